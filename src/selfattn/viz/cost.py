"""Figure builders for chapters 09-10: what attention costs, and the tiles of FlashAttention.

Builders return plotly Figures (never show them). The static figures carry buttons or a slider, so a
reader of the book explores them with no kernel; the single-view builders (``*_view``) are what
the chapters' ipywidgets explorers re-display, so both show the same views.
"""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ..efficient.experiments import fitted_slope
from ..ref.online import OnlineSoftmaxState, logsumexp, online_softmax_update
from . import COLORSCALE, add_marked_vline, describe

__all__ = ["machine_roofline_figure", "scaling_view", "scaling_figure", "tiles_data", "tiles_view", "tiles_figure", "lookup_figure",
           "fitted_slope", "traffic_figure", "block_time_figure"]

# Okabe-Ito colours: distinct for colour-blind readers; dashes tell the series apart in grayscale.
_COLOURS = ["#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9"]
_DASHES = ["solid", "dash", "dot", "dashdot", "longdash", "longdashdot"]
_STEP = {"mode": "immediate", "frame": {"duration": 0, "redraw": True}, "transition": {"duration": 0}}


def _scaling_traces(sizes, series: dict, visible: bool = True) -> list[go.Scatter]:
    traces = []
    for i, (name, values) in enumerate(series.items()):
        pairs = [(s, v) for s, v in zip(sizes, values, strict=True) if v is not None and v > 0]
        label = name
        if len(pairs) >= 2:
            label = f"{name} (slope {fitted_slope(*zip(*pairs, strict=True)):.2f})"
        traces.append(go.Scatter(x=[p[0] for p in pairs], y=[float(f"{p[1]:.4g}") for p in pairs],
                                 mode="lines+markers", name=label, visible=visible,
                                 line={"color": _COLOURS[i % 6], "dash": _DASHES[i % 6]}))
    return traces


def _loglog_layout(fig: go.Figure, title: str, unit: str) -> None:
    fig.update_layout(title=title, height=440, template="plotly_white", legend={"orientation": "h", "y": -0.22})
    fig.update_xaxes(type="log", title_text="sequence length T (log scale)")
    fig.update_yaxes(type="log", title_text=f"{unit} (log scale)")


def scaling_view(sizes, series: dict, quantity: str, unit: str) -> go.Figure:
    """Log-log lines of ``series`` (name -> one value per size, None where not measured) against
    ``sizes``; each legend entry gives its fitted slope (2 means quadratic, 1 linear).

    Source: chapter 09 (claim 16)."""
    fig = go.Figure(_scaling_traces(sizes, series))
    _loglog_layout(fig, f"{quantity} against sequence length", unit)
    return describe(fig, f"Log-log plot of {quantity} ({unit}) against sequence length for "
                         f"{', '.join(series)}; the legend gives each line's fitted slope.")


def scaling_figure(sizes, panels: dict[str, tuple[dict, str]]) -> go.Figure:
    """Several :func:`scaling_view` panels in one figure with buttons to switch between them (works
    with no kernel). ``panels``: quantity -> (series, unit).

    Source: chapter 09 (claim 16)."""
    fig = go.Figure()
    counts, buttons = [], []
    for j, (series, _unit) in enumerate(panels.values()):
        fig.add_traces(_scaling_traces(sizes, series, visible=j == 0))
        counts.append(len(series))
    start = 0
    for j, (quantity, (_series, unit)) in enumerate(panels.items()):
        visible = [False] * sum(counts)
        visible[start:start + counts[j]] = [True] * counts[j]
        start += counts[j]
        buttons.append({"label": quantity, "method": "update",
                        "args": [{"visible": visible}, {"title": {"text": f"{quantity} against sequence length"},
                                                        "yaxis": {"type": "log", "title": {"text": f"{unit} (log scale)"}}}]})
    first_q, (_, first_unit) = next(iter(panels.items()))
    _loglog_layout(fig, f"{first_q} against sequence length", first_unit)
    fig.update_layout(updatemenus=[{"type": "buttons", "direction": "right", "buttons": buttons,
                                    "x": 0.0, "y": 1.18, "xanchor": "left", "showactive": True}],
                      margin={"t": 110})
    return describe(fig, "Log-log plots against sequence length; buttons switch between "
                         f"{', '.join(panels)}. The legend gives each line's fitted slope (2 means quadratic, 1 "
                         "linear, 0 constant).")


