"""Checks for the exercises of chapter 11 (attention at inference).

11.1 the KV cache's size, and its follow-up: how many sequences' caches fit beside the weights; 11.2 grouped-query attention from ``repeat_kv``; 11.3 the top-p (nucleus) set;
11.4 a paged cache's block-table gather; 11.5 a top-p sampler. (Merging two partial results is
exercise 10.1.)
Expected values are computed here with plain Python and NumPy, independently of
:mod:`selfattn.gqa`, :mod:`selfattn.inference` and :mod:`selfattn.sampling`; the usual mistakes are
computed too, and the check names the one the learner's answer matches: the factor 2 for keys and
values forgotten, ``n_heads`` used instead of ``n_kv_heads``, bits instead of bytes; the weights left out of
the memory, or counted one byte each, a partial sequence rounded up, a negative count; heads tiled instead of
interleaved; the token that crosses p left out, the cumulative sum taken in vocabulary order instead of
sorted order; the block table ignored or read off by one; a draw not renormalised to the kept set, or returned
as its position in the sorted order (or as a tensor, not an int).

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
    part_feedback,
    passed,
    to_numpy,
)

__all__ = ["check_kv_cache_bytes", "check_sequences_that_fit", "check_gqa", "check_top_p_keep", "check_block_table_gather", "check_top_p_sample"]

_EX1 = "11.1 the size of the KV cache"
_EX2 = "11.2 grouped-query attention"
_EX3 = "11.3 the top-p set"
_EX4 = "11.4 a paged cache's block table"
_EX5 = "11.5 a top-p sampler"

# (n_layers, n_heads, n_kv_heads, d_head, bytes_per_number, n_tokens): a small MHA model, Llama 3.1 8B
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
        if not np.isfinite(float(got)):
            return failed(_EX1, f"Your number of bytes is {float(got)}; it should be a finite whole number.")
        if got == expected:
            continue
        if got == expected // 2:
            return failed(_EX1, "Half the right size: the cache holds keys and values, a factor 2.")
        if H != H_kv and got == expected // H_kv * H:
            return failed(_EX1, f"With n_heads={H} and n_kv_heads={H_kv} you counted every query head; "
                          "only the key/value heads are cached (grouped-query attention shares them).")
        if got == expected * 8:
            return failed(_EX1, "That is bits: multiply by the bytes per number, not by its bits.")
        if got == expected // n:
            return failed(_EX1, "That is the size per token; multiply by n_tokens for the whole sequence.")
        return failed(_EX1, f"For n_layers={L}, n_kv_heads={H_kv}, d_head={Dh}, {nbytes} bytes per number "
                      f"and {n} tokens the cache takes {expected} bytes; you returned {got}.")
    return passed(_EX1, "2 x n_layers x n_kv_heads x d_head x bytes x tokens: Llama 3.1 8B holds 1 GiB "
                  "of cache for one 8k-token sequence in bfloat16.")


# An H100 80GB's memory as nvidia-smi reports it (memory.total of an H100 80GB HBM3): 81,559 MiB, about 79.6 GiB
# or 85.5e9 bytes, not 80e9.
H100_MEMORY_BYTES = 81_559 * 2**20
# (memory_bytes, n_weights, bytes_per_weight, cache_bytes_per_sequence): Llama 3.1 8B in bfloat16 on an H100 80GB
# with 8k-token sequences (1 GiB each; (85,520,809,984 - 16.06e9) / 2**30 = 64.69 fit, so 64), a small model in
# float32, weights too large.
_FIT_CASES = ((H100_MEMORY_BYTES, 8.03e9, 2, 2 * 32 * 8 * 128 * 2 * 8192), (24e9, 1.5e9, 4, 3_000_000_000),
              (16e9, 8.03e9, 2, 2**30))


@checker(_EX1)
def check_sequences_that_fit(fn):
    """The follow-up of 11.1: ``fn(memory_bytes, n_weights, bytes_per_weight, cache_bytes_per_sequence)`` -> how
    many whole sequences' KV caches fit in the memory the weights leave free (an int, 0 when the weights alone
    fill it): floor((memory_bytes - n_weights bytes_per_weight) / cache_bytes_per_sequence), at least 0."""
    for memory, n_weights, nbytes, per_sequence in _FIT_CASES:
        raw = call_learner(_EX1, fn, memory, n_weights, nbytes, per_sequence)
        if isinstance(raw, torch.Tensor) and raw.numel() == 1:
            raw = raw.item()
        if isinstance(raw, np.ndarray) and raw.size == 1:
            raw = raw.item()
        if isinstance(raw, bool) or not isinstance(raw, (int, float, np.integer, np.floating)):
            return failed(_EX1, f"Follow-up: return one number of sequences (an int); got {type(raw).__name__}"
                                f"{tuple(getattr(raw, 'shape', ())) or ''}.")
        got = float(raw)
        if not np.isfinite(got):
            return failed(_EX1, f"Follow-up: your count is {got}; it should be a finite whole number.")
        free = memory - n_weights * nbytes
        expected = max(0, int(free // per_sequence))
        if got == expected:
            continue
        at = (f"Follow-up, for {memory / 1e9:.3g} GB of memory, {n_weights / 1e9:g} billion weights of {nbytes} bytes "
              f"and {per_sequence:,} bytes of cache per sequence:")
        if got != int(got):
            return failed(_EX1, f"{at} you returned {got:g}, not a whole number: only whole sequences are served; "
                                "round down with // (or int()).")
        if free < 0 and got == int(free // per_sequence):
            return failed(_EX1, f"{at} you returned {int(got)}: the weights alone take more than the memory, so no "
                                "sequence fits; return max(0, ...).")
        if got == max(0, int(memory // per_sequence)):
            return failed(_EX1, f"{at} you divided all the memory by the cache: the weights take their "
                                "n_weights x bytes_per_weight first; divide what they leave.")
        if got == max(0, int((memory - n_weights) // per_sequence)):
            return failed(_EX1, f"{at} you took one byte per weight: subtract n_weights x bytes_per_weight "
                                f"({nbytes} bytes each).")
        if got == int(np.ceil(free / per_sequence)) or got == round(free / per_sequence):
            return failed(_EX1, f"{at} you rounded up: a sequence whose cache does not fit whole cannot be served; "
                                "round down with //.")
        return failed(_EX1, f"{at} {expected} sequences fit; you returned {int(got)}.")
    main = part_feedback(_EX1, "check_kv_cache_bytes")
    if main is not None and main.attempted and not main.ok:  # the cell above shows part 1's red box
        return passed(_EX1, "The follow-up is right, but part 1 (kv_cache_bytes) still fails, so exercise 11.1 is not "
                            "done yet: fix kv_cache_bytes (its message is above) and run the cell again.")
    return passed(_EX1, "Whole caches in what the weights leave: 64 sequences of 8k tokens for Llama 3.1 8B on an "
                        "H100 80GB (81,559 MiB, as nvidia-smi reports it), an upper bound "
                        "(activations and workspace need memory too).")


def _np_attention(Q, K, V):
    """softmax(Q K^T / sqrt(Dh)) V over the last two axes, in NumPy float64."""
    s = Q @ np.swapaxes(K, -1, -2) / np.sqrt(Q.shape[-1])
    w = np.exp(s - s.max(-1, keepdims=True))
    return (w / w.sum(-1, keepdims=True)) @ V


@checker(_EX2)
def check_gqa(fn):
    """``fn(Q (B, H, T, Dh), K (B, H_kv, S, Dh), V (B, H_kv, S, Dh))`` -> the context (B, H, T, Dh) of
    grouped-query attention (no mask): query head h reads key/value head ``h // (H // H_kv)``, the
    heads being repeated with ``repeat_kv`` (each kv head copied ``H // H_kv`` times, next to itself).
    Torch float64 tensors in and out. Ainslie et al. 2023."""
    if is_empty_stub(fn):
        return not_attempted(_EX2)
    rng = np.random.default_rng(12)
    for H, H_kv in ((6, 2), (4, 4), (4, 1)):
        B, T, S, Dh = 2, 3, 5, 4
        Q, K, V = rng.normal(size=(B, H, T, Dh)), rng.normal(size=(B, H_kv, S, Dh)), rng.normal(size=(B, H_kv, S, Dh))
        t = torch.from_numpy
        got = to_numpy(call_learner(_EX2, fn, t(Q.copy()), t(K.copy()), t(V.copy())))
        group = np.arange(H) // (H // H_kv)
        expected = _np_attention(Q, K[:, group], V[:, group])
        where = f"With H={H} query heads and H_kv={H_kv} key/value heads"
        if got is not None and got.shape == expected.shape and np.allclose(got, expected, atol=1e-8, rtol=1e-8):
            continue
        if got is not None and got.shape == expected.shape and np.isfinite(got).all():
            tiled = np.arange(H) % H_kv
            mistakes = (
                (_np_attention(Q, K[:, tiled], V[:, tiled]), "Query head h read key/value head h % H_kv: you tiled the "
                 "heads (torch .repeat or cat of copies) instead of repeating each one in place. Use "
                 "K.repeat_interleave(H // H_kv, dim=1) (or expand then reshape), so heads 0..n_rep-1 share kv head 0."),
                (_np_attention(Q, K[:, :1].repeat(H, 1), V[:, :1].repeat(H, 1)), "Every query head read key/value "
                 "head 0: repeat all H_kv heads, each H // H_kv times."),
                (_np_attention(Q * np.sqrt(Dh), K[:, group], V[:, group]), "You forgot to divide the scores by "
                 "sqrt(Dh)."),
            )
            for candidate, message in mistakes:
                if np.allclose(got, candidate, atol=1e-8):
                    return failed(_EX2, message)
            s = Q @ np.swapaxes(K[:, group], -1, -2) / np.sqrt(Dh)
            w = np.exp(s - s.max(-2, keepdims=True))
            if np.allclose(got, (w / w.sum(-2, keepdims=True)) @ V[:, group], atol=1e-8):
                return failed(_EX2, "Your softmax runs over the queries (dim=-2); each query's weights over the keys "
                                    "must sum to one: softmax(dim=-1).")
        bad = compare_arrays(_EX2, got, expected, what=f"{where}, the context", atol=1e-8, rtol=1e-8)
        if bad is not None:
            return bad
    return passed(_EX2, "repeat_interleave the H_kv heads to H, then ordinary attention: with H_kv = H it is "
                        "multi-head attention, with H_kv = 1 multi-query, and the cache stores only H_kv heads.")


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
            return failed(_EX3, f"Return a boolean tensor, True for the tokens kept; you returned dtype "
                                f"{getattr(got, 'dtype', np.asarray(got).dtype)}. If 1 means kept, convert with .bool().")
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
                          "past p, so the kept mass is below p: keep a token while the mass before it is below p.")
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


def _gather(pool, table, n, shift=0):
    bs = pool.shape[1]
    return np.stack([pool[table[(t + shift) // bs], (t + shift) % bs] for t in range(n)])


@checker(_EX4)
def check_block_table_gather(fn):
    """``fn(pool (n_blocks, block_size, Dh), block_table (n_logical,) int64, n_tokens)`` -> (n_tokens, Dh): one
    sequence's cached keys in position order, read from a paged cache: token t lies in physical block
    ``block_table[t // block_size]``, at slot ``t % block_size``. Torch tensors in and out. Kwon et al.
    2023 (vLLM's PagedAttention)."""
    if is_empty_stub(fn):
        return not_attempted(_EX4)
    rng = np.random.default_rng(14)
    pool = rng.normal(size=(7, 4, 3))
    table = np.array([5, 2, 6, 0])  # a spare last block, allocated ahead
    for n in (10, 8, 1):
        got_raw = call_learner(_EX4, fn, torch.from_numpy(pool.copy()), torch.from_numpy(table.copy()), n)
        got = to_numpy(got_raw)
        expected = _gather(pool, table, n)
        if got is not None and got.shape == (len(table) * 4, 3) and got.shape != expected.shape:
            return failed(_EX4, f"You returned every slot of the sequence's blocks ({got.shape[0]} rows); the last block "
                                f"is only partly filled: keep the first n_tokens = {n} rows.")
        if got is not None and got.shape == expected.shape and np.isfinite(got).all():
            flat = pool.reshape(-1, 3)
            mistakes = (
                (flat[:n], "You read the pool in its own order: the sequence's tokens lie in the blocks the table names, "
                           "token t in pool[block_table[t // block_size], t % block_size]."),
                (np.stack([pool[table[t % 4], t // 4] for t in range(n)]), "You swapped the division and the remainder: the "
                    "logical block is t // block_size and the slot inside it t % block_size."),
                (_gather(pool, table, n, shift=1), "Off by one: your rows are those of positions 1..n_tokens; the first "
                                                   "token is position 0, in block block_table[0], slot 0."),
                (np.stack([pool[table[t // 4], 3 - t % 4] for t in range(n)]), "The slots run backwards: slot t % "
                 "block_size, counted from the start of the block."),
            )
            for candidate, message in mistakes:
                if np.allclose(got, candidate) and not np.allclose(got, expected):
                    return failed(_EX4, message)
        bad = compare_arrays(_EX4, got_raw, expected, what=f"For n_tokens={n} the gathered keys", atol=0, rtol=0)
        if bad is not None:
            return bad
    return passed(_EX4, "pool[block_table[t // block_size], t % block_size] for t < n_tokens: the cache grows a "
                        "block at a time anywhere in the pool, and no memory is reserved for tokens not yet written.")


def _draw(probs, p, u, *, renormalise=True, sorted_order=True, keep_crossing=True):
    order = np.argsort(-probs, kind="stable") if sorted_order else np.arange(len(probs))
    ranked = probs[order]
    before = np.cumsum(ranked) - ranked
    keep = (before < p) if keep_crossing else (np.cumsum(ranked) < p)
    if not sorted_order:  # the top-p set in vocabulary order
        top = np.argsort(-probs, kind="stable")
        kept = np.zeros(len(probs), bool)
        kept[top[(np.cumsum(probs[top]) - probs[top]) < p]] = True
        keep = kept
    kept_probs = np.where(keep, ranked, 0.0)
    cum = np.cumsum(kept_probs) / (kept_probs.sum() if renormalise else 1.0)
    index = int(np.searchsorted(cum, u, side="right"))
    return int(order[min(index, len(order) - 1)])


@checker(_EX5)
def check_top_p_sample(fn):
    """``fn(probs (V,), p, u)`` -> one token id (an int): the top-p draw that the uniform number ``u`` in
    [0, 1) selects. Keep the top-p set (exercise 11.3), renormalise it to sum to one, walk it most probable
    first, and return the first token whose cumulative probability exceeds u (inverse-CDF sampling).
    Holtzman et al. 2020."""
    if is_empty_stub(fn):
        return not_attempted(_EX5)
    probs = np.array([0.05, 0.10, 0.02, 0.25, 0.15, 0.08, 0.30, 0.05 - 1e-3, 1e-3])  # vocabulary order != sorted
    cases = [(0.72, u) for u in (0.05, 0.4, 0.75, 0.93, 0.999)] + [(0.5, 0.6), (1.0, 0.9995)]
    answers = []
    for p, u in cases:
        raw = call_learner(_EX5, fn, torch.from_numpy(probs.copy()), p, u)
        if isinstance(raw, (torch.Tensor, np.ndarray, np.generic)) and np.size(raw) == 1:
            return failed(_EX5, f"Return the token id as a Python int: you returned a {type(raw).__name__} "
                                f"({raw!r}); return int(...) of it.")
        if isinstance(raw, bool) or not isinstance(raw, int):
            return failed(_EX5, f"Return one token id, an int (return int(...) of it); got "
                                f"{type(raw).__name__}{tuple(getattr(raw, 'shape', ())) or ''}.")
        answers.append(int(raw))
    top = int(np.argmax(probs))
    if all(a == top for a in answers):
        return failed(_EX5, "You returned the most probable token for every u (greedy); use u to draw from the kept set.")
    for (p, u), got in zip(cases, answers, strict=True):
        expected = _draw(probs, p, u)
        if got == expected:
            continue
        at = f"At p={p}, u={u}"
        for kwargs, message in (
            (dict(renormalise=False), "you did not renormalise: the kept probabilities sum to less than 1, so a large u "
                                      "walks past the top-p set. Divide the kept probabilities by their sum first."),
            (dict(keep_crossing=False), "you left out the token that carries the mass past p, so the kept set is too "
                                        "small: keep a token while the mass before it is below p."),
            (dict(sorted_order=False), "you walked the kept tokens in vocabulary order: walk them most probable first."),
        ):
            if got == _draw(probs, p, u, **kwargs):
                return failed(_EX5, f"{at} {message}")
        order = np.argsort(-probs, kind="stable")
        if got != expected and 0 <= got < len(probs) and int(order[got]) == expected:
            return failed(_EX5, f"{at} you returned {got}, the position of the draw in the sorted order; map it back "
                                f"through the sort's indices (order[{got}] is token {expected}).")
        return failed(_EX5, f"{at} the draw is token {expected}; you returned {got}.")
    return passed(_EX5, "Sort, keep the top-p set, renormalise, invert the cumulative sum at u: with u drawn "
                        "uniformly this samples each kept token with its renormalised probability.")
