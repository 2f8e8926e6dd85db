"""Checks for the exercises of chapter 03 (queries, keys and values)."""

from __future__ import annotations

import math

import numpy as np
import torch

from .. import ref
from . import call_learner, checker, compare_arrays, failed, passed, to_numpy
from ._judge import judge

__all__ = ["check_attention", "check_weighted_sum", "check_self_attention", "check_batched_attention"]


@checker("3.1 attention from Q, K, V")
def check_attention(fn):
    """``fn(Q, K, V)`` with Q (T, Dh), K (S, Dh), V (S, Dv) NumPy arrays must return the context
    ``softmax(Q K^T / sqrt(Dh)) V`` of shape (T, Dv), softmax over the keys (the last axis)."""
    ex = "3.1 attention from Q, K, V"
    rng = np.random.default_rng(31)
    # Square first (T = S = Dh = Dv = 4), so the usual slips run without a shape error and can be named.
    n = 4
    Q, K, V = (rng.normal(size=(n, n)) * 2 for _ in range(3))
    got = call_learner(ex, fn, Q.copy(), K.copy(), V.copy())
    arr = to_numpy(got)
    if arr is None:
        return failed(ex, f"Return an array; got {type(got).__name__}.")
    if arr.shape == (n, n) and np.isfinite(arr).all():
        scale = 1 / math.sqrt(n)
        raw = Q @ K.T  # (T, Dh) @ (Dh, S) -> (T, S)
        wrong = [
            (ref.softmax(raw * scale, axis=0) @ V,
             "You took the softmax over the queries (axis 0): each query's weights must sum to one over the keys, "
             "so normalise over the last axis."),
            (ref.softmax(raw) @ V, "You forgot the scaling: divide the scores by sqrt(d_head) before the softmax."),
            (ref.softmax(raw / n) @ V, "You divided the scores by d_head; divide by its square root, sqrt(d_head)."),
            (ref.softmax(raw * scale) @ V.T,
             "You multiplied the weights by V transposed: the context is weights @ V, (T, S) @ (S, Dv)."),
            (ref.softmax((K @ Q.T) * scale) @ V,
             "Your score matrix is K Q^T (one row per key); the scores are Q K^T, one row per query."),
            (raw * scale @ V, "You skipped the softmax: the scores must become weights before they mix the values."),
            (ref.softmax(raw * scale) @ K,
             "You mixed the key rows: keys only decide the weights; the context is a weighted sum of the value "
             "rows, weights @ V."),
        ]
        for candidate, message in wrong:
            if np.allclose(arr, candidate, atol=1e-9):
                return failed(ex, message)
    bad = compare_arrays(ex, got, ref.scaled_dot_product_attention(Q, K, V), what="The context")
    if bad is not None:
        return bad
    T, S, Dh, Dv = 3, 5, 8, 2  # then a non-square case: every axis has its own length
    Q, K, V = rng.normal(size=(T, Dh)), rng.normal(size=(S, Dh)), rng.normal(size=(S, Dv))
    got = call_learner(ex, fn, Q.copy(), K.copy(), V.copy())
    bad = compare_arrays(ex, got, ref.scaled_dot_product_attention(Q, K, V),
                         what=f"For T={T}, S={S}, d_head={Dh}, Dv={Dv} the context (T, Dv)")
    if bad is not None:
        return bad
    # scores of about +-1800 (exp overflows above ~709), and a row whose scores are all far below 0
    q_big = np.array([[30.0] * 4, [-30.0] * 4])
    k_big = np.array([[30.0] * 4, [29.0] * 4, [28.0] * 4])
    big = q_big, k_big, rng.normal(size=(3, 2))
    with np.errstate(over="ignore", invalid="ignore"):
        got = call_learner(ex, fn, *(a.copy() for a in big))
    bad = compare_arrays(ex, got, ref.scaled_dot_product_attention(*big), what="With scores in the thousands, the context")
    if bad is not None:
        return failed(ex, bad.message + " Use a stable softmax (subtract each row's maximum), e.g. selfattn.ref.softmax.")
    return passed(ex, "softmax(Q @ K.T / sqrt(d_head), axis=-1) @ V: one weighted sum of value rows per query.")


