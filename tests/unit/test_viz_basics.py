"""Chapter 00's figures: the dot product shown equals cos(angle), and the slider has one step per frame."""

from __future__ import annotations

import numpy as np
import pytest

from selfattn.viz import figure_description
from selfattn.viz.basics import dot_product_figure, rotating_dot_product_figure


@pytest.mark.parametrize("degrees", [0, 60, 90, 135, 180, 270])
def test_title_shows_the_cosine(degrees):
    fig = dot_product_figure(degrees)
    value = float(fig.layout.title.text.split("=")[1])
    assert value == pytest.approx(np.cos(np.deg2rad(degrees)), abs=0.006)  # printed to 2 decimals
    assert figure_description(fig)


def test_rotating_figure_has_a_slider_step_per_frame():
    fig = rotating_dot_product_figure(step_degrees=30)
    assert len(fig.frames) == 13  # 0, 30, ..., 360
    steps = fig.layout.sliders[0].steps
    assert [s.args[0][0] for s in steps] == [f.name for f in fig.frames]
    last_b = fig.frames[3].data[1]  # the frame at 90 degrees: b points straight up
    np.testing.assert_allclose([last_b.x[1], last_b.y[1]], [0.0, 1.0], atol=1e-12)
