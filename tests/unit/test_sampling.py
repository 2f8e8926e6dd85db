"""selfattn.sampling: greedy, temperature, top-k and top-p, each with what its definition implies."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from selfattn.sampling import filter_logits, sample


def _logits_of(probs):
    return torch.log(torch.tensor([probs], dtype=torch.float64))  # (1, V)


def _kept(logits):
    return torch.isfinite(logits[0]).nonzero().flatten().tolist()


def test_top_p_keeps_the_smallest_set_whose_mass_reaches_p():
    logits = _logits_of([0.05, 0.4, 0.1, 0.3, 0.15])  # sorted: 0.4 (1), 0.3 (3), 0.15 (4), 0.1 (2), 0.05 (0)
    # (p values away from the exact sums 0.4, 0.7, ...: those are decided by rounding)
    assert _kept(filter_logits(logits, top_p=0.39)) == [1]  # 0.4 reaches 0.39
    assert _kept(filter_logits(logits, top_p=0.41)) == [1, 3]  # 0.7
    assert _kept(filter_logits(logits, top_p=0.69)) == [1, 3]
    assert sorted(_kept(filter_logits(logits, top_p=0.71))) == [1, 3, 4]  # 0.85
    assert sorted(_kept(filter_logits(logits, top_p=0.96))) == [0, 1, 2, 3, 4]
    assert _kept(filter_logits(logits, top_p=1.0)) == [0, 1, 2, 3, 4]  # p = 1 keeps all
    assert _kept(filter_logits(logits, top_p=1e-9)) == [1]  # the most probable always survives


def test_top_p_keeps_ties_with_the_last_token_kept():
    logits = _logits_of([0.3, 0.2, 0.2, 0.2, 0.1])
    assert sorted(_kept(filter_logits(logits, top_p=0.45))) == [0, 1, 2, 3]  # 0.5 reached by one of three tied
    # and the choice does not depend on the order of the tied tokens
    perm = torch.tensor([3, 1, 4, 0, 2])
    assert sorted(perm[_kept(filter_logits(logits[:, perm], top_p=0.45))].tolist()) == [0, 1, 2, 3]


def test_top_k_keeps_the_k_largest_and_their_ties():
    logits = torch.tensor([[1.0, 3.0, 2.0, 3.0, 0.0]])
    assert _kept(filter_logits(logits, top_k=1)) == [1, 3]  # two tied maxima
    assert sorted(_kept(filter_logits(logits, top_k=3))) == [1, 2, 3]
    assert _kept(filter_logits(logits, top_k=10)) == [0, 1, 2, 3, 4]
    both = filter_logits(_logits_of([0.05, 0.4, 0.1, 0.3, 0.15]), top_k=3, top_p=0.41)
    assert _kept(both) == [1, 3]  # a token must pass both


def test_top_k_of_one_is_greedy_and_the_kept_logits_are_unchanged():
    logits = torch.randn(4, 11, generator=torch.Generator().manual_seed(0))
    g = torch.Generator().manual_seed(1)
    draws = torch.cat([sample(logits, top_k=1, generator=g) for _ in range(20)], dim=1)  # (4, 20)
    assert torch.equal(draws, logits.argmax(-1, keepdim=True).expand(4, 20))
    filtered = filter_logits(logits, top_k=4, top_p=0.9)
    kept = torch.isfinite(filtered)
    assert torch.equal(filtered[kept], logits[kept])


def test_samples_follow_the_renormalised_distribution():
    probs = [0.05, 0.4, 0.1, 0.3, 0.15]
    logits = _logits_of(probs).float().expand(20000, 5)
    ids = sample(logits, top_p=0.8, generator=torch.Generator().manual_seed(2))[:, 0]  # keeps 1, 3, 4
    freq = torch.bincount(ids, minlength=5).double() / ids.numel()
    expected = torch.tensor([0, 0.4, 0, 0.3, 0.15], dtype=torch.float64) / 0.85
    # 20000 draws: the standard error of each frequency is below 0.0036; 5 of them is 0.018
    assert freq[[0, 2]].sum() == 0 and (freq - expected).abs().max() < 0.018


def test_plain_temperature_sampling_draws_exactly_as_before():
    """With neither top-k nor top-p, sample() is chapter 13's temperature sampling, draw for draw."""
    logits = torch.randn(3, 9, generator=torch.Generator().manual_seed(4))
    a = sample(logits, temperature=0.7, generator=torch.Generator().manual_seed(5))
    b = torch.multinomial(torch.softmax(logits.float() / 0.7, dim=-1), 1, generator=torch.Generator().manual_seed(5))
    assert torch.equal(a, b)
    assert torch.equal(sample(logits, greedy=True), logits.argmax(-1, keepdim=True))


