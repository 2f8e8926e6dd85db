"""selfattn.ref.online: the online softmax and blockwise attention equal the plain reference."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from selfattn import ref
from selfattn.ref import online


def test_online_softmax_equals_softmax_for_every_block_size():
    x = np.random.default_rng(0).normal(size=(4, 13)) * 7
    for block_size in (1, 2, 5, 13, 20):
        np.testing.assert_allclose(online.online_softmax(x, block_size), ref.softmax(x), rtol=0, atol=1e-15)


@settings(max_examples=60, deadline=None)
@given(arrays(np.float64, st.tuples(st.integers(1, 4), st.integers(1, 12)),
              elements=st.floats(-1e4, 1e4)), st.integers(1, 7))
def test_online_softmax_property(x, block_size):
    got = online.online_softmax(x, block_size)
    np.testing.assert_allclose(got, ref.softmax(x), rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(got.sum(axis=-1), 1.0, rtol=1e-12)


def test_online_softmax_along_other_axis():
    x = np.random.default_rng(1).normal(size=(6, 3))
    np.testing.assert_allclose(online.online_softmax(x, 4, axis=0), ref.softmax(x, axis=0), atol=1e-15)


def test_update_rescales_old_sum_when_max_grows():
    state = online.OnlineSoftmaxState((1,))
    online.online_softmax_update(state, np.array([[0.0, 1.0]]))
    correction = online.online_softmax_update(state, np.array([[3.0]]))
    # by hand: m goes 1 -> 3, so the old sum e^-1 + e^0 is multiplied by e^(1-3)
    np.testing.assert_allclose(correction, [np.exp(-2.0)], rtol=1e-15)
    np.testing.assert_allclose(state.m, [3.0])
    np.testing.assert_allclose(state.l, [np.exp(-3.0) + np.exp(-2.0) + 1.0], rtol=1e-15)


def test_all_minus_inf_row_gives_zeros_and_lse_minus_inf():
    x = np.array([[-np.inf, -np.inf, -np.inf], [0.0, -np.inf, 1.0]])
    got = online.online_softmax(x, 2)
    np.testing.assert_array_equal(got[0], 0.0)
    np.testing.assert_allclose(got[1], ref.softmax(x[1]), atol=1e-15)
    lse = online.logsumexp(x)
    assert lse[0] == -np.inf
    np.testing.assert_allclose(lse[1], np.log(1 + np.e), rtol=1e-15)


def test_logsumexp_huge_values_do_not_overflow():
    x = np.array([1e4, 1e4 - 1.0, -1e4])
    np.testing.assert_allclose(online.logsumexp(x), 1e4 + np.log1p(np.exp(-1.0)), rtol=1e-15)


@pytest.mark.parametrize("T,S,block_size", [(5, 7, 3), (8, 8, 8), (3, 10, 1), (6, 4, 5)])
def test_online_attention_equals_reference_with_lse(T, S, block_size):
    rng = np.random.default_rng(T * S)
    q, k, v = rng.normal(size=(2, T, 4)), rng.normal(size=(2, S, 4)), rng.normal(size=(2, S, 3))
    mask = ref.causal_mask(T, S, alignment="bottom_right")
    context, lse = online.online_attention(q, k, v, block_size, mask=mask, return_lse=True)
    np.testing.assert_allclose(context, ref.scaled_dot_product_attention(q, k, v, mask), atol=1e-13)
    scores = np.where(mask, q @ np.swapaxes(k, -1, -2) / 2.0, -np.inf)  # scale 1/sqrt(4)
    with np.errstate(divide="ignore"):  # rows that see no key: log 0 = -inf, as lse should be
        expected_lse = np.log(np.exp(scores).sum(-1))
    np.testing.assert_allclose(lse, expected_lse, rtol=1e-13)


def test_online_attention_masked_rows_and_nan_values():
    rng = np.random.default_rng(3)
    q, k, v = rng.normal(size=(3, 2)), rng.normal(size=(4, 2)), rng.normal(size=(4, 2))
    mask = np.array([[True, True, False, False], [False, False, False, False], [True, False, True, False]])
    v[3] = np.nan  # never visible: must not reach the output
    context, lse = online.online_attention(q, k, v, 2, mask=mask, return_lse=True)
    assert np.isfinite(context).all()
    np.testing.assert_array_equal(context[1], 0.0)
    assert lse[1] == -np.inf
    np.testing.assert_allclose(context, ref.scaled_dot_product_attention(q, k, v, mask), atol=1e-14)


def test_online_attention_rejects_bad_block_size():
    q = np.zeros((2, 2))
    with pytest.raises(ValueError, match="block_size"):
        online.online_attention(q, q, q, 0)
    with pytest.raises(TypeError, match="block_size"):
        online.online_softmax(q, 1.5)


@pytest.mark.parametrize("block_size", [1, 2, 3, 5])
def test_online_attention_nan_value_reaches_only_the_queries_that_may_see_it(block_size):
    # Regression: a NaN value at position 3, visible to query 3 only (causal), made every row NaN.
    rng = np.random.default_rng(5)
    q, k, v = rng.normal(size=(2, 5, 4)), rng.normal(size=(2, 5, 4)), rng.normal(size=(2, 5, 3))
    v[:, 3] = np.nan
    mask = ref.causal_mask(5)
    expected = ref.scaled_dot_product_attention(q, k, v, mask)
    assert np.isnan(expected[:, 3:]).all() and np.isfinite(expected[:, :3]).all()
    got = online.online_attention(q, k, v, block_size, mask=mask)
    np.testing.assert_allclose(got, expected, rtol=1e-13, atol=1e-14)  # NaN exactly where expected is


@pytest.mark.parametrize("block_size", [1, 2, 5])
def test_online_attention_nan_key_gives_nan_only_in_the_rows_that_see_it(block_size):
    # Regression: a visible NaN key made l NaN and `l > 0` False, so its rows were silently zero.
    rng = np.random.default_rng(6)
    q, k, v = rng.normal(size=(2, 5, 4)), rng.normal(size=(2, 5, 4)), rng.normal(size=(2, 5, 3))
    k[:, 3] = np.nan
    mask = ref.causal_mask(5)
    expected = ref.scaled_dot_product_attention(q, k, v, mask)
    assert np.isnan(expected[:, 3:]).all() and np.isfinite(expected[:, :3]).all()
    got, lse = online.online_attention(q, k, v, block_size, mask=mask, return_lse=True)
    np.testing.assert_allclose(got, expected, rtol=1e-13, atol=1e-14)
    assert np.isnan(lse[:, 3:]).all() and np.isfinite(lse[:, :3]).all()


def test_online_softmax_nan_entry_gives_a_nan_row_like_softmax():
    x = np.array([[np.nan, 0.0, 1.0], [1.0, 2.0, 3.0]])
    np.testing.assert_allclose(online.online_softmax(x, 2), ref.softmax(x), rtol=1e-15)
    assert np.isnan(online.online_softmax(x, 2)[0]).all()


def test_logsumexp_of_an_empty_slice_is_minus_infinity():
    # Regression: ref.logsumexp(np.zeros(0)) raised NumPy's "zero-size array to reduction operation".
    assert online.logsumexp(np.zeros(0)) == -np.inf
    out = online.logsumexp(np.zeros((3, 0)))
    assert out.shape == (3,) and np.all(out == -np.inf)
    assert online.logsumexp(np.zeros((0, 4))).shape == (0,)
