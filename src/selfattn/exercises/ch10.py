"""Checks for the exercises of chapter 10 (FlashAttention from first principles).

10.1 merge two (output, log-sum-exp) results; 10.2 FlashAttention's tiled forward (output and log-sum-exp, any
block sizes); 10.3 its backward from the saved log-sum-exp (the CS336 task); 10.4 the tiles a causal
forward must visit. Each check compares with ``selfattn.ref`` or torch autograd of plain attention and
names the usual mistake: a sum that is not rescaled, the rescaling upside down, NaN for an empty state,
the log-sum-exp without its maximum, two outputs added unweighted, a forgotten D = rowsum(dO * O), P recomputed
per tile, the 1 / sqrt(Dh) left out of the backward...
"""

from __future__ import annotations

import tracemalloc

import numpy as np

from .. import ref
from . import bool_mask_problem, call_learner, checker, compare_arrays, failed, passed, to_numpy

__all__ = ["check_merge_states", "check_flash_forward", "check_flash_backward", "check_causal_tiles"]

_EX1 = "10.1 merge two (output, log-sum-exp) results"
_EX2 = "10.2 the tiled forward"
_EX3 = "10.3 the backward from the saved log-sum-exp"
_EX4 = "10.4 the tiles a causal pass computes"


def _score_bytes_held(call, T: int = 64, S: int = 4096) -> int | None:
    """Peak NumPy memory of ``fn`` at T queries over S keys, if it reaches half of the (T, S) float64
    score matrix (an answer that builds all the scores at once), else None. Measured with
    ``tracemalloc``, which sees NumPy's allocations; a block-wise answer holds a few (T, block)
    arrays, about 1/64 of that, and a copy of k or v (S x 2) is 1/32 of it."""
    rng = np.random.default_rng(91)
    q, k, v = rng.normal(size=(T, 2)), rng.normal(size=(S, 2)), rng.normal(size=(S, 2))
    already = tracemalloc.is_tracing()  # someone else's tracing is left running
    if already:
        tracemalloc.reset_peak()
    else:
        tracemalloc.start()
    try:
        start = tracemalloc.get_traced_memory()[0]
        call(q, k, v)
        peak = tracemalloc.get_traced_memory()[1] - start
    except Exception:  # noqa: BLE001 - the learner's code already passed at the small size
        return None
    finally:
        if not already:
            tracemalloc.stop()
    return peak if peak >= T * S * 8 // 2 else None


def _merge_out_lse(out_a, lse_a, out_b, lse_b, *, form="right"):
    """Two (output, log-sum-exp) results of the same queries over two sets of keys, merged (or one typical
    mistake). Rows where both sets were empty stay empty: lse -inf, output 0."""
    lse = np.logaddexp(lse_a, lse_b)
    shift = np.where(np.isfinite(lse), lse, 0.0)
    w_a, w_b = np.exp(lse_a - shift), np.exp(lse_b - shift)
    if form == "unnormalised":  # weights relative to the max, never divided by their sum
        m = np.maximum(lse_a, lse_b)
        m = np.where(np.isfinite(m), m, 0.0)
        w_a, w_b = np.exp(lse_a - m), np.exp(lse_b - m)
    if form == "average":
        w_a, w_b = np.full_like(lse_a, 0.5), np.full_like(lse_b, 0.5)
    if form == "sum":  # out_a + out_b, unweighted
        w_a, w_b = np.ones_like(lse_a), np.ones_like(lse_b)
    return w_a[:, None] * out_a + w_b[:, None] * out_b, lse


