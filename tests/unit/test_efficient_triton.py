"""The Triton forward and backward kernels, run on the CPU through Triton's interpreter.

``TRITON_INTERPRET=1`` must be set before ``triton`` is imported, and the rest of the test session
has already imported it without, so the checks run in a fresh Python process.
"""

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from selfattn.efficient import tiled
from selfattn.efficient.tiled import Visibility

triton = pytest.importorskip("triton", reason="triton is not installed")

_SCRIPT = textwrap.dedent("""
    import json
    import torch
    import selfattn
    from selfattn.efficient.tiled import Visibility, tiled_forward_torch
    from selfattn.efficient.triton_kernel import triton_forward
    torch.manual_seed(0)
    cases = [(2, 3, 37, 37, 16, 24, None), (1, 2, 20, 45, 16, 16, "top_left"),
             (1, 2, 20, 45, 16, 16, "bottom_right"), (1, 2, 45, 20, 8, 16, "bottom_right"),
             (1, 1, 33, 33, 64, 64, "top_left")]
    report = []
    for B, H, T, S, Dh, Dv, alignment in cases:
        q, k, v = torch.randn(B, H, T, Dh), torch.randn(B, H, S, Dh), torch.randn(B, H, S, Dv)
        offset = None if alignment is None else (S - T if alignment == "bottom_right" else 0)
        vis = Visibility(causal_offset=offset)
        out, lse = triton_forward(q, k, v, vis, 0.3, 16, 16)
        keep = None if alignment is None else selfattn.causal_mask(T, S, alignment=alignment)
        expected = selfattn.scaled_dot_product_attention(q.double(), k.double(), v.double(), keep, scale=0.3)
        _, expected_lse = tiled_forward_torch(q.double(), k.double(), v.double(), vis, 0.3, 7, 5)
        lse_finite = torch.isfinite(expected_lse)
        report.append({
            "case": [B, H, T, S, Dh, Dv, alignment],
            "out_err": float((out.double() - expected).abs().max()),
            "out_finite": bool(torch.isfinite(out).all()),
            "lse_err": float((lse.double() - expected_lse)[lse_finite].abs().max()),
            "lse_inf_match": bool(torch.equal(torch.isneginf(lse), torch.isneginf(expected_lse))),
            "empty_rows_zero": bool((out[~lse_finite.expand_as(lse)] == 0).all()),
        })
    # a NaN value at position 3: under the causal mask only queries 3.. may see it (as in the reference)
    q, k, v = torch.randn(1, 2, 20, 16), torch.randn(1, 2, 20, 16), torch.randn(1, 2, 20, 16)
    v[..., 3, :] = float("nan")
    out, _ = triton_forward(q, k, v, Visibility(causal_offset=0), 0.3, 16, 16)
    expected = selfattn.scaled_dot_product_attention(q.double(), k.double(), v.double(),
                                                     selfattn.causal_mask(20), scale=0.3)
    report.append({"nan_rows_match": bool(torch.equal(torch.isnan(out), torch.isnan(expected))),
                   "nan_expected_rows_3_on": bool(torch.isnan(expected[..., 3:, :]).all()),
                   "finite_rows_err": float((out.double() - expected)[..., :3, :].abs().max())})
    print(json.dumps(report))
""")


