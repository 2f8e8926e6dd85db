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
