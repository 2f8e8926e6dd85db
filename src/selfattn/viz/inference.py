"""Figure builders for chapter 11: what the KV cache costs, the roofline, and decoding speed.

Builders return plotly Figures with a text description attached (never show them). They are static
(hover text, legend toggles, log axes), so a reader of the book explores them with no kernel.

- :func:`kv_cache_figure`: KV-cache GiB against context length per model, up to the context it
  was trained for, and the multi-head equivalent of each grouped-query model (claims 25, 26).
- :func:`roofline_figure`: attainable FLOP/s against arithmetic intensity for this machine (measured)
  and published GPUs, with the intensities of decode and prefill marked (claim 25).
- :func:`decode_speed_figure`: tokens per second with and without the cache against context length.
- :func:`decode_sweep_figure`: the roofline experiment of claim 25, one decode step over a fixed cache
  with more queries per key/value head and more sequences sharing it, against this machine's roofs.

Source: chapter 11.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import numpy as np
import plotly.graph_objects as go

from ..inference.costs import PUBLISHED_ACCELERATORS, Accelerator, KVCacheRow, RooflineMeasurement
from ..inference.decode_timing import DecodeSweep, DecodeTiming
from . import describe

__all__ = ["kv_cache_figure", "roofline_figure", "decode_speed_figure", "decode_sweep_figure", "kv_cache_readout",
           "find_decode_compare", "decode_compare_figure",
           "kv_cache_calculator_widget", "CACHE_FORMATS"]

# Okabe-Ito colours: distinct for colour-blind readers; dashes tell the series apart in grayscale.
_COLOURS = ["#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000"]
_DASHES = ["solid", "dash", "dot", "dashdot", "longdash", "longdashdot"]


def _layout(fig: go.Figure, title: str, x_title: str, y_title: str) -> None:
    fig.update_layout(title=title, height=460, template="plotly_white", legend={"orientation": "h", "y": -0.25},
                      hovermode="closest")
    fig.update_xaxes(type="log", title_text=x_title)
    fig.update_yaxes(type="log", title_text=y_title)


def _cache_points(row: KVCacheRow) -> list[int]:
    # the table's lengths up to the model's max_context, and the corners: the window (where a rolling
    # buffer stops growing) and max_context itself (where the line ends)
    corners = [n for n in (row.sliding_window, row.max_context) if n is not None]
    top = max(row.context_lengths) if row.max_context is None else row.max_context
    return sorted({n for n in (*row.context_lengths, *corners) if n <= top})


def _limits_note(row: KVCacheRow) -> str:
    note = ""
    if row.sliding_window is not None:
        note += (f"<br>sliding window of {row.sliding_window:,} tokens: the cache stops growing there "
                 "(a rolling buffer)")
    if row.max_context is not None:
        note += f"<br>trained for at most {row.max_context:,} tokens: the line ends there"
    return note


def kv_cache_figure(rows: Sequence[KVCacheRow]) -> go.Figure:
    """KV-cache size (GiB) against context length (tokens), log-log, one line per model.

    For each row of :func:`selfattn.inference.costs.kv_cache_table` a solid line of its cache at the
    table's context lengths (``row.gib_at``), drawn only up to the model's ``max_context`` (a point is
    added there) and flat past its ``sliding_window`` (a point added at the window); for a
    grouped-query model (``row.saving > 1``) also a dotted line of its multi-head equivalent in the
    same colour (same legend group). Hover gives bytes per token, the saving and those limits. A model
    whose max_context is below every length of the table is drawn as one point, at its max_context.

    Raises: TypeError: a row that is not a KVCacheRow. ValueError: no rows. Source: chapter 11.
    """
    rows = list(rows)
    if not rows:
        raise ValueError("rows must hold at least one KVCacheRow; got none")
    fig = go.Figure()
    for i, row in enumerate(rows):
        if not isinstance(row, KVCacheRow):
            raise TypeError(f"rows[{i}] must be a KVCacheRow (from kv_cache_table); got {type(row).__name__}")
        colour = _COLOURS[i % len(_COLOURS)]
        x = _cache_points(row)
        note = _limits_note(row)
        hover = (f"{row.name}<br>%{{x:,}} tokens: %{{y:.3g}} GiB<br>{row.bytes_per_token:,} bytes/token "
                 f"({row.n_layers} layers x {row.n_kv_heads} kv heads x d_head {row.d_head}){note}<extra></extra>")
        fig.add_trace(go.Scatter(x=x, y=[row.gib_at(n) for n in x], mode="lines+markers", name=row.name,
                                 legendgroup=row.name, line={"color": colour, "dash": "solid"}, hovertemplate=hover))
        if row.saving > 1:
            mha_hover = (f"{row.name} with multi-head attention ({row.n_heads} kv heads)<br>%{{x:,}} tokens: "
                         f"%{{y:.3g}} GiB<br>{row.mha_bytes_per_token:,} bytes/token, {row.saving:g}x the "
                         f"grouped-query cache{note}<extra></extra>")
            fig.add_trace(go.Scatter(x=x, y=[row.gib_at(n, mha=True) for n in x], mode="lines+markers",
                                     name=f"{row.name}, MHA equivalent", legendgroup=row.name,
                                     line={"color": colour, "dash": "dot"}, marker={"symbol": "circle-open"},
                                     hovertemplate=mha_hover))
    _layout(fig, "KV-cache size against context length (one sequence)", "context length (tokens, log scale)",
            "KV cache (GiB, log scale)")
    gqa = [r for r in rows if r.saving > 1]
    text = (f"Log-log lines of KV-cache size in GiB against context length for {', '.join(r.name for r in rows)}. "
            "The cache grows linearly with the context")
    windowed = [r for r in rows if r.sliding_window is not None]
    if windowed:
        text += (", except past a sliding window, where it stays flat ("
                 + ", ".join(f"{r.name} at {r.sliding_window:,} tokens" for r in windowed) + ")")
    text += "."
    bounded = [r for r in rows if r.max_context is not None]
    if bounded:
        text += (" Each line ends at the context its model was trained for ("
                 + ", ".join(f"{r.name} {r.max_context:,}" for r in bounded) + " tokens).")
    if gqa:
        text += (" Dotted lines: the same model with multi-head attention, larger by n_heads / n_kv_heads ("
                 + ", ".join(f"{r.name} {r.saving:g}x" for r in gqa) + ").")
    return describe(fig, text)


def roofline_figure(measurement: RooflineMeasurement, published: Iterable[Accelerator] | None = None, *,
                    intensities: Mapping[str, float] | None = None,
                    intensity_range: tuple[float, float] = (0.1, 1e4)) -> go.Figure:
    """The roofline: attainable GFLOP/s ``min(peak, intensity x bandwidth)`` against arithmetic
    intensity (FLOPs per byte), log-log.

    One line for this machine (``measurement``: measured float32 matmul rate and read bandwidth) and
    one per published accelerator (default :data:`PUBLISHED_ACCELERATORS`, dense BF16); each line's
    ridge point (its balance) is a point of the line. A marker shows what one decode step of attention
    achieved here; vertical dashed lines mark ``intensities`` (label -> FLOPs/byte; default: the
    measured decode attention), e.g. the cost model's decode and prefill.

    Raises:
        TypeError: ``measurement`` not a RooflineMeasurement. ValueError: a bad intensity range or a
        non-positive intensity.

    Source: Williams et al. 2009; chapter 11 (claim 25).
    """
    if not isinstance(measurement, RooflineMeasurement):
        raise TypeError(f"measurement must be a RooflineMeasurement; got {type(measurement).__name__}")
    lo, hi = intensity_range
    if not (0 < lo < hi < np.inf):
        raise ValueError(f"intensity_range must be (low, high) with 0 < low < high; got {intensity_range!r}")
    accelerators = list(PUBLISHED_ACCELERATORS.values() if published is None else published)
    marks = dict({"decode attention, measured here": measurement.decode_intensity} if intensities is None
                 else intensities)
    for label, value in marks.items():
        if not (np.isfinite(value) and value > 0):
            raise ValueError(f"intensities[{label!r}] must be a finite number > 0 (FLOPs per byte); got {value!r}")
    grid = np.geomspace(lo, hi, 121)
    here = Accelerator(f"this machine ({measurement.threads} threads, float32, measured)",
                       measurement.matmul_flops_per_s, measurement.bandwidth_bytes_per_s, "float32", "measured")
    fig = go.Figure()
    for i, acc in enumerate([here, *accelerators]):
        # the ridge point in the grid, so the corner is drawn exactly
        x = np.unique(np.append(grid, acc.balance) if lo <= acc.balance <= hi else grid)
        y = [acc.attainable(v) / 1e9 for v in x]
        fig.add_trace(go.Scatter(
            x=x.tolist(), y=y, mode="lines", name=f"{acc.name} (balance {acc.balance:.3g} FLOP/byte)",
            line={"color": _COLOURS[i % len(_COLOURS)], "dash": _DASHES[i % len(_DASHES)]},
            hovertemplate=f"{acc.name}<br>%{{x:.3g}} FLOP/byte: %{{y:.4g}} GFLOP/s<extra></extra>"))
    fig.add_trace(go.Scatter(
        x=[measurement.decode_intensity], y=[measurement.decode_flops_per_s / 1e9], mode="markers",
        name="decode attention achieved here", marker={"symbol": "x", "size": 12, "color": "black"},
        hovertemplate=(f"one decode step of attention (H, S, d_head = {measurement.decode_shape})<br>"
                       "%{x:.2f} FLOP/byte: %{y:.3g} GFLOP/s achieved<extra></extra>")))
    for label, value in marks.items():
        # on a log axis a shape takes data values but an annotation takes log10 of them (plotly.js #6194)
        fig.add_vline(x=float(value), line={"dash": "dash", "color": "#999999", "width": 1})
        fig.add_annotation(x=float(np.log10(value)), y=1.0, yref="paper", text=label, showarrow=False,
                           textangle=-90, xanchor="right", yanchor="top", yshift=-4, font={"size": 11})
    _layout(fig, "Roofline: attainable FLOP/s against arithmetic intensity", "arithmetic intensity (FLOP/byte, log scale)",
            "attainable (GFLOP/s, log scale)")
    return describe(fig, (
        f"Roofline, log-log: attainable GFLOP/s against FLOPs per byte for this machine (measured: "
        f"{measurement.matmul_flops_per_s / 1e9:.0f} GFLOP/s, {measurement.bandwidth_bytes_per_s / 1e9:.0f} GB/s, "
        f"balance {measurement.balance:.2g}) and {', '.join(a.name for a in accelerators) or 'no published GPU'}. "
        "Left of a line's corner the memory limits it, right of it the arithmetic. Dashed verticals: "
        + "; ".join(f"{k} at {v:.3g} FLOP/byte" for k, v in marks.items())
        + f". The cross: decode attention here reached {measurement.decode_flops_per_s / 1e9:.2g} GFLOP/s."))


def decode_speed_figure(result: DecodeTiming) -> go.Figure:
    """Tokens per second against context length, with and without the KV cache (log-log).

    One line per mode measured in ``result`` (:func:`selfattn.inference.decode_timing.time_decode`);
    hover gives ms per token and, when both were measured, the cached / uncached ratio.

    Raises: TypeError: not a DecodeTiming. Source: chapter 11.
    """
    if not isinstance(result, DecodeTiming):
        raise TypeError(f"result must be a DecodeTiming (from time_decode); got {type(result).__name__}")
    fig = go.Figure()
    speedup = result.speedup
    for i, mode in enumerate(m for m in (True, False) if m in result.seconds_per_token):
        label = "with the KV cache" if mode else "without the cache (whole sequence recomputed)"
        tps = result.tokens_per_second[mode]
        custom = [[1e3 * s, speedup[k] if speedup else float("nan")]
                  for k, s in enumerate(result.seconds_per_token[mode])]
        ratio = "<br>cached / uncached: %{customdata[1]:.2f}x" if speedup else ""
        fig.add_trace(go.Scatter(
            x=list(result.context_lengths), y=tps, customdata=custom, mode="lines+markers", name=label,
            line={"color": _COLOURS[i], "dash": _DASHES[i]},
            hovertemplate=f"{label}<br>context %{{x}}: %{{y:.1f}} tokens/s, %{{customdata[0]:.2f}} ms/token"
                          f"{ratio}<extra></extra>"))
    _layout(fig, "Decoding speed against context length", "context length (tokens, log scale)",
            "generated tokens per second (log scale)")
    text = (f"Log-log lines of generated tokens per second against context length ({result.n_new} timed tokens per "
            f"run, median of {result.repeats}, {result.threads} threads)")
    if speedup:
        text += (f"; with the cache the model is {speedup[0]:.2g}x as fast at context {result.context_lengths[0]} and "
                 f"{speedup[-1]:.2g}x at {result.context_lengths[-1]}")
    return describe(fig, text + ".")


# --------------------------------------------------------------------------------------------------
# KV-cache calculator (live explorer; its static counterparts are kv_cache_figure and the chapter's table)
# --------------------------------------------------------------------------------------------------

#: Bytes per cached number for the calculator's formats.
CACHE_FORMATS = {"float32": 4, "bfloat16 / float16": 2, "8-bit": 1, "4-bit": 0.5}

#: Memory of one H100 (80 GiB), the yardstick of the calculator's readout.
H100_BYTES = 80 * 2**30


def kv_cache_readout(spec, n_kv_heads: int, n_tokens: int, batch: int, bytes_per_number: float) -> str:
    """The calculator's readout for ``spec`` with ``n_kv_heads`` key/value heads: HTML of four lines.

    Bytes per token (``2 x n_layers x n_kv_heads x d_head x bytes``), the cache of ``batch``
    sequences of ``n_tokens`` tokens (capped at the model's sliding window), the same with one
    key/value head per query head, and the share of an H100's 80 GiB.

    Raises:
        TypeError / ValueError: as :class:`~selfattn.inference.costs.ModelSpec` (``n_kv_heads`` must
        divide ``n_heads``) and :func:`~selfattn.inference.costs.kv_cache_bytes` (``n_tokens`` past
        the model's ``max_context``).

    Source: chapter 11 (claim 25).
    """
    from dataclasses import replace

    from ..inference.costs import kv_cache_bytes

    grouped = replace(spec, n_kv_heads=n_kv_heads)
    per_token = kv_cache_bytes(grouped, 1, bytes_per_number=bytes_per_number)
    total = kv_cache_bytes(grouped, n_tokens, batch=batch, bytes_per_number=bytes_per_number)
    mha = kv_cache_bytes(replace(spec, n_kv_heads=spec.n_heads), n_tokens, batch=batch,
                         bytes_per_number=bytes_per_number)
    held = grouped.cached_tokens(n_tokens)
    window = f" (its window keeps {held:,} of them)" if held < n_tokens else ""
    return (f"<b>{spec.name}</b>, {n_kv_heads} of {spec.n_heads} key/value heads: "
            f"{per_token:,} bytes per token<br>"
            f"{batch} sequence(s) of {n_tokens:,} tokens{window}: <b>{total / 2**30:,.2f} GiB</b> of cache<br>"
            f"with one key/value head per query head: {mha / 2**30:,.2f} GiB ({spec.n_heads // n_kv_heads}x)<br>"
            f"{total / H100_BYTES:.0%} of an H100's 80 GiB")


def kv_cache_calculator_widget(model: str = "Llama 3.1 8B"):
    """Live KV-cache calculator (needs a running kernel): pick a published model, its number of
    key/value heads, the context, the batch and the number format; the readout shows the cache.

    Returns:
        An ``ipywidgets.VBox``: ``children[0]`` the model dropdown, ``children[1]`` the key/value heads
        dropdown (the divisors of the model's n_heads), ``children[2]`` the context slider (powers of
        two up to the model's max_context), ``children[3]`` the batch slider, ``children[4]`` the
        format dropdown, ``children[5]`` the HTML readout (:func:`kv_cache_readout`).

    Raises:
        ValueError: ``model`` not a key of :data:`selfattn.inference.costs.PUBLISHED_SPECS`.

    Source: chapter 11.
    """
    import ipywidgets as widgets

    from ..inference.costs import PUBLISHED_SPECS

    if model not in PUBLISHED_SPECS:
        raise ValueError(f"model must be one of {sorted(PUBLISHED_SPECS)}; got {model!r}")

    def contexts(spec) -> list[int]:
        top = spec.max_context or 2**17
        return [2**k for k in range(7, 18) if 2**k <= top]

    def divisors(spec) -> list[int]:
        return [d for d in range(1, spec.n_heads + 1) if spec.n_heads % d == 0]

    spec = PUBLISHED_SPECS[model]
    model_box = widgets.Dropdown(options=list(PUBLISHED_SPECS), value=model, description="model")
    heads_box = widgets.Dropdown(options=divisors(spec), value=spec.n_kv_heads, description="KV heads")
    context = widgets.SelectionSlider(options=contexts(spec), value=min(8192, contexts(spec)[-1]), description="tokens")
    batch = widgets.IntSlider(value=1, min=1, max=256, description="batch")
    fmt = widgets.Dropdown(options=list(CACHE_FORMATS), value="bfloat16 / float16", description="format")
    readout = widgets.HTML()
    switching = []  # non-empty while new_model resets the other controls (each reset fires update)

    def update(*_):
        if switching:
            return
        s = PUBLISHED_SPECS[model_box.value]
        readout.value = kv_cache_readout(s, heads_box.value, context.value, batch.value, CACHE_FORMATS[fmt.value])

    def new_model(change):
        s = PUBLISHED_SPECS[change["new"]]
        switching.append(True)
        try:
            heads_box.options = divisors(s)
            heads_box.value = s.n_kv_heads
            context.options = contexts(s)
            context.value = min(8192, contexts(s)[-1])
        finally:
            switching.clear()
        update()

    model_box.observe(new_model, names="value")
    for w in (heads_box, context, batch, fmt):
        w.observe(update, names="value")
    update()
    return widgets.VBox([model_box, heads_box, context, batch, fmt, readout])


def decode_sweep_figure(sweep: DecodeSweep, measurement: RooflineMeasurement) -> go.Figure:
    """Achieved GFLOP/s (counted FLOPs over the median time) against counted intensity for each step
    of ``sweep`` (:func:`selfattn.inference.decode_timing.time_decode_step_sweep`), log-log, under this
    machine's roofline ``min(peak, intensity x bandwidth)`` from ``measurement``. If the step were
    limited by memory traffic alone, the points would climb the sloped roof; flat points lie below it.

    Raises: TypeError: the wrong types. Source: chapter 11 (claim 25).
    """
    if not isinstance(sweep, DecodeSweep):
        raise TypeError(f"sweep must be a DecodeSweep (from time_decode_step_sweep); got {type(sweep).__name__}")
    if not isinstance(measurement, RooflineMeasurement):
        raise TypeError(f"measurement must be a RooflineMeasurement; got {type(measurement).__name__}")
    points = sweep.groups + sweep.batches[1:]
    lo, hi = min(p.intensity for p in points) / 2, max(p.intensity for p in points) * 2
    here = Accelerator("this machine", measurement.matmul_flops_per_s, measurement.bandwidth_bytes_per_s, "float32",
                       "measured")
    grid = np.geomspace(lo, hi, 81)
    x = np.unique(np.append(grid, here.balance) if lo <= here.balance <= hi else grid)
    fig = go.Figure()
    fig.add_trace(go.Scatter(
        x=x.tolist(), y=[here.attainable(v) / 1e9 for v in x], mode="lines", line={"color": "#999999"},
        name=f"roofline of this machine (measured, balance {here.balance:.2g} FLOP/byte)",
        hovertemplate="%{x:.3g} FLOP/byte: at most %{y:.4g} GFLOP/s<extra></extra>"))
    for i, (label, pts) in enumerate((("query heads per key/value head 1 -> " f"{sweep.groups[-1].group_size}",
                                       sweep.groups),
                                      (f"sequences sharing the cache 1 -> {sweep.batches[-1].batch}", sweep.batches))):
        fig.add_trace(go.Scatter(
            x=[p.intensity for p in pts], y=[p.flops_per_s / 1e9 for p in pts], mode="lines+markers", name=label,
            line={"color": _COLOURS[i], "dash": _DASHES[i]},
            customdata=[[p.group_size, p.batch, p.seconds * 1e3] for p in pts],
            hovertemplate=("group %{customdata[0]}, batch %{customdata[1]}: %{customdata[2]:.1f} ms<br>"
                           "%{x:.3g} FLOP/byte, %{y:.3g} GFLOP/s achieved<extra></extra>")))
    _layout(fig, "One decode step, more FLOPs on the same cache", "counted intensity (FLOP/byte, log scale)",
            "achieved (GFLOP/s, log scale)")
    return describe(fig, (
        f"Log-log: achieved GFLOP/s against counted FLOPs per byte for one decode step over a cache of "
        f"{sweep.context_len:,} positions ({sweep.n_kv_heads} key/value heads of width {sweep.d_head}, float32), "
        f"first with 1 to {sweep.groups[-1].group_size} query heads per key/value head, then with 1 to "
        f"{sweep.batches[-1].batch} sequences sharing the cache; under this machine's measured roofline "
        f"({measurement.matmul_flops_per_s / 1e9:.0f} GFLOP/s, {measurement.bandwidth_bytes_per_s / 1e9:.0f} GB/s). "
        f"Step times from {points[0].seconds * 1e3:.1f} to {points[-1].seconds * 1e3:.1f} ms."))


# --------------------------------------------------------------------------------------------------
# The decode comparison of bench/decode_compare.py (read from its results file; the chapter does not run it)
# --------------------------------------------------------------------------------------------------

def find_decode_compare(start=None):
    """The newest results file of ``bench/decode_compare.py``: ``bench/results/decode-compare-*.json``
    in ``start`` (default: the working directory) or the nearest folder above it that has one, the
    last by name (the names carry the date); None where there is none (e.g. on Colab without the
    repository). Source: chapter 11."""
    from pathlib import Path

    here = Path.cwd() if start is None else Path(start)
    for folder in [here, *here.parents]:
        found = sorted((folder / "bench" / "results").glob("decode-compare-*.json"))
        if found:
            return found[-1]
    return None


def decode_compare_figure(record: Mapping) -> go.Figure:
    """Tokens per second against context, one line per engine, one view per size and batch (buttons).

    ``record``: the JSON of ``bench/decode_compare.py`` (``engines``, ``sizes``, ``batches``,
    ``contexts``, ``tokens_per_second[size][batch][engine]``, ``seconds_per_step`` likewise). Hover
    gives ms per step and the engine's speed as a ratio to the course's eager step.

    Raises: TypeError: ``record`` not a mapping; KeyError: a field missing. Source: chapter 11.
    """
    from . import views_figure

    if not isinstance(record, Mapping):
        raise TypeError(f"record must be the mapping read from a decode-compare JSON file; got {type(record).__name__}")
    contexts = list(record["contexts"])
    views = {}
    for size in record["sizes"]:
        for batch in record["batches"]:
            tps = record["tokens_per_second"][size][str(batch)]
            sec = record["seconds_per_step"][size][str(batch)]
            fig = go.Figure()
            for i, engine in enumerate(record["engines"]):
                custom = [[1e3 * s, t / e] for s, t, e in zip(sec[engine], tps[engine], tps["course eager"], strict=True)]
                fig.add_trace(go.Scatter(
                    x=contexts, y=tps[engine], customdata=custom, mode="lines+markers", name=engine,
                    line={"color": _COLOURS[i], "dash": _DASHES[i]},
                    hovertemplate=f"{engine}<br>context %{{x}}: %{{y:.0f}} tokens/s, %{{customdata[0]:.2f}} ms/step"
                                  "<br>%{customdata[1]:.2f}x the course's eager speed<extra></extra>"))
            _layout(fig, f"One decode step, {size} size, batch {batch}", "context length (tokens, log scale)",
                    "tokens per second (log scale)")
            eager = tps["course eager"]
            views[f"{size}, batch {batch}"] = describe(fig, (
                f"{size}, batch {batch}: the course's eager step at {eager[0]:.0f} tokens/s at context {contexts[0]} "
                f"and {eager[-1]:.0f} at {contexts[-1]}; "
                + ", ".join(f"{e} {tps[e][0]:.0f} and {tps[e][-1]:.0f}" for e in record["engines"][1:]) + "."))
    if len(views) == 1:
        return next(iter(views.values()))
    return views_figure(views, label="size and batch")
