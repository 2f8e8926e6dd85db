"""Checks for the exercises of chapter 02 (similarity and softmax)."""

from __future__ import annotations

import math

import numpy as np

from .. import ref
from . import call_learner, checker, compare_arrays, failed, passed, to_numpy

__all__ = ["check_stable_softmax", "check_scaled_scores"]


def _naive_softmax(x: np.ndarray, axis: int) -> np.ndarray:
    e = np.exp(x)
    return e / e.sum(axis=axis, keepdims=True)


@checker("2.1 stable softmax")
def check_stable_softmax(fn):
    """``fn(x)`` must return the softmax of a NumPy array along its last axis, for any shape, and
    stay finite for scores in the thousands (subtract each row's maximum first)."""
    ex = "2.1 stable softmax"
    rng = np.random.default_rng(2)
    x = rng.normal(size=(3, 5))
    got = call_learner(ex, fn, x.copy())
    arr = to_numpy(got)
    if arr is None:
        return failed(ex, f"Return an array; got {type(got).__name__}.")
    if arr.shape != x.shape:
        return failed(ex, f"For x of shape {x.shape} the weights should have the same shape; got {arr.shape} "
                          "(softmax normalises, it does not reduce an axis).")
    low = str(getattr(got, "dtype", "")).replace("torch.", "")
    if low in ("float16", "bfloat16", "float32") and np.allclose(arr, ref.softmax(x), atol=3e-2 if low != "float32" else 1e-6):
        return failed(ex, f"Right values, but you returned {low}, which rounds them (rows sum to 1 only to about "
                          f"{'1e-3' if low != 'float32' else '1e-7'}). x is float64: compute and return float64, "
                          "e.g. without .astype or .to(...) casts.")
    if np.isfinite(arr).all():
        if np.allclose(arr, ref.softmax(x, axis=0), atol=1e-9):
            return failed(ex, "The columns sum to one but the rows do not sum to one: normalise over the last axis "
                              "(axis=-1, one row per query), not axis 0.")
        if np.allclose(arr, np.exp(x), atol=1e-9) or np.allclose(arr, np.exp(x - x.max(axis=-1, keepdims=True)), atol=1e-9):
            return failed(ex, "You exponentiated but did not divide: the rows do not sum to one.")
        if np.allclose(arr, x / x.sum(axis=-1, keepdims=True), atol=1e-9):
            return failed(ex, "You divided the scores by their sum without exp: weights can be negative and "
                              "the rows do not sum to one for the right reason.")
        row_sums = arr.sum(axis=-1)
        if not np.allclose(row_sums, 1.0, atol=1e-9):
            return failed(ex, f"The rows do not sum to one (row sums {np.round(row_sums, 4).tolist()}).")
        if (arr < 0).any():
            return failed(ex, "Some weights are negative; exp makes every weight positive.")
    bad = compare_arrays(ex, got, ref.softmax(x), what="softmax([[...]])")
    if bad is not None:
        return bad
    x_big = np.array([[1000.0, 999.0, 998.0], [-1000.0, 0.0, 1000.0], [-2000.0, -2001.0, -2002.0]])
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        got = call_learner(ex, fn, x_big.copy())
    arr = to_numpy(got)
    if arr is None or arr.shape != x_big.shape:
        return failed(ex, f"For scores of shape {x_big.shape} return weights of the same shape.")
    if not np.isfinite(arr[:2]).all():
        return failed(ex, "Right on small scores, but on scores like [1000, 999, 998] exp overflows to inf and "
                          "inf / inf = NaN: subtract each row's maximum before exp (softmax(x) = softmax(x - c)).")
    if not np.isfinite(arr).all():
        return failed(ex, "The row [-2000, -2001, -2002] gives NaN: you subtracted one maximum for the whole array, "
                          "so exp underflows to 0 in that row and 0 / 0 = NaN. Subtract each row's own maximum "
                          "(x.max(axis=-1, keepdims=True)).")
    bad = compare_arrays(ex, got, ref.softmax(x_big), what="softmax of large scores")
    if bad is not None:
        return bad
    x3 = rng.normal(size=(2, 3, 4)) * 50
    with np.errstate(over="ignore", invalid="ignore"):
        bad = compare_arrays(ex, call_learner(ex, fn, x3.copy()), ref.softmax(x3), what="softmax of a (2, 3, 4) array")
    if bad is not None:
        return failed(ex, bad.message + " Take the maximum and the sum over the last axis with keepdims=True, so "
                                        "it works for any number of leading axes.")
    return passed(ex, "exp(x - max) / sum(exp(x - max)) over the last axis: finite for any finite scores.")


@checker("2.2 scaled scores")
def check_scaled_scores(fn):
    """``fn(Q, K, d_model)`` with Q (T, Dh), K (S, Dh) from a model of width d_model must return the
    (T, S) scores ``Q K^T / sqrt(Dh)``: one row per query, scaled by the head's width."""
    ex = "2.2 scaled scores"
    rng = np.random.default_rng(22)
    T, S, d_head, d_model = 3, 4, 16, 64
    Q, K = rng.normal(size=(T, d_head)), rng.normal(size=(S, d_head))
    got = call_learner(ex, fn, Q.copy(), K.copy(), d_model)
    arr = to_numpy(got)
    if arr is None:
        return failed(ex, f"Return an array; got {type(got).__name__}.")
    raw = Q @ K.T  # (T, Dh) @ (Dh, S) -> (T, S)
    if arr.shape == (S, T):
        return failed(ex, f"Your scores have shape (S, T) = {arr.shape}: one row per key. Compute Q @ K.T so that "
                          "row i holds query i's scores against every key, shape (T, S).")
    if arr.shape != (T, S):
        return failed(ex, f"For Q (T, Dh) = {Q.shape} and K (S, Dh) = {K.shape} the scores have shape (T, S) = "
                          f"{(T, S)}; got {arr.shape}.")
    if not np.isfinite(arr).all():
        return failed(ex, "Your scores contain NaN or inf.")
    wrong = [
        (raw / math.sqrt(d_model), "You scaled by sqrt(d_model), not sqrt(d_head): divide by the square root of "
                                   "the key width Q.shape[-1], the width of one head."),
        (raw / d_model, "You divided by d_model; divide by sqrt(d_head), the square root of the key width."),
        (raw / d_head, "You divided by d_head; divide by its square root, sqrt(d_head), which brings the "
                       "variance (not the standard deviation squared twice) back to 1."),
        (raw, "These are the unscaled scores Q K^T: divide by sqrt(d_head) so their variance stays near 1."),
    ]
    for candidate, message in wrong:
        if np.allclose(arr, candidate, atol=1e-9):
            return failed(ex, message)
    bad = compare_arrays(ex, got, raw / math.sqrt(d_head), what="The score matrix")
    if bad is not None:
        return bad
    return passed(ex, "Q @ K.T / sqrt(Q.shape[-1]): the head's width, whatever the model's.")
