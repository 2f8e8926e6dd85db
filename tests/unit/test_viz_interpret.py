"""Chapter 13's figures: per-head scaling, the slider over heads, the scatter's buttons."""

from __future__ import annotations

import numpy as np
import pytest

from selfattn.viz import figure_description
from selfattn.viz.interpret import (
    edge_measures_figure,
    edge_measures_widget,
    key_scatter_figure,
    scaled_per_head,
    token_bars_figure,
)


def test_scaled_per_head_divides_by_each_heads_max():
    v = np.stack([np.full((2, 2), -4.0), np.zeros((2, 2))])
    v[0, 0, 0] = 2.0
    out = scaled_per_head(v)
    np.testing.assert_allclose(out[0], [[0.5, 1.0], [1.0, 1.0]])
    np.testing.assert_allclose(out[1], 0.0)
    with pytest.raises(ValueError, match=r"\(N, T, T\)"):
        scaled_per_head(np.ones((2, 2)))


def test_edge_measures_figure_has_one_panel_per_measure_and_one_frame_per_head(rng):
    tokens = ["a", "b", "c"]
    measures = {"weight": rng.random((2, 3, 3)), "effect": -rng.random((2, 3, 3))}
    fig = edge_measures_figure(tokens, measures, ["H1", "H2"], title="t")
    assert len(fig.data) == 2 and [f.name for f in fig.frames] == ["H1", "H2"]
    expected = scaled_per_head(measures["effect"])[1]
    np.testing.assert_allclose(fig.frames[1].data[1].z, np.round(expected, 3))
    assert "slider" in figure_description(fig)
    with pytest.raises(ValueError, match="measure 'weight'"):
        edge_measures_figure(tokens, {"weight": rng.random((3, 3, 3))}, ["H1", "H2"])
    assert len(edge_measures_widget(tokens, measures, ["H1", "H2"]).children) == 2


def test_key_scatter_splits_special_tokens_and_switches_measures():
    x = np.array([1.0, 2.0, 3.0, 4.0])
    special = np.array([True, False, False, True])
    fig = key_scatter_figure(
        x, {"a": np.array([0.0, 1.0, -2.0, 3.0]), "b": np.ones(4)}, list("pqrs"), special
    )
    np.testing.assert_allclose(fig.data[0].x, [1.0, 4.0])
    np.testing.assert_allclose(fig.data[1].y, [1.0, 2.0])  # absolute values
    np.testing.assert_allclose(
        fig.data[0].y, [1.0, 3.0]
    )  # the zero is clipped to the smallest positive
    assert [b.label for b in fig.layout.updatemenus[0].buttons] == ["a", "b"]
    with pytest.raises(ValueError, match="shape"):
        key_scatter_figure(x, {"a": np.ones(3)}, list("pqrs"), special)


def test_token_bars_show_shares():
    fig = token_bars_figure(["x", "y"], {"m": np.array([1.0, -3.0])})
    np.testing.assert_allclose(fig.data[0].y, [0.25, 0.75])
    assert "m: y" in figure_description(fig)
    with pytest.raises(ValueError, match="non-zero"):
        token_bars_figure(["x", "y"], {"m": np.zeros(2)})
