"""The online softmax and attention computed one block of keys at a time, in NumPy float64.

The softmax of a row needs its maximum and its sum, both known only once every entry has been seen.
The online softmax (Milakov and Gimelshein 2018) keeps a *running* maximum ``m`` and a running sum
``l`` of ``exp(x - m)``; when a new block raises the maximum, everything accumulated so far is
rescaled by ``exp(m_old - m_new)``. Attention accumulates ``exp(s - m) @ V`` the same way, so the
full (T, S) score matrix never exists (Dao et al. 2022, FlashAttention, Algorithm 1). This is the
readable oracle for :func:`selfattn.efficient.tiled_attention`. Introduced in chapter 10.
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

__all__ = ["OnlineSoftmaxState", "online_softmax_update", "online_softmax", "logsumexp", "online_attention"]


class OnlineSoftmaxState:
    """Running maximum ``m`` and running sum ``l = sum exp(x - m)`` of the entries seen so far.

    Both have the shape of the rows (the input's shape without its last axis). Before any entry,
    ``m = -inf`` and ``l = 0``. Source: chapter 10; Milakov and Gimelshein (2018), Algorithm 3.
    """

    def __init__(self, row_shape: tuple[int, ...]):
        self.m = np.full(row_shape, -np.inf)
        self.l = np.zeros(row_shape)

    def logsumexp(self) -> np.ndarray:
        """``log sum_j exp(x_j)`` of everything seen: ``m + log l``; ``-inf`` for a row with no entry."""
        with np.errstate(divide="ignore"):
            return np.where(self.l != 0, self.m + np.log(np.where(self.l != 0, self.l, 1.0)), -np.inf)


def online_softmax_update(state: OnlineSoftmaxState, block) -> np.ndarray:
    """Fold one block of entries (..., n) into ``state``; return the rescaling factor of the old sum.

    ``m_new = max(m, max(block))``, ``l_new = l * exp(m - m_new) + sum exp(block - m_new)``.
    Entries equal to ``-inf`` (masked) add nothing. The returned factor ``exp(m_old - m_new)`` (...,)
    is what an accumulator built with the old maximum must be multiplied by.
    """
    block = np.asarray(block, dtype=np.float64)
    m_new = np.maximum(state.m, block.max(axis=-1))
    # A row that has seen only -inf keeps m = -inf; shift by 0 instead, so exp never sees -inf - -inf.
    shift = np.where(np.isfinite(m_new), m_new, 0.0)
    correction = np.exp(state.m - shift)  # exp(-inf) = 0: an empty past contributes nothing
    state.l = state.l * correction + np.exp(block - shift[..., None]).sum(axis=-1)
    state.m = m_new
    return correction


def online_softmax(x, block_size: int = 4, axis: int = -1) -> np.ndarray:
    """Softmax computed in two passes over blocks of ``block_size`` entries: equal to ``ref.softmax``.

    Pass 1 streams the blocks through :func:`online_softmax_update` (one read of ``x``, never the
    whole row's maximum in advance); pass 2 writes ``exp(x - m) / l``. A row of only ``-inf`` gives
    zeros, as ``ref.softmax`` does with a fully masked row.

    Raises:
        TypeError: non-numeric ``x``. ValueError: ``block_size`` not a positive int.

    Source: chapter 10; Milakov and Gimelshein (2018).
    """
    x = np.moveaxis(require_array("x", x), axis, -1)
    block_size = require_positive_int("block_size", block_size)
    state = OnlineSoftmaxState(x.shape[:-1])
    for start in range(0, x.shape[-1], block_size):
        online_softmax_update(state, x[..., start:start + block_size])
    shift = np.where(np.isfinite(state.m), state.m, 0.0)[..., None]
    l = state.l[..., None]
    out = np.divide(np.exp(x - shift), l, out=np.zeros_like(x), where=l != 0)  # NaN in, NaN out
    return np.moveaxis(out, -1, axis)


def logsumexp(x, axis: int = -1) -> np.ndarray:
    """``log sum exp(x)`` along ``axis``, stably (``max + log sum exp(x - max)``); ``-inf`` for an
    all ``-inf`` slice. The quantity tiled attention returns per query row. Source: chapter 10."""
    x = require_array("x", x)
    if x.shape[axis] == 0:  # the log of an empty sum: -inf, like an all -inf slice (and torch.logsumexp)
        return np.full(np.delete(np.array(x.shape), axis % x.ndim).tolist(), -np.inf)
    top = np.max(x, axis=axis, keepdims=True)
    top = np.where(np.isfinite(top), top, 0.0)
    total = np.exp(x - top).sum(axis=axis, keepdims=True)
    with np.errstate(divide="ignore"):
        return np.squeeze(np.log(total) + top, axis=axis)


def _read_values(p, v_blk, mask, start: int, stop: int) -> np.ndarray:
    """``p @ v_blk`` (..., T, n) @ (..., n, Dv), except that a non-finite value reaches only the rows
    that may see it: 0 * NaN = NaN would otherwise spread it to every row, masked or not."""
    bad = ~np.isfinite(v_blk)  # (..., n, Dv)
    if mask is None or not bad.any():
        return p @ v_blk  # (..., T, n) @ (..., n, Dv) -> (..., T, Dv)
    reach = (mask[..., start:stop].astype(np.float64) @ bad) > 0  # (..., T, Dv): may row i see a bad value?
    return np.where(reach, p @ v_blk, p @ np.where(bad, 0.0, v_blk))


def online_attention(q, k, v, block_size: int = 4, *, mask=None, scale=None, return_lse: bool = False):
    """Attention accumulated over key blocks with the online softmax; equal to
    ``ref.scaled_dot_product_attention``.

    For each block of keys: scores ``s = q k_blk^T * scale`` (masked entries -> -inf), update the
    running maximum and sum, rescale the accumulator ``acc`` by ``exp(m_old - m_new)`` and add
    ``exp(s - m_new) v_blk``. At the end ``context = acc / l``.

    Args:
        q: (..., T, Dh); k: (..., S, Dh); v: (..., S, Dv).
        block_size: number of keys per block (> 0); need not divide S.
        mask: optional boolean keep-mask broadcastable to (..., T, S).
        scale: score multiplier, default ``1 / sqrt(Dh)``.
        return_lse: also return the log-sum-exp of each row's scaled scores, shape (..., T).

    Returns:
        ``context`` (..., T, Dv) float64, and ``lse`` (..., T) with ``return_lse``. A query with no
        visible key gets a zero row and ``lse = -inf``.

    Raises:
        TypeError / ValueError: as ``ref.scaled_dot_product_attention``; ``block_size`` not a
        positive int.

    Source: chapter 10; Dao et al. (2022), Algorithm 1 (one query block, key blocks in sequence).
    """
    return_lse = require_flag("return_lse", return_lse)
    q, k, v = require_array("q", q), require_array("k", k), require_array("v", v)
    require_qkv(q, k, v)
    require_scale(scale)
    block_size = require_positive_int("block_size", block_size)
    T, S = q.shape[-2], k.shape[-2]
    target = q.shape[:-2] + (T, S)
    if mask is not None:
        require_bool_mask("mask", mask)
        require_min_rank("mask", np.asarray(mask), 2, "(..., T, S)")
        require_broadcastable("mask", np.asarray(mask), target, "(..., T, S) =")
        mask = np.broadcast_to(np.asarray(mask), target)
    if scale is None:
        scale = 1.0 / np.sqrt(q.shape[-1])

    state = OnlineSoftmaxState(q.shape[:-1])  # m, l: (..., T)
    acc = np.zeros(q.shape[:-1] + (v.shape[-1],))  # (..., T, Dv), weighted by exp(s - m)
    for start in range(0, S, block_size):
        stop = min(start + block_size, S)
        scores = q @ np.swapaxes(k[..., start:stop, :], -1, -2) * scale  # (..., T, Dh) @ (..., Dh, n) -> (..., T, n)
        if mask is not None:
            scores = np.where(mask[..., start:stop], scores, -np.inf)
        correction = online_softmax_update(state, scores)
        shift = np.where(np.isfinite(state.m), state.m, 0.0)[..., None]
        p = np.exp(scores - shift)  # (..., T, n), 0 at masked entries
        acc = acc * correction[..., None] + _read_values(p, v[..., start:stop, :], mask, start, stop)
    l = state.l[..., None]
    # `l != 0`, not `l > 0`: a visible NaN key makes l NaN, and its row must be NaN, not zero.
    context = np.divide(acc, l, out=np.zeros_like(acc), where=l != 0)
    return (context, state.logsumexp()) if return_lse else context
