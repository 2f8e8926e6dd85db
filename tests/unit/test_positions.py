"""Unit tests for selfattn.positions (chapter 08): claims 21, 22 and 23, RoPE's properties in both
layouts and the porting bug between them, ALiBi's slopes, half precision, gradients, the scheme
classes and every error path.

Expected values are written out by hand, come from the NumPy reference (``selfattn.ref``) or from a
second computation in the test, never from the function under test alone. Tolerances: float64
1e-12 unless stated; property tests use the derandomized "selfattn" hypothesis profile.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from selfattn import MHAConfig, MultiHeadAttention, causal_mask, ref
from selfattn import positions as P

TOL = 1e-12
LAYOUTS = ("half", "interleaved")


def _gaussian(seed: int, *shape) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def _unit_rows(x: torch.Tensor) -> torch.Tensor:
    return x / x.norm(dim=-1, keepdim=True)


def _assert_close(actual, expected, atol=TOL, rtol=0.0):
    """assert_close fails on NaN (equal_nan=False) and on a dtype or shape mismatch."""
    torch.testing.assert_close(actual, expected, rtol=rtol, atol=atol)


# --- claim 22: a shift of positions is a linear map of the sinusoidal encoding -------------------


@given(
    p=st.integers(0, 2000),
    k=st.integers(-2000, 1000),
    half_d=st.integers(1, 32),
    base=st.sampled_from([10000.0, 100.0, 1e6]),
)
def test_claim_22_pe_of_p_plus_k_is_pe_of_p_times_shift_matrix(p, k, half_d, base):
    k = max(k, -p)  # positions stay >= 0 (negative offsets included)
    D = 2 * half_d
    pe_p = P.sinusoidal_encoding(1, D, base=base, start=p, dtype=torch.float64)  # (1, D)
    pe_pk = P.sinusoidal_encoding(1, D, base=base, start=p + k, dtype=torch.float64)
    _assert_close(pe_p @ P.sinusoidal_shift_matrix(k, D, base=base), pe_pk)


def test_claim_22_one_matrix_for_every_position():
    pe = P.sinusoidal_encoding(1500, 64, dtype=torch.float64)
    for k in (-700, -1, 1, 13, 499):
        M = P.sinusoidal_shift_matrix(k, 64)  # the same M whatever p is
        lo, hi = max(0, -k), min(1500, 1500 - k)
        _assert_close(pe[lo:hi] @ M, pe[lo + k : hi + k])


def test_sinusoidal_encoding_by_hand_and_dtype():
    pe = P.sinusoidal_encoding(2, 4, start=3)  # w = (1, 1/100)
    assert pe.dtype == torch.float32 and pe.shape == (2, 4)
    expected = torch.tensor(
        [[math.sin(p), math.cos(p), math.sin(p / 100), math.cos(p / 100)] for p in (3, 4)]
    )
    _assert_close(pe, expected, atol=1e-7)


# --- claim 23: RoPE scores depend on the offset only -------------------------------------------


@given(
    seed=st.integers(0, 2**16),
    shift=st.integers(0, 3000),
    half_dh=st.integers(1, 16),
    layout=st.sampled_from(LAYOUTS),
    base=st.sampled_from([10000.0, 500000.0]),
)
def test_claim_23_scores_invariant_to_a_common_shift(seed, shift, half_dh, layout, base):
    Dh, T = 2 * half_dh, 6
    q, k = _unit_rows(_gaussian(seed, 2, T, Dh)).unbind(0)  # unit rows: scores in [-1, 1]
    pos = torch.arange(T)

    def scores(offset):
        q_rot = P.apply_rope(q, pos + offset, base=base, layout=layout)
        k_rot = P.apply_rope(k, pos + offset, base=base, layout=layout)
        return q_rot @ k_rot.T  # (T, Dh) @ (Dh, T) -> (T, T): q_m . k_n for every pair

    _assert_close(scores(shift), scores(0))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_claim_23_score_of_one_q_and_one_k_is_a_function_of_m_minus_n(layout):
    q, k = _unit_rows(_gaussian(1, 2, 16)).unbind(0)  # one query vector, one key vector
    N = 40
    pos = torch.arange(N)
    q_rot = P.apply_rope(q.expand(N, 16), pos, layout=layout)  # the same q at positions 0..N-1
    k_rot = P.apply_rope(k.expand(N, 16), pos, layout=layout)
    S = q_rot @ k_rot.T  # S[m, n] = q_m . k_n: (N, N)
    _assert_close(S[1:, 1:], S[:-1, :-1])  # constant along every diagonal: Toeplitz
    # and equal to q . R(n - m) k from the reference's rotation matrix
    for m, n in [(0, 0), (3, 17), (30, 2)]:
        R = torch.from_numpy(ref.rope_rotation_matrix(float(n - m), 16, layout=layout))
        _assert_close(S[m, n], q @ R @ k)
    assert (S - S[0, 0]).abs().max() > 0.1  # not trivially constant: the offset matters


# --- RoPE properties ---------------------------------------------------------------------------


@given(seed=st.integers(0, 2**16), layout=st.sampled_from(LAYOUTS), half_dh=st.integers(1, 16))
def test_rope_keeps_norms(seed, layout, half_dh):
    x = _gaussian(seed, 3, 7, 2 * half_dh) * 10
    pos = torch.tensor([0, 1, 5, 99, 1000, 4096, 12345])
    out = P.apply_rope(x, pos, layout=layout)
    _assert_close(out.norm(dim=-1), x.norm(dim=-1), atol=0, rtol=1e-13)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_rope_at_position_zero_is_the_identity(layout):
    x = _gaussian(2, 2, 3, 5, 8)
    assert torch.equal(
        P.apply_rope(x, torch.zeros(5), layout=layout), x
    )  # cos 0 = 1, sin 0 = 0 exactly


def test_rope_pairs_by_hand():
    # Dh = 4, position 1: angles 1 and 1/100 (base 10000)
    x = torch.tensor([[1.0, 2.0, 3.0, 4.0]], dtype=torch.float64)
    c0, s0, c1, s1 = math.cos(1), math.sin(1), math.cos(0.01), math.sin(0.01)
    half = [
        1 * c0 - 3 * s0,
        2 * c1 - 4 * s1,
        1 * s0 + 3 * c0,
        2 * s1 + 4 * c1,
    ]  # pairs (0,2), (1,3)
    inter = [
        1 * c0 - 2 * s0,
        1 * s0 + 2 * c0,
        3 * c1 - 4 * s1,
        3 * s1 + 4 * c1,
    ]  # pairs (0,1), (2,3)
    _assert_close(P.apply_rope(x, [1], layout="half"), torch.tensor([half], dtype=torch.float64))
    _assert_close(
        P.apply_rope(x, [1], layout="interleaved"), torch.tensor([inter], dtype=torch.float64)
    )


def test_layout_permutation_by_hand_and_as_a_conjugation():
    perm = P.rope_interleaved_to_half(8)
    assert perm.dtype == torch.int64
    assert perm.tolist() == [0, 2, 4, 6, 1, 3, 5, 7]
    x = _gaussian(3, 2, 4, 9, 8)
    pos = torch.arange(100, 109)
    _assert_close(
        P.apply_rope(x[..., perm], pos, layout="half"),
        P.apply_rope(x, pos, layout="interleaved")[..., perm],
    )


def test_porting_bug_interleaved_weights_in_half_layout_code():
    """Weights trained with interleaved RoPE, run through half-layout code: the scores change unless
    the columns of W_Q and W_K are permuted (as Hugging Face's Llama conversion script does)."""
    D, Dh, T = 32, 16, 24
    X = _gaussian(4, T, D)
    W_Q, W_K = _gaussian(5, D, Dh) / math.sqrt(D), _gaussian(6, D, Dh) / math.sqrt(D)
    pos = torch.arange(T)

    def scores(W_q, W_k, layout):
        return (
            P.apply_rope(X @ W_q, pos, layout=layout) @ P.apply_rope(X @ W_k, pos, layout=layout).T
        )

    trained = scores(W_Q, W_K, "interleaved")  # (T, T): what the model was trained with
    buggy = scores(W_Q, W_K, "half")
    perm = P.rope_interleaved_to_half(Dh)
    fixed = scores(W_Q[:, perm], W_K[:, perm], "half")
    _assert_close(fixed, trained)
    relative = ((buggy - trained).norm() / trained.norm()).item()
    assert relative > 0.3, f"relative difference of the buggy scores only {relative:.3f}"
    # at position 0 nothing is rotated, so the bug is invisible there: a test at T=1 would miss it
    _assert_close(buggy[0, 0], trained[0, 0])


def test_permutation_is_the_llama_conversion_scripts_permute():
    """Hugging Face's convert_llama_weights_to_hf.py reorders the output rows of each head's W_Q / W_K
    (nn.Linear layout, (out, in)) with ``w.view(H, Dh // 2, 2, D).transpose(1, 2).reshape(D, D)``
    (written out here; the script is not shipped in the wheel). In the maths' (in, out) layout that
    is our permutation applied to each head's columns."""
    H, Dh = 3, 8
    D = H * Dh
    W = _gaussian(14, D, D)  # (D_in, D_out), X @ W
    w_linear = W.T  # (out, in)
    converted = w_linear.view(H, Dh // 2, 2, D).transpose(1, 2).reshape(D, D).T  # back to (in, out)
    perm = P.rope_interleaved_to_half(Dh)
    per_head = torch.cat([W[:, h * Dh : (h + 1) * Dh][:, perm] for h in range(H)], dim=1)
    assert torch.equal(converted, per_head)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("factor", [2, 4.0, 8.5])
def test_interpolation_equals_dividing_positions(layout, factor):
    x = _gaussian(7, 2, 11, 16)
    pos = torch.arange(0, 4400, 400)  # 11 positions up to 4000
    _assert_close(
        P.apply_rope(x, pos, layout=layout, interpolation=factor),
        P.apply_rope(x, pos.double() / factor, layout=layout),
    )


def test_rope_cos_sin_and_frequencies_by_hand():
    _assert_close(
        P.rope_frequencies(6, base=64.0),
        torch.tensor([1.0, 0.25, 1 / 16], dtype=torch.float64),
        atol=1e-15,
    )
    cos, sin = P.rope_cos_sin(
        [0, 2], 4, base=100.0, interpolation=2.0
    )  # positions 0, 1; theta 1, 0.1
    _assert_close(
        cos, torch.tensor([[1.0, 1.0], [math.cos(1), math.cos(0.1)]], dtype=torch.float64)
    )
    _assert_close(
        sin, torch.tensor([[0.0, 0.0], [math.sin(1), math.sin(0.1)]], dtype=torch.float64)
    )


def test_ntk_scaled_base_by_hand():
    # 10000 * 4^(64/62) = 10000 * 4 * 4^(1/31) = 40000 * 2^(2/31)
    assert P.ntk_scaled_base(10000.0, 4.0, 64) == pytest.approx(40000 * 2 ** (2 / 31), rel=1e-14)
    assert P.ntk_scaled_base(10000, 2, 4) == pytest.approx(40000.0, rel=1e-14)  # 2^(4/2) = 4
    assert P.ntk_scaled_base(500000.0, 1.0, 128) == pytest.approx(500000.0, rel=1e-15)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize(("dtype", "atol"), [(torch.float16, 4e-3), (torch.bfloat16, 3e-2)])
def test_half_precision_in_same_dtype_out_close_to_float32(layout, dtype, atol):
    x32 = _gaussian(8, 2, 4, 33, 16).float()
    x = x32.to(dtype)
    pos = torch.arange(1000, 1033)
    out = P.apply_rope(x, pos, layout=layout)
    assert out.dtype == dtype
    expected = P.apply_rope(x.float(), pos, layout=layout)  # the same rounded input, in float32
    _assert_close(
        out.float(), expected, atol=atol
    )  # entries of |x| < ~4: one rounding of the output


def test_gradients_through_apply_rope_are_finite_and_correct():
    x = _gaussian(9, 2, 5, 8).requires_grad_()
    for layout in LAYOUTS:
        assert torch.autograd.gradcheck(
            lambda t, layout=layout: P.apply_rope(t, torch.arange(5) * 37, layout=layout), (x,)
        )
    x16 = x.detach().to(torch.bfloat16).requires_grad_()
    P.apply_rope(x16, torch.arange(5), layout="half").float().pow(2).sum().backward()
    assert x16.grad.dtype == torch.bfloat16 and torch.isfinite(x16.grad.float()).all()
    # the rotation is orthogonal, so d|R x|^2 / dx = 2 x
    _assert_close(x16.grad.float(), 2 * x16.detach().float(), atol=0.1)


# --- ALiBi -------------------------------------------------------------------------------------


def test_alibi_slopes_8_heads_are_the_papers():
    expected = torch.tensor(
        [1 / 2, 1 / 4, 1 / 8, 1 / 16, 1 / 32, 1 / 64, 1 / 128, 1 / 256], dtype=torch.float64
    )
    assert torch.equal(P.alibi_slopes(8), expected)


def test_alibi_slopes_6_and_12_heads_by_hand():
    six = [1 / 4, 1 / 16, 1 / 64, 1 / 256, 1 / 2, 1 / 8]  # 4-head slopes, then 8-head's 1st and 3rd
    _assert_close(P.alibi_slopes(6), torch.tensor(six, dtype=torch.float64), atol=0, rtol=1e-15)
    twelve = [2.0**-k for k in range(1, 9)] + [2**-0.5, 2**-1.5, 2**-2.5, 2**-3.5]
    _assert_close(P.alibi_slopes(12), torch.tensor(twelve, dtype=torch.float64), atol=0, rtol=1e-15)


@pytest.mark.parametrize("H", range(1, 65))
def test_alibi_slopes_are_in_0_1_distinct_and_decrease_within_each_part(H):
    s = P.alibi_slopes(H)
    assert s.shape == (H,) and s.dtype == torch.float64
    assert ((s > 0) & (s < 1)).all()
    assert len(set(s.tolist())) == H
    n = 2 ** int(math.log2(H))  # the power-of-two part, then the interleaved extra heads
    assert (s[: n - 1] > s[1:n]).all() and (s[n:-1] > s[n + 1 :]).all()
    if n == H:
        assert s[-1] == 2.0**-8  # a power of two ends at 2^-8


def test_alibi_bias_by_hand():
    bias = P.alibi_bias(torch.tensor([0.5, 0.25], dtype=torch.float64), [2, 3], [0, 1, 2, 3])
    distance = torch.tensor([[2, 1, 0, -1], [3, 2, 1, 0]], dtype=torch.float64)
    assert torch.equal(
        bias, -torch.tensor([0.5, 0.25], dtype=torch.float64)[:, None, None] * distance
    )


# --- scheme classes ----------------------------------------------------------------------------


def test_learned_positions_add_rows_and_refuse_past_the_table():
    torch.manual_seed(0)
    scheme = P.LearnedPositions(8, 4)
    assert scheme.max_positions == 8
    x = torch.zeros(2, 3, 4)
    _assert_close(scheme.add_absolute(x, start=5), scheme.weight[5:8].expand(2, 3, 4), atol=0)
    with pytest.raises(ValueError, match=r"positions 6\.\.8 exceed .*max_positions=8"):
        scheme.add_absolute(x, start=6)
    with pytest.raises(ValueError, match="start"):
        scheme.add_absolute(x, start=-1)
    with pytest.raises(ValueError, match="D=4"):
        scheme.add_absolute(torch.zeros(2, 3, 5))
    assert torch.equal(scheme.rotate(x), x) and scheme.score_bias(3, 3) is None


def test_learned_positions_generator_makes_the_table_reproducible():
    def table(seed):
        return P.LearnedPositions(16, 8, generator=torch.Generator().manual_seed(seed)).weight

    torch.manual_seed(123)
    first = table(0)
    torch.rand(5)  # other draws from the global generator do not matter
    assert torch.equal(first, table(0)) and not torch.equal(first, table(1))
    assert 0.01 < first.std().item() < 0.03  # N(0, 0.02^2): 128 draws


@pytest.mark.parametrize("start", [0, 1, 37, 10_000])
def test_sinusoidal_positions_at_any_start(start):
    scheme = P.SinusoidalPositions(6)
    assert scheme.max_positions is None
    x = _gaussian(10, 2, 4, 6)
    expected = x + torch.from_numpy(ref.sinusoidal_encoding(4, 6, start=start))
    _assert_close(scheme.add_absolute(x, start), expected)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("start", [0, 3, 5000])
def test_rotary_positions_at_any_start(layout, start):
    scheme = P.RotaryPositions(8, base=500000.0, layout=layout, interpolation=2.0)
    assert scheme.max_positions is None
    x = _gaussian(11, 2, 3, 5, 8)  # (B, H, T, Dh)
    expected = ref.apply_rope(
        x.numpy(), np.arange(start, start + 5), base=500000.0, layout=layout, interpolation=2.0
    )
    _assert_close(scheme.rotate(x, start), torch.from_numpy(expected))
    assert torch.equal(scheme.add_absolute(x), x) and scheme.score_bias(5, 5) is None
    with pytest.raises(ValueError, match="Dh=8"):
        scheme.rotate(torch.zeros(1, 1, 2, 6))


@pytest.mark.parametrize(("start", "T", "S"), [(0, 4, 4), (6, 1, 7), (100, 3, 103)])
def test_alibi_positions_at_any_start(start, T, S):
    scheme = P.ALiBiPositions(6)
    bias = scheme.score_bias(T, S, start, dtype=torch.float64)
    assert bias.shape == (6, T, S) and bias.dtype == torch.float64
    expected = ref.alibi_bias(ref.alibi_slopes(6), np.arange(start, start + T), np.arange(S))
    _assert_close(bias, torch.from_numpy(expected))
    assert scheme.score_bias(T, S, start).dtype == torch.float32
    with pytest.raises(ValueError, match="T must be > 0"):
        scheme.score_bias(0, S)


def test_no_positions_changes_nothing():
    scheme = P.NoPositions()
    x = _gaussian(12, 2, 3, 4)
    assert scheme.add_absolute(x, 7) is x and scheme.rotate(x, 7) is x
    assert scheme.score_bias(3, 3) is None and scheme.max_positions is None


def test_make_positions_builds_each_scheme_and_rejects_unknown_names():
    kinds = {"learned": P.LearnedPositions, "sinusoidal": P.SinusoidalPositions, "rope": P.RotaryPositions,
             "alibi": P.ALiBiPositions, "none": P.NoPositions}  # fmt: skip
    assert set(kinds) == set(P.POSITION_SCHEMES)
    for name, cls in kinds.items():
        scheme = P.make_positions(name, max_positions=16, d_model=12, n_heads=3)
        assert type(scheme) is cls and scheme.name == name
    assert P.make_positions("rope", max_positions=16, d_model=12, n_heads=3).d_head == 4
    with pytest.raises(ValueError, match="positions must be one of.*'rotary'"):
        P.make_positions("rotary", max_positions=16, d_model=12, n_heads=3)
    with pytest.raises(ValueError, match="divisible"):
        P.make_positions("rope", max_positions=16, d_model=12, n_heads=5)


# --- claim 21: attention alone is permutation-equivariant; a causal mask breaks it ---------------


def _mha():
    mha = MultiHeadAttention(MHAConfig(16, 4), generator=torch.Generator().manual_seed(0)).double()
    with torch.no_grad():
        for b in (mha.b_Q, mha.b_K, mha.b_V, mha.b_O):
            b.normal_(generator=torch.Generator().manual_seed(1))
    return mha.eval()


@given(seed=st.integers(0, 2**16))
def test_claim_21_without_positions_or_mask_attention_is_permutation_equivariant(seed):
    mha, X = _mha(), _gaussian(seed, 2, 9, 16)
    perm = torch.randperm(9, generator=torch.Generator().manual_seed(seed))
    _assert_close(mha(X[:, perm]), mha(X)[:, perm])


def test_claim_21_a_causal_mask_alone_breaks_equivariance():
    mha, X = _mha(), _gaussian(13, 2, 9, 16)
    perm = torch.randperm(9, generator=torch.Generator().manual_seed(13))
    mask = causal_mask(9)
    diff = (mha(X[:, perm], mask=mask) - mha(X, mask=mask)[:, perm]).abs().max().item()
    assert math.isfinite(diff) and diff > 1e-2, f"measured max |difference| {diff:.3g}"
    # and so does an absolute position scheme without any mask
    pe = P.SinusoidalPositions(16)
    diff_pe = (
        (mha(pe.add_absolute(X[:, perm])) - mha(pe.add_absolute(X))[:, perm]).abs().max().item()
    )
    assert diff_pe > 1e-2, f"measured max |difference| with sinusoids {diff_pe:.3g}"


# --- errors --------------------------------------------------------------------------------------

X4 = torch.zeros(3, 4)


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda: P.sinusoidal_encoding(0, 4), ValueError, "n_positions"),
        (lambda: P.sinusoidal_encoding(2, 3), ValueError, "d_model must be even"),
        (lambda: P.sinusoidal_encoding(2, 4.0), TypeError, "d_model"),
        (lambda: P.sinusoidal_encoding(2, 4, base=1), ValueError, "base"),
        (lambda: P.sinusoidal_encoding(2, 4, start=-2), ValueError, "start"),
        (lambda: P.sinusoidal_shift_matrix(0.5, 4), TypeError, "offset"),
        (lambda: P.sinusoidal_shift_matrix(1, 5), ValueError, "d_model"),
        (lambda: P.rope_frequencies(5), ValueError, "d_head must be even"),
        (lambda: P.rope_frequencies(4, base=float("nan")), ValueError, "base"),
        (lambda: P.rope_frequencies(4, base="10000"), TypeError, "base"),
        (lambda: P.rope_cos_sin([0, 1], 4, interpolation=0.5), ValueError, "interpolation"),
        (lambda: P.apply_rope(X4.numpy(), [0, 1, 2]), TypeError, "x must be a torch.Tensor"),
        (lambda: P.apply_rope(X4.long(), [0, 1, 2]), TypeError, "floating-point"),
        (lambda: P.apply_rope(torch.zeros(4), [0]), ValueError, "at least 2 dims"),
        (
            lambda: P.apply_rope(torch.zeros(3, 5), [0, 1, 2]),
            ValueError,
            r"Dh must be even.*\(3, 5\)",
        ),
        (lambda: P.apply_rope(X4, [0, 1]), ValueError, r"positions must have length T=3"),
        (lambda: P.apply_rope(X4, [[0, 1, 2]]), ValueError, r"positions must have shape \(T,\)"),
        (
            lambda: P.apply_rope(X4, torch.tensor([True, False, True])),
            TypeError,
            "positions must hold real",
        ),
        (
            lambda: P.apply_rope(X4, [0.0, float("nan"), 2.0]),
            ValueError,
            "positions must be finite",
        ),
        (lambda: P.apply_rope(X4, [0, 1, 2], layout="neox"), ValueError, "layout must be one of"),
        (lambda: P.apply_rope(X4, [0, 1, 2], base=0.5), ValueError, "base"),
        (lambda: P.apply_rope(X4, [0, 1, 2], interpolation=0.99), ValueError, "interpolation"),
        (
            lambda: P.apply_rope(X4, [0, 1, 2], interpolation=float("inf")),
            ValueError,
            "interpolation",
        ),
        (lambda: P.apply_rope(X4, [0, 1, 2], base="1e4"), TypeError, "base"),
        (lambda: P.apply_rope(X4, [0, 1, 2], interpolation=True), TypeError, "interpolation"),
        (lambda: P.apply_rope(X4, [0, 1, 2], layout=None), ValueError, "layout"),
        (
            lambda: P.apply_rope(X4, torch.tensor([0, 1, 2]) + 0j),
            TypeError,
            "positions must hold real",
        ),
        (lambda: P.rope_cos_sin([[0]], 4), ValueError, "positions"),
        (lambda: P.rope_cos_sin([0], 6, base=-3.0), ValueError, "base"),
        (lambda: P.rope_interleaved_to_half(3), ValueError, "d_head"),
        (lambda: P.ntk_scaled_base(10000.0, 0.5, 64), ValueError, "factor"),
        (lambda: P.ntk_scaled_base(10000.0, 2.0, 2), ValueError, "d_head must be > 2"),
        (lambda: P.ntk_scaled_base(1.0, 2.0, 64), ValueError, "base"),
        (lambda: P.alibi_slopes(0), ValueError, "n_heads"),
        (lambda: P.alibi_slopes(True), TypeError, "n_heads"),
        (lambda: P.alibi_bias(np.ones(2), [0], [0]), TypeError, "slopes must be a torch.Tensor"),
        (
            lambda: P.alibi_bias(torch.ones(2, 1), [0], [0]),
            ValueError,
            r"slopes must have shape \(H,\)",
        ),
        (lambda: P.alibi_bias(torch.ones(2), [[0]], [0]), ValueError, "positions must have shape"),
        (lambda: P.LearnedPositions(4, 4.0), TypeError, "d_model"),
        (lambda: P.RotaryPositions(8, base=1), ValueError, "base"),
        (lambda: P.SinusoidalPositions(4).add_absolute(torch.zeros(1, 2, 6)), ValueError, "D=4"),
        (
            lambda: P.SinusoidalPositions(4).add_absolute(torch.zeros(1, 2, 4), -1),
            ValueError,
            "start",
        ),
        (
            lambda: P.LearnedPositions(4, 2).add_absolute(torch.zeros(1, 2, 2).long()),
            TypeError,
            "floating",
        ),
        (lambda: P.ALiBiPositions(2).score_bias(2, 0), ValueError, "S must be > 0"),
        (lambda: P.LearnedPositions(0, 4), ValueError, "max_positions"),
        (lambda: P.SinusoidalPositions(5), ValueError, "d_model"),
        (lambda: P.RotaryPositions(8, layout="x"), ValueError, "layout"),
        (lambda: P.RotaryPositions(8, interpolation=0), ValueError, "interpolation"),
        (lambda: P.RotaryPositions(7), ValueError, "d_head"),
        (lambda: P.ALiBiPositions(-1), ValueError, "n_heads"),
        (lambda: P.RotaryPositions(4).rotate(X4, start=-1), ValueError, "start"),
        (lambda: P.ALiBiPositions(2).score_bias(2, 2, start=1.5), TypeError, "start"),
        (
            lambda: P.make_positions("none", max_positions=4, d_model=4, n_heads=0),
            ValueError,
            "n_heads",
        ),
    ],
)
def test_errors_name_the_argument(call, error, match):
    with pytest.raises(error, match=match):
        call()


