"""selfattn.models.gpt: causal by construction, the KV-cached path equals the full one, generation
with and without the cache gives the same tokens, the training loop and the baselines."""

from __future__ import annotations

import math

import pytest
import torch

from selfattn import causal_mask
from selfattn.efficient import KVCache
from selfattn.models.gpt import GPT, GPTConfig, evaluate_loss, train_lm, unigram_cross_entropy
from selfattn.models.tiny_lm import TinyLM


def _model(seed=0, n_layers=2, block_size=16):
    torch.manual_seed(seed)
    config = GPTConfig(
        vocab_size=13, block_size=block_size, d_model=24, n_heads=3, n_layers=n_layers, d_ff=48
    )
    model = GPT(config).eval()
    # Trained-looking weights: larger than the init so that the logits are not all alike.
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.3 * torch.randn_like(p))
    return model


def test_forward_equals_tiny_lm_with_the_causal_mask():
    model = _model()
    tiny = TinyLM(model.config).eval()
    tiny.load_state_dict(model.state_dict())  # same parameter names: the state dict moves as is
    ids = torch.randint(0, 13, (2, 10), generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(model(ids), tiny(ids, causal_mask(10)), rtol=0, atol=1e-6)


def test_logits_at_t_ignore_later_tokens_and_weights_are_causal():
    model = _model()
    ids = torch.randint(0, 13, (2, 12), generator=torch.Generator().manual_seed(2))
    changed = ids.clone()
    changed[:, 7:] = (changed[:, 7:] + 5) % 13
    logits, weights = model(ids, return_weights=True)
    torch.testing.assert_close(logits[:, :7], model(changed)[:, :7], rtol=0, atol=1e-6)
    assert len(weights) == 2 and weights[0].shape == (2, 3, 12, 12)
    upper = torch.triu(torch.ones(12, 12, dtype=torch.bool), diagonal=1)
    for w in weights:
        assert torch.isfinite(w).all()
        assert w[..., upper].abs().max().item() == 0.0
        torch.testing.assert_close(w.sum(-1), torch.ones(2, 3, 12), rtol=0, atol=1e-5)


def test_forward_cached_step_by_step_equals_full_forward():
    model = _model()
    ids = torch.randint(0, 13, (3, 11), generator=torch.Generator().manual_seed(3))
    full = model(ids)
    caches = [KVCache() for _ in model.blocks]
    chunks = [
        model.forward_cached(ids[:, :4], caches)
    ]  # a 4-token prompt, then one token at a time
    chunks += [model.forward_cached(ids[:, t : t + 1], caches) for t in range(4, 11)]
    torch.testing.assert_close(torch.cat(chunks, dim=1), full, rtol=1e-5, atol=1e-5)
    assert len(caches[0]) == 11


@pytest.mark.parametrize("greedy", [True, False])
def test_generate_with_cache_equals_without_token_by_token(greedy):
    model = _model()
    prompt = torch.randint(0, 13, (4, 3), generator=torch.Generator().manual_seed(4))
    kw = dict(greedy=greedy, temperature=0.9)
    with_cache = model.generate(
        prompt, 12, generator=torch.Generator().manual_seed(5), use_cache=True, **kw
    )
    without = model.generate(
        prompt, 12, generator=torch.Generator().manual_seed(5), use_cache=False, **kw
    )
    assert with_cache.shape == (4, 15)
    assert torch.equal(with_cache[:, :3], prompt)
    assert torch.equal(with_cache, without)


def test_greedy_generation_is_the_argmax_of_the_full_forward():
    model = _model()
    prompt = torch.tensor([[1, 2, 3]])
    out = model.generate(prompt, 5, greedy=True)
    for t in range(3, 8):
        assert out[0, t].item() == model(out[:, :t])[0, -1].argmax().item()


def test_seeded_sampling_is_reproducible_and_temperature_matters():
    model = _model()
    prompt = torch.tensor([[0]])
    a = model.generate(prompt, 15, generator=torch.Generator().manual_seed(0))
    b = model.generate(prompt, 15, generator=torch.Generator().manual_seed(0))
    assert torch.equal(a, b)
    cold = model.generate(prompt, 15, temperature=1e-4, generator=torch.Generator().manual_seed(0))
    assert torch.equal(cold, model.generate(prompt, 15, greedy=True))


def test_generate_rejects_bad_arguments():
    model = _model(block_size=8)
    prompt = torch.tensor([[1, 2]])
    with pytest.raises(ValueError, match="block_size=8"):
        model.generate(prompt, 7)
    with pytest.raises((TypeError, ValueError), match="max_new_tokens"):
        model.generate(prompt, 0)
    with pytest.raises(ValueError, match="temperature"):
        model.generate(prompt, 2, temperature=0.0)
    with pytest.raises(ValueError, match="caches"):
        model.forward_cached(prompt, [KVCache()])
    with pytest.raises(ValueError, match="block_size=8"):
        model(torch.zeros(1, 9, dtype=torch.int64))


def test_unigram_cross_entropy_against_the_formula():
    train = torch.tensor([0, 0, 1, 2])
    val = torch.tensor([0, 2])
    # add-one counts over V = 4: [3, 2, 2, 1] / 8
    expected = -(math.log(3 / 8) + math.log(2 / 8)) / 2
    assert unigram_cross_entropy(train, val, 4) == pytest.approx(expected, abs=1e-12)
    with pytest.raises(ValueError, match="val_ids"):
        unigram_cross_entropy(train, val[None], 4)


def test_training_beats_the_uniform_baseline_and_logs_validation():
    torch.manual_seed(0)
    # A periodic sequence: predictable from context, so training must drive the loss far below log V.
    ids = torch.arange(600) % 7
    model = GPT(GPTConfig(vocab_size=7, block_size=8, d_model=16, n_heads=2, n_layers=1, d_ff=32))
    log = train_lm(
        model,
        ids,
        ids,
        steps=60,
        batch_size=16,
        lr=1e-2,
        eval_every=20,
        eval_batches=2,
        progress=False,
    )
    assert len(log.train_loss) == 60 and log.val_steps == [20, 40, 60]
    assert all(math.isfinite(v) for v in log.train_loss + log.val_loss)
    assert log.val_loss[-1] < 0.2 * math.log(7), log.val_loss
    assert evaluate_loss(model, ids, batches=2, batch_size=16) == pytest.approx(
        log.val_loss[-1], abs=1e-6
    )
    assert not model.training


def test_empty_input_and_infinite_temperature_are_named_errors():
    # Regression: an empty input_ids failed with "T must be > 0" (from the causal mask, not naming
    # input_ids); temperature=inf was accepted although the rule is a finite number > 0.
    model = _model(block_size=8)
    empty = torch.zeros(1, 0, dtype=torch.int64)
    for call in (lambda: model(empty), lambda: model.generate(empty, 2)):
        with pytest.raises(ValueError, match=r"input_ids must hold at least one token \(T > 0\); got shape \(1, 0\)"):
            call()
    for bad in (math.inf, math.nan, True):
        with pytest.raises(ValueError, match="temperature must be a finite number > 0"):
            model.generate(torch.tensor([[1, 2]]), 2, temperature=bad)
