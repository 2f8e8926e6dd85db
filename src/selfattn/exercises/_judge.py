"""One verdict from a list of known mistakes: shared by the checks of chapters 02-07 added for issue 27."""

from __future__ import annotations

import numpy as np

from . import Feedback, failed, to_numpy


def judge(exercise: str, got, expected: np.ndarray, mistakes, *, what: str, atol: float = 1e-6,
          right: str = "Well done.") -> Feedback:
    """Compare ``got`` with ``expected``; name the first mistake in ``mistakes`` it matches.

    ``mistakes`` is a list of ``(array or callable returning one, words)``; a callable is only computed when
    needed, and one that raises or returns another shape is skipped. The message says what is wrong with a
    non-array, wrongly shaped or non-finite answer, never raising. Tolerance: ``|got - x| <= atol`` elementwise.
    """
    from . import passed

    arr = to_numpy(got)
    if arr is None:
        return failed(exercise, f"{what} should be an array or tensor; got {type(got).__name__}.")
    if arr.shape != expected.shape:
        if arr.ndim == 0 and expected.ndim > 0:  # one number (a NaN, a float, a 0-d tensor) where an array belongs
            return failed(exercise, f"{what} should be an array of shape {expected.shape}; you returned one number, "
                                    f"{float(arr):.6g} ({type(got).__name__}).")
        return failed(exercise, f"{what} should have shape {expected.shape}; got {arr.shape}.")
    if not np.isfinite(arr).all():
        return failed(exercise, f"{what}: NaN or inf in {int((~np.isfinite(arr)).sum())} entries.")
    if np.allclose(arr, expected, atol=atol, rtol=0):
        return passed(exercise, right)
    for wrong, words in mistakes:
        try:
            value = np.asarray(wrong() if callable(wrong) else wrong, dtype=np.float64)
        except Exception:  # a mistake that cannot happen for these inputs
            continue
        if value.shape == arr.shape and np.isfinite(value).all() and np.allclose(arr, value, atol=atol, rtol=0):
            return failed(exercise, words)
    worst = float(np.max(np.abs(arr - expected)))
    return failed(exercise, f"{what}: right shape, wrong values (largest error {worst:.3g}).")
