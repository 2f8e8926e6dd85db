"""The torch path: ``scaled_dot_product_attention``, ``masked_softmax``, ``SelfAttention``.

Bad inputs raise errors that name the argument and the shapes; the contracts of DESIGN.md hold
(zero rows for fully masked queries, masking by replacement, NaN at masked positions never reaches
the output or the gradients, scaling by sqrt(d_head), dropout only when asked). Expected values
come from torch's own softmax or the NumPy reference, never from the code under test.
"""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
import torch

import selfattn
from selfattn import AttentionConfig, SelfAttention, causal_mask, masked_softmax, padding_mask, ref
from selfattn import scaled_dot_product_attention as sdpa
from selfattn.modern import QKNormAttention

TOL64 = 1e-12


def _qkv(gen, B=2, H=3, T=4, S=5, Dh=8, Dv=6, dtype=torch.float64, requires_grad=False):
    q = torch.randn(B, H, T, Dh, generator=gen, dtype=dtype)
    k = torch.randn(B, H, S, Dh, generator=gen, dtype=dtype)
    v = torch.randn(B, H, S, Dv, generator=gen, dtype=dtype)
    if requires_grad:
        for x in (q, k, v):
            x.requires_grad_(True)
    return q, k, v


def _ref(q, k, v, mask=None, **kw):
    m = None if mask is None else mask.numpy()
    return ref.scaled_dot_product_attention(
        q.detach().double().numpy(),
        k.detach().double().numpy(),
        v.detach().double().numpy(),
        m,
        **kw,
    )


# --- bad inputs --------------------------------------------------------------------------------


def test_wrong_rank_names_argument_and_shape(gen):
    q, k, v = _qkv(gen)
    with pytest.raises(
        ValueError,
        match=re.escape("q must have shape (..., T, Dh) (at least 2 dims); got shape (8,)"),
    ):
        sdpa(q[0, 0, 0], k, v)
    with pytest.raises(
        ValueError,
        match=re.escape("k must have shape (..., S, Dh) (at least 2 dims); got shape (8,)"),
    ):
        sdpa(q, k[0, 0, 0], v)
    with pytest.raises(
        ValueError,
        match=re.escape("v must have shape (..., S, Dv) (at least 2 dims); got shape (6,)"),
    ):
        sdpa(q, k, v[0, 0, 0])


def test_mismatched_shapes_name_both(gen):
    q, k, v = _qkv(gen)
    with pytest.raises(
        ValueError,
        match=re.escape(
            "q and k must have the same last dim d_head; got q (2, 3, 4, 8) and k (2, 3, 5, 7)"
        ),
    ):
        sdpa(q, k[..., :7], v)
    with pytest.raises(ValueError, match=re.escape("got k (2, 3, 5, 8) and v (2, 3, 4, 6)")):
        sdpa(q, k, v[..., :4, :])
    with pytest.raises(
        ValueError,
        match=re.escape(
            "same leading (batch, head) dims; got q (2, 3, 4, 8), k (2, 2, 5, 8), v (2, 2, 5, 6)"
        ),
    ):
        sdpa(q, k[:, :2], v[:, :2])


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.int64, torch.uint8])
def test_non_boolean_mask_refused_with_hint_to_bias(gen, dtype):
    q, k, v = _qkv(gen)
    mask = torch.ones(4, 5, dtype=dtype)  # a 0/1 "mask" whose meaning is ambiguous
    with pytest.raises(
        TypeError,
        match=rf"mask must be a boolean tensor with True = may attend; got dtype {dtype}.*bias=",
    ):
        sdpa(q, k, v, mask)


def test_numpy_mask_refused(gen):
    q, k, v = _qkv(gen)
    with pytest.raises(TypeError, match=r"mask must be a torch\.Tensor; got ndarray"):
        sdpa(q, k, v, np.ones((4, 5), dtype=bool))


@pytest.mark.parametrize("shape", [(4, 4), (5, 4), (2, 4, 5), (2, 3, 4, 5, 1), (1, 1, 1, 4, 5)])
def test_mask_that_does_not_broadcast(gen, shape):
    q, k, v = _qkv(gen)
    msg = re.escape(f"mask must broadcast to (..., T, S) = (2, 3, 4, 5); got shape {shape}")
    with pytest.raises(ValueError, match=msg):
        sdpa(q, k, v, torch.ones(shape, dtype=torch.bool))


def test_mask_of_rank_one_refused(gen):
    q, k, v = _qkv(gen)
    with pytest.raises(
        ValueError,
        match=re.escape("mask must have shape (..., T, S) (at least 2 dims); got shape (5,)"),
    ):
        sdpa(q, k, v, torch.ones(5, dtype=torch.bool))


