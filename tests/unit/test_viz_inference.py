"""Figure builders of chapter 11: the traces hold the inputs, the axes say their units."""

import math

import numpy as np
import pytest

from selfattn.inference.costs import (
    PUBLISHED_ACCELERATORS,
    PUBLISHED_SPECS,
    Accelerator,
    RooflineMeasurement,
    kv_cache_table,
)
from selfattn.inference.decode_timing import DecodeTiming
from selfattn.viz import figure_description
from selfattn.viz.inference import decode_speed_figure, kv_cache_figure, roofline_figure


def _measurement():
    # 100 GFLOP/s, 20 GB/s: balance 5 FLOP/byte; decode reached 2 GFLOP/s at 0.5 FLOP/byte
    return RooflineMeasurement(100e9, 20e9, 2e9, 4e9, 0.5, matmul_n=8, bandwidth_bytes=4, decode_shape=(8, 64, 64),
                               threads=2)


def test_kv_cache_figure_traces_hold_the_table():
    rows = kv_cache_table([PUBLISHED_SPECS["GPT-2 small"], PUBLISHED_SPECS["Llama 3.1 8B"]], [256, 4096, 131072])
    fig = kv_cache_figure(rows)
    # GPT-2 (MHA): one line; Llama 3.1 8B (GQA): its line and the dotted MHA equivalent
    assert [t.name for t in fig.data] == ["GPT-2 small", "Llama 3.1 8B", "Llama 3.1 8B, MHA equivalent"]
    assert list(fig.data[1].x) == [256, 4096, 131072] and list(fig.data[1].y) == [1 / 32, 0.5, 16.0]
    assert list(fig.data[2].y) == [0.125, 2.0, 64.0] and fig.data[2].line.dash == "dot"
    # GPT-2 stops at its 1024 trained positions: 256, then a point at 1024 (36 MiB), nothing beyond
    assert list(fig.data[0].x) == [256, 1024] and list(fig.data[0].y) == [rows[0].gib[0], 36 / 1024]
    assert "trained for at most 1,024 tokens: the line ends there" in fig.data[0].hovertemplate
    assert fig.data[1].line.color == fig.data[2].line.color and fig.data[2].legendgroup == "Llama 3.1 8B"
    assert "131,072 bytes/token" in fig.data[1].hovertemplate
    assert fig.layout.xaxis.type == fig.layout.yaxis.type == "log"
    assert fig.layout.xaxis.title.text == "context length (tokens, log scale)"
    assert fig.layout.yaxis.title.text == "KV cache (GiB, log scale)"
    text = figure_description(fig)
    assert "Llama 3.1 8B 4x" in text and "GPT-2 small 1,024" in text


def test_kv_cache_figure_draws_a_window_flat_and_stops_at_max_context():
    rows = kv_cache_table([PUBLISHED_SPECS["Mistral 7B"], PUBLISHED_SPECS["all-MiniLM-L6-v2"]])  # 1k, 8k, 128k
    fig = kv_cache_figure(rows)
    mistral, mistral_mha, minilm = fig.data
    # up to the window it grows, then flat to max_context 8192; no point at 128k
    assert list(mistral.x) == [1024, 4096, 8192] and list(mistral.y) == [0.125, 0.5, 0.5]
    assert list(mistral_mha.x) == [1024, 4096, 8192] and list(mistral_mha.y) == [0.5, 2.0, 2.0]
    assert "sliding window of 4,096 tokens: the cache stops growing there" in mistral.hovertemplate
    assert "trained for at most 8,192 tokens" in mistral_mha.hovertemplate
    # MiniLM: every length of the table is past its 512 positions; one point, at 512
    assert list(minilm.x) == [512] and list(minilm.y) == [4.5 / 1024]
    text = figure_description(fig)
    assert "stays flat (Mistral 7B at 4,096 tokens)" in text and "all-MiniLM-L6-v2 512" in text


def test_kv_cache_figure_rejects_bad_rows():
    with pytest.raises(ValueError, match="at least one KVCacheRow"):
        kv_cache_figure([])
    with pytest.raises(TypeError, match=r"rows\[0\] must be a KVCacheRow"):
        kv_cache_figure([{"gib": 1}])


def test_roofline_figure_lines_are_min_of_peak_and_bandwidth():
    m = _measurement()
    fig = roofline_figure(m, intensities={"decode": 1.0, "prefill": 2000.0})
    accs = list(PUBLISHED_ACCELERATORS.values())
    assert len(fig.data) == 1 + len(accs) + 1  # this machine, each GPU, the achieved point
    here = fig.data[0]
    x, y = np.array(here.x), np.array(here.y)
    np.testing.assert_allclose(y, np.minimum(100.0, x * 20.0), rtol=1e-12)  # GFLOP/s
    assert 5.0 in list(x) and "balance 5 FLOP/byte" in here.name  # the ridge point is drawn exactly
    for trace, acc in zip(fig.data[1:-1], accs, strict=True):
        assert trace.name.startswith(acc.name)
        np.testing.assert_allclose(trace.y, np.minimum(acc.flops_per_s, np.array(trace.x) * acc.bytes_per_s) / 1e9,
                                   rtol=1e-12)
        assert acc.balance in list(trace.x)
    point = fig.data[-1]
    assert list(point.x) == [0.5] and list(point.y) == [2.0]
    assert [s.x0 for s in fig.layout.shapes] == [1.0, 2000.0]
    assert [a.text for a in fig.layout.annotations] == ["decode", "prefill"]
    assert [a.x for a in fig.layout.annotations] == [0.0, math.log10(2000.0)]  # log axes: annotations in log10
    assert fig.layout.xaxis.title.text == "arithmetic intensity (FLOP/byte, log scale)"
    assert fig.layout.yaxis.title.text == "attainable (GFLOP/s, log scale)"
    assert figure_description(fig)


