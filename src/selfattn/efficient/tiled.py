"""Exact attention in tiles with the online softmax (FlashAttention, Dao et al. 2022; Dao 2023).

The (T, S) score matrix is never built: queries are cut into blocks of ``block_q`` rows and keys into
blocks of ``block_k`` columns; each query block keeps a running maximum ``m``, a running sum ``l``
and an accumulator, rescaled whenever a new key block raises the maximum (``selfattn.ref.online``
holds the NumPy version). Peak extra memory is one (block_q, block_k) tile per head plus the output,
linear in the sequence length. Tiles that a causal or sliding-window mask hides entirely are skipped.

The backward pass is FlashAttention-2's (Dao 2023, Algorithm 2): it recomputes each tile's weights
from the saved log-sum-exp instead of storing them, so training memory is linear too.
Introduced in chapter 10.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch.autograd.function import once_differentiable

from .._validate import (
    require_attention_tensors,
    require_bool_mask,
    require_broadcastable,
    require_flag,
    require_min_rank,
    require_positive_int,
    require_scale,
    require_tensor,
)
from ..attention import _seen_matmul

__all__ = ["Visibility", "tiled_attention", "pick_forward", "DEFAULT_BLOCK_Q", "DEFAULT_BLOCK_K"]

# Large enough that the Python loop and the per-tile elementwise passes cost little next to the matrix
# products on a CPU (measured by bench/attention_bench.py), small enough that the one (H, block_q,
# block_k) float32 tile alive at a time (8 x 512 x 512 x 4 B = 8 MiB) stays below the output at long T.
DEFAULT_BLOCK_Q = 512
DEFAULT_BLOCK_K = 512
_HALF = (torch.float16, torch.bfloat16)
# Scores are kept in base 2 (s log2 e: the queries are scaled by scale * log2 e) so that the tiles use exp2,
# 2-3 times faster than exp on CPUs (FlashAttention does the same on GPUs), with no extra pass over a tile.
# The backward is handed the forward's own base-2 lse: converting lse to natural log and back adds a
# rounding of about |lse| * 1e-7 (1e-2 at logits near 1e5), and P = exp2(s - lse2) would be off by as much.
# (The Triton kernel works in natural log, so on that path the conversion remains: untested at such logits.)
_LOG2E = 1.0 / math.log(2.0)
_LN2 = math.log(2.0)


@dataclass(frozen=True)
class Visibility:
    """Which (query i, key j) pairs may attend, evaluated one tile at a time.

    Attributes:
        mask: boolean keep-mask of shape (..., T, S) (leading axes may broadcast), or None.
        causal_offset: if not None, key j is visible to query i only if ``j <= i + causal_offset``
            (0 for top-left alignment, ``S - T`` for bottom-right).
        window: if not None (sliding window, T == S): with ``causal_offset`` the keys
            ``i - window < j <= i``, without it ``|i - j| < window``.
    """

    mask: torch.Tensor | None = None
    causal_offset: int | None = None
    window: int | None = None

    def structural(self, i0: int, i1: int, j0: int, j1: int) -> bool | None:
        """True: every pair of the tile visible; False: none; None: it depends on the pair."""
        first_q, last_q, first_k, last_k = i0, i1 - 1, j0, j1 - 1
        if self.causal_offset is not None:
            off = self.causal_offset
            lo_all = -math.inf if self.window is None else last_q + off - self.window  # key must be > this
            lo_any = -math.inf if self.window is None else first_q + off - self.window
            if first_k > last_q + off or last_k <= lo_any:
                return False
            return True if (last_k <= first_q + off and first_k > lo_all) else None
        if self.window is not None:  # |i - j| < window
            if first_k - last_q >= self.window or first_q - last_k >= self.window:
                return False
            return True if (last_k - first_q < self.window and last_q - first_k < self.window) else None
        return True

    def key_span(self, i0: int, i1: int, j0: int, j1: int) -> tuple[int, int]:
        """The part of key columns [j0, j1) that the causal/window structure lets some query of rows
        [i0, i1) see (``mask`` not consulted); empty (start >= stop) if none."""
        if self.causal_offset is not None:
            j1 = min(j1, i1 + self.causal_offset)  # keys j <= (i1 - 1) + offset
            if self.window is not None:
                j0 = max(j0, i0 + self.causal_offset - self.window + 1)
        elif self.window is not None:
            j0, j1 = max(j0, i0 - self.window + 1), min(j1, i1 + self.window - 1)
        return j0, j1

    def band(self, i0: int, j0: int) -> tuple[int | None, int | None]:
        """Diagonals ``(lo, hi)`` (as in ``torch.triu``/``torch.tril``) of the tile starting at row i0,
        column j0: the structure keeps tile entry (r, c) iff ``lo <= c - r <= hi`` (None: no bound)."""
        if self.causal_offset is not None:
            hi = i0 + self.causal_offset - j0
            return (None if self.window is None else hi - self.window + 1), hi
        if self.window is not None:
            return i0 - j0 - self.window + 1, i0 - j0 + self.window - 1
        return None, None

    def tile(self, i0: int, i1: int, j0: int, j1: int, device) -> torch.Tensor | bool:
        """The keep-mask of tile rows [i0, i1) and columns [j0, j1): a bool tensor broadcastable
        to (..., i1 - i0, j1 - j0), or True (all visible) or False (nothing visible: skip it)."""
        whole = self.structural(i0, i1, j0, j1)
        if whole is False:
            return False
        keep = None
        if whole is None:
            i = torch.arange(i0, i1, device=device)[:, None]  # (bq, 1)
            j = torch.arange(j0, j1, device=device)[None, :]  # (1, bk)
            keep = torch.ones(i1 - i0, j1 - j0, dtype=torch.bool, device=device)
            if self.causal_offset is not None:
                keep &= j <= i + self.causal_offset
                if self.window is not None:
                    keep &= j > i + self.causal_offset - self.window
            elif self.window is not None:
                keep &= (i - j).abs() < self.window
        if self.mask is not None:
            tile_mask = self.mask[..., i0:i1, j0:j1]
            keep = tile_mask if keep is None else keep & tile_mask
        if keep is None:
            return True
        return keep if bool(keep.any()) else False


def _zero_unseen(k_t, v_t, keep):
    """Zero the keys and values of the tile that no query of the tile may read.

    0 * NaN = NaN, so a NaN stored at a masked position would otherwise reach the output through
    the matrix product even with weight 0 (masking is by replacement)."""
    seen = keep.any(dim=-2)[..., None]  # (..., bq, bk) -> (..., bk, 1)
    return torch.where(seen, k_t, 0.0), torch.where(seen, v_t, 0.0)


def _flat_keep(keep, lead: torch.Size, tile: torch.Size):
    """A tile's keep-mask, broadcastable to (*lead, bq, bk), as a (BH, bq, bk) tensor."""
    return keep.expand(*lead, *keep.shape[-2:]).reshape(tile)  # (..., bq, bk) -> (BH, bq, bk)