def test_bad_bias(gen):
    q, k, v = _qkv(gen)
    with pytest.raises(
        TypeError,
        match=r"bias must be a floating tensor added to the scores; got dtype torch\.bool",
    ):
        sdpa(q, k, v, bias=torch.ones(4, 5, dtype=torch.bool))
    with pytest.raises(
        ValueError,
        match=re.escape("bias must broadcast to (..., T, S) = (2, 3, 4, 5); got shape (5, 4)"),
    ):
        sdpa(q, k, v, bias=torch.zeros(5, 4, dtype=torch.float64))
    with pytest.raises(TypeError, match=r"bias must be a torch\.Tensor; got ndarray"):
        sdpa(q, k, v, bias=np.zeros((4, 5)))


@pytest.mark.parametrize("scale", [0.0, -0.5, float("inf"), float("nan")])
def test_bad_scale(gen, scale):
    q, k, v = _qkv(gen)
    with pytest.raises(ValueError, match=r"scale must be a finite number > 0 or None"):
        sdpa(q, k, v, scale=scale)


@pytest.mark.parametrize("p", [-0.1, 1.0, 2.0])
def test_bad_dropout_p(gen, p):
    q, k, v = _qkv(gen)
    with pytest.raises(ValueError, match=rf"dropout_p must be in \[0, 1\); got {p}"):
        sdpa(q, k, v, dropout_p=p)


def test_mixed_dtypes_refused(gen):
    q, k, v = _qkv(gen)
    with pytest.raises(
        TypeError,
        match=r"q, k and v must share one dtype; got torch\.float32, torch\.float64, torch\.float64",
    ):
        sdpa(q.float(), k, v)


def test_non_tensor_inputs_refused(gen):
    q, k, v = _qkv(gen)
    with pytest.raises(TypeError, match=r"k must be a torch\.Tensor; got ndarray"):
        sdpa(q, k.numpy(), v)


def test_attention_config_validated():
    with pytest.raises(ValueError, match=r"d_model must be > 0; got 0"):
        AttentionConfig(d_model=0, d_head=4)
    with pytest.raises(TypeError, match=r"d_head must be a positive int; got 4\.0"):
        AttentionConfig(d_model=8, d_head=4.0)
    with pytest.raises(TypeError, match=r"config must be an AttentionConfig; got dict"):
        SelfAttention({"d_model": 8, "d_head": 4})
    with pytest.raises(AttributeError):
        AttentionConfig(8, 4).d_model = 16  # frozen


def test_self_attention_bad_input(gen):
    layer = SelfAttention(AttentionConfig(d_model=8, d_head=4), generator=gen)
    with pytest.raises(
        ValueError, match=re.escape("X must have last dim d_model=8; got shape (2, 5, 7)")
    ):
        layer(torch.randn(2, 5, 7))
    with pytest.raises(
        ValueError,
        match=re.escape("X must have shape (B, T, D) or (T, D) (3 dims); got shape (1, 2, 5, 8)"),
    ):
        layer(torch.randn(1, 2, 5, 8))
    with pytest.raises(TypeError, match=r"X must be a torch\.Tensor; got list"):
        layer([[0.0] * 8])


# --- maths -------------------------------------------------------------------------------------


def test_masked_softmax_equals_torch_softmax(gen):
    scores = torch.randn(3, 4, 5, generator=gen, dtype=torch.float64) * 10
    torch.testing.assert_close(
        masked_softmax(scores, None), torch.softmax(scores, -1), rtol=0, atol=TOL64
    )
    keep = torch.rand(3, 4, 5, generator=gen) > 0.4
    keep[..., 0] = True
    expected = torch.softmax(scores.masked_fill(~keep, float("-inf")), -1)
    torch.testing.assert_close(masked_softmax(scores, keep), expected, rtol=0, atol=TOL64)


def test_scores_are_q_kT_over_sqrt_d_head(gen):
    """Scaling by sqrt(d_head), not d_model (issue 3): weights = softmax(q k^T / sqrt(Dh))."""
    q, k, v = _qkv(gen, Dh=16)
    _, weights = sdpa(q, k, v, return_weights=True)
    scores = q @ k.transpose(-2, -1) / math.sqrt(16)
    torch.testing.assert_close(weights, torch.softmax(scores, -1), rtol=0, atol=TOL64)
    # Recover the scores from the weights: log w differs from the scores by a per-row constant.
    log_w = weights.log()
    torch.testing.assert_close(log_w - log_w[..., :1], scores - scores[..., :1], rtol=0, atol=1e-10)
    # Scaling by d_model (here H * Dh = 48) would give visibly different weights.
    wrong = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(48), -1)
    assert (weights - wrong).abs().max() > 1e-2


