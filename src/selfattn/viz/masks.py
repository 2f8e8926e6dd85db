"""Figure builders for chapters 04 and 05: masks, masked attention weights, the peeking model.

Every builder returns a ``plotly.graph_objects.Figure`` with a text description attached; none
shows it. Masks are drawn with True (may attend) in the bright end of Viridis and False (blocked)
in the dark end; rows are queries (T), columns keys (S).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import plotly.graph_objects as go

from . import COLORSCALE, describe

__all__ = [
    "mask_heatmap",
    "mask_gallery_figure",
    "weights_heatmap",
    "heatmap_slider_figure",
    "future_change_figure",
    "loss_curves_figure",
    "padding_drift_figure",
]

_MASK_COLORS = [
    [0.0, "#440154"],
    [0.5, "#440154"],
    [0.5, "#fde725"],
    [1.0, "#fde725"],
]  # Viridis ends


def _as_matrix(name: str, x) -> np.ndarray:
    arr = x.detach().cpu().numpy() if hasattr(x, "detach") else np.asarray(x)
    if arr.ndim != 2:
        raise ValueError(f"{name} must be a 2-D (T, S) array; got shape {arr.shape}")
    return arr


def _mask_trace(mask: np.ndarray, x_labels=None, y_labels=None) -> go.Heatmap:
    T, S = mask.shape
    return go.Heatmap(
        z=mask.astype(int), x=list(x_labels) if x_labels is not None else list(range(S)),
        y=list(y_labels) if y_labels is not None else list(range(T)), zmin=0, zmax=1,
        colorscale=_MASK_COLORS, xgap=1, ygap=1,
        colorbar={"tickvals": [0, 1], "ticktext": ["blocked", "may attend"], "len": 0.5},
        hovertemplate="query %{y}, key %{x}: %{z}<extra></extra>",
    )  # fmt: skip


def _axes(
    fig: go.Figure, x_title: str = "key position j", y_title: str = "query position i"
) -> None:
    fig.update_xaxes(title=x_title, side="top", type="category")
    fig.update_yaxes(title=y_title, autorange="reversed", type="category", scaleanchor="x")
    # The key axis sits on top, under the title: pin the title to the top edge and leave room for
    # rotated tick labels (tokens) between them.
    fig.update_layout(
        template="plotly_white", height=470, margin={"t": 150}, title_y=0.98, title_yanchor="top"
    )


def mask_heatmap(
    mask, title: str = "boolean keep-mask", *, x_labels=None, y_labels=None
) -> go.Figure:
    """One boolean keep-mask (T, S) as a grid: bright = may attend, dark = blocked.

    Args:
        mask: 2-D boolean array or tensor (T, S). title: the figure's title.
        x_labels, y_labels: optional tick labels for keys (S) and queries (T), e.g. tokens.

    Raises:
        ValueError: ``mask`` is not 2-D.

    Source: chapter 04.
    """
    mask = _as_matrix("mask", mask).astype(bool)
    fig = go.Figure(_mask_trace(mask, x_labels, y_labels))
    fig.update_layout(title=title)
    _axes(fig)
    T, S = mask.shape
    return describe(fig, f"{title}: a {T} by {S} grid, queries as rows and keys as columns; "
                         f"{int(mask.sum())} of {T * S} cells may attend.")  # fmt: skip


def mask_gallery_figure(masks: Mapping[str, object]) -> go.Figure:
    """Several masks in one figure, one button (or drop-down entry, when buttons would not fit) each;
    no kernel needed.

    Args:
        masks: ``{button label: 2-D boolean mask}``, at least one; masks may differ in shape.

    Raises:
        ValueError: no mask, or a mask that is not 2-D.

    Source: chapter 04 (causal, top_left, bottom_right) and chapter 05 (padding).
    """
    if not masks:
        raise ValueError("masks must hold at least one {label: mask} entry")
    arrays = {label: _as_matrix(f"masks[{label!r}]", m).astype(bool) for label, m in masks.items()}
    labels = list(arrays)
    fig = go.Figure(_mask_trace(arrays[labels[0]]))
    buttons = []
    for label in labels:
        m = arrays[label]
        T, S = m.shape
        buttons.append({
            "label": label, "method": "update",
            "args": [{"z": [m.astype(int)], "x": [list(range(S))], "y": [list(range(T))]},
                     {"title": {"text": f"{label}: T={T} queries, S={S} keys"}}],
        })  # fmt: skip
    T, S = arrays[labels[0]].shape
    # A row of buttons while they fit the page's width (about 60 characters); a drop-down menu beyond.
    fits = len(labels) <= 4 and sum(len(label) + 4 for label in labels) <= 60
    fig.update_layout(
        title=f"{labels[0]}: T={T} queries, S={S} keys",
        updatemenus=[{"type": "buttons" if fits else "dropdown", "direction": "right" if fits else "down",
                      "x": 0.0, "y": 1.02, "xanchor": "left", "yanchor": "bottom", "showactive": True,
                      "buttons": buttons}],
    )  # fmt: skip
    _axes(fig)
    fig.update_xaxes(side="bottom")  # the controls sit above the grid, the key axis below it
    fig.update_layout(margin={"t": 110})
    summary = "; ".join(f"{k} ({v.shape[0]} by {v.shape[1]}, {int(v.sum())} cells may attend)"
                        for k, v in arrays.items())  # fmt: skip
    return describe(
        fig, "Boolean keep-masks, one per button, queries as rows and keys as columns: " + summary
    )


def weights_heatmap(
    weights, title: str = "attention weights", *, x_labels=None, y_labels=None
) -> go.Figure:
    """Attention weights (T, S) as a Viridis heatmap, 0 to 1, value printed in each cell.

    Raises:
        ValueError: ``weights`` is not 2-D.

    Source: chapters 04 and 05.
    """
    w = _as_matrix("weights", weights).astype(float)
    fig = go.Figure(_weights_trace(w, x_labels, y_labels))
    fig.update_layout(title=title)
    _axes(fig)
    T, S = w.shape
    return describe(fig, f"{title}: a {T} by {S} heatmap of attention weights between 0 and 1; "
                         f"each row (a query) sums to {w.sum(axis=1).mean():.2f} on average.")  # fmt: skip


def _weights_trace(w: np.ndarray, x_labels=None, y_labels=None) -> go.Heatmap:
    T, S = w.shape
    return go.Heatmap(
        z=np.round(w, 3), x=list(x_labels) if x_labels is not None else list(range(S)),
        y=list(y_labels) if y_labels is not None else list(range(T)), zmin=0, zmax=1,
        colorscale=COLORSCALE, texttemplate="%{z:.2f}", xgap=1, ygap=1,
        hovertemplate="query %{y}, key %{x}: weight %{z:.3f}<extra></extra>",
    )  # fmt: skip


def heatmap_slider_figure(
    matrices: Sequence, labels: Sequence[str], *, prefix: str, title: str,
    x_labels: Sequence | None = None, y_labels: Sequence | None = None,
) -> go.Figure:  # fmt: skip
    """Weight matrices (each 2-D, shapes may differ) stepped through with a slider (no kernel needed).

    Args:
        matrices: the (T, S) weight matrices, one per slider step.
        labels: the slider's label for each step (same length as ``matrices``).
        prefix: text before the current label. title: the figure's title.
        x_labels, y_labels: optional per-step tick labels (sequences of sequences).

    Raises:
        ValueError: no matrix, a matrix that is not 2-D, or ``labels`` of another length.

    Source: chapters 04 and 05.
    """
    mats = [_as_matrix(f"matrices[{i}]", m).astype(float) for i, m in enumerate(matrices)]
    if not mats or len(labels) != len(mats):
        raise ValueError(
            f"need one label per matrix; got {len(mats)} matrices and {len(labels)} labels"
        )
    xs = x_labels if x_labels is not None else [None] * len(mats)
    ys = y_labels if y_labels is not None else [None] * len(mats)
    frames = [
        go.Frame(data=[_weights_trace(m, x, y)], name=str(lab))
        for m, lab, x, y in zip(mats, labels, xs, ys, strict=True)
    ]
    fig = go.Figure(_weights_trace(mats[0], xs[0], ys[0]), frames=frames)
    fig.update_layout(
        title=title,
        sliders=[{
            "active": 0, "currentvalue": {"prefix": prefix}, "pad": {"t": 30},
            "steps": [{"label": str(lab), "method": "animate",
                       "args": [[str(lab)], {"mode": "immediate", "frame": {"duration": 0, "redraw": True},
                                             "transition": {"duration": 0}}]} for lab in labels],
        }],
    )  # fmt: skip
    _axes(fig)
    fig.update_layout(height=520)
    shapes = ", ".join(
        f"{lab}: {m.shape[0]}x{m.shape[1]}" for lab, m in zip(labels, mats, strict=True)
    )
    return describe(fig, f"{title}. A slider steps through {len(mats)} weight matrices ({shapes}); "
                         "rows are queries, columns keys, colour the weight from 0 to 1.")  # fmt: skip


def future_change_figure(changes: Mapping[str, np.ndarray]) -> go.Figure:
    """How much each position's output moves when the inputs after position p are changed.

    Args:
        changes: ``{label: array (P, T)}``: row p holds, for every output position t, the largest
            absolute change of the output at t when every input after position p is replaced. One
            group of bars per label (e.g. "with causal mask", "without mask"); a slider picks p.

    Raises:
        ValueError: no entry, or arrays that are not 2-D of one shape.

    Source: chapter 04 (claim 12).
    """
    arrays = {k: _as_matrix(f"changes[{k!r}]", v).astype(float) for k, v in changes.items()}
    if not arrays or len({a.shape for a in arrays.values()}) != 1:
        raise ValueError("changes must hold one or more 2-D arrays of the same shape (P, T)")
    labels = list(arrays)
    P, T = arrays[labels[0]].shape
    top = max(float(a.max()) for a in arrays.values()) * 1.1 or 1.0
    colours = ["#0072B2", "#E69F00", "#009E73", "#CC79A7"]

    def bars(p: int) -> list[go.Bar]:
        return [go.Bar(x=list(range(T)), y=arrays[lab][p], name=lab, marker_color=colours[i % len(colours)],
                       hovertemplate=lab + ", position %{x}: max |change| %{y:.2e}<extra></extra>")
                for i, lab in enumerate(labels)]  # fmt: skip

    def title(p: int) -> str:
        return f"inputs after position p = {p} replaced: outputs at t <= {p} should not move"

    fig = go.Figure(bars(0), frames=[go.Frame(data=bars(p), name=str(p), layout={"title": {"text": title(p)}})
                                     for p in range(P)])  # fmt: skip
    fig.update_layout(
        title=title(0), barmode="group", template="plotly_white", height=470,
        xaxis={"title": "output position t", "dtick": 1},
        yaxis={"title": "max |change of the output at t|", "range": [0, top]},
        legend={"orientation": "h", "y": 1.12},
        sliders=[{
            "active": 0, "currentvalue": {"prefix": "p = "}, "pad": {"t": 50},
            "steps": [{"label": str(p), "method": "animate",
                       "args": [[str(p)], {"mode": "immediate", "frame": {"duration": 0, "redraw": True},
                                           "transition": {"duration": 0}}]} for p in range(P)],
        }],
    )  # fmt: skip
    return describe(fig, "Grouped bar chart of how much the output at each position changes when every input "
                         f"after position p is replaced, for {', '.join(labels)}; a slider picks p. With the "
                         "causal mask the bars at positions up to p are zero; without it every bar moves.")  # fmt: skip


def loss_curves_figure(
    curves: Mapping[str, Sequence[float]], levels: Mapping[str, float]
) -> go.Figure:
    """Training-loss curves (nats per token per step) with horizontal reference levels.

    Args:
        curves: ``{label: losses per step}``. levels: ``{label: loss}`` drawn as dashed lines,
            e.g. the blind loss of each model and the unigram baseline.

    Raises:
        ValueError: no curve.

    Source: chapter 04 (claim 12).
    """
    if not curves:
        raise ValueError("curves must hold at least one {label: losses} entry")
    fig = go.Figure()
    styles = ["#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9"]
    for i, (label, losses) in enumerate(curves.items()):
        colour = styles[i % len(styles)]
        fig.add_trace(go.Scatter(y=list(losses), mode="lines", name=label, line={"color": colour}))
    for i, (label, value) in enumerate(levels.items()):
        fig.add_trace(go.Scatter(x=[0, max(len(v) for v in curves.values()) - 1], y=[value, value],
                                 mode="lines", name=f"{label} = {value:.2f}",
                                 line={"dash": "dash", "color": styles[(i + 2) % len(styles)]}))  # fmt: skip
    fig.update_layout(title="Training loss with and without the causal mask",
                      xaxis_title="training step", yaxis_title="cross-entropy (nats per token)",
                      template="plotly_white", height=450, legend={"orientation": "h", "y": -0.25})  # fmt: skip
    last = ", ".join(f"{k} ends at {np.mean(list(v)[-20:]):.2f}" for k, v in curves.items())
    lv = ", ".join(f"{k} {v:.2f}" for k, v in levels.items())
    return describe(fig, f"Line chart of the training loss per step: {last}. Dashed levels: {lv}.")


def padding_drift_figure(
    n_pads: Sequence[int], series: Mapping[str, Sequence[float]], *, y_title: str
) -> go.Figure:
    """How a quantity moves as padding is added to a batch: one line per ``series`` entry.

    Args:
        n_pads: the number of padding tokens in the sentence's row of the batch (x axis).
        series: ``{label: values}``, one value per entry of ``n_pads``.
        y_title: what the values are (e.g. "cosine to the unpadded sentence vector").

    Raises:
        ValueError: no series, or a series whose length differs from ``n_pads``.

    Source: chapter 05.
    """
    if not series or any(len(v) != len(n_pads) for v in series.values()):
        raise ValueError(
            f"series must hold one or more lists of {len(n_pads)} values (one per entry of n_pads)"
        )
    colours = ["#0072B2", "#E69F00", "#009E73", "#CC79A7"]
    fig = go.Figure()
    for i, (label, values) in enumerate(series.items()):
        fig.add_trace(go.Scatter(x=list(n_pads), y=list(values), mode="lines+markers", name=label,
                                 line={"color": colours[i % len(colours)], "dash": "solid" if i == 0 else "dash"}))  # fmt: skip
    fig.update_layout(title=f"{y_title} as padding is added", xaxis_title="padding tokens in the short sentence's row",
                      yaxis_title=y_title, template="plotly_white", height=420,
                      legend={"orientation": "h", "y": -0.25})  # fmt: skip
    ends = "; ".join(f"{k}: {v[0]:.3f} with {n_pads[0]} and {v[-1]:.3f} with {n_pads[-1]} padding tokens"
                     for k, v in series.items())  # fmt: skip
    return describe(
        fig, f"Line chart of {y_title} against the number of padding tokens in the row. {ends}."
    )
