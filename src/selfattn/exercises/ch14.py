"""Checks for the exercises of chapter 14 (the capstone: a small GPT and its KV cache).

Expected values come from NumPy (``selfattn.ref.softmax``, ``np.concatenate``); the typical
mistakes are computed too, and the check names the one the learner's answer matches.
"""

from __future__ import annotations

import numpy as np
import torch

from .. import ref
from . import call_learner, checker, compare_arrays, failed, passed, to_numpy

__all__ = ["check_next_token_distribution", "check_append_to_cache"]


@checker("14.1 the next-token distribution")
def check_next_token_distribution(fn):
    """``fn(logits (B, V), temperature)`` -> (B, V) probabilities ``softmax(logits / temperature)``
    over the vocabulary axis. Torch tensors in and out."""
    ex = "14.1 the next-token distribution"
    logits = np.random.default_rng(0).normal(size=(3, 7)) * 3.0
    for temperature in (0.5, 2.0):
        got = to_numpy(call_learner(ex, fn, torch.from_numpy(logits.copy()), temperature))
        expected = ref.softmax(logits / temperature, axis=-1)
        if got is not None and got.shape == expected.shape:
            if np.allclose(got, ref.softmax(logits * temperature, axis=-1), atol=1e-8):
                return failed(
                    ex,
                    f"With temperature {temperature} you multiplied the logits by it; divide: a "
                    "temperature below 1 must sharpen the distribution, above 1 flatten it.",
                )
            if np.allclose(got, logits / temperature, atol=1e-8):
                return failed(
                    ex, "You returned the scaled logits; apply softmax to get probabilities."
                )
            if np.allclose(got, ref.softmax(logits / temperature, axis=0), atol=1e-8):
                return failed(
                    ex,
                    "Your probabilities sum to one down the batch axis; the softmax runs over the "
                    "vocabulary (the last axis), one distribution per sequence.",
                )
        bad = compare_arrays(
            ex, got, expected, what=f"the probabilities at temperature {temperature}"
        )
        if bad is not None:
            return bad
    return passed(ex, "softmax(logits / temperature) over the vocabulary.")


@checker("14.2 append to the cache")
def check_append_to_cache(fn):
    """``fn(K_cache, V_cache, k_new, v_new)`` -> ``(K, V)``: the cached keys and values (B, H, S, Dh)
    with the new positions (B, H, T_new, Dh) appended after them. Torch tensors in and out."""
    ex = "14.2 append to the cache"
    rng = np.random.default_rng(2)
    B, H, S, T_new, Dh = 2, 3, 5, 1, 4
    K, V = rng.normal(size=(B, H, S, Dh)), rng.normal(size=(B, H, S, Dh))
    k, v = rng.normal(size=(B, H, T_new, Dh)), rng.normal(size=(B, H, T_new, Dh))
    t = torch.from_numpy
    result = call_learner(ex, fn, t(K.copy()), t(V.copy()), t(k.copy()), t(v.copy()))
    if not (isinstance(result, (tuple, list)) and len(result) == 2):
        return failed(ex, "Return the pair (K, V): the keys and the values with the new position.")
    got_K, got_V = to_numpy(result[0]), to_numpy(result[1])
    expected_K = np.concatenate([K, k], axis=-2)
    if got_K is not None:
        if got_K.shape == k.shape:
            return failed(
                ex,
                "Your K holds only the new position: the cache must keep every earlier key too, "
                "so that the new query can attend to all S + T_new positions.",
            )
        if got_K.shape == (B, H, S, Dh + T_new) or got_K.shape == (B, H + T_new, S, Dh):
            return failed(
                ex,
                f"Your keys have shape {got_K.shape}: concatenate along the positions axis (-2), "
                f"giving (B, H, S + T_new, Dh) = {expected_K.shape}.",
            )
        if got_K.shape == expected_K.shape and np.allclose(got_K, np.concatenate([k, K], axis=-2)):
            return failed(
                ex,
                "The new position comes first: append it after the cached ones, so that position "
                "order (and the bottom-right causal mask) stays right.",
            )
        if got_K.shape == expected_K.shape and np.allclose(got_K, np.concatenate([V, v], axis=-2)):
            return failed(
                ex, "Your K holds the values: keep keys with keys and values with values."
            )
    for got, expected, what in (
        (got_K, expected_K, "K"),
        (got_V, np.concatenate([V, v], axis=-2), "V"),
    ):
        bad = compare_arrays(ex, got, expected, what=what, atol=0, rtol=0)
        if bad is not None:
            return bad
    return passed(ex, "torch.cat([K_cache, k_new], dim=-2), the same for V: S grows by T_new.")
