"""Checks for the exercises of chapter 05 (cross-attention and padding).

5.1 a key-padding keep-mask from the true lengths; 5.2 cross-attention from one sequence to another;
5.3 batched cross-attention under a key padding mask; 5.4 a mean over the real tokens only.
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
from ._judge import judge

__all__ = ["check_padding_mask", "check_cross_attention", "check_masked_cross_attention", "check_mean_pool"]

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


_EX3 = "5.3 cross-attention with a key padding mask"
_EX4 = "5.4 mean pooling over the real tokens"


def _masked_attention(Q, K, V, keep, *, scale=True, fill=None, after=False):
    scores = Q @ np.swapaxes(K, -1, -2) / (math.sqrt(Q.shape[-1]) if scale else 1.0)
    if after:
        e = np.exp(scores - scores.max(-1, keepdims=True))
        return (e / e.sum(-1, keepdims=True) * keep) @ V
    if fill is not None:
        scores = np.where(keep, scores, fill)
        e = np.exp(scores - scores.max(-1, keepdims=True))
        return e / e.sum(-1, keepdims=True) @ V
    return ref.softmax(scores, mask=np.broadcast_to(keep, scores.shape)) @ V


@checker(_EX3)
def check_masked_cross_attention(fn):
    """``fn(Q, K, V, key_keep)`` for torch float64 Q (B, T, Dh) from the decoder, K, V (B, S, Dh) from the
    padded encoder output and a boolean key_keep (B, S) (True = a real source token) must return the context
    (B, T, Dh): scaled dot-product attention in which no query reads a pad key."""
    gen = torch.Generator().manual_seed(53)
    B, T, S, Dh = 2, 3, 5, 4
    Q, K, V = (torch.randn(B, n, Dh, generator=gen, dtype=torch.float64) for n in (T, S, S))
    V[0, 4:] += 10.0  # the pad keys' values are large: reading them shows
    V[1, 3:] += 10.0
    key_keep = torch.tensor([[True, True, True, True, False], [True, True, True, False, False]])
    got = call_learner(_EX3, fn, Q.clone(), K.clone(), V.clone(), key_keep.clone())
    q, k, v, kk = Q.numpy(), K.numpy(), V.numpy(), key_keep.numpy()[:, None, :]
    expected = _masked_attention(q, k, v, kk)
    mistakes = [
        (lambda: _masked_attention(q, k, v, np.ones_like(kk)), "The padding mask is not applied: queries read the pad "
                                                               "keys of sequence 1. Set their scores to -inf before the softmax."),
        (lambda: _masked_attention(q, k, v, ~kk), "The polarity is reversed: True in key_keep marks a real token, which "
                                                  "may be read; you kept the pad keys."),
        (lambda: _masked_attention(q, k, v, kk, fill=0.0), "You set the pad keys' scores to 0, not to -inf: exp(0) = 1, "
                                                          "so they still get weight. Use masked_fill(~key_keep[:, None, :], float('-inf'))."),
        (lambda: _masked_attention(q, k, v, kk, after=True), "You masked the weights after the softmax: the pad keys get "
                                                             "0 but the rows no longer sum to 1. Mask the scores (-inf) before the softmax."),
        (lambda: _masked_attention(q, k, v, kk, scale=False), "You forgot the scale: divide the scores by sqrt(Dh) before the softmax."),
    ]  # fmt: skip
    return judge(_EX3, got, expected, mistakes, what="The context", atol=1e-9,
                 right="scores.masked_fill(~key_keep[:, None, :], -inf): the mask is (B, 1, S), one row per "
                       "sequence, shared by all its queries.")  # fmt: skip


@checker(_EX4)
def check_mean_pool(fn):
    """``fn(H, keep)`` for torch float64 encoder outputs H (B, S, D) and a boolean keep (B, S) (True = a real
    token) must return the (B, D) mean of each sequence's real token vectors, the padding left out."""
    gen = torch.Generator().manual_seed(54)
    B, S, D = 3, 5, 4
    H = torch.randn(B, S, D, generator=gen, dtype=torch.float64)
    keep = torch.tensor([[True] * 5, [True, True, False, False, False], [True, True, True, True, False]])
    H[~keep] += 7.0  # padding vectors far from the real ones
    got = call_learner(_EX4, fn, H.clone(), keep.clone())
    h, kk = H.numpy(), keep.numpy()[:, :, None]
    counts = kk.sum(axis=1)
    expected = (h * kk).sum(axis=1) / counts
    mistakes = [
        (lambda: h.mean(axis=1), "You averaged over every position, padding included: multiply by the mask and "
                                 "divide by the number of real tokens, keep.sum(dim=1)."),
        (lambda: (h * kk).sum(axis=1) / S, "You left the padding out of the sum but divided by S; divide by the "
                                           "number of real tokens of each sequence, keep.sum(dim=1, keepdim=True)."),
        (lambda: (h * kk).sum(axis=1), "You summed the real tokens but did not divide by their number."),
        (lambda: (h * ~kk).sum(axis=1) / np.maximum((~kk).sum(axis=1), 1), "The polarity is reversed: you averaged the "
                                                                          "padding; True in keep marks a real token."),
    ]  # fmt: skip
    arr = to_numpy(got)
    if arr is not None and arr.shape == (B, S):
        return failed(_EX4, "The result has shape (B, S): you averaged over the features (dim=-1); average over the "
                            "positions (dim=1), one D-vector per sequence.")  # fmt: skip
    return judge(_EX4, got, expected, mistakes, what="The pooled vectors", atol=1e-9,
                 right="(H * keep[..., None]).sum(1) / keep.sum(1, keepdim=True): padding changes nothing.")
