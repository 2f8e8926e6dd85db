"""NumPy float64 reference for the Transformer block: layer norm, GELU, the feed-forward network,
and the post-norm (BERT) and pre-norm blocks. Plain code, one function per equation; shares no
code with the torch path. Introduced in chapter 07.

A block's parameters are passed as a dict of arrays in the maths' layout (``X @ W``):
``W_Q, W_K, W_V, W_O`` (D, D); ``b_Q, b_K, b_V, b_O`` (D,); ``ln1_gamma, ln1_beta, ln2_gamma,
ln2_beta`` (D,); ``W_1`` (D, F), ``b_1`` (F,), ``W_2`` (F, D), ``b_2`` (D,).
"""

from __future__ import annotations

import math

import numpy as np

from .._validate import require_array, require_flag
from .multihead import multi_head_attention

__all__ = [
    "layer_norm",
    "gelu",
    "feed_forward",
    "post_norm_block",
    "pre_norm_block",
    "BLOCK_PARAMS",
]

BLOCK_PARAMS = (
    "W_Q", "W_K", "W_V", "W_O", "b_Q", "b_K", "b_V", "b_O",
    "ln1_gamma", "ln1_beta", "ln2_gamma", "ln2_beta", "W_1", "b_1", "W_2", "b_2",
)  # fmt: skip

_erf = np.vectorize(math.erf, otypes=[np.float64])


def layer_norm(x, gamma, beta, eps: float = 1e-5) -> np.ndarray:
    """``gamma * (x - mean) / sqrt(var + eps) + beta`` over the last axis (Ba et al. 2016).

    The variance is the biased one (divide by D), as in ``torch.nn.LayerNorm``.

    Args:
        x: (..., D). gamma, beta: (D,). eps: > 0.

    Raises:
        TypeError: non-numeric input. ValueError: gamma/beta not of shape (D,), eps <= 0.

    Source: chapter 07.
    """
    x, gamma, beta = (
        require_array("x", x),
        require_array("gamma", gamma),
        require_array("beta", beta),
    )
    D = x.shape[-1]
    for name, p in (("gamma", gamma), ("beta", beta)):
        if p.shape != (D,):
            raise ValueError(f"{name} must have shape (D,) = {(D,)}; got {p.shape}")
    if not eps > 0:
        raise ValueError(f"eps must be > 0; got {eps!r}")
    mean = x.mean(axis=-1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
    return gamma * (x - mean) / np.sqrt(var + eps) + beta


def gelu(x) -> np.ndarray:
    """Exact GELU, ``x * Phi(x) = x * (1 + erf(x / sqrt(2))) / 2`` (Hendrycks & Gimpel 2016).

    Source: chapter 07.
    """
    x = require_array("x", x)
    return x * 0.5 * (1.0 + _erf(x / math.sqrt(2.0)))


def feed_forward(x, W_1, b_1, W_2, b_2) -> np.ndarray:
    """``gelu(x W_1 + b_1) W_2 + b_2``, applied to each position: (..., D) -> (..., D).

    Source: Vaswani et al. 2017 eq. 2 (with GELU); chapter 07.
    """
    x = require_array("x", x)
    hidden = gelu(x @ require_array("W_1", W_1) + require_array("b_1", b_1))  # (..., D) @ (D, F)
    return hidden @ require_array("W_2", W_2) + require_array("b_2", b_2)  # (..., F) @ (F, D)


def _attention(x, params, n_heads, mask):
    return multi_head_attention(
        x, x, params["W_Q"], params["W_K"], params["W_V"], params["W_O"], n_heads,
        b_Q=params["b_Q"], b_K=params["b_K"], b_V=params["b_V"], b_O=params["b_O"],
        mask=mask, return_weights=True,
    )  # fmt: skip


def _check_params(params) -> None:
    missing = [name for name in BLOCK_PARAMS if name not in params]
    if missing:
        raise ValueError(f"params is missing {missing}; expected the keys {BLOCK_PARAMS}")


def post_norm_block(
    x, params: dict, n_heads: int, mask=None, eps: float = 1e-12, return_weights=False
):
    """Post-norm block (BERT): ``h = LN1(x + MHA(x))``; ``out = LN2(h + FFN(h))``.

    Args:
        x: (B, T, D). params: the dict described in the module docstring. n_heads: H.
        mask: optional boolean keep-mask broadcastable to (B, H, T, T). eps: layer norm epsilon.

    Returns:
        (B, T, D) float64, and the attention weights (B, H, T, T) with ``return_weights``.

    Raises:
        ValueError: a parameter missing or of the wrong shape; errors of :func:`multi_head_attention`.

    Source: Vaswani et al. 2017 section 3.1; chapter 07.
    """
    return_weights = require_flag("return_weights", return_weights)
    _check_params(params)
    x = require_array("x", x)
    attn_out, weights = _attention(x, params, n_heads, mask)
    h = layer_norm(x + attn_out, params["ln1_gamma"], params["ln1_beta"], eps)
    ffn_out = feed_forward(h, params["W_1"], params["b_1"], params["W_2"], params["b_2"])
    out = layer_norm(h + ffn_out, params["ln2_gamma"], params["ln2_beta"], eps)
    return (out, weights) if return_weights else out


def pre_norm_block(
    x, params: dict, n_heads: int, mask=None, eps: float = 1e-5, return_weights=False
):
    """Pre-norm block: ``h = x + MHA(LN1(x))``; ``out = h + FFN(LN2(h))``.

    Arguments, returns and errors as :func:`post_norm_block`.

    Source: Xiong et al. 2020; chapter 07.
    """
    return_weights = require_flag("return_weights", return_weights)
    _check_params(params)
    x = require_array("x", x)
    attn_out, weights = _attention(
        layer_norm(x, params["ln1_gamma"], params["ln1_beta"], eps), params, n_heads, mask
    )
    h = x + attn_out
    normed = layer_norm(h, params["ln2_gamma"], params["ln2_beta"], eps)
    out = h + feed_forward(normed, params["W_1"], params["b_1"], params["W_2"], params["b_2"])
    return (out, weights) if return_weights else out
