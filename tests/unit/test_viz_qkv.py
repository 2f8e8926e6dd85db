"""Chapter 03's figures show the weights they are given, label repeated tokens apart, and refuse bad input."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from selfattn import ref
from selfattn.viz import figure_description
from selfattn.viz.qkv import (
    attention_heatmap,
    heads_figure,
    projection_heatmaps_figure,
    tying_figure,
)

TOKENS = ["[CLS]", "the", "cat", "the", "[SEP]"]


def _weights(H=3, T=5, seed=0):
    return ref.softmax(np.random.default_rng(seed).normal(size=(H, T, T)) * 2)


def test_heatmap_shows_the_weights_with_distinct_labels():
    w = _weights()[0]
    fig = attention_heatmap(torch.from_numpy(w), TOKENS)
    np.testing.assert_allclose(np.array(fig.data[0].z), w, atol=5e-5)  # rounded to 4 decimals
    assert len(set(fig.data[0].x)) == len(TOKENS)  # "the" twice stays two columns
    assert fig.data[0].zmin == 0 and fig.data[0].zmax == 1 and figure_description(fig)


def test_heatmap_refuses_mismatched_labels_and_nan():
    with pytest.raises(ValueError, match="labels"):
        attention_heatmap(_weights()[0], TOKENS[:-1])
    bad = _weights()[0]
    bad[0, 0] = np.nan
    with pytest.raises(ValueError, match="finite"):
        attention_heatmap(bad, TOKENS)
    with pytest.raises(ValueError, match="dimensions"):
        attention_heatmap(_weights(), TOKENS)


def test_heads_figure_frame_per_head_equals_the_single_view():
    w = _weights()
    fig = heads_figure(w, TOKENS)
    assert [s.args[0][0] for s in fig.layout.sliders[0].steps] == [f.name for f in fig.frames] == ["0", "1", "2"]
    for h in range(3):
        np.testing.assert_allclose(np.array(fig.frames[h].data[0].z), np.array(attention_heatmap(w[h], TOKENS).data[0].z))
    assert figure_description(fig)


def test_tying_figure_plots_the_numbers_and_has_buttons():
    fig = tying_figure([2, 4, 8], [0.7, 1.0, 1.0], [0.1, 0.3, 0.99], chance=1 / 16)
    assert list(fig.data[0].y) == [0.7, 1.0, 1.0] and list(fig.data[1].y) == [0.1, 0.3, 0.99]
    assert len(fig.layout.updatemenus[0].buttons) == 3 and figure_description(fig)


def test_projection_heatmaps_figure_shows_each_matrix_and_describes_the_split():
    W_K = np.zeros((4, 2))
    W_K[:2] = 1.0  # all weight on the first half of the rows
    W_V = np.zeros((4, 2))
    W_V[2:] = -2.0
    fig = projection_heatmaps_figure({"W_K": W_K, "W_V": W_V}, ["k0", "k1", "v0", "v1"], title="t")
    assert len(fig.data) == 2 and [d.type for d in fig.data] == ["heatmap", "heatmap"]
    np.testing.assert_array_equal(np.asarray(fig.data[1].z), W_V)
    assert fig.data[0].zmin == -2.0 and fig.data[0].zmax == 2.0  # one colour scale for both
    text = figure_description(fig)
    assert "W_K: 100.0%" in text and "W_V: 0.0%" in text
    with pytest.raises(ValueError, match="rows"):
        projection_heatmaps_figure({"W_K": W_K}, ["a", "b"])
    with pytest.raises(ValueError, match="at least one"):
        projection_heatmaps_figure({}, [])
