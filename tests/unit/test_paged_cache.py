"""The paged KV cache (claim 27, first half): sequences stored in scattered blocks of one pool give,
at every step, the result of the contiguous ``KVCache`` + ``cached_attention`` and of full causal
attention. float64; equalities to 1e-12 (max abs diff; ``_max_diff`` fails on NaN). Also the
allocator, the utilisation counts and the memory simulation (exact integers)."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from selfattn import causal_mask
from selfattn import scaled_dot_product_attention as sdpa
from selfattn.efficient import KVCache, cached_attention
from selfattn.gqa import repeat_kv
from selfattn.inference.paged import (
    BlockAllocator,
    OutOfBlocksError,
    PagedKVCache,
    paged_attention,
    paged_caches,
    simulate_memory_utilisation,
)

TOL = 1e-12
f64 = torch.float64


def _max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    assert not torch.isnan(a).any() and not torch.isnan(b).any(), "a NaN where none may be"
    return float((a - b).abs().max())


def _run_interleaved(rnd: random.Random, n_seqs: int, n_steps: int, *, block_size: int, H_kv: int, group: int,
                     Dh: int = 8, free_some: bool = True):
    """Append random lengths to random sequences in random order; after every append compare
    paged_attention with cached_attention (contiguous cache) and with full causal attention.
    Returns (worst diff to cached, worst diff to full, all bitwise equal to cached?, cache)."""
    gen = torch.Generator().manual_seed(rnd.randrange(2**31))
    cache = PagedKVCache(256, block_size, H_kv, Dh, dtype=f64)
    contiguous: dict = {}
    history: dict = {}  # seq -> (q, k, v) of every position so far, for full attention
    worst_cached = worst_full = 0.0
    bitwise = True
    for _ in range(n_steps):
        s = rnd.randrange(n_seqs)
        if free_some and s in contiguous and rnd.random() < 0.1:  # a finished request returns its blocks
            cache.free(s)
            del contiguous[s], history[s]
            continue
        T = rnd.randint(1, 2 * block_size + 1)
        q = torch.randn(H_kv * group, T, Dh, generator=gen, dtype=f64)
        k, v = torch.randn(H_kv, T, Dh, generator=gen, dtype=f64), torch.randn(H_kv, T, Dh, generator=gen, dtype=f64)
        cache.append(s, k, v)
        got = paged_attention(q, cache, s)
        kv = contiguous.setdefault(s, KVCache())
        # the contiguous path with the key/value heads repeated per group, (1, H, T, Dh)
        expected = cached_attention(q[None], repeat_kv(k[None], group), repeat_kv(v[None], group), kv)[0]
        worst_cached = max(worst_cached, _max_diff(got, expected))
        bitwise &= torch.equal(got, expected)
        qs, ks, vs = history.get(s, (q[:, :0], k[:, :0], v[:, :0]))
        history[s] = qs, ks, vs = torch.cat([qs, q], 1), torch.cat([ks, k], 1), torch.cat([vs, v], 1)
        S = ks.shape[1]
        full = sdpa(qs, repeat_kv(ks[None], group)[0], repeat_kv(vs[None], group)[0], causal_mask(S))[:, -T:]
        worst_full = max(worst_full, _max_diff(got, full))
    return worst_cached, worst_full, bitwise, cache


def test_claim_27_paged_equals_contiguous_cache_and_full_attention_interleaved():
    worst_cached, worst_full, _, cache = _run_interleaved(random.Random(0), n_seqs=4, n_steps=60, block_size=4,
                                                          H_kv=2, group=1)
    assert worst_cached <= TOL and worst_full <= TOL
    tables = [cache.block_table(s) for s in cache.sequences]
    assert any(t != sorted(t) or t != list(range(t[0], t[0] + len(t))) for t in tables)  # scattered, out of order


@given(st.integers(0, 2**31 - 1), st.sampled_from([1, 3, 4, 16]), st.sampled_from([1, 2]))
def test_paged_equals_contiguous_under_random_interleavings(seed, block_size, group):
    worst_cached, worst_full, _, _ = _run_interleaved(random.Random(seed), n_seqs=3, n_steps=12,
                                                      block_size=block_size, H_kv=2, group=group)
    assert worst_cached <= TOL and worst_full <= TOL


def test_block_order_of_the_merge_does_not_matter():
    cache = PagedKVCache(16, 3, 1, 4, dtype=f64)
    g = torch.Generator().manual_seed(1)
    cache.append("a", torch.randn(1, 10, 4, generator=g, dtype=f64), torch.randn(1, 10, 4, generator=g, dtype=f64))
    q = torch.randn(1, 2, 4, generator=g, dtype=f64)
    base = paged_attention(q, cache, "a")
    for order in ("tree", [3, 1, 0, 2], [2, 3, 0, 1]):
        assert _max_diff(paged_attention(q, cache, "a", order=order), base) <= TOL


def test_append_writes_the_slots_the_block_table_names_and_gather_inverts_it():
    cache = PagedKVCache(8, 4, 2, 3, dtype=f64)
    g = torch.Generator().manual_seed(2)
    k = {s: torch.randn(2, n, 3, generator=g, dtype=f64) for s, n in (("a", 6), ("b", 3))}
    cache.append("a", k["a"][:, :2], -k["a"][:, :2])
    cache.append("b", k["b"], -k["b"])
    cache.append("a", k["a"][:, 2:], -k["a"][:, 2:])
    assert cache.block_table("a") == [0, 2] and cache.block_table("b") == [1]
    for t in range(6):
        block, slot = cache.block_table("a")[t // 4], t % 4
        assert torch.equal(cache.k_pool[block, :, slot], k["a"][:, t])
    ka, va = cache.gather("a")
    assert torch.equal(ka, k["a"]) and torch.equal(va, -k["a"])
    usage = cache.usage()
    assert (usage.blocks_used, usage.slots_allocated, usage.tokens_stored) == (3, 12, 9)
    assert usage.utilisation == 9 / 12


def test_freed_blocks_are_reused_so_tables_become_scattered():
    cache = PagedKVCache(6, 2, 1, 1, dtype=f64)
    one = torch.zeros(1, 1, 1, dtype=f64)
    for s in "abc":
        cache.append(s, torch.zeros(1, 2, 1, dtype=f64), torch.zeros(1, 2, 1, dtype=f64))  # blocks 0, 1, 2
    cache.free("b")
    assert cache.allocator.n_free == 4 and "b" not in cache
    cache.append("a", one, one)  # a's second block: the one b returned
    assert cache.block_table("a") == [0, 1]
    cache.append("c", torch.zeros(1, 3, 1, dtype=f64), torch.zeros(1, 3, 1, dtype=f64))
    assert cache.block_table("c") == [2, 3, 4]


def test_layers_keep_equal_block_tables():
    layers = paged_caches(3, 32, 4, 2, 4, dtype=f64)
    rnd = random.Random(3)
    for _ in range(20):
        s, T = rnd.randrange(3), rnd.randint(1, 7)
        for cache in layers:
            cache.append(s, torch.zeros(2, T, 4, dtype=f64), torch.zeros(2, T, 4, dtype=f64))
        if rnd.random() < 0.2:
            for cache in layers:
                cache.free(s)
    tables = [{s: c.block_table(s) for s in c.sequences} for c in layers]
    assert tables[0] == tables[1] == tables[2] and tables[0]


def test_out_of_blocks_names_the_counts_and_leaves_the_cache_unchanged():
    cache = PagedKVCache(3, 4, 1, 2, dtype=f64)
    x = torch.ones(1, 9, 2, dtype=f64)
    cache.append("a", x, x)  # 3 blocks
    pools = cache.k_pool.clone(), cache.v_pool.clone()
    with pytest.raises(OutOfBlocksError, match=r"cannot allocate 1 block\(s\): only 0 of 3 are free") as info:
        cache.append("b", x[:, :1], x[:, :1])
    assert (info.value.requested, info.value.free) == (1, 0)
    cache.append("a", x[:, :3], x[:, :3])  # still fits in a's last block
    with pytest.raises(OutOfBlocksError, match="cannot allocate 1 block"):
        cache.append("a", x[:, :1], x[:, :1])
    assert cache.length("a") == 12 and "b" not in cache and cache.allocator.n_free == 0
    assert torch.equal(cache.k_pool[:, :, :, :][cache.block_table("a")].reshape(-1, 2)[:9], pools[0].reshape(-1, 2)[:9])


def test_allocator_errors():
    alloc = BlockAllocator(4)
    assert alloc.allocate(2) == [0, 1] and alloc.n_free == 2
    with pytest.raises(OutOfBlocksError, match="cannot allocate 3 block"):
        alloc.allocate(3)
    assert alloc.n_free == 2  # nothing taken
    with pytest.raises(ValueError, match=r"ids must be blocks in use.*\[3\]"):
        alloc.free([0, 3])
    assert alloc.n_free == 2  # nothing freed
    with pytest.raises(ValueError, match="repeated"):
        alloc.free([0, 0])
    with pytest.raises(ValueError, match="n must be >= 0"):
        alloc.allocate(-1)
    with pytest.raises(TypeError, match="n must be an int"):
        alloc.allocate(1.5)
    with pytest.raises(ValueError, match="n_blocks must be > 0"):
        BlockAllocator(0)


def test_bad_input_is_refused_and_changes_nothing():
    cache = PagedKVCache(4, 2, 2, 3, dtype=f64)
    good = torch.zeros(2, 1, 3, dtype=f64)
    with pytest.raises(ValueError, match=r"k_new must have shape \(n_kv_heads=2, T_new, d_head=3\) \(3 dims\); got shape \(1, 3\)"):
        cache.append("a", good[0], good)
    with pytest.raises(ValueError, match=r"v_new must have shape \(n_kv_heads=2, T_new > 0, d_head=3\); got \(2, 1, 4\)"):
        cache.append("a", good, torch.zeros(2, 1, 4, dtype=f64))
    with pytest.raises(TypeError, match="k_new must have the cache's dtype torch.float64; got torch.float32"):
        cache.append("a", good.float(), good)
    with pytest.raises(ValueError, match="must hold the same T_new positions"):
        cache.append("a", good, torch.zeros(2, 2, 3, dtype=f64))
    with pytest.raises(TypeError, match="unhashable"):
        cache.append(["a"], good, good)
    assert cache.sequences == [] and cache.allocator.n_free == 4
    with pytest.raises(KeyError, match="seq_id 'a' is not in the cache"):
        paged_attention(torch.zeros(2, 1, 3, dtype=f64), cache, "a")
    cache.append("a", good, good)
    with pytest.raises(ValueError, match=r"1 <= T <= S=1.*got \(2, 2, 3\)"):
        paged_attention(torch.zeros(2, 2, 3, dtype=f64), cache, "a")
    with pytest.raises(ValueError, match="H a multiple of n_kv_heads=2"):
        paged_attention(torch.zeros(3, 1, 3, dtype=f64), cache, "a")
    with pytest.raises(TypeError, match="q must have the cache's dtype"):
        paged_attention(torch.zeros(2, 1, 3), cache, "a")
    with pytest.raises(TypeError, match="cache must be a selfattn.inference.paged.PagedKVCache"):
        paged_attention(torch.zeros(2, 1, 3, dtype=f64), KVCache(), "a")
    with pytest.raises(TypeError, match="dtype must be a floating torch.dtype"):
        PagedKVCache(4, 2, 2, 3, dtype=torch.int64)
    with pytest.raises(ValueError, match="block_size must be > 0"):
        PagedKVCache(4, 0, 2, 3)


# --- the memory simulation -------------------------------------------------------------------------

def test_simulation_exact_counts_on_hand_made_lengths():
    sim = simulate_memory_utilisation([1, 16, 17, 100], max_len=128, block_size=16, budget_slots=256)
    assert sim.tokens == 134
    assert sim.slots_preallocated == 4 * 128 == 512
    assert sim.slots_paged == 16 + 16 + 32 + 112 == 176
    assert sim.utilisation_preallocated == 134 / 512 and sim.utilisation_paged == 134 / 176
    assert sim.fit_preallocated == 2  # 256 // 128
    assert sim.fit_paged == 4  # 176 <= 256
    assert simulate_memory_utilisation([1, 16, 17, 100], max_len=128, block_size=16, budget_slots=63).fit_paged == 2
    assert simulate_memory_utilisation([1, 16, 17, 100], max_len=128, block_size=16, budget_slots=64).fit_paged == 3


@given(st.lists(st.integers(1, 512), min_size=1, max_size=30), st.integers(1, 64))
def test_paged_wastes_less_than_one_block_per_request(lengths, b):
    sim = simulate_memory_utilisation(lengths, max_len=512, block_size=b)
    for L, u in zip(sim.lengths, sim.per_request_paged, strict=True):
        assert u >= 1 - (b - 1) / L - 1e-15 and u <= 1
    assert sim.slots_paged - sim.tokens <= len(lengths) * (b - 1)
    if 512 % b == 0:  # else a request near max_len may need a few slots more than max_len
        assert sim.utilisation_paged >= sim.utilisation_preallocated
    assert (sim.utilisation_paged == 1.0) == all(L % b == 0 for L in lengths)


def test_simulation_is_seeded_and_matches_a_paged_cache_filled_with_the_same_lengths():
    sim = simulate_memory_utilisation(n_requests=12, max_len=64, block_size=8, seed=5)
    assert sim == simulate_memory_utilisation(n_requests=12, max_len=64, block_size=8, seed=5)
    assert min(sim.lengths) >= 16 and max(sim.lengths) <= 64
    cache = PagedKVCache(12 * 8, 8, 1, 1, dtype=f64)
    for i, L in enumerate(sim.lengths):
        cache.append(i, torch.zeros(1, L, 1, dtype=f64), torch.zeros(1, L, 1, dtype=f64))
    usage = cache.usage()
    assert (usage.slots_allocated, usage.tokens_stored) == (sim.slots_paged, sim.tokens)


def test_default_setting_for_the_chapter():
    sim = simulate_memory_utilisation()  # 64 requests, lengths uniform in [16, 2048], max_len 2048, b = 16
    assert len(sim.lengths) == 64 and sim.block_size == 16 and sim.max_len == 2048
    assert sim.utilisation_paged > 0.98 and sim.utilisation_preallocated < 0.6
    assert sim.fit_paged > sim.fit_preallocated == 16
    assert math.isclose(sim.utilisation_preallocated, sim.tokens / (64 * 2048))


def test_simulation_errors():
    with pytest.raises(ValueError, match="each <= max_len=8"):
        simulate_memory_utilisation([4, 9], max_len=8)
    with pytest.raises(ValueError, match=r"lengths\[1\] must be > 0"):
        simulate_memory_utilisation([4, 0], max_len=8)
    with pytest.raises(TypeError, match=r"lengths\[0\] must be a positive int"):
        simulate_memory_utilisation([2.5], max_len=8)
    with pytest.raises(ValueError, match="min_len must be <= max_len=8"):
        simulate_memory_utilisation(max_len=8, min_len=9)


# --- bad input found by the new-user probe (chapter 11) ---


@pytest.mark.parametrize("bad", [[1.0], [True], ["1"], "1", {1}])
def test_free_refuses_ids_that_are_not_ints(bad):
    """free([1.0]) put 1.0 on the free list; free([True]) freed block 1."""
    a = BlockAllocator(4)
    a.allocate(2)
    with pytest.raises(TypeError, match="ids"):
        a.free(bad)
    assert a.n_free == 2 and a.allocate(2) == [2, 3]  # nothing freed


def test_free_accepts_numpy_ints():
    a = BlockAllocator(4)
    a.allocate(2)
    a.free(np.array([1]))
    a.free([np.int64(0)])
    assert a.n_free == 4 and a.allocate(4) == [0, 1, 2, 3]


def test_a_pool_too_large_is_a_clear_memory_error():
    """n_blocks=10**12 gave a bare MemoryError (the free list) or torch's allocator message."""
    with pytest.raises(MemoryError, match=r"n_blocks=1000000000000 x block_size=2 x n_kv_heads=2 x d_head=3 .* bytes"):
        PagedKVCache(n_blocks=10**12, block_size=2, n_kv_heads=2, d_head=3)
    with pytest.raises(MemoryError, match=r"n_blocks=1,000,000,000,000"):
        BlockAllocator(10**12)


