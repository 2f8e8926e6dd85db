"""selfattn.viz.masks: every builder returns a described figure with the data it claims to draw."""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go
import pytest

import selfattn
from selfattn.viz import figure_description
from selfattn.viz.masks import (
    future_change_figure,
    heatmap_slider_figure,
    loss_curves_figure,
    mask_gallery_figure,
    mask_heatmap,
    padding_drift_figure,
    weights_heatmap,
)


def test_mask_heatmap_draws_the_mask():
    fig = mask_heatmap(selfattn.causal_mask(4), "causal")
    assert isinstance(fig, go.Figure) and figure_description(fig)
    np.testing.assert_array_equal(np.asarray(fig.data[0].z), np.tril(np.ones((4, 4), dtype=int)))
    assert "10 of 16" in figure_description(fig)
    with pytest.raises(ValueError, match="2-D"):
        mask_heatmap(np.ones((2, 2, 2), dtype=bool))


def test_mask_gallery_has_one_button_per_mask_with_its_data():
    masks = {
        "causal": selfattn.causal_mask(3),
        "br": selfattn.causal_mask(2, 4, alignment="bottom_right"),
    }
    fig = mask_gallery_figure(masks)
    buttons = fig.layout.updatemenus[0].buttons
    assert [b.label for b in buttons] == ["causal", "br"]
    np.testing.assert_array_equal(np.asarray(buttons[1].args[0]["z"][0]), masks["br"].int().numpy())
    assert "br (2 by 4, 7 cells may attend)" in figure_description(fig)
    with pytest.raises(ValueError, match="at least one"):
        mask_gallery_figure({})


def test_weights_heatmap_and_slider():
    w = np.array([[1.0, 0.0], [0.25, 0.75]])
    fig = weights_heatmap(w)
    np.testing.assert_allclose(np.asarray(fig.data[0].z), w)
    assert fig.data[0].colorscale[0][1] == "#440154"  # Viridis
    fig = heatmap_slider_figure([w, np.ones((1, 3)) / 3], ["a", "b"], prefix="S = ", title="t")
    assert len(fig.frames) == 2 and len(fig.layout.sliders[0].steps) == 2
    np.testing.assert_allclose(
        np.asarray(fig.frames[1].data[0].z), np.round(np.ones((1, 3)) / 3, 3)
    )
    with pytest.raises(ValueError, match="one label per matrix"):
        heatmap_slider_figure([w], ["a", "b"], prefix="", title="t")


def test_future_change_figure_has_a_frame_per_position():
    changes = {"masked": np.triu(np.ones((3, 4)), 1), "unmasked": np.ones((3, 4))}
    fig = future_change_figure(changes)
    assert len(fig.frames) == 3 and len(fig.data) == 2
    np.testing.assert_allclose(np.asarray(fig.frames[2].data[0].y), changes["masked"][2])
    assert "masked" in figure_description(fig)
    with pytest.raises(ValueError, match="same shape"):
        future_change_figure({"a": np.ones((2, 3)), "b": np.ones((3, 3))})


def test_loss_curves_figure():
    fig = loss_curves_figure({"masked": [3.0, 2.0], "unmasked": [3.0, 0.1]}, {"baseline": 2.5})
    assert len(fig.data) == 3
    np.testing.assert_allclose(np.asarray(fig.data[2].y), [2.5, 2.5])
    assert "baseline 2.50" in figure_description(fig)
    with pytest.raises(ValueError, match="at least one"):
        loss_curves_figure({}, {})


def test_padding_drift_figure():
    fig = padding_drift_figure(
        [0, 5], {"masked": [1.0, 1.0], "unmasked": [0.9, 0.5]}, y_title="cosine"
    )
    assert len(fig.data) == 2
    np.testing.assert_allclose(np.asarray(fig.data[1].y), [0.9, 0.5])
    assert "unmasked: 0.900 with 0 and 0.500 with 5" in figure_description(fig)
    with pytest.raises(ValueError, match="one per entry of n_pads"):
        padding_drift_figure([0, 5], {"a": [1.0]}, y_title="cosine")


def test_mask_gallery_uses_a_drop_down_when_buttons_do_not_fit():
    masks = {f"causal {T}": selfattn.causal_mask(T) for T in range(1, 7)}
    menu = mask_gallery_figure(masks).layout.updatemenus[0]
    assert menu.type == "dropdown" and len(menu.buttons) == 6
    assert (
        mask_gallery_figure(dict(list(masks.items())[:4])).layout.updatemenus[0].type == "buttons"
    )
    long = {f"a rather long label number {i}": selfattn.causal_mask(2) for i in range(3)}
    assert mask_gallery_figure(long).layout.updatemenus[0].type == "dropdown"
