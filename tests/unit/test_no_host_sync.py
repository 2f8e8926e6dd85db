"""Issue 30, item 2: no device-to-host sync in the hot path. On CPU, torch.compile(fullgraph=True)
raises at any graph break, and a ``bool(tensor)`` / ``int(tensor)`` is one: the GPT forward, one
decode step, scaled_dot_product_attention (masked, with gradients) and MultiHeadAttention compile
whole. Backend "eager": Dynamo alone finds graph breaks, without inductor's code generation (seconds
instead of minutes on 2 cores). On CUDA, the same calls under torch.cuda.set_sync_debug_mode("error")."""

from __future__ import annotations

import pytest
import torch

import selfattn
from selfattn.efficient import StaticKVCache
from selfattn.inference.decode_timing import capstone_sized_gpt

BACKEND = "eager"


def _compile(fn):
    torch._dynamo.reset()
    return torch.compile(fn, backend=BACKEND, fullgraph=True)


def _tiny_gpt(device="cpu"):
    return capstone_sized_gpt(seed=0, d_model=16, n_heads=2, d_ff=32, n_layers=2).to(device)


def _qkv(device="cpu", requires_grad=True):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 2, n, 4, generator=g).to(device) for n in (3, 5, 5))
    return [x.requires_grad_(requires_grad) for x in (q, k, v)]


def test_sdpa_masked_and_biased_compiles_whole_forward_and_backward():
    q, k, v = _qkv()
    mask = selfattn.causal_mask(3, 5, alignment="bottom_right")
    bias = torch.randn(2, 1, 3, 5)
    out = _compile(selfattn.scaled_dot_product_attention)(q, k, v, mask, bias=bias)
    out.sum().backward()
    q2, k2, v2 = (x.detach().clone().requires_grad_(True) for x in (q, k, v))
    ref = selfattn.scaled_dot_product_attention(q2, k2, v2, mask, bias=bias)
    ref.sum().backward()
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-6)
    torch.testing.assert_close(q.grad, q2.grad, rtol=0, atol=1e-6)


def test_multihead_attention_compiles_whole():
    mha = selfattn.MultiHeadAttention(selfattn.multihead.MHAConfig(8, 2))
    x = torch.randn(2, 5, 8)
    mask = selfattn.causal_mask(5)
    out = _compile(mha)(x, mask=mask)
    torch.testing.assert_close(out, mha(x, mask=mask), rtol=0, atol=1e-6)


def test_gpt_forward_and_one_decode_step_compile_whole():
    model = _tiny_gpt()
    ids = torch.randint(0, 94, (2, 6), generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(_compile(model)(ids), model(ids), rtol=0, atol=1e-6)
    with torch.no_grad():
        caches = [StaticKVCache(8) for _ in model.blocks]
        model.forward_cached(ids, caches)
        nxt = ids[:, :1]
        got = _compile(model.forward_cached)(nxt, caches)
        expected = model(torch.cat([ids, nxt], dim=1))[:, -1:]
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)
    assert len(caches[0]) == 7


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: sync debug mode")
def test_attention_and_a_decode_step_make_no_sync_on_cuda():
    model = _tiny_gpt("cuda")
    ids = torch.randint(0, 94, (2, 6), device="cuda")
    q, k, v = _qkv("cuda", requires_grad=False)
    mask = selfattn.causal_mask(3, 5, alignment="bottom_right", device="cuda")
    with torch.no_grad():
        caches = [StaticKVCache(8) for _ in model.blocks]
        model.forward_cached(ids, caches)
        from selfattn.models.gpt import _StaticCache
        own = [_StaticCache(c) for c in caches]
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            selfattn.scaled_dot_product_attention(q, k, v, mask)
            plan = own[0].plan(1, model.positions, ids.device)
            logits = model._forward_new(model.token_embedding.weight[ids[:, :1]], own, plan, plan.keep,
                                        model.positions)[0]
        finally:
            torch.cuda.set_sync_debug_mode("default")
    assert torch.isfinite(logits).all()
