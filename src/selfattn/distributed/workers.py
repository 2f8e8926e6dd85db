"""The per-rank functions the chapter and the tests hand to :func:`~selfattn.distributed.run_distributed`.

Spawned processes import the function they run by name, so these live in the package, not in a
notebook cell. Each builds the *same* full inputs on every rank from a seed (:func:`make_inputs`),
keeps its own shard and returns its shards of the output and the gradients, with the bytes it sent:
the caller, in the parent process, unshards them and compares with single-process attention.

Source: chapter 12.
"""

from __future__ import annotations

import os
import time

import torch

from .comm import Traffic
from .layout import shard_sequence
from .ring import ring_attention
from .ulysses import ulysses_attention
from .wire import WireCount

__all__ = ["make_inputs", "attention_cases", "die_after_first_ring", "time_ring_and_ulysses", "bad_input_messages",
           "chapter_run", "subgroup_ring"]

METHODS = {"ring": ring_attention, "ulysses": ulysses_attention}


def make_inputs(case: dict):
    """Full inputs of one case: q, k, v and the output's gradient dout (B, H, T, Dh), and the key-padding
    mask (B, T) or None, from ``case`` = {"B", "H", "T", "Dh", "seed", "padding", optional "dtype"}.

    The padding hides positions 0 and the last three of every row (under a causal mask query 0 then
    sees only padding: a zero row) and, when B > 1, all of row 1 (every query of it sees nothing).
    An optional ``case["nonfinite"]``, a list of ``(name, position, value)`` with name "q", "k" or "v",
    stores ``value`` (NaN, inf, -inf) at that position of that tensor, every batch row and head: the
    house rule's test that a value the mask hides reaches nothing."""
    g = torch.Generator().manual_seed(case["seed"])
    B, H, T, Dh = case["B"], case["H"], case["T"], case["Dh"]
    dtype = case.get("dtype", torch.float64)
    q, k, v, dout = (torch.randn(B, H, T, Dh, generator=g, dtype=torch.float64).to(dtype) for _ in range(4))
    for name, position, value in case.get("nonfinite", ()):
        x = {"q": q, "k": k, "v": v}[name]
        x[:, :, position] = value  # (B, H, Dh) entries of that position
    kpm = None
    if case.get("padding", False):
        kpm = torch.ones(B, T, dtype=torch.bool)
        kpm[:, 0] = False
        kpm[:, -3:] = False
        if B > 1:
            kpm[1] = False
    return q, k, v, dout, kpm


def _run_case(rank, world_size, case):
    q, k, v, dout, kpm = make_inputs(case)
    layout = case["layout"]
    q, k, v = (shard_sequence(x, world_size, layout, rank).requires_grad_() for x in (q, k, v))  # (B, H, T/P, Dh)
    dout = shard_sequence(dout, world_size, layout, rank)
    kpm = None if kpm is None else shard_sequence(kpm, world_size, layout, rank, dim=-1)  # (B, T/P)
    traffic = Traffic()
    with WireCount() as wire:  # the bytes handed to torch.distributed, counted apart from `traffic`
        out = METHODS[case["method"]](q, k, v, key_padding_mask=kpm, causal=case["causal"], layout=layout,
                                      traffic=traffic)
        forward = wire.take()
        out.backward(dout)
        backward = wire.take()
    return {"out": out.detach(), "dq": q.grad, "dk": k.grad, "dv": v.grad, "traffic": traffic.as_dict(),
            "wire": {"forward": forward, "backward": backward}}


def attention_cases(rank: int, world_size: int, cases: list) -> list:
    """Run every case (ring or Ulysses, forward and backward) on this rank; one dict per case with
    this rank's shards "out", "dq", "dk", "dv" (B, H, T/P, Dh), "traffic" (:meth:`Traffic.as_dict`,
    the module's own count) and "wire": {phase: (bytes sent, bytes received)} as
    :class:`~selfattn.distributed.wire.WireCount` saw them at torch.distributed's entry points."""
    return [_run_case(rank, world_size, case) for case in cases]


