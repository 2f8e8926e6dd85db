"""Checks for the exercises of chapter 09 (parallel and quadratic).

9.1 causal linear attention as a recurrent loop; 9.2 a sliding-window keep-mask; 9.3 the FLOPs of one
attention layer, checked against FlopCounterMode; 9.4 the bytes naive attention moves. Each check runs
the learner's function on its own inputs, compares with a NumPy computation written from the
definition, and names the usual mistake.
"""

from __future__ import annotations

import numpy as np
import torch

from . import bool_mask_problem, call_learner, checker, compare_arrays, failed, passed, to_numpy

__all__ = ["check_linear_recurrent", "check_sliding_window_mask", "check_attention_flops", "check_attention_bytes",
           "elu_plus_one"]

_EX1 = "9.1 linear attention as a recurrence"
_EX2 = "9.2 sliding-window mask"


def elu_plus_one(x: np.ndarray) -> np.ndarray:
    """The feature map phi(x) = elu(x) + 1 of Katharopoulos et al. (2020), in NumPy."""
    x = np.asarray(x, dtype=float)
    return np.where(x > 0, x + 1.0, np.exp(np.minimum(x, 0.0)))


def _linear(q, k, v, *, causal=True, phi=elu_plus_one, normalize=True):
    """Linear attention from its definition: explicit (cumulative) sums over keys."""
    pq, pk = phi(q), phi(k)
    outer = pk[:, :, None] * v[:, None, :]  # (S, Dh, Dv): phi(k_j) v_j^T
    state = np.cumsum(outer, axis=0) if causal else np.broadcast_to(outer.sum(0), outer.shape)
    z = np.cumsum(pk, axis=0) if causal else np.broadcast_to(pk.sum(0), pk.shape)
    numerator = np.einsum("td,tdv->tv", pq, state)
    if not normalize:
        return numerator
    return numerator / (np.einsum("td,td->t", pq, z)[:, None] + 1e-6)


@checker(_EX1)
def check_linear_recurrent(fn):
    """``fn(q, k, v)`` with NumPy arrays (T, Dh), (T, Dh), (T, Dv) must return (T, Dv): causal linear
    attention with phi = elu + 1, computed by a loop that carries ``state`` (Dh, Dv) and ``z`` (Dh,)."""
    rng = np.random.default_rng(8)
    q, k, v = rng.normal(size=(7, 4)), rng.normal(size=(7, 4)), rng.normal(size=(7, 3))
    got = call_learner(_EX1, fn, q.copy(), k.copy(), v.copy())
    expected = _linear(q, k, v)
    wrong = compare_arrays(_EX1, got, expected, what="The output", atol=1e-6, rtol=1e-5)
    if wrong is None:
        return passed(_EX1, "Each step adds phi(k_i) v_i^T to the state and phi(k_i) to z: constant memory "
                            "per step, the same numbers as the masked matrix product.")  # fmt: skip
    arr = to_numpy(got)
    if arr is not None and arr.shape == expected.shape and np.isfinite(arr).all():
        hints = [
            (_linear(q, k, v, causal=False), "Row i uses keys after i: update the state and z before reading "
                                             "them at step i, and only with keys 0..i (not the sums over all keys)."),
            (_linear(q, k, v, normalize=False), "You forgot the normalizer: divide phi(q_i) state_i by "
                                                "phi(q_i) . z_i, the linear version of softmax's row sum."),
            (_linear(q, k, v, phi=lambda x: x), "Apply the feature map phi(x) = elu(x) + 1 to q and k first; "
                                                "raw dot products can be negative, so they are not weights."),
        ]
        for candidate, message in hints:
            if np.allclose(arr, candidate, atol=1e-6, rtol=1e-5):
                return failed(_EX1, message)
    return wrong


