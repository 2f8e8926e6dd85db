"""Figure builders for chapter 11c: the weight a trained model parks on its first token, and a
quantized cache's error against its bytes per token.

Every builder returns a static plotly Figure with a text description attached (never shows it).

Source: chapter 11c.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import plotly.graph_objects as go

from . import describe

__all__ = ["sink_weight_figure", "quantization_figure"]


def sink_weight_figure(weights: Mapping[str, np.ndarray], uniform: float) -> go.Figure:
    """Bars: the mean weight on position 0 of every (layer, head), one bar group per run; an even spread dashed.

    Args:
        weights: ``{run label: (n_layers, H) array}``. uniform: an even spread's weight on position 0.

    Raises:
        ValueError: no run, or an array that is not 2-D and finite.
    """
    if not weights:
        raise ValueError("weights must hold at least one run")
    fig = go.Figure()
    for label, w in weights.items():
        w = np.asarray(w, dtype=float)
        if w.ndim != 2 or not np.isfinite(w).all():
            raise ValueError(f"weights[{label!r}] must be a finite (n_layers, H) array; got shape {w.shape}")
        names = [f"L{layer} H{head}" for layer in range(w.shape[0]) for head in range(w.shape[1])]
        fig.add_bar(x=names, y=w.ravel(), name=str(label))
    fig.add_hline(y=uniform, line_dash="dash", annotation_text="even spread", annotation_position="top left")
    fig.update_layout(title="Weight on the first token (BOS), per layer and head", barmode="group",
                      xaxis_title="layer and head", yaxis_title="mean weight on position 0", height=380)
    return describe(fig, f"Bars of the mean attention weight each head gives position 0, for {len(weights)} "
                    f"trained models; a dashed line marks an even spread's weight, {uniform:.3f}.")


def quantization_figure(bytes_per_token: Mapping[str, float], errors: Mapping[str, Sequence[float]],
                        *, y_title: str, title: str) -> go.Figure:
    """Markers: each scheme's error (y, log) against its bytes per token (x), one marker per measurement.

    Args:
        bytes_per_token: ``{scheme: bytes}``. errors: ``{scheme: errors}`` (e.g. one per layer).
        y_title, title: the axis title and the figure title.

    Raises:
        ValueError: a scheme of ``errors`` without bytes, or a non-finite or non-positive error.
    """
    fig = go.Figure()
    for label, errs in errors.items():
        if label not in bytes_per_token:
            raise ValueError(f"errors names {label!r}, which bytes_per_token lacks")
        errs = np.asarray(errs, dtype=float)
        if not (np.isfinite(errs).all() and (errs > 0).all()):
            raise ValueError(f"errors[{label!r}] must be finite and > 0; got {errs}")
        fig.add_scatter(x=[bytes_per_token[label]] * errs.size, y=errs, mode="markers", name=label,
                        marker=dict(size=9))
    fig.update_layout(title=title, xaxis_title="bytes per token per head (keys and values)", yaxis_title=y_title,
                      yaxis_type="log", height=400)
    return describe(fig, f"{title}: the error of each cache scheme against its bytes per token; schemes: "
                    f"{', '.join(errors)}.")
