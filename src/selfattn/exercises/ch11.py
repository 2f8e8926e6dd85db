"""Checks for the exercises of chapter 11 (attention at inference).

11.1 the KV cache's size; 11.2 merging two split-KV partial results; 11.3 the top-p (nucleus) set.
Expected values are computed here with plain Python and NumPy, independently of
:mod:`selfattn.gqa`, :mod:`selfattn.inference` and :mod:`selfattn.sampling`; the usual mistakes are
computed too, and the check names the one the learner's answer matches: the factor 2 for keys and
values forgotten, ``n_heads`` used instead of ``n_kv_heads``, bits instead of bytes; partial sums added
without rescaling, rescaled the wrong way, NaN where a chunk saw no key; the token that crosses p left
out, the cumulative sum taken in vocabulary order instead of sorted order.

A function whose body is still empty (``pass``, ``...`` or a docstring) counts as not attempted.
"""

from __future__ import annotations

import numpy as np
import torch

from . import (
    bool_mask_problem,
    call_learner,
    checker,
    compare_arrays,
    failed,
    is_empty_stub,
    not_attempted,
    passed,
    to_numpy,
)

__all__ = ["check_kv_cache_bytes", "check_merge_partials", "check_top_p_keep"]

_EX1 = "11.1 the size of the KV cache"
_EX2 = "11.2 merge two partial results"
_EX3 = "11.3 the top-p set"

# (n_layers, n_heads, n_kv_heads, d_head, bytes_per_number, n_tokens): a small MHA model, Llama 3 8B
# in bfloat16 at 8k tokens, a multi-query model in float32.
_CACHE_CASES = ((6, 12, 12, 32, 4, 128), (32, 32, 8, 128, 2, 8192), (4, 8, 1, 64, 4, 1000))


@checker(_EX1)
def check_kv_cache_bytes(fn):
    """``fn(n_layers, n_heads, n_kv_heads, d_head, bytes_per_number, n_tokens)`` -> the bytes the KV
    cache of one sequence of ``n_tokens`` tokens takes (an int)."""
    if is_empty_stub(fn):
        return not_attempted(_EX1)
    for L, H, H_kv, Dh, nbytes, n in _CACHE_CASES:
        got = call_learner(_EX1, fn, L, H, H_kv, Dh, nbytes, n)
        expected = 2 * L * H_kv * Dh * nbytes * n
        if isinstance(got, bool) or not isinstance(got, (int, float, np.integer, np.floating)):
            return failed(_EX1, f"Return one number of bytes; got {type(got).__name__}.")
        if got == expected:
            continue
        if got == expected // 2:
            return failed(_EX1, "Half the right size: the cache holds keys *and* values, a factor 2.")
        if H != H_kv and got == expected // H_kv * H:
            return failed(_EX1, f"With n_heads={H} and n_kv_heads={H_kv} you counted every query head; "
                          "only the key/value heads are cached (grouped-query attention shares them).")
        if got == expected * 8:
            return failed(_EX1, "That is bits: multiply by the bytes per number, not by its bits.")
        if got == expected // n:
            return failed(_EX1, "That is the size per token; multiply by n_tokens for the whole sequence.")
        return failed(_EX1, f"For n_layers={L}, n_kv_heads={H_kv}, d_head={Dh}, {nbytes} bytes per number "
                      f"and {n} tokens the cache takes {expected} bytes; you returned {got}.")
    return passed(_EX1, "2 x n_layers x n_kv_heads x d_head x bytes x tokens: Llama 3 8B holds 1 GiB "
                  "of cache for one 8k-token sequence in bfloat16.")


def _merge_reference(m_a, l_a, acc_a, m_b, l_b, acc_b):
    m = np.maximum(m_a, m_b)
    # a row where neither chunk saw a key stays empty (max -inf, sum 0); exp(-inf - -inf) would be NaN
    safe = np.where(np.isfinite(m), m, 0.0)
    s_a, s_b = np.exp(m_a - safe), np.exp(m_b - safe)
    return m, s_a * l_a + s_b * l_b, s_a[:, None] * acc_a + s_b[:, None] * acc_b


