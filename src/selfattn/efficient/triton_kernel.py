"""The tiled online-softmax forward and backward passes as Triton kernels (FlashAttention-2, Dao 2023).

Forward: one program computes one block of ``BLOCK_M`` query rows of one (batch, head): it streams
the key and value blocks of ``BLOCK_N`` positions through on-chip memory, keeps the running maximum,
sum and accumulator in registers, and writes the output rows and their log-sum-exp once. Causal
masking stops the key loop at the diagonal, so fully masked tiles are never loaded.

Backward (after Algorithm 2): ``delta = rowsum(dO * O)`` first; then one program per key block keeps
its dK and dV in registers while the query blocks that may see it stream through, recomputing the
weights from the saved log-sum-exp. FlashAttention-2's Algorithm 2 also updates dQ_i in HBM inside
that K/V loop (atomic adds in its CUDA code); this package computes dQ in a separate kernel instead,
one program per query block, which recomputes P and dS and sums its dQ in registers: no atomics, and
the result is deterministic.

It runs natively on a CUDA GPU and, for tests, on the CPU through Triton's interpreter
(``TRITON_INTERPRET=1`` set before ``triton`` is imported). :func:`selfattn.efficient.tiled_attention`
picks them for CUDA tensors. Introduced in chapter 10.
"""

from __future__ import annotations

import math

import torch

__all__ = ["triton_available", "triton_forward", "triton_backward"]

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


