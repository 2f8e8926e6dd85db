"""Unit tests for selfattn.multihead: head split/merge, MHAConfig, MultiHeadAttention.

Expected values come from maths written out in the test (per-head loops with torch.softmax),
never from the module under test. Tolerances: float64 1e-12 unless stated.
"""

import dataclasses
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from selfattn import (
    MHAConfig,
    MultiHeadAttention,
    causal_mask,
    merge_heads,
    padding_mask,
    split_heads,
)

TOL64 = dict(rtol=0.0, atol=1e-12)


def _module(d_model=12, n_heads=3, bias=True, dropout=0.0, seed=0):
    torch.manual_seed(seed)
    mha = MultiHeadAttention(MHAConfig(d_model, n_heads, bias=bias, dropout=dropout)).double()
    with torch.no_grad():  # non-zero biases so that a forgotten bias is caught
        for b in (mha.b_Q, mha.b_K, mha.b_V, mha.b_O):
            if b is not None:
                b.normal_()
    return mha.eval()


def _per_head_loop(mha, x_q, x_kv, scale_width=None):
    """The maths of Vaswani et al. section 3.2.2, one head at a time (no split/merge helpers)."""
    c = mha.config
    Dh = c.d_head
    heads, all_weights = [], []
    for h in range(c.n_heads):
        cols = slice(h * Dh, (h + 1) * Dh)
        Q = x_q @ mha.W_Q[:, cols] + mha.b_Q[cols]  # (B, T, D) @ (D, Dh) -> (B, T, Dh)
        K = x_kv @ mha.W_K[:, cols] + mha.b_K[cols]
        V = x_kv @ mha.W_V[:, cols] + mha.b_V[cols]
        scores = Q @ K.transpose(-2, -1) / math.sqrt(scale_width or Dh)  # (B, T, S)
        weights = torch.softmax(scores, dim=-1)
        heads.append(weights @ V)  # (B, T, Dh)
        all_weights.append(weights)
    concat = torch.cat(heads, dim=-1)  # (B, T, D)
    return concat @ mha.W_O + mha.b_O, torch.stack(all_weights, dim=1)


# --- split_heads / merge_heads -------------------------------------------------------------


def test_split_then_merge_is_identity_and_merge_then_split_too():
    x = torch.randn(2, 5, 12, dtype=torch.float64)
    torch.testing.assert_close(merge_heads(split_heads(x, 3)), x, **TOL64)
    y = torch.randn(2, 4, 5, 3, dtype=torch.float64)
    torch.testing.assert_close(split_heads(merge_heads(y), 4), y, **TOL64)


def test_split_heads_gives_head_h_the_feature_slice_h():
    x = torch.randn(2, 5, 12, dtype=torch.float64)
    heads = split_heads(x, 4)
    assert heads.shape == (2, 4, 5, 3)
    for h in range(4):
        torch.testing.assert_close(heads[:, h], x[..., 3 * h : 3 * (h + 1)], **TOL64)


def test_regression_merging_without_transposing_back_is_wrong():
    """Failure kind 'merging heads without transposing back': reshape (B, H, T, Dh) -> (B, T, D)
    straight away mixes positions of different heads into one row."""
    x = torch.randn(2, 5, 12, dtype=torch.float64)
    heads = split_heads(x, 3)
    wrong = heads.reshape(2, 5, 12)  # no transpose back
    assert not torch.allclose(wrong, x)
    assert (wrong - x).abs().max() > 0.1
    torch.testing.assert_close(merge_heads(heads), x, **TOL64)


def test_split_heads_bad_inputs_name_the_argument():
    with pytest.raises(ValueError, match="n_heads=5"):
        split_heads(torch.randn(2, 3, 12), 5)
    with pytest.raises(ValueError, match=r"x must have shape \(B, T, D\)"):
        split_heads(torch.randn(3, 12), 3)
    with pytest.raises(ValueError, match="n_heads must be > 0"):
        split_heads(torch.randn(2, 3, 12), 0)
    with pytest.raises(TypeError, match="x must be a torch.Tensor"):
        split_heads([[1.0]], 1)
    with pytest.raises(ValueError, match=r"x must have shape \(B, H, T, Dh\)"):
        merge_heads(torch.randn(2, 3, 12))


# --- MHAConfig -------------------------------------------------------------------------------