def _partial(scores: np.ndarray, v: np.ndarray):
    """(max, sum, accumulator) of one chunk of keys; -inf scores are keys the query cannot see."""
    m = scores.max(axis=-1)
    safe = np.where(np.isfinite(m), m, 0.0)
    p = np.exp(scores - safe[:, None])
    return m, p.sum(axis=-1), p @ v


@checker(_EX2)
def check_merge_partials(fn):
    """``fn(m_a, l_a, acc_a, m_b, l_b, acc_b)`` -> ``(m, l, acc)``: two chunks' partial results, each a
    row max (T,), a sum of exponentials (T,) and an unnormalised accumulator (T, Dv), merged into the
    partial result of both chunks together. Torch float64 tensors in and out."""
    if is_empty_stub(fn):
        return not_attempted(_EX2)
    rng = np.random.default_rng(11)
    T, S, Dv = 4, 10, 3
    scores = rng.normal(size=(T, S)) * 3.0
    scores[3, :] = -np.inf  # row 3 sees no key in either chunk (padding): it must stay empty
    scores[2, 6:] = -np.inf  # row 2 sees no key of chunk b: chunk b contributes nothing to it
    v = rng.normal(size=(S, Dv))
    a, b = _partial(scores[:, :6], v[:6]), _partial(scores[:, 6:], v[6:])
    t = torch.from_numpy
    result = call_learner(_EX2, fn, *(t(x.copy()) for x in (*a, *b)))
    if not (isinstance(result, (tuple, list)) and len(result) == 3):
        return failed(_EX2, "Return the triple (m, l, acc): the merged max, sum and accumulator.")
    got = [to_numpy(x) for x in result]
    expected = _merge_reference(*a, *b)
    if got[1] is not None and got[1].shape == (T,) and np.allclose(got[1][:3], a[1][:3] + b[1][:3]):
        return failed(_EX2, "You added the two sums as they are, but each was taken relative to its own "
                      "max: rescale each by exp(m_chunk - m_new) before adding (the online softmax of chapter 10).")
    m_new = expected[0]
    with np.errstate(invalid="ignore", over="ignore"):
        wrong_way = np.exp(m_new - a[0])[:3] * a[1][:3] + np.exp(m_new - b[0])[:3] * b[1][:3]
    if got[1] is not None and got[1].shape == (T,) and np.allclose(got[1][:2], wrong_way[:2]):
        return failed(_EX2, "The rescaling goes the other way: a chunk whose max is below the new max "
                      "shrinks, by exp(m_chunk - m_new) <= 1.")
    if got[1] is not None and got[1].shape == (T,) and np.isnan(got[1][3]):
        return failed(_EX2, "Row 3 sees no key in either chunk (both maxima are -inf), and your merge gave "
                      "NaN there: exp(-inf - (-inf)) is NaN. Keep such a row empty: max -inf, sum 0, accumulator 0.")
    if got[2] is not None and got[2].shape == expected[2].shape:
        with np.errstate(invalid="ignore", divide="ignore"):
            normalised = expected[2] / expected[1][:, None]
        rows = slice(0, 3)  # the rows that see a key
        if np.allclose(got[2][rows], normalised[rows], atol=1e-10):
            return failed(_EX2, "Your acc is the normalised context (acc / l): keep the accumulator unnormalised, "
                          "sum_j e^(s_j - m) v_j, so that it can be merged again; divide by l only once, at the end.")
    got_m, e_m = got[0], expected[0]
    finite = np.isfinite(e_m)
    if (got_m is None or got_m.shape != e_m.shape or not np.array_equal(np.isneginf(got_m), ~finite)
            or not np.allclose(got_m[finite], e_m[finite], atol=1e-12, rtol=0)):
        return failed(_EX2, "The merged max is max(m_a, m_b) per row, (T,), and stays -inf where neither "
                      "chunk saw a key.")
    for x, e, what in ((got[1], expected[1], "sum l"), (got[2], expected[2], "accumulator acc")):
        bad = compare_arrays(_EX2, x, e, what=f"the merged {what}", atol=1e-10, rtol=1e-10)
        if bad is not None:
            return bad
    return passed(_EX2, "Both partials rescaled to the new max and added: the merge is associative and "
                  "commutative, so chunks can be processed on different cores in any order.")


