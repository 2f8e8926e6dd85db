"""Claims of chapter 02 (Similarity and softmax), computed with the package, not by running the notebook."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import selfattn
from selfattn import ref
from selfattn.experiments.scaling import random_scores, saturation_stats, softmax_jacobian

D_HEADS = (4, 16, 64, 256, 1024)
N_QUERIES, N_KEYS = 1000, 16  # 16,000 scores per d_head: relative std of the variance estimate <= 1.5%


def test_claim_05_score_variance_grows_like_d_head_and_scaling_keeps_it_near_one():
    for d_head in D_HEADS:
        scores = random_scores(d_head, N_QUERIES, N_KEYS, seed=d_head)
        var = float(scores.var())
        scaled_var = float((scores / math.sqrt(d_head)).var())
        # Var(q.k) = d_head exactly (sum of d_head independent products of variance 1); 5% covers sampling
        assert var == pytest.approx(d_head, rel=0.05), (d_head, var)
        assert scaled_var == pytest.approx(1.0, rel=0.05), (d_head, scaled_var)


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
