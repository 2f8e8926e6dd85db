"""The NumPy float64 reference for positions (``selfattn.ref.positions``, chapter 08).

Expected values are written out by hand here (ALiBi's slopes, the NTK base, small rotations) or come
from a second formulation inside the reference (the rotation matrix R(m) against the complex
product), never from the code under test alone. Float64 throughout: tolerance 1e-12 unless stated.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from selfattn import ref
from selfattn.ref import positions as rp

TOL = 1e-12


# --- sinusoids -----------------------------------------------------------------------------------


def test_sinusoidal_encoding_small_case_by_hand():
    # D = 4, base 10000: w_0 = 1, w_1 = 10000^(-2/4) = 1/100
    pe = ref.sinusoidal_encoding(3, 4)
    expected = np.array(
        [[math.sin(p), math.cos(p), math.sin(p / 100), math.cos(p / 100)] for p in range(3)]
    )
    np.testing.assert_allclose(pe, expected, rtol=0, atol=TOL)
    assert pe.dtype == np.float64 and pe.shape == (3, 4)


def test_sinusoidal_encoding_start_is_a_slice_of_a_longer_table():
    np.testing.assert_allclose(
        ref.sinusoidal_encoding(5, 8, start=7), ref.sinusoidal_encoding(12, 8)[7:], rtol=0, atol=TOL
    )


@pytest.mark.parametrize("offset", [-300, -1, 0, 1, 5, 777])
def test_shift_matrix_maps_pe_p_to_pe_p_plus_offset(offset):
    pe = ref.sinusoidal_encoding(2000, 16)
    M = ref.sinusoidal_shift_matrix(offset, 16)
    lo, hi = max(0, -offset), min(2000, 2000 - offset)
    np.testing.assert_allclose(pe[lo:hi] @ M, pe[lo + offset : hi + offset], rtol=0, atol=TOL)


def test_shift_matrix_is_orthogonal_and_composes():
    M3, M4, M7 = (ref.sinusoidal_shift_matrix(k, 10) for k in (3, 4, 7))
    np.testing.assert_allclose(M3 @ M3.T, np.eye(10), rtol=0, atol=TOL)
    np.testing.assert_allclose(M3 @ M4, M7, rtol=0, atol=TOL)
    np.testing.assert_allclose(ref.sinusoidal_shift_matrix(0, 10), np.eye(10), rtol=0, atol=0)


# --- RoPE ----------------------------------------------------------------------------------------


def test_rope_frequencies_by_hand():
    # Dh = 4: theta = 1, base^(-1/2) = 1/100
    np.testing.assert_allclose(ref.rope_frequencies(4), [1.0, 0.01], rtol=1e-15, atol=0)
    np.testing.assert_allclose(
        ref.rope_frequencies(6, base=64.0), [1.0, 0.25, 1 / 16], rtol=1e-15, atol=0
    )


@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_rotation_matrix_of_a_two_feature_head_is_the_plane_rotation(layout):
    m = 0.7  # Dh = 2: theta_0 = 1, angle 0.7 in both layouts (one pair, the same features)
    c, s = math.cos(m), math.sin(m)
    np.testing.assert_allclose(
        ref.rope_rotation_matrix(m, 2, layout=layout), [[c, -s], [s, c]], rtol=0, atol=TOL
    )


def test_rotation_matrix_places_pairs_as_the_layout_says():
    R = ref.rope_rotation_matrix(
        1.0, 4, base=10000.0, layout="half"
    )  # pairs (0, 2) angle 1 and (1, 3) angle 0.01
    c0, s0, c1, s1 = math.cos(1), math.sin(1), math.cos(0.01), math.sin(0.01)
    expected = np.array([[c0, 0, -s0, 0], [0, c1, 0, -s1], [s0, 0, c0, 0], [0, s1, 0, c1]])
    np.testing.assert_allclose(R, expected, rtol=0, atol=TOL)
    R = ref.rope_rotation_matrix(1.0, 4, layout="interleaved")  # pairs (0, 1) and (2, 3)
    expected = np.array([[c0, -s0, 0, 0], [s0, c0, 0, 0], [0, 0, c1, -s1], [0, 0, s1, c1]])
    np.testing.assert_allclose(R, expected, rtol=0, atol=TOL)


@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_rotation_matrix_group_law_rt_m_r_n_is_r_n_minus_m(layout):
    for m, n in [(3, 11), (250, 17), (-4, 9)]:
        Rm, Rn = (ref.rope_rotation_matrix(p, 12, layout=layout) for p in (m, n))
        np.testing.assert_allclose(
            Rm.T @ Rn, ref.rope_rotation_matrix(n - m, 12, layout=layout), rtol=0, atol=TOL
        )
        np.testing.assert_allclose(Rm.T @ Rm, np.eye(12), rtol=0, atol=TOL)


@pytest.mark.parametrize("layout", ["half", "interleaved"])
@pytest.mark.parametrize("interpolation", [1.0, 4.0])
def test_complex_form_equals_the_rotation_matrix(rng, layout, interpolation):
    x = rng.standard_normal((2, 7, 8))  # (B, T, Dh)
    positions = np.array([0, 1, 2, 5, 40, 333, 2047])
    out = ref.apply_rope(x, positions, layout=layout, interpolation=interpolation)
    for t, m in enumerate(positions):
        R = ref.rope_rotation_matrix(float(m), 8, layout=layout, interpolation=interpolation)
        np.testing.assert_allclose(
            out[:, t], x[:, t] @ R.T, rtol=0, atol=TOL
        )  # rows: x R^T = (R x)^T


def test_permutation_maps_interleaved_pairs_to_half_pairs(rng):
    perm = ref.rope_interleaved_to_half(8)
    np.testing.assert_array_equal(perm, [0, 2, 4, 6, 1, 3, 5, 7])
    x = rng.standard_normal((5, 8))
    p = np.arange(5.0)
    np.testing.assert_allclose(
        ref.apply_rope(x[:, perm], p, layout="half"),
        ref.apply_rope(x, p, layout="interleaved")[:, perm],
        rtol=0,
        atol=TOL,
    )


def test_ntk_scaled_base_by_hand():
    # base * factor^(Dh/(Dh-2)): Dh=4, factor 2 -> 4 base; Dh=6, factor 8 -> 8^1.5 = 16 sqrt 2
    assert ref.ntk_scaled_base(10000.0, 2.0, 4) == pytest.approx(40000.0, rel=1e-14)
    assert ref.ntk_scaled_base(10000.0, 8.0, 6) == pytest.approx(
        10000 * 16 * math.sqrt(2), rel=1e-14
    )
    assert ref.ntk_scaled_base(500000.0, 1.0, 128) == pytest.approx(500000.0, rel=1e-14)


def test_ntk_base_divides_the_slowest_frequency_by_the_factor():
    b = ref.ntk_scaled_base(10000.0, 8.0, 64)
    np.testing.assert_allclose(
        ref.rope_frequencies(64, base=b)[-1], ref.rope_frequencies(64)[-1] / 8, rtol=1e-13
    )
    np.testing.assert_allclose(
        ref.rope_frequencies(64, base=b)[0], 1.0, rtol=0, atol=0
    )  # the fastest: unchanged


# --- ALiBi ---------------------------------------------------------------------------------------


def test_alibi_slopes_8_heads_are_the_papers():
    np.testing.assert_array_equal(
        ref.alibi_slopes(8), [1 / 2, 1 / 4, 1 / 8, 1 / 16, 1 / 32, 1 / 64, 1 / 128, 1 / 256]
    )


def test_alibi_slopes_non_powers_of_two_by_hand():
    # 6 heads: the 4-head slopes 2^-2 .. 2^-8, then the 1st and 3rd of the 8-head slopes
    np.testing.assert_allclose(
        ref.alibi_slopes(6), [1 / 4, 1 / 16, 1 / 64, 1 / 256, 1 / 2, 1 / 8], rtol=1e-15, atol=0
    )
    # 12 heads: the 8-head slopes, then the 1st, 3rd, 5th, 7th of the 16-head slopes 2^-0.5 k
    expected = [2.0**-k for k in range(1, 9)] + [2.0**-0.5, 2.0**-1.5, 2.0**-2.5, 2.0**-3.5]
    np.testing.assert_allclose(ref.alibi_slopes(12), expected, rtol=1e-15, atol=0)
    np.testing.assert_allclose(ref.alibi_slopes(1), [1 / 256], rtol=0, atol=0)


def test_alibi_bias_by_hand():
    bias = ref.alibi_bias(
        np.array([0.5, 0.25]), np.array([2.0, 3.0]), np.array([0.0, 1.0, 2.0, 3.0])
    )
    expected = -np.array([0.5, 0.25])[:, None, None] * np.array([[2, 1, 0, -1], [3, 2, 1, 0]])[None]
    np.testing.assert_allclose(bias, expected, rtol=0, atol=0)


# --- torch against the reference -----------------------------------------------------------------


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().cpu().numpy()


def test_torch_sinusoids_equal_ref():
    from selfattn import positions as P

    np.testing.assert_allclose(
        _np(P.sinusoidal_encoding(3000, 32, start=5, dtype=torch.float64)),
        ref.sinusoidal_encoding(3000, 32, start=5),
        rtol=0,
        atol=TOL,
    )
    for k in (-1000, -3, 0, 2, 999):
        np.testing.assert_allclose(
            _np(P.sinusoidal_shift_matrix(k, 32)),
            ref.sinusoidal_shift_matrix(k, 32),
            rtol=0,
            atol=TOL,
        )


@pytest.mark.parametrize("layout", ["half", "interleaved"])
@pytest.mark.parametrize(
    ("base", "interpolation"), [(10000.0, 1.0), (500000.0, 1.0), (10000.0, 2.5)]
)
def test_torch_apply_rope_equals_ref(rng, layout, base, interpolation):
    from selfattn import positions as P

    x = rng.standard_normal((2, 3, 9, 16))  # (B, H, T, Dh)
    positions = np.array([0, 1, 2, 3, 10, 100, 1000, 2500, 4095])
    got = P.apply_rope(
        torch.from_numpy(x),
        torch.from_numpy(positions),
        base=base,
        layout=layout,
        interpolation=interpolation,
    )
    expected = ref.apply_rope(x, positions, base=base, layout=layout, interpolation=interpolation)
    assert got.dtype == torch.float64
    np.testing.assert_allclose(_np(got), expected, rtol=0, atol=TOL)


def test_torch_small_functions_equal_ref():
    from selfattn import positions as P

    np.testing.assert_allclose(
        _np(P.rope_frequencies(64, base=500000.0)),
        ref.rope_frequencies(64, base=500000.0),
        rtol=1e-14,
        atol=0,
    )
    np.testing.assert_array_equal(
        _np(P.rope_interleaved_to_half(12)), ref.rope_interleaved_to_half(12)
    )
    for args in [(10000.0, 4.0, 64), (500000.0, 8.0, 128), (10000.0, 1.0, 16)]:
        assert P.ntk_scaled_base(*args) == pytest.approx(ref.ntk_scaled_base(*args), rel=1e-13)
    for H in range(1, 65):
        np.testing.assert_allclose(
            _np(P.alibi_slopes(H)), ref.alibi_slopes(H), rtol=1e-14, atol=0
        )  # a few ulps
    slopes = ref.alibi_slopes(6)
    q, k = np.arange(3, 8), np.arange(8)
    np.testing.assert_allclose(
        _np(P.alibi_bias(torch.from_numpy(slopes), q, k)),
        ref.alibi_bias(slopes, q, k),
        rtol=0,
        atol=TOL,
    )


# --- errors --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda: ref.sinusoidal_encoding(0, 4), ValueError, "n_positions"),
        (lambda: ref.sinusoidal_encoding(3.0, 4), TypeError, "n_positions"),
        (lambda: ref.sinusoidal_encoding(3, 5), ValueError, "d_model must be even"),
        (lambda: ref.sinusoidal_encoding(3, 4, base=1.0), ValueError, "base"),
        (lambda: ref.sinusoidal_encoding(3, 4, base="big"), TypeError, "base"),
        (lambda: ref.sinusoidal_encoding(3, 4, start=-1), ValueError, "start"),
        (lambda: ref.sinusoidal_shift_matrix(1.5, 4), TypeError, "offset"),
        (lambda: ref.sinusoidal_shift_matrix(1, 3), ValueError, "d_model"),
        (lambda: ref.rope_frequencies(7), ValueError, "d_head must be even"),
        (lambda: ref.rope_frequencies(8, base=float("inf")), ValueError, "base"),
        (lambda: ref.rope_rotation_matrix(1, 8, layout="gptj"), ValueError, "layout"),
        (lambda: ref.rope_rotation_matrix(float("nan"), 8), ValueError, "position"),
        (lambda: ref.rope_rotation_matrix(1, 8, interpolation=0.5), ValueError, "interpolation"),
        (lambda: ref.apply_rope(np.ones((3, 5)), np.arange(3)), ValueError, "Dh must be even"),
        (lambda: ref.apply_rope(np.ones(4), np.arange(1)), ValueError, "at least 2 dims"),
        (
            lambda: ref.apply_rope(np.ones((3, 4)), np.arange(4)),
            ValueError,
            r"positions must have shape \(T,\) = \(3,\)",
        ),
        (
            lambda: ref.apply_rope(np.ones((3, 4)), np.zeros((3, 1))),
            ValueError,
            "positions must have shape",
        ),
        (
            lambda: ref.apply_rope(np.ones((3, 4)), np.arange(3), layout="Half"),
            ValueError,
            "layout",
        ),
        (
            lambda: ref.apply_rope(np.ones((3, 4)), np.arange(3), interpolation=0.9),
            ValueError,
            "interpolation",
        ),
        (
            lambda: ref.apply_rope(np.ones((3, 4)), np.arange(3), interpolation=True),
            TypeError,
            "interpolation",
        ),
        (
            lambda: ref.apply_rope(torch.ones(3, 4), np.arange(3)),
            TypeError,
            "x must be a NumPy array",
        ),
        (lambda: ref.apply_rope(np.ones((3, 4)), ["a", "b", "c"]), TypeError, "positions"),
        (
            lambda: ref.apply_rope(np.ones((2, 4)), [0.0, np.inf]),
            ValueError,
            "positions must be finite",
        ),
        (lambda: ref.rope_interleaved_to_half(0), ValueError, "d_head"),
        (lambda: ref.ntk_scaled_base(10000.0, 0.5, 64), ValueError, "factor"),
        (lambda: ref.ntk_scaled_base(10000.0, 2.0, 2), ValueError, "d_head must be > 2"),
        (lambda: ref.ntk_scaled_base(0.5, 2.0, 64), ValueError, "base"),
        (lambda: ref.alibi_slopes(0), ValueError, "n_heads"),
        # an empty feature axis names x (it raised "d_head must be > 0", an argument the caller did not pass)
        (lambda: ref.apply_rope(np.zeros((3, 0)), np.arange(3.0)), ValueError,
         r"^x's last axis Dh must be even and > 0 .*got shape \(3, 0\)"),
        (lambda: ref.alibi_slopes(2.0), TypeError, "n_heads"),
        (
            lambda: ref.alibi_bias(np.ones((2, 2)), np.arange(3), np.arange(3)),
            ValueError,
            "slopes must have shape",
        ),
        (
            lambda: ref.alibi_bias(np.ones(2), np.zeros((3, 1)), np.arange(3)),
            ValueError,
            "q_positions",
        ),
        (
            lambda: ref.alibi_bias(np.ones(2), np.arange(3), np.zeros((3, 1))),
            ValueError,
            "k_positions",
        ),
    ],
)
def test_ref_errors_name_the_argument(call, error, match):
    with pytest.raises(error, match=match):
        call()


def test_ref_is_exported_and_documented():
    for name in rp.__all__:
        assert getattr(ref, name) is getattr(rp, name)
        doc = getattr(rp, name).__doc__
        assert "chapter 08" in doc and "Source:" in doc and "Raises:" in doc, name


def test_ref_alibi_slopes_refuses_more_heads_than_the_torch_paths_bound():
    # Regression: the torch alibi_slopes gained a bound of 2**16 heads (issue 31 item 9); the reference had
    # none, and 2**26 heads built and returned a 512 MiB array (2**22 took 1.6 s here).
    with pytest.raises(ValueError, match=r"n_heads must be at most ALIBI_MAX_HEADS = 65536.*got 67108864"):
        ref.alibi_slopes(2**26)
    with pytest.raises(ValueError, match=r"got 65537"):
        ref.alibi_slopes(65537)
    top = ref.alibi_slopes(65536)  # the bound itself: the paper's sequence 2^(-8 h / H), the last slope 2^-8
    assert top.shape == (65536,)
    # r * r**h, a power of a number rounded once: the last slope within 1e-11 relative of 2^-8
    np.testing.assert_allclose(top[[0, -1]], [2.0 ** (-8.0 / 65536), 2.0 ** -8], rtol=1e-11, atol=0)
