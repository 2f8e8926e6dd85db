"""Figures for chapter 14 (loss curves of the small GPT, attention learning to address).

:func:`loss_curve_figure` plots the training loss of every step (with a moving average), the
validation loss where it was measured, and horizontal baselines. :func:`retrieval_frames_figure`
shows the query's attention over the dictionary at every recorded training step, one frame per
step with a slider and a play button (explorable with no kernel); :func:`retrieval_step_figure`
is one of those frames, used by the live explorer :func:`retrieval_explorer_widget`.
Source: chapter 14; chapter 08.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go

from . import describe, live_output

__all__ = [
    "loss_curve_figure",
    "retrieval_step_figure",
    "retrieval_frames_figure",
    "retrieval_explorer_widget",
]

_MATCH, _OTHER = "#d55e00", "#0072b2"  # Okabe-Ito vermillion and blue: distinct in grayscale too


def moving_average(values: np.ndarray, window: int) -> np.ndarray:
    """Trailing moving average over ``window`` values (shorter windows at the start), same length."""
    window = max(1, min(window, values.size))
    kernel = np.ones(window) / window
    head = np.cumsum(values[: window - 1]) / np.arange(1, window)  # shorter windows at the start
    return np.concatenate([head, np.convolve(values, kernel, mode="valid")])


def loss_curve_figure(
    train_loss: Sequence[float],
    val_steps: Sequence[int],
    val_loss: Sequence[float],
    baselines: dict[str, float] | None = None,
    *,
    title: str = "next-token loss",
    window: int = 25,
) -> go.Figure:
    """Training loss per step (faint), its moving average, validation loss (markers), baselines.

    Args:
        train_loss: one loss (nats per token) per step. val_steps, val_loss: equally long.
        baselines: ``{label: loss}`` drawn as dashed horizontal lines (e.g. uniform, unigram).
        window: moving-average window in steps.

    Raises:
        ValueError: empty ``train_loss``, ``val_steps``/``val_loss`` of different lengths, or
        non-finite values.

    Source: chapter 14.
    """
    train = np.asarray(train_loss, dtype=np.float64)
    steps_v, val = np.asarray(val_steps), np.asarray(val_loss, dtype=np.float64)
    if train.size == 0 or steps_v.shape != val.shape:
        raise ValueError(
            f"train_loss must be non-empty and val_steps/val_loss equally long; got {train.size}, "
            f"{steps_v.shape}, {val.shape}"
        )
    if not (np.isfinite(train).all() and np.isfinite(val).all()):
        raise ValueError("losses must be finite")
    steps = np.arange(1, train.size + 1)
    stride = max(1, train.size // 600)  # keep the figure small: at most ~600 raw points
    fig = go.Figure()
    fig.add_trace(
        go.Scatter(
            x=steps[::stride],
            y=np.round(train[::stride], 4),
            mode="lines",
            name="training (per step)",
            line={"color": "#999999", "width": 1},
        )
    )
    fig.add_trace(
        go.Scatter(
            x=steps[::stride],
            y=np.round(moving_average(train, window)[::stride], 4),
            mode="lines",
            name=f"training ({window}-step average)",
            line={"color": _OTHER, "width": 2},
        )
    )
    fig.add_trace(
        go.Scatter(
            x=steps_v,
            y=np.round(val, 4),
            mode="lines+markers",
            name="validation",
            line={"color": _MATCH, "width": 2},
            marker={"symbol": "diamond", "size": 8},
        )
    )
    for label, value in (baselines or {}).items():
        fig.add_hline(
            y=value,
            line_dash="dash",
            line_color="#444444",
            annotation_text=f"{label}: {value:.2f}",
            annotation_position="top right",
        )
    fig.update_layout(title=title, template="plotly_white", height=420,
                      xaxis={"title": "step"}, yaxis={"title": "loss (nats per token)"},
                      legend={"orientation": "h", "y": -0.2})  # fmt: skip
    base = ", ".join(f"{k} {v:.2f}" for k, v in (baselines or {}).items())
    return describe(
        fig,
        f"{title}: training loss over {train.size} steps falls from {train[0]:.2f} to "
        f"{moving_average(train, window)[-1]:.2f} (moving average); validation loss measured at "
        f"{val.size} points ends at {val[-1]:.2f}" + (f"; baselines: {base}." if base else "."),
    )


def _pair_labels(keys: Sequence[int], values: Sequence[int]) -> list[str]:
    return [f"{i}: k{k}→v{v}" for i, (k, v) in enumerate(zip(keys, values, strict=True))]


def retrieval_step_figure(
    row: Sequence[float], keys: Sequence[int], values: Sequence[int], query: int, where: int,
    *, step: int = 0,
) -> go.Figure:  # fmt: skip
    """One frame: the query's attention weight on each (key, value) pair, the matching pair highlighted.

    Args:
        row: the weights on the P pairs (the query position's own column, always 0, may be
            included as a last entry and is dropped). keys, values: the P pairs. query: the query
            key. where: index of the matching pair. step: training step, for the title.

    Source: chapter 14.
    """
    P = len(keys)
    w = np.asarray(row, dtype=np.float64)[:P]
    colours = [_MATCH if i == where else _OTHER for i in range(P)]
    fig = go.Figure(go.Bar(x=_pair_labels(keys, values), y=np.round(w, 4), marker_color=colours,
                           hovertemplate="%{x}<br>weight %{y:.3f}<extra></extra>"))  # fmt: skip
    fig.update_layout(
        title=f"query k{query}: attention over the dictionary at step {step}",
        template="plotly_white", height=380, yaxis={"title": "attention weight", "range": [0, 1]},
        xaxis={"title": "pair (position: key→value); the matching pair is orange"},
    )  # fmt: skip
    return describe(
        fig,
        f"Bar chart of the query key k{query}'s attention weights over {P} (key, value) pairs at "
        f"training step {step}; the matching pair (position {where}) has weight {w[where]:.2f}.",
    )


def retrieval_frames_figure(
    snapshot_steps: Sequence[int],
    snapshots: Sequence[Sequence[float]],
    keys: Sequence[int],
    values: Sequence[int],
    query: int,
    where: int,
    accuracy: Sequence[float] | None = None,
) -> go.Figure:
    """The query's attention at every recorded step: one frame per step, a slider and a play button.

    Args:
        snapshot_steps: the steps recorded (0 = before training). snapshots: the query's attention
            row at each. keys, values, query, where: the fixed example. accuracy: the training
            accuracy of every step (optional; shown in the frame titles).

    Raises:
        ValueError: ``snapshot_steps`` and ``snapshots`` of different lengths, or empty.

    Source: chapter 14 (claim 20).
    """
    if len(snapshot_steps) != len(snapshots) or not snapshots:
        raise ValueError(
            f"snapshot_steps and snapshots must be equally long and non-empty; got "
            f"{len(snapshot_steps)} and {len(snapshots)}"
        )
    P = len(keys)
    labels = _pair_labels(keys, values)
    colours = [_MATCH if i == where else _OTHER for i in range(P)]

    def title(step: int) -> str:
        acc = ""
        if accuracy is not None and step > 0:
            acc = f" (batch accuracy {np.mean(accuracy[max(0, step - 10) : step]):.2f})"
        return f"query k{query}: attention over the dictionary at step {step}{acc}"

    def bar(row) -> go.Bar:
        return go.Bar(
            x=labels,
            y=np.round(np.asarray(row, dtype=np.float64)[:P], 4),
            marker_color=colours,
            hovertemplate="%{x}<br>weight %{y:.3f}<extra></extra>",
        )

    names = [str(s) for s in snapshot_steps]
    frames = [
        go.Frame(data=[bar(row)], name=n, layout={"title": {"text": title(s)}})
        for n, s, row in zip(names, snapshot_steps, snapshots, strict=True)
    ]
    fig = go.Figure(bar(snapshots[0]), frames=frames)
    jump = {
        "mode": "immediate",
        "frame": {"duration": 0, "redraw": True},
        "transition": {"duration": 0},
    }
    fig.update_layout(
        title=title(snapshot_steps[0]), template="plotly_white", height=470, margin={"b": 150},
        yaxis={"title": "attention weight", "range": [0, 1]},
        xaxis={"title": "pair (position: key→value); the matching pair is orange"},
        sliders=[{"active": 0, "y": -0.25, "len": 1.0, "currentvalue": {"prefix": "training step: "},
                  "steps": [{"label": n, "method": "animate", "args": [[n], jump]} for n in names]}],
        updatemenus=[{"type": "buttons", "x": 0.0, "y": 1.15, "xanchor": "left", "direction": "right",
                      "buttons": [{"label": "play", "method": "animate",
                                   "args": [None, {"frame": {"duration": 150, "redraw": True},
                                                   "fromcurrent": True, "transition": {"duration": 0}}]}]}],
    )  # fmt: skip
    first, last = snapshots[0][where], snapshots[-1][where]
    return describe(
        fig,
        f"Animated bar chart over {len(names)} training steps (slider and play button): the query "
        f"k{query}'s attention over {P} pairs. The weight on the matching pair (position {where}) "
        f"goes from {first:.2f} at step {snapshot_steps[0]} to {last:.2f} at step {snapshot_steps[-1]}.",
    )


def retrieval_explorer_widget(snapshot_steps, snapshots, keys, values, query, where):
    """Live explorer (needs a kernel): a slider over the recorded steps shows
    :func:`retrieval_step_figure`; the same views as :func:`retrieval_frames_figure`.

    Returns:
        An ``ipywidgets.VBox``. Source: chapter 14.
    """
    import ipywidgets as widgets

    slider = widgets.SelectionSlider(options=list(snapshot_steps), value=snapshot_steps[-1],
                                     description="step")  # fmt: skip
    index = {s: i for i, s in enumerate(snapshot_steps)}

    def show(step):
        retrieval_step_figure(snapshots[index[step]], keys, values, query, where, step=step).show()

    return widgets.VBox([slider, live_output(show, {"step": slider})])
