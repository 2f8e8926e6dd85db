"""Figure builder for chapter 11: what mean-pooling MiniLM's key/value heads costs, and what it saves.

:func:`gqa_conversion_figure` draws a :class:`selfattn.inference.convert.GQAConversionResult`: lines
of how close the converted model's sentence embeddings stay to the original's (cosine mean and
minimum, rank correlation of pairwise similarities, paraphrase retrieval) against the number of
key/value heads, over bars of the KV cache bytes per token on a second axis. Static: hovering and the
legend (click to hide a series) work with no kernel.

Source: Ainslie et al. 2023, section 2.1; chapter 11 (claim 26).
"""

from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from . import describe

__all__ = ["gqa_conversion_figure"]

# Okabe-Ito colours (as viz.cost); dashes and markers tell the lines apart in grayscale.
_COLOURS = ["#0072B2", "#D55E00", "#009E73", "#CC79A7"]
_DASHES = ["solid", "dash", "dot", "dashdot"]
_MARKERS = ["circle", "diamond", "square", "triangle-up"]
_BAR_COLOUR = "#BBBBBB"


def gqa_conversion_figure(result) -> go.Figure:
    """Embedding fidelity and KV cache size of MiniLM converted to each ``n_kv_heads`` without retraining.

    Args:
        result: a :class:`~selfattn.inference.convert.GQAConversionResult` (from
            :func:`~selfattn.inference.convert.gqa_conversion_sweep`).

    Returns:
        A plotly Figure: x is the number of key/value heads per layer (categories, multi-head on the
        left, multi-query on the right); bars on the right axis give the KV cache bytes per token
        (hover: the saving n_heads / n_kv_heads); lines on the left axis give the cosine of each
        sentence's embedding to the original (mean and minimum), the Spearman correlation of
        pairwise similarities, and the fraction of paraphrases still retrieved first. A text
        description is attached.

    Raises:
        TypeError: ``result`` has no ``rows``. ValueError: it has none.

    Source: chapter 11 (claim 26).
    """
    rows = getattr(result, "rows", None)
    if rows is None:
        raise TypeError(f"result must be a GQAConversionResult; got {type(result).__name__}")
    if not rows:
        raise ValueError("result must hold at least one row")
    rows = sorted(rows, key=lambda r: -r.n_kv_heads)  # multi-head (most heads) first
    x = [str(r.n_kv_heads) for r in rows]
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    fig.add_trace(go.Bar(
        x=x, y=[r.kv_cache_bytes_per_token for r in rows], name="KV cache bytes per token (right axis)",
        marker_color=_BAR_COLOUR, opacity=0.6,
        customdata=[[r.cache_saving, r.group_size] for r in rows],
        hovertemplate=("%{x} key/value heads: %{y} bytes per token<br>cache %{customdata[0]:.0f}x smaller, "
                       "groups of %{customdata[1]} query heads<extra></extra>"),
    ), secondary_y=True)  # fmt: skip
    series = [
        ("embedding cosine to the original, mean", [r.cosine_mean for r in rows]),
        ("embedding cosine to the original, minimum", [r.cosine_min for r in rows]),
        ("rank correlation of pairwise similarities (Spearman)", [r.rank_correlation for r in rows]),
        ("paraphrase retrieved first (fraction)", [r.paraphrase_top1 for r in rows]),
    ]
    for i, (name, values) in enumerate(series):
        fig.add_trace(go.Scatter(
            x=x, y=[round(float(v), 4) for v in values], name=name, mode="lines+markers",
            line={"color": _COLOURS[i], "dash": _DASHES[i]}, marker={"symbol": _MARKERS[i], "size": 9},
            hovertemplate=f"{name}<br>%{{x}} key/value heads: %{{y:.4f}}<extra></extra>",
        ), secondary_y=False)  # fmt: skip
    n_heads = getattr(result, "n_heads", rows[0].n_kv_heads * rows[0].group_size)
    lowest = min(min(r.cosine_min, r.rank_correlation, r.paraphrase_top1) for r in rows)
    fig.update_layout(
        title="Mean-pooled key/value heads, no retraining: what the embeddings keep, what the cache saves",
        height=480, template="plotly_white", legend={"orientation": "h", "y": -0.25}, bargap=0.45,
        margin={"t": 80},
    )  # fmt: skip
    fig.update_xaxes(title_text=f"key/value heads per layer (of {n_heads} query heads)", type="category")
    fig.update_yaxes(title_text="similarity to the original model", range=[min(0.0, lowest - 0.05), 1.05],
                     secondary_y=False)
    fig.update_yaxes(title_text="KV cache bytes per token", rangemode="tozero", showgrid=False, secondary_y=True)
    first, last = rows[0], rows[-1]
    return describe(fig, (
        f"MiniLM converted to grouped-query attention by mean-pooling key and value heads, without retraining, "
        f"for {', '.join(x)} key/value heads. With {first.n_kv_heads} the mean embedding cosine to the original is "
        f"{first.cosine_mean:.4f} and the cache holds {first.kv_cache_bytes_per_token} bytes per token; with "
        f"{last.n_kv_heads} the cosine is {last.cosine_mean:.4f} (minimum {last.cosine_min:.4f}), the rank "
        f"correlation of pairwise similarities {last.rank_correlation:.4f}, and the cache "
        f"{last.kv_cache_bytes_per_token} bytes per token, {last.cache_saving:.0f} times smaller."
    ))  # fmt: skip
