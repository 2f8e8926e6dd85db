"""Checks for the exercises of chapter 06 (multi-head attention).

Expected values come from NumPy (``selfattn.ref``); the typical mistakes are recognised by
computing them too and naming the one the learner's answer matches.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from .. import ref
from . import call_learner, checker, compare_arrays, failed, passed, to_numpy
from ._judge import judge

__all__ = ["check_split_merge_heads", "check_multi_head_attention", "check_in_proj_weight", "check_head_contributions"]

_B, _T, _D, _H = 2, 5, 12, 3  # distinct sizes, so that a swapped axis shows in the shape
_DH = _D // _H


def _split_ref(x: np.ndarray, n_heads: int) -> np.ndarray:
    B, T, D = x.shape
    return x.reshape(B, T, n_heads, D // n_heads).transpose(
        0, 2, 1, 3
    )  # (B, T, D) -> (B, H, T, Dh)


def _merge_ref(x: np.ndarray) -> np.ndarray:
    B, H, T, Dh = x.shape
    return x.transpose(0, 2, 1, 3).reshape(B, T, H * Dh)  # (B, H, T, Dh) -> (B, T, D)


@checker("6.1 split and merge heads")
def check_split_merge_heads(split_fn, merge_fn):
    """``split_fn(x, n_heads)``: (B, T, D) -> (B, H, T, Dh); ``merge_fn(x)``: (B, H, T, Dh) -> (B, T, D),
    its inverse. Both take and return torch tensors."""
    ex = "6.1 split and merge heads"
    x = torch.arange(_B * _T * _D, dtype=torch.float64).reshape(_B, _T, _D)  # every entry distinct
    xn = x.numpy()
    got = to_numpy(call_learner(ex, split_fn, x.clone(), _H))
    if got is None:
        return failed(ex, "split_heads should return a tensor.")
    if got.shape == (_B, _T, _H, _DH):
        return failed(
            ex,
            "split_heads returns shape (B, T, H, Dh): you reshaped but forgot the transpose "
            "that puts the head axis before the positions, (B, H, T, Dh).",
        )
    if got.shape == (_B, _H, _T, _DH) and np.array_equal(got, xn.reshape(_B, _H, _T, _DH)):
        return failed(
            ex,
            "split_heads reshaped (B, T, D) straight to (B, H, T, Dh): the shape is right but "
            "each 'head' now holds features of other positions. Reshape to (B, T, H, Dh) first, "
            "then transpose positions and heads.",
        )
    bad = compare_arrays(
        ex, got, _split_ref(xn, _H), what="split_heads(x, n_heads)", atol=0, rtol=0
    )
    if bad is not None:
        return bad
    heads = torch.arange(_B * _H * _T * _DH, dtype=torch.float64).reshape(_B, _H, _T, _DH)
    hn = heads.numpy()
    merged = to_numpy(call_learner(ex, merge_fn, heads.clone()))
    if merged is None:
        return failed(ex, "merge_heads should return a tensor.")
    if merged.shape == (_B, _T, _D) and np.array_equal(merged, hn.reshape(_B, _T, _D)):
        return failed(
            ex,
            "merge_heads reshapes (B, H, T, Dh) to (B, T, D) without transposing back: row t "
            "then mixes several positions of one head instead of position t of every head. "
            "Transpose to (B, T, H, Dh) before the reshape.",
        )
    bad = compare_arrays(ex, merged, _merge_ref(hn), what="merge_heads(x)", atol=0, rtol=0)
    if bad is not None:
        return bad
    round_trip = to_numpy(call_learner(ex, merge_fn, call_learner(ex, split_fn, x.clone(), _H)))
    bad = compare_arrays(ex, round_trip, xn, what="merge_heads(split_heads(x))", atol=0, rtol=0)
    if bad is not None:
        return bad
    return passed(
        ex,
        "Split = reshape then transpose; merge = transpose back then reshape. They are inverses.",
    )


def _mha_variant(
    X, W, n_heads: int, *, scale: float | None, merge_without_transpose=False, use_W_O=True
):
    """Multi-head attention in NumPy with one knob per typical mistake: (B, T, D) -> (out, weights)."""
    Q, K, V = (_split_ref(X @ W[name], n_heads) for name in ("W_Q", "W_K", "W_V"))  # (B, H, T, Dh)
    context, weights = ref.scaled_dot_product_attention(Q, K, V, scale=scale, return_weights=True)
    B, H, T, Dh = context.shape
    concat = context.reshape(B, T, H * Dh) if merge_without_transpose else _merge_ref(context)
    return (concat @ W["W_O"] if use_W_O else concat), weights


# Float32 rounding (a right answer computed in float32 is off by ~1e-6 here) passes; every typical
# mistake is off by far more than this.
_ATOL, _RTOL = 1e-5, 1e-5


@checker("6.2 multi-head attention")
def check_multi_head_attention(fn):
    """``fn(X, W_Q, W_K, W_V, W_O, n_heads)`` -> ``(out (B, T, D), weights (B, H, T, T))`` for torch
    float64 inputs, with scores scaled by 1/sqrt(d_head), d_head = D // n_heads."""
    ex = "6.2 multi-head attention"
    gen = torch.Generator().manual_seed(6)
    X = torch.randn(_B, _T, _D, generator=gen, dtype=torch.float64)
    W = {
        n: torch.randn(_D, _D, generator=gen, dtype=torch.float64)
        for n in ("W_Q", "W_K", "W_V", "W_O")
    }
    result = call_learner(ex, fn, X.clone(), *(w.clone() for w in W.values()), _H)
    if not (isinstance(result, (tuple, list)) and len(result) == 2):
        return failed(ex, f"Return a pair (out, weights); got {type(result).__name__}.")
    out, weights = to_numpy(result[0]), to_numpy(result[1])
    Xn, Wn = X.numpy(), {k: v.numpy() for k, v in W.items()}
    exp_out, exp_weights = ref.multi_head_attention(Xn, Xn, *Wn.values(), _H, return_weights=True)
    if weights is not None and weights.shape == exp_weights.shape and np.isfinite(weights).all():
        for wrong_scale, words in ((1 / math.sqrt(_D), "you scaled by sqrt(d_model), not sqrt(d_head)"),
                                   (1.0, "you did not scale the scores at all")):  # fmt: skip
            _, w_bad = _mha_variant(Xn, Wn, _H, scale=wrong_scale)
            if np.allclose(weights, w_bad, atol=_ATOL):
                return failed(
                    ex,
                    f"The weights are off: {words}. Each head's scores are "
                    f"Q_h K_h^T / sqrt(d_head), with d_head = D / H = {_DH}.",
                )
    if (
        weights is not None
        and weights.shape == exp_weights.shape
        and not np.allclose(weights, exp_weights, atol=_ATOL)
        and np.allclose(np.swapaxes(weights, -1, -2), exp_weights, atol=_ATOL)
    ):
        return failed(
            ex,
            "Your weights are transposed: entry (t, s) must be how much query t reads key s, so each "
            "row (the last axis) is one query's distribution over the keys.",
        )
    bad = compare_arrays(ex, weights, exp_weights, what="weights", atol=_ATOL, rtol=_RTOL)
    if bad is not None:
        return bad
    if out is not None and out.shape == exp_out.shape:
        if np.allclose(
            out,
            _mha_variant(Xn, Wn, _H, scale=None, merge_without_transpose=True)[0],
            atol=_ATOL,
            rtol=_RTOL,
        ):
            return failed(
                ex,
                "The weights are right but out is not: you merged the heads without transposing "
                "back to (B, T, H, Dh) before reshaping to (B, T, D).",
            )
        if np.allclose(
            out, _mha_variant(Xn, Wn, _H, scale=None, use_W_O=False)[0], atol=_ATOL, rtol=_RTOL
        ):
            return failed(
                ex, "out is the concatenation of the heads: multiply it by W_O as the last step."
            )
    bad = compare_arrays(ex, out, exp_out, what="out", atol=_ATOL, rtol=_RTOL)
    if bad is not None:
        return bad
    return passed(ex, "Project, split, attend per head with 1/sqrt(d_head), merge, then W_O.")


