"""Checks for the exercises of chapter 12 (attention across devices).

12.1 the bytes one process sends in ring attention's forward pass; 12.2 the zigzag layout's
positions; 12.3 one rank's ring loop (in one process, the ring simulated); 12.4 each rank's causal work
with the contiguous layout. Expected values are computed here with plain Python, independently of
:mod:`selfattn.distributed`; the usual mistakes are computed too, and the check names the one the
learner's answer matches: P hops instead of P - 1, keys without values, the whole sequence instead of
a shard, the all-to-all formula; chunks r and P-1-r, striping, the contiguous layout.

A function whose body is still empty (``pass``, ``...`` or a docstring) counts as not attempted.
"""

from __future__ import annotations

import numpy as np

from ..exercises import (
    call_learner,
    checker,
    compare_arrays,
    failed,
    is_empty_stub,
    not_attempted,
    passed,
    to_numpy,
)

__all__ = ["check_ring_forward_bytes", "check_zigzag_positions", "check_ring_loop", "check_ring_work"]

_EX1 = "12.1 the bytes of a ring"
_EX2 = "12.2 the zigzag layout"

# (B, H, T, Dh, P, element_size): a bfloat16 long-context shard on 8 (first: there every mistake gives
# a different number), the chapter's run, a float32 pair (where ring and all-to-all send alike)
_BYTE_CASES = ((1, 32, 131072, 128, 8, 2), (1, 4, 32, 8, 4, 8), (2, 8, 1024, 64, 2, 4))


