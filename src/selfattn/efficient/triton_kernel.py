"""The tiled online-softmax forward pass as a Triton kernel (FlashAttention-2 forward, Dao 2023).

One program computes one block of ``BLOCK_M`` query rows of one (batch, head): it streams the key
and value blocks of ``BLOCK_N`` positions through on-chip memory, keeps the running maximum, sum
and accumulator in registers, and writes the output rows and their log-sum-exp once. Causal
masking stops the key loop at the diagonal, so fully masked tiles are never loaded.

It runs natively on a CUDA GPU and, for tests, on the CPU through Triton's interpreter
(``TRITON_INTERPRET=1`` set before ``triton`` is imported). :func:`selfattn.efficient.tiled_attention`
picks it for CUDA tensors. Introduced in chapter 10.
"""

from __future__ import annotations

import math

import torch

__all__ = ["triton_available", "triton_forward"]

try:  # Triton is optional: the package works without it (CPU-only installs, macOS)
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - depends on the environment
    triton = None
    tl = None


def triton_available() -> bool:
    """True if ``triton`` is importable."""
    return triton is not None


if triton is not None:

    @triton.jit
    def _attention_forward_kernel(
        Q, K, V, Out, Lse,
        stride_qb, stride_qt, stride_kb, stride_ks, stride_vb, stride_vs, stride_ob, stride_ot,
        T, S, Dh, Dv, scale, causal_offset,
        CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
        BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, PRECISION: tl.constexpr, ACC: tl.constexpr,
    ):
        start_m = tl.program_id(0)
        bh = tl.program_id(1)  # one (batch, head) pair
        rows = start_m * BLOCK_M + tl.arange(0, BLOCK_M)  # (BLOCK_M,)
        dims = tl.arange(0, BLOCK_D)
        dims_v = tl.arange(0, BLOCK_DV)
        q = tl.load(Q + bh * stride_qb + rows[:, None] * stride_qt + dims[None, :],
                    mask=(rows[:, None] < T) & (dims[None, :] < Dh), other=0.0)  # (BLOCK_M, BLOCK_D)
        # running max, sum and accumulator in ACC: float64 for float64 inputs, else float32
        m_i = tl.full((BLOCK_M,), float("-inf"), ACC)
        l_i = tl.zeros((BLOCK_M,), ACC)
        acc = tl.zeros((BLOCK_M, BLOCK_DV), ACC)
        hi = S
        if CAUSAL:  # key j is visible to row i iff j <= i + causal_offset: stop at the diagonal
            hi = tl.minimum(S, tl.maximum((start_m + 1) * BLOCK_M + causal_offset, 0))
        for start_n in range(0, hi, BLOCK_N):
            cols = start_n + tl.arange(0, BLOCK_N)  # (BLOCK_N,)
            k = tl.load(K + bh * stride_kb + cols[:, None] * stride_ks + dims[None, :],
                        mask=(cols[:, None] < S) & (dims[None, :] < Dh), other=0.0)  # (BLOCK_N, BLOCK_D)
            v = tl.load(V + bh * stride_vb + cols[:, None] * stride_vs + dims_v[None, :],
                        mask=(cols[:, None] < S) & (dims_v[None, :] < Dv), other=0.0)  # (BLOCK_N, BLOCK_DV)
            s = tl.dot(q, tl.trans(k), input_precision=PRECISION, out_dtype=ACC) * scale  # (BLOCK_M, BLOCK_N)
            visible = cols[None, :] < S
            if CAUSAL:
                visible = visible & (cols[None, :] <= rows[:, None] + causal_offset)
            s = tl.where(visible, s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            shift = tl.where(m_new == float("-inf"), 0.0, m_new)  # no -inf - -inf for empty rows
            p = tl.exp(s - shift[:, None])
            correction = tl.exp(m_i - shift)
            l_i = l_i * correction + tl.sum(p, 1)
            acc = acc * correction[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION, out_dtype=ACC)
            m_i = m_new
        seen = l_i != 0  # NaN (a visible NaN key) must stay NaN, as in the torch path
        safe_l = tl.where(seen, l_i, 1.0)
        out = tl.where(seen[:, None], acc / safe_l[:, None], 0.0)
        lse = tl.where(seen, m_i + tl.log(safe_l), float("-inf"))
        tl.store(Out + bh * stride_ob + rows[:, None] * stride_ot + dims_v[None, :], out.to(Out.dtype.element_ty),
                 mask=(rows[:, None] < T) & (dims_v[None, :] < Dv))
        tl.store(Lse + bh * T + rows, lse, mask=rows < T)


def triton_forward(q, k, v, vis, scale: float, block_q: int = 64, block_k: int = 64):
    """Run the Triton forward kernel; same contract as ``tiled_forward_torch``: ``(out, lse)``.

    Supports no mask or a causal mask (``vis.causal_offset``), not a general mask or a window.
    Block sizes are rounded to powers of two >= 16 (``tl.dot`` needs them) and capped at 128.
    float32 inputs use IEEE float32 products (no TF32), so results match the torch path; float64
    inputs are computed in float64. ``lse`` is float32, or float64 for float64 inputs (as the torch
    path's).
    Values holding a NaN or inf go to :func:`~selfattn.efficient.tiled.tiled_forward_torch`
    instead: in the kernel's ``p @ v``, 0 * NaN = NaN would reach queries the causal mask hides
    the value from, while the torch loop lets it reach only the queries that may see it.

    Raises:
        RuntimeError: Triton is not installed. ValueError: ``vis`` carries a mask or a window.
    """
    if triton is None:
        raise RuntimeError("triton is not installed: pip install triton (Linux with CUDA)")
    if vis.mask is not None or vis.window is not None:
        raise ValueError("the Triton kernel supports causal or no masking only; use tiled_forward_torch")
    if not bool(torch.isfinite(v.sum())):  # a sum, not isfinite(v).all(): no (..., S, Dv) temporary
        from .tiled import tiled_forward_torch

        return tiled_forward_torch(q, k, v, vis, scale, block_q, block_k)
    *batch, T, Dh = q.shape
    S, Dv = k.shape[-2], v.shape[-1]
    BH = math.prod(batch)
    q3 = q.reshape(BH, T, Dh).contiguous()  # (..., T, Dh) -> (BH, T, Dh)
    k3 = k.reshape(BH, S, Dh).contiguous()
    v3 = v.reshape(BH, S, Dv).contiguous()
    out = torch.empty((BH, T, Dv), dtype=q.dtype, device=q.device)
    acc_dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
    lse = torch.empty((BH, T), dtype=acc_dtype, device=q.device)
    block_m = min(128, max(16, triton.next_power_of_2(block_q)))
    block_n = min(128, max(16, triton.next_power_of_2(block_k)))
    grid = (triton.cdiv(T, block_m), BH)
    _attention_forward_kernel[grid](
        q3, k3, v3, out, lse,
        q3.stride(0), q3.stride(1), k3.stride(0), k3.stride(1), v3.stride(0), v3.stride(1),
        out.stride(0), out.stride(1),
        T, S, Dh, Dv, float(scale), int(vis.causal_offset or 0),
        CAUSAL=vis.causal_offset is not None, BLOCK_M=block_m, BLOCK_N=block_n,
        BLOCK_D=max(16, triton.next_power_of_2(Dh)), BLOCK_DV=max(16, triton.next_power_of_2(Dv)),
        PRECISION="ieee" if q.dtype in (torch.float32, torch.float64) else "tf32",
        ACC=tl.float64 if acc_dtype == torch.float64 else tl.float32,
    )
    return out.reshape(*batch, T, Dv), lse.reshape(*batch, T)
