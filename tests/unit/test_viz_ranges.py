"""The figure builders that draw labelled vertical lines on log axes keep the axes on their data
(issue 31, item 2): an annotation on a log axis is placed at log10 of the value."""

from __future__ import annotations

import math

import numpy as np
import pytest

from selfattn.viz import add_marked_vline
from selfattn.viz.cost import block_time_figure
from selfattn.viz.streaming import streaming_loss_figure

from ..figure_extent import stray_marks


def test_block_time_figure_labels_sit_on_the_data():
    fig = block_time_figure([8, 16, 32, 64, 128], [5.0, 4.0, 3.0, 3.0, 4.0], sdpa_ms=2.0,
                            tile_bytes=[1e3, 4e3, 16e3, 64e3, 256e3], caches={"L1d": 32768, "L2": 1 << 20})
    labels = {a.text: a.x for a in fig.layout.annotations}
    assert labels.keys() == {"tile > L1d"}
    assert labels["tile > L1d"] == pytest.approx(math.log10(64), abs=1e-12)  # the first block whose tile > 32 KiB
    assert fig.layout.shapes[0].x0 == 64.0  # the line itself in data units
    assert stray_marks(fig.to_plotly_json()) == []


@pytest.mark.parametrize("log_x", [True, False])
def test_streaming_loss_figure_labels_sit_on_the_data(log_x):
    fig = streaming_loss_figure({"full cache": np.linspace(3.0, 2.0, 300)}, window=64, train_length=128, log_x=log_x)
    labels = {a.text: a.x for a in fig.layout.annotations}
    want = {"window 64": 63.5, "training length 128": 127.5}
    for text, value in want.items():
        assert labels[text] == pytest.approx(math.log10(value) if log_x else value, abs=1e-12)
    assert stray_marks(fig.to_plotly_json()) == []


def test_the_check_catches_a_label_in_data_units_on_a_log_axis():
    import plotly.graph_objects as go

    fig = go.Figure(go.Scatter(x=[8, 16, 32, 64], y=[1, 2, 3, 4]))
    fig.update_xaxes(type="log")
    fig.add_vline(x=32, annotation_text="at 32")  # plotly puts the label at x=32: 1e32 on a log axis
    problems = stray_marks(fig.to_plotly_json())
    assert len(problems) == 1 and "'at 32'" in problems[0]


def test_add_marked_vline_refuses_bad_input():
    import plotly.graph_objects as go

    with pytest.raises(ValueError, match="x must be finite and > 0"):
        add_marked_vline(go.Figure(), 0.0, "zero", log_x=True)
    with pytest.raises(ValueError, match="side"):
        add_marked_vline(go.Figure(), 1.0, "one", log_x=False, side="up")
