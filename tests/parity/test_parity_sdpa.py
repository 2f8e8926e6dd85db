"""Three oracles agree: ``selfattn.ref`` (NumPy float64), ``selfattn.scaled_dot_product_attention``
and ``torch.nn.functional.scaled_dot_product_attention``.

Tolerances:
- float64: 1e-12 absolute (the three compute the same sums in a different order);
- float32: 1e-5 absolute against the float64 reference computed from the same float32 inputs;
- float16 / bfloat16: computed in float32 inside, output rounded to the input dtype; compared with
  the float64 reference on the same (rounded) inputs to a few units in the last place of the
  output dtype: 4e-3 (float16, eps 9.8e-4) and 3e-2 (bfloat16, eps 7.8e-3), relative to max |v|.

Masks without an empty row are used against torch, whose handling of fully masked rows differs
between versions; fully masked rows are compared with the reference only.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from selfattn import causal_mask, padding_mask, ref
from selfattn import scaled_dot_product_attention as sdpa

TOL = {torch.float64: 1e-12, torch.float32: 1e-5}
B, H, T, S, Dh, Dv = 2, 3, 5, 7, 8, 6


def _qkv(gen, T=T, S=S, dtype=torch.float64):
    q = torch.randn(B, H, T, Dh, generator=gen, dtype=torch.float64)
    k = torch.randn(B, H, S, Dh, generator=gen, dtype=torch.float64)
    v = torch.randn(B, H, S, Dv, generator=gen, dtype=torch.float64)
    return q.to(dtype), k.to(dtype), v.to(dtype)


def _ref(q, k, v, mask=None, bias=None, scale=None):
    """The float64 NumPy reference on exactly the values the torch code sees."""
    as64 = lambda x: None if x is None else x.detach().to(torch.float64).numpy()  # noqa: E731
    m = None if mask is None else mask.numpy()
    return ref.scaled_dot_product_attention(
        as64(q), as64(k), as64(v), m, bias=as64(bias), scale=scale
    )


def _random_mask(gen, T=T, S=S):
    """Random boolean keep-mask (B, 1, T, S) with at least one visible key in every row."""
    keep = torch.rand(B, 1, T, S, generator=gen) > 0.5
    first = torch.randint(0, S, (B, 1, T), generator=gen)
    keep.scatter_(-1, first[..., None], True)
    return keep


def _assert_three_agree(q, k, v, *, mask=None, bias=None, scale=None, is_causal=False):
    """ref, ours and torch agree to TOL[dtype]; ``is_causal`` is passed to torch as such and to the
    other two as the top-left causal mask (torch's alignment)."""
    tol = TOL[q.dtype]
    keep = causal_mask(q.shape[-2], k.shape[-2], alignment="top_left") if is_causal else mask
    expected = torch.from_numpy(_ref(q, k, v, keep, bias, scale))
    ours = sdpa(q, k, v, keep, bias=bias, scale=scale)
    if bias is None:
        attn_mask = mask
    elif mask is None:
        attn_mask = bias
    else:  # torch takes one float attn_mask: the bias with -inf where the mask blocks
        attn_mask = bias.masked_fill(~mask, float("-inf"))
    theirs = F.scaled_dot_product_attention(
        q, k, v, attn_mask=attn_mask, scale=scale, is_causal=is_causal
    )
    assert ours.dtype == q.dtype
    torch.testing.assert_close(ours.double(), expected, rtol=0, atol=tol)
    torch.testing.assert_close(theirs.double(), expected, rtol=0, atol=tol)
    torch.testing.assert_close(ours, theirs, rtol=0, atol=tol)


DTYPES = [torch.float64, torch.float32]


@pytest.mark.parametrize("dtype", DTYPES)
def test_no_mask(gen, dtype):
    _assert_three_agree(*_qkv(gen, dtype=dtype))


@pytest.mark.parametrize("dtype", DTYPES)
def test_causal_mask_square(gen, dtype):
    q, k, v = _qkv(gen, T=6, S=6, dtype=dtype)
    _assert_three_agree(q, k, v, mask=causal_mask(6))


@pytest.mark.parametrize("dtype", DTYPES)
def test_is_causal_equals_causal_mask(gen, dtype):
    q, k, v = _qkv(gen, T=6, S=6, dtype=dtype)
    _assert_three_agree(q, k, v, is_causal=True)
    theirs = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    torch.testing.assert_close(sdpa(q, k, v, causal_mask(6)), theirs, rtol=0, atol=TOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
def test_random_boolean_mask(gen, dtype):
    q, k, v = _qkv(gen, dtype=dtype)
    _assert_three_agree(q, k, v, mask=_random_mask(gen))


@pytest.mark.parametrize("dtype", DTYPES)
def test_padding_mask(gen, dtype):
    q, k, v = _qkv(gen, dtype=dtype)
    _assert_three_agree(q, k, v, mask=padding_mask([3, 7], S))


@pytest.mark.parametrize("dtype", DTYPES)
def test_additive_bias(gen, dtype):
    q, k, v = _qkv(gen, dtype=dtype)
    bias = torch.randn(H, T, S, generator=gen, dtype=torch.float64).to(dtype)
    _assert_three_agree(q, k, v, bias=bias)


@pytest.mark.parametrize("dtype", DTYPES)
def test_bias_and_mask(gen, dtype):
    q, k, v = _qkv(gen, dtype=dtype)
    bias = torch.randn(T, S, generator=gen, dtype=torch.float64).to(dtype)
    _assert_three_agree(q, k, v, mask=_random_mask(gen), bias=bias)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("scale", [0.05, 1.0, 3.0])
def test_scale_given(gen, dtype, scale):
    q, k, v = _qkv(gen, dtype=dtype)
    _assert_three_agree(q, k, v, mask=padding_mask([4, 6], S), scale=scale)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("T_", "S_"), [(3, 7), (7, 3)])
def test_top_left_alignment(gen, dtype, T_, S_):
    q, k, v = _qkv(gen, T=T_, S=S_, dtype=dtype)
    keep = causal_mask(T_, S_, alignment="top_left")
    assert torch.equal(keep, torch.tril(torch.ones(T_, S_, dtype=torch.bool)))
    _assert_three_agree(q, k, v, mask=keep)
    # torch's is_causal uses the top-left alignment when T != S.
    theirs = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    torch.testing.assert_close(sdpa(q, k, v, keep), theirs, rtol=0, atol=TOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
def test_bottom_right_alignment(gen, dtype):
    T_, S_ = 3, 7  # T < S: no query is left without a key
    q, k, v = _qkv(gen, T=T_, S=S_, dtype=dtype)
    keep = causal_mask(T_, S_, alignment="bottom_right")
    assert torch.equal(keep, torch.tril(torch.ones(T_, S_, dtype=torch.bool), diagonal=S_ - T_))
    _assert_three_agree(q, k, v, mask=keep)


def test_bottom_right_with_more_queries_than_keys_against_reference(gen):
    """T > S: the first T - S queries see nothing and get zero rows (torch is not asked)."""
    q, k, v = _qkv(gen, T=7, S=3)
    keep = causal_mask(7, 3, alignment="bottom_right")
    assert torch.equal(keep, torch.tril(torch.ones(7, 3, dtype=torch.bool), diagonal=-4))
    ours = sdpa(q, k, v, keep)
    torch.testing.assert_close(
        ours, torch.from_numpy(_ref(q, k, v, keep)), rtol=0, atol=TOL[torch.float64]
    )
    assert torch.equal(ours[..., :4, :], torch.zeros_like(ours[..., :4, :]))


def test_fully_masked_rows_against_reference(gen):
    q, k, v = _qkv(gen)
    keep = _random_mask(gen)
    keep[:, :, 1] = False
    ours = sdpa(q, k, v, keep)
    torch.testing.assert_close(
        ours, torch.from_numpy(_ref(q, k, v, keep)), rtol=0, atol=TOL[torch.float64]
    )


def test_gradients_match_torch(gen):
    """Forward and backward agree with torch's own attention (float64, 1e-12)."""
    q, k, v = _qkv(gen)
    keep, bias = _random_mask(gen), torch.randn(T, S, generator=gen, dtype=torch.float64)
    upstream = torch.randn(B, H, T, Dv, generator=gen, dtype=torch.float64)
    grads = []
    for fn in (
        lambda q, k, v: sdpa(q, k, v, keep, bias=bias),
        lambda q, k, v: F.scaled_dot_product_attention(
            q, k, v, attn_mask=bias.masked_fill(~keep, float("-inf"))
        ),
    ):
        inputs = [x.clone().requires_grad_(True) for x in (q, k, v)]
        (fn(*inputs) * upstream).sum().backward()
        grads.append([x.grad for x in inputs])
    for ours, theirs in zip(*grads, strict=True):
        torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-12)


# --- half precision ---------------------------------------------------------------------------

HALF_TOL = {torch.float16: 4e-3, torch.bfloat16: 3e-2}


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("mask_kind", ["none", "causal", "padding"])
def test_half_precision_large_scores(gen, dtype, mask_kind):
    q, k, v = _qkv(gen, T=6, S=6)
    q = (q * 300).to(dtype)  # scores in the hundreds: exp overflows float16 without care
    k, v = k.to(dtype), v.to(dtype)
    mask = {"none": None, "causal": causal_mask(6), "padding": padding_mask([2, 6], 6)}[mask_kind]
    context, weights = sdpa(q, k, v, mask, return_weights=True)
    assert context.dtype == dtype
    assert torch.isfinite(context).all() and torch.isfinite(weights).all()
    expected = _ref(q, k, v, mask)  # float64 on the same rounded inputs
    tol = HALF_TOL[dtype] * float(v.abs().max())
    np.testing.assert_allclose(context.double().numpy(), expected, rtol=0, atol=tol)
    # The scores really are large: the softmax is nearly one-hot somewhere.
    assert weights.max() > 0.99


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_fully_masked_row_is_zero(gen, dtype):
    q, k, v = (x.to(dtype) for x in _qkv(gen, T=4, S=4))
    keep = torch.ones(4, 4, dtype=torch.bool)
    keep[0] = False
    context = sdpa(q, k, v, keep)
    assert context.dtype == dtype and torch.isfinite(context).all()
    assert torch.equal(context[..., 0, :], torch.zeros_like(context[..., 0, :]))
