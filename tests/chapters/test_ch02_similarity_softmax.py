"""Claims of chapter 02 (Similarity and softmax), computed with the package, not by running the notebook."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import selfattn
from selfattn import ref
from selfattn.experiments.scaling import (
    init_score_variance,
    minilm_score_spread,
    random_scores,
    saturation_stats,
    softmax_jacobian,
    train_scaling,
)

D_HEADS = (4, 16, 64, 256, 1024)
N_QUERIES, N_KEYS = 1000, 16  # 16,000 scores per d_head: relative std of the variance estimate <= 1.5%
COURSE_SENTENCES = [  # the sentences of chapters 01 and 03
    "I sat on the river bank.",
    "I opened a bank account.",
    "Thieves robbed the bank and took the cash.",
    "The bank of the river was muddy after the rain.",
    "She deposited the money at the bank on Monday.",
]


def test_claim_05_score_variance_grows_like_d_head_and_scaling_keeps_it_near_one():
    for d_head in D_HEADS:
        scores = random_scores(d_head, N_QUERIES, N_KEYS, seed=d_head)
        var = float(scores.var())
        scaled_var = float((scores / math.sqrt(d_head)).var())
        # Var(q.k) = d_head exactly (sum of d_head independent products of variance 1); 5% covers sampling
        assert var == pytest.approx(d_head, rel=0.05), (d_head, var)
        assert scaled_var == pytest.approx(1.0, rel=0.05), (d_head, scaled_var)


def test_claim_05_scaling_keeps_score_variance_constant_in_a_real_layer_at_init(minilm):
    # real inputs: MiniLM's token embeddings of the course's sentences, layer-normalised as at init
    batch = minilm.tokenize(COURSE_SENTENCES)
    X = minilm.token_embeddings(batch.input_ids)[batch.attention_mask.bool()].double()  # (N, D)
    X = torch.nn.functional.layer_norm(X, (X.shape[-1],))
    torch.testing.assert_close(X.pow(2).sum(-1), torch.full((X.shape[0],), 384.0, dtype=X.dtype), rtol=0.01, atol=0)  # LayerNorm eps: 0.5%
    d_heads = (8, 32, 128, 512)
    var = init_score_variance(X, d_heads, n_inits=64, seed=0)
    assert np.isfinite(list(var.values())).all()
    # SelfAttention's W ~ N(0, 1/d_model) and |x|^2 = d_model give Var(q_i) = 1, so Var(q.k) = d_head:
    # measured ratios 0.94-0.97 (the variance removes each head's mean score; 64 heads: a few % noise)
    for d in d_heads:
        assert 0.85 < var[d] / d < 1.1, (d, var[d])
    assert var[512] / var[8] == pytest.approx(64, rel=0.15)  # unscaled: grows like d_head


def test_claim_05_minilm_scaled_scores_have_order_one_spread_per_head(minilm):
    spread = minilm_score_spread(minilm, COURSE_SENTENCES)  # (6, 12)
    assert spread.shape == (6, 12) and np.isfinite(spread).all()
    order_one = (spread > 0.5) & (spread < 4.0)
    assert order_one.sum() >= 70, spread  # measured: 71 of 72 heads, median 1.38
    assert 0.8 < np.median(spread) < 2.5
    # the outlier is layer 0's previous-token head (chapter 03), measured 10.1
    assert np.unravel_index(np.argmax(spread), spread.shape) == (0, 2) and spread[0, 2] > 6.0
    # it is that head: it puts almost all of its weight on the previous token
    run = minilm.run(COURSE_SENTENCES[3])
    assert float(run.weights[0][0, 2].diagonal(-1).mean()) > 0.9


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_claim_05_training_without_scaling_at_large_d_head_is_measurably_worse(seed):
    scaled, unscaled = train_scaling(True, seed=seed), train_scaling(False, seed=seed)  # d_head = 256, 60 steps
    assert np.isfinite(scaled.losses + unscaled.losses).all()
    # at init: measured entropy 1.71-1.75 nats scaled, 0.13-0.19 unscaled (uniform over 8 pairs: 2.08)
    assert scaled.entropy_at_init > 1.5 and unscaled.entropy_at_init < 0.3
    assert unscaled.max_weight_at_init > 0.85 > 0.5 > scaled.max_weight_at_init
    # mean training loss over steps 21-60: measured < 0.01 nats scaled, 1.1-1.6 unscaled (seeds 0-5)
    early_scaled, early_unscaled = np.mean(scaled.losses[20:]), np.mean(unscaled.losses[20:])
    assert early_scaled < 0.05 and early_unscaled - early_scaled > 0.8, (early_scaled, early_unscaled)


def test_claim_05_without_scaling_softmax_saturates_as_d_head_grows():
    unscaled, scaled = [], []
    for d_head in D_HEADS:
        scores = random_scores(d_head, N_QUERIES, N_KEYS, seed=d_head)
        unscaled.append(saturation_stats(scores))
        scaled.append(saturation_stats(scores / math.sqrt(d_head)))
    max_w = [s.max_weight for s in unscaled]
    entropy = [s.entropy for s in unscaled]
    jac = [s.jacobian_norm for s in unscaled]
    assert all(np.isfinite(max_w + entropy + jac))
    assert max_w == sorted(max_w) and entropy == sorted(entropy, reverse=True) and jac == sorted(jac, reverse=True)
    assert max_w[-1] > 0.9 and entropy[-1] < 0.15  # nearly one-hot at d_head = 1024 (uniform: 1/16, log 16 = 2.77)
    assert jac[-1] < 0.25 * scaled[-1].jacobian_norm  # the gradient through the softmax shrinks > 4x
    # with scaling the softmax looks the same at every d_head
    for s in scaled:
        assert s.max_weight == pytest.approx(scaled[0].max_weight, abs=0.03)
        assert s.entropy == pytest.approx(scaled[0].entropy, abs=0.05)
        assert s.entropy > 2.0


def test_claim_05_softmax_jacobian_formula_matches_autograd():
    x = torch.tensor([3.0, 1.0, -2.0, 0.5], dtype=torch.float64)
    expected = torch.autograd.functional.jacobian(lambda s: torch.softmax(s, dim=-1), x)
    torch.testing.assert_close(softmax_jacobian(torch.softmax(x, dim=-1)), expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("scale", [1e-3, 1.0, 30.0, 1e4])
def test_claim_06_softmax_weights_are_non_negative_and_rows_sum_to_one(scale):
    rng = np.random.default_rng(6)
    scores = rng.normal(size=(5, 7, 9)) * scale
    for weights in (ref.softmax(scores), selfattn.masked_softmax(torch.from_numpy(scores), None).numpy()):
        assert np.isfinite(weights).all()
        assert (weights >= 0).all()
        np.testing.assert_allclose(weights.sum(axis=-1), 1.0, rtol=0, atol=1e-12)
    np.testing.assert_allclose(ref.softmax(scores), torch.softmax(torch.from_numpy(scores), dim=-1).numpy(),
                               rtol=1e-12, atol=1e-300)


def test_claim_06_attention_weights_rows_sum_to_one():
    g = torch.Generator().manual_seed(6)
    q, k, v = (torch.randn(2, 3, 5, 8, generator=g, dtype=torch.float64) * 10 for _ in range(3))
    _, weights = selfattn.scaled_dot_product_attention(q, k, v, return_weights=True)
    assert (weights >= 0).all()
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, 3, 5, dtype=torch.float64), rtol=0, atol=1e-12)


def test_claim_06_softmax_is_shift_invariant_and_monotone():
    rng = np.random.default_rng(7)
    x = rng.normal(size=(4, 6))
    np.testing.assert_allclose(ref.softmax(x + 123.0), ref.softmax(x), rtol=1e-12, atol=1e-15)
    order = np.argsort(x, axis=-1)
    w = ref.softmax(x)
    assert (np.diff(np.take_along_axis(w, order, axis=-1), axis=-1) > 0).all()  # larger score, larger weight
