"""Chapter 02's checks accept the reference solutions and explain typical mistakes."""

from __future__ import annotations

import math

import numpy as np

from selfattn.exercises import ch02


def stable_softmax(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def test_stable_softmax_accepts_the_solution():
    fb = ch02.check_stable_softmax(stable_softmax)
    assert fb.ok and fb.attempted


def test_stable_softmax_catches_overflow():
    def naive(x):
        e = np.exp(x)
        return e / e.sum(axis=-1, keepdims=True)

    fb = ch02.check_stable_softmax(naive)
    assert not fb.ok and "overflows" in fb.message and "maximum" in fb.message


def test_stable_softmax_catches_the_wrong_axis():
    def columns(x):
        e = np.exp(x - x.max(axis=0, keepdims=True))
        return e / e.sum(axis=0, keepdims=True)

    fb = ch02.check_stable_softmax(columns)
    assert not fb.ok and "the rows do not sum to one" in fb.message


def test_stable_softmax_catches_a_missing_division():
    fb = ch02.check_stable_softmax(lambda x: np.exp(x - x.max(axis=-1, keepdims=True)))
    assert not fb.ok and "did not divide" in fb.message


def test_stable_softmax_catches_a_global_maximum():
    # subtracting one global max (not per row) underflows rows far below it: 0 / 0 = NaN
    def global_max(x):
        e = np.exp(x - x.max())
        return e / e.sum(axis=-1, keepdims=True)

    fb = ch02.check_stable_softmax(global_max)
    assert not fb.ok and "NaN" in fb.message


def test_stable_softmax_not_attempted():
    def stub(x):
        raise NotImplementedError

    fb = ch02.check_stable_softmax(stub)
    assert not fb.ok and not fb.attempted


def scaled_scores(Q, K, d_model):
    return Q @ K.T / math.sqrt(Q.shape[-1])


def test_scaled_scores_accepts_the_solution():
    assert ch02.check_scaled_scores(scaled_scores)


def test_scaled_scores_catches_d_model():
    fb = ch02.check_scaled_scores(lambda Q, K, d_model: Q @ K.T / math.sqrt(d_model))
    assert not fb.ok and "you scaled by sqrt(d_model), not sqrt(d_head)" in fb.message.lower()


def test_scaled_scores_catches_no_scaling_and_no_square_root():
    fb = ch02.check_scaled_scores(lambda Q, K, d_model: Q @ K.T)
    assert not fb.ok and "unscaled" in fb.message
    fb = ch02.check_scaled_scores(lambda Q, K, d_model: Q @ K.T / Q.shape[-1])
    assert not fb.ok and "square root" in fb.message


def test_scaled_scores_catches_transposed_scores():
    fb = ch02.check_scaled_scores(lambda Q, K, d_model: K @ Q.T / math.sqrt(Q.shape[-1]))
    assert not fb.ok and "one row per key" in fb.message


def test_stable_softmax_rejects_wrong_values():
    fb = ch02.check_stable_softmax(lambda x: stable_softmax(x)[..., ::-1])  # rows sum to one, values misplaced
    assert not fb.ok and "wrong values" in fb.message


def test_scaled_scores_rejects_wrong_values():
    fb = ch02.check_scaled_scores(lambda Q, K, d_model: Q @ K.T / 3.0)
    assert not fb.ok and "wrong values" in fb.message


def test_stable_softmax_names_a_low_precision_dtype_instead_of_blaming_the_row_sums():
    # Regression: a correct softmax returned as float16 got "The rows do not sum to one (row sums
    # [1.0002, ...])", which points at the maths instead of the dtype.
    for dtype in (np.float16, np.float32):
        fb = ch02.check_stable_softmax(lambda x, dtype=dtype: stable_softmax(x).astype(dtype))
        assert not fb.ok and f"you returned {np.dtype(dtype).name}" in fb.message, fb.message
        assert "compute and return float64" in fb.message
    fb = ch02.check_stable_softmax(lambda x: np.exp(x).astype(np.float16))  # wrong maths stays wrong maths
    assert not fb.ok and "you returned" not in fb.message
