"""Exact attention in tiles with the online softmax (FlashAttention, Dao et al. 2022; Dao 2023).

The (T, S) score matrix is never built: queries are cut into blocks of ``block_q`` rows and keys into
blocks of ``block_k`` columns; each query block keeps a running maximum ``m``, a running sum ``l``
and an accumulator, rescaled whenever a new key block raises the maximum (``selfattn.ref.online``
holds the NumPy version). Peak extra memory is one (block_q, block_k) tile per head plus the output,
linear in the sequence length. Tiles that a causal or sliding-window mask hides entirely are skipped,
and so are those hidden by a ``mask_mod(b, h, q_idx, kv_idx)`` (FlexAttention's way to describe a mask,
Dong et al. 2024), which is evaluated on each tile's index grid: empty tiles are skipped, full tiles
take the unmasked path, partial ones are masked.
A sliding window whose band of keys fits one key tile per query block needs no online softmax at all:
it has its own band kernel (``_window_band_forward_base2``), which batches many query blocks per product.
An additive score bias (ALiBi, Press et al. 2022; chapter 08) is sliced per tile from a tensor or
computed per tile from the tile's positions, so that ALiBi too runs without a (T, S) matrix.

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
from ..masks import evaluate_mask_mod
from . import head_groups

__all__ = ["Visibility", "tiled_attention", "mask_mod_tile_kinds", "TILE_EMPTY", "TILE_PARTIAL", "TILE_FULL", "pick_forward", "DEFAULT_BLOCK_Q", "DEFAULT_BLOCK_K",
           "WINDOW_BLOCK_Q", "WINDOW_BACKWARD_BLOCK_Q", "WINDOW_BLOCK_K"]

# Large enough that the Python loop and the per-tile elementwise passes cost little next to the matrix
# products on a CPU (measured by bench/attention_bench.py --sweep: on a 2-core AMD EPYC with AVX-512,
# 512 x 512 was among the best of 128-1024 x 256-1024 blocks, forward and backward, causal or not, and
# keeps the tile constant from T = 512 on), small enough that the one (H, block_q, block_k) float32
# tile alive at a time (8 x 512 x 512 x 4 B = 8 MiB; two in the backward) stays below the output at long T.
DEFAULT_BLOCK_Q = 512
DEFAULT_BLOCK_K = 512
# A sliding window's tiles: short query blocks, so that the band each one reads (block_q + window - 1
# keys, trimmed by Visibility.key_span) is little more than the window (at w=256: 32-row blocks compute
# 288 scores a row for 256 visible, 64-row blocks 320, 128-row blocks 384), and key blocks long enough
# that the band is one tile, so that the band kernel (_window_band_forward_base2) applies; the buffers
# are sized by the band, not by block_k. Measured by bench/attention_bench.py (w=256, T=8192): in the
# forward, 32 beat 16, 64 and 128 (one thread: 34 ms for 4 heads against 37.5 at 64). The backward (the
# general recomputing loop, no band kernel) has its own block size, WINDOW_BACKWARD_BLOCK_Q, measured by
# bench/attention_bench.py --window-sweep (bench/results/window-sweep-cpu-2026-12-02.md, its two quiet runs;
# 2-core AMD EPYC, AVX-512): forward plus backward with the backward at 64 rows took 144 and 157 ms, at 32
# rows 1.07 and 1.18 times as long, at 128 rows 1.15 and 1.07, at 16 rows 1.37 and 1.52; the forward at 64
# rows took 1.05 and 1.07 times as long as at 32.
WINDOW_BLOCK_Q = 32
WINDOW_BACKWARD_BLOCK_Q = 64
WINDOW_BLOCK_K = 1 << 16
_HALF = (torch.float16, torch.bfloat16)
# The tiles hold the natural-unit scores s = (q * scale) . k and their running maximum m; s - m is formed
# there, and only then scaled into base 2 for exp2, 2-3 times faster than exp on CPUs (FlashAttention uses
# exp2 on GPUs too): exp2((s - m) * log2 e). Scaling first (base-2 scores (q * scale * log2 e) . k) rounded
# the scores at 1.44 times their size (past 2^16 at |s| ~ 6e4: twice the rounding) and q once more, and
# where a row's largest weights were close, out and dK were off by up to 44x and 93x SDPA's error;
# s - m of nearby scores is exact, as in SDPA's exp(s - m). The backward is handed the forward's own
# statistics in two parts, the row maximum m (natural units) and log2 l, and forms
# exp2((s - m) * log2 e - log2 l): converting lse to one number would round it at the size of m, and a
# bias such as ALiBi's puts m in the thousands without saturating the softmax (several times torch's
# error in dV). A bias is added to the tile in float64, so that the biased score is rounded once, as
# torch's s + bias is. (The Triton kernel works in natural log throughout: exp(s - m).)
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
        mask_mod: if not None, a function ``mask_mod(b, h, q_idx, kv_idx) -> bool tensor`` (True =
            keep), evaluated on each tile's index grid (:func:`selfattn.masks.evaluate_mask_mod`).
        lead: the (B, H) sizes over which ``mask_mod``'s ``b`` and ``h`` run.
    """

    mask: torch.Tensor | None = None
    causal_offset: int | None = None
    window: int | None = None
    mask_mod: object = None
    lead: tuple = ()

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

    def max_keys(self, block_q: int, block_k: int, S: int) -> int:
        """The most key columns of any visited tile: ``block_k`` (at most S), or the band of one
        query block under a sliding window if that is narrower (what the tile buffers are sized by)."""
        cols = min(block_k, S)
        if self.window is not None:
            band = block_q + self.window - 1 if self.causal_offset is not None else block_q + 2 * self.window - 2
            cols = min(cols, band)
        return max(cols, 0)

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
        if self.mask_mod is not None:
            # the function on this tile's grid only: O(tile) memory, never the (T, S) mask
            grid = evaluate_mask_mod(self.mask_mod, *(torch.arange(n, device=device) for n in self.lead),
                                     torch.arange(i0, i1, device=device), torch.arange(j0, j1, device=device))
            keep = grid if keep is None else keep & grid
            if bool(keep.all()):  # a full tile: the unmasked path, as a causal tile below the diagonal
                return True
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


def _band_bias(lo: int | None, hi: int | None, rows: int, cols: int, dtype, device) -> torch.Tensor:
    """The (rows, cols) additive mask that keeps entry (r, c) iff ``lo <= c - r <= hi`` (0 there,
    ``-inf`` elsewhere; None: no bound), the diagonals of :meth:`Visibility.band`."""
    keep = torch.ones(rows, cols, dtype=torch.bool, device=device)
    if hi is not None:
        keep.tril_(hi)
    if lo is not None:
        keep.triu_(lo)
    return torch.zeros(rows, cols, dtype=dtype, device=device).masked_fill_(~keep, -math.inf)


class _StructuralBias:
    """Additive masks (0 where visible, ``-inf`` where hidden) of the partially visible tiles of a
    causal or sliding-window structure, built once per forward call and reused: with T == S and
    equal blocks every diagonal tile has the same band, so one (bq, bk) tensor serves them all."""

    def __init__(self, vis: Visibility, dtype: torch.dtype, device):
        self.vis, self.dtype, self.device, self.cache = vis, dtype, device, {}

    def bias(self, i0: int, j0: int, rows: int, cols: int) -> torch.Tensor:
        """The (rows, cols) additive mask of the tile starting at row i0 and column j0 (cached)."""
        lo, hi = self.vis.band(i0, j0)
        bias = self.cache.get((lo, hi, rows, cols))
        if bias is None:
            bias = _band_bias(lo, hi, rows, cols, self.dtype, self.device)
            self.cache[(lo, hi, rows, cols)] = bias
        return bias

    def hide_(self, s, i0: int, j0: int):
        """Set the hidden scores of tile ``s`` (BH, bq, bk), starting at row i0 and column j0, to
        ``-inf`` in place: ``tril_``/``triu_`` write zeros (so a NaN stored there goes too), then the
        cached bias adds ``-inf``; several times faster on a CPU than a broadcast ``masked_fill_``."""
        lo, hi = self.vis.band(i0, j0)
        bias = self.bias(i0, j0, *s.shape[-2:])
        if hi is not None:
            s.tril_(hi)
        if lo is not None:
            s.triu_(lo)
        return s.add_(bias)

    def scores(self, q_t, k_t, i0: int, j0: int, out):
        """The masked scores of a partially visible tile in one pass, ``bias + q_t @ k_t^T``
        (``baddbmm`` adds the cached mask to the product): for finite q and k only (a NaN stored at
        a hidden key would give ``NaN + -inf = NaN``); a visible score is the product plus 0, the
        value ``bmm`` gives (bit for bit where the kernel rounds the product the same way)."""
        bias = self.bias(i0, j0, q_t.shape[-2], k_t.shape[-2])
        return torch.baddbmm(bias.expand(out.shape), q_t, k_t.transpose(1, 2), out=out)