def test_triton_kernel_in_interpreter_matches_reference():
    env = dict(os.environ, TRITON_INTERPRET="1")
    run = subprocess.run([sys.executable, "-c", _SCRIPT], env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads(run.stdout.strip().splitlines()[-1])
    assert len(report) == 6
    nan_case = report.pop()
    assert nan_case["nan_expected_rows_3_on"] and nan_case["nan_rows_match"], nan_case
    assert nan_case["finite_rows_err"] < 1e-5, nan_case
    for case in report:
        assert case["out_finite"], case
        assert case["out_err"] < 1e-5, case
        assert case["lse_err"] < 1e-5, case
        assert case["lse_inf_match"] and case["empty_rows_zero"], case


def test_dispatch_picks_torch_loop_on_cpu_and_triton_on_cuda(monkeypatch):
    q = torch.zeros(1, 1, 4, 4)
    assert tiled.pick_forward(q, Visibility()) is tiled.tiled_forward_torch

    class FakeCuda:
        is_cuda = True

        def numel(self):
            return 16

    from selfattn.efficient import triton_kernel

    assert tiled.pick_forward(FakeCuda(), Visibility(causal_offset=0)) is triton_kernel.triton_forward
    # a general mask or a window stays on the torch loop even on CUDA
    assert tiled.pick_forward(FakeCuda(), Visibility(mask=torch.ones(4, 4, dtype=torch.bool))) is tiled.tiled_forward_torch
    assert tiled.pick_forward(FakeCuda(), Visibility(causal_offset=0, window=3)) is tiled.tiled_forward_torch
    empty = FakeCuda()
    empty.numel = lambda: 0  # nothing to launch a kernel for: the torch loop returns the empty result
    assert tiled.pick_forward(empty, Visibility()) is tiled.tiled_forward_torch
    monkeypatch.setattr(triton_kernel, "triton_available", lambda: False)
    assert tiled.pick_forward(FakeCuda(), Visibility()) is tiled.tiled_forward_torch


def test_triton_forward_refuses_general_mask():
    from selfattn.efficient.triton_kernel import triton_forward

    q = torch.zeros(1, 1, 4, 4)
    with pytest.raises(ValueError, match="causal or no masking"):
        triton_forward(q, q, q, Visibility(mask=torch.ones(4, 4, dtype=torch.bool)), 1.0)


_LSE_DTYPE_SCRIPT = textwrap.dedent("""
    import json
    import numpy as np
    import torch
    import selfattn
    from selfattn.efficient.tiled import Visibility
    from selfattn.efficient.triton_kernel import triton_forward
    from selfattn.ref.online import logsumexp
    torch.manual_seed(0)
    report = {}
    for dtype in (torch.float64, torch.float32, torch.float16):
        q, k, v = (torch.randn(1, 2, 20, 16, dtype=dtype) for _ in range(3))
        out, lse = triton_forward(q, k, v, Visibility(causal_offset=0), 0.3, 16, 16)
        # float64 oracles from the NumPy reference
        q64, k64, v64 = (x.double().numpy() for x in (q, k, v))
        keep = selfattn.ref.causal_mask(20)
        scores = 0.3 * q64 @ k64.swapaxes(-1, -2)
        expected_lse = logsumexp(np.where(keep, scores, -np.inf))
        expected = selfattn.ref.scaled_dot_product_attention(q64, k64, v64, keep, scale=0.3)
        report[str(dtype)] = {"out_dtype": str(out.dtype), "lse_dtype": str(lse.dtype),
                              "lse": lse.double().tolist(), "expected_lse": expected_lse.tolist(),
                              "out": out.double().tolist(), "expected": expected.tolist()}
    print(json.dumps(report))
""")


def test_triton_lse_is_float64_for_float64_inputs_as_documented():
    # Regression: the kernel returned a float32 lse (computed in float32) for float64 inputs, though
    # tiled_forward_torch's contract (which triton_forward promises to keep) and tiled_attention's
    # docstring say float32, float64 for float64 inputs.
    env = dict(os.environ, TRITON_INTERPRET="1")
    run = subprocess.run([sys.executable, "-c", _LSE_DTYPE_SCRIPT], env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads(run.stdout.strip().splitlines()[-1])
    tolerances = {"torch.float64": 1e-12, "torch.float32": 1e-5, "torch.float16": 2e-2}
    for dtype, lse_dtype in (("torch.float64", "torch.float64"), ("torch.float32", "torch.float32"),
                             ("torch.float16", "torch.float32")):
        case = report[dtype]
        assert case["out_dtype"] == dtype and case["lse_dtype"] == lse_dtype, (dtype, case["lse_dtype"])
        tol = tolerances[dtype]
        torch.testing.assert_close(torch.tensor(case["lse"]), torch.tensor(case["expected_lse"]),
                                   rtol=0, atol=tol, equal_nan=False)
        torch.testing.assert_close(torch.tensor(case["out"]), torch.tensor(case["expected"]),
                                   rtol=0, atol=tol, equal_nan=False)


_HIDDEN_NONFINITE_SCRIPT = textwrap.dedent("""
    import json
    from selfattn.efficient import tiled
    from selfattn.efficient.triton_kernel import triton_forward
    from tests.unit import test_hidden_nonfinite_gradients as contract
    launched = []

    def pick_forward(q, vis):  # what tiled_attention picks on CUDA, here on the CPU interpreter
        if vis.mask is None and vis.window is None:
            launched.append(1)
            return triton_forward
        return tiled.tiled_forward_torch

    tiled.pick_forward = pick_forward
    failures = []
    for where, pos in [(w, p) for name, w, p in contract.CASES if name == "causal"]:
        for bad in contract.BAD:
            for blocks in [(16, 16), (2, 2), (4, 3)]:  # the kernel's tiles are >= 16; the backward's as given
                def path(q, k, v, keep):
                    return tiled.tiled_attention(q, k, v, causal=True, scale=contract.SCALE,
                                                 block_q=blocks[0], block_k=blocks[1])
                try:
                    contract._check(path, "causal", where, pos, bad)
                except AssertionError as error:
                    failures.append(f"{where}[{pos}]={bad} blocks {blocks}: {str(error)[:300]}")
    print(json.dumps({"failures": failures, "launched": len(launched)}))
""")


def test_triton_forward_keeps_hidden_nonfinite_out_of_gradients():
    # DESIGN.md: in every path, a NaN/inf at a key, query or value position reaches no gradient of a
    # row that cannot see it. The Triton forward (or the torch loop it falls back to for a
    # non-finite value) with the tiled backward; the cases and the float64 oracle of
    # test_hidden_nonfinite_gradients.py. Regression: a NaN key hidden by the causal mask made dq
    # of the earlier rows NaN.
    env = dict(os.environ, TRITON_INTERPRET="1")
    run = subprocess.run([sys.executable, "-c", _HIDDEN_NONFINITE_SCRIPT], env=env, capture_output=True, text=True,
                         timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads(run.stdout.strip().splitlines()[-1])
    assert report["launched"] == 36, report["launched"]  # every call went to the Triton forward
    assert report["failures"] == [], "\n".join(report["failures"])


# ------------------------------------------------------------------------------------------------
# The backward kernels (dq, dk, dv; Dao 2023, Algorithm 2)
# ------------------------------------------------------------------------------------------------

_BACKWARD_SCRIPT = textwrap.dedent("""
    import json
    import torch
    import selfattn
    from selfattn.efficient.tiled import Visibility
    from selfattn.efficient.triton_kernel import triton_backward, triton_forward
    torch.manual_seed(0)

    def oracle(q, k, v, alignment, d_out):
        # float64 autograd through the dense reference
        q, k, v = (x.detach().double().requires_grad_(True) for x in (q, k, v))
        T, S = q.shape[-2], k.shape[-2]
        keep = None if alignment is None else selfattn.causal_mask(T, S, alignment=alignment)
        out = selfattn.scaled_dot_product_attention(q, k, v, keep, scale=0.3)
        return torch.autograd.grad(out, (q, k, v), d_out.double())

    def errors(got, want):
        # max |got - want| / max |want| per gradient; NaN propagates through amax (NaN > tol is False,
        # so the test also checks finiteness explicitly)
        return [float((g.double() - w).abs().amax() / w.abs().amax()) for g, w in zip(got, want)]

    # (name, B, H, T, S, Dh, Dv, alignment, dtype); block 16: T and S are not multiples of it
    cases = [("no mask, uneven tiles", 2, 2, 37, 29, 16, 24, None, torch.float32),
             ("causal top-left T < S", 1, 2, 20, 45, 16, 16, "top_left", torch.float32),
             ("causal top-left T > S", 1, 2, 40, 20, 16, 16, "top_left", torch.float32),
             ("causal bottom-right T < S, Dh 12 Dv 20", 1, 2, 20, 45, 12, 20, "bottom_right", torch.float32),
             ("causal bottom-right T > S (rows 0..24 see nothing)", 1, 2, 45, 20, 8, 16, "bottom_right",
              torch.float32),
             ("causal T == S, Dh 24 Dv 40", 2, 1, 33, 33, 24, 40, "top_left", torch.float32),
             ("float64", 1, 2, 20, 27, 16, 16, "bottom_right", torch.float64),
             ("float16", 1, 2, 20, 27, 16, 16, "bottom_right", torch.float16)]
    report = []
    for name, B, H, T, S, Dh, Dv, alignment, dtype in cases:
        q, k, v = (torch.randn(B, H, n, d, dtype=dtype) for n, d in ((T, Dh), (S, Dh), (S, Dv)))
        offset = None if alignment is None else (S - T if alignment == "bottom_right" else 0)
        vis = Visibility(causal_offset=offset)
        out, lse = triton_forward(q, k, v, vis, 0.3, 16, 16)
        d_out = torch.randn(B, H, T, Dv, dtype=dtype)
        grads = triton_backward(q, k, v, out, lse, d_out, vis, 0.3, 16, 16)
        want = oracle(q, k, v, alignment, d_out)
        empty = torch.isneginf(lse)  # (B, H, T): queries that see no key
        report.append({
            "case": name, "dtype": str(dtype), "errors": errors(grads, want),
            "dtypes": [str(g.dtype) for g in grads], "shapes_ok": [g.shape == x.shape for g, x in zip(grads, (q, k, v))],
            "finite": [bool(torch.isfinite(g).all()) for g in grads],
            "empty_rows": int(empty.sum()), "empty_dq_zero": bool((grads[0][empty] == 0).all()),
        })
    # a NaN key hidden by the causal mask from queries 0..14 (the fallback to the torch loop):
    # their dq must be finite and exact; the oracle uses a clean key there, which they never see
    q, k, v = torch.randn(1, 2, 20, 16), torch.randn(1, 2, 20, 16), torch.randn(1, 2, 20, 16)
    clean = k.clone()
    k[..., 15, :] = float("nan")
    vis = Visibility(causal_offset=0)
    out, lse = triton_forward(q, k, v, vis, 0.3, 16, 16)
    d_out = torch.randn(1, 2, 20, 16)
    dq, _, _ = triton_backward(q, k, v, out, lse, d_out, vis, 0.3, 16, 16)
    want_dq = oracle(q, clean, v, "top_left", d_out)[0]
    report.append({"case": "hidden NaN key", "finite_before": bool(torch.isfinite(dq[..., :15, :]).all()),
                   "nan_from": bool(torch.isnan(dq[..., 15:, :]).all()),
                   "error": float((dq.double() - want_dq)[..., :15, :].abs().amax() / want_dq.abs().amax())})
    print(json.dumps(report))
""")

# float32: each gradient entry sums at most 45 products of float32-rounded factors, and the
# recomputed weights carry the rounding of exp(s - lse); measured errors are 1e-7 to 5e-7 of the
# largest gradient, so 1e-5 (about 170 float32 roundings) leaves room for summation order while a
# wrong mask, tile bound or lse convention (errors of 1e-2 and more) cannot pass. float64: the same
# sums in float64. float16: operands of the products are rounded to float16 (eps 4.9e-4; dS and P are
# rounded before dS K and P^T dO), measured 3e-4 to 4e-4.
_BACKWARD_TOL = {"torch.float32": 1e-5, "torch.float64": 1e-12, "torch.float16": 5e-3}


def test_triton_backward_in_interpreter_matches_float64_autograd():
    env = dict(os.environ, TRITON_INTERPRET="1")
    run = subprocess.run([sys.executable, "-c", _BACKWARD_SCRIPT], env=env, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads(run.stdout.strip().splitlines()[-1])
    assert len(report) == 9
    nan_case = report.pop()
    assert nan_case["finite_before"] and nan_case["nan_from"], nan_case
    assert nan_case["error"] < 1e-5, nan_case  # NaN < tol is False: a NaN error fails
    for case in report:
        assert all(case["finite"]), case
        assert case["dtypes"] == [case["dtype"]] * 3 and all(case["shapes_ok"]), case
        assert all(e < _BACKWARD_TOL[case["dtype"]] for e in case["errors"]), case
        assert case["empty_dq_zero"], case
    masked = [c for c in report if c["case"].startswith("causal bottom-right T > S")]
    assert masked[0]["empty_rows"] == 2 * 25, masked  # the case does have rows that see no key


_WIRING_SCRIPT = textwrap.dedent("""
    import json
    import torch
    import selfattn
    from selfattn.efficient import tiled, triton_kernel
    torch.manual_seed(0)
    calls = {"forward": 0, "backward": 0}

    def forward(*args):
        calls["forward"] += 1
        return triton_kernel.triton_forward(*args)

    def backward(*args):
        calls["backward"] += 1
        return triton_kernel.triton_backward(*args)

    # what tiled_attention picks on CUDA, here on the CPU interpreter
    tiled.pick_forward = lambda q, vis: forward
    tiled.pick_backward = lambda q, vis: backward
    q, k, v = torch.randn(1, 2, 45, 12), torch.randn(1, 2, 20, 12), torch.randn(1, 2, 20, 20)
    d_out = torch.randn(1, 2, 45, 20)
    leaves = [x.clone().requires_grad_(True) for x in (q, k, v)]
    out = tiled.tiled_attention(*leaves, causal=True, alignment="bottom_right", scale=0.3, block_q=16, block_k=16)
    got = torch.autograd.grad(out, leaves, d_out)
    leaves64 = [x.double().requires_grad_(True) for x in (q, k, v)]
    want = torch.autograd.grad(selfattn.scaled_dot_product_attention(
        *leaves64, selfattn.causal_mask(45, 20, alignment="bottom_right"), scale=0.3), leaves64, d_out.double())
    print(json.dumps({"calls": calls, "finite": [bool(torch.isfinite(g).all()) for g in got],
                      "errors": [float((g.double() - w).abs().amax() / w.abs().amax()) for g, w in zip(got, want)]}))
""")


def test_tiled_attention_runs_triton_forward_and_backward_when_picked():
    # the autograd Function hands the Triton backward the kernel's natural-log lse (a base-2 lse
    # would give errors of order 1) and uses it only when the forward ran the kernel
    env = dict(os.environ, TRITON_INTERPRET="1")
    run = subprocess.run([sys.executable, "-c", _WIRING_SCRIPT], env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads(run.stdout.strip().splitlines()[-1])
    assert report["calls"] == {"forward": 1, "backward": 1}, report
    assert all(report["finite"]), report
    assert all(e < 1e-5 for e in report["errors"]), report


def test_backward_dispatch_picks_torch_loop_on_cpu_and_triton_on_cuda(monkeypatch):
    from selfattn.efficient import triton_kernel

    q = torch.zeros(1, 1, 4, 4)
    assert tiled.pick_backward(q, Visibility()) is tiled.tiled_backward_torch
    assert tiled.pick_backward(q, Visibility(causal_offset=0)) is tiled.tiled_backward_torch

    class FakeCuda:
        is_cuda = True

        def numel(self):
            return 16

    assert tiled.pick_backward(FakeCuda(), Visibility()) is triton_kernel.triton_backward
    assert tiled.pick_backward(FakeCuda(), Visibility(causal_offset=-3)) is triton_kernel.triton_backward
    # a general mask or a window stays on the torch loop even on CUDA
    mask = torch.ones(4, 4, dtype=torch.bool)
    assert tiled.pick_backward(FakeCuda(), Visibility(mask=mask)) is tiled.tiled_backward_torch
    assert tiled.pick_backward(FakeCuda(), Visibility(causal_offset=0, window=3)) is tiled.tiled_backward_torch
    empty = FakeCuda()
    empty.numel = lambda: 0
    assert tiled.pick_backward(empty, Visibility()) is tiled.tiled_backward_torch
    monkeypatch.setattr(triton_kernel, "triton_available", lambda: False)
    assert tiled.pick_backward(FakeCuda(), Visibility()) is tiled.tiled_backward_torch


def test_cpu_tiled_attention_never_calls_the_triton_backward(monkeypatch):
    from selfattn.efficient import triton_kernel

    def refuse(*args, **kwargs):
        raise AssertionError("the Triton backward was called on the CPU")

    monkeypatch.setattr(triton_kernel, "triton_backward", refuse)
    q, k, v = (torch.randn(1, 2, 9, 4, dtype=torch.float64, requires_grad=True) for _ in range(3))
    tiled.tiled_attention(q, k, v, causal=True, block_q=4, block_k=4).sum().backward()
    assert all(torch.isfinite(x.grad).all() for x in (q, k, v))


def test_triton_backward_refuses_general_mask():
    from selfattn.efficient.triton_kernel import triton_backward

    q = torch.zeros(1, 1, 4, 4)
    with pytest.raises(ValueError, match="causal or no masking"):
        triton_backward(q, q, q, q, q[..., 0], q, Visibility(mask=torch.ones(4, 4, dtype=torch.bool)), 1.0)


# The tiles and head sizes a GPU runs. The cases above use 16 x 16 tiles, T, S <= 45 and d_head <= 24;
# on CUDA, tiled_attention passes its default blocks (DEFAULT_BLOCK_Q/K = 512), which the forward caps
# at 128 and the backward at 64 (num_warps 8 when d_head > 64). Unequal tiles check that the dK/dV
# kernel's first query block (``lo``, rounded down to a multiple of BLOCK_M) and the dQ kernel's last
# key block (``hi``, from BLOCK_M) use the right block size, with both causal alignments and T != S.
_GPU_TILES_SCRIPT = textwrap.dedent("""
    import json
    import numpy as np
    import torch
    import triton.language as tl
    from triton.runtime import interpreter
    import selfattn
    from selfattn.efficient.tiled import DEFAULT_BLOCK_K, DEFAULT_BLOCK_Q, Visibility
    from selfattn.efficient.triton_kernel import triton_backward, triton_forward

    # Triton's interpreter stores bfloat16 as its uint16 bit pattern and its tl.dot multiplies those
    # bits (triton-lang/triton#11584: values near 1e10; "we just don't support it yet"). Widen such
    # operands to the float32 of the same value (exact) before the product, which then sums in float32
    # as a GPU's tensor cores do. The kernels' other bfloat16 operations are loads, stores, casts and
    # transposes, which the interpreter handles.
    _dot = interpreter.InterpreterBuilder.create_dot

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        def value(x):
            if x.dtype.scalar == tl.bfloat16 and x.data.dtype == np.uint16:
                return interpreter.TensorHandle((x.data.astype(np.uint32) << 16).view(np.float32), tl.float32)
            return x
        return _dot(self, value(a), value(b), d, input_precision, max_num_imprecise_acc)

    interpreter.InterpreterBuilder.create_dot = create_dot
    torch.manual_seed(0)

    def oracle(q, k, v, alignment, d_out):
        # float64 autograd through the dense reference, on the same (rounded) inputs
        q, k, v = (x.detach().double().requires_grad_(True) for x in (q, k, v))
        T, S = q.shape[-2], k.shape[-2]
        keep = None if alignment is None else selfattn.causal_mask(T, S, alignment=alignment)
        out = selfattn.scaled_dot_product_attention(q, k, v, keep, scale=0.3)
        return out.detach(), torch.autograd.grad(out, (q, k, v), d_out.double())

    def rel(got, want):  # max |got - want| / max |want|; NaN stays NaN
        return float((got.double() - want).abs().amax() / want.abs().amax())

    D = (DEFAULT_BLOCK_Q, DEFAULT_BLOCK_K)  # what tiled_attention passes: forward 128, backward 64
    f32, bf16 = torch.float32, torch.bfloat16
    # ((block_q, block_k), T, S, Dh, Dv, alignment, dtype); B = H = 1: the interpreter is slow
    cases = [((16, 32), 100, 77, 32, 32, "top_left", f32), ((16, 32), 77, 100, 32, 32, "bottom_right", f32),
             ((32, 16), 77, 100, 32, 32, "bottom_right", f32), ((32, 16), 100, 61, 32, 32, "top_left", f32),
             ((64, 16), 100, 61, 32, 32, "bottom_right", f32), ((64, 16), 61, 100, 32, 32, "top_left", f32),
             ((16, 64), 61, 100, 32, 32, "bottom_right", f32), ((32, 16), 100, 77, 24, 40, None, f32),
             (D, 150, 200, 64, 64, "bottom_right", f32), (D, 100, 90, 64, 64, "bottom_right", f32),
             (D, 70, 100, 128, 128, "top_left", f32), (D, 100, 130, 128, 128, None, f32),
             (D, 90, 100, 64, 64, "bottom_right", bf16), (D, 100, 77, 128, 128, "top_left", bf16),
             ((32, 16), 61, 100, 32, 32, "bottom_right", bf16)]
    report = []
    for (bq, bk), T, S, Dh, Dv, alignment, dtype in cases:
        q, k, v = (torch.randn(1, 1, n, d, dtype=dtype) for n, d in ((T, Dh), (S, Dh), (S, Dv)))
        offset = None if alignment is None else (S - T if alignment == "bottom_right" else 0)
        vis = Visibility(causal_offset=offset)
        out, lse = triton_forward(q, k, v, vis, 0.3, bq, bk)
        d_out = torch.randn(1, 1, T, Dv, dtype=dtype)
        grads = triton_backward(q, k, v, out, lse, d_out, vis, 0.3, bq, bk)
        want_out, want = oracle(q, k, v, alignment, d_out)
        empty = torch.isneginf(lse)  # (1, 1, T): queries that see no key
        report.append({"case": [bq, bk, T, S, Dh, Dv, alignment], "dtype": str(dtype),
                       "errors": [rel(x, w) for x, w in zip((out, *grads), (want_out, *want))],
                       "finite": [bool(torch.isfinite(x).all()) for x in (out, *grads)],
                       "dtypes": [str(x.dtype) for x in (out, *grads)],
                       "empty_rows": int(empty.sum()), "empty_dq_zero": bool((grads[0][empty] == 0).all())})
    print(json.dumps(report))
""")

# float32: as _BACKWARD_TOL; measured 1e-7 to 6e-7 with tiles <= 64 and d_head 32, 5e-7 to 2e-6 at the
# default tiles with d_head 64 and 128 (sums of 64 to 128 products), well under 1e-5. bfloat16 (eps
# 2^-7 = 7.8e-3): the output and the gradients are rounded to bfloat16 (up to eps / 2 of max |grad|
# each), and so are P and dS before P^T dO, dS^T Q and dS K, and O in delta = rowsum(dO * O); measured
# 4e-3 to 1.1e-2 (0.5 to 1.4 eps). 4 eps = 3.1e-2 leaves room for other seeds, while a wrong tile
# bound or mask (a whole key block added or dropped: errors of 1e-1 and more) cannot pass.
_GPU_TILES_TOL = {"torch.float32": 1e-5, "torch.bfloat16": 4 * 2.0**-7}


def test_triton_kernels_in_interpreter_match_float64_at_gpu_tiles_and_unequal_tiles():
    env = dict(os.environ, TRITON_INTERPRET="1")
    run = subprocess.run([sys.executable, "-c", _GPU_TILES_SCRIPT], env=env, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads(run.stdout.strip().splitlines()[-1])
    assert len(report) == 15
    for case in report:
        assert all(case["finite"]), case
        assert case["dtypes"] == [case["dtype"]] * 4, case
        # e < tol is False for NaN: a NaN error fails
        assert all(e < _GPU_TILES_TOL[case["dtype"]] for e in case["errors"]), case
        assert case["empty_dq_zero"], case
    # the bottom-right cases with T > S do have rows that see no key (T - S of them)
    assert [c["empty_rows"] for c in report if c["case"][6] == "bottom_right" and c["case"][2] > c["case"][3]] \
        == [39, 10], report
    assert {c["dtype"] for c in report} == {"torch.float32", "torch.bfloat16"}


_GPU_CHECK_FLOAT32 = textwrap.dedent("""
    import json, sys
    sys.path.insert(0, sys.argv[1])
    import torch
    import gpu_check
    from selfattn.efficient import triton_kernel
    gpu_check.H = 2  # d_head stays 128, the size whose tiles the check is for; T = 160: an uneven last tile
    untimed = lambda fn, repeats: 1e-3
    good = gpu_check.float32_rows(sizes=(160,), repeats=1, device="cpu", timer=untimed)
    real = triton_kernel.triton_backward
    def off(*args, **kwargs):  # a backward 1e-3 off in dK: the check must say INACCURATE
        dq, dk, dv = real(*args, **kwargs)
        return dq, dk * 1.001, dv
    triton_kernel.triton_backward = off
    bad = gpu_check.float32_rows(sizes=(160,), repeats=1, device="cpu", timer=untimed)
    print(json.dumps({"good": good, "bad": bad}))
""")


def test_gpu_checks_float32_table_runs_the_kernels_at_d_head_128_and_flags_an_error():
    """bench/gpu_check.py's float32 table (Triton forward, backward and tiled_attention's wiring against
    float64, relative error, ok below 1e-4), run through the interpreter on the CPU at d_head = 128:
    every row ok with errors at float32's level, and a backward made 1e-3 wrong in dK is INACCURATE."""
    bench = os.path.join(os.path.dirname(__file__), "..", "..", "bench")
    env = dict(os.environ, TRITON_INTERPRET="1")
    run = subprocess.run([sys.executable, "-c", _GPU_CHECK_FLOAT32, bench], capture_output=True, text=True,
                         env=env, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(run.stdout.strip().splitlines()[-1])
    rows = [r.split("|")[1:-1] for r in result["good"] if r.startswith("| 160 |")]
    assert [(r[1].strip(), r[2].strip()) for r in rows] == [
        (c, n) for c in ("no", "yes") for n in ("triton forward", "triton backward",
                                                "tiled_attention (autograd), forward+backward")]
    errors = [float(r[5]) for r in rows]
    assert all(0 < e < 1e-5 for e in errors) and all(r[6].strip() == "ok" for r in rows), rows
    bad = {(r.split("|")[2].strip(), r.split("|")[3].strip()): r.split("|")[7].strip()
           for r in result["bad"] if r.startswith("| 160 |")}
    assert bad[("no", "triton backward")] == bad[("yes", "triton backward")] == "INACCURATE", bad
    assert bad[("no", "triton forward")] == "ok", bad