@checker(_EX2)
def check_sliding_window_mask(fn):
    """``fn(T, window)`` must return a (T, T) boolean keep-mask: True where ``i - window < j <= i``
    (each query sees itself and the ``window - 1`` keys before it)."""
    for T, window in ((6, 3), (5, 1), (4, 9)):
        got = call_learner(_EX2, fn, T, window)
        problem = bool_mask_problem(got)  # the one dtype rule of every mask exercise
        if problem is not None:
            return failed(_EX2, problem)
        arr = to_numpy(got)
        if arr is None or arr.shape != (T, T):
            return failed(_EX2, f"For T={T} return a ({T}, {T}) mask; got "
                                f"{type(got).__name__ if arr is None else arr.shape}.")  # fmt: skip
        mask = arr.astype(bool)
        i, j = np.arange(T)[:, None], np.arange(T)[None, :]
        expected = (j <= i) & (j > i - window)
        if np.array_equal(mask, expected):
            continue
        if np.array_equal(mask, ~expected):
            return failed(_EX2, "The polarity is reversed: True must mean 'may attend'.")
        if np.array_equal(mask, (j <= i) & (j >= i - window)):
            return failed(_EX2, f"Off by one: each query should see exactly window={window} keys (itself "
                                "included), i.e. j > i - window, not j >= i - window.")  # fmt: skip
        if np.array_equal(mask, np.abs(i - j) < window):
            return failed(_EX2, "Your band is two-sided: a causal window also hides the future (j <= i).")
        if (mask & (j > i)).any():
            return failed(_EX2, "Your mask lets a query read keys after it: keep j <= i as well.")
        return failed(_EX2, f"For T={T}, window={window} the mask differs from i - window < j <= i.")
    return passed(_EX2, "(j <= i) & (j > i - window): the same as selfattn.efficient.sliding_window_mask.")


_EX3 = "9.3 the FLOPs of one attention layer"
_EX4 = "9.4 the bytes of naive attention"

# (B, T, D, H): small enough for FlopCounterMode to count in milliseconds, and every typical mistake gives
# a different number on each (T != D, H > 1).
_FLOP_CASES = ((2, 24, 16, 4), (1, 8, 32, 2), (3, 40, 12, 3))


def _counted_flops(B: int, T: int, D: int, H: int) -> int:
    """FLOPs of one causal self-attention layer as torch.utils.flop_counter.FlopCounterMode counts them:
    the four projections and the two attention products (a matmul of (m, k) by (k, n) is 2 m k n)."""
    from torch.utils.flop_counter import FlopCounterMode

    g = torch.Generator().manual_seed(0)
    x = torch.randn(B, T, D, generator=g)
    W_Q, W_K, W_V, W_O = (torch.randn(D, D, generator=g) for _ in range(4))
    Dh = D // H
    with FlopCounterMode(display=False) as counter:
        Q, K, V = ((x @ W).view(B, T, H, Dh).transpose(1, 2) for W in (W_Q, W_K, W_V))  # (B, H, T, Dh)
        scores = Q @ K.transpose(-2, -1) / Dh**0.5  # (B, H, T, T)
        scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
        context = torch.softmax(scores, dim=-1) @ V  # (B, H, T, Dh)
        context.transpose(1, 2).reshape(B, T, D) @ W_O  # (B, T, D)
    return int(counter.get_total_flops())


def _is_number(got) -> bool:
    return not isinstance(got, bool) and isinstance(got, (int, float, np.integer, np.floating))


