"""The fast paths of the tiled torch loop (issue 13, item 5) compute what the general loop computes:
partly visible causal/window tiles in row strips, the backward's fast loop, the window's default
blocks (the window's band kernel: test_efficient_tiled_window_band.py). Speed itself is measured by bench/attention_bench.py, never here."""

import pytest
import torch

import selfattn
from selfattn.efficient import (
    sliding_window_attention,
    sliding_window_tiled_attention,
    tiled_attention,
)
from selfattn.efficient import tiled as tiled_module
from selfattn.efficient.tiled import WINDOW_BLOCK_K, WINDOW_BLOCK_Q, Visibility


def _qkv(T, S, *, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(2, 3, n, 8, generator=g, dtype=torch.float64).to(dtype) for n in (T, S))
    v = torch.randn(2, 3, S, 5, generator=g, dtype=torch.float64).to(dtype)
    return tuple(x.requires_grad_() for x in (q, k, v))


def _grads(out, inputs):
    d_out = torch.randn(out.shape, generator=torch.Generator().manual_seed(7), dtype=out.dtype)
    return torch.autograd.grad(out, inputs, d_out)


@pytest.fixture
def strips(monkeypatch):
    """Strips of 4 rows (so that small tiles are cut into several) and a count of the tiles done so."""
    calls = []
    real = tiled_module._partial_tile_by_strips
    monkeypatch.setattr(tiled_module, "STRIP_ROWS", 4)
    monkeypatch.setattr(tiled_module, "_partial_tile_by_strips", lambda *a: calls.append(1) or real(*a))
    return calls


@pytest.mark.parametrize("T,S,alignment", [(45, 45, None), (30, 45, "bottom_right"), (45, 30, "bottom_right"),
                                           (30, 45, "top_left")])
@pytest.mark.parametrize("block_q,block_k", [(16, 12), (9, 20)])
def test_causal_tiles_in_strips_match_the_reference(strips, T, S, alignment, block_q, block_k):
    q, k, v = _qkv(T, S, seed=T + S)
    out, lse = tiled_attention(q, k, v, causal=True, alignment=alignment, block_q=block_q, block_k=block_k,
                               return_lse=True)
    assert strips, "no partly visible tile went through the strips"
    keep = selfattn.causal_mask(T, S, alignment=alignment)
    expected = selfattn.scaled_dot_product_attention(q, k, v, keep)
    torch.testing.assert_close(out, expected, atol=1e-10, rtol=1e-9)
    scores = (q @ k.transpose(-1, -2) / 8**0.5).masked_fill(~keep, -torch.inf)
    torch.testing.assert_close(lse, torch.logsumexp(scores, dim=-1).detach(), atol=1e-10, rtol=1e-9)
    for got, want in zip(_grads(out, (q, k, v)), _grads(expected, (q, k, v)), strict=True):
        torch.testing.assert_close(got, want, atol=1e-10, rtol=1e-9)


@pytest.mark.parametrize("window", [1, 3, 7])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("blocks", [{"block_q": 16, "block_k": 12}, {"block_q": 10, "block_k": 6}])
def test_window_tiles_in_strips_match_the_reference(strips, window, causal, blocks):
    """Key tiles narrower than a query block's band: the general loop (the band kernel needs one
    tile per band; tests/unit/test_efficient_tiled_window_band.py)."""
    q, k, v = _qkv(41, 41, seed=window)
    out = sliding_window_tiled_attention(q, k, v, window, causal, **blocks)
    assert strips
    expected = sliding_window_attention(q, k, v, window, causal)
    torch.testing.assert_close(out, expected, atol=1e-10, rtol=1e-9)
    for got, want in zip(_grads(out, (q, k, v)), _grads(expected, (q, k, v)), strict=True):
        torch.testing.assert_close(got, want, atol=1e-10, rtol=1e-9)


@pytest.mark.parametrize("causal", [False, True])
def test_fast_backward_equals_the_general_loop_in_float32(causal):
    """No mask tensor: the fast backward loop; the same structure as a mask tensor: the general one."""
    q, k, v = _qkv(70, 70, seed=3, dtype=torch.float32)
    fast = tiled_attention(q, k, v, causal=causal, block_q=16, block_k=24)
    keep = selfattn.causal_mask(70) if causal else torch.ones(70, 70, dtype=torch.bool)
    general = tiled_attention(q, k, v, keep, block_q=16, block_k=24)
    torch.testing.assert_close(fast, general, atol=1e-6, rtol=1e-5)
    for got, want in zip(_grads(fast, (q, k, v)), _grads(general, (q, k, v)), strict=True):
        torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)


def test_window_buffers_are_sized_by_the_band_not_by_block_k():
    assert Visibility(causal_offset=0, window=256).max_keys(WINDOW_BLOCK_Q, WINDOW_BLOCK_K, 8192) == WINDOW_BLOCK_Q + 255
    assert Visibility(window=256).max_keys(128, 1 << 16, 8192) == 128 + 2 * 255
    assert Visibility(causal_offset=0).max_keys(512, 1024, 700) == 700
    assert Visibility(causal_offset=0, window=4096).max_keys(128, 512, 8192) == 512
