"""The scaling simulation: scores are q.k of the stated shape, and the saturation measures hit their limits."""

from __future__ import annotations

import math

import pytest
import torch

from selfattn.experiments.scaling import random_scores, saturation_stats


def test_random_scores_shape_and_bad_sizes():
    s = random_scores(8, 10, 3, seed=1)
    assert s.shape == (10, 3) and s.dtype == torch.float64 and torch.isfinite(s).all()
    torch.testing.assert_close(s, random_scores(8, 10, 3, seed=1), rtol=0, atol=0)
    with pytest.raises(ValueError, match="d_head"):
        random_scores(0, 10, 3)


def test_saturation_stats_limits():
    uniform = saturation_stats(torch.zeros(4, 16, dtype=torch.float64))
    assert uniform.max_weight == pytest.approx(1 / 16, abs=1e-12)
    assert uniform.entropy == pytest.approx(math.log(16), abs=1e-12)
    one_hot = saturation_stats(torch.tensor([[1000.0, 0.0, 0.0]], dtype=torch.float64))
    assert one_hot.max_weight == pytest.approx(1.0, abs=1e-12)
    assert one_hot.entropy == pytest.approx(0.0, abs=1e-12) and one_hot.jacobian_norm == pytest.approx(0.0, abs=1e-12)


def test_saturation_stats_refuses_bad_scores():
    with pytest.raises(ValueError, match="shape"):
        saturation_stats(torch.zeros(3))
    with pytest.raises(ValueError, match="finite"):
        saturation_stats(torch.tensor([[float("nan"), 0.0]]))


def test_init_score_variance_matches_the_formula_and_refuses_bad_input():
    from selfattn.experiments.scaling import init_score_variance

    g = torch.Generator().manual_seed(0)
    X = torch.nn.functional.layer_norm(torch.randn(40, 64, generator=g, dtype=torch.float64), (64,))  # |x|^2 = 64
    var = init_score_variance(X, [16, 64], n_inits=32)
    # W ~ N(0, 1/D) and |x|^2 = D: Var(q.k) = d_head; 32 heads of 1600 scores: within 15%
    assert var[16] == pytest.approx(16, rel=0.15) and var[64] == pytest.approx(64, rel=0.15)
    assert init_score_variance(X, [16], n_inits=4, seed=3) == init_score_variance(X, [16], n_inits=4, seed=3)
    with pytest.raises(ValueError, match="X must be"):
        init_score_variance(X[0], [16])
    with pytest.raises(ValueError, match="d_head"):
        init_score_variance(X, [0])


def test_scaling_recall_model_divides_the_scores_only_when_asked():
    from selfattn.experiments.scaling import ScalingRecallModel
    from selfattn.experiments.tying import RecallConfig, RecallTask

    config = RecallConfig(d_head=64)
    X, _ = RecallTask(config).sample(16, torch.Generator().manual_seed(1))
    scaled = ScalingRecallModel(config, True, generator=torch.Generator().manual_seed(2))
    unscaled = ScalingRecallModel(config, False, generator=torch.Generator().manual_seed(2))
    torch.testing.assert_close(scaled.attn.W_Q, unscaled.attn.W_Q, rtol=0, atol=0)  # the same start
    with torch.no_grad():
        Q, K, _ = scaled.attn.project(torch.nn.functional.layer_norm(X, X.shape[-1:]))
        expected = torch.softmax(Q[:, -1:] @ K[:, :-1].transpose(-2, -1) / 8.0, dim=-1)  # sqrt(64) = 8
        _, w_scaled = scaled(X, return_weights=True)
        _, w_unscaled = unscaled(X, return_weights=True)
    torch.testing.assert_close(w_scaled, expected, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(w_unscaled, torch.softmax(8.0 * torch.log(expected), dim=-1), rtol=1e-4, atol=1e-5)
    with pytest.raises(TypeError, match="scaled"):
        ScalingRecallModel(config, 1)
