"""Multi-head attention: H heads in parallel, concatenated and projected by W_O.

Vaswani et al. 2017, section 3.2.2:
``MultiHead(X_q, X_kv) = Concat(head_1, ..., head_H) W_O`` with
``head_h = Attention(X_q W_Q^h, X_kv W_K^h, X_kv W_V^h)``.

Weight layout (the maths' layout, not ``nn.Linear``'s): ``W_Q``, ``W_K``, ``W_V`` and ``W_O`` are
(D, D) matrices used as ``X @ W_Q``. Head h owns the columns ``h*Dh:(h+1)*Dh`` of ``W_Q``, ``W_K``,
``W_V`` (its (D, Dh) projection) and the rows ``h*Dh:(h+1)*Dh`` of ``W_O`` (its (Dh, D) share of
the output projection); :meth:`MultiHeadAttention.head_weights` returns these slices. Storing
the H per-head matrices side by side in one (D, D) matrix is what lets all heads be computed by
one matrix product followed by :func:`split_heads`.

``torch.nn.MultiheadAttention`` fuses the three input projections into ``in_proj_weight`` of shape
(3D, D) in ``nn.Linear``'s (out, in) layout: ``in_proj_weight = cat([W_Q^T, W_K^T, W_V^T])`` and
``out_proj.weight = W_O^T`` (:meth:`MultiHeadAttention.from_torch`, :meth:`MultiHeadAttention.to_torch`).

Introduced in chapter 06.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch
from torch import nn

from ._validate import (
    require_dtype,
    require_flag,
    require_positive_int,
    require_probability,
    require_rank,
    require_scores_fit,
    require_tensor,
    shape_of,
)
from .attention import scaled_dot_product_attention

__all__ = ["split_heads", "merge_heads", "MHAConfig", "HeadWeights", "MultiHeadAttention"]


def split_heads(x: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Split the last axis into ``n_heads`` heads: (B, T, D) -> (B, H, T, Dh), Dh = D // H.

    Head h receives the features ``h*Dh:(h+1)*Dh`` of every position. The transpose puts the head
    axis before the position axis so that attention runs over positions, independently per head.
    This and :func:`merge_heads` are the only places heads are split and merged.

    Raises:
        TypeError: ``x`` is not a tensor, ``n_heads`` not a positive int.
        ValueError: ``x`` is not 3-D, or D is not divisible by ``n_heads``.

    Source: chapter 06.
    """
    require_tensor("x", x)
    require_rank("x", x, 3, "(B, T, D)")
    n_heads = require_positive_int("n_heads", n_heads)
    B, T, D = x.shape
    if D % n_heads:
        raise ValueError(
            f"x's last dim D={D} must be divisible by n_heads={n_heads}; got shape {shape_of(x)}"
        )
    x = x.reshape(B, T, n_heads, D // n_heads)  # (B, T, D) -> (B, T, H, Dh)
    return x.transpose(1, 2)  # (B, T, H, Dh) -> (B, H, T, Dh)


def merge_heads(x: torch.Tensor) -> torch.Tensor:
    """Concatenate the heads again: (B, H, T, Dh) -> (B, T, D), D = H * Dh; inverse of :func:`split_heads`.

    The transpose back must come before the reshape: reshaping (B, H, T, Dh) straight to (B, T, D)
    would mix positions of different heads into one row (a classic bug, tested).

    Raises:
        TypeError: ``x`` is not a tensor. ValueError: ``x`` is not 4-D.

    Source: chapter 06.
    """
    require_tensor("x", x)
    require_rank("x", x, 4, "(B, H, T, Dh)")
    B, H, T, Dh = x.shape
    x = x.transpose(1, 2)  # (B, H, T, Dh) -> (B, T, H, Dh)
    return x.reshape(B, T, H * Dh)  # (B, T, H, Dh) -> (B, T, D)


@dataclass(frozen=True)
class MHAConfig:
    """Sizes of a multi-head attention layer, validated at construction.

    Attributes:
        d_model: width D of the inputs and outputs (> 0), divisible by ``n_heads``.
        n_heads: number of heads H (> 0).
        bias: whether the four projections have bias vectors (as in BERT and ``nn.MultiheadAttention``).
        dropout: dropout probability on the attention weights, in [0, 1); used in training mode only.
    """

    d_model: int
    n_heads: int
    bias: bool = True
    dropout: float = 0.0

    def __post_init__(self):
        require_positive_int("d_model", self.d_model)
        require_positive_int("n_heads", self.n_heads)
        if self.d_model % self.n_heads:
            raise ValueError(
                f"d_model={self.d_model} must be divisible by n_heads={self.n_heads} "
                "(each head gets d_head = d_model // n_heads features)"
            )
        if not isinstance(self.bias, bool):
            raise TypeError(f"bias must be a bool; got {self.bias!r}")
        require_probability("dropout", self.dropout)

    @property
    def d_head(self) -> int:
        """Per-head width Dh = d_model // n_heads; the scores are divided by sqrt(d_head)."""
        return self.d_model // self.n_heads


class HeadWeights(NamedTuple):
    """The parameters of one head: W_Q, W_K, W_V of shape (D, Dh), W_O of shape (Dh, D)."""

    W_Q: torch.Tensor
    W_K: torch.Tensor
    W_V: torch.Tensor
    W_O: torch.Tensor


class MultiHeadAttention(nn.Module):
    """Multi-head (self- or cross-) attention with per-head-readable weights.

    Parameters: ``W_Q``, ``W_K``, ``W_V``, ``W_O`` of shape (D, D), used as ``X @ W`` (see the module
    docstring for which slice belongs to which head), and biases ``b_Q``, ``b_K``, ``b_V``, ``b_O``
    of shape (D,) when ``config.bias`` (else ``None``).

    Shapes:
        forward(x_q (B, T, D), x_kv (B, S, D) or None, mask broadcastable to (B, H, T, S),
        bias broadcastable to (B, H, T, S)) -> out (B, T, D), and weights (B, H, T, S) with
        ``return_weights=True``.

    Source: Vaswani et al. 2017, section 3.2.2; chapter 06.
    """

    def __init__(self, config: MHAConfig, generator: torch.Generator | None = None):
        super().__init__()
        if not isinstance(config, MHAConfig):
            raise TypeError(f"config must be an MHAConfig; got {type(config).__name__}")
        self.config = config
        D = config.d_model
        std = 1.0 / math.sqrt(D)  # keeps each projection's output at the scale of its input
        self.W_Q = nn.Parameter(torch.randn(D, D, generator=generator) * std)
        self.W_K = nn.Parameter(torch.randn(D, D, generator=generator) * std)
        self.W_V = nn.Parameter(torch.randn(D, D, generator=generator) * std)
        self.W_O = nn.Parameter(torch.randn(D, D, generator=generator) * std)
        for name in ("b_Q", "b_K", "b_V", "b_O"):
            self.register_parameter(name, nn.Parameter(torch.zeros(D)) if config.bias else None)

    def head_weights(self, h: int) -> HeadWeights:
        """Views of head ``h``'s slices: W_Q, W_K, W_V (D, Dh) and W_O (Dh, D).

        Raises:
            ValueError: ``h`` not in [0, n_heads).
        """
        if isinstance(h, bool) or not isinstance(h, (int, np.integer)) or not 0 <= h < self.config.n_heads:
            raise ValueError(f"h must be an int in [0, {self.config.n_heads}); got {h!r}")
        cols = slice(h * self.config.d_head, (h + 1) * self.config.d_head)
        return HeadWeights(
            self.W_Q[:, cols], self.W_K[:, cols], self.W_V[:, cols], self.W_O[cols, :]
        )

    def _project(self, x: torch.Tensor, W: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
        y = x @ W  # (B, T, D) @ (D, D) -> (B, T, D): all heads in one product
        return y if b is None else y + b

    def _check_inputs(self, x_q: torch.Tensor, x_kv: torch.Tensor) -> None:
        D = self.config.d_model
        for name, x in (("x_q", x_q), ("x_kv", x_kv)):
            require_tensor(name, x)
            require_rank(name, x, 3, "(B, T, D)" if name == "x_q" else "(B, S, D)")
            if x.shape[-1] != D:
                raise ValueError(f"{name} must have last dim d_model={D}; got shape {shape_of(x)}")
            require_dtype(name, x, self.W_Q.dtype)
        if x_kv.shape[0] != x_q.shape[0]:
            raise ValueError(
                f"x_q and x_kv must have the same batch size B; got x_q {shape_of(x_q)} and x_kv {shape_of(x_kv)}"
            )
        if x_kv.shape[1] == 0:
            name = "x_q (self-attention reads its keys and values from x_q)" if x_kv is x_q else "x_kv"
            raise ValueError(f"{name} must hold at least one position; got shape {shape_of(x_kv)}")
        # before the projections, so that subclasses (QKNormAttention) that call this check it too
        H = self.config.n_heads
        work = torch.float32 if x_q.dtype in (torch.float16, torch.bfloat16) else x_q.dtype  # the scores' dtype
        require_scores_fit(f"x_q {shape_of(x_q)} and x_kv {shape_of(x_kv)} with n_heads={H}",
                           (x_q.shape[0], H), x_q.shape[1], x_kv.shape[1], work, x_q.device)

    def forward(
        self,
        x_q: torch.Tensor,
        x_kv: torch.Tensor | None = None,
        mask: torch.Tensor | None = None,
        *,
        bias: torch.Tensor | None = None,
        return_weights: bool = False,
    ):
        """Attend from ``x_q`` (B, T, D) to ``x_kv`` (B, S, D); self-attention when ``x_kv`` is None.

        Args:
            x_q: the sequence that asks (queries), (B, T, D).
            x_kv: the sequence that is read (keys and values), (B, S, D); default ``x_q``.
            mask: boolean keep-mask (True = may attend), (T, S) or 4-D broadcastable to (B, H, T, S),
                e.g. a (T, S) causal mask or a (B, 1, 1, S) padding mask; a 3-D mask is refused (it
                would broadcast as (H, T, S), not the (B, T, S) it is usually meant as). The mask acts on the scores, after
                the projections: a NaN or inf stored in a padded row of ``x_kv`` (or ``x_q``) is
                hidden from ``out``, but ``K = x_kv @ W_K`` and ``V = x_kv @ W_V`` still read it, so
                the gradients of ``W_K`` and ``W_V`` (and of ``b_K``, ``b_V``) are NaN (0 * NaN = NaN
                in the projection's backward). Zero the padded rows of the input
                (``x_kv.masked_fill(~keep[..., None], 0)``) when they may hold such values.
            bias: additive float tensor broadcastable to (B, H, T, S), added to the scores.
            return_weights: also return the per-head weights (B, H, T, S).

        Returns:
            ``out`` (B, T, D); with ``return_weights`` also ``weights`` (B, H, T, S).

        Raises:
            TypeError / ValueError: inputs that are not 3-D tensors of width d_model, or not of the
            parameters' dtype; batch sizes that differ; a 3-D ``mask``; and every error of
            :func:`selfattn.scaled_dot_product_attention`.
            MemoryError: the (B, H, T, S) scores alone would need more bytes than the device's total
            memory; raised before the projections, naming ``x_q``'s and ``x_kv``'s shapes and the bytes.
        """
        return_weights = require_flag("return_weights", return_weights)
        x_kv = x_q if x_kv is None else x_kv
        self._check_inputs(x_q, x_kv)
        if isinstance(mask, torch.Tensor) and mask.dim() == 3:
            # broadcast from the right a (X, T, S) mask is (1, X, T, S): per head, not per batch element,
            # so a (B, T, S) mask would silently mask head b with batch element b's mask when B == H
            raise ValueError(
                f"mask must be (T, S) or 4-D (B or 1, H or 1, T, S); got a 3-D mask of shape {shape_of(mask)}, "
                "which reads as (H, T, S) and is easily meant as (B, T, S): pass mask[:, None] for one mask "
                "per batch element, or mask[None] for one per head"
            )
        H = self.config.n_heads
        Q = split_heads(self._project(x_q, self.W_Q, self.b_Q), H)  # (B, T, D) -> (B, H, T, Dh)
        K = split_heads(self._project(x_kv, self.W_K, self.b_K), H)  # (B, S, D) -> (B, H, S, Dh)
        V = split_heads(self._project(x_kv, self.W_V, self.b_V), H)  # (B, S, D) -> (B, H, S, Dh)
        # Dropout on the weights only while training: eval mode must be deterministic.
        dropout_p = self.config.dropout if self.training else 0.0
        context, weights = scaled_dot_product_attention(
            Q, K, V, mask, bias=bias, dropout_p=dropout_p, return_weights=True
        )  # scaled by 1/sqrt(d_head); context (B, H, T, Dh), weights (B, H, T, S)
        # (B, H, T, Dh) -> (B, T, D), then (B, T, D) @ (D, D) -> (B, T, D)
        out = self._project(merge_heads(context), self.W_O, self.b_O)
        return (out, weights) if return_weights else out

    @classmethod
    def from_torch(cls, mha: nn.MultiheadAttention) -> MultiHeadAttention:
        """Build a module with the same weights as a ``torch.nn.MultiheadAttention``.

        Mapping (``nn.Linear`` stores (out, in), we store (in, out)):
        ``W_Q, W_K, W_V = in_proj_weight.chunk(3)`` each transposed; ``b_Q, b_K, b_V =
        in_proj_bias.chunk(3)``; ``W_O = out_proj.weight.T``; ``b_O = out_proj.bias``. The dropout
        probability is copied; ``batch_first`` is not a weight (our inputs are always (B, T, D)).

        Raises:
            TypeError: ``mha`` is not an ``nn.MultiheadAttention``.
            ValueError: it has separate key/value widths (kdim/vdim != embed_dim), bias_k/bias_v
            or add_zero_attn, which have no counterpart here.
        """
        if not isinstance(mha, nn.MultiheadAttention):
            raise TypeError(f"mha must be a torch.nn.MultiheadAttention; got {type(mha).__name__}")
        if not mha._qkv_same_embed_dim or mha.bias_k is not None or mha.add_zero_attn:
            raise ValueError(
                "mha must have kdim == vdim == embed_dim, no bias_k/bias_v and no add_zero_attn"
            )
        has_bias = mha.in_proj_bias is not None
        config = MHAConfig(mha.embed_dim, mha.num_heads, bias=has_bias, dropout=float(mha.dropout))
        module = cls(config).to(dtype=mha.in_proj_weight.dtype, device=mha.in_proj_weight.device)
        # (3D, D) -> 3 x (D, D), each in nn.Linear's (out, in) layout
        W_q, W_k, W_v = mha.in_proj_weight.detach().chunk(3)
        state = {"W_Q": W_q.T, "W_K": W_k.T, "W_V": W_v.T, "W_O": mha.out_proj.weight.detach().T}
        if has_bias:
            b_q, b_k, b_v = mha.in_proj_bias.detach().chunk(3)  # (3D,) -> 3 x (D,)
            state.update(b_Q=b_q, b_K=b_k, b_V=b_v, b_O=mha.out_proj.bias.detach())
        module.load_state_dict({k: v.clone() for k, v in state.items()})
        return module.train(mha.training)

    def to_torch(self, *, batch_first: bool = True) -> nn.MultiheadAttention:
        """Export to a ``torch.nn.MultiheadAttention`` with the same weights (inverse of :meth:`from_torch`).

        ``in_proj_weight = cat([W_Q^T, W_K^T, W_V^T])`` (3D, D); ``out_proj.weight = W_O^T``.
        """
        batch_first = require_flag("batch_first", batch_first)
        c = self.config
        ref = self.W_Q
        mha = nn.MultiheadAttention(
            c.d_model,
            c.n_heads,
            dropout=c.dropout,
            bias=c.bias,
            batch_first=batch_first,
            device=ref.device,
            dtype=ref.dtype,
        )
        with torch.no_grad():
            mha.in_proj_weight.copy_(torch.cat([self.W_Q.T, self.W_K.T, self.W_V.T]))  # -> (3D, D)
            mha.out_proj.weight.copy_(self.W_O.T)
            if c.bias:
                mha.in_proj_bias.copy_(torch.cat([self.b_Q, self.b_K, self.b_V]))  # -> (3D,)
                mha.out_proj.bias.copy_(self.b_O)
        return mha.train(self.training)