def tiles_data(scores, block_k: int) -> list[dict]:
    """The online softmax of each row of ``scores`` (T, S), one key block at a time.

    Returns one dict per step (0 = nothing seen, then one per key block) with ``seen`` (number of
    keys read), ``m`` (running maxima, T), ``lse`` (log-sum-exp so far, T). Source: chapter 10."""
    scores = np.asarray(scores, dtype=float)
    state = OnlineSoftmaxState(scores.shape[:-1])
    steps = [{"seen": 0, "m": state.m.copy(), "lse": state.logsumexp()}]
    for start in range(0, scores.shape[-1], block_k):
        online_softmax_update(state, scores[..., start:start + block_k])
        steps.append({"seen": min(start + block_k, scores.shape[-1]), "m": state.m.copy(), "lse": state.logsumexp()})
    return steps


def _tiles_traces(scores: np.ndarray, step: dict, final_lse: np.ndarray) -> list:
    T, S = scores.shape
    shown = np.where(np.arange(S)[None, :] < step["seen"], scores, np.nan)  # unread keys are blank
    rows = [f"q{i}" for i in range(T)]
    finite = lambda a: [None if not np.isfinite(x) else round(float(x), 3) for x in a]  # noqa: E731
    return [
        go.Heatmap(z=np.round(shown, 3), x=[f"k{j}" for j in range(S)], y=rows, colorscale=COLORSCALE,
                   zmin=float(scores.min()), zmax=float(scores.max()),
                   colorbar={"title": "score", "x": 0.43, "xanchor": "left", "thickness": 12},  # in the gap
                   xaxis="x", yaxis="y", hovertemplate="%{y}, %{x}: %{z}<extra></extra>"),
        go.Bar(x=finite(step["lse"]), y=rows, orientation="h", name="log-sum-exp so far", marker_color=_COLOURS[0],
               xaxis="x2", yaxis="y2"),
        go.Scatter(x=finite(step["m"]), y=rows, mode="markers", name="running max m",
                   marker={"symbol": "diamond", "size": 9, "color": _COLOURS[1]}, xaxis="x2", yaxis="y2"),
        go.Scatter(x=finite(final_lse), y=rows, mode="markers", name="final log-sum-exp",
                   marker={"symbol": "line-ns-open", "size": 16, "color": "black", "line": {"width": 2}},
                   xaxis="x2", yaxis="y2"),
    ]


def _tiles_base(scores: np.ndarray, title: str) -> go.Figure:
    # One shared row axis (the query labels only on the left), so the gap between the panels holds
    # the heatmap's colorbar alone; the legend sits above the panels, clear of the slider below.
    fig = make_subplots(rows=1, cols=2, column_widths=[0.5, 0.5], horizontal_spacing=0.16, shared_yaxes=True)
    lo = float(min(scores.max(axis=-1).min(), scores.min())) - 0.5
    hi = float(logsumexp(scores).max()) + 0.5
    fig.update_layout(title=title, height=460, template="plotly_white", barmode="overlay", margin={"t": 100},
                      legend={"orientation": "h", "x": 1.0, "xanchor": "right", "y": 1.02, "yanchor": "bottom"})
    fig.update_yaxes(autorange="reversed", row=1, col=1)
    fig.update_yaxes(autorange="reversed", row=1, col=2)
    fig.update_xaxes(title_text="key (scores read so far)", row=1, col=1)
    fig.update_xaxes(range=[lo, hi], title_text="value, per query row", row=1, col=2)
    return fig


def _tiles_title(step: dict, n_keys: int) -> str:
    return f"after reading keys 0..{step['seen'] - 1} of {n_keys}" if step["seen"] else "before reading any key"


