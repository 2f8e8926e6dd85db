"""selfattn.efficient.tiled_attention against the reference: output and log-sum-exp, forward and
backward (the CS336 FlashAttention tests), with the edge cases that break naive implementations."""

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import selfattn
from selfattn import ref
from selfattn.efficient import tiled_attention
from selfattn.efficient.memory import peak_tensor_bytes
from selfattn.efficient.tiled import Visibility, tiled_forward_torch
from selfattn.ref.online import logsumexp


def _qkv(B, H, T, S, Dh, Dv=None, *, seed=0, dtype=torch.float64, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    q = (torch.randn(B, H, T, Dh, generator=g, dtype=torch.float64) * scale).to(dtype)
    k = (torch.randn(B, H, S, Dh, generator=g, dtype=torch.float64) * scale).to(dtype)
    v = torch.randn(B, H, S, Dv or Dh, generator=g, dtype=torch.float64).to(dtype)
    return q, k, v


def _reference_lse(q, k, keep, scale=None):
    """log-sum-exp of the visible scaled scores, from the NumPy reference."""
    qn, kn = q.detach().double().numpy(), k.detach().double().numpy()
    scale = 1 / math.sqrt(qn.shape[-1]) if scale is None else scale
    scores = qn @ np.swapaxes(kn, -1, -2) * scale
    if keep is not None:
        scores = np.where(np.broadcast_to(keep.numpy(), scores.shape), scores, -np.inf)
    return logsumexp(scores)


def _check_against_reference(q, k, v, keep, *, atol=1e-10, rtol=1e-9, **kwargs):
    """Output, lse and the gradients of q, k, v equal those of selfattn.scaled_dot_product_attention."""
    q, k, v = (x.detach().clone().requires_grad_(True) for x in (q, k, v))
    out, lse = tiled_attention(q, k, v, return_lse=True, **kwargs)
    expected = selfattn.scaled_dot_product_attention(q, k, v, keep, scale=kwargs.get("scale"))
    torch.testing.assert_close(out, expected, atol=atol, rtol=rtol)
    np.testing.assert_allclose(lse.numpy(), _reference_lse(q, k, keep, kwargs.get("scale")), atol=atol, rtol=rtol)
    d_out = torch.randn(out.shape, generator=torch.Generator().manual_seed(7), dtype=out.dtype)
    got = torch.autograd.grad(out, (q, k, v), d_out)
    want = torch.autograd.grad(expected, (q, k, v), d_out)
    for name, g, w in zip("qkv", got, want, strict=True):
        assert torch.isfinite(g).all(), f"d{name} has NaN or inf"
        torch.testing.assert_close(g, w, atol=atol, rtol=rtol, msg=f"gradient of {name}")
    return out, lse


@pytest.mark.parametrize("T,S,block_q,block_k", [(37, 37, 8, 8), (37, 37, 5, 7), (16, 16, 16, 16),
                                                 (13, 29, 4, 6), (29, 13, 6, 4), (1, 9, 3, 2)])
def test_matches_reference_without_mask(T, S, block_q, block_k):
    q, k, v = _qkv(2, 3, T, S, 8, 5, seed=T + S)
    _check_against_reference(q, k, v, None, block_q=block_q, block_k=block_k)


@pytest.mark.parametrize("T,S", [(37, 37), (13, 29), (29, 13), (1, 20), (20, 1)])
@pytest.mark.parametrize("alignment", ["top_left", "bottom_right"])
def test_causal_matches_reference_both_alignments(T, S, alignment):
    q, k, v = _qkv(1, 2, T, S, 8, seed=T * S)
    keep = selfattn.causal_mask(T, S, alignment=alignment)
    _check_against_reference(q, k, v, keep, causal=True, alignment=alignment, block_q=4, block_k=6)


def test_rows_with_no_visible_key_are_zero_with_lse_minus_inf_and_zero_grads():
    # T > S bottom-right: the first T - S queries precede every key and see nothing
    q, k, v = _qkv(1, 2, 10, 4, 8, seed=1)
    out, lse = _check_against_reference(q, k, v, selfattn.causal_mask(10, 4, alignment="bottom_right"),
                                         causal=True, alignment="bottom_right", block_q=3, block_k=3)
    torch.testing.assert_close(out[..., :6, :], torch.zeros(1, 2, 6, 8, dtype=torch.float64), atol=0, rtol=0)
    assert torch.isneginf(lse[..., :6]).all() and torch.isfinite(lse[..., 6:]).all()


def test_general_mask_with_padding_and_fully_masked_rows():
    q, k, v = _qkv(2, 3, 11, 14, 4, seed=5)
    keep = selfattn.padding_mask([14, 6], 14) & torch.rand(2, 3, 11, 14, generator=torch.Generator().manual_seed(0)).gt(0.4)
    keep[0, 1, 3] = False  # one query that sees nothing
    _check_against_reference(q, k, v, keep, mask=keep, block_q=4, block_k=5)


def test_mask_combined_with_causal():
    q, k, v = _qkv(1, 2, 12, 12, 4, seed=6)
    pad = selfattn.padding_mask([9], 12)
    _check_against_reference(q, k, v, pad & selfattn.causal_mask(12), mask=pad, causal=True, block_q=5, block_k=4)


def test_fully_masked_tile_processed_first():
    """The first key tile is visible to some queries of a query tile and hidden from others: those
    rows leave it with running max -inf and must not produce NaN when later tiles arrive."""
    q, k, v = _qkv(1, 1, 8, 12, 4, seed=2)
    keep = torch.ones(8, 12, dtype=torch.bool)
    keep[::2, :4] = False  # even queries see nothing of key tile 0 (keys 0..3)
    _check_against_reference(q, k, v, keep, mask=keep, block_q=8, block_k=4)


@pytest.mark.parametrize("causal", [False, True])
def test_reverse_key_tile_order_gives_the_same_result(causal):
    q, k, v = _qkv(1, 2, 23, 23, 8, seed=3, scale=3.0)
    vis = Visibility(causal_offset=0 if causal else None)
    forward_order = tiled_forward_torch(q, k, v, vis, 0.3, 4, 5)
    reverse_order = tiled_forward_torch(q, k, v, vis, 0.3, 4, 5, reverse_key_tiles=True)
    keep = selfattn.causal_mask(23) if causal else None
    expected = selfattn.scaled_dot_product_attention(q, k, v, keep, scale=0.3)
    for out, lse in (forward_order, reverse_order):
        torch.testing.assert_close(out, expected, atol=1e-12, rtol=1e-11)
        np.testing.assert_allclose(lse.numpy(), _reference_lse(q, k, keep, 0.3), rtol=1e-12)


def _huge_gap_inputs(dtype):
    """Scores (scale 1) whose visible maximum sits ~1e4 above the rest, in a late key tile."""
    q = torch.zeros(1, 1, 4, 2, dtype=torch.float64)
    q[..., 0] = 1.0
    k = torch.zeros(1, 1, 9, 2, dtype=torch.float64)
    k[..., 0] = torch.tensor([0.0, 1.0, -3.0, 2.0, 0.5, 0.0, 0.0, 1e4, 1e4 - 2.0])
    v = torch.arange(18, dtype=torch.float64).reshape(1, 1, 9, 2)
    return q.to(dtype), k.to(dtype), v.to(dtype)


def test_huge_gaps_between_logits():
    q, k, v = _huge_gap_inputs(torch.float64)
    out, lse = _check_against_reference(q, k, v, None, scale=1.0, block_q=2, block_k=2)
    # by hand: only keys 7 and 8 matter, with weights 1/(1+e^-2) and e^-2/(1+e^-2)
    w7 = 1 / (1 + math.exp(-2.0))
    torch.testing.assert_close(out[0, 0, 0], w7 * v[0, 0, 7] + (1 - w7) * v[0, 0, 8], atol=1e-12, rtol=0)
    torch.testing.assert_close(lse[0, 0, 0], torch.tensor(1e4 + math.log1p(math.exp(-2.0)), dtype=torch.float64))


def test_huge_gaps_float32_finite():
    q, k, v = _huge_gap_inputs(torch.float32)
    out, lse = tiled_attention(q, k, v, scale=1.0, block_q=2, block_k=2, return_lse=True)
    expected = ref.scaled_dot_product_attention(q.double().numpy(), k.double().numpy(), v.double().numpy(), scale=1.0)
    np.testing.assert_allclose(out.numpy(), expected, rtol=1e-5, atol=1e-4)
    assert torch.isfinite(lse).all()


def test_very_negative_logits():
    """Every score about -1e4: exp underflows to 0 without the running max; must still be exact."""
    q, k, v = _qkv(1, 2, 9, 11, 4, seed=4)
    q = q - 100.0
    k = k + 100.0  # q . k ~ -4e4 for every pair, differences O(100)
    # scores near -2e4 carry a float64 rounding of ~|s| * 1e-16 = 2e-12 in the exponent, which the
    # gradient of q (a sum of terms ~100 that cancel) amplifies: compare at 1e-8, still rounding level
    out, lse = _check_against_reference(q, k, v, None, atol=1e-8, rtol=1e-7, block_q=4, block_k=3)
    assert (lse < -1e3).all()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_low_precision_accumulates_in_float32(dtype):
    q, k, v = _qkv(2, 2, 33, 33, 16, seed=8, dtype=dtype)
    out, lse = tiled_attention(q, k, v, causal=True, block_q=8, block_k=16, return_lse=True)
    assert out.dtype == dtype and lse.dtype == torch.float32
    expected = ref.scaled_dot_product_attention(q.double().numpy(), k.double().numpy(), v.double().numpy(),
                                                ref.causal_mask(33))
    tol = {torch.float16: 2e-3, torch.bfloat16: 1.6e-2, torch.float32: 1e-5}[dtype]
    np.testing.assert_allclose(out.double().numpy(), expected, atol=tol, rtol=tol)
    q.requires_grad_(True)
    (g,) = torch.autograd.grad(tiled_attention(q, k, v, causal=True, block_q=8, block_k=16).sum(), q)
    assert g.dtype == dtype and torch.isfinite(g).all()


def test_nan_at_masked_positions_does_not_leak():
    q, k, v = _qkv(1, 1, 6, 8, 4, seed=9)
    k, v = k.clone(), v.clone()
    k[..., 6:, :] = float("nan")
    v[..., 6:, :] = float("inf")
    keep = selfattn.padding_mask([6], 8)
    out = tiled_attention(q, k, v, keep, block_q=4, block_k=3)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, selfattn.scaled_dot_product_attention(q[..., :6, :].clone(), k[..., :6, :],
                                                                           v[..., :6, :])[..., :6, :])


