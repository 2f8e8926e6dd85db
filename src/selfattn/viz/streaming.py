"""Figure builders for chapter 11's streaming cache: loss past the window, and the ring buffer's slots.

Every builder returns a static plotly Figure with a text description attached (never shows it), so a
reader of the book explores it with no kernel (hover, legend toggles).

- :func:`streaming_loss_figure`: loss against position (moving average) for the full cache, sliding
  windows with and without sinks, and recomputation (claim 28), with the window and the training
  length marked.
- :func:`ring_buffer_figure`: which text position sits in which slot of a
  :class:`~selfattn.inference.streaming.SlidingWindowCache` after each of a few steps, sinks
  marked, the slot just written outlined.

Source: chapter 11.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import plotly.colors
import plotly.graph_objects as go
import torch

from ..inference.streaming import SlidingWindowCache
from . import add_marked_vline, describe
from .positions import _as_baselines, _as_curve, _require_count, _style
from .training import moving_average

__all__ = ["streaming_loss_figure", "ring_buffer_figure", "ring_buffer_slots"]


def streaming_loss_figure(losses: Mapping[str, object], *, window: int, train_length: int = 64,
                          smooth: int = 32, baselines: Mapping[str, float] | None = None,
                          log_x: bool = True, title: str | None = None) -> go.Figure:
    """Loss per position (nats per token, trailing moving average) for each cache setting.

    Args:
        losses: ``{label: (N,) per-position losses}``, e.g.
            :attr:`selfattn.inference.streaming.StreamingResult.position_loss`.
        window: W (> 0), marked by a dashed vertical line (where the window starts evicting).
        train_length: the training length (> 0), a dotted vertical line.
        smooth: moving-average length (> 0; 1 = raw values). baselines: optional ``{label: loss}``
            horizontal lines (e.g. the in-distribution reference). log_x: a logarithmic position axis
            (positions from 1), so that the first window and the long tail both show.
        title: default "Loss per position: full cache, sliding window W, sinks".

    Raises:
        ValueError: no curve; a curve not 1-D, empty or not finite; bad ``window``,
        ``train_length``, ``smooth`` or baseline.

    Source: Xiao et al. 2024, figure 3; chapter 11 (claim 28).
    """
    if not losses:
        raise ValueError("losses must hold at least one {label: per-position losses} entry")
    W = _require_count("window", window)
    T = _require_count("train_length", train_length)
    smooth = _require_count("smooth", smooth)
    curves = {str(k): _as_curve(f"losses[{k!r}]", v) for k, v in losses.items()}
    lines = _as_baselines(baselines)
    longest = max(len(c) for c in curves.values())
    fig = go.Figure()
    for i, (name, c) in enumerate(curves.items()):
        colour, dash = _style(i, name)
        x = list(range(1, len(c))) if log_x else list(range(len(c)))  # position 0 has no place on a log axis
        y = moving_average(c, smooth)[1:] if log_x else moving_average(c, smooth)
        fig.add_trace(go.Scatter(x=x, y=np.round(y, 4).tolist(), mode="lines", name=name,
                                 line={"color": colour, "dash": dash, "width": 2},
                                 hovertemplate=f"{name}, position %{{x}}: %{{y:.3f}} nats<extra></extra>"))
    for i, (label, value) in enumerate(lines.items()):
        fig.add_trace(go.Scatter(x=[1, longest - 1], y=[value, value], mode="lines", name=f"{label} = {value:.2f}",
                                 line={"color": "#000000" if i == 0 else "#999999", "dash": "dot", "width": 1},
                                 hovertemplate=f"{label}: {value:.3f} nats<extra></extra>"))
    for x, text, dash in ((W, f"window {W}", "dash"), (T, f"training length {T}", "dot")):
        add_marked_vline(fig, x - 0.5, text, log_x=log_x, line={"color": "#666666", "dash": dash, "width": 2},
                         font={"color": "#444444"})
    y_title = "cross-entropy (nats per token)" + (f", {smooth}-position average" if smooth > 1 else "")
    fig.update_layout(title=title or f"Loss per position: full cache, sliding window {W}, sinks",
                      template="plotly_white", height=480, autosize=True,
                      xaxis={"title": "position in the text" + (" (log scale)" if log_x else ""),
                             "type": "log" if log_x else "linear"},
                      yaxis={"title": y_title}, legend={"orientation": "h", "y": -0.22})
    parts = [f"{name}: {c[:T].mean():.2f} at positions 0-{min(T, len(c)) - 1}"
             + (f", {c[T:].mean():.2f} at positions {T}-{len(c) - 1}" if len(c) > T else "")
             for name, c in curves.items()]
    base = (" Horizontal lines: " + ", ".join(f"{k} {v:.2f}" for k, v in lines.items()) + ".") if lines else ""
    return describe(fig, f"Line chart of the loss at each position for {len(curves)} cache setting"
                         f"{'s' if len(curves) != 1 else ''}; dashed and dotted vertical lines mark the window {W} and "
                         f"the training length {T}. Mean loss: " + "; ".join(parts) + "." + base)


def ring_buffer_slots(window: int, n_sinks: int, n_steps: int) -> np.ndarray:
    """(n_steps, n_sinks + window) int64: the text position in each slot after each step (-1: empty).

    Row t is the state of a :class:`~selfattn.inference.streaming.SlidingWindowCache` after t + 1
    tokens, read off a real one (its ``slot_positions``), not recomputed.

    Raises:
        ValueError: bad sizes (as the cache; ``n_steps`` not a positive int).
    """
    n_steps = _require_count("n_steps", n_steps)
    cache = SlidingWindowCache(window, n_sinks)
    rows = []
    x = torch.zeros(1, 1, 1, 1)
    for _ in range(n_steps):
        cache.update(x, x)  # one token of width 1: only the bookkeeping matters
        rows.append(cache.slot_positions.numpy().copy())
    return np.stack(rows)


def ring_buffer_figure(window: int = 6, n_sinks: int = 2, n_steps: int = 15) -> go.Figure:
    """Which text position sits in which slot after each step, as a table-like heatmap.

    Rows: steps (token p just appended, top to bottom); columns: slots (sinks first). Each cell shows
    the text position it holds; sink slots are one colour, window slots another, the slot just
    written a third, empty slots blank. Reading a row left to right after the sinks and wrapping at
    the slot just written gives the window oldest first.

    Raises:
        ValueError: bad sizes (see :func:`ring_buffer_slots`).

    Source: Xiao et al. 2024, figure 1(d) (the sinks and the rolling window); Jiang et al. 2023,
    figure 2 (rolling buffer cache); chapter 11.
    """
    slots = ring_buffer_slots(window, n_sinks, n_steps)  # (n_steps, C)
    C = slots.shape[1]
    kind = np.where(slots < 0, np.nan, np.where(np.arange(C)[None] < n_sinks, 0.0, 1.0))  # 0 sink, 1 window
    for t in range(n_steps):
        kind[t, int(np.flatnonzero(slots[t] == t)[0])] = 2.0  # the slot written at step t
    text = [[("" if p < 0 else str(p)) for p in row] for row in slots]
    # Three stops of Viridis, in its order (readable in grayscale and by colour-blind readers)
    sink_c, window_c, new_c = (plotly.colors.sequential.Viridis[i] for i in (2, 6, 9))
    colours = [[0.0, sink_c], [0.33, sink_c], [0.34, window_c], [0.66, window_c], [0.67, new_c], [1.0, new_c]]
    hover = [[("empty" if p < 0 else f"slot {j}: text position {p}" + (" (sink)" if j < n_sinks else ""))
              for j, p in enumerate(row)] for row in slots]
    fig = go.Figure(go.Heatmap(z=kind, x=[f"{'sink' if j < n_sinks else 'slot'} {j}" for j in range(C)],
                               y=[f"after token {t}" for t in range(n_steps)], text=text, texttemplate="%{text}",
                               customdata=hover, hovertemplate="%{customdata}<extra></extra>", zmin=0, zmax=2,
                               colorscale=colours, showscale=False, xgap=2, ygap=2))
    fig.update_layout(title=f"Ring buffer of {C} slots: {n_sinks} sink{'s' if n_sinks != 1 else ''} (dark blue), window "
                            f"{window} (green), the slot just written (yellow)",
                      template="plotly_white", height=max(320, 28 * n_steps + 120), autosize=True,
                      yaxis={"autorange": "reversed"}, xaxis={"side": "top"})
    last = slots[-1]
    held = [int(p) for p in last if p >= 0]
    return describe(fig, f"Table of the {C} slots of a sliding-window cache with {n_sinks} sinks and window {window} "
                         f"after each of {n_steps} tokens; each cell gives the text position held. After the last "
                         f"token the slots hold positions {', '.join(str(p) for p in last)} (in slot order), i.e. "
                         f"{sorted(held)} sorted.")
