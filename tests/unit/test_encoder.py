"""Unit tests for selfattn.encoder and the MiniLM.run / sentence_embedding API built on it.

The layer-by-layer comparison with the real model in transformers is in
tests/parity/test_parity_minilm.py; here: shapes, the API contract, padding, and bad inputs.
"""

import dataclasses

import pytest
import torch

from selfattn.encoder import Encoder, EncoderConfig, EncoderOutput, hf_bert_state_dict
from selfattn.pretrained import MiniLMRun, load_minilm

SENTENCES = ["The chef added salt because the soup tasted bland.", "Hello world."]


def _tiny(seed=0):
    torch.manual_seed(seed)
    return Encoder(EncoderConfig(vocab_size=50, d_model=12, n_layers=2, n_heads=3, d_ff=20)).eval()


def test_minilm_run_api_smoke():
    run = load_minilm().run(SENTENCES)
    assert isinstance(run, MiniLMRun)
    B, T = run.batch.input_ids.shape
    assert B == 2 and run.lengths[1] < T  # the short sentence is padded
    assert len(run.hidden_states) == 7 and len(run.weights) == 6
    assert all(h.shape == (B, T, 384) and torch.isfinite(h).all() for h in run.hidden_states)
    assert all(w.shape == (B, 12, T, T) for w in run.weights)
    torch.testing.assert_close(run.last_hidden_state, run.hidden_states[-1], rtol=0, atol=0)
    # Rows sum to one; padding keys get exactly zero weight.
    for w in run.weights:
        torch.testing.assert_close(w.sum(-1), torch.ones(B, 12, T), rtol=0, atol=1e-5)
        assert torch.all(w[1, :, :, run.lengths[1] :] == 0)
    assert load_minilm().run(SENTENCES, output_weights=False).weights is None


def test_minilm_real_tokens_do_not_depend_on_padding():
    model = load_minilm()
    alone = model.run([SENTENCES[1]])
    padded = model.run(SENTENCES)
    n = alone.lengths[0]
    for a, p in zip(alone.hidden_states, padded.hidden_states, strict=True):
        torch.testing.assert_close(p[1, :n], a[0, :n], rtol=0, atol=1e-5)


def test_minilm_encoder_is_cached_in_eval_mode_without_gradients():
    model = load_minilm()
    enc = model.encoder()
    assert enc is model.encoder()
    assert not enc.training and not any(p.requires_grad for p in enc.parameters())
    torch.testing.assert_close(
        enc.blocks[3].attn.W_Q,
        model.state_dict["encoder.layer.3.attention.self.query.weight"].T,
        rtol=0,
        atol=0,
    )


def test_sentence_embedding_is_unit_length_and_similar_sentences_are_closer():
    emb = load_minilm().sentence_embedding(
        ["A man is eating food.", "A man is eating a meal.", "The stock market fell sharply."]
    )
    assert emb.shape == (3, 384)
    torch.testing.assert_close(emb.norm(dim=-1), torch.ones(3), rtol=0, atol=1e-6)
    cos = emb @ emb.T
    assert cos[0, 1] > cos[0, 2] + 0.3


def test_encoder_output_shapes_and_frozen_output():
    enc = _tiny()
    ids = torch.randint(0, 50, (2, 6))
    out = enc(ids, torch.ones(2, 6, dtype=torch.int64), output_weights=True)
    assert isinstance(out, EncoderOutput)
    assert [h.shape for h in out.hidden_states] == [(2, 6, 12)] * 3
    assert [w.shape for w in out.weights] == [(2, 3, 6, 6)] * 2
    assert enc(ids).weights is None
    with pytest.raises(dataclasses.FrozenInstanceError):
        out.weights = None


def test_encoder_masks_padding_keys():
    enc = _tiny()
    ids = torch.randint(1, 50, (1, 6))
    attention_mask = torch.tensor([[1, 1, 1, 1, 0, 0]])
    out = enc(ids, attention_mask, output_weights=True)
    assert all(torch.all(w[..., 4:] == 0) for w in out.weights)
    changed = ids.clone()
    changed[0, 4:] = 7  # different padding tokens change nothing at real positions
    for a, b in zip(out.hidden_states, enc(changed, attention_mask).hidden_states, strict=True):
        torch.testing.assert_close(a[:, :4], b[:, :4], rtol=0, atol=1e-6)


def test_encoder_bad_inputs_name_the_argument():
    enc = _tiny()
    ids = torch.randint(0, 50, (2, 6))
    with pytest.raises(
        ValueError, match=r"attention_mask must have the shape of input_ids \(2, 6\)"
    ):
        enc(ids, torch.ones(2, 5, dtype=torch.int64))
    with pytest.raises(TypeError, match="attention_mask must be an integer or boolean"):
        enc(ids, torch.ones(2, 6))
    with pytest.raises(ValueError, match=r"input_ids must be in \[0, vocab_size=50\)"):
        enc(ids + 50)
    with pytest.raises(ValueError, match=r"input_ids must have shape \(B, T\)"):
        enc(ids[0])
    with pytest.raises(ValueError, match="d_model=10 must be divisible by n_heads=3"):
        EncoderConfig(vocab_size=5, d_model=10, n_layers=1, n_heads=3, d_ff=4)
    with pytest.raises(ValueError, match="n_layers must be > 0"):
        EncoderConfig(vocab_size=5, d_model=12, n_layers=0, n_heads=3, d_ff=4)
    with pytest.raises(TypeError, match="config must be an EncoderConfig"):
        Encoder({"d_model": 12})


def test_hf_state_dict_mapping_is_strict():
    sd = load_minilm().state_dict
    mapped, unused = hf_bert_state_dict(sd, 6)
    assert unused == {"embeddings.position_ids", "pooler.dense.weight", "pooler.dense.bias"}
    assert set(mapped) == set(load_minilm().encoder().state_dict())
    missing = {k: v for k, v in sd.items() if k != "encoder.layer.2.output.dense.bias"}
    with pytest.raises(KeyError, match="encoder.layer.2.output.dense.bias"):
        hf_bert_state_dict(missing, 6)


def test_no_position_names_input_ids_with_its_shape():
    # Regression: T = 0 raised an error naming x_q, an argument of the attention layer inside.
    encoder = Encoder(EncoderConfig(vocab_size=10, d_model=8, n_layers=1, n_heads=2, d_ff=16))
    with pytest.raises(ValueError, match=r"input_ids must hold at least one token \(T > 0\) in \(B, T\); got shape \(2, 0\)"):
        encoder(torch.zeros(2, 0, dtype=torch.long))
