"""selfattn.open_models: shapes, the errors its public functions raise, and the cache counts by hand."""

import pytest
import torch

from selfattn.open_models import local_global, mla, sparse


def test_mla_config_refuses_bad_sizes():
    with pytest.raises(ValueError, match="qk_rope_head_dim must be even"):
        mla.MLAConfig(32, 4, 16, 12, 7, 10)
    with pytest.raises(ValueError, match="rope_layout"):
        mla.MLAConfig(32, 4, 16, 12, 8, 10, rope_layout="interleaved")
    with pytest.raises((TypeError, ValueError), match="kv_lora_rank"):
        mla.MLAConfig(32, 4, 0, 12, 8, 10)


def test_mla_shapes_and_cache_growth_and_bad_input():
    torch.manual_seed(0)
    layer = mla.MultiHeadLatentAttention(mla.MLAConfig(32, 4, 16, 12, 8, 10))  # full-rank query path
    out, cache = layer(torch.randn(2, 5, 32))
    assert out.shape == (2, 5, 32) and cache.latent.shape == (2, 5, 16) and cache.k_rope.shape == (2, 5, 8)
    out2, cache2 = layer(torch.randn(2, 1, 32), cache)
    assert out2.shape == (2, 1, 32) and cache2.length == 6 and torch.isfinite(out2).all()
    with pytest.raises(ValueError, match="x must be"):
        layer(torch.randn(2, 5, 31))
    with pytest.raises(ValueError, match="keep must be"):
        layer(torch.randn(2, 5, 32), keep=torch.ones(2, 5, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match="cache must hold"):
        layer(torch.randn(3, 1, 32), cache)
    with pytest.raises(ValueError, match=r"x must be \(B, 1, D"):
        mla.mla_decode_absorbed(layer, torch.randn(2, 2, 32), cache)


def test_cache_counts_by_hand_and_errors():
    c = mla.MLAConfig(32, 4, 16, 12, 8, 10)
    assert mla.cache_numbers_per_token(c) == 24
    assert mla.cache_numbers_per_token(c, "mha") == 4 * (20 + 10)
    assert mla.cache_numbers_per_token(c, "gqa", n_kv_heads=2) == 2 * 30
    with pytest.raises(ValueError, match="must divide"):
        mla.cache_numbers_per_token(c, "gqa", n_kv_heads=3)
    with pytest.raises(ValueError, match="kind"):
        mla.cache_numbers_per_token(c, "mqa")
    # 1 query, 1 key, by hand: expand 2*16*4*22 + scores 2*4*20 + context 2*4*10
    assert mla.mla_flops(c, 1, 1, absorbed=False) == 2816 + 160 + 80
    # absorbed: 2*4*12*16 + 2*4*(16+8) + 2*4*16 + 2*4*16*10
    assert mla.mla_flops(c, 1, 1, absorbed=True) == 1536 + 192 + 128 + 1280


def test_topk_keep_never_keeps_a_hidden_key_and_refuses_bad_k():
    scores = torch.tensor([[1.0, float("-inf"), float("-inf")], [0.5, 2.0, float("-inf")], [3.0, 1.0, 2.0]])
    keep = sparse.topk_keep(scores, 2)
    assert keep.tolist() == [[True, False, False], [True, True, False], [True, False, True]]
    with pytest.raises((TypeError, ValueError), match="k"):
        sparse.topk_keep(scores, 0)


def test_window_strided_keep_by_hand():
    keep = sparse.window_strided_keep(6, window=2, stride=3)
    assert keep[5].tolist() == [True, False, False, True, True, True]
    assert not keep.triu(1).any()


def test_indexer_refuses_bad_sizes_and_inputs():
    with pytest.raises(ValueError, match="rope_dim"):
        sparse.LightningIndexer(32, 24, 2, 8, 10)
    idx = sparse.LightningIndexer(32, 24, 2, 16, 8)
    with pytest.raises(ValueError, match="q_latent"):
        idx(torch.randn(1, 4, 32), torch.randn(1, 4, 23))
    scores = idx(torch.randn(1, 4, 32), torch.randn(1, 4, 24))
    assert scores.shape == (1, 4, 4) and torch.isinf(scores[0].triu(1)[0, 1:]).all()


def test_local_global_helpers_and_errors():
    assert local_global.layer_types(6, 2) == ["sliding_attention", "sliding_attention", "full_attention"] * 2
    with pytest.raises(ValueError, match="ratio"):
        local_global.layer_types(6, -1)
    with pytest.raises(ValueError, match="kind"):
        local_global.layer_keep_mask("local", 4, 2)
    assert local_global.hybrid_kv_bytes(["sliding_attention", "full_attention"], 10, 4, n_kv_heads=1, d_head=2,
                                        bytes_per_number=1) == (4 + 10) * 4
    with pytest.raises(ValueError, match="one_sided"):
        local_global.longformer_mask_mod(-1, [0])
    with pytest.raises(ValueError, match="global_positions"):
        local_global.longformer_mask_mod(2, [0.5])
    with pytest.raises(ValueError, match="must divide"):
        local_global.LocalGlobalConfig(32, 4, 3, 8)
