"""The learned sink logit against Hugging Face's GPT-OSS attention (chapter 11c, claim 38).

``transformers``' ``GptOssAttention`` at a small random config (nothing downloaded), eager path,
float64: its full and its sliding-window layer, its ``sinks`` parameter set to large and varied
values. The course's :class:`selfattn.sinks.SinkAttention` reads its weights and must give the same
output and the same weights; leaving the sink out of the denominator (the other convention) must not.
"""

import pytest
import torch

from selfattn.attention import scaled_dot_product_attention
from selfattn.sinks import SinkAttention

transformers = pytest.importorskip("transformers")
from transformers import GptOssConfig  # noqa: E402
from transformers.masking_utils import create_causal_mask, create_sliding_window_causal_mask  # noqa: E402
from transformers.models.gpt_oss.modeling_gpt_oss import GptOssAttention, GptOssRotaryEmbedding  # noqa: E402

D, H, HKV, DH, WINDOW, B, T = 32, 4, 2, 8, 5, 2, 11


def _config():
    config = GptOssConfig(hidden_size=D, num_attention_heads=H, num_key_value_heads=HKV, head_dim=DH,
                          num_hidden_layers=2, layer_types=["sliding_attention", "full_attention"],
                          sliding_window=WINDOW, attention_bias=True, vocab_size=16, intermediate_size=16,
                          num_local_experts=2, num_experts_per_tok=1,
                          rope_parameters={"rope_type": "default", "rope_theta": 10000.0})  # gpt-oss: YaRN on top
    config._attn_implementation = "eager"
    return config


def _run_hf(layer_idx: int):
    torch.manual_seed(layer_idx)
    config = _config()
    hf = GptOssAttention(config, layer_idx).double().eval()
    with torch.no_grad():
        for lin in (hf.q_proj, hf.k_proj, hf.v_proj, hf.o_proj):
            lin.weight.normal_(0, 0.4)
            lin.bias.normal_(0, 0.2)
        hf.sinks.copy_(torch.tensor([-2.0, 0.5, 3.0, 6.0], dtype=torch.float64))  # weak to dominant sinks
    x = torch.randn(B, T, D, dtype=torch.float64)
    position_ids = torch.arange(T)[None].expand(B, T)
    rotary = GptOssRotaryEmbedding(config)
    # its frequencies and angles are float32 (errors ~1e-7); the same formula in float64, checked against them
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, DH, 2, dtype=torch.float64) / DH))  # (Dh / 2,)
    torch.testing.assert_close(inv_freq.float(), rotary.inv_freq, atol=0, rtol=1e-6)
    angles = position_ids[..., None].double() * inv_freq  # (B, T, Dh / 2)
    cos, sin = angles.cos() * rotary.attention_scaling, angles.sin() * rotary.attention_scaling
    make = create_sliding_window_causal_mask if hf.sliding_window else create_causal_mask
    mask = make(config=config, inputs_embeds=x, attention_mask=torch.ones(B, T, dtype=torch.long), cache=None,
                position_ids=position_ids, allow_is_causal_skip=False)
    with torch.no_grad():
        out, weights = hf(x, (cos, sin), mask)
    return hf, x, out, weights


@pytest.mark.parametrize("layer_idx", [0, 1], ids=["sliding", "full"])
def test_sink_attention_equals_gpt_oss_attention(layer_idx):
    hf, x, out_hf, weights_hf = _run_hf(layer_idx)
    ours = SinkAttention.from_hf(hf)
    assert ours.config.sliding_window == (WINDOW if layer_idx == 0 else None)
    with torch.no_grad():
        out, weights = ours(x, return_weights=True)
    torch.testing.assert_close(out, out_hf, atol=1e-12, rtol=0)
    torch.testing.assert_close(weights, weights_hf, atol=1e-12, rtol=0)
    # the sink takes a real share: rows sum to well below one on average (head 3: sink logit 6)
    assert float(weights_hf.sum(-1)[:, 3].mean()) < 0.9


@pytest.mark.parametrize("layer_idx", [0, 1], ids=["sliding", "full"])
def test_leaving_the_sink_out_of_the_denominator_fails_parity(layer_idx):
    hf, x, out_hf, weights_hf = _run_hf(layer_idx)
    ours = SinkAttention.from_hf(hf)
    with torch.no_grad():
        q, k, v = ours.project(x)
        keep = ours.keep_mask(T)
        context, weights = scaled_dot_product_attention(q, k, v, keep, return_weights=True)  # no sink
        out = ours.output(context)
    assert float((out - out_hf).abs().max()) > 1e-2
    assert float((weights - weights_hf).abs().max()) > 1e-2