def _to_base2(b: torch.Tensor) -> torch.Tensor:
    """A bias tile in natural-log units, as the tiles' scores, in float64 (a new
    tensor, never the caller's), so that :func:`_add_bias_` rounds the biased score only once."""
    return b.to(torch.float64, copy=True)  # a copy: _add_bias_ may write into it


def _add_bias_(s: torch.Tensor, bias2: torch.Tensor) -> torch.Tensor:
    """``s += bias2`` in place (``s`` (*lead, bq, bk) natural-unit scores, ``bias2`` from :func:`_to_base2`).

    In float32 the sum is formed in float64 and rounded once: converting the bias to float32
    first and then adding would round twice at the size of the bias (thousands for ALiBi at long T),
    about twice torch's error with the same additive mask; one rounding keeps within its factor."""
    if s.dtype == torch.float64:
        return s.add_(bias2)
    # float64 + float32 -> float64, rounded once to s's dtype by copy_; bias2 is this tile's own
    # temporary, so it can hold the sum when it has the tile's full shape
    return s.copy_(bias2.add_(s) if bias2.shape == s.shape else bias2 + s)


class _TensorBias:
    """An additive bias tensor broadcastable to (*lead, T, S), sliced one tile at a time.

    ``full`` is the bias with leading size-1 axes up to the rank of (*lead, T, S) (a view); ``view``
    expands its last two axes to (T, S) (a view, no copy), so that a tile can be sliced from it.
    With ``needs_grad``, :meth:`accumulate_grad_` sums each tile's score gradient into ``grad``
    (the shape of ``full``), reduced over the axes that the bias broadcasts."""

    def __init__(self, bias: torch.Tensor, lead: torch.Size, T: int, S: int, *, needs_grad: bool = False,
                 work: torch.dtype = torch.float32):
        self.bias = bias
        self.full = bias[(None,) * (len(lead) + 2 - bias.ndim)]  # (..., T or 1, S or 1) at full rank
        self.view = self.full.expand(*self.full.shape[:-2], T, S)
        self.lead = lead
        # summed in the wider of the tiles' dtype and the bias's (float32 at least), cast back at the end
        grad_dtype = torch.promote_types(work, _work_dtype(bias.dtype))
        self.grad = torch.zeros(self.full.shape, dtype=grad_dtype, device=bias.device) if needs_grad else None

    def tile(self, i0: int, i1: int, j0: int, j1: int, *, check_grad: bool = False):
        """The bias of rows [i0, i1) and columns [j0, j1), in float64, broadcastable to (*lead, bq, bk)."""
        return _to_base2(self.view[..., i0:i1, j0:j1])

    def accumulate_grad_(self, ds: torch.Tensor, i0: int, i1: int, j0: int, j1: int):
        """``grad += dS`` of the tile (``ds`` (BH, bq, bk), natural-log units: d out / d score),
        summed over the axes on which the bias has size 1 (it was broadcast there)."""
        d = ds.view(*self.lead, i1 - i0, j1 - j0)  # (BH, bq, bk) -> (*lead, bq, bk)
        axes = [a for a, n in enumerate(self.full.shape) if n == 1 and d.shape[a] != 1]
        if axes:
            d = d.sum(dim=axes, keepdim=True)  # (*lead, bq, bk) -> the bias's own (broadcast) shape
        rows = slice(0, 1) if self.full.shape[-2] == 1 else slice(i0, i1)
        cols = slice(0, 1) if self.full.shape[-1] == 1 else slice(j0, j1)
        self.grad[..., rows, cols] += d.to(self.grad.dtype)

    def grad_of_input(self) -> torch.Tensor:
        """``grad`` in the shape and dtype of the bias that was passed in."""
        return self.grad.reshape(self.bias.shape).to(self.bias.dtype)


class _CallableBias:
    """``score_bias(q_idx, k_idx)`` called once per tile with the tile's int64 query rows (bq,) and
    key columns (bk,); its result (natural-log units) is checked and converted to float64.

    With ``grad_enabled`` (the caller's grad mode), the forward calls it with grad mode on, so that a
    result depending on a learned parameter shows ``requires_grad`` and is refused: no gradient
    flows into ``score_bias`` (pass such a bias as ``bias=``)."""

    def __init__(self, fn, lead: torch.Size, device, *, grad_enabled: bool = False):
        self.fn, self.lead, self.device, self.grad_enabled = fn, lead, device, grad_enabled
        self.grad = None  # nothing to differentiate

    def tile(self, i0: int, i1: int, j0: int, j1: int, *, check_grad: bool = False):
        """The checked result for rows [i0, i1) and columns [j0, j1), float64 (see the class)."""
        q_idx = torch.arange(i0, i1, device=self.device)  # (bq,) int64: the query rows of the tile
        k_idx = torch.arange(j0, j1, device=self.device)  # (bk,) int64: its key columns
        with torch.set_grad_enabled(self.grad_enabled and check_grad):
            b = self.fn(q_idx, k_idx)
        target = (*self.lead, i1 - i0, j1 - j0)
        what = f"score_bias(q_idx, k_idx) with q_idx = arange({i0}, {i1}), k_idx = arange({j0}, {j1})"
        if not isinstance(b, torch.Tensor):
            raise TypeError(f"{what} must return a torch.Tensor; got {type(b).__name__}")
        if not b.dtype.is_floating_point:
            raise TypeError(f"{what} must return a floating tensor added to the scores; got dtype {b.dtype}")
        if b.device != self.device:
            raise ValueError(f"{what} must return a tensor on the device of q ({self.device}); got {b.device}")
        shape = tuple(b.shape)
        if len(shape) > len(target) or any(n not in (1, t) for n, t in zip(shape[::-1], target[::-1], strict=False)):
            raise ValueError(f"{what} must return a bias broadcastable to (..., bq, bk) = {target}; got shape {shape}")
        if b.requires_grad:
            raise ValueError(
                f"{what} returned a tensor that requires grad (does it use a learned parameter?): tiled_attention "
                "passes no gradient into score_bias; build that bias as a tensor and pass it as bias=... instead"
            )
        return _to_base2(b)


def _work_dtype(dtype: torch.dtype) -> torch.dtype:
    """Arithmetic dtype: float32 for half-precision inputs, else the input's own."""
    return torch.float32 if dtype in _HALF else dtype


def _tiles(n: int, block: int) -> list[tuple[int, int]]:
    return [(start, min(start + block, n)) for start in range(0, n, block)]


def tiled_forward_torch(q, k, v, vis: Visibility, scale: float, block_q: int, block_k: int,
                        *, reverse_key_tiles: bool = False, bias=None):
    """The tiled forward pass in plain torch; returns ``(out, lse)``.

    ``out`` (..., T, Dv) in the dtype of ``q``; ``lse`` (..., T) float32 (float64 for float64 inputs), ``-inf`` for a query that
    sees no key (its output row is zero). ``reverse_key_tiles`` visits the key tiles last to first,
    which must not change the result (tests use it). ``bias``: None, or the tile source of an additive
    score bias (a ``_TensorBias`` or ``_CallableBias``, as :func:`tiled_attention` builds them).
    Source: Dao et al. (2022), Algorithm 1.
    """
    out, m2, log2_l = _tiled_forward_base2(q, k, v, vis, scale, block_q, block_k,
                                           reverse_key_tiles=reverse_key_tiles, bias=bias)
    return out, m2 + log2_l * _LN2


