"""Figures and measures for chapter 06: the attention maps of every head of every layer.

Measures (NumPy, float64) that the chapter and its tests use to say how heads differ:
:func:`attention_entropy`, :func:`js_distance`, :func:`pairwise_head_distances` and
:func:`key_share`. Figure builders return ``plotly.graph_objects.Figure`` (never shown):
:func:`attention_map_figure` (one head), :func:`layer_head_explorer_figure` (a slider over every
(layer, head) pair, buttons per layer; explorable with no kernel) and :func:`head_summary_figure`
(one number per head, buttons over the measure). :func:`head_explorer_widget` is the live
ipywidgets explorer (sentence, layer, head) that re-displays :func:`attention_map_figure`.

Source: chapter 06.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import plotly.graph_objects as go
import torch

from .. import _validate
from . import COLORSCALE, describe, live_output

__all__ = [
    "attention_entropy",
    "js_distance",
    "pairwise_head_distances",
    "key_share",
    "attention_map_figure",
    "layer_head_explorer_figure",
    "head_summary_figure",
    "head_explorer_widget",
]


def _as_weights(name: str, weights, min_ndim: int = 2) -> np.ndarray:
    """Attention weights (NumPy array or torch tensor) as float64, finite, non-negative, at least
    ``min_ndim`` dims."""
    if isinstance(weights, torch.Tensor):
        weights = weights.detach().cpu().double().numpy()
    w = _validate.require_array(name, weights)
    if w.ndim < min_ndim:
        raise ValueError(
            f"{name} must have at least {min_ndim} dims (..., T, S); got shape {w.shape}"
        )
    if not np.isfinite(w).all() or (w < 0).any():
        raise ValueError(f"{name} must hold finite, non-negative weights; got shape {w.shape}")
    return w


def attention_entropy(weights) -> np.ndarray:
    """Mean entropy (nats) of the rows of attention maps: (..., T, S) -> (...,).

    ``H(row) = -sum_j w_j log w_j``; 0 when a row puts all its weight on one key, ``log S`` when
    it spreads evenly. Terms with ``w_j = 0`` count as 0.

    Raises:
        TypeError: not numeric. ValueError: fewer than 2 dims, NaN/inf or negative entries.
    """
    w = _as_weights("weights", weights)
    logs = np.log(np.where(w > 0, w, 1.0))  # log 1 = 0 where w = 0: 0 log 0 := 0
    return -(w * logs).sum(axis=-1).mean(axis=-1)  # (..., T, S) -> (..., T) -> (...,)


def js_distance(p, q) -> np.ndarray:
    """Jensen-Shannon distance between two attention maps, row by row, averaged over the rows.

    ``JSD(p, q) = (KL(p || m) + KL(q || m)) / 2`` with ``m = (p + q) / 2``, natural log; the
    distance is ``sqrt(JSD)``: 0 for identical rows, ``sqrt(log 2) ~ 0.833`` for rows with
    disjoint support. (..., T, S) and (..., T, S) (broadcastable) -> (...,).

    Raises:
        ValueError: shapes that do not broadcast; entries NaN/inf or negative.
    """
    p, q = _as_weights("p", p), _as_weights("q", q)
    try:
        np.broadcast_shapes(p.shape, q.shape)
    except ValueError:
        raise ValueError(
            f"p and q must have broadcastable shapes; got {p.shape} and {q.shape}"
        ) from None
    m = (p + q) / 2

    def kl(a: np.ndarray) -> np.ndarray:
        ratio = np.where(a > 0, a / np.where(m > 0, m, 1.0), 1.0)  # m > 0 wherever a > 0
        return (a * np.log(ratio)).sum(axis=-1)  # (..., T, S) -> (..., T)

    jsd = np.clip((kl(p) + kl(q)) / 2, 0.0, None)  # clip rounding below 0
    return np.sqrt(jsd).mean(axis=-1)  # (..., T) -> (...,)


def pairwise_head_distances(weights) -> np.ndarray:
    """Jensen-Shannon distance (see :func:`js_distance`) between every pair of heads of one layer.

    Args:
        weights: (H, T, S), one map per head (one sentence, real tokens only).

    Returns:
        (H, H) symmetric matrix with a zero diagonal.
    """
    w = _as_weights("weights", weights, min_ndim=3)
    if w.ndim != 3:
        raise ValueError(f"weights must have shape (H, T, S); got {w.shape}")
    return js_distance(w[:, None], w[None, :])  # (H, 1, T, S) vs (1, H, T, S) -> (H, H)


def key_share(weights, keys: Sequence[int]) -> np.ndarray:
    """Fraction of each map's weight that goes to the key positions ``keys``, averaged over the
    query rows: (..., T, S) -> (...,), in [0, 1] when the rows sum to one.

    Example: ``key_share(w, [0])`` is the share that goes to [CLS].

    Raises:
        ValueError: ``keys`` empty or outside [0, S).
    """
    w = _as_weights("weights", weights)
    S = w.shape[-1]
    keys = list(keys)
    if not keys or any(not 0 <= int(k) < S for k in keys):
        raise ValueError(f"keys must be a non-empty list of positions in [0, {S}); got {keys}")
    return w[..., keys].sum(axis=-1).mean(axis=-1)  # (..., T, S) -> (..., T) -> (...,)


def _check_maps(tokens: Sequence[str], weights: np.ndarray, ndim: int, layout: str) -> np.ndarray:
    w = _as_weights("weights", weights, min_ndim=ndim)
    T = len(tokens)
    if w.ndim != ndim or w.shape[-2:] != (T, T):
        raise ValueError(
            f"weights must have shape {layout} with T = len(tokens) = {T}; got {w.shape}"
        )
    return w


def _heatmap(tokens: Sequence[str], w: np.ndarray) -> go.Heatmap:
    # Duplicate tokens (two "the") would merge on a categorical axis: label them with positions.
    labels = [f"{i}:{t}" for i, t in enumerate(tokens)]
    return go.Heatmap(
        z=np.round(w, 4).tolist(), x=labels, y=labels, colorscale=COLORSCALE, zmin=0.0, zmax=1.0,
        colorbar={"title": "weight"},
        hovertemplate="query %{y}<br>key %{x}<br>weight %{z:.3f}<extra></extra>",
    )  # fmt: skip


def _map_layout(fig: go.Figure, title: str, T: int) -> None:
    # No fixed width: the map fills the text column (plotly autosizes to it) on a phone and on a
    # desktop; a fixed width grown with T ran past the column. The height grows with T up to a
    # screenful.
    size = min(max(360, 34 * T + 160), 760)
    fig.update_layout(
        title=title, height=size + 60, autosize=True, template="plotly_white",
        xaxis={"title": "key (attended to)", "tickangle": -45},
        yaxis={"title": "query (attending)", "autorange": "reversed"},
    )  # fmt: skip


def attention_map_figure(
    tokens: Sequence[str], weights, title: str = "attention weights"
) -> go.Figure:
    """Heatmap of one head's map: row = query token, column = key token, colour = weight in [0, 1].

    Args:
        tokens: the T token strings. weights: (T, T).

    Raises:
        ValueError: ``weights`` not (T, T) with T = len(tokens), or not finite and non-negative.

    Source: chapter 06.
    """
    w = _check_maps(tokens, weights, 2, "(T, T)")
    fig = go.Figure(_heatmap(tokens, w))
    _map_layout(fig, title, len(tokens))
    top = [f"{tokens[i]}->{tokens[int(np.argmax(w[i]))]}" for i in range(len(tokens))]
    return describe(
        fig,
        f"{title}: a {len(tokens)} by {len(tokens)} heatmap of attention weights "
        f"(rows: queries, columns: keys). Strongest key of each query: {', '.join(top)}.",
    )


def layer_head_explorer_figure(tokens: Sequence[str], weights, sentence: str = "") -> go.Figure:
    """Every head of every layer for one sentence: a slider over the (layer, head) pairs and one
    button per layer that jumps to its first head. Works with no kernel (plotly frames).

    Args:
        tokens: the T token strings. weights: (L, H, T, T) for one sentence (real tokens only).
        sentence: shown in the title.

    Raises:
        ValueError: ``weights`` not (L, H, T, T) with T = len(tokens).

    Source: chapter 06.
    """
    w = _check_maps(tokens, weights, 4, "(L, H, T, T)")
    L, H = w.shape[:2]
    names = [f"L{layer} H{head}" for layer in range(L) for head in range(H)]  # counted from 0, as the course does
    prefix = f"“{sentence}” — " if sentence else ""
    frames = [
        go.Frame(data=[_heatmap(tokens, w[layer, head])], name=names[layer * H + head],
                 layout={"title": {"text": f"{prefix}layer {layer}, head {head}"}})
        for layer in range(L) for head in range(H)
    ]  # fmt: skip
    fig = go.Figure(_heatmap(tokens, w[0, 0]), frames=frames)
    _map_layout(fig, f"{prefix}layer 0, head 0", len(tokens))
    jump = {
        "mode": "immediate",
        "frame": {"duration": 0, "redraw": True},
        "transition": {"duration": 0},
    }
    fig.update_layout(
        height=fig.layout.height + 160,
        margin={"t": 140, "b": 150},
        title={"y": 0.98, "yanchor": "top", "yref": "container"},
        sliders=[{
            "active": 0, "y": -0.12, "len": 1.0, "currentvalue": {"prefix": "layer and head: "},
            "steps": [{"label": n, "method": "animate", "args": [[n], jump]} for n in names],
        }],
        updatemenus=[{
            "type": "buttons", "name": "jump to layer", "direction": "right", "showactive": False, "x": 0.0, "y": 1.03,
            "xanchor": "left", "yanchor": "bottom",
            "buttons": [{"label": f"layer {layer}", "method": "animate",
                         "args": [[names[layer * H]], jump]} for layer in range(L)],
        }],
    )  # fmt: skip
    return describe(
        fig,
        f"{prefix}attention maps of all {L} layers by {H} heads ({L * H} maps of "
        f"{len(tokens)} by {len(tokens)} tokens). A slider picks the layer and head, "
        "buttons jump to a layer; rows are queries, columns keys.",
    )


def head_summary_figure(
    measures: dict[str, np.ndarray], title: str = "one number per head"
) -> go.Figure:
    """A layer-by-head grid of one measure at a time, with a menu over the measures (no kernel needed).

    Args:
        measures: ``{name: (L, H) array}``, e.g. entropy, share of weight on [CLS].

    Raises:
        ValueError: no measures, or arrays that are not all of one (L, H) shape.

    Source: chapter 06.
    """
    if not isinstance(measures, dict) or not measures:
        raise ValueError("measures must be a non-empty dict {name: (L, H) array}")
    arrays = {name: _validate.require_array(name, np.asarray(m)) for name, m in measures.items()}
    shapes = {a.shape for a in arrays.values()}
    if len(shapes) != 1 or len(next(iter(shapes))) != 2:
        raise ValueError(f"every measure must be one (L, H) array; got shapes {sorted(shapes)}")
    L, H = next(iter(shapes))
    names = list(arrays)
    heads = [f"H{h}" for h in range(H)]  # counted from 0, as the course does
    layers = [f"L{layer}" for layer in range(L)]

    def trace_args(name: str) -> dict:
        z = arrays[name]
        return {
            "z": [np.round(z, 4).tolist()],
            "text": [np.round(z, 2).tolist()],
            "zmin": [float(min(0.0, z.min()))],
            "zmax": [float(max(1.0, z.max()))],
        }

    first = trace_args(names[0])
    fig = go.Figure(go.Heatmap(
        z=first["z"][0], text=first["text"][0], texttemplate="%{text}", x=heads, y=layers,
        colorscale=COLORSCALE, zmin=first["zmin"][0], zmax=first["zmax"][0],
        hovertemplate="%{y} %{x}: %{z:.3f}<extra></extra>",
    ))  # fmt: skip
    fig.update_layout(
        title={"text": f"{title}: {names[0]}", "y": 0.97, "yanchor": "top", "yref": "container"},
        height=460, template="plotly_white", margin={"t": 120},
        xaxis={"title": "head"}, yaxis={"title": "layer", "autorange": "reversed"},
        updatemenus=[{
            "type": "dropdown", "name": "measure", "direction": "down", "x": 0.0, "y": 1.04, "xanchor": "left", "yanchor": "bottom",
            "buttons": [{"label": name, "method": "update",
                         "args": [trace_args(name), {"title": {"text": f"{title}: {name}"}}]}
                        for name in names],
        }],
    )  # fmt: skip
    return describe(
        fig,
        f"{title}: a {L} by {H} grid (layers by heads) of one measure at a time; "
        f"buttons switch between {', '.join(names)}.",
    )


def head_explorer_widget(
    run_fn: Callable[[str], tuple[list[str], np.ndarray]],
    sentence: str,
    *,
    layer: int = 0,
    head: int = 0,
):
    """Live explorer (needs a running kernel): a text box for the sentence and sliders for the
    layer and head (counted from 0, as everywhere in the course); shows :func:`attention_map_figure` for the choice.

    Args:
        run_fn: ``sentence -> (tokens, weights (L, H, T, T))`` for the real tokens of one sentence.
        sentence: the initial sentence.
        layer, head: the initial choice, counted from 0.

    Returns:
        An ``ipywidgets.VBox``; display it in a notebook.

    Raises:
        ValueError: ``layer`` or ``head`` not an index of ``weights`` (counted from 0).

    Source: chapter 06.
    """
    import ipywidgets as widgets

    tokens, weights = run_fn(sentence)
    L, H = np.asarray(weights).shape[:2]
    for name, value, n in (("layer", layer, L), ("head", head, H)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not 0 <= value < n:
            raise ValueError(f"{name} must be an int in [0, {n}) (counted from 0); got {value!r}")
    text = widgets.Text(value=sentence, description="sentence", continuous_update=False,
                        layout=widgets.Layout(width="95%"))  # fmt: skip
    layer_slider = widgets.IntSlider(value=layer, min=0, max=L - 1, description="layer")
    head_slider = widgets.IntSlider(value=head, min=0, max=H - 1, description="head")
    cache = {sentence: (tokens, weights)}

    def show(sentence: str, layer: int, head: int) -> None:
        if sentence not in cache:
            cache[sentence] = run_fn(sentence)
        toks, w = cache[sentence]
        title = f"layer {layer}, head {head}"
        attention_map_figure(toks, np.asarray(w)[layer, head], title).show()

    out = live_output(
        show, {"sentence": text, "layer": layer_slider, "head": head_slider}
    )
    return widgets.VBox([text, widgets.HBox([layer_slider, head_slider]), out])