def test_generate_uses_top_k_and_top_p():
    from selfattn.models.gpt import GPT, GPTConfig

    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=13, block_size=8, d_model=16, n_heads=2, n_layers=1, d_ff=32))
    prompt = torch.tensor([[1, 2, 3]])
    greedy = model.generate(prompt, 12, greedy=True)
    assert torch.equal(model.generate(prompt, 12, top_k=1, generator=torch.Generator().manual_seed(0)), greedy)
    assert torch.equal(model.generate(prompt, 12, top_p=1e-9, generator=torch.Generator().manual_seed(0)), greedy)
    cached = model.generate(prompt, 12, top_p=0.9, top_k=5, generator=torch.Generator().manual_seed(3))
    uncached = model.generate(prompt, 12, top_p=0.9, top_k=5, generator=torch.Generator().manual_seed(3),
                              use_cache=False)  # fmt: skip
    assert torch.equal(cached, uncached)
    with pytest.raises(ValueError, match="top_p"):
        model.generate(prompt, 2, top_p=0.0)
    with pytest.raises(TypeError, match="top_k"):
        model.generate(prompt, 2, top_k=2.5)


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda: filter_logits(torch.zeros(3), top_k=1), ValueError, "logits"),
        (lambda: filter_logits(torch.zeros(1, 3, dtype=torch.int64), top_k=1), TypeError, "floating"),
        (lambda: filter_logits(torch.tensor([[0.0, math.nan]]), top_k=1), ValueError, "NaN"),
        (lambda: filter_logits(torch.full((1, 3), -math.inf), top_p=0.5), ValueError, "finite entry"),
        (lambda: filter_logits(torch.zeros(1, 3), top_k=0), ValueError, "top_k"),
        (lambda: filter_logits(torch.zeros(1, 3), top_k=True), TypeError, "top_k"),
        (lambda: filter_logits(torch.zeros(1, 3), top_p=1.5), ValueError, "top_p"),
        (lambda: filter_logits(torch.zeros(1, 3), top_p="0.9"), TypeError, "top_p"),
        (lambda: sample(torch.zeros(1, 3), temperature=0), ValueError, "temperature"),
        (lambda: sample(torch.zeros(1, 3), greedy="no"), TypeError, "greedy"),
    ],
)
def test_bad_input_raises_naming_the_argument(call, error, match):
    with pytest.raises(error, match=match):
        call()


def test_top_p_in_float32_logits_matches_a_float64_reference():
    logits = torch.randn(64, 50, generator=torch.Generator().manual_seed(6))
    for p in (0.1, 0.5, 0.9, 0.99):
        kept = torch.isfinite(filter_logits(logits, top_p=p))
        probs = torch.softmax(logits.double(), -1).numpy()
        for row in range(64):
            order = np.argsort(-probs[row], kind="stable")
            n = int(np.searchsorted(np.cumsum(probs[row][order]), p) + 1)  # first prefix with mass >= p
            assert set(np.flatnonzero(kept[row].numpy())) == set(order[:n].tolist())
