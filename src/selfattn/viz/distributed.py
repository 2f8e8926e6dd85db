"""Figure builders for chapter 12: the ring schedule, step by step, and the causal work per rank.

Builders return static plotly Figures with a text description attached (never shown), readable with
no kernel: the schedule carries a slider over the ring's steps.

- :func:`ring_schedule`: for each step, which key/value block each rank holds and whether it computes
  it (all pairs visible, some) or skips it, with the visible pairs of each (query shard, key block).
- :func:`ring_schedule_figure`: that schedule as two grids (contiguous and zigzag layouts) of query
  shards by key blocks, a slider over the steps.
- :func:`causal_work_figure`: visible query-key pairs per rank under both layouts, with the mean.

Source: chapter 12; Liu et al. 2023 (ring attention).
"""

from __future__ import annotations

import numpy as np
import plotly.colors
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ..distributed.layout import LAYOUTS, causal_work, shard_positions
from . import describe

__all__ = ["ring_schedule", "ring_schedule_figure", "causal_work_figure"]

# Five stops of Viridis, in its order (readable in grayscale and by colour-blind readers): computing
# now (all pairs / some pairs), skipped now, computed earlier, skipped earlier
STATES = ("computing: every pair visible", "computing: some pairs visible", "skipped: no pair visible",
          "computed at an earlier step", "skipped at an earlier step")
_STATE_COLOURS = tuple(plotly.colors.sequential.Viridis[i] for i in (0, 2, 5, 7, 9))
_STEP = {"mode": "immediate", "frame": {"duration": 0, "redraw": True}, "transition": {"duration": 0}}


def ring_schedule(T: int, P: int, layout: str, causal: bool = True):
    """The ring's schedule: ``(holds, pairs, state)``.

    ``holds[t][r]``: the block (by the rank it started on) that rank r holds at step t, ``(r - t) mod P``;
    ``pairs[r][s]``: visible (query, key) pairs of rank r's queries against block s (per batch row and head);
    ``state[t]``: (P, P) float array, rank by block, an index into :data:`STATES` (NaN: not reached yet).

    Raises:
        ValueError: as :func:`~selfattn.distributed.layout.shard_positions`.
    """
    pos = [shard_positions(T, P, layout, r) for r in range(P)]
    n = T // P
    pairs = [[int((pos[r][:, None] >= pos[s][None, :]).sum()) if causal else n * n for s in range(P)] for r in range(P)]
    holds = [[(r - t) % P for r in range(P)] for t in range(P)]
    states = []
    for t in range(P):
        z = np.full((P, P), np.nan)
        for step in range(t + 1):
            for r in range(P):
                s = holds[step][r]
                visible = pairs[r][s]
                if step == t:
                    z[r, s] = 0 if visible == n * n else (1 if visible else 2)
                else:
                    z[r, s] = 3 if visible else 4
        states.append(z)
    return holds, pairs, states


def _colourscale():
    k = len(STATES)
    scale = []
    for i, c in enumerate(_STATE_COLOURS):
        scale += [[i / k, c], [(i + 1) / k, c]]
    return scale


def _grid(T, P, layout, causal, t):
    holds, pairs, states = ring_schedule(T, P, layout, causal)
    z = states[t]
    text = [[("" if np.isnan(z[r, s]) else f"{pairs[r][s]}") for s in range(P)] for r in range(P)]
    hover = [[(f"rank {r}'s queries, K/V block from rank {s}: not reached yet" if np.isnan(z[r, s]) else
               f"rank {r}'s queries, K/V block from rank {s}: {STATES[int(z[r, s])]}, {pairs[r][s]} visible pairs")
              for s in range(P)] for r in range(P)]
    cells = [[None if np.isnan(x) else float(x) for x in row] for row in z]  # None, not NaN: JSON has no NaN
    return go.Heatmap(z=cells, x=[f"block {s}" for s in range(P)],
                      y=[f"rank {r}: {_positions_label(T, P, layout, r)}" for r in range(P)], text=text,
                      texttemplate="%{text}", customdata=hover, hovertemplate="%{customdata}<extra></extra>",
                      zmin=0, zmax=len(STATES), colorscale=_colourscale(), showscale=False, xgap=3, ygap=3)


def _positions_label(T, P, layout, r):
    pos = shard_positions(T, P, layout, r).tolist()
    runs, start = [], pos[0]
    for a, b in zip(pos, pos[1:] + [None], strict=True):
        if b != a + 1:
            runs.append(f"{start}-{a}")
            start = b
    return "positions " + ", ".join(runs)


