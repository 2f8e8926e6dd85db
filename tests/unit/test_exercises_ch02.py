"""Chapter 02's checks accept the reference solutions and explain typical mistakes."""

from __future__ import annotations

import math

import numpy as np
import torch

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


# 2.3 stable log-softmax and 2.4 cross-entropy


def _log_softmax(x, axis=-1):
    m = x.max(axis=axis, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=axis, keepdims=True))


def test_log_softmax_solutions_pass():
    assert ch02.check_log_softmax(_log_softmax)
    assert ch02.check_log_softmax(lambda x: torch.log_softmax(torch.from_numpy(x), dim=-1))


def test_log_softmax_names_each_mistake():
    cases = [
        (lambda x: np.log(np.exp(x) / np.exp(x).sum(-1, keepdims=True)), "underflows"),
        (lambda x: _log_softmax(x, axis=0), "axis 0"),
        (lambda x: x - x.max(-1, keepdims=True), "but not log(sum(exp(x - m)))"),
        (lambda x: x - np.log(np.exp(x - x.max(-1, keepdims=True)).sum(-1, keepdims=True)), "forgot to subtract m"),
        (lambda x: -_log_softmax(x), "sign is flipped"),
    ]
    for wrong, words in cases:
        with np.errstate(all="ignore"):
            fb = ch02.check_log_softmax(wrong)
        assert not fb and fb.attempted and words in fb.message, (words, fb.message)


def test_log_softmax_shape_type_stub():
    assert not ch02.check_log_softmax(lambda x: (_ for _ in ()).throw(NotImplementedError)).attempted
    fb = ch02.check_log_softmax(lambda x: _log_softmax(x)[0])
    assert not fb and "shape" in fb.message
    fb = ch02.check_log_softmax(lambda x: "x")
    assert not fb and "array or tensor" in fb.message


def _cross_entropy(logits, y):
    return -_log_softmax(logits)[np.arange(len(y)), y].mean()


def test_cross_entropy_solutions_pass():
    assert ch02.check_cross_entropy(_cross_entropy)
    assert ch02.check_cross_entropy(lambda z, y: torch.nn.functional.cross_entropy(torch.from_numpy(z), torch.from_numpy(y)))


def test_cross_entropy_names_each_mistake():
    n = np.arange
    cases = [
        (lambda z, y: -_log_softmax(z)[n(len(y)), y], "one loss per example"),
        (lambda z, y: np.log(np.exp(z) / np.exp(z).sum(-1, keepdims=True))[n(len(y)), y].mean() * -1, "underflows"),
        (lambda z, y: _log_softmax(z)[n(len(y)), y].mean(), "sign is missing"),
        (lambda z, y: -_log_softmax(z)[n(len(y)), y].sum(), "summed over the examples"),
        (lambda z, y: -np.exp(_log_softmax(z))[n(len(y)), y].mean(), "averaged the probabilities"),
        (lambda z, y: -_log_softmax(z).mean(), "every class"),
        (lambda z, y: -z[n(len(y)), y].mean(), "raw logits"),
    ]
    for wrong, words in cases:
        with np.errstate(all="ignore"):
            fb = ch02.check_cross_entropy(wrong)
        assert not fb and fb.attempted and words in fb.message, (words, fb.message)


def test_cross_entropy_shape_and_crash():
    fb = ch02.check_cross_entropy(lambda z, y: _log_softmax(z))
    assert not fb and "shape" in fb.message
    fb = ch02.check_cross_entropy(lambda z, y: z[y.astype(float)])
    assert not fb and "raised IndexError" in fb.message


def test_stable_softmax_names_division_without_exp_negative_weights_and_leading_axes():
    """Three named mistakes the other tests did not reach (issue 27: every named wrong answer is tested)."""
    fb = ch02.check_stable_softmax(lambda x: x / x.sum(axis=-1, keepdims=True))
    assert not fb.ok and "without exp" in fb.message, fb.message

    def negative(x):  # rows still sum to 1, but a weight is pushed below 0
        w = stable_softmax(x)
        d = np.zeros_like(w)
        d[..., 0], d[..., 1] = -2.0, 2.0
        return w + d

    fb = ch02.check_stable_softmax(negative)
    assert not fb.ok and "negative" in fb.message, fb.message

    def second_axis(x):  # right for (T, S), wrong for (2, 3, 4): axis 1 is not the last one
        e = np.exp(x - x.max(axis=1, keepdims=True))
        return e / e.sum(axis=1, keepdims=True)

    fb = ch02.check_stable_softmax(second_axis)
    assert not fb.ok and "any number of leading axes" in fb.message, fb.message
