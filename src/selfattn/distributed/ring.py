"""Ring attention over P processes with ``torch.distributed``, exact forward and backward (chapter 12).

Each of P ranks holds a sequence shard of Q, K and V, (B, H, T/P, Dh). The key/value blocks travel
around the ring: at step t rank r holds the block that started on rank (r - t) mod P, attends its own
queries to it (one :func:`~selfattn.inference.split_kv.partial_attention`) and merges the partial into
its running result with chapter 11's :func:`~selfattn.inference.split_kv.merge_partials`, the online
softmax of chapter 10. The send of the block to rank r + 1 and the receive of the next from rank r - 1
are posted (``dist.batch_isend_irecv``) *before* the step's arithmetic, so that transfer and compute
overlap. Under a causal mask a block that no query may see is skipped, and of the others only the
query rows and key columns with work are computed (with the zigzag layout, half of every block but
the rank's own). After P steps every query has met every key: :func:`~selfattn.inference.split_kv.finalize`
gives exact attention and its log-sum-exp (Liu, Zaharia and Abbeel 2023, "Ring Attention with
Blockwise Transformers for Near-Infinite Context").

The backward pass is a second ring (Dao 2023, Algorithm 2, per block): K and V travel again, now with
their gradient accumulators dK and dV; each rank recomputes its queries' weights of the block from the
saved log-sum-exp, adds its contribution to dK and dV, keeps dQ at home, and passes the block on; after
the full circle the accumulators arrive home.

Bytes sent per rank (e = element size, n = T/P, one tensor of a block = B H n Dh e bytes):

- forward: ``(P - 1) x 2 x B x H x n x Dh x e`` (K and V, P - 1 hops), plus ``(P - 1) x B x n`` for a
  key-padding mask (one byte per position, travelling with its keys);
- backward: ``(P - 1) x 2 x B x H x n x Dh x e`` (K and V again) ``+ P x 2 x B x H x n x Dh x a`` (dK and
  dV, P hops: the last brings them home; ``a = e``, except ``a = 4`` for float16/bfloat16, whose
  accumulators travel in float32 so that P additions do not round P times), plus ``(P - 1) x B x n``
  for a mask; nothing when P = 1.

For float16/bfloat16 the scores, softmax and gradient products are computed in float32 (as chapter
11's partials), and the gradients are rounded to the inputs' dtype once, at the end.

Source: chapter 12; Liu et al. (2023); the merge: chapter 11, Milakov and Gimelshein (2018); the
backward: Dao (2023), Algorithm 2.
"""

from __future__ import annotations

import functools
import math
import time

import torch

from ..attention import _seen_matmul, _zero_unseen
from ..inference.split_kv import Partial, finalize, merge_partials, partial_attention
from ._checks import check_shards, group_size_rank
from .comm import StepRecord, Traffic, post_ring_exchange, wait_all
from .layout import shard_positions

__all__ = ["ring_attention", "ring_bytes_formula"]

_HALF = (torch.float16, torch.bfloat16)