@settings(max_examples=25, deadline=None)
@given(T=st.integers(1, 20), S=st.integers(1, 20), block_q=st.integers(1, 8), block_k=st.integers(1, 8),
       causal=st.booleans(), alignment=st.sampled_from(["top_left", "bottom_right"]), seed=st.integers(0, 99))
def test_property_equals_reference(T, S, block_q, block_k, causal, alignment, seed):
    q, k, v = _qkv(1, 2, T, S, 4, 3, seed=seed, scale=2.0)
    al = alignment if causal else None
    keep = selfattn.causal_mask(T, S, alignment=alignment) if causal else None
    out, lse = tiled_attention(q, k, v, causal=causal, alignment=al, block_q=block_q, block_k=block_k,
                               return_lse=True)
    torch.testing.assert_close(out, selfattn.scaled_dot_product_attention(q, k, v, keep), atol=1e-11, rtol=1e-10)
    np.testing.assert_allclose(lse.numpy(), _reference_lse(q, k, keep), rtol=1e-11, atol=1e-11)


def test_causal_skips_fully_masked_tiles():
    """Above the diagonal no tile is computed: the number of tiles the visibility rule lets through
    is the count of tiles touching the lower triangle (by hand: 4 + 3 + 2 + 1 for 4 x 4 tiles)."""
    vis = Visibility(causal_offset=0)
    computed = [vis.tile(i, i + 4, j, j + 4, "cpu") is not False for i in range(0, 16, 4) for j in range(0, 16, 4)]
    assert sum(computed) == 10


