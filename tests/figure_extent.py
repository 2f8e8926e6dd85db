"""Does anything placed on a plotly figure's axes lie outside its data (issue 31)?

plotly autoranges an axis over its traces *and* the shapes and annotations referenced to it. On a
log axis an annotation's coordinate is log10 of the data value while a shape's is the data value
itself (plotly.js; a label placed "at block 64" in data units lands at 1e64 and the axis runs to
it). ``stray_marks(fig_dict)`` lists every shape or annotation coordinate of an autoranged numeric
axis that lies outside the extent of that axis's data, with 10% of the data's span (in axis units:
log10 on a log axis) as the usual padding. Used by tests/book/test_figure_ranges.py (every figure of
the executed book) and tests/unit/test_viz_ranges.py (the builders directly).
"""

from __future__ import annotations

import math
import re

PAD = 0.10  # of the data's span in axis units; plotly's own padding is ~5% plus marker size


def _axis_key(ref: str) -> str | None:
    """'x' -> 'xaxis', 'y3' -> 'yaxis3', 'x domain'/'paper' -> None (not data units)."""
    m = re.fullmatch(r"([xy])(\d*)", ref or "")
    return f"{m.group(1)}axis{m.group(2)}" if m else None


def _numbers(values) -> list[float]:
    out = []
    if values is None:
        return out
    if isinstance(values, dict):  # plotly's typed-array JSON {"dtype": ..., "bdata": ...}
        import base64

        import numpy as np

        if "bdata" in values:
            arr = np.frombuffer(base64.b64decode(values["bdata"]), dtype=values["dtype"])
            return [float(v) for v in arr.ravel() if math.isfinite(float(v))]
        return out
    if not isinstance(values, (list, tuple)):
        values = [values]
    for v in values:
        if isinstance(v, (list, tuple, dict)):
            out.extend(_numbers(v))
        elif isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
            out.append(float(v))
    return out


def _traces(fig: dict) -> list[dict]:
    """The figure's traces and its frames' traces (a frame trace takes its axes from the trace it updates)."""
    data = list(fig.get("data") or [])
    out = list(data)
    for frame in fig.get("frames") or []:
        for i, t in enumerate(frame.get("data") or []):
            index = (frame.get("traces") or list(range(len(frame["data"]))))[i]
            base = data[index] if isinstance(index, int) and index < len(data) else {}
            out.append({"xaxis": base.get("xaxis", "x"), "yaxis": base.get("yaxis", "y"), **t})
    return out


def data_extent(fig: dict) -> dict[str, tuple[float, float]]:
    """axis key -> (min, max) of the numeric x / y values of the traces drawn on it."""
    extent: dict[str, list[float]] = {}
    for t in _traces(fig):
        for letter in "xy":
            key = _axis_key(t.get(f"{letter}axis", letter))
            values = _numbers(t.get(letter))
            if key and values:
                extent.setdefault(key, []).extend(values)
    return {k: (min(v), max(v)) for k, v in extent.items()}


def stray_marks(fig: dict) -> list[str]:
    """Each shape/annotation coordinate outside its autoranged numeric axis's data, as a message."""
    layout = fig.get("layout") or {}
    extent = data_extent(fig)
    problems = []
    marks = [("shape", s) for s in layout.get("shapes") or []] + [("annotation", a) for a in layout.get("annotations") or []]
    for kind, mark in marks:
        for letter in "xy":
            key = _axis_key(mark.get(f"{letter}ref", letter))
            if key is None or key not in extent:
                continue
            axis = layout.get(key) or {}
            if axis.get("range") is not None and axis.get("autorange") in (None, False):
                continue  # the author chose the range
            log = axis.get("type") == "log"
            names = (f"{letter}0", f"{letter}1") if kind == "shape" else (letter,)
            lo, hi = extent[key]
            if log:
                if lo <= 0:
                    continue
                lo, hi = math.log10(lo), math.log10(hi)
            pad = PAD * (hi - lo) + (0.05 if log else 0.5)
            for name in names:
                v = mark.get(name)
                if not isinstance(v, (int, float)) or isinstance(v, bool):
                    continue
                if log and kind == "shape":  # a shape on a log axis is in data units
                    if v <= 0:
                        problems.append(f"{kind} {name}={v} on log {key}")
                        continue
                    v = math.log10(v)
                if not lo - pad <= v <= hi + pad:
                    unit = "log10 " if log else ""
                    text = mark.get("text", "")
                    problems.append(f"{kind} {text!r} {name} at {unit}{v:.4g} on {key}: data spans {unit}{lo:.4g} to {hi:.4g}")
    return problems
