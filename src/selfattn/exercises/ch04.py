"""Checks for the exercises of chapter 04 (causal masking).

4.1 build a causal keep-mask; 4.2 a masked softmax that stays finite on a fully masked row; 4.3 the
chapter's core piece: a batch's scores under a causal and a key padding mask, turned into weights.
Each check runs the learner's function on its own inputs, compares it with ``selfattn.ref`` and
names the usual mistake: the diagonal left out, the wrong triangle, the other library's polarity,
NaN on an empty row, a NaN at a masked position leaking through an additive mask.
"""

from __future__ import annotations

import numpy as np
import torch

from .. import ref
from . import bool_mask_problem, call_learner, checker, compare_arrays, failed, passed, to_numpy

__all__ = ["check_causal_mask", "check_masked_softmax", "check_causal_padded_weights", "check_bottom_right_mask"]

_EX1 = "4.1 causal mask"
_EX2 = "4.2 masked softmax"
_EX3 = "4.3 causal and padding masks together"
_EX4 = "4.4 a causal mask for new queries after a prefix"


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


def _causal_padded_case():
    """Scores (B, T, T) of a batch of two: the first right-padded (two pad keys at the end), the second
    left-padded (two pad keys first), so its queries 0 and 1 see no key at all."""
    gen = torch.Generator().manual_seed(43)
    B, T = 2, 5
    scores = torch.randn(B, T, T, generator=gen) * 2
    key_keep = torch.tensor([[True, True, True, False, False], [False, False, True, True, True]])
    return scores, key_keep


def _np_softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


@checker(_EX3)
def check_causal_padded_weights(fn):
    """``fn(scores, key_keep)`` for float32 scores (B, T, T) and a boolean key padding mask (B, T)
    (True = a real token) must return the (B, T, T) attention weights: a softmax over the keys j <= i
    that are real tokens, exact zeros elsewhere, and an all-zero row for a query that sees no key."""
    scores, key_keep = _causal_padded_case()
    got = call_learner(_EX3, fn, scores.clone(), key_keep.clone())
    s = scores.double().numpy()
    kk = key_keep.numpy()
    causal = np.tril(np.ones(s.shape[-2:], dtype=bool))
    keep = causal[None] & kk[:, None, :]  # (B, T, T): causal and a real key
    expected = ref.softmax(s, mask=keep)
    arr = to_numpy(got)
    if arr is None:
        return failed(_EX3, f"Return a tensor of weights; got {type(got).__name__}.")
    if arr.shape != expected.shape:
        if arr.shape in ((s.shape[0], s.shape[1], s.shape[1], s.shape[1]), (s.shape[0], s.shape[0], s.shape[1], s.shape[1])):
            return failed(_EX3, f"The weights have shape {arr.shape}: the padding mask broadcast along a new axis. "
                                "Give it the shape (B, 1, S) with key_keep[:, None, :] so it lines up with the keys.")  # fmt: skip
        return failed(_EX3, f"The weights should have the scores' shape (B, T, T) = {expected.shape}; got {arr.shape}.")
    empty = ~keep.any(axis=-1)  # (B, T): queries that see no key
    bad = ~np.isfinite(arr)
    if bad.any():
        if bad[empty].any() and not bad[~empty].any():
            return failed(_EX3, "The rows of queries 0 and 1 of the left-padded sequence are NaN: every key "
                                "they may see (j <= i) is padding, so their softmax is 0/0. Give such a row "
                                "all-zero weights (row maximum 0 when it is -inf, divide only where the sum is "
                                "> 0), as in exercise 4.2.")  # fmt: skip
        return failed(_EX3, f"Your weights contain NaN or inf ({int(bad.sum())} entries).")
    if np.allclose(arr, expected, atol=1e-5):
        return passed(_EX3, "keep = causal[None] & key_keep[:, None, :] (shape (B, T, T)), then the masked "
                            "softmax of 4.2: -inf at blocked scores, zero rows where nothing is visible.")  # fmt: skip
    pad_only = kk[:, None, :] & np.ones_like(keep)
    flipped = causal[None] & ~kk[:, None, :]
    on_queries = causal[None] & kk[:, :, None]
    uniform_rows = expected.copy()
    uniform_rows[empty] = 1.0 / s.shape[-1]
    mistakes = [
        (ref.softmax(s, mask=pad_only), "The causal mask is missing: query i reads keys after it. Combine both "
                                        "masks with &: keep = causal[None] & key_keep[:, None, :]."),
        (ref.softmax(s, mask=np.broadcast_to(causal, s.shape)), "The padding mask is missing: queries attend to the "
                                                                "pad keys. Combine both masks with &: keep = causal[None] & key_keep[:, None, :]."),
        (ref.softmax(s, mask=flipped), "The padding mask's polarity is reversed: True in key_keep means a real token "
                                       "that may be attended, and you kept the pad keys instead."),
        (ref.softmax(s, mask=on_queries), "The padding mask went along the queries (key_keep[:, :, None]), not the "
                                          "keys: a pad token is a key no query may read, so use key_keep[:, None, :]."),
        (_np_softmax(np.where(keep, s, 0.0)), "You set the blocked scores to 0, not to -inf: exp(0) = 1, so blocked "
                                               "keys still get weight. Fill with float('-inf') (masked_fill(~keep, -inf))."),
        (_np_softmax(s) * keep, "You applied the mask after the softmax: the blocked entries are zero but the rows no "
                                "longer sum to 1. Mask the scores (-inf) before the softmax."),
        (uniform_rows, "Queries 0 and 1 of the left-padded sequence see no key, yet your weights spread 1/T over "
                       "blocked keys: this is what a finite fill value (-1e9) does. Such a row must be all zeros: "
                       "fill with -inf and guard the empty row as in exercise 4.2."),
    ]  # fmt: skip
    for wrong, words in mistakes:
        if np.allclose(arr, wrong, atol=1e-5):
            return failed(_EX3, words)
    leaked = float(np.abs(arr[~keep]).max())
    if leaked > 1e-7:
        return failed(_EX3, f"Blocked positions (a future key or a pad key) must get weight exactly 0; yours get up to {leaked:.3g}.")
    sums = arr.sum(axis=-1)
    if not np.allclose(sums[~empty], 1.0, atol=1e-4):
        return failed(_EX3, "Each row with a visible key must sum to 1 over the keys (softmax over the last axis, dim=-1).")
    return compare_arrays(_EX3, got, expected, what="Your weights", atol=1e-5, rtol=1e-5) or failed(_EX3, "Wrong weights.")


