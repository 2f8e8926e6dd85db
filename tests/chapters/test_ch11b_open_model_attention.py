"""Claims of chapter 11b (attention in today's open models), each checked against an independent oracle.

Claim 35: multi-head latent attention caches a low-rank latent and one shared RoPE key per token, and
gives the attention of the keys and values it expands to; absorbing the up-projections into the query
and the output gives the same decode step. Claim 36: a trained sparse selection (an indexer's top-k
keys per query) equals dense attention when k covers every key, and keeps what a fixed sparse pattern
of the same budget drops, measured. Claim 37: alternating sliding-window and global layers shrinks the
KV cache to about (global share + window / T) of all-global; global tokens in a band are computed
exactly by the tiled kernel. (Parity with transformers' DeepSeek-V3, DeepSeek-V3.2 and Gemma 3 code:
tests/parity/test_parity_open_models.py.)
"""

from __future__ import annotations

import torch

from selfattn import ref
from selfattn.attention import scaled_dot_product_attention
from selfattn.efficient.tiled import tiled_attention
from selfattn.masks import causal_mask, materialize_mask_mod
from selfattn.open_models.local_global import (
    GLOBAL,
    LOCAL,
    hybrid_kv_bytes,
    hybrid_kv_fraction,
    layer_types,
    longformer_mask_mod,
)
from selfattn.open_models.mla import (
    DEEPSEEK_V3,
    MLAConfig,
    MultiHeadLatentAttention,
    absorption_break_even,
    cache_numbers_per_token,
    mla_decode_absorbed,
    mla_flops,
)
from selfattn.open_models.sparse import (
    LightningIndexer,
    needle_case,
    selection_costs,
    sparse_attention,
    topk_keep,
    window_strided_keep,
)


def _max(a, b) -> float:
    d = (torch.as_tensor(a) - torch.as_tensor(b)).abs().max().item()
    assert d == d, "NaN in a comparison"
    return d


def _small_mla(seed=0):
    torch.manual_seed(seed)
    return MultiHeadLatentAttention(MLAConfig(32, 4, 16, 12, 8, 10, q_lora_rank=24)).double()


def test_claim_35_mla_is_the_attention_of_the_keys_and_values_it_expands_to():
    mla = _small_mla()
    x = torch.randn(2, 9, 32, dtype=torch.float64)
    with torch.no_grad():
        out, cache = mla(x)
        assert cache.latent.shape == (2, 9, 16) and cache.k_rope.shape == (2, 9, 8)  # r + dr numbers per token
        k, v = mla.expand(cache)
        q_nope, q_rope = mla.queries(x, torch.arange(9))
        q = torch.cat([q_nope, q_rope], -1).numpy()
        # the NumPy float64 reference attention over the expanded keys and values
        context = ref.attention.scaled_dot_product_attention(q, k.numpy(), v.numpy(), causal_mask(9).numpy(),
                                                             scale=20 ** -0.5)
        expected = torch.from_numpy(context).transpose(1, 2).reshape(2, 9, -1) @ mla.W_O
    assert _max(out, expected) < 1e-12
    # every head sees the same RoPE key: one copy cached, H copies expanded
    assert torch.equal(k[:, 0, :, 12:], k[:, 3, :, 12:])


def test_claim_35_absorbed_decode_equals_the_expanded_step():
    mla = _small_mla(1)
    x = torch.randn(2, 10, 32, dtype=torch.float64)
    with torch.no_grad():
        _, cache = mla(x[:, :9])
        expanded, c1 = mla(x[:, 9:], cache)
        absorbed, c2 = mla_decode_absorbed(mla, x[:, 9:], cache)
        full, _ = mla(x)
    assert expanded.abs().max() > 0.1
    assert _max(absorbed, expanded) < 1e-12
    assert _max(absorbed, full[:, 9:]) < 1e-12  # and the cached step is the full sequence's last row
    assert torch.equal(c1.latent, c2.latent) and torch.equal(c1.k_rope, c2.k_rope)


def test_claim_35_deepseek_v3_bytes_per_token_and_where_absorption_stops_paying():
    # DeepSeek-V3: r = 512, dr = 64, 128 heads, keys 128 + 64 wide, values 128, 61 layers, bf16
    assert cache_numbers_per_token(DEEPSEEK_V3) == 576
    assert cache_numbers_per_token(DEEPSEEK_V3, "mha") == 128 * (192 + 128) == 40960
    assert cache_numbers_per_token(DEEPSEEK_V3, "gqa", n_kv_heads=8) == 2560
    assert 576 * 61 * 2 == 70272  # bytes per token for the whole model: 68.6 KiB, against 4.77 MiB for MHA
    # counted by hand per head and per key (units of 2 FLOPs): absorbed T (r dn + S (2r + dr) + r dv),
    # unabsorbed S r (dn + dv) + T S (dn + dr + dv); at S = 4096 the absorbed way is dearer once
    # T (65536 + 4096 * 1088 + 65536) > 4096 * 131072 + T * 4096 * 320, T > 163.84
    assert absorption_break_even(DEEPSEEK_V3, 4096) == 164
    assert mla_flops(DEEPSEEK_V3, 1, 4096, absorbed=True) < mla_flops(DEEPSEEK_V3, 1, 4096, absorbed=False) / 100


