"""The Transformer block: attention and a feed-forward network, each in a residual branch with
layer normalization.

Two placements of the normalization, each its own class (no norm-style switch inside a forward):

- :class:`TransformerBlock`, pre-norm (GPT-2 and most recent models; Xiong et al. 2020):
  ``x = x + attn(ln1(x)); x = x + ffn(ln2(x))``. The residual stream itself is never normalized
  inside the block, so a stack of them needs a final layer norm before its output head (chapter 07).
- :class:`PostNormTransformerBlock`, post-norm (the original Transformer, Vaswani et al. 2017
  section 3.1, and BERT, hence all-MiniLM-L6-v2): ``x = ln1(x + attn(x)); x = ln2(x + ffn(x))``.

Both are built from the same parts (``attn``, ``ffn``, ``ln1``, ``ln2``, ``dropout``), so a
state dict moves between them unchanged. Introduced in chapter 07.
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
    require_probability,
    require_rank,
    require_tensor,
    shape_of,
)
from .multihead import MHAConfig, MultiHeadAttention

__all__ = ["BlockConfig", "FeedForward", "TransformerBlock", "PostNormTransformerBlock"]


def _require_width(name: str, x, d_model: int, layout: str, dtype: torch.dtype) -> None:
    require_tensor(name, x)
    require_rank(name, x, 3, layout)
    if x.shape[-1] != d_model:
        raise ValueError(f"{name} must have last dim d_model={d_model}; got shape {shape_of(x)}")
    require_dtype(name, x, dtype)


class FeedForward(nn.Module):
    """Position-wise feed-forward network ``GELU(x W_1 + b_1) W_2 + b_2`` (Vaswani et al. 2017,
    eq. 2, with BERT's GELU in place of ReLU).

    GELU is the exact one, ``x * Phi(x)`` with the Gaussian CDF written with erf, as in BERT's
    ``hidden_act="gelu"`` (not the tanh approximation). The same function is applied to every
    position separately: no information moves between positions here.

    Args:
        d_model: width D of inputs and outputs (> 0).
        d_ff: hidden width F (> 0), usually 4 * D.

    Shapes:
        forward(x: (B, T, D)) -> (B, T, D). Parameters ``linear1`` (D -> F) and ``linear2``
        (F -> D) are ``nn.Linear`` modules.

    Raises:
        TypeError / ValueError: sizes not positive ints; at call time, ``x`` not a (B, T, D) tensor.

    Source: chapter 07.
    """

    def __init__(self, d_model: int, d_ff: int):
        super().__init__()
        self.d_model = require_positive_int("d_model", d_model)
        self.d_ff = require_positive_int("d_ff", d_ff)
        self.linear1 = nn.Linear(d_model, d_ff)
        self.activation = nn.GELU(approximate="none")
        self.linear2 = nn.Linear(d_ff, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _require_width("x", x, self.d_model, "(B, T, D)", self.linear1.weight.dtype)
        hidden = self.activation(self.linear1(x))  # (B, T, D) @ (D, F) -> (B, T, F)
        return self.linear2(hidden)  # (B, T, F) @ (F, D) -> (B, T, D)


@dataclass(frozen=True)
class BlockConfig:
    """Sizes of a Transformer block, validated at construction.

    Attributes:
        d_model: width D of the residual stream (> 0), divisible by ``n_heads``.
        n_heads: number of attention heads H (> 0).
        d_ff: hidden width F of the feed-forward network (> 0).
        dropout: probability in [0, 1) for the attention weights and for both residual branches;
            active in training mode only.
        layer_norm_eps: the epsilon of both layer norms (> 0); BERT uses 1e-12.
    """

    d_model: int
    n_heads: int
    d_ff: int
    dropout: float = 0.0
    layer_norm_eps: float = 1e-5

    def __post_init__(self):
        MHAConfig(self.d_model, self.n_heads)  # validates d_model and n_heads, same messages
        require_positive_int("d_ff", self.d_ff)
        require_probability("dropout", self.dropout)
        eps = self.layer_norm_eps
        if isinstance(eps, bool) or not isinstance(eps, (int, float, np.integer, np.floating)):
            raise TypeError(f"layer_norm_eps must be a number > 0 and finite; got {eps!r} ({type(eps).__name__})")
        if not (math.isfinite(eps) and eps > 0):
            raise ValueError(f"layer_norm_eps must be a number > 0 and finite; got {eps!r}")

    @property
    def mha_config(self) -> MHAConfig:
        """The attention layer's config (with biases, as in BERT)."""
        return MHAConfig(self.d_model, self.n_heads, bias=True, dropout=self.dropout)

    @property
    def d_head(self) -> int:
        return self.d_model // self.n_heads


class _BlockParts(nn.Module):
    """The parts both block classes are made of; each subclass defines only its ``forward``."""

    def __init__(self, config: BlockConfig):
        super().__init__()
        if not isinstance(config, BlockConfig):
            raise TypeError(f"config must be a BlockConfig; got {type(config).__name__}")
        self.config = config
        D = config.d_model
        self.attn = MultiHeadAttention(config.mha_config)
        self.ln1 = nn.LayerNorm(D, eps=config.layer_norm_eps)
        self.ffn = FeedForward(D, config.d_ff)
        self.ln2 = nn.LayerNorm(D, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.dropout)  # on each branch's output; identity in eval

    def _check_input(self, x) -> None:
        """``x`` must be a (B, T, D) tensor of the parameters' dtype with T > 0 (named ``x``, not the
        ``x_q`` of the attention layer it is passed on to)."""
        _require_width("x", x, self.config.d_model, "(B, T, D)", self.ln1.weight.dtype)
        if x.shape[1] == 0:
            raise ValueError(f"x must hold at least one position (T > 0) in (B, T, D); got shape {shape_of(x)}")


class TransformerBlock(_BlockParts):
    """Pre-norm Transformer block: ``x + attn(ln1(x))``, then ``x + ffn(ln2(x))``.

    Args:
        config: a :class:`BlockConfig`.

    Shapes:
        forward(x: (B, T, D), mask: boolean keep-mask broadcastable to (B, H, T, T)) -> (B, T, D),
        and the attention weights (B, H, T, T) with ``return_weights=True``.

    Raises:
        TypeError / ValueError: ``x`` not a (B, T, D) tensor of width d_model with T > 0; a bad
        mask; ``return_weights`` not a bool.

    Source: Xiong et al. 2020 (pre-norm); chapter 07.
    """

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None, *, return_weights=False):
        return_weights = require_flag("return_weights", return_weights)
        self._check_input(x)
        # Each branch reads a normalized copy; the residual stream x itself is only added to.
        attn_out, weights = self.attn(self.ln1(x), mask=mask, return_weights=True)
        x = x + self.dropout(attn_out)  # (B, T, D)
        x = x + self.dropout(self.ffn(self.ln2(x)))  # (B, T, D)
        return (x, weights) if return_weights else x


