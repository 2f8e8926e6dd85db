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
    """With neither top-k nor top-p, sample() is chapter 14's temperature sampling, draw for draw."""
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


# --- bad input found by the new-user probe (chapter 11): each was silently wrong or an unclear error ---


@pytest.mark.parametrize("greedy", [True, False])
@pytest.mark.parametrize(
    ("logits", "match"),
    [
        (torch.tensor([[float("nan"), 1.0, 2.0]]), r"NaN or \+inf; got 1 NaN and 0 \+inf"),
        (torch.tensor([[0.0, math.inf, 2.0]]), r"NaN or \+inf; got 0 NaN and 1 \+inf"),
        (torch.full((2, 3), -math.inf), r"at least one finite entry.*rows \[0, 1\]"),
        (torch.zeros(2, 0), r"at least one token \(V > 0\); got shape \(2, 0\)"),
    ],
)
def test_bad_logits_are_refused_on_every_path_greedy_too(logits, greedy, match):
    """Greedy skipped every logit check: NaN logits gave token 0, an all -inf row gave 0, V = 0 an IndexError."""
    with pytest.raises(ValueError, match=match):
        sample(logits, greedy=greedy, generator=torch.Generator().manual_seed(0))


def test_integer_logits_are_refused_greedy_too():
    with pytest.raises(TypeError, match="logits must be a floating tensor; got dtype torch.int64"):
        sample(torch.tensor([[1, 9, 3]]), greedy=True)


def test_greedy_still_checks_top_k_and_top_p():
    with pytest.raises(ValueError, match="top_k must be >= 1"):
        sample(torch.zeros(1, 3), greedy=True, top_k=0)
    with pytest.raises(ValueError, match="top_p must be in"):
        sample(torch.zeros(1, 3), greedy=True, top_p=5)


def test_float64_logits_are_not_rounded_to_float32():
    """logits.float() tied 1000 and 1000 - 1e-6: top_k=1 picked token 1 in about half the seeds."""
    logits = torch.tensor([[1000.0, 1000 - 1e-6, -5.0]], dtype=torch.float64)
    picks = [int(sample(logits, top_k=1, generator=torch.Generator().manual_seed(s))) for s in range(200)]
    assert picks == [0] * 200
    picks = [int(sample(logits, temperature=1e-9, generator=torch.Generator().manual_seed(s))) for s in range(50)]
    assert picks == [0] * 50  # (1e-6 / 1e-9 = 1000 nats apart in float64)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_logits_are_computed_in_at_least_float32(dtype):
    logits = torch.tensor([[0.0, 1.0, 2.0]], dtype=dtype)
    ids = sample(logits, temperature=0.5, top_p=0.9, generator=torch.Generator().manual_seed(0))
    assert ids.dtype == torch.int64 and ids.shape == (1, 1)


@pytest.mark.parametrize(
    ("dtype", "tau"), [(torch.float32, 1e-39), (torch.float32, 1e-300), (torch.float64, 1e-300), (torch.float16, 1e-39)]
)
@pytest.mark.parametrize("kw", [{}, {"top_k": 2}, {"top_p": 0.9}])
def test_a_tiny_temperature_tends_to_greedy_without_overflow(dtype, tau, kw):
    """logits / 1e-39 overflowed to inf and crashed in torch (or blamed the logits); each row's max is
    subtracted first, so the most probable token is drawn, every seed."""
    logits = torch.tensor([[1.0, 3.0, 2.0], [-4.0, -5.0, -math.inf]], dtype=dtype)
    for s in range(10):
        ids = sample(logits, temperature=tau, generator=torch.Generator().manual_seed(s), **kw)
        assert ids[:, 0].tolist() == [1, 0]


def test_a_tiny_temperature_splits_ties_evenly():
    logits = torch.tensor([[2.0, 2.0, 1.0]])
    picks = {int(sample(logits, temperature=1e-39, generator=torch.Generator().manual_seed(s))) for s in range(40)}
    assert picks == {0, 1}


@pytest.mark.parametrize("bad", [42, "x", np.random.default_rng(0)])
def test_generator_must_be_a_torch_generator(bad):
    """generator=42 gave AttributeError: 'int' object has no attribute 'device'."""
    with pytest.raises(TypeError, match=r"generator must be a torch.Generator or None; got .*manual_seed"):
        sample(torch.zeros(1, 3), generator=bad)


def test_temperature_of_the_wrong_type_is_a_type_error():
    with pytest.raises(TypeError, match=r"temperature must be a finite number > 0; got 'hot' \(str\)"):
        sample(torch.zeros(1, 3), temperature="hot")