class _StructuralBias:
    """Additive masks (0 where visible, ``-inf`` where hidden) of the partially visible tiles of a
    causal or sliding-window structure, built once per forward call and reused: with T == S and
    equal blocks every diagonal tile has the same band, so one (bq, bk) tensor serves them all."""

    def __init__(self, vis: Visibility, dtype: torch.dtype, device):
        self.vis, self.dtype, self.device, self.cache = vis, dtype, device, {}

    def hide_(self, s, i0: int, j0: int):
        """Set the hidden scores of tile ``s`` (BH, bq, bk), starting at row i0 and column j0, to
        ``-inf`` in place: ``tril_``/``triu_`` write zeros (so a NaN stored there goes too), then the
        cached bias adds ``-inf``; several times faster on a CPU than a broadcast ``masked_fill_``."""
        lo, hi = self.vis.band(i0, j0)
        rows, cols = s.shape[-2:]
        bias = self.cache.get((lo, hi, rows, cols))
        if bias is None:
            keep = torch.ones(rows, cols, dtype=torch.bool, device=self.device)
            if hi is not None:
                keep.tril_(hi)
            if lo is not None:
                keep.triu_(lo)
            bias = torch.zeros(rows, cols, dtype=self.dtype, device=self.device).masked_fill_(~keep, -math.inf)
            self.cache[(lo, hi, rows, cols)] = bias
        if hi is not None:
            s.tril_(hi)
        if lo is not None:
            s.triu_(lo)
        return s.add_(bias)


