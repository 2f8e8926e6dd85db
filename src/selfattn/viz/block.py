"""Figures and measures for chapter 07: the residual stream through a stack of Transformer blocks.

Measures: :func:`stream_through` (the residual stream after every block of a stack) and
:func:`branch_measures` (how much each sublayer of a post-norm block writes into the stream, per
layer and token). Figure builders return ``plotly.graph_objects.Figure`` (never shown):
:func:`depth_statistics_figure` (pre-norm vs post-norm: size of the stream by depth and a slider
over depth showing the distribution of its values; explorable with no kernel),
:func:`branch_heatmap_figure` (one measure, one sentence) and :func:`branch_figure` (a dropdown over
sentences and measures). :func:`branch_explorer_widget` is the live ipywidgets explorer.

Source: chapter 07.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots

from . import COLORSCALE, describe, live_output

__all__ = [
    "stream_through",
    "branch_measures",
    "depth_statistics_figure",
    "branch_heatmap_figure",
    "branch_figure",
    "branch_explorer_widget",
    "BRANCH_MEASURES",
]

#: The measures of :func:`branch_measures`, in order, with what they mean.
BRANCH_MEASURES = {
    "attention / stream": "|attn(x)| / |x|: size of the attention branch relative to the block's input",
    "FFN / stream": "|ffn(h)| / |h|: size of the feed-forward branch relative to its input h",
    "cos(input, output)": "cosine between a token's vector before and after the block",
}

_COLOURS = {"pre-norm": "#0072B2", "post-norm": "#E69F00"}  # Okabe-Ito: colour-blind safe


def stream_through(blocks: Sequence[torch.nn.Module], x: torch.Tensor) -> list[np.ndarray]:
    """The residual stream before the first block and after each one, without gradients.

    Args:
        blocks: modules mapping (B, T, D) -> (B, T, D), applied in order.
        x: (B, T, D) input.

    Returns:
        ``len(blocks) + 1`` float64 arrays (B, T, D).

    Raises:
        TypeError: ``x`` is not a tensor.
    """
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor (B, T, D); got {type(x).__name__}")
    streams = [x.detach().double().cpu().numpy()]
    with torch.no_grad():
        for block in blocks:
            x = block(x)  # (B, T, D) -> (B, T, D)
            streams.append(x.double().cpu().numpy())
    return streams


def branch_measures(
    blocks: Sequence[torch.nn.Module], hidden_states: Sequence[torch.Tensor]
) -> dict[str, np.ndarray]:
    """For post-norm blocks (``x -> h = ln1(x + attn(x)) -> ln2(h + ffn(h))``), per layer and token:
    the sizes of the two branches relative to their inputs and the cosine between the block's
    input and output (see :data:`BRANCH_MEASURES`).

    Args:
        blocks: L :class:`~selfattn.block.PostNormTransformerBlock` (e.g. ``encoder.blocks``).
        hidden_states: L + 1 tensors (1, T, D): the input of block 0, then each block's output.

    Returns:
        ``{measure: (L, T) float64 array}``.

    Raises:
        ValueError: ``hidden_states`` is not one longer than ``blocks``, or a batch is not 1.
    """
    if len(hidden_states) != len(blocks) + 1:
        raise ValueError(
            f"hidden_states must hold len(blocks) + 1 = {len(blocks) + 1} tensors; got {len(hidden_states)}"
        )
    rows = {name: [] for name in BRANCH_MEASURES}
    with torch.no_grad():
        for block, x, out in zip(blocks, hidden_states[:-1], hidden_states[1:], strict=True):
            if x.ndim != 3 or x.shape[0] != 1:
                raise ValueError(
                    f"hidden states must be (1, T, D), one sentence; got {tuple(x.shape)}"
                )
            attn_out = block.attn(x)  # (1, T, D)
            h = block.ln1(x + attn_out)  # (1, T, D)
            ffn_out = block.ffn(h)  # (1, T, D)
            norm = lambda t: t[0].double().norm(dim=-1)  # noqa: E731  (1, T, D) -> (T,)
            rows["attention / stream"].append((norm(attn_out) / norm(x)).numpy())
            rows["FFN / stream"].append((norm(ffn_out) / norm(h)).numpy())
            cos = torch.nn.functional.cosine_similarity(
                x[0].double(), out[0].double(), dim=-1
            )  # (T,)
            rows["cos(input, output)"].append(cos.numpy())
    return {name: np.stack(r) for name, r in rows.items()}  # L x (T,) -> (L, T)


def _histograms(streams: dict[str, list[np.ndarray]], bins: int, limit: float):
    edges = np.linspace(-limit, limit, bins + 1)
    centres = (edges[:-1] + edges[1:]) / 2
    counts = {
        name: [np.histogram(np.clip(s, -limit, limit), bins=edges)[0] / s.size for s in stack]
        for name, stack in streams.items()
    }  # values beyond +-limit are counted in the outermost bins
    return centres, counts


def depth_statistics_figure(
    streams: dict[str, list[np.ndarray]], bins: int = 41, limit: float | None = None
) -> go.Figure:
    """Pre-norm vs post-norm (or any named stacks): left, the root-mean-square of the residual stream
    after each block; right, the distribution of its values at the depth chosen with the slider.

    Args:
        streams: ``{name: [array (B, T, D) per depth]}`` (e.g. from :func:`stream_through`), every
            stack of the same depth.
        bins: histogram bins. limit: histogram range [-limit, limit]; default the largest 99.9th
            percentile of |values|.

    Raises:
        ValueError: no stacks, stacks of different depths, or non-finite values.

    Source: chapter 07.
    """
    if not isinstance(streams, dict) or not streams:
        raise ValueError("streams must be a non-empty dict {name: [array per depth]}")
    depths = {len(s) for s in streams.values()}
    if len(depths) != 1:
        raise ValueError(f"every stack must have the same number of depths; got {sorted(depths)}")
    n_depths = depths.pop()
    for name, stack in streams.items():
        if not all(np.isfinite(np.asarray(s)).all() for s in stack):
            raise ValueError(f"stack {name!r} holds NaN or inf values")
    rms = {
        name: np.array([np.sqrt(np.mean(np.square(s))) for s in stack])
        for name, stack in streams.items()
    }
    if limit is None:
        limit = float(
            max(np.percentile(np.abs(s), 99.9) for stack in streams.values() for s in stack)
        )
    centres, counts = _histograms(streams, bins, limit)
    names = list(streams)

    def traces(depth: int) -> list:
        out = [
            go.Scatter(
                x=list(range(n_depths)),
                y=np.round(rms[n], 4).tolist(),
                mode="lines+markers",
                name=f"{n}: RMS",
                line={"color": _COLOURS.get(n)},
                legendgroup=n,
            )
            for n in names
        ]
        out += [
            go.Scatter(
                x=[depth] * len(names),
                y=[float(rms[n][depth]) for n in names],
                mode="markers",
                marker={"size": 14, "symbol": "circle-open", "color": "black"},
                showlegend=False,
                hoverinfo="skip",
            )
        ]
        out += [
            go.Bar(
                x=np.round(centres, 3).tolist(),
                y=np.round(counts[n][depth], 5).tolist(),
                name=f"{n}: values",
                marker={"color": _COLOURS.get(n)},
                opacity=0.6,
                legendgroup=n,
                xaxis="x2",
                yaxis="y2",
            )
            for n in names
        ]
        return out  # fmt: skip

    fig = make_subplots(
        rows=1,
        cols=2,
        subplot_titles=("RMS by depth", "values at the chosen depth"),
    )
    for i, trace in enumerate(traces(0)):
        fig.add_trace(trace, row=1, col=1 if i <= len(names) else 2)
    fig.frames = [
        go.Frame(data=traces(d), name=str(d), traces=list(range(2 * len(names) + 1)))
        for d in range(n_depths)
    ]
    step = {
        "mode": "immediate",
        "frame": {"duration": 0, "redraw": True},
        "transition": {"duration": 0},
    }
    fig.update_layout(
        height=520, template="plotly_white", barmode="overlay",
        legend={"orientation": "h", "x": 0.0, "y": 1.12, "xanchor": "left", "yanchor": "bottom"},
        margin={"t": 110},
        xaxis={"title": "depth (blocks applied)"}, yaxis={"title": "RMS of the residual stream"},
        xaxis2={"title": "value", "range": [-limit, limit]}, yaxis2={"title": "fraction of values"},
        sliders=[{"active": 0, "currentvalue": {"prefix": "depth: "}, "pad": {"t": 50},
                  "steps": [{"label": str(d), "method": "animate", "args": [[str(d)], step]} for d in range(n_depths)]}],
    )  # fmt: skip
    summary = "; ".join(
        f"{n}: RMS {rms[n][0]:.2f} at depth 0, {rms[n][-1]:.2f} at depth {n_depths - 1}"
        for n in names
    )
    return describe(
        fig,
        f"Residual stream through {n_depths - 1} blocks ({summary}). Left: RMS by depth; "
        "right: histogram of the stream's values at the depth chosen with the slider.",
    )


def _check_measure(tokens: Sequence[str], values) -> np.ndarray:
    v = np.asarray(values, dtype=np.float64)
    if v.ndim != 2 or v.shape[1] != len(tokens):
        raise ValueError(
            f"values must be (L, T) with T = len(tokens) = {len(tokens)}; got shape {v.shape}"
        )
    if not np.isfinite(v).all():
        raise ValueError("values hold NaN or inf")
    return v


def _branch_heatmap(tokens: Sequence[str], v: np.ndarray) -> go.Heatmap:
    return go.Heatmap(
        z=np.round(v, 4).tolist(), x=[f"{i}:{t}" for i, t in enumerate(tokens)],
        y=[f"layer {layer}" for layer in range(v.shape[0])], colorscale=COLORSCALE,  # counted from 0
        hovertemplate="%{y}, token %{x}: %{z:.3f}<extra></extra>",
    )  # fmt: skip


def branch_heatmap_figure(tokens: Sequence[str], values, measure: str) -> go.Figure:
    """One measure of :func:`branch_measures` for one sentence: a layer-by-token heatmap.

    Raises:
        ValueError: ``values`` not (L, T) with T = len(tokens), or not finite.

    Source: chapter 07.
    """
    v = _check_measure(tokens, values)
    fig = go.Figure(_branch_heatmap(tokens, v))
    fig.update_layout(title=measure, height=380, template="plotly_white", xaxis={"tickangle": -45},
                      yaxis={"autorange": "reversed"})  # fmt: skip
    per_layer = ", ".join(f"{m:.2f}" for m in v.mean(axis=1))
    return describe(
        fig, f"{measure} for each layer (rows) and token (columns); mean per layer: {per_layer}."
    )


def branch_figure(sentences: dict[str, tuple[Sequence[str], dict[str, np.ndarray]]]) -> go.Figure:
    """:func:`branch_heatmap_figure` for several sentences and measures, with a dropdown over every
    (sentence, measure) pair; explorable with no kernel.

    Args:
        sentences: ``{sentence: (tokens, {measure: (L, T) array})}``.

    Raises:
        ValueError: empty, or measures that do not fit their tokens.

    Source: chapter 07.
    """
    if not isinstance(sentences, dict) or not sentences:
        raise ValueError(
            "sentences must be a non-empty dict {sentence: (tokens, {measure: (L, T)})}"
        )
    options = []
    for sentence, (tokens, measures) in sentences.items():
        for measure, values in measures.items():
            v = _check_measure(tokens, values)
            trace = _branch_heatmap(tokens, v)
            options.append(
                (f"{measure} — {sentence}", {"z": [trace.z], "x": [trace.x], "y": [trace.y]})
            )
    first_sentence, (first_tokens, first_measures) = next(iter(sentences.items()))
    first_measure = next(iter(first_measures))
    fig = branch_heatmap_figure(first_tokens, first_measures[first_measure], options[0][0])
    fig.update_layout(  # the menu's label names the view: no separate title
        title={"text": ""}, height=440, margin={"t": 90},
        updatemenus=[{"type": "dropdown", "name": "sentence and measure", "x": 0.0, "y": 1.04, "xanchor": "left", "yanchor": "bottom",
                      "showactive": True,
                      "buttons": [{"label": label, "method": "restyle", "args": [args]} for label, args in options]}],
    )  # fmt: skip
    return describe(
        fig,
        f"Layer-by-token heatmaps of {', '.join(first_measures)} for {len(sentences)} sentences; "
        "a dropdown picks the sentence and the measure.",
    )


def branch_explorer_widget(
    measure_fn: Callable[[str], tuple[list[str], dict[str, np.ndarray]]], sentence: str
):
    """Live explorer (needs a running kernel): a text box for the sentence and a dropdown for the
    measure; shows :func:`branch_heatmap_figure`.

    Args:
        measure_fn: ``sentence -> (tokens, {measure: (L, T) array})``.
        sentence: the initial sentence.

    Returns:
        An ``ipywidgets.VBox``; display it in a notebook.

    Source: chapter 07.
    """
    import ipywidgets as widgets

    cache = {sentence: measure_fn(sentence)}
    names = list(cache[sentence][1])
    text = widgets.Text(value=sentence, description="sentence", continuous_update=False,
                        layout=widgets.Layout(width="95%"))  # fmt: skip
    measure = widgets.Dropdown(options=names, value=names[0], description="measure")

    def show(sentence: str, measure: str) -> None:
        if sentence not in cache:
            cache[sentence] = measure_fn(sentence)
        tokens, measures = cache[sentence]
        branch_heatmap_figure(tokens, measures[measure], f"{measure} — {sentence}").show()

    out = live_output(show, {"sentence": text, "measure": measure})
    return widgets.VBox([text, measure, out])
