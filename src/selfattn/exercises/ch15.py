"""Checks for the exercises of chapter 15 (from attention to causes).

Expected values are computed here with NumPy (float64) from the definitions in the chapter; the
typical mistakes are computed too, and the check names the one the learner's answer matches.
"""

from __future__ import annotations

import numpy as np

from . import call_learner, checker, compare_arrays, failed, passed, to_numpy

__all__ = ["check_restored_fraction", "check_copying_score"]


@checker("15.1 restored fraction")
def check_restored_fraction(fn):
    """``fn(patched, clean, corrupted)`` -> (N,) NumPy array: ``(patched - corrupted) / (clean - corrupted)``,
    elementwise, for NumPy arrays of metric values."""
    ex = "15.1 restored fraction"
    rng = np.random.default_rng(0)
    clean = rng.normal(3.0, 1.0, size=6)
    corrupted = clean - rng.uniform(1.0, 4.0, size=6)
    patched = corrupted + rng.uniform(-0.5, 1.2, size=6) * (clean - corrupted)
    patched[0], patched[1] = clean[0], corrupted[1]  # the two ends: 1 and 0
    got = to_numpy(call_learner(ex, fn, patched.copy(), clean.copy(), corrupted.copy()))
    expected = (patched - corrupted) / (clean - corrupted)
    if got is not None and got.shape == expected.shape:
        mistakes = {
            "You measured how much is still missing, (clean - patched) / (clean - corrupted) = 1 - r: a patch "
            "that restores everything must give 1, one that restores nothing 0.": 1.0 - expected,
            "Your sign is flipped: (patched - corrupted) / (corrupted - clean) gives -1 for a full restore.": -expected,
            "You divided by the clean value alone: the scale is the difference clean - corrupted.":
                (patched - corrupted) / clean,
            "You compared with the clean run, (patched - clean) / (clean - corrupted): the corrupted run is "
            "the zero point.": (patched - clean) / (clean - corrupted),
        }
        for message, wrong in mistakes.items():
            if np.allclose(got, wrong, atol=1e-9) and not np.allclose(got, expected, atol=1e-9):
                return failed(ex, message)
    bad = compare_arrays(ex, got, expected, what="the restored fractions", atol=1e-9)
    if bad is not None:
        return bad
    return passed(ex, "1 when the patch brings back the clean metric, 0 when it changes nothing.")


@checker("15.2 copying score")
def check_copying_score(fn):
    """``fn(circuit (V, V) NumPy array)`` -> float: ``sum(eigenvalues).real / sum(|eigenvalues|)``
    (Elhage et al. 2021's summary of an OV circuit)."""
    ex = "15.2 copying score"
    rng = np.random.default_rng(1)
    cases = []
    A = rng.normal(size=(6, 2))
    cases.append(A @ A.T + 0.0)  # positive semi-definite, rank 2: a copier, many zero eigenvalues
    Q, _ = np.linalg.qr(rng.normal(size=(6, 6)))
    cases.append(Q @ np.diag([4.0, 1.0, -1.0, -0.5, 0.2, 3.0]) @ Q.T)  # mixed signs, weighted
    R = np.zeros((6, 6))
    R[:2, :2] = [[0.0, -2.0], [2.0, 0.0]]
    R[2, 2] = 1.0
    cases.append(R)  # a rotation (eigenvalues +-2i) and one copy
    for M in cases:
        lam = np.linalg.eigvals(M)
        expected = float(lam.sum().real / np.abs(lam).sum())
        got = call_learner(ex, fn, M.copy())
        try:
            value = float(np.real(got))
        except (TypeError, ValueError):
            return failed(ex, f"Return one number (a float); got {type(got).__name__}.")
        nonzero = np.abs(lam) > 1e-9
        mistakes = {
            "You counted the share of positive eigenvalues; Elhage et al. weigh each by its size: "
            "sum(lambda) / sum(|lambda|).": float((lam.real > 1e-9).sum() / len(lam)),
            "You counted the share of positive eigenvalues among the nonzero ones; Elhage et al. weigh each by "
            "its size: sum(lambda) / sum(|lambda|).": float((lam.real[nonzero] > 0).mean()),
            "You divided by |sum(lambda)| instead of sum(|lambda|): the denominator is the total size of all "
            "eigenvalues, whatever their sign.": float(lam.sum().real / max(abs(lam.sum()), 1e-300)),
            "You used the trace over the Frobenius norm; use the eigenvalues: sum(lambda) / sum(|lambda|).":
                float(np.trace(M) / np.linalg.norm(M)),
        }
        if not np.isclose(value, expected, atol=1e-9):
            for message, wrong in mistakes.items():
                if np.isclose(value, wrong, atol=1e-9):
                    return failed(ex, message)
            return failed(ex, f"Got {value:.6g}, expected {expected:.6g} for a {M.shape[0]} x {M.shape[1]} circuit "
                              f"with eigenvalues {np.round(lam, 3).tolist()}.")
    return passed(ex, "1 for a pure copier, -1 for an anti-copier, near 0 for a rotation.")