def _work_dtype(dtype: torch.dtype) -> torch.dtype:
    """Arithmetic dtype: float32 for half-precision inputs, else the input's own."""
    return torch.float32 if dtype in _HALF else dtype


def _tiles(n: int, block: int) -> list[tuple[int, int]]:
    return [(start, min(start + block, n)) for start in range(0, n, block)]


def tiled_forward_torch(q, k, v, vis: Visibility, scale: float, block_q: int, block_k: int,
                        *, reverse_key_tiles: bool = False):
    """The tiled forward pass in plain torch; returns ``(out, lse)``.

    ``out`` (..., T, Dv) in the dtype of ``q``; ``lse`` (..., T) float32 (float64 for float64 inputs), ``-inf`` for a query that
    sees no key (its output row is zero). ``reverse_key_tiles`` visits the key tiles last to first,
    which must not change the result (tests use it). Source: Dao et al. (2022), Algorithm 1.
    """
    out, lse2 = _tiled_forward_base2(q, k, v, vis, scale, block_q, block_k, reverse_key_tiles=reverse_key_tiles)
    return out, lse2 * _LN2


@torch.no_grad()
def _tiled_forward_base2(q, k, v, vis: Visibility, scale: float, block_q: int, block_k: int,
                         *, reverse_key_tiles: bool = False):
    """:func:`tiled_forward_torch`, returning the base-2 ``lse2 = lse * log2 e`` that the backward
    needs exactly as computed here."""
    T, S, Dh, Dv, lead = q.shape[-2], k.shape[-2], q.shape[-1], v.shape[-1], q.shape[:-2]
    work, dev = _work_dtype(q.dtype), q.device
    BH = math.prod(lead)
    q3 = q.reshape(BH, T, Dh)  # (..., T, Dh) -> (BH, T, Dh): one batch axis for bmm (BH or T may be 0)
    out = torch.empty(BH, T, Dv, dtype=q.dtype, device=dev)
    lse = torch.empty(BH, T, dtype=work, device=dev)
    tile_buffer = torch.empty(BH * min(block_q, T) * min(block_k, S), dtype=work, device=dev)  # reused
    key_tiles = _tiles(S, block_k)[::-1] if reverse_key_tiles else _tiles(S, block_k)
    # Else a NaN value must reach only the rows that see it. The sum, not isfinite(v).all(): no
    # (..., S, Dv) temporary, so the memory stays O(tile) (a sum that overflows to inf only takes
    # the exact slow path, which is still right).
    finite_v = bool(torch.isfinite(v.sum()))
    structural = _StructuralBias(vis, work, dev) if vis.mask is None else None
    # The query block and its accumulator live in buffers reused by every block, so that the memory
    # beyond the output is the same at every length (a fresh block's tensors would otherwise be
    # allocated while the previous block's are still alive).
    q_buffer = torch.empty(BH * min(block_q, T) * Dh, dtype=work, device=dev)
    acc_buffer = torch.empty(BH * min(block_q, T) * Dv, dtype=work, device=dev)
    for i0, i1 in _tiles(T, block_q):
        n = i1 - i0
        # the scaled queries, float32 for half inputs; the backward recomputes them the same way
        q_t = q_buffer[: BH * n * Dh].view(BH, n, Dh).copy_(q3[:, i0:i1]).mul_(scale * _LOG2E)
        m = torch.full((BH, n), -math.inf, dtype=work, device=dev)  # running max (BH, bq), base 2
        l = torch.zeros((BH, n), dtype=work, device=dev)  # running sum of exp2(s - m)
        acc = acc_buffer[: BH * n * Dv].view(BH, n, Dv).zero_()  # (BH, bq, Dv)
        for j0, j1 in key_tiles:
            j0, j1 = vis.key_span(i0, i1, j0, j1)  # only keys some query of the tile may see
            if j0 >= j1:
                continue
            if structural is not None:  # causal/window only: True (all visible), None (some), False
                keep = vis.structural(i0, i1, j0, j1)
            else:
                keep = vis.tile(i0, i1, j0, j1, dev)
            if keep is False:  # the whole tile is masked: no arithmetic at all
                continue
            k_t, v_t = k[..., j0:j1, :].to(work), v[..., j0:j1, :].to(work)
            if keep is not True and structural is None:
                k_t, v_t = _zero_unseen(k_t, v_t, keep)
            k_t, v_t = k_t.reshape(BH, j1 - j0, Dh), v_t.reshape(BH, j1 - j0, Dv)  # (..., bk, D) -> (BH, bk, D)
            s = tile_buffer[: BH * (i1 - i0) * (j1 - j0)].view(BH, i1 - i0, j1 - j0)
            torch.bmm(q_t, k_t.transpose(1, 2), out=s)  # (BH, bq, Dh) @ (BH, Dh, bk) -> (BH, bq, bk)
            if keep is None:
                structural.hide_(s, i0, j0)
            elif keep is not True:
                s.view(*lead, *s.shape[-2:]).masked_fill_(~keep, -math.inf)
            m_new = torch.maximum(m, s.amax(dim=-1))
            # A row that has seen only masked entries keeps m = -inf: shift by 0 so that
            # exp(-inf - -inf) = NaN never happens; exp(-inf - 0) = 0 adds nothing.
            shift = m_new if keep is True else torch.where(m_new == -math.inf, 0.0, m_new)
            p = torch.exp2(s.sub_(shift[..., None]), out=s)  # in place: the one tile buffer
            correction = torch.exp2(m - shift)  # (BH, bq): rescales what was summed under the old max
            l.mul_(correction).add_(p.sum(dim=-1))
            acc.mul_(correction[..., None])
            if finite_v or keep is True:
                acc.baddbmm_(p, v_t)  # += (BH, bq, bk) @ (BH, bk, Dv) -> (BH, bq, Dv)
            else:
                if keep is None:  # the structural keep-mask of this tile, for the exact slow path
                    keep = torch.isfinite(structural.cache[(*vis.band(i0, j0), i1 - i0, j1 - j0)])
                acc.add_(_seen_matmul(p, v_t, _flat_keep(keep, lead, p.shape)))  # slower, exact for non-finite v
            m = m_new
        seen = l != 0  # not `l > 0`: a NaN score (a visible NaN key) must give NaN, not a zero row
        if bool(seen.all()):  # the usual case: every query of the block saw a key
            out[:, i0:i1] = acc.div_(l[..., None])
            lse[:, i0:i1] = m + torch.log2(l)
        else:
            out[:, i0:i1] = torch.where(seen[..., None], acc / torch.where(seen, l, 1.0)[..., None], 0.0)
            lse[:, i0:i1] = torch.where(seen, m + torch.log2(torch.where(seen, l, 1.0)), -math.inf)
    return out.view(*lead, T, Dv), lse.view(*lead, T)  # (BH, T, Dv) -> (..., T, Dv)