def test_explicit_scale(gen):
    q, k, v = _qkv(gen)
    _, weights = sdpa(q, k, v, scale=0.05, return_weights=True)
    torch.testing.assert_close(
        weights, torch.softmax(q @ k.transpose(-2, -1) * 0.05, -1), rtol=0, atol=TOL64
    )


def test_bias_is_added_before_softmax(gen):
    q, k, v = _qkv(gen)
    bias = torch.randn(4, 5, generator=gen, dtype=torch.float64)
    expected = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(8) + bias, -1) @ v
    torch.testing.assert_close(sdpa(q, k, v, bias=bias), expected, rtol=0, atol=TOL64)


def test_two_dim_inputs(gen):
    q, k, v = (x[0, 0] for x in _qkv(gen))  # (T, Dh), (S, Dh), (S, Dv)
    np.testing.assert_allclose(sdpa(q, k, v).numpy(), _ref(q, k, v), rtol=0, atol=TOL64)


# --- contracts ---------------------------------------------------------------------------------


def test_fully_masked_row_gives_zero_weights_output_and_finite_zero_gradients(gen):
    q, k, v = _qkv(gen, requires_grad=True)
    keep = torch.ones(4, 5, dtype=torch.bool)
    keep[2] = False  # query 2 sees nothing
    context, weights = sdpa(q, k, v, keep, return_weights=True)
    assert torch.equal(weights[..., 2, :], torch.zeros_like(weights[..., 2, :]))
    assert torch.equal(context[..., 2, :], torch.zeros_like(context[..., 2, :]))
    assert torch.isfinite(context).all() and torch.isfinite(weights).all()
    (context.sum() + weights.sum()).backward()
    for name, x in (("q", q), ("k", k), ("v", v)):
        assert torch.isfinite(x.grad).all(), name
    assert torch.equal(q.grad[..., 2, :], torch.zeros_like(q.grad[..., 2, :]))


def test_everything_masked_gives_zero_gradients(gen):
    q, k, v = _qkv(gen, requires_grad=True)
    keep = torch.zeros(4, 5, dtype=torch.bool)
    context = sdpa(q, k, v, keep)
    assert torch.equal(context, torch.zeros_like(context))
    (context * torch.randn(context.shape, generator=gen, dtype=context.dtype)).sum().backward()
    for x in (q, k, v):
        assert torch.equal(x.grad, torch.zeros_like(x.grad))


def test_no_gradient_from_a_position_a_query_may_not_see(gen):
    q, k, v = _qkv(gen, B=1, H=1, T=4, S=4, requires_grad=True)
    keep = causal_mask(4)
    context = sdpa(q, k, v, keep)
    context[..., 1, :].sum().backward()  # query 1 sees keys 0 and 1 only
    assert torch.equal(k.grad[..., 2:, :], torch.zeros_like(k.grad[..., 2:, :]))
    assert torch.equal(v.grad[..., 2:, :], torch.zeros_like(v.grad[..., 2:, :]))
    assert k.grad[..., :2, :].abs().sum() > 0 and v.grad[..., :2, :].abs().sum() > 0


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_nan_and_inf_at_padded_positions_reach_neither_output_nor_gradients(gen, bad):
    q, k, v = _qkv(gen, requires_grad=False)
    lengths = torch.tensor([3, 5])
    keep = padding_mask(lengths, 5)  # (B, 1, 1, S): batch 0 has keys 3, 4 padded
    k_bad, v_bad = k.clone(), v.clone()
    k_bad[0, :, 3:] = bad
    v_bad[0, :, 3:] = bad
    expected = _ref(q, k, v, keep)
    for x in (q, k_bad, v_bad):
        x.requires_grad_(True)
    context = sdpa(q, k_bad, v_bad, keep)
    np.testing.assert_allclose(context.detach().numpy(), expected, rtol=0, atol=TOL64)
    context.sum().backward()
    for name, x in (("q", q), ("k", k_bad), ("v", v_bad)):
        assert torch.isfinite(x.grad).all(), name
    assert torch.equal(k_bad.grad[0, :, 3:], torch.zeros_like(k_bad.grad[0, :, 3:]))
    assert torch.equal(v_bad.grad[0, :, 3:], torch.zeros_like(v_bad.grad[0, :, 3:]))


def test_inf_at_a_key_masked_for_some_queries_reaches_only_the_query_that_sees_it(gen):
    q, k, v = _qkv(gen, B=1, H=1, T=4, S=4)
    keep = causal_mask(4)
    k_bad = k.clone()
    k_bad[..., 3, :] = float("inf")  # only query 3 may read key 3
    context = sdpa(q, k_bad, v, keep)
    np.testing.assert_allclose(
        context[..., :3, :].numpy(), _ref(q, k, v, keep)[..., :3, :], rtol=0, atol=TOL64
    )