def test_config_d_head_and_validation():
    assert MHAConfig(384, 12).d_head == 32
    with pytest.raises(ValueError, match="d_model=10 must be divisible by n_heads=3"):
        MHAConfig(10, 3)
    with pytest.raises(ValueError, match="d_model must be > 0"):
        MHAConfig(0, 1)
    with pytest.raises(TypeError, match="n_heads must be a positive int"):
        MHAConfig(8, 2.0)
    with pytest.raises(ValueError, match="dropout must be in"):
        MHAConfig(8, 2, dropout=1.0)
    with pytest.raises(TypeError, match="bias must be a bool"):
        MHAConfig(8, 2, bias=1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        MHAConfig(8, 2).d_model = 4
    with pytest.raises(TypeError, match="config must be an MHAConfig"):
        MultiHeadAttention((8, 2))


# --- MultiHeadAttention ------------------------------------------------------------------------


def test_forward_equals_per_head_loop_self_and_cross():
    mha = _module()
    x = torch.randn(2, 5, 12, dtype=torch.float64)
    y = torch.randn(2, 7, 12, dtype=torch.float64)
    for x_kv in (None, y):
        out, weights = mha(x, x_kv, return_weights=True)
        expected_out, expected_weights = _per_head_loop(mha, x, x if x_kv is None else x_kv)
        assert out.shape == (2, 5, 12) and weights.shape == (2, 3, 5, 5 if x_kv is None else 7)
        torch.testing.assert_close(out, expected_out, **TOL64)
        torch.testing.assert_close(weights, expected_weights, **TOL64)


def test_regression_scores_are_scaled_by_sqrt_d_head_not_d_model():
    """Failure kind 'scaling by d_model instead of d_head'."""
    mha = _module(d_model=16, n_heads=4)
    x = torch.randn(1, 6, 16, dtype=torch.float64) * 3
    _, weights = mha(x, return_weights=True)
    hw = mha.head_weights(2)
    Q, K = x @ hw.W_Q + mha.b_Q[8:12], x @ hw.W_K + mha.b_K[8:12]
    scores = Q @ K.transpose(-2, -1) / math.sqrt(4)  # q k^T / sqrt(d_head), d_head = 4
    torch.testing.assert_close(weights[:, 2], torch.softmax(scores, -1), **TOL64)
    wrong = torch.softmax(Q @ K.transpose(-2, -1) / math.sqrt(16), -1)  # sqrt(d_model)
    assert (weights[:, 2] - wrong).abs().max() > 1e-3


def test_head_weights_are_views_of_the_right_slices():
    mha = _module(d_model=12, n_heads=3)
    hw = mha.head_weights(1)
    assert hw.W_Q.shape == (12, 4) and hw.W_O.shape == (4, 12)
    torch.testing.assert_close(hw.W_K, mha.W_K[:, 4:8], **TOL64)
    torch.testing.assert_close(hw.W_O, mha.W_O[4:8, :], **TOL64)
    assert hw.W_V.data_ptr() == mha.W_V[:, 4:8].data_ptr()  # a view, not a copy
    with pytest.raises(ValueError, match=r"h must be an int in \[0, 3\)"):
        mha.head_weights(3)


def test_no_bias_module_has_no_bias_parameters():
    mha = _module(bias=False)
    assert mha.b_Q is None and mha.b_O is None
    assert sorted(n for n, _ in mha.named_parameters()) == ["W_K", "W_O", "W_Q", "W_V"]
    x = torch.randn(1, 3, 12, dtype=torch.float64)
    assert torch.isfinite(mha(x)).all()


def test_mask_blocks_future_positions():
    mha = _module()
    x = torch.randn(1, 6, 12, dtype=torch.float64)
    out, weights = mha(x, mask=causal_mask(6), return_weights=True)
    assert torch.all(weights.triu(1) == 0)
    changed = x.clone()
    changed[:, 4:] = 100.0  # the future of positions 0..3
    torch.testing.assert_close(mha(changed, mask=causal_mask(6))[:, :4], out[:, :4], **TOL64)


def test_regression_dropout_only_in_training_mode():
    """Failure kind 'dropout still active in evaluation'."""
    mha = _module(dropout=0.5)
    no_dropout = _module(dropout=0.0)
    no_dropout.load_state_dict(mha.state_dict())
    x = torch.randn(2, 6, 12, dtype=torch.float64)
    mha.eval()
    first, second = mha(x), mha(x)
    torch.testing.assert_close(first, second, rtol=0, atol=0)
    torch.testing.assert_close(first, no_dropout(x), **TOL64)
    mha.train()
    torch.manual_seed(1)
    trained = mha(x)
    assert torch.isfinite(trained).all()
    assert (trained - first).abs().max() > 1e-3


def test_forward_bad_inputs_name_the_argument():
    mha = _module()
    x = torch.randn(2, 5, 12, dtype=torch.float64)
    with pytest.raises(
        ValueError, match=r"x_q must have shape \(B, T, D\) \(3 dims\); got shape \(5, 12\)"
    ):
        mha(x[0])
    with pytest.raises(ValueError, match="x_q must have last dim d_model=12; got shape"):
        mha(torch.randn(2, 5, 8, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"x_kv must have shape \(B, S, D\)"):
        mha(x, x[0])
    with pytest.raises(ValueError, match="same batch size B"):
        mha(x, torch.randn(3, 4, 12, dtype=torch.float64))
    with pytest.raises(TypeError, match="mask must be a boolean tensor"):
        mha(x, mask=torch.ones(5, 5, dtype=torch.float64))
    with pytest.raises(ValueError, match="mask must broadcast"):
        mha(x, mask=torch.ones(4, 5, dtype=torch.bool))
    with pytest.raises(TypeError, match="x_q must be a torch.Tensor"):
        mha(x.numpy())


def test_from_torch_and_to_torch_are_inverse_weight_mappings():
    torch.manual_seed(0)
    ref = nn.MultiheadAttention(12, 3, bias=True, batch_first=True, dtype=torch.float64)
    with torch.no_grad():
        ref.in_proj_bias.normal_()
        ref.out_proj.bias.normal_()
    mha = MultiHeadAttention.from_torch(ref)
    assert mha.config == MHAConfig(12, 3, bias=True, dropout=0.0)
    assert mha.W_Q.dtype == torch.float64
    torch.testing.assert_close(mha.W_K, ref.in_proj_weight[12:24].T, rtol=0, atol=0)
    torch.testing.assert_close(mha.b_V, ref.in_proj_bias[24:], rtol=0, atol=0)
    torch.testing.assert_close(mha.W_O, ref.out_proj.weight.T, rtol=0, atol=0)
    back = mha.to_torch(batch_first=False)
    assert back.batch_first is False
    for name, p in ref.state_dict().items():
        torch.testing.assert_close(back.state_dict()[name], p, rtol=0, atol=0)
    with pytest.raises(TypeError, match="mha must be a torch.nn.MultiheadAttention"):
        MultiHeadAttention.from_torch(mha)
    with pytest.raises(ValueError, match="kdim == vdim == embed_dim"):
        MultiHeadAttention.from_torch(nn.MultiheadAttention(12, 3, kdim=6, vdim=6))


@settings(max_examples=25, deadline=None)
@given(
    S=st.integers(1, 6),
    n_pad=st.integers(1, 4),
    seed=st.integers(0, 2**16),
    garbage=st.sampled_from([0.0, 1e4, math.nan, math.inf]),
)
def test_property_padding_keys_change_nothing(S, n_pad, seed, garbage):
    """Appending masked padding keys (even NaN or inf ones) leaves every output unchanged."""
    mha = _module()
    g = torch.Generator().manual_seed(seed)
    x_q = torch.randn(1, 3, 12, generator=g, dtype=torch.float64)
    x_kv = torch.randn(1, S, 12, generator=g, dtype=torch.float64)
    padded = torch.cat([x_kv, torch.full((1, n_pad, 12), garbage, dtype=torch.float64)], dim=1)
    keep = padding_mask([S], S + n_pad)  # (1, 1, 1, S + n_pad)
    out, weights = mha(x_q, padded, keep, return_weights=True)
    expected_out, expected_weights = _per_head_loop(mha, x_q, x_kv)
    torch.testing.assert_close(out, expected_out, rtol=0, atol=1e-12)
    torch.testing.assert_close(weights[..., :S], expected_weights, rtol=0, atol=1e-12)
    assert torch.all(weights[..., S:] == 0)


@pytest.mark.parametrize("bad", ["0.1", None, True])
def test_config_refuses_a_dropout_that_is_not_a_number(bad):
    # Regression: MHAConfig(dropout="0.1") was accepted and failed only in forward.
    with pytest.raises(TypeError, match=r"dropout must be a number in \[0, 1\); got"):
        MHAConfig(12, 3, dropout=bad)


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64])
def test_input_of_another_dtype_than_the_parameters_is_refused_by_name(dtype):
    # Regression: a float32 or int input to a float64 module failed inside matmul
    # ("expected m1 and m2 to have the same dtype").
    mha = _module()  # float64 parameters
    x = torch.ones(2, 5, 12, dtype=dtype)
    with pytest.raises(TypeError, match=rf"x_q must have the dtype of the module's parameters, "
                                        rf"torch.float64; got dtype {dtype}"):
        mha(x)
    with pytest.raises(TypeError, match=rf"x_kv must have .*torch.float64; got dtype {dtype}"):
        mha(torch.ones(2, 5, 12, dtype=torch.float64), x)


