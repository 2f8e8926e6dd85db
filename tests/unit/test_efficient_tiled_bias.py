"""selfattn.efficient.tiled_attention with an additive score bias: ``bias=`` (a tensor sliced per
tile) and ``score_bias=`` (a function of the tile's positions, so that ALiBi's (T, S) matrix is never
built; Press et al. 2022, chapter 08).

The oracles: the dense ``selfattn.scaled_dot_product_attention(..., bias=...)`` in float64 for values
and gradients, plain torch float64 for the log-sum-exp, and, for float32 accuracy at large biases,
torch's own SDPA with the same additive float mask, both measured against a float64 computation.
"""

import math

import pytest
import torch

import selfattn
from selfattn.efficient import tiled, tiled_attention
from selfattn.efficient.memory import peak_tensor_bytes
from selfattn.positions import alibi_bias, alibi_slopes

TOL64 = dict(atol=1e-12, rtol=1e-12)  # float64 rounding, with room for sums over a few dozen keys


def _qkv(B, H, T, S, Dh, Dv=None, *, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, T, Dh, generator=g, dtype=torch.float64).to(dtype)
    k = torch.randn(B, H, S, Dh, generator=g, dtype=torch.float64).to(dtype)
    v = torch.randn(B, H, S, Dv or Dh, generator=g, dtype=torch.float64).to(dtype)
    return q, k, v


def _offset(T, S, alignment):
    """Position of query row 0 among the keys: S - T with bottom-right alignment (a decoder's
    last T positions), else 0."""
    return S - T if alignment == "bottom_right" else 0


def _alibi(H, T, S, alignment=None):
    """ALiBi's (H, T, S) float64 bias for queries at positions offset..offset+T-1, keys 0..S-1."""
    off = _offset(T, S, alignment)
    return alibi_bias(alibi_slopes(H), torch.arange(T) + off, torch.arange(S))


def _alibi_fn(H, T, S, alignment=None, calls=None):
    """The same bias as a score_bias callable (recording its calls in ``calls`` if given)."""
    slopes, off = alibi_slopes(H), _offset(T, S, alignment)

    def score_bias(q_idx, k_idx):
        if calls is not None:
            calls.append((q_idx.clone(), k_idx.clone()))
        return alibi_bias(slopes, q_idx + off, k_idx)  # (H, bq, bk)

    return score_bias


def _lse_reference(q, k, keep, bias):
    """log sum_j exp(scale q.k + bias) over the visible keys, in plain float64 torch."""
    scores = (q.detach().double() @ k.detach().double().transpose(-2, -1)) / math.sqrt(q.shape[-1])
    scores = scores + bias.detach().double()
    if keep is not None:
        scores = scores.masked_fill(~keep, -math.inf)
    return torch.logsumexp(scores, dim=-1)


def _grads(out, inputs, seed=7):
    d_out = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed), dtype=out.dtype)
    return torch.autograd.grad(out, inputs, d_out)


def _assert_finite_close(got, want, name, **tol):
    assert torch.isfinite(got).all(), f"{name} holds a NaN or inf"
    torch.testing.assert_close(got, want, **tol, msg=lambda m: f"{name}: {m}")


# (T, S, block_q, block_k, causal, alignment): tiles that divide T and S or not, one tile, one
# row per tile, T != S both ways with both alignments (T > S bottom-right leaves rows with no key)
CASES = [
    (37, 37, 8, 8, False, None), (37, 37, 5, 7, False, None), (37, 37, 5, 7, True, None),
    (16, 16, 16, 16, True, None), (20, 20, 512, 512, False, None), (11, 11, 1, 3, True, None),
    (13, 29, 4, 6, True, "top_left"), (13, 29, 4, 6, True, "bottom_right"),
    (29, 13, 6, 4, True, "top_left"), (29, 13, 6, 4, True, "bottom_right"),
    (13, 29, 4, 6, False, None), (29, 13, 6, 4, False, None),
]