if triton is not None:

    @triton.jit
    def _attention_backward_delta_kernel(
        Out, DOut, Delta, stride_ob, stride_ot, stride_db, stride_dt, T, Dv,
        BLOCK_M: tl.constexpr, BLOCK_DV: tl.constexpr, ACC: tl.constexpr,
    ):
        # delta_i = rowsum(dO * O)_i = sum_j P_ij dP_ij: the term dS = P * (dP - delta) subtracts,
        # computed once per row here rather than once per key block in the kernels below
        start_m = tl.program_id(0)
        bh = tl.program_id(1)
        rows = start_m * BLOCK_M + tl.arange(0, BLOCK_M)  # (BLOCK_M,)
        dims_v = tl.arange(0, BLOCK_DV)
        inside = (rows[:, None] < T) & (dims_v[None, :] < Dv)
        o = tl.load(Out + bh * stride_ob + rows[:, None] * stride_ot + dims_v[None, :], mask=inside, other=0.0)
        do = tl.load(DOut + bh * stride_db + rows[:, None] * stride_dt + dims_v[None, :], mask=inside, other=0.0)
        delta = tl.sum(o.to(ACC) * do.to(ACC), 1)  # (BLOCK_M, BLOCK_DV) -> (BLOCK_M,)
        tl.store(Delta + bh * T + rows, delta, mask=rows < T)

    @triton.jit
    def _attention_backward_weights(q, k, lse, rows, cols, T, S, scale, causal_offset,
                                    CAUSAL: tl.constexpr, PRECISION: tl.constexpr, ACC: tl.constexpr):
        """The forward's weights of one (query block, key block) tile, P = exp(s - lse), recomputed,
        and where they are visible: ``(p, visible)``, both (BLOCK_M, BLOCK_N); p is 0 where hidden."""
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION, out_dtype=ACC) * scale  # (BLOCK_M, BLOCK_N)
        visible = (rows[:, None] < T) & (cols[None, :] < S)
        if CAUSAL:
            visible = visible & (cols[None, :] <= rows[:, None] + causal_offset)
        # a query that sees no key has lse = -inf: exp(s - inf) = 0, so its weights and gradients
        # are zero, where exp(s - -inf) would be inf and the products below inf * 0 = NaN
        lse_safe = tl.where(lse == float("-inf"), float("inf"), lse)
        # tl.where, not an -inf score: hidden pairs get exactly 0 whatever q . k is (an overflow
        # exp(s - lse) = inf there is discarded, never multiplied)
        p = tl.where(visible, tl.exp(s - lse_safe[:, None]), 0.0)
        return p, visible

    @triton.jit
    def _attention_backward_dkdv_kernel(
        Q, K, V, DOut, Lse, Delta, DK, DV,
        stride_qb, stride_qt, stride_kb, stride_ks, stride_vb, stride_vs, stride_db, stride_dt,
        stride_dkb, stride_dks, stride_dvb, stride_dvs,
        T, S, Dh, Dv, scale, causal_offset,
        CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
        BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, PRECISION: tl.constexpr, ACC: tl.constexpr,
    ):
        # One program owns one block of BLOCK_N keys (Algorithm 2's outer loop): its dK and dV stay
        # in registers while every query block that may see it streams through, and are written once.
        start_n = tl.program_id(0)
        bh = tl.program_id(1)  # one (batch, head) pair
        cols = start_n * BLOCK_N + tl.arange(0, BLOCK_N)  # (BLOCK_N,)
        dims = tl.arange(0, BLOCK_D)
        dims_v = tl.arange(0, BLOCK_DV)
        k = tl.load(K + bh * stride_kb + cols[:, None] * stride_ks + dims[None, :],
                    mask=(cols[:, None] < S) & (dims[None, :] < Dh), other=0.0)  # (BLOCK_N, BLOCK_D)
        v = tl.load(V + bh * stride_vb + cols[:, None] * stride_vs + dims_v[None, :],
                    mask=(cols[:, None] < S) & (dims_v[None, :] < Dv), other=0.0)  # (BLOCK_N, BLOCK_DV)
        dk = tl.zeros((BLOCK_N, BLOCK_D), ACC)
        dv = tl.zeros((BLOCK_N, BLOCK_DV), ACC)
        lo = 0
        if CAUSAL:  # key j is seen by rows i >= j - causal_offset: start at the first such query block
            lo = (tl.maximum(start_n * BLOCK_N - causal_offset, 0) // BLOCK_M) * BLOCK_M
        for start_m in range(lo, T, BLOCK_M):
            rows = start_m + tl.arange(0, BLOCK_M)  # (BLOCK_M,)
            q = tl.load(Q + bh * stride_qb + rows[:, None] * stride_qt + dims[None, :],
                        mask=(rows[:, None] < T) & (dims[None, :] < Dh), other=0.0)  # (BLOCK_M, BLOCK_D)
            do = tl.load(DOut + bh * stride_db + rows[:, None] * stride_dt + dims_v[None, :],
                         mask=(rows[:, None] < T) & (dims_v[None, :] < Dv), other=0.0)  # (BLOCK_M, BLOCK_DV)
            lse = tl.load(Lse + bh * T + rows, mask=rows < T, other=0.0)  # (BLOCK_M,)
            delta = tl.load(Delta + bh * T + rows, mask=rows < T, other=0.0)  # (BLOCK_M,)
            p, visible = _attention_backward_weights(q, k, lse, rows, cols, T, S, scale, causal_offset,
                                                     CAUSAL, PRECISION, ACC)
            # dV += P^T dO: (BLOCK_N, BLOCK_M) @ (BLOCK_M, BLOCK_DV) -> (BLOCK_N, BLOCK_DV)
            dv += tl.dot(tl.trans(p.to(do.dtype)), do, input_precision=PRECISION, out_dtype=ACC)
            dp = tl.dot(do, tl.trans(v), input_precision=PRECISION, out_dtype=ACC)  # (BLOCK_M, BLOCK_N)
            # dS = P * (dP - delta); zeroed where hidden, so that a NaN in a hidden value's dP stays out
            ds = tl.where(visible, p * (dp - delta[:, None]), 0.0)  # (BLOCK_M, BLOCK_N)
            # dK += dS^T Q (times scale below): (BLOCK_N, BLOCK_M) @ (BLOCK_M, BLOCK_D) -> (BLOCK_N, BLOCK_D)
            dk += tl.dot(tl.trans(ds.to(q.dtype)), q, input_precision=PRECISION, out_dtype=ACC)
        inside = cols[:, None] < S
        tl.store(DK + bh * stride_dkb + cols[:, None] * stride_dks + dims[None, :], (dk * scale).to(DK.dtype.element_ty),
                 mask=inside & (dims[None, :] < Dh))
        tl.store(DV + bh * stride_dvb + cols[:, None] * stride_dvs + dims_v[None, :], dv.to(DV.dtype.element_ty),
                 mask=inside & (dims_v[None, :] < Dv))

    @triton.jit
    def _attention_backward_dq_kernel(
        Q, K, V, DOut, Lse, Delta, DQ,
        stride_qb, stride_qt, stride_kb, stride_ks, stride_vb, stride_vs, stride_db, stride_dt,
        stride_dqb, stride_dqt,
        T, S, Dh, Dv, scale, causal_offset,
        CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
        BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, PRECISION: tl.constexpr, ACC: tl.constexpr,
    ):
        # One program owns one block of BLOCK_M queries and streams the key blocks through, as the
        # forward does: dQ is summed in registers and written once, so no two programs add into the
        # same rows (no atomics: deterministic). Algorithm 2 instead adds each tile's dS K into dQ_i in
        # HBM inside the K/V loop (atomic adds in FlashAttention-2's CUDA code); the price here is that
        # the tile's P and dS are recomputed a second time.
        start_m = tl.program_id(0)
        bh = tl.program_id(1)
        rows = start_m * BLOCK_M + tl.arange(0, BLOCK_M)  # (BLOCK_M,)
        dims = tl.arange(0, BLOCK_D)
        dims_v = tl.arange(0, BLOCK_DV)
        q = tl.load(Q + bh * stride_qb + rows[:, None] * stride_qt + dims[None, :],
                    mask=(rows[:, None] < T) & (dims[None, :] < Dh), other=0.0)  # (BLOCK_M, BLOCK_D)
        do = tl.load(DOut + bh * stride_db + rows[:, None] * stride_dt + dims_v[None, :],
                     mask=(rows[:, None] < T) & (dims_v[None, :] < Dv), other=0.0)  # (BLOCK_M, BLOCK_DV)
        lse = tl.load(Lse + bh * T + rows, mask=rows < T, other=0.0)  # (BLOCK_M,)
        delta = tl.load(Delta + bh * T + rows, mask=rows < T, other=0.0)  # (BLOCK_M,)
        dq = tl.zeros((BLOCK_M, BLOCK_D), ACC)
        hi = S
        if CAUSAL:  # key j is visible to row i iff j <= i + causal_offset: stop at the diagonal
            hi = tl.minimum(S, tl.maximum((start_m + 1) * BLOCK_M + causal_offset, 0))
        for start_n in range(0, hi, BLOCK_N):
            cols = start_n + tl.arange(0, BLOCK_N)  # (BLOCK_N,)
            k = tl.load(K + bh * stride_kb + cols[:, None] * stride_ks + dims[None, :],
                        mask=(cols[:, None] < S) & (dims[None, :] < Dh), other=0.0)  # (BLOCK_N, BLOCK_D)
            v = tl.load(V + bh * stride_vb + cols[:, None] * stride_vs + dims_v[None, :],
                        mask=(cols[:, None] < S) & (dims_v[None, :] < Dv), other=0.0)  # (BLOCK_N, BLOCK_DV)
            p, visible = _attention_backward_weights(q, k, lse, rows, cols, T, S, scale, causal_offset,
                                                     CAUSAL, PRECISION, ACC)
            dp = tl.dot(do, tl.trans(v), input_precision=PRECISION, out_dtype=ACC)  # (BLOCK_M, BLOCK_N)
            ds = tl.where(visible, p * (dp - delta[:, None]), 0.0)  # (BLOCK_M, BLOCK_N)
            # dQ += dS K (times scale below): (BLOCK_M, BLOCK_N) @ (BLOCK_N, BLOCK_D) -> (BLOCK_M, BLOCK_D)
            dq += tl.dot(ds.to(k.dtype), k, input_precision=PRECISION, out_dtype=ACC)
        tl.store(DQ + bh * stride_dqb + rows[:, None] * stride_dqt + dims[None, :], (dq * scale).to(DQ.dtype.element_ty),
                 mask=(rows[:, None] < T) & (dims[None, :] < Dh))


# The backward keeps two accumulators of a key block (dK, dV) and five tiles alive where the forward
# keeps one: blocks of 64 (and 8 warps for d_head > 64) keep that within a GPU's registers and shared
# memory at d_head 128 (FlashAttention-2's Triton versions use 32 to 128)
_BACKWARD_MAX_BLOCK = 64


def triton_backward(q, k, v, out, lse, d_out, vis, scale: float, block_q: int = 64, block_k: int = 64):
    """Gradients ``(dq, dk, dv)`` of attention by Triton kernels (FlashAttention-2's backward).

    Dao (2023), FlashAttention-2, Algorithm 2; introduced in chapter 10. Three kernels: the first
    computes ``delta = rowsum(dO * O)`` (T,) per (batch, head); the second runs one program per key
    block, loops over the query blocks that may see it, recomputes the weights ``P = exp(s - lse)``
    from the saved log-sum-exp (the (T, S) weights are never stored) and sums ``dV = P^T dO`` and
    ``dK = scale dS^T Q`` in registers, with ``dS = P * (dO V^T - delta)``. Algorithm 2 also updates
    ``dQ_i`` in HBM inside that K/V loop (atomic adds in FlashAttention-2's CUDA code); here the third
    kernel computes dQ separately: one program per query block recomputes P and dS over the key blocks
    and sums ``dQ = scale dS K`` in registers, so no atomics are needed and the result is
    deterministic. Causal masking skips the tiles above the diagonal in both loops.

    Args:
        q: (..., T, Dh); k: (..., S, Dh); v: (..., S, Dv): the forward's inputs, one floating dtype
            (float16, bfloat16, float32 or float64); Dh and Dv need not be powers of two.
        out: the forward's output (..., T, Dv); d_out: its gradient (..., T, Dv), q's dtype.
        lse: the forward's natural-log log-sum-exp (..., T), as :func:`triton_forward` returns it
            (float32, float64 for float64 inputs); ``-inf`` for a query that sees no key, whose
            gradient is then zero (never NaN).
        vis: a :class:`~selfattn.efficient.tiled.Visibility` with no mask and no window:
            ``vis.causal_offset`` None (no mask), 0 (causal, top-left) or ``S - T`` (bottom-right).
        scale: the forward's score multiplier.
        block_q, block_k: query rows and key columns per tile (need not divide T, S), rounded to a
            power of two >= 16 (``tl.dot`` needs them) and capped at 64.

    Returns:
        ``(dq, dk, dv)`` in the shapes and dtype of ``q``, ``k``, ``v``. Scores, weights, ``dS`` and
        all sums are float32 (float64 for float64 inputs); for half inputs the operands of the
        matrix products are in the input dtype (as in the forward's ``p @ v`` and in FlashAttention-2),
        for float32 IEEE float32 (no TF32). q, k or v holding a NaN or inf go to
        :func:`~selfattn.efficient.tiled.tiled_backward_torch` instead: ``dS @ K`` would compute
        ``0 * NaN = NaN`` for a query that the mask hides the key from.

    Raises:
        RuntimeError: Triton is not installed. ValueError: ``vis`` carries a mask or a window.
    """
    if triton is None:
        raise RuntimeError("triton is not installed: pip install triton (Linux with CUDA)")
    if vis.mask is not None or vis.window is not None:
        raise ValueError("the Triton kernel supports causal or no masking only; use tiled_backward_torch")
    # sums, not isfinite(x).all(): no temporary of the inputs' size; summed in float32 at least, so
    # that a float16 sum does not overflow (65504) on finite inputs. The empty case needs no kernel.
    wide = torch.float64 if q.dtype == torch.float64 else torch.float32
    finite = bool(torch.isfinite(q.sum(dtype=wide)) & torch.isfinite(k.sum(dtype=wide))
                  & torch.isfinite(v.sum(dtype=wide)))
    if not finite or min(q.numel(), k.numel(), v.numel()) == 0:
        from .tiled import tiled_backward_torch

        # the torch loop takes the natural log-sum-exp as (row maximum, log2 l) = (lse, 0)
        return tiled_backward_torch(q, k, v, out, lse, d_out, vis, scale, block_q, block_k)
    *batch, T, Dh = q.shape
    S, Dv = k.shape[-2], v.shape[-1]
    BH = math.prod(batch)
    q3 = q.reshape(BH, T, Dh).contiguous()  # (..., T, Dh) -> (BH, T, Dh)
    k3 = k.reshape(BH, S, Dh).contiguous()  # (..., S, Dh) -> (BH, S, Dh)
    v3 = v.reshape(BH, S, Dv).contiguous()  # (..., S, Dv) -> (BH, S, Dv)
    o3 = out.reshape(BH, T, Dv).contiguous()  # (..., T, Dv) -> (BH, T, Dv)
    do3 = d_out.to(q.dtype).reshape(BH, T, Dv).contiguous()  # (..., T, Dv) -> (BH, T, Dv)
    acc_dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
    lse3 = lse.to(acc_dtype).reshape(BH, T).contiguous()  # (..., T) -> (BH, T)
    delta = torch.empty((BH, T), dtype=acc_dtype, device=q.device)
    dq = torch.empty_like(q3)
    dk = torch.empty_like(k3)
    dv = torch.empty_like(v3)
    block_m = min(_BACKWARD_MAX_BLOCK, max(16, triton.next_power_of_2(block_q)))
    block_n = min(_BACKWARD_MAX_BLOCK, max(16, triton.next_power_of_2(block_k)))
    block_d, block_dv = max(16, triton.next_power_of_2(Dh)), max(16, triton.next_power_of_2(Dv))
    acc = tl.float64 if acc_dtype == torch.float64 else tl.float32
    common = dict(
        CAUSAL=vis.causal_offset is not None, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=block_d, BLOCK_DV=block_dv,
        PRECISION="ieee" if q.dtype in (torch.float32, torch.float64) else "tf32", ACC=acc,
        num_warps=8 if max(block_d, block_dv) > 64 else 4,
    )
    _attention_backward_delta_kernel[(triton.cdiv(T, block_m), BH)](
        o3, do3, delta, o3.stride(0), o3.stride(1), do3.stride(0), do3.stride(1), T, Dv,
        BLOCK_M=block_m, BLOCK_DV=block_dv, ACC=acc,
    )
    strides = (q3.stride(0), q3.stride(1), k3.stride(0), k3.stride(1), v3.stride(0), v3.stride(1),
               do3.stride(0), do3.stride(1))
    sizes = (T, S, Dh, Dv, float(scale), int(vis.causal_offset or 0))
    _attention_backward_dkdv_kernel[(triton.cdiv(S, block_n), BH)](
        q3, k3, v3, do3, lse3, delta, dk, dv, *strides, dk.stride(0), dk.stride(1), dv.stride(0), dv.stride(1),
        *sizes, **common,
    )
    _attention_backward_dq_kernel[(triton.cdiv(T, block_m), BH)](
        q3, k3, v3, do3, lse3, delta, dq, *strides, dq.stride(0), dq.stride(1), *sizes, **common,
    )
    # (BH, T, Dh) -> (..., T, Dh); (BH, S, D) -> (..., S, D)
    return dq.reshape(q.shape), dk.reshape(k.shape), dv.reshape(v.shape)