def test_roofline_figure_defaults_and_errors():
    m = _measurement()
    only = roofline_figure(m, published=[Accelerator("X", 1e12, 1e11, "bf16", "s")])
    assert len(only.data) == 3 and [s.x0 for s in only.layout.shapes] == [0.5]
    with pytest.raises(TypeError, match="measurement must be a RooflineMeasurement"):
        roofline_figure({})
    with pytest.raises(ValueError, match="intensities"):
        roofline_figure(m, intensities={"bad": 0.0})
    with pytest.raises(ValueError, match="intensity_range"):
        roofline_figure(m, intensity_range=(10.0, 1.0))


def test_decode_speed_figure_traces_hold_the_timings():
    result = DecodeTiming([64, 256], {True: [0.002, 0.0025], False: [0.004, 0.02]}, n_new=4, repeats=3, batch=1,
                          threads=2)
    fig = decode_speed_figure(result)
    assert len(fig.data) == 2
    cached, uncached = fig.data
    assert list(cached.x) == [64, 256] and list(cached.y) == [500.0, 400.0]
    assert list(uncached.y) == [250.0, 50.0]
    assert [c[1] for c in cached.customdata] == [2.0, 8.0]  # the cached / uncached ratio, on hover
    assert [c[0] for c in uncached.customdata] == [4.0, 20.0]  # ms per token
    assert fig.layout.xaxis.title.text == "context length (tokens, log scale)"
    assert fig.layout.yaxis.title.text == "generated tokens per second (log scale)"
    assert "8x at 256" in figure_description(fig)
    one = decode_speed_figure(DecodeTiming([8], {True: [0.01]}, n_new=1, repeats=1, batch=1, threads=1))
    assert len(one.data) == 1 and "cached / uncached" not in one.data[0].hovertemplate
    with pytest.raises(TypeError, match="result must be a DecodeTiming"):
        decode_speed_figure([1, 2])


def test_kv_cache_readout_states_the_cache_computed_by_hand():
    from selfattn.inference.costs import PUBLISHED_SPECS
    from selfattn.viz.inference import kv_cache_readout

    text = kv_cache_readout(PUBLISHED_SPECS["Llama 3.1 8B"], 8, 8192, 4, 2)
    per_token = 2 * 32 * 8 * 128 * 2  # 131,072 bytes
    assert f"{per_token:,} bytes per token" in text
    assert f"{per_token * 8192 * 4 / 2**30:,.2f} GiB" in text  # 4.00 GiB
    assert f"{per_token * 4 * 8192 * 4 / 2**30:,.2f} GiB (4x)" in text  # 32 KV heads: 16.00 GiB
    windowed = kv_cache_readout(PUBLISHED_SPECS["Mistral 7B"], 8, 8192, 1, 2)
    assert "its window keeps 4,096 of them" in windowed and "0.50 GiB" in windowed
    with pytest.raises(ValueError):
        kv_cache_readout(PUBLISHED_SPECS["Llama 3.1 8B"], 5, 8192, 1, 2)  # 5 does not divide 32
    with pytest.raises(ValueError, match="max_context"):
        kv_cache_readout(PUBLISHED_SPECS["GPT-2 small"], 12, 2048, 1, 2)


def test_kv_cache_calculator_widget_follows_its_controls():
    from selfattn.viz.inference import CACHE_FORMATS, kv_cache_calculator_widget

    box = kv_cache_calculator_widget("Llama 3.1 70B")
    model, heads, context, batch, fmt, readout = box.children
    assert heads.options == (1, 2, 4, 8, 16, 32, 64) and heads.value == 8 and context.value == 8192
    assert "327,680 bytes per token" in readout.value  # 2 x 80 x 8 x 128 x 2
    heads.value = 64
    assert f"{2 * 80 * 64 * 128 * 2:,} bytes per token" in readout.value
    fmt.value = "4-bit"
    assert f"{2 * 80 * 64 * 128 // 2:,} bytes per token" in readout.value and CACHE_FORMATS["4-bit"] == 0.5
    model.value = "GPT-2 small"  # the other controls follow the model: its heads and its 1,024 positions
    assert heads.value == 12 and context.options[-1] == 1024 and context.value == 1024
    assert f"{2 * 12 * 12 * 64 // 2:,} bytes per token" in readout.value
    with pytest.raises(ValueError, match="model must be one of"):
        kv_cache_calculator_widget("GPT-5")


def test_decode_sweep_figure_points_are_the_counted_rates():
    from selfattn.inference.decode_timing import DecodeStepPoint, DecodeSweep, decode_step_counts
    from selfattn.viz.inference import decode_sweep_figure

    def point(G, B, seconds):
        flops, nbytes = decode_step_counts(8, G, B, 1024, 64)
        return DecodeStepPoint(G, B, flops, nbytes, seconds, (seconds,))

    groups = [point(1, 1, 0.01), point(8, 1, 0.02)]
    sweep = DecodeSweep(groups, [groups[-1], point(8, 4, 0.05)], 1e-5, 8, 1024, 64, 2)
    fig = decode_sweep_figure(sweep, _measurement())
    roof, g, b = fig.data
    np.testing.assert_allclose(roof.y, np.minimum(100.0, np.array(roof.x) * 20.0), rtol=1e-12)  # GFLOP/s
    assert list(g.x) == [p.intensity for p in groups]
    np.testing.assert_allclose(b.y, [groups[-1].flops / 0.02 / 1e9, sweep.batches[-1].flops / 0.05 / 1e9], rtol=1e-12)
    assert "1,024 positions" in figure_description(fig)
    with pytest.raises(TypeError, match="sweep must be a DecodeSweep"):
        decode_sweep_figure(None, _measurement())
