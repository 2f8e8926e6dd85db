"""Checks for the exercises of chapter 11c (sinks and a quantized cache).

11c.1 the weights of a softmax with a sink logit; 11c.2 the bytes per token of a KIVI cache.
Expected values are computed here with NumPy and plain arithmetic, independently of
:mod:`selfattn.sinks` and :mod:`selfattn.inference.quant_cache`; the usual mistakes are computed too
and named: the sink left out of the denominator, the sink's share returned as a column, rows
renormalised to one; scales and offsets forgotten, the keys' scales counted per token, bits for bytes.

A function whose body is still empty counts as not attempted.
"""

from __future__ import annotations

import numpy as np

from . import (
    call_learner,
    checker,
    compare_arrays,
    failed,
    is_empty_stub,
    not_attempted,
    passed,
    to_numpy,
)

__all__ = ["check_sink_softmax", "check_kivi_bytes"]

_EX1 = "11c.1 a softmax with a sink"
_EX2 = "11c.2 the bytes of a KIVI cache"


def _softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


@checker(_EX1)
def check_sink_softmax(fn):
    """``fn(scores, sink)``: scores (T, S) float64 array, sink a float -> the (T, S) weights with
    ``exp(sink)`` in every row's denominator."""
    if is_empty_stub(fn):
        return not_attempted(_EX1)
    rng = np.random.default_rng(0)
    # A sink of 0 comes after the others (there exp(sink) = 1 in the denominator and the sink itself, 0, would
    # read as plain softmax); the last case has scores near 800 and a sink above them, where exp overflows.
    for sink, shift in ((2.5, 0.0), (-1.0, 0.0), (0.0, 0.0), (800.5, 800.0)):
        scores = rng.normal(size=(4, 6)) * 2 + shift
        got = call_learner(_EX1, fn, scores.copy(), sink)
        m = np.maximum(scores.max(-1, keepdims=True), sink)
        e = np.exp(scores - m)
        expected = e / (e.sum(-1, keepdims=True) + np.exp(sink - m))
        arr = to_numpy(got) if not isinstance(got, np.ndarray) else got
        if isinstance(arr, np.ndarray) and arr.shape == (4, 7):
            return failed(_EX1, "You returned the sink's column too; drop it: the sink has no value to read.")
        if isinstance(arr, np.ndarray) and arr.shape == expected.shape and np.allclose(arr, _softmax(scores)):
            return failed(_EX1, "These are plain softmax weights: exp(sink) must join each row's denominator.")
        if shift and isinstance(arr, np.ndarray) and arr.shape == expected.shape and not np.isfinite(arr).all():
            return failed(_EX1, f"With scores near {shift:g} and sink = {sink:g} your weights hold NaN or inf: exp "
                                "overflowed. Subtract m = max(the row's largest score, sink) from the scores and from "
                                "the sink before exp, as the stable softmax does.")
        if not shift and sink and isinstance(arr, np.ndarray) and arr.shape == expected.shape and np.allclose(
                arr, np.exp(scores) / (np.exp(scores).sum(-1, keepdims=True) + sink)):
            return failed(_EX1, f"With sink = {sink:g} you added the sink itself to the denominator: the sink is a "
                                "logit like the scores, so exp(sink) joins the sum.")
        problem = compare_arrays(_EX1, got, expected, what="the weights", atol=1e-9, rtol=1e-9)
        if problem is not None:
            return problem
    return passed(_EX1, "Right: each row sums to less than one, and the missing share went to the sink.")


@checker(_EX2)
def check_kivi_bytes(fn):
    """``fn(d_head, bits, group_size)`` -> bytes per token per head of KIVI's key and value rows, with a
    16-bit scale and a 16-bit offset per group (keys: per channel over G tokens; values: per G channels)."""
    if is_empty_stub(fn):
        return not_attempted(_EX2)
    for Dh, b, G in ((128, 2, 32), (64, 4, 32), (32, 2, 16)):
        got = call_learner(_EX2, fn, Dh, b, G)
        if isinstance(got, bool) or not isinstance(got, (int, float, np.integer, np.floating)):
            return failed(_EX2, f"Return one number of bytes; got {type(got).__name__}.")
        if not np.isfinite(float(got)):
            return failed(_EX2, f"Your number of bytes is {float(got)}; it should be a finite number.")
        data = 2 * Dh * b / 8
        expected = data + Dh * 4 / G + (Dh // G) * 4
        if np.isclose(got, expected):
            continue
        if np.isclose(got, data):
            return failed(_EX2, "Only the integers: every group also stores a scale and an offset (2 bytes each).")
        if np.isclose(got, data + Dh * 4 + (Dh // G) * 4):
            return failed(_EX2, "The keys' scale and offset belong to a channel over G tokens: per token that "
                          "is 4 / G bytes per channel, not 4.")
        if np.isclose(got, 8 * expected) or np.isclose(got, 2 * Dh * b + Dh * 4 / G + (Dh // G) * 4):
            return failed(_EX2, "Bits, not bytes: divide the b-bit integers by 8.")
        return failed(_EX2, f"For d_head={Dh}, {b} bits, G={G}: expected {expected:g} bytes, got {got}.")
    return passed(_EX2, "Right: for d_head = 128 at 2 bits and G = 32 the scales and offsets are 32 of the 96 bytes, a third.")