def test_float64_math_stays_on_the_cpu_so_devices_without_float64_work():
    """Apple's MPS has no float64: the angles and biases are computed in float64 on the CPU, and only
    the results reach the data's device. Checked on the "meta" device, which records every op: no
    float64 tensor may be created there for float32 data (before the fix, the positions, angles and
    biases were float64 tensors on the data's device)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Float64OnMeta(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.seen = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in out if isinstance(out, (tuple, list)) else (out,):
                if isinstance(t, torch.Tensor) and t.device.type == "meta" and t.dtype == torch.float64:
                    self.seen.append(str(func))
            return out

    x = torch.empty(2, 3, 5, 8, device="meta")  # (B, H, T, Dh) float32
    with Float64OnMeta() as mode:
        for layout in P.ROPE_LAYOUTS:
            out = P.apply_rope(x, torch.arange(5), layout=layout)
            assert out.device.type == "meta" and out.dtype == torch.float32
        P.RotaryPositions(8).rotate(x, start=3)
        pe = P.sinusoidal_encoding(5, 8, device="meta")
        bias = P.ALiBiPositions(3).score_bias(5, 5, dtype=torch.float32, device="meta")
        P.SinusoidalPositions(8).add_absolute(torch.empty(2, 5, 8, device="meta"))
    assert pe.device.type == "meta" and bias.device.type == "meta" and bias.dtype == torch.float32
    assert mode.seen == [], mode.seen


def test_alibi_positions_slopes_stay_on_the_cpu_when_the_module_moves():
    scheme = P.ALiBiPositions(4)
    scheme.to(torch.float32)  # .to() must not touch the float64 slopes (they are not a buffer)
    assert scheme.slopes.dtype == torch.float64 and scheme.slopes.device.type == "cpu"
    bias = scheme.score_bias(3, 3, dtype=torch.float64)
    torch.testing.assert_close(bias, P.alibi_bias(P.alibi_slopes(4), torch.arange(3), torch.arange(3)), rtol=0, atol=0)


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda: P.sinusoidal_encoding(3, 4, dtype=torch.int64), TypeError, "dtype must be a floating"),
        (lambda: P.sinusoidal_encoding(3, 4, dtype="float32"), TypeError, "dtype must be a floating"),
        (lambda: P.ALiBiPositions(4).score_bias(2, 3, 1, dtype=torch.int64), TypeError, "dtype must be a floating"),
        (lambda: P.alibi_bias(torch.tensor([float("nan"), 0.5]), [0, 1], [0, 1]), ValueError, "slopes must be finite"),
        (lambda: P.alibi_bias(torch.tensor([True, False]), [0, 1], [0, 1]), TypeError, "slopes must be a floating"),
        (lambda: P.apply_rope(torch.randn(5, 4), "01234"), TypeError, "positions must"),
        (lambda: P.apply_rope(torch.randn(5, 4), None), TypeError, "positions must"),
        (lambda: P.apply_rope(torch.randn(1, 4), [2**70]), TypeError, "positions must"),
        (lambda: P.apply_rope(torch.randn(1, 4), [2.0**60]), ValueError, "2\\^53"),
        (lambda: P.sinusoidal_encoding(4, 8, start=2**62), ValueError, "start"),
        (lambda: P.make_positions("rope", max_positions="x", d_model=8, n_heads=2), TypeError, "max_positions"),
    ],
)
def test_bad_values_found_by_a_new_user_raise_naming_the_argument(call, error, match):
    with pytest.raises(error, match=match):
        call()


def test_numpy_scalars_are_accepted_like_python_numbers():
    np.testing.assert_array_equal(P.sinusoidal_encoding(4, 8, start=np.int64(3)).numpy(),
                                  P.sinusoidal_encoding(4, 8, start=3).numpy())  # fmt: skip
    x = torch.randn(3, 4, dtype=torch.float64)
    torch.testing.assert_close(P.apply_rope(x, [0, 1, 2], base=np.float32(1e4)), P.apply_rope(x, [0, 1, 2]), rtol=0, atol=0)
    torch.testing.assert_close(P.sinusoidal_shift_matrix(np.int64(2), 8), P.sinusoidal_shift_matrix(2, 8), rtol=0, atol=0)


def test_scheme_edge_cases_keep_dtype_and_accept_no_positions():
    half = torch.zeros(1, 3, 8, dtype=torch.float16)
    assert P.LearnedPositions(4, 8).add_absolute(half).dtype == torch.float16
    assert P.SinusoidalPositions(8).add_absolute(half).dtype == torch.float16
    assert P.SinusoidalPositions(8).add_absolute(torch.zeros(2, 0, 8)).shape == (2, 0, 8)


def test_alibi_slopes_refuses_more_heads_than_its_bound_before_allocating():
    # Regression: no bound, so 2**26 heads built a 2**26-element Python list (40 s, 3.4 GB) and returned it.
    with pytest.raises(ValueError, match=r"n_heads must be at most ALIBI_MAX_HEADS = 65536.*got 67108864"):
        P.alibi_slopes(2**26)
    with pytest.raises(ValueError, match=r"n_heads must be at most.*got 65537"):
        P.alibi_slopes(P.ALIBI_MAX_HEADS + 1)
    # the bound itself is accepted: the paper's sequence 2^(-8 h / H), the last slope 2^-8
    top = P.alibi_slopes(P.ALIBI_MAX_HEADS)
    assert top.shape == (65536,)
    assert float(top[-1]) == 2.0 ** -8 and float(top[0]) == 2.0 ** (-8.0 / 65536)


def test_apply_rope_with_an_empty_feature_axis_names_x():
    # Regression: Dh = 0 reached rope_cos_sin, whose error named d_head, an argument the caller never passed.
    for layout in ("half", "interleaved"):
        with pytest.raises(ValueError, match=r"x's last axis Dh must be even and > 0.*got shape \(3, 0\)"):
            P.apply_rope(torch.zeros(3, 0), torch.arange(3), layout=layout)


def test_positions_given_as_python_floats_are_read_in_float64():
    """torch.as_tensor reads Python floats as float32: position 16777217.0 became 16777216 and 1000.3
    was 3.5e-5 off (a fresh user's trial). They are read in float64, as a float64 tensor is."""
    from selfattn.positions import alibi_bias, alibi_slopes, apply_rope

    x = torch.randn(1, 2, 1, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    for p in (16777217.0, 1000.3):
        exact = apply_rope(x, torch.tensor([p], dtype=torch.float64))
        torch.testing.assert_close(apply_rope(x, [p]), exact, atol=0, rtol=0)
    bias = alibi_bias(alibi_slopes(1), [16777217.0], [0.0])
    assert float(bias) == -float(alibi_slopes(1)[0]) * 16777217.0  # -65536.00390625, not -65536
    with pytest.raises(ValueError, match=r"positions must lie in \(-2\^53, 2\^53\)"):
        apply_rope(x, [1e300])  # float32 made it inf and the message said "NaN or inf"


def test_learned_alibi_slopes_get_their_gradient():
    """alibi_bias detached its slopes, so a model learning them got no gradient, silently."""
    from selfattn.positions import alibi_bias

    slopes = torch.tensor([0.5, 0.25], dtype=torch.float64, requires_grad=True)
    q, k = [3.0, 4.0], [0.0, 1.0, 2.0]
    bias = alibi_bias(slopes, q, k)
    assert bias.requires_grad
    bias.sum().backward()
    # d/ds_h of sum_ij -s_h (q_i - k_j) = -sum_ij (q_i - k_j) = -(3 * 7 - 2 * 3) = -15, for each head
    torch.testing.assert_close(slopes.grad, torch.tensor([-15.0, -15.0], dtype=torch.float64), atol=1e-12, rtol=0)