@checker(_EX3)
def check_top_p_keep(fn):
    """``fn(probs (V,), p)`` -> a boolean tensor (V,): True for the tokens of the top-p set, the
    smallest set of most probable tokens whose probabilities sum to at least p. Torch in and out;
    the probabilities given have no ties. ``p = 1`` keeps every token."""
    if is_empty_stub(fn):
        return not_attempted(_EX3)
    probs = np.array([0.05, 0.30, 0.02, 0.25, 0.15, 0.08, 0.10, 0.05 - 1e-3, 1e-3])  # one tie-free order
    for p in (0.5, 0.72, 0.9, 1.0):  # no p equal to a partial sum: floats would decide those
        got = call_learner(_EX3, fn, torch.from_numpy(probs.copy()), p)
        order = np.argsort(-probs, kind="stable")
        before = np.cumsum(probs[order]) - probs[order]  # mass of the more probable tokens
        expected = np.zeros(len(probs), dtype=bool)
        expected[order[before < p]] = True
        arr = to_numpy(got)
        if arr is None or arr.shape != expected.shape:
            return failed(_EX3, f"Return one boolean per token, shape {expected.shape}; got "
                          f"{getattr(got, 'shape', type(got).__name__)}.")
        problem = bool_mask_problem(got)
        if problem is not None:
            return failed(_EX3, f"Return a boolean tensor, True for the tokens kept: {problem}")
        keep = arr.astype(bool)
        if np.array_equal(keep, expected):
            continue
        in_sorted_order = np.zeros(len(probs), dtype=bool)
        in_sorted_order[: int(expected.sum())] = True
        if np.array_equal(keep, in_sorted_order):
            return failed(_EX3, "Your mask is in sorted order (True for the first positions after sorting); map it "
                          "back to the vocabulary with the indices the sort returns.")
        excluding = np.zeros(len(probs), dtype=bool)
        excluding[order[np.cumsum(probs[order]) < p]] = True
        if np.array_equal(keep, excluding):
            return failed(_EX3, f"At p={p} you stopped before the token whose probability carries the sum "
                          "past p, so the kept mass is below p: keep a token while the mass *before* it is below p.")
        unsorted = np.cumsum(probs) - probs < p
        if np.array_equal(keep, unsorted):
            return failed(_EX3, "You summed the probabilities in vocabulary order; sort them, most probable first.")
        return failed(_EX3, f"At p={p} the top-p set is the tokens {sorted(np.flatnonzero(expected).tolist())}; "
                      f"you kept {sorted(np.flatnonzero(keep).tolist())}.")
    # A real next-token distribution in float32: its cumulative sum reaches 1.0 before the last
    # (tiny) probabilities, so "mass before < 1" drops tokens that p = 1 must keep.
    logits = torch.from_numpy(np.random.default_rng(5).normal(size=94) * 4.0).float()
    real = torch.softmax(logits, dim=-1)
    keep = to_numpy(call_learner(_EX3, fn, real.clone(), 1.0))
    if keep is None or keep.shape != (94,):
        return failed(_EX3, f"Return one boolean per token, shape (94,), for a float32 distribution of 94 tokens; got "
                      f"{None if keep is None else keep.shape}.")
    if not keep.astype(bool).all():
        return failed(_EX3, f"At p=1 every token must be kept, but you dropped {int((~keep.astype(bool)).sum())} of 94 "
                      "from a float32 softmax: its rounded cumulative sum reaches 1 before the last tiny "
                      "probabilities. Treat p >= 1 as keeping every token.")
    return passed(_EX3, "Sorted, most probable first, kept while the mass before each token is below p, and "
                  "p = 1 keeps every token even where rounding makes the running sum reach 1 early.")
