"""Figures for chapter 13: attention weights beside what the edges move and what they change.

- :func:`edge_measures_figure`: for a set of heads, one heatmap per measure (weight, norm of the
  moved vector, |gradient x weight|, |ablation effect|), two to a row, each scaled to its head's
  largest value; a slider over the heads (explorable with no kernel).
- :func:`edge_measures_widget`: the live explorer (head slider, measure menu) over the same views.
- :func:`key_scatter_figure`: one point per (layer, head, key): attention received against another
  measure, chosen by buttons; special tokens and punctuation drawn apart.
- :func:`token_bars_figure`: one bar per token for several token-level measures, with buttons.

Source: chapter 13.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from . import COLORSCALE, describe, live_output

__all__ = [
    "scaled_per_head",
    "edge_measures_figure",
    "edge_measures_widget",
    "key_scatter_figure",
    "token_bars_figure",
]


def scaled_per_head(values) -> np.ndarray:
    """|values| divided by each head's largest |value|: (N, T, T) -> (N, T, T) in [0, 1].

    A head whose values are all 0 stays 0. Raises ValueError for NaN/inf or a rank other than 3.
    """
    v = np.abs(np.asarray(values, dtype=np.float64))
    if v.ndim != 3 or not np.isfinite(v).all():
        raise ValueError(f"values must be a finite (N, T, T) array; got shape {v.shape}")
    top = v.max(axis=(1, 2), keepdims=True)
    return np.divide(v, top, out=np.zeros_like(v), where=top > 0)


def _check(tokens: Sequence[str], measures: dict, head_labels: Sequence[str]) -> dict:
    if not isinstance(measures, dict) or not measures:
        raise ValueError("measures must be a non-empty dict {name: (N, T, T) array}")
    T, N = len(tokens), len(head_labels)
    scaled = {name: scaled_per_head(m) for name, m in measures.items()}
    for name, m in scaled.items():
        if m.shape != (N, T, T):
            raise ValueError(
                f"measure {name!r} must have shape (N, T, T) = ({N}, {T}, {T}); got {m.shape}"
            )
    return scaled


def _labels(tokens: Sequence[str]) -> list[str]:
    return [f"{i}:{t}" for i, t in enumerate(tokens)]


def edge_measures_figure(
    tokens: Sequence[str],
    measures: dict[str, np.ndarray],
    head_labels: Sequence[str],
    title: str = "",
) -> go.Figure:
    """Heatmaps of several per-edge measures, two to a row (fits the page), a slider over heads.

    Args:
        tokens: the T token strings. measures: ``{name: (N, T, T)}``, rows queries, columns keys;
            absolute values are shown, each scaled to [0, 1] by its head's maximum.
        head_labels: the N head names (e.g. ``"L6 H3"``). title: a prefix for the title.

    Raises:
        ValueError: measures of the wrong shape or not finite.

    Source: chapter 13.
    """
    scaled = _check(tokens, measures, head_labels)
    names = list(scaled)
    labels = _labels(tokens)
    T = len(tokens)
    # Two panels a row at most, so that the figure fits the page's column (no sideways scrolling);
    # heights in pixels: each row of panels, the rotated key labels under it, the title and slider.
    cols = min(len(names), 2)
    rows = math.ceil(len(names) / cols)
    panel, labels_px, top, bottom = max(260, 20 * T + 60), 110, 90, 90
    plot_px = rows * panel + (rows - 1) * labels_px
    fig = make_subplots(rows=rows, cols=cols, subplot_titles=names, horizontal_spacing=0.06,
                        vertical_spacing=labels_px / plot_px if rows > 1 else 0.0)

    def traces(n: int) -> list[go.Heatmap]:
        return [
            go.Heatmap(z=np.round(scaled[name][n], 3).tolist(), x=labels, y=labels,
                       colorscale=COLORSCALE, zmin=0, zmax=1, showscale=(k == len(names) - 1),
                       colorbar={"title": "share of head max"},
                       hovertemplate=f"{name}<br>query %{{y}}<br>key %{{x}}<br>%{{z:.3f}}<extra></extra>")
            for k, name in enumerate(names)
        ]  # fmt: skip

    for k, trace in enumerate(traces(0)):
        fig.add_trace(trace, row=k // cols + 1, col=k % cols + 1)
    prefix = f"{title}: " if title else ""
    fig.frames = [go.Frame(data=traces(n), name=h, traces=list(range(len(names))),
                           layout={"title": {"text": f"{prefix}{h}"}})
                  for n, h in enumerate(head_labels)]  # fmt: skip
    jump = {
        "mode": "immediate",
        "frame": {"duration": 0, "redraw": True},
        "transition": {"duration": 0},
    }
    fig.update_layout(
        title=f"{prefix}{head_labels[0]}", template="plotly_white",
        height=plot_px + labels_px + top + bottom, margin={"t": top, "b": labels_px + bottom},
        sliders=[{"active": 0, "y": -(labels_px + 20) / plot_px, "yanchor": "top", "len": 1.0,
                  "currentvalue": {"prefix": "head: "},
                  "steps": [{"label": h, "method": "animate", "args": [[h], jump]} for h in head_labels]}],
    )  # fmt: skip
    fig.update_yaxes(autorange="reversed")
    fig.update_yaxes(showticklabels=False)
    for r in range(1, rows + 1):
        fig.update_yaxes(showticklabels=True, row=r, col=1)
    fig.update_xaxes(tickangle=-60)
    return describe(
        fig,
        f"{prefix}{len(names)} heatmaps, two to a row ({', '.join(names)}) for one head at a time, "
        f"{T} by {T} tokens (rows: queries, columns: keys), each scaled to the head's largest "
        f"value; a slider picks one of {len(head_labels)} heads.",
    )


def edge_measures_widget(
    tokens: Sequence[str], measures: dict[str, np.ndarray], head_labels: Sequence[str]
):
    """Live explorer (needs a kernel): a head slider and a measure menu; shows one heatmap of
    :func:`edge_measures_figure`'s views at a time. Returns an ``ipywidgets.VBox``.

    Source: chapter 13.
    """
    import ipywidgets as widgets

    scaled = _check(tokens, measures, head_labels)
    labels = _labels(tokens)
    head = widgets.SelectionSlider(options=list(head_labels), description="head")
    measure = widgets.Dropdown(options=list(scaled), description="measure")

    def show(head: str, measure: str) -> None:
        z = scaled[measure][list(head_labels).index(head)]
        fig = go.Figure(go.Heatmap(z=np.round(z, 3).tolist(), x=labels, y=labels,
                                   colorscale=COLORSCALE, zmin=0, zmax=1))  # fmt: skip
        fig.update_layout(title=f"{head}: {measure} (share of head max)", template="plotly_white",
                          height=460, yaxis={"autorange": "reversed"})  # fmt: skip
        describe(fig, f"{head}: heatmap of {measure} per edge, scaled to the head's largest value.")
        fig.show()

    out = live_output(show, {"head": head, "measure": measure})
    return widgets.VBox([widgets.HBox([head, measure]), out])


def key_scatter_figure(
    received: np.ndarray, others: dict[str, np.ndarray], hover: Sequence[str], special: np.ndarray,
    title: str = "",
) -> go.Figure:  # fmt: skip
    """One point per (layer, head, key): attention received (x) against another measure (y).

    Args:
        received: (N,) total attention weight each key receives in its head.
        others: ``{name: (N,)}``, switched with buttons (log-scaled y axis; zeros are clipped to
            the smallest positive value).
        hover: (N,) labels. special: (N,) bool, True for [CLS], [SEP] and punctuation.

    Raises:
        ValueError: arrays of different lengths or not finite.

    Source: chapter 13.
    """
    x = np.asarray(received, dtype=np.float64)
    special = np.asarray(special, dtype=bool)
    ys = {k: np.abs(np.asarray(v, dtype=np.float64)) for k, v in others.items()}
    if not ys or any(v.shape != x.shape for v in ys.values()) or special.shape != x.shape:
        raise ValueError(f"every array must have shape {x.shape}")
    if not (np.isfinite(x).all() and all(np.isfinite(v).all() for v in ys.values())):
        raise ValueError("values must be finite")
    hover = np.asarray(hover)
    names = list(ys)

    def clip(v):
        positive = v[v > 0]
        return np.maximum(v, positive.min() if positive.size else 1e-12)

    fig = go.Figure()
    groups = (("[CLS], [SEP], punctuation", special, "#d55e00", "diamond"),
              ("words", ~special, "#0072b2", "circle"))  # fmt: skip
    for label, sel, colour, symbol in groups:
        fig.add_trace(go.Scatter(
            x=np.round(x[sel], 4), y=clip(ys[names[0]])[sel].tolist(), mode="markers", name=label,
            text=hover[sel].tolist(), marker={"color": colour, "symbol": symbol, "size": 6, "opacity": 0.7},
            hovertemplate="%{text}<br>received %{x:.2f}<br>%{y:.3g}<extra></extra>"))  # fmt: skip
    buttons = [{"label": n, "method": "update",
                "args": [{"y": [clip(ys[n])[special].tolist(), clip(ys[n])[~special].tolist()]},
                         {"yaxis.title.text": n}]} for n in names]  # fmt: skip
    fig.update_layout(
        title=title or "attention received vs. other measures", template="plotly_white", height=480,
        xaxis={"title": "attention weight received (sum over queries)"},
        yaxis={"title": names[0], "type": "log"},
        updatemenus=[{"type": "buttons", "direction": "right", "x": 0.0, "y": 1.15, "xanchor": "left",
                      "buttons": buttons}],
    )  # fmt: skip
    return describe(
        fig,
        f"Scatter plot of {x.size} (layer, head, key) points: attention received on the x axis "
        f"against {', '.join(names)} (buttons) on a log y axis; special tokens and punctuation "
        "are orange diamonds, words blue circles.",
    )


def token_bars_figure(
    tokens: Sequence[str], measures: dict[str, np.ndarray], title: str = ""
) -> go.Figure:
    """One bar per token for one measure at a time (buttons); each measure shown as a share of its
    total over the tokens (absolute values), so that they share one axis.

    Raises:
        ValueError: measures not of length len(tokens), not finite, or all zero.

    Source: chapter 13.
    """
    shares = {}
    for name, m in measures.items():
        v = np.abs(np.asarray(m, dtype=np.float64))
        if v.shape != (len(tokens),) or not np.isfinite(v).all() or v.sum() == 0:
            raise ValueError(f"measure {name!r} must be a finite, non-zero ({len(tokens)},) array")
        shares[name] = v / v.sum()
    names = list(shares)
    labels = _labels(tokens)
    fig = go.Figure(go.Bar(x=labels, y=np.round(shares[names[0]], 4), marker_color="#0072b2"))
    fig.update_layout(
        title=f"{title or 'per token'}: {names[0]}", template="plotly_white", height=400,
        yaxis={"title": "share of the total"}, xaxis={"tickangle": -45},
        updatemenus=[{"type": "buttons", "direction": "right", "x": 0.0, "y": 1.18, "xanchor": "left",
                      "buttons": [{"label": n, "method": "update",
                                   "args": [{"y": [np.round(shares[n], 4).tolist()]},
                                            {"title.text": f"{title or 'per token'}: {n}"}]}
                                  for n in names]}],
    )  # fmt: skip
    top = {n: tokens[int(np.argmax(s))] for n, s in shares.items()}
    return describe(
        fig,
        f"Bar chart over {len(tokens)} tokens of one measure at a time ({', '.join(names)}, "
        f"buttons), each as a share of its total. Largest: "
        + "; ".join(f"{n}: {t}" for n, t in top.items())
        + ".",
    )
