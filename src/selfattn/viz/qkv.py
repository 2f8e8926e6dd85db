"""Figure builders for chapter 03: attention weights as heatmaps, per head, the tying experiment,
and trained projection matrices side by side (:func:`projection_heatmaps_figure`).

Every builder returns a plotly Figure (never shows it). :func:`heads_figure` carries a slider over
heads for the static book; :func:`attention_heatmap` is the single view that the chapter's
ipywidgets explorer re-displays, and each frame of :func:`heads_figure` is exactly that view.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go

from . import COLORSCALE, describe

__all__ = ["attention_heatmap", "heads_figure", "tying_figure", "projection_heatmaps_figure"]

_STEP = {"mode": "immediate", "frame": {"duration": 0, "redraw": True}, "transition": {"duration": 0}}


def _as_array(weights, ndim: int, name: str) -> np.ndarray:
    if hasattr(weights, "detach"):
        weights = weights.detach().cpu().double().numpy()
    arr = np.asarray(weights, dtype=float)
    if arr.ndim != ndim:
        raise ValueError(f"{name} must have {ndim} dimensions; got shape {arr.shape}")
    if not np.isfinite(arr).all():
        raise ValueError(f"{name} must be finite")
    return arr


def _labels(tokens: Sequence[str]) -> list[str]:
    # Repeated tokens ("the" twice) would merge on a categorical axis: number every position.
    return [f"{i}:{t}" for i, t in enumerate(tokens)]


def _heatmap_trace(weights: np.ndarray, query_labels: list[str], key_labels: list[str]) -> go.Heatmap:
    return go.Heatmap(z=np.round(weights, 4), x=key_labels, y=query_labels, colorscale=COLORSCALE, zmin=0, zmax=1,
                      colorbar={"title": "weight"},
                      hovertemplate="query %{y}<br>key %{x}<br>weight %{z:.3f}<extra></extra>")


def _heatmap_layout(fig: go.Figure, title: str, n_rows: int) -> None:
    fig.update_layout(title=title, template="plotly_white", height=max(420, 28 * n_rows + 200),
                      xaxis={"title": "key (read from)", "side": "bottom", "tickangle": -45},
                      yaxis={"title": "query (reads)", "autorange": "reversed"})


def attention_heatmap(weights, query_tokens: Sequence[str], key_tokens: Sequence[str] | None = None,
                      title: str = "attention weights") -> go.Figure:
    """Heatmap of one head's weights (T, S): row i is how query i spreads its reading over the keys.

    Args:
        weights: (T, S) array or tensor, rows summing to one.
        query_tokens: T labels; key_tokens: S labels (default: the query tokens, self-attention).
        title: the figure title.

    Raises:
        ValueError: weights not 2-D or not finite, or label counts that do not match its shape.

    Source: chapter 03.
    """
    arr = _as_array(weights, 2, "weights")
    key_tokens = query_tokens if key_tokens is None else key_tokens
    if (len(query_tokens), len(key_tokens)) != arr.shape:
        raise ValueError(f"weights has shape {arr.shape} but there are {len(query_tokens)} query and "
                         f"{len(key_tokens)} key labels")
    fig = go.Figure(_heatmap_trace(arr, _labels(query_tokens), _labels(key_tokens)))
    _heatmap_layout(fig, title, arr.shape[0])
    strongest = [f"{q} -> {key_tokens[int(j)]}" for q, j in zip(query_tokens, arr.argmax(axis=1), strict=True)]
    return describe(fig, f"{title}: a {arr.shape[0]} by {arr.shape[1]} heatmap of attention weights, queries as rows "
                         f"and keys as columns, from 0 (dark) to 1 (bright). Each query's strongest key: "
                         f"{'; '.join(strongest)}.")


def heads_figure(weights, tokens: Sequence[str], title: str = "layer 0", head_names: Sequence[str] | None = None) -> go.Figure:
    """One heatmap per head (H, T, T), with a slider over heads (works with no kernel).

    Frame h is :func:`attention_heatmap` of ``weights[h]``. Source: chapter 03.
    """
    arr = _as_array(weights, 3, "weights")
    head_names = list(head_names) if head_names is not None else [str(h) for h in range(arr.shape[0])]
    if len(head_names) != arr.shape[0]:
        raise ValueError(f"{len(head_names)} head names for {arr.shape[0]} heads")
    titles = [f"{title}, head {name}" for name in head_names]
    fig = attention_heatmap(arr[0], tokens, title=titles[0])
    labels = _labels(tokens)
    fig.frames = [go.Frame(data=[_heatmap_trace(w, labels, labels)], name=name, layout={"title": {"text": t}})
                  for w, name, t in zip(arr, head_names, titles, strict=True)]
    fig.update_layout(sliders=[{
        "active": 0, "currentvalue": {"prefix": "head: "}, "pad": {"t": 60},
        "steps": [{"label": name, "method": "animate", "args": [[name], _STEP]} for name in head_names],
    }])
    return describe(fig, f"Attention weights of {arr.shape[0]} heads ({title}) on the tokens "
                         f"{' '.join(tokens)}; a slider picks the head. Rows are queries, columns keys, "
                         "colour the weight from 0 to 1.")


def tying_figure(d_heads: Sequence[int], untied: Sequence[float], tied: Sequence[float], chance: float) -> go.Figure:
    """Recall accuracy against the head's width, with separate and with tied keys and values.

    Buttons switch between the two curves together and either one alone. Source: chapter 03 (claim 8).
    """
    x = list(d_heads)
    fig = go.Figure([
        go.Scatter(x=x, y=list(untied), mode="lines+markers", name="separate W_K, W_V",
                   line={"color": "#0072B2"}, marker={"symbol": "circle", "size": 9}),
        go.Scatter(x=x, y=list(tied), mode="lines+markers", name="tied: W_V := W_K",
                   line={"color": "#D55E00", "dash": "dash"}, marker={"symbol": "square", "size": 9}),
        go.Scatter(x=[x[0], x[-1]], y=[chance, chance], mode="lines", name="chance",
                   line={"color": "gray", "dash": "dot"}),
    ])
    fig.update_layout(
        title="Associative recall: accuracy on fresh sequences", template="plotly_white", height=420,
        xaxis={"title": "d_head", "type": "log", "tickvals": x}, yaxis={"title": "accuracy", "range": [0, 1.05]},
        updatemenus=[{"type": "buttons", "direction": "right", "x": 0.0, "y": 1.18, "xanchor": "left", "buttons": [
            {"label": "both", "method": "restyle", "args": [{"visible": [True, True, True]}]},
            {"label": "separate only", "method": "restyle", "args": [{"visible": [True, False, True]}]},
            {"label": "tied only", "method": "restyle", "args": [{"visible": [False, True, True]}]},
        ]}],
    )
    pairs = "; ".join(f"d_head {d}: {u:.2f} vs {t:.2f}" for d, u, t in zip(x, untied, tied, strict=True))
    return describe(fig, f"Line chart of recall accuracy against d_head for a head with separate keys and values "
                         f"and one with values tied to keys (chance {chance:.2f}). Separate vs tied: {pairs}.")


def projection_heatmaps_figure(matrices: dict[str, object], row_labels: Sequence[str], title: str = "") -> go.Figure:
    """Trained projection matrices (each (D, Dh)) as heatmaps side by side, on one colour scale.

    Args:
        matrices: ``{name: (D, Dh) array or tensor}``, e.g. ``{"W_K": ..., "W_V": ...}``; all with D rows.
        row_labels: D labels of the input features (the rows).
        title: figure title.

    Raises:
        ValueError: an empty dict, a matrix that is not 2-D or not finite, rows that differ from the labels.

    Source: chapter 03 (claim 8).
    """
    from plotly.subplots import make_subplots

    if not matrices:
        raise ValueError("matrices must hold at least one matrix")
    arrays = {name: _as_array(W, 2, name) for name, W in matrices.items()}
    labels = list(row_labels)
    for name, W in arrays.items():
        if W.shape[0] != len(labels):
            raise ValueError(f"{name} has {W.shape[0]} rows; expected one per row label ({len(labels)})")
    zmax = max(float(np.abs(W).max()) for W in arrays.values()) or 1.0
    fig = make_subplots(rows=1, cols=len(arrays), subplot_titles=list(arrays), horizontal_spacing=0.12)
    for col, (name, W) in enumerate(arrays.items(), start=1):
        fig.add_trace(go.Heatmap(
            z=np.round(W, 3), x=[f"{j}" for j in range(W.shape[1])], y=labels, colorscale="Cividis",
            zmin=-zmax, zmax=zmax, showscale=col == len(arrays), colorbar={"title": "weight"},
            hovertemplate=f"{name}<br>input %{{y}}<br>column %{{x}}<br>%{{z:.3f}}<extra></extra>"), row=1, col=col)
        fig.update_xaxes(title_text="column (of d_head)", row=1, col=col)
        fig.update_yaxes(autorange="reversed", row=1, col=col, showticklabels=col == 1)
    fig.update_layout(title=title, template="plotly_white", height=max(420, 14 * len(labels) + 160))
    half = len(labels) // 2
    share = "; ".join(
        f"{name}: {float((W[:half] ** 2).sum() / max((W ** 2).sum(), 1e-300)):.1%} of its squared weight on the first "
        f"{half} rows" for name, W in arrays.items())
    return describe(fig, f"Heatmaps of the trained matrices {', '.join(arrays)} ({len(labels)} input rows each, "
                         f"one column per head dimension), on one colour scale. {share}.")
