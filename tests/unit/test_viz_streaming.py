"""selfattn.viz.streaming: the loss figure draws the given curves (smoothed), the window and the
training length; the ring-buffer figure shows the slots a real SlidingWindowCache holds."""

from __future__ import annotations

import numpy as np
import pytest

from selfattn.viz import figure_description
from selfattn.viz.streaming import ring_buffer_figure, ring_buffer_slots, streaming_loss_figure
from selfattn.viz.training import moving_average


def test_streaming_loss_figure_draws_each_setting_with_its_moving_average():
    rng = np.random.default_rng(0)
    losses = {"full cache": 2 + rng.random(200), "window 32, 0 sinks": 1.5 + rng.random(200)}
    fig = streaming_loss_figure(losses, window=32, train_length=64, smooth=8, baselines={"reference": 1.9})
    names = [t.name for t in fig.data]
    assert names[:2] == ["full cache", "window 32, 0 sinks"] and names[2] == "reference = 1.90"
    for trace, curve in zip(fig.data[:2], losses.values(), strict=True):
        assert list(trace.x) == list(range(1, 200))  # log axis: from position 1
        np.testing.assert_allclose(trace.y, np.round(moving_average(curve, 8)[1:], 4), rtol=0, atol=1e-12)
    assert fig.layout.xaxis.type == "log"
    assert sorted(s.x0 for s in fig.layout.shapes) == [31.5, 63.5]  # the window and the training length
    text = figure_description(fig)
    assert f"full cache: {losses['full cache'][:64].mean():.2f} at positions 0-63" in text
    assert f"{losses['window 32, 0 sinks'][64:].mean():.2f} at positions 64-199" in text
    linear = streaming_loss_figure(losses, window=32, log_x=False, smooth=1)
    np.testing.assert_allclose(linear.data[0].y, np.round(losses["full cache"], 4), rtol=0, atol=1e-12)
    with pytest.raises(ValueError, match="must be finite"):
        streaming_loss_figure({"x": [1.0, float("nan")]}, window=4)
    with pytest.raises(ValueError, match="window must be an int >= 1"):
        streaming_loss_figure(losses, window=0)
    with pytest.raises(ValueError, match="at least one"):
        streaming_loss_figure({}, window=4)


def test_ring_buffer_slots_and_figure_show_sinks_and_the_rolling_window():
    slots = ring_buffer_slots(4, 1, 7)
    assert slots.tolist() == [[0, -1, -1, -1, -1], [0, 1, -1, -1, -1], [0, 1, 2, -1, -1], [0, 1, 2, 3, -1],
                              [0, 1, 2, 3, 4], [0, 5, 2, 3, 4], [0, 5, 6, 3, 4]]
    fig = ring_buffer_figure(window=6, n_sinks=2, n_steps=15)
    heat = fig.data[0]
    assert list(heat.x[:3]) == ["sink 0", "sink 1", "slot 2"] and len(heat.x) == 8 and len(heat.y) == 15
    assert list(heat.text[-1]) == ["0", "1", "14", "9", "10", "11", "12", "13"]  # after token 14: 8 evicted
    z = np.array(heat.z, dtype=float)
    assert z[-1].tolist() == [0, 0, 2, 1, 1, 1, 1, 1]  # sinks, the slot just written, the window
    assert np.isnan(z[0, 1:]).all() and heat.text[0][1] == ""  # empty slots are blank
    assert "sink" in heat.customdata[-1][0] and "text position 14" in heat.customdata[-1][2]
    assert "0, 1, 14, 9, 10, 11, 12, 13" in figure_description(fig)
    with pytest.raises(ValueError, match="window must be an int >= 1"):
        ring_buffer_figure(window=0)
