"""Checks for the exercises of chapter 10 (FlashAttention from first principles).

9.1 merge two online-softmax states; 9.2 attention over key blocks with the online softmax.
Each check compares with ``selfattn.ref`` and names the usual mistake: a sum that is not rescaled,
the rescaling upside down, NaN for an empty state, a forgotten last block, per-block normalising.
"""

from __future__ import annotations

import tracemalloc

import numpy as np

from .. import ref
from . import call_learner, checker, compare_arrays, failed, passed, to_numpy

__all__ = ["check_merge_states", "check_online_attention"]

_EX1 = "10.1 merge two softmax states"
_EX2 = "10.2 online attention"


def _score_bytes_held(fn, T: int = 64, S: int = 4096, block_size: int = 64) -> int | None:
    """Peak NumPy memory of ``fn`` at T queries over S keys, if it reaches half of the (T, S) float64
    score matrix (an answer that builds all the scores at once), else None. Measured with
    ``tracemalloc``, which sees NumPy's allocations; a block-wise answer holds a few (T, block)
    arrays, about 1/64 of that, and a copy of k or v (S x 2) is 1/32 of it."""
    rng = np.random.default_rng(91)
    q, k, v = rng.normal(size=(T, 2)), rng.normal(size=(S, 2)), rng.normal(size=(S, 2))
    already = tracemalloc.is_tracing()  # someone else's tracing is left running
    if already:
        tracemalloc.reset_peak()
    else:
        tracemalloc.start()
    try:
        start = tracemalloc.get_traced_memory()[0]
        fn(q, k, v, block_size)
        peak = tracemalloc.get_traced_memory()[1] - start
    except Exception:  # noqa: BLE001 - the learner's code already passed at the small size
        return None
    finally:
        if not already:
            tracemalloc.stop()
    return peak if peak >= T * S * 8 // 2 else None


@checker(_EX1)
def check_merge_states(fn):
    """``fn(m1, l1, m2, l2)`` must return ``(m, l)``: the maximum and the sum ``sum exp(x - m)`` of
    the union of two blocks whose own maxima and sums are (m1, l1) and (m2, l2); arrays of rows.
    An empty block has ``m = -inf, l = 0``."""
    rng = np.random.default_rng(9)
    a = rng.normal(size=(5, 5)) * 3
    b = rng.normal(size=(5, 3)) * 3 + np.array([[-6.0], [6.0], [0.0], [0.0], [0.0]])
    b[3:] = -np.inf  # the second block of the last two rows is empty (fully masked)...
    a[4] = -np.inf  # ...and the last row has seen nothing at all: m = -inf, l = 0 stays so
    states = []
    for block in (a, b):
        m = block.max(-1)
        shift = np.where(np.isfinite(m), m, 0.0)
        states += [m, np.exp(block - shift[:, None]).sum(-1)]
    got = call_learner(_EX1, fn, *(x.copy() for x in states))
    if not isinstance(got, (tuple, list)) or len(got) != 2:
        return failed(_EX1, f"Return a pair (m, l); got {type(got).__name__}.")
    both = np.concatenate([a, b], axis=-1)
    m_expected = both.max(-1)
    shift = np.where(np.isfinite(m_expected), m_expected, 0.0)
    l_expected = np.exp(both - shift[:, None]).sum(-1)
    m_arr = to_numpy(got[0])
    if m_arr is None or m_arr.shape != m_expected.shape:
        return failed(_EX1, f"The merged maximum m should have shape {m_expected.shape}.")
    if np.isnan(m_arr).any() or not np.array_equal(np.isneginf(m_arr), np.isneginf(m_expected)) or not np.allclose(
            m_arr[np.isfinite(m_expected)], m_expected[np.isfinite(m_expected)]):
        return failed(_EX1, "The merged maximum m is wrong: it is max(m1, m2) elementwise (and stays -inf for a "
                            "row that has seen nothing).")  # fmt: skip
    l_arr = to_numpy(got[1])
    if l_arr is not None and l_arr.shape == l_expected.shape:
        bad_rows = ~np.isfinite(l_arr)
        if bad_rows.any() and not bad_rows[np.isfinite(m_expected)].any():
            rows = np.flatnonzero(bad_rows).tolist()
            return failed(_EX1, f"Your l has NaN or inf on row(s) {rows}, where both maxima are -inf (nothing "
                                "seen yet): there m = -inf too, and exp(m_i - m) = exp(-inf - -inf) = NaN. For a "
                                "row where both maxima are -inf, use a shift of 0 instead of m: exp(-inf - 0) = 0, "
                                "so l stays 0. E.g. shift = np.where(np.isfinite(m), m, 0.0), then "
                                "l = l1 exp(m1 - shift) + l2 exp(m2 - shift).")  # fmt: skip
        if bad_rows.any():
            return failed(_EX1, "Your l has NaN or inf on a row where something was seen. For an empty block, "
                                "exp(m2 - m) with m2 = -inf is 0: compute the factors as exp(m_i - m), never "
                                "exp(m - m_i) (that overflows to inf). A row where both maxima are -inf needs "
                                "a shift of 0 instead of m: exp(-inf - 0) = 0.")  # fmt: skip
        if np.allclose(l_arr, states[1] + states[3]):
            return failed(_EX1, "You added l1 + l2 without rescaling: each sum was taken relative to its own "
                                "maximum; multiply l1 by exp(m1 - m) and l2 by exp(m2 - m).")  # fmt: skip
    wrong = compare_arrays(_EX1, got[1], l_expected, what="The merged sum l", rtol=1e-9)
    if wrong is not None:
        return wrong
    return passed(_EX1, "m = max(m1, m2), l = l1 exp(m1 - m) + l2 exp(m2 - m) (with a shift of 0 instead of m "
                        "where both maxima are -inf): the whole online softmax is this merge, applied block "
                        "after block, in any order.")  # fmt: skip