@checker(_EX4)
def check_bottom_right_mask(fn):
    """``fn(T, S)`` for T new queries after S - T earlier tokens (T <= S) must return the (T, S) boolean
    keep-mask of the bottom-right alignment: query i (position S - T + i) may attend to key j <= i + S - T."""
    for T, S in ((3, 7), (1, 5), (4, 4)):
        got = call_learner(_EX4, fn, T, S)
        problem = bool_mask_problem(got)
        if problem is not None:
            return failed(_EX4, problem)
        arr = to_numpy(got)
        if arr is None:
            return failed(_EX4, f"Return a tensor; got {type(got).__name__}.")
        if arr.shape == (S, T) and S != T:
            return failed(_EX4, f"The mask has shape (S, T) = {arr.shape}: one row per query, so it is (T, S) = ({T}, {S}).")
        if arr.shape != (T, S):
            return failed(_EX4, f"For T={T}, S={S} the mask should have shape ({T}, {S}); got {arr.shape}.")
        mask = arr.astype(bool)
        expected = ref.causal_mask(T, S, alignment="bottom_right")
        if np.array_equal(mask, expected):
            continue
        words = {
            "top": "You aligned the queries to the first keys (top-left): query i sees keys j <= i. The new queries "
                   "come after S - T earlier tokens, so query i sees j <= i + (S - T) (bottom-right).",
            "strict": "The diagonal is missing: query i is the token at position i + S - T and must see itself, "
                      "j <= i + S - T, not j < i + S - T.",
            "flip": "The polarity is reversed: True means 'may attend'. Invert your mask with ~.",
        }
        top = ref.causal_mask(T, S, alignment="top_left")
        strict = np.arange(S)[None, :] < np.arange(T)[:, None] + (S - T)
        for key, wrong in (("top", top), ("strict", strict), ("flip", ~expected)):
            if np.array_equal(mask, wrong):
                return failed(_EX4, words[key])
        i, j = np.argwhere(mask != expected)[0]
        return failed(_EX4, f"For T={T}, S={S}: query {i} (position {S - T + i}) should "
                            f"{'see' if expected[i, j] else 'not see'} key {j}.")  # fmt: skip
    return passed(_EX4, "arange(S)[None, :] <= arange(T)[:, None] + (S - T): the last query sees every key, as in "
                        "decoding with a cache.")  # fmt: skip
