"""Claims of chapter 07 (the Transformer block), each checked against an independent oracle.

Claim 14: the full block is residual connections, normalization and a feed-forward network around
attention. The chapter's specific statements: the block structure (against the NumPy reference),
silent branches make a pre-norm block the identity, the FFN is position-wise, permutation
equivariance without positions and its loss with BERT's position embeddings, the size of the
residual stream by depth, the real model reproduced layer by layer (the full parity suite is
tests/parity/test_parity_minilm.py), and what the real layers write into the stream.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

import selfattn
from selfattn import ref
from selfattn.viz.block import branch_measures, stream_through

SENTENCES = [
    "The chef added salt because the soup tasted bland.",
    "The animal didn't cross the street because it was too tired.",
    "She sat on the river bank and watched the boats.",
]
CONFIG = selfattn.BlockConfig(d_model=16, n_heads=4, d_ff=64)


def _params(block) -> dict[str, np.ndarray]:
    a, f = block.attn, block.ffn
    p = {
        "W_Q": a.W_Q, "W_K": a.W_K, "W_V": a.W_V, "W_O": a.W_O, "b_Q": a.b_Q, "b_K": a.b_K, "b_V": a.b_V,
        "b_O": a.b_O, "ln1_gamma": block.ln1.weight, "ln1_beta": block.ln1.bias, "ln2_gamma": block.ln2.weight,
        "ln2_beta": block.ln2.bias, "W_1": f.linear1.weight.T, "b_1": f.linear1.bias, "W_2": f.linear2.weight.T,
        "b_2": f.linear2.bias,
    }  # fmt: skip
    return {k: v.detach().double().numpy() for k, v in p.items()}


def _random_blocks(seed=0):
    torch.manual_seed(seed)
    pre = selfattn.TransformerBlock(CONFIG).double().eval()
    with torch.no_grad():
        for p in pre.parameters():
            if p.ndim == 1:
                p.add_(0.1 * torch.randn_like(p))
    post = selfattn.PostNormTransformerBlock(CONFIG).double().eval()
    post.load_state_dict(pre.state_dict())
    return pre, post


def test_claim_14_blocks_are_residual_norm_and_ffn_around_attention(rng):
    pre, post = _random_blocks()
    x = rng.normal(size=(2, 5, 16))
    with torch.no_grad():
        got_pre, got_post = pre(torch.from_numpy(x)).numpy(), post(torch.from_numpy(x)).numpy()
    p = _params(pre)
    np.testing.assert_allclose(got_pre, ref.pre_norm_block(x, p, 4, eps=1e-5), atol=1e-12, rtol=0)
    np.testing.assert_allclose(got_post, ref.post_norm_block(x, p, 4, eps=1e-5), atol=1e-12, rtol=0)


def test_claim_14_real_post_norm_layer_matches_the_reference(minilm):
    run = minilm.run(SENTENCES[0], output_weights=False)
    block0 = minilm.encoder().blocks[0]
    expected = ref.post_norm_block(
        run.hidden_states[0].double().numpy(), _params(block0), 12, eps=minilm.config.layer_norm_eps
    )
    np.testing.assert_allclose(run.hidden_states[1].numpy(), expected, atol=1e-4, rtol=0)


def test_claim_14_silent_branches_make_pre_norm_the_identity(rng):
    pre, post = _random_blocks()
    with torch.no_grad():
        for b in (pre, post):
            for silenced in (b.attn.W_O, b.attn.b_O, b.ffn.linear2.weight, b.ffn.linear2.bias):
                silenced.zero_()
        x = torch.from_numpy(rng.normal(size=(2, 5, 16)))
        torch.testing.assert_close(pre(x), x, atol=0, rtol=0)
        p = _params(post)
        expected = ref.layer_norm(
            ref.layer_norm(x.numpy(), p["ln1_gamma"], p["ln1_beta"]), p["ln2_gamma"], p["ln2_beta"]
        )
        np.testing.assert_allclose(post(x).numpy(), expected, atol=1e-12, rtol=0)


def test_claim_14_ffn_is_position_wise(rng):
    ffn = selfattn.FeedForward(16, 64).double()
    x = torch.from_numpy(rng.normal(size=(2, 5, 16)))
    x2 = x.clone()
    x2[:, 2] += 1.0
    with torch.no_grad():
        change = (ffn(x2) - ffn(x)).abs().amax(dim=(0, 2))  # (T,)
    assert change[2] > 0.01
    torch.testing.assert_close(
        change[[0, 1, 3, 4]], torch.zeros(4, dtype=torch.float64), atol=0, rtol=0
    )


def test_claim_14_attention_without_positions_is_permutation_equivariant(rng, minilm):
    pre, post = _random_blocks()
    x = torch.from_numpy(rng.normal(size=(2, 7, 16)))
    perm = torch.from_numpy(rng.permutation(7))
    with torch.no_grad():
        for module in (pre, post, pre.attn):
            torch.testing.assert_close(module(x[:, perm]), module(x)[:, perm], atol=1e-12, rtol=0)
        batch = minilm.tokenize(SENTENCES[0])
        x_tok = minilm.token_embeddings(batch.input_ids)  # (1, T, D), no positions
        perm = torch.from_numpy(rng.permutation(x_tok.shape[1]))
        block0 = minilm.encoder().blocks[0]
        torch.testing.assert_close(
            block0(x_tok[:, perm]), block0(x_tok)[:, perm], atol=1e-4, rtol=0
        )


def test_claim_14_position_embeddings_break_the_symmetry(minilm):
    encoder = minilm.encoder()
    batch = minilm.tokenize(SENTENCES[0])
    perm = torch.randperm(batch.input_ids.shape[1], generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        out = encoder(batch.input_ids).last_hidden_state
        out_shuffled = encoder(batch.input_ids[:, perm]).last_hidden_state
    rel = (out_shuffled - out[:, perm]).norm(dim=-1) / out[:, perm].norm(dim=-1)
    assert torch.isfinite(rel).all() and rel.min() > 0.1


def test_claim_14_pre_norm_stream_grows_post_norm_stays():
    config = selfattn.BlockConfig(d_model=64, n_heads=4, d_ff=256)
    x = torch.randn(4, 16, 64, generator=torch.Generator().manual_seed(0))
    rms = {}
    for name, cls in (
        ("pre", selfattn.TransformerBlock),
        ("post", selfattn.PostNormTransformerBlock),
    ):
        torch.manual_seed(0)
        stack = stream_through([cls(config).eval() for _ in range(24)], x)
        rms[name] = np.array([np.sqrt(np.mean(s**2)) for s in stack])
    assert np.all(np.isfinite(rms["pre"])) and np.all(np.diff(rms["pre"]) > 0)
    assert abs(rms["pre"][-1] / rms["pre"][0] - 4.5) < 0.3  # the chapter: "about 4.5 times"
    np.testing.assert_allclose(rms["post"][1:], 1.0, atol=1e-3)


def test_claim_14_encoder_reproduces_transformers_on_the_chapter_sentences(minilm):
    os.environ["HF_HUB_OFFLINE"] = "1"
    transformers = pytest.importorskip("transformers")
    reference = transformers.BertModel.from_pretrained(
        str(selfattn.pretrained.model_dir()), attn_implementation="eager", local_files_only=True
    ).eval()
    ours = minilm.run(SENTENCES, output_weights=True)
    with torch.no_grad():
        theirs = reference(input_ids=ours.batch.input_ids, attention_mask=ours.batch.attention_mask,
                           output_hidden_states=True, output_attentions=True)  # fmt: skip
    real = ours.batch.attention_mask.bool()
    assert len(ours.hidden_states) == len(theirs.hidden_states) == 7
    for a, b in zip(ours.hidden_states, theirs.hidden_states, strict=True):
        torch.testing.assert_close(
            a[real], b[real], atol=2e-5, rtol=0
        )  # the chapter: about 5e-6, rounding-sized
    for a, b in zip(ours.weights, theirs.attentions, strict=True):
        torch.testing.assert_close(
            a.transpose(1, 2)[real], b.transpose(1, 2)[real], atol=2e-5, rtol=0
        )


def test_claim_14_real_layers_edit_the_stream(minilm):
    encoder = minilm.encoder()
    means = []
    for sentence in SENTENCES:
        run = minilm.run(sentence, output_weights=False)
        m = branch_measures(encoder.blocks, run.hidden_states)
        means.append({k: v.mean(axis=1) for k, v in m.items()})
    mean = {k: np.mean([m[k] for m in means], axis=0) for k in means[0]}  # (L,)
    assert all(np.isfinite(v).all() for v in mean.values())
    # the chapter: "between a fifth and two thirds"
    assert np.all((mean["attention / stream"] > 0.2) & (mean["attention / stream"] < 2 / 3))
    assert np.all(mean["FFN / stream"] > mean["attention / stream"])
    assert np.all(mean["cos(input, output)"][:5] > 0.8) and mean["cos(input, output)"][5] < 0.75


def test_claim_14_pre_norm_stack_needs_a_final_norm():
    """Inside a pre-norm stack nothing normalises the residual stream: each token's RMS grows with
    depth, and so, without a final layer norm, a fixed random output head's logits grow and its
    softmax entropy falls with depth; with the final norm both stay where they were at depth 0."""
    config = selfattn.BlockConfig(d_model=64, n_heads=4, d_ff=256)
    x = torch.randn(4, 16, 64, generator=torch.Generator().manual_seed(0))
    torch.manual_seed(0)
    stack = stream_through([selfattn.TransformerBlock(config).eval() for _ in range(24)], x)
    final_norm = torch.nn.LayerNorm(64)
    W_U = torch.randn(64, 1000, generator=torch.Generator().manual_seed(0)) / 64**0.5  # (D, vocab)
    rms, raw, normed = [], [], []
    with torch.no_grad():
        for depth in (0, 6, 12, 24):
            stream = torch.from_numpy(stack[depth]).float()
            assert torch.isfinite(stream).all()
            rms.append(float(stream.pow(2).mean(dim=-1).sqrt().mean()))
            for h, out in ((stream, raw), (final_norm(stream), normed)):
                logits = h @ W_U  # (B, T, 1000)
                p = logits.softmax(dim=-1)
                entropy = -(p * p.clamp_min(1e-30).log()).sum(dim=-1)  # (B, T), nats
                assert torch.isfinite(entropy).all()
                out.append((float(logits.std(dim=-1).mean()), float(entropy.mean())))
    assert rms[0] < rms[1] < rms[2] < rms[3] and rms[3] > 3 * rms[0]
    # Measured (seed 0): logit std 0.99 -> 4.49, entropy 6.41 -> 2.01 nats without LN_f;
    # unembedding seeds 0-2 give entropies at depth 24 of 2.0, 2.5, 1.5 nats.
    assert raw[3][0] > 3 * raw[0][0]
    assert raw[3][1] < raw[2][1] < raw[1][1] < raw[0][1] and raw[3][1] < raw[0][1] - 3
    # With LN_f (measured: std 0.999-1.004, entropy 6.405-6.422 nats at every depth).
    for std, entropy in normed:
        assert abs(std - normed[0][0]) < 0.05 and abs(entropy - normed[0][1]) < 0.1


# Claim 29: the modern block (RMSNorm, SwiGLU, no Q/K/V biases, a final norm) equals its reference
# implementation; attention inside it is unchanged.

MODERN = dict(d_model=16, n_heads=4, d_ff=40)


def _modern_block(seed=1, qk_norm=False):
    from selfattn import modern

    torch.manual_seed(seed)
    block = modern.ModernBlock(modern.ModernBlockConfig(**MODERN, qk_norm=qk_norm)).double().eval()
    with torch.no_grad():
        norms = [block.norm1, block.norm2] + ([block.attn.q_norm, block.attn.k_norm] if qk_norm else [])
        for norm in norms:
            norm.weight.add_(0.2 * torch.randn_like(norm.weight))  # non-trivial gains, so they are tested
    return block


@pytest.mark.parametrize("qk_norm", [False, True])
def test_claim_29_modern_block_matches_the_numpy_reference(rng, qk_norm):
    from selfattn import modern

    block = _modern_block(qk_norm=qk_norm)
    x = rng.normal(size=(2, 6, 16))
    keep = selfattn.causal_mask(6)
    with torch.no_grad():
        out, weights = block(torch.from_numpy(x), keep, return_weights=True)
    expected, expected_weights = ref.modern_block(
        x, modern.reference_params(block), 4, mask=keep.numpy(), eps=1e-6, qk_norm=qk_norm, return_weights=True
    )
    assert torch.isfinite(out).all()
    np.testing.assert_allclose(out.numpy(), expected, atol=1e-12, rtol=0)  # measured: 1.1e-15
    np.testing.assert_allclose(weights.numpy(), expected_weights, atol=1e-12, rtol=0)


def test_claim_29_modern_parts_match_transformers_llama(rng):
    os.environ["HF_HUB_OFFLINE"] = "1"
    pytest.importorskip("transformers")
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaMLP, LlamaRMSNorm

    block = _modern_block()
    config = LlamaConfig(hidden_size=16, intermediate_size=40, num_attention_heads=4, num_key_value_heads=4,
                         num_hidden_layers=1, vocab_size=32, rms_norm_eps=1e-6)  # fmt: skip
    x = torch.from_numpy(3 * rng.normal(size=(2, 6, 16)))
    mlp = LlamaMLP(config).double()
    mlp.load_state_dict(block.ffn.state_dict())
    norm = LlamaRMSNorm(16, eps=1e-6).double()
    norm.load_state_dict(block.norm1.state_dict())
    with torch.no_grad():
        torch.testing.assert_close(block.ffn(x), mlp(x), atol=1e-12, rtol=0)  # measured: 0
        # LlamaRMSNorm normalises in float32 whatever the dtype: its float64 output is exactly its gain
        # times the float32 normalisation, and in float32 it equals ours.
        unit32 = selfattn.modern.RMSNorm(16, 1e-6)(x.float()).double()
        assert torch.equal(norm(x), block.norm1.weight * unit32)
        norm32, ours32 = LlamaRMSNorm(16, eps=1e-6), selfattn.modern.RMSNorm(16, 1e-6)
        norm32.load_state_dict(block.norm1.state_dict())
        ours32.load_state_dict(block.norm1.state_dict())
        torch.testing.assert_close(ours32(x.float()), norm32(x.float()), atol=1e-6, rtol=0)  # measured: 0
        # The whole decoder layer, with PyTorch's float64 RMSNorm in place of Llama's float32 one and the
        # identity rotation in place of RoPE (the block has no positions).
        config._attn_implementation = "sdpa"
        layer = LlamaDecoderLayer(config, layer_idx=0).double().eval()
        layer.load_state_dict(selfattn.modern.llama_state_dict(block))
        for name in ("input_layernorm", "post_attention_layernorm"):
            exact = torch.nn.RMSNorm(16, eps=1e-6, dtype=torch.float64)
            exact.load_state_dict(getattr(layer, name).state_dict())
            setattr(layer, name, exact)
        keep = selfattn.causal_mask(6)
        additive = torch.zeros(6, 6, dtype=torch.float64).masked_fill(~keep, float("-inf")).expand(2, 1, 6, 6)
        rotation = (torch.ones(2, 6, 4, dtype=torch.float64), torch.zeros(2, 6, 4, dtype=torch.float64))
        theirs = layer(x, attention_mask=additive, position_embeddings=rotation)
        theirs = theirs[0] if isinstance(theirs, tuple) else theirs
        torch.testing.assert_close(block(x, keep), theirs, atol=1e-12, rtol=0)  # measured: 1.2e-15


def test_claim_29_attention_inside_the_modern_block_is_unchanged(rng):
    block = _modern_block()
    assert type(block.attn) is selfattn.MultiHeadAttention
    assert all(getattr(block.attn, b) is None for b in ("b_Q", "b_K", "b_V", "b_O"))
    classic = selfattn.TransformerBlock(selfattn.BlockConfig(d_model=16, n_heads=4, d_ff=40)).double().eval()
    with torch.no_grad():
        for name in ("W_Q", "W_K", "W_V", "W_O"):
            getattr(classic.attn, name).copy_(getattr(block.attn, name))
        for name in ("b_Q", "b_K", "b_V", "b_O"):
            getattr(classic.attn, name).zero_()
        x = torch.from_numpy(rng.normal(size=(2, 6, 16)))
        keep = selfattn.causal_mask(6)
        h = block.norm1(x)
        # the attention sublayer is the same function ...
        torch.testing.assert_close(block.attn(h, mask=keep), classic.attn(h, mask=keep), atol=0, rtol=0)
        # ... and the classic pre-norm block with the modern norms and network swapped in is the modern block
        classic.ln1, classic.ln2, classic.ffn = block.norm1, block.norm2, block.ffn
        out, weights = block(x, keep, return_weights=True)
        out_classic, weights_classic = classic(x, keep, return_weights=True)
        assert torch.isfinite(out).all()
        torch.testing.assert_close(out, out_classic, atol=0, rtol=0)
        torch.testing.assert_close(weights, weights_classic, atol=0, rtol=0)


def test_claim_29_a_key_bias_is_wasted_a_query_bias_is_not(rng):
    block = _modern_block()
    biased = selfattn.MultiHeadAttention(selfattn.MHAConfig(16, 4, bias=True)).double().eval()
    x = torch.from_numpy(rng.normal(size=(2, 6, 16)))
    keep = selfattn.causal_mask(6)
    with torch.no_grad():
        for name in ("W_Q", "W_K", "W_V", "W_O"):
            getattr(biased, name).copy_(getattr(block.attn, name))
        _, plain = block.attn(x, mask=keep, return_weights=True)
        biased.b_K.copy_(torch.from_numpy(rng.normal(size=16)))
        _, key_biased = biased(x, mask=keep, return_weights=True)
        biased.b_K.zero_()
        biased.b_Q.copy_(torch.from_numpy(rng.normal(size=16)))
        _, query_biased = biased(x, mask=keep, return_weights=True)
    torch.testing.assert_close(key_biased, plain, atol=1e-12, rtol=0)  # softmax ignores a per-row shift
    assert (query_biased - plain).abs().max() > 0.01  # measured: 0.5 (the chapter's seed)
    n_saved = sum(p.numel() for p in biased.parameters()) - sum(p.numel() for p in block.attn.parameters())
    assert n_saved == 4 * 16


def test_claim_29_a_modern_stack_needs_its_final_norm():
    from selfattn import modern

    x = torch.randn(4, 16, 64, generator=torch.Generator().manual_seed(0))
    torch.manual_seed(0)
    blocks = [modern.ModernBlock(modern.ModernBlockConfig(d_model=64, n_heads=4, d_ff=172)).eval() for _ in range(24)]
    streams = stream_through(blocks, x)
    rms = np.array([np.sqrt(np.mean(s**2)) for s in streams])
    final = modern.RMSNorm(64).double()
    with torch.no_grad():
        token_rms = np.stack([final(torch.from_numpy(s)).pow(2).mean(-1).sqrt().numpy() for s in streams])
    # Measured: 0.99 -> 4.40 (seed 0); seeds 1, 2 give 4.1 and 4.0 times.
    assert np.all(np.isfinite(rms)) and np.all(np.diff(rms) > 0) and rms[-1] / rms[0] > 3
    assert np.all(np.abs(token_rms - 1) < 1e-5)  # measured: within 9e-7 of 1


def test_claim_29_qk_norm_bounds_the_logits_that_grow_without_it():
    from selfattn.experiments.qk_norm import LogitGrowthConfig, train_logit_growth

    plain = train_logit_growth(LogitGrowthConfig(), qk_norm=False, seed=0)
    normed = train_logit_growth(LogitGrowthConfig(), qk_norm=True, seed=0)
    for run in (plain, normed):
        assert np.all(np.isfinite(run.max_logit)) and run.loss[-10:].mean() < 0.05  # both learn the task
    assert np.all(normed.max_logit <= normed.bound)  # the Cauchy-Schwarz bound, at every step
    # Measured (seeds 0, 1, 2): without QK-norm the largest logit ends at 340, 228, 459; with it at
    # 11.4, 12.9, 11.5 (never above 12.9).
    assert plain.max_logit[-1] > 150 and normed.max_logit.max() < 20
    assert plain.max_logit[-1] > 10 * normed.max_logit[-1]
