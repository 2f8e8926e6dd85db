"""Figures for chapter 07's modern block: the residual stream's size by depth with and without a
final RMSNorm, and the largest attention score during training with and without QK-norm.

Builders return ``plotly.graph_objects.Figure`` (never shown), each with a text description.

Source: chapter 07.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import plotly.graph_objects as go

from . import describe

__all__ = ["stream_rms_figure", "logit_growth_figure"]

# Okabe-Ito colours: distinct for colour-blind readers; dashes tell the lines apart in grayscale.
_COLOURS = ["#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9"]


def _curve(name: str, values) -> np.ndarray:
    v = np.asarray(values, dtype=np.float64)
    if v.ndim != 1 or v.size == 0:
        raise ValueError(f"{name} must be a non-empty 1-D sequence; got shape {v.shape}")
    if not np.all(np.isfinite(v)):
        raise ValueError(f"{name} must hold finite numbers only")
    return v


def stream_rms_figure(rms_without, rms_with) -> go.Figure:
    """RMS of the residual stream after 0..L blocks: the raw stream, and after a final RMSNorm.

    Args:
        rms_without: (L + 1,) RMS of the stream entering the stack and after each block.
        rms_with: (L + 1,) the same after a final RMSNorm (gain 1).

    Raises:
        ValueError: not 1-D, of different lengths, empty or not finite.
    """
    without, with_ = _curve("rms_without", rms_without), _curve("rms_with", rms_with)
    if without.shape != with_.shape:
        raise ValueError(f"rms_without and rms_with must have the same length; got {without.size} and {with_.size}")
    depth = np.arange(without.size)
    fig = go.Figure([
        go.Scatter(x=depth, y=np.round(without, 4), mode="lines+markers", name="stream, no final norm",
                   line={"color": _COLOURS[0]}),
        go.Scatter(x=depth, y=np.round(with_, 4), mode="lines+markers", name="after a final RMSNorm",
                   line={"color": _COLOURS[1], "dash": "dash"}),
    ])  # fmt: skip
    fig.update_layout(title="Residual stream of a random pre-norm stack of modern blocks", height=400,
                      template="plotly_white", legend={"orientation": "h", "y": -0.25})  # fmt: skip
    fig.update_xaxes(title_text="blocks applied")
    fig.update_yaxes(title_text="root-mean-square of the stream", rangemode="tozero")
    return describe(fig, (
        f"Line plot of the residual stream's root-mean-square against the number of blocks applied (0 to "
        f"{without.size - 1}). Without a final norm it goes from {without[0]:.2f} to {without[-1]:.2f}; after "
        f"a final RMSNorm it stays between {with_.min():.3f} and {with_.max():.3f}."
    ))


def logit_growth_figure(curves: Mapping[str, np.ndarray], bounds: Mapping[str, np.ndarray] | None = None) -> go.Figure:
    """The largest |attention score| (logit of the softmax) after each training step, one line per run, log scale.

    Args:
        curves: run name -> (steps + 1,) largest |score| at initialisation and after every step.
        bounds: optional run name -> (steps + 1,) the QK-norm bound of that run, drawn dotted.

    Raises:
        ValueError: no curves, a curve not 1-D / empty / not finite / not positive, a bound for an
        unknown run or of another length.
    """
    if not curves:
        raise ValueError("curves must hold at least one run")
    bounds = dict(bounds or {})
    unknown = set(bounds) - set(curves)
    if unknown:
        raise ValueError(f"bounds names runs not in curves: {sorted(unknown)}")
    traces, summary = [], []
    for i, (name, values) in enumerate(curves.items()):
        v = _curve(f"curves[{name!r}]", values)
        if np.any(v <= 0):
            raise ValueError(f"curves[{name!r}] must be > 0 (log scale)")
        colour = _COLOURS[i % len(_COLOURS)]
        traces.append(go.Scatter(x=np.arange(v.size), y=np.round(v, 3), mode="lines", name=name,
                                 line={"color": colour}))  # fmt: skip
        summary.append(f"{name}: from {v[0]:.1f} to {v[-1]:.1f}")
        if name in bounds:
            b = _curve(f"bounds[{name!r}]", bounds[name])
            if b.shape != v.shape:
                raise ValueError(f"bounds[{name!r}] must have the length of its curve, {v.size}; got {b.size}")
            traces.append(go.Scatter(x=np.arange(b.size), y=np.round(b, 3), mode="lines", name=f"{name}: bound",
                                     line={"color": colour, "dash": "dot"}))  # fmt: skip
            summary.append(f"its bound ends at {b[-1]:.1f}")
    fig = go.Figure(traces)
    fig.update_layout(title="Largest attention score during training", height=420, template="plotly_white",
                      legend={"orientation": "h", "y": -0.25})  # fmt: skip
    fig.update_xaxes(title_text="training step")
    fig.update_yaxes(type="log", title_text="max |score| (log scale)")
    return describe(fig, "Line plot, log scale, of the largest absolute attention score after each training step; "
                         + "; ".join(summary) + ".")