@torch.no_grad()
def tiled_backward_torch(q, k, v, out, lse2, d_out, vis: Visibility, scale: float, block_q: int,
                         block_k: int):
    """Gradients of q, k, v, recomputing each tile's weights from ``lse2`` (Dao 2023, Algorithm 2).

    ``lse2`` (..., T) is the base-2 log-sum-exp, ``lse * log2 e``, as the forward computed it. With
    ``P = exp(S - lse)``: ``dV = P^T dO``, ``dP = dO V^T``, ``dS = P * (dP - rowsum(dO * O))``,
    ``dQ = dS K * scale``, ``dK = dS^T Q * scale``. A query with ``lse = -inf`` (no visible key) has
    ``P = 0`` and so contributes zero gradients. The scores are recomputed exactly as the torch
    forward computed them (the same scaled queries, tiles and products: the scores are the
    forward's bit for bit), so ``P`` differs from the forward's weights only by the rounding of the
    stored ``lse2`` (half a unit in its last place, about ``|lse2| * 6e-8`` in float32), as in
    torch's own CPU flash backward. A NaN or inf stored at a query or key reaches only the
    gradients of the pairs the mask lets see it.
    """
    T, S, Dh, Dv, lead = q.shape[-2], k.shape[-2], q.shape[-1], v.shape[-1], q.shape[:-2]
    work, dev = _work_dtype(q.dtype), q.device
    BH = math.prod(lead)
    q3, do3 = q.reshape(BH, T, Dh), d_out.reshape(BH, T, Dv)  # (..., T, D) -> (BH, T, D), as the forward
    delta = (do3.to(work) * out.reshape(BH, T, Dv).to(work)).sum(dim=-1)  # (BH, T): rowsum(dO * O)
    lse_safe = torch.where(torch.isfinite(lse2), lse2, math.inf).reshape(BH, T).to(work)  # exp2(s - inf) = 0
    # Else a NaN query or key must reach only the pairs that see it (a sum: no (T, Dh) temporary)
    finite_qk = bool(torch.isfinite(q.sum()) & torch.isfinite(k.sum()))
    dq = torch.zeros(BH, T, Dh, dtype=work, device=dev)
    dk = torch.zeros(BH, S, Dh, dtype=work, device=dev)
    dv = torch.zeros(BH, S, Dv, dtype=work, device=dev)
    for tile_j0, tile_j1 in _tiles(S, block_k):
        for i0, i1 in _tiles(T, block_q):
            j0, j1 = vis.key_span(i0, i1, tile_j0, tile_j1)  # the forward's key span of this tile
            keep = vis.tile(i0, i1, j0, j1, dev) if j0 < j1 else False
            if keep is False:
                continue
            k_t, v_t = k[..., j0:j1, :].to(work), v[..., j0:j1, :].to(work)
            if keep is not True:
                k_t, v_t = _zero_unseen(k_t, v_t, keep)
            k_t, v_t = k_t.reshape(BH, j1 - j0, Dh), v_t.reshape(BH, j1 - j0, Dv)  # (..., bk, D) -> (BH, bk, D)
            q_t, do_t = q3[:, i0:i1].to(work) * (scale * _LOG2E), do3[:, i0:i1].to(work)  # as the forward's q_t
            s = torch.bmm(q_t, k_t.transpose(1, 2))  # (BH, bq, Dh) @ (BH, Dh, bk) -> (BH, bq, bk)
            if keep is not True:
                s.view(*lead, *s.shape[-2:]).masked_fill_(~keep, -math.inf)
            p = torch.exp2(s.sub_(lse_safe[:, i0:i1, None]), out=s)  # the forward's weights
            dv[:, j0:j1] += p.transpose(1, 2) @ do_t  # (BH, bk, bq) @ (BH, bq, Dv) -> (BH, bk, Dv)
            dp = do_t @ v_t.transpose(1, 2)  # (BH, bq, Dv) @ (BH, Dv, bk) -> (BH, bq, bk)
            ds = p.mul_(dp.sub_(delta[:, i0:i1, None]))  # dS = P * (dP - delta), in p's buffer
            if keep is not True:  # p = 0 there, but 0 * NaN = NaN: a non-finite value must not reach
                ds.view(*lead, *ds.shape[-2:]).masked_fill_(~keep, 0.0)  # the queries that may not see it
            if keep is True or finite_qk:
                dq[:, i0:i1] += (ds @ k_t) * scale  # (BH, bq, bk) @ (BH, bk, Dh) -> (BH, bq, Dh)
                dk[:, j0:j1] += ds.transpose(1, 2) @ q_t  # (BH, bk, bq) @ (BH, bq, Dh); q_t holds scale log2 e
            else:  # slower, exact: ds @ k_t would compute 0 * NaN for the pairs the mask hides
                flat = _flat_keep(keep, lead, ds.shape)
                dq[:, i0:i1] += _seen_matmul(ds, k_t, flat) * scale
                dk[:, j0:j1] += _seen_matmul(ds.transpose(1, 2), q_t, flat.transpose(1, 2))
    dk.mul_(_LN2)  # the sums above used q * scale * log2 e: one pass over dk instead of one per tile
    return (dq.view(q.shape).to(q.dtype), dk.view(k.shape).to(k.dtype),  # (BH, T, D) -> (..., T, D)
            dv.view(v.shape).to(v.dtype))