@pytest.mark.parametrize("padding", [False, True])
@pytest.mark.parametrize("T,S,block_q,block_k,causal,alignment", CASES)
def test_alibi_bias_and_score_bias_match_dense_attention_float64(T, S, block_q, block_k, causal, alignment, padding):
    H = 3  # not a power of two: the slopes' second recipe
    q, k, v = (x.requires_grad_(True) for x in _qkv(2, H, T, S, 8, 5, seed=T * S + causal))
    bias = _alibi(H, T, S, alignment).requires_grad_(True)
    keep = selfattn.causal_mask(T, S, alignment=alignment) if causal else torch.ones(T, S, dtype=torch.bool)
    mask = selfattn.padding_mask([S, S - 5], S) if padding else None  # (B, 1, 1, S): batch 1 ignores 5 keys
    keep = keep & mask if padding else keep
    want = selfattn.scaled_dot_product_attention(q, k, v, keep, bias=bias)
    want_grads = _grads(want, (q, k, v, bias))
    want_lse = _lse_reference(q, k, keep, bias)
    kwargs = dict(causal=causal, alignment=alignment, block_q=block_q, block_k=block_k, return_lse=True)
    for how, extra in (("bias", dict(bias=bias)), ("score_bias", dict(score_bias=_alibi_fn(H, T, S, alignment)))):
        out, lse = tiled_attention(q, k, v, mask, **kwargs, **extra)
        _assert_finite_close(out, want, f"{how}: out", **TOL64)
        finite = torch.isfinite(want_lse)
        assert torch.equal(torch.isfinite(lse), finite) and torch.isneginf(lse[~finite]).all()
        _assert_finite_close(lse[finite], want_lse[finite], f"{how}: lse", **TOL64)
        inputs = (q, k, v, bias) if how == "bias" else (q, k, v)
        for name, g, w in zip(("dq", "dk", "dv", "dbias"), _grads(out, inputs), want_grads, strict=False):
            _assert_finite_close(g, w, f"{how}: {name}", **TOL64)
    if causal and alignment == "bottom_right" and T > S:  # rows 0..T-S-1 precede every key
        assert torch.equal(out[..., : T - S, :], torch.zeros_like(out[..., : T - S, :]))
        dq, _, _, d_bias = _grads(tiled_attention(q, k, v, mask, **kwargs, bias=bias)[0], (q, k, v, bias))
        assert torch.equal(dq[..., : T - S, :], torch.zeros_like(dq[..., : T - S, :]))
        assert torch.equal(d_bias[..., : T - S, :], torch.zeros_like(d_bias[..., : T - S, :]))