@checker("3.2 the weighted sum of values")
def check_weighted_sum(fn):
    """``fn(w, V)`` with one query's weights w (S,) and the values V (S, Dv) must return the (Dv,)
    vector ``sum_j w[j] * V[j]``, built as a sum of scaled value rows."""
    ex = "3.2 the weighted sum of values"
    rng = np.random.default_rng(32)
    S = Dv = 4  # square, so summing over the wrong axis runs and can be named
    w = ref.softmax(rng.normal(size=S) * 2)
    V = rng.normal(size=(S, Dv))
    got = call_learner(ex, fn, w.copy(), V.copy())
    arr = to_numpy(got)
    if arr is None:
        return failed(ex, f"Return an array; got {type(got).__name__}.")
    if arr.shape == (S, Dv):
        return failed(ex, f"You returned shape (S, Dv) = {arr.shape}: the scaled rows w[j] * V[j]. Now add them "
                          "up over the positions j (axis 0) to get one vector of length Dv.")
    if arr.shape == (Dv,) and np.isfinite(arr).all():
        wrong = [
            (V @ w, "You summed over the value features instead of over the positions: that is V @ w; the "
                    "weighted sum is w @ V = sum_j w[j] * V[j]."),
            (V.mean(axis=0), "You averaged the value rows without the weights: scale row j by w[j] first."),
            (V.sum(axis=0), "You added the value rows without the weights: scale row j by w[j] first."),
            ((w[:, None] * V).mean(axis=0), "You averaged the scaled rows (divided by S): the weights already sum "
                                            "to one, so add the rows w[j] * V[j] up without dividing."),
        ]
        for candidate, message in wrong:
            if np.allclose(arr, candidate, atol=1e-9):
                return failed(ex, message)
    bad = compare_arrays(ex, got, w @ V, what="The weighted sum")
    if bad is not None:
        return bad
    S, Dv = 6, 3
    w, V = ref.softmax(rng.normal(size=S)), rng.normal(size=(S, Dv))
    bad = compare_arrays(ex, call_learner(ex, fn, w.copy(), V.copy()), w @ V,
                         what=f"For S={S} positions and Dv={Dv} the weighted sum (Dv,)")
    if bad is not None:
        return bad
    return passed(ex, "sum_j w[j] * V[j] = w @ V: the output is a mixture of the value rows, with the weights "
                      "as mixing proportions.")


_EX3 = "3.3 self-attention from X"
_EX4 = "3.4 batched attention with its weights"


def _sdpa(Q, K, V, *, scale=True, axis=-1, scale_by=None):
    Dh = Q.shape[-1]
    scores = Q @ np.swapaxes(K, -1, -2)
    scores = scores / (scale_by if scale_by is not None else (math.sqrt(Dh) if scale else 1.0))
    weights = ref.softmax(scores, axis=axis)
    return weights @ V, weights