_EX3 = "6.3 PyTorch's fused in_proj_weight"
_EX4 = "6.4 each head's contribution to the output"


@checker(_EX3)
def check_in_proj_weight(fn):
    """``fn(W_Q, W_K, W_V)`` for three (D, D) float64 tensors in this course's layout (x @ W) must return the
    (3D, D) ``in_proj_weight`` of ``torch.nn.MultiheadAttention``: the rows W_Q^T, then W_K^T, then W_V^T
    (``nn.Linear`` stores (out, in))."""
    gen = torch.Generator().manual_seed(63)
    W_Q, W_K, W_V = (torch.randn(_D, _D, generator=gen, dtype=torch.float64) for _ in range(3))
    got = call_learner(_EX3, fn, W_Q.clone(), W_K.clone(), W_V.clone())
    q, k, v = W_Q.numpy(), W_K.numpy(), W_V.numpy()
    expected = np.concatenate([q.T, k.T, v.T], axis=0)
    arr = to_numpy(got)
    if arr is not None and arr.shape == (_D, 3 * _D):
        return failed(_EX3, f"The shape is (D, 3D) = {arr.shape}: you stacked along the columns; in_proj_weight "
                            "is (3D, D), the three blocks one below the other (torch.cat(..., dim=0)).")  # fmt: skip
    mistakes = [
        (np.concatenate([q, k, v], axis=0), "The blocks are not transposed: nn.Linear stores its weight as (out, in) "
                                            "and computes x W^T, so each block is W^T (W_Q.T, W_K.T, W_V.T)."),
        (np.concatenate([k.T, q.T, v.T], axis=0), "The order is wrong: PyTorch's rows are queries first, then keys, then values."),
        (np.concatenate([v.T, k.T, q.T], axis=0), "The order is reversed: PyTorch's rows are W_Q^T, W_K^T, W_V^T, in that order."),
    ]  # fmt: skip
    return judge(_EX3, got, expected, mistakes, what="in_proj_weight", atol=0,
                 right="torch.cat([W_Q.T, W_K.T, W_V.T], dim=0): what MultiHeadAttention.to_torch writes.")


