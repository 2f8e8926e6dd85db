"""Grouped-query and multi-query attention: fewer key/value heads than query heads.

At inference a decoder keeps the keys and values of every earlier token (the KV cache), and reads all
of them for every new token. Multi-query attention (Shazeer 2019) gives all H query heads one shared
key head and one shared value head; grouped-query attention (Ainslie et al. 2023) sits between it and
multi-head attention: ``n_kv_heads`` key/value heads, each shared by a group of
``n_heads // n_kv_heads`` consecutive query heads (query head h reads key/value head
``h // (n_heads // n_kv_heads)``). The cache shrinks by ``n_heads / n_kv_heads``:
:func:`kv_cache_bytes_per_token` gives ``2 x n_layers x n_kv_heads x d_head x bytes per number``.

``n_kv_heads == n_heads`` is multi-head attention (tested equal to
:class:`~selfattn.multihead.MultiHeadAttention`, float64, 1e-12); ``n_kv_heads == 1`` is multi-query
attention. :meth:`GroupedQueryAttention.from_mha` converts a multi-head layer by mean-pooling the key
and value projections of each group, the initialisation of Ainslie et al. (section 2.1).

Weight layout as in :mod:`selfattn.multihead` (the maths' layout, ``X @ W``): ``W_Q`` and ``W_O`` are
(D, D), ``W_K`` and ``W_V`` are (D, n_kv_heads * Dh); key/value head g owns columns ``g*Dh:(g+1)*Dh``.

Introduced in chapter 11 (inference); the KV cache itself is chapter 10's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from ._validate import (
    require_dtype,
    require_flag,
    require_positive_int,
    require_rank,
    require_tensor,
    shape_of,
)
from .attention import scaled_dot_product_attention
from .multihead import MHAConfig, MultiHeadAttention, merge_heads, split_heads

__all__ = ["GQAConfig", "GroupedQueryAttention", "repeat_kv", "kv_cache_bytes_per_token"]


@dataclass(frozen=True)
class GQAConfig:
    """Sizes of a :class:`GroupedQueryAttention`, validated at construction.

    Attributes:
        d_model: D (> 0), divisible by ``n_heads``. n_heads: H query heads (> 0).
        n_kv_heads: key/value heads (> 0), dividing ``n_heads``; H for multi-head, 1 for multi-query.
        bias: projections with biases (as in BERT) or without (as in Llama).
        dropout: on the attention weights, training mode only.

    Raises:
        TypeError / ValueError: sizes not positive ints, d_model not divisible by n_heads, n_heads not
        divisible by n_kv_heads, ``bias`` not a bool, dropout outside [0, 1).
    """

    d_model: int
    n_heads: int
    n_kv_heads: int
    bias: bool = False
    dropout: float = 0.0

    def __post_init__(self):
        # d_model, n_heads, bias and dropout: the checks (and messages) of multi-head attention
        MHAConfig(self.d_model, self.n_heads, bias=self.bias, dropout=self.dropout)
        object.__setattr__(self, "n_kv_heads", require_positive_int("n_kv_heads", self.n_kv_heads))
        if self.n_heads % self.n_kv_heads:
            raise ValueError(
                f"n_heads={self.n_heads} must be divisible by n_kv_heads={self.n_kv_heads} "
                "(each key/value head serves a group of n_heads // n_kv_heads query heads)"
            )

    @property
    def d_head(self) -> int:
        """Dh = d_model // n_heads, the width of every query, key and value head."""
        return self.d_model // self.n_heads

    @property
    def group_size(self) -> int:
        """Query heads per key/value head: n_heads // n_kv_heads."""
        return self.n_heads // self.n_kv_heads


def repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    """(B, Hkv, S, Dh) -> (B, Hkv * n_rep, S, Dh): each key/value head repeated for its group.

    Output head h is input head ``h // n_rep``, the order of ``torch.repeat_interleave`` along the
    head axis, of ``scaled_dot_product_attention(..., enable_gqa=True)`` and of Hugging Face's
    ``repeat_kv`` (tested). A view plus one copy; the cache itself stores only the Hkv heads.

    Raises:
        TypeError / ValueError: ``x`` not a 4-D tensor; ``n_rep`` not a positive int.
    """
    require_tensor("x", x)
    require_rank("x", x, 4, "(B, Hkv, S, Dh)")
    n_rep = require_positive_int("n_rep", n_rep)
    if n_rep == 1:
        return x
    B, H_kv, S, Dh = x.shape
    return x[:, :, None].expand(B, H_kv, n_rep, S, Dh).reshape(B, H_kv * n_rep, S, Dh)


def _as_python_number(value):
    """A Python int for an integral value (NumPy ints and floats included), else a Python float, so that
    sizes are computed exactly, never in a NumPy scalar's dtype (np.float16 rounds 4098 to 4096, np.int8
    overflows)."""
    if isinstance(value, (int, np.integer)):
        return int(value)
    value = float(value)
    return int(value) if value.is_integer() else value