@torch.no_grad()
def _tiled_forward_base2(q, k, v, vis: Visibility, scale: float, block_q: int, block_k: int,
                         *, reverse_key_tiles: bool = False, bias=None, out=None):
    """:func:`tiled_forward_torch`, returning ``(out, m2, log2_l)``: the log-sum-exp
    ``lse = m2 + log2_l * ln 2`` in the two parts that the backward needs exactly as computed here,
    the row maximum ``m2`` of the (natural-unit) scores (``-inf`` for a query that sees no key) and
    ``log2_l`` (0 for such a query). ``out``: None, or a contiguous (BH, T, Dv) tensor of the dtype
    of ``q`` to write the output into (the head groups of :mod:`.head_groups` write into one output)."""
    T, S, Dh, Dv, lead = q.shape[-2], k.shape[-2], q.shape[-1], v.shape[-1], q.shape[:-2]
    work, dev = _work_dtype(q.dtype), q.device
    BH = math.prod(lead)
    q3 = q.reshape(BH, T, Dh)  # (..., T, Dh) -> (BH, T, Dh): one batch axis for bmm (BH or T may be 0)
    out = torch.empty(BH, T, Dv, dtype=q.dtype, device=dev) if out is None else out.view(BH, T, Dv)
    row_max = torch.empty(BH, T, dtype=work, device=dev)
    log2_sum = torch.empty(BH, T, dtype=work, device=dev)
    tile_buffer = torch.empty(BH * min(block_q, T) * vis.max_keys(block_q, block_k, S), dtype=work, device=dev)  # reused
    key_tiles = _tiles(S, block_k)[::-1] if reverse_key_tiles else _tiles(S, block_k)
    # Else a NaN value must reach only the rows that see it. The sum, not isfinite(v).all(): no
    # (..., S, Dv) temporary, so the memory stays O(tile) (a sum that overflows to inf only takes
    # the exact slow path, which is still right).
    finite_v = bool(torch.isfinite(v.sum()))
    structural = _StructuralBias(vis, work, dev) if vis.mask is None and vis.mask_mod is None else None
    # a causal/window tile that is partly visible is masked inside its matrix product (one pass less)
    # when q and k are finite; else by tril_/triu_, which also removes a NaN stored at a hidden key.
    # Without causal or window structure no tile is partly visible: q and k are not read for the check.
    fused_mask = (structural is not None and (vis.causal_offset is not None or vis.window is not None)
                  and bool(torch.isfinite(q.sum()) & torch.isfinite(k.sum())))
    # The query block and its accumulator live in buffers reused by every block, so that the memory
    # beyond the output is the same at every length (a fresh block's tensors would otherwise be
    # allocated while the previous block's are still alive).
    q_buffer = torch.empty(BH * min(block_q, T) * Dh, dtype=work, device=dev)
    acc_buffer = torch.empty(BH * min(block_q, T) * Dv, dtype=work, device=dev)
    for i0, i1 in _tiles(T, block_q):
        n = i1 - i0
        # the scaled queries, float32 for half inputs; the backward recomputes them the same way
        q_t = q_buffer[: BH * n * Dh].view(BH, n, Dh).copy_(q3[:, i0:i1]).mul_(scale)
        m = l = None  # running max (BH, bq), natural units, and running sum of exp(s - m): from the first tile
        acc = acc_buffer[: BH * n * Dv].view(BH, n, Dv)  # (BH, bq, Dv), written by the first tile
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
            if keep is None and fused_mask and bias is None and finite_v:
                if m is None:  # the state that the row strips update in place
                    m = torch.full((BH, n), -math.inf, dtype=work, device=dev)
                    l = torch.zeros((BH, n), dtype=work, device=dev)
                    acc.zero_()
                _partial_tile_by_strips(q_t, k_t, v_t, m, l, acc, vis, structural, i0, i1, j0, j1, tile_buffer)
                continue
            s = tile_buffer[: BH * (i1 - i0) * (j1 - j0)].view(BH, i1 - i0, j1 - j0)
            torch.bmm(q_t, k_t.transpose(1, 2), out=s)  # (BH, bq, Dh) @ (BH, Dh, bk) -> (BH, bq, bk)
            if bias is not None:  # before the hiding, so that a NaN stored in the bias at a hidden pair goes too
                _add_bias_(s.view(*lead, *s.shape[-2:]), bias.tile(i0, i1, j0, j1, check_grad=True))
            if keep is None:
                structural.hide_(s, i0, j0)
            elif keep is not True:
                s.view(*lead, *s.shape[-2:]).masked_fill_(~keep, -math.inf)
            tile_max = s.amax(dim=-1)
            m_new = tile_max if m is None else torch.maximum(m, tile_max)
            # A row that has seen only masked entries keeps m = -inf: shift by 0 so that
            # exp(-inf - -inf) = NaN never happens; exp(-inf - 0) = 0 adds nothing. A bias of -inf can
            # hide a whole row of a tile that the mask shows, so with a bias the guard is always on.
            shift = m_new if (keep is True and bias is None) else torch.where(m_new == -math.inf, 0.0, m_new)
            p = torch.exp2(s.sub_(shift[..., None]).mul_(_LOG2E), out=s)  # in place; s - m before base 2 (see _LOG2E)
            exact_v = finite_v or keep is True
            if not exact_v and keep is None:  # the structural keep-mask of this tile, for the exact slow path
                keep = torch.isfinite(structural.cache[(*vis.band(i0, j0), i1 - i0, j1 - j0)])
            if m is None:  # the first tile: nothing summed yet, no rescaling (acc is written, not added to)
                l = p.sum(dim=-1)
                if exact_v:
                    torch.bmm(p, v_t, out=acc)  # (BH, bq, bk) @ (BH, bk, Dv) -> (BH, bq, Dv)
                else:
                    acc.copy_(_seen_matmul(p, v_t, _flat_keep(keep, lead, p.shape)))
            else:
                if not torch.equal(m_new, m):  # a row's maximum rose: rescale what was summed under the old one
                    correction = torch.exp2((m - shift).mul_(_LOG2E))  # (BH, bq)
                    l.mul_(correction)
                    acc.mul_(correction[..., None])
                l.add_(p.sum(dim=-1))
                if exact_v:
                    acc.baddbmm_(p, v_t)  # += (BH, bq, bk) @ (BH, bk, Dv) -> (BH, bq, Dv)
                else:  # slower, exact for non-finite v
                    acc.add_(_seen_matmul(p, v_t, _flat_keep(keep, lead, p.shape)))
            m = m_new
        if m is None:  # no key tile visible to this block at all
            m = torch.full((BH, n), -math.inf, dtype=work, device=dev)
            l = torch.zeros((BH, n), dtype=work, device=dev)
            acc.zero_()
        seen = l != 0  # not `l > 0`: a NaN score (a visible NaN key) must give NaN, not a zero row
        if bool(seen.all()):  # the usual case: every query of the block saw a key
            out[:, i0:i1] = acc.div_(l[..., None])
            row_max[:, i0:i1], log2_sum[:, i0:i1] = m, torch.log2(l)
        else:
            out[:, i0:i1] = torch.where(seen[..., None], acc / torch.where(seen, l, 1.0)[..., None], 0.0)
            row_max[:, i0:i1] = torch.where(seen, m, -math.inf)
            log2_sum[:, i0:i1] = torch.where(seen, torch.log2(torch.where(seen, l, 1.0)), 0.0)
    # (BH, T, Dv) -> (..., T, Dv); (BH, T) -> (..., T)
    return out.view(*lead, T, Dv), row_max.view(*lead, T), log2_sum.view(*lead, T)


# Rows per strip of a partly visible causal/window tile: each strip reads only the keys its own rows
# may see (Visibility.key_span), so that a diagonal tile computes about a strip's triangle of hidden
# scores instead of half the tile (at T=8192 with 512-row blocks that was 1/17 of the causal work).
STRIP_ROWS = 128


def _partial_tile_by_strips(q_t, k_t, v_t, m, l, acc, vis: Visibility, structural: _StructuralBias,
                            i0: int, i1: int, j0: int, j1: int, tile_buffer):
    """The online-softmax update of a partly visible causal/window tile (finite q, k, v, no bias),
    STRIP_ROWS query rows at a time, each strip over its own key span, updating the state rows
    ``m``, ``l`` (BH, bq) and ``acc`` (BH, bq, Dv) of the strip in place (rows are independent)."""
    BH = q_t.shape[0]
    for r0 in range(i0, i1, STRIP_ROWS):
        r1 = min(r0 + STRIP_ROWS, i1)
        c0, c1 = vis.key_span(r0, r1, j0, j1)
        keep = vis.structural(r0, r1, c0, c1) if c0 < c1 else False
        if keep is False:
            continue
        a, b = r0 - i0, r1 - i0
        q_s, k_s, v_s = q_t[:, a:b], k_t[:, c0 - j0:c1 - j0], v_t[:, c0 - j0:c1 - j0]
        s = tile_buffer[: BH * (b - a) * (c1 - c0)].view(BH, b - a, c1 - c0)
        if keep is None:
            structural.scores(q_s, k_s, r0, c0, s)  # (BH, rows, Dh) @ (BH, Dh, keys) with the mask added
        else:
            torch.bmm(q_s, k_s.transpose(1, 2), out=s)
        m_s, l_s, acc_s = m[:, a:b], l[:, a:b], acc[:, a:b]  # views: updated in place
        m_new = torch.maximum(m_s, s.amax(dim=-1))
        shift = torch.where(m_new == -math.inf, 0.0, m_new)  # a row with no visible key yet: shift by 0
        p = torch.exp2(s.sub_(shift[..., None]).mul_(_LOG2E), out=s)
        correction = torch.exp2((m_s - shift).mul_(_LOG2E))
        l_s.mul_(correction).add_(p.sum(dim=-1))
        acc_s.mul_(correction[..., None]).baddbmm_(p, v_s)  # += (BH, rows, keys) @ (BH, keys, Dv)
        m_s.copy_(m_new)


