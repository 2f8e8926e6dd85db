"""Figure builders for chapter 08: where is each token? RoPE, ALiBi, sinusoids, extrapolation.

Every builder returns a plotly Figure with a text description attached (never shows it). The
static figures carry sliders, so a reader of the book explores them with no kernel;
:func:`rope_score_view` is the single view that :func:`rope_explorer_widget` (ipywidgets, live
kernel) re-displays, and every setting of :func:`rope_score_figure`'s controls draws exactly that view.

- :func:`rope_score_figure`: one feature pair of q and k drawn as arrows, turned by ``m theta_i``
  and ``n theta_i``, and the score ``q_m . k_n`` along the line ``m - n = const``; a slider moves
  both positions together (the key position n), buttons pick the offset ``m - n`` (claim 23).
- :func:`alibi_bias_figure`, :func:`alibi_distance_figure`: ALiBi's bias per head (heatmap with a
  head slider; lines of bias against distance).
- :func:`extrapolation_figure`, :func:`extrapolation_bars_figure`: loss per position past the
  training length, and mean loss at a few evaluation lengths, per position scheme (claim 24).
- :func:`sinusoidal_figure`, :func:`sinusoidal_shift_figure`: the encodings, and a shift as the
  block-diagonal rotation that maps ``PE[p]`` to ``PE[p + k]`` (claim 22).

Source: chapter 08.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots

from .. import positions as _pos
from . import COLORSCALE, DIVERGING, describe, live_output
from .training import moving_average

__all__ = [
    "rope_score_data",
    "rope_score_view",
    "rope_score_figure",
    "rope_explorer_widget",
    "alibi_bias_figure",
    "alibi_distance_figure",
    "extrapolation_figure",
    "extrapolation_bars_figure",
    "sinusoidal_figure",
    "sinusoidal_shift_figure",
    "SCHEME_STYLES",
]

# Okabe-Ito colours: distinct for colour-blind readers; dashes tell the series apart in grayscale.
_COLOURS = ["#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000"]
_DASHES = ["solid", "dash", "dot", "dashdot", "longdash", "longdashdot"]
_Q_COLOUR, _K_COLOUR = "#D55E00", "#0072B2"
_OTHER = "#BBBBBB"  # a grey: the other offsets' lines, context only
_STEP = {"mode": "immediate", "frame": {"duration": 0, "redraw": True}, "transition": {"duration": 0}}

#: Colour and dash of each position scheme of :data:`selfattn.positions.POSITION_SCHEMES`, the same
#: in every figure of the chapter.
SCHEME_STYLES = {
    "learned": ("#E69F00", "dot"),
    "sinusoidal": ("#CC79A7", "dashdot"),
    "rope": ("#0072B2", "solid"),
    "alibi": ("#009E73", "dash"),
    "none": ("#D55E00", "longdash"),
}
_BASELINE_STYLES = [("#000000", "dot"), ("#999999", "dash"), ("#666666", "dashdot")]


def _style(i: int, name: str) -> tuple[str, str]:
    return SCHEME_STYLES.get(name, (_COLOURS[i % len(_COLOURS)], _DASHES[i % len(_DASHES)]))


# --------------------------------------------------------------------------------------------------
# RoPE: the score depends on the offset only (claim 23)
# --------------------------------------------------------------------------------------------------


def _as_vector(name: str, x) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu().double().numpy()
    arr = np.asarray(x)
    if arr.dtype == bool or not (np.issubdtype(arr.dtype, np.floating) or np.issubdtype(arr.dtype, np.integer)):
        raise TypeError(f"{name} must hold real numbers; got dtype {arr.dtype}")
    arr = arr.astype(np.float64)
    if arr.ndim != 1 or arr.shape[0] < 2 or arr.shape[0] % 2:
        raise ValueError(f"{name} must have shape (Dh,) with Dh even and >= 2; got shape {arr.shape}")
    if not np.isfinite(arr).all():
        raise ValueError(f"{name} must be finite; got {int((~np.isfinite(arr)).sum())} NaN or inf entries")
    return arr


def _int_range(name: str, values, *, min_value: int | None = None) -> list[int]:
    try:
        items = list(values)
    except TypeError:
        items = None
    if not items or isinstance(values, (str, bytes)) or any(
            isinstance(v, bool) or not isinstance(v, (int, np.integer)) for v in items):
        raise ValueError(f"{name} must be a non-empty sequence of ints; got {values!r}")
    out = [int(v) for v in items]
    if len(set(out)) != len(out) or out != sorted(out):
        raise ValueError(f"{name} must be increasing, without repeats; got {out}")
    if min_value is not None and out[0] < min_value:
        raise ValueError(f"{name} must be >= {min_value}; got {out}")
    return out


def _pair_indices(d_head: int, layout: str) -> list[tuple[int, int]]:
    """The feature indices of each pair, as :func:`selfattn.positions.apply_rope` pairs them."""
    if layout not in _pos.ROPE_LAYOUTS:
        raise ValueError(f"layout must be one of {_pos.ROPE_LAYOUTS}; got {layout!r}")
    if layout == "half":
        return [(i, i + d_head // 2) for i in range(d_head // 2)]
    return [(2 * i, 2 * i + 1) for i in range(d_head // 2)]


def _rotated(x: np.ndarray, positions, base: float, layout: str) -> np.ndarray:
    """x (Dh,) at each of the positions: (len(positions), Dh), by the package's own apply_rope."""
    rows = torch.from_numpy(np.repeat(x[None], len(positions), axis=0))  # (P, Dh)
    return _pos.apply_rope(rows, torch.tensor(list(positions)), base=base, layout=layout).numpy()


