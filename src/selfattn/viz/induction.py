"""Figures for chapter 14's induction heads (every one readable with no kernel).

- :func:`span_loss_figure`: loss at each position of the repeated span, first and second
  occurrence, and the second occurrence with heads ablated.
- :func:`head_scores_figure`: the previous-token and induction score of every head, two heatmaps.
- :func:`head_patterns_figure`: the attention pattern of chosen heads on one sequence, buttons to
  switch heads, the two occurrences of the span marked.
- :func:`composition_figure`: K-, Q- and V-composition scores of every pair of heads in two layers
  against the random-matrix baseline.

Source: chapter 14.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from . import describe

__all__ = ["span_loss_figure", "head_scores_figure", "head_patterns_figure", "composition_figure"]

# Okabe-Ito
_COLOURS = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9")


def _finite(name: str, x, ndim: int) -> np.ndarray:
    a = np.asarray(x, dtype=np.float64)
    if a.ndim != ndim or a.size == 0 or not np.isfinite(a).all():
        raise ValueError(f"{name} must be a finite non-empty array of rank {ndim}; got shape {a.shape}")
    return a


def span_loss_figure(first, second, uniform: float, ablated: dict[str, np.ndarray] | None = None,
                     title: str = "") -> go.Figure:
    """Loss (nats) at each position of the span: first occurrence, second, second with heads ablated.

    Args:
        first, second: (S - 1,) losses of predicting span token i + 1 from token i (from
            :func:`selfattn.experiments.induction.span_losses`). uniform: log V, drawn as a dotted line.
        ablated: ``{label: (S - 1,) second-occurrence losses}`` with some heads mean-ablated.

    Raises:
        ValueError: arrays not finite, of different lengths; more than four ablations.

    Source: chapter 14.
    """
    first, second = _finite("first", first, 1), _finite("second", second, 1)
    ablated = {} if ablated is None else {k: _finite(f"ablated[{k!r}]", v, 1) for k, v in ablated.items()}
    if len(ablated) > 4:
        raise ValueError(f"at most four ablations fit the palette; got {len(ablated)}")
    n = len(first)
    if len(second) != n or any(len(v) != n for v in ablated.values()):
        raise ValueError("first, second and every ablation must have the same length S - 1")
    x = np.arange(1, n + 1)
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=x, y=np.round(first, 3), name="first occurrence", mode="lines+markers",
                             line={"color": _COLOURS[0]}))
    fig.add_trace(go.Scatter(x=x, y=np.round(second, 3), name="second occurrence", mode="lines+markers",
                             line={"color": _COLOURS[1]}))
    for i, (label, v) in enumerate(ablated.items()):
        fig.add_trace(go.Scatter(x=x, y=np.round(v, 3), name=f"second, {label}", mode="lines+markers",
                                 line={"color": _COLOURS[2 + i], "dash": "dash"}))
    fig.add_hline(y=float(uniform), line={"color": "#555555", "dash": "dot"},
                  annotation_text=f"uniform guess log V = {uniform:.2f}", annotation_position="bottom right")
    fig.update_layout(
        title=title or "Loss at each position of the repeated span", template="plotly_white", height=440,
        xaxis={"title": "position in the span (predicting token i + 1 from token i)", "dtick": 1},
        yaxis={"title": "loss (nats)", "rangemode": "tozero"},
        legend={"orientation": "h", "y": -0.25},
    )
    parts = [f"first occurrence {first.mean():.2f}", f"second occurrence {second.mean():.2f}"]
    parts += [f"second occurrence, {k}: {v.mean():.2f}" for k, v in ablated.items()]
    return describe(
        fig,
        f"Line chart of the loss at each of {n} positions of the repeated span. Mean loss: "
        + "; ".join(parts) + f". The dotted line is the uniform guess, {uniform:.2f} nats.",
    )


def head_scores_figure(prev_scores, induction_scores, title: str = "") -> go.Figure:
    """Two heatmaps (layers x heads): the previous-token score and the induction score of every head.

    Args:
        prev_scores, induction_scores: (L, H) arrays in [0, 1].

    Raises:
        ValueError: not finite (L, H) arrays of one shape.

    Source: chapter 14.
    """
    prev, ind = _finite("prev_scores", prev_scores, 2), _finite("induction_scores", induction_scores, 2)
    if prev.shape != ind.shape:
        raise ValueError(f"prev_scores and induction_scores must have one shape; got {prev.shape} and {ind.shape}")
    L, H = prev.shape
    fig = make_subplots(rows=1, cols=2, subplot_titles=("previous-token score", "induction score"),
                        horizontal_spacing=0.12)
    xs, ys = [f"head {h}" for h in range(H)], [f"layer {layer}" for layer in range(L)]  # counted from 0
    for col, z in ((1, prev), (2, ind)):
        fig.add_trace(go.Heatmap(z=np.round(z, 3), x=xs, y=ys, zmin=0, zmax=1, colorscale="Viridis",
                                 text=np.round(z, 2), texttemplate="%{text}", showscale=col == 2,
                                 hovertemplate="%{y}, %{x}: %{z}<extra></extra>"), row=1, col=col)
        fig.update_yaxes(autorange="reversed", row=1, col=col)
    fig.update_layout(title=title or "What each head does", template="plotly_white", height=320 + 40 * L)
    best_prev, best_ind = np.unravel_index(prev.argmax(), prev.shape), np.unravel_index(ind.argmax(), ind.shape)
    return describe(
        fig,
        f"Two heatmaps, {L} layers by {H} heads, colour 0 to 1. Highest previous-token score: layer "
        f"{best_prev[0]} head {best_prev[1]} ({prev.max():.2f}); highest induction score: layer "
        f"{best_ind[0]} head {best_ind[1]} ({ind.max():.2f}).",
    )


def head_patterns_figure(tokens: Sequence[str], patterns: dict[str, np.ndarray], first: int, second: int,
                         span: int, title: str = "") -> go.Figure:
    """The attention weights of several heads on one sequence, one head at a time (buttons).

    The two occurrences of the span are outlined: rows ``second ..`` (queries in the second
    occurrence) against columns ``first ..`` (keys in the first), where an induction head's weights
    lie one column right of the diagonal of the outlined block.

    Args:
        tokens: the T tokens as strings. patterns: ``{label: (T, T) weights}``, rows queries.
        first, second, span: where the span starts twice, and its length.

    Raises:
        ValueError: patterns empty, not (T, T) or not finite; the span outside the sequence.

    Source: chapter 14.
    """
    T = len(tokens)
    if not isinstance(patterns, dict) or not patterns:
        raise ValueError("patterns must be a non-empty dict {label: (T, T) array}")
    pats = {k: _finite(f"patterns[{k!r}]", v, 2) for k, v in patterns.items()}
    if any(p.shape != (T, T) for p in pats.values()):
        raise ValueError(f"every pattern must have shape (T, T) = ({T}, {T})")
    if not (0 <= first and first + span <= second and second + span <= T):
        raise ValueError(f"the span must fit: 0 <= first, first + span <= second, second + span <= T={T}; "
                         f"got first={first}, second={second}, span={span}")
    labels = [f"{i}:{t}" for i, t in enumerate(tokens)]
    names = list(pats)
    fig = go.Figure()
    for i, name in enumerate(names):
        fig.add_trace(go.Heatmap(z=np.round(pats[name], 3), x=labels, y=labels, zmin=0, zmax=1,
                                 colorscale="Cividis", visible=i == 0, name=name,
                                 colorbar={"title": "weight"},
                                 hovertemplate="query %{y}<br>key %{x}<br>weight %{z}<extra></extra>"))
    box = {"type": "rect", "xref": "x", "yref": "y", "line": {"color": "#D55E00", "width": 2},
           "x0": first - 0.5, "x1": first + span - 0.5, "y0": second - 0.5, "y1": second + span - 0.5}
    buttons = [{"label": n, "method": "update",
                "args": [{"visible": [j == i for j in range(len(names))]},
                         {"title.text": f"{title or 'Attention on one repeated sequence'}: {n}"}]}
               for i, n in enumerate(names)]
    fig.update_layout(
        title=f"{title or 'Attention on one repeated sequence'}: {names[0]}", template="plotly_white",
        height=660, shapes=[box], margin={"t": 140},
        xaxis={"title": "key (earlier position)", "tickangle": -90, "tickfont": {"size": 9}},
        yaxis={"title": "query", "autorange": "reversed", "tickfont": {"size": 9}},
        updatemenus=[{"type": "buttons", "direction": "right", "x": 0.0, "y": 1.02, "xanchor": "left",
                      "yanchor": "bottom", "buttons": buttons}],
    )
    return describe(
        fig,
        f"Heatmap of the attention weights of one head at a time ({', '.join(names)}, buttons) on a "
        f"sequence of {T} tokens whose span of {span} tokens at position {first} repeats at {second}; "
        "the orange box marks the queries of the second occurrence against the keys of the first.",
    )


def composition_figure(scores: dict[str, np.ndarray], baseline: dict[str, float], title: str = "") -> go.Figure:
    """Grouped bars: the K-, Q- and V-composition score of every (earlier head, later head) pair.

    Args:
        scores: ``{"keys", "queries", "values"}`` -> (H1, H2) arrays (from
            :func:`selfattn.experiments.induction.composition_scores`). baseline: the same keys ->
            the random-matrix mean, drawn as a dotted line per kind.

    Raises:
        ValueError: missing kinds, arrays not finite or of different shapes.

    Source: chapter 14 (Elhage et al. 2021's composition scores).
    """
    kinds = ("keys", "queries", "values")
    if not isinstance(scores, dict) or set(scores) != set(kinds) or not isinstance(baseline, dict) or not set(
            kinds) <= set(baseline):
        raise ValueError(f"scores and baseline must both have the keys {kinds}")
    arrays = {k: _finite(f"scores[{k!r}]", scores[k], 2) for k in kinds}
    shape = arrays["keys"].shape
    if any(a.shape != shape for a in arrays.values()):
        raise ValueError("every kind of score must have the same (H1, H2) shape")
    H1, H2 = shape
    pairs = [f"L0 H{a} → L1 H{b}" for a in range(H1) for b in range(H2)]  # layers and heads counted from 0
    fig = go.Figure()
    for i, k in enumerate(kinds):
        fig.add_trace(go.Bar(x=pairs, y=np.round(arrays[k].reshape(-1), 3), name=f"{k[0].upper()}-composition",
                             marker_color=_COLOURS[i]))
        fig.add_hline(y=float(baseline[k]), line={"color": _COLOURS[i], "dash": "dot", "width": 1})
    fig.update_layout(
        title=title or "Composition scores between the two layers' heads", template="plotly_white", height=440,
        barmode="group", yaxis={"title": "composition score", "rangemode": "tozero"},
        xaxis={"tickangle": -30}, legend={"orientation": "h", "y": 1.1},
    )
    k = arrays["keys"]
    a, b = np.unravel_index(k.argmax(), k.shape)
    return describe(
        fig,
        f"Grouped bar chart of the K-, Q- and V-composition scores of {H1 * H2} pairs of heads; dotted lines: "
        f"random-matrix baselines (K {baseline['keys']:.3f}). Largest K-composition: layer 0 head {a} into "
        f"layer 1 head {b}, {k.max():.3f}.",
    )