@pytest.mark.parametrize("bias_dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("shape", [(2, 3, 11, 14), (3, 11, 14), (1, 3, 1, 14), (2, 1, 11, 1), (14,), ()])
def test_bias_gradient_is_the_score_gradient_summed_over_broadcast_axes(shape, bias_dtype):
    # a float32 bias with float64 inputs: its gradient is summed in float64 and rounded once, as the
    # dense path's (autograd through bias.to(float64)), so the two agree to float32 rounding
    q, k, v = (x.requires_grad_(True) for x in _qkv(2, 3, 11, 14, 4, seed=3))
    g = torch.Generator().manual_seed(5)
    bias = (torch.randn(shape, generator=g, dtype=torch.float64) * 3).to(bias_dtype).requires_grad_(True)
    keep = selfattn.causal_mask(11, 14, alignment="bottom_right")
    want = selfattn.scaled_dot_product_attention(q, k, v, keep, bias=bias)
    want_grads = _grads(want, (q, k, v, bias))
    out = tiled_attention(q, k, v, causal=True, alignment="bottom_right", bias=bias, block_q=4, block_k=5)
    for name, got, w in zip(("dq", "dk", "dv", "dbias"), _grads(out, (q, k, v, bias)), want_grads, strict=True):
        assert got.shape == w.shape and got.dtype == w.dtype
        tol = dict(atol=1e-6, rtol=1e-6) if w.dtype == torch.float32 else TOL64
        _assert_finite_close(got, w, name, **tol)


def test_bias_in_float32_and_float64_with_float32_inputs_and_half_inputs():
    """Any floating bias dtype; half-precision inputs use float32 scores, as the dense path."""
    q, k, v = _qkv(1, 4, 33, 33, 16, seed=8)
    bias = _alibi(4, 33, 33)
    for dtype, tol in ((torch.float32, 2e-6), (torch.float16, 2e-3), (torch.bfloat16, 1.6e-2)):
        qd, kd, vd = (x.to(dtype).requires_grad_(True) for x in (q, k, v))
        for b in (bias, bias.float(), bias.to(dtype)):
            # float64 attention on the same (rounded) inputs: what remains is the arithmetic's error
            expected = selfattn.scaled_dot_product_attention(qd.double(), kd.double(), vd.double(),
                                                             selfattn.causal_mask(33), bias=b.double())
            out = tiled_attention(qd, kd, vd, causal=True, bias=b, block_q=8, block_k=16)
            assert out.dtype == dtype
            _assert_finite_close(out.double(), expected.detach(), f"{dtype}, bias {b.dtype}", atol=tol, rtol=tol)
        grads = torch.autograd.grad(tiled_attention(qd, kd, vd, causal=True, score_bias=_alibi_fn(4, 33, 33),
                                                    block_q=8, block_k=16).sum(), (qd, kd, vd))
        assert all(g.dtype == dtype and torch.isfinite(g).all() for g in grads)


def test_bias_and_score_bias_give_the_same_result_bit_for_bit():
    # float32 inputs, the float64 ALiBi bias: sliced from the tensor or computed per tile, the tiles
    # add the same numbers in the same way
    q, k, v = (x.requires_grad_(True) for x in _qkv(2, 4, 70, 70, 16, seed=11, dtype=torch.float32))
    results = []
    for extra in (dict(bias=_alibi(4, 70, 70)), dict(score_bias=_alibi_fn(4, 70, 70))):
        out = tiled_attention(q, k, v, causal=True, block_q=16, block_k=24, **extra)
        results.append((out, *_grads(out, (q, k, v))))
    for name, a, b in zip(("out", "dq", "dk", "dv"), *results, strict=True):
        assert torch.isfinite(a).all(), name
        torch.testing.assert_close(a, b, atol=0, rtol=0, msg=name)


def test_causal_tiles_above_the_diagonal_are_skipped_with_a_score_bias():
    """With 4 x 4 tiles of 16 x 16 causal attention, only the 10 tiles touching the lower triangle
    are computed (4 + 3 + 2 + 1, by hand), in the forward and again in the backward; each call gets
    the int64 rows and (the structure's key span of) the columns of one of them."""
    calls = []
    q, k, v = (x.requires_grad_(True) for x in _qkv(1, 2, 16, 16, 4, seed=2))
    out = tiled_attention(q, k, v, causal=True, score_bias=_alibi_fn(2, 16, 16, calls=calls), block_q=4, block_k=4)
    forward_calls = list(calls)
    out.sum().backward()
    backward_calls = calls[len(forward_calls):]
    for phase in (forward_calls, backward_calls):
        tiles = sorted((int(qi[0]), int(qi[-1]), int(kj[0]), int(kj[-1])) for qi, kj in phase)
        assert tiles == sorted((i, i + 3, j, j + 3) for i in range(0, 16, 4) for j in range(0, i + 1, 4))
        assert all(qi.dtype == kj.dtype == torch.int64 for qi, kj in phase)
        assert all(torch.equal(qi, torch.arange(qi[0], qi[-1] + 1)) for qi, _ in phase)


def test_a_biased_call_on_cuda_takes_the_torch_tiles_not_the_triton_kernel(monkeypatch):
    """The Triton kernel has no bias: a biased call must not be handed to pick_forward's choice."""
    def fake_triton(*args, **kwargs):
        raise AssertionError("the Triton kernel was given a biased call")

    monkeypatch.setattr(tiled, "pick_forward", lambda q, vis: fake_triton)  # what a CUDA device would pick
    q, k, v = _qkv(1, 2, 12, 12, 4, seed=1)
    with pytest.raises(AssertionError, match="Triton kernel was given"):  # the patch works: no bias -> kernel
        tiled_attention(q, k, v, causal=True)
    want = selfattn.scaled_dot_product_attention(q, k, v, selfattn.causal_mask(12), bias=_alibi(2, 12, 12))
    for extra in (dict(bias=_alibi(2, 12, 12)), dict(score_bias=_alibi_fn(2, 12, 12))):
        _assert_finite_close(tiled_attention(q, k, v, causal=True, block_q=5, block_k=5, **extra), want,
                             "torch tiles", **TOL64)


# ------------------------------------------------------------------------------------------------
# Contracts: hidden rows, hidden non-finite values, pairs hidden only by the bias
# ------------------------------------------------------------------------------------------------


def _oracle(q, k, v, keep, bias, d_out):
    """Float64 attention in plain torch on clean inputs; rows with no visible key are zero."""
    q, k, v = (x.clone().requires_grad_(True) for x in (q, k, v))
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1]) + bias
    seen = keep.any(dim=-1, keepdim=True)
    scores = scores.masked_fill(~keep, -math.inf).masked_fill(~seen, 0.0)
    out = (torch.softmax(scores, dim=-1) * seen) @ v
    return (out.detach(), *torch.autograd.grad(out, (q, k, v), d_out))