def ring_bytes_formula(B: int, H: int, T: int, Dh: int, P: int, element_size: int,
                       key_padding_mask: bool = False) -> dict:
    """``{"forward": bytes, "backward": bytes}`` one rank sends in :func:`ring_attention` (see the module).

    ``element_size``: bytes per element of q, k, v; 2 (float16/bfloat16) makes the travelling dK, dV
    accumulators 4 bytes per element (float32)."""
    if P == 1:
        return {"forward": 0, "backward": 0}
    block, mask = B * H * (T // P) * Dh * element_size, (B * (T // P) if key_padding_mask else 0)
    acc = B * H * (T // P) * Dh * (4 if element_size == 2 else element_size)  # one of dK, dV
    return {"forward": (P - 1) * (2 * block + mask), "backward": (P - 1) * (2 * block + mask) + P * 2 * acc}


@functools.lru_cache(maxsize=512)
def _causal_part(T: int, P: int, layout: str, rank: int, src: int):
    """The causal structure of one (query shard, key block) pair, built once per shape and reused
    (every step of every call with the same T, P and layout asks for the same few): ``(rows, cols,
    keep)`` on the CPU, read only. ``rows``, ``cols``: index tensors of the query rows that see some
    key and the key columns some query sees, or None for all; ``keep``: (1, 1, rows, cols) or None
    (all of that part visible)."""
    q_pos, k_pos = shard_positions(T, P, layout, rank), shard_positions(T, P, layout, src)
    seen = q_pos[:, None] >= k_pos[None, :]  # (n, n): i sees j iff pos_i >= pos_j
    rows, cols = seen.any(dim=1).nonzero().squeeze(1), seen.any(dim=0).nonzero().squeeze(1)
    seen = seen[rows][:, cols]  # (rows, cols): the part that has work
    if rows.numel() == len(q_pos) and cols.numel() == len(k_pos):
        rows = cols = None  # the whole block: no copies
    return rows, cols, (None if bool(seen.all()) else seen[None, None])  # keep: (1, 1, rows, cols)


def _visible_block(T, P, layout, rank, src, mask_block, causal, device):
    """Which part of one (query shard, key block) pair to compute: ``(rows, cols, keep)``.

    Under a causal mask only the query rows that see some key and the key columns that some query
    sees are computed (``rows``, ``cols``: index tensors, or None for all): for the zigzag layout that
    is exactly half of every block but the diagonal, so no time goes into pairs that are all hidden.
    ``keep``: the boolean keep-mask (B or 1, 1, rows, cols) of that part, or None (all visible).
    ``rows`` of length 0: nothing to compute. The causal part is cached (:func:`_causal_part`).
    """
    rows = cols = keep = None
    if causal:
        rows, cols, keep = (None if x is None else x.to(device) for x in _causal_part(T, P, layout, rank, src))
    if mask_block is not None:
        pad = (mask_block if cols is None else mask_block[:, cols])[:, None, None, :]  # (B, cols) -> (B, 1, 1, cols)
        keep = pad if keep is None else keep & pad
    return rows, cols, keep


def _rows(x, rows):
    return x if rows is None else x.index_select(2, rows)  # (B, H, n, Dh) -> (B, H, rows, Dh)


def _scatter_rows(part: Partial, rows, n) -> Partial:
    """A partial of some query rows, as one of all n rows (the others empty: m = -inf, l = 0, acc = 0)."""
    if rows is None:
        return part
    B, H, _, Dh = part.acc.shape
    m = part.m.new_full((B, H, n), -math.inf).index_copy(2, rows, part.m)
    l = part.l.new_zeros((B, H, n)).index_copy(2, rows, part.l)  # noqa: E741
    return Partial(m, l, part.acc.new_zeros((B, H, n, Dh)).index_copy(2, rows, part.acc))


def _ring_forward(q, k, v, kpm, causal, layout, scale, group, traffic):
    P, r = group_size_rank(group)
    n = q.shape[2]
    nxt, prv = (r + 1) % P, (r - 1) % P
    running = None
    block = [k, v] + ([kpm] if kpm is not None else [])  # what travels: keys, values, their padding
    for t in range(P):
        src = (r - t) % P  # the rank this block started on
        incoming, reqs = [], []
        if t < P - 1:  # post the next block's transfer first, then compute on this one
            incoming = [torch.empty_like(x) for x in block]
            reqs = post_ring_exchange(block, incoming, nxt, prv, group, traffic, "forward")
        t0, c0 = time.perf_counter(), time.thread_time()
        rows, cols, keep = _visible_block(n * P, P, layout, r, src, block[2] if kpm is not None else None,
                                          causal, q.device)
        pairs = 0
        if (rows is None or rows.numel()) and (keep is None or bool(keep.any())):  # else skipped, not computed
            q_b, k_b, v_b = _rows(q, rows), _rows(block[0], cols), _rows(block[1], cols)  # the part with work
            pairs = q.shape[0] * q_b.shape[2] * k_b.shape[2] if keep is None else int(
                keep.expand(q.shape[0], 1, q_b.shape[2], k_b.shape[2]).sum())
            part = partial_attention(q_b, k_b, v_b, scale=scale, mask=keep)  # m, l (B, H, rows); acc (B, H, rows, Dh)
            part = _scatter_rows(part, rows, n)  # (B, H, n, ...): rows without work stay empty
            running = part if running is None else merge_partials(running, part)
        compute_s, compute_cpu_s = time.perf_counter() - t0, time.thread_time() - c0
        wait_s = wait_all(reqs)
        if traffic is not None:
            traffic.steps.append(StepRecord("forward", t, sum(x.numel() * x.element_size() for x in block)
                                            if t < P - 1 else 0, compute_s, wait_s, pairs, compute_cpu_s))
        block = incoming
    if running is None:  # every key hidden from every query: zero rows, lse = -inf
        running = Partial(torch.full(q.shape[:-1], -math.inf, dtype=q.dtype, device=q.device),
                          q.new_zeros(q.shape[:-1]), torch.zeros_like(q))
    context, lse = finalize(running)  # context (B, H, n, Dh), lse (B, H, n); float32 for half inputs
    return context.to(q.dtype), lse


def _seen_product(a, b, keep):
    """``a @ b`` (a: (..., rows, cols), b: (..., cols, D)) in which a non-finite entry of ``b`` reaches
    only the rows that may see it. 0 * NaN = NaN, so a NaN stored in b[j] would otherwise reach every
    row i, even one whose pair (i, j) the mask hides (a[i, j] = 0). ``keep`` (..., rows, cols) or None."""
    if keep is None or bool(torch.isfinite(b).all()):
        return a @ b  # the common case: one product
    return _seen_matmul(a, b, keep)  # the finite entries for the rows that may not see the others


def _block_grads(q, k, v, dout, lse, delta, keep, scale):
    """Dao (2023) Algorithm 2 for one (query rows, key columns) part of a block: (dq, dk, dv) contributions.

    In float32 for float16/bfloat16 inputs (as the forward's partials; ``lse`` and ``delta`` are
    float32 then), else in the inputs' dtype; the contributions come back in that compute dtype.
    A NaN or inf stored at a key, value or query the mask hides from a pair reaches no gradient
    through that pair: unseen keys, values and queries are zeroed, ``ds`` is zero where the mask hides
    a pair, and the products with a partly seen non-finite row use only the rows that see it."""
    if q.dtype in _HALF:  # scores, exponentials and products in float32
        q, k, v, dout = q.float(), k.float(), v.float(), dout.float()
    if keep is not None:
        q, k, v = _zero_unseen(q, k, v, keep)  # keys no query sees, queries that see no key: zero
    scores = (q @ k.transpose(-2, -1)) * scale  # (B, H, n, Dh) @ (B, H, Dh, n) -> (B, H, n, n)
    lse_safe = torch.where(torch.isfinite(lse), lse, 0.0)[..., None]  # a row that saw nothing: weights 0
    weights = torch.exp(scores - lse_safe)  # P = exp(S - L), recomputed, never stored
    if keep is not None:
        weights = torch.where(keep, weights, 0.0)
    dv = weights.transpose(-2, -1) @ dout  # dV += P^T dO: (B, H, n, n) @ (B, H, n, Dh)
    dp = dout @ v.transpose(-2, -1)  # dP = dO V^T: (B, H, n, Dh) @ (B, H, Dh, n) -> (B, H, n, n)
    ds = weights * (dp - delta[..., None])  # dS = P * (dP - rowsum(dO * O))
    if keep is not None:
        ds = torch.where(keep, ds, 0.0)  # a hidden pair has no gradient, whatever dp holds there
    dq = _seen_product(ds, k, keep) * scale  # dQ += dS K scale: (B, H, n, n) @ (B, H, n, Dh)
    dk = _seen_product(ds.transpose(-2, -1), q, None if keep is None else keep.transpose(-2, -1)) * scale  # dK += dS^T Q
    return dq, dk, dv


def _ring_backward(dout, q, k, v, kpm, out, lse, causal, layout, scale, group, traffic):
    P, r = group_size_rank(group)
    n = q.shape[2]
    nxt, prv = (r + 1) % P, (r - 1) % P
    work = torch.float32 if q.dtype in _HALF else q.dtype  # half inputs: gradients accumulate in float32
    delta = (dout.to(work) * out.to(work)).sum(dim=-1)  # (B, H, n): rowsum(dO * O)
    dq = torch.zeros_like(q, dtype=work)
    block = [k, v] + ([kpm] if kpm is not None else [])
    acc_in, acc_reqs = None, []  # the accumulators of the block now held, arriving from rank r - 1
    for t in range(P):
        src = (r - t) % P
        incoming, reqs = [], []
        if t < P - 1:  # keys and values of the next block: posted before this step's arithmetic
            incoming = [torch.empty_like(x) for x in block]
            reqs = post_ring_exchange(block, incoming, nxt, prv, group, traffic, "backward")
        t0, c0 = time.perf_counter(), time.thread_time()
        rows, cols, keep = _visible_block(n * P, P, layout, r, src, block[2] if kpm is not None else None,
                                          causal, q.device)
        dk_loc, dv_loc = (torch.zeros_like(x, dtype=work) for x in (k, v))  # a skipped block contributes nothing
        if (rows is None or rows.numel()) and (keep is None or bool(keep.any())):  # as in the forward pass
            dq_b, dk_b, dv_b = _block_grads(_rows(q, rows), _rows(block[0], cols), _rows(block[1], cols),
                                            _rows(dout, rows), lse if rows is None else lse[:, :, rows],
                                            delta if rows is None else delta[:, :, rows], keep, scale)
            dq = dq + dq_b if rows is None else dq.index_add(2, rows, dq_b)  # (B, H, rows, Dh) into (B, H, n, Dh)
            dk_loc = dk_b if cols is None else dk_loc.index_copy(2, cols, dk_b)
            dv_loc = dv_b if cols is None else dv_loc.index_copy(2, cols, dv_b)
        compute_s, compute_cpu_s = time.perf_counter() - t0, time.thread_time() - c0
        wait_s = wait_all(acc_reqs)  # this block's dK, dV from the ranks it visited before
        acc = [dk_loc, dv_loc] if acc_in is None else [acc_in[0] + dk_loc, acc_in[1] + dv_loc]
        sent = sum(x.numel() * x.element_size() for x in block) if t < P - 1 else 0
        if P > 1:  # pass the accumulators on; after step P - 1 this hop takes them home
            acc_in = [torch.empty_like(x) for x in acc]
            acc_reqs = post_ring_exchange(acc, acc_in, nxt, prv, group, traffic, "backward")
            sent += sum(x.numel() * x.element_size() for x in acc)
        wait_s += wait_all(reqs)
        if traffic is not None:
            traffic.steps.append(StepRecord("backward", t, sent, compute_s, wait_s, compute_cpu_s=compute_cpu_s))
        block = incoming
    if P == 1:
        dk, dv = acc
    else:
        wait_all(acc_reqs)
        dk, dv = acc_in  # this rank's own dK, dV, home after the full circle
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)  # rounded to the inputs' dtype once, at the end


class _RingAttention(torch.autograd.Function):
    """Forward: the ring of partials. Backward: the second ring, from the saved log-sum-exp."""

    @staticmethod
    def forward(ctx, q, k, v, kpm, causal, layout, scale, group, traffic):
        out, lse = _ring_forward(q, k, v, kpm, causal, layout, scale, group, traffic)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.kpm, ctx.causal, ctx.layout, ctx.scale, ctx.group, ctx.traffic = kpm, causal, layout, scale, group, traffic
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = _ring_backward(dout.contiguous(), q, k, v, ctx.kpm, out, lse, ctx.causal, ctx.layout,
                                    ctx.scale, ctx.group, ctx.traffic)
        return dq, dk, dv, None, None, None, None, None, None


def ring_attention(q, k, v, *, key_padding_mask=None, causal: bool = False, layout: str = "contiguous",
                   scale: float | None = None, group=None, traffic: Traffic | None = None) -> torch.Tensor:
    """This rank's shard of exact self-attention over the whole sequence, by ring attention.

    Call it on every rank of the process group at once (each with its own shards).

    Args:
        q, k, v: this rank's shards, (B, H, T/P, Dh), one floating dtype, cut by
            :func:`~selfattn.distributed.layout.shard_sequence` with ``layout``.
        key_padding_mask: optional this rank's shard (B, T/P) of a ``torch.bool`` (B, T) mask, True =
            real token; it travels with its keys. A query that sees only padding gets a zero row.
        causal: position i sees position j iff j <= i (positions in the full sequence).
        layout: ``"contiguous"`` or ``"zigzag"`` (:mod:`~selfattn.distributed.layout`).
        scale: score multiplier; default ``1 / sqrt(Dh)``.
        group: the process group (default: the whole world); ring order is rank order.
        traffic: optional :class:`~selfattn.distributed.comm.Traffic` that records the bytes sent
            (see the module for the formulas) and each step's compute and wait times.

    Returns:
        (B, H, T/P, Dh): rows of ``softmax(q k^T scale, masked) v`` for this rank's queries, differentiable
        (the backward runs a second ring; every rank must call backward too).

    Raises:
        RuntimeError: torch.distributed not initialised.
        TypeError / ValueError: non-tensors, dtypes, shapes not (B, H, T/P, Dh) alike, a bad mask,
        layout or scale, shards of odd length for the zigzag layout (T not divisible by 2P).

    Source: Liu, Zaharia and Abbeel (2023); Dao (2023), Algorithm 2; chapter 12.
    """
    P, _ = group_size_rank(group)
    causal, layout = check_shards(q, k, v, key_padding_mask, causal, layout, scale, P)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()  # sent as they are: contiguous buffers
    return _RingAttention.apply(q, k, v, key_padding_mask, causal, layout, scale, group, traffic)
