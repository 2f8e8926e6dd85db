"""The GPU check: attention kernels on CUDA in bfloat16, against a float32 reference, up to T=32768.

    python bench/gpu_check.py [--max-T 32768] [--out bench/results/gpu-<date>-<device>.md]

Runs, for B=1, H=16, d_head=128 (bfloat16), T = 1024 ... max-T, causal and not:
PyTorch SDPA with each backend forced (flash, efficient, cuDNN, math), the tiled torch path
(``tiled_forward_torch``) and the Triton kernel (``triton_forward``). Each output is compared with a
float32 reference (the tiled torch path in float32, exact by the test suite), and timed with CUDA
events (median of repeats); throughput is reported in TFLOP/s against the measured bfloat16
matrix-multiply peak of the same GPU. Configurations a backend refuses, or that run out of memory,
are reported as such. On a machine without a CUDA GPU it says so and exits (status 0): the CPU path
is measured by ``bench/attention_bench.py``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import math
import sys
from pathlib import Path

import torch

RESULTS = Path(__file__).resolve().parent / "results"
B, H, D_HEAD = 1, 16, 128


def _bf16_matmul_tflops(n: int = 8192, repeats: int = 10) -> float:
    a, b = (torch.randn(n, n, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    return 2 * n**3 / _cuda_time(lambda: a @ b, repeats) / 1e12


def _cuda_time(fn, repeats: int) -> float:
    """Median seconds of ``fn`` over ``repeats`` runs, after one warm-up, timed with CUDA events."""
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(stop) / 1e3)
    return sorted(times)[len(times) // 2]


def _implementations(causal: bool):
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from selfattn.efficient.tiled import Visibility, tiled_forward_torch
    from selfattn.efficient.triton_kernel import triton_forward

    vis = Visibility(causal_offset=0 if causal else None)

    def sdpa(backend):
        def run(q, k, v):
            with sdpa_kernel([backend]):
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        return run

    return {
        "sdpa-flash": sdpa(SDPBackend.FLASH_ATTENTION),
        "sdpa-efficient": sdpa(SDPBackend.EFFICIENT_ATTENTION),
        "sdpa-cudnn": sdpa(SDPBackend.CUDNN_ATTENTION),
        "sdpa-math": sdpa(SDPBackend.MATH),
        "tiled-torch": lambda q, k, v: tiled_forward_torch(q, k, v, vis, 1 / math.sqrt(D_HEAD), 1024, 1024)[0],
        "triton": lambda q, k, v: triton_forward(q, k, v, vis, 1 / math.sqrt(D_HEAD), 128, 64)[0],
    }, vis


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-T", type=int, default=32768)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("gpu_check: no CUDA GPU on this machine (torch.cuda.is_available() is False); nothing to "
              "check. The CPU measurements are made by bench/attention_bench.py.")
        return 0
    from selfattn.efficient.tiled import tiled_forward_torch

    device_name = torch.cuda.get_device_name()
    peak = _bf16_matmul_tflops()
    lines = [f"# Attention on {device_name}, bfloat16 ({dt.date.today().isoformat()})", "",
             f"torch {torch.__version__}; measured bfloat16 matmul peak {peak:.0f} TFLOP/s. "
             f"B={B}, H={H}, d_head={D_HEAD}. Error: max |out - float32 reference|. Time: median of "
             f"{args.repeats} runs (CUDA events).", "",
             "| T | causal | implementation | ms | TFLOP/s | % of matmul peak | max error | status |",
             "|---:|:---:|:---|---:|---:|---:|---:|:---|"]
    T = 1024
    while T <= args.max_T:
        g = torch.Generator(device="cuda").manual_seed(T)
        q, k, v = (torch.randn(B, H, T, D_HEAD, device="cuda", generator=g, dtype=torch.bfloat16) for _ in range(3))
        for causal in (False, True):
            impls, vis = _implementations(causal)
            reference = tiled_forward_torch(q.float(), k.float(), v.float(), vis, 1 / math.sqrt(D_HEAD), 2048, 2048)[0]
            flops = 4 * B * H * D_HEAD * (T * (T + 1) / 2 if causal else T * T)
            for name, fn in impls.items():
                try:
                    error = float((fn(q, k, v).float() - reference).abs().max())
                    seconds = _cuda_time(lambda fn=fn, q=q, k=k, v=v: fn(q, k, v), args.repeats)
                    tflops = flops / seconds / 1e12
                    status = "ok" if error < 2e-2 else "INACCURATE"
                    lines.append(f"| {T} | {'yes' if causal else 'no'} | {name} | {seconds * 1e3:.2f} | {tflops:.1f} "
                                 f"| {100 * tflops / peak:.0f}% | {error:.2e} | {status} |")
                except (RuntimeError, torch.OutOfMemoryError) as err:  # refused or out of memory
                    reason = str(err).splitlines()[0][:80].replace("|", "/")
                    lines.append(f"| {T} | {'yes' if causal else 'no'} | {name} | - | - | - | - | {reason} |")
                torch.cuda.empty_cache()
            print(f"  T={T} causal={causal} done", file=sys.stderr, flush=True)
            del reference
        T *= 2
    table = "\n".join(lines) + "\n"
    print(table)
    slug = "".join(c if c.isalnum() else "-" for c in device_name).strip("-").lower()
    out = args.out or RESULTS / f"gpu-{dt.date.today().isoformat()}-{slug}.md"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(table)
    print(f"wrote {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