def test_forward_memory_is_linear_in_length():
    """Peak memory of the tensors created (no_grad forward): doubling T about doubles it for the
    tiled path (ratio < 2.5), while the naive path's grows about 4x (ratio > 3.5)."""
    peaks = {}
    for T in (512, 1024):
        q, k, v = _qkv(1, 4, T, T, 32, dtype=torch.float32)
        with torch.no_grad():
            peaks[T] = (peak_tensor_bytes(tiled_attention, q, k, v, block_q=64, block_k=64)[0],
                        peak_tensor_bytes(selfattn.scaled_dot_product_attention, q, k, v)[0])
    tiled_ratio, naive_ratio = peaks[1024][0] / peaks[512][0], peaks[1024][1] / peaks[512][1]
    assert tiled_ratio < 2.5, tiled_ratio
    assert naive_ratio > 3.5, naive_ratio


def test_bad_inputs_raise_with_names():
    q, k, v = _qkv(1, 1, 4, 5, 2)
    with pytest.raises(ValueError, match="alignment"):
        tiled_attention(q, k, v, causal=True)
    with pytest.raises(ValueError, match="only applies with causal"):
        tiled_attention(q, k, v, alignment="top_left")
    with pytest.raises(ValueError, match="alignment must be"):
        tiled_attention(q, k, v, causal=True, alignment="left")
    with pytest.raises(TypeError, match="mask must be a boolean"):
        tiled_attention(q, k, v, torch.ones(4, 5))
    with pytest.raises(ValueError, match="mask must broadcast"):
        tiled_attention(q, k, v, torch.ones(4, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match="block_q must be > 0"):
        tiled_attention(q, k, v, block_q=0)
    with pytest.raises(TypeError, match="same dtype|share one dtype"):
        tiled_attention(q, k.float(), v)
    with pytest.raises(ValueError, match="d_head"):
        tiled_attention(q, k[..., :1], v)


def test_a_visible_nan_key_gives_nan_like_the_reference_not_a_zero_row():
    # Regression: `l > 0` is False for NaN, so a query that saw a NaN key got a silent zero row.
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 1, n, 8, generator=gen) for n in (4, 6, 6))
    k[..., 2, :] = float("nan")
    out = tiled_attention(q, k, v, block_q=2, block_k=4)
    assert torch.isnan(out).all()  # every query sees key 2, as in naive attention
    keep = torch.ones(4, 6, dtype=torch.bool)
    keep[:, 2] = False  # once key 2 is masked, the NaN stored there must not leak
    torch.testing.assert_close(
        tiled_attention(q, k, v, keep, block_q=2, block_k=4),
        selfattn.scaled_dot_product_attention(q, k, v, keep), rtol=1e-5, atol=1e-6,
    )


