"""Chapter 11b's modules against ``transformers``' own attention code (5.x), each built from a small
random config (no weights are downloaded), in float64.

Tolerance 1e-6: ``transformers``' RMSNorms (DeepSeek's and Gemma's) and DeepSeek-V3.2's indexer
compute in float32 whatever the parameters' dtype, so agreement stops at float32 rounding (seen:
about 1e-7). Each parity has a negative twin: the course's module given another model's convention
must miss by far more than that tolerance (margin stated in each test).
"""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from transformers import DeepseekV3Config, DeepseekV32Config, Gemma3TextConfig  # noqa: E402
from transformers.cache_utils import DynamicCache  # noqa: E402
from transformers.masking_utils import create_causal_mask, create_sliding_window_causal_mask  # noqa: E402
from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3Attention  # noqa: E402
from transformers.models.deepseek_v32.modeling_deepseek_v32 import DeepseekV32Attention  # noqa: E402
from transformers.models.gemma3.modeling_gemma3 import Gemma3Attention  # noqa: E402

from selfattn.open_models import mla as mla_mod  # noqa: E402
from selfattn.open_models.local_global import (  # noqa: E402
    GLOBAL,
    LOCAL,
    LocalGlobalAttention,
    LocalGlobalConfig,
    layer_keep_mask,
    layer_types,
)
from selfattn.open_models.mla import MLAConfig, MultiHeadLatentAttention  # noqa: E402
from selfattn.open_models.sparse import LightningIndexer, topk_keep  # noqa: E402
from selfattn.positions import rope_cos_sin  # noqa: E402

TOL = 1e-6
MARGIN = 1e-2  # a wrong convention must miss by at least this (10^4 x the tolerance)
B, T, D = 2, 12, 32


def _max(a, b) -> float:
    d = (a - b).abs().max().item()
    assert d == d, "NaN in a comparison"
    return d


def _hf_cos_sin(d_rope: int, base: float = 10000.0):
    """transformers' (cos, sin), (B, T, d_rope) as cat(freqs, freqs), computed in float64 by the course."""
    cos, sin = rope_cos_sin(torch.arange(T), d_rope, base=base)
    return tuple(torch.cat([t, t], -1)[None].expand(B, -1, -1) for t in (cos, sin))


def _causal_additive():
    return torch.full((T, T), float("-inf"), dtype=torch.float64).triu(1)[None, None].expand(B, 1, T, T)


