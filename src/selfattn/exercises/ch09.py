"""Checks for the exercises of chapter 09 (parallel and quadratic).

9.1 causal linear attention as a recurrent loop; 9.2 a sliding-window keep-mask. Each check runs
the learner's function on its own inputs, compares with a NumPy computation written from the
definition, and names the usual mistake.
"""

from __future__ import annotations

import numpy as np

from . import bool_mask_problem, call_learner, checker, compare_arrays, failed, passed, to_numpy

__all__ = ["check_linear_recurrent", "check_sliding_window_mask", "elu_plus_one"]

_EX1 = "9.1 linear attention as a recurrence"
_EX2 = "9.2 sliding-window mask"


def elu_plus_one(x: np.ndarray) -> np.ndarray:
    """The feature map phi(x) = elu(x) + 1 of Katharopoulos et al. (2020), in NumPy."""
    x = np.asarray(x, dtype=float)
    return np.where(x > 0, x + 1.0, np.exp(np.minimum(x, 0.0)))


def _linear(q, k, v, *, causal=True, phi=elu_plus_one, normalize=True):
    """Linear attention from its definition: explicit (cumulative) sums over keys."""
    pq, pk = phi(q), phi(k)
    outer = pk[:, :, None] * v[:, None, :]  # (S, Dh, Dv): phi(k_j) v_j^T
    state = np.cumsum(outer, axis=0) if causal else np.broadcast_to(outer.sum(0), outer.shape)
    z = np.cumsum(pk, axis=0) if causal else np.broadcast_to(pk.sum(0), pk.shape)
    numerator = np.einsum("td,tdv->tv", pq, state)
    if not normalize:
        return numerator
    return numerator / (np.einsum("td,td->t", pq, z)[:, None] + 1e-6)


@checker(_EX1)
def check_linear_recurrent(fn):
    """``fn(q, k, v)`` with NumPy arrays (T, Dh), (T, Dh), (T, Dv) must return (T, Dv): causal linear
    attention with phi = elu + 1, computed by a loop that carries ``state`` (Dh, Dv) and ``z`` (Dh,)."""
    rng = np.random.default_rng(8)
    q, k, v = rng.normal(size=(7, 4)), rng.normal(size=(7, 4)), rng.normal(size=(7, 3))
    got = call_learner(_EX1, fn, q.copy(), k.copy(), v.copy())
    expected = _linear(q, k, v)
    wrong = compare_arrays(_EX1, got, expected, what="The output", atol=1e-6, rtol=1e-5)
    if wrong is None:
        return passed(_EX1, "Each step adds phi(k_i) v_i^T to the state and phi(k_i) to z: constant memory "
                            "per step, the same numbers as the masked matrix product.")  # fmt: skip
    arr = to_numpy(got)
    if arr is not None and arr.shape == expected.shape and np.isfinite(arr).all():
        hints = [
            (_linear(q, k, v, causal=False), "Row i uses keys after i: update the state and z *before* reading "
                                             "them at step i, and only with keys 0..i (not the sums over all keys)."),
            (_linear(q, k, v, normalize=False), "You forgot the normalizer: divide phi(q_i) state_i by "
                                                "phi(q_i) . z_i, the linear version of softmax's row sum."),
            (_linear(q, k, v, phi=lambda x: x), "Apply the feature map phi(x) = elu(x) + 1 to q and k first; "
                                                "raw dot products can be negative, so they are not weights."),
        ]
        for candidate, message in hints:
            if np.allclose(arr, candidate, atol=1e-6, rtol=1e-5):
                return failed(_EX1, message)
    return wrong


@checker(_EX2)
def check_sliding_window_mask(fn):
    """``fn(T, window)`` must return a (T, T) boolean keep-mask: True where ``i - window < j <= i``
    (each query sees itself and the ``window - 1`` keys before it)."""
    for T, window in ((6, 3), (5, 1), (4, 9)):
        got = call_learner(_EX2, fn, T, window)
        problem = bool_mask_problem(got)  # the one dtype rule of every mask exercise
        if problem is not None:
            return failed(_EX2, problem)
        arr = to_numpy(got)
        if arr is None or arr.shape != (T, T):
            return failed(_EX2, f"For T={T} return a ({T}, {T}) mask; got "
                                f"{type(got).__name__ if arr is None else arr.shape}.")  # fmt: skip
        mask = arr.astype(bool)
        i, j = np.arange(T)[:, None], np.arange(T)[None, :]
        expected = (j <= i) & (j > i - window)
        if np.array_equal(mask, expected):
            continue
        if np.array_equal(mask, ~expected):
            return failed(_EX2, "The polarity is reversed: True must mean 'may attend'.")
        if np.array_equal(mask, (j <= i) & (j >= i - window)):
            return failed(_EX2, f"Off by one: each query should see exactly window={window} keys (itself "
                                "included), i.e. j > i - window, not j >= i - window.")  # fmt: skip
        if np.array_equal(mask, np.abs(i - j) < window):
            return failed(_EX2, "Your band is two-sided: a causal window also hides the future (j <= i).")
        if (mask & (j > i)).any():
            return failed(_EX2, "Your mask lets a query read keys after it: keep j <= i as well.")
        return failed(_EX2, f"For T={T}, window={window} the mask differs from i - window < j <= i.")
    return passed(_EX2, "(j <= i) & (j > i - window): the same as selfattn.efficient.sliding_window_mask.")
