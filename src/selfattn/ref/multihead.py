"""NumPy float64 reference for multi-head attention (Vaswani et al. 2017, section 3.2.2).

One head at a time, in a plain loop, so that it reads like the equation
``MultiHead(X_q, X_kv) = Concat(head_1, ..., head_H) W_O`` with
``head_h = Attention(X_q W_Q^h, X_kv W_K^h, X_kv W_V^h)``. It shares no code with the torch path.

Weights use the maths' layout: ``W_Q``, ``W_K``, ``W_V``, ``W_O`` are (D, D) matrices applied as
``X @ W``; head h owns the columns ``h*Dh:(h+1)*Dh`` of ``W_Q``, ``W_K``, ``W_V`` and the same
rows of ``W_O``. Introduced in chapter 06.
"""

from __future__ import annotations

import numpy as np

from .._validate import require_array, require_flag, require_positive_int
from .attention import scaled_dot_product_attention

__all__ = ["multi_head_attention"]


def multi_head_attention(
    X_q,
    X_kv,
    W_Q,
    W_K,
    W_V,
    W_O,
    n_heads: int,
    *,
    b_Q=None,
    b_K=None,
    b_V=None,
    b_O=None,
    mask=None,
    bias=None,
    return_weights: bool = False,
):
    """Multi-head attention from ``X_q`` (B, T, D) to ``X_kv`` (B, S, D), in float64.

    Args:
        X_q: queries' inputs, (B, T, D).
        X_kv: keys' and values' inputs, (B, S, D); pass ``X_q`` again for self-attention.
        W_Q, W_K, W_V, W_O: (D, D) matrices, applied as ``X @ W``.
        n_heads: H (> 0), dividing D.
        b_Q, b_K, b_V, b_O: optional (D,) bias vectors.
        mask: optional boolean keep-mask (True = may attend) broadcastable to (B, H, T, S).
        bias: optional additive float array broadcastable to (B, H, T, S).
        return_weights: also return the weights (B, H, T, S).

    Returns:
        ``out`` (B, T, D), float64; with ``return_weights`` also ``weights`` (B, H, T, S).

    Raises:
        TypeError: non-numeric input or a non-boolean mask.
        ValueError: inputs not 3-D, widths that differ from D, D not divisible by ``n_heads``,
        a mask or bias that does not broadcast.

    Source: chapter 06.
    """
    return_weights = require_flag("return_weights", return_weights)
    X_q, X_kv = require_array("X_q", X_q), require_array("X_kv", X_kv)
    for name, X, layout in (("X_q", X_q, "(B, T, D)"), ("X_kv", X_kv, "(B, S, D)")):
        if X.ndim != 3:
            raise ValueError(f"{name} must have shape {layout} (3 dims); got shape {X.shape}")
    D = X_q.shape[-1]
    H = require_positive_int("n_heads", n_heads)
    if D % H:
        raise ValueError(f"d_model={D} must be divisible by n_heads={H}")
    if X_kv.shape[-1] != D or X_kv.shape[0] != X_q.shape[0]:
        raise ValueError(
            f"X_kv must have shape (B, S, D) with B, D of X_q {X_q.shape}; got {X_kv.shape}"
        )
    weights_in = {"W_Q": W_Q, "W_K": W_K, "W_V": W_V, "W_O": W_O}
    W = {}
    for name, value in weights_in.items():
        W[name] = require_array(name, value)
        if W[name].shape != (D, D):
            raise ValueError(f"{name} must have shape (D, D) = {(D, D)}; got {W[name].shape}")
    b = {}
    for name, value in (("b_Q", b_Q), ("b_K", b_K), ("b_V", b_V), ("b_O", b_O)):
        b[name] = np.zeros(D) if value is None else require_array(name, value)
        if b[name].shape != (D,):
            raise ValueError(f"{name} must have shape (D,) = {(D,)}; got {b[name].shape}")

    d_head = D // H
    heads, all_weights = [], []
    for h in range(H):
        cols = slice(h * d_head, (h + 1) * d_head)
        Q = X_q @ W["W_Q"][:, cols] + b["b_Q"][cols]  # (B, T, D) @ (D, Dh) -> (B, T, Dh)
        K = X_kv @ W["W_K"][:, cols] + b["b_K"][cols]  # (B, S, D) @ (D, Dh) -> (B, S, Dh)
        V = X_kv @ W["W_V"][:, cols] + b["b_V"][cols]  # (B, S, D) @ (D, Dh) -> (B, S, Dh)
        # Pick this head's slice of a mask or bias given for (B, H, T, S).
        mask_h = None if mask is None else _head_slice(np.asarray(mask), h, H)
        bias_h = None if bias is None else _head_slice(require_array("bias", bias), h, H)
        context, weights = scaled_dot_product_attention(
            Q, K, V, mask_h, bias=bias_h, return_weights=True
        )  # context (B, T, Dh), weights (B, T, S); scaled by 1/sqrt(d_head)
        heads.append(context)
        all_weights.append(weights)
    concat = np.concatenate(heads, axis=-1)  # H x (B, T, Dh) -> (B, T, D)
    out = concat @ W["W_O"] + b["b_O"]  # (B, T, D) @ (D, D) -> (B, T, D)
    return (out, np.stack(all_weights, axis=1)) if return_weights else out


def _head_slice(a: np.ndarray, h: int, n_heads: int) -> np.ndarray:
    """Head h's (B, T, S)-broadcastable slice of an array broadcastable to (B, H, T, S)."""
    if a.ndim < 3:
        return a  # (T, S) or (S,): the same for every head
    a4 = a.reshape((1,) * (4 - a.ndim) + a.shape)  # -> 4 dims (B|1, H|1, T|1, S|1)
    if a4.shape[1] not in (1, n_heads):
        raise ValueError(f"mask/bias must broadcast to (B, H={n_heads}, T, S); got shape {a.shape}")
    return a4[:, h if a4.shape[1] == n_heads else 0]  # (B|1, T|1, S|1)