def tiles_view(scores, block_k: int, step: int) -> go.Figure:
    """One step of the online softmax over key blocks: left, the scores read so far (unread blank);
    right, per query row the running maximum, the log-sum-exp so far and the final one (they meet
    at the last step). Source: chapter 10."""
    scores = np.asarray(scores, dtype=float)
    steps = tiles_data(scores, block_k)
    if not 0 <= step < len(steps):
        raise ValueError(f"step must be in [0, {len(steps) - 1}]; got {step}")
    fig = _tiles_base(scores, _tiles_title(steps[step], scores.shape[-1]))
    fig.add_traces(_tiles_traces(scores, steps[step], steps[-1]["lse"]))
    return describe(fig, f"Online softmax with key blocks of {block_k}: the scores read after step {step}, and "
                         "for each query the running maximum and the log-sum-exp so far against the final value.")


def tiles_figure(scores, block_k: int) -> go.Figure:
    """:func:`tiles_view` with a slider over every step (works with no kernel). Source: chapter 10."""
    scores = np.asarray(scores, dtype=float)
    steps = tiles_data(scores, block_k)
    final = steps[-1]["lse"]
    fig = _tiles_base(scores, _tiles_title(steps[0], scores.shape[-1]))
    fig.add_traces(_tiles_traces(scores, steps[0], final))
    names = [str(i) for i in range(len(steps))]
    fig.frames = [go.Frame(data=_tiles_traces(scores, st, final), name=name,
                           layout={"title": {"text": _tiles_title(st, scores.shape[-1])}})
                  for st, name in zip(steps, names, strict=True)]
    fig.update_layout(sliders=[{"active": 0, "currentvalue": {"prefix": "key blocks read: "}, "pad": {"t": 50},
                                "steps": [{"label": n, "method": "animate", "args": [[n], _STEP]} for n in names]}])
    return describe(fig, f"A slider steps through the key blocks ({block_k} keys each) of the online softmax: the "
                         "heatmap fills with the scores read so far; the bars show each query's log-sum-exp so "
                         "far, which grows and reaches the final value (black ticks) at the last step; the diamonds "
                         "show the running maximum.")


def lookup_figure(weights: dict, targets) -> go.Figure:
    """Heatmaps of attention weights (T, S) for several methods, with buttons to switch between them
    (works with no kernel); white circles mark each query's target key. Source: chapter 09 (claim 18)."""
    targets = np.asarray(targets)
    fig = go.Figure()
    names = list(weights)
    for j, name in enumerate(names):
        w = np.asarray(weights[name], dtype=float)
        fig.add_trace(go.Heatmap(z=np.round(w, 3), colorscale=COLORSCALE, zmin=0, zmax=1, visible=j == 0,
                                 colorbar={"title": "weight"}, name=name,
                                 hovertemplate="query %{y}, key %{x}: %{z}<extra></extra>"))
    fig.add_trace(go.Scatter(x=targets.tolist(), y=list(range(len(targets))), mode="markers", name="target key",
                             marker={"symbol": "circle-open", "size": 7, "color": "white", "line": {"width": 1.5}}))
    buttons = []
    for j, name in enumerate(names):
        visible = [i == j for i in range(len(names))] + [True]
        buttons.append({"label": name, "method": "update", "args": [{"visible": visible}, {"title": {"text": name}}]})
    fig.update_layout(title=names[0], height=520, template="plotly_white",
                      updatemenus=[{"type": "buttons", "direction": "right", "buttons": buttons, "x": 0.0, "y": 1.15,
                                    "xanchor": "left"}], margin={"t": 100})
    fig.update_xaxes(title_text="key position")
    fig.update_yaxes(title_text="query position", autorange="reversed")
    return describe(fig, f"Attention weights of a sharp lookup task for {', '.join(names)} (buttons switch); circles "
                         "mark the key each query should find. Exact attention puts its weight on the circles; "
                         "the window cannot reach circles far from the diagonal; linear attention spreads its weight.")