def pick_forward(q: torch.Tensor, vis: Visibility):
    """Choose the forward kernel: the Triton kernel for CUDA tensors with causal or no masking and
    no sliding window (when Triton is installed), else the torch loop :func:`tiled_forward_torch`.

    Returns a callable with the signature of :func:`tiled_forward_torch` (without
    ``reverse_key_tiles``)."""
    if q.is_cuda and vis.mask is None and vis.window is None and q.numel() > 0:
        from . import triton_kernel

        if triton_kernel.triton_available():
            return triton_kernel.triton_forward
    return tiled_forward_torch


class _TiledAttentionFunction(torch.autograd.Function):
    """Forward by tiles (torch loop or Triton), backward by recomputation; the weights are never
    stored, so the memory kept for backward is q, k, v, out and lse: linear in length."""

    @staticmethod
    def forward(ctx, q, k, v, vis, scale, block_q, block_k):
        forward = pick_forward(q, vis)
        if forward is tiled_forward_torch:  # keep the loop's own base-2 lse: the backward needs it exact
            out, lse2 = _tiled_forward_base2(q, k, v, vis, scale, block_q, block_k)
            lse = lse2 * _LN2
        else:  # the Triton kernel works in natural log
            out, lse = forward(q, k, v, vis, scale, block_q, block_k)
            lse2 = lse * _LOG2E
        ctx.save_for_backward(q, k, v, out, lse2)
        ctx.vis, ctx.scale, ctx.blocks = vis, scale, (block_q, block_k)
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    @once_differentiable  # the hand-written backward is not itself differentiable: a second
    def backward(ctx, d_out, _d_lse):  # derivative raises instead of silently being zero
        q, k, v, out, lse2 = ctx.saved_tensors
        dq, dk, dv = tiled_backward_torch(q, k, v, out, lse2, d_out, ctx.vis, ctx.scale, *ctx.blocks)
        return dq, dk, dv, None, None, None, None