def test_nan_value_at_a_position_masked_for_some_queries_does_not_reach_them(gen):
    q, k, v = _qkv(gen, B=1, H=1, T=4, S=4)
    keep = causal_mask(4)
    v_bad = v.clone()
    v_bad[..., 3, :] = float("nan")  # only query 3 may read position 3
    context = sdpa(q, k, v_bad, keep)
    np.testing.assert_allclose(
        context[..., :3, :].numpy(), _ref(q, k, v, keep)[..., :3, :], rtol=0, atol=TOL64
    )
    # Query 3 may read position 3, so it does read the NaN: the value is data, not hidden.
    assert torch.isnan(context[..., 3, :]).all()


def test_float_zero_one_mask_refused_even_if_it_looks_right(gen):
    q, k, v = _qkv(gen)
    keep = causal_mask(4, 5, alignment="top_left")
    with pytest.raises(TypeError, match=r"bias="):
        sdpa(q, k, v, keep.double())
    sdpa(q, k, v, keep)  # the boolean one is accepted


def test_causal_diagonal_included(gen):
    q, k, v = _qkv(gen, T=6, S=6)
    _, weights = sdpa(q, k, v, causal_mask(6), return_weights=True)
    diagonal = weights.diagonal(dim1=-2, dim2=-1)  # (B, H, T)
    assert (diagonal > 0).all()  # every token attends to itself
    torch.testing.assert_close(
        weights[..., 0, 0], torch.ones_like(weights[..., 0, 0]), rtol=0, atol=TOL64
    )
    upper = torch.triu(torch.ones(6, 6, dtype=torch.bool), diagonal=1)
    assert torch.equal(weights[..., upper], torch.zeros_like(weights[..., upper]))


def test_one_token_decoding_step_equals_last_row_of_full_causal_attention(gen):
    q, k, v = _qkv(gen, T=7, S=7)
    full = sdpa(q, k, v, causal_mask(7))
    step = sdpa(q[..., -1:, :], k, v, causal_mask(1, 7, alignment="bottom_right"))
    torch.testing.assert_close(step[..., 0, :], full[..., -1, :], rtol=0, atol=TOL64)
    # The top-left alignment would let the new token see only the first key: a different answer.
    wrong = sdpa(q[..., -1:, :], k, v, causal_mask(1, 7, alignment="top_left"))
    assert (wrong[..., 0, :] - full[..., -1, :]).abs().max() > 1e-2


def test_last_queries_of_bottom_right_mask_equal_full_causal_rows(gen):
    q, k, v = _qkv(gen, T=7, S=7)
    full = sdpa(q, k, v, causal_mask(7))
    tail = sdpa(q[..., -3:, :], k, v, causal_mask(3, 7, alignment="bottom_right"))
    torch.testing.assert_close(tail, full[..., -3:, :], rtol=0, atol=TOL64)


def test_masking_is_by_replacement(gen):
    """Adding a large value to masked scores (through bias) changes nothing: they are replaced."""
    q, k, v = _qkv(gen)
    keep = torch.rand(4, 5, generator=gen) > 0.5
    keep[:, 0] = True
    plain = sdpa(q, k, v, keep)
    for big in (1e4, 1e30, float("inf")):
        bias = torch.where(keep, 0.0, big).double()  # huge at masked scores only
        torch.testing.assert_close(sdpa(q, k, v, keep, bias=bias), plain, rtol=0, atol=TOL64)


def test_masked_scores_may_hold_nan_in_bias(gen):
    q, k, v = _qkv(gen)
    keep = causal_mask(4, 5, alignment="top_left")
    bias = torch.where(keep, 0.0, float("nan")).double()
    torch.testing.assert_close(
        sdpa(q, k, v, keep, bias=bias), sdpa(q, k, v, keep), rtol=0, atol=TOL64
    )


def test_dropout_zero_is_deterministic(gen):
    q, k, v = _qkv(gen)
    a = sdpa(q, k, v, dropout_p=0.0)
    b = sdpa(q, k, v, dropout_p=0.0)
    assert torch.equal(a, b)


def test_dropout_positive_changes_weights_between_calls(gen):
    q, k, v = _qkv(gen, T=16, S=16)
    torch.manual_seed(0)
    _, w1 = sdpa(q, k, v, dropout_p=0.5, return_weights=True)
    _, w2 = sdpa(q, k, v, dropout_p=0.5, return_weights=True)
    assert not torch.equal(w1, w2)
    _, w0 = sdpa(q, k, v, return_weights=True)
    # Inverted dropout: every kept weight is scaled by 1 / (1 - p), every other one is zero.
    kept = w1 != 0
    torch.testing.assert_close(w1[kept], w0[kept] * 2, rtol=0, atol=TOL64)
    assert 0.3 < kept.double().mean() < 0.7


