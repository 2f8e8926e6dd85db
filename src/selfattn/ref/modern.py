"""NumPy float64 reference for the modern block: RMSNorm, SiLU, SwiGLU and the pre-norm block
built from them, with optional QK-norm. Plain code, one function per equation; shares no code with
the torch path (``selfattn.modern``). Introduced in chapter 07.

A block's parameters are a dict of arrays in the maths' layout (``X @ W``): ``W_Q, W_K, W_V, W_O``
(D, D); ``g_1, g_2`` (D,) the two RMSNorm gains; ``W_gate, W_up`` (D, F), ``W_down`` (F, D); and,
for QK-norm, ``g_q, g_k`` (Dh,). No biases anywhere.
"""

from __future__ import annotations

import numpy as np

from .._validate import require_array, require_flag, require_positive_int
from .attention import scaled_dot_product_attention

__all__ = ["rms_norm", "silu", "swiglu", "modern_block", "MODERN_BLOCK_PARAMS"]

MODERN_BLOCK_PARAMS = ("W_Q", "W_K", "W_V", "W_O", "g_1", "g_2", "W_gate", "W_up", "W_down")


def rms_norm(x, g, eps: float = 1e-6) -> np.ndarray:
    """``g * x / sqrt(mean(x**2) + eps)`` over the last axis (Zhang & Sennrich 2019, eq. 4).

    Args:
        x: (..., d). g: the gain, (d,). eps: > 0.

    Raises:
        TypeError: non-numeric input. ValueError: ``g`` not of shape (d,), ``eps`` not > 0.

    Source: chapter 07.
    """
    x, g = require_array("x", x), require_array("g", g)
    d = x.shape[-1] if x.ndim else None
    if g.shape != (d,):
        raise ValueError(f"g must have shape (d,) = {(d,)}, the last dim of x {x.shape}; got {g.shape}")
    if not (isinstance(eps, (int, float, np.floating)) and np.isfinite(eps) and eps > 0):
        raise ValueError(f"eps must be a finite number > 0; got {eps!r}")
    rms = np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)  # (..., 1)
    return g * (x / rms)


def silu(x) -> np.ndarray:
    """``x * sigmoid(x) = x / (1 + exp(-x))``, written to stay finite for large negative x.

    Source: Elfwing et al. 2018 / Ramachandran et al. 2017 (Swish); chapter 07.
    """
    x = require_array("x", x)
    return x * 0.5 * (1.0 + np.tanh(0.5 * x))  # sigmoid(x) = (1 + tanh(x / 2)) / 2: no overflow


def swiglu(x, W_gate, W_up, W_down) -> np.ndarray:
    """``(silu(x W_gate) * (x W_up)) W_down``, per position: (..., D) -> (..., D).

    Args:
        x: (..., D). W_gate, W_up: (D, F). W_down: (F, D).

    Raises:
        TypeError: non-numeric input. ValueError: widths that do not chain.

    Source: Shazeer 2020, eq. 6; chapter 07.
    """
    x = require_array("x", x)
    W_gate, W_up, W_down = (require_array(n, w) for n, w in (("W_gate", W_gate), ("W_up", W_up), ("W_down", W_down)))
    D = x.shape[-1]
    for name, w in (("W_gate", W_gate), ("W_up", W_up)):
        if w.ndim != 2 or w.shape[0] != D:
            raise ValueError(f"{name} must have shape (D, F) with D={D}; got {w.shape}")
    if W_up.shape != W_gate.shape or W_down.shape != (W_gate.shape[1], D):
        raise ValueError(
            f"W_up must have W_gate's shape {W_gate.shape} and W_down shape (F, D) = {(W_gate.shape[1], D)}; "
            f"got W_up {W_up.shape}, W_down {W_down.shape}"
        )
    hidden = silu(x @ W_gate) * (x @ W_up)  # (..., D) @ (D, F) -> (..., F), elementwise gate
    return hidden @ W_down  # (..., F) @ (F, D) -> (..., D)


def modern_block(x, params: dict, n_heads: int, mask=None, eps: float = 1e-6, qk_norm: bool = False,
                 return_weights: bool = False):
    """Pre-norm block: ``h = x + MHA(rms_norm(x, g_1))``; ``out = h + swiglu(rms_norm(h, g_2))``.

    Attention is written out here head by head (no biases); with ``qk_norm`` each head's queries and
    keys go through ``rms_norm`` with the gains ``g_q``, ``g_k`` before the scores.

    Args:
        x: (B, T, D). params: the dict of the module docstring. n_heads: H, dividing D.
        mask: optional boolean keep-mask broadcastable to (B, H, T, T) (or (T, T)). eps: every norm's epsilon.
        qk_norm: apply QK-norm. return_weights: also return the weights (B, H, T, T).

    Returns:
        (B, T, D) float64 (and the weights).

    Raises:
        ValueError: a parameter missing; errors of :func:`rms_norm`, :func:`swiglu` and
        :func:`selfattn.ref.scaled_dot_product_attention`.

    Source: Touvron et al. 2023 (Llama); Dehghani et al. 2023 (QK-norm); chapter 07.
    """
    return_weights = require_flag("return_weights", return_weights)
    qk_norm = require_flag("qk_norm", qk_norm)
    n_heads = require_positive_int("n_heads", n_heads)
    needed = MODERN_BLOCK_PARAMS + (("g_q", "g_k") if qk_norm else ())
    missing = [k for k in needed if k not in params]
    if missing:
        raise ValueError(f"params is missing {missing}; expected the keys {needed}")
    p = {k: require_array(k, params[k]) for k in needed}
    x = require_array("x", x)
    D = x.shape[-1]
    if D % n_heads:
        raise ValueError(f"x's last dim D={D} must be divisible by n_heads={n_heads}")
    Dh = D // n_heads
    a = rms_norm(x, p["g_1"], eps)
    heads, weights = [], []
    for h in range(n_heads):
        cols = slice(h * Dh, (h + 1) * Dh)
        q, k, v = a @ p["W_Q"][:, cols], a @ p["W_K"][:, cols], a @ p["W_V"][:, cols]  # (B, T, Dh) each
        if qk_norm:
            q, k = rms_norm(q, p["g_q"], eps), rms_norm(k, p["g_k"], eps)
        context, w = scaled_dot_product_attention(q, k, v, None if mask is None else _head_mask(mask, h),
                                                  return_weights=True)  # fmt: skip
        heads.append(context)
        weights.append(w)
    h_stream = x + np.concatenate(heads, axis=-1) @ p["W_O"]  # H x (B, T, Dh) -> (B, T, D) @ (D, D)
    out = h_stream + swiglu(rms_norm(h_stream, p["g_2"], eps), p["W_gate"], p["W_up"], p["W_down"])
    return (out, np.stack(weights, axis=1)) if return_weights else out


def _head_mask(mask, h: int) -> np.ndarray:
    """Head h's slice of a mask broadcastable to (B, H, T, S)."""
    m = np.asarray(mask)
    if m.ndim < 4 or m.shape[1] == 1:
        return m if m.ndim < 4 else m[:, 0]
    return m[:, h]
