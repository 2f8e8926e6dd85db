"""The shared argument checks name the argument, what it got and what was expected."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

from selfattn import _validate as V


def test_shape_of_returns_plain_ints():
    assert V.shape_of(torch.zeros(2, 3)) == (2, 3)
    assert V.shape_of(np.zeros((4,))) == (4,)
    assert all(type(s) is int for s in V.shape_of(np.zeros((2, 1))))


def test_require_tensor_refuses_numpy():
    with pytest.raises(TypeError, match=r"q must be a torch\.Tensor; got ndarray"):
        V.require_tensor("q", np.zeros(3))
    V.require_tensor("q", torch.zeros(3))


def test_require_array_converts_to_float64_and_refuses_torch_and_bool():
    out = V.require_array("x", [1, 2, 3])
    assert out.dtype == np.float64
    np.testing.assert_array_equal(out, [1.0, 2.0, 3.0])
    with pytest.raises(TypeError, match=r"x must be a NumPy array .*got a torch\.Tensor"):
        V.require_array("x", torch.zeros(2))
    with pytest.raises(TypeError, match=r"x must hold real numbers; got dtype bool"):
        V.require_array("x", np.array([True, False]))
    with pytest.raises(TypeError, match=r"x must hold real numbers; got dtype <U"):
        V.require_array("x", np.array(["a"]))
    with pytest.raises(TypeError, match=r"x must hold real numbers; got dtype complex128"):
        V.require_array("x", np.array([1j]))


def test_require_min_rank_and_rank_name_layout_and_shape():
    with pytest.raises(
        ValueError,
        match=re.escape("q must have shape (..., T, Dh) (at least 2 dims); got shape (5,)"),
    ):
        V.require_min_rank("q", torch.zeros(5), 2, "(..., T, Dh)")
    with pytest.raises(
        ValueError, match=re.escape("X must have shape (B, T, D) (3 dims); got shape (1, 2, 3, 4)")
    ):
        V.require_rank("X", torch.zeros(1, 2, 3, 4), 3, "(B, T, D)")
    V.require_rank("X", torch.zeros(1, 2, 3), 3, "(B, T, D)")


@pytest.mark.parametrize("value", [0, -3])
def test_require_positive_int_refuses_non_positive(value):
    with pytest.raises(ValueError, match=rf"d_model must be > 0; got {value}"):
        V.require_positive_int("d_model", value)


@pytest.mark.parametrize("value", [2.0, True, "4", None])
def test_require_positive_int_refuses_non_int(value):
    with pytest.raises(TypeError, match=r"d_head must be a positive int; got"):
        V.require_positive_int("d_head", value)


def test_require_positive_int_accepts_numpy_int():
    result = V.require_positive_int("T", np.int64(4))
    assert result == 4 and type(result) is int


def test_require_qkv_messages_name_both_shapes():
    q, k, v = torch.zeros(2, 3, 4), torch.zeros(2, 5, 4), torch.zeros(2, 5, 6)
    V.require_qkv(q, k, v)
    with pytest.raises(
        ValueError, match=re.escape("same last dim d_head; got q (2, 3, 4) and k (2, 5, 8)")
    ):
        V.require_qkv(q, torch.zeros(2, 5, 8), v)
    with pytest.raises(
        ValueError,
        match=re.escape("number of positions S (dim -2); got k (2, 5, 4) and v (2, 6, 6)"),
    ):
        V.require_qkv(q, k, torch.zeros(2, 6, 6))
    with pytest.raises(
        ValueError,
        match=re.escape("leading (batch, head) dims; got q (3, 3, 4), k (2, 5, 4), v (2, 5, 6)"),
    ):
        V.require_qkv(torch.zeros(3, 3, 4), k, v)


def test_require_broadcastable():
    V.require_broadcastable("mask", torch.zeros(1, 5), (2, 3, 4, 5), "(..., T, S) =")
    V.require_broadcastable("mask", torch.zeros(2, 1, 4, 5), (2, 3, 4, 5), "(..., T, S) =")
    msg = re.escape("mask must broadcast to (..., T, S) = (2, 3, 4, 5); got shape (4, 6)")
    with pytest.raises(ValueError, match=msg):
        V.require_broadcastable("mask", torch.zeros(4, 6), (2, 3, 4, 5), "(..., T, S) =")
    # More dims than the target would grow the result: refused.
    with pytest.raises(ValueError, match=re.escape("got shape (1, 1, 4, 5)")):
        V.require_broadcastable("mask", torch.zeros(1, 1, 4, 5), (4, 5), "(..., T, S) =")


@pytest.mark.parametrize(
    "mask", [torch.ones(2, 2), torch.ones(2, 2, dtype=torch.int64), np.ones((2, 2))]
)
def test_require_bool_mask_refuses_float_and_int(mask):
    with pytest.raises(
        TypeError, match=r"mask must be a boolean (tensor|array) with True = may attend; got dtype .*bias="
    ):
        V.require_bool_mask("mask", mask)


def test_require_bool_mask_accepts_bool():
    V.require_bool_mask("mask", torch.ones(2, 2, dtype=torch.bool))
    V.require_bool_mask("mask", np.ones((2, 2), dtype=bool))


@pytest.mark.parametrize("scale", [0.0, -1.0, float("inf"), float("nan")])
def test_require_scale_refuses_non_positive_or_non_finite(scale):
    with pytest.raises(ValueError, match=r"scale must be a finite number > 0 or None"):
        V.require_scale(scale)


def test_require_scale_accepts_none_and_positive():
    V.require_scale(None)
    V.require_scale(0.125)


@pytest.mark.parametrize("p", [-0.1, 1.0, 1.5, float("nan")])
def test_require_probability_refuses_out_of_range(p):
    with pytest.raises(ValueError, match=r"dropout_p must be in \[0, 1\); got"):
        V.require_probability("dropout_p", p)


@pytest.mark.parametrize("bad", [True, "0.5", [1.0]])
def test_scale_must_be_a_number(bad):
    # Regression: True was accepted as a scale of 1.
    with pytest.raises(TypeError, match="scale must be a number"):
        V.require_scale(bad)


@pytest.mark.parametrize("p", [None, "0.1", True, [0.1], torch.tensor(0.1)])
def test_require_probability_refuses_non_numbers_by_name(p):
    # Regression: None gave "float() argument must be ...", "0.1" a str/float comparison error, and
    # MHAConfig(dropout='0.1') was accepted.
    with pytest.raises(TypeError, match=r"dropout_p must be a number in \[0, 1\); got .*\("):
        V.require_probability("dropout_p", p)


def test_require_probability_accepts_numbers_in_range():
    for p in (0, 0.0, 0.5, np.float32(0.25), np.int64(0)):
        V.require_probability("dropout", p)


def test_require_bool_mask_accepts_array_likes_and_refuses_float_lists_by_name():
    # Regression: a Python list of bools raised AttributeError ('list' object has no attribute 'dtype').
    V.require_bool_mask("mask", [[True, False], [True, True]])
    with pytest.raises(TypeError, match=r"mask must be a boolean (tensor|array) .*got dtype float64"):
        V.require_bool_mask("mask", [[1.0, 0.0]])


def _flag_calls():
    """One call per boolean flag of every public function, with every other argument valid."""
    import selfattn
    from selfattn import ref
    from selfattn.block import BlockConfig, PostNormTransformerBlock, TransformerBlock
    from selfattn.efficient import tiled_attention
    from selfattn.efficient.experiments import variant_errors
    from selfattn.encoder import Encoder, EncoderConfig
    from selfattn.experiments.retrieval import (
        RetrievalConfig,
        RetrievalModel,
        make_retrieval_batch,
        train_retrieval,
    )
    from selfattn.models.gpt import GPT, GPTConfig, train_lm
    from selfattn.models.tiny_lm import (
        TinyLM,
        TinyLMConfig,
        blind_next_token_loss,
        train_next_token,
    )
    from selfattn.multihead import MHAConfig, MultiHeadAttention
    from selfattn.viz.softmax import scaling_view

    q = k = v = torch.randn(1, 1, 4, 4, dtype=torch.float64)
    x = torch.randn(1, 4, 8)
    qn = q.numpy()
    mha = MultiHeadAttention(MHAConfig(8, 2))
    block_cfg = BlockConfig(8, 2, 16)
    ids = torch.arange(40) % 5
    gpt = GPT(GPTConfig(vocab_size=5, block_size=8, d_model=8, n_heads=2, n_layers=1, d_ff=16))
    tiny = TinyLM(TinyLMConfig(vocab_size=5, block_size=8, d_model=8, n_heads=2, d_ff=16))
    rcfg = RetrievalConfig(n_keys=10, n_values=5, n_pairs=6)
    W = np.eye(8)
    params = {n: np.eye(8) for n in ("W_Q", "W_K", "W_V", "W_O")}
    params.update({n: np.zeros(8) for n in ("b_Q", "b_K", "b_V", "b_O", "ln1_beta", "ln2_beta", "b_2")})
    params.update(ln1_gamma=np.ones(8), ln2_gamma=np.ones(8), W_1=np.ones((8, 16)), b_1=np.zeros(16),
                  W_2=np.ones((16, 8)))
    return {
        "sdpa return_weights": ("return_weights", lambda f: selfattn.scaled_dot_product_attention(q, k, v, return_weights=f)),
        "SelfAttention return_weights": ("return_weights", lambda f: selfattn.SelfAttention(
            selfattn.AttentionConfig(8, 4))(x, return_weights=f)),
        "MultiHeadAttention return_weights": ("return_weights", lambda f: mha(x, return_weights=f)),
        "MultiHeadAttention.to_torch batch_first": ("batch_first", lambda f: mha.to_torch(batch_first=f)),
        "TransformerBlock return_weights": ("return_weights", lambda f: TransformerBlock(block_cfg)(x, return_weights=f)),
        "PostNormTransformerBlock return_weights": ("return_weights", lambda f: PostNormTransformerBlock(block_cfg)(
            x, return_weights=f)),
        "Encoder output_weights": ("output_weights", lambda f: Encoder(EncoderConfig(10, 8, 1, 2, 16))(
            torch.zeros(1, 3, dtype=torch.long), output_weights=f)),
        "tiled_attention return_lse": ("return_lse", lambda f: tiled_attention(q, k, v, return_lse=f)),
        "tiled_attention causal": ("causal", lambda f: tiled_attention(q, k, v, causal=f)),
        "variant_errors causal": ("causal", lambda f: variant_errors(q[0], k[0], v[0], windows=(2,), causal=f)),
        "RetrievalModel return_weights": ("return_weights", lambda f: RetrievalModel(rcfg)(
            make_retrieval_batch(rcfg, 2, torch.Generator().manual_seed(0)), return_weights=f)),
        "train_retrieval progress": ("progress", lambda f: train_retrieval(RetrievalModel(rcfg), steps=1, progress=f)),
        "GPT return_weights": ("return_weights", lambda f: gpt(ids[None, :4], return_weights=f)),
        "GPT.generate greedy": ("greedy", lambda f: gpt.generate(ids[None, :4], 1, greedy=f)),
        "GPT.generate use_cache": ("use_cache", lambda f: gpt.generate(ids[None, :4], 1, greedy=True, use_cache=f)),
        "train_lm progress": ("progress", lambda f: train_lm(gpt, ids, ids, steps=1, batch_size=2, eval_every=1,
                                                            eval_batches=1, progress=f)),
        "blind_next_token_loss causal": ("causal", lambda f: blind_next_token_loss(tiny, ids[None, :4], ids[None, 1:5],
                                                                                  causal=f)),
        "train_next_token causal": ("causal", lambda f: train_next_token(tiny, ids, causal=f, steps=1, batch_size=2)),
        "ref.scaled_dot_product_attention return_weights": ("return_weights", lambda f: ref.scaled_dot_product_attention(
            qn, qn, qn, return_weights=f)),
        "ref.multi_head_attention return_weights": ("return_weights", lambda f: ref.multi_head_attention(
            x.double().numpy(), x.double().numpy(), W, W, W, W, 2, return_weights=f)),
        "ref.post_norm_block return_weights": ("return_weights", lambda f: ref.post_norm_block(
            x.double().numpy(), params, 2, return_weights=f)),
        "ref.pre_norm_block return_weights": ("return_weights", lambda f: ref.pre_norm_block(
            x.double().numpy(), params, 2, return_weights=f)),
        "ref.online_attention return_lse": ("return_lse", lambda f: ref.online_attention(qn, qn, qn, return_lse=f)),
        "scaling_view show_unscaled": ("show_unscaled", lambda f: scaling_view(4, show_unscaled=f, n_queries=4)),
        "scaling_view show_scaled": ("show_scaled", lambda f: scaling_view(4, show_scaled=f, n_queries=4)),
    }


_FLAG_CALLS = sorted(_flag_calls())


@pytest.mark.parametrize("case", _FLAG_CALLS)
def test_every_boolean_flag_of_the_public_functions_refuses_a_non_bool(case):
    # Regression: return_weights="no", return_lse="no" (and most other flags) were taken as True.
    name, call = _flag_calls()[case]
    for bad in ("no", 0, None):
        with pytest.raises(TypeError, match=rf"{name} must be True or False; got {re.escape(repr(bad))}"):
            call(bad)
    call(False)  # a real bool is accepted
