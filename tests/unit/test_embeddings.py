"""Unit tests for selfattn.embeddings: the context-free token lookup and BERT's input embeddings.
Expected values are written out with torch ops in the test; tolerance float64 1e-12."""

import pytest
import torch
import torch.nn.functional as F

from selfattn.embeddings import BertEmbeddings, TokenEmbedding

TOL64 = dict(rtol=0.0, atol=1e-12)


def _bert(seed=0):
    torch.manual_seed(seed)
    emb = BertEmbeddings(vocab_size=30, d_model=8, max_positions=10, type_vocab_size=2).double()
    with torch.no_grad():
        emb.layer_norm.weight.normal_()
        emb.layer_norm.bias.normal_()
    return emb.eval()


def test_token_embedding_is_a_context_free_lookup():
    torch.manual_seed(0)
    emb = TokenEmbedding(30, 8)
    ids = torch.tensor([[5, 7, 9], [1, 5, 2]])
    out = emb(ids)
    assert out.shape == (2, 3, 8)
    torch.testing.assert_close(out[0, 0], emb.weight[5], rtol=0, atol=0)
    torch.testing.assert_close(out[0, 0], out[1, 1], rtol=0, atol=0)  # same token, other context


def test_bert_embeddings_equal_layer_norm_of_the_three_sums():
    emb = _bert()
    ids = torch.tensor([[3, 4, 5, 6], [7, 3, 0, 0]])
    types = torch.tensor([[0, 0, 1, 1], [0, 1, 1, 1]])
    total = emb.token.weight[ids] + emb.position.weight[:4] + emb.token_type.weight[types]
    expected = F.layer_norm(total, (8,), emb.layer_norm.weight, emb.layer_norm.bias, eps=1e-12)
    torch.testing.assert_close(emb(ids, types), expected, **TOL64)
    torch.testing.assert_close(emb(ids), emb(ids, torch.zeros_like(ids)), **TOL64)


def test_bert_embeddings_depend_on_position():
    emb = _bert()
    out = emb(torch.tensor([[3, 3, 3]]))
    assert torch.isfinite(out).all()
    assert (out[0, 0] - out[0, 2]).abs().max() > 1e-3  # same token, different positions


def test_embeddings_bad_inputs_name_the_argument():
    emb = _bert()
    ids = torch.tensor([[3, 4, 5]])
    with pytest.raises(TypeError, match="input_ids must be an int64 or int32 tensor"):
        emb(ids.float())
    with pytest.raises(
        ValueError, match=r"input_ids must be in \[0, vocab_size=30\); got min 3, max 30"
    ):
        emb(torch.tensor([[3, 30]]))
    with pytest.raises(ValueError, match=r"input_ids must have shape \(B, T\)"):
        emb(ids[0])
    with pytest.raises(ValueError, match="T=11 positions; at most max_positions=10"):
        emb(torch.zeros(1, 11, dtype=torch.int64))
    with pytest.raises(ValueError, match="token_type_ids must have the shape of input_ids"):
        emb(ids, torch.zeros(1, 2, dtype=torch.int64))
    with pytest.raises(ValueError, match=r"token_type_ids must be in \[0, type_vocab_size=2\)"):
        emb(ids, torch.full((1, 3), 2))
    with pytest.raises(ValueError, match="vocab_size must be > 0"):
        TokenEmbedding(0, 8)
    with pytest.raises(ValueError, match="layer_norm_eps must be > 0"):
        BertEmbeddings(30, 8, 10, layer_norm_eps=0)