@pytest.mark.parametrize("blocks", [(1, 1), (2, 3), (4, 4), (16, 16)])
@pytest.mark.parametrize("where,pos", [("k", 4), ("v", 4), ("q", 7), ("k", 7), ("v", 8), ("bias", None)])
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_nonfinite_at_hidden_positions_reaches_no_output_or_gradient(where, pos, bad, blocks):
    """Causal attention with ALiBi and padding (positions 7, 8: no query row sees anything, no key
    is seen); a bad value at a hidden position of q, k, v, or in the bias at every hidden pair."""
    T = 9
    keep = selfattn.causal_mask(T) & (torch.arange(T) < 7)[:, None] & (torch.arange(T) < 7)[None, :]
    q, k, v = _qkv(2, 2, T, T, 5, 4, seed=4)
    d_out = torch.randn(2, 2, T, 4, generator=torch.Generator().manual_seed(9), dtype=torch.float64)
    bias = _alibi(2, T, T)
    want = _oracle(q, k, v, keep, bias, d_out)
    bad_in = {"q": q.clone(), "k": k.clone(), "v": v.clone(), "bias": bias.clone()}
    if where == "bias":
        bad_in["bias"] = bad_in["bias"].masked_fill(~keep, bad)  # hidden pairs only
        rows = keys = torch.zeros(T, dtype=torch.bool)
    else:
        bad_in[where][..., pos, :] = bad
        # the rows that may see it (none for positions 7 and 8), and the keys those rows see
        rows = (torch.arange(T) == pos) & keep[pos].any() if where == "q" else keep[:, pos].clone()
        keys = keep[rows].any(dim=0)
    for how in ("bias", "score_bias"):
        xq, xk, xv = (bad_in[n].clone().requires_grad_(True) for n in "qkv")
        b = bad_in["bias"]
        extra = dict(bias=b) if how == "bias" else dict(score_bias=lambda qi, kj, b=b: b[:, qi][:, :, kj])
        out = tiled_attention(xq, xk, xv, keep, causal=True, block_q=blocks[0], block_k=blocks[1], **extra)
        got = (out, *torch.autograd.grad(out, (xq, xk, xv), d_out))
        for name, g, w, clean in zip(("out", "dq", "dk", "dv"), got, want, (~rows, ~rows, ~keys, ~keys), strict=True):
            torch.testing.assert_close(g[..., clean, :], w[..., clean, :], **TOL64, equal_nan=False,
                                       msg=lambda m, name=name, how=how: f"{how}: {name} reached by {bad} at {where}[{pos}]: {m}")
        assert torch.equal(got[0][..., 7:, :], torch.zeros_like(got[0][..., 7:, :]))  # padded rows: zero
        assert torch.equal(got[1][..., 7:, :], torch.zeros_like(got[1][..., 7:, :]))  # and zero dq


