"""Time and peak memory of four attention implementations, side by side, in one run.

    python bench/attention_bench.py            # full run (~10-15 min on 2 cores), writes bench/results/
    python bench/attention_bench.py --quick    # T = 256, 512 only, prints the tables (< 1 min)
    python bench/attention_bench.py --sweep    # tiled block sizes against SDPA at T=4096 (prints only)
    python bench/attention_bench.py --window-sweep  # the sliding window's block sizes, forward and backward

Implementations (B=1, H=8, d_head=64, float32, CPU, forward pass under ``torch.no_grad``):

- ``naive``: ``selfattn.scaled_dot_product_attention`` (the full (T, T) score matrix);
- ``sdpa``: ``torch.nn.functional.scaled_dot_product_attention`` (PyTorch's fused CPU kernel);
- ``tiled``: ``selfattn.efficient.tiled_attention`` (online softmax over tiles, torch loop);
- ``numpy``: ``selfattn.ref.scaled_dot_product_attention`` (float64 NumPy reference).

Training (forward plus backward, ``out.backward(dO)``): SDPA and tiled, time and peak extra memory
(naive too for memory). Sliding window (w=256, causal, T=8192, full run only): the tiled
``sliding_window_tiled_attention`` against ``torch.nn.attention.flex_attention`` compiled by
``torch.compile`` on the CPU with a ``create_block_mask`` of the same mask (compile time reported,
not counted; if compiling fails the target says "not measurable" with the error). Threads (full
run, 2+ threads): the tiled loop with its heads split over the threads (the default) against the
loop with every operation split on its own (``head_groups.unsplit()``), T=4096.

Time: the minimum over repeats, the implementations interleaved (the machine is shared; the minimum
is the least disturbed run). Throughput: useful FLOPs (4 T S d_head per head for QK^T and PV; only
the visible pairs when causal) per second, as a fraction of a float32 matrix product measured in the
same run. Memory: the rise of peak resident memory (Linux VmHWM, reset via /proc/self/clear_refs)
above the resident size just before the call, measured in a separate fresh process per
implementation with ``MALLOC_MMAP_THRESHOLD_=65536`` so that freed tensors return to the OS; the
inputs exist before the call and are not counted (the first size is run once before it is measured).
``OMP_WAIT_POLICY=PASSIVE`` is set unless given (see the comment at the import of torch). Configurations whose estimated memory exceeds
the budget are skipped and marked as such. Chapter 09 loads the committed results file.
"""

from __future__ import annotations

import os

# Before torch is imported: OpenMP threads that wait for each other sleep instead of spinning. On a
# shared machine (this one runs several people's jobs on 2 cores) a spinning thread steals the core of
# the thread it waits for, which punishes code made of many short parallel operations (the tiled
# loop) far more than one fused kernel (SDPA). Applies to every implementation alike.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse
import datetime as dt
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from bench_machine import cpu_name, vector_isa  # bench/, the folder of this script

import selfattn
from selfattn import ref
from selfattn.efficient import (
    sliding_window_attention,
    sliding_window_tiled_attention,
    tiled_attention,
)
from selfattn.efficient.memory import peak_rss_bytes
from selfattn.efficient.tiled import (
    DEFAULT_BLOCK_K,
    DEFAULT_BLOCK_Q,
    WINDOW_BACKWARD_BLOCK_Q,
    WINDOW_BLOCK_Q,
)

B, H, D_HEAD = 1, 8, 64
IMPLS = ("naive", "sdpa", "tiled", "numpy")
TIME_SIZES = (256, 512, 1024, 2048, 4096, 8192)
MEMORY_SIZES = TIME_SIZES + (16384,)
QUICK_SIZES = (256, 512)
TRAIN_SIZES = (2048, 4096, 8192)  # training memory (the targets: linear growth from 4096 to 8192)
TRAIN_TIME_SIZES = (2048, 4096)
TRAIN_IMPLS = ("naive", "sdpa", "tiled")
WINDOW, WINDOW_T = 256, 8192
SWEEP_BLOCKS = ((256, 256), (256, 512), (512, 256), (512, 512), (256, 1024), (512, 1024), (1024, 512),
                (1024, 1024), (128, 512), (128, 1024))
GIB = 2**30
RESULTS = Path(__file__).resolve().parent / "results"


def estimated_bytes(impl: str, T: int, train: bool = False) -> int:
    """A generous estimate of the peak extra memory, used only to skip what would not fit."""
    scores = B * H * T * T
    if train:  # weights kept for backward, their gradient and temporaries; linear paths: 3 gradients more
        return {"naive": 8 * scores * 4, "sdpa": 16 * B * H * T * D_HEAD * 4, "tiled": 16 * B * H * T * D_HEAD * 4}[impl]
    return {"naive": 4 * scores * 4, "numpy": 5 * scores * 8, "sdpa": 8 * B * H * T * D_HEAD * 4,
            "tiled": 8 * B * H * T * D_HEAD * 4}[impl]