@checker(_EX3)
def check_self_attention(fn):
    """``fn(X, W_Q, W_K, W_V)`` with X (T, D) and the projections W_Q, W_K (D, Dh), W_V (D, Dv) (NumPy
    float64) must return the context (T, Dv) of self-attention: Q = X W_Q, K = X W_K, V = X W_V, then
    ``softmax(Q K^T / sqrt(Dh)) V``."""
    rng = np.random.default_rng(33)
    T, D, Dh, Dv = 5, 6, 4, 3
    X = rng.normal(size=(T, D))
    W_Q, W_K, W_V = rng.normal(size=(D, Dh)), rng.normal(size=(D, Dh)), rng.normal(size=(D, Dv))
    got = call_learner(_EX3, fn, X.copy(), W_Q.copy(), W_K.copy(), W_V.copy())
    Q, K, V = X @ W_Q, X @ W_K, X @ W_V
    expected = _sdpa(Q, K, V)[0]
    arr = to_numpy(got)
    if arr is not None and arr.shape == (T, D) and np.allclose(arr, _sdpa(Q, K, X)[0], atol=1e-9):
        return failed(_EX3, "Your values are X itself (the context has X's width D): compute V = X W_V.")
    mistakes = [
        (lambda: _sdpa(Q, K, V, scale=False)[0], "You forgot the scale: divide the scores by sqrt(Dh) = sqrt(W_Q.shape[1]) before the softmax."),
        (lambda: _sdpa(Q, K, V, scale_by=math.sqrt(D))[0], "You scaled by sqrt(D), the width of X; scale by sqrt(Dh), the width of the queries and keys."),
        (lambda: _sdpa(Q, K, V, axis=0)[0], "The softmax ran over the queries (axis 0): each query's weights over the keys must sum to 1, so take it over the last axis."),
        (lambda: _sdpa(Q, Q, V)[0], "Your keys are the queries (X W_Q): compute K = X W_K."),
        (lambda: _sdpa(K, Q, V)[0], "Queries and keys are swapped: the scores are Q K^T with Q = X W_Q (one row per query)."),
    ]  # fmt: skip
    return judge(_EX3, got, expected, mistakes, what="The context", atol=1e-9,
                 right="Q, K, V = X W_Q, X W_K, X W_V; softmax(Q K^T / sqrt(Dh)) V: every position asks, every "
                       "position answers.")  # fmt: skip


@checker(_EX4)
def check_batched_attention(fn):
    """``fn(Q, K, V)`` for torch float64 Q (B, T, Dh), K (B, S, Dh), V (B, S, Dv) must return the pair
    ``(context (B, T, Dv), weights (B, T, S))`` of scaled dot-product attention, each batch element on its
    own."""
    gen = torch.Generator().manual_seed(34)
    B, T, S, Dh, Dv = 2, 3, 4, 5, 2
    Q, K, V = (torch.randn(B, n, d, generator=gen, dtype=torch.float64) for n, d in ((T, Dh), (S, Dh), (S, Dv)))
    got = call_learner(_EX4, fn, Q.clone(), K.clone(), V.clone())
    if not isinstance(got, (tuple, list)) or len(got) != 2:
        return failed(_EX4, f"Return a pair (context, weights); got {type(got).__name__}"
                            f"{' of length ' + str(len(got)) if isinstance(got, (tuple, list)) else ''}.")  # fmt: skip
    context, weights = got
    q, k, v = Q.numpy(), K.numpy(), V.numpy()
    exp_context, exp_weights = _sdpa(q, k, v)
    c_arr, w_arr = to_numpy(context), to_numpy(weights)
    if c_arr is not None and w_arr is not None and c_arr.shape == exp_weights.shape and w_arr.shape == exp_context.shape:
        return failed(_EX4, "The pair is in the wrong order: return (context, weights), the context first.")
    wrong_weights = [
        (lambda: _sdpa(q, k, v, scale=False)[1], "You forgot the scale: divide the scores by sqrt(Dh) before the softmax."),
        (lambda: _sdpa(q, k, v, scale_by=Dh)[1], "You divided the scores by Dh; divide by sqrt(Dh)."),
        (lambda: _sdpa(q, k, v, axis=-2)[1], "The softmax ran over the queries (dim=-2): each query's weights over the keys must sum to 1, so use dim=-1."),
    ]  # fmt: skip
    verdict = judge(_EX4, weights, exp_weights, wrong_weights, what="The weights", atol=1e-9)
    if not verdict:
        return verdict
    return judge(_EX4, context, exp_context, [], what="The context",
                 atol=1e-9, right="scores = Q @ K.transpose(-2, -1) / sqrt(Dh), weights = softmax over dim=-1, "
                                  "context = weights @ V: the batch axis rides along in every product.")  # fmt: skip
