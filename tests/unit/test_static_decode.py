"""Issue 30, item 1: GPT.generate's default decode path (a StaticKVCache per layer, written in place,
arguments checked once, RoPE's cos/sin table kept per device and dtype) gives today's results: the
same greedy and seeded tokens as the KVCache path (make_cache=KVCache, the path generate took before)
and as full recomputation (use_cache=False), and step logits equal to the full forward's to 1e-6, on
the capstone's sizes with random weights. StaticKVCache itself: the views KVCache would return,
nothing copied per step, its capacity refused past the end."""

from __future__ import annotations

import pytest
import torch

from selfattn.efficient import KVCache, StaticKVCache, cached_attention
from selfattn.inference.decode_timing import CAPSTONE_SIZES, capstone_sized_gpt
from selfattn.models.gpt import _StaticCache
from selfattn.positions import POSITION_SCHEMES, RotaryPositions, apply_rope

TOL = 1e-6  # logits, float32, of the cached step against the full forward


def _model(positions="rope", seed=0):
    model = capstone_sized_gpt(seed=seed, positions=positions)
    with torch.no_grad():  # trained-looking weights: larger than the init, so that logits differ
        for p in model.parameters():
            p.add_(0.3 * torch.randn_like(p))
    return model


def _ids(B, T, seed=1):
    return torch.randint(0, CAPSTONE_SIZES["vocab_size"], (B, T), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("positions", POSITION_SCHEMES)
def test_default_generate_gives_the_tokens_of_the_kvcache_path_and_of_full_recomputation(positions):
    model = _model(positions)
    prompt = _ids(2, 7)
    n_new = 50 if positions != "learned" else CAPSTONE_SIZES["block_size"] - 7  # rope etc. run past block_size
    static = model.generate(prompt, n_new, greedy=True)
    kv = model.generate(prompt, n_new, greedy=True, make_cache=KVCache)
    full = model.generate(prompt, n_new, greedy=True, use_cache=False)
    assert static.dtype == torch.int64 and static.shape == (2, 7 + n_new)
    assert torch.equal(static[:, :7], prompt)
    assert torch.equal(static, kv) and torch.equal(static, full)
    assert len(set(static[0, 7:].tolist())) > 3  # the weights give varied tokens, not one repeated id


def test_default_generate_gives_the_seeded_samples_of_full_recomputation():
    model, prompt = _model(), _ids(3, 5)
    static = model.generate(prompt, 40, temperature=0.9, top_k=20, generator=torch.Generator().manual_seed(7))
    full = model.generate(prompt, 40, temperature=0.9, top_k=20, generator=torch.Generator().manual_seed(7),
                          use_cache=False)
    assert torch.equal(static, full)


@pytest.mark.parametrize(("positions", "dtype"), [("rope", torch.float32), ("rope", torch.float64),
                                                   ("alibi", torch.float64), ("learned", torch.float64)])
def test_static_cache_step_logits_equal_the_full_forward_and_the_kvcache_step(positions, dtype):
    """float64: each step against the full forward (every position at once, under the causal mask: an
    independent path), to 1e-10. float32: against the KVCache path, whose matrix products have the same
    shapes (the full forward's are 60 rows, so float32 rounding differs by up to ~1e-5 there), to 1e-6,
    on the capstone's configuration (RoPE); with ALiBi or learned positions the float32 prefill over the
    cache's strided views differs from the KVCache's contiguous keys by up to 7e-6 (rounding only)."""
    model = _model(positions).to(dtype)
    ids = _ids(2, 60, seed=3)
    T0 = 9
    with torch.no_grad():
        kv_ref = [KVCache() for _ in model.blocks]
        if dtype == torch.float64:
            full, tol = model(ids), 1e-10  # (B, 60, V)
        else:
            full = torch.cat([model.forward_cached(ids[:, :T0], kv_ref)]
                             + [model.forward_cached(ids[:, t : t + 1], kv_ref) for t in range(T0, 60)], dim=1)
            tol = TOL
        static = [StaticKVCache(60) for _ in model.blocks]
        own = [_StaticCache(StaticKVCache(60)) for _ in model.blocks]  # generate's unchecked path
        kv = [KVCache() for _ in model.blocks]
        steps = [model.forward_cached(ids[:, :T0], c) for c in (static, kv)]
        steps.append(model._run(ids[:, :T0], own)[0])
        for s in steps:
            torch.testing.assert_close(s, full[:, :T0], rtol=0, atol=tol)
        for t in range(T0, 60):
            a = model.forward_cached(ids[:, t : t + 1], static)
            b = model.forward_cached(ids[:, t : t + 1], kv)
            plan = own[0].plan(1, model.positions, ids.device)
            c = model._forward_new(model.token_embedding.weight[ids[:, t : t + 1]], own, plan, plan.keep,
                                   model.positions)[0]
            for x in (a, b, c):
                torch.testing.assert_close(x, full[:, t : t + 1], rtol=0, atol=tol)
    assert len(static[0]) == len(own[0].cache) == 60


def test_static_cache_returns_the_kvcache_views_and_writes_in_place():
    g = torch.Generator().manual_seed(0)
    static, kv = StaticKVCache(7), KVCache()
    buffer = None
    for T_new in (3, 1, 1, 2):
        k, v = torch.randn(2, 4, T_new, 5, generator=g), torch.randn(2, 4, T_new, 6, generator=g)
        ks, vs = static.append(k, v)
        kk, vk = kv.append(k, v)
        assert torch.equal(ks, kk) and torch.equal(vs, vk)
        assert torch.equal(static.k, kk) and torch.equal(static.v, vk) and len(static) == len(kv)
        if buffer is None:
            buffer = ks.untyped_storage().data_ptr()
        assert ks.untyped_storage().data_ptr() == buffer  # the same storage every step: nothing reallocated
    assert len(static) == 7


def test_static_cache_refuses_past_its_capacity_and_bad_input_unchanged():
    cache = StaticKVCache(4)
    cache.append(torch.zeros(1, 2, 3, 5), torch.zeros(1, 2, 3, 5))
    with pytest.raises(ValueError, match="capacity"):
        cache.append(torch.zeros(1, 2, 2, 5), torch.zeros(1, 2, 2, 5))
    with pytest.raises(ValueError, match="must match the cached"):
        cache.append(torch.zeros(1, 2, 1, 4), torch.zeros(1, 2, 1, 5))
    with pytest.raises(ValueError, match="same number"):
        cache.append(torch.zeros(1, 2, 1, 5), torch.zeros(1, 2, 0, 5))
    with pytest.raises(TypeError, match="dtype"):
        cache.append(torch.zeros(1, 2, 1, 5, dtype=torch.float64), torch.zeros(1, 2, 1, 5, dtype=torch.float64))
    assert len(cache) == 3
    for bad in (0, -1, 2.0, True):
        with pytest.raises((TypeError, ValueError), match="capacity"):
            StaticKVCache(bad)


def test_cached_attention_with_a_static_cache_equals_with_a_kvcache():
    g = torch.Generator().manual_seed(1)
    static, kv = StaticKVCache(6), KVCache()
    for T_new in (2, 1, 3):
        q, k, v = (torch.randn(1, 3, T_new, 4, generator=g, dtype=torch.float64) for _ in range(3))
        a, b = cached_attention(q, k, v, static), cached_attention(q, k, v, kv)
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)
    assert len(static) == len(kv) == 6
    with pytest.raises(ValueError, match="capacity"):  # a refused call leaves the cache unchanged
        cached_attention(q[..., :1, :], k[..., :1, :], v[..., :1, :], static)
    assert len(static) == 6


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_rope_rotate_from_its_table_equals_apply_rope_exactly(dtype, layout):
    scheme = RotaryPositions(8, base=500.0, layout=layout, interpolation=2.0)
    x = torch.randn(2, 3, 5, 8).to(dtype)
    for start in (0, 3, 61, 200, 1000):  # 200 and 1000 past the table so far: it grows
        expected = apply_rope(x, torch.arange(start, start + 5), base=500.0, layout=layout, interpolation=2.0)
        got = scheme.rotate(x, start)
        assert got.dtype == dtype and torch.equal(got, expected), start
    assert scheme._tables[(torch.device("cpu"), torch.float32 if dtype == torch.bfloat16 else dtype)][0].shape[0] >= 1005
    assert "_tables" not in str(list(scheme.state_dict()))