@checker(_EX1)
def check_merge_states(fn):
    """``fn(out_a, lse_a, out_b, lse_b)`` -> ``(out, lse)``: the attention output (T, Dv) and log-sum-exp (T,) of
    the same queries over the keys of two chunks, from each chunk's own (normalised) output and log-sum-exp, as
    FlashAttention's forward returns them (exercise 10.2). NumPy arrays. A chunk in which a query sees no key
    has lse = -inf and output 0; a row that sees no key in either stays so (lse -inf, output 0), not NaN. This is
    the merge of split-KV decoding (chapter 11) and of ring attention (chapter 12)."""
    rng = np.random.default_rng(9)
    T, Dv = 6, 3
    s_a, s_b = rng.normal(size=(T, 5)) * 3, rng.normal(size=(T, 4)) * 3 + np.array([[-6.0], [6.0], [0], [0], [0], [0]])
    s_a[3] += 800.0  # large scores: exp(lse) overflows in float64
    s_b[3] += 801.0
    s_b[4:] = -np.inf  # rows 4 and 5 see no key of chunk b...
    s_a[5] = -np.inf  # ...and row 5 no key at all
    va, vb = rng.normal(size=(5, Dv)), rng.normal(size=(4, Dv))

    def chunk(s, v):
        m = s.max(-1)
        shift = np.where(np.isfinite(m), m, 0.0)
        e = np.exp(s - shift[:, None])
        total = e.sum(-1)
        with np.errstate(divide="ignore"):
            lse = shift + np.log(total)
        return (e @ v) / np.where(total > 0, total, 1.0)[:, None], lse

    (out_a, lse_a), (out_b, lse_b) = chunk(s_a, va), chunk(s_b, vb)
    got = call_learner(_EX1, fn, out_a.copy(), lse_a.copy(), out_b.copy(), lse_b.copy())
    if not isinstance(got, (tuple, list)) or len(got) != 2:
        return failed(_EX1, f"Return a pair (out, lse); got {type(got).__name__}.")
    out_e, lse_e = _merge_out_lse(out_a, lse_a, out_b, lse_b)
    out, lse = to_numpy(got[0]), to_numpy(got[1])
    if out is None or lse is None:
        return failed(_EX1, "Return out and lse as arrays or tensors.")
    if out.shape != out_e.shape or lse.shape != lse_e.shape:
        return failed(_EX1, f"out should have shape {out_e.shape} and lse {lse_e.shape}; got {out.shape} and {lse.shape}.")
    finite = np.isfinite(lse_e)
    bad_lse = np.isnan(lse) | (np.isinf(lse) & finite) | (np.isfinite(lse) & ~finite)
    bad_out = ~np.isfinite(out).all(-1)
    if bad_out[3] or bad_lse[3]:
        return failed(_EX1, "Row 3 has scores near 800, so exp(lse) overflows to inf and your merge gave NaN or inf "
                            "there: never take exp of an lse itself. Use weights relative to the merged lse, "
                            "exp(lse_a - lse), with lse = max + log(exp(lse_a - max) + exp(lse_b - max)) "
                            "(np.logaddexp).")  # fmt: skip
    if bad_out[5] or bad_lse[5]:
        return failed(_EX1, "Row 5 sees no key in either chunk (both lse are -inf) and your merge gave NaN there: "
                            "exp(-inf - (-inf)) is NaN. Keep such a row empty, lse -inf and output 0, e.g. by "
                            "shifting by 0 where the merged lse is -inf.")  # fmt: skip
    both = np.isfinite(lse_a) & np.isfinite(lse_b)  # rows where both chunks saw keys
    if _close(lse[both], np.maximum(lse_a, lse_b)[both]) and not _close(lse[both], lse_e[both]):
        return failed(_EX1, "Your lse is the larger of the two: the merged lse is log(exp(lse_a) + exp(lse_b)), "
                            "np.logaddexp(lse_a, lse_b), a little above the max.")
    if _close(lse[both], (lse_a + lse_b)[both]):
        return failed(_EX1, "You added the two lse: they are logs of sums, so add the sums, lse = "
                            "log(exp(lse_a) + exp(lse_b)) = np.logaddexp(lse_a, lse_b).")
    if bad_out.any() or bad_lse.any():
        rows = np.flatnonzero(bad_out | bad_lse).tolist()
        return failed(_EX1, f"NaN or inf on row(s) {rows}: a chunk with lse = -inf has weight exp(-inf - lse) = 0, "
                            "never exp(lse - (-inf)).")
    ok_rows = np.isfinite(lse_e)
    for form, message in (
        ("sum", "You added the two outputs, out_a + out_b: each is already normalised over its own chunk, so the sum "
                "counts each chunk as a whole softmax. Weight them by their share of the total, "
                "exp(lse_a - lse) out_a + exp(lse_b - lse) out_b, with lse the merged log-sum-exp."),
        ("average", "You averaged the two outputs: each chunk counts by its share of the total, exp(lse_chunk - lse), "
                    "which sums to 1 over the chunks."),
        ("unnormalised", "Your weights exp(lse_chunk - max) do not sum to 1: divide by their sum, i.e. use "
                         "exp(lse_chunk - lse) with the merged lse."),
    ):
        if _close(out[ok_rows], _merge_out_lse(out_a, lse_a, out_b, lse_b, form=form)[0][ok_rows]):
            return failed(_EX1, message)
    if not (np.array_equal(np.isneginf(lse), ~finite) and _close(lse[finite], lse_e[finite], atol=1e-9, rtol=1e-12)):
        return failed(_EX1, "The merged lse is wrong: lse = np.logaddexp(lse_a, lse_b), -inf where both are -inf.")
    wrong = compare_arrays(_EX1, out, out_e, what="The merged output", atol=1e-10, rtol=1e-10)
    if wrong is not None:
        return wrong
    return passed(_EX1, "lse = logaddexp(lse_a, lse_b), out = exp(lse_a - lse) out_a + exp(lse_b - lse) out_b: the "
                        "online softmax's merge in the form FlashAttention returns, exact in any order, with empty "
                        "chunks and rows handled.")  # fmt: skip