def memory_budget() -> int:
    """~16 GB, or 60% of the memory available now if that is less (the machine is shared)."""
    available = 16 * GIB
    meminfo = Path("/proc/meminfo")
    if meminfo.exists():
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                available = min(available, int(0.6 * int(line.split()[1]) * 1024))
    return available


def make_inputs(T: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(B, H, T, D_HEAD, generator=g) for _ in range(3))


def runner(impl: str, q, k, v, causal: bool):
    """A zero-argument function computing attention with ``impl``."""
    T = q.shape[-2]
    if impl == "naive":
        keep = selfattn.causal_mask(T) if causal else None
        return lambda: selfattn.scaled_dot_product_attention(q, k, v, keep)
    if impl == "sdpa":
        return lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    if impl == "tiled":
        return lambda: tiled_attention(q, k, v, causal=causal)
    qn, kn, vn = (x.double().numpy() for x in (q, k, v))
    keep = ref.causal_mask(T) if causal else None
    return lambda: ref.scaled_dot_product_attention(qn, kn, vn, keep)


def train_runner(impl: str, q, k, v, d_out, causal: bool):
    """A zero-argument function running ``impl`` forward and backward (``q, k, v`` require grad);
    returns the three gradients (cleared from the inputs, so that each call starts the same)."""
    fwd = runner(impl, q, k, v, causal)

    def step():
        out = fwd()
        out.backward(d_out)
        grads = (q.grad, k.grad, v.grad)
        q.grad = k.grad = v.grad = None
        return grads
    return step


def make_train_inputs(T: int):
    q, k, v = (x.requires_grad_() for x in make_inputs(T))
    return q, k, v, make_inputs(T, seed=1)[0]


def attention_flops(T: int, causal: bool) -> float:
    pairs = T * (T + 1) / 2 if causal else T * T
    return 4.0 * B * H * pairs * D_HEAD  # QK^T and PV, 2 FLOPs per multiply-add


