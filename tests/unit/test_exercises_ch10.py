"""Exercise checks of chapter 10: the reference solutions pass, typical mistakes get the right words."""

import numpy as np
import torch

from selfattn.exercises import ch10


def solution_merge(m1, l1, m2, l2):
    m = np.maximum(m1, m2)
    shift = np.where(np.isfinite(m), m, 0.0)  # a row that has seen nothing: avoid -inf - -inf
    return m, l1 * np.exp(m1 - shift) + l2 * np.exp(m2 - shift)


def solution_online(q, k, v, block_size):
    m, l = np.full(q.shape[0], -np.inf), np.zeros(q.shape[0])
    acc = np.zeros((q.shape[0], v.shape[1]))
    for start in range(0, k.shape[0], block_size):
        s = q @ k[start:start + block_size].T / np.sqrt(q.shape[1])
        m_new = np.maximum(m, s.max(axis=-1))
        p = np.exp(s - m_new[:, None])
        correction = np.exp(m - m_new)
        l = l * correction + p.sum(axis=-1)
        acc = acc * correction[:, None] + p @ v[start:start + block_size]
        m = m_new
    return acc / l[:, None]


def test_merge_solution_passes():
    assert ch10.check_merge_states(solution_merge)


def test_merge_without_rescaling_is_caught():
    feedback = ch10.check_merge_states(lambda m1, l1, m2, l2: (np.maximum(m1, m2), l1 + l2))
    assert not feedback and "without rescaling" in feedback.message


def test_merge_nan_for_empty_block_is_caught():
    def naive_shift(m1, l1, m2, l2):
        m = np.maximum(m1, m2)
        with np.errstate(invalid="ignore"):
            return m, l1 * np.exp(m1 - m) + l2 * np.exp(m2 - m)  # -inf - -inf = nan for an empty row

    def upside_down(m1, l1, m2, l2):
        m = np.maximum(m1, m2)
        with np.errstate(over="ignore", invalid="ignore"):
            return m, l1 * np.exp(m - m1) + l2 * np.exp(m - m2)

    for fn in (naive_shift, upside_down):
        feedback = ch10.check_merge_states(fn)
        assert not feedback and "NaN or inf" in feedback.message, feedback.message


def test_merge_wrong_max_and_wrong_type():
    feedback = ch10.check_merge_states(lambda m1, l1, m2, l2: (m1 + m2, l1))
    assert not feedback and "maximum m is wrong" in feedback.message
    feedback = ch10.check_merge_states(lambda m1, l1, m2, l2: m1)
    assert not feedback and "pair" in feedback.message


def test_online_solution_passes():
    assert ch10.check_online_attention(solution_online)


def test_online_mistakes_are_named():
    def no_rescale(q, k, v, b):
        m, l, acc = np.full(q.shape[0], -np.inf), np.zeros(q.shape[0]), np.zeros((q.shape[0], v.shape[1]))
        for start in range(0, k.shape[0], b):
            s = q @ k[start:start + b].T / np.sqrt(q.shape[1])
            m = np.maximum(m, s.max(-1))
            p = np.exp(s - m[:, None])
            l, acc = l + p.sum(-1), acc + p @ v[start:start + b]
        return acc / l[:, None]

    def drop_last(q, k, v, b):
        n = (k.shape[0] // b) * b
        return solution_online(q, k[:n], v[:n], b)

    def per_block(q, k, v, b):
        outs = []
        for start in range(0, k.shape[0], b):
            s = q @ k[start:start + b].T / np.sqrt(q.shape[1])
            w = np.exp(s - s.max(-1, keepdims=True))
            outs.append(w / w.sum(-1, keepdims=True) @ v[start:start + b])
        return np.mean(outs, axis=0)

    for fn, words in ((no_rescale, "exp(m_old - m_new)"), (drop_last, "last block"), (per_block, "normalised each")):
        feedback = ch10.check_online_attention(fn)
        assert not feedback and words in feedback.message, (fn.__name__, feedback.message)


def test_online_not_attempted():
    def stub(q, k, v, b):
        raise NotImplementedError

    assert not ch10.check_online_attention(stub).attempted


def test_merge_nan_on_both_empty_rows_says_use_shift_zero():
    """The textbook merge gives NaN only where both maxima are -inf: the feedback must say what to do
    there (shift by 0), not repeat exp(m_i - m), which the learner already did."""

    def textbook(m1, l1, m2, l2):
        m = np.maximum(m1, m2)
        with np.errstate(invalid="ignore"):
            return m, l1 * np.exp(m1 - m) + l2 * np.exp(m2 - m)

    feedback = ch10.check_merge_states(textbook)
    assert not feedback, feedback.message
    assert "both maxima are -inf" in feedback.message and "shift of 0" in feedback.message, feedback.message
    assert "never" not in feedback.message, feedback.message


def test_online_attention_accepts_float32_and_says_close():
    def float32(q, k, v, block_size):  # right, but in float32: off by ~1e-7
        q, k, v = (torch.from_numpy(x).float() for x in (q, k, v))
        return torch.softmax(q @ k.T / q.shape[-1] ** 0.5, dim=-1) @ v  # (T, Dh) @ (Dh, S) @ (S, Dv)

    def with_eps(q, k, v, block_size):  # an epsilon in the final division: off by ~1e-4
        return solution_online(q, k, v, block_size) * (1 - 1e-4)

    assert ch10.check_online_attention(float32)
    feedback = ch10.check_online_attention(with_eps)
    assert not feedback and "Close" in feedback.message and "1e-05" in feedback.message, feedback.message


def test_online_attention_refuses_an_answer_that_builds_all_the_scores():
    # Regression: plain full-softmax attention passed 9.2 and was praised for "never holding a whole
    # row of scores".
    def full(q, k, v, block_size):
        s = q @ k.T / np.sqrt(q.shape[1])
        e = np.exp(s - s.max(1, keepdims=True))
        return e / e.sum(1, keepdims=True) @ v

    feedback = ch10.check_online_attention(full)
    assert not feedback and "not online" in feedback.message and "MiB" in feedback.message

    def copies_then_online(q, k, v, block_size):  # copying the inputs is not holding the scores
        return solution_online(q.copy(), k.copy(), v.copy(), block_size)

    assert ch10.check_online_attention(copies_then_online)
    import tracemalloc  # a caller's own tracing is left running

    tracemalloc.start()
    try:
        assert not ch10.check_online_attention(full)
        assert tracemalloc.is_tracing()
    finally:
        tracemalloc.stop()
