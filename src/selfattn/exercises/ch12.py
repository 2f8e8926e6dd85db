"""Checks for the exercises of chapter 12 (attention across devices).

12.1 the bytes one process sends in ring attention's forward pass; 12.2 the zigzag layout's
positions. Expected values are computed here with plain Python, independently of
:mod:`selfattn.distributed`; the usual mistakes are computed too, and the check names the one the
learner's answer matches: P hops instead of P - 1, keys without values, the whole sequence instead of
a shard, the all-to-all formula; chunks r and P-1-r, striping, the contiguous layout.

A function whose body is still empty (``pass``, ``...`` or a docstring) counts as not attempted.
"""

from __future__ import annotations

import numpy as np

from ..exercises import call_learner, checker, failed, is_empty_stub, not_attempted, passed

__all__ = ["check_ring_forward_bytes", "check_zigzag_positions"]

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
