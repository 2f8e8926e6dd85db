"""Chapter 15's exercise checks: the reference solutions pass, typical mistakes get the right words."""

from __future__ import annotations

import numpy as np

from selfattn.exercises import ch15


def restored(patched, clean, corrupted):
    return (patched - corrupted) / (clean - corrupted)


def copying(M):
    lam = np.linalg.eigvals(M)
    return float(lam.sum().real / np.abs(lam).sum())


def test_reference_solutions_pass():
    assert ch15.check_restored_fraction(restored)
    assert ch15.check_copying_score(copying)


def test_not_attempted_is_not_a_failure():
    def stub(*args):
        raise NotImplementedError

    for check in (ch15.check_restored_fraction, ch15.check_copying_score):
        feedback = check(stub)
        assert not feedback and not feedback.attempted


def test_restored_fraction_mistakes():
    missing = ch15.check_restored_fraction(lambda p, c, k: (c - p) / (c - k))
    assert not missing and "1 - r" in missing.message
    flipped = ch15.check_restored_fraction(lambda p, c, k: (p - k) / (k - c))
    assert not flipped and "sign" in flipped.message
    shifted = ch15.check_restored_fraction(lambda p, c, k: restored(p, c, k) + 0.5)
    assert not shifted and "wrong values" in shifted.message


def test_copying_score_mistakes():
    count = ch15.check_copying_score(lambda M: float((np.linalg.eigvals(M).real > 1e-9).mean()))
    assert not count and "share of positive eigenvalues" in count.message
    trace = ch15.check_copying_score(lambda M: float(np.trace(M) / np.linalg.norm(M)))
    assert not trace and "Frobenius" in trace.message
    off = ch15.check_copying_score(lambda M: copying(M) + 0.1)
    assert not off and "expected" in off.message