def test_head_weights_accepts_any_integral_index():
    mha = _module()
    for h in (np.int64(1), np.int32(1)):
        got = mha.head_weights(h)
        torch.testing.assert_close(got.W_Q, mha.W_Q[:, 4:8], rtol=0, atol=0)
        torch.testing.assert_close(got.W_O, mha.W_O[4:8, :], rtol=0, atol=0)
    with pytest.raises(ValueError, match=r"h must be an int in \[0, 3\); got 1.0"):
        mha.head_weights(1.0)


def test_an_empty_sequence_is_named_by_the_argument_the_user_passed():
    # Regression: self-attention over x_q with T = 0 said "k and v must hold at least one position",
    # names the user never passed.
    mha = _module()
    with pytest.raises(ValueError, match=r"x_q \(self-attention reads its keys and values from x_q\) must hold at least one position; got shape \(2, 0, 12\)"):
        mha(torch.zeros(2, 0, 12, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"x_kv must hold at least one position; got shape \(2, 0, 12\)"):
        mha(torch.zeros(2, 3, 12, dtype=torch.float64), torch.zeros(2, 0, 12, dtype=torch.float64))
    out = mha(torch.zeros(2, 0, 12, dtype=torch.float64), torch.ones(2, 3, 12, dtype=torch.float64))
    assert out.shape == (2, 0, 12)  # no queries, some keys: an empty result, as the reference


def test_a_nan_in_a_padded_x_kv_row_reaches_w_k_and_w_v_gradients_unless_zeroed():
    # Pins the documented behaviour (forward's mask argument): the padding mask acts on the scores, after
    # the projections, so a NaN in a padded x_kv row is hidden from out but reaches dW_K and dW_V through
    # x_kv @ W; zeroing the padded rows gives the gradients of the clean input.
    mha = _module()
    gen = torch.Generator().manual_seed(3)
    x_q, x_kv = torch.randn(2, 3, 12, generator=gen, dtype=torch.float64), torch.randn(2, 5, 12, generator=gen, dtype=torch.float64)
    keep = torch.tensor([[True] * 5, [True] * 3 + [False] * 2])  # (B, S): sequence 1 has 2 padded positions
    mask = keep[:, None, None, :]  # (B, 1, 1, S)
    clean = x_kv.clone()
    clean[1, 3:] = 0.0
    dirty = clean.clone()
    dirty[1, 3] = math.nan

    def grads(x):
        mha.zero_grad(set_to_none=True)
        out = mha(x_q, x, mask)
        out.sum().backward()
        return out.detach(), mha.W_K.grad.clone(), mha.W_V.grad.clone(), mha.W_Q.grad.clone()

    out_c, gk_c, gv_c, gq_c = grads(clean)
    out_d, gk_d, gv_d, gq_d = grads(dirty)
    torch.testing.assert_close(out_d, out_c, **TOL64)  # hidden from the output
    torch.testing.assert_close(gq_d, gq_c, **TOL64)  # and from W_Q's gradient
    assert gk_d.isnan().any() and gv_d.isnan().any()  # but not from W_K's and W_V's
    zeroed = dirty.masked_fill(~keep[..., None], 0.0)  # the remedy the docstring names
    _, gk_z, gv_z, _ = grads(zeroed)
    torch.testing.assert_close(gk_z, gk_c, **TOL64)
    torch.testing.assert_close(gv_z, gv_c, **TOL64)


def test_a_3d_mask_is_refused_not_read_per_head():
    """A (B, T, S) mask broadcast from the right is (1, B, T, S): with B == H, batch element b's
    padding mask was applied to head b of every element (a fresh user's trial found a 1.62 difference
    against mask[:, None]). Refused, naming the shape and the two ways to say what is meant."""
    m = MultiHeadAttention(MHAConfig(16, 4)).eval()
    x = torch.randn(4, 5, 16)
    keep = (torch.arange(5)[None, None] < torch.tensor([5, 4, 3, 2])[:, None, None]).expand(4, 5, 5)
    with pytest.raises(ValueError, match=r"got a 3-D mask of shape \(4, 5, 5\).*mask\[:, None\]"):
        m(x, mask=keep)
    out = m(x, mask=keep[:, None])  # per batch element, as meant
    for b in range(4):  # each element alone, with its own mask, gives the same rows
        alone = m(x[b:b + 1], mask=keep[b])
        torch.testing.assert_close(out[b:b + 1], alone, atol=1e-6, rtol=0)
