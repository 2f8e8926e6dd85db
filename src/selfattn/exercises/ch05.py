"""Checks for the exercises of chapter 05 (cross-attention and padding).

5.1 a key-padding keep-mask from the true lengths; 5.2 cross-attention from one sequence to another.
The checks name the usual mistakes: the other library's polarity, an off-by-one at the last real
token, ignoring the padded length S, keys and values taken from the queries' sequence, queries
from the wrong one, the weights returned instead of the context, scaling by d_model.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from .. import ref
from . import bool_mask_problem, call_learner, checker, compare_arrays, failed, passed, to_numpy

__all__ = ["check_padding_mask", "check_cross_attention"]

_EX1 = "5.1 padding mask"
_EX2 = "5.2 cross-attention"


@checker(_EX1)
def check_padding_mask(fn):
    """``fn(lengths, S)`` for a list of B lengths and a padded length S must return a (B, S) boolean
    keep-mask: True at the real tokens ``j < lengths[b]``, False at the padding."""
    for lengths, S in (([3, 5, 1], 6), ([4, 4], 4), ([2, 7, 0, 5], 9)):
        got = call_learner(_EX1, fn, list(lengths), S)
        problem = bool_mask_problem(got)
        if problem is not None:
            return failed(_EX1, problem)
        arr = to_numpy(got)
        if arr is None:
            return failed(_EX1, f"Return a tensor; got {type(got).__name__}.")
        B = len(lengths)
        if arr.shape == (B, 1, 1, S):  # the broadcastable layout is fine too
            arr = arr.reshape(B, S)
        if arr.shape == (S, B) and S != B:
            return failed(_EX1, f"The mask is transposed: it should have one row per sequence, shape (B, S) = "
                                f"({B}, {S}); got {arr.shape}.")  # fmt: skip
        if arr.shape != (B, S):
            if arr.ndim == 2 and arr.shape[0] == B and arr.shape[1] == max(lengths):
                return failed(_EX1, f"Your mask has max(lengths) = {max(lengths)} columns; it must have S = {S}, "
                                    "the padded length of the batch (it may be longer than the longest sequence).")  # fmt: skip
            return failed(
                _EX1,
                f"For lengths {lengths} and S={S} the mask should have shape ({B}, {S}); got {arr.shape}.",
            )
        mask = arr.astype(bool)
        expected = np.arange(S)[None, :] < np.asarray(lengths)[:, None]
        if np.array_equal(mask, expected):
            continue
        if np.array_equal(mask, ~expected):
            return failed(_EX1, "The polarity is reversed: True must mark the real tokens (may attend). True = "
                                "padding is the convention of nn.MultiheadAttention's key_padding_mask; convert "
                                "such a mask with selfattn.from_blocked_mask.")  # fmt: skip
        if np.array_equal(mask, np.arange(S)[None, :] <= np.asarray(lengths)[:, None]):
            return failed(_EX1, "Off by one: a sequence of length L has real tokens at positions 0 .. L-1, so "
                                "keep j < L, not j <= L (you let each sequence see one padding token).")  # fmt: skip
        if np.array_equal(mask, np.arange(S)[None, :] < np.asarray(lengths)[:, None] - 1):
            return failed(
                _EX1, "Off by one: you hide the last real token. Keep j < L, not j < L - 1."
            )
        b = int(np.argwhere((mask != expected).any(axis=1))[0, 0])
        return failed(_EX1, f"Sequence {b} has length {lengths[b]}: its row should be {expected[b].astype(int).tolist()}; "
                            f"got {mask[b].astype(int).tolist()}.")  # fmt: skip
    return passed(
        _EX1,
        "torch.arange(S)[None, :] < lengths[:, None]: the same as selfattn.padding_mask(lengths, S).",
    )


def _cross_case():
    rng = np.random.default_rng(5)
    T, S, D, Dh = 3, 5, 8, 4
    X_q, X_kv = rng.normal(size=(T, D)), rng.normal(size=(S, D))
    W_Q, W_K, W_V = (rng.normal(size=(D, Dh)) for _ in range(3))
    return X_q, X_kv, W_Q, W_K, W_V


@checker(_EX2)
def check_cross_attention(fn):
    """``fn(X_q, X_kv, W_Q, W_K, W_V)`` (float64 tensors (T, D), (S, D), three (D, Dh)) must return the
    context (T, Dh) of cross-attention: queries from ``X_q``, keys and values from ``X_kv``."""
    X_q, X_kv, W_Q, W_K, W_V = _cross_case()
    T, S, Dh = X_q.shape[0], X_kv.shape[0], W_Q.shape[1]
    args = [torch.from_numpy(a.copy()) for a in (X_q, X_kv, W_Q, W_K, W_V)]
    got = call_learner(_EX2, fn, *args)
    arr = to_numpy(got)
    if arr is None:
        return failed(_EX2, f"Return a tensor; got {type(got).__name__}.")
    expected = ref.scaled_dot_product_attention(X_q @ W_Q, X_kv @ W_K, X_kv @ W_V)
    if arr.shape == (T, S):
        return failed(_EX2, f"You returned a (T, S) = ({T}, {S}) matrix: the weights. Multiply them by the values "
                            "V = X_kv @ W_V to get the context (T, Dh).")  # fmt: skip
    if arr.shape == (S, Dh):
        return failed(_EX2, f"Your output has S = {S} rows, one per key. There must be one row per query "
                            f"(T = {T}): the queries come from X_q, the keys and values from X_kv.")  # fmt: skip
    if arr.shape != (T, Dh):
        return failed(
            _EX2, f"The context should have shape (T, Dh) = ({T}, {Dh}); got {arr.shape}."
        )
    if not np.isfinite(arr).all():
        return failed(_EX2, "Your context contains NaN or inf.")
    if np.allclose(
        arr, ref.scaled_dot_product_attention(X_q @ W_Q, X_q @ W_K, X_q @ W_V), atol=1e-6
    ):
        return failed(_EX2, "This is self-attention on X_q: the keys and values must come from the other "
                            "sequence, X_kv (K = X_kv @ W_K, V = X_kv @ W_V).")  # fmt: skip
    wrong_scale = ref.scaled_dot_product_attention(
        X_q @ W_Q, X_kv @ W_K, X_kv @ W_V, scale=1 / math.sqrt(X_q.shape[1])
    )
    if np.allclose(arr, wrong_scale, atol=1e-6):
        return failed(_EX2, "You scaled the scores by 1/sqrt(d_model); scale by 1/sqrt(d_head), the width of "
                            "the queries and keys (here Dh = 4).")  # fmt: skip
    if np.allclose(
        arr,
        ref.scaled_dot_product_attention(X_q @ W_Q, X_kv @ W_K, X_kv @ W_V, scale=1.0),
        atol=1e-6,
    ):
        return failed(
            _EX2, "You did not scale the scores: divide them by sqrt(d_head) before the softmax."
        )
    scores = (X_q @ W_Q) @ (X_kv @ W_K).T / math.sqrt(Dh)
    if np.allclose(arr, ref.softmax(scores, axis=0) @ (X_kv @ W_V), atol=1e-6):
        return failed(_EX2, "The softmax runs over the wrong axis: each query's weights over the S keys must sum "
                            "to one (softmax over the last axis of the (T, S) scores).")  # fmt: skip
    wrong = compare_arrays(_EX2, got, expected, what="Your context", atol=1e-6, rtol=1e-6)
    if wrong is not None:
        return wrong
    return passed(_EX2, "softmax((X_q W_Q)(X_kv W_K)^T / sqrt(d_head)) (X_kv W_V): the same function as "
                        "self-attention, with the keys and values read from the other sequence.")  # fmt: skip
