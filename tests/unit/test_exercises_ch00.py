"""Chapter 00's checks accept the reference solutions and explain typical mistakes."""

from __future__ import annotations

import numpy as np

from selfattn.exercises import ch00


def test_swap_last_two_accepts_transpose():
    fb = ch00.check_swap_last_two(lambda X: X.transpose(-2, -1))
    assert fb.ok and fb.attempted


def test_swap_last_two_catches_reshape():
    fb = ch00.check_swap_last_two(lambda X: X.reshape(X.shape[0], X.shape[2], X.shape[1]))
    assert not fb.ok and "reshaped instead of transposing" in fb.message


def test_swap_last_two_catches_reversing_all_axes():
    fb = ch00.check_swap_last_two(lambda X: X.permute(2, 1, 0))
    assert not fb.ok and "reversed all axes" in fb.message


def test_swap_last_two_not_attempted():
    def stub(X):
        raise NotImplementedError

    fb = ch00.check_swap_last_two(stub)
    assert not fb.ok and not fb.attempted and "not attempted" in str(fb)


def test_dot_product_accepts_sum_of_products():
    assert ch00.check_dot_product(lambda a, b: (a * b).sum())
    assert ch00.check_dot_product(lambda a, b: a @ b)


def test_dot_product_catches_mean_and_elementwise():
    mean = ch00.check_dot_product(lambda a, b: (a * b).mean())
    assert not mean.ok and "mean of the products" in mean.message
    elementwise = ch00.check_dot_product(lambda a, b: a * b)
    assert not elementwise.ok and "single number" in elementwise.message


def test_dot_product_reports_a_crash_by_name():
    fb = ch00.check_dot_product(lambda a, b: np.dot(a, b[:-1]))
    assert not fb.ok and "ValueError" in fb.message