def test_claim_36_topk_covering_every_key_is_dense_attention():
    torch.manual_seed(0)
    T = 16
    idx = LightningIndexer(32, 24, 3, 16, 8).double()
    x, c_q = torch.randn(2, T, 32, dtype=torch.float64), torch.randn(2, T, 24, dtype=torch.float64)
    q, k, v = (torch.randn(2, T, 8, dtype=torch.float64) for _ in range(3))
    with torch.no_grad():
        keep = topk_keep(idx(x, c_q), T)
    assert torch.equal(keep, causal_mask(T).expand(2, T, T))
    assert _max(sparse_attention(q, k, v, keep), scaled_dot_product_attention(q, k, v, causal_mask(T))) < 1e-15
    keep_small = topk_keep(idx(x, c_q).detach(), 4)
    assert _max(sparse_attention(q, k, v, keep_small), scaled_dot_product_attention(q, k, v, causal_mask(T))) > 1e-2


def test_claim_36_selection_keeps_a_needle_that_a_fixed_pattern_of_the_same_budget_drops():
    T, budget = 256, 32
    for seed in (0, 1, 2):
        q, k, v = needle_case(T, needle=40, seed=seed)
        dense = scaled_dot_product_attention(q, k, v, causal_mask(T))[0, -1]
        scores = torch.relu(q @ k.transpose(-1, -2)).masked_fill(~causal_mask(T), float("-inf"))
        chosen = topk_keep(scores, budget)
        fixed = window_strided_keep(T, 16, 16)  # 16 recent keys + 15 strided ones: 31 <= 32
        assert chosen[0, -1].sum() == budget and fixed[-1].sum() == 31
        assert chosen[0, -1, 40] and not fixed[-1, 40]
        err_topk = ((sparse_attention(q, k, v, chosen)[0, -1] - dense).norm() / dense.norm()).item()
        err_fixed = ((sparse_attention(q, k, v, fixed)[0, -1] - dense).norm() / dense.norm()).item()
        assert err_topk < 0.01 and err_fixed > 0.5, (seed, err_topk, err_fixed)


def test_claim_36_counted_costs_per_decode_step_of_dense_indexer_and_fixed_selection():
    kw = dict(k=2048, n_heads=128, d_qk=192, d_v=128, n_index_heads=64, index_head_dim=128, cache_numbers=576)
    short, long = selection_costs(4096, **kw), selection_costs(131072, **kw)
    assert long["dense"][0] / short["dense"][0] == 32  # per decode step dense grows as T (so T^2 over a sequence)
    assert long["fixed"] == short["fixed"]  # a fixed budget: constant
    # top-k: the indexer's 2 T Hi Di grows with T, at 64 x 128 / (128 x 320) = 1/5 of dense's FLOPs per key
    assert abs((long["topk"][0] - long["fixed"][0]) / long["dense"][0] - (2 * 64 * 128 + 64) / (2 * 128 * 320)) < 1e-12
    assert long["topk"][1] < long["dense"][1] / 4  # bytes: 128 FP8 numbers per key against 576 bf16


def test_claim_37_hybrid_cache_is_global_share_plus_window_over_T():
    kinds = layer_types(60, 5)
    assert kinds.count(GLOBAL) == 10 and kinds.count(LOCAL) == 50
    for T in (8192, 32768, 131072):
        hybrid = hybrid_kv_bytes(kinds, T, 1024, n_kv_heads=8, d_head=256)
        full = hybrid_kv_bytes(layer_types(60, 0), T, 1024, n_kv_heads=8, d_head=256)
        assert abs(hybrid / full - (1 / 6 + 5 / 6 * 1024 / T)) < 1e-12
        assert abs(hybrid_kv_fraction(T, 1024, 5) - (1 / 6 + 5 / 6 * 1024 / T)) < 1e-12
    assert abs(hybrid_kv_fraction(131072, 1024, 5) - 0.17318) < 1e-5  # 5.8x smaller at 128k tokens


def test_claim_37_longformer_global_tokens_in_a_band_through_the_tiled_kernel():
    torch.manual_seed(0)
    B, H, T, Dh = 1, 2, 200, 16
    q, k, v = (torch.randn(B, H, T, Dh, dtype=torch.float64) for _ in range(3))
    mm = longformer_mask_mod(8, [0, 77])
    keep = materialize_mask_mod(mm, B, H, T, T)
    # the mask by hand: a band of 17 plus rows and columns 0 and 77
    i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
    by_hand = ((i - j).abs() <= 8) | (i == 0) | (j == 0) | (i == 77) | (j == 77)
    assert torch.equal(keep[0, 0], by_hand)
    out = tiled_attention(q, k, v, mask_mod=mm, block_q=32, block_k=32)
    assert _max(out, scaled_dot_product_attention(q, k, v, keep)) < 1e-12
    without_globals = tiled_attention(q, k, v, mask_mod=longformer_mask_mod(8, []), block_q=32, block_k=32)
    assert _max(without_globals, out) > 0.1