def validate_attention_inputs(q, k, v, mask, scale):
    """Shared argument checks of the tiled functions (same contract as
    ``selfattn.scaled_dot_product_attention``); returns the scale to use."""
    require_attention_tensors(q, k, v)
    require_scale(scale)
    if mask is not None:
        require_tensor("mask", mask)
        if mask.device != q.device:
            raise ValueError(f"mask must be on the device of q ({q.device}); got {mask.device}")
        require_bool_mask("mask", mask)
        require_min_rank("mask", mask, 2, "(..., T, S)")
        target = tuple(q.shape[:-2]) + (q.shape[-2], k.shape[-2])
        require_broadcastable("mask", mask, target, "(..., T, S) =")
    return 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)


def causal_offset(T: int, S: int, alignment: str | None) -> int:
    """``0`` for top-left, ``S - T`` for bottom-right alignment (see ``selfattn.causal_mask``).

    Raises:
        ValueError: ``alignment`` unknown, or missing when ``T != S``."""
    if alignment is not None and alignment not in ("top_left", "bottom_right"):
        raise ValueError(f"alignment must be 'top_left', 'bottom_right' or None; got {alignment!r}")
    if T != S and alignment is None:
        raise ValueError(
            f"causal attention with T={T} queries and S={S} keys needs an explicit alignment: "
            "'top_left' (query i sees keys <= i) or 'bottom_right' (query i sees keys <= i + S - T)"
        )
    return S - T if alignment == "bottom_right" else 0


