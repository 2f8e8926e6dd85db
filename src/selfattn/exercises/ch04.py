"""Checks for the exercises of chapter 04 (causal masking).

4.1 build a causal keep-mask; 4.2 a masked softmax that stays finite on a fully masked row.
Each check runs the learner's function on its own inputs, compares it with ``selfattn.ref`` and
names the usual mistake: the diagonal left out, the wrong triangle, the other library's polarity,
NaN on an empty row, a NaN at a masked position leaking through an additive mask.
"""

from __future__ import annotations

import numpy as np
import torch

from .. import ref
from . import bool_mask_problem, call_learner, checker, compare_arrays, failed, passed, to_numpy

__all__ = ["check_causal_mask", "check_masked_softmax"]

_EX1 = "4.1 causal mask"
_EX2 = "4.2 masked softmax"


@checker(_EX1)
def check_causal_mask(fn):
    """``fn(T)`` must return a (T, T) boolean keep-mask: True where query i may attend to key j <= i."""
    for T in (4, 7, 1):  # T = 1 last: there, a missing diagonal and a reversed polarity look alike
        got = call_learner(_EX1, fn, T)
        problem = bool_mask_problem(got)
        if problem is not None:
            return failed(_EX1, problem)
        arr = to_numpy(got)
        if arr is None:
            return failed(_EX1, f"Return a tensor; got {type(got).__name__}.")
        if arr.shape != (T, T):
            return failed(
                _EX1, f"For T={T} the mask should have shape ({T}, {T}); got {arr.shape}."
            )
        mask = arr.astype(bool)
        expected = ref.causal_mask(T)
        if np.array_equal(mask, expected):
            continue
        if np.array_equal(mask, ~expected):
            return failed(_EX1, "The polarity is reversed: in this course True means 'may attend', and you "
                                "marked the blocked positions (the convention of nn.MultiheadAttention's "
                                "attn_mask). Invert it with ~, or convert with selfattn.from_blocked_mask.")  # fmt: skip
        if np.array_equal(mask, np.tril(np.ones((T, T), dtype=bool), k=-1)):
            return failed(_EX1, "The diagonal is False: every token must attend to itself (keep j <= i, "
                                "not j < i). Otherwise the first row sees nothing at all.")  # fmt: skip
        if mask[np.triu_indices(T, k=1)].any():
            i, j = np.argwhere(mask & ~expected)[0]
            return failed(_EX1, f"Your mask lets position i read the future: query {i} may attend to key {j}, "
                                "which comes after it. Keep the lower triangle (torch.tril), not the upper one.")  # fmt: skip
        i, j = np.argwhere(expected & ~mask)[0]
        return failed(
            _EX1, f"Query {i} should see key {j} (every j <= i), but your mask blocks it."
        )
    return passed(_EX1, "torch.tril(torch.ones(T, T, dtype=torch.bool)), or j <= i with broadcasting: "
                        "the same as selfattn.causal_mask(T).")  # fmt: skip


def _masked_softmax_cases():
    gen = torch.Generator().manual_seed(4)
    scores = torch.randn(4, 5, generator=gen) * 3
    keep = ref.causal_mask(4, 5, alignment="bottom_right").copy()
    keep = torch.from_numpy(keep)
    stored_nan = scores.clone()
    stored_nan[0, 4] = float("nan")  # a masked position holding garbage (e.g. padding)
    empty = keep.clone()
    empty[2] = False  # a query that may attend to nothing
    return [("plain", scores, keep), ("nan", stored_nan, keep), ("empty", scores, empty)]


@checker(_EX2)
def check_masked_softmax(fn):
    """``fn(scores, keep)`` for float32 (T, S) scores and a boolean (T, S) keep-mask must return the
    softmax over the kept entries of each row, exact zeros elsewhere, and an all-zero row where
    nothing is kept."""
    for case, scores, keep in _masked_softmax_cases():
        got = call_learner(_EX2, fn, scores.clone(), keep.clone())
        expected = ref.softmax(scores.double().numpy(), mask=keep.numpy())
        arr = to_numpy(got)
        if arr is None:
            return failed(_EX2, f"Return a tensor; got {type(got).__name__}.")
        if arr.shape != expected.shape:
            return failed(
                _EX2,
                f"The weights should have the scores' shape {expected.shape}; got {arr.shape}.",
            )
        bad = ~np.isfinite(arr)
        if bad.any():
            if case == "empty" and bad[2].all() and np.isfinite(np.delete(arr, 2, axis=0)).all():
                return failed(_EX2, "Row 2 has no visible key and your weights there are NaN: softmax of a row "
                                    "that is all -inf computes 0/0. Give such a row all-zero weights (for "
                                    "example: take the row maximum as 0 when it is -inf, and divide only "
                                    "where the sum is > 0).")  # fmt: skip
            if case == "nan":
                return failed(_EX2, "A NaN stored at a masked position reached your weights. Adding a large "
                                    "negative number to the scores keeps NaN + (-1e9) = NaN: replace the "
                                    "masked scores (masked_fill or torch.where) instead of adding to them.")  # fmt: skip
            return failed(_EX2, f"Your weights contain NaN or inf ({int(bad.sum())} entries).")
        if case == "empty" and np.allclose(arr[2], 1.0 / arr.shape[1], atol=1e-6):
            return failed(_EX2, "Row 2 has no visible key, yet your weights spread 1/S over the masked keys: "
                                "this is what a large finite fill value (-1e9) does. A query that may see "
                                "nothing must get all-zero weights.")  # fmt: skip
        leaked = np.abs(arr[~keep.numpy()]).max() if (~keep).any() else 0.0
        if leaked > 1e-7:
            if np.allclose(
                arr, ref.softmax(scores.double().numpy(), mask=~keep.numpy()), atol=1e-5
            ):
                return failed(
                    _EX2,
                    "The polarity is reversed: you kept the False entries. True means 'may attend'.",
                )
            return failed(
                _EX2, f"Masked positions must get weight exactly 0; yours get up to {leaked:.3g}."
            )
        wrong = compare_arrays(_EX2, got, expected, what="Your weights", atol=1e-5, rtol=1e-5)
        if wrong is not None:
            sums = arr.sum(axis=-1)
            if not np.allclose(sums[keep.numpy().any(-1)], 1.0, atol=1e-4):
                return failed(
                    _EX2,
                    f"Each row with a visible key must sum to 1; yours sum to {np.round(sums, 3)}.",
                )
            return wrong
    return passed(_EX2, "Replace masked scores by -inf, shift by the row maximum (0 for an empty row), "
                        "exponentiate and divide only where the sum is positive: selfattn.masked_softmax.")  # fmt: skip