def test_a_bias_gradient_is_zero_at_hidden_pairs_and_in_rows_that_see_nothing():
    T = 9
    keep = selfattn.causal_mask(T) & (torch.arange(T) < 7)[None, :]  # keys 7, 8 padded
    keep[3] = False  # query 3 sees nothing
    q, k, v = (x.requires_grad_(True) for x in _qkv(1, 2, T, T, 4, seed=6))
    bias = _alibi(2, T, T).masked_fill(~keep, float("nan")).requires_grad_(True)  # NaN only where hidden
    out = tiled_attention(q, k, v, keep, causal=True, bias=bias, block_q=2, block_k=4)
    dq, dk, dv, d_bias = _grads(out, (q, k, v, bias))
    assert torch.isfinite(out).all() and all(torch.isfinite(g).all() for g in (dq, dk, dv, d_bias))
    assert torch.equal(d_bias.masked_fill(keep, 0.0), torch.zeros_like(d_bias))
    assert torch.equal(out[..., 3, :], torch.zeros_like(out[..., 3, :]))
    assert torch.equal(dq[..., 3, :], torch.zeros_like(dq[..., 3, :]))
    clean = _alibi(2, T, T).requires_grad_(True)
    want = selfattn.scaled_dot_product_attention(q, k, v, keep, bias=clean)
    for name, g, w in zip(("dq", "dk", "dv", "dbias"), (dq, dk, dv, d_bias), _grads(want, (q, k, v, clean)),
                          strict=True):
        _assert_finite_close(g, w, name, **TOL64)


def test_pairs_hidden_only_by_a_minus_inf_bias_behave_as_in_the_dense_path():
    """A -inf bias gives weight 0 but does not hide: a NaN value there still reaches every row that has
    another key (0 * NaN), exactly as in scaled_dot_product_attention. A row whose every bias is -inf
    is a zero row with zero gradients (l = 0: nothing is read), even where the dense path's 0 @ v
    gives NaN from a NaN value."""
    q, k, v = _qkv(1, 1, 6, 6, 4, seed=12)
    bias = torch.zeros(6, 6, dtype=torch.float64)
    bias[:, 3] = -math.inf  # key 3 "hidden" by the bias only
    bias[5] = -math.inf  # query 5 gets -inf for every key
    v_bad = v.clone()
    v_bad[..., 3, :] = float("nan")
    for blocks in ((1, 1), (2, 4), (8, 8)):
        for values, what in ((v, "finite"), (v_bad, "NaN at key 3")):
            want = selfattn.scaled_dot_product_attention(q, k, values, bias=bias)
            got = tiled_attention(q, k, values, bias=bias, block_q=blocks[0], block_k=blocks[1])
            torch.testing.assert_close(got[..., :5, :], want[..., :5, :], **TOL64, equal_nan=True,
                                       msg=lambda m, what=what: f"{what}: {m}")
            assert torch.equal(got[..., 5, :], torch.zeros_like(got[..., 5, :]))
        assert torch.isnan(got[..., :5, :]).all()  # the dense path's answer too (checked above)
        assert torch.isnan(want[..., 5, :]).all()  # the dense path: 0 @ v with a NaN in v
        qi, ki, vi = (x.clone().requires_grad_(True) for x in (q, k, v))
        out = tiled_attention(qi, ki, vi, bias=bias, block_q=blocks[0], block_k=blocks[1])
        dq, dk, dv = torch.autograd.grad(out.sum(), (qi, ki, vi))
        assert torch.equal(out[..., 5, :], torch.zeros_like(out[..., 5, :]))
        assert torch.equal(dq[..., 5, :], torch.zeros_like(dq[..., 5, :])) and torch.isfinite(dk).all()


# ------------------------------------------------------------------------------------------------
# float32 accuracy at large biases: as accurate as torch's SDPA with the same additive float mask
# ------------------------------------------------------------------------------------------------


def _float64_truth(q, k, v, bias, keep, d_out):
    q, k, v = (x.detach().double().requires_grad_(True) for x in (q, k, v))
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]) + bias.double()
    if keep is not None:
        scores = scores.masked_fill(~keep, -math.inf)
    out = torch.softmax(scores, dim=-1) @ v
    return (out.detach(), *torch.autograd.grad(out, (q, k, v), d_out.double()))


def _relative_errors(got, truth):
    """Max error of (out, dq, dk, dv), each relative to the largest entry of the true quantity."""
    errors = []
    for name, x, t in zip(("out", "dq", "dk", "dv"), got, truth, strict=True):
        assert torch.isfinite(x).all(), f"{name} holds a NaN or inf"
        errors.append(float((x.double() - t).abs().max() / t.abs().max()))
    return errors


