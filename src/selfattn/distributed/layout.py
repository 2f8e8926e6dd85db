"""How a sequence is cut across P processes, and how much causal work each one gets (chapter 12).

Two layouts of a sequence of T positions over P ranks:

- ``"contiguous"``: rank r holds positions ``[r T/P, (r + 1) T/P)``. Under a causal mask the last
  rank's queries see every key and the first rank's only its own block: the work is uneven.
- ``"zigzag"``: the sequence is cut into 2P chunks of T/(2P) positions; rank r holds chunks r and
  2P-1-r (one early, one late), concatenated in that order. Every rank then has the same number of
  visible query-key pairs (:func:`causal_work`). It is the load-balanced chunking of Llama 3's
  context parallelism (Dubey et al. 2024, "The Llama 3 Herd of Models", section 3.3.2), though
  Llama 3 gathers the keys and values with an all-gather rather than passing them around a ring;
  Brandon et al. (2023, striped attention) balance the same work by striping single positions instead.

Source: chapter 12.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from .._validate import require_positive_int, require_tensor, shape_of

__all__ = ["LAYOUTS", "require_layout", "shard_positions", "shard_sequence", "unshard_sequence",
           "CausalWork", "causal_work", "causal_work_formula", "even_work_cpu_text"]

LAYOUTS = ("contiguous", "zigzag")


def require_layout(layout) -> str:
    """Return ``layout``; raise ValueError unless it is one of :data:`LAYOUTS`."""
    if not isinstance(layout, str) or layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}; got {layout!r}")
    return layout


def _check_split(T: int, P: int, layout: str) -> None:
    """The clear error for a length the layout cannot cut evenly."""
    parts = P if layout == "contiguous" else 2 * P
    if T % parts:
        raise ValueError(f"the {layout} layout cuts a sequence into {parts} equal pieces "
                         f"({'P' if layout == 'contiguous' else '2P'} with P={P}), so T must be divisible by {parts}; "
                         f"got T={T}")


def shard_positions(T: int, P: int, layout: str, rank: int) -> torch.Tensor:
    """(T/P,) int64: the positions in the full sequence of rank ``rank``'s shard, in shard order.

    Raises:
        TypeError / ValueError: T or P not a positive int, an unknown layout, ``rank`` outside
        ``[0, P)``, T not divisible by P (contiguous) or 2P (zigzag); the message names T, P and the layout.
    """
    T, P = require_positive_int("T", T), require_positive_int("P", P)
    layout = require_layout(layout)
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < P:
        raise ValueError(f"rank must be an int in [0, P={P}); got {rank!r}")
    _check_split(T, P, layout)
    if layout == "contiguous":
        n = T // P
        return torch.arange(rank * n, (rank + 1) * n)
    c = T // (2 * P)  # chunk length
    early, late = rank, 2 * P - 1 - rank
    return torch.cat([torch.arange(early * c, (early + 1) * c), torch.arange(late * c, (late + 1) * c)])


def shard_sequence(x: torch.Tensor, P: int, layout: str, rank: int, dim: int = -2) -> torch.Tensor:
    """Rank ``rank``'s shard of ``x`` along the sequence axis ``dim`` (a copy).

    Args:
        x: a tensor whose axis ``dim`` has length T, e.g. q of shape (B, H, T, Dh) (``dim=-2``) or a
            key-padding mask (B, T) (``dim=-1``).

    Returns:
        ``x`` with axis ``dim`` cut to the T/P positions :func:`shard_positions` names.

    Raises:
        TypeError / ValueError: as :func:`shard_positions`; ``x`` not a tensor or ``dim`` out of range.
    """
    require_tensor("x", x)
    if not -x.ndim <= dim < x.ndim:
        raise ValueError(f"dim must index an axis of x (shape {shape_of(x)}); got {dim}")
    idx = shard_positions(x.shape[dim], P, layout, rank).to(x.device)
    return x.index_select(dim, idx)


def unshard_sequence(shards, layout: str, dim: int = -2) -> torch.Tensor:
    """The full tensor from the P shards (rank order) that :func:`shard_sequence` cut: its inverse.

    Raises:
        ValueError: no shard, shards of different shapes, an unknown layout.
    """
    shards = list(shards)
    layout = require_layout(layout)
    if not shards or any(not isinstance(s, torch.Tensor) or s.shape != shards[0].shape for s in shards):
        raise ValueError("shards must be a non-empty sequence of tensors of one shape (one per rank, in rank order)")
    P, n = len(shards), shards[0].shape[dim]
    T = P * n
    order = torch.cat([shard_positions(T, P, layout, r) for r in range(P)])  # where each gathered row belongs
    gathered = torch.cat(shards, dim=dim)
    return gathered.index_select(dim, torch.argsort(order).to(gathered.device))


class CausalWork(NamedTuple):
    """Causal work per rank under one layout.

    Attributes:
        pairs: list of P ints, the visible (query, key) pairs of each rank's queries (i >= j).
        blocks: list of P ints, the key blocks (of the P that travel the ring) with at least one
            visible pair for the rank's queries: the blocks it computes rather than skips.
        imbalance: max(pairs) / mean(pairs): 1.0 is perfectly even.
    """

    pairs: list
    blocks: list
    imbalance: float


def causal_work(T: int, P: int, layout: str) -> CausalWork:
    """Count, position by position, the causal work of each rank (what :func:`causal_work_formula` derives).

    Raises:
        ValueError: as :func:`shard_positions`.
    """
    pos = [shard_positions(T, P, layout, r) for r in range(P)]
    pairs, blocks = [], []
    for r in range(P):
        seen = [(pos[r][:, None] >= pos[s][None, :]) for s in range(P)]  # (n, n) per key block
        pairs.append(int(sum(int(m.sum()) for m in seen)))
        blocks.append(sum(bool(m.any()) for m in seen))
    return CausalWork(pairs, blocks, max(pairs) * P / sum(pairs))


def causal_work_formula(T: int, P: int, layout: str) -> CausalWork:
    """The same counts in closed form (chapter 12 derives them).

    Contiguous, n = T/P: rank r's queries r n + i (i < n) each see r n + i + 1 keys, so
    ``pairs_r = r n^2 + n (n + 1) / 2``; it computes r + 1 blocks; the last rank is the busiest and
    ``imbalance = (2T - n + 1) / (T + 1)``, which tends to (2P - 1) / P for long shards.
    Zigzag, c = T/(2P): chunk k contributes ``k c^2 + c (c + 1) / 2``, chunks r and 2P-1-r together
    ``(2P - 1) c^2 + c (c + 1)``, the same for every rank: imbalance exactly 1; every block holds a
    visible pair, so every rank computes P blocks.
    """
    T, P = require_positive_int("T", T), require_positive_int("P", P)
    layout = require_layout(layout)
    _check_split(T, P, layout)
    if layout == "contiguous":
        n = T // P
        pairs = [r * n * n + n * (n + 1) // 2 for r in range(P)]
        blocks = [r + 1 for r in range(P)]
    else:
        c = T // (2 * P)
        pairs = [(2 * P - 1) * c * c + c * (c + 1) for _ in range(P)]
        blocks = [P] * P
    return CausalWork(pairs, blocks, max(pairs) * P / sum(pairs))


def even_work_cpu_text(step_cpu_seconds, *, even: float = 1.1) -> str:
    """Chapter 12's sentence on the zigzag ranks' forward compute CPU time, from the measured table.

    Args: ``step_cpu_seconds``: per rank, the CPU seconds of each forward ring step (P lists of P
    finite floats >= 0, each rank's total and its total after step 0 positive), for a layout whose ranks do the same work at every step (zigzag).
    ``even``: a max/mean ratio below which the ranks count as even (default 1.1).

    Returns "" when the ranks' totals are even; otherwise one or two sentences that say where in the table
    the difference lies (step 0 or the later steps), with the numbers. It says what CPU time leaves out
    and what it does not: it excludes the time a process waits for a core, but sharing the cores still
    inflates it (caches the other processes cooled, the memory bandwidth they share), and the run does
    not measure how much.

    Raises: ValueError: not P >= 2 lists of P such numbers, or ``even`` not > 1. Source: chapter 12.
    """
    import math

    rows = [list(r) for r in step_cpu_seconds]
    P = len(rows)
    if P < 2 or any(len(r) != P for r in rows) or not all(
            isinstance(x, (int, float)) and math.isfinite(x) and x >= 0 for r in rows for x in r) or not all(
            sum(r) > 0 and sum(r[1:]) > 0 for r in rows):
        raise ValueError(f"step_cpu_seconds must be P >= 2 lists of P finite seconds >= 0, each rank's total and "
                         f"total after step 0 positive; got {rows!r}")
    if not (isinstance(even, (int, float)) and even > 1):
        raise ValueError(f"even must be a ratio > 1, got {even!r}")

    def ratio(xs):
        return max(xs) / (sum(xs) / len(xs))

    total, first, later = ratio([sum(r) for r in rows]), [r[0] for r in rows], ratio([sum(r[1:]) for r in rows])
    if total < even:
        return ""
    where = (f"the table puts the difference in step 0, each rank's own diagonal block, the same work on every rank "
             f"({1e3 * min(first):.1f} to {1e3 * max(first):.1f} ms), while the later steps even out ({later:.2f} "
             "after step 0)" if later < even else
             f"the later steps differ too ({later:.2f} after step 0; step 0 took {1e3 * min(first):.1f} to "
             f"{1e3 * max(first):.1f} ms)")
    return (f"The zigzag ranks do the same work, yet their forward compute CPU times differ ({total:.2f} max/mean): "
            f"{where}. CPU time leaves out the time a process waits for a core, not the slowdown of sharing "
            "one: four processes on two cores (and other jobs) run on caches the others cooled and share the "
            "memory's bandwidth, which inflates the same work's CPU time; this run does not measure how much of "
            "the difference that is. ")