@pytest.mark.parametrize("block", [1, 2, 3, 512])
@pytest.mark.parametrize("use_mask", [False, True])
def test_a_nan_value_reaches_only_the_queries_that_may_see_it(block, use_mask):
    # Regression: 0 * NaN = NaN, so a NaN value at position 3 (visible to query 3 only under a causal
    # mask) made every row NaN; the reference gives NaN in row 3 only and the other rows unchanged.
    q, k, v = _qkv(2, 2, 5, 5, 4, seed=3)
    v = v.clone()
    v[..., 3, :] = float("nan")
    keep = selfattn.causal_mask(5)
    kwargs = {"mask": keep} if use_mask else {"causal": True}
    out = tiled_attention(q, k, v, block_q=block, block_k=block, **kwargs)
    expected = ref.scaled_dot_product_attention(q.numpy(), k.numpy(), v.numpy(), keep.numpy())
    assert np.isnan(expected[..., 3:, :]).all() and np.isfinite(expected[..., :3, :]).all()
    np.testing.assert_allclose(out.numpy(), expected, rtol=1e-10, atol=1e-12)  # NaN where expected is


def test_a_nan_key_reaches_only_the_queries_that_may_see_it():
    q, k, v = _qkv(1, 2, 5, 5, 4, seed=4)
    k = k.clone()
    k[..., 3, :] = float("nan")
    keep = selfattn.causal_mask(5)
    expected = ref.scaled_dot_product_attention(q.numpy(), k.numpy(), v.numpy(), keep.numpy())
    assert np.isnan(expected[..., 3:, :]).all() and np.isfinite(expected[..., :3, :]).all()
    for block in (1, 2, 512):
        for kwargs in ({"causal": True}, {"mask": keep}):
            out = tiled_attention(q, k, v, block_q=block, block_k=block, **kwargs)
            np.testing.assert_allclose(out.numpy(), expected, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("block", [1, 2, 512])
@pytest.mark.parametrize("use_mask", [False, True])
def test_a_nan_value_reaches_only_the_gradients_of_queries_that_may_see_it(block, use_mask):
    # Regression: in the backward pass dp = dO V^T is NaN in column 3 for every row, and
    # ds = p * (dp - delta) = 0 * NaN = NaN for the rows the mask hides it from, so dq of queries
    # 0-2 was NaN with a tile holding rows 0-4 (block 512); the reference keeps them finite.
    q, k, v = _qkv(1, 2, 5, 5, 4, seed=3)
    v = v.clone()
    v[..., 3, :] = float("nan")
    keep = selfattn.causal_mask(5)
    kwargs = {"mask": keep} if use_mask else {"causal": True}
    d_out = torch.ones(1, 2, 5, 4, dtype=torch.float64)
    d_out[..., 3:, :] = 0.0
    got_in = [x.clone().requires_grad_(True) for x in (q, k, v)]
    want_in = [x.clone().requires_grad_(True) for x in (q, k, v)]
    got = torch.autograd.grad(tiled_attention(*got_in, block_q=block, block_k=block, **kwargs), got_in, d_out)
    want = torch.autograd.grad(selfattn.scaled_dot_product_attention(*want_in, keep), want_in, d_out)
    assert torch.isfinite(want[0][..., :3, :]).all()  # the reference: queries 0-2 keep finite gradients
    for name, g, w in zip("qkv", got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-12, equal_nan=True, msg=f"gradient of {name}")


def test_second_derivatives_raise_instead_of_silently_vanishing():
    # Regression: with create_graph=True the gradient came back with requires_grad=False, so a
    # gradient penalty built on it was silently a constant (gradgradcheck: "expected to be zero").
    # A loss whose gradient needs no gradient (out.sum()) still returned a detached gradient without an
    # error (a new user's trial): q.grad then missed the penalty's part. Both now raise at the request.
    q, k, v = (x.requires_grad_(True) for x in _qkv(1, 1, 5, 7, 3))
    for loss in (lambda o: o.pow(2).sum(), lambda o: o.sum()):
        with pytest.raises(RuntimeError, match="cannot differentiate twice"):
            torch.autograd.grad(loss(tiled_attention(q, k, v)), q, create_graph=True)
    # first derivatives are unchanged, also when computed under no create_graph
    (gq,) = torch.autograd.grad(tiled_attention(q, k, v).sum(), q)
    (want,) = torch.autograd.grad(selfattn.scaled_dot_product_attention(q, k, v).sum(), q)
    torch.testing.assert_close(gq, want, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("shape_q", [(2, 3, 0, 8), (0, 3, 4, 8)])
def test_empty_queries_or_batch_give_empty_results_like_the_reference(shape_q):
    # Regression: T = 0 (or an empty batch) crashed in a reshape ("cannot reshape tensor of 0
    # elements"); the reference returns an empty (..., T, Dv) result.
    B, H = shape_q[:2]
    q = torch.randn(shape_q, dtype=torch.float64, requires_grad=True)
    k, v = torch.randn(B, H, 11, 8, dtype=torch.float64), torch.randn(B, H, 11, 5, dtype=torch.float64)
    for kwargs in ({}, {"causal": True, "alignment": "bottom_right"}):
        out, lse = tiled_attention(q, k, v, return_lse=True, **kwargs)
        assert out.shape == selfattn.scaled_dot_product_attention(q, k, v).shape == (*shape_q[:3], 5)
        assert lse.shape == shape_q[:3]
        (g,) = torch.autograd.grad(out.sum(), q)
        assert g.shape == q.shape


def test_a_mask_on_another_device_is_refused_by_name():
    # Regression: tiled_attention did not check the mask's device (scaled_dot_product_attention does).
    q = torch.randn(1, 1, 4, 8)
    mask = torch.ones(4, 4, dtype=torch.bool, device="meta")
    with pytest.raises(ValueError, match=r"mask must be on the device of q \(cpu\); got meta"):
        tiled_attention(q, q, q, mask)
    with pytest.raises(ValueError, match=r"mask must be on the device of q \(cpu\); got meta"):
        selfattn.scaled_dot_product_attention(q, q, q, mask)  # the same words as the dense path


def _float64_truth(q, k, v, d_out, causal):
    """Output, gradients and log-sum-exp of float32 inputs, computed in float64 with plain torch."""
    q, k, v = (x.detach().double().requires_grad_(True) for x in (q, k, v))
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
    if causal:
        scores = scores.masked_fill(~torch.ones(scores.shape[-2:], dtype=torch.bool).tril(), -math.inf)
    out = torch.softmax(scores, dim=-1) @ v
    return (out.detach(), *torch.autograd.grad(out, (q, k, v), d_out.double()), torch.logsumexp(scores.detach(), -1))


def _torch_sdpa_float32(q, k, v, d_out, causal):
    """torch's SDPA in float32: output, gradients and (from its CPU flash kernel) the log-sum-exp."""
    q, k, v = (x.detach().clone().requires_grad_(True) for x in (q, k, v))
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
    grads = torch.autograd.grad(out, (q, k, v), d_out)
    with torch.no_grad():
        _, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, causal)
    return (out.detach(), *grads, lse)


def _errors(got, truth, q, k, v, d_out):
    """Max error of (out, dq, dk, dv, lse), each relative to the size of the quantity: max |truth| for
    out, dv and lse; for dq and dk, the size of the terms they sum (scale |dO V^T| |K| and
    scale |dO V^T| |Q|), because at large logits the softmax saturates and the true dq, dk vanish."""
    scale = 1.0 / math.sqrt(q.shape[-1])
    dp = (d_out.double() @ v.double().transpose(-2, -1)).abs().max()
    sizes = [truth[0].abs().max(), scale * dp * k.double().abs().max(), scale * dp * q.double().abs().max(),
             truth[3].abs().max(), truth[4].abs().max()]
    errors = []
    for name, x, t, size in zip(("out", "dq", "dk", "dv", "lse"), got, truth, sizes, strict=True):
        assert torch.isfinite(x).all(), f"{name} holds a NaN or inf"
        errors.append(float((x.double() - t).abs().max() / size))
    return errors


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("magnitude", [1.0, 1e2, 1e3, 1e4, 1e5])
def test_float32_at_large_logits_is_as_accurate_as_torch_sdpa(magnitude, causal):
    # Regression: the backward converted the forward's base-2 lse to natural log and back (a rounding
    # of ~|lse| * 1e-7: 1e-2 at |s| ~ 1e5) and recomputed the scores in another order than the
    # forward, so P drifted and the gradients (dV most) reached ~1e-2 relative while SDPA stays at
    # float32 rounding. Now within 4x of SDPA's error, forward, dQ, dK, dV and lse.
    gen = torch.Generator().manual_seed(int(math.log10(magnitude)) + 10 * causal)
    a = math.sqrt(magnitude)  # scores q.k / sqrt(64) have standard deviation `magnitude`
    q, k = (torch.randn(1, 4, 200, 64, generator=gen) * a for _ in range(2))
    v, d_out = (torch.randn(1, 4, 200, 64, generator=gen) for _ in range(2))
    truth = _float64_truth(q, k, v, d_out, causal)
    want = _errors(_torch_sdpa_float32(q, k, v, d_out, causal), truth, q, k, v, d_out)
    for block in (64, 512):  # several tiles with partial ones, and one tile
        qi, ki, vi = (x.clone().requires_grad_(True) for x in (q, k, v))
        out, lse = tiled_attention(qi, ki, vi, causal=causal, block_q=block, block_k=block, return_lse=True)
        got = _errors((out.detach(), *torch.autograd.grad(out, (qi, ki, vi), d_out), lse), truth, q, k, v, d_out)
        for name, g, w in zip(("out", "dq", "dk", "dv", "lse"), got, want, strict=True):
            bound = 4 * max(w, torch.finfo(torch.float32).eps)
            assert g <= bound, f"block {block}: tiled {name} error {g:.2e} > 4 x SDPA's {w:.2e}"
    # the package's dense path too (it returns no lse)
    qi, ki, vi = (x.clone().requires_grad_(True) for x in (q, k, v))
    out = selfattn.scaled_dot_product_attention(qi, ki, vi, selfattn.causal_mask(200) if causal else None)
    got = _errors((out.detach(), *torch.autograd.grad(out, (qi, ki, vi), d_out), truth[4]), truth, q, k, v, d_out)
    for name, g, w in zip(("out", "dq", "dk", "dv"), got, want, strict=False):
        assert g <= 4 * max(w, torch.finfo(torch.float32).eps), f"dense {name} error {g:.2e} > 4 x SDPA's {w:.2e}"


@pytest.mark.parametrize("seed", [0, 1])
def test_float32_at_logits_near_6e4_spread_over_a_row_is_as_accurate_as_torch_sdpa(seed):
    # Regression: the tiles held base-2 scores, (q * scale * log2 e) . k, and subtracted the running
    # maximum from those: at |s| ~ 6e4 the base-2 scores (~8.7e4) lie past 2^16 and carry twice the
    # rounding of the natural-unit ones, plus the rounding of q * log2 e, and where a row's largest
    # weights are close, the weights and so out and dK were off by up to 44x and 93x SDPA's error
    # (seeds 1 and 0). Now s - m is formed in natural units and only then scaled into base 2, as
    # SDPA's exp(s - m): within 4x of its error, forward and backward, several tile sizes.
    gen = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(1, 2, 128, 64, generator=gen) * math.sqrt(10.0) for _ in range(2))
    c = math.sqrt(6e4 * 8)  # a shared first feature: every score near 6e4, a row spread of ~1e3
    q[..., 0] += c * (1 + 0.01 * torch.randn(1, 2, 128, generator=gen))
    k[..., 0] += c
    v, d_out = (torch.randn(1, 2, 128, 64, generator=gen) for _ in range(2))
    truth = _float64_truth(q, k, v, d_out, False)
    assert 5e4 < float(truth[4].min()) and float(truth[4].max()) < 7e4  # the lse: logits near 6e4
    want = _errors(_torch_sdpa_float32(q, k, v, d_out, False), truth, q, k, v, d_out)
    for block in (16, 48, 128):
        qi, ki, vi = (x.clone().requires_grad_(True) for x in (q, k, v))
        out, lse = tiled_attention(qi, ki, vi, block_q=block, block_k=block, return_lse=True)
        got = _errors((out.detach(), *torch.autograd.grad(out, (qi, ki, vi), d_out), lse), truth, q, k, v, d_out)
        for name, g, w in zip(("out", "dq", "dk", "dv", "lse"), got, want, strict=True):
            bound = 4 * max(w, torch.finfo(torch.float32).eps)
            assert g <= bound, f"block {block}: tiled {name} error {g:.2e} > 4 x SDPA's {w:.2e}"
