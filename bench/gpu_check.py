"""The GPU check: attention kernels on CUDA in bfloat16, against a float32 reference, up to T=32768.

    python bench/gpu_check.py [--max-T 32768] [--out bench/results/gpu-<date>-<device>.md] [--require-gpu]

Runs, for B=1, H=16, d_head=128 (bfloat16), T = 1024 ... max-T, causal and not:
PyTorch SDPA with each backend forced (flash, efficient, cuDNN, math), the tiled torch path
(``tiled_forward_torch``) and the Triton kernel (``triton_forward``). Each output is compared with a
float32 reference (the tiled torch path in float32, exact by the test suite): its error is
max |out - reference| / max |reference| (relative, as the backward's: the outputs shrink as T grows,
to about 0.05 at T=32768, so an absolute bound would loosen with T), "ok" below 2e-2 (bfloat16 rounds
at 2^-8 = 3.9e-3 relative); and timed with CUDA events (median of repeats); throughput is reported in
TFLOP/s against the measured bfloat16 matrix-multiply peak of the same GPU. A second table does the same for the backward pass (dq, dk,
dv for a random output gradient): SDPA's backward with each backend, the Triton backward
(``triton_backward``) and ``tiled_attention`` under autograd (which runs the Triton forward and
backward on CUDA), against float32 reference gradients (``tiled_backward_torch`` in float32); its
error is the largest of max |grad - reference| / max |reference| over dq, dk and dv, and its
throughput counts 2.5 times the forward's FLOPs (five matrix products for the forward's two).
A third table runs the Triton kernels in float32 (IEEE products, the precision ``tiled_attention``
picks for float32 on CUDA, at the 128-row forward tiles and d_head=128 whose registers and shared
memory the interpreter of the test suite does not model) against a float64 reference, forward and
backward, "ok" below 1e-4 relative. Configurations a backend refuses, or that run out of memory, are reported as such. On a machine
without a CUDA GPU it says so and exits (status 0; 1 with ``--require-gpu``): the CPU path is measured by
``bench/attention_bench.py``.
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
# what a configuration may raise and be reported as (refused, out of memory), not end the check:
# Triton's own errors (a kernel that needs more shared memory than the GPU has) are no RuntimeError
_REFUSALS: tuple[type[BaseException], ...] = (RuntimeError, torch.OutOfMemoryError)
try:
    from triton.errors import TritonError

    _REFUSALS += (TritonError,)
except ImportError:  # no Triton: the Triton rows fail with RuntimeError ("triton is not installed")
    pass


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


def _backward_implementations(causal: bool, vis):
    """For each backward: ``prepare(q, k, v, d_out)`` runs the forward once (untimed) and returns a
    function computing ``(dq, dk, dv)``, the part that is timed (autograd keeps the graph for repeats)."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from selfattn.efficient.tiled import tiled_attention
    from selfattn.efficient.triton_kernel import triton_backward, triton_forward

    scale = 1 / math.sqrt(D_HEAD)

    def sdpa(backend):
        def prepare(q, k, v, d_out):
            leaves = [x.detach().requires_grad_(True) for x in (q, k, v)]
            with sdpa_kernel([backend]):  # the backend is fixed by the forward; its backward follows
                out = F.scaled_dot_product_attention(*leaves, is_causal=causal)
            return lambda: torch.autograd.grad(out, leaves, d_out, retain_graph=True)
        return prepare

    def triton(q, k, v, d_out):
        out, lse = triton_forward(q, k, v, vis, scale, 128, 64)
        return lambda: triton_backward(q, k, v, out, lse, d_out, vis, scale, 64, 64)

    def tiled_autograd(q, k, v, d_out):  # the wiring: Triton forward and backward inside tiled_attention
        leaves = [x.detach().requires_grad_(True) for x in (q, k, v)]
        out = tiled_attention(*leaves, causal=causal, block_q=128, block_k=64)
        return lambda: torch.autograd.grad(out, leaves, d_out, retain_graph=True)

    return {
        "sdpa-flash": sdpa(SDPBackend.FLASH_ATTENTION),
        "sdpa-efficient": sdpa(SDPBackend.EFFICIENT_ATTENTION),
        "sdpa-cudnn": sdpa(SDPBackend.CUDNN_ATTENTION),
        "sdpa-math": sdpa(SDPBackend.MATH),
        "triton": triton,
        "tiled_attention (autograd)": tiled_autograd,
    }


