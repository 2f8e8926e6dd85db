"""The real MiniLM converted to grouped-query attention by mean pooling (selfattn.inference.convert).

Exactness (float64): n_kv_heads = 12 gives back the original embeddings; the expanded-weights encoder
computes what GroupedQueryAttention.from_mha computes, layer by layer and end to end; the pooled
weights are the group means, computed here independently from the checkpoint's own tensors.
Measured changes: structural assertions only (cosine 1 at 12 heads, a visible drop at 1).
Every comparison fails on NaN.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from selfattn.gqa import GroupedQueryAttention
from selfattn.inference.convert import (
    N_KV_HEADS,
    PARAPHRASE_PAIRS,
    SENTENCES,
    GQAConversionResult,
    convert_encoder_to_gqa,
    expand_pooled_kv,
    gqa_conversion_sweep,
    pool_kv_heads,
    sentence_embeddings,
    spearman,
)
from selfattn.masks import from_hf_attention_mask

H, DH, L = 12, 32, 6


def _max_abs_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    assert a.shape == b.shape, (a.shape, b.shape)
    assert torch.isfinite(a).all() and torch.isfinite(b).all(), "non-finite values"
    return (a - b).abs().max().item()


@pytest.fixture(scope="module")
def batch(minilm):
    return minilm.tokenize(list(SENTENCES), minilm.max_seq_length)


@pytest.fixture(scope="module")
def encoder64(minilm):
    return copy.deepcopy(minilm.encoder()).double()


@pytest.fixture(scope="module")
def sweep(minilm):
    return gqa_conversion_sweep(minilm)  # float32, all of 12, 6, 4, 3, 2, 1


def test_sentence_set_is_real_text_with_padding_and_paraphrase_pairs(batch):
    assert len(SENTENCES) >= 20 and len(set(SENTENCES)) == len(SENTENCES)
    assert len(PARAPHRASE_PAIRS) >= 5
    lengths = batch.attention_mask.sum(1)
    assert lengths.min() < lengths.max() == batch.input_ids.shape[1]  # the batch really is padded


def test_pooling_equals_minilm_sentence_embedding(minilm, batch):
    ours = sentence_embeddings(minilm.encoder(), batch.input_ids, batch.attention_mask)
    assert ours.dtype == torch.float32 and ours.shape == (len(SENTENCES), 384)
    assert _max_abs_diff(ours, minilm.sentence_embedding(list(SENTENCES))) <= 1e-6
    assert _max_abs_diff(ours.norm(dim=-1), torch.ones(len(SENTENCES))) <= 1e-6


def test_claim_26_twelve_kv_heads_reproduce_the_original_embeddings_exactly(encoder64, batch):
    converted = convert_encoder_to_gqa(encoder64, 12)
    for a, b in zip(converted.parameters(), encoder64.parameters(), strict=True):
        assert torch.equal(a, b)  # a group of one head: its mean is itself, bit for bit
    original = sentence_embeddings(encoder64, batch.input_ids, batch.attention_mask)
    same = sentence_embeddings(converted, batch.input_ids, batch.attention_mask)
    assert original.dtype == torch.float64
    assert _max_abs_diff(same, original) <= 1e-12


@pytest.mark.parametrize("n_kv_heads", [4, 1])
def test_pooled_weights_are_the_hand_computed_mean_of_each_groups_heads(minilm, encoder64, n_kv_heads):
    G = H // n_kv_heads
    converted = convert_encoder_to_gqa(encoder64, n_kv_heads)
    for layer in (0, 5):
        for theirs, ours in (("key", "K"), ("value", "V")):
            # The checkpoint's own nn.Linear tensors: weight (out, in), head h = rows h*32 .. h*32+31.
            W = minilm.state_dict[f"encoder.layer.{layer}.attention.self.{theirs}.weight"].double()
            b = minilm.state_dict[f"encoder.layer.{layer}.attention.self.{theirs}.bias"].double()
            W_expanded = getattr(converted.blocks[layer].attn, f"W_{ours}")  # (D, H*Dh), X @ W layout
            b_expanded = getattr(converted.blocks[layer].attn, f"b_{ours}")
            pooled_W = pool_kv_heads(getattr(encoder64.blocks[layer].attn, f"W_{ours}"), H, n_kv_heads)
            assert pooled_W.shape == (384, n_kv_heads * DH)
            for g in range(n_kv_heads):
                rows = [W[h * DH:(h + 1) * DH] for h in range(g * G, (g + 1) * G)]
                mean_W = sum(rows[1:], rows[0]) / G  # (Dh, D)
                mean_b = sum(b[h * DH:(h + 1) * DH] for h in range(g * G, (g + 1) * G)) / G
                assert _max_abs_diff(pooled_W[:, g * DH:(g + 1) * DH], mean_W.T) <= 1e-15
                for h in range(g * G, (g + 1) * G):  # every query head of the group reads the pooled head
                    assert _max_abs_diff(W_expanded[:, h * DH:(h + 1) * DH], mean_W.T) <= 1e-15
                    assert _max_abs_diff(b_expanded[h * DH:(h + 1) * DH], mean_b) <= 1e-15
        # Queries, outputs and the rest of the block are untouched.
        for name in ("W_Q", "b_Q", "W_O", "b_O"):
            assert torch.equal(getattr(converted.blocks[layer].attn, name), getattr(encoder64.blocks[layer].attn, name))
        assert torch.equal(converted.blocks[layer].ffn.linear1.weight, encoder64.blocks[layer].ffn.linear1.weight)


def test_convert_leaves_the_original_encoder_unchanged(minilm, encoder64):
    before = encoder64.blocks[0].attn.W_K.clone()
    convert_encoder_to_gqa(encoder64, 1)
    assert torch.equal(encoder64.blocks[0].attn.W_K, before)
    assert torch.equal(minilm.encoder().blocks[0].attn.W_K, minilm.state_dict[
        "encoder.layer.0.attention.self.key.weight"].T)


@pytest.mark.parametrize("n_kv_heads", [6, 4, 3, 2, 1])
def test_expanded_weights_layer_equals_grouped_query_attention(encoder64, batch, n_kv_heads):
    converted = convert_encoder_to_gqa(encoder64, n_kv_heads)
    mask = from_hf_attention_mask(batch.attention_mask)  # (B, 1, 1, T), padding keys hidden
    with torch.no_grad():
        hidden = converted(batch.input_ids, batch.attention_mask).hidden_states
        for layer in range(L):
            gqa = GroupedQueryAttention.from_mha(encoder64.blocks[layer].attn, n_kv_heads).eval()
            assert gqa.W_K.shape == (384, n_kv_heads * DH) and gqa.W_K.dtype == torch.float64
            x = hidden[layer]  # this layer's real input, (B, T, D)
            expected, w_expected = gqa(x, mask=mask, return_weights=True)
            got, w_got = converted.blocks[layer].attn(x, mask=mask, return_weights=True)
            assert _max_abs_diff(got, expected) <= 1e-12
            assert _max_abs_diff(w_got, w_expected) <= 1e-12
            # And the cache a GQA layer holds is n_kv_heads heads, not 12.
            K, V = gqa.project_kv(x)
            assert K.shape == V.shape == (x.shape[0], n_kv_heads, x.shape[1], DH)


@pytest.mark.parametrize("n_kv_heads", [4, 1])
def test_model_built_from_grouped_query_layers_gives_the_same_embeddings(encoder64, batch, n_kv_heads):
    with_gqa = copy.deepcopy(encoder64)
    for block in with_gqa.blocks:  # real GQA modules in the blocks, (D, n_kv_heads * Dh) key/value weights
        block.attn = GroupedQueryAttention.from_mha(block.attn, n_kv_heads).eval()
    expected = sentence_embeddings(with_gqa, batch.input_ids, batch.attention_mask)
    got = sentence_embeddings(convert_encoder_to_gqa(encoder64, n_kv_heads), batch.input_ids, batch.attention_mask)
    assert _max_abs_diff(got, expected) <= 1e-12


def test_key_bias_never_reaches_the_output_value_bias_does(encoder64, batch):
    # q . b_K is the same for every key of a query row, so the softmax removes it; b_V is not.
    embed = lambda enc: sentence_embeddings(enc, batch.input_ids, batch.attention_mask)  # noqa: E731
    original = embed(encoder64)
    no_key_bias, no_value_bias = copy.deepcopy(encoder64), copy.deepcopy(encoder64)
    with torch.no_grad():
        for a, b in zip(no_key_bias.blocks, no_value_bias.blocks, strict=True):
            a.attn.b_K.zero_()
            b.attn.b_V.zero_()
    assert _max_abs_diff(embed(no_key_bias), original) <= 1e-12
    assert _max_abs_diff(embed(no_value_bias), original) > 1e-3


def test_expand_pooled_kv_follows_repeat_kv_order():
    W = torch.arange(2 * 6 * 3, dtype=torch.float64).reshape(2, 18)  # 6 heads of width 3
    out = expand_pooled_kv(W, 6, 2)
    heads = W.reshape(2, 6, 3)
    for h in range(6):
        g = h // 3
        assert torch.equal(out[:, 3 * h:3 * h + 3], heads[:, 3 * g:3 * g + 3].mean(dim=1))
    assert torch.equal(expand_pooled_kv(W, 6, 6), W)


def test_sweep_rows_and_cache_bytes(sweep):
    assert isinstance(sweep, GQAConversionResult)
    assert [r.n_kv_heads for r in sweep.rows] == list(N_KV_HEADS) == [12, 6, 4, 3, 2, 1]
    assert (sweep.n_layers, sweep.n_heads, sweep.d_head, sweep.bytes_per_number) == (6, 12, 32, 4)
    for r in sweep.rows:
        values = [r.cosine_mean, r.cosine_min, r.rank_correlation, r.top1_agreement, r.paraphrase_top1]
        assert all(np.isfinite(values)), r
        assert -1 <= r.cosine_min <= r.cosine_mean <= 1 + 1e-6
        assert r.group_size * r.n_kv_heads == 12
        assert r.kv_cache_bytes_per_token == 2 * 6 * r.n_kv_heads * 32 * 4  # K and V, 6 layers, float32
        assert r.cache_saving == 12 / r.n_kv_heads
    assert sweep.row(12).kv_cache_bytes_per_token == 18432 and sweep.row(1).kv_cache_bytes_per_token == 1536
    assert sweep.row(12).cosine_min >= 1 - 1e-6  # float32: the same model
    assert sweep.row(1).cosine_mean < 0.999 and sweep.row(1).rank_correlation < 0.999  # a visible change
    assert sweep.original_paraphrase_top1 >= 5 / 6  # the original model finds its paraphrases
    assert "n_kv_heads" in sweep.table() and len(sweep.table().splitlines()) == 7
    with pytest.raises(KeyError, match="was not measured"):
        sweep.row(5)


def test_sweep_in_float64_is_exact_at_twelve_heads(minilm):
    result = gqa_conversion_sweep(minilm, n_kv_heads=(12, 1), dtype=torch.float64)
    same = result.row(12)
    assert abs(same.cosine_mean - 1) <= 1e-12 and abs(same.cosine_min - 1) <= 1e-12
    assert abs(same.rank_correlation - 1) <= 1e-12 and same.top1_agreement == 1.0
    assert result.row(1).cosine_mean < 0.999


def test_sweep_metrics_recomputed_independently(minilm, batch, sweep):
    scipy_stats = pytest.importorskip("scipy.stats")
    encoder = minilm.encoder()
    original = sentence_embeddings(encoder, batch.input_ids, batch.attention_mask).double()
    for n in (6, 1):
        emb = sentence_embeddings(convert_encoder_to_gqa(encoder, n), batch.input_ids, batch.attention_mask).double()
        cosines = torch.nn.functional.cosine_similarity(emb, original, dim=-1)
        row = sweep.row(n)
        assert abs(row.cosine_mean - cosines.mean().item()) <= 1e-6
        assert abs(row.cosine_min - cosines.min().item()) <= 1e-6
        pairs = [(i, j) for i in range(len(SENTENCES)) for j in range(i + 1, len(SENTENCES))]
        a = [float(original[i] @ original[j]) for i, j in pairs]
        b = [float(emb[i] @ emb[j]) for i, j in pairs]
        assert abs(row.rank_correlation - scipy_stats.spearmanr(a, b).statistic) <= 1e-6


def test_spearman_matches_scipy_with_and_without_ties():
    scipy_stats = pytest.importorskip("scipy.stats")
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=50), rng.normal(size=50)
    assert abs(spearman(a, b) - scipy_stats.spearmanr(a, b).statistic) <= 1e-12
    a_ties, b_ties = np.round(a), np.round(b * 2)
    assert abs(spearman(a_ties, b_ties) - scipy_stats.spearmanr(a_ties, b_ties).statistic) <= 1e-12
    assert spearman([1, 2, 3], [10, 20, 30]) == pytest.approx(1.0, abs=1e-15)
    for bad in ([1, 2], [1, np.nan, 3], [1, 1, 1]):
        with pytest.raises(ValueError):
            spearman([1, 2, 3], bad)


BAD_N_KV_HEADS = [
    (5, ValueError, "must divide n_heads=12"),
    (7, ValueError, "must divide n_heads=12"),
    (24, ValueError, "must divide n_heads=12"),
    (0, ValueError, "n_kv_heads"),
    (-3, ValueError, "n_kv_heads"),
    (True, TypeError, "n_kv_heads"),
    (2.0, TypeError, "n_kv_heads"),
    ("4", TypeError, "n_kv_heads"),
]


@pytest.mark.parametrize(("n_kv_heads", "error", "match"), BAD_N_KV_HEADS)
def test_bad_n_kv_heads_raises_a_clear_error(encoder64, n_kv_heads, error, match):
    with pytest.raises(error, match=match):
        convert_encoder_to_gqa(encoder64, n_kv_heads)
    with pytest.raises(error, match=match):
        pool_kv_heads(torch.zeros(4, 12 * 2), 12, n_kv_heads)


@pytest.mark.parametrize(("n_kv_heads", "error", "match"), BAD_N_KV_HEADS[:1] + BAD_N_KV_HEADS[5:6])
def test_sweep_refuses_bad_n_kv_heads(minilm, n_kv_heads, error, match):
    with pytest.raises(error, match=match):
        gqa_conversion_sweep(minilm, n_kv_heads=(12, n_kv_heads))


def test_other_bad_input_raises():
    with pytest.raises(TypeError, match="Encoder"):
        convert_encoder_to_gqa(torch.nn.Linear(2, 2), 1)
    with pytest.raises(ValueError, match="n_heads \\* d_head"):
        pool_kv_heads(torch.zeros(4, 13), 12, 3)
    with pytest.raises(TypeError, match="W must be a torch.Tensor"):
        pool_kv_heads(np.zeros((4, 24)), 12, 3)


def test_sweep_refuses_bad_sentences(minilm):
    with pytest.raises(ValueError, match="at least three"):
        gqa_conversion_sweep(minilm, sentences=["one", "two"], paraphrase_pairs=())
    with pytest.raises(ValueError, match="paraphrase_pairs"):
        gqa_conversion_sweep(minilm, sentences=["a b", "c d", "e f"], paraphrase_pairs=[(0, 3)])
    with pytest.raises(ValueError, match="at least one"):
        gqa_conversion_sweep(minilm, n_kv_heads=())
