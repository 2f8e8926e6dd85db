"""Checks for the exercises of chapter 02 (similarity and softmax).

2.1 a stable softmax; 2.2 scaled scores; 2.3 a stable log-softmax; 2.4 the mean cross-entropy loss of the
chapter's training loop, from the logits and the answers.
"""

from __future__ import annotations

import math

import numpy as np

from .. import ref
from . import call_learner, checker, compare_arrays, failed, passed, to_numpy
from ._judge import judge

__all__ = ["check_stable_softmax", "check_scaled_scores", "check_log_softmax", "check_cross_entropy"]


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


_EX3 = "2.3 stable log-softmax"
_EX4 = "2.4 cross-entropy loss"


def _log_softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    m = x.max(axis=axis, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=axis, keepdims=True))


@checker(_EX3)
def check_log_softmax(fn):
    """``fn(x)`` must return ``log softmax(x)`` along the last axis of a NumPy array, finite for scores in
    the thousands: ``x - m - log(sum(exp(x - m)))`` with m each row's maximum."""
    rng = np.random.default_rng(23)
    x = rng.normal(size=(4, 6)) * np.array([[0.5], [3.0], [300.0], [1000.0]])  # rows 2, 3: large scores
    with np.errstate(over="ignore", invalid="ignore", divide="ignore", under="ignore"):
        got = call_learner(_EX3, fn, x.copy())
    expected = _log_softmax(x)
    arr = to_numpy(got)
    if arr is not None and arr.shape == x.shape and not np.isfinite(arr).all():
        if np.isfinite(arr[:2]).all():
            return failed(_EX3, "Right on small scores, but rows with scores in the hundreds give -inf or NaN: "
                                "log(softmax(x)) underflows (softmax is 0 far below the maximum, log 0 = -inf) and "
                                "exp(x) overflows. Compute x - m - log(sum(exp(x - m))) with m the row maximum.")  # fmt: skip
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        mistakes = [
            (lambda: _log_softmax(x, axis=0), "You normalised over axis 0 (the columns); take the maximum and the "
                                              "log-sum-exp over the last axis (axis=-1, keepdims=True)."),
            (lambda: x - x.max(axis=-1, keepdims=True), "You subtracted the maximum but not log(sum(exp(x - m))): "
                                                        "the exponentials of your result do not sum to one."),
            (lambda: x - np.log(np.exp(x - x.max(axis=-1, keepdims=True)).sum(axis=-1, keepdims=True)),
             "You subtracted log(sum(exp(x - m))) but forgot to subtract m itself: log softmax(x) = x - m - "
             "log(sum(exp(x - m)))."),
            (lambda: ref.softmax(x), "You returned the softmax, not its logarithm."),
            (lambda: -_log_softmax(x), "The sign is flipped: log-probabilities are <= 0."),
        ]  # fmt: skip
        return judge(_EX3, got, expected, mistakes, what="log_softmax(x)", atol=1e-9,
                     right="x - m - log(sum(exp(x - m))) over the last axis: finite for any finite scores, "
                           "and exp of it is the softmax.")  # fmt: skip


@checker(_EX4)
def check_cross_entropy(fn):
    """``fn(logits, y)`` for logits (N, C) float64 and integer answers y (N,) must return the mean
    cross-entropy ``-(1/N) sum_n log softmax(logits[n])[y[n]]`` in nats, a single number (as
    ``F.cross_entropy``)."""
    rng = np.random.default_rng(24)
    N, C = 6, 5
    logits = rng.normal(size=(N, C)) * 2
    logits[1] *= 200  # a confident row: a plain log(softmax) gives -inf there
    y = rng.integers(0, C, size=N)
    y[1] = int(np.argmin(logits[1]))  # the confident row is wrong, so its loss is large
    with np.errstate(over="ignore", invalid="ignore", divide="ignore", under="ignore"):
        got = call_learner(_EX4, fn, logits.copy(), y.copy())
    lsm = _log_softmax(logits)
    picked = lsm[np.arange(N), y]
    expected = np.array(-picked.mean())
    arr = to_numpy(got)
    if arr is not None and arr.size == 1:
        arr = arr.reshape(())
        got = arr
    if arr is not None and arr.shape == (N,):
        if np.allclose(arr, -picked, atol=1e-9):
            return failed(_EX4, "You returned one loss per example; the loss is their mean (a single number): .mean().")
    if arr is not None and arr.shape == () and not np.isfinite(arr):
        return failed(_EX4, "The loss is inf or NaN: log(softmax) of a confident wrong row underflows to log 0. "
                            "Use a stable log-softmax (exercise 2.3) and pick log_softmax(logits)[n, y[n]].")  # fmt: skip
    probs = ref.softmax(logits)
    mistakes = [
        (np.array(picked.mean()), "The sign is missing: the loss is minus the mean log-probability of the answers, so it is >= 0."),
        (np.array(-picked.sum()), "You summed over the examples; F.cross_entropy (and this course) takes the mean: divide by N."),
        (np.array(-probs[np.arange(N), y].mean()), "You averaged the probabilities of the answers; the loss averages their "
                                                   "logarithms: -mean(log softmax(logits)[n, y[n]])."),
        (np.array(-lsm[y, np.arange(N) % C].mean()) if N >= C else None, "You indexed rows by the answers; pick "
                                                                          "log_softmax(logits)[n, y[n]]: row n, column y[n]."),
        (np.array(-lsm.mean()), "You averaged the log-probabilities of every class; pick only the answer's: "
                                "log_softmax(logits)[torch.arange(N), y]."),
        (np.array(-(logits[np.arange(N), y]).mean()), "You took the raw logits of the answers; take their log-softmax "
                                                      "first, so that the other classes count too."),
    ]  # fmt: skip
    mistakes = [(wrong, words) for wrong, words in mistakes if wrong is not None]
    return judge(_EX4, got, expected, mistakes, what="The loss", atol=1e-9,
                 right="-log_softmax(logits)[arange(N), y].mean(): what F.cross_entropy(logits, y) computes.")