def kv_cache_bytes_per_token(n_layers: int, n_kv_heads: int, d_head: int, bytes_per_number: int | float) -> int:
    """Bytes of KV cache per token: ``2 x n_layers x n_kv_heads x d_head x bytes_per_number``.

    The 2 counts keys and values. Multiply by the number of cached tokens (and the batch) for the
    whole cache. ``bytes_per_number`` is 4 for float32, 2 for float16/bfloat16, 1 for 8-bit caches
    (0.5 for 4-bit).

    Raises:
        TypeError / ValueError: counts not positive ints; ``bytes_per_number`` not a positive number.

    Source: chapter 11 (claim 25); Pope et al. 2023 (Efficiently Scaling Transformer Inference).
    """
    n_layers = require_positive_int("n_layers", n_layers)
    n_kv_heads = require_positive_int("n_kv_heads", n_kv_heads)
    d_head = require_positive_int("d_head", d_head)
    if isinstance(bytes_per_number, bool) or not isinstance(bytes_per_number, (int, float, np.integer, np.floating)):
        raise TypeError(f"bytes_per_number must be a number > 0; got {bytes_per_number!r}")
    if not (math.isfinite(bytes_per_number) and bytes_per_number > 0):
        raise ValueError(f"bytes_per_number must be a finite number > 0; got {bytes_per_number!r}")
    bytes_per_number = _as_python_number(bytes_per_number)  # never compute in a NumPy dtype (float16 rounds)
    total = 2 * n_layers * n_kv_heads * d_head * bytes_per_number
    if total != int(total):
        raise ValueError(f"2 x n_layers x n_kv_heads x d_head x bytes_per_number must be whole bytes; got {total}")
    return int(total)


