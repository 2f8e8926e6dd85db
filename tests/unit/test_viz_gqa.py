"""selfattn.viz.gqa: the conversion figure draws the numbers of the result it is given, on the right axes."""

from __future__ import annotations

import math

import pytest
import torch

from selfattn.inference.convert import GQAConversionResult, GQAConversionRow, gqa_conversion_sweep
from selfattn.viz import figure_description
from selfattn.viz.gqa import gqa_conversion_figure


def _row(n, cos_mean, cos_min, rho, para):
    return GQAConversionRow(n_kv_heads=n, group_size=12 // n, cosine_mean=cos_mean, cosine_min=cos_min,
                            rank_correlation=rho, top1_agreement=1.0, paraphrase_top1=para,
                            kv_cache_bytes_per_token=2 * 6 * n * 32 * 4, cache_saving=12 / n)


def _result(rows):
    return GQAConversionResult(rows=tuple(rows), sentences=("a", "b", "c"), paraphrase_pairs=((0, 1),),
                               n_layers=6, n_heads=12, d_head=32, bytes_per_number=4, dtype=torch.float32,
                               original_paraphrase_top1=1.0)


@pytest.fixture
def result():
    # Given out of order: the figure puts multi-head (12) first and multi-query (1) last.
    return _result([_row(1, 0.5, 0.25, 0.6, 0.5), _row(12, 1.0, 1.0, 1.0, 1.0), _row(4, 0.75, 0.5, 0.8, 0.75)])


def test_bars_give_cache_bytes_per_token_on_the_second_axis(result):
    fig = gqa_conversion_figure(result)
    bars = [t for t in fig.data if t.type == "bar"]
    assert len(bars) == 1
    assert list(bars[0].x) == ["12", "4", "1"]
    assert list(bars[0].y) == [18432, 6144, 1536]  # 2 x 6 layers x n_kv x 32 x 4 bytes
    assert bars[0].yaxis == "y2" and fig.layout.yaxis2.title.text == "KV cache bytes per token"
    assert [c[0] for c in bars[0].customdata] == [1, 3, 12]  # the saving, shown on hover
    assert "smaller" in bars[0].hovertemplate


def test_lines_give_cosine_rank_correlation_and_paraphrase_retrieval(result):
    fig = gqa_conversion_figure(result)
    lines = {t.name: t for t in fig.data if t.type == "scatter"}
    assert len(lines) == 4
    expected = {"mean": [1.0, 0.75, 0.5], "minimum": [1.0, 0.5, 0.25], "Spearman": [1.0, 0.8, 0.6],
                "paraphrase": [1.0, 0.75, 0.5]}
    for key, values in expected.items():
        (trace,) = [t for name, t in lines.items() if key in name]
        assert list(trace.x) == ["12", "4", "1"]
        assert list(trace.y) == values and trace.yaxis == "y"
    assert fig.layout.xaxis.type == "category"
    low, high = fig.layout.yaxis.range
    assert low <= 0.2 and high >= 1.0  # the lowest point (0.25) and 1 are in view


def test_description_states_the_end_points(result):
    text = figure_description(gqa_conversion_figure(result))
    assert "18432 bytes per token" in text and "1536 bytes per token" in text and "12 times smaller" in text
    assert "0.5000" in text and "0.2500" in text


def test_real_sweep_figure_draws_the_measured_values(minilm):
    real = gqa_conversion_sweep(minilm, n_kv_heads=(12, 3, 1))
    fig = gqa_conversion_figure(real)
    (mean_line,) = [t for t in fig.data if t.type == "scatter" and "mean" in t.name]
    assert all(math.isfinite(v) for v in mean_line.y)
    assert mean_line.y[0] == pytest.approx(1.0, abs=1e-4)
    assert list(mean_line.y) == [round(real.row(n).cosine_mean, 4) for n in (12, 3, 1)]
    assert mean_line.y[-1] < mean_line.y[0]


def test_bad_input():
    with pytest.raises(TypeError, match="GQAConversionResult"):
        gqa_conversion_figure([1, 2])
    with pytest.raises(ValueError, match="at least one row"):
        gqa_conversion_figure(_result([]))