def ring_schedule_figure(T: int = 16, P: int = 4, causal: bool = True) -> go.Figure:
    """Ring attention's schedule under both layouts: rows are ranks (their query shards), columns the
    key/value blocks (named by the rank they start on); a slider walks the P steps. At step t rank r
    holds block (r - t) mod P: that cell is coloured by whether the rank computes it (every pair, or
    some pairs, visible) or skips it; earlier steps stay coloured; each cell shows its visible pairs.

    Raises:
        ValueError: T not divisible by 2P, bad P.

    Source: Liu et al. 2023 (the ring); chapter 12.
    """
    # One panel above the other, so that each panel's row labels have the full width (a phone's too).
    fig = make_subplots(rows=2, cols=1, subplot_titles=[f"{lay} layout" for lay in LAYOUTS], vertical_spacing=0.16)
    for i, lay in enumerate(LAYOUTS):
        fig.add_trace(_grid(T, P, lay, causal, 0), row=i + 1, col=1)
    # The key to the colours as text (a legend's coloured markers would not be drawn from one colour
    # scale), a line per state, darkest first; each cell's hover text names its state too.
    names = ("darkest", "dark blue", "teal", "green", "yellow")
    fig.add_annotation(text="<br>".join(f"{n}: {st}" for n, st in zip(names, STATES, strict=True)), showarrow=False,
                       xref="paper", yref="paper", x=0, y=1.04, xanchor="left", yanchor="bottom", align="left")
    fig.frames = [go.Frame(data=[_grid(T, P, lay, causal, t) for lay in LAYOUTS], name=str(t), traces=[0, 1])
                  for t in range(P)]
    # The key above the panels, the slider below them: neither covers the other at any width.
    fig.update_layout(
        title={"text": f"The ring, step by step (T = {T}, P = {P}" + (", causal)" if causal else ")"), "y": 0.98},
        template="plotly_white", height=760, autosize=True, margin={"t": 170, "l": 150, "b": 110},
        yaxis={"autorange": "reversed"}, yaxis2={"autorange": "reversed"},
        sliders=[{"active": 0, "currentvalue": {"prefix": "step: "}, "y": 0, "yanchor": "top", "pad": {"t": 40},
                  "steps": [{"label": str(t), "method": "animate", "args": [[str(t)], _STEP]} for t in range(P)]}])
    parts = []
    for lay in LAYOUTS:
        holds, pairs, states = ring_schedule(T, P, lay, causal)
        skipped = int(np.isin(states[-1], (2, 4)).sum())  # skipped now or earlier
        per_rank = [sum(row) for row in pairs]
        parts.append(f"{lay}: {skipped} of {P * P} (rank, block) pairs skipped, visible pairs per rank {per_rank}")
    steps = "; ".join(f"step {t}: rank r holds block {', '.join(str(s) for s in ring_schedule(T, P, 'zigzag')[0][t])} "
                      "for r = 0.." + str(P - 1) for t in range(P))
    return describe(fig, f"Two grids of {P} ranks by {P} key/value blocks, one per layout, with a slider over the "
                         f"{P} steps of the ring; {steps}. After the last step: " + "; ".join(parts) + ".")


def causal_work_figure(T: int, P: int) -> go.Figure:
    """Visible causal query-key pairs per rank, contiguous against zigzag, with the mean (a dotted line).

    Raises:
        ValueError: T not divisible by 2P, bad P. Source: chapter 12."""
    fig = go.Figure()
    works = {lay: causal_work(T, P, lay) for lay in LAYOUTS}
    for (lay, work), colour in zip(works.items(), ("#D55E00", "#0072B2"), strict=True):
        fig.add_trace(go.Bar(x=[f"rank {r}" for r in range(P)], y=work.pairs, name=f"{lay} (max/mean {work.imbalance:.3f})",
                             marker={"color": colour}, hovertemplate=f"{lay}, %{{x}}: %{{y}} pairs<extra></extra>"))
    mean = T * (T + 1) / 2 / P
    fig.add_hline(y=mean, line={"color": "#000000", "dash": "dot", "width": 1},
                  annotation={"text": f"mean {mean:.0f}"}, annotation_position="top left")
    fig.update_layout(title=f"Causal work per rank: T = {T}, P = {P}", barmode="group", template="plotly_white",
                      height=420, autosize=True, yaxis={"title": "visible query-key pairs"},
                      legend={"orientation": "h", "y": -0.2})
    return describe(fig, f"Bar chart of the visible query-key pairs of each of {P} ranks for T = {T}: contiguous "
                         f"{works['contiguous'].pairs} (max/mean {works['contiguous'].imbalance:.3f}), zigzag "
                         f"{works['zigzag'].pairs} (max/mean {works['zigzag'].imbalance:.3f}); mean {mean:.0f}.")