def rope_score_data(q, k, *, shifts: Sequence[int] = range(16), offsets: Sequence[int] = range(8),
                    pairs: Sequence[int] | None = None, base: float = 10000.0,
                    layout: str = "interleaved") -> dict:
    """What :func:`rope_score_figure` draws, as numbers (float64).

    Args:
        q, k: (Dh,) one query and one key (array or tensor; Dh even).
        shifts: the key positions n (ints, increasing). offsets: the offsets ``d = m - n`` (ints,
            increasing; negative allowed), so the query sits at ``m = n + d``.
        pairs: which feature pairs get an arrow panel (default: the two fastest, 0 and 1).
        base, layout: as :func:`selfattn.positions.apply_rope`.

    Returns:
        dict with ``theta`` (Dh/2,) radians per position; ``pairs`` (list of pair indices);
        ``features`` (the two feature indices of each shown pair); ``q_phase``, ``k_phase`` (the
        angle in degrees of each shown pair of q and k at position 0); ``q_norm``, ``k_norm``;
        ``scores`` (len(offsets), len(shifts)): ``scores[a, b] = apply_rope(q, n + d) . apply_rope(k, n)``
        for ``d = offsets[a]``, ``n = shifts[b]`` (before any ``1/sqrt(Dh)`` scale).

    Raises:
        TypeError / ValueError: q or k not real (Dh,) vectors of one even length; shifts or offsets
        not increasing ints; a pair index outside ``0 .. Dh/2-1``; a bad base or layout.

    Source: chapter 08 (claim 23).
    """
    qv, kv = _as_vector("q", q), _as_vector("k", k)
    if qv.shape != kv.shape:
        raise ValueError(f"q and k must have the same shape (Dh,); got {qv.shape} and {kv.shape}")
    Dh = qv.shape[0]
    shifts = _int_range("shifts", shifts)
    offsets = _int_range("offsets", offsets)
    half = Dh // 2
    pairs = list(range(min(2, half))) if pairs is None else [int(p) for p in pairs]
    if not pairs or any(not 0 <= p < half for p in pairs) or len(set(pairs)) != len(pairs):
        raise ValueError(f"pairs must be distinct pair indices in 0..{half - 1} (Dh = {Dh}); got {pairs}")
    index = _pair_indices(Dh, layout)
    theta = _pos.rope_frequencies(Dh, base=base).numpy()  # (Dh/2,) radians per position
    n = np.asarray(shifts)
    scores = np.stack([(_rotated(qv, n + d, base, layout) * _rotated(kv, n, base, layout)).sum(-1)
                       for d in offsets])  # (len(offsets), len(shifts))
    feats = [index[p] for p in pairs]
    return {
        "theta": theta, "pairs": pairs, "features": feats, "layout": layout, "base": float(base),
        "shifts": shifts, "offsets": offsets, "scores": scores,
        "q_phase": [math.degrees(math.atan2(qv[b], qv[a])) for a, b in feats],
        "k_phase": [math.degrees(math.atan2(kv[b], kv[a])) for a, b in feats],
        "q_norm": [math.hypot(qv[a], qv[b]) for a, b in feats],
        "k_norm": [math.hypot(kv[a], kv[b]) for a, b in feats],
    }  # fmt: skip


def _pair_title(data: dict, j: int) -> str:
    # Short: two panel titles share a phone's width.
    p = data["pairs"][j]
    return f"pair {p}: θ = {data['theta'][p]:.3g} rad/pos"


def _score_title(d: int, score: float) -> str:
    return f"m − n = {d}: score {score:.4f} for every n"


def _rotation(data: dict, j: int, n: int) -> float:
    """The angular axis of pair j's panel turned by n theta (degrees): both arrows turn with it."""
    return float(math.degrees(n * data["theta"][data["pairs"][j]]) % 360.0)


def _q_theta(data: dict, j: int, d: int) -> list[float]:
    """The q arrow, drawn in the panel turned by n theta: d theta ahead of its own phase."""
    return [0.0, float(data["q_phase"][j] + math.degrees(d * data["theta"][data["pairs"][j]]))]