# Scores per product of the band kernel (one head's query blocks, batched). Every product and pass is one
# Python call, and the head groups' threads take turns at Python's lock between calls, so fewer, larger
# calls win as long as the tile stays near a core's L2 cache (1 MiB here): 2^19 float32 scores (2 MiB) are
# 56 blocks of 32 x 288 at w=256. Measured with bench/attention_bench.py's window (w=256, T=8192).
WINDOW_TILE_SCORES = 1 << 19
# The band of keys is widened to a multiple of this many columns (the extra keys are hidden by the
# mask): rows of 16 float32 are whole AVX-512 vectors, and amax over 320 columns ran 2-3 times faster
# than over 319 (w=256, block_q=64).
_BAND_ALIGN = 16


def band_fits_one_tile(vis: Visibility, bias, block_q: int, block_k: int, S: int) -> bool:
    """Whether :func:`_window_band_forward_base2` applies: a sliding window (no mask tensor, mask_mod or
    bias, not bottom-right) whose band of keys for one query block fits one key tile, so that no
    query block ever needs a second key tile (and so no online rescaling)."""
    if vis.window is None or vis.mask is not None or vis.mask_mod is not None or bias is not None:
        return False
    if vis.causal_offset not in (None, 0):
        return False
    return min(block_k, S) >= vis.max_keys(block_q, S, S)


@torch.no_grad()
def _window_band_forward_base2(q, k, v, vis: Visibility, scale: float, block_q: int, block_k: int,
                               *, bias=None, out=None):
    """The forward of a sliding window whose band fits one key tile (:func:`band_fits_one_tile`):
    the contract and returns of :func:`_tiled_forward_base2` (q (..., T, Dh), k (..., T, Dh), v
    (..., T, Dv); ``(out, m2, log2_l)``), in fewer passes over each tile.

    A block of queries [i0, i1) sees the keys [i0 - before, i1 + after) (``before = window - 1``,
    ``after`` 0 if causal, else ``window - 1``; cut to [0, T)), all in one tile, so its softmax is
    not online: the scores once, with the band's mask added inside the product (``baddbmm``), their
    exact row maximum, ``exp2`` in place, the row sum, the product with V and one division; no
    running maximum, rescaling or state. Blocks whose band lies inside [0, T) have the same shape and
    the same mask, so as many as ``WINDOW_TILE_SCORES`` scores hold are one batched product, their key
    and value bands read as overlapping ``unfold`` views of K and V (no copy in float32 and float64; half
    inputs are converted to float32 per span and head first); the rows near 0 and T
    are a few larger tiles (:func:`_band_spans`).

    Non-finite inputs: ``NaN + -inf`` is NaN and ``0 * inf`` is NaN, so a NaN or inf stored at a
    hidden key or value would survive the added mask and reach the rows of its block. It cannot go
    unseen: a NaN or ``+inf`` score makes its row's maximum, and so the whole row, NaN; a ``-inf`` score
    is a hidden one (weight 0, as it should be); a non-finite value times a weight of 0 is NaN. So one
    check of the finished output (a sum, no temporary) replaces checking q, k and v before (three
    sums): if it holds a NaN or inf, the call is redone by :func:`_tiled_forward_base2`, which masks
    by replacement (a finite output whose sum overflows is redone too: slower, still exact).
    Every row sees at least its own key, so no row is empty.

    The backward (:func:`tiled_backward_torch`, by recomputation) computes the scores again with matrix
    products of other shapes, whose sums may round differently in the last bit; the lse stored here is
    exact for this forward's scores. At logits near 1e5 one unit in the last place of a score changes a
    weight by about 1 %: ``tests/unit/test_efficient_tiled_window_band.py`` bounds the gradients' error
    at such logits against SDPA's.

    Source: Dao et al. (2022), Algorithm 1, with one key tile per query block; chapter 09.
    """
    T, Dh, Dv, lead = q.shape[-2], q.shape[-1], v.shape[-1], q.shape[:-2]
    work, dev = _work_dtype(q.dtype), q.device
    if q.numel() == 0 or v.numel() == 0:
        return _tiled_forward_base2(q, k, v, vis, scale, block_q, block_k, out=out)
    BH = math.prod(lead)
    q3, k3, v3 = q.reshape(BH, T, Dh), k.reshape(BH, T, Dh), v.reshape(BH, T, Dv)  # (..., T, D) -> (BH, T, D)
    out = torch.empty(BH, T, Dv, dtype=q.dtype, device=dev) if out is None else out.view(BH, T, Dv)
    row_max = torch.empty(BH, T, dtype=work, device=dev)
    row_sum = torch.empty(BH, T, dtype=work, device=dev)  # l; its log2 is taken once at the end
    after = 0 if vis.causal_offset is not None else vis.window - 1
    before = vis.window - 1
    before += (-(block_q + before + after)) % _BAND_ALIGN  # hidden keys that round the band up
    spans = _band_spans(T, block_q, before, after, WINDOW_TILE_SCORES)
    rows = max(i1 - i0 for i0, i1, _, _, _ in spans)
    scores = max((i1 - i0) * (j1 - j0 - (n - 1) * block_q) for i0, i1, j0, j1, n in spans)
    s_buffer = torch.empty(scores, dtype=work, device=dev)  # reused by every product
    q_buffer = torch.empty(rows * Dh, dtype=work, device=dev)
    acc_buffer = None if out.dtype == work else torch.empty(rows * Dv, dtype=work, device=dev)
    inner_mask = None  # every span of n > 1 blocks has the same (block_q, band) mask: built once
    for i0, i1, j0, j1, n in spans:  # n query blocks [i0, i1), keys [j0, j1)
        bq, width = (i1 - i0) // n, j1 - j0 - (n - 1) * block_q  # rows and keys of each block
        if n > 1 and inner_mask is not None:
            mask = inner_mask
        else:  # built once per span and used by every head (never kept for all spans: w >= T has T / bq)
            mask = _band_bias(*vis.band(i0, j0), bq, width, work, dev)  # (bq, width): 0 or -inf
            inner_mask = mask if n > 1 else None
        mask = mask.expand(n, bq, width)
        for h in range(BH):
            # the scaled queries, rounded as the backward rounds them (it recomputes the scores from them)
            q_t = torch.mul(q3[h, i0:i1].view(n, bq, Dh).to(work), scale,
                            out=q_buffer[: n * bq * Dh].view(n, bq, Dh))  # (n, bq, Dh)
            k_bands = k3[h, j0:j1].to(work).unfold(0, width, block_q)  # (n, Dh, width): block b's keys, transposed
            v_bands = v3[h, j0:j1].to(work).unfold(0, width, block_q).transpose(1, 2)  # (n, width, Dv)
            # mask + (n, bq, Dh) @ (n, Dh, width) -> (n, bq, width): base-2 scores, the hidden ones -inf
            s = torch.baddbmm(mask, q_t, k_bands, out=s_buffer[: n * bq * width].view(n, bq, width))
            m = torch.amax(s, dim=-1, out=row_max[h, i0:i1].view(n, bq))  # exact: the row's every key is here
            p = s.sub_(m[..., None]).mul_(_LOG2E).exp2_()  # in place; s - m before base 2 (see _LOG2E)
            l = torch.sum(p, dim=-1, out=row_sum[h, i0:i1].view(n, bq))  # >= 1 (the maximum's own exp2(0))
            rows_out = out[h, i0:i1].view(n, bq, Dv)
            acc = rows_out if acc_buffer is None else acc_buffer[: n * bq * Dv].view(n, bq, Dv)
            torch.bmm(p, v_bands, out=acc).div_(l[..., None])  # (n, bq, width) @ (n, width, Dv) -> (n, bq, Dv)
            if acc_buffer is not None:
                rows_out.copy_(acc)  # to the half dtype
    if not bool(torch.isfinite(out.sum(dtype=work))):  # see the docstring: redo it the safe way
        return _tiled_forward_base2(q, k, v, vis, scale, block_q, block_k, out=out)
    # (BH, T, Dv) -> (..., T, Dv); (BH, T) -> (..., T)
    return out.view(*lead, T, Dv), row_max.view(*lead, T), row_sum.log2_().view(*lead, T)


