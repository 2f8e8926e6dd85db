"""Figure builders for chapter 02: softmax with a temperature, and scores with and without scaling.

Every builder returns a plotly Figure (never shows it). The static figures carry a slider, so a
reader of the book explores them with no kernel; the single-view builders are what the chapter's
ipywidgets explorer re-displays, so both show the same views.
"""

from __future__ import annotations

import math

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from .. import ref
from .._validate import require_flag
from ..experiments.scaling import random_scores
from . import describe

__all__ = ["temperature_view", "temperature_figure", "scaling_view", "scaling_figure", "scaling_data"]

_UNSCALED = "#D55E00"  # Okabe-Ito vermilion / blue: distinct for colour-blind readers and in grayscale
_SCALED = "#0072B2"
_STEP = {"mode": "immediate", "frame": {"duration": 0, "redraw": True}, "transition": {"duration": 0}}


def _slider(prefix: str, names: list[str], labels: list[str], active: int = 0) -> dict:
    return {
        "active": active,
        "currentvalue": {"prefix": prefix},
        "pad": {"t": 40},
        "steps": [{"label": label, "method": "animate", "args": [[name], _STEP]} for name, label in zip(names, labels, strict=True)],
    }


# --- softmax and temperature -------------------------------------------------------------------


def _temperature_traces(scores: np.ndarray, labels: list[str], temperature: float) -> list[go.Bar]:
    weights = ref.softmax(np.asarray(scores, dtype=float) / temperature)
    return [go.Bar(x=labels, y=weights, marker_color=_SCALED, name="weight",
                   text=[f"{w:.2f}" for w in weights], textposition="outside")]


def temperature_view(scores, temperature: float, labels: list[str] | None = None) -> go.Figure:
    """Bars of ``softmax(scores / temperature)`` for one row of scores (S,).

    Low temperature sharpens the weights towards the largest score, high temperature flattens them
    towards uniform. Source: chapter 02.

    Raises:
        ValueError: temperature not > 0.
    """
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0; got {temperature}")
    scores = np.asarray(scores, dtype=float)
    labels = labels or [f"key {j}" for j in range(scores.shape[-1])]
    fig = go.Figure(_temperature_traces(scores, labels, temperature))
    fig.update_layout(title=f"softmax(scores / {temperature:g})", yaxis={"range": [0, 1.15], "title": "weight"},
                      height=420, template="plotly_white", showlegend=False)
    return describe(fig, f"Bar chart of the softmax weights of the scores {np.round(scores, 2).tolist()} divided by "
                         f"the temperature {temperature:g}; the bars sum to one.")


def temperature_figure(scores, temperatures=(0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 10.0),
                       labels: list[str] | None = None) -> go.Figure:
    """:func:`temperature_view` with a slider over ``temperatures`` (works with no kernel)."""
    scores = np.asarray(scores, dtype=float)
    labels = labels or [f"key {j}" for j in range(scores.shape[-1])]
    names = [f"{t:g}" for t in temperatures]
    start = names.index("1") if "1" in names else 0
    fig = temperature_view(scores, temperatures[start], labels)
    fig.frames = [go.Frame(data=_temperature_traces(scores, labels, t), name=name,
                           layout={"title": {"text": f"softmax(scores / {t:g})"}})
                  for t, name in zip(temperatures, names, strict=True)]
    fig.update_layout(sliders=[_slider("temperature: ", names, names, start)])
    return describe(fig, "Softmax weights of one row of scores; a slider sets the temperature from "
                         f"{temperatures[0]:g} to {temperatures[-1]:g}. Low temperatures put almost all weight on "
                         "the largest score, high temperatures spread it almost evenly.")


# --- scaling by sqrt(d_head) --------------------------------------------------------------------


def scaling_data(d_head: int, n_queries: int = 500, n_keys: int = 16, seed: int = 0,
                 bins: np.ndarray | None = None) -> dict:
    """Histograms of unscaled and scaled scores, and the mean sorted softmax weights of a row.

    Returns a dict with ``bin_centres`` and ``hist_unscaled`` / ``hist_scaled`` (densities),
    ``sorted_unscaled`` / ``sorted_scaled`` (n_keys,) (row weights sorted in decreasing order,
    averaged over queries). Source: chapter 02.
    """
    scores = random_scores(d_head, n_queries, n_keys, seed).numpy()  # (N, S), Var = d_head
    scaled = scores / math.sqrt(d_head)
    bins = np.linspace(-100, 100, 401) if bins is None else bins  # +-3 std at d_head = 1024
    hist_u, _ = np.histogram(np.clip(scores, bins[0], bins[-1]), bins=bins, density=True)
    hist_s, _ = np.histogram(np.clip(scaled, bins[0], bins[-1]), bins=bins, density=True)
    sort_desc = lambda w: -np.sort(-w, axis=-1)  # noqa: E731
    return {
        "bin_centres": (bins[:-1] + bins[1:]) / 2,
        "hist_unscaled": hist_u,
        "hist_scaled": hist_s,
        "sorted_unscaled": sort_desc(ref.softmax(scores)).mean(axis=0),
        "sorted_scaled": sort_desc(ref.softmax(scaled)).mean(axis=0),
    }