def test_self_attention_is_deterministic_in_eval(gen):
    layer = SelfAttention(AttentionConfig(d_model=8, d_head=4), generator=gen).double().eval()
    X = torch.randn(2, 5, 8, generator=gen, dtype=torch.float64)
    assert torch.equal(layer(X), layer(X))


def test_self_attention_equals_the_formula(gen):
    layer = SelfAttention(AttentionConfig(d_model=8, d_head=4, bias=True), generator=gen).double()
    with torch.no_grad():
        for b in (layer.b_Q, layer.b_K, layer.b_V):
            b.normal_(generator=gen)
    X = torch.randn(2, 5, 8, generator=gen, dtype=torch.float64)
    Q, K, V = X @ layer.W_Q + layer.b_Q, X @ layer.W_K + layer.b_K, X @ layer.W_V + layer.b_V
    expected = torch.softmax(Q @ K.transpose(-2, -1) / 2.0, -1) @ V  # sqrt(Dh) = 2
    context, weights = layer(X, return_weights=True)
    torch.testing.assert_close(context, expected, rtol=0, atol=TOL64)
    assert weights.shape == (2, 5, 5)
    # (T, D) input without a batch axis.
    torch.testing.assert_close(layer(X[0]), expected[0], rtol=0, atol=TOL64)


def test_self_attention_projections_are_distinct_and_learnable(gen):
    layer = SelfAttention(AttentionConfig(d_model=8, d_head=4), generator=gen)
    names = {n for n, _ in layer.named_parameters()}
    assert names == {"W_Q", "W_K", "W_V"}
    assert not torch.equal(layer.W_Q, layer.W_K) and not torch.equal(layer.W_K, layer.W_V)
    assert layer.W_Q.shape == (8, 4)


def test_self_attention_with_causal_mask(gen):
    layer = SelfAttention(AttentionConfig(d_model=8, d_head=4), generator=gen).double()
    X = torch.randn(1, 6, 8, generator=gen, dtype=torch.float64)
    out = layer(X, causal_mask(6))
    X2 = X.clone()
    X2[:, 4:] = torch.randn(1, 2, 8, generator=gen, dtype=torch.float64)  # change the future
    torch.testing.assert_close(layer(X2, causal_mask(6))[:, :4], out[:, :4], rtol=0, atol=TOL64)


def test_public_names_exist():
    for name in (
        "scaled_dot_product_attention",
        "causal_mask",
        "padding_mask",
        "SelfAttention",
        "ref",
    ):
        assert hasattr(selfattn, name)


@pytest.mark.parametrize("dtype", [torch.int64, torch.bool])
def test_non_floating_inputs_are_refused_by_name(dtype):
    # Regression: integer inputs reached torch's matmul and failed with an internal error.
    x = torch.ones(1, 2, 3, 4, dtype=dtype)
    with pytest.raises(TypeError, match=r"floating-point tensors; got dtype"):
        sdpa(x, x, x)


def test_empty_keys_and_zero_width_heads_are_refused(gen):
    q, k, v = _qkv(gen)
    with pytest.raises(ValueError, match=r"at least one position \(S > 0\)"):
        sdpa(q, k[..., :0, :], v[..., :0, :])
    with pytest.raises(ValueError, match=r"d_head .* must be > 0"):
        sdpa(q[..., :0], k[..., :0], v)


def test_inputs_on_different_devices_are_refused(gen):
    # Regression: a key tensor on another device gave uninitialised memory, with no error.
    q, k, v = _qkv(gen)
    with pytest.raises(ValueError, match=r"one device"):
        sdpa(q, k.to("meta"), v)
    with pytest.raises(ValueError, match=r"mask must be on the device of q"):
        sdpa(q, k, v, torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool, device="meta"))


