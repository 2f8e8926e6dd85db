"""Approximate attention: a sliding window (sparse) and kernelized linear attention.

Both change the result of exact softmax attention, by an amount chapter 09 measures (claim 18):
the window hides every key farther than ``window`` positions; linear attention replaces
``exp(q . k)`` by ``phi(q) . phi(k)``, which cannot be as sharp. Causal linear attention comes in
three forms with one result: parallel (a masked T x T product, O(T^2 d)), recurrent (T steps,
O(T Dh Dv)) and chunkwise (the masked product inside chunks of C positions, a running state
across them: O(T C d + T Dh Dv), linear in T). Introduced in chapter 09.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .._validate import require_attention_tensors, require_flag, require_positive_int, shape_of
from ..attention import _seen_matmul, scaled_dot_product_attention
from .tiled import (
    WINDOW_BACKWARD_BLOCK_Q,
    WINDOW_BLOCK_K,
    WINDOW_BLOCK_Q,
    Visibility,
    _TiledAttentionFunction,
    validate_attention_inputs,
)

__all__ = [
    "sliding_window_mask",
    "sliding_window_attention",
    "sliding_window_tiled_attention",
    "FEATURE_MAPS",
    "linear_attention",
    "linear_attention_recurrent",
    "linear_attention_chunkwise",
]


def sliding_window_mask(T: int, window: int, *, causal: bool = True, device=None) -> torch.Tensor:
    """Boolean keep-mask (T, T) of a sliding window (Child et al. 2019; Beltagy et al. 2020).

    With ``causal=True`` query i sees the ``window`` most recent keys ``i - window < j <= i``
    (itself included); with ``causal=False`` the keys with ``|i - j| < window``.

    Raises:
        TypeError / ValueError: ``T`` or ``window`` not a positive int, ``causal`` not a bool.

    Source: chapter 09.
    """
    T, window = require_positive_int("T", T), require_positive_int("window", window)
    causal = require_flag("causal", causal)
    i = torch.arange(T, device=device)[:, None]  # (T, 1)
    j = torch.arange(T, device=device)[None, :]  # (1, T)
    if causal:
        return (j <= i) & (j > i - window)  # (T, T)
    return (i - j).abs() < window  # (T, T)


def _require_self_attention(q, k, what: str) -> None:
    if q.shape[-2] != k.shape[-2]:
        raise ValueError(f"{what} needs T == S (self-attention); got q {shape_of(q)} and k {shape_of(k)}")


def sliding_window_attention(q, k, v, window: int, causal: bool = True, *, scale: float | None = None):
    """Attention restricted to a band of width ``window``: exact attention with
    :func:`sliding_window_mask` as the mask (it still computes, then discards, the whole T x T
    score matrix: the band mask shows *what* is computed, :func:`sliding_window_tiled_attention`
    shows how to save the work).

    Args:
        q, k, v: (..., T, Dh), (..., T, Dh), (..., T, Dv).
        window: keys visible to each query on each side (see :func:`sliding_window_mask`).
        causal: only the past (True) or both sides (False).

    Returns:
        ``context`` (..., T, Dv).

    Raises:
        ValueError: T != S, or the errors of ``selfattn.scaled_dot_product_attention``.

    Source: chapter 09.
    """
    require_attention_tensors(q, k, v)
    _require_self_attention(q, k, "sliding_window_attention")
    keep = sliding_window_mask(q.shape[-2], window, causal=require_flag("causal", causal), device=q.device)
    return scaled_dot_product_attention(q, k, v, keep, scale=scale)


def sliding_window_tiled_attention(q, k, v, window: int, causal: bool = True, *,
                                   scale: float | None = None, block_q: int = WINDOW_BLOCK_Q,
                                   block_k: int = WINDOW_BLOCK_K, backward_block_q: int = WINDOW_BACKWARD_BLOCK_Q):
    """The same result as :func:`sliding_window_attention`, computed by tiles that skip every block
    outside the band: work and memory O(T * window) instead of O(T^2).

    When ``block_k`` is at least a query block's band of keys (``block_q + window - 1``, causal, or
    ``block_q + 2 window - 2``; the defaults always are), each block's keys fit one tile and the forward
    runs the band kernel (``tiled._window_band_forward_base2``): the exact softmax of each block in
    one pass, no online rescaling, many blocks per batched product. Narrower key tiles take the
    general online-softmax loop of :func:`selfattn.efficient.tiled_attention`. Same result either way.

    Args:
        q, k, v: (..., T, Dh), (..., T, Dh), (..., T, Dv); float32, float64, float16 or bfloat16.
        window, causal: as :func:`sliding_window_attention`.
        block_q, block_k: query rows and key columns per tile of the forward, positive ints.
        backward_block_q: query rows per tile of the backward (the recomputing loop of
            :func:`selfattn.efficient.tiled_attention`, whose best size differs from the band
            kernel's; measured by ``bench/attention_bench.py --window-sweep``), a positive int. The
            gradients are the same to rounding whatever the block sizes.

    Returns:
        ``context`` (..., T, Dv); differentiable (recomputation backward).

    Raises:
        TypeError / ValueError: ``window``, ``block_q``, ``block_k`` or ``backward_block_q`` not a
        positive int; T != S;
        and the errors of ``tiled_attention``.

    Source: chapter 09; the tiles are those of :func:`selfattn.efficient.tiled_attention`.
    """
    scale = validate_attention_inputs(q, k, v, None, scale)
    _require_self_attention(q, k, "sliding_window_tiled_attention")
    window = require_positive_int("window", window)
    block_q, block_k = require_positive_int("block_q", block_q), require_positive_int("block_k", block_k)
    backward_block_q = require_positive_int("backward_block_q", backward_block_q)
    vis = Visibility(causal_offset=0 if require_flag("causal", causal) else None, window=window)
    out, _ = _TiledAttentionFunction.apply(q, k, v, vis, scale, block_q, block_k, None, None, backward_block_q, False)
    return out


def _elu_plus_one(x):
    return F.elu(x) + 1.0  # positive everywhere, so phi(q) . phi(k) > 0 like exp(q . k)


FEATURE_MAPS = {"elu+1": _elu_plus_one, "relu": F.relu}


def _feature_map(name):
    if callable(name):
        return name
    if name not in FEATURE_MAPS:
        raise ValueError(f"feature_map must be one of {sorted(FEATURE_MAPS)} or a callable; got {name!r}")
    return FEATURE_MAPS[name]


def _linear_inputs(q, k, v, eps):
    """Check the inputs of the linear-attention functions; return q, k, v in the arithmetic dtype
    (float32 for half-precision inputs: sums over thousands of positions overflow float16), eps,
    and the dtype to return."""
    require_attention_tensors(q, k, v)
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not (0 <= eps < math.inf):
        raise ValueError(f"eps must be a finite number >= 0; got {eps!r}")
    work = torch.float32 if q.dtype in (torch.float16, torch.bfloat16) else q.dtype
    return q.to(work), k.to(work), v.to(work), float(eps), q.dtype


def _masked_similarity_times_values(phi_q, phi_k, v, keep):
    """``(sim, sim @ v)`` with ``sim = phi_q phi_k^T`` set to 0 where ``keep`` hides a pair, so that a NaN
    or inf stored at a later key or value reaches only the rows that may see it (``x * 0`` would keep a
    NaN, and ``0 @ NaN`` is NaN). Shapes: (..., T, Dh), (..., S, Dh), (..., S, Dv), keep (T, S)."""
    sim = torch.where(keep, phi_q @ phi_k.transpose(-2, -1), 0.0)  # (..., T, Dh) @ (..., Dh, S) -> (..., T, S)
    product = sim @ v if bool(torch.isfinite(v).all()) else _seen_matmul(sim, v, keep)  # (..., T, Dv)
    return sim, product


def linear_attention(q, k, v, feature_map="elu+1", causal: bool = False, *, eps: float = 1e-6):
    """Linear attention in its parallel form (Katharopoulos et al. 2020, eqs. 5-6 and 8-9).

    ``out_i = phi(q_i) . sum_j phi(k_j) v_j^T / (phi(q_i) . sum_j phi(k_j))``, the sums over all
    j (``causal=False``: O(T Dh Dv) by computing ``phi(K)^T V`` first) or over ``j <= i``
    (``causal=True``: the masked (T, T) product, one matrix product for all positions, which costs
    O(T^2 (Dh + Dv)) like softmax attention; equal to :func:`linear_attention_recurrent` and
    :func:`linear_attention_chunkwise`, the forms linear in T). No scaling by sqrt(Dh), as in the paper.

    Args:
        q, k, v: (..., T, Dh), (..., S, Dh), (..., S, Dv); causal needs T == S.
        feature_map: ``"elu+1"`` (the paper's), ``"relu"``, or a callable on tensors.
        eps: added to the normalizer (a relu feature map can make it 0); a finite number >= 0.

    Returns:
        ``out`` (..., T, Dv) in the dtype of ``q`` (computed in float32 for float16/bfloat16).

    Raises:
        TypeError: non-tensor or non-floating inputs, different dtypes, a ``causal`` that is not a
        bool. ValueError: mismatched shapes or devices, an unknown feature map, causal with T != S,
        a negative or non-finite ``eps``.

    Source: chapter 09.
    """
    q, k, v, eps, dtype = _linear_inputs(q, k, v, eps)
    phi = _feature_map(feature_map)
    phi_q, phi_k = phi(q), phi(k)  # (..., T, Dh), (..., S, Dh)
    if require_flag("causal", causal):
        _require_self_attention(q, k, "causal linear attention")
        T = q.shape[-2]
        keep = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()  # (T, T)
        sim, numerator = _masked_similarity_times_values(phi_q, phi_k, v, keep)  # (..., T, T), (..., T, Dv)
        out = numerator / (sim.sum(dim=-1, keepdim=True) + eps)
        return out.to(dtype)
    kv = phi_k.transpose(-2, -1) @ v  # (..., Dh, S) @ (..., S, Dv) -> (..., Dh, Dv)
    normalizer = phi_q @ phi_k.sum(dim=-2)[..., None]  # (..., T, Dh) @ (..., Dh, 1) -> (..., T, 1)
    return ((phi_q @ kv) / (normalizer + eps)).to(dtype)  # (..., T, Dh) @ (..., Dh, Dv) -> (..., T, Dv)


def linear_attention_recurrent(q, k, v, feature_map="elu+1", *, eps: float = 1e-6):
    """Causal linear attention as a recurrent network (Katharopoulos et al. 2020, eqs. 18-20).

    A state ``state_i = state_{i-1} + phi(k_i) v_i^T`` (Dh, Dv) and ``z_i = z_{i-1} + phi(k_i)``
    are updated one position at a time; ``out_i = phi(q_i) state_i / (phi(q_i) . z_i)``. Constant
    memory per step, but T sequential steps; equal to ``linear_attention(..., causal=True)``.

    Returns:
        ``out`` (..., T, Dv).

    Raises:
        The errors of :func:`linear_attention`.

    Source: chapter 09.
    """
    q, k, v, eps, dtype = _linear_inputs(q, k, v, eps)
    _require_self_attention(q, k, "linear_attention_recurrent")
    phi = _feature_map(feature_map)
    phi_q, phi_k = phi(q), phi(k)
    state = torch.zeros(q.shape[:-2] + (q.shape[-1], v.shape[-1]), dtype=q.dtype, device=q.device)
    z = torch.zeros(q.shape[:-2] + (q.shape[-1],), dtype=q.dtype, device=q.device)  # (..., Dh)
    outs = []
    for i in range(q.shape[-2]):
        state = state + phi_k[..., i, :, None] * v[..., i, None, :]  # (..., Dh, 1) * (..., 1, Dv)
        z = z + phi_k[..., i, :]
        numerator = (phi_q[..., i, None, :] @ state)[..., 0, :]  # (..., 1, Dh) @ (..., Dh, Dv) -> (..., Dv)
        outs.append(numerator / ((phi_q[..., i, :] * z).sum(dim=-1, keepdim=True) + eps))
    return torch.stack(outs, dim=-2).to(dtype)  # T x (..., Dv) -> (..., T, Dv)


def linear_attention_chunkwise(q, k, v, chunk_size: int, feature_map="elu+1", *, eps: float = 1e-6):
    """Causal linear attention by chunks: linear in T, and parallel inside each chunk.

    The positions are cut into chunks of ``chunk_size`` (the last one may be shorter). Inside a
    chunk, the masked parallel form of :func:`linear_attention`; across chunks, the recurrent
    state of :func:`linear_attention_recurrent`, carried once per chunk instead of once per
    position. For chunk ``c`` with rows ``Q_c, K_c, V_c`` (C positions) and the state
    ``S = sum phi(k_j) v_j^T``, ``z = sum phi(k_j)`` over all earlier chunks::

        num_c = (phi(Q_c) phi(K_c)^T * tril) V_c + phi(Q_c) S        # (C, Dv)
        den_c = (phi(Q_c) phi(K_c)^T * tril) 1  + phi(Q_c) z         # (C, 1)
        out_c = num_c / (den_c + eps);  S += phi(K_c)^T V_c;  z += phi(K_c)^T 1

    Matrix-product FLOPs per chunk: 2 C^2 (Dh + Dv) + 4 C Dh Dv + 2 C Dh, so
    ``B H T (2 C (Dh + Dv) + 4 Dh Dv + 2 Dh)`` in all when C divides T: linear in T, against the
    ``2 B H T^2 (Dh + Dv)`` of the parallel causal form. ``chunk_size = 1`` is the recurrent form,
    ``chunk_size >= T`` the parallel one; the result is the same for every chunk size.

    Args:
        q, k, v: (..., T, Dh), (..., T, Dh), (..., T, Dv) (self-attention: T == S).
        chunk_size: positions per chunk C, a positive int.
        feature_map: ``"elu+1"`` (the paper's), ``"relu"``, or a callable on tensors.
        eps: added to the normalizer; a finite number >= 0.

    Returns:
        ``out`` (..., T, Dv) in the dtype of ``q`` (computed in float32 for float16/bfloat16).

    Raises:
        TypeError / ValueError: the errors of :func:`linear_attention`; T != S; ``chunk_size`` not
        a positive int.

    Source: Katharopoulos et al. 2020 (eqs. 18-20, the recurrent form); the chunkwise form of
    Sun et al. 2023 (RetNet, section 2.2, without decay) and Yang et al. 2024 (Gated Linear
    Attention, section 2.2, without gates); chapter 09.
    """
    q, k, v, eps, dtype = _linear_inputs(q, k, v, eps)
    _require_self_attention(q, k, "linear_attention_chunkwise")
    chunk_size = require_positive_int("chunk_size", chunk_size)
    phi = _feature_map(feature_map)
    phi_q, phi_k = phi(q), phi(k)  # (..., T, Dh)
    T = q.shape[-2]
    state = torch.zeros(q.shape[:-2] + (q.shape[-1], v.shape[-1]), dtype=q.dtype, device=q.device)
    z = torch.zeros(q.shape[:-2] + (q.shape[-1], 1), dtype=q.dtype, device=q.device)  # (..., Dh, 1)
    outs = []
    for lo in range(0, T, chunk_size):
        pq, pk, vc = (x[..., lo:lo + chunk_size, :] for x in (phi_q, phi_k, v))  # (..., C, .)
        C = pq.shape[-2]
        keep = torch.ones(C, C, dtype=torch.bool, device=q.device).tril()  # (C, C): causal inside
        sim, inside = _masked_similarity_times_values(pq, pk, vc, keep)  # (..., C, C), (..., C, Dv)
        numerator = inside + pq @ state  # + (..., C, Dh) @ (..., Dh, Dv): the earlier chunks
        denominator = sim.sum(dim=-1, keepdim=True) + pq @ z  # (..., C, 1) + (..., C, Dh) @ (..., Dh, 1)
        outs.append(numerator / (denominator + eps))
        # Carry this chunk's keys and values to every later chunk: one update per chunk, not per position.
        state = state + pk.transpose(-2, -1) @ vc  # (..., Dh, C) @ (..., C, Dv) -> (..., Dh, Dv)
        z = z + pk.sum(dim=-2)[..., None]  # (..., Dh, 1)
    return torch.cat(outs, dim=-2).to(dtype)  # chunks of (..., C, Dv) -> (..., T, Dv)