def _rope_base(data: dict, n: int, d: int) -> go.Figure:
    """The figure at key position n and offset d; traces: per pair (k arrow, q arrow), then the
    other offsets' lines, then the current offset's line, then the marker at (n, score)."""
    P = len(data["pairs"])
    fig = make_subplots(
        rows=2, cols=P, specs=[[{"type": "polar"}] * P, [{"type": "xy", "colspan": P}] + [None] * (P - 1)],
        row_heights=[0.45, 0.55], vertical_spacing=0.12, horizontal_spacing=0.12,
        subplot_titles=[_pair_title(data, j) for j in range(P)] + ["score"],
    )  # fmt: skip
    a = data["offsets"].index(d)
    b = data["shifts"].index(n)
    scores = data["scores"]
    for j in range(P):
        r = max(data["q_norm"][j], data["k_norm"][j]) or 1.0
        fig.add_trace(go.Scatterpolar(
            r=[0.0, data["k_norm"][j]], theta=[0.0, data["k_phase"][j]], mode="lines+markers+text",
            text=["", "k at n"], textposition="top center", name=f"k, pair {data['pairs'][j]}",
            line={"color": _K_COLOUR, "width": 3}, marker={"size": [0, 12], "symbol": "arrow", "angleref": "previous",
                                                           "color": _K_COLOUR},
            hoverinfo="skip"), row=1, col=j + 1)  # fmt: skip
        fig.add_trace(go.Scatterpolar(
            r=[0.0, data["q_norm"][j]], theta=_q_theta(data, j, d), mode="lines+markers+text",
            text=["", "q at m"], textposition="top center", name=f"q, pair {data['pairs'][j]}",
            line={"color": _Q_COLOUR, "width": 3, "dash": "dash"},
            marker={"size": [0, 12], "symbol": "arrow", "angleref": "previous", "color": _Q_COLOUR},
            hoverinfo="skip"), row=1, col=j + 1)  # fmt: skip
        polar = "polar" if j == 0 else f"polar{j + 1}"
        fig.update_layout({polar: {
            "angularaxis": {"rotation": _rotation(data, j, n), "showticklabels": False, "direction": "counterclockwise"},
            "radialaxis": {"range": [0, 1.2 * r], "showticklabels": False}}})  # fmt: skip
    x = data["shifts"]
    for i, dd in enumerate(data["offsets"]):
        fig.add_trace(go.Scatter(x=x, y=scores[i].tolist(), mode="lines", line={"color": _OTHER, "width": 1},
                                 name=f"m − n = {dd}", showlegend=False,
                                 hovertemplate=f"m − n = {dd}, n = %{{x}}: %{{y:.4f}}<extra></extra>"), row=2, col=1)
    fig.add_trace(go.Scatter(x=x, y=scores[a].tolist(), mode="lines", line={"color": _Q_COLOUR, "width": 3},
                             name="current offset", hovertemplate="n = %{x}: q_m · k_n = %{y:.4f}<extra></extra>"),
                  row=2, col=1)
    fig.add_trace(go.Scatter(x=[n], y=[float(scores[a, b])], mode="markers", name="(m, n) now",
                             marker={"size": 13, "color": "#000000", "symbol": "circle"},
                             hovertemplate="n = %{x}: %{y:.4f}<extra></extra>"), row=2, col=1)
    lo, hi = float(scores.min()), float(scores.max())
    pad = 0.1 * (hi - lo) + 1e-3
    fig.update_xaxes(title_text="key position n (the query is at m = n + offset)", row=2, col=1,
                     range=[x[0] - 0.5, x[-1] + 0.5])
    fig.update_yaxes(title_text="score q_m · k_n", range=[lo - pad, hi + pad], row=2, col=1)
    fig.layout.annotations[P].text = _score_title(d, float(scores[a].mean()))
    for note in fig.layout.annotations[:P]:
        note.font, note.yshift = {"size": 12}, 12  # the pair titles share a phone's width; clear of a tip label
    fig.update_layout(template="plotly_white", height=760, autosize=True, showlegend=False,
                      margin={"t": 60, "b": 40, "l": 60, "r": 20})
    return fig


def _rope_description(data: dict) -> str:
    per = "; ".join(f"offset {d}: {data['scores'][i].mean():.4f}" for i, d in enumerate(data["offsets"]))
    spread = float(np.max(np.ptp(data["scores"], axis=1)))
    shown = ", ".join(f"pair {p} (features {a} and {b}, {data['theta'][p]:.3g} radians per position)"
                      for p, (a, b) in zip(data["pairs"], data["features"], strict=True))
    return (f"RoPE in the {data['layout']} layout. Top: arrows for {shown} of a query (dashed) "
            "and a key (solid), each turned by its position times the pair's frequency theta. Bottom: the score "
            "q_m · k_n against the key position n with the query at m = n + offset; grey lines for the other "
            f"offsets. Moving both positions together turns both arrows by the same angle and the score does not "
            f"change (largest change along one offset {spread:.1e}); only the offset changes it. Scores per "
            f"offset: {per}.")