def bad_input_messages(rank: int, world_size: int) -> dict:
    """The errors ring and all-to-all attention raise for shards they cannot use, as {case: message}."""
    x = torch.zeros(1, 4, 3, 8, dtype=torch.float64)  # shards of 3: T = 3P, not divisible by 2P
    y = torch.zeros(1, 3, 4, 8, dtype=torch.float64)  # H = 3 heads
    messages = {}
    for name, call in {"zigzag odd shard": lambda: ring_attention(x, x, x, layout="zigzag"),
                       "ulysses heads": lambda: ulysses_attention(y, y, y),
                       "bad layout": lambda: ring_attention(x, x, x, layout="striped"),
                       "mask shape": lambda: ring_attention(x, x, x, key_padding_mask=torch.ones(1, 4, dtype=torch.bool))
                       }.items():
        try:
            call()
            messages[name] = None
        except (TypeError, ValueError) as e:
            messages[name] = f"{type(e).__name__}: {e}"
    return messages


def die_after_first_ring(rank: int, world_size: int) -> str:
    """One ring pass, then rank 1 exits abruptly (``os._exit(1)``) while the others start a second one,
    which can never finish: the launcher must notice and fail, not hang."""
    case = {"B": 1, "H": 2, "T": 8, "Dh": 4, "seed": 0}
    q, k, v, _, _ = make_inputs(case)
    q = shard_sequence(q, world_size, "contiguous", rank)
    ring_attention(q, q, q)
    if rank == 1:
        os._exit(1)
    ring_attention(q, q, q)  # waits for rank 1's block, which never comes
    return "finished"


def time_ring_and_ulysses(rank: int, world_size: int, case: dict, repeats: int = 3) -> dict:
    """Seconds per forward + backward pass (best of ``repeats``) of ring attention (both layouts) and of
    all-to-all attention on this rank, and the step records of that fastest pass, each step's CPU time
    replaced by its least over the repeats (what the step's work costs, without the noise of a busy machine)."""
    q0, k0, v0, dout0, _ = make_inputs(case)
    results = {}
    for method, layout in (("ring", "contiguous"), ("ring", "zigzag"), ("ulysses", "contiguous")):
        q, k, v = (shard_sequence(x, world_size, layout, rank).requires_grad_() for x in (q0, k0, v0))
        dout = shard_sequence(dout0, world_size, layout, rank)
        best, best_traffic, cpu = float("inf"), None, {}
        for _ in range(repeats):
            traffic = Traffic()
            torch.distributed.barrier()  # start together, so a rank's time is not another's start-up
            t0 = time.perf_counter()
            out = METHODS[method](q, k, v, causal=case["causal"], layout=layout, traffic=traffic)
            out.backward(dout)
            seconds = time.perf_counter() - t0
            for i, step in enumerate(traffic.steps):  # each step's least CPU time over the repeats
                cpu[i] = min(cpu.get(i, float("inf")), step.compute_cpu_s)
            if seconds < best:
                best, best_traffic = seconds, traffic
            q.grad = k.grad = v.grad = None
        for i, step in enumerate(best_traffic.steps):
            step.compute_cpu_s = cpu[i]
        results[f"{method}, {layout}"] = {"seconds": best, "traffic": best_traffic.as_dict()}
    return results


def chapter_run(rank: int, world_size: int, cases: list, timing_case: dict, repeats: int = 3) -> dict:
    """Chapter 12's one process group: :func:`attention_cases`, :func:`bad_input_messages` and
    :func:`time_ring_and_ulysses` on the same ranks (each process start costs seconds)."""
    return {"rank": rank, "cases": attention_cases(rank, world_size, cases),
            "errors": bad_input_messages(rank, world_size),
            "timing": time_ring_and_ulysses(rank, world_size, timing_case, repeats)}


def subgroup_ring(rank: int, world_size: int, case: dict) -> dict:
    """Ring and all-to-all attention inside a subgroup of the world (ranks 1, 2, ... only), so that
    group ranks and global ranks differ: the ring must address its neighbours by group rank."""
    members = list(range(1, world_size))
    group = torch.distributed.new_group(members)  # every rank must take part in creating it
    if rank not in members:
        return {}
    r, P = members.index(rank), len(members)
    q0, k0, v0, dout0, kpm0 = make_inputs(case)
    out = {}
    for method in ("ring", "ulysses"):
        q, k, v = (shard_sequence(x, P, case["layout"], r).requires_grad_() for x in (q0, k0, v0))
        kpm = None if kpm0 is None else shard_sequence(kpm0, P, case["layout"], r, dim=-1)
        o = METHODS[method](q, k, v, key_padding_mask=kpm, causal=case["causal"], layout=case["layout"], group=group)
        o.backward(shard_sequence(dout0, P, case["layout"], r))
        out[method] = {"out": o.detach(), "dq": q.grad, "dk": k.grad, "dv": v.grad}
    return out
