"""Chapter 02's figures: what they plot equals the reference softmax, and each slider step has a frame."""

from __future__ import annotations

import math

import numpy as np
import pytest

from selfattn import ref
from selfattn.experiments.scaling import random_scores
from selfattn.viz import figure_description
from selfattn.viz.softmax import (
    scaling_data,
    scaling_figure,
    scaling_view,
    temperature_figure,
    temperature_view,
)

SCORES = [2.0, 1.0, 0.5, -1.0]


@pytest.mark.parametrize("temperature", [0.1, 1.0, 10.0])
def test_temperature_view_plots_the_reference_softmax(temperature):
    fig = temperature_view(SCORES, temperature)
    np.testing.assert_allclose(fig.data[0].y, ref.softmax(np.array(SCORES) / temperature), atol=1e-12)
    assert figure_description(fig)


def test_temperature_view_refuses_a_non_positive_temperature():
    with pytest.raises(ValueError, match="temperature"):
        temperature_view(SCORES, 0.0)


def test_temperature_figure_has_a_slider_step_per_frame():
    fig = temperature_figure(SCORES, temperatures=(0.5, 1.0, 2.0))
    assert [s.args[0][0] for s in fig.layout.sliders[0].steps] == [f.name for f in fig.frames] == ["0.5", "1", "2"]
    np.testing.assert_allclose(fig.frames[0].data[0].y, ref.softmax(np.array(SCORES) / 0.5), atol=1e-12)


def test_scaling_data_sorted_weights_match_the_reference():
    d_head = 64
    data = scaling_data(d_head, n_queries=200, n_keys=8, seed=3)
    scores = random_scores(d_head, 200, 8, seed=3).numpy()
    expected = np.sort(ref.softmax(scores / math.sqrt(d_head)), axis=-1)[:, ::-1].mean(axis=0)
    np.testing.assert_allclose(data["sorted_scaled"], expected, atol=1e-12)
    np.testing.assert_allclose(data["sorted_unscaled"].sum(), 1.0, atol=1e-12)
    width = np.diff(data["bin_centres"])[0]
    np.testing.assert_allclose(data["hist_scaled"].sum() * width, 1.0, atol=1e-9)  # a density


def test_scaling_figure_frames_and_view_agree():
    fig = scaling_figure(d_heads=(4, 256), n_queries=100)
    assert [s.args[0][0] for s in fig.layout.sliders[0].steps] == [f.name for f in fig.frames] == ["4", "256"]
    view = scaling_view(256, n_queries=100)
    for frame_trace, view_trace in zip(fig.frames[1].data, view.data, strict=True):
        np.testing.assert_allclose(frame_trace.y, view_trace.y, atol=1e-12)
    assert figure_description(fig) and figure_description(view)
    assert len(fig.to_json()) < 300_000


def test_scaling_figure_legend_is_above_the_plot_and_the_slider_below():
    """The slider (below the plot) drew over a legend placed below the plot."""
    fig = scaling_figure(d_heads=(4, 16), n_queries=20)
    assert fig.layout.legend.y >= 1.0 and fig.layout.legend.yanchor == "bottom"
    slider = fig.layout.sliders[0]
    assert (slider.y if slider.y is not None else 0) <= 0 and (slider.yanchor or "top") == "top"
