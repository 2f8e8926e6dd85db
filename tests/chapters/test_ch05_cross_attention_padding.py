"""Claim 11 (chapter 05): cross-attention is the same mechanism with queries from one sequence and
keys/values from another, and a trained encoder-decoder learns with it to read the other sequence
(digit reversal: decoder position i reads source position n - 1 - i).

The padding tests (``test_padding_...``) check chapter 05's second topic, not a numbered claim: with
a padding mask, real tokens do not see (or change with) padding."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import selfattn
from selfattn.multihead import MultiHeadAttention

SENTENCES = [
    "The chef added salt because the soup tasted bland.",
    "It was fine.",
    "Padding must not change a thing.",
]


def test_claim_11_cross_attention_is_the_same_function():
    gen = torch.Generator().manual_seed(0)
    B, H, T, S, Dh = 2, 3, 4, 7, 8
    q = torch.randn(B, H, T, Dh, generator=gen, dtype=torch.float64)
    k, v = (torch.randn(B, H, S, Dh, generator=gen, dtype=torch.float64) for _ in range(2))
    context, weights = selfattn.scaled_dot_product_attention(q, k, v, return_weights=True)
    assert context.shape == (B, H, T, Dh) and weights.shape == (B, H, T, S)
    # Oracles: torch's own attention and the NumPy reference, with T != S.
    torch.testing.assert_close(
        context, torch.nn.functional.scaled_dot_product_attention(q, k, v), rtol=0, atol=1e-12
    )
    np.testing.assert_allclose(
        context.numpy(),
        selfattn.ref.scaled_dot_product_attention(q.numpy(), k.numpy(), v.numpy()),
        rtol=0,
        atol=1e-12,
    )
    torch.testing.assert_close(
        weights.sum(-1), torch.ones(B, H, T, dtype=torch.float64), rtol=0, atol=1e-12
    )

    # The module: MultiHeadAttention(x_q, x_kv) equals nn.MultiheadAttention(query, key=value=x_kv).
    torch.manual_seed(0)
    torch_mha = torch.nn.MultiheadAttention(16, 4, batch_first=True, dtype=torch.float64).eval()
    mha = MultiHeadAttention.from_torch(torch_mha).eval()
    x_q = torch.randn(2, 5, 16, generator=gen, dtype=torch.float64)
    x_kv = torch.randn(2, 9, 16, generator=gen, dtype=torch.float64)
    with torch.no_grad():
        out, w = mha(x_q, x_kv, return_weights=True)
        expected, expected_w = torch_mha(
            x_q, x_kv, x_kv, need_weights=True, average_attn_weights=False
        )
        torch.testing.assert_close(out, expected, rtol=0, atol=1e-10)
        torch.testing.assert_close(w, expected_w, rtol=0, atol=1e-10)
        assert out.shape == (2, 5, 16) and w.shape == (2, 4, 5, 9)
        # Self-attention is the special case x_kv = x_q.
        torch.testing.assert_close(mha(x_q), mha(x_q, x_q), rtol=0, atol=0)
        # Queries do not change the keys and values: a change in query row 0 moves output row 0 only.
        changed = x_q.clone()
        changed[:, 0] += 1.0
        moved = (mha(changed, x_kv) - out).abs().amax(dim=(0, 2))  # (T,)
        assert moved[0] > 1e-3 and moved[1:].max() == 0
        # The keys and values do come from x_kv: changing it changes every output row.
        assert (mha(x_q, x_kv + 1.0) - out).abs().amax(dim=(0, 2)).min() > 1e-3


def test_claim_11_cross_attention_learns_to_read_the_source_sequence():
    """Trained on digit reversal, the encoder-decoder reverses held-out strings, and its
    cross-attention (queries from the decoder, keys and values from the encoder) puts its weight on
    source position n - 1 - i; before training, and with cross-attention cut, it cannot. The
    chapter's seed, 0 (seeds 1 and 2 give the same margins: exact match 1.0, argmax 1.0)."""
    seed = 0
    from selfattn.models.seq2seq import (
        Seq2Seq,
        Seq2SeqConfig,
        evaluate_reversal,
        held_out_reversal,
        train_reversal,
    )

    config = Seq2SeqConfig()
    result = train_reversal(config, seed=seed)
    assert all(np.isfinite(result.losses)) and result.losses[-1] < 0.1
    assert result.exact_match > 0.95 and result.digit_accuracy > 0.99
    chance = 1 / config.length
    assert result.alignment_argmax > 0.9 and result.alignment_weight > 0.8 > 5 * chance
    held_src, held_tgt = held_out_reversal(config, seed)
    torch.manual_seed(seed)
    untrained = evaluate_reversal(Seq2Seq(config).eval(), held_src, held_tgt, [])
    assert untrained.alignment_argmax < 0.5 and untrained.exact_match < 0.01
    # Cut the cross-attention (its output projection and bias to zero): the decoder can no longer
    # read the source, and the digits it writes fall to about chance (1/10).
    model = result.model
    with torch.no_grad():
        for block in model.decoder:
            block.cross_attn.W_O.zero_()
            block.cross_attn.b_O.zero_()
    cut = evaluate_reversal(model, held_src, held_tgt, [])
    assert cut.exact_match < 0.01 and cut.digit_accuracy < 0.2