def matmul_gflops(n: int, repeats: int) -> float:
    """The float32 matrix-multiply rate of this machine, best of ``repeats`` (n x n) @ (n x n)."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b  # warm-up
    best = min(_timed(lambda: a @ b) for _ in range(repeats))
    return 2 * n**3 / best / 1e9


LOADS: list[float] = []  # the 1-minute load average after each measured configuration


def _note_load() -> None:
    LOADS.append(os.getloadavg()[0])


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def measure_times(sizes, repeats: int, budget: int, numpy_max_T: int):
    """{(impl, T, causal): seconds or None (skipped)}, interleaving the implementations."""
    times = {}
    for T in sizes:
        q, k, v = make_inputs(T)
        for causal in (False, True):
            todo = [impl for impl in IMPLS
                    if estimated_bytes(impl, T) <= budget and (impl != "numpy" or T <= numpy_max_T)]
            for impl in IMPLS:
                times[(impl, T, causal)] = None
            fns = {impl: runner(impl, q, k, v, causal) for impl in todo}
            with torch.no_grad():
                for impl in todo:  # warm-up (and the only run for slow NumPy at large T)
                    times[(impl, T, causal)] = _timed(fns[impl])
                # T=4096 and 8192 hold the targets: more repeats (on a shared machine the minimum needs them)
                for _ in range(repeats + 2 if T in (4096, 8192) else repeats - 1):
                    for impl in todo:
                        if (impl == "numpy" and T >= 2048) or (impl == "naive" and T >= 8192):
                            continue  # in no target, and slow: the warm-up run is its time
                        times[(impl, T, causal)] = min(times[(impl, T, causal)], _timed(fns[impl]))
            _note_load()
            print(f"  timed T={T} causal={causal}: "
                  + ", ".join(f"{i}={times[(i, T, causal)]:.3g}s" for i in todo), file=sys.stderr, flush=True)
    return times


def measure_train_times(sizes, repeats: int):
    """{("sdpa" or "tiled", T, causal): seconds of forward plus backward}, interleaved, minimum."""
    times = {}
    for T in sizes:
        q, k, v, d_out = make_train_inputs(T)
        for causal in (False, True):
            fns = {impl: train_runner(impl, q, k, v, d_out, causal) for impl in ("sdpa", "tiled")}
            for impl, fn in fns.items():  # warm-up
                times[(impl, T, causal)] = _timed(fn)
            for _ in range(repeats):
                for impl, fn in fns.items():
                    times[(impl, T, causal)] = min(times[(impl, T, causal)], _timed(fn))
            _note_load()
            print(f"  timed fwd+bwd T={T} causal={causal}: "
                  + ", ".join(f"{i}={times[(i, T, causal)]:.3g}s" for i in fns), file=sys.stderr, flush=True)
    return times


def measure_window(repeats: int, quick: bool) -> dict:
    """Sliding window (w=WINDOW, causal, T=WINDOW_T): tiled against compiled flex_attention.

    Returns ``{"tiled": s, "flex": s, "compile_s": s, "max_abs_diff": x, "max_abs_diff_dense": x}``
    (the largest difference of the tiled output to flex's and to the dense ``sliding_window_attention``,
    computed one head at a time), or ``{"error": text}`` when flex_attention cannot be compiled here,
    or ``{"skipped": text}`` in --quick mode."""
    if quick:
        return {"skipped": "--quick does not compile flex_attention (minutes of compile time)"}
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, H, WINDOW_T, D_HEAD, generator=g) for _ in range(3))
    tiled = lambda: sliding_window_tiled_attention(q, k, v, WINDOW, causal=True)  # noqa: E731
    try:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention

        def sliding_causal(b, h, q_idx, kv_idx):
            return (kv_idx <= q_idx) & (q_idx - kv_idx < WINDOW)

        start = time.perf_counter()
        block_mask = create_block_mask(sliding_causal, None, None, WINDOW_T, WINDOW_T, device="cpu")
        compiled = torch.compile(flex_attention, dynamic=False)
        with torch.no_grad():
            flex_out = compiled(q, k, v, block_mask=block_mask)
        compile_s = time.perf_counter() - start
    except Exception as error:  # no compiler, an unsupported CPU path, ...: say so, do not crash
        return {"error": f"{type(error).__name__}: {str(error).strip().splitlines()[0][:300] if str(error).strip() else ''}"}
    flex = lambda: compiled(q, k, v, block_mask=block_mask)  # noqa: E731
    result = {"compile_s": compile_s}
    with torch.no_grad():
        out = tiled()
        result["max_abs_diff"] = float((out - flex_out).abs().max())
        # the dense band, one head at a time: its (T, T) scores are 256 MiB a head, not 2 GiB for all eight
        result["max_abs_diff_dense"] = max(
            float((out[:, h] - sliding_window_attention(q[:, h], k[:, h], v[:, h], WINDOW)).abs().max())
            for h in range(H))
        del out
        result["tiled"], result["flex"] = _timed(tiled), _timed(flex)
        for _ in range(repeats):
            result["tiled"] = min(result["tiled"], _timed(tiled))
            result["flex"] = min(result["flex"], _timed(flex))
    _note_load()
    print(f"  timed window: tiled={result['tiled']:.3g}s flex={result['flex']:.3g}s", file=sys.stderr, flush=True)
    return result


def measure_head_groups(repeats: int, T: int = 4096) -> dict:
    """Tiled forward and forward plus backward at T with the heads split over the threads (the
    default, ``selfattn.efficient.head_groups``) and without (``head_groups.unsplit()``: every
    operation parallelised by torch on its own), interleaved with SDPA: {(what, causal): seconds}."""
    from selfattn.efficient import head_groups

    q, k, v = make_inputs(T)
    tq, tk, tv, d_out = make_train_inputs(T)
    result = {}
    for train in (False, True):
        for causal in (False, True):
            if train:
                fns = {"sdpa": train_runner("sdpa", tq, tk, tv, d_out, causal),
                       "split": _train_blocks(tq, tk, tv, d_out, causal, (DEFAULT_BLOCK_Q, DEFAULT_BLOCK_K))}
            else:
                fns = {"sdpa": runner("sdpa", q, k, v, causal), "split": runner("tiled", q, k, v, causal)}

            def unsplit(fn=fns["split"]):
                with head_groups.unsplit():
                    return fn()

            fns["unsplit"] = unsplit
            with torch.set_grad_enabled(train):
                best = {name: _timed(fn) for name, fn in fns.items()}
                for _ in range(repeats):
                    for name, fn in fns.items():
                        best[name] = min(best[name], _timed(fn))
            for name, t in best.items():
                result[("train" if train else "forward", causal, name)] = t
            print(f"  timed head groups train={train} causal={causal}: " + ", ".join(
                f"{n}={t:.3g}s" for n, t in best.items()), file=sys.stderr, flush=True)
    return result


def render_head_groups(groups, threads: int) -> list[str]:
    if not groups:
        return []
    lines = ["", f"## The tiled loop's heads split over the {threads} threads, T=4096", "",
             "`selfattn.efficient.head_groups`: each thread runs the loop on its own group of heads with "
             "single-threaded operations (the default), against the loop with every operation parallelised "
             "by torch on its own (`head_groups.unsplit()`), each as a ratio to SDPA's time.", "",
             "| pass | causal | SDPA (ms) | heads split (ms) | each op split (ms) | split/SDPA | each op/SDPA |",
             "|---|:---:|---:|---:|---:|---:|---:|"]
    for what in ("forward", "train"):
        for causal in (False, True):
            t = {n: groups[(what, causal, n)] for n in ("sdpa", "split", "unsplit")}
            lines.append(f"| {'forward' if what == 'forward' else 'forward+backward'} | {'yes' if causal else 'no'} "
                         f"| {1e3 * t['sdpa']:.1f} | {1e3 * t['split']:.1f} | {1e3 * t['unsplit']:.1f} "
                         f"| {t['split'] / t['sdpa']:.2f} | {t['unsplit'] / t['sdpa']:.2f} |")
    return lines


def sweep(repeats: int, T: int = 4096):
    """Print the tiled/SDPA time ratios at T for each block size of SWEEP_BLOCKS, forward and
    forward plus backward, causal and not: the measurement behind DEFAULT_BLOCK_Q/K."""
    print(f"# Block-size sweep, T={T} (B={B}, H={H}, d_head={D_HEAD}); {cpu_name()}, vector ISA: {vector_isa()}; "
          f"1-minute load average {os.getloadavg()[0]:.1f} at start\n")
    print("| block_q x block_k | fwd no mask | fwd causal | fwd+bwd no mask | fwd+bwd causal |")
    print("|---|---:|---:|---:|---:|")
    q, k, v = make_inputs(T)
    tq, tk, tv, d_out = make_train_inputs(T)
    ratios = {blocks: [] for blocks in SWEEP_BLOCKS}
    for train in (False, True):
        for causal in (False, True):
            if train:
                base = train_runner("sdpa", tq, tk, tv, d_out, causal)
                fns = {bl: _train_blocks(tq, tk, tv, d_out, causal, bl) for bl in SWEEP_BLOCKS}
            else:
                base = runner("sdpa", q, k, v, causal)
                fns = {bl: (lambda bl=bl, c=causal: tiled_attention(q, k, v, causal=c, block_q=bl[0], block_k=bl[1]))
                       for bl in SWEEP_BLOCKS}
            with torch.set_grad_enabled(train):
                best = {bl: _timed(fn) for bl, fn in fns.items()}
                best_base = _timed(base)
                for _ in range(repeats):
                    best_base = min(best_base, _timed(base))
                    for bl, fn in fns.items():
                        best[bl] = min(best[bl], _timed(fn))
            for bl in SWEEP_BLOCKS:
                ratios[bl].append(best[bl] / best_base)
            print(f"  swept train={train} causal={causal}", file=sys.stderr, flush=True)
    for bl in SWEEP_BLOCKS:
        print(f"| {bl[0]} x {bl[1]} | " + " | ".join(f"{r:.2f}" for r in ratios[bl]) + " |")
    print(f"\n1-minute load average {os.getloadavg()[0]:.1f} at the end")


WINDOW_SWEEP_BLOCKS = (16, 32, 64, 128)


def window_sweep(repeats: int):
    """Print the sliding window's (w=WINDOW, causal, T=WINDOW_T) time at each query block size of
    WINDOW_SWEEP_BLOCKS: the forward (band kernel) with ``block_q`` = b, and forward plus backward with
    the forward at WINDOW_BLOCK_Q and the backward at ``backward_block_q`` = b; each as a ratio to the
    defaults, all interleaved in one run. The measurement behind WINDOW_BLOCK_Q and
    WINDOW_BACKWARD_BLOCK_Q."""
    print(f"# Sliding-window block sweep, w={WINDOW}, causal, T={WINDOW_T} (B={B}, H={H}, d_head={D_HEAD}); "
          f"{cpu_name()}, vector ISA: {vector_isa()}; {torch.get_num_threads()} threads; "
          f"1-minute load average {os.getloadavg()[0]:.1f} at start\n")
    g = torch.Generator().manual_seed(0)
    q, k, v, d_out = (torch.randn(B, H, WINDOW_T, D_HEAD, generator=g) for _ in range(4))
    tq, tk, tv = (x.clone().requires_grad_() for x in (q, k, v))

    def forward(b):
        return lambda: sliding_window_tiled_attention(q, k, v, WINDOW, causal=True, block_q=b)

    def train(b):
        def step():
            sliding_window_tiled_attention(tq, tk, tv, WINDOW, causal=True, backward_block_q=b).backward(d_out)
            tq.grad = tk.grad = tv.grad = None
        return step

    samples = {}  # (what, block) -> every timing, the first included
    for what, make, grad in (("forward", forward, False), ("train", train, True)):
        fns = {b: make(b) for b in WINDOW_SWEEP_BLOCKS}
        with torch.set_grad_enabled(grad):
            for _ in range(repeats + 1):
                for b, fn in fns.items():
                    samples.setdefault((what, b), []).append(_timed(fn))
        _note_load()
        print(f"  swept window {what}", file=sys.stderr, flush=True)
    best = {key: min(times) for key, times in samples.items()}
    spread = {key: max(times) / min(times) - 1 for key, times in samples.items()}
    print(f"Minimum over {repeats + 1} interleaved timings; spread: (slowest - fastest) / fastest of them.\n")
    print(f"| block_q | forward (block_q) ms | / default ({WINDOW_BLOCK_Q}) | spread | forward+backward (backward_block_q) ms "
          f"| / default ({WINDOW_BACKWARD_BLOCK_Q}) | spread |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for b in WINDOW_SWEEP_BLOCKS:
        f, t = best[("forward", b)], best[("train", b)]
        print(f"| {b} | {1e3 * f:.1f} | {f / best[('forward', WINDOW_BLOCK_Q)]:.2f} | {spread[('forward', b)]:.0%} "
              f"| {1e3 * t:.1f} | {t / best[('train', WINDOW_BACKWARD_BLOCK_Q)]:.2f} | {spread[('train', b)]:.0%} |")
    peak = max(LOADS, default=0.0)
    print(f"\n1-minute load average {os.getloadavg()[0]:.1f} at the end, {peak:.1f} at most")
    if peak > (os.cpu_count() or 1) - 0.5:
        print(f"\nThe load reached {peak:.1f} on {os.cpu_count()} cores: other jobs shared the machine, and ratios "
              "closer to 1 than the spreads are noise, not a measurement. Run it again on a quiet machine.")


def _train_blocks(q, k, v, d_out, causal, blocks):
    def step():
        tiled_attention(q, k, v, causal=causal, block_q=blocks[0], block_k=blocks[1]).backward(d_out)
        q.grad = k.grad = v.grad = None
    return step


def memory_worker(impl: str, sizes: list[int], budget: int, train_sizes: list[int] = ()) -> dict:
    """Run in a fresh process: peak extra resident bytes of ``impl`` at each size, causal and not;
    then (``train_sizes``) of its forward plus backward, keyed ``"train,T,causal"``."""
    result = {}
    for T in sizes:
        for causal in (False, True):
            key = f"{T},{int(causal)}"
            if estimated_bytes(impl, T) > budget:
                result[key] = None
                continue
            q, k, v = make_inputs(T)
            fn = runner(impl, q, k, v, causal)  # NumPy copies of the inputs are made here, not counted
            with torch.no_grad():
                if not result:  # first size: one-time costs (code pages, thread pools) are not the algorithm's
                    warm = fn()
                    del warm
                peak, out = peak_rss_bytes(fn)
            del out
            result[key] = peak
    for T in train_sizes:
        for causal in (False, True):
            key = f"train,{T},{int(causal)}"
            if estimated_bytes(impl, T, train=True) > budget:
                result[key] = None
                continue
            q, k, v, d_out = make_train_inputs(T)
            fn = train_runner(impl, q, k, v, d_out, causal)
            if not any(x.startswith("train,") for x in result):  # one-time costs of the autograd engine
                fn()
            peak, grads = peak_rss_bytes(fn)
            del grads
            result[key] = peak
    return result


def measure_memory(sizes, budget: int, numpy_max_T: int, train_sizes=()):
    """{(impl, T, causal): bytes} of the forward and {(impl, T, causal): bytes} of training."""
    memory, train = {}, {}
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536", MALLOC_TRIM_THRESHOLD_="0")
    for impl in IMPLS:
        impl_sizes = [T for T in sizes if impl != "numpy" or T <= numpy_max_T]
        impl_train = list(train_sizes) if impl in TRAIN_IMPLS else []
        run = subprocess.run([sys.executable, __file__, "--memory-worker", impl, "--budget", str(budget),
                              "--sizes", *map(str, impl_sizes), "--train-sizes", *map(str, impl_train)],
                             env=env, capture_output=True, text=True, timeout=900)
        if run.returncode != 0:
            raise RuntimeError(f"memory worker for {impl} failed:\n{run.stderr[-2000:]}")
        raw = json.loads(run.stdout.strip().splitlines()[-1])
        for T in sizes:
            for causal in (False, True):
                memory[(impl, T, causal)] = raw.get(f"{T},{int(causal)}")
        for T in impl_train:
            for causal in (False, True):
                train[(impl, T, causal)] = raw.get(f"train,{T},{int(causal)}")
        print(f"  memory {impl} done", file=sys.stderr, flush=True)
    return memory, train


def _fmt(x, spec):
    return "skipped" if x is None else format(x, spec)


def _ratio(a, b):
    return None if a is None or b is None else a / b


def render(times, memory, time_sizes, memory_sizes, peak_gflops, meta, train_times=None, train_memory=None,
           window=None, groups=None) -> str:
    train_times, train_memory, window = train_times or {}, train_memory or {}, window or {}
    lines = [f"# Attention on CPU: time and peak memory ({meta['date']})", "",
             f"Machine: {meta['cpu']}, vector ISA: {meta['isa']}; {meta['threads']} torch threads, torch {meta['torch']}, "
             f"numpy {meta['numpy']}; OMP_WAIT_POLICY={meta['omp_wait_policy']}; 1-minute load average "
             f"{meta['load']} (a shared machine: other jobs ran during the measurement). "
             f"Measured float32 matmul rate: **{peak_gflops:.1f} GFLOP/s** ({meta['matmul_n']} x {meta['matmul_n']}, "
             "best of runs at the start and the end).", "",
             "B=1, H=8, d_head=64, float32 (NumPy: float64), forward pass under `torch.no_grad`. "
             "Time: minimum over interleaved repeats. %peak: achieved useful GFLOP/s as a percentage of "
             "the measured matmul rate. 'skipped': estimated memory over the budget "
             f"({meta['budget_gib']:.1f} GiB) or, for NumPy, above T={meta['numpy_max_T']} (time budget).", "",
             "## Time (ms) and ratio to SDPA", "",
             "| T | causal | naive | SDPA | tiled | NumPy | naive/SDPA | tiled/SDPA | NumPy/SDPA "
             "| SDPA %peak | tiled %peak |",
             "|---:|:---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for T in time_sizes:
        for causal in (False, True):
            t = {impl: times[(impl, T, causal)] for impl in IMPLS}
            ms = {impl: None if t[impl] is None else 1e3 * t[impl] for impl in IMPLS}
            pct = {impl: None if t[impl] is None else
                   100 * attention_flops(T, causal) / t[impl] / 1e9 / peak_gflops for impl in ("sdpa", "tiled")}
            lines.append(
                f"| {T} | {'yes' if causal else 'no'} | {_fmt(ms['naive'], '.1f')} | {_fmt(ms['sdpa'], '.1f')} "
                f"| {_fmt(ms['tiled'], '.1f')} | {_fmt(ms['numpy'], '.1f')} "
                f"| {_fmt(_ratio(t['naive'], t['sdpa']), '.2f')} | {_fmt(_ratio(t['tiled'], t['sdpa']), '.2f')} "
                f"| {_fmt(_ratio(t['numpy'], t['sdpa']), '.2f')} | {_fmt(pct['sdpa'], '.0f')}% "
                f"| {_fmt(pct['tiled'], '.0f')}% |")
    lines += ["", "## Peak extra memory (MiB) and ratios", "",
              "| T | causal | naive | SDPA | tiled | NumPy | tiled/SDPA | tiled/naive |",
              "|---:|:---:|---:|---:|---:|---:|---:|---:|"]
    for T in memory_sizes:
        for causal in (False, True):
            m = {impl: memory[(impl, T, causal)] for impl in IMPLS}
            mib = {impl: None if m[impl] is None else m[impl] / 2**20 for impl in IMPLS}
            lines.append(
                f"| {T} | {'yes' if causal else 'no'} | {_fmt(mib['naive'], '.1f')} | {_fmt(mib['sdpa'], '.1f')} "
                f"| {_fmt(mib['tiled'], '.1f')} | {_fmt(mib['numpy'], '.1f')} "
                f"| {_fmt(_ratio(m['tiled'], m['sdpa']), '.2f')} | {_fmt(_ratio(m['tiled'], m['naive']), '.4f')} |")
    lines += render_training(train_times, train_memory)
    lines += render_window(window)
    lines += render_head_groups(groups or {}, meta["threads"])
    lines += ["", "## Targets", "",
              f"Measured on {meta['cpu']} (vector ISA: {meta['isa']}) only: ratios differ between machine classes.", ""]
    lines += [f"- {line}" for line in check_targets(times, memory, train_times, train_memory, window)]
    return "\n".join(lines) + "\n"


def _sizes(table):
    return sorted({T for (_, T, _) in table})


def render_training(train_times, train_memory) -> list[str]:
    lines = []
    if train_times:
        lines += ["", "## Training: forward plus backward, time (ms)", "",
                  "`out.backward(dO)` after the forward, gradients of q, k, v; minimum over interleaved repeats.", "",
                  "| T | causal | SDPA | tiled | tiled/SDPA |", "|---:|:---:|---:|---:|---:|"]
        for T in _sizes(train_times):
            for causal in (False, True):
                s, t = train_times.get(("sdpa", T, causal)), train_times.get(("tiled", T, causal))
                lines.append(f"| {T} | {'yes' if causal else 'no'} | {_fmt(None if s is None else 1e3 * s, '.1f')} "
                             f"| {_fmt(None if t is None else 1e3 * t, '.1f')} | {_fmt(_ratio(t, s), '.2f')} |")
    if train_memory:
        lines += ["", "## Training: peak extra memory of forward plus backward (MiB)", "",
                  "The three gradients (linear in T) are part of it. x2T: the ratio to the row at half the length "
                  "(2 for memory linear in T, 4 for quadratic).", "",
                  "| T | causal | naive | SDPA | tiled | naive x2T | SDPA x2T | tiled x2T |",
                  "|---:|:---:|---:|---:|---:|---:|---:|---:|"]
        for T in _sizes(train_memory):
            for causal in (False, True):
                m = {i: train_memory.get((i, T, causal)) for i in TRAIN_IMPLS}
                grow = {i: _ratio(m[i], train_memory.get((i, T // 2, causal))) for i in TRAIN_IMPLS}
                lines.append(f"| {T} | {'yes' if causal else 'no'} | "
                             + " | ".join(_fmt(None if m[i] is None else m[i] / 2**20, '.1f') for i in TRAIN_IMPLS) + " | "
                             + " | ".join("-" if (i, T // 2, causal) not in train_memory else _fmt(grow[i], '.2f')
                                          for i in TRAIN_IMPLS) + " |")
    return lines


def render_window(window) -> list[str]:
    if not window:
        return []
    lines = ["", f"## Sliding window (w={WINDOW}, causal, T={WINDOW_T}), forward", ""]
    if "skipped" in window:
        return lines + [f"Not run: {window['skipped']}."]
    if "error" in window:
        return lines + [f"flex_attention could not be compiled on this machine: {window['error']}"]
    return lines + [
        "`sliding_window_tiled_attention` (default blocks) against `torch.compile(flex_attention)` with "
        "`create_block_mask` of the same mask; minimum over interleaved repeats, compile time not counted. "
        "Max abs difference of the tiled output to flex's and to the dense `sliding_window_attention`.", "",
        "| tiled (ms) | flex compiled (ms) | tiled/flex | flex compile + first call (s) | max abs diff to flex "
        "| to dense |",
        "|---:|---:|---:|---:|---:|---:|",
        f"| {1e3 * window['tiled']:.1f} | {1e3 * window['flex']:.1f} | {window['tiled'] / window['flex']:.2f} "
        f"| {window['compile_s']:.1f} | {window['max_abs_diff']:.1e} | {_sci(window.get('max_abs_diff_dense'))} |"]


def _sci(x) -> str:
    return "-" if x is None else f"{x:.1e}"


def check_targets(times, memory, train_times=None, train_memory=None, window=None) -> list[str]:
    """The issue's targets, each stated with its measured value and MET / NOT MET, or NOT MEASURED
    when the run did not include the size (``--quick``) or skipped it (memory budget)."""
    train_times, train_memory, window = train_times or {}, train_memory or {}, window or {}
    out = []

    def verdict(r, ok, spec, T):
        if r is None:
            return f"NOT MEASURED (T={T} was not run: --quick, or over the memory budget)"
        return f"{format(r, spec)}, {'MET' if ok(r) else 'NOT MET'}"

    for causal in (False, True):
        r = _ratio(times.get(("tiled", 4096, causal)), times.get(("sdpa", 4096, causal)))
        out.append(f"tiled forward time within 1.2x of SDPA at T=4096, causal={causal}: "
                   + verdict(r, lambda x: x <= 1.2, ".2f", 4096))
    for causal in (False, True):
        r = _ratio(train_times.get(("tiled", 4096, causal)), train_times.get(("sdpa", 4096, causal)))
        out.append(f"tiled forward+backward time within 1.5x of SDPA's at T=4096, causal={causal}: "
                   + verdict(r, lambda x: x <= 1.5, ".2f", 4096))
    for causal in (False, True):
        grow = {i: _ratio(train_memory.get((i, 8192, causal)), train_memory.get((i, 4096, causal)))
                for i in TRAIN_IMPLS}
        others = ", ".join(f"{i} {_fmt(grow[i], '.2f')}" for i in ("sdpa", "naive"))
        out.append(f"tiled training memory linear in T (peak extra memory at T=8192 / at T=4096 <= 2.25; "
                   f"quadratic would be 4), causal={causal}: " + verdict(grow["tiled"], lambda x: x <= 2.25, ".2f", 8192)
                   + ("" if grow["tiled"] is None else f" ({others})"))
    r = _ratio(times.get(("tiled", 8192, False)), times.get(("tiled", 8192, True)))
    out.append("tiled causal at least 1.8x faster than unmasked at T=8192 (unmasked/causal time): "
               + verdict(r, lambda x: x >= 1.8, ".2f", 8192))
    what = f"tiled sliding window (w={WINDOW}, T={WINDOW_T}) faster than flex_attention compiled on the CPU (tiled/flex)"
    if "error" in window:
        out.append(f"{what}: NOT MEASURABLE here, flex_attention did not compile: {window['error']}")
    elif "tiled" in window:
        r = window["tiled"] / window["flex"]
        out.append(f"{what}: {r:.2f}, {'MET' if r < 1 else 'NOT MET'}")
    else:
        out.append(f"{what}: NOT MEASURED (T={WINDOW_T} was not run: --quick does not compile flex_attention)")
    for causal in (False, True):
        r = _ratio(memory.get(("tiled", 8192, causal)), memory.get(("sdpa", 8192, causal)))
        out.append(f"tiled peak memory within 2x of SDPA at T=8192, causal={causal}: "
                   + verdict(r, lambda x: x <= 2, ".2f", 8192))
        r = _ratio(memory.get(("tiled", 8192, causal)), memory.get(("naive", 8192, causal)))
        out.append(f"tiled peak memory under 1/100 of naive at T=8192, causal={causal}: "
                   + verdict(r, lambda x: x < 0.01, ".4f", 8192))
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="T = 256, 512 only; for a smoke test")
    parser.add_argument("--out", type=Path, default=None,
                        help="markdown file to write (default for a full run: bench/results/cpu-<date>.md)")
    parser.add_argument("--memory-worker", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--sweep", action="store_true", help="tiled block sizes against SDPA at T=4096; prints only")
    parser.add_argument("--window-sweep", action="store_true",
                        help="the sliding window's forward and backward block sizes (w=256, T=8192); prints only")
    parser.add_argument("--sizes", type=int, nargs="*", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--train-sizes", type=int, nargs="*", default=(), help=argparse.SUPPRESS)
    parser.add_argument("--budget", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.memory_worker:
        print(json.dumps(memory_worker(args.memory_worker, args.sizes, args.budget, args.train_sizes)))
        return
    if args.sweep:
        sweep(repeats=3)
        return
    if args.window_sweep:
        window_sweep(repeats=5)
        return

    torch.manual_seed(0)
    load_start = os.getloadavg()
    budget = memory_budget()
    time_sizes = QUICK_SIZES if args.quick else TIME_SIZES
    memory_sizes = QUICK_SIZES if args.quick else MEMORY_SIZES
    numpy_max_T = 4096
    matmul_n = 512 if args.quick else 2048
    peak = matmul_gflops(matmul_n, 3 if args.quick else 5)
    print(f"float32 matmul: {peak:.1f} GFLOP/s", file=sys.stderr, flush=True)
    times = measure_times(time_sizes, 2 if args.quick else 3, budget, numpy_max_T)
    # measured again after the timings and the best kept: a rate caught while other jobs ran would
    # understate the machine and overstate every fraction of it
    peak = max(peak, matmul_gflops(matmul_n, 3 if args.quick else 5))
    print(f"float32 matmul, best of start and end: {peak:.1f} GFLOP/s", file=sys.stderr, flush=True)
    train_times = measure_train_times(QUICK_SIZES if args.quick else TRAIN_TIME_SIZES, 2 if args.quick else 4)
    window = measure_window(6, args.quick)
    groups = {} if args.quick or torch.get_num_threads() < 2 else measure_head_groups(3)
    memory, train_memory = measure_memory(memory_sizes, budget, numpy_max_T,
                                          QUICK_SIZES if args.quick else TRAIN_SIZES)
    today = dt.date.today().isoformat()
    meta = {"date": today, "cpu": cpu_name(), "isa": vector_isa(), "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"), "threads": torch.get_num_threads(), "torch": torch.__version__,
            "numpy": np.__version__, "load": f"{load_start[0]:.1f} at start, {os.getloadavg()[0]:.1f} at the end, "
                                       f"{max(LOADS, default=load_start[0]):.1f} at most during the timings",
            "budget_gib": budget / GIB, "numpy_max_T": numpy_max_T, "matmul_n": matmul_n}
    table = render(times, memory, time_sizes, memory_sizes, peak, meta, train_times, train_memory, window, groups)
    print(table)
    out = args.out if args.out is not None else (None if args.quick else RESULTS / f"cpu-{today}.md")
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(table)
        record = {"meta": meta, "matmul_gflops": peak,
                  "time_s": [{"impl": i, "T": T, "causal": c, "value": v} for (i, T, c), v in times.items()],
                  "memory_bytes": [{"impl": i, "T": T, "causal": c, "value": v} for (i, T, c), v in memory.items()],
                  "train_time_s": [{"impl": i, "T": T, "causal": c, "value": v} for (i, T, c), v in train_times.items()],
                  "train_memory_bytes": [{"impl": i, "T": T, "causal": c, "value": v}
                                         for (i, T, c), v in train_memory.items()],
                  "window": {"w": WINDOW, "T": WINDOW_T, **window},
                  "head_groups_s": [{"pass": p, "causal": c, "impl": n, "value": v} for (p, c, n), v in groups.items()]}
        out.with_suffix(".json").write_text(json.dumps(record, indent=1))
        print(f"wrote {out} and {out.with_suffix('.json')}", file=sys.stderr)


if __name__ == "__main__":
    main()
