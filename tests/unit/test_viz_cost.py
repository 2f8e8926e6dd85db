"""Figure builders of chapters 09-10: data, frames and descriptions."""

import numpy as np
import pytest

from selfattn import ref
from selfattn.viz import figure_description
from selfattn.viz.cost import (
    lookup_figure,
    scaling_figure,
    scaling_view,
    tiles_data,
    tiles_figure,
    tiles_view,
)


def test_scaling_view_reports_the_fitted_slope_in_the_legend():
    fig = scaling_view([1, 2, 4], {"quadratic": [3, 12, 48], "partial": [1, None, 4]}, "memory", "MiB")
    assert fig.data[0].name == "quadratic (slope 2.00)"
    assert fig.data[1].name == "partial (slope 1.00)" and list(fig.data[1].x) == [1, 4]
    assert fig.layout.xaxis.type == "log" and figure_description(fig)


def test_scaling_figure_buttons_show_one_panel_at_a_time():
    fig = scaling_figure([1, 2], {"time": ({"a": [1, 4], "b": [1, 2]}, "s"), "memory": ({"a": [1, 2]}, "MiB")})
    buttons = fig.layout.updatemenus[0].buttons
    assert [b.label for b in buttons] == ["time", "memory"]
    assert buttons[0].args[0]["visible"] == [True, True, False]
    assert buttons[1].args[0]["visible"] == [False, False, True]
    assert [t.visible for t in fig.data] == [True, True, False]


def test_tiles_data_ends_at_the_log_sum_exp_of_each_row():
    scores = np.random.default_rng(0).normal(size=(3, 10))
    steps = tiles_data(scores, 4)
    assert [s["seen"] for s in steps] == [0, 4, 8, 10]
    assert np.all(np.isneginf(steps[0]["lse"]))
    np.testing.assert_allclose(steps[-1]["lse"], np.log(np.exp(scores).sum(-1)), rtol=1e-14)
    np.testing.assert_allclose(steps[-1]["m"], scores.max(-1))
    np.testing.assert_allclose(np.exp(scores - steps[-1]["lse"][:, None]), ref.softmax(scores), rtol=1e-13)


def test_tiles_figure_has_one_frame_per_step_and_small_json():
    scores = np.random.default_rng(1).normal(size=(6, 12))
    fig = tiles_figure(scores, 4)
    assert len(fig.frames) == 4 and len(fig.layout.sliders[0].steps) == 4
    assert len(fig.to_json()) < 300_000
    view = tiles_view(scores, 4, 2)
    assert view.layout.title.text == "after reading keys 0..7 of 12"
    with pytest.raises(ValueError, match="step must be in"):
        tiles_view(scores, 4, 9)


def test_lookup_figure_buttons_and_targets():
    w = np.eye(5)
    fig = lookup_figure({"exact": w, "window": w * 0.5}, np.arange(5))
    assert [b.label for b in fig.layout.updatemenus[0].buttons] == ["exact", "window"]
    assert fig.layout.updatemenus[0].buttons[1].args[0]["visible"] == [False, True, True]
    assert "circles mark the key each query should find" in figure_description(fig)


def test_tiles_layout_keeps_legend_colorbar_and_labels_apart():
    # regression: the legend sat on the slider's "key blocks read" label, and the score colorbar's
    # ticks interleaved with the right panel's query labels
    scores = np.random.default_rng(1).normal(size=(6, 12))
    for fig in (tiles_figure(scores, 4), tiles_view(scores, 4, 1)):
        assert fig.layout.legend.y >= 1.0 and fig.layout.legend.yanchor == "bottom"  # above the panels
        left_end, right_start = fig.layout.xaxis.domain[1], fig.layout.xaxis2.domain[0]
        colorbar = fig.data[0].colorbar
        assert left_end <= colorbar.x < right_start and colorbar.xanchor == "left"  # in the gap
        assert right_start - left_end >= 0.15
        assert fig.layout.yaxis2.showticklabels is False  # the query labels only once, on the left


def test_traffic_figure_has_one_line_per_series_and_panel_with_fitted_slopes():
    from selfattn.viz.cost import traffic_figure

    fig = traffic_figure([256, 512], {"standard": [4, 16], "tiled": [2, 8]}, [1024, 2048],
                         {"standard": [16, 16], "tiled": [8, 4]}, fixed_memory=65536, fixed_length=512)
    assert [t.name for t in fig.data] == ["standard (slope 2.00)", "tiled (slope 2.00)", "standard (slope 0.00)",
                                          "tiled (slope -1.00)"]
    assert fig.layout.xaxis.type == "log" and fig.layout.xaxis2.type == "log" and figure_description(fig)


def test_block_time_figure_marks_where_the_tile_outgrows_each_data_cache():
    from selfattn.viz.cost import block_time_figure

    fig = block_time_figure([32, 64, 128], [3.0, 2.0, 2.5], sdpa_ms=1.5, tile_bytes=[10, 100, 1000],
                            caches={"L1d": 50, "L1i": 50, "L2": 500, "L3": 5000})
    marks = [a.text for a in fig.layout.annotations]
    assert marks == ["tile > L1d", "tile > L2"]  # no instruction cache; the L3 is never outgrown
    assert list(fig.data[1].y) == [1.5, 1.5] and "L2 (0 KiB) from block 128" in figure_description(fig)


def test_machine_roofline_figure_lines_are_min_of_peak_and_bandwidth():
    from selfattn.viz.cost import machine_roofline_figure

    fig = machine_roofline_figure({"cpu": (100e9, 20e9), "gpu": (989e12, 3.35e12)}, {"softmax pass": 1.0})
    cpu, gpu = fig.data
    np.testing.assert_allclose(cpu.y, np.minimum(100.0, np.array(cpu.x) * 20.0), rtol=1e-12)  # GFLOP/s
    assert 5.0 in list(cpu.x) and "balance 5 FLOP/byte" in cpu.name
    assert 989e12 / 3.35e12 in list(gpu.x) and "balance 295 FLOP/byte" in gpu.name
    assert [s.x0 for s in fig.layout.shapes] == [1.0]
    with pytest.raises(ValueError, match="machines"):
        machine_roofline_figure({})
    with pytest.raises(ValueError, match="bytes/s"):
        machine_roofline_figure({"x": (1e9, 0.0)})


def test_machine_roofline_x_axis_is_the_intensity_range_and_labels_do_not_stretch_it():
    """Issue 31: at 390 px chapter 10's roofline ran its x axis to 1e14, plotly widening the autoranged
    axis until the right-anchored label "1024 x 1024 matmul, float32" fit. The range is now fixed to
    intensity_range (log10 units), and a label in the right half of the axis sits left of its line."""
    import math

    from selfattn.viz.cost import machine_roofline_figure

    fig = machine_roofline_figure({"cpu": (100e9, 20e9)}, {"softmax pass": 1.0, "matmul": 1024 / 6},
                                  intensity_range=(0.1, 1e4))
    assert fig.layout.xaxis.autorange is False
    assert fig.layout.xaxis.range == (-1.0, 4.0)
    notes = {a.text: a for a in fig.layout.annotations}
    assert notes["softmax pass"].xanchor == "left" and notes["matmul"].xanchor == "right"
    assert math.isclose(notes["matmul"].x, math.log10(1024 / 6), rel_tol=1e-12)
    assert notes["softmax pass"].y != notes["matmul"].y  # stacked, not side by side at one height
    with pytest.raises(ValueError, match="outside intensity_range"):
        machine_roofline_figure({"cpu": (100e9, 20e9)}, {"big": 1e5}, intensity_range=(0.1, 1e4))
