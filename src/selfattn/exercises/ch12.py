"""Checks for the exercises of chapter 12 (attention across devices).

12.1 all-to-all attention's first all-to-all, sequence shards to head shards; 12.2 the zigzag layout's
positions; 12.3 one rank's ring loop (in one process, the ring simulated); 12.4 the zigzag layout undone.
Expected values are computed here with plain Python and NumPy, independently of
:mod:`selfattn.distributed`; the usual mistakes are computed too, and the check names the one the
learner's answer matches: strided heads, the positions reversed, every head kept; chunks r and P-1-r,
striping, the contiguous layout; P hops instead of P - 1, the wrong block's mask, a forgotten rescale;
shards concatenated as they are, late chunks in rank order.

A function whose body is still empty (``pass``, ``...`` or a docstring) counts as not attempted.
"""

from __future__ import annotations

import numpy as np
import torch

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

__all__ = ["check_all_to_all", "check_zigzag_positions", "check_ring_loop", "check_unshard_zigzag"]

_EX1 = "12.1 the all-to-all, sequence to heads"
_EX2 = "12.2 the zigzag layout"

@checker(_EX1)
def check_all_to_all(fn):
    """``fn(shards, rank)`` -> (B, H / P, T, Dh): what rank ``rank`` holds after all-to-all attention's first
    all-to-all (DeepSpeed-Ulysses, Jacobs et al. 2023). ``shards`` is the list of the P sequence shards, shard s
    (B, H, T / P, Dh) holding positions s T/P .. (s + 1) T/P - 1 of every head; afterwards rank r holds heads
    r H/P .. (r + 1) H/P - 1 over the whole sequence, positions in order. Torch tensors; checked in one process."""
    if is_empty_stub(fn):
        return not_attempted(_EX1)
    rng = np.random.default_rng(21)
    B, H, T, Dh, P = 2, 8, 12, 2, 4
    n, h = T // P, H // P
    full = rng.normal(size=(B, H, T, Dh))
    shards = [full[:, :, s * n:(s + 1) * n] for s in range(P)]
    for rank in (1, 3, 0):
        got_raw = call_learner(_EX1, fn, [torch.from_numpy(x.copy()) for x in shards], rank)
        got = to_numpy(got_raw)
        expected = full[:, rank * h:(rank + 1) * h]
        at = f"On rank {rank} of {P} (H = {H}, T = {T})"
        if got is not None and got.shape == (B, H, T, Dh):
            return failed(_EX1, f"{at} you kept every head: after the all-to-all a rank holds H / P = {h} heads, "
                                f"heads rank * H/P .. (rank + 1) * H/P - 1, over all T positions.")
        if got is not None and got.shape == (B, h, n, Dh):
            return failed(_EX1, f"{at} you kept only this rank's own positions: the all-to-all gathers the chosen "
                                "heads from every rank's shard, so the result covers all T positions.")
        if got is not None and got.shape == (B, H, n, Dh):
            return failed(_EX1, f"{at} you concatenated the pieces along the heads: every piece holds the same "
                                "heads for other positions, so concatenate along the positions (dim=2).")
        if got is not None and got.shape == expected.shape and np.isfinite(got).all() and not np.allclose(got, expected):
            for value, message in (
                (full[:, rank::P], "you took heads rank, rank + P, ... (strided): rank r holds the contiguous heads "
                                   "r H/P .. (r + 1) H/P - 1."),
                (np.concatenate([x[:, rank * h:(rank + 1) * h] for x in shards[::-1]], axis=2),
                 "the positions come out in reverse order: concatenate the pieces in rank order, shard 0 first."),
                (np.concatenate([x[:, rank * h:(rank + 1) * h] for x in shards], axis=2)[:, ::-1],
                 "the heads come out in reverse order: keep them as they are within the rank's slice."),
            ):
                if np.allclose(got, value):
                    return failed(_EX1, f"{at} {message}")
        bad = compare_arrays(_EX1, got_raw, expected, what=f"{at} the result", atol=0, rtol=0)
        if bad is not None:
            return bad
    return passed(_EX1, "From every rank, this rank's heads: torch.cat([s[:, r * H/P:(r + 1) * H/P] for s in shards], "
                        "dim=2). Each rank then runs ordinary attention over the whole sequence for its heads; "
                        "a second all-to-all swaps back.")


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
_EX4 = "12.4 the zigzag layout undone"


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
def check_unshard_zigzag(fn):
    """``fn(shards)`` -> (B, H, T, Dh): the whole sequence put back together from the P shards of the zigzag
    layout, shard r (B, H, 2c, Dh) holding chunk r (positions r c .. (r + 1) c - 1) followed by chunk 2P - 1 - r,
    with T = 2 P c. Torch tensors in and out."""
    if is_empty_stub(fn):
        return not_attempted(_EX4)
    rng = np.random.default_rng(22)
    for P, c in ((4, 2), (2, 3), (3, 1)):
        B, H, Dh, T = 1, 2, 2, 2 * P * c
        full = rng.normal(size=(B, H, T, Dh))
        chunks = [full[:, :, j * c:(j + 1) * c] for j in range(2 * P)]
        shards = [np.concatenate([chunks[r], chunks[2 * P - 1 - r]], axis=2) for r in range(P)]
        got_raw = call_learner(_EX4, fn, [torch.from_numpy(x.copy()) for x in shards])
        got = to_numpy(got_raw)
        at = f"With P = {P} shards of 2 chunks of {c} positions"
        if got is not None and got.shape == full.shape and np.isfinite(got).all() and not np.allclose(got, full):
            for value, message in (
                (np.concatenate(shards, axis=2), "you concatenated the shards as they are, which undoes the contiguous "
                                                 "layout: each shard holds an early and a late chunk."),
                (np.concatenate([x[:, :, :c] for x in shards] + [x[:, :, c:] for x in shards], axis=2),
                 "the late chunks come in the wrong order: rank r's late chunk is chunk 2P - 1 - r, so they follow "
                 "in reverse rank order, rank P - 1's first."),
                (full[:, :, ::-1], "the sequence comes out reversed: the early chunks (each shard's first half, in rank order) come "
                 "first."),
            ):
                if np.allclose(got, value):
                    return failed(_EX4, f"{at} {message}")
        bad = compare_arrays(_EX4, got_raw, full, what=f"{at} the sequence", atol=0, rtol=0)
        if bad is not None:
            return bad
    return passed(_EX4, "The first halves in rank order, then the second halves in reverse rank order: chunk j < P "
                        "is shard j's early chunk, chunk j >= P shard 2P - 1 - j's late chunk.")