def _blockwise(q, k, v, block, *, rescale=True, drop_last=False, normalize_each=False):
    """Typical wrong versions of blockwise attention, to recognise the learner's mistake."""
    S = k.shape[0]
    stop = (S // block) * block if drop_last else S
    m, l, acc = np.full(q.shape[0], -np.inf), np.zeros(q.shape[0]), np.zeros((q.shape[0], v.shape[1]))
    outs = []
    for start in range(0, stop, block):
        s = q @ k[start:start + block].T / np.sqrt(q.shape[1])
        m_new = np.maximum(m, s.max(-1))
        p = np.exp(s - m_new[:, None])
        factor = np.exp(m - m_new) if rescale else np.ones_like(m)
        l = l * factor + p.sum(-1)
        acc = acc * factor[:, None] + p @ v[start:start + block]
        outs.append((p / p.sum(-1, keepdims=True)) @ v[start:start + block])
        m = m_new
    return np.mean(outs, axis=0) if normalize_each else acc / l[:, None]


# Float32 rounding (a right answer computed in float32 is off by ~1e-7 here) passes, as in chapter 06;
# every typical mistake is off by far more than this.
_ATOL, _RTOL = 1e-5, 1e-5


@checker(_EX2)
def check_online_attention(fn):
    """``fn(q, k, v, block_size)`` with NumPy arrays (T, Dh), (S, Dh), (S, Dv) must return the
    attention output (T, Dv), reading the keys ``block_size`` at a time with a running maximum, a
    running sum and a rescaled accumulator."""
    rng = np.random.default_rng(90)
    q, k, v = rng.normal(size=(5, 4)) * 2, rng.normal(size=(11, 4)) * 2, rng.normal(size=(11, 3))
    k[8] *= 6  # the maximum of most rows arrives late, so a missing rescale shows
    got = call_learner(_EX2, fn, q.copy(), k.copy(), v.copy(), 4)  # 11 keys: blocks 4, 4, 3
    expected = ref.scaled_dot_product_attention(q, k, v)
    wrong = compare_arrays(_EX2, got, expected, what="The output", atol=_ATOL, rtol=_RTOL)
    if wrong is None:
        held = _score_bytes_held(fn)
        if held is not None:
            return failed(_EX2, f"Right values, but not online: at T=64 queries and S=4096 keys your function held "
                                f"{held / 2**20:.1f} MiB at once, as much as the whole (T, S) score matrix "
                                f"({64 * 4096 * 8 / 2**20:.1f} MiB in float64). Read the keys block_size at a time "
                                "and keep only a running maximum, a running sum and an accumulator per query.")
        return passed(_EX2, "Exact attention reading the keys one block at a time: this loop, run on "
                            "tiles of queries too, is FlashAttention's forward pass.")  # fmt: skip
    arr = to_numpy(got)
    if arr is not None and arr.shape == expected.shape and np.isfinite(arr).all():
        hints = [
            (_blockwise(q, k, v, 4, rescale=False), "When a new block raises the maximum, multiply what you "
                                                    "accumulated (the sum and the output) by exp(m_old - m_new)."),
            (_blockwise(q, k, v, 4, drop_last=True), "The last block is missing: with 11 keys and blocks of 4 "
                                                     "the last block has 3 keys (use range(0, S, block_size))."),
            (_blockwise(q, k, v, 4, normalize_each=True), "You normalised each block on its own and averaged: "
                                                          "blocks must be weighted by their share of the total "
                                                          "sum, so keep one running sum and divide once at the end."),
        ]
        for candidate, message in hints:
            if np.allclose(arr, candidate, atol=_ATOL, rtol=_RTOL):
                return failed(_EX2, message)
        worst = float(np.max(np.abs(arr - expected)))
        if worst < 1e-2:
            return failed(_EX2, f"Close (largest error {worst:.3g}) but not within {_ATOL:g}: check for a small "
                                "leftover, such as an epsilon added to the running sum or the final division, or "
                                "float16 arithmetic (float32 and float64 both pass).")  # fmt: skip
    return wrong