# Float32 rounding (a right answer computed in float32 is off by ~1e-7 here) passes, as in chapter 06;
# every typical mistake is off by far more than this.
_ATOL, _RTOL = 1e-5, 1e-5


def _flash_np(q, k, v, bq, bk, *, rescale_l=True, rescale_acc=True, scale=True, lse_form="m+log(l)",
              drop_last_q=False):
    """The tiled forward (output, log-sum-exp) in NumPy, right or with one typical mistake."""
    T, Dh = q.shape
    c = 1 / np.sqrt(Dh) if scale else 1.0
    out, lse = np.zeros((T, v.shape[1])), np.zeros(T)
    for r in range(0, (T // bq) * bq if drop_last_q else T, bq):
        qi = q[r:r + bq]
        m, l, acc = np.full(len(qi), -np.inf), np.zeros(len(qi)), np.zeros((len(qi), v.shape[1]))
        for s0 in range(0, k.shape[0], bk):
            s = qi @ k[s0:s0 + bk].T * c
            m_new = np.maximum(m, s.max(-1))
            p = np.exp(s - m_new[:, None])
            corr = np.exp(m - m_new)
            l = (l * corr if rescale_l else l) + p.sum(-1)
            acc = (acc * corr[:, None] if rescale_acc else acc) + p @ v[s0:s0 + bk]
            m = m_new
        out[r:r + bq] = acc / l[:, None]
        lse[r:r + bq] = {"m+log(l)": m + np.log(l), "log(l)": np.log(l), "m": m, "m+l": m + l}[lse_form]
    return out, lse


def _forward_inputs():
    rng = np.random.default_rng(90)
    q, k, v = rng.normal(size=(7, 4)) * 2, rng.normal(size=(11, 4)) * 2, rng.normal(size=(11, 3))
    k[8] *= 6  # the maximum of most rows arrives late, so a missing rescale shows
    return q, k, v


# (block_q, block_k): uneven tiles (7 queries in 3, 3, 1; 11 keys in 4, 4, 3), tiles of one, tiles larger than T
_BLOCKS = ((3, 4), (1, 1), (16, 16), (2, 5))


def _pair(ex, got, names):
    if not isinstance(got, (tuple, list)) or len(got) != len(names):
        return None, failed(ex, f"Return the {len(names)}-tuple ({', '.join(names)}); got "
                                f"{type(got).__name__}{'' if not isinstance(got, (tuple, list)) else f' of {len(got)}'}.")
    arrs = [to_numpy(x) for x in got]
    for a, x, name in zip(arrs, got, names, strict=True):
        if a is None:
            return None, failed(ex, f"{name} should be an array or tensor; got {type(x).__name__}.")
    return arrs, None


def _close(a, b, atol=_ATOL, rtol=_RTOL):
    return a.shape == b.shape and np.allclose(a, b, atol=atol, rtol=rtol)


@checker(_EX2)
def check_flash_forward(fn):
    """``fn(q (T, Dh), k (S, Dh), v (S, Dv), block_q, block_k)`` with NumPy arrays must return
    ``(out (T, Dv), lse (T,))``: attention softmax(q k^T / sqrt(Dh)) v and each row's log-sum-exp
    ``log sum_j exp(s_ij)`` of the scaled scores, computed tile by tile (``block_q`` queries against
    ``block_k`` keys at a time) with the online softmax, for any block sizes (the last tiles may be
    partial). Dao 2023 (FlashAttention-2), Algorithm 1."""
    q, k, v = _forward_inputs()
    T = q.shape[0]
    s = q @ k.T / np.sqrt(q.shape[1])
    out_e = ref.scaled_dot_product_attention(q, k, v)
    lse_e = s.max(-1) + np.log(np.exp(s - s.max(-1, keepdims=True)).sum(-1))
    for bq, bk in _BLOCKS:
        arrs, bad = _pair(_EX2, call_learner(_EX2, fn, q.copy(), k.copy(), v.copy(), bq, bk), ("out", "lse"))
        if bad is not None:
            return bad
        out, lse = arrs
        where = f"With block_q={bq}, block_k={bk} (7 queries, 11 keys)"
        if out.shape[0] < T and out.shape[1:] == out_e.shape[1:]:
            return failed(_EX2, f"{where} your output has {out.shape[0]} rows, not {T}: the last query tile is "
                                "partial; loop with range(0, T, block_q) and slice q[r:r + block_q].")
        if lse.shape != lse_e.shape:
            return failed(_EX2, f"{where} lse should have shape {lse_e.shape} (one number per query); got {lse.shape}.")
        if out.shape != out_e.shape:
            return failed(_EX2, f"{where} out should have shape {out_e.shape}; got {out.shape}.")
        if not (np.isfinite(out).all() and np.isfinite(lse).all()):
            return failed(_EX2, f"{where} your out or lse holds NaN or inf. The rescaling factor is exp(m_old - m_new), "
                                "at most 1 (for the first tile m_old = -inf gives exactly 0), never exp(m_new - m_old); "
                                "and start each query tile with m = -inf, l = 0, acc = 0.")  # fmt: skip
        ok_out, ok_lse = _close(out, out_e), _close(lse, lse_e)
        if ok_out and ok_lse:
            continue
        mistakes = (
            (dict(rescale_l=False, rescale_acc=False), "You did not rescale: when a tile raises the running maximum, "
             "multiply both the running sum l and the accumulator by exp(m_old - m_new) before adding the tile."),
            (dict(rescale_acc=False), "You rescaled the running sum but not the accumulator: the accumulator was "
             "summed relative to the old maximum too, so multiply it by exp(m_old - m_new) as well."),
            (dict(rescale_l=False), "You rescaled the accumulator but not the running sum l: both were taken "
             "relative to the old maximum; multiply l by exp(m_old - m_new) too."),
            (dict(scale=False), "You forgot the 1 / sqrt(Dh) on the scores (out and lse both use the scaled scores)."),
            (dict(drop_last_q=True), "The rows of the last, partial query tile are missing: loop with "
             "range(0, T, block_q)."),
        )
        for kwargs, message in mistakes:
            c_out, c_lse = _flash_np(q, k, v, bq, bk, **kwargs)
            if _close(out, c_out) and (_close(lse, c_lse) or not ok_lse):
                return failed(_EX2, message)
        if not ok_out:
            worst = float(np.max(np.abs(out - out_e)))
            return failed(_EX2, f"{where} the output is wrong (largest error {worst:.3g}): divide the accumulator by "
                                "the running sum once, after the last key tile.")  # fmt: skip
        for form, message in (
            ("log(l)", "Your lse is log(l) without the maximum: l was summed relative to m, so lse = m + log(l)."),
            ("m", "Your lse is the running maximum alone: add log(l), lse = m + log(l)."),
            ("m+l", "Your lse is m + l: take the logarithm of the sum, lse = m + log(l)."),
        ):
            if _close(lse, _flash_np(q, k, v, bq, bk, lse_form=form)[1]):
                return failed(_EX2, message)
        return failed(_EX2, f"{where} the output is right but lse is not (largest error "
                            f"{float(np.max(np.abs(lse - lse_e))):.3g}): lse_i = log sum_j exp(s_ij) = m_i + log(l_i).")
    held = _score_bytes_held(lambda q, k, v: fn(q, k, v, 64, 64))
    if held is not None:
        return failed(_EX2, f"Right values, but not tiled: at T=64 queries and S=4096 keys with 64-key tiles your function "
                            f"held {held / 2**20:.1f} MiB at once, as much as the whole (T, S) score matrix "
                            f"({64 * 4096 * 8 / 2**20:.1f} MiB in float64). Read the keys block_k at a time and keep "
                            "only a running maximum, a running sum and an accumulator per query.")
    return passed(_EX2, "Exact attention and its log-sum-exp, one (block_q, block_k) tile at a time, for any tile "
                        "sizes: FlashAttention's forward. The lse, T numbers, is all the backward needs to rebuild "
                        "the weights.")  # fmt: skip


def _flash_bwd_np(q, k, v, o, lse, do, bq, bk, *, use_D=True, D_per_tile=False, scale_grads=True, p_from="lse",
                  scale_scores=True):
    """The tiled backward (dq, dk, dv) in NumPy, right or with one typical mistake."""
    c = 1 / np.sqrt(q.shape[1])
    dq, dk, dv = np.zeros_like(q), np.zeros_like(k), np.zeros_like(v)
    D = (do * o).sum(-1)
    g = c if scale_grads else 1.0
    for r in range(0, q.shape[0], bq):
        for s0 in range(0, k.shape[0], bk):
            s = q[r:r + bq] @ k[s0:s0 + bk].T * (c if scale_scores else 1.0)
            if p_from == "lse":
                with np.errstate(over="ignore", invalid="ignore"):
                    p = np.exp(s - lse[r:r + bq, None])
            else:  # the tile's own softmax
                e = np.exp(s - s.max(-1, keepdims=True))
                p = e / e.sum(-1, keepdims=True)
            dv[s0:s0 + bk] += p.T @ do[r:r + bq]
            dp = do[r:r + bq] @ v[s0:s0 + bk].T
            if D_per_tile:
                d = (p * dp).sum(-1)
            else:
                d = D[r:r + bq] if use_D else 0.0
            ds = p * (dp - (d[:, None] if np.ndim(d) else d))
            dq[r:r + bq] += ds @ k[s0:s0 + bk] * g
            dk[s0:s0 + bk] += ds.T @ q[r:r + bq] * g
    return dq, dk, dv


def _autograd_reference(q, k, v, do):
    import torch

    qt, kt, vt = (torch.from_numpy(x.copy()).requires_grad_() for x in (q, k, v))
    out = torch.softmax(qt @ kt.T / q.shape[1] ** 0.5, dim=-1) @ vt  # plain attention, float64
    out.backward(torch.from_numpy(do.copy()))
    return out.detach().numpy(), qt.grad.numpy(), kt.grad.numpy(), vt.grad.numpy()


@checker(_EX3)
def check_flash_backward(fn):
    """``fn(q (T, Dh), k (S, Dh), v (S, Dv), out (T, Dv), lse (T,), d_out (T, Dv), block_q, block_k)`` with
    NumPy arrays must return ``(dq, dk, dv)``, the gradients of sum(out * d_out), computed tile by tile
    from the saved log-sum-exp: P = exp(S - lse) per tile, D = rowsum(d_out * out), dS = P (dP - D).
    Checked against torch autograd of plain attention in float64. Dao 2023, Algorithm 2."""
    q, k, v = _forward_inputs()
    do = np.random.default_rng(93).normal(size=(q.shape[0], v.shape[1]))
    out, dq_e, dk_e, dv_e = _autograd_reference(q, k, v, do)
    s = q @ k.T / np.sqrt(q.shape[1])
    lse = s.max(-1) + np.log(np.exp(s - s.max(-1, keepdims=True)).sum(-1))
    names = ("dq", "dk", "dv")
    for bq, bk in _BLOCKS:
        result = call_learner(_EX3, fn, q.copy(), k.copy(), v.copy(), out.copy(), lse.copy(), do.copy(), bq, bk)
        arrs, bad = _pair(_EX3, result, names)
        if bad is not None:
            return bad
        where = f"With block_q={bq}, block_k={bk}"
        for a, e, name in zip(arrs, (dq_e, dk_e, dv_e), names, strict=True):
            if a.shape != e.shape:
                return failed(_EX3, f"{where} {name} should have shape {e.shape}, the shape of {name[1:]}; got {a.shape}.")
            if not np.isfinite(a).all():
                return failed(_EX3, f"{where} {name} holds NaN or inf: rebuild each tile's weights as exp(S - lse), "
                                    "which is at most 1, with S the scaled scores of that tile.")  # fmt: skip
        if all(_close(a, e) for a, e in zip(arrs, (dq_e, dk_e, dv_e), strict=True)):
            continue
        mistakes = (
            (dict(use_D=False), "You left out D: dS = P * (dP - D) with D = rowsum(d_out * out), one number per query "
             "(the softmax's Jacobian subtracts the weighted mean of dP)."),
            (dict(D_per_tile=True), "You took D as rowsum(P * dP) over one tile: that sum must run over all keys. "
             "Compute D = rowsum(d_out * out) once per query, before the tiles (it equals the full sum)."),
            (dict(scale_scores=False, scale_grads=False), "You left out the 1 / sqrt(Dh) everywhere: the saved lse is "
             "the log-sum-exp of the scaled scores, so rebuild P = exp(q k^T / sqrt(Dh) - lse) per tile, and scale "
             "dS by it too: dq += dS k / sqrt(Dh), dk += dS^T q / sqrt(Dh)."),
            (dict(scale_scores=False), "You rebuilt P from unscaled scores: the saved lse is the log-sum-exp of the "
             "scaled scores, so P = exp(q k^T / sqrt(Dh) - lse) per tile (your dq and dk do carry the 1 / sqrt(Dh))."),
            (dict(scale_grads=False), "dq and dk miss the 1 / sqrt(Dh): S = q k^T / sqrt(Dh), so dq = dS k / sqrt(Dh) "
             "and dk = dS^T q / sqrt(Dh)."),
            (dict(p_from="tile"), "You rebuilt P with each tile's own softmax: the weights are normalised over all keys, "
             "so use the saved log-sum-exp, P = exp(S - lse) (no max, no sum needed)."),
        )
        for kwargs, message in mistakes:
            cand = _flash_bwd_np(q, k, v, out, lse, do, bq, bk, **kwargs)
            if all(np.isfinite(c).all() and _close(a, c) for a, c in zip(arrs, cand, strict=True)):
                return failed(_EX3, message)
        wrong = [n for a, e, n in zip(arrs, (dq_e, dk_e, dv_e), names, strict=True) if not _close(a, e)]
        return failed(_EX3, f"{where} {', '.join(wrong)} differ from autograd of plain attention (largest error "
                            f"{max(float(np.max(np.abs(a - e))) for a, e in zip(arrs, (dq_e, dk_e, dv_e), strict=True)):.3g}). "
                            "Per tile: dv += P^T d_out, dP = d_out v^T, dS = P (dP - D), dq += dS k / sqrt(Dh), "
                            "dk += dS^T q / sqrt(Dh).")  # fmt: skip

    def big(q, k, v):  # stand-ins for out, lse and d_out: the values do not matter, only what is held
        T, Dv = q.shape[0], v.shape[1]
        return fn(q, k, v, np.zeros((T, Dv)), np.zeros(T), np.ones((T, Dv)), 64, 64)

    held = _score_bytes_held(big)
    if held is not None:
        return failed(_EX3, f"Right gradients, but not tiled: at T=64 and S=4096 your backward held {held / 2**20:.1f} MiB "
                            "at once, as much as the whole (T, S) matrix of weights. Rebuild P one tile at a time "
                            "from lse.")  # fmt: skip
    return passed(_EX3, "dq, dk, dv equal autograd's, with no (T, S) matrix kept: P is rebuilt per tile from the "
                        "log-sum-exp, and D = rowsum(d_out * out) replaces the softmax's Jacobian.")  # fmt: skip


@checker(_EX4)
def check_causal_tiles(fn):
    """``fn(T, block_q, block_k)`` -> a boolean (ceil(T / block_q), ceil(T / block_k)) array: True for the
    tiles that a causal FlashAttention pass over T queries and T keys must compute, those holding at least
    one pair (i, j) with j <= i. A tile of only future keys is skipped."""
    for T, bq, bk in ((10, 4, 3), (8, 2, 4), (9, 3, 3), (7, 7, 2)):
        got = call_learner(_EX4, fn, T, bq, bk)
        arr = to_numpy(got)
        nq, nk = -(-T // bq), -(-T // bk)
        if arr is None or arr.ndim != 2:
            return failed(_EX4, f"Return a 2-D boolean array of shape ({nq}, {nk}) for T={T}, block_q={bq}, "
                                f"block_k={bk}; got {type(got).__name__ if arr is None else arr.shape}.")
        if bool_mask_problem(got) is not None:  # numbers, not booleans: say it in this exercise's terms
            return failed(_EX4, f"Return a boolean array, True for a tile the pass computes; you returned "
                                f"{np.asarray(got).dtype} numbers. If 1 means computed, convert with .astype(bool).")
        if arr.shape == (T // bq, T // bk) and arr.shape != (nq, nk):
            return failed(_EX4, f"With T={T}, block_q={bq}, block_k={bk} there are ceil(T / block) tiles, ({nq}, {nk}): "
                                "the last tile of a row or column may be partial; use -(-T // block).")
        if arr.shape != (nq, nk):
            return failed(_EX4, f"For T={T}, block_q={bq}, block_k={bk} return shape ({nq}, {nk}); got {arr.shape}.")
        a, b = np.arange(nq)[:, None], np.arange(nk)[None, :]
        last_q = np.minimum((a + 1) * bq, T) - 1
        expected = b * bk <= last_q
        keep = arr.astype(bool)
        if np.array_equal(keep, expected):
            continue
        if np.array_equal(keep, ~expected):
            return failed(_EX4, "Reversed: True must mark the tiles to compute, those with a key at or before a query.")
        if np.array_equal(keep, a >= b) and bq != bk:
            return failed(_EX4, f"You compared tile numbers (a >= b), right only when block_q = block_k; here {bq} and "
                                f"{bk}: compare positions, the first key of the tile (b * block_k) with the last query "
                                "(min((a + 1) * block_q, T) - 1).")  # fmt: skip
        if np.array_equal(keep, np.minimum((b + 1) * bk, T) - 1 <= a * bq):
            return failed(_EX4, "You kept only the tiles with no masked pair; the tiles on the diagonal are partly "
                                "visible and must be computed too (with the mask inside the tile).")
        if np.array_equal(keep, b * bk < last_q):
            return failed(_EX4, "Off by one: a key at the same position as the query is visible (j <= i), so a tile "
                                "whose first key equals the last query is computed.")
        return failed(_EX4, f"For T={T}, block_q={bq}, block_k={bk} the tiles to compute are\n{expected.astype(int)}; "
                            f"you marked\n{keep.astype(int)}.")  # fmt: skip
    return passed(_EX4, "A tile is computed when its first key is not after its last query: about half of the "
                        "tiles are skipped, which is where causal FlashAttention's factor 2 comes from.")  # fmt: skip