@pytest.mark.parametrize("bad", [5, "abc", {10: 1}])
def test_simulate_memory_utilisation_lengths_must_be_a_sequence(bad):
    with pytest.raises(TypeError, match="lengths must be a sequence of positive ints"):
        simulate_memory_utilisation(bad)


@pytest.mark.parametrize(("bad", "error"), [(-1, ValueError), ("a", TypeError), (1.5, TypeError), (True, TypeError)])
def test_simulate_memory_utilisation_seed_must_be_a_non_negative_int(bad, error):
    with pytest.raises(error, match=r"seed must be an int >= 0"):
        simulate_memory_utilisation(seed=bad)
    assert simulate_memory_utilisation(seed=np.int64(3)) == simulate_memory_utilisation(seed=3)


@pytest.mark.parametrize("bad", [[1.7, 0.2], [True, False], {1: 0, 0: 1}])
def test_paged_attention_order_must_be_ints(bad):
    cache = PagedKVCache(n_blocks=4, block_size=2, n_kv_heads=2, d_head=3, dtype=torch.float64)
    cache.append("a", torch.randn(2, 3, 3, dtype=torch.float64), torch.randn(2, 3, 3, dtype=torch.float64))
    with pytest.raises(TypeError, match="order"):
        paged_attention(torch.randn(2, 1, 3, dtype=torch.float64), cache, "a", order=bad)


