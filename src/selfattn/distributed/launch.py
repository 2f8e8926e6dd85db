"""Start P gloo processes on this machine, run a function in each, collect the results (chapter 12).

:func:`run_distributed` is the small launcher the chapter and the tests use instead of ``torchrun``:
``world_size`` processes (spawn start method), a gloo process group on ``127.0.0.1`` only, one
result per rank through a queue, and a clear error, never a hang, when a rank raises or dies.

Source: chapter 12.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import queue
import socket
import time
import traceback
from datetime import timedelta

from .._validate import require_positive_int

__all__ = ["run_distributed", "DistributedRunError", "free_port"]


class DistributedRunError(RuntimeError):
    """A rank raised, died, or the run passed its timeout; the message names the rank and why."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (the OS picks it: bind to port 0)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank, world_size, port, timeout, fn, args, results):
    # Child process: one thread (the ranks share the machine's cores), gloo over loopback only
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    try:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size,
                                timeout=timedelta(seconds=timeout))
        try:
            value = fn(rank, world_size, *args)
        finally:
            dist.destroy_process_group()
        results.put((rank, "ok", pickle.dumps(value)))  # plain pickle: tensors copied, not shared memory
    except BaseException as e:  # noqa: BLE001 (whatever it is, the parent must hear of it)
        results.put((rank, "error", f"{type(e).__name__}: {e}\n{traceback.format_exc()}"))


def _root_cause(procs, done, rank, payload, grace: float = 3.0) -> str:
    """The message for rank ``rank``'s exception. A peer that died makes the survivors raise ("connection
    closed by peer"), so first wait ``grace`` seconds for a rank that exited with a nonzero code and no
    result: if there is one, it is the cause and is named first."""
    end = time.monotonic() + grace
    while time.monotonic() < end:
        dead = [(r, p.exitcode) for r, p in enumerate(procs)
                if r != rank and r not in done and p.exitcode is not None and p.exitcode != 0]
        if dead:
            r, code = dead[0]
            first_line = payload.splitlines()[0] if payload else ""
            return f"rank {r} died with exit code {code} before returning a result (then rank {rank} raised {first_line})"
        if all(p.exitcode == 0 for r, p in enumerate(procs) if r != rank and r not in done):
            break  # every other rank returned or ended cleanly: none died
        time.sleep(0.05)  # others still run (or wait on the failed rank); a dying one may not be reaped yet
    return f"rank {rank} raised {payload}"


def run_distributed(fn, world_size: int, *args, timeout: float = 60.0):
    """Run ``fn(rank, world_size, *args)`` in ``world_size`` fresh processes joined in one gloo group.

    Args:
        fn: a function importable by name (spawned processes import it: define it in a module, not
            in a notebook cell). It may call any ``torch.distributed`` collective; its return value
            must pickle.
        world_size: number of processes P (>= 1).
        *args: passed to every rank (must pickle).
        timeout: seconds (> 0) for the whole run, start-up included; also the process group's
            timeout, so a collective whose peer has gone fails instead of waiting forever.

    Returns:
        list of the P return values, in rank order.

    Raises:
        DistributedRunError: a rank raised (its exception and traceback text in the message), died
        (its exit code), or the run passed ``timeout``; the surviving processes are terminated first.
        TypeError / ValueError: bad ``world_size`` or ``timeout``.

    Source: chapter 12.
    """
    world_size = require_positive_int("world_size", world_size)
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        raise ValueError(f"timeout must be a number of seconds > 0; got {timeout!r}")
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_worker, args=(r, world_size, port, float(timeout), fn, args, results), daemon=True)
             for r in range(world_size)]
    for p in procs:
        p.start()
    deadline = time.monotonic() + timeout
    done, error = {}, None
    try:
        while len(done) < world_size and error is None:
            try:
                rank, status, payload = results.get(timeout=0.2)
            except queue.Empty:
                if time.monotonic() > deadline:
                    missing = [r for r in range(world_size) if r not in done]
                    error = f"timed out after {timeout:.0f} s waiting for rank(s) {missing}"
                    break
                for r, p in enumerate(procs):  # a rank that died without a word (killed, os._exit)
                    if r not in done and p.exitcode is not None and p.exitcode != 0:
                        time.sleep(0.2)  # let a message it queued before dying arrive first
                        if results.empty():
                            error = f"rank {r} died with exit code {p.exitcode} before returning a result"
                            break
                continue
            if status == "ok":
                done[rank] = pickle.loads(payload)
            else:
                error = _root_cause(procs, done, rank, payload)
    finally:
        if error is not None or len(done) < world_size:
            for p in procs:
                if p.is_alive():
                    p.terminate()
        for p in procs:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
                p.join()
        results.close()
    if error is not None:
        raise DistributedRunError(f"run_distributed({getattr(fn, '__name__', fn)!s}, world_size={world_size}): {error}")
    return [done[r] for r in range(world_size)]