def traffic_figure(lengths, by_length: dict, memories, by_memory: dict, *, fixed_memory: int,
                   fixed_length: int) -> go.Figure:
    """Bytes moved between slow and fast memory (the IO model), in two log-log panels: left,
    against the sequence length T at a fast memory of ``fixed_memory`` bytes (``by_length``: name ->
    bytes moved at each length); right, against the fast-memory size M in bytes (``memories``) at
    ``T = fixed_length`` (``by_memory``: name -> bytes moved at each size). Both axes of the right panel
    are in bytes, so its slope is the same as in numbers. Each legend entry gives its fitted slope (2:
    quadratic in T; -1: inversely proportional to M; 0: independent of M).

    Source: chapter 10 (Dao et al. 2022, Theorem 2; claim 34)."""
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.12,
                        subplot_titles=(f"against T (M = {fixed_memory // 1024} KiB)",
                                        f"against fast memory M (T = {fixed_length})"))
    for col, (xs, series) in enumerate(((lengths, by_length), (memories, by_memory)), start=1):
        for i, (name, values) in enumerate(series.items()):
            slope = fitted_slope(xs, values)
            fig.add_trace(go.Scatter(x=list(xs), y=[float(f"{v:.4g}") for v in values], mode="lines+markers",
                                     name=f"{name} (slope {slope:.2f})", legendgroup=f"panel{col}",
                                     line={"color": _COLOURS[i % 6], "dash": _DASHES[i % 6]}), row=1, col=col)
    fig.update_xaxes(type="log", title_text="sequence length T (log scale)", row=1, col=1)
    fig.update_xaxes(type="log", title_text="fast memory M, bytes (log scale)", row=1, col=2)
    fig.update_yaxes(type="log", title_text="bytes moved (log scale)")
    fig.update_layout(title="Bytes moved between slow and fast memory, counted", height=470,
                      template="plotly_white", legend={"orientation": "h", "y": -0.25}, margin={"t": 90})
    names = ", ".join(dict.fromkeys([*by_length, *by_memory]))
    return describe(fig, "Two log-log panels of the bytes each algorithm moves between slow and fast "
                         f"memory ({names}): left against the sequence length at a fast memory of "
                         f"{fixed_memory // 1024} KiB, right against the fast-memory size at T = {fixed_length}. "
                         "The legend gives each line's fitted slope.")


def block_time_figure(blocks, times_ms, *, sdpa_ms: float, tile_bytes, caches: dict) -> go.Figure:
    """Time of the tiled forward pass against its (square) block size, with SDPA's time as a
    horizontal line and the block sizes where the tile (``tile_bytes``, one per block: what one step
    of the loop works on for one head, as each head's matrix product works on its own) outgrows each
    cache in ``caches`` (name -> bytes, as :func:`selfattn.device.cpu_cache_sizes` reports).

    Source: chapter 10."""
    blocks, times_ms, tile_bytes = list(blocks), list(times_ms), list(tile_bytes)
    fig = go.Figure(go.Scatter(x=blocks, y=[float(f"{t:.4g}") for t in times_ms], mode="lines+markers",
                               name="tiled attention", line={"color": _COLOURS[0]},
                               customdata=[f"{b / 2**10:,.0f} KiB" for b in tile_bytes],
                               hovertemplate="block %{x}: %{y} ms, tile per head %{customdata}<extra></extra>"))
    fig.add_trace(go.Scatter(x=[blocks[0], blocks[-1]], y=[float(f"{sdpa_ms:.4g}")] * 2, mode="lines",
                             name="PyTorch SDPA (one fused kernel)", line={"color": _COLOURS[1], "dash": "dash"}))
    marks = []
    for i, (name, size) in enumerate(sorted(((n, s) for n, s in caches.items() if not n.endswith("i")),
                                            key=lambda item: item[1])):
        first_over = next((b for b, tb in zip(blocks, tile_bytes, strict=True) if tb > size), None)
        if first_over is None:
            continue
        add_marked_vline(fig, first_over, f"tile > {name}", log_x=True, side="left",
                         line={"color": _COLOURS[2 + i % 4], "dash": "dot"})
        marks.append(f"{name} ({size // 2**10:,} KiB) from block {first_over}")
    fig.update_xaxes(type="log", title_text="block size (queries = keys per tile, log scale)")
    fig.update_yaxes(type="log", title_text="time per forward pass, ms (log scale)")
    fig.update_layout(title="Tiled attention: time against block size", height=440, template="plotly_white",
                      legend={"orientation": "h", "y": -0.22})
    where = "; one head's tile outgrows " + ", ".join(marks) if marks else ""
    return describe(fig, f"Log-log plot of the tiled forward pass's time against its block size "
                         f"({blocks[0]} to {blocks[-1]}), with SDPA's time as a dashed line{where}.")