def _randomise(module, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(0.3 * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return module


def _x(seed=1):
    return torch.randn(B, T, D, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


MLA_SIZES = dict(hidden_size=D, num_attention_heads=4, num_key_value_heads=4, kv_lora_rank=16,
                 qk_rope_head_dim=8, qk_nope_head_dim=12, v_head_dim=10, num_hidden_layers=1, vocab_size=50)


def _deepseek_v3(q_lora_rank):
    hc = DeepseekV3Config(q_lora_rank=q_lora_rank, **MLA_SIZES)
    hc._attn_implementation = "eager"
    attn = _randomise(DeepseekV3Attention(hc, 0).double().eval(), 0)
    cfg = MLAConfig(D, 4, 16, 12, 8, 10, q_lora_rank=q_lora_rank)
    return hc, attn, cfg


def _run_hf_mla(hc, attn, x):
    cache = DynamicCache(config=hc)
    with torch.no_grad():
        out, _ = attn(x, _hf_cos_sin(8), _causal_additive(), cache=cache)
    layer = cache.layers[0]
    return out, layer.keys[:, 0], layer.values[:, 0]  # the latent (B, T, r) and the RoPE key (B, T, dr)


@pytest.mark.parametrize("q_lora_rank", [24, None])
def test_mla_matches_deepseek_v3_attention_output_and_cache(q_lora_rank):
    hc, attn, cfg = _deepseek_v3(q_lora_rank)
    x = _x()
    out_hf, latent_hf, k_rope_hf = _run_hf_mla(hc, attn, x)
    mine = MultiHeadLatentAttention.from_hf(attn, cfg)
    with torch.no_grad():
        out, cache = mine(x)
    assert out_hf.abs().max() > 0.1  # not a trivial zero
    assert _max(out, out_hf) < TOL
    assert _max(cache.latent, latent_hf) < TOL
    assert _max(cache.k_rope, k_rope_hf) < TOL


def test_mla_with_llama_rope_layout_misses_deepseek_v3():
    hc, attn, cfg = _deepseek_v3(24)
    x = _x()
    out_hf, _, k_rope_hf = _run_hf_mla(hc, attn, x)
    wrong = MultiHeadLatentAttention.from_hf(attn, MLAConfig(D, 4, 16, 12, 8, 10, q_lora_rank=24, rope_layout="half"))
    with torch.no_grad():
        out, cache = wrong(x)
    assert _max(cache.k_rope, k_rope_hf) > MARGIN
    assert _max(out, out_hf) > MARGIN


def test_mla_without_the_decoupled_rope_misses_deepseek_v3(monkeypatch):
    hc, attn, cfg = _deepseek_v3(24)
    x = _x()
    out_hf, _, _ = _run_hf_mla(hc, attn, x)
    monkeypatch.setattr(mla_mod, "_rope", lambda x, positions, base, layout: x)  # no positions at all
    with torch.no_grad():
        out, _ = MultiHeadLatentAttention.from_hf(attn, cfg)(x)
    assert _max(out, out_hf) > MARGIN


def _deepseek_v32(topk):
    dc = DeepseekV32Config(q_lora_rank=24, index_topk=topk, index_head_dim=16, index_n_heads=3, **MLA_SIZES)
    dc._attn_implementation = "eager"
    attn = _randomise(DeepseekV32Attention(dc, 0).double().eval(), 2)
    return attn


def _hf_selection(attn, x):
    with torch.no_grad():
        idx = attn.indexer(x, attn.q_a_layernorm(attn.q_a_proj(x)), _hf_cos_sin(8), _causal_additive()[:, 0], None)
    chosen = torch.zeros(B, T, T, dtype=torch.bool).scatter(-1, idx.long(), True)
    return chosen & torch.ones(T, T, dtype=torch.bool).tril()  # a future key picked among -inf ties is masked anyway


def _my_selection(attn, x, k, indexer=None):
    mine = MultiHeadLatentAttention.from_hf(attn, MLAConfig(D, 4, 16, 12, 8, 10, q_lora_rank=24))
    indexer = LightningIndexer.from_hf(attn.indexer) if indexer is None else indexer
    with torch.no_grad():
        return mine, topk_keep(indexer(x, mine.q_norm(x @ mine.W_DQ)), k)


def test_lightning_indexer_selection_and_sparse_mla_match_deepseek_v32():
    attn, x = _deepseek_v32(4), _x()
    mine, keep = _my_selection(attn, x, 4)
    assert torch.equal(keep, _hf_selection(attn, x))
    assert keep.sum(-1).max() == 4 and keep[:, :3].sum() < keep[:, 3:].sum()  # really sparse past 4 keys
    with torch.no_grad():
        out_hf, _ = attn(x, _hf_cos_sin(8), _causal_additive())
        out, _ = mine(x, keep=keep)
    assert _max(out, out_hf) < TOL


def test_indexer_without_relu_or_without_head_weights_selects_other_keys():
    attn, x = _deepseek_v32(4), _x()
    hf = _hf_selection(attn, x)
    linear = LightningIndexer.from_hf(attn.indexer)
    linear.activation = lambda s: s  # a plain weighted dot product
    _, keep_linear = _my_selection(attn, x, 4, linear)
    unweighted = LightningIndexer.from_hf(attn.indexer)
    with torch.no_grad():
        unweighted.W_w.fill_(1.0)  # every indexer head weighted alike
    _, keep_unweighted = _my_selection(attn, x, 4, unweighted)
    kept = hf.sum().item()
    for keep in (keep_linear, keep_unweighted):
        assert (keep != hf).sum().item() / kept > 0.1  # over 10% of the selected keys differ


GEMMA_WINDOW = 5


def _gemma():
    gc = Gemma3TextConfig(hidden_size=D, num_attention_heads=4, num_key_value_heads=2, head_dim=8, num_hidden_layers=6,
                          sliding_window=GEMMA_WINDOW, query_pre_attn_scalar=8, vocab_size=50)
    gc._attn_implementation = "eager"
    return gc


def _gemma_masks(gc, x):
    kw = dict(config=gc, inputs_embeds=x, attention_mask=None, cache=None, position_ids=torch.arange(T)[None].expand(B, -1))
    return {LOCAL: create_sliding_window_causal_mask(**kw), GLOBAL: create_causal_mask(**kw)}


def test_layer_types_match_gemma3_config():
    assert layer_types(12, 5) == Gemma3TextConfig(num_hidden_layers=12).layer_types


def test_sliding_and_global_masks_match_gemma3_and_off_by_one_does_not():
    gc, x = _gemma(), _x()
    masks = _gemma_masks(gc, x)
    for kind, m in masks.items():
        keep_hf = (m == 0)[0, 0]  # additive: 0 where seen
        assert torch.equal(layer_keep_mask(kind, T, GEMMA_WINDOW), keep_hf)
    for wrong in (GEMMA_WINDOW - 1, GEMMA_WINDOW + 1):
        diff = (layer_keep_mask(LOCAL, T, wrong) != (masks[LOCAL] == 0)[0, 0]).sum().item()
        assert diff == T - min(wrong, GEMMA_WINDOW)  # the band's edge diagonal, i - j = min(window, wrong)


@pytest.mark.parametrize("layer_idx", [0, 5])
def test_local_global_attention_matches_gemma3_attention(layer_idx):
    gc, x = _gemma(), _x()
    attn = _randomise(Gemma3Attention(gc, layer_idx).double().eval(), 3)
    kind = gc.layer_types[layer_idx]
    base = gc.rope_parameters[kind]["rope_theta"]
    with torch.no_grad():
        out_hf, _ = attn(x, _hf_cos_sin(8, base), _gemma_masks(gc, x)[kind])
        good = LocalGlobalAttention.from_hf(attn, LocalGlobalConfig(D, 4, 2, 8, kind=kind, window=GEMMA_WINDOW,
                                                                    query_pre_attn_scalar=8))
        assert _max(good(x), out_hf) < TOL
        if kind == LOCAL:  # the window off by one misses
            off = LocalGlobalAttention.from_hf(attn, LocalGlobalConfig(D, 4, 2, 8, kind=kind, window=GEMMA_WINDOW + 1,
                                                                       query_pre_attn_scalar=8))
            assert _max(off(x), out_hf) > MARGIN
        # Llama's RMSNorm gain (weight, not 1 + weight) misses
        plain = LocalGlobalAttention.from_hf(attn, good.config)
        plain.q_norm.weight.data -= 1
        plain.k_norm.weight.data -= 1
        assert _max(plain(x), out_hf) > MARGIN


def test_longformer_band_with_global_tokens_through_the_tiled_kernel_matches_longformer_self_attention():
    """transformers' LongformerSelfAttention (its chunked band, global rows and columns) against the
    course's tiled kernel with :func:`longformer_mask_mod`. Longformer has separate projections for
    global attention; they are set equal to the local ones, so the comparison is of the pattern alone.
    Longformer's softmax runs in float32: tolerance 1e-6 (seen: about 3e-7)."""
    from transformers import LongformerConfig
    from transformers.models.longformer.modeling_longformer import LongformerSelfAttention

    from selfattn.efficient.tiled import tiled_attention
    from selfattn.open_models.local_global import longformer_mask_mod

    H, Dh, w, n = 2, 8, 4, 32  # one-sided window w: Longformer's attention_window is 2w
    cfg = LongformerConfig(hidden_size=H * Dh, num_attention_heads=H, attention_window=[2 * w], num_hidden_layers=1,
                           attention_probs_dropout_prob=0.0)
    attn = _randomise(LongformerSelfAttention(cfg, 0).double().eval(), 4)
    with torch.no_grad():
        for name in ("query", "key", "value"):
            getattr(attn, name + "_global").load_state_dict(getattr(attn, name).state_dict())
    x = torch.randn(1, n, H * Dh, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    global_positions = [0, 13]
    marks = torch.zeros(1, n, dtype=torch.float64)
    marks[0, global_positions] = 10000  # Longformer's convention: > 0 global, 0 local, < 0 padding
    with torch.no_grad():
        out_hf = attn(x, attention_mask=marks, is_index_masked=marks < 0, is_index_global_attn=marks > 0,
                      is_global_attn=True)[0]
        q, k, v = (getattr(attn, name)(x).view(1, n, H, Dh).transpose(1, 2) for name in ("query", "key", "value"))

        def ours(one_sided, globals_):
            out = tiled_attention(q, k, v, mask_mod=longformer_mask_mod(one_sided, globals_), block_q=8, block_k=8)
            return out.transpose(1, 2).reshape(1, n, H * Dh)

        assert _max(ours(w, global_positions), out_hf) < TOL
        assert _max(ours(w - 1, global_positions), out_hf) > MARGIN  # the band one narrower on each side
        assert _max(ours(w, []), out_hf) > MARGIN  # the global tokens left out