@checker(_EX3)
def check_attention_flops(fn):
    """``fn(B, T, D, H)`` -> the floating-point operations of one self-attention layer's matrix products
    (projections Q, K, V and W_O, scores, weights @ V), a multiply-add counted as 2, softmax and masking
    not counted, as ``torch.utils.flop_counter.FlopCounterMode`` counts them. An int."""
    for B, T, D, H in _FLOP_CASES:
        got = call_learner(_EX3, fn, B, T, D, H)
        if not _is_number(got):
            return failed(_EX3, f"Return one number of FLOPs; got {type(got).__name__}.")
        if not np.isfinite(float(got)):
            return failed(_EX3, f"Return a finite number of FLOPs; got {got}.")
        expected = _counted_flops(B, T, D, H)
        if got == expected:
            continue
        proj, attn = 2 * B * T * D * D, 2 * B * T * T * D  # one projection; one of the two (T, T) products
        mistakes = (
            ((4 * proj + 2 * attn) // 2, "Half the count: a multiply-add is 2 FLOPs, so a (m, k) @ (k, n) product "
                                         "costs 2 m k n."),
            (3 * proj + 2 * attn, "You left out the output projection W_O: it is a (T, D) @ (D, D) product too, "
                                  "2 B T D^2 FLOPs."),
            (4 * proj + attn, "Only one of the two (T, T) products: scores = Q K^T and context = weights V each "
                              "cost 2 B T^2 D."),
            (4 * proj + 2 * H * attn, "You counted each head's (T, T) products with D instead of d_head = D / H: "
                                      "all heads together cost 2 B T^2 D per product, not H times that."),
            (2 * attn, "You counted only the attention products; the four projections (Q, K, V and W_O) cost "
                       "2 B T D^2 each."),
        )
        for value, message in mistakes:
            if got == value:
                return failed(_EX3, message)
        return failed(_EX3, f"For B={B}, T={T}, D={D}, H={H} FlopCounterMode counts {expected} FLOPs; you "
                            f"returned {got}.")  # fmt: skip
    return passed(_EX3, "8 B T D^2 + 4 B T^2 D, the same as FlopCounterMode: the projections grow with D^2, the "
                        "attention products with T^2, and they cost the same at T = 2 D.")  # fmt: skip


@checker(_EX4)
def check_attention_bytes(fn):
    """``fn(B, T, D, H, element_size)`` -> the bytes that naive attention (not fused, each step reading its
    inputs from memory and writing its result) moves for the core softmax(Q K^T) V: read Q and K, write the
    scores (B, H, T, T); read the scores, write the weights; read the weights and V, write the context.
    An int (chapter 10's Algorithm 0, 4 T^2 + 4 T d numbers per head)."""
    for B, T, D, H, e in ((2, 24, 16, 4, 4), (1, 4096, 4096, 32, 2), (3, 10, 12, 3, 8)):
        got = call_learner(_EX4, fn, B, T, D, H, e)
        if not _is_number(got):
            return failed(_EX4, f"Return one number of bytes; got {type(got).__name__}.")
        if not np.isfinite(float(got)):
            return failed(_EX4, f"Return a finite number of bytes; got {got}.")
        io, square = B * T * D, B * H * T * T  # Q (or K, V, context) and the scores (or weights)
        expected = (4 * io + 4 * square) * e
        if got == expected:
            continue
        mistakes = (
            ((4 * io + 2 * square) * e, "You left out the softmax's own traffic: it reads the whole (T, T) score "
                                        "matrix and writes the weights, 2 B H T^2 numbers more."),
            ((4 * io + 4 * B * T * T) * e, "One (T, T) matrix per sequence: every head has its own scores and "
                                           "weights, B H T^2 numbers each."),
            (4 * io + 4 * square, "That counts numbers, not bytes: multiply by element_size."),
            ((4 * io + 4 * square) * e * 8, "That is bits: multiply by the bytes per number, not by its bits."),
            (4 * square * e, "You left out Q, K, V and the context: each is B T D numbers, read or written once."),
        )
        for value, message in mistakes:
            if got == value:
                return failed(_EX4, message)
        return failed(_EX4, f"For B={B}, T={T}, D={D}, H={H} and {e} bytes per number naive attention moves "
                            f"{expected} bytes; you returned {got}.")  # fmt: skip
    return passed(_EX4, "(4 B T D + 4 B H T^2) x element_size: at T = 4096, D = 4096, 32 heads in bfloat16 that is "
                        "4.4 GB per layer for 0.27 TFLOP of attention products, about 62 FLOPs per byte: the "
                        "T^2 traffic, not the arithmetic, is what FlashAttention removes.")  # fmt: skip
