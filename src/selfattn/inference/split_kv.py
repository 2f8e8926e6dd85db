"""Split-KV decoding (Flash-Decoding): attention over chunks of keys, merged in any order (chapter 11).

When one new token is decoded, there is a single query row per head (T = 1) and all the parallel
work is along the S keys. Flash-Decoding (Dao, Haziza, Massa and Sizov 2023) cuts the keys into
chunks, attends to each chunk independently (on its own processor) and combines the results with one
small reduction. Each chunk yields a *partial*: the row maximum ``m`` of its scaled scores, the sum
``l`` of ``exp(scores - m)`` and the unnormalised accumulator ``acc = exp(scores - m) @ V``. Two
partials merge by rescaling both to the larger maximum, ``exp(m_a - m) and exp(m_b - m)``: the
online-softmax update of chapter 10 (``selfattn.ref.online``), made symmetric. The merge is
commutative and associative, so the chunks may be merged in any order or as a tree; ``acc / l``
at the end is exact attention. :mod:`selfattn.inference.paged` reads a paged cache through the same
merge, one block at a time.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import torch

from .._validate import (
    require_attention_tensors,
    require_bool_mask,
    require_broadcastable,
    require_flag,
    require_min_rank,
    require_positive_int,
    require_scale,
    require_tensor,
    shape_of,
)
from ..attention import _read_values, _zero_unseen

__all__ = ["Partial", "partial_attention", "merge_partials", "reduce_partials", "finalize", "chunk_boundaries",
           "split_kv_attention"]

_HALF = (torch.float16, torch.bfloat16)


class Partial(NamedTuple):
    """What one chunk of keys contributes to attention, for every query row.

    Attributes:
        m: (..., T) row maximum of the chunk's visible scaled scores; ``-inf`` for a row that sees
            no key of the chunk.
        l: (..., T) ``sum_j exp(s_j - m)`` over the visible keys; 0 for such a row.
        acc: (..., T, Dv) ``sum_j exp(s_j - m) v_j``, not yet divided by ``l``; 0 for such a row.

    float32 for half-precision inputs, else the inputs' dtype. Source: chapter 11 (Flash-Decoding).
    """

    m: torch.Tensor
    l: torch.Tensor  # noqa: E741 (the maths' symbol)
    acc: torch.Tensor


def _partial(q, k, v, keep, scale: float) -> Partial:
    """:func:`partial_attention` without the argument checks (its callers have made them)."""
    if q.dtype in _HALF:  # scores, exponentials and sums in float32
        q, k, v = q.float(), k.float(), v.float()
    q, k, v = _zero_unseen(q, k, v, keep)  # a NaN stored where no query may look cannot reach the output
    scores = (q @ k.transpose(-2, -1)) * scale  # (..., T, Dh) @ (..., Dh, n) -> (..., T, n)
    if keep is not None:
        scores = scores.masked_fill(~keep, -math.inf)  # replacement, not addition
    m = scores.amax(dim=-1).detach()  # (..., T); a constant shift, so no gradient through it
    shift = torch.where(m == -math.inf, 0.0, m)  # a row with no visible key: exp(-inf - 0) = 0, never NaN
    p = torch.exp(scores - shift[..., None])  # (..., T, n), 0 at hidden keys
    return Partial(m, p.sum(dim=-1), _read_values(p, v, keep))  # acc: (..., T, n) @ (..., n, Dv) -> (..., T, Dv)


def _check_mask(mask, q, target) -> None:
    if mask is None:
        return
    require_tensor("mask", mask)
    if mask.device != q.device:
        raise ValueError(f"mask must be on the device of q ({q.device}); got {mask.device}")
    require_bool_mask("mask", mask)
    require_min_rank("mask", mask, 2, "(..., T, S)")
    require_broadcastable("mask", mask, target, "(..., T, S) =")


def partial_attention(q, k, v, *, scale: float | None = None, mask: torch.Tensor | None = None) -> Partial:
    """The :class:`Partial` (m, l, acc) of queries ``q`` against ONE chunk of keys and values.

    ``finalize(partial_attention(q, k, v, mask=keep))`` equals
    ``scaled_dot_product_attention(q, k, v, keep)``; merged with :func:`merge_partials`, the partials
    of chunks that cover the keys give attention over all of them.

    Args:
        q: (..., T, Dh), typically (B, H, 1, Dh) when decoding; k: (..., n, Dh); v: (..., n, Dv).
            One floating dtype, one device, the same leading axes.
        scale: score multiplier; default ``1 / sqrt(Dh)``.
        mask: optional boolean keep-mask (True = may attend) broadcastable to (..., T, n), the
            chunk's columns of the full mask. A row that sees no key gets ``m = -inf``, ``l = 0``.

    Returns:
        :class:`Partial` with ``m``, ``l`` (..., T) and ``acc`` (..., T, Dv), in the inputs' dtype
        (float32 for float16/bfloat16). Differentiable (``m`` is treated as a constant shift, which
        leaves every gradient exact).

    Raises:
        TypeError / ValueError: as :func:`selfattn.scaled_dot_product_attention` (non-tensors,
        different dtypes, mismatched shapes, a non-boolean mask or one that does not broadcast, a
        bad scale).

    Source: chapter 11; Dao, Haziza, Massa and Sizov (2023), Flash-Decoding; the rescaling is
    chapter 10's online softmax (Milakov and Gimelshein 2018).
    """
    require_attention_tensors(q, k, v)
    require_scale(scale)
    _check_mask(mask, q, tuple(q.shape[:-2]) + (q.shape[-2], k.shape[-2]))
    return _partial(q, k, v, mask, 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale))


def _require_partial(name: str, p) -> None:
    if not isinstance(p, Partial):
        raise TypeError(f"{name} must be a selfattn.inference.split_kv.Partial (from partial_attention); "
                        f"got {type(p).__name__}")


def merge_partials(a: Partial, b: Partial) -> Partial:
    """The partial of the union of two disjoint sets of keys: commutative and associative.

    ``m = max(m_a, m_b)``; both sides are rescaled to it, ``l = l_a e^(m_a - m) + l_b e^(m_b - m)`` and
    ``acc = acc_a e^(m_a - m) + acc_b e^(m_b - m)``. A side that saw no key (``m = -inf``) gets the
    factor 0; if neither did, the result is again empty (``m = -inf``, ``l = 0``), never NaN.
    Commutative bit for bit (the same products, summed in either order); associative up to
    rounding (about 1e-16 relative in float64).

    Raises:
        TypeError: ``a`` or ``b`` not a :class:`Partial`, or of different dtypes.
        ValueError: their shapes differ.

    Source: chapter 11 (Flash-Decoding's reduction); chapter 10's online-softmax rescaling.
    """
    _require_partial("a", a)
    _require_partial("b", b)
    if a.acc.dtype != b.acc.dtype:
        raise TypeError(f"a and b must have one dtype; got {a.acc.dtype} and {b.acc.dtype}")
    if a.acc.shape != b.acc.shape or a.m.shape != b.m.shape:
        raise ValueError(f"a and b must cover the same query rows: acc shapes {shape_of(a.acc)} and "
                         f"{shape_of(b.acc)}, m shapes {shape_of(a.m)} and {shape_of(b.m)}")
    return _merge(a, b)


def _merge(a: Partial, b: Partial) -> Partial:
    """:func:`merge_partials` without the checks."""
    m = torch.maximum(a.m, b.m)  # (..., T)
    shift = torch.where(m == -math.inf, 0.0, m)  # both empty: exp(-inf - 0) = 0 for both
    scale_a, scale_b = torch.exp(a.m - shift), torch.exp(b.m - shift)  # (..., T), each in [0, 1]
    l = a.l * scale_a + b.l * scale_b  # noqa: E741
    acc = a.acc * scale_a[..., None] + b.acc * scale_b[..., None]  # (..., T, Dv)
    return Partial(m, l, acc)


def reduce_partials(partials: Sequence[Partial], order=None) -> Partial:
    """Merge a list of partials into one.

    Args:
        partials: a non-empty sequence of :class:`Partial` of one shape.
        order: None or ``"sequential"`` (left to right), ``"tree"`` (neighbours pairwise, then pairs of
            pairs: log2(n) rounds, as a parallel reduction does), or a permutation of
            ``range(len(partials))`` (merged left to right in that order).

    Raises:
        TypeError / ValueError: empty ``partials``, a non-Partial, an ``order`` that is neither of
        the names nor a permutation of ``range(len(partials))``.

    Source: chapter 11.
    """
    partials = list(partials)
    order = "sequential" if order is None else order
    if not partials:
        raise ValueError("partials must hold at least one Partial; got none")
    for i, p in enumerate(partials):
        _require_partial(f"partials[{i}]", p)
    if isinstance(order, str) and order == "tree":
        while len(partials) > 1:  # one round: (0 1) (2 3) ...; an odd last one waits for the next round
            partials = [_merge(*partials[i:i + 2]) if i + 1 < len(partials) else partials[i]
                        for i in range(0, len(partials), 2)]
        return partials[0]
    if isinstance(order, str) and order != "sequential":
        raise ValueError(f"order must be 'sequential', 'tree' or a permutation of range({len(partials)}); got {order!r}")
    if not isinstance(order, str):
        perm = _int_list("order", order, f"'sequential', 'tree' or a permutation of range({len(partials)})")
        if sorted(perm) != list(range(len(partials))):
            raise ValueError(f"order must be a permutation of range({len(partials)}) (one index per chunk); got {order!r}")
        partials = [partials[i] for i in perm]
    out = partials[0]
    for p in partials[1:]:
        out = _merge(out, p)
    return out


def finalize(p: Partial):
    """``(context, lse)`` of a partial: ``context = acc / l`` (..., T, Dv) and the log-sum-exp of the
    visible scaled scores ``lse = m + log l`` (..., T). A row that saw no key gets a zero context row
    and ``lse = -inf`` (the package's convention, as ``tiled_attention``). Both in the partial's dtype.

    Raises:
        TypeError: ``p`` not a :class:`Partial`. Source: chapter 11."""
    _require_partial("p", p)
    seen = p.l != 0  # not `> 0`: a visible NaN makes l NaN, and that row must stay NaN
    l_safe = torch.where(seen, p.l, 1.0)
    context = torch.where(seen[..., None], p.acc / l_safe[..., None], 0.0)  # (..., T, Dv)
    lse = torch.where(seen, p.m + torch.log(l_safe), -math.inf)  # (..., T)
    return context, lse


def _int_list(name: str, value, expected: str) -> list[int]:
    """``value`` as a list of Python ints: a list, tuple, range, 1-D integer NumPy array or tensor of
    ints (NumPy ints accepted, bools and floats refused, as everywhere in the package); not a str, a
    dict or a set (a set's order is arbitrary, a dict iterates its keys)."""
    if isinstance(value, (np.ndarray, torch.Tensor)):
        is_int = (not value.dtype.is_floating_point and not value.dtype.is_complex and value.dtype != torch.bool
                  if isinstance(value, torch.Tensor) else np.issubdtype(value.dtype, np.integer))
        if value.ndim != 1 or not is_int:
            raise TypeError(f"{name} must be {expected}; got a {type(value).__name__} of shape "
                            f"{tuple(value.shape)} and dtype {value.dtype}")
        return [int(x) for x in value.tolist()]
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise TypeError(f"{name} must be {expected} (a list or tuple); got {value!r} ({type(value).__name__})")
    out = []
    for i, x in enumerate(value):
        if isinstance(x, (bool, np.bool_)) or not isinstance(x, (int, np.integer)):
            raise TypeError(f"{name}[{i}] must be an int; got {x!r} ({type(x).__name__}) in {name}={value!r}")
        out.append(int(x))
    return out


def chunk_boundaries(S: int, n_splits: int) -> list[int]:
    """``[0, ..., S]``: ``n_splits`` chunks of near-equal size (sizes differ by at most one).

    Raises:
        TypeError / ValueError: ``S`` or ``n_splits`` not a positive int, ``n_splits > S``."""
    S, n_splits = require_positive_int("S", S), require_positive_int("n_splits", n_splits)
    if n_splits > S:
        raise ValueError(f"n_splits must be <= S (every chunk holds a key); got n_splits={n_splits}, S={S}")
    return [i * S // n_splits for i in range(n_splits + 1)]


def _check_boundaries(boundaries, S: int) -> list[int]:
    b = _int_list("boundaries", boundaries, "a sequence of ints [0, ..., S]")
    if len(b) < 2 or b[0] != 0 or b[-1] != S or any(x >= y for x, y in zip(b, b[1:], strict=False)):
        raise ValueError(f"boundaries must increase strictly from 0 to S={S} (the keys' chunk edges); got {b}")
    return b


def split_kv_attention(q, k, v, *, n_splits: int | None = None, boundaries: Sequence[int] | None = None,
                       order=None, mask: torch.Tensor | None = None, scale: float | None = None,
                       return_lse: bool = False):
    """Attention computed chunk by chunk along the keys, the chunks merged in ``order``.

    Each chunk ``[b_i, b_{i+1})`` of keys gets its own :func:`partial_attention` (independent: on a
    GPU, each would run on its own block of threads); :func:`reduce_partials` merges them; equal to
    ``selfattn.scaled_dot_product_attention(q, k, v, mask)`` for every chunking and every order.

    Args:
        q: (..., T, Dh), typically (B, H, 1, Dh) when decoding; k: (..., S, Dh); v: (..., S, Dv).
        n_splits: number of near-equal chunks (1 <= n_splits <= S); or
        boundaries: the chunk edges ``[0, b_1, ..., S]``, strictly increasing. Exactly one of the two.
        order: as :func:`reduce_partials`: None or ``"sequential"``, ``"tree"`` or a permutation of the chunks.
        mask: optional boolean keep-mask broadcastable to (..., T, S). A chunk that a row cannot see
            at all contributes nothing to it; a row that sees no key anywhere gets a zero context row
            and ``lse = -inf``, as in :func:`selfattn.scaled_dot_product_attention` and ``tiled_attention``.
        scale: score multiplier; default ``1 / sqrt(Dh)``.
        return_lse: also return the log-sum-exp (..., T) of each row's visible scaled scores.

    Returns:
        ``context`` (..., T, Dv) in the dtype of ``q`` (float32 arithmetic for half inputs); with
        ``return_lse``, also ``lse`` (..., T) (float32 for half inputs). Differentiable by autograd.

    Raises:
        TypeError / ValueError: as :func:`selfattn.scaled_dot_product_attention`; both or neither of
        ``n_splits`` and ``boundaries``, bad boundaries, a bad ``order``, ``return_lse`` not a bool.

    Source: chapter 11; Dao, Haziza, Massa and Sizov (2023), "Flash-Decoding for long-context inference".
    """
    return_lse = require_flag("return_lse", return_lse)
    require_attention_tensors(q, k, v)
    require_scale(scale)
    T, S = q.shape[-2], k.shape[-2]
    _check_mask(mask, q, tuple(q.shape[:-2]) + (T, S))
    if (n_splits is None) == (boundaries is None):
        raise ValueError("give exactly one of n_splits (a number of equal chunks) and boundaries ([0, ..., S]); "
                         f"got n_splits={n_splits!r}, boundaries={boundaries!r}")
    edges = chunk_boundaries(S, n_splits) if boundaries is None else _check_boundaries(boundaries, S)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    if mask is not None:
        mask = mask.expand(*mask.shape[:-2], T, S)  # real (T, S) axes, so that chunks can be sliced (a view)
    partials = [_partial(q, k[..., j0:j1, :], v[..., j0:j1, :],  # (..., n, Dh), (..., n, Dv)
                         None if mask is None else mask[..., j0:j1], scale)  # (..., T, n)
                for j0, j1 in zip(edges, edges[1:], strict=False)]
    context, lse = finalize(reduce_partials(partials, order))
    context = context.to(q.dtype)
    return (context, lse) if return_lse else context
