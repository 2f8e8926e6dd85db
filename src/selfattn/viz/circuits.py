"""Figures for chapter 15: logit attribution, activation patching and circuits (readable with no kernel).

- :func:`loss_curve_figure`: training loss per step (smoothed), with the uniform baseline.
- :func:`attribution_figure`: a logit's parts, one bar each, and the heads' parts as a layer x head grid.
- :func:`patching_figure`: restored fraction per (row, column): (layer, position) or (layer, head).
- :func:`circuit_figure`: a (V, V) circuit as a heatmap.

Source: chapter 15.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from . import describe

__all__ = ["loss_curve_figure", "attribution_figure", "patching_figure", "circuit_figure"]


def _finite(name: str, x, ndim: int) -> np.ndarray:
    a = np.asarray(x, dtype=float)
    if a.ndim != ndim or a.size == 0 or not np.isfinite(a).all():
        raise ValueError(f"{name} must be a finite, non-empty {ndim}-D array; got shape {a.shape}")
    return a


def loss_curve_figure(losses, uniform: float, *, window: int = 25, title: str = "") -> go.Figure:
    """Training loss per step (light) and its running mean over ``window`` steps, with ``log V`` dashed.

    Raises:
        ValueError: losses not a finite 1-D array; window not a positive int.
    """
    y = _finite("losses", losses, 1)
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise ValueError(f"window must be a positive int; got {window!r}")
    steps = np.arange(1, len(y) + 1)
    smooth = np.convolve(y, np.ones(window) / window, mode="valid")
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=steps, y=y, mode="lines", name="per step", line=dict(color="#56B4E9", width=1),
                             opacity=0.5))
    fig.add_trace(go.Scatter(x=steps[window - 1:], y=smooth, mode="lines", name=f"mean of {window} steps",
                             line=dict(color="#0072B2", width=2.5)))
    fig.add_hline(y=uniform, line=dict(dash="dash", color="#D55E00"))
    fig.add_annotation(x=steps[-1], y=uniform, text="uniform guess, log V", showarrow=False, yshift=10, xanchor="right")
    fig.update_layout(title=title or "Training loss", xaxis_title="step", yaxis_title="loss (nats per token)",
                      template="plotly_white", height=380)
    return describe(fig, f"Line chart of the training loss over {len(y)} steps: from {smooth[0]:.2f} nats (mean of "
                         f"the first {window} steps) to {smooth[-1]:.2f} (last {window}); the uniform guess is "
                         f"{uniform:.2f}.")


def attribution_figure(labels: Sequence[str], parts, heads, logit: float, title: str = "") -> go.Figure:
    """Left: one bar per part of the logit; right: the heads' parts as a (layer, head) heatmap.

    Args:
        labels, parts: the parts (n,) of :class:`selfattn.circuits.Attribution`. heads: (L, H).
        logit: the logit they sum to.

    Raises:
        ValueError: parts not finite or of another length than labels; heads not a finite 2-D array.
    """
    p = _finite("parts", parts, 1)
    if len(labels) != len(p):
        raise ValueError(f"labels and parts must have one length; got {len(labels)} and {len(p)}")
    g = _finite("heads", heads, 2)
    L, H = g.shape
    fig = make_subplots(rows=1, cols=2, column_widths=[0.6, 0.4], horizontal_spacing=0.14,
                        subplot_titles=("every part (sums to the logit)", "heads: layer x head"))
    colours = ["#0072B2" if v >= 0 else "#D55E00" for v in p]
    fig.add_trace(go.Bar(x=list(labels), y=np.round(p, 4), marker_color=colours, showlegend=False,
                         hovertemplate="%{x}: %{y}<extra></extra>"), row=1, col=1)
    m = float(np.abs(g).max()) or 1.0
    fig.add_trace(go.Heatmap(z=np.round(g, 3), x=[f"head {h}" for h in range(H)], y=[f"layer {i}" for i in range(L)],
                             zmin=-m, zmax=m, zmid=0, colorscale="RdBu", text=np.round(g, 2), texttemplate="%{text}",
                             hovertemplate="%{y}, %{x}: %{z}<extra></extra>"), row=1, col=2)
    fig.update_yaxes(autorange="reversed", row=1, col=2)
    fig.update_yaxes(title_text="contribution to the logit", row=1, col=1)
    fig.update_layout(title=title or f"Direct logit attribution (logit {logit:.3f})", template="plotly_white",
                      height=400)
    order = np.argsort(-np.abs(p))
    top = ", ".join(f"{labels[i]} {p[i]:+.2f}" for i in order[:3])
    return describe(fig, f"Bar chart of {len(p)} parts summing to the logit {logit:.2f}; the largest: {top}. "
                         f"Heatmap of the {L} x {H} heads' parts, red negative, blue positive.")


def patching_figure(grid, columns: Sequence[str], rows: Sequence[str], title: str = "",
                    xaxis: str = "position") -> go.Figure:
    """A heatmap of restored fractions (1: the clean metric restored, 0: nothing), diverging around 0.

    Raises:
        ValueError: grid not a finite 2-D array matching ``rows`` x ``columns``.
    """
    g = _finite("grid", grid, 2)
    if g.shape != (len(rows), len(columns)):
        raise ValueError(f"grid must have shape (len(rows), len(columns)) = {(len(rows), len(columns))}; got {g.shape}")
    m = max(1.0, float(np.abs(g).max()))
    xs = [f"{i}:{c}" for i, c in enumerate(columns)]
    fig = go.Figure(go.Heatmap(z=np.round(g, 3), x=xs, y=list(rows), zmin=-m, zmax=m, zmid=0, colorscale="RdBu",
                               text=np.round(g, 2), texttemplate="%{text}", colorbar=dict(title="restored"),
                               hovertemplate="%{y}, %{x}: %{z}<extra></extra>"))
    fig.update_yaxes(autorange="reversed")
    fig.update_layout(title=title or "Activation patching", xaxis_title=xaxis, template="plotly_white",
                      height=260 + 34 * len(rows))
    i, j = np.unravel_index(np.argmax(g), g.shape)
    return describe(fig, f"Heatmap, {len(rows)} rows by {len(columns)} columns, of the fraction of the clean metric "
                         f"each patch restores; the largest, {g[i, j]:.2f}, at {rows[i]}, {xaxis} {xs[j]}.")


def circuit_figure(matrix, title: str = "", axis: str = "token") -> go.Figure:
    """A (V, V) circuit (query or source token as rows, key or logit token as columns), diverging colours.

    Raises:
        ValueError: not a finite square 2-D array.
    """
    a = _finite("matrix", matrix, 2)
    if a.shape[0] != a.shape[1]:
        raise ValueError(f"matrix must be square; got {a.shape}")
    m = float(np.abs(a).max()) or 1.0
    fig = go.Figure(go.Heatmap(z=np.round(a, 3), zmin=-m, zmax=m, zmid=0, colorscale="RdBu",
                               hovertemplate="row %{y}, column %{x}: %{z}<extra></extra>"))
    fig.update_yaxes(autorange="reversed", title_text=f"{axis} (row)")
    fig.update_xaxes(title_text=f"{axis} (column)")
    fig.update_layout(title=title or "Circuit", template="plotly_white", height=420)
    diag, off = float(np.diag(a).mean()), float(a[~np.eye(len(a), dtype=bool)].mean())
    return describe(fig, f"Heatmap of a {len(a)} x {len(a)} circuit; mean diagonal entry {diag:.2f}, mean "
                         f"off-diagonal entry {off:.2f}.")
