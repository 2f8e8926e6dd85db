"""Chapter 06's head measures against values known from the maths, and its figures' controls."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from selfattn.viz import figure_description
from selfattn.viz.heads import (
    attention_entropy,
    attention_map_figure,
    head_explorer_widget,
    head_summary_figure,
    js_distance,
    key_share,
    layer_head_explorer_figure,
    pairwise_head_distances,
)


def _random_maps(rng, *shape):
    w = rng.random(shape)
    return w / w.sum(-1, keepdims=True)


def test_entropy_is_zero_for_one_hot_rows_and_log_s_for_uniform_rows():
    one_hot = np.eye(5)
    uniform = np.full((5, 5), 0.2)
    np.testing.assert_allclose(
        attention_entropy(np.stack([one_hot, uniform])), [0.0, math.log(5)], atol=1e-12
    )


def test_js_distance_zero_for_equal_maps_and_sqrt_log2_for_disjoint_ones(rng):
    p = _random_maps(rng, 4, 6)
    np.testing.assert_allclose(js_distance(p, p), 0.0, atol=1e-7)
    a, b = np.eye(4), np.roll(np.eye(4), 1, axis=1)  # every row puts its weight on another key
    np.testing.assert_allclose(js_distance(a, b), math.sqrt(math.log(2)), atol=1e-12)


def test_js_distance_matches_the_formula_on_one_row():
    p, q = np.array([[0.5, 0.5, 0.0]]), np.array([[0.25, 0.25, 0.5]])
    m = (p + q) / 2
    kl_pm = 0.5 * math.log(0.5 / 0.375) * 2
    kl_qm = 0.25 * math.log(0.25 / 0.375) * 2 + 0.5 * math.log(0.5 / 0.25)
    assert m.sum() == pytest.approx(1.0)
    np.testing.assert_allclose(js_distance(p, q), math.sqrt((kl_pm + kl_qm) / 2), atol=1e-12)


def test_pairwise_distances_symmetric_with_zero_diagonal(rng):
    w = _random_maps(rng, 4, 5, 5)
    d = pairwise_head_distances(torch.from_numpy(w))  # tensors are accepted too
    assert d.shape == (4, 4)
    np.testing.assert_allclose(d, d.T, atol=1e-12)
    np.testing.assert_allclose(np.diag(d), 0.0, atol=1e-7)
    np.testing.assert_allclose(d[1, 2], js_distance(w[1], w[2]), atol=1e-12)


def test_key_share_sums_the_chosen_columns(rng):
    w = _random_maps(rng, 3, 4, 4)
    np.testing.assert_allclose(key_share(w, [0]), w[..., 0].mean(-1), atol=1e-12)
    np.testing.assert_allclose(key_share(w, range(4)), 1.0, atol=1e-12)
    with pytest.raises(ValueError, match="keys"):
        key_share(w, [4])


def test_measures_refuse_nan_and_negative_weights():
    with pytest.raises(ValueError, match="finite, non-negative"):
        attention_entropy(np.array([[np.nan, 1.0]]))
    with pytest.raises(ValueError, match="finite, non-negative"):
        js_distance(np.array([[-0.5, 1.5]]), np.array([[0.5, 0.5]]))


def test_map_figure_shows_the_weights_and_describes_the_strongest_keys():
    tokens = ["[CLS]", "a", "b"]
    w = np.array([[1.0, 0.0, 0.0], [0.2, 0.1, 0.7], [0.0, 1.0, 0.0]])
    fig = attention_map_figure(tokens, w, "test")
    np.testing.assert_allclose(np.array(fig.data[0].z), w, atol=1e-12)
    assert "b->a" in figure_description(fig) and "a->b" in figure_description(fig)
    with pytest.raises(ValueError, match="T = len"):
        attention_map_figure(tokens, w[:2, :2])


def test_explorer_has_one_frame_and_slider_step_per_layer_and_head(rng):
    tokens = ["[CLS]", "x", "y", "[SEP]"]
    w = _random_maps(rng, 2, 3, 4, 4)
    fig = layer_head_explorer_figure(tokens, w, "x y")
    assert [f.name for f in fig.frames] == ["L0 H0", "L0 H1", "L0 H2", "L1 H0", "L1 H1", "L1 H2"]
    assert [s.args[0][0] for s in fig.layout.sliders[0].steps] == [f.name for f in fig.frames]
    assert [b.args[0][0] for b in fig.layout.updatemenus[0].buttons] == ["L0 H0", "L1 H0"]
    np.testing.assert_allclose(
        np.array(fig.frames[4].data[0].z), w[1, 1], atol=1e-4
    )  # rounded to 4 places
    assert figure_description(fig)


def test_summary_figure_buttons_switch_between_measures():
    a, b = np.arange(6.0).reshape(2, 3) / 10, np.ones((2, 3))
    fig = head_summary_figure({"a": a, "b": b})
    buttons = fig.layout.updatemenus[0].buttons
    assert [btn.label for btn in buttons] == ["a", "b"]
    np.testing.assert_allclose(np.array(buttons[1].args[0]["z"][0]), b)
    np.testing.assert_allclose(np.array(fig.data[0].z), a)
    with pytest.raises(ValueError, match="one \\(L, H\\) array"):
        head_summary_figure({"a": a, "b": np.ones(3)})


def test_live_explorer_builds_with_controls(rng):
    w = _random_maps(rng, 2, 3, 3, 3)
    calls = []

    def run_fn(sentence):
        calls.append(sentence)
        return ["[CLS]", sentence, "[SEP]"], w

    box = head_explorer_widget(run_fn, "hi", layer=1, head=2)  # counted from 0, as the course counts
    text, sliders = box.children[0], box.children[1]
    assert text.value == "hi" and [s.value for s in sliders.children] == [1, 2]
    assert [(s.min, s.max) for s in sliders.children] == [(0, 1), (0, 2)]
    assert calls[0] == "hi"
    with pytest.raises(ValueError, match=r"head must be an int in \[0, 3\) \(counted from 0\); got 3"):
        head_explorer_widget(run_fn, "hi", layer=0, head=3)


def test_maps_have_no_fixed_width_and_fit_a_screen_in_height():
    """A fixed width grown with T (1600 px at T = 40) ran past the book's text column."""
    tokens = [f"t{i}" for i in range(40)]
    w = np.full((2, 2, 40, 40), 1 / 40)
    for fig in (attention_map_figure(tokens, w[0, 0]), layer_head_explorer_figure(tokens, w)):
        assert fig.layout.width is None and fig.layout.autosize is True
        assert fig.layout.height <= 1000
