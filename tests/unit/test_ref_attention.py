"""The NumPy float64 reference: softmax, causal mask and scaled dot-product attention.

Expected values come from maths written out here or from torch's own functions, never from the
code under test.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

from selfattn import ref

TOL = 1e-12  # float64 throughout


def _qkv(rng, *lead, T=3, S=5, Dh=4, Dv=6):
    return (
        rng.standard_normal((*lead, T, Dh)),
        rng.standard_normal((*lead, S, Dh)),
        rng.standard_normal((*lead, S, Dv)),
    )


# --- softmax ---------------------------------------------------------------------------------


@pytest.mark.parametrize("axis", [-1, 0, 1])
def test_softmax_equals_torch_softmax_float64(rng, axis):
    x = rng.standard_normal((4, 5, 6)) * 5
    expected = torch.softmax(torch.from_numpy(x), dim=axis).numpy()
    np.testing.assert_allclose(ref.softmax(x, axis=axis), expected, rtol=0, atol=TOL)


def test_softmax_is_stable_for_large_inputs():
    x = np.array([1000.0, 1001.0, 1002.0])
    expected = torch.softmax(torch.tensor(x), dim=0).numpy()
    got = ref.softmax(x)
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, expected, rtol=0, atol=TOL)


def test_softmax_matches_the_formula_on_small_numbers():
    x = np.array([0.0, np.log(2.0), np.log(5.0)])  # exp -> 1, 2, 5: weights 1/8, 2/8, 5/8
    np.testing.assert_allclose(ref.softmax(x), [1 / 8, 2 / 8, 5 / 8], rtol=0, atol=TOL)


def test_softmax_mask_zeroes_masked_entries_even_nan_and_inf():
    x = np.array([[1.0, np.nan, 2.0, np.inf]])
    keep = np.array([[True, False, True, False]])
    expected = np.zeros((1, 4))
    expected[0, [0, 2]] = torch.softmax(torch.tensor([1.0, 2.0], dtype=torch.float64), 0).numpy()
    np.testing.assert_allclose(ref.softmax(x, mask=keep), expected, rtol=0, atol=TOL)


def test_softmax_fully_masked_row_is_zero():
    x = np.array([[1.0, 2.0], [3.0, 4.0]])
    keep = np.array([[False, False], [True, True]])
    got = ref.softmax(x, mask=keep)
    np.testing.assert_array_equal(got[0], [0.0, 0.0])
    np.testing.assert_allclose(got[1].sum(), 1.0, rtol=0, atol=TOL)


def test_softmax_bad_inputs():
    with pytest.raises(
        TypeError, match=r"mask must be a boolean array .*got dtype float64.*bias="
    ):
        ref.softmax(np.zeros((2, 3)), mask=np.ones((2, 3)))
    with pytest.raises(TypeError, match=r"mask must be a boolean array .*got dtype int64"):
        ref.softmax(np.zeros((2, 3)), mask=np.ones((2, 3), dtype=np.int64))
    with pytest.raises(
        ValueError,
        match=re.escape("mask must broadcast to the shape of x (2, 3); got shape (2, 4)"),
    ):
        ref.softmax(np.zeros((2, 3)), mask=np.ones((2, 4), dtype=bool))
    with pytest.raises(TypeError, match=r"x must be a NumPy array"):
        ref.softmax(torch.zeros(3))
    with pytest.raises(TypeError, match=r"x must hold real numbers; got dtype bool"):
        ref.softmax(np.array([True]))


# --- causal_mask -----------------------------------------------------------------------------


@pytest.mark.parametrize("T", [1, 2, 5])
def test_causal_mask_square_is_lower_triangular_with_diagonal(T):
    expected = np.tril(np.ones((T, T), dtype=bool))
    got = ref.causal_mask(T)
    assert got.dtype == bool
    np.testing.assert_array_equal(got, expected)
    assert got.diagonal().all()  # every token sees itself


@pytest.mark.parametrize(("T", "S"), [(3, 5), (5, 3), (1, 4)])
def test_causal_mask_alignments(T, S):
    np.testing.assert_array_equal(
        ref.causal_mask(T, S, alignment="top_left"), np.tril(np.ones((T, S), dtype=bool))
    )
    np.testing.assert_array_equal(
        ref.causal_mask(T, S, alignment="bottom_right"),
        np.tril(np.ones((T, S), dtype=bool), k=S - T),
    )


def test_causal_mask_bad_inputs():
    with pytest.raises(ValueError, match=r"T=3 queries and S=5 keys needs an explicit alignment"):
        ref.causal_mask(3, 5)
    with pytest.raises(
        ValueError,
        match=r"alignment must be one of \('top_left', 'bottom_right'\) or None; got 'bottom'",
    ):
        ref.causal_mask(3, 5, alignment="bottom")
    with pytest.raises(ValueError, match=r"T must be > 0; got 0"):
        ref.causal_mask(0)
    with pytest.raises(TypeError, match=r"S must be a positive int; got 2.5"):
        ref.causal_mask(2, 2.5, alignment="top_left")


# --- scaled_dot_product_attention ------------------------------------------------------------


def _attention_by_formula(q, k, v, keep=None, scale=None):
    """softmax(q k^T / sqrt(Dh)) v written with torch.softmax in float64, a second oracle."""
    qt, kt, vt = (torch.from_numpy(a) for a in (q, k, v))
    scale = 1 / np.sqrt(q.shape[-1]) if scale is None else scale
    scores = qt @ kt.transpose(-2, -1) * scale
    if keep is not None:
        scores = scores.masked_fill(~torch.from_numpy(np.asarray(keep)), float("-inf"))
    return (torch.softmax(scores, dim=-1) @ vt).numpy()


def test_attention_equals_formula(rng):
    q, k, v = _qkv(rng, 2, 3)
    np.testing.assert_allclose(
        ref.scaled_dot_product_attention(q, k, v), _attention_by_formula(q, k, v), rtol=0, atol=TOL
    )


def test_attention_with_mask_and_scale_equals_formula(rng):
    q, k, v = _qkv(rng, 2, T=4, S=4)
    keep = ref.causal_mask(4)
    got = ref.scaled_dot_product_attention(q, k, v, keep, scale=0.3)
    np.testing.assert_allclose(
        got, _attention_by_formula(q, k, v, keep, scale=0.3), rtol=0, atol=TOL
    )


def test_attention_bias_is_added_to_scores(rng):
    q, k, v = _qkv(rng, T=3, S=5)
    bias = rng.standard_normal((3, 5))
    scores = q @ k.T / 2.0 + bias  # Dh = 4: sqrt(Dh) = 2
    expected = torch.softmax(torch.from_numpy(scores), -1).numpy() @ v
    np.testing.assert_allclose(
        ref.scaled_dot_product_attention(q, k, v, bias=bias), expected, rtol=0, atol=TOL
    )


def test_attention_returns_weights_that_reproduce_the_output(rng):
    q, k, v = _qkv(rng, 2)
    context, weights = ref.scaled_dot_product_attention(q, k, v, return_weights=True)
    assert weights.shape == (2, 3, 5)
    np.testing.assert_allclose(weights.sum(-1), 1.0, rtol=0, atol=TOL)
    np.testing.assert_allclose(context, weights @ v, rtol=0, atol=TOL)


def test_attention_fully_masked_row_is_zero(rng):
    q, k, v = _qkv(rng)
    keep = np.ones((3, 5), dtype=bool)
    keep[1] = False
    context, weights = ref.scaled_dot_product_attention(q, k, v, keep, return_weights=True)
    np.testing.assert_array_equal(weights[1], 0.0)
    np.testing.assert_array_equal(context[1], 0.0)
    assert np.isfinite(context).all()


def test_attention_ignores_nan_and_inf_at_masked_positions(rng):
    q, k, v = _qkv(rng)
    keep = np.ones((3, 5), dtype=bool)
    keep[:, 3:] = False  # keys 3 and 4 are padding
    expected = _attention_by_formula(q, k[:3], v[:3])
    for bad in (np.nan, np.inf, -np.inf):
        k_bad, v_bad = k.copy(), v.copy()
        k_bad[3:] = bad
        v_bad[3:] = bad
        got = ref.scaled_dot_product_attention(q, k_bad, v_bad, keep)
        np.testing.assert_allclose(got, expected, rtol=0, atol=TOL)


def test_attention_ignores_nan_value_at_a_position_masked_for_some_queries(rng):
    q, k, v = _qkv(rng, T=4, S=4)
    keep = ref.causal_mask(4)
    v_bad = v.copy()
    v_bad[3] = np.nan  # only the last query may read position 3
    got = ref.scaled_dot_product_attention(q, k, v_bad, keep)
    expected = _attention_by_formula(q, k, v, keep)
    np.testing.assert_allclose(got[:3], expected[:3], rtol=0, atol=TOL)
    assert np.isnan(got[3]).all()  # the query that may read it does see it


def test_attention_accepts_lists_and_ints():
    got = ref.scaled_dot_product_attention([[1, 0]], [[1, 0], [0, 1]], [[1, 2], [3, 4]])
    w = np.exp([1 / np.sqrt(2), 0.0])
    w /= w.sum()
    np.testing.assert_allclose(got, [w @ np.array([[1.0, 2.0], [3.0, 4.0]])], rtol=0, atol=TOL)


def test_attention_bad_inputs(rng):
    q, k, v = _qkv(rng, 2, T=3, S=5, Dh=4, Dv=6)
    with pytest.raises(
        ValueError,
        match=re.escape("q must have shape (..., T, Dh) (at least 2 dims); got shape (4,)"),
    ):
        ref.scaled_dot_product_attention(q[0, 0], k, v)
    with pytest.raises(
        ValueError, match=re.escape("same last dim d_head; got q (2, 3, 4) and k (2, 5, 3)")
    ):
        ref.scaled_dot_product_attention(q, k[..., :3], v)
    with pytest.raises(ValueError, match=re.escape("got k (2, 5, 4) and v (2, 4, 6)")):
        ref.scaled_dot_product_attention(q, k, v[:, :4])
    with pytest.raises(TypeError, match=r"mask must be a boolean array .*float64.*bias="):
        ref.scaled_dot_product_attention(q, k, v, np.ones((3, 5)))
    with pytest.raises(
        ValueError,
        match=re.escape("mask must broadcast to (..., T, S) = (2, 3, 5); got shape (3, 4)"),
    ):
        ref.scaled_dot_product_attention(q, k, v, np.ones((3, 4), dtype=bool))
    with pytest.raises(
        ValueError,
        match=re.escape("mask must have shape (..., T, S) (at least 2 dims); got shape (5,)"),
    ):
        ref.scaled_dot_product_attention(q, k, v, np.ones(5, dtype=bool))
    with pytest.raises(
        ValueError,
        match=re.escape("bias must broadcast to (..., T, S) = (2, 3, 5); got shape (5, 3)"),
    ):
        ref.scaled_dot_product_attention(q, k, v, bias=np.zeros((5, 3)))
    with pytest.raises(ValueError, match=r"scale must be a finite number > 0 or None.*got -1\.0"):
        ref.scaled_dot_product_attention(q, k, v, scale=-1.0)
    with pytest.raises(ValueError, match=r"scale must be a finite number > 0 or None.*got 0"):
        ref.scaled_dot_product_attention(q, k, v, scale=0)
    with pytest.raises(TypeError, match=r"q must be a NumPy array"):
        ref.scaled_dot_product_attention(torch.from_numpy(q), k, v)


def test_softmax_propagates_nan_instead_of_returning_a_zero_row():
    # Regression: a NaN among visible scores gave a silent all-zero row.
    out = ref.softmax(np.array([[np.nan, 0.0], [1.0, 2.0]]))
    assert np.isnan(out[0]).all()
    np.testing.assert_allclose(out[1], [1 / (1 + np.e), np.e / (1 + np.e)], rtol=1e-12)
    masked = ref.softmax(np.array([np.nan, 0.0]), mask=np.array([False, True]))
    np.testing.assert_allclose(masked, [0.0, 1.0], rtol=0, atol=0)


def test_a_python_list_mask_is_accepted_like_the_array():
    # Regression: a list of bools raised AttributeError ('list' object has no attribute 'dtype').
    rng = np.random.default_rng(11)
    q, k, v = rng.normal(size=(2, 3, 4)), rng.normal(size=(2, 3, 4)), rng.normal(size=(2, 3, 2))
    keep = [[True, False, False], [True, True, False], [True, True, True]]
    np.testing.assert_allclose(
        ref.scaled_dot_product_attention(q, k, v, keep),
        ref.scaled_dot_product_attention(q, k, v, np.array(keep)), rtol=0, atol=0,
    )
    with pytest.raises(TypeError, match="mask must be a boolean array .*got dtype int"):
        ref.scaled_dot_product_attention(q, k, v, [[1, 0, 0], [1, 1, 0], [1, 1, 1]])


def test_softmax_of_an_empty_array_is_empty_not_a_numpy_error():
    # Regression: ref.softmax(np.zeros((2, 0))) raised "zero-size array to reduction operation maximum".
    out = ref.softmax(np.zeros((2, 0)))
    assert out.shape == (2, 0) and out.dtype == np.float64


def test_an_integer_mask_error_gives_the_numpy_fix():
    # Regression: the NumPy reference's message advised mask.bool(), a torch method.
    q = np.ones((5, 4))
    with pytest.raises(TypeError, match=r"mask.astype\(bool\) \(NumPy\)"):
        ref.scaled_dot_product_attention(q, np.ones((7, 4)), np.ones((7, 4)), mask=np.ones((5, 7), dtype=int))


@pytest.mark.parametrize("axis", ["a", 1.0, None, True, np.float64(0.0)])
def test_softmax_refuses_an_axis_that_is_not_an_int(axis):
    # Regression: a non-integer axis raised NumPy's "'str' object cannot be interpreted as an integer".
    with pytest.raises(TypeError, match=rf"axis must be an int .*got {re.escape(repr(axis))}"):
        ref.softmax(np.zeros((2, 3)), axis=axis)


@pytest.mark.parametrize("axis", [2, -3])
def test_softmax_refuses_an_axis_out_of_range_even_for_an_empty_array(axis):
    for x in (np.zeros((2, 3)), np.zeros((2, 0))):
        with pytest.raises(ValueError, match=rf"axis must be in \[-2, 2\) for x of shape {re.escape(str(x.shape))}; got {axis}"):
            ref.softmax(x, axis=axis)


def test_softmax_of_an_empty_axis_is_empty_like_torch():
    # ref.softmax and selfattn.masked_softmax agree on an empty last axis (the torch side is tested
    # in test_attention.py): an empty result of the input's shape, as torch.softmax.
    got = ref.softmax(np.zeros((2, 3, 0)), axis=-1)
    assert got.shape == (2, 3, 0) and got.dtype == np.float64
    assert got.shape == tuple(torch.softmax(torch.zeros(2, 3, 0), dim=-1).shape)