def test_padding_mask_keeps_real_tokens_unchanged(minilm):
    encoder = minilm.encoder()
    batch = minilm.tokenize(SENTENCES)
    lengths = batch.attention_mask.sum(dim=1)
    assert torch.equal(
        selfattn.padding_mask(lengths, batch.input_ids.shape[1]),
        selfattn.from_hf_attention_mask(batch.attention_mask),
    )
    with torch.no_grad():
        reference = encoder(batch.input_ids, batch.attention_mask, output_weights=True)
        for extra in (1, 5, 20):
            ids = torch.nn.functional.pad(
                batch.input_ids, (0, extra), value=minilm.config.pad_token_id
            )
            mask01 = torch.nn.functional.pad(batch.attention_mask, (0, extra), value=0)
            masked = encoder(ids, mask01, output_weights=True)
            unmasked = encoder(ids).last_hidden_state
            for b, L in enumerate(lengths.tolist()):
                got = masked.last_hidden_state[b, :L]
                assert torch.isfinite(got).all()
                torch.testing.assert_close(
                    got, reference.last_hidden_state[b, :L], rtol=0, atol=1e-5
                )
                assert (unmasked[b, :L] - reference.last_hidden_state[b, :L]).abs().max() > 0.1
                for (
                    layer_weights
                ) in masked.weights:  # padding keys get exactly zero weight in every layer
                    assert layer_weights[b, :, :, L:].abs().max() == 0


def test_padding_mean_pooling_needs_the_mask(minilm):
    encoder = minilm.encoder()
    batch = minilm.tokenize(SENTENCES)
    short = 1
    with torch.no_grad():
        alone = (
            encoder(minilm.tokenize(SENTENCES[short]).input_ids).last_hidden_state[0].mean(dim=0)
        )
        plain = []
        for extra in (0, 5, 20):
            ids = torch.nn.functional.pad(
                batch.input_ids, (0, extra), value=minilm.config.pad_token_id
            )
            mask01 = torch.nn.functional.pad(batch.attention_mask, (0, extra), value=0)
            hidden = encoder(ids, mask01).last_hidden_state[short]
            real = mask01[short].to(hidden.dtype)[:, None]
            masked_mean = (hidden * real).sum(dim=0) / real.sum()
            cos = torch.nn.functional.cosine_similarity(masked_mean, alone, dim=0)
            assert float(cos) == pytest.approx(1.0, abs=1e-6)
            plain.append(
                float(torch.nn.functional.cosine_similarity(hidden.mean(dim=0), alone, dim=0))
            )
    assert plain[0] < 0.9 and plain[-1] < 0.5 and plain[0] > plain[1] > plain[2]
    # The library's sentence embedding pools over the real tokens only.
    torch.testing.assert_close(
        minilm.sentence_embedding(SENTENCES)[short],
        torch.nn.functional.normalize(alone, dim=0),
        rtol=0,
        atol=1e-5,
    )


def test_left_padding_with_position_offsets_generates_each_prompt_as_alone():
    """Chapter 05's left-padding demonstration on chapter 04's TinyLM (learned positions), float64."""
    from selfattn.models import TinyLM, TinyLMConfig

    torch.manual_seed(0)
    lm = TinyLM(TinyLMConfig(32, block_size=24, d_model=32, n_heads=4, n_layers=2, d_ff=64)).double().eval()
    prompts = [[5, 17, 3, 9, 21, 4], [12, 7], [30, 2, 2, 8]]
    T0, n_new = 6, 8
    ids = torch.tensor([[0] * (T0 - len(p)) + p for p in prompts])  # padding first
    real = torch.tensor([[0] * (T0 - len(p)) + [1] * len(p) for p in prompts])
    n_pad = [T0 - len(p) for p in prompts]

    def keep_and_positions(real):
        T = real.shape[1]
        keep = torch.tensor([[[j <= i and bool(r[j]) for j in range(T)] for i in range(T)] for r in real])[:, None]
        offsets = torch.tensor(n_pad)[:, None]
        return keep, (torch.arange(T)[None] - offsets).clamp(min=0)  # row b: column t at position t - n_pad[b]

    with torch.no_grad():
        batch, batch_real = ids, real
        for _ in range(n_new):
            nxt = lm(batch, *keep_and_positions(batch_real))[:, -1].argmax(-1, keepdim=True)
            batch, batch_real = torch.cat([batch, nxt], 1), torch.cat([batch_real, torch.ones_like(nxt)], 1)
        batch_logits = lm(batch, *keep_and_positions(batch_real))
        assert torch.isfinite(batch_logits).all()
        for b, p in enumerate(prompts):
            alone = torch.tensor([p])
            for _ in range(n_new):
                nxt = lm(alone, selfattn.causal_mask(alone.shape[1]))[:, -1].argmax(-1, keepdim=True)
                alone = torch.cat([alone, nxt], 1)
            assert torch.equal(batch[b, n_pad[b]:], alone[0])
            torch.testing.assert_close(batch_logits[b, n_pad[b]:], lm(alone, selfattn.causal_mask(alone.shape[1]))[0],
                                       rtol=0, atol=1e-10)
        # the two ways to get it wrong, for the prompt of length 2 padded by 4
        alone_next = lm(torch.tensor([prompts[1]]), selfattn.causal_mask(2))[0, -1]
        no_offsets = lm(ids, keep_and_positions(real)[0])[1, -1]  # masked, positions 0 .. T0-1
        right = torch.tensor([p + [0] * (T0 - len(p)) for p in prompts])
        right_last = lm(right, selfattn.causal_mask(T0))[1, -1]  # the last column is padding
    assert (no_offsets - alone_next).abs().max() > 1e-2
    assert (right_last - alone_next).abs().max() > 1e-2
