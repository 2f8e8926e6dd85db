"""Checks for the exercises of chapter 11b (attention in today's open models).

11b.1 the bytes per token of an MLA cache; 11b.2 a sliding-window mask in Gemma's convention.
Expected values are computed here with plain Python and NumPy, independently of
:mod:`selfattn.open_models`; the usual mistakes are computed too and named: the RoPE key left out,
the latent counted once per head, keys and values counted twice as in MHA; a window one key too
wide or too narrow, a window that looks ahead.

A function whose body is still empty (``pass``, ``...`` or a docstring) counts as not attempted.
"""

from __future__ import annotations

import numpy as np

from . import (
    bool_mask_problem,
    call_learner,
    checker,
    failed,
    is_empty_stub,
    not_attempted,
    passed,
    to_numpy,
)

__all__ = ["check_mla_bytes_per_token", "check_sliding_keep"]

_EX1 = "11b.1 the bytes per token of an MLA cache"
_EX2 = "11b.2 Gemma's sliding window"

# (kv_lora_rank, rope_dim, n_heads, n_layers, bytes_per_number): DeepSeek-V3 in bf16, DeepSeek-V2-Lite-like, a toy
_MLA_CASES = ((512, 64, 128, 61, 2), (512, 64, 16, 27, 2), (16, 8, 4, 3, 4))


@checker(_EX1)
def check_mla_bytes_per_token(fn):
    """``fn(kv_lora_rank, rope_dim, n_heads, n_layers, bytes_per_number)`` -> the bytes an MLA cache
    holds per token, over all layers (an int)."""
    if is_empty_stub(fn):
        return not_attempted(_EX1)
    for r, dr, H, L, nbytes in _MLA_CASES:
        got = call_learner(_EX1, fn, r, dr, H, L, nbytes)
        expected = (r + dr) * L * nbytes
        if isinstance(got, bool) or not isinstance(got, (int, float, np.integer, np.floating)):
            return failed(_EX1, f"Return one number of bytes; got {type(got).__name__}.")
        if not np.isfinite(float(got)):
            return failed(_EX1, f"Your number of bytes is {float(got)}; it should be a finite whole number.")
        if got == expected:
            continue
        if got == r * L * nbytes:
            return failed(_EX1, "The RoPE key is cached too: r + dr numbers per token and layer.")
        if got == 2 * expected:
            return failed(_EX1, "No factor 2 here: the one latent serves keys and values alike.")
        if got == (r * H + dr) * L * nbytes or got == expected * H:
            return failed(_EX1, "The latent and the RoPE key are shared by every head: count them once.")
        return failed(_EX1, f"For r={r}, dr={dr}, {L} layers, {nbytes} bytes per number: expected {expected:,}; got {got!r}.")
    return passed(_EX1, "The cache holds (r + dr) numbers per token and layer, whatever the number of heads.")


@checker(_EX2)
def check_sliding_keep(fn):
    """``fn(T, window)`` -> a boolean (T, T) keep-mask, True where query i may read key j, in the
    convention of Gemma (``transformers``): ``i - window < j <= i``."""
    if is_empty_stub(fn):
        return not_attempted(_EX2)
    for T, w in ((10, 3), (7, 1), (6, 9)):
        got = call_learner(_EX2, fn, T, w)
        problem = bool_mask_problem(got)
        if problem is not None:
            return failed(_EX2, f"Return a (T, T) mask. {problem}")
        arr = to_numpy(got)
        i, j = np.arange(T)[:, None], np.arange(T)[None, :]
        expected = (j <= i) & (j > i - w)
        if arr.shape != expected.shape:
            return failed(_EX2, f"Return shape ({T}, {T}); got {arr.shape}.")
        if np.array_equal(arr, expected):
            continue
        if np.array_equal(arr, (j <= i) & (j >= i - w)):
            return failed(_EX2, "One key too many: the window counts the query's own key, so j > i - window.")
        if np.array_equal(arr, (j <= i) & (j > i - w + 1)):
            return failed(_EX2, "One key too few: query i sees `window` keys, itself included.")
        if np.array_equal(arr, np.abs(i - j) < w):
            return failed(_EX2, "The layer is causal: no key after the query.")
        return failed(_EX2, f"For T={T}, window={w} the mask differs at {int((arr != expected).sum())} places.")
    return passed(_EX2, "Each query sees itself and the window - 1 keys before it.")