def _reference_gradients(q, k, v, d_out, vis, dtype=torch.float32):
    """Reference ``(dq, dk, dv)`` in ``dtype`` (float32 or float64): the tiled torch forward and backward."""
    from selfattn.efficient.tiled import tiled_backward_torch, tiled_forward_torch

    q, k, v, d_out = (x.to(dtype) for x in (q, k, v, d_out))
    out, lse = tiled_forward_torch(q, k, v, vis, 1 / math.sqrt(D_HEAD), 2048, 2048)
    # the torch backward takes the natural log-sum-exp as (row maximum, log2 l) = (lse, 0)
    return tiled_backward_torch(q, k, v, out, lse, d_out, vis, 1 / math.sqrt(D_HEAD), 2048, 2048)


def _relative_error(got, want) -> float:
    """max |got - want| / max |want|, in float64."""
    want = want.detach().double()
    return float((got.detach().double() - want).abs().max() / want.abs().max())


FLOAT32_TOLERANCE = 1e-4  # relative; float32 rounds at 6e-8, the sums over T and d_head add a few hundred roundings


def float32_rows(sizes=(1024, 4096), repeats: int = 5, device: str = "cuda", timer=None) -> list[str]:
    """The float32 table: the Triton forward and backward kernels and ``tiled_attention`` under autograd
    in float32 (B, H, T, D_HEAD) against float64 references, causal and not, at each T of ``sizes``.
    ``device`` and ``timer`` (``timer(fn, repeats) -> seconds``, default CUDA events) let the test suite
    run it on the CPU under ``TRITON_INTERPRET=1``."""
    lines = ["", "## float32 (IEEE products), Triton kernels against a float64 reference", "",
             f"Error: max |out - reference| / max |reference| (backward: the largest over dq, dk, dv); "
             f"ok below {FLOAT32_TOLERANCE:g}. TFLOP/s: useful FLOPs (backward 2.5 times the forward's) per second.", "",
             "| T | causal | implementation | ms | TFLOP/s | max rel. error | status |",
             "|---:|:---:|:---|---:|---:|---:|:---|"]
    for T in sizes:
        g = torch.Generator(device=device).manual_seed(T)
        q, k, v, d_out = (torch.randn(B, H, T, D_HEAD, device=device, generator=g) for _ in range(4))
        for causal in (False, True):
            lines += _float32_case(q, k, v, d_out, causal, repeats, timer or _cuda_time)
            print(f"  float32 T={T} causal={causal} done", file=sys.stderr, flush=True)
    return lines


def _float32_case(q, k, v, d_out, causal: bool, repeats: int, timer) -> list[str]:
    from selfattn.efficient.tiled import Visibility, tiled_attention, tiled_forward_torch
    from selfattn.efficient.triton_kernel import triton_backward, triton_forward

    T, scale = q.shape[-2], 1 / math.sqrt(D_HEAD)
    vis = Visibility(causal_offset=0 if causal else None)
    want_out = tiled_forward_torch(q.double(), k.double(), v.double(), vis, scale, 1024, 1024)[0]
    want_grads = _reference_gradients(q, k, v, d_out, vis, torch.float64)
    flops = 4 * B * H * D_HEAD * (T * (T + 1) / 2 if causal else T * T)
    leaves = [x.detach().requires_grad_(True) for x in (q, k, v)]

    def forward():
        return triton_forward(q, k, v, vis, scale, 128, 64)

    out, lse = forward()

    def backward():
        return triton_backward(q, k, v, out, lse, d_out, vis, scale, 64, 64)

    def autograd_step():  # the wiring: Triton forward and backward inside tiled_attention on CUDA
        result = tiled_attention(*leaves, causal=causal, block_q=128, block_k=64)
        return (result, *torch.autograd.grad(result, leaves, d_out))

    def worst(got, want):
        return max(_relative_error(a, b) for a, b in zip(got, want, strict=True))

    lines = []
    for name, fn, error_of, work in [
            ("triton forward", forward, lambda result: _relative_error(result[0], want_out), 1.0),
            ("triton backward", backward, lambda grads: worst(grads, want_grads), 2.5),
            ("tiled_attention (autograd), forward+backward", autograd_step,
             lambda result: worst(result, (want_out, *want_grads)), 3.5)]:
        try:
            error = error_of(fn())
            seconds = timer(fn, repeats)
            lines.append(f"| {T} | {'yes' if causal else 'no'} | {name} | {seconds * 1e3:.2f} "
                         f"| {work * flops / seconds / 1e12:.1f} | {error:.2e} "
                         f"| {'ok' if error < FLOAT32_TOLERANCE else 'INACCURATE'} |")
        except _REFUSALS as err:
            lines.append(_failed_row(T, causal, name, err, blanks=3))
    return lines


