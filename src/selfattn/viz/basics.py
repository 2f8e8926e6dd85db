"""Figure builders for chapter 00: the dot product of two 2-D vectors as one of them turns."""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go

from . import describe

__all__ = ["dot_product_figure", "rotating_dot_product_figure"]


def _arrow_traces(a: np.ndarray, b: np.ndarray) -> list[go.Scatter]:
    return [
        go.Scatter(x=[0, a[0]], y=[0, a[1]], mode="lines+markers+text", name="a (fixed)",
                   text=["", "a"], textposition="top center", line={"width": 4, "color": "#0072B2"}),
        go.Scatter(x=[0, b[0]], y=[0, b[1]], mode="lines+markers+text", name="b (turning)",
                   text=["", "b"], textposition="top center", line={"width": 4, "color": "#E69F00", "dash": "dash"}),
    ]


def _title(a: np.ndarray, b: np.ndarray, degrees: float) -> str:
    return f"angle {degrees:.0f}°:  a · b = {float(a @ b):+.2f}"


def dot_product_figure(degrees: float, a=(1.0, 0.0), length: float = 1.0) -> go.Figure:
    """One frame: vector ``a`` and a vector of length ``length`` at ``degrees`` from the x axis.

    Returns a plotly Figure (not shown). Source: chapter 00.
    """
    a = np.asarray(a, dtype=float)
    rad = np.deg2rad(degrees)
    b = length * np.array([np.cos(rad), np.sin(rad)])
    fig = go.Figure(_arrow_traces(a, b))
    fig.update_layout(title=_title(a, b, degrees), xaxis={"range": [-1.3, 1.3], "scaleanchor": "y"},
                      yaxis={"range": [-1.3, 1.3]}, height=420, template="plotly_white")
    return describe(fig, f"Two arrows from the origin: a = {a.tolist()} and b at {degrees:.0f} degrees; "
                         f"their dot product is {float(a @ b):.2f}.")


def rotating_dot_product_figure(step_degrees: int = 15, a=(1.0, 0.0)) -> go.Figure:
    """The same picture with a slider that turns ``b`` from 0 to 360 degrees (works with no kernel).

    The dot product is largest when the vectors point the same way, zero at 90 degrees and most
    negative when they point in opposite directions. Source: chapter 00.
    """
    a = np.asarray(a, dtype=float)
    angles = list(range(0, 361, step_degrees))
    frames = []
    for deg in angles:
        rad = np.deg2rad(deg)
        b = np.array([np.cos(rad), np.sin(rad)])
        frames.append(go.Frame(data=_arrow_traces(a, b), name=str(deg),
                               layout={"title": {"text": _title(a, b, deg)}}))
    fig = dot_product_figure(angles[0], a)
    fig.frames = frames
    fig.update_layout(
        sliders=[{
            "active": 0,
            "currentvalue": {"prefix": "angle of b: ", "suffix": "°"},
            "steps": [{"label": str(deg), "method": "animate",
                       "args": [[str(deg)], {"mode": "immediate", "frame": {"duration": 0, "redraw": True},
                                             "transition": {"duration": 0}}]} for deg in angles],
        }],
        updatemenus=[{
            "type": "buttons", "showactive": False, "x": 0.0, "y": 1.15, "xanchor": "left",
            "buttons": [{"label": "▶ play", "method": "animate",
                         "args": [None, {"frame": {"duration": 300, "redraw": True}, "fromcurrent": True}]}],
        }],
    )
    return describe(fig, "Two unit arrows a and b; a slider turns b through 360 degrees and the title shows "
                         "a · b = cos(angle): +1 when aligned, 0 at 90 degrees, -1 when opposite.")
