"""The NumPy float64 reference for softmax, masks and scaled dot-product attention.

Written to read like the equations in the text (chapters 02-04), not to be fast. It is the oracle
that the torch path is tested against, and it shares no code with it.
"""

from __future__ import annotations

import numpy as np

from .._validate import (
    require_array,
    require_bool_mask,
    require_broadcastable,
    require_flag,
    require_min_rank,
    require_positive_int,
    require_qkv,
    require_scale,
)

__all__ = ["softmax", "causal_mask", "scaled_dot_product_attention"]

ALIGNMENTS = ("top_left", "bottom_right")


def softmax(x, axis: int = -1, mask=None) -> np.ndarray:
    """Numerically stable softmax: ``exp(x_i - max x) / sum_j exp(x_j - max x)`` along ``axis``.

    Args:
        x: array of real numbers, any shape; converted to float64.
        axis: the axis that sums to one.
        mask: optional boolean array broadcastable to ``x``; False entries get weight exactly 0
            whatever ``x`` holds there (even NaN or inf). A slice with no True entry is all zeros.

    Returns:
        float64 array of ``x``'s shape; every slice along ``axis`` sums to 1 (or is all zeros
        when fully masked).

    Raises:
        TypeError: ``x`` is not numeric, ``mask`` is not boolean, ``axis`` is not an int.
        ValueError: ``mask`` does not broadcast to ``x``; ``axis`` out of range for ``x``.

    Source: chapter 02; subtracting the maximum does not change the result because
    softmax(x) = softmax(x - c) for any constant c.
    """
    x = require_array("x", x)
    if isinstance(axis, (bool, np.bool_)) or not isinstance(axis, (int, np.integer)):
        raise TypeError(f"axis must be an int (the axis that sums to one); got {axis!r} ({type(axis).__name__})")
    if not -x.ndim <= axis < x.ndim:
        raise ValueError(f"axis must be in [-{x.ndim}, {x.ndim}) for x of shape {x.shape}; got {axis}")
    if mask is None:
        mask = np.ones(x.shape, dtype=bool)
    else:
        require_bool_mask("mask", mask)
        mask = np.asarray(mask)
        require_broadcastable("mask", mask, x.shape, "the shape of x")
        mask = np.broadcast_to(mask, x.shape)
    if x.size == 0:  # nothing to normalise (as torch.softmax of an empty tensor): an empty result
        return np.zeros(x.shape)
    # Replace, do not add: a masked entry must not take part even if it is NaN or inf.
    x = np.where(mask, x, -np.inf)
    row_max = np.max(x, axis=axis, keepdims=True)
    # A fully masked slice has max -inf: shift it by 0 instead. Only -inf is special-cased, so a NaN
    # (or +inf) among the visible entries still gives NaN, never a silent zero row.
    row_max = np.where(row_max == -np.inf, 0.0, row_max)
    with np.errstate(invalid="ignore", over="ignore"):
        e = np.where(mask, np.exp(x - row_max), 0.0)
        total = np.sum(e, axis=axis, keepdims=True)
        weights = np.divide(e, total, out=np.zeros_like(e), where=total != 0)
    # A NaN among a slice's visible entries makes its total NaN; the masked entries stay exactly 0.
    return np.where(mask, weights, 0.0)