@checker(_EX4)
def check_head_contributions(fn):
    """``fn(context, W_O)`` for the per-head contexts (B, H, T, Dh) and W_O (D, D), D = H * Dh (float64
    tensors, heads concatenated in order) must return the (B, H, T, D) contributions ``context[:, h] @
    W_O[h*Dh:(h+1)*Dh]``, whose sum over the heads is the merged context times W_O."""
    gen = torch.Generator().manual_seed(64)
    context = torch.randn(_B, _H, _T, _DH, generator=gen, dtype=torch.float64)
    W_O = torch.randn(_D, _D, generator=gen, dtype=torch.float64)
    got = call_learner(_EX4, fn, context.clone(), W_O.clone())
    c, w = context.numpy(), W_O.numpy()
    blocks = w.reshape(_H, _DH, _D)  # (H, Dh, D): the rows of head h
    expected = np.einsum("bhtd,hde->bhte", c, blocks)
    arr = to_numpy(got)
    if arr is not None and arr.shape == (_B, _H, _T, _DH):
        return failed(_EX4, "Each contribution has Dh columns: you sliced the columns of W_O. Head h's block is a "
                            "slice of rows, W_O[h * Dh:(h + 1) * Dh] (Dh, D), so each head writes a D-vector.")  # fmt: skip
    if arr is not None and arr.shape == (_B, _T, _D):
        return failed(_EX4, "You returned the summed output (B, T, D); return one contribution per head, "
                            "(B, H, T, D), without summing over H.")  # fmt: skip
    interleaved = np.stack([w[h::_H] for h in range(_H)])  # rows h, h + H, ...
    mistakes = [
        (np.einsum("bhtd,hde->bhte", c, interleaved), "You took every H-th row of W_O (W_O[h::H]): the heads are "
                                                      "concatenated in blocks, so head h owns the contiguous rows "
                                                      "h * Dh to (h + 1) * Dh."),
        (expected / _H, "You divided by H: the output is the sum of the heads' contributions, not their mean."),
        (np.einsum("bhtd,hde->bhte", c, blocks[::-1]), "The heads' blocks are in reverse order: head h owns rows "
                                                      "h * Dh to (h + 1) * Dh."),
    ]  # fmt: skip
    return judge(_EX4, got, expected, mistakes, what="The contributions", atol=1e-9,
                 right="context[:, h] @ W_O[h * Dh:(h + 1) * Dh] for each head; their sum over h is the "
                       "layer's output before b_O.")  # fmt: skip