@pytest.mark.parametrize("form,causal", [("alibi", False), ("bloom", True)])
def test_float32_with_large_biases_is_as_accurate_as_torch_sdpa(form, causal):
    # ALiBi at T = 8192 puts biases of thousands on the scores. Here T = 2048 with positions 0, 4, 8, ...
    # gives the same magnitudes (up to 0.5 x 8188 = 4094 in the first head): "alibi" is -m_h (q_i - k_j)
    # without a mask (large both ways), "bloom" is BLOOM's m_h k_j (large for every key of a row, so the
    # softmax does not saturate and every rounding at the size of the bias shows). Regression: converting
    # the bias to float32 base 2 and then adding (two roundings), and handing the backward m + log2 l
    # rounded at the size of m, gave up to 2.2x (out), 4.1x (dK) and 4.9x (dV) SDPA's error here; now at
    # most 1.7x (measured, the same with 1 and 2 threads), bound 3x.
    T, H, Dh = 2048, 2, 64
    g = torch.Generator().manual_seed(21 + causal)
    q, k, v, d_out = (torch.randn(1, H, T, Dh, generator=g) for _ in range(4))
    slopes, pos = alibi_slopes(8)[:H], torch.arange(T) * 4  # the two steepest heads of eight: 1/2, 1/4
    if form == "alibi":
        bias64 = alibi_bias(slopes, pos, pos)  # (H, T, T)

        def score_bias(qi, kj):
            return alibi_bias(slopes, qi * 4, kj * 4)
    else:
        bias64 = (slopes[:, None, None] * pos.double()[None, None, :]).expand(H, T, T)

        def score_bias(qi, kj):
            return slopes[:, None, None] * (kj * 4).double()[None, None, :]  # (H, 1, bk)
    bias = bias64.float()  # what every float32 path is given
    assert float(bias.abs().max()) > 4000
    keep = torch.ones(T, T, dtype=torch.bool).tril() if causal else None
    truth = _float64_truth(q, k, v, bias, keep, d_out)
    qs, ks, vs = (x.clone().requires_grad_(True) for x in (q, k, v))
    attn_mask = bias.masked_fill(~keep, -math.inf) if causal else bias
    out = torch.nn.functional.scaled_dot_product_attention(qs, ks, vs, attn_mask=attn_mask)
    sdpa = _relative_errors((out.detach(), *torch.autograd.grad(out, (qs, ks, vs), d_out)), truth)
    assert max(sdpa) < 1e-4, sdpa  # torch's own errors: float32 rounding at |bias| ~ 4e3
    for how, extra, blocks in (("bias", dict(bias=bias), (512, 512)), ("bias", dict(bias=bias), (300, 700)),
                               ("score_bias", dict(score_bias=score_bias), (512, 512))):
        qs, ks, vs = (x.clone().requires_grad_(True) for x in (q, k, v))
        out = tiled_attention(qs, ks, vs, causal=causal, block_q=blocks[0], block_k=blocks[1], **extra)
        got = _relative_errors((out.detach(), *torch.autograd.grad(out, (qs, ks, vs), d_out)), truth)
        for name, e, w in zip(("out", "dq", "dk", "dv"), got, sdpa, strict=True):
            bound = 3 * max(w, torch.finfo(torch.float32).eps)
            assert e <= bound, f"{how} {blocks}: tiled {name} error {e:.2e} > 3 x SDPA's {w:.2e}"


# ------------------------------------------------------------------------------------------------
# Memory: ALiBi through score_bias never builds the (H, T, S) bias
# ------------------------------------------------------------------------------------------------


def test_alibi_through_score_bias_at_long_length_needs_a_fraction_of_the_bias_matrix():
    """Peak bytes of the tensors created (deterministic, counted by a dispatch mode) by forward and
    backward of causal ALiBi attention at T = 4096 through score_bias, against the bytes of the
    (H, T, S) float32 bias alone (256 MiB): measured 0.025 (forward, 6.5 MiB) and 0.045 (forward and
    backward, 11.6 MiB); bound 0.15. (Building that bias from alibi_bias's float64 first: 768 MiB.)"""
    T, H, Dh = 4096, 4, 16
    q, k, v = _qkv(1, H, T, T, Dh, seed=1, dtype=torch.float32)
    bias_bytes = H * T * T * 4
    score_bias = _alibi_fn(H, T, T)
    with torch.no_grad():
        peak, out = peak_tensor_bytes(tiled_attention, q, k, v, causal=True, score_bias=score_bias,
                                      block_q=256, block_k=256)
    assert torch.isfinite(out).all()
    assert peak < 0.15 * bias_bytes, (peak, bias_bytes)
    qg, kg, vg = (x.requires_grad_(True) for x in (q, k, v))

    def train_step():
        out = tiled_attention(qg, kg, vg, causal=True, score_bias=score_bias, block_q=256, block_k=256)
        return torch.autograd.grad(out.sum(), (qg, kg, vg))

    peak_train, grads = peak_tensor_bytes(train_step)
    assert all(torch.isfinite(g).all() for g in grads)
    assert peak_train < 0.15 * bias_bytes, (peak_train, bias_bytes)