@checker(_EX1)
def check_ring_forward_bytes(fn):
    """``fn(B, H, T, Dh, P, element_size)`` -> bytes one process sends in ring attention's forward pass
    (self-attention, no padding mask): an int."""
    if is_empty_stub(fn):
        return not_attempted(_EX1)
    for B, H, T, Dh, P, e in _BYTE_CASES:
        got = call_learner(_EX1, fn, B, H, T, Dh, P, e)
        if isinstance(got, bool) or not isinstance(got, (int, float, np.integer, np.floating)):
            return failed(_EX1, f"Return one number of bytes; got {type(got).__name__}.")
        tensor = B * H * (T // P) * Dh * e  # one shard of K (or of V)
        expected = (P - 1) * 2 * tensor
        if got == expected:
            continue
        if got == P * 2 * tensor:
            return failed(_EX1, "That is P hops: the first block is the process's own, so P - 1 blocks arrive "
                          "and P - 1 are sent on (the last block it holds goes nowhere).")
        if got == (P - 1) * tensor:
            return failed(_EX1, "Half the right size: both K and V travel around the ring.")
        if got == (P - 1) * 2 * B * H * T * Dh * e:
            return failed(_EX1, "Each hop carries one shard of T/P positions, not the whole sequence.")
        if got * P == 4 * (P - 1) * tensor:
            return failed(_EX1, "That is the all-to-all formula, 4 (P - 1)/P shards; the ring sends 2 shards P - 1 times.")
        return failed(_EX1, f"For B={B}, H={H}, T={T}, Dh={Dh}, P={P} and {e} bytes per number a process sends "
                      f"{expected} bytes; you returned {got}.")
    return passed(_EX1, "(P - 1) x 2 x B x H x (T/P) x Dh x bytes: for a 128k-token sequence on 8 GPUs, 32 "
                  "heads of 128, a process sends 1.75 GiB of keys and values per layer in bfloat16.")


def _zigzag(T, P, r):
    c = T // (2 * P)
    return list(range(r * c, (r + 1) * c)) + list(range((2 * P - 1 - r) * c, (2 * P - r) * c))


def _as_positions(got):
    try:
        values = [int(x) for x in (got.tolist() if hasattr(got, "tolist") else got)]
    except (TypeError, ValueError):
        return None
    return values


@checker(_EX2)
def check_zigzag_positions(fn):
    """``fn(T, P, rank)`` -> the positions (a list of ints, any order) that rank ``rank`` holds in the
    zigzag layout: chunks ``rank`` and ``2P - 1 - rank`` of ``2P`` chunks of ``T / (2P)`` positions."""
    if is_empty_stub(fn):
        return not_attempted(_EX2)
    for T, P in ((32, 4), (16, 2), (24, 3)):
        for r in reversed(range(P)):  # the last rank first: there every mistake gives other positions
            got = _as_positions(call_learner(_EX2, fn, T, P, r))
            if got is None:
                return failed(_EX2, "Return the positions as a list of ints (or a 1-D tensor or array).")
            want = _zigzag(T, P, r)
            if sorted(got) == want:
                continue
            c, n = T // (2 * P), T // P
            if sorted(got) == sorted(list(range(r * c, (r + 1) * c)) + list(range((P - 1 - r) * c, (P - r) * c))):
                return failed(_EX2, "Chunks r and P-1-r: there are 2P chunks, so the partner of chunk r is 2P-1-r.")
            if sorted(got) == list(range(r, T, P)):
                return failed(_EX2, "That is striping (positions r, r + P, ...; Brandon et al. 2023): nearly "
                              "balanced too, but not the zigzag layout.")
            if sorted(got) == list(range(r * n, (r + 1) * n)):
                return failed(_EX2, "That is the contiguous layout: one block of T/P positions.")
            return failed(_EX2, f"For T={T}, P={P} rank {r} holds {want}; you returned {sorted(got)}.")
    return passed(_EX2, "One early chunk and one late chunk each: every rank gets the same causal work.")


_EX3 = "12.3 one rank's ring loop"
_EX4 = "12.4 the causal work of each rank"


class _Ring:
    """One rank's view of a simulated ring of P processes holding contiguous shards of K and V:
    ``send_recv(k, v)`` passes the block this rank holds to rank + 1 and returns the one from rank - 1.
    Records what was sent, so that the check can say what went wrong."""

    def __init__(self, k_shards, v_shards, rank):
        self.k, self.v, self.rank, self.P = k_shards, v_shards, rank, len(k_shards)
        self.calls, self.wrong_send = 0, None

    def send_recv(self, k, v):
        held = (self.rank - self.calls) % self.P  # the block this rank holds before this hop
        sent_k, sent_v = to_numpy(k), to_numpy(v)
        if self.wrong_send is None and not (sent_k is not None and sent_k.shape == self.k[held].shape
                                            and np.array_equal(sent_k, self.k[held])
                                            and sent_v is not None and sent_v.shape == self.v[held].shape
                                            and np.array_equal(sent_v, self.v[held])):
            self.wrong_send = self.calls
        self.calls += 1
        src = (self.rank - self.calls) % self.P
        return self.k[src].copy(), self.v[src].copy()


def _ring_output(q, k_shards, v_shards, rank, *, src_sign=-1, mask_diagonal=True, skip_future=True,
                 rescale=True):
    """Rank ``rank``'s causal output, by its ring loop, right or with one typical mistake."""
    P, c = len(k_shards), q.shape[0]
    m, l, acc = np.full(c, -np.inf), np.zeros(c), np.zeros((c, v_shards[0].shape[1]))
    for step in range(P):
        actual = (rank - step) % P  # what the rank holds
        believed = (rank + src_sign * step) % P  # what it thinks it holds
        if skip_future and believed > rank:
            continue
        s = q @ k_shards[actual].T / np.sqrt(q.shape[1])
        if mask_diagonal and believed == rank:
            s = np.where(np.tril(np.ones((c, c), bool)), s, -np.inf)
        m_new = np.maximum(m, s.max(-1))
        p = np.exp(s - m_new[:, None])
        corr = np.exp(m - m_new) if rescale else np.ones(c)
        l, acc, m = l * corr + p.sum(-1), acc * corr[:, None] + p @ v_shards[actual], m_new
    return acc / l[:, None]


@checker(_EX3)
def check_ring_loop(fn):
    """``fn(rank, P, q, k, v, send_recv)`` -> the causal attention output (c, Dv) of rank ``rank``'s c queries,
    with the contiguous layout (rank r holds positions r c .. (r + 1) c - 1 of q, k and v: NumPy arrays).
    Loop over P steps: at step s the rank holds the key/value block of rank (rank - s) % P; attend to it
    (skip a block of later positions, mask the diagonal one causally), merge with the online softmax, and
    call ``k, v = send_recv(k, v)`` to pass the block on and receive the next (P - 1 times). Checked in one
    process: ``send_recv`` simulates the ring. Liu et al. 2023 (ring attention)."""
    if is_empty_stub(fn):
        return not_attempted(_EX3)
    rng = np.random.default_rng(12)
    P, c, Dh = 4, 3, 4
    q_all, k_all, v_all = rng.normal(size=(P * c, Dh)) * 1.5, rng.normal(size=(P * c, Dh)) * 1.5, rng.normal(size=(P * c, 2))
    k_all[1] *= 5  # an early large score: a missing rescale shows
    ks, vs = [k_all[r * c:(r + 1) * c] for r in range(P)], [v_all[r * c:(r + 1) * c] for r in range(P)]
    for rank in (2, 3, 0, 1):
        ring = _Ring(ks, vs, rank)
        q = q_all[rank * c:(rank + 1) * c]
        got_raw = call_learner(_EX3, fn, rank, P, q.copy(), ks[rank].copy(), vs[rank].copy(), ring.send_recv)
        at = f"On rank {rank} of {P}"
        if ring.calls == P:
            return failed(_EX3, f"{at} you called send_recv {P} times: the first block is the rank's own, so P - 1 hops "
                                "bring every other block; the last block received goes nowhere.")
        if ring.calls < P - 1:
            return failed(_EX3, f"{at} you called send_recv {ring.calls} times; P - 1 = {P - 1} hops are needed to see "
                                "every rank's block (call it after each step but the last).")
        if ring.wrong_send is not None:
            return failed(_EX3, f"{at} at hop {ring.wrong_send} you sent a block other than the one you hold: pass on "
                                "what you just received, k, v = send_recv(k, v).")
        s = q @ k_all.T / np.sqrt(Dh)  # the rank's rows of full causal attention
        i, j = np.arange(rank * c, (rank + 1) * c)[:, None], np.arange(P * c)[None, :]
        s = np.where(j <= i, s, -np.inf)
        w = np.exp(s - s.max(-1, keepdims=True))
        expected = (w / w.sum(-1, keepdims=True)) @ v_all
        got = to_numpy(got_raw)
        if got is not None and got.shape == expected.shape and np.isfinite(got).all() and not np.allclose(
                got, expected, atol=1e-10):
            mistakes = (
                (dict(src_sign=1), "You took the block at step s to be rank (rank + s)'s; blocks travel to rank + 1, "
                                   "so at step s a rank holds the block of rank (rank - s) % P."),
                (dict(mask_diagonal=False), "The block of the rank's own positions needs the causal mask: there "
                                            "query i may read key j only for j <= i."),
                (dict(skip_future=False), "You attended to blocks of later positions: with the contiguous layout a "
                                          "block from a rank after this one is all in the future; skip it."),
                (dict(rescale=False), "When a block raises the running maximum, multiply the running sum and the "
                                      "accumulator by exp(m_old - m_new) before adding it (the online softmax)."),
            )
            for kwargs, message in mistakes:
                if np.allclose(got, _ring_output(q, ks, vs, rank, **kwargs), atol=1e-10):
                    return failed(_EX3, f"{at}: {message}")
        bad = compare_arrays(_EX3, got_raw, expected, what=f"{at} the output", atol=1e-10, rtol=1e-10)
        if bad is not None:
            return bad
    return passed(_EX3, "P steps, P - 1 hops, one online-softmax merge per block: each rank ends with its own rows "
                        "of exact causal attention, having held only one other block at a time.")


@checker(_EX4)
def check_ring_work(fn):
    """``fn(T, P)`` -> a list of P ints: for causal self-attention over T positions with the contiguous layout
    (rank r holds positions r T/P .. (r + 1) T/P - 1), the number of (query, key) pairs with key <= query
    that rank r computes. T is a multiple of P."""
    if is_empty_stub(fn):
        return not_attempted(_EX4)
    for T, P in ((12, 4), (8, 2), (30, 3)):
        got = _as_positions(call_learner(_EX4, fn, T, P))
        if got is None or len(got) != P:
            return failed(_EX4, f"Return a list of P = {P} ints, one per rank; got "
                                f"{'something else' if got is None else f'{len(got)} numbers'}.")
        c = T // P
        expected = [r * c * c + c * (c + 1) // 2 for r in range(P)]
        if got == expected:
            continue
        mistakes = (
            ([(r + 1) * c * c for r in range(P)], "You counted the diagonal block whole: only its pairs with key <= "
                                                  "query count, c (c + 1) / 2 of its c^2."),
            ([r * c * c + c * (c - 1) // 2 for r in range(P)], "Off by one: a query sees itself too (key <= query), "
                                                               "so the diagonal block has c (c + 1) / 2 pairs."),
            ([T * (T + 1) // 2 // P] * P, "That is the even share, T (T + 1) / 2 / P for every rank; with the contiguous "
                                          "layout the last rank sees every earlier block and does far more."),
            ([(P - 1 - r) * c * c + c * (c + 1) // 2 for r in range(P)], "Reversed: rank 0 holds the first positions, "
                                                                         "which see the fewest keys."),
        )
        for value, message in mistakes:
            if got == value:
                return failed(_EX4, message)
        return failed(_EX4, f"For T={T}, P={P} the ranks compute {expected} pairs; you returned {got}.")
    return passed(_EX4, "r c^2 + c (c + 1) / 2: the last rank does about 2P - 1 times the first one's work, the "
                        "imbalance that the zigzag layout of exercise 12.2 removes.")