class PostNormTransformerBlock(_BlockParts):
    """Post-norm Transformer block, as in BERT: ``ln1(x + attn(x))``, then ``ln2(x + ffn(x))``.

    Parameter names match :class:`TransformerBlock`; BERT's names map onto them as
    ``attention.self.{query,key,value}`` -> ``attn.W_{Q,K,V}`` (transposed),
    ``attention.output.dense`` -> ``attn.W_O`` (transposed), ``attention.output.LayerNorm`` ->
    ``ln1``, ``intermediate.dense`` -> ``ffn.linear1``, ``output.dense`` -> ``ffn.linear2``,
    ``output.LayerNorm`` -> ``ln2``.

    Shapes, errors: as :class:`TransformerBlock`.

    Source: Vaswani et al. 2017 section 3.1; Devlin et al. 2019 (BERT); chapter 07.
    """

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None, *, return_weights=False):
        return_weights = require_flag("return_weights", return_weights)
        self._check_input(x)
        # Normalize after adding: the residual stream is renormalized after every branch.
        attn_out, weights = self.attn(x, mask=mask, return_weights=True)
        x = self.ln1(x + self.dropout(attn_out))  # (B, T, D)
        x = self.ln2(x + self.dropout(self.ffn(x)))  # (B, T, D)
        return (x, weights) if return_weights else x
