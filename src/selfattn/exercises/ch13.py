"""Checks for the exercises of chapter 13 (what attention weights do and do not tell).

Expected values are computed here with NumPy (float64) from the definitions in the chapter; the
typical mistakes are computed too, and the check names the one the learner's answer matches.
"""

from __future__ import annotations

import numpy as np
import torch

from .. import ref
from . import call_learner, checker, compare_arrays, failed, passed, to_numpy

__all__ = ["check_moved_norms", "check_block_edge"]


def _inputs(seed: int = 0):
    rng = np.random.default_rng(seed)
    H, T, Dh, D = 3, 5, 4, 12  # distinct sizes: a swapped axis shows in the shape
    weights = ref.softmax(rng.normal(size=(H, T, T)) * 2.0, axis=-1)
    V = rng.normal(size=(H, T, Dh))
    W_O = rng.normal(size=(H, Dh, D))
    return weights, V, W_O


# Float32 rounding (a right answer computed in float32 is off by ~1e-6 here) passes, as in chapter 06;
# every typical mistake is off by far more than this.
_ATOL, _RTOL = 1e-5, 1e-5


@checker("13.1 norms of the moved vectors")
def check_moved_norms(fn):
    """``fn(weights (H, T, T), V (H, T, Dh), W_O (H, Dh, D))`` -> (H, T, T) with entry [h, i, j]
    = ``weights[h, i, j] * ||V[h, j] @ W_O[h]||`` (Kobayashi et al. 2020). Torch tensors in and out."""
    ex = "13.1 norms of the moved vectors"
    weights, V, W_O = _inputs()
    as_t = torch.from_numpy
    got = to_numpy(call_learner(ex, fn, as_t(weights.copy()), as_t(V.copy()), as_t(W_O.copy())))
    moved = np.linalg.norm(V @ W_O, axis=-1)  # (H, T, Dh) @ (H, Dh, D) -> (H, T, D) -> (H, T)
    expected = weights * moved[:, None, :]  # (H, T, T) * (H, 1, T)
    if got is not None and got.shape == expected.shape:
        mistakes = {
            "You took the norm of the value vector alone: the vector a head adds to the output is "
            "v_j W_O^h, so multiply by the head's rows of W_O before the norm.": weights
            * np.linalg.norm(V, axis=-1)[:, None, :],
            "You squared the norm: use the length ||v_j W_O^h||, not its square.": weights
            * (moved**2)[:, None, :],
            "You left out the attention weight: each edge moves alpha_ij * v_j W_O^h, so multiply "
            "the norm by the weight.": np.broadcast_to(moved[:, None, :], expected.shape),
            "You indexed the norms by the query (rows) instead of the key (columns): the vector "
            "moved along edge (i, j) is key j's.": weights * moved[:, :, None],
        }
        for message, wrong in mistakes.items():
            if np.allclose(got, wrong, atol=_ATOL, rtol=_RTOL) and not np.allclose(
                got, expected, atol=_ATOL, rtol=_RTOL
            ):
                return failed(ex, message)
    bad = compare_arrays(ex, got, expected, what="the norms", atol=_ATOL, rtol=_RTOL)
    if bad is not None and got is not None and got.shape == expected.shape and np.isfinite(got).all():
        worst = float(np.max(np.abs(got - expected)))
        if worst < 1e-2:
            return failed(ex, f"Close (largest error {worst:.3g}) but not within {_ATOL:g}: check for a small "
                              "leftover, such as an epsilon added inside the norm or float16 arithmetic "
                              "(float32 and float64 both pass).")  # fmt: skip
    if bad is not None:
        return bad
    return passed(ex, "alpha_ij * ||v_j W_O^h||: the length of what the edge actually adds.")


@checker("13.2 block one edge")
def check_block_edge(fn):
    """``fn(weights (T, S), i, j)`` -> (T, S): the weights after key j is hidden from query i, as
    the keep-mask does it (weight 0, row i renormalised over the remaining keys, other rows
    unchanged). NumPy arrays in and out; the input must not be modified."""
    ex = "13.2 block one edge"
    weights = ref.softmax(np.random.default_rng(1).normal(size=(4, 6)) * 2.0, axis=-1)
    for i, j in ((1, 2), (3, 0)):
        given = weights.copy()
        got = to_numpy(call_learner(ex, fn, given, i, j))
        if not np.array_equal(given, weights):
            return failed(ex, "Your function changed its input array; work on a copy.")
        expected = weights.copy()
        expected[i, j] = 0.0
        expected[i] /= expected[i].sum()
        if got is not None and got.shape == expected.shape:
            not_renormalised = weights.copy()
            not_renormalised[i, j] = 0.0
            column = weights.copy()
            column[:, j] = 0.0
            column /= column.sum(-1, keepdims=True)
            if np.allclose(got, not_renormalised, atol=1e-10):
                return failed(
                    ex,
                    f"Row {i} sums to {got[i].sum():.3f}, not 1: you zeroed the weight but did not "
                    "renormalise. A blocked key is absent from the softmax, so the other weights grow.",
                )
            if np.allclose(got, column, atol=1e-10):
                return failed(
                    ex,
                    f"You hid key {j} from every query; only query {i} must lose it (one edge).",
                )
        bad = compare_arrays(
            ex, got, expected, what=f"the weights after blocking ({i}, {j})", atol=1e-10
        )
        if bad is not None:
            return bad
    return passed(ex, "Zero the entry, divide the row by its new sum: softmax without that key.")
