"""tiled_attention(mask_mod=...): FlexAttention's mask-as-a-function, with tile skipping (chapter 04).

Oracles: dense attention (selfattn.scaled_dot_product_attention) with the mask materialised on the
full index grid; torch's flex_attention (eager, CPU) with create_block_mask; the tiles skipped
counted from the dense mask and measured as the score products (BH, bq, Dh) @ (BH, Dh, bk) the loop
performs (seen by a TorchDispatchMode), never from the classification under test alone.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.nn.attention.flex_attention import create_block_mask, flex_attention
from torch.utils._python_dispatch import TorchDispatchMode

from selfattn import masks, scaled_dot_product_attention
from selfattn.efficient.tiled import (
    TILE_EMPTY,
    TILE_FULL,
    TILE_PARTIAL,
    mask_mod_tile_kinds,
    tiled_attention,
)

B, H, T, Dh = 2, 2, 48, 8
BLOCK = 6  # not Dh, so that a score tile (BH, BLOCK, BLOCK) is told from a value product (BH, BLOCK, Dh)
DOC = torch.tensor([[0] * 13 + [1] * 20 + [2] * 15, [0] * 30 + [1] * 18])


def _mods():
    return {
        "causal": masks.causal_mask_mod,
        "document": masks.document_mask_mod(DOC),
        "prefix_lm": masks.prefix_lm_mask_mod(12),
        "sliding_window": masks.sliding_window_mask_mod(10),
    }


def _qkv(dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, H, T, Dh, generator=g, dtype=dtype).requires_grad_() for _ in range(3)]


@pytest.mark.parametrize("name", list(_mods()))
def test_mask_mod_equals_dense_forward_and_backward(name):
    mod = _mods()[name]
    keep = masks.materialize_mask_mod(mod, B, H, T, T)
    q, k, v = _qkv(torch.float64)
    out = tiled_attention(q, k, v, mask_mod=mod, block_q=BLOCK, block_k=BLOCK)
    ref = scaled_dot_product_attention(q, k, v, keep)
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    grads = torch.autograd.grad(out, (q, k, v), g)
    ref_grads = torch.autograd.grad(ref, (q, k, v), g)
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-12)  # float64: rounding only
    for a, b in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-11)


def _independent_counts(keep):
    """Tiles (BLOCK x BLOCK) of the dense (B, H, T, T) mask: empty / partial / full, over all b, h."""
    n = T // BLOCK
    tiles = keep.reshape(B, H, n, BLOCK, n, BLOCK).permute(2, 4, 0, 1, 3, 5).reshape(n, n, -1)
    empty, full = ~tiles.any(dim=-1), tiles.all(dim=-1)
    return empty, full


@pytest.mark.parametrize("name", list(_mods()))
def test_tiles_skipped_equal_independent_count(name):
    mod = _mods()[name]
    keep = masks.materialize_mask_mod(mod, B, H, T, T)
    empty, full = _independent_counts(keep)
    kinds = mask_mod_tile_kinds(mod, B, H, T, T, block_q=BLOCK, block_k=BLOCK)
    assert torch.equal(kinds == TILE_EMPTY, empty) and torch.equal(kinds == TILE_FULL, full)
    assert torch.equal(kinds == TILE_PARTIAL, ~empty & ~full)
    n_tiles = (T // BLOCK) ** 2
    assert 0 < int(empty.sum()) < n_tiles  # every one of these masks skips some tiles
    # What the forward loop really computes: one score product per visited tile.
    q, k, v = (x.detach() for x in _qkv(torch.float32))
    with _ScoreProducts() as counter:
        tiled_attention(q, k, v, mask_mod=mod, block_q=BLOCK, block_k=BLOCK)
    assert counter.n == n_tiles - int(empty.sum())


class _ScoreProducts(TorchDispatchMode):
    """Counts the matrix products whose result is a (B * H, BLOCK, BLOCK) score tile."""

    def __init__(self):
        super().__init__()
        self.n = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func.overloadpacket in (torch.ops.aten.bmm, torch.ops.aten.baddbmm) and tuple(out.shape) == (
                B * H, BLOCK, BLOCK):
            self.n += 1
        return out


@pytest.mark.parametrize("name", list(_mods()))
def test_mask_mod_equals_flex_attention(name):
    mod = _mods()[name]
    q, k, v = (x.detach() for x in _qkv(torch.float32, seed=2))
    block_mask = create_block_mask(mod, B, H, T, T, device="cpu")
    with warnings.catch_warnings():  # eager flex_attention warns that it is not compiled
        warnings.simplefilter("ignore", UserWarning)
        expected = flex_attention(q, k, v, block_mask=block_mask)
    out = tiled_attention(q, k, v, mask_mod=mod, block_q=BLOCK, block_k=BLOCK)
    # float32, two different summation orders: measured max |diff| about 4e-7
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-5)


def test_row_with_no_visible_key_is_zero_with_zero_grads():
    def mod(b, h, q_idx, kv_idx):  # query 5 sees nothing; the others are causal
        return (kv_idx <= q_idx) & (q_idx != 5)
    q, k, v = _qkv(torch.float32, seed=3)
    out = tiled_attention(q, k, v, mask_mod=mod, block_q=BLOCK, block_k=BLOCK)
    out.sum().backward()
    assert torch.isfinite(out).all() and torch.equal(out[:, :, 5], torch.zeros(B, H, Dh))
    assert all(torch.isfinite(x.grad).all() for x in (q, k, v))
    assert torch.equal(q.grad[:, :, 5], torch.zeros(B, H, Dh))


def test_mask_mod_combines_with_causal_and_mask():
    q, k, v = (x.detach() for x in _qkv(torch.float64, seed=4))
    extra = torch.rand(T, T, generator=torch.Generator().manual_seed(5)) > 0.3
    mod = masks.prefix_lm_mask_mod(20)
    out = tiled_attention(q, k, v, extra, causal=True, mask_mod=mod, block_q=BLOCK, block_k=BLOCK)
    keep = masks.prefix_lm_mask(T, 20) & extra & masks.causal_mask(T)
    torch.testing.assert_close(out, scaled_dot_product_attention(q, k, v, keep), rtol=0, atol=1e-12)


def test_mask_mod_errors():
    q, k, v = (x.detach() for x in _qkv(torch.float32))
    with pytest.raises(TypeError, match="boolean"):
        tiled_attention(q, k, v, mask_mod=lambda b, h, qi, kv: (kv <= qi).float(), block_q=BLOCK, block_k=BLOCK)
    with pytest.raises(ValueError, match="broadcastable"):
        tiled_attention(q, k, v, mask_mod=lambda b, h, qi, kv: torch.ones(3, 3, dtype=torch.bool),
                        block_q=BLOCK, block_k=BLOCK)
    with pytest.raises(TypeError, match="callable"):
        tiled_attention(q, k, v, mask_mod=masks.causal_mask(T))
    with pytest.raises(ValueError, match=r"\(B, H, T, Dh\)"):
        tiled_attention(q[0], k[0], v[0], mask_mod=masks.causal_mask_mod)


@settings(max_examples=20, deadline=None)
@given(lengths=st.lists(st.integers(1, 9), min_size=1, max_size=4), block_q=st.integers(1, 7),
       block_k=st.integers(1, 7), seed=st.integers(0, 2**16))
def test_document_mask_mod_any_packing_and_blocks(lengths, block_q, block_k, seed):
    # random document lengths and tile sizes that need not divide T: tiled == dense (float64)
    doc = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))[None]  # (1, T)
    T_doc = doc.shape[1]
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(1, 2, T_doc, 4, generator=g, dtype=torch.float64) for _ in range(3))
    mod = masks.document_mask_mod(doc)
    out = tiled_attention(q, k, v, mask_mod=mod, block_q=block_q, block_k=block_k)
    expected = scaled_dot_product_attention(q, k, v, masks.document_causal_mask(doc))
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-12)


@pytest.mark.parametrize("name", ["causal", "document", "prefix_lm", "sliding_window"])
def test_tile_kinds_equal_flex_create_block_mask(name):
    # FlexAttention's block mask, per (b, h): the visited blocks (kv_indices; to_dense() shows them
    # all, full ones included) and, among them, the full blocks (full_kv_indices); with B = H = 1
    # its blocks are the tiles tiled_attention skips, computes unmasked, or masks.
    from torch.nn.attention.flex_attention import BlockMask

    T_long, block = 256, 32
    doc = (torch.arange(T_long) // 40)[None]
    mod = {"causal": masks.causal_mask_mod, "document": masks.document_mask_mod(doc),
           "prefix_lm": masks.prefix_lm_mask_mod(70), "sliding_window": masks.sliding_window_mask_mod(50)}[name]
    block_mask = create_block_mask(mod, 1, 1, T_long, T_long, device="cpu", BLOCK_SIZE=block)
    visited = block_mask.to_dense()[0, 0].bool()
    full = BlockMask.from_kv_blocks(block_mask.full_kv_num_blocks, block_mask.full_kv_indices,
                                    BLOCK_SIZE=block).to_dense()[0, 0].bool()
    kinds = mask_mod_tile_kinds(mod, 1, 1, T_long, T_long, block_q=block, block_k=block)
    assert torch.equal(kinds == TILE_EMPTY, ~visited) and torch.equal(kinds == TILE_FULL, full)
    assert torch.equal(kinds == TILE_PARTIAL, visited & ~full)
    assert int(full.sum()) > 0 or name in ("document", "sliding_window")  # full tiles exist where they can