class GroupedQueryAttention(nn.Module):
    """Attention with ``n_heads`` query heads and ``n_kv_heads`` shared key/value heads.

    Parameters: ``W_Q`` (D, D), ``W_K`` and ``W_V`` (D, n_kv_heads * Dh), ``W_O`` (D, D), used as
    ``X @ W``; biases ``b_Q`` (D,), ``b_K``, ``b_V`` (n_kv_heads * Dh,), ``b_O`` (D,) when
    ``config.bias``, else None.

    Shapes:
        forward(x_q (B, T, D), x_kv (B, S, D) or None, mask broadcastable to (B, H, T, S), bias
        broadcastable to (B, H, T, S)) -> out (B, T, D), and weights (B, H, T, S) with
        ``return_weights=True``. :meth:`project_kv` gives the cached (B, n_kv_heads, S, Dh) keys
        and values.

    Raises:
        TypeError / ValueError: inputs not (B, T, D) tensors of width d_model and the parameters'
        dtype; different batch sizes; every error of :func:`selfattn.scaled_dot_product_attention`.

    Source: Shazeer 2019 (multi-query); Ainslie et al. 2023 (grouped-query), section 2; chapter 11.
    """

    def __init__(self, config: GQAConfig, generator: torch.Generator | None = None):
        super().__init__()
        if not isinstance(config, GQAConfig):
            raise TypeError(f"config must be a GQAConfig; got {type(config).__name__}")
        self.config = config
        D, D_kv = config.d_model, config.n_kv_heads * config.d_head
        std = 1.0 / math.sqrt(D)
        self.W_Q = nn.Parameter(torch.randn(D, D, generator=generator) * std)
        self.W_K = nn.Parameter(torch.randn(D, D_kv, generator=generator) * std)
        self.W_V = nn.Parameter(torch.randn(D, D_kv, generator=generator) * std)
        self.W_O = nn.Parameter(torch.randn(D, D, generator=generator) * std)
        for name, width in (("b_Q", D), ("b_K", D_kv), ("b_V", D_kv), ("b_O", D)):
            self.register_parameter(name, nn.Parameter(torch.zeros(width)) if config.bias else None)

    def _check(self, name: str, x, layout: str, n_positions: str | None = None) -> None:
        """``x`` a (B, N, D) tensor of the module's dtype; with ``n_positions`` (the name of N), N > 0."""
        require_tensor(name, x)
        require_rank(name, x, 3, layout)
        if x.shape[-1] != self.config.d_model:
            raise ValueError(f"{name} must have last dim d_model={self.config.d_model}; got shape {shape_of(x)}")
        if n_positions is not None and x.shape[1] == 0:
            raise ValueError(f"{name} must hold at least one position ({n_positions} > 0); got shape {shape_of(x)}")
        if not x.dtype.is_floating_point:
            raise TypeError(
                f"{name} must be a floating tensor of the module's dtype, {self.W_Q.dtype}; got dtype {x.dtype}. "
                f"Convert it with {name}.to({self.W_Q.dtype})"
            )
        require_dtype(name, x, self.W_Q.dtype)

    @staticmethod
    def _linear(x: torch.Tensor, W: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
        y = x @ W
        return y if b is None else y + b

    def project_kv(self, x_kv: torch.Tensor):
        """Keys and values of ``x_kv`` (B, S, D): two (B, n_kv_heads, S, Dh) tensors (what a cache holds)."""
        self._check("x_kv", x_kv, "(B, S, D)")
        H_kv = self.config.n_kv_heads
        K = split_heads(self._linear(x_kv, self.W_K, self.b_K), H_kv)  # (B, S, Hkv*Dh) -> (B, Hkv, S, Dh)
        V = split_heads(self._linear(x_kv, self.W_V, self.b_V), H_kv)
        return K, V

    def forward(self, x_q: torch.Tensor, x_kv: torch.Tensor | None = None, mask: torch.Tensor | None = None, *,
                bias: torch.Tensor | None = None, return_weights: bool = False):
        """Attend from ``x_q`` (B, T, D) to ``x_kv`` (B, S, D); self-attention when ``x_kv`` is None.

        A padding ``mask`` acts on the scores, after the projections: a NaN or inf stored in a padded
        row of ``x_kv`` is hidden from the output but still reaches the gradients of ``W_K`` and
        ``W_V`` (NaN) through ``x_kv @ W_K`` and ``x_kv @ W_V``; zero the padded rows first when they
        may hold such values (as :meth:`selfattn.MultiHeadAttention.forward`).

        Raises:
            TypeError / ValueError: ``x_q`` or ``x_kv`` not a (B, T, D) / (B, S, D) floating tensor
            of the module's dtype with T > 0 and S > 0, different batch sizes; a bad ``mask`` or
            ``bias`` (as :func:`selfattn.scaled_dot_product_attention`); ``return_weights`` not a bool.
        """
        return_weights = require_flag("return_weights", return_weights)
        self._check("x_q", x_q, "(B, T, D)", "T")
        if x_kv is None:
            x_kv = x_q
        else:
            self._check("x_kv", x_kv, "(B, S, D)", "S")  # its rank first, then the batch sizes
        if x_kv.shape[0] != x_q.shape[0]:
            raise ValueError(f"x_q and x_kv must have the same batch size B; got {shape_of(x_q)} and {shape_of(x_kv)}")
        Q = split_heads(self._linear(x_q, self.W_Q, self.b_Q), self.config.n_heads)  # (B, H, T, Dh)
        K, V = self.project_kv(x_kv)  # (B, Hkv, S, Dh) each
        K, V = repeat_kv(K, self.config.group_size), repeat_kv(V, self.config.group_size)  # (B, H, S, Dh)
        dropout_p = self.config.dropout if self.training else 0.0
        context, weights = scaled_dot_product_attention(Q, K, V, mask, bias=bias, dropout_p=dropout_p,
                                                        return_weights=True)  # (B, H, T, Dh), (B, H, T, S)
        out = self._linear(merge_heads(context), self.W_O, self.b_O)  # (B, T, D) @ (D, D)
        return (out, weights) if return_weights else out

    @classmethod
    def from_mha(cls, mha: MultiHeadAttention, n_kv_heads: int) -> GroupedQueryAttention:
        """A GQA layer from a multi-head one: each group's key and value heads mean-pooled into one.

        Query and output projections are copied; key/value head g gets the mean of the K and V
        projections (weights and biases) of query heads ``g*G .. (g+1)*G - 1``, G = n_heads //
        n_kv_heads. With ``n_kv_heads == n_heads`` the layer computes exactly what ``mha`` does. The
        GQA paper follows the conversion with a short "uptraining"; without it the outputs change, by
        an amount the inference chapter measures.

        Raises:
            TypeError: ``mha`` not a MultiHeadAttention. ValueError: ``n_kv_heads`` not dividing n_heads.

        Source: Ainslie et al. 2023, section 2.1 (mean pooling); chapter 11.
        """
        if not isinstance(mha, MultiHeadAttention):
            raise TypeError(f"mha must be a selfattn.MultiHeadAttention; got {type(mha).__name__}")
        c = mha.config
        config = GQAConfig(c.d_model, c.n_heads, n_kv_heads, bias=c.bias, dropout=c.dropout)
        G, Dh = config.group_size, config.d_head
        module = cls(config).to(dtype=mha.W_Q.dtype, device=mha.W_Q.device)

        def pooled(W: torch.Tensor) -> torch.Tensor:  # (..., H*Dh) -> (..., Hkv*Dh), heads averaged by group
            lead = W.shape[:-1]
            return W.reshape(*lead, n_kv_heads, G, Dh).mean(dim=-2).reshape(*lead, n_kv_heads * Dh)

        with torch.no_grad():
            module.W_Q.copy_(mha.W_Q)
            module.W_O.copy_(mha.W_O)
            module.W_K.copy_(pooled(mha.W_K))
            module.W_V.copy_(pooled(mha.W_V))
            if c.bias:
                module.b_Q.copy_(mha.b_Q)
                module.b_O.copy_(mha.b_O)
                module.b_K.copy_(pooled(mha.b_K))
                module.b_V.copy_(pooled(mha.b_V))
        return module