def _row(T: int, causal: bool, name: str, seconds: float, flops: float, peak: float, error: float,
         status: str) -> str:
    tflops = flops / seconds / 1e12
    return (f"| {T} | {'yes' if causal else 'no'} | {name} | {seconds * 1e3:.2f} | {tflops:.1f} "
            f"| {100 * tflops / peak:.0f}% | {error:.2e} | {status} |")


def _failed_row(T: int, causal: bool, name: str, err: Exception, blanks: int = 4) -> str:
    """A row for a configuration refused or out of memory: ``blanks`` empty number columns, then the reason."""
    reason = str(err).splitlines()[0][:80].replace("|", "/") if str(err) else type(err).__name__
    return f"| {T} | {'yes' if causal else 'no'} | {name} | {'- | ' * blanks}{reason} |"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-T", type=int, default=32768)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--require-gpu", action="store_true",
                        help="exit with status 1 when there is no CUDA GPU (for a GPU runner that must not pass "
                             "green on a CPU build of torch)")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("gpu_check: no CUDA GPU on this machine (torch.cuda.is_available() is False); nothing to "
              "check. The CPU measurements are made by bench/attention_bench.py.")
        return 1 if args.require_gpu else 0
    from selfattn.efficient.tiled import tiled_forward_torch

    device_name = torch.cuda.get_device_name()
    peak = _bf16_matmul_tflops()
    lines = [f"# Attention on {device_name}, bfloat16 ({dt.date.today().isoformat()})", "",
             f"torch {torch.__version__}; measured bfloat16 matmul peak {peak:.0f} TFLOP/s. "
             f"B={B}, H={H}, d_head={D_HEAD}. Error: max |out - float32 reference| / max |reference|. Time: median of "
             f"{args.repeats} runs (CUDA events).", "",
             "| T | causal | implementation | ms | TFLOP/s | % of matmul peak | max error | status |",
             "|---:|:---:|:---|---:|---:|---:|---:|:---|"]
    backward_lines = ["", "## Backward (dq, dk, dv)", "",
                      "Error: the largest over dq, dk, dv of max |grad - float32 reference| / max |reference|. "
                      "TFLOP/s counts 2.5 times the forward's FLOPs.", "",
                      "| T | causal | implementation | ms | TFLOP/s | % of matmul peak | max rel. error | status |",
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
                    error = _relative_error(fn(q, k, v), reference)
                    seconds = _cuda_time(lambda fn=fn, q=q, k=k, v=v: fn(q, k, v), args.repeats)
                    lines.append(_row(T, causal, name, seconds, flops, peak, error,
                                      "ok" if error < 2e-2 else "INACCURATE"))
                except _REFUSALS as err:  # refused, out of memory or out of GPU resources
                    lines.append(_failed_row(T, causal, name, err))
                torch.cuda.empty_cache()
            del reference
            d_out = torch.randn(B, H, T, D_HEAD, device="cuda", generator=g, dtype=torch.bfloat16)
            reference_grads = _reference_gradients(q, k, v, d_out, vis)
            for name, prepare in _backward_implementations(causal, vis).items():
                try:
                    backward = prepare(q, k, v, d_out)
                    grads = backward()
                    # relative to the largest reference gradient: dk and dv shrink as T grows
                    error = max(_relative_error(got, want) for got, want in zip(grads, reference_grads, strict=True))
                    del grads
                    seconds = _cuda_time(backward, args.repeats)
                    backward_lines.append(_row(T, causal, name, seconds, 2.5 * flops, peak, error,
                                               "ok" if error < 5e-2 else "INACCURATE"))
                except _REFUSALS as err:  # refused, out of memory or out of GPU resources
                    backward_lines.append(_failed_row(T, causal, name, err))
                backward = grads = None  # free the graph a forward kept for its backward
                torch.cuda.empty_cache()
            del reference_grads, d_out
            print(f"  T={T} causal={causal} done", file=sys.stderr, flush=True)
        T *= 2
    table = "\n".join(lines + backward_lines + float32_rows(repeats=args.repeats)) + "\n"
    print(table)
    slug = "".join(c if c.isalnum() else "-" for c in device_name).strip("-").lower()
    out = args.out or RESULTS / f"gpu-{dt.date.today().isoformat()}-{slug}.md"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(table)
    print(f"wrote {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
