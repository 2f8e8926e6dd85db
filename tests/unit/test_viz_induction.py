"""Chapter 14's induction-head figures: traces, buttons, the marked span, descriptions, refusals."""

from __future__ import annotations

import numpy as np
import pytest

from selfattn.viz import figure_description
from selfattn.viz.induction import (
    composition_figure,
    head_patterns_figure,
    head_scores_figure,
    span_loss_figure,
)

OKABE_ITO = {"#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9"}


def test_span_loss_figure_draws_each_curve_and_the_uniform_line():
    first, second = np.full(5, 3.4), np.linspace(2.0, 0.2, 5)
    fig = span_loss_figure(first, second, np.log(32), {"previous-token head ablated": np.full(5, 3.0)})
    assert [t.name for t in fig.data] == ["first occurrence", "second occurrence",
                                          "second, previous-token head ablated"]
    np.testing.assert_allclose(fig.data[1].y, np.round(second, 3))
    assert {t.line.color for t in fig.data} <= OKABE_ITO
    assert fig.layout.shapes[0].y0 == pytest.approx(np.log(32))
    assert "second occurrence 1.10" in figure_description(fig)
    with pytest.raises(ValueError, match="same length"):
        span_loss_figure(first, second[:3], 3.0)
    with pytest.raises(ValueError, match="finite"):
        span_loss_figure(first, np.full(5, np.nan), 3.0)


def test_head_scores_figure_has_two_heatmaps_and_names_the_best_heads():
    prev = np.array([[0.1, 0.9], [0.05, 0.0]])
    ind = np.array([[0.0, 0.1], [0.8, 0.6]])
    fig = head_scores_figure(prev, ind)
    assert len(fig.data) == 2 and all(t.type == "heatmap" for t in fig.data)
    np.testing.assert_allclose(fig.data[1].z, ind)
    text = figure_description(fig)
    assert "previous-token score: layer 0 head 1 (0.90)" in text and "induction score: layer 1 head 0 (0.80)" in text
    with pytest.raises(ValueError, match="one shape"):
        head_scores_figure(prev, ind[:1])


def test_head_patterns_figure_one_trace_per_head_buttons_and_the_box():
    T = 8
    pats = {"L0 H0": np.eye(T), "L1 H0": np.tril(np.ones((T, T))) / np.arange(1, T + 1)[:, None]}
    fig = head_patterns_figure(list("abcdabcd"), pats, first=0, second=4, span=4)
    assert len(fig.data) == 2 and [t.visible for t in fig.data] == [True, False]
    buttons = fig.layout.updatemenus[0].buttons
    assert [b.label for b in buttons] == ["L0 H0", "L1 H0"] and buttons[1].args[0]["visible"] == [False, True]
    box = fig.layout.shapes[0]
    assert (box.x0, box.x1, box.y0, box.y1) == (-0.5, 3.5, 3.5, 7.5)
    assert "buttons" in figure_description(fig)
    with pytest.raises(ValueError, match="span must fit"):
        head_patterns_figure(list("abcdabcd"), pats, first=2, second=4, span=4)
    with pytest.raises(ValueError, match="shape"):
        head_patterns_figure(list("abc"), pats, first=0, second=1, span=1)


def test_composition_figure_groups_three_kinds_over_every_pair():
    scores = {"keys": np.array([[0.1, 0.2], [0.3, 0.05]]), "queries": np.full((2, 2), 0.1),
              "values": np.full((2, 2), 0.12)}
    base = {"keys": 0.17, "queries": 0.17, "values": 0.18}
    fig = composition_figure(scores, base)
    assert [t.name for t in fig.data] == ["K-composition", "Q-composition", "V-composition"]
    assert list(fig.data[0].x) == ["L0 H0 → L1 H0", "L0 H0 → L1 H1", "L0 H1 → L1 H0", "L0 H1 → L1 H1"]
    np.testing.assert_allclose(fig.data[0].y, [0.1, 0.2, 0.3, 0.05])
    assert len(fig.layout.shapes) == 3 and fig.layout.shapes[0].y0 == pytest.approx(0.17)
    assert "layer 0 head 1 into layer 1 head 0, 0.300" in figure_description(fig)
    with pytest.raises(ValueError, match="keys"):
        composition_figure({"keys": scores["keys"]}, base)