def tiled_attention(q, k, v, mask=None, *, causal: bool = False, alignment: str | None = None,
                    scale: float | None = None, block_q: int = DEFAULT_BLOCK_Q,
                    block_k: int = DEFAULT_BLOCK_K, return_lse: bool = False):
    """Exact scaled dot-product attention computed tile by tile with the online softmax.

    Equal (to rounding) to ``selfattn.scaled_dot_product_attention(q, k, v, keep)`` where ``keep``
    is ``mask`` and, with ``causal=True``, ``causal_mask(T, S, alignment=alignment)``; but the
    (T, S) score matrix is never stored: extra memory is one (block_q, block_k) tile per head plus
    the output. On CUDA with no ``mask`` the forward pass runs the Triton kernel
    (:mod:`selfattn.efficient.triton_kernel`); the backward pass recomputes the weights tile by
    tile from the log-sum-exp, so training memory is linear in length too.

    Args:
        q: queries (..., T, Dh), typically (B, H, T, Dh); float32, float16 or bfloat16.
        k: keys (..., S, Dh); v: values (..., S, Dv); same dtype as ``q``.
        mask: optional boolean keep-mask (True = may attend) broadcastable to (..., T, S). Tiles in
            which it is all False are skipped.
        causal: also hide key j from query i when ``j > i`` (top-left) or ``j > i + S - T``
            (bottom-right); tiles above the diagonal are skipped without being computed.
        alignment: ``"top_left"`` or ``"bottom_right"``; required when ``causal`` and ``T != S``.
        scale: score multiplier; default ``1 / sqrt(Dh)``.
        block_q: query rows per tile (> 0; need not divide T).
        block_k: key columns per tile (> 0; need not divide S).
        return_lse: also return ``lse = log sum_j exp(scale * q_i . k_j)`` over the visible keys.

    Returns:
        ``out`` (..., T, Dv) in the dtype of ``q`` (scores, softmax and accumulation in float32);
        with ``return_lse``, also ``lse`` (..., T), float32 (float64 for float64 inputs), without gradient. A query with no
        visible key gets a zero output row, ``lse = -inf``, and zero (finite) gradients. A NaN or
        inf stored at a hidden position reaches neither the outputs nor the gradients of the rows
        that may not see it, whatever the block sizes. First derivatives
        only: the backward is hand-written and not itself differentiable, so differentiating the
        gradients again (``create_graph=True``, e.g. a gradient penalty) raises a RuntimeError
        (torch's wording depends on the call); use ``selfattn.scaled_dot_product_attention`` for that.

    Raises:
        TypeError: non-tensor or non-floating inputs, different dtypes, a non-boolean mask.
        TypeError also for ``causal`` or ``return_lse`` not a bool.
        ValueError: mismatched shapes, a mask that does not broadcast to (..., T, S) or is on another
        device than ``q``, a bad scale or
        block size, ``alignment`` missing when causal with T != S, or given without ``causal``.

    Source: chapter 10; Dao et al. (2022), FlashAttention, Algorithm 1; backward Dao (2023),
    FlashAttention-2, Algorithm 2.
    """
    return_lse = require_flag("return_lse", return_lse)
    scale = validate_attention_inputs(q, k, v, mask, scale)
    block_q, block_k = require_positive_int("block_q", block_q), require_positive_int("block_k", block_k)
    causal = require_flag("causal", causal)
    if alignment is not None and not causal:
        raise ValueError(f"alignment={alignment!r} only applies with causal=True")
    T, S = q.shape[-2], k.shape[-2]
    offset = causal_offset(T, S, alignment) if causal else None
    if mask is not None:  # a view with real (T, S) axes, so that tiles can be sliced from it
        mask = mask.expand(*mask.shape[:-2], T, S)
    vis = Visibility(mask=mask, causal_offset=offset)
    out, lse = _TiledAttentionFunction.apply(q, k, v, vis, scale, block_q, block_k)
    return (out, lse) if return_lse else out