# ------------------------------------------------------------------------------------------------
# Errors that name the argument, what it got and what was expected
# ------------------------------------------------------------------------------------------------


def test_bad_bias_arguments_raise_with_names():
    q, k, v = _qkv(1, 2, 4, 5, 3)
    good = torch.zeros(2, 4, 5, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"bias must broadcast to \(\.\.\., T, S\) = \(1, 2, 4, 5\); got shape \(4, 4\)"):
        tiled_attention(q, k, v, bias=torch.zeros(4, 4))
    with pytest.raises(TypeError, match=r"bias must be a floating tensor added to the scores; got dtype torch.int64"):
        tiled_attention(q, k, v, bias=torch.zeros(4, 5, dtype=torch.int64))
    with pytest.raises(TypeError, match=r"bias must be a floating tensor.*torch.bool"):
        tiled_attention(q, k, v, bias=torch.ones(4, 5, dtype=torch.bool))
    with pytest.raises(TypeError, match=r"bias must be a torch.Tensor; got list"):
        tiled_attention(q, k, v, bias=[[0.0] * 5] * 4)
    with pytest.raises(ValueError, match=r"bias must be on the device of q \(cpu\); got meta"):
        tiled_attention(q, k, v, bias=torch.zeros(4, 5, device="meta"))
    with pytest.raises(ValueError, match=r"bias= or score_bias=, not both"):
        tiled_attention(q, k, v, bias=good, score_bias=lambda qi, kj: good[:, qi][:, :, kj])
    with pytest.raises(TypeError, match=r"score_bias must be a callable score_bias\(q_idx, k_idx\).*got Tensor"):
        tiled_attention(q, k, v, score_bias=good)


def test_bad_score_bias_results_raise_with_names():
    q, k, v = _qkv(1, 2, 4, 5, 3)
    cases = [
        (lambda qi, kj: torch.zeros(3, len(qi), len(kj)), ValueError,
         r"score_bias\(q_idx, k_idx\) with q_idx = arange\(0, 3\), k_idx = arange\(0, 5\) must return a bias "
         r"broadcastable to \(\.\.\., bq, bk\) = \(1, 2, 3, 5\); got shape \(3, 3, 5\)"),
        (lambda qi, kj: torch.zeros(2, 3, 5), ValueError, r"got shape \(2, 3, 5\)"),  # fixed size: the last tile is 1 x 5
        (lambda qi, kj: (qi[:, None] - kj[None, :]), TypeError, r"must return a floating tensor.*got dtype torch.int64"),
        (lambda qi, kj: 0.0, TypeError, r"must return a torch.Tensor; got float"),
        (lambda qi, kj: torch.zeros(len(qi), len(kj), device="meta"), ValueError,
         r"must return a tensor on the device of q \(cpu\); got meta"),
    ]
    for fn, error, message in cases:
        with pytest.raises(error, match=message):
            tiled_attention(q, k, v, score_bias=fn, block_q=3)
    slope = torch.nn.Parameter(torch.tensor(0.5, dtype=torch.float64))  # a learned bias: refused, not ignored
    with pytest.raises(ValueError, match=r"returned a tensor that requires grad.*pass it as bias="):
        tiled_attention(q, k, v, score_bias=lambda qi, kj: -slope * (qi[:, None] - kj[None, :]))
    with torch.no_grad():  # no gradient wanted: nothing is lost
        tiled_attention(q, k, v, score_bias=lambda qi, kj: -slope * (qi[:, None] - kj[None, :]))