def _causal_reference(q, k, v):
    """float64 plain-torch attention of the last T positions over all S keys, bottom-right causal,
    query head h reading key/value head h // (H / Hkv)."""
    H, T, Dh = q.shape
    group, S = H // k.shape[0], k.shape[1]
    k, v = k.repeat_interleave(group, dim=0), v.repeat_interleave(group, dim=0)
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(Dh)
    keep = torch.arange(S)[None, :] <= torch.arange(S - T, S)[:, None]  # (T, S)
    return torch.softmax(scores.masked_fill(~keep, -math.inf), dim=-1) @ v


@pytest.mark.parametrize("n_heads", [2, 4])  # MHA and grouped-query (2 query heads per key/value head)
def test_backward_passes_through_paged_attention_follow_each_other_with_the_right_gradients(n_heads):
    # Regression: append wrote k_new / v_new into the pools in place with autograd on, so the pools
    # became a node of every later step's graph: the second step's backward ran into the first
    # step's freed graph (RuntimeError). Now the pools stay plain copies (as KVCache's concatenation
    # never writes into a tensor of the graph), and each cached position's gradient reaches the
    # tensor it was appended from, as KVCache's does: checked against plain float64 autograd.
    gen = torch.Generator().manual_seed(7)
    Hkv, Dh, lengths = 2, 4, (3, 2, 4)  # three steps over blocks of 2: appends cross block boundaries
    ks, vs, qs = ([torch.randn(h, t, Dh, generator=gen, dtype=torch.float64, requires_grad=True) for t in lengths]
                  for h in (Hkv, Hkv, n_heads))
    cache = PagedKVCache(8, 2, Hkv, Dh, dtype=torch.float64)
    for step in range(3):
        cache.append("s", ks[step], vs[step])
        assert cache.k_pool.grad_fn is None and not cache.k_pool.requires_grad  # the pool is no graph node
        out = paged_attention(qs[step], cache, "s")
        wrt = [*ks[: step + 1], *vs[: step + 1], qs[step]]
        got = torch.autograd.grad((out * (step + 1)).sum(), wrt)  # a backward per step, no retain_graph
        ref = _causal_reference(qs[step], torch.cat(ks[: step + 1], dim=1), torch.cat(vs[: step + 1], dim=1))
        want = torch.autograd.grad((ref * (step + 1)).sum(), wrt)
        torch.testing.assert_close(out, ref, rtol=0, atol=1e-12)
        for g, w in zip(got, want, strict=True):
            torch.testing.assert_close(g, w, rtol=0, atol=1e-12)
    # a backward taken after a later append still sees the values it read (no in-place version clash)
    q = torch.randn(n_heads, 1, Dh, generator=gen, dtype=torch.float64, requires_grad=True)
    out = paged_attention(q, cache, "s")
    cache.append("s", *(torch.randn(Hkv, 1, Dh, generator=gen, dtype=torch.float64) for _ in range(2)))
    ref = _causal_reference(q, torch.cat(ks, dim=1), torch.cat(vs, dim=1))
    torch.testing.assert_close(torch.autograd.grad(out.sum(), q)[0], torch.autograd.grad(ref.sum(), q)[0],
                               rtol=0, atol=1e-12)


def test_paged_cache_records_no_graph_without_grad():
    # under no_grad (generation), or for tensors that do not require grad, nothing is remembered
    cache = PagedKVCache(4, 2, 1, 4, dtype=torch.float64)
    k = torch.randn(1, 3, 4, dtype=torch.float64, requires_grad=True)
    with torch.no_grad():
        cache.append(0, k, k)
    cache.append(1, k.detach(), k.detach())
    assert cache._sources == {}
    q = torch.randn(1, 1, 4, dtype=torch.float64, requires_grad=True)
    out = paged_attention(q, cache, 0)
    torch.testing.assert_close(out, _causal_reference(q, k.detach(), k.detach()), rtol=0, atol=1e-12)
    assert torch.autograd.grad(out.sum(), q)[0].isfinite().all()