def rope_score_view(q, k, m: int, n: int, *, shifts: Sequence[int] = range(16), offsets: Sequence[int] = range(8),
                    pairs: Sequence[int] | None = None, base: float = 10000.0, layout: str = "interleaved") -> go.Figure:
    """One view of :func:`rope_score_figure`: the query at position m, the key at n (no sliders).

    Args: as :func:`rope_score_data`, plus m, n (ints): the query's and the key's positions. The
    offset ``m - n`` is added to ``offsets`` if it is not there.

    Raises:
        ValueError: m or n not an int; as :func:`rope_score_data`.

    Source: chapter 08 (claim 23).
    """
    for name, v in (("m", m), ("n", n)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
            raise ValueError(f"{name} must be an int (a position); got {v!r}")
    m, n = int(m), int(n)
    offsets = sorted(set(_int_range("offsets", offsets)) | {m - n})
    shifts = sorted(set(_int_range("shifts", shifts)) | {n})
    data = rope_score_data(q, k, shifts=shifts, offsets=offsets, pairs=pairs, base=base, layout=layout)
    fig = _rope_base(data, n, m - n)
    fig.update_layout(title=f"query at m = {m}, key at n = {n}")
    fig.update_layout(margin={"t": 90})
    return describe(fig, f"Query at position {m}, key at position {n}. " + _rope_description(data))


def rope_score_figure(q, k, *, shifts: Sequence[int] = range(16), offsets: Sequence[int] = range(8),
                      pairs: Sequence[int] | None = None, base: float = 10000.0,
                      layout: str = "interleaved") -> go.Figure:
    """RoPE's relative score, explorable with no kernel: a slider for the key position n, a row of
    buttons for the offset m - n.

    The slider moves both positions together: it turns every arrow panel by ``n theta_i`` (the
    panel's angular axis) and moves the marker along the line; the score does not change. The
    offset buttons turn the q arrows ``d theta_i`` ahead of the k arrows and move the bright line
    and the marker to that offset's score. The two controls restyle different attributes, so they
    combine: at key position n and offset d the k arrow of pair i is drawn at
    ``phase(k_i) + n theta_i``, the q arrow at ``phase(q_i) + (n + d) theta_i``, the marker at
    ``apply_rope(q, n + d) . apply_rope(k, n)`` (tested for every combination). The offset is a
    menu, not a second slider: the book's browser tests drive one plotly slider per figure, and a
    row of buttons shows every offset at once (a drop-down beyond 12 offsets).

    Args: as :func:`rope_score_data`.

    Raises: as :func:`rope_score_data`.

    Source: Su et al. 2021, section 3.4; chapter 08 (claim 23).
    """
    data = rope_score_data(q, k, shifts=shifts, offsets=offsets, pairs=pairs, base=base, layout=layout)
    n0, d0 = data["shifts"][0], data["offsets"][0]
    fig = _rope_base(data, n0, d0)
    P = len(data["pairs"])
    q_traces = [2 * j + 1 for j in range(P)]
    line, marker = 2 * P + len(data["offsets"]), 2 * P + len(data["offsets"]) + 1
    polars = ["polar" if j == 0 else f"polar{j + 1}" for j in range(P)]
    shift_steps = [{
        "label": str(n), "method": "update",
        "args": [{"x": [[n]]}, {f"{pol}.angularaxis.rotation": _rotation(data, j, n) for j, pol in enumerate(polars)},
                 [marker]],
    } for n in data["shifts"]]  # fmt: skip
    # One update for arrows (polar: theta) and line and marker (cartesian: y); null leaves an
    # attribute the trace type does not have at its default (plotly.js restyle: null = default).
    offset_buttons = []
    for i, d in enumerate(data["offsets"]):
        scores = data["scores"][i]
        offset_buttons.append({
            "label": str(d), "method": "update",
            "args": [{"theta": [_q_theta(data, j, d) for j in range(P)] + [None, None],
                      "y": [None] * P + [scores.tolist(), [float(scores.mean())]]},
                     {f"annotations[{P}].text": _score_title(d, float(scores.mean()))},
                     q_traces + [line, marker]],
        })  # fmt: skip
    row = len(offset_buttons) <= 12
    fig.update_layout(
        height=840, margin={"t": 130, "b": 110},
        sliders=[{"active": 0, "currentvalue": {"prefix": "key position n = "}, "steps": shift_steps,
                  "x": 0.0, "len": 1.0, "y": -0.06, "yanchor": "top", "pad": {"t": 10}}],
        updatemenus=[{"type": "buttons" if row else "dropdown", "direction": "right" if row else "down",
                      "name": "offset m − n", "buttons": offset_buttons, "active": 0, "showactive": True,
                      "x": 0.0, "xanchor": "left", "y": 1.06, "yanchor": "bottom", "pad": {"t": 0, "r": 0}}],
    )  # fmt: skip
    # The buttons' label sits above them (beside them, a phone's width has no room for both).
    fig.add_annotation(text="offset m − n:", x=0.0, xref="paper", xanchor="left", y=1.06, yref="paper",
                       yanchor="bottom", yshift=30, showarrow=False)
    # The marker's y is the offset's score whatever n is (the line is flat): the same number the
    # offset buttons write, so each control sets its own attribute of the marker.
    fig.data[marker].y = [float(data["scores"][0].mean())]
    return describe(fig, "A slider moves the key position n (both positions move together); buttons pick the "
                         "offset m − n. " + _rope_description(data))


def rope_explorer_widget(q, k, *, m: int = 5, n: int = 2, max_position: int = 15,
                         pairs: Sequence[int] | None = None, base: float = 10000.0, layout: str = "interleaved"):
    """Live explorer (needs a running kernel): IntSliders for the query position m and the key
    position n; shows :func:`rope_score_view` for the choice.

    Args:
        q, k: (Dh,) one query and one key. m, n: the initial positions. max_position: the sliders'
            largest position (> 0). pairs, base, layout: as :func:`rope_score_data`. The default, 15,
            keeps the redrawn figure near 20 kB: with 23 or 31 (30 and 40 kB of figure JSON), the
            notebook executor that builds the book (nbclient 0.11) stopped responding on the cell
            that displays the widget, while a plain kernel showed it at once.

    Returns:
        An ``ipywidgets.VBox``: ``children[0]`` the HBox of the two sliders (m, n), ``children[1]``
        the output that shows the figure.

    Raises:
        ValueError: ``max_position`` not a positive int, m or n outside ``0 .. max_position``; as
        :func:`rope_score_data`.

    Source: chapter 08 (claim 23).
    """
    import ipywidgets as widgets

    if isinstance(max_position, bool) or not isinstance(max_position, int) or max_position < 1:
        raise ValueError(f"max_position must be an int >= 1; got {max_position!r}")
    for name, v in (("m", m), ("n", n)):
        if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= max_position:
            raise ValueError(f"{name} must be an int in 0..max_position={max_position}; got {v!r}")
    rope_score_data(q, k, pairs=pairs, base=base, layout=layout)  # validates q, k, pairs, base, layout
    m_slider = widgets.IntSlider(value=m, min=0, max=max_position, description="query m")
    n_slider = widgets.IntSlider(value=n, min=0, max=max_position, description="key n")
    span = max(8, max_position // 2)

    def show(m: int, n: int) -> None:
        rope_score_view(q, k, m, n, shifts=range(0, max_position + 1), offsets=range(-span, span + 1),
                        pairs=pairs, base=base, layout=layout).show()

    out = live_output(show, {"m": m_slider, "n": n_slider})
    return widgets.VBox([widgets.HBox([m_slider, n_slider]), out])


# --------------------------------------------------------------------------------------------------
# ALiBi
# --------------------------------------------------------------------------------------------------


def _slope_text(slope: float) -> str:
    e = math.log2(slope)
    return f"2^{e:.4g} = {slope:.4g}"


def _require_count(name: str, value, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}; got {value!r}")
    return int(value)


def alibi_bias_figure(n_heads: int, T: int = 12) -> go.Figure:
    """ALiBi's causal bias ``-m_h (i - j)`` of each head as a (T, T) heatmap, a slider over heads.

    Keys after the query (j > i) are blank: the causal mask hides them. One colour scale for all
    heads (0 at the bright end), so a head with a small slope is visibly the far-reaching one; the
    title gives the head's slope (:func:`selfattn.positions.alibi_slopes`).

    Args:
        n_heads: H (>= 1; any H, powers of two or not). T: positions (>= 2).

    Raises:
        ValueError: ``n_heads`` or ``T`` not an int in range.

    Source: Press et al. 2022, figure 3; chapter 08.
    """
    H = _require_count("n_heads", n_heads)
    T = _require_count("T", T, 2)
    slopes = _pos.alibi_slopes(H)
    pos = torch.arange(T)
    bias = _pos.alibi_bias(slopes, pos, pos).numpy()  # (H, T, T)
    causal = np.tril(np.ones((T, T), dtype=bool))
    zmin = float(bias[:, causal].min())

    def trace(h: int) -> go.Heatmap:
        z = np.where(causal, np.round(bias[h], 6), np.nan)
        return go.Heatmap(z=[[None if np.isnan(v) else float(v) for v in row] for row in z],
                          x=list(range(T)), y=list(range(T)), colorscale=COLORSCALE, zmin=zmin, zmax=0.0,
                          colorbar={"title": "bias"}, xgap=1, ygap=1,
                          hovertemplate="query %{y}, key %{x}: bias %{z:.4f}<extra></extra>")  # fmt: skip

    titles = [f"head {h}: slope m = {_slope_text(float(slopes[h]))}" for h in range(H)]
    fig = go.Figure(trace(0), frames=[go.Frame(data=[trace(h)], name=str(h), layout={"title": {"text": titles[h]}})
                                      for h in range(H)])  # fmt: skip
    fig.update_layout(
        title=titles[0], template="plotly_white", height=560, autosize=True, margin={"t": 80},
        xaxis={"title": "key position j", "dtick": 1 if T <= 16 else None},
        yaxis={"title": "query position i", "autorange": "reversed", "dtick": 1 if T <= 16 else None},
        sliders=[{"active": 0, "currentvalue": {"prefix": "head: "}, "pad": {"t": 50},
                  "steps": [{"label": str(h), "method": "animate", "args": [[str(h)], _STEP]} for h in range(H)]}],
    )  # fmt: skip
    listed = "; ".join(f"head {h}: {_slope_text(float(s))}" for h, s in enumerate(slopes.tolist()))
    return describe(fig, f"ALiBi's bias for {H} heads on {T} positions, a slider picks the head. Each heatmap has "
                         "queries as rows and keys as columns; the bias is 0 on the diagonal and falls by the head's "
                         f"slope for every position further back (keys after the query are masked, blank). "
                         f"Slopes: {listed}.")


def alibi_distance_figure(n_heads: int, max_distance: int = 32) -> go.Figure:
    """ALiBi's bias ``-m_h d`` against the distance ``d = i - j`` back to the key, one line per head.

    Args:
        n_heads: H (>= 1). max_distance: the largest distance drawn (>= 1).

    Raises:
        ValueError: ``n_heads`` or ``max_distance`` not an int in range.

    Source: Press et al. 2022, section 3; chapter 08.
    """
    H = _require_count("n_heads", n_heads)
    D = _require_count("max_distance", max_distance)
    slopes = _pos.alibi_slopes(H)
    d = np.arange(D + 1)
    bias = _pos.alibi_bias(slopes, torch.tensor([D]), torch.arange(D, -1, -1)).numpy()[:, 0, :]  # (H, D+1)
    fig = go.Figure()
    for h in range(H):
        fig.add_trace(go.Scatter(x=d.tolist(), y=bias[h].tolist(), mode="lines", name=f"head {h}: m = {slopes[h]:.3g}",
                                 line={"color": _COLOURS[h % len(_COLOURS)], "dash": _DASHES[(h // len(_COLOURS) + h) % len(_DASHES)]},
                                 hovertemplate=f"head {h}, distance %{{x}}: bias %{{y:.3f}}<extra></extra>"))  # fmt: skip
    fig.update_layout(title=f"ALiBi: the bias each of {H} heads adds for a key d positions back",
                      template="plotly_white", height=480, autosize=True,
                      xaxis={"title": "distance d = i − j (positions back)"}, yaxis={"title": "bias added to the score"},
                      legend={"orientation": "h", "y": -0.2})  # fmt: skip
    ends = "; ".join(f"head {h}: {bias[h, -1]:.3g}" for h in range(H))
    return describe(fig, f"Line chart of ALiBi's bias against the distance back to the key, from 0 to {D}, one "
                         f"straight line per head falling at the head's slope. Bias at distance {D}: {ends}.")


# --------------------------------------------------------------------------------------------------
# Extrapolation past the training length (claim 24)
# --------------------------------------------------------------------------------------------------


def _as_curve(name: str, values) -> np.ndarray:
    if isinstance(values, torch.Tensor):
        values = values.detach().cpu().double().numpy()
    arr = np.asarray(values, dtype=np.float64)
    if arr.ndim != 1 or arr.size == 0:
        raise ValueError(f"{name} must be a non-empty 1-D array (one loss per position); got shape {arr.shape}")
    if not np.isfinite(arr).all():
        raise ValueError(f"{name} must be finite; got {int((~np.isfinite(arr)).sum())} NaN or inf entries")
    return arr


def _as_baselines(baselines) -> dict[str, float]:
    out = {}
    for label, value in (baselines or {}).items():
        if isinstance(value, bool) or not isinstance(value, (int, float, np.floating, np.integer)) or not math.isfinite(value):
            raise ValueError(f"baselines[{label!r}] must be a finite number; got {value!r}")
        out[str(label)] = float(value)
    return out


def extrapolation_figure(losses: Mapping[str, object], *, train_length: int = 64,
                         baselines: Mapping[str, float] | None = None, window: int = 1,
                         title: str | None = None) -> go.Figure:
    """Loss per position (nats per token) for each position scheme, with the training length marked.

    A scheme that generalizes past the training length stays flat to the right of the dotted line;
    one that breaks turns upwards there; a learned table stops at its last row.

    Args:
        losses: ``{scheme: (L,) per-position losses}``, L may differ (the learned table stops at
            its length), e.g. :attr:`selfattn.experiments.positions.ExtrapolationResult.position_loss`.
            Known schemes (:data:`SCHEME_STYLES`) keep their colour in every figure.
        train_length: the length trained on (> 0): a dotted vertical line where unseen positions start.
        baselines: optional ``{label: loss}`` drawn as horizontal lines (e.g. uniform, unigram).
        window: draw a trailing moving average over this many positions (> 0; 1 = the raw values,
            which are noisy when few windows were evaluated). The description's means use raw values.
        title: the figure's title (default: "Loss per position, trained on T tokens").

    Raises:
        ValueError: no scheme, a curve not 1-D, empty or not finite, a bad ``train_length``,
        ``window`` or baseline.

    Source: chapter 08 (claim 24).
    """
    if not losses:
        raise ValueError("losses must hold at least one {scheme: per-position losses} entry")
    T = _require_count("train_length", train_length)
    window = _require_count("window", window)
    curves = {str(k): _as_curve(f"losses[{k!r}]", v) for k, v in losses.items()}
    lines = _as_baselines(baselines)
    longest = max(len(c) for c in curves.values())
    fig = go.Figure()
    for i, (name, c) in enumerate(curves.items()):
        colour, dash = _style(i, name)
        fig.add_trace(go.Scatter(x=list(range(len(c))), y=np.round(moving_average(c, window), 4).tolist(),
                                 mode="lines", name=name,
                                 line={"color": colour, "dash": dash, "width": 2},
                                 hovertemplate=f"{name}, position %{{x}}: %{{y:.3f}} nats<extra></extra>"))
    for i, (label, value) in enumerate(lines.items()):
        colour, dash = _BASELINE_STYLES[i % len(_BASELINE_STYLES)]
        fig.add_trace(go.Scatter(x=[0, longest - 1], y=[value, value], mode="lines", name=f"{label} = {value:.2f}",
                                 line={"color": colour, "dash": dash, "width": 1},
                                 hovertemplate=f"{label}: {value:.3f} nats<extra></extra>"))  # fmt: skip
    fig.add_vline(x=T - 0.5, line={"color": "#666666", "dash": "dot", "width": 2},
                  annotation={"text": f"training length {T}", "font": {"color": "#444444"}},
                  annotation_position="top right")  # fmt: skip
    y_title = "cross-entropy (nats per token)" + (f", {window}-position average" if window > 1 else "")
    fig.update_layout(title=title or f"Loss per position, trained on {T} tokens", template="plotly_white",
                      height=480, autosize=True, xaxis={"title": "position in the sequence"},
                      yaxis={"title": y_title}, legend={"orientation": "h", "y": -0.22})  # fmt: skip
    parts = []
    for name, c in curves.items():
        inside = f"{c[:T].mean():.2f} at positions 0-{min(T, len(c)) - 1}"
        if len(c) > T:
            parts.append(f"{name}: {inside}, {c[T:].mean():.2f} at positions {T}-{len(c) - 1}")
        else:
            parts.append(f"{name}: {inside}, and nothing past position {len(c) - 1} (it cannot run there)")
    base = (" Horizontal lines: " + ", ".join(f"{k} {v:.2f}" for k, v in lines.items()) + ".") if lines else ""
    return describe(fig, f"Line chart of the loss at each position for {len(curves)} position scheme{'s' if len(curves) != 1 else ''}; a dotted "
                         f"vertical line marks the training length {T}. Mean loss: " + "; ".join(parts) + "." + base)


def extrapolation_bars_figure(mean_losses: Mapping[str, Mapping[int, float | None]], *,
                              baselines: Mapping[str, float] | None = None) -> go.Figure:
    """Mean loss at a few evaluation lengths (e.g. 64, 128, 256), grouped bars per position scheme.

    A length a scheme cannot run at (None, or missing) gets no bar and an "n/a" label in its slot,
    never a bar of 0.

    Args:
        mean_losses: ``{scheme: {length: mean loss or None}}``.
        baselines: optional ``{label: loss}`` drawn as horizontal lines.

    Raises:
        ValueError: no scheme, no length, a length not a positive int, a loss neither None nor finite.

    Source: chapter 08 (claim 24).
    """
    if not mean_losses:
        raise ValueError("mean_losses must hold at least one {scheme: {length: loss}} entry")
    table: dict[str, dict[int, float | None]] = {}
    for name, row in mean_losses.items():
        if not isinstance(row, Mapping):
            raise ValueError(f"mean_losses[{name!r}] must be a mapping {{length: loss or None}}; got {type(row).__name__}")
        clean = {}
        for length, v in row.items():
            L = _require_count(f"the lengths of mean_losses[{name!r}]", length)
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float, np.floating, np.integer))
                                  or not math.isfinite(v)):
                raise ValueError(f"mean_losses[{name!r}][{L}] must be a finite number or None; got {v!r}")
            clean[L] = None if v is None else float(v)
        table[str(name)] = clean
    lengths = sorted({L for row in table.values() for L in row})
    if not lengths:
        raise ValueError("mean_losses must give at least one length")
    lines = _as_baselines(baselines)
    cats = [str(L) for L in lengths]
    K = len(table)
    fig = go.Figure()
    missing = []
    gap = 0.2  # plotly's bargap: each group spans 0.8 of a category, one slot per scheme
    for k, (name, row) in enumerate(table.items()):
        colour, _ = _style(k, name)
        ys = [row.get(L) for L in lengths]
        fig.add_trace(go.Bar(x=cats, y=ys, name=name, marker={"color": colour},
                             text=[None if y is None else f"{y:.2f}" for y in ys], textposition="outside",
                             hovertemplate=f"{name}, length %{{x}}: %{{y:.3f}} nats<extra></extra>"))  # fmt: skip
        for c, y in enumerate(ys):
            if y is None:
                missing.append(f"{name} at {lengths[c]}")
                fig.add_annotation(x=c - (1 - gap) / 2 + (k + 0.5) * (1 - gap) / K, y=0, yref="y", text="n/a",
                                   showarrow=False, yanchor="bottom", textangle=-90, font={"color": "#444444"})
    for i, (label, value) in enumerate(lines.items()):
        colour, dash = _BASELINE_STYLES[i % len(_BASELINE_STYLES)]
        fig.add_hline(y=value, line={"color": colour, "dash": dash, "width": 1},
                      annotation={"text": f"{label} {value:.2f}"}, annotation_position="top left")
    fig.update_layout(title="Mean loss at each evaluation length", template="plotly_white", height=480,
                      autosize=True, barmode="group", bargap=gap, bargroupgap=0.0,
                      xaxis={"title": "evaluation length (tokens)", "type": "category"},
                      yaxis={"title": "mean cross-entropy (nats per token)", "rangemode": "tozero"},
                      legend={"orientation": "h", "y": -0.22})  # fmt: skip
    rows = "; ".join(name + ": " + ", ".join(f"{L} tokens " + ("n/a" if row.get(L) is None else f"{row[L]:.2f}")
                                               for L in lengths) for name, row in table.items())  # fmt: skip
    na = f" Cannot run (n/a): {', '.join(missing)}." if missing else ""
    base = (" Horizontal lines: " + ", ".join(f"{k} {v:.2f}" for k, v in lines.items()) + ".") if lines else ""
    return describe(fig, f"Grouped bar chart of the mean loss (nats per token) at lengths {', '.join(cats)} for "
                         f"{K} position schemes. {rows}.{na}{base}")


# --------------------------------------------------------------------------------------------------
# Sinusoidal encodings and a shift as a rotation (claim 22)
# --------------------------------------------------------------------------------------------------


def sinusoidal_figure(n_positions: int = 64, d_model: int = 32, *, base: float = 10000.0) -> go.Figure:
    """The sinusoidal encodings (T, D) as a heatmap: positions as rows, features as columns, -1..1.

    Raises:
        ValueError: as :func:`selfattn.positions.sinusoidal_encoding`.

    Source: Vaswani et al. 2017, section 3.5; chapter 08.
    """
    pe = _pos.sinusoidal_encoding(n_positions, d_model, base=base, dtype=torch.float64).numpy()
    fig = go.Figure(go.Heatmap(z=np.round(pe, 4).tolist(), x=list(range(d_model)), y=list(range(n_positions)),
                               colorscale=DIVERGING, zmid=0, zmin=-1, zmax=1, colorbar={"title": "value"},
                               hovertemplate="position %{y}, feature %{x}: %{z:.3f}<extra></extra>"))  # fmt: skip
    fig.update_layout(title=f"Sinusoidal encodings: {n_positions} positions, d_model = {d_model}",
                      template="plotly_white", height=520, autosize=True,
                      xaxis={"title": "feature (even: sin, odd: cos; frequency falls to the right)"},
                      yaxis={"title": "position p", "autorange": "reversed"})  # fmt: skip
    slowest = 2 * math.pi * base ** ((d_model - 2) / d_model)
    return describe(fig, f"Heatmap of the sinusoidal encodings for positions 0 to {n_positions - 1} and {d_model} "
                         "features, from -1 (red) to 1 (blue). Feature pairs (sin, cos) of one frequency sit side by "
                         f"side; the leftmost pair repeats every {2 * math.pi:.2f} positions, the rightmost every "
                         f"{slowest:.3g}, so the left columns flicker and the right ones barely change.")


def sinusoidal_shift_figure(d_model: int = 16, offsets: Sequence[int] = range(0, 9), *, n_positions: int = 32,
                            base: float = 10000.0) -> go.Figure:
    """A shift of every position by k is one linear map: the (D, D) matrix M_k with PE[p + k] = PE[p] M_k.

    Left: M_k (block-diagonal 2x2 rotations, one per frequency). Right: the error
    ``|PE[p] M_k - PE[p + k]|`` per position p, at rounding level for every p. A slider picks k.

    Raises:
        ValueError: as :func:`selfattn.positions.sinusoidal_shift_matrix`; offsets not increasing ints.

    Source: Vaswani et al. 2017, section 3.5; chapter 08 (claim 22).
    """
    offsets = _int_range("offsets", offsets, min_value=0)
    T = _require_count("n_positions", n_positions)
    pe = _pos.sinusoidal_encoding(T + offsets[-1], d_model, base=base, dtype=torch.float64)  # (T + K, D)

    def parts(k: int) -> tuple[np.ndarray, np.ndarray]:
        M = _pos.sinusoidal_shift_matrix(k, d_model, base=base)
        err = (pe[:T] @ M - pe[k:k + T]).abs().max(dim=-1).values  # (T,) worst feature per position
        return M.numpy(), err.numpy()

    def traces(k: int) -> list:
        M, err = parts(k)
        return [go.Heatmap(z=np.round(M, 4).tolist(), colorscale=DIVERGING, zmid=0, zmin=-1, zmax=1,
                           colorbar={"title": "M", "thickness": 12}, xaxis="x", yaxis="y",
                           hovertemplate="row %{y}, column %{x}: %{z:.3f}<extra></extra>"),
                go.Bar(x=list(range(T)), y=[float(e) for e in err], marker={"color": "#0072B2"}, xaxis="x2", yaxis="y2",
                       name="max error", hovertemplate="p = %{x}: %{y:.1e}<extra></extra>")]  # fmt: skip

    fig = make_subplots(rows=1, cols=2, column_widths=[0.5, 0.5], horizontal_spacing=0.16,
                        subplot_titles=["M_k", "max |PE[p] M_k − PE[p + k]| over features"])
    fig.add_traces(traces(offsets[0]))
    title = lambda k: f"shift by k = {k}: PE[p + {k}] = PE[p] M_{k} for every p"  # noqa: E731
    fig.frames = [go.Frame(data=traces(k), name=str(k), layout={"title": {"text": title(k)}}) for k in offsets]
    worst = max(float(parts(k)[1].max()) for k in offsets)
    fig.update_layout(title=title(offsets[0]), template="plotly_white", height=500, autosize=True, showlegend=False,
                      margin={"t": 90},
                      sliders=[{"active": 0, "currentvalue": {"prefix": "shift k = "}, "pad": {"t": 50},
                                "steps": [{"label": str(k), "method": "animate", "args": [[str(k)], _STEP]}
                                          for k in offsets]}])  # fmt: skip
    fig.update_yaxes(autorange="reversed", title_text="row", row=1, col=1)
    fig.update_xaxes(title_text="column", row=1, col=1)
    fig.update_xaxes(title_text="position p", row=1, col=2)
    fig.update_yaxes(title_text="error", range=[0, max(worst * 1.2, 1e-15)], exponentformat="e", row=1, col=2)
    return describe(fig, f"A slider picks the shift k from {offsets[0]} to {offsets[-1]}. Left: the {d_model} by "
                         f"{d_model} matrix M_k, zero except for 2 by 2 rotation blocks on the diagonal, one per "
                         "frequency, each turning by k times its frequency. Right: for positions 0 to "
                         f"{T - 1}, the largest difference between PE[p] M_k and PE[p + k]; at most {worst:.1e} for "
                         "every shift, rounding error: the same matrix works at every position.")
