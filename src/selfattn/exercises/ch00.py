"""Checks for the exercises of chapter 00 (how the feedback works)."""

from __future__ import annotations

import numpy as np
import torch

from . import call_learner, checker, failed, passed, to_numpy

__all__ = ["check_swap_last_two", "check_dot_product"]


@checker("0.1 swap the last two axes")
def check_swap_last_two(fn):
    """``fn(X)`` must turn a (B, T, D) tensor into (B, D, T), element [b, d, t] = X[b, t, d]."""
    ex = "0.1 swap the last two axes"
    X = torch.arange(2 * 3 * 4, dtype=torch.float64).reshape(2, 3, 4)
    got = call_learner(ex, fn, X.clone())
    arr = to_numpy(got)
    if arr is None:
        return failed(ex, f"Return a tensor; got {type(got).__name__}.")
    if arr.shape == (4, 3, 2):
        return failed(ex, "You reversed all axes (shape (D, T, B)); keep the batch axis first: (B, D, T).")
    if arr.shape != (2, 4, 3):
        return failed(ex, f"For X of shape (B, T, D) = (2, 3, 4) the result should have shape (2, 4, 3); got {arr.shape}.")
    expected = np.swapaxes(X.numpy(), -1, -2)
    if not np.isfinite(arr).all():
        return failed(ex, f"Your result holds NaN or inf in {int((~np.isfinite(arr)).sum())} of its {arr.size} entries; "
                          "swapping axes only moves the numbers of X.")
    if np.array_equal(arr, X.numpy().reshape(2, 4, 3)):
        return failed(ex, "The shape is right but you reshaped instead of transposing: "
                          "reshape keeps the memory order, so the numbers land in the wrong places.")
    if not np.array_equal(arr, expected):
        return failed(ex, "The shape is right but the values are not X[b, t, d] at [b, d, t].")
    return passed(ex, "X.transpose(-2, -1) (or X.mT) swaps exactly the last two axes.")


@checker("0.2 dot product")
def check_dot_product(fn):
    """``fn(a, b)`` must return the number sum_i a_i * b_i for two 1-D arrays."""
    ex = "0.2 dot product"
    rng = np.random.default_rng(0)
    for n in (1, 3, 7):
        a, b = rng.normal(size=n), rng.normal(size=n)
        got = call_learner(ex, fn, a.copy(), b.copy())
        arr = to_numpy(got)
        if arr is None or arr.size != 1:
            shape = None if arr is None else arr.shape
            return failed(ex, f"Return a single number; for vectors of length {n} you returned shape {shape} "
                              "(did you forget to sum the elementwise products?).")
        value = float(arr.reshape(()))
        if not np.isfinite(value):
            return failed(ex, "Your result is NaN or inf.")
        if np.isclose(value, float(np.sum(a * b) / n), atol=1e-9) and n > 1:
            return failed(ex, "You took the mean of the products; the dot product is their sum.")
        if not np.isclose(value, float(np.sum(a * b)), atol=1e-9):
            return failed(ex, f"For a = {np.round(a, 3).tolist()} and b = {np.round(b, 3).tolist()} the dot "
                              f"product is {np.sum(a * b):.4f}; you returned {value:.4f}.")
    return passed(ex, "The dot product is the sum of the elementwise products: (a * b).sum() or a @ b.")
