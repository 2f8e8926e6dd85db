"""Figures for chapter 01: one word's vectors across sentences and layers, and its nearest tokens.

The helpers that prepare the figures' numbers (:func:`word_positions`, :func:`word_vectors_by_layer`,
:func:`cosine_matrix`, :func:`nearest_tokens`) live here too, so that the chapter, its explorer and
its tests compute them in one way. Builders return plotly figures; they never show them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import plotly.colors as pcolors
import plotly.graph_objects as go
import torch

from .._validate import require_rank, require_tensor, shape_of
from . import COLORSCALE, describe

__all__ = [
    "word_positions",
    "word_vectors_by_layer",
    "cosine_matrix",
    "nearest_tokens",
    "layer_cosine_matrix_figure",
    "cosine_by_layer_figure",
    "nearest_tokens_figure",
]

_OKABE_ITO = [
    "#0072B2",
    "#E69F00",
    "#009E73",
    "#CC79A7",
    "#56B4E9",
    "#D55E00",
    "#F0E442",
    "#000000",
]
_DASHES = ["solid", "dash", "dot", "dashdot", "longdash", "longdashdot"]


def word_positions(input_ids: torch.Tensor, token_id: int) -> list[int]:
    """The position of the first occurrence of ``token_id`` in each row of ``input_ids``.

    Args:
        input_ids: (B, T) integer token ids (``TokenBatch.input_ids``).
        token_id: the vocabulary id of the word (``MiniLM.token_id("bank")``).

    Returns:
        B positions (0 is [CLS]).

    Raises:
        TypeError / ValueError: ``input_ids`` is not a (B, T) tensor; ValueError: a row lacks the id
        (for example because the word was split into several WordPiece tokens).
    """
    require_tensor("input_ids", input_ids)
    require_rank("input_ids", input_ids, 2, "(B, T)")
    positions = []
    for b, row in enumerate(input_ids):
        hits = (row == token_id).nonzero()
        if len(hits) == 0:
            raise ValueError(
                f"input_ids row {b} does not contain token_id {token_id}; "
                f"is the word split into sub-word tokens there?"
            )
        positions.append(int(hits[0, 0]))
    return positions


def word_vectors_by_layer(
    hidden_states: Sequence[torch.Tensor], positions: Sequence[int]
) -> torch.Tensor:
    """Pick one position per sentence out of every layer's hidden states.

    Args:
        hidden_states: L + 1 tensors (B, T, D) (``MiniLMRun.hidden_states``: embeddings, then layers).
        positions: B positions, one per sentence (:func:`word_positions`).

    Returns:
        (L + 1, B, D) tensor, same dtype as the hidden states.

    Raises:
        ValueError: a hidden state is not (B, T, D) with B = len(positions).
    """
    rows = torch.arange(len(positions))
    cols = torch.as_tensor(list(positions), dtype=torch.int64)
    picked = []
    for layer, h in enumerate(hidden_states):
        require_tensor(f"hidden_states[{layer}]", h)
        require_rank(f"hidden_states[{layer}]", h, 3, "(B, T, D)")
        if h.shape[0] != len(positions):
            raise ValueError(
                f"hidden_states[{layer}] has B = {h.shape[0]} sentences; "
                f"positions has {len(positions)} entries"
            )
        picked.append(h[rows, cols])  # (B, T, D) -> (B, D): one row per sentence
    return torch.stack(picked)  # L + 1 of (B, D) -> (L + 1, B, D)


def cosine_matrix(vectors) -> np.ndarray:
    """Cosine similarity of every pair of rows: (..., N, D) -> (..., N, N), float64.

    cos(a, b) = a . b / (|a| |b|), between -1 and 1; 1 means "same direction".

    Raises:
        ValueError: fewer than 2 dimensions, or a zero-length row (its cosine is undefined).
    """
    x = (
        vectors.detach().cpu().double().numpy()
        if isinstance(vectors, torch.Tensor)
        else np.asarray(vectors, float)
    )
    if x.ndim < 2:
        raise ValueError(f"vectors must have shape (..., N, D); got {x.shape}")
    norms = np.linalg.norm(x, axis=-1, keepdims=True)  # (..., N, 1)
    if np.any(norms == 0):
        raise ValueError("vectors has a row of length 0; its cosine similarity is undefined")
    unit = x / norms  # (..., N, D)
    return unit @ np.swapaxes(unit, -1, -2)  # (..., N, D) @ (..., D, N) -> (..., N, N)


def nearest_tokens(
    table: torch.Tensor, vector: torch.Tensor, k: int = 8, exclude: Sequence[int] = ()
) -> tuple[list[int], list[float]]:
    """The ``k`` rows of an embedding table with the highest cosine similarity to ``vector``.

    Args:
        table: (V, D) embedding table. vector: (D,). k: how many. exclude: ids to leave out
            (e.g. the word's own id).

    Returns:
        (ids, cosines), best first.

    Raises:
        ValueError: shapes do not fit, or k is not in [1, V].
    """
    require_tensor("table", table)
    require_rank("table", table, 2, "(V, D)")
    require_tensor("vector", vector)
    if vector.shape != table.shape[1:]:
        raise ValueError(
            f"vector must have shape ({table.shape[1]},) to match table {shape_of(table)}; "
            f"got {shape_of(vector)}"
        )
    if not 1 <= k <= table.shape[0] - len(exclude):
        raise ValueError(f"k must be in [1, {table.shape[0] - len(exclude)}]; got {k}")
    unit_table = torch.nn.functional.normalize(table.double(), dim=-1)  # (V, D), rows of length 1
    cosines = unit_table @ torch.nn.functional.normalize(
        vector.double(), dim=0
    )  # (V, D) @ (D,) -> (V,)
    if exclude:
        cosines[list(exclude)] = -torch.inf
    top = torch.topk(cosines, k)
    return top.indices.tolist(), top.values.tolist()


def _heatmap(cos: np.ndarray, labels: list[str], zmin: float) -> go.Heatmap:
    return go.Heatmap(
        z=cos,
        x=labels,
        y=labels,
        zmin=zmin,
        zmax=1.0,
        colorscale=COLORSCALE,
        texttemplate="%{z:.2f}",
        colorbar={"title": "cosine"},
        hovertemplate="%{y}<br>%{x}<br>cosine %{z:.3f}<extra></extra>",
    )


def layer_cosine_matrix_figure(
    cos_by_layer, labels: Sequence[str], word: str = "bank"
) -> go.Figure:
    """Heatmaps of the cosine similarity between one word's vectors in N sentences, with a slider
    over the layers (0 = the input embeddings, then each block's output). Works with no kernel.

    Args:
        cos_by_layer: (L + 1, N, N) cosines (:func:`cosine_matrix` of :func:`word_vectors_by_layer`).
        labels: N short names of the sentences. word: the word, for the title.

    Raises:
        ValueError: shapes do not fit.

    Source: chapter 01 (claims 2 and 10).
    """
    cos = np.asarray(cos_by_layer, dtype=float)
    labels = list(labels)
    if cos.ndim != 3 or cos.shape[1:] != (len(labels), len(labels)):
        raise ValueError(
            f"cos_by_layer must have shape (L + 1, N, N) with N = len(labels) = {len(labels)}; "
            f"got {cos.shape}"
        )
    zmin = float(np.floor(cos.min() * 10) / 10)  # one colour scale for every layer, so they compare

    def title(layer: int) -> str:
        where = "input embeddings (+ position)" if layer == 0 else f"output of layer {layer}"
        return f"cosine similarity of '{word}' across sentences: {where}"

    fig = go.Figure([_heatmap(cos[0], labels, zmin)])
    fig.frames = [
        go.Frame(
            data=[_heatmap(cos[i], labels, zmin)], name=str(i), layout={"title": {"text": title(i)}}
        )
        for i in range(len(cos))
    ]
    fig.update_layout(
        title=title(0),
        height=560,
        template="plotly_white",
        margin={"l": 10, "r": 10, "t": 60, "b": 10},
        yaxis={"autorange": "reversed"},
        sliders=[
            {
                "active": 0,
                "currentvalue": {"prefix": "layer: "},
                "pad": {"t": 30},
                "steps": [
                    {
                        "label": str(i),
                        "method": "animate",
                        "args": [
                            [str(i)],
                            {
                                "mode": "immediate",
                                "frame": {"duration": 0, "redraw": True},
                                "transition": {"duration": 0},
                            },
                        ],
                    }
                    for i in range(len(cos))
                ],
            }
        ],
    )
    last = cos[-1][np.triu_indices(len(labels), 1)]
    return describe(
        fig,
        f"A {len(labels)} by {len(labels)} heatmap of the cosine similarity between the vectors of "
        f"'{word}' in {len(labels)} sentences, with a slider over layers 0 to {len(cos) - 1}. "
        f"In the last layer the off-diagonal cosines range from {last.min():.2f} to {last.max():.2f}.",
    )


def cosine_by_layer_figure(curves: Mapping[str, Sequence[float]], word: str = "bank") -> go.Figure:
    """Lines of a cosine similarity against the layer (0 = input embeddings, then layers 1..L).

    Args:
        curves: ``{name: L + 1 cosines}``, e.g. ``{"river vs money": [...], ...}``; same length each.
        word: the word, for the title.

    Raises:
        ValueError: no curve, or curves of different lengths.

    Source: chapter 01 (claims 2 and 10).
    """
    if not curves:
        raise ValueError("curves must hold at least one {name: values} entry; got none")
    lengths = {name: len(values) for name, values in curves.items()}
    if len(set(lengths.values())) != 1:
        raise ValueError(f"every curve needs one value per layer; got lengths {lengths}")
    fig = go.Figure()
    for i, (name, values) in enumerate(curves.items()):
        fig.add_trace(
            go.Scatter(
                x=list(range(len(values))),
                y=[float(v) for v in values],
                name=name,
                mode="lines+markers",
                line={"color": _OKABE_ITO[i % 8], "dash": _DASHES[i % 6]},
                hovertemplate="layer %{x}: cosine %{y:.3f}<extra>" + name + "</extra>",
            )
        )
    fig.update_layout(
        title=f"How alike are the vectors of '{word}', layer by layer?",
        height=420,
        template="plotly_white",
        xaxis={"title": "layer (0 = input embeddings)", "dtick": 1},
        yaxis={"title": "cosine similarity"},
        legend={"orientation": "h", "y": -0.25},
    )
    parts = "; ".join(
        f"{name}: {float(v[0]):.2f} at layer 0, {float(v[-1]):.2f} at the last layer"
        for name, v in curves.items()
    )
    return describe(
        fig,
        f"Line chart of the cosine similarity between vectors of '{word}' against the layer. {parts}.",
    )


def _bars(tokens: Sequence[str], cosines: Sequence[float], visible: bool) -> go.Bar:
    return go.Bar(
        x=list(cosines)[::-1],
        y=list(tokens)[::-1],
        orientation="h",
        visible=visible,
        # Colours as strings, not numbers on a colour scale: plotly.js picks the contrast of the text
        # drawn inside a bar from the bar's colour and warns ("Invalid color specifier") on a number.
        marker={"color": pcolors.sample_colorscale(COLORSCALE, [min(max(float(c), 0.0), 1.0) for c in cosines][::-1])},
        texttemplate="%{x:.2f}",
        hovertemplate="%{y}: cosine %{x:.3f}<extra></extra>",
    )


def nearest_tokens_figure(
    neighbours: Mapping[str, tuple[Sequence[str], Sequence[float]]],
) -> go.Figure:
    """Bar charts of the vocabulary tokens nearest to a word's input embedding, one per word, with
    buttons to switch between words when there are several (works with no kernel).

    Args:
        neighbours: ``{word: (tokens, cosines)}``, best first (from :func:`nearest_tokens`).

    Raises:
        ValueError: no word, or tokens and cosines of different lengths.

    Source: chapter 01.
    """
    if not neighbours:
        raise ValueError("neighbours must hold at least one word; got none")
    for word, (tokens, cosines) in neighbours.items():
        if len(tokens) != len(cosines) or not tokens:
            raise ValueError(
                f"neighbours[{word!r}] needs as many tokens as cosines (at least one); "
                f"got {len(tokens)} and {len(cosines)}"
            )
    words = list(neighbours)

    def title(word: str) -> str:
        return f"Nearest vocabulary tokens to the input embedding of '{word}' (cosine)"

    fig = go.Figure([_bars(*neighbours[w], visible=(i == 0)) for i, w in enumerate(words)])
    fig.update_layout(
        title=title(words[0]),
        height=420,
        template="plotly_white",
        showlegend=False,
        xaxis={"title": "cosine similarity", "range": [0, 1.05]},
        margin={"l": 10, "r": 10, "t": 90 if len(words) > 1 else 60, "b": 10},
    )
    if len(words) > 1:
        fig.update_layout(
            updatemenus=[
                {
                    "type": "buttons",
                    "direction": "right",
                    "x": 0.0,
                    "y": 1.16,
                    "xanchor": "left",
                    "showactive": True,
                    "buttons": [
                        {
                            "label": w,
                            "method": "update",
                            "args": [
                                {"visible": [j == i for j in range(len(words))]},
                                {"title": {"text": title(w)}},
                            ],
                        }
                        for i, w in enumerate(words)
                    ],
                }
            ]
        )
    summary = "; ".join(f"{w}: {', '.join(list(neighbours[w][0])[:4])}" for w in words)
    return describe(
        fig,
        f"Horizontal bars of the cosine similarity between a word's input embedding and its "
        f"nearest vocabulary tokens, one chart per word ({summary}).",
    )