def _band_spans(T: int, block_q: int, before: int, after: int, budget: int) -> list[tuple[int, int, int, int, int]]:
    """The band kernel's products as ``(i0, i1, j0, j1, n)``: n query blocks of rows [i0, i1) reading
    keys [j0, j1), each product of at most ``budget`` scores (or one block of ``block_q`` rows).

    Inner blocks, whose band [i0 - before, i0 + block_q + after) lies inside [0, T), start at the first
    multiple of block_q >= before and share one shape and mask: as many per product as the budget
    holds. The rows before them and after them (the band cut at 0 or T; a last block shorter than
    block_q) are cut into spans of whole blocks, each one tile (n = 1) with its own keys, as large as
    the budget allows: few Python calls, and the memory bounded by max(budget, block_q * band width), not by T."""
    width = block_q + before + after
    first = min(-(-before // block_q) * block_q, T)
    count = max(0, (T - after - first) // block_q)  # the inner blocks
    first, last = (first, first + count * block_q) if count else (T, T)
    spans = _band_edge_spans(0, first, T, block_q, before, after, budget)
    step = max(1, budget // (block_q * width)) * block_q
    for i0 in range(first, last, step):
        i1 = min(i0 + step, last)
        spans.append((i0, i1, i0 - before, i1 + after, (i1 - i0) // block_q))
    return spans + _band_edge_spans(last, T, T, block_q, before, after, budget)


def _band_edge_spans(a: int, b: int, T: int, block_q: int, before: int, after: int, budget: int):
    """Rows [a, b) as one-tile spans ``(i0, i1, j0, j1, 1)`` of whole blocks, each as long as its
    (rows x keys) tile stays within ``budget`` (at least one block)."""
    spans, i0 = [], a
    while i0 < b:
        i1 = min(i0 + block_q, b)
        while i1 < b and (min(i1 + block_q, b) - i0) * (min(min(i1 + block_q, b) + after, T) - max(i0 - before, 0)) <= budget:
            i1 = min(i1 + block_q, b)
        spans.append((i0, i1, max(i0 - before, 0), min(i1 + after, T), 1))
        i0 = i1
    return spans


@torch.no_grad()
def tiled_backward_torch(q, k, v, out, lse2, d_out, vis: Visibility, scale: float, block_q: int,
                         block_k: int, *, bias=None):
    """Gradients of q, k, v, recomputing each tile's weights from ``lse2`` (Dao 2023, Algorithm 2).

    ``lse2`` is the log-sum-exp as the forward computed it, in its two parts ``(m2, log2_l)``
    (``lse = m2 + log2_l * ln 2``; ``m2`` the row maximum in natural units), each (..., T) (see
    :func:`_tiled_forward_base2`); a single (..., T) tensor is the natural lse, taken as ``(lse, 0)``. With
    ``P = exp(S - lse)``: ``dV = P^T dO``, ``dP = dO V^T``, ``dS = P * (dP - rowsum(dO * O))``,
    ``dQ = dS K * scale``, ``dK = dS^T Q * scale``. A query with ``lse = -inf`` (no visible key) has
    ``P = 0`` and so contributes zero gradients. The scores are recomputed from the same scaled
    queries as the torch forward's; with the forward's block sizes and the general loop (not the
    window's band kernel, and no ``backward_block_q`` of its own) the tiles and products are the
    forward's too, so the scores are the forward's bit for bit; otherwise the products have other
    shapes and a score may differ in the last bit. ``P = exp2((s - m2) log2 e - log2_l)`` differs from the forward's weights
    only by the rounding of the stored ``log2_l`` (``|log2 l| <= log2 S``: about ``log2(S) * 6e-8``
    in float32), not by a rounding at the size of the scores (torch's own CPU flash backward stores
    ``m + log l`` rounded, about ``|lse| * 6e-8``). A NaN or inf stored at a query or key reaches only
    the gradients of the pairs the mask lets see it.

    ``bias``: the forward's tile source of an additive bias (or None): each tile's bias is recomputed
    (sliced or called again) and added exactly as in the forward. ``dS`` is the gradient of the
    natural-log scores, so a bias tensor's gradient is ``dS`` (zero at hidden pairs), reduced over its
    broadcast axes; it is accumulated into ``bias.grad`` when that is not None.
    """
    T, S, Dh, Dv, lead = q.shape[-2], k.shape[-2], q.shape[-1], v.shape[-1], q.shape[:-2]
    work, dev = _work_dtype(q.dtype), q.device
    BH = math.prod(lead)
    q3, do3 = q.reshape(BH, T, Dh), d_out.reshape(BH, T, Dv)  # (..., T, D) -> (BH, T, D), as the forward
    delta = (do3.to(work) * out.reshape(BH, T, Dv).to(work)).sum(dim=-1)  # (BH, T): rowsum(dO * O)
    m2, log2_l = lse2 if isinstance(lse2, tuple) else (lse2, torch.zeros_like(lse2))
    finite = torch.isfinite(m2 + log2_l)
    m_safe = torch.where(finite, m2, math.inf).reshape(BH, T).to(work)  # exp2(s - inf) = 0
    log2_l_safe = torch.where(finite, log2_l, 0.0).reshape(BH, T).to(work)
    # Else a NaN query or key must reach only the pairs that see it (a sum: no (T, Dh) temporary)
    finite_qk = bool(torch.isfinite(q.sum()) & torch.isfinite(k.sum()))
    dq = torch.zeros(BH, T, Dh, dtype=work, device=dev)
    dk = torch.zeros(BH, S, Dh, dtype=work, device=dev)
    dv = torch.zeros(BH, S, Dv, dtype=work, device=dev)
    if (vis.mask is None and vis.mask_mod is None and bias is None and finite_qk and q.numel() and k.numel() and v.numel()
            and bool(torch.isfinite(v.sum()) & torch.isfinite(d_out.sum()))):
        _backward_fast(q3, k, v, do3, delta, m_safe, log2_l_safe, vis, scale, block_q, block_k, dq, dk, dv)
        return _backward_result(q, k, v, dq, dk, dv)
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
            q_t, do_t = q3[:, i0:i1].to(work) * scale, do3[:, i0:i1].to(work)  # as the forward's q_t
            s = torch.bmm(q_t, k_t.transpose(1, 2))  # (BH, bq, Dh) @ (BH, Dh, bk) -> (BH, bq, bk)
            if bias is not None:  # the forward's bias tile, added the same way: the same scores bit for bit
                _add_bias_(s.view(*lead, *s.shape[-2:]), bias.tile(i0, i1, j0, j1))
            if keep is not True:
                s.view(*lead, *s.shape[-2:]).masked_fill_(~keep, -math.inf)
            # the forward's weights; s - m first: exact for the scores that matter (near the max)
            p = torch.exp2(s.sub_(m_safe[:, i0:i1, None]).mul_(_LOG2E).sub_(log2_l_safe[:, i0:i1, None]), out=s)
            dv[:, j0:j1] += p.transpose(1, 2) @ do_t  # (BH, bk, bq) @ (BH, bq, Dv) -> (BH, bk, Dv)
            dp = do_t @ v_t.transpose(1, 2)  # (BH, bq, Dv) @ (BH, Dv, bk) -> (BH, bq, bk)
            ds = p.mul_(dp.sub_(delta[:, i0:i1, None]))  # dS = P * (dP - delta), in p's buffer
            if keep is not True:  # p = 0 there, but 0 * NaN = NaN: a non-finite value must not reach
                ds.view(*lead, *ds.shape[-2:]).masked_fill_(~keep, 0.0)  # the queries that may not see it
            if bias is not None and bias.grad is not None:  # d bias = dS, zero at the hidden pairs
                bias.accumulate_grad_(ds, i0, i1, j0, j1)
            if keep is True or finite_qk:
                dq[:, i0:i1] += (ds @ k_t) * scale  # (BH, bq, bk) @ (BH, bk, Dh) -> (BH, bq, Dh)
                dk[:, j0:j1] += ds.transpose(1, 2) @ q_t  # (BH, bk, bq) @ (BH, bq, Dh); q_t holds q * scale
            else:  # slower, exact: ds @ k_t would compute 0 * NaN for the pairs the mask hides
                flat = _flat_keep(keep, lead, ds.shape)
                dq[:, i0:i1] += _seen_matmul(ds, k_t, flat) * scale
                dk[:, j0:j1] += _seen_matmul(ds.transpose(1, 2), q_t, flat.transpose(1, 2))
    return _backward_result(q, k, v, dq, dk, dv)


def _backward_result(q, k, v, dq, dk, dv):
    """The gradients in the shapes and dtypes of the inputs."""
    return (dq.view(q.shape).to(q.dtype), dk.view(k.shape).to(k.dtype),  # (BH, T, D) -> (..., T, D)
            dv.view(v.shape).to(v.dtype))


def _backward_fast(q3, k, v, do3, delta, m_safe, log2_l_safe, vis: Visibility, scale: float,
                   block_q: int, block_k: int, dq, dk, dv):
    """The loop of :func:`tiled_backward_torch` when nothing can hide a non-finite value (no mask
    tensor, no bias, finite q, k, v and dO): a hidden pair then has ``P = 0`` and ``dS = 0`` exactly,
    so no tile needs the masked products. The two (BH, bq, bk) tiles (scores/weights/dS and dP) and the
    scaled query block live in buffers reused by every tile; the products accumulate in place
    (``baddbmm_``) into dq, dk, dv; a partly visible causal/window tile is done in strips of
    STRIP_ROWS rows, each with its mask inside the score product, as in the forward. Same arithmetic as the general loop, up to the rounding of
    ``scale`` applied inside the dQ product."""
    BH, T, Dh = q3.shape
    S, Dv, work, dev = k.shape[-2], v.shape[-1], dq.dtype, dq.device
    k3, v3 = k.reshape(BH, S, Dh), v.reshape(BH, S, Dv)  # (..., S, D) -> (BH, S, D)
    structural = _StructuralBias(vis, work, dev)
    bq, bk = min(block_q, T), vis.max_keys(block_q, block_k, S)
    s_buffer = torch.empty(BH * bq * bk, dtype=work, device=dev)
    dp_buffer = torch.empty(BH * bq * bk, dtype=work, device=dev)
    q_buffer = torch.empty(BH * bq * Dh, dtype=work, device=dev)
    def step(i0, i1, j0, j1, keep, q_t, do_t):  # one tile (or strip): rows [i0, i1), keys [j0, j1)
        n, w = i1 - i0, j1 - j0
        k_t, v_t = k3[:, j0:j1].to(work), v3[:, j0:j1].to(work)  # (BH, bk, D)
        s = s_buffer[: BH * n * w].view(BH, n, w)
        if keep is None:
            structural.scores(q_t, k_t, i0, j0, s)
        else:
            torch.bmm(q_t, k_t.transpose(1, 2), out=s)  # (BH, bq, Dh) @ (BH, Dh, bk) -> (BH, bq, bk)
        p = torch.exp2(s.sub_(m_safe[:, i0:i1, None]).mul_(_LOG2E).sub_(log2_l_safe[:, i0:i1, None]), out=s)
        dv[:, j0:j1].baddbmm_(p.transpose(1, 2), do_t)  # += (BH, bk, bq) @ (BH, bq, Dv)
        dp = torch.bmm(do_t, v_t.transpose(1, 2), out=dp_buffer[: BH * n * w].view(BH, n, w))
        ds = p.mul_(dp.sub_(delta[:, i0:i1, None]))  # dS = P * (dP - delta), in p's buffer
        dq[:, i0:i1].baddbmm_(ds, k_t, alpha=scale)  # += (BH, bq, bk) @ (BH, bk, Dh) * scale
        dk[:, j0:j1].baddbmm_(ds.transpose(1, 2), q_t)  # += (BH, bk, bq) @ (BH, bq, Dh); q_t holds q * scale

    for tile_j0, tile_j1 in _tiles(S, block_k):
        for i0, i1 in _tiles(T, block_q):
            j0, j1 = vis.key_span(i0, i1, tile_j0, tile_j1)  # the forward's key span of this tile
            keep = vis.structural(i0, i1, j0, j1) if j0 < j1 else False
            if keep is False:
                continue
            n = i1 - i0
            q_t = q_buffer[: BH * n * Dh].view(BH, n, Dh).copy_(q3[:, i0:i1]).mul_(scale)  # as the forward's
            do_t = do3[:, i0:i1].to(work)  # (BH, bq, Dv)
            if keep is True:
                step(i0, i1, j0, j1, True, q_t, do_t)
                continue
            for r0 in range(i0, i1, STRIP_ROWS):  # a partly visible tile: in strips, as in the forward
                r1 = min(r0 + STRIP_ROWS, i1)
                c0, c1 = vis.key_span(r0, r1, j0, j1)
                strip_keep = vis.structural(r0, r1, c0, c1) if c0 < c1 else False
                if strip_keep is not False:
                    step(r0, r1, c0, c1, strip_keep, q_t[:, r0 - i0:r1 - i0], do_t[:, r0 - i0:r1 - i0])


def _triton_applies(q: torch.Tensor, vis: Visibility) -> bool:
    """The Triton kernels' domain: CUDA tensors, causal or no masking, no sliding window, Triton installed."""
    if not (q.is_cuda and vis.mask is None and vis.mask_mod is None and vis.window is None and q.numel() > 0):
        return False
    from . import triton_kernel

    return triton_kernel.triton_available()


def pick_forward(q: torch.Tensor, vis: Visibility):
    """Choose the forward kernel: the Triton kernel for CUDA tensors with causal or no masking and
    no sliding window (when Triton is installed), else the torch loop :func:`tiled_forward_torch`.

    Returns a callable with the signature of :func:`tiled_forward_torch` (without
    ``reverse_key_tiles``)."""
    if _triton_applies(q, vis):
        from . import triton_kernel

        return triton_kernel.triton_forward
    return tiled_forward_torch


def pick_backward(q: torch.Tensor, vis: Visibility):
    """Choose the backward kernel by the rule of :func:`pick_forward`: the Triton kernels
    (:func:`~selfattn.efficient.triton_kernel.triton_backward`, natural-log ``lse``) for CUDA tensors
    with causal or no masking and no sliding window, else the torch loop :func:`tiled_backward_torch`
    (base-2 ``lse``). Only asked when the forward ran the Triton kernel (never with a bias)."""
    if _triton_applies(q, vis):
        from . import triton_kernel

        return triton_kernel.triton_backward
    return tiled_backward_torch


class _TiledAttentionFunction(torch.autograd.Function):
    """Forward by tiles (torch loop or Triton), backward by recomputation; the weights are never
    stored, so the memory kept for backward is q, k, v, out and lse (and a bias tensor if one was
    given; a score_bias is called again per tile): linear in length."""

    @staticmethod
    def forward(ctx, q, k, v, vis, scale, block_q, block_k, bias=None, score_bias=None, backward_block_q=None,
                with_lse=True):
        # bias: a tensor (an input of the graph, so that it can get a gradient); score_bias: a _CallableBias;
        # backward_block_q: the query rows per tile of the torch backward (None: block_q), which has its
        # own best size (the window's band kernel is fastest at 32-row blocks, its backward at 64);
        # with_lse: return the natural-log lse, else None (the torch loop then does not form it: the
        # backward takes the loop's own base-2 parts, and a pass over all T rows is saved)
        T, S = q.shape[-2], k.shape[-2]
        tile_bias = _TensorBias(bias, q.shape[:-2], T, S) if bias is not None else score_bias
        # the Triton kernel has no bias: a biased call always takes the torch loop
        forward = tiled_forward_torch if tile_bias is not None else pick_forward(q, vis)
        backward = tiled_backward_torch
        n_groups = _head_groups(q, vis, tile_bias)
        # a window whose band fits one key tile: the band kernel (no online softmax), else the general loop
        base2 = (_window_band_forward_base2 if band_fits_one_tile(vis, tile_bias, block_q, block_k, S)
                 else _tiled_forward_base2)
        if forward is tiled_forward_torch and n_groups > 1:  # heads split over the CPU's threads
            out, m2, log2_l = _forward_by_head_groups(base2, q, k, v, vis, scale, block_q, block_k, n_groups)
            lse = torch.add(m2, log2_l, alpha=_LN2) if with_lse else None  # (..., T), the lse's own buffer
        elif forward is tiled_forward_torch:  # keep the loop's own base-2 lse: the backward needs it exact
            out, m2, log2_l = base2(q, k, v, vis, scale, block_q, block_k, bias=tile_bias)
            lse = torch.add(m2, log2_l, alpha=_LN2) if with_lse else None
        else:  # the Triton kernel works in natural log
            out, lse = forward(q, k, v, vis, scale, block_q, block_k)
            backward = pick_backward(q, vis)
            if backward is tiled_backward_torch:
                m2, log2_l = lse, torch.zeros_like(lse)
            else:  # the Triton backward takes the kernel's natural-log lse as it is: no conversion
                # a copy only if the lse is returned: the caller may change it in place
                m2, log2_l = (lse.clone() if with_lse else lse), None
        ctx.save_for_backward(q, k, v, out, m2, log2_l, bias)
        ctx.vis, ctx.scale, ctx.score_bias = vis, scale, score_bias
        ctx.blocks = (block_q if backward_block_q is None else backward_block_q, block_k)
        ctx.backward_kernel = backward
        if not with_lse:
            return out, None
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, d_out, _d_lse):
        # The hand-written backward is not itself differentiable. once_differentiable makes a second
        # derivative raise only when d_out itself requires grad (a loss such as out.pow(2).sum()); with
        # out.sum() the gradient came back detached and a gradient penalty on it was silently a constant.
        # Under create_graph=True the engine runs backward with grad mode on: refuse it here, always.
        if torch.is_grad_enabled():
            raise RuntimeError(
                "tiled_attention cannot differentiate twice: its backward is hand-written and not "
                "differentiable (create_graph=True asks for that); use selfattn.scaled_dot_product_attention "
                "for higher-order gradients"
            )
        return _TiledAttentionFunction._backward(ctx, d_out, _d_lse)

    @staticmethod
    @once_differentiable
    def _backward(ctx, d_out, _d_lse):
        q, k, v, out, m2, log2_l, bias = ctx.saved_tensors
        if ctx.backward_kernel is not tiled_backward_torch:  # the Triton kernels; m2 holds the natural-log lse
            dq, dk, dv = ctx.backward_kernel(q, k, v, out, m2, d_out, ctx.vis, ctx.scale, *ctx.blocks)
            return dq, dk, dv, None, None, None, None, None, None, None, None
        n_groups = _head_groups(q, ctx.vis, bias if bias is not None else ctx.score_bias)
        if n_groups > 1:
            dq, dk, dv = _backward_by_head_groups(q, k, v, out, m2, log2_l, d_out, ctx.vis, ctx.scale,
                                                  *ctx.blocks, n_groups)
            return dq, dk, dv, None, None, None, None, None, None, None, None
        needs_bias_grad = bias is not None and ctx.needs_input_grad[7]
        tile_bias = (_TensorBias(bias, q.shape[:-2], q.shape[-2], k.shape[-2], needs_grad=needs_bias_grad,
                                 work=_work_dtype(q.dtype)) if bias is not None else ctx.score_bias)
        dq, dk, dv = tiled_backward_torch(q, k, v, out, (m2, log2_l), d_out, ctx.vis, ctx.scale, *ctx.blocks,
                                          bias=tile_bias)
        d_bias = tile_bias.grad_of_input() if needs_bias_grad else None
        return dq, dk, dv, None, None, None, None, d_bias, None, None, None


def _head_groups(q, vis: Visibility, bias) -> int:
    """How many head groups the torch loop runs in parallel (:mod:`.head_groups`); 1: not split.
    Not with a mask tensor, a mask_mod or a bias (they are indexed by batch and head of the whole call)."""
    if vis.mask is not None or vis.mask_mod is not None or bias is not None or q.dim() < 3:
        return 1
    return head_groups.split_applies(q, math.prod(q.shape[:-2]))


def _forward_by_head_groups(base2, q, k, v, vis: Visibility, scale: float, block_q: int, block_k: int,
                            n_groups: int):
    """``base2`` (:func:`_tiled_forward_base2` or :func:`_window_band_forward_base2`) on ``n_groups``
    groups of heads at once, one thread each, writing into one output; returns ``(out, m2, log2_l)``
    as it does."""
    T, S, Dh, Dv, lead = q.shape[-2], k.shape[-2], q.shape[-1], v.shape[-1], q.shape[:-2]
    BH = math.prod(lead)
    out = torch.empty(BH, T, Dv, dtype=q.dtype, device=q.device)

    def group(q_g, k_g, v_g, out_g):  # (G, T, Dh), (G, S, Dh), (G, S, Dv), (G, T, Dv): G heads
        _, m2, log2_l = base2(q_g, k_g, v_g, vis, scale, block_q, block_k, out=out_g)
        return m2, log2_l

    parts = head_groups.head_groups_apply(
        group, n_groups, [q.reshape(BH, T, Dh), k.reshape(BH, S, Dh), v.reshape(BH, S, Dv), out])
    m2 = torch.cat([m for m, _ in parts]).view(*lead, T)
    log2_l = torch.cat([l for _, l in parts]).view(*lead, T)
    return out.view(*lead, T, Dv), m2, log2_l


def _backward_by_head_groups(q, k, v, out, m2, log2_l, d_out, vis: Visibility, scale: float, block_q: int,
                             block_k: int, n_groups: int):
    """:func:`tiled_backward_torch` on ``n_groups`` groups of heads at once, one thread each."""
    T, S, Dh, Dv, lead = q.shape[-2], k.shape[-2], q.shape[-1], v.shape[-1], q.shape[:-2]
    BH = math.prod(lead)

    def group(q_g, k_g, v_g, out_g, m2_g, log2_l_g, do_g):
        return tiled_backward_torch(q_g, k_g, v_g, out_g, (m2_g, log2_l_g), do_g, vis, scale, block_q, block_k)

    parts = head_groups.head_groups_apply(
        group, n_groups, [q.reshape(BH, T, Dh), k.reshape(BH, S, Dh), v.reshape(BH, S, Dv),
                          out.reshape(BH, T, Dv), m2.reshape(BH, T), log2_l.reshape(BH, T),
                          d_out.reshape(BH, T, Dv)])
    return tuple(torch.cat([p[i] for p in parts]).view(shape)
                 for i, shape in enumerate((q.shape, k.shape, v.shape)))


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
                    bias: torch.Tensor | None = None, score_bias=None, mask_mod=None,
                    scale: float | None = None, block_q: int = DEFAULT_BLOCK_Q,
                    block_k: int = DEFAULT_BLOCK_K, return_lse: bool = False):
    """Exact scaled dot-product attention computed tile by tile with the online softmax.

    Equal (to rounding) to ``selfattn.scaled_dot_product_attention(q, k, v, keep, bias=b)`` where
    ``keep`` is ``mask`` and, with ``causal=True``, ``causal_mask(T, S, alignment=alignment)``, and
    ``b`` is ``bias`` (or the matrix ``score_bias`` describes); but the (T, S) score matrix is never
    stored: extra memory is one (block_q, block_k) tile per head plus the output. On CUDA with no
    ``mask`` and no bias the forward pass runs the Triton kernel
    (:mod:`selfattn.efficient.triton_kernel`); the kernel has no bias, so a call with ``bias`` or
    ``score_bias`` runs the torch tile loop there instead (slower, never without the bias). The
    backward pass recomputes the weights tile by tile from the log-sum-exp (with the Triton backward
    kernels wherever the forward ran the Triton kernel), so training memory is linear in length too.

    Args:
        q: queries (..., T, Dh), typically (B, H, T, Dh); float32, float64, float16 or bfloat16.
        k: keys (..., S, Dh); v: values (..., S, Dv); same dtype as ``q``.
        mask: optional boolean keep-mask (True = may attend) broadcastable to (..., T, S). Tiles in
            which it is all False are skipped.
        causal: also hide key j from query i when ``j > i`` (top-left) or ``j > i + S - T``
            (bottom-right); tiles above the diagonal are skipped without being computed (also with
            a bias: a skipped tile's bias is neither sliced nor computed).
        alignment: ``"top_left"`` or ``"bottom_right"``; required when ``causal`` and ``T != S``.
        bias: optional additive float tensor broadcastable to (..., T, S), in the units of the
            scores ``scale * q . k`` (natural log), as ``selfattn.scaled_dot_product_attention``'s
            ``bias``; any floating dtype (converted to the float32/float64 arithmetic), on the device
            of ``q``. Sliced one tile at a time (it is not expanded or copied; each tile's biased
            scores pass through float64, a few float64 tiles of extra memory). If it requires grad,
            it gets its gradient, ``dL/dscores`` (zero at hidden pairs), summed over the axes it
            broadcasts on.
        score_bias: optional callable ``score_bias(q_idx, k_idx) -> tensor`` for a bias that is a
            function of positions only, such as ALiBi's
            ``lambda qi, kj: selfattn.positions.alibi_bias(slopes, qi, kj)`` ((H, bq, bk)): so the
            (T, S) bias is never built. Called once per computed tile, in the forward and again in
            the backward, with the int64 query rows ``q_idx`` (bq,) and key columns ``k_idx`` (bk,)
            of the tile (indices 0..T-1 and 0..S-1 on the device of ``q``: with bottom-right
            alignment the query of row i usually sits at position ``i + S - T``, add it yourself).
            It must return a floating tensor on the device of ``q``, broadcastable to
            (..., bq, bk), in natural-log units, and depend on nothing but the positions: the same
            values at every call, no learned parameters (no gradient flows into it; a result that
            requires grad is refused). Not together with ``bias``.
        mask_mod: optional mask as a function ``mask_mod(b, h, q_idx, kv_idx) -> bool tensor``
            (True = keep), FlexAttention's ``mask_mod`` (Dong et al. 2024), e.g.
            :func:`selfattn.masks.document_mask_mod`; needs 4-D (B, H, T, Dh) inputs. Called once per
            visited tile (forward and again in the backward) with int64 index tensors b (B, 1, 1, 1),
            h (1, H, 1, 1), q_idx (1, 1, bq, 1), kv_idx (1, 1, 1, bk); it must return a boolean tensor
            broadcastable to (B, H, bq, bk) and use only elementwise operations and indexing (so that
            the same function runs under FlexAttention's vmap). A tile it hides entirely is skipped
            (no arithmetic), a tile it keeps entirely takes the unmasked path, the rest are masked;
            :func:`mask_mod_tile_kinds` gives that classification. A tile covers every batch row and
            head at once (the loop batches them), so it is skipped only if it is empty for all of
            them (FlexAttention's block mask classifies each (b, h) apart). Combined (AND) with
            ``mask`` and ``causal``.
        scale: score multiplier; default ``1 / sqrt(Dh)``.
        block_q: query rows per tile (> 0; need not divide T).
        block_k: key columns per tile (> 0; need not divide S).
        return_lse: also return ``lse = log sum_j exp(scale * q_i . k_j + bias_ij)`` over the visible keys.

    Returns:
        ``out`` (..., T, Dv) in the dtype of ``q`` (scores, softmax and accumulation in float32; a
        bias is added in float64 and the sum rounded once, as torch rounds ``s + bias`` once); with ``return_lse``, also ``lse`` (..., T), float32 (float64 for float64 inputs),
        without gradient. A query with no visible key gets a zero output row, ``lse = -inf``, and
        zero (finite) gradients. A NaN or inf stored at a hidden position (of q, k, v or the bias)
        reaches neither the outputs nor the gradients of the rows that may not see it, whatever
        the block sizes; a pair hidden only by a ``-inf`` bias is not hidden in this sense (as in
        the dense path: a NaN value there still reaches its row; but a row whose every key has bias
        ``-inf`` is a zero row with zero gradients, where the dense path's ``0 @ v`` is NaN if a value
        is). First derivatives
        only: the backward is hand-written and not itself differentiable, so differentiating the
        gradients again (``create_graph=True``, e.g. a gradient penalty) raises a RuntimeError
        ("cannot differentiate twice") when the gradient is computed; use
        ``selfattn.scaled_dot_product_attention`` for that.

    Raises:
        TypeError: non-tensor or non-floating inputs, different dtypes, a non-boolean mask, a
        ``bias`` that is not a floating tensor, a ``score_bias`` that is not callable or returns
        something other than a floating tensor.
        TypeError also for ``causal`` or ``return_lse`` not a bool, a ``mask_mod`` that is not
        callable or returns something other than a boolean tensor; ValueError for a ``mask_mod``
        result that does not broadcast to (B, H, bq, bk), or ``mask_mod`` with inputs that are not 4-D.
        ValueError: mismatched shapes, a mask or bias that does not broadcast to (..., T, S) or is on
        another device than ``q``, both ``bias`` and ``score_bias``, a ``score_bias`` result of the
        wrong shape or device or that requires grad, a bad scale or
        block size, ``alignment`` missing when causal with T != S, or given without ``causal``.

    Source: chapter 10; Dao et al. (2022), FlashAttention, Algorithm 1; backward Dao (2023),
    FlashAttention-2, Algorithm 2; ALiBi (the bias this is built for): Press et al. (2022), chapter 08.
    """
    return_lse = require_flag("return_lse", return_lse)
    scale = validate_attention_inputs(q, k, v, mask, scale)
    block_q, block_k = require_positive_int("block_q", block_q), require_positive_int("block_k", block_k)
    causal = require_flag("causal", causal)
    if alignment is not None and not causal:
        raise ValueError(f"alignment={alignment!r} only applies with causal=True")
    T, S = q.shape[-2], k.shape[-2]
    _validate_bias(q, k, bias, score_bias)
    offset = causal_offset(T, S, alignment) if causal else None
    if mask is not None:  # a view with real (T, S) axes, so that tiles can be sliced from it
        mask = mask.expand(*mask.shape[:-2], T, S)
    lead = ()
    if mask_mod is not None:
        if not callable(mask_mod):
            raise TypeError("mask_mod must be a callable mask_mod(b, h, q_idx, kv_idx) -> bool tensor; "
                            f"got {type(mask_mod).__name__}")
        if q.ndim != 4:
            raise ValueError(f"mask_mod needs q, k, v of shape (B, H, T, Dh) (its b and h index the first two "
                             f"axes); got q of shape {tuple(q.shape)}")
        lead = tuple(q.shape[:2])
    vis = Visibility(mask=mask, causal_offset=offset, mask_mod=mask_mod, lead=lead)
    tile_fn = None if score_bias is None else _CallableBias(score_bias, q.shape[:-2], q.device,
                                                            grad_enabled=torch.is_grad_enabled())
    out, lse = _TiledAttentionFunction.apply(q, k, v, vis, scale, block_q, block_k, bias, tile_fn, None, return_lse)
    return (out, lse) if return_lse else out


def _validate_bias(q, k, bias, score_bias) -> None:
    """The checks of ``bias`` and ``score_bias`` (the words of ``scaled_dot_product_attention``'s)."""
    if bias is not None and score_bias is not None:
        raise ValueError("pass bias= or score_bias=, not both (add the two inside score_bias, or build one tensor)")
    if bias is not None:
        require_tensor("bias", bias)
        if not bias.dtype.is_floating_point:
            raise TypeError(f"bias must be a floating tensor added to the scores; got dtype {bias.dtype}")
        if bias.device != q.device:
            raise ValueError(f"bias must be on the device of q ({q.device}); got {bias.device}")
        target = tuple(q.shape[:-2]) + (q.shape[-2], k.shape[-2])
        require_broadcastable("bias", bias, target, "(..., T, S) =")
    if score_bias is not None and not callable(score_bias):
        raise TypeError(
            "score_bias must be a callable score_bias(q_idx, k_idx) -> bias broadcastable to (..., bq, bk); "
            f"got {type(score_bias).__name__}"
        )


#: The kinds of tile :func:`mask_mod_tile_kinds` reports (FlexAttention's block mask has the same three).
TILE_EMPTY, TILE_PARTIAL, TILE_FULL = 0, 1, 2


def mask_mod_tile_kinds(mask_mod, B: int, H: int, T: int, S: int, *, block_q: int = DEFAULT_BLOCK_Q,
                        block_k: int = DEFAULT_BLOCK_K, device=None) -> torch.Tensor:
    """How :func:`tiled_attention` treats each (query tile, key tile) under ``mask_mod``: an int8
    tensor (ceil(T / block_q), ceil(S / block_k)) of :data:`TILE_EMPTY` (skipped), :data:`TILE_PARTIAL`
    (masked) and :data:`TILE_FULL` (the unmasked path), from the same per-tile evaluation the loop
    makes (no causal flag, no mask tensor). Like FlexAttention's ``create_block_mask``, whose block
    mask splits the blocks into the same three kinds.

    Raises:
        TypeError / ValueError: sizes not positive ints; a bad ``mask_mod`` (as :func:`tiled_attention`).

    Source: Dong et al. 2024 (block masks); chapter 04.
    """
    B, H, T, S = (require_positive_int(n, x) for n, x in (("B", B), ("H", H), ("T", T), ("S", S)))
    block_q, block_k = require_positive_int("block_q", block_q), require_positive_int("block_k", block_k)
    vis = Visibility(mask_mod=mask_mod, lead=(B, H))
    q_tiles, k_tiles = _tiles(T, block_q), _tiles(S, block_k)
    kinds = torch.empty(len(q_tiles), len(k_tiles), dtype=torch.int8)
    for a, (i0, i1) in enumerate(q_tiles):
        for c, (j0, j1) in enumerate(k_tiles):
            keep = vis.tile(i0, i1, j0, j1, device)
            kinds[a, c] = TILE_EMPTY if keep is False else TILE_FULL if keep is True else TILE_PARTIAL
    return kinds
