"""Chapter 14's figures (the loss curve, the retrieval frames) and chapter 08's loss by position hold\nthe data they were given."""

from __future__ import annotations

import numpy as np
import pytest

from selfattn.viz import figure_description
from selfattn.viz.training import (
    loss_curve_figure,
    retrieval_explorer_widget,
    retrieval_frames_figure,
    retrieval_step_figure,
)


def test_loss_curve_holds_train_average_validation_and_baselines():
    train = np.linspace(4.0, 2.0, 100)
    fig = loss_curve_figure(train, [50, 100], [3.0, 2.5], {"uniform": 4.5}, window=10)
    raw, average, val = fig.data
    np.testing.assert_allclose(raw.y, np.round(train, 4))
    # The moving average of a straight line lags it by (window - 1) / 2 steps once the window is full.
    np.testing.assert_allclose(average.y[20], np.mean(train[11:21]), atol=1e-4)
    np.testing.assert_allclose(average.y[0], train[0], atol=1e-4)
    assert list(val.x) == [50, 100] and list(val.y) == [3.0, 2.5]
    assert fig.layout.shapes[0].y0 == 4.5
    assert "ends at 2.50" in figure_description(fig)
    with pytest.raises(ValueError, match="equally long"):
        loss_curve_figure(train, [1, 2], [3.0])
    with pytest.raises(ValueError, match="finite"):
        loss_curve_figure([1.0, float("nan")], [1], [1.0])


def test_retrieval_frames_one_frame_per_step_with_a_slider():
    rows = [[0.125] * 8 + [0.0], [0.05] * 7 + [0.65, 0.0]]
    fig = retrieval_frames_figure([0, 10], rows, list(range(8)), [3] * 8, query=7, where=7)
    assert [f.name for f in fig.frames] == ["0", "10"]
    np.testing.assert_allclose(fig.frames[1].data[0].y, rows[1][:8])
    assert (
        len(fig.layout.sliders[0].steps) == 2
        and fig.layout.updatemenus[0].buttons[0].label == "play"
    )
    colours = fig.data[0].marker.color
    assert colours[7] != colours[0]
    assert "from 0.00 at step 0 to 0.00" not in figure_description(fig)
    with pytest.raises(ValueError, match="equally long"):
        retrieval_frames_figure([0], rows, list(range(8)), [3] * 8, 7, 7)


def test_retrieval_step_figure_and_widget():
    row = [0.1] * 8 + [0.0]
    fig = retrieval_step_figure(row, list(range(8)), list(range(8)), query=2, where=2, step=5)
    assert len(fig.data[0].y) == 8 and "step 5" in fig.layout.title.text
    widget = retrieval_explorer_widget([0, 5], [row, row], list(range(8)), list(range(8)), 2, 2)
    assert widget.children[0].value == 5
