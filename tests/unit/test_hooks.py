"""selfattn.hooks: a hooked run with no hooks is the model's own forward; the cache has the documented
shapes; a hook's replacement reaches the output (checked against chapter 14's mean ablation); refusals."""

from __future__ import annotations

import pytest
import torch

from selfattn.encoder import Encoder, EncoderConfig
from selfattn.experiments.induction import AttentionOnly, InductionConfig, run_ablated
from selfattn.hooks import hook_names, run_with_cache, run_with_hooks
from selfattn.models.gpt import GPT, GPTConfig

SMALL = InductionConfig(vocab_size=16, seq_len=20, span=5, d_model=16, n_heads=2, steps=1, batch_size=4)


def _gpt(positions):
    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=20, block_size=16, d_model=16, n_heads=2, n_layers=2, d_ff=32,
                         positions=positions)).eval()


@pytest.mark.parametrize("positions", ["rope", "alibi", "learned", "none"])
def test_hooked_gpt_without_hooks_is_the_forward(positions):
    model = _gpt(positions)
    ids = torch.randint(20, (3, 12), generator=torch.Generator().manual_seed(1))
    out, cache = run_with_cache(model, ids)
    torch.testing.assert_close(out, model(ids), atol=1e-6, rtol=0)
    _, weights = model(ids, return_weights=True)
    for layer in range(2):
        torch.testing.assert_close(cache[f"blocks.{layer}.attn.hook_pattern"], weights[layer], atol=1e-6, rtol=0)
    assert set(cache) == set(hook_names(model))
    assert cache["blocks.1.attn.hook_z"].shape == (3, 2, 12, 8)
    assert cache["blocks.1.attn.hook_result"].shape == (3, 2, 12, 16)
    assert cache["blocks.0.hook_resid_post"].shape == (3, 12, 16)
    assert cache["ln_final.hook_scale"].shape == (3, 12, 1)
    # the residual stream is the sum of what was written into it
    resid = cache["hook_embed"].clone()
    for layer in range(2):
        torch.testing.assert_close(cache[f"blocks.{layer}.attn.hook_result"].sum(1) + model.blocks[layer].attn.b_O,
                                   cache[f"blocks.{layer}.hook_attn_out"], atol=1e-6, rtol=0)
        resid = resid + cache[f"blocks.{layer}.hook_attn_out"] + cache[f"blocks.{layer}.hook_mlp_out"]
    torch.testing.assert_close(resid, cache["blocks.1.hook_resid_post"], atol=1e-5, rtol=0)


@pytest.mark.parametrize("final_norm", [False, True])
def test_hooked_attention_only_without_hooks_is_the_forward(final_norm):
    torch.manual_seed(0)
    model = AttentionOnly(InductionConfig(**{**SMALL.__dict__, "final_norm": final_norm})).eval()
    ids = torch.randint(16, (2, 20), generator=torch.Generator().manual_seed(2))
    out, cache = run_with_cache(model, ids)
    torch.testing.assert_close(out, model(ids), atol=1e-6, rtol=0)
    assert ("ln_final.hook_scale" in cache) == final_norm


def test_hooked_encoder_without_hooks_is_the_forward():
    torch.manual_seed(0)
    model = Encoder(EncoderConfig(vocab_size=50, d_model=12, n_layers=2, n_heads=3, d_ff=20)).eval()
    ids = torch.randint(50, (2, 7), generator=torch.Generator().manual_seed(3))
    mask = torch.tensor([[1] * 7, [1] * 5 + [0] * 2])
    out, cache = run_with_cache(model, ids, attention_mask=mask)
    expected = model(ids, mask, output_weights=True)
    torch.testing.assert_close(out, expected.last_hidden_state, atol=1e-6, rtol=0)
    torch.testing.assert_close(cache["blocks.1.attn.hook_pattern"], expected.weights[1], atol=1e-6, rtol=0)
    torch.testing.assert_close(cache["blocks.0.hook_resid_post"], expected.hidden_states[1], atol=1e-6, rtol=0)


def test_zeroing_a_heads_output_is_chapter_14s_ablation_with_zero_means():
    torch.manual_seed(0)
    model = AttentionOnly(SMALL).eval()
    ids = torch.randint(16, (2, 20), generator=torch.Generator().manual_seed(4))

    def zero_head_1(z, name):
        z = z.clone()
        z[:, 1] = 0.0
        return z

    patched = run_with_hooks(model, ids, {"blocks.0.attn.hook_z": zero_head_1})
    means = torch.zeros(2, 2, 8)
    expected, _ = run_ablated(model, ids, means, [(0, 1)])
    torch.testing.assert_close(patched, expected, atol=1e-6, rtol=0)
    assert (patched - model(ids)).abs().max() > 1e-3  # the patch changed something


def test_a_read_only_hook_changes_nothing_and_sees_the_activation():
    model = _gpt("rope")
    ids = torch.randint(20, (1, 6), generator=torch.Generator().manual_seed(5))
    seen = {}

    def look(x, name):
        seen[name] = tuple(x.shape)  # returns None: read only

    out = run_with_hooks(model, ids, {"blocks.1.attn.hook_pattern": look})
    torch.testing.assert_close(out, model(ids), atol=1e-6, rtol=0)
    assert seen == {"blocks.1.attn.hook_pattern": (1, 2, 6, 6)}


def test_refusals():
    model = _gpt("rope")
    ids = torch.randint(20, (1, 6))
    with pytest.raises(ValueError, match="unknown hook point"):
        run_with_hooks(model, ids, {"blocks.9.hook_resid_pre": lambda x, n: None})
    with pytest.raises(ValueError, match="must return None or a tensor of shape"):
        run_with_hooks(model, ids, {"blocks.0.hook_resid_pre": lambda x, n: x[:, :1]})
    with pytest.raises(TypeError, match="must be a callable"):
        run_with_hooks(model, ids, {"blocks.0.hook_resid_pre": 3})
    with pytest.raises(TypeError, match="GPT, an AttentionOnly or an Encoder"):
        run_with_cache(torch.nn.Linear(2, 2), ids)
    model.train()
    with pytest.raises(ValueError, match="eval-mode"):
        run_with_cache(model, ids)
