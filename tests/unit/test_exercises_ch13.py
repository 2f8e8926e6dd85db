"""Chapter 13's exercise checks: the reference solutions pass, typical mistakes get the right words."""

from __future__ import annotations

import numpy as np

from selfattn.exercises import ch13


def moved_norms(weights, V, W_O):
    moved = (V @ W_O).norm(dim=-1)  # (H, T, Dh) @ (H, Dh, D) -> (H, T, D) -> (H, T)
    return weights * moved[:, None, :]


def block_edge(weights, i, j):
    out = weights.copy()
    out[i, j] = 0.0
    out[i] /= out[i].sum()
    return out


def test_reference_solutions_pass():
    assert ch13.check_moved_norms(moved_norms)
    assert ch13.check_block_edge(block_edge)


def test_not_attempted_is_not_a_failure():
    def stub(*args):
        raise NotImplementedError

    for check in (ch13.check_moved_norms, ch13.check_block_edge):
        feedback = check(stub)
        assert not feedback and not feedback.attempted


def test_moved_norms_mistakes():
    no_wo = ch13.check_moved_norms(lambda w, V, W_O: w * V.norm(dim=-1)[:, None, :])
    assert not no_wo and "W_O" in no_wo.message
    squared = ch13.check_moved_norms(
        lambda w, V, W_O: w * ((V @ W_O).norm(dim=-1) ** 2)[:, None, :]
    )
    assert not squared and "squared" in squared.message
    no_weight = ch13.check_moved_norms(
        lambda w, V, W_O: (V @ W_O).norm(dim=-1)[:, None, :].expand_as(w)
    )
    assert not no_weight and "weight" in no_weight.message
    rows = ch13.check_moved_norms(lambda w, V, W_O: w * (V @ W_O).norm(dim=-1)[:, :, None])
    assert not rows and "query" in rows.message
    crash = ch13.check_moved_norms(lambda w, V, W_O: w @ W_O)
    assert not crash and "raised" in crash.message


def test_block_edge_mistakes():
    def no_renorm(w, i, j):
        out = w.copy()
        out[i, j] = 0.0
        return out

    def column(w, i, j):
        out = w.copy()
        out[:, j] = 0.0
        return out / out.sum(-1, keepdims=True)

    def in_place(w, i, j):
        w[i, j] = 0.0
        w[i] /= w[i].sum()
        return w

    feedback = ch13.check_block_edge(no_renorm)
    assert not feedback and "renormalise" in feedback.message
    feedback = ch13.check_block_edge(column)
    assert not feedback and "every query" in feedback.message
    feedback = ch13.check_block_edge(in_place)
    assert not feedback and "copy" in feedback.message
    feedback = ch13.check_block_edge(lambda w, i, j: np.zeros_like(w))
    assert not feedback and "wrong values" in feedback.message


def test_moved_norms_accepts_float32_and_says_close():
    def float32(weights, V, W_O):  # right, but in float32: off by ~1e-6
        return moved_norms(weights.float(), V.float(), W_O.float())

    def with_eps(weights, V, W_O):  # a small leftover factor: off by ~1e-4 relative
        return moved_norms(weights, V, W_O) * (1 - 1e-4)

    assert ch13.check_moved_norms(float32)
    feedback = ch13.check_moved_norms(with_eps)
    assert not feedback and "Close" in feedback.message and "1e-05" in feedback.message, feedback.message