def _scaling_traces(data: dict, show_unscaled: bool = True, show_scaled: bool = True) -> list[go.Scatter]:
    ranks = np.arange(1, len(data["sorted_scaled"]) + 1)
    traces = []
    for key, colour, name, show in (("unscaled", _UNSCALED, "q·k (unscaled)", show_unscaled),
                                    ("scaled", _SCALED, "q·k / √d_head", show_scaled)):
        visible = True if show else "legendonly"
        traces.append(go.Scatter(x=data["bin_centres"], y=np.round(data[f"hist_{key}"], 5), mode="lines",
                                 line={"color": colour, "shape": "hvh", "dash": "solid" if key == "scaled" else "dash"},
                                 name=name, legendgroup=key, visible=visible, xaxis="x", yaxis="y"))
        traces.append(go.Scatter(x=ranks, y=np.round(data[f"sorted_{key}"], 5), mode="lines+markers",
                                 line={"color": colour, "dash": "solid" if key == "scaled" else "dash"},
                                 name=name, legendgroup=key, showlegend=False, visible=visible,
                                 xaxis="x2", yaxis="y2"))
    return traces


def _scaling_layout(fig: go.Figure, d_head: int, n_keys: int) -> None:
    # The legend sits above the panels: below them, the slider of scaling_figure would cover it.
    fig.update_layout(title=_scaling_title(d_head), height=500, template="plotly_white",
                      margin={"t": 130}, title_y=0.97, title_yanchor="top", title_yref="container",
                      legend={"orientation": "h", "x": 0.0, "xanchor": "left", "y": 1.09, "yanchor": "bottom"})
    fig.update_xaxes(title_text="score", range=[-100, 100], row=1, col=1)
    fig.update_yaxes(title_text="density", range=[0, 0.45], row=1, col=1)
    fig.update_xaxes(title_text="rank of the weight in its row", range=[0.5, n_keys + 0.5], row=1, col=2)
    fig.update_yaxes(title_text="mean weight", range=[0, 1], row=1, col=2)


def _scaling_title(d_head: int) -> str:
    return f"d_head = {d_head}: unscaled scores have variance ≈ {d_head}, scaled ≈ 1"


def scaling_view(d_head: int, *, show_unscaled: bool = True, show_scaled: bool = True, n_queries: int = 500,
                 n_keys: int = 16, seed: int = 0) -> go.Figure:
    """Two panels for one ``d_head``: the score histogram, and the row's weights sorted by size.

    Unscaled scores spread out as d_head grows and their softmax puts nearly all weight on the top
    key; scaled scores keep variance 1 and the weights stay spread. Source: chapter 02 (claim 5).
    """
    show_unscaled = require_flag("show_unscaled", show_unscaled)
    show_scaled = require_flag("show_scaled", show_scaled)
    fig = make_subplots(rows=1, cols=2, subplot_titles=("scores of random q, k", f"softmax over {n_keys} keys, sorted"))
    fig.add_traces(_scaling_traces(scaling_data(d_head, n_queries, n_keys, seed), show_unscaled, show_scaled))
    _scaling_layout(fig, d_head, n_keys)
    return describe(fig, f"For d_head = {d_head}: left, histograms of q·k and of q·k/sqrt(d_head) for random "
                         "unit-variance q and k; right, the softmax weights of a row sorted from largest to "
                         "smallest, averaged over rows, for both.")


def scaling_figure(d_heads=(4, 16, 64, 256, 1024), n_queries: int = 500, n_keys: int = 16, seed: int = 0) -> go.Figure:
    """:func:`scaling_view` with a slider over ``d_heads`` (works with no kernel)."""
    d_heads = list(d_heads)
    datas = [scaling_data(d, n_queries, n_keys, seed) for d in d_heads]
    fig = make_subplots(rows=1, cols=2, subplot_titles=("scores of random q, k", f"softmax over {n_keys} keys, sorted"))
    fig.add_traces(_scaling_traces(datas[0]))
    _scaling_layout(fig, d_heads[0], n_keys)
    names = [str(d) for d in d_heads]
    fig.frames = [go.Frame(data=_scaling_traces(data), name=name, layout={"title": {"text": _scaling_title(d)}})
                  for d, data, name in zip(d_heads, datas, names, strict=True)]
    fig.update_layout(sliders=[_slider("d_head: ", names, names)])
    return describe(fig, f"A slider over d_head from {d_heads[0]} to {d_heads[-1]}. Left: the unscaled scores q·k "
                         "spread out (variance d_head) while q·k/sqrt(d_head) keeps variance 1. Right: the unscaled "
                         "softmax puts almost all weight on one key as d_head grows; the scaled one stays spread.")