def machine_roofline_figure(machines, intensities=None, *, intensity_range=(0.1, 1e4)) -> go.Figure:
    """The roofline of chapter 10's systems primer: attainable GFLOP/s ``min(peak, I x bandwidth)``
    against arithmetic intensity ``I`` (FLOP per byte of slow memory), log-log, one line per machine.

    Args:
        machines: name -> (peak FLOP/s, bandwidth bytes/s), e.g. this CPU measured and a published GPU.
        intensities: label -> FLOP/byte, drawn as labelled vertical lines (e.g. a softmax pass, a large
            matrix product).
        intensity_range: (low, high) of the x axis, fixed (an intensity outside it is an error).

    Each line's corner, its balance (peak / bandwidth), is a point of the line.

    Raises: ValueError: no machine, a rate that is not a finite number > 0, a bad range or intensity.
    Source: Williams et al. 2009 (the roofline); chapter 10.
    """
    machines = dict(machines)
    if not machines:
        raise ValueError("machines must name at least one machine: name -> (FLOP/s, bytes/s)")
    lo, hi = intensity_range
    if not (0 < lo < hi < np.inf):
        raise ValueError(f"intensity_range must be (low, high) with 0 < low < high; got {intensity_range!r}")
    for name, (flops, bw) in machines.items():
        for what, v in (("FLOP/s", flops), ("bytes/s", bw)):
            if not (isinstance(v, (int, float)) and np.isfinite(v) and v > 0):
                raise ValueError(f"machines[{name!r}]: {what} must be a finite number > 0; got {v!r}")
    marks = dict(intensities or {})
    for label, v in marks.items():
        if not (isinstance(v, (int, float)) and np.isfinite(v) and v > 0):
            raise ValueError(f"intensities[{label!r}] must be a finite number > 0 (FLOP/byte); got {v!r}")
        if not lo <= v <= hi:
            raise ValueError(f"intensities[{label!r}] = {v!r} lies outside intensity_range {intensity_range!r}, "
                             "the x axis drawn")
    grid = np.geomspace(lo, hi, 121)
    fig = go.Figure()
    for i, (name, (flops, bw)) in enumerate(machines.items()):
        balance = flops / bw
        x = np.unique(np.append(grid, balance) if lo <= balance <= hi else grid)
        fig.add_trace(go.Scatter(
            x=x.tolist(), y=(np.minimum(flops, x * bw) / 1e9).tolist(), mode="lines",
            name=f"{name} (balance {balance:.3g} FLOP/byte)",
            line={"color": _COLOURS[i % 6], "dash": _DASHES[i % 6]},
            hovertemplate=f"{name}<br>%{{x:.3g}} FLOP/byte: at most %{{y:.4g}} GFLOP/s<extra></extra>"))
    # Each label on the side of its line with more room, one under another (two close lines' labels
    # would overprint); the x range is the data's (intensity_range): plotly would otherwise widen the
    # axis until a long label fits, to 1e14 on a phone (issue 31).
    middle = (np.log10(lo) + np.log10(hi)) / 2
    for k, (label, v) in enumerate(marks.items()):
        add_marked_vline(fig, float(v), label, log_x=True, line={"dash": "dash", "color": "#999999", "width": 1},
                         side="right" if np.log10(v) <= middle else "left", y=1.0 - 0.09 * (k % 4))
    fig.update_layout(title="The roofline: what a machine can attain at a given arithmetic intensity", height=460,
                      template="plotly_white", legend={"orientation": "h", "y": -0.25})
    fig.update_xaxes(type="log", range=[float(np.log10(lo)), float(np.log10(hi))], autorange=False,
                     title_text="arithmetic intensity (FLOP per byte moved, log scale)")
    fig.update_yaxes(type="log", title_text="attainable (GFLOP/s, log scale)")
    return describe(fig, (
        "Roofline, log-log: attainable GFLOP/s against FLOPs per byte for "
        + "; ".join(f"{n} ({f / 1e9:,.0f} GFLOP/s, {b / 1e9:,.0f} GB/s, balance {f / b:.3g})"
                    for n, (f, b) in machines.items())
        + ". Left of a line's corner memory traffic limits it, right of it the arithmetic."
        + ("" if not marks else " Dashed verticals: " + "; ".join(f"{k} at {v:.3g}" for k, v in marks.items()) + ".")))