def causal_mask(T: int, S: int | None = None, *, alignment: str | None = None) -> np.ndarray:
    """Boolean keep-mask of shape (T, S): True where query i may attend to key j.

    With ``T == S`` (or ``S`` omitted) it is lower triangular, diagonal included: every token sees
    itself and the past. With ``T != S`` the alignment must be given:

    - ``"top_left"``: query i sees keys ``j <= i`` (the masks of PyTorch's ``torch.tril``);
    - ``"bottom_right"``: query i sees keys ``j <= i + S - T``, so the last query sees every key, as
      in decoding with a cache, where the T queries are the newest of S positions.

    Raises:
        TypeError / ValueError: T or S not a positive int; ``alignment`` missing when T != S, or
        not one of ``"top_left"``, ``"bottom_right"``.

    Source: chapter 04.
    """
    T = require_positive_int("T", T)
    S = T if S is None else require_positive_int("S", S)
    if alignment is not None and alignment not in ALIGNMENTS:
        raise ValueError(f"alignment must be one of {ALIGNMENTS} or None; got {alignment!r}")
    if T != S and alignment is None:
        raise ValueError(
            f"a causal mask with T={T} queries and S={S} keys needs an explicit alignment: "
            "'top_left' (query i sees keys <= i) or 'bottom_right' (query i sees keys <= i + S - T)"
        )
    offset = S - T if alignment == "bottom_right" else 0
    i = np.arange(T)[:, None]
    j = np.arange(S)[None, :]
    return j <= i + offset


def scaled_dot_product_attention(q, k, v, mask=None, *, bias=None, scale=None, return_weights=False):
    """``softmax(q k^T * scale + bias, masked) v`` in float64 (Vaswani et al. 2017, eq. 1).

    Args:
        q: queries, shape (..., T, Dh).
        k: keys, shape (..., S, Dh).
        v: values, shape (..., S, Dv).
        mask: optional boolean keep-mask broadcastable to (..., T, S); True = may attend.
        bias: optional additive float bias broadcastable to (..., T, S), added to the scores
            before masking.
        scale: multiplier of the scores; default ``1 / sqrt(Dh)``, the per-head key width.
        return_weights: also return the (..., T, S) softmax weights.

    Returns:
        ``context`` of shape (..., T, Dv), float64; and ``weights`` when asked. A query with no
        visible key gets a zero weight row and a zero context row.

    Raises:
        TypeError: non-numeric input, a non-boolean mask.
        ValueError: wrong ranks, mismatched shapes, a mask or bias that does not broadcast,
        a non-positive scale.

    Source: chapter 03 (unmasked) and chapter 04 (masked).
    """
    return_weights = require_flag("return_weights", return_weights)
    q, k, v = require_array("q", q), require_array("k", k), require_array("v", v)
    require_qkv(q, k, v)
    require_scale(scale)
    d_head = q.shape[-1]
    T, S = q.shape[-2], k.shape[-2]
    target = q.shape[:-2] + (T, S)
    if scale is None:
        scale = 1.0 / np.sqrt(d_head)

    if bias is not None:
        bias = require_array("bias", bias)
        require_broadcastable("bias", bias, target, "(..., T, S) =")
    # An inf or NaN stored at a masked key makes its scores inf - inf = NaN; the mask replaces those
    # scores below, so NumPy's "invalid value" warning is silenced here rather than the result.
    with np.errstate(invalid="ignore", over="ignore"):
        scores = q @ np.swapaxes(k, -1, -2) * scale  # (..., T, Dh) @ (..., Dh, S) -> (..., T, S)
        if bias is not None:
            scores = scores + bias
    if mask is None:
        mask = np.ones(target, dtype=bool)
    else:
        require_bool_mask("mask", mask)
        require_min_rank("mask", np.asarray(mask), 2, "(..., T, S)")
        require_broadcastable("mask", np.asarray(mask), target, "(..., T, S) =")
        mask = np.broadcast_to(np.asarray(mask), target)
    weights = softmax(scores, axis=-1, mask=mask)
    if np.isfinite(v).all():
        context = weights @ v  # (..., T, S) @ (..., S, Dv) -> (..., T, Dv)
    else:
        # 0 * NaN is NaN: sum over visible keys only, so a value stored at a masked position
        # cannot reach the output. (Slow, (..., T, S, Dv) memory; only taken for non-finite v.)
        visible_v = np.where(mask[..., None], v[..., None, :, :], 0.0)  # (..., T, S, Dv)
        context = np.einsum("...ts,...tsd->...td", weights, visible_v)
    return (context, weights) if return_weights else context