def test_nan_value_at_a_masked_position_leaves_the_other_rows_gradients_finite(gen):
    # Regression: the forward pass hid v[3] from queries 0-2, but backward computed 0 * NaN and
    # made q.grad NaN in every row. Expected: torch's own attention on the same, finite problem.
    q, k, v = _qkv(gen, B=2, H=2, T=5, S=5, requires_grad=True)
    keep = causal_mask(5)
    v_bad = v.detach().clone()
    v_bad[..., 3, :] = float("nan")  # only queries 3 and 4 may read position 3
    v_bad.requires_grad_(True)
    sdpa(q, k, v_bad, keep)[..., :3, :].sum().backward()
    v_finite = v.detach().clone()
    v_finite[..., 3, :] = 0.0  # rows 0-2 do not depend on v[3]
    v_finite.requires_grad_(True)
    q2 = q.detach().clone().requires_grad_(True)
    expected = torch.nn.functional.scaled_dot_product_attention(q2, k.detach(), v_finite, attn_mask=keep)
    expected[..., :3, :].sum().backward()
    assert torch.isfinite(q.grad[..., :3, :]).all() and torch.isfinite(v_bad.grad).all()
    torch.testing.assert_close(q.grad[..., :3, :], q2.grad[..., :3, :], rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(v_bad.grad, v_finite.grad, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("bad", [None, "0.1", True])
def test_dropout_p_that_is_not_a_number_is_refused_by_name(gen, bad):
    # Regression: None raised float()'s own TypeError and "0.1" a str/float comparison error.
    q, k, v = _qkv(gen)
    with pytest.raises(TypeError, match=r"dropout_p must be a number in \[0, 1\); got " + re.escape(repr(bad))):
        sdpa(q, k, v, dropout_p=bad)


def test_self_attention_names_x_when_its_dtype_differs_from_the_parameters():
    # Regression: a float64 or float16 X gave torch's "expected m1 and m2 to have the same dtype".
    layer = SelfAttention(AttentionConfig(16, 8))
    for dtype in (torch.float64, torch.float16):
        with pytest.raises(TypeError, match=r"X must have the dtype of the module's parameters, torch.float32"):
            layer(torch.randn(2, 5, 16).to(dtype))


def test_masked_softmax_checks_its_arguments_by_name():
    # Regression: a float, int, list or mis-shaped mask reached torch and failed with its raw errors.
    scores = torch.randn(2, 3, 4)
    with pytest.raises(TypeError, match="keep must be a boolean tensor"):
        masked_softmax(scores, torch.ones(3, 4))
    with pytest.raises(TypeError, match="keep must be a boolean tensor"):
        masked_softmax(scores, torch.ones(3, 4, dtype=torch.int64))
    with pytest.raises(ValueError, match=r"keep must broadcast to the shape of scores \(2, 3, 4\); got shape \(3, 5\)"):
        masked_softmax(scores, torch.ones(3, 5, dtype=torch.bool))
    with pytest.raises(TypeError, match="scores must be a torch.Tensor; got list"):
        masked_softmax([[0.0, 1.0]], None)
    with pytest.raises(TypeError, match="scores must be a floating-point tensor; got dtype torch.int64"):
        masked_softmax(torch.ones(2, 2, dtype=torch.int64), None)
    keep = torch.tensor([[True, False, True, True]])
    expected = ref.softmax(scores.double().numpy(), mask=np.broadcast_to(keep.numpy(), (2, 3, 4)))
    np.testing.assert_allclose(masked_softmax(scores.double(), keep).numpy(), expected, rtol=1e-12, atol=1e-15)


def test_masked_softmax_treats_a_positive_infinite_score_like_torch_and_the_reference():
    # Regression: the row maximum +inf was replaced by 0, so [inf, 1] gave [nan, 0], a row with a
    # silent zero; torch.softmax and selfattn.ref.softmax both give [nan, nan].
    scores = torch.tensor([[float("inf"), 1.0], [0.0, 1.0]], dtype=torch.float64)
    got = masked_softmax(scores, None)
    assert torch.isnan(got[0]).all()
    np.testing.assert_allclose(got.numpy(), ref.softmax(scores.numpy()), rtol=1e-12, atol=0)  # NaN where NaN
    torch.testing.assert_close(got, torch.softmax(scores, dim=-1), equal_nan=True)


def test_attention_config_bias_must_be_a_bool():
    # Regression: bias="no" was taken as True and created b_Q, b_K, b_V (MHAConfig already refused it).
    with pytest.raises(TypeError, match=r"bias must be True or False; got 'no' \(str\)"):
        AttentionConfig(8, 4, bias="no")
    assert [n for n, _ in SelfAttention(AttentionConfig(8, 4, bias=False)).named_parameters()] == ["W_Q", "W_K", "W_V"]


@pytest.mark.parametrize("with_keep", [False, True])
def test_masked_softmax_of_an_empty_axis_is_empty_like_torch_and_the_reference(with_keep):
    # Regression: an empty last axis raised torch's IndexError from amax.
    scores = torch.zeros(2, 3, 0, dtype=torch.float64, requires_grad=True)
    keep = torch.zeros(3, 0, dtype=torch.bool) if with_keep else None
    got = masked_softmax(scores, keep)
    expected = ref.softmax(scores.detach().numpy(), axis=-1, mask=None if keep is None else keep.numpy())
    assert got.shape == (2, 3, 0) == expected.shape and got.dtype == torch.float64
    torch.testing.assert_close(got, torch.softmax(scores, dim=-1), rtol=0, atol=0, equal_nan=False)
    got.sum().backward()  # still part of the graph
    assert scores.grad.shape == (2, 3, 0)


@pytest.mark.parametrize("shape", [(2, 0, 8), (0, 8)])
def test_self_attention_with_no_position_names_X_with_its_shape(shape):
    # Regression: T = 0 raised an error naming k and v, which the caller never passed.
    layer = SelfAttention(AttentionConfig(8, 4))
    with pytest.raises(ValueError, match=rf"X must hold at least one position \(T > 0\) .*got shape {re.escape(str(shape))}"):
        layer(torch.zeros(shape))


def test_masked_scores_backward_is_the_exact_gradient_and_differentiable_again(gen):
    # The product q k^T that sdpa uses when a mask hides pairs and q or k is non-finite: on finite
    # inputs its hand-written backward must be the true gradient, and differentiable (create_graph).
    from selfattn.attention import _MaskedScores

    q = torch.randn(2, 4, 3, generator=gen, dtype=torch.float64, requires_grad=True)
    k = torch.randn(2, 5, 3, generator=gen, dtype=torch.float64, requires_grad=True)
    keep = causal_mask(4, 5, alignment="bottom_right")
    # gradcheck compares with finite differences of the forward (which is the plain product)
    assert torch.autograd.gradcheck(lambda a, b: _MaskedScores.apply(a, b, keep).masked_fill(~keep, 0.0), (q, k))
    assert torch.autograd.gradgradcheck(lambda a, b: _MaskedScores.apply(a, b, keep).masked_fill(~keep, 0.0), (q, k))


def test_a_visible_nan_gives_nan_weights_only_on_the_keys_its_row_sees(gen):
    # Regression (found with the gradient contract): a NaN among a row's visible scores gave NaN
    # weights on its hidden keys too (0 / NaN), so dV of those keys was NaN; so did the NumPy
    # reference, against its docstring ("False entries get weight exactly 0 whatever x holds there").
    # Both: NaN on the row's visible entries, exactly 0 on its hidden ones.
    scores = torch.randn(3, 4, generator=gen, dtype=torch.float64)
    scores[1, 0] = float("nan")
    keep = causal_mask(3, 4, alignment="top_left")
    got = masked_softmax(scores, keep)
    want = ref.softmax(scores.numpy(), mask=keep.numpy())
    expected_nan = np.zeros((3, 4), dtype=bool)
    expected_nan[1, :2] = True  # row 1 sees keys 0 and 1
    np.testing.assert_array_equal(np.isnan(want), expected_nan)
    assert (want[~keep.numpy()] == 0).all() and (got[~keep] == 0).all()
    np.testing.assert_array_equal(np.isnan(got.numpy()), np.isnan(want))
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-12, atol=0)  # NaN where the reference is


def test_masked_softmax_of_a_0d_tensor_is_a_value_error_naming_scores():
    # Regression: a 0-d scores tensor raised IndexError (tuple index out of range) from the empty-axis
    # check; it has no axis to normalise over, so it is refused by name, as selfattn.ref.softmax does.
    for keep in (None, torch.tensor(True)):
        with pytest.raises(ValueError, match=r"scores must have at least one axis.*0-d"):
            masked_softmax(torch.tensor(1.0), keep)
    # one axis is still a single row: weights that sum to 1
    w = masked_softmax(torch.tensor([0.0, math.log(3.0)], dtype=torch.float64), None)
    torch.testing.assert_close(w, torch.tensor([0.25, 0.75], dtype=torch.float64), rtol=0, atol=1e-15)


def _float64_attention_and_grads(q, k, v, d_out, mask, scale):
    """Plain float64 softmax(q k^T scale) v and its gradients by torch autograd (not the code under test)."""
    q, k, v = (x.detach().double().requires_grad_(True) for x in (q, k, v))
    scores = (q @ k.transpose(-2, -1)) * scale
    max_logit = float(scores.detach().abs().max())  # over every pair, before the mask's -inf
    if mask is not None:
        scores = scores.masked_fill(~mask, -math.inf)
    out = torch.softmax(scores, dim=-1) @ v
    return (out.detach(), *torch.autograd.grad(out, (q, k, v), d_out.double())), max_logit


@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize(("size_q", "size_k", "logit", "size_d_out"), [
    (2e19, 2e19, 1e4, 1.0), (2e19, 2e19, 1e5, 1.0),  # scale < 1: q . k ~ 4e38 overflows float32
    # scale > 1: q * scale ~ 1e39 would overflow float32 (a small d_out keeps the true dk ~ scale |q| |d_out|
    # within float32)
    (1e35, 1e-35, 1e4, 1e-3),
])
def test_float32_dense_attention_at_large_finite_logits_matches_float64(size_q, size_k, logit, size_d_out, masked):
    # Regression: the dense path formed q @ k^T and then multiplied by the scale, so q, k ~ 2e19 in float32
    # with scale ~ 2.5e-35 gave q . k = inf (float32 ends at 3.4e38) where the logits are only ~1e4-1e5
    # (finite, and fine in the tiled path and the float64 reference): inf - inf = NaN in the softmax, NaN
    # outputs and gradients. Now a scale <= 1 multiplies q first and a scale > 1 the product.
    # Tolerance: 4 float32 roundings of the largest logit (4 * eps32 * max |logit|), each error taken
    # relative to the size of its quantity (max |v| for out; for dq, dk the terms they sum, as in
    # test_efficient_tiled; max |d_out| for dv); measured at most 0.52 eps32 * max |logit|.
    gen = torch.Generator().manual_seed(int(math.log10(logit)) + 7 * masked)
    B, H, T, S, Dh = 1, 2, 16, 24, 16
    scale = logit / (size_q * size_k)
    q = size_q * 0.01 * torch.randn(B, H, T, Dh, generator=gen)  # small features: logit terms ~1
    k = size_k * 0.01 * torch.randn(B, H, S, Dh, generator=gen)
    q[..., 0] = size_q * (1 + 1e-4 * torch.randn(B, H, T, generator=gen))  # a shared feature: every logit
    k[..., 0] = size_k * (1 + 1e-4 * torch.randn(B, H, S, generator=gen))  # near `logit`, a row spread of ~1
    v, d_out = torch.randn(B, H, S, Dh, generator=gen), size_d_out * torch.randn(B, H, T, Dh, generator=gen)
    mask = causal_mask(T, S, alignment="bottom_right") if masked else None
    truth, max_logit = _float64_attention_and_grads(q, k, v, d_out, mask, scale)
    assert 0.9 * logit < max_logit < 1.1 * logit
    if scale < 1:
        assert not torch.isfinite(q @ k.transpose(-2, -1)).all()  # the product alone overflows float32
    else:
        assert not torch.isfinite(q * scale).all()  # scaling q first would overflow
    qi, ki, vi = (x.clone().requires_grad_(True) for x in (q, k, v))
    out = sdpa(qi, ki, vi, mask, scale=scale)
    got = (out, *torch.autograd.grad(out, (qi, ki, vi), d_out))
    dp = float((d_out.double() @ v.double().transpose(-2, -1)).abs().max())
    sizes = (float(v.abs().max()), scale * dp * float(k.double().abs().max()),
             scale * dp * float(q.double().abs().max()), float(d_out.abs().max()))
    bound = 4 * torch.finfo(torch.float32).eps * max_logit
    for name, x, t, size in zip(("out", "dq", "dk", "dv"), got, truth, sizes, strict=True):
        assert torch.isfinite(x).all(), f"{name} holds a NaN or inf"
        error = float((x.detach().double() - t).abs().max()) / size
        assert error <= bound, f"{name}: error {error:.2e} (relative) > {bound:.2e}"


def test_scores_larger_than_the_machines_memory_are_refused_up_front_naming_shapes_and_bytes():
    # Regression: T = S = 2**22 needs a (1, 1, 2**22, 2**22) float32 scores tensor, 64 TiB; the user got
    # the allocator's RuntimeError ("DefaultCPUAllocator: not enough memory") from inside the matmul.
    # Now a MemoryError before anything is allocated, naming the shapes and the bytes. The inputs are
    # expanded views of one number: 16 bytes of storage.
    n = 2**22
    q = torch.zeros(()).expand(1, 1, n, 1)
    need = n * n * 4  # bytes of the float32 scores, worked out by hand
    with pytest.raises(MemoryError, match=re.escape(f"q (1, 1, {n}, 1) and k (1, 1, {n}, 1)") + ".*"
                       + re.escape(f"shape (1, 1, {n}, {n})") + f".*{need} bytes.*64.0 TiB"):
        sdpa(q, q, q)
    x = torch.zeros(()).expand(1, n, 2)
    mha = selfattn.MultiHeadAttention(selfattn.MHAConfig(2, 1))
    with pytest.raises(MemoryError, match=re.escape(f"x_q (1, {n}, 2) and x_kv (1, {n}, 2) with n_heads=1")
                       + f".*{need} bytes"):
        mha(x)
    qk_norm = QKNormAttention(selfattn.MHAConfig(2, 1))  # its own forward, the same check
    with pytest.raises(MemoryError, match=re.escape(f"x_q (1, {n}, 2) and x_kv (1, {n}, 2) with n_heads=1")):
        qk_norm(x)
    # half inputs: the scores are float32 all the same
    with pytest.raises(MemoryError, match=f"float32, would need {need} bytes"):
        sdpa(q.half(), q.half(), q.half())
    # a legitimate large run is not refused: T = S = 2048 (16 MiB of scores) runs
    q = torch.randn(1, 1, 2048, 4, generator=torch.Generator().manual_seed(0))
    out = sdpa(q, q, q)
    assert out.shape == (1, 1, 2048, 4) and torch.isfinite(out).all()
