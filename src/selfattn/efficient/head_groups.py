"""Run the tiled loop on groups of heads at once, one CPU thread per group.

Why: every operation of the torch tile loop (a matrix product, an ``amax``, an ``exp2`` over a tile)
is parallelised by torch across the CPU's threads on its own, with a start and a join per
operation and a (heads, block_q, block_k) tile that is shared by all threads. PyTorch's fused CPU
kernel instead gives each thread whole (batch, head, query block) items, each with a tile small
enough for that core's cache. Heads are independent, so the loop can do the same: split the B*H
heads into one group per thread and run the unchanged loop on each group in its own Python thread,
whose torch operations run single-threaded (torch releases the GIL inside each operation, so the
groups' matrix products run at the same time). Measured by ``bench/attention_bench.py``.

The groups compute what the loop computes on all heads at once: each head's arithmetic is the same
sequence of operations on the same numbers (the loop never mixes heads). Only the matrix-product
library may choose another kernel for a group's smaller batch, so the last bits can differ
(tested: 1e-14 in float64).

Only where nothing thread-local would be lost: CPU tensors, at least 2 torch threads and 2 heads,
no boolean mask tensor, ``mask_mod`` or bias (they are indexed by the batch and head of the whole call), and no dispatch
mode, torch-function mode or autocast active in the calling thread (those are thread-local: a
worker thread would not see them; chapter 10's memory-traffic counter is such a mode). Grad mode
and inference mode are carried into the workers.

Introduced in chapter 10.
"""

from __future__ import annotations

import contextlib
import os
import threading
from concurrent.futures import ThreadPoolExecutor

import torch

__all__ = ["head_groups_apply", "split_applies", "worker_threads", "unsplit"]

_POOLS: dict[int, ThreadPoolExecutor] = {}
_POOLS_LOCK = threading.Lock()
_IN_WORKER = threading.local()


def _forget_pools_in_child() -> None:
    """After ``fork`` the child has the parent's pool objects but none of their threads: a task
    submitted there would wait for ever. The child starts with no pools (new ones are made on use)."""
    global _POOLS_LOCK
    _POOLS.clear()
    _POOLS_LOCK = threading.Lock()  # the parent's lock may have been held by another thread at the fork


os.register_at_fork(after_in_child=_forget_pools_in_child)


def _make_pool(n: int) -> ThreadPoolExecutor:
    """n worker threads whose torch operations run on one thread each, the caller's setting unchanged.

    ``torch.set_num_threads`` sets the calling thread's OpenMP and MKL thread counts and a process-wide
    default that threads read the first time they use torch. Each worker reads its default first (so
    that it is initialised), then sets one thread for itself; the caller's count is set again after,
    which restores the process-wide default for every other thread.
    """
    caller = torch.get_num_threads()
    ready = threading.Barrier(n + 1)

    def init():
        torch.get_num_threads()  # initialise this thread's settings now, not at its first operation
        torch.set_num_threads(1)
        _IN_WORKER.active = True
        ready.wait()

    pool = ThreadPoolExecutor(n, thread_name_prefix="selfattn-heads", initializer=init)
    started = [pool.submit(lambda: None) for _ in range(n)]  # one task per thread: all n threads start
    ready.wait()
    for f in started:
        f.result()
    torch.set_num_threads(caller)
    return pool


def _pool(n: int) -> ThreadPoolExecutor:
    with _POOLS_LOCK:
        if n not in _POOLS:
            _POOLS[n] = _make_pool(n)
        return _POOLS[n]


def worker_threads(n: int) -> list[int]:
    """The torch thread count each of the n workers reports (all 1; for tests)."""
    pool = _pool(n)
    barrier = threading.Barrier(n)

    def report():
        barrier.wait(timeout=10)  # n tasks held at once: each runs on its own worker
        return torch.get_num_threads()

    return [f.result() for f in [pool.submit(report) for _ in range(n)]]


@contextlib.contextmanager
def unsplit():
    """Inside the block (in this thread) the tiled loop is not split into head groups: every
    operation is parallelised by torch on its own, as without this module. For side-by-side
    measurements (``bench/attention_bench.py``) and for readers who want to see the difference."""
    before = getattr(_IN_WORKER, "unsplit", False)
    _IN_WORKER.unsplit = True
    try:
        yield
    finally:
        _IN_WORKER.unsplit = before


def _thread_local_state_active() -> bool:
    """A dispatch mode, torch-function mode or autocast in the calling thread (workers would miss it)."""
    from torch.utils._python_dispatch import _get_current_dispatch_mode

    return (_get_current_dispatch_mode() is not None or torch._C._is_torch_function_mode_enabled()
            or torch.is_autocast_enabled("cpu"))


def split_applies(q: torch.Tensor, n_heads: int) -> int:
    """How many head groups to run: ``min(torch.get_num_threads(), n_heads)`` where the split
    applies (see the module docstring), else 1 (run the loop as it is)."""
    if (not q.device.type == "cpu" or getattr(_IN_WORKER, "active", False) or getattr(_IN_WORKER, "unsplit", False)
            or _thread_local_state_active()):
        return 1
    return max(1, min(torch.get_num_threads(), n_heads))


def head_groups_apply(fn, n_groups: int, tensors: list[torch.Tensor]):
    """Call ``fn(*parts)`` on ``n_groups`` contiguous groups of the first axis of every tensor of
    ``tensors`` (each (BH, ...), the same BH), each group in a worker thread; returns the list of
    the groups' results in order. An exception in a group is raised here."""
    BH = tensors[0].shape[0]
    bounds = [(g * BH // n_groups, (g + 1) * BH // n_groups) for g in range(n_groups)]
    grad, inference = torch.is_grad_enabled(), torch.is_inference_mode_enabled()

    def run(a, b):
        with torch.inference_mode(inference), torch.set_grad_enabled(grad):
            return fn(*[t[a:b] for t in tensors])

    pool = _pool(min(n_groups, torch.get_num_threads()))  # more groups than threads: they queue
    futures = [pool.submit(run, a, b) for a, b in bounds]
    return [f.result() for f in futures]


def group_sizes(BH: int, n_groups: int) -> list[int]:
    """The sizes of the contiguous groups ``head_groups_apply`` cuts BH heads into."""
    return [(g + 1) * BH // n_groups - g * BH // n_groups for g in range(n_groups)]

