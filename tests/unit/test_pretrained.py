"""The real model, all-MiniLM-L6-v2, read offline from the installed package.

Independent oracles: the package's own ``vocab.txt`` (line number = token id) and the safetensors
file opened directly with ``safetensors.safe_open``.
"""

from __future__ import annotations

import re
import socket

import pytest
import torch
from safetensors import safe_open

from selfattn.pretrained import MiniLM, MiniLMConfig, TokenBatch, load_minilm, model_dir


def _vocab() -> dict[str, int]:
    lines = (model_dir() / "vocab.txt").read_text(encoding="utf-8").splitlines()
    return {token: i for i, token in enumerate(lines)}


def test_loads_offline_without_any_network(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")

    def refuse(*args, **kwargs):
        raise AssertionError("the model loader tried to open a network connection")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    model = MiniLM()  # a fresh load, not the cached one
    assert model.embedding_table.shape == (30522, 384)


def test_load_minilm_is_cached(minilm):
    assert load_minilm() is load_minilm() is minilm


def test_model_dir_holds_the_files():
    path = model_dir()
    for name in ("model.safetensors", "tokenizer.json", "config.json", "vocab.txt"):
        assert (path / name).is_file(), name


def test_config(minilm):
    c = minilm.config
    assert (c.n_layers, c.n_heads, c.d_model, c.d_head, c.vocab_size, c.d_ff) == (
        6,
        12,
        384,
        32,
        30522,
        1536,
    )
    assert c.pad_token_id == 0 and c.max_positions == 512


def test_config_validated():
    good = dict(
        vocab_size=10,
        d_model=8,
        n_layers=1,
        n_heads=2,
        d_ff=16,
        max_positions=4,
        type_vocab_size=2,
        layer_norm_eps=1e-12,
        pad_token_id=0,
    )
    MiniLMConfig(**good)
    with pytest.raises(ValueError, match=r"d_model=8 must be divisible by n_heads=3"):
        MiniLMConfig(**{**good, "n_heads": 3})
    with pytest.raises(ValueError, match=r"n_layers must be > 0; got 0"):
        MiniLMConfig(**{**good, "n_layers": 0})


def test_weights_are_float32_with_bert_names(minilm):
    sd = minilm.state_dict
    assert all(t.dtype == torch.float32 for name, t in sd.items() if name != "embeddings.position_ids")
    for layer in range(6):
        assert sd[f"encoder.layer.{layer}.attention.self.query.weight"].shape == (384, 384)
        assert sd[f"encoder.layer.{layer}.intermediate.dense.weight"].shape == (1536, 384)


def test_tokenize_pads_to_the_longest_with_cls_and_sep(minilm):
    batch = minilm.tokenize(["The river bank.", "I opened a bank account at the bank today."])
    assert isinstance(batch, TokenBatch)
    assert batch.input_ids.dtype == torch.int64 and batch.attention_mask.dtype == torch.int64
    lengths = batch.attention_mask.sum(-1).tolist()
    assert batch.input_ids.shape == (2, max(lengths))  # padded to the longest, not to 128
    vocab = _vocab()
    assert vocab["[CLS]"] == 101 and vocab["[SEP]"] == 102 and vocab["[PAD]"] == 0
    for row, n, tokens in zip(batch.input_ids, lengths, batch.tokens, strict=True):
        assert row[0] == 101 and row[n - 1] == 102
        assert (row[n:] == 0).all()
        assert row.tolist() == [vocab[t] for t in tokens]  # ids agree with vocab.txt
    assert batch.tokens[0][:5] == ["[CLS]", "the", "river", "bank", "."]


def test_keep_mask_from_attention_mask(minilm):
    batch = minilm.tokenize(["a b c", "a"])
    keep = batch.keep_mask()
    assert keep.dtype == torch.bool and keep.shape == (2, 1, 1, batch.input_ids.shape[1])
    assert torch.equal(keep[:, 0, 0], batch.attention_mask == 1)


def test_single_string_is_a_batch_of_one(minilm):
    assert minilm.tokenize("hello world").input_ids.shape[0] == 1


def test_bank_is_one_token(minilm):
    ids = minilm.tokenizer.encode("bank", add_special_tokens=False).ids
    assert ids == [_vocab()["bank"]]
    assert minilm.token_id("bank") == ids[0]
    with pytest.raises(KeyError, match=r"token 'qwertyuiop' is not in the vocabulary"):
        minilm.token_id("qwertyuiop")


def test_embedding_lookup_equals_the_table_row(minilm):
    bank = minilm.token_id("bank")
    with safe_open(str(model_dir() / "model.safetensors"), framework="pt") as f:
        row = f.get_slice("embeddings.word_embeddings.weight")[bank : bank + 1].float()[0]
    batch = minilm.tokenize(["the river bank", "a bank account"])
    embedded = minilm.token_embeddings(batch.input_ids)
    assert embedded.shape == (*batch.input_ids.shape, 384)
    positions = (batch.input_ids == bank).nonzero().tolist()
    assert len(positions) == 2
    for b, t in positions:  # the same vector in both sentences: a context-free lookup (claim 1)
        torch.testing.assert_close(embedded[b, t], row, rtol=0, atol=0)


def test_bad_ids_raise(minilm):
    with pytest.raises(
        ValueError,
        match=re.escape(
            "input_ids must be in [0, 30522); got min 0, max 30522 in a tensor of shape (1, 2)"
        ),
    ):
        minilm.token_embeddings(torch.tensor([[0, 30522]]))
    with pytest.raises(ValueError, match=re.escape("got min -1, max 5 in a tensor of shape (2,)")):
        minilm.token_embeddings(torch.tensor([-1, 5]))
    with pytest.raises(
        TypeError, match=r"input_ids must be an int64 or int32 tensor; got dtype torch\.float32"
    ):
        minilm.token_embeddings(torch.tensor([[1.0, 2.0]]))
    with pytest.raises(TypeError, match=r"input_ids must be a torch\.Tensor; got list"):
        minilm.token_embeddings([[101, 102]])


def test_bad_sentences_raise(minilm):
    with pytest.raises(ValueError, match=r"sentences must not be empty"):
        minilm.tokenize([])
    with pytest.raises(TypeError, match=r"sentences must be a str or a list of str; got int"):
        minilm.tokenize(3)
    with pytest.raises(TypeError, match=r"sentences must be a str or a list of str; got list"):
        minilm.tokenize(["ok", 3])


def test_integer_buffers_keep_their_dtype(minilm):
    # Regression: every tensor used to be cast to float32, position_ids included.
    assert minilm.state_dict["embeddings.position_ids"].dtype == torch.int64
    assert minilm.state_dict["embeddings.word_embeddings.weight"].dtype == torch.float32


def test_tokenize_max_length_cuts_and_is_checked():
    minilm = load_minilm()
    text = "word " * 300
    assert minilm.tokenize(text, max_length=10).input_ids.shape == (1, 10)
    assert minilm.tokenize(text).input_ids.shape == (1, 302)  # [CLS] + 300 + [SEP]: within 512
    for bad in (1, 513, 2.5, True):
        with pytest.raises(ValueError, match=r"max_length must be an int in \[2, 512\]"):
            minilm.tokenize(text, max_length=bad)


def test_run_refuses_a_non_bool_output_weights(minilm):
    # Regression: output_weights="no" was taken as True (every layer's weights returned).
    with pytest.raises(TypeError, match=r"output_weights must be True or False; got 'no'"):
        minilm.run("a sentence", output_weights="no")
