"""The modern block: RMSNorm, SwiGLU, no biases in attention, optional QK-norm.

Models since Llama (Touvron et al. 2023) change the parts *around* attention, not attention itself:

- :class:`RMSNorm` (Zhang & Sennrich 2019) replaces layer norm: it rescales each position's vector
  to unit root-mean-square and multiplies by a learned gain; no mean is subtracted, no bias added.
- :class:`SwiGLU` (Shazeer 2020) replaces the GELU MLP: ``(SiLU(x W_gate) * (x W_up)) W_down``,
  three bias-free matrices.
- The attention projections have no biases (``MHAConfig(bias=False)``): the sublayer is the
  package's own :class:`~selfattn.multihead.MultiHeadAttention`, unchanged.
- :class:`QKNormAttention` (Dehghani et al. 2023, ViT-22B; per head as in Qwen3) applies an
  RMSNorm to each head's queries and keys before the scores, which bounds every score by
  ``sqrt(d_head) * max_i |g_q[i] * g_k[i]|`` (the two gains).

:class:`ModernBlock` is pre-norm, ``x + attn(norm1(x))`` then ``x + ffn(norm2(x))``; a stack of
them needs a final :class:`RMSNorm` before its output head (chapter 07 measures why). Parameter
names of the norms and of the MLP match Hugging Face's Llama (``weight``; ``gate_proj``,
``up_proj``, ``down_proj``), so their state dicts load unchanged.

Introduced in chapter 07 ("The modern block").
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

__all__ = [
    "RMSNorm",
    "SwiGLU",
    "QKNormAttention",
    "ModernBlockConfig",
    "ModernBlock",
    "attention_scores",
    "qk_norm_score_bound",
    "reference_params",
    "llama_state_dict",
]

_HALF = (torch.float16, torch.bfloat16)


def _require_eps(eps) -> float:
    if isinstance(eps, bool) or not isinstance(eps, (int, float, np.integer, np.floating)):
        raise TypeError(f"eps must be a number > 0 and finite; got {eps!r} ({type(eps).__name__})")
    if not (math.isfinite(eps) and eps > 0):
        raise ValueError(f"eps must be a number > 0 and finite; got {eps!r}")
    return float(eps)


def _require_last_dim(name: str, x, width: int, what: str, dtype: torch.dtype) -> None:
    require_tensor(name, x)
    if x.ndim < 1 or x.shape[-1] != width:
        raise ValueError(f"{name} must have last dim {what}={width}; got shape {shape_of(x)}")
    require_dtype(name, x, dtype)


class RMSNorm(nn.Module):
    """Root-mean-square normalization over the last axis: ``g * x / sqrt(mean(x**2) + eps)``.

    Unlike layer norm it neither subtracts the mean nor adds a bias: it only fixes each vector's
    scale, so a vector leaves it with root-mean-square 1 (times the gain ``g``; slightly less, by
    the ``eps``). Half-precision inputs are normalised in float32 and returned in their own dtype
    (the package's rule for half precision, and what Llama's ``LlamaRMSNorm`` does).

    Args:
        d: width of the normalised (last) axis, > 0 (``d_model`` for the stream, ``d_head`` for QK-norm).
        eps: added to the mean square, > 0 (Llama uses 1e-5 or 1e-6).

    Shapes:
        forward(x: (..., d)) -> (..., d), same dtype. Parameter ``weight`` (the gain g): (d,), ones at
        initialisation.

    Raises:
        TypeError / ValueError: ``d`` not a positive int, ``eps`` not a finite number > 0; at call
        time ``x`` not a tensor, its last dim not ``d`` or its dtype not the gain's.

    Source: Zhang & Sennrich 2019, eq. 4; chapter 07.
    """

    def __init__(self, d: int, eps: float = 1e-6):
        super().__init__()
        self.d = require_positive_int("d", d)
        self.eps = _require_eps(eps)
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _require_last_dim("x", x, self.d, "d", self.weight.dtype)
        return self._normalise(x)

    def _normalise(self, x: torch.Tensor) -> torch.Tensor:
        """:meth:`forward` without the checks (for callers that made them)."""
        h = x.float() if x.dtype in _HALF else x  # half precision: the mean square in float32
        mean_square = h.pow(2).mean(dim=-1, keepdim=True)  # (..., d) -> (..., 1)
        h = h * torch.rsqrt(mean_square + self.eps)  # each vector now has RMS 1 (less eps)
        return self.weight * h.to(x.dtype)

    def extra_repr(self) -> str:
        return f"{self.d}, eps={self.eps}"


class SwiGLU(nn.Module):
    """Gated feed-forward network ``(SiLU(x W_gate) * (x W_up)) W_down``, no biases.

    ``SiLU(z) = z * sigmoid(z)`` (also called Swish). The gate path decides, per hidden unit and
    position, how much of the up path passes. With three matrices instead of two, ``d_ff`` is
    usually about ``(2/3) * 4 * d_model`` so that the parameter count matches a GELU MLP of width
    ``4 * d_model`` (Shazeer 2020, section 2). Applied to every position separately.

    Args:
        d_model: width D of inputs and outputs (> 0).
        d_ff: hidden width F (> 0).

    Shapes:
        forward(x: (B, T, D)) -> (B, T, D). ``gate_proj``, ``up_proj`` (D -> F) and ``down_proj``
        (F -> D) are bias-free ``nn.Linear`` modules, named as in Llama's ``LlamaMLP``.

    Raises:
        TypeError / ValueError: sizes not positive ints; at call time ``x`` not a (B, T, D) tensor
        of the parameters' dtype.

    Source: Shazeer 2020, eq. 6 (FFN_SwiGLU); Touvron et al. 2023; chapter 07.
    """

    def __init__(self, d_model: int, d_ff: int):
        super().__init__()
        self.d_model = require_positive_int("d_model", d_model)
        self.d_ff = require_positive_int("d_ff", d_ff)
        self.gate_proj = nn.Linear(d_model, d_ff, bias=False)
        self.up_proj = nn.Linear(d_model, d_ff, bias=False)
        self.down_proj = nn.Linear(d_ff, d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        require_tensor("x", x)
        require_rank("x", x, 3, "(B, T, D)")
        _require_last_dim("x", x, self.d_model, "d_model", self.gate_proj.weight.dtype)
        gate = nn.functional.silu(self.gate_proj(x))  # (B, T, D) @ (D, F) -> (B, T, F)
        return self.down_proj(gate * self.up_proj(x))  # (B, T, F) @ (F, D) -> (B, T, D)


class QKNormAttention(MultiHeadAttention):
    """Multi-head attention with QK-norm: an :class:`RMSNorm` over each head's queries and keys.

    Everything else is :class:`~selfattn.multihead.MultiHeadAttention` (weights, heads, the
    attention function); only ``Q`` and ``K`` are normalised, per head over their ``d_head``
    features, with one gain ``q_norm.weight`` and one ``k_norm.weight`` of shape (Dh,) shared by all
    heads, as in Qwen3 (OLMo 2 instead normalises all heads' queries together, over d_model). Then
    each normalised query and key has Euclidean length at most ``sqrt(d_head)`` before its gain, so every score obeys
    ``|score| <= sqrt(d_head) * max_i |g_q[i] * g_k[i]|`` (:func:`qk_norm_score_bound`), however
    large ``W_Q`` and ``W_K`` grow.

    Args:
        config: an :class:`~selfattn.multihead.MHAConfig` (biases allowed, though the modern block
            uses none).
        eps: the two norms' epsilon (> 0).

    Shapes, errors: as :meth:`MultiHeadAttention.forward`.

    Source: Dehghani et al. 2023, section 3.1 (ViT-22B); chapter 07.
    """

    def __init__(self, config: MHAConfig, eps: float = 1e-6, generator: torch.Generator | None = None):
        super().__init__(config, generator=generator)
        self.q_norm = RMSNorm(config.d_head, eps)
        self.k_norm = RMSNorm(config.d_head, eps)

    def queries_keys(self, x_q: torch.Tensor, x_kv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The normalised per-head queries (B, H, T, Dh) and keys (B, H, S, Dh); inputs unchecked."""
        H = self.config.n_heads
        Q = split_heads(self._project(x_q, self.W_Q, self.b_Q), H)  # (B, T, D) -> (B, H, T, Dh)
        K = split_heads(self._project(x_kv, self.W_K, self.b_K), H)  # (B, S, D) -> (B, H, S, Dh)
        return self.q_norm._normalise(Q), self.k_norm._normalise(K)  # RMS 1 per head, then the gains

    def forward(self, x_q, x_kv=None, mask=None, *, bias=None, return_weights=False):
        return_weights = require_flag("return_weights", return_weights)
        x_kv = x_q if x_kv is None else x_kv
        self._check_inputs(x_q, x_kv)
        Q, K = self.queries_keys(x_q, x_kv)  # (B, H, T, Dh), (B, H, S, Dh), normalised per head
        V = split_heads(self._project(x_kv, self.W_V, self.b_V), self.config.n_heads)  # (B, H, S, Dh)
        dropout_p = self.config.dropout if self.training else 0.0
        context, weights = scaled_dot_product_attention(
            Q, K, V, mask, bias=bias, dropout_p=dropout_p, return_weights=True
        )  # the package's attention, unchanged: context (B, H, T, Dh), weights (B, H, T, S)
        out = self._project(merge_heads(context), self.W_O, self.b_O)  # (B, T, D) @ (D, D) -> (B, T, D)
        return (out, weights) if return_weights else out


@dataclass(frozen=True)
class ModernBlockConfig:
    """Sizes of a :class:`ModernBlock`, validated at construction.

    Attributes:
        d_model: width D of the residual stream (> 0), divisible by ``n_heads``.
        n_heads: number of heads H (> 0).
        d_ff: hidden width F of the SwiGLU network (> 0); Llama uses about (8/3) D.
        norm_eps: epsilon of every RMSNorm (> 0).
        qk_norm: build the attention as :class:`QKNormAttention` (chosen once, in the constructor).
    """

    d_model: int
    n_heads: int
    d_ff: int
    norm_eps: float = 1e-6
    qk_norm: bool = False

    def __post_init__(self):
        MHAConfig(self.d_model, self.n_heads)  # validates d_model and n_heads, same messages
        require_positive_int("d_ff", self.d_ff)
        _require_eps(self.norm_eps)
        if not isinstance(self.qk_norm, (bool, np.bool_)):
            raise TypeError(f"qk_norm must be True or False; got {self.qk_norm!r} ({type(self.qk_norm).__name__})")

    @property
    def mha_config(self) -> MHAConfig:
        """The attention layer's config: no biases on Q, K, V or O, no dropout."""
        return MHAConfig(self.d_model, self.n_heads, bias=False)

    @property
    def d_head(self) -> int:
        return self.d_model // self.n_heads


class ModernBlock(nn.Module):
    """Pre-norm block with RMSNorm and SwiGLU: ``x + attn(norm1(x))``, then ``x + ffn(norm2(x))``.

    ``attn`` is a bias-free :class:`~selfattn.multihead.MultiHeadAttention` (or a
    :class:`QKNormAttention` when ``config.qk_norm``), ``ffn`` a :class:`SwiGLU`, ``norm1`` and
    ``norm2`` :class:`RMSNorm` modules. As in any pre-norm block, the stream itself is only added
    to: a stack of these needs a final RMSNorm before its output head.

    Args:
        config: a :class:`ModernBlockConfig`.

    Shapes:
        forward(x: (B, T, D), mask: boolean keep-mask broadcastable to (B, H, T, T)) -> (B, T, D),
        and the weights (B, H, T, T) with ``return_weights=True``.

    Raises:
        TypeError / ValueError: ``x`` not a (B, T, D) tensor of width d_model with T > 0 and the
        parameters' dtype; a bad mask; ``return_weights`` not a bool.

    Source: Touvron et al. 2023 (Llama), section 2.2; chapter 07.
    """

    def __init__(self, config: ModernBlockConfig):
        super().__init__()
        if not isinstance(config, ModernBlockConfig):
            raise TypeError(f"config must be a ModernBlockConfig; got {type(config).__name__}")
        self.config = config
        D = config.d_model
        # The variant is fixed here, once; forward has no branches on the config.
        if config.qk_norm:
            self.attn = QKNormAttention(config.mha_config, eps=config.norm_eps)
        else:
            self.attn = MultiHeadAttention(config.mha_config)
        self.norm1 = RMSNorm(D, config.norm_eps)
        self.ffn = SwiGLU(D, config.d_ff)
        self.norm2 = RMSNorm(D, config.norm_eps)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None, *, return_weights=False):
        return_weights = require_flag("return_weights", return_weights)
        require_tensor("x", x)
        require_rank("x", x, 3, "(B, T, D)")
        _require_last_dim("x", x, self.config.d_model, "d_model", self.norm1.weight.dtype)
        if x.shape[1] == 0:
            raise ValueError(f"x must hold at least one position (T > 0) in (B, T, D); got shape {shape_of(x)}")
        attn_out, weights = self.attn(self.norm1._normalise(x), mask=mask, return_weights=True)
        x = x + attn_out  # (B, T, D): the stream is only added to
        x = x + self.ffn(self.norm2._normalise(x))  # (B, T, D)
        return (x, weights) if return_weights else x


def attention_scores(block: ModernBlock, x: torch.Tensor) -> torch.Tensor:
    """The scores (attention logits, before any mask and softmax) of ``block``'s attention on ``x``.

    ``scores = Q K^T / sqrt(d_head)`` with ``Q``, ``K`` from ``norm1(x)`` (normalised per head for
    a :class:`QKNormAttention`): the numbers whose growth QK-norm bounds.

    Args:
        block: a :class:`ModernBlock`. x: (B, T, D) of the block's dtype.

    Returns:
        (B, H, T, T) tensor.

    Raises:
        TypeError / ValueError: ``block`` not a ModernBlock; ``x`` as in :meth:`ModernBlock.forward`.

    Source: chapter 07.
    """
    if not isinstance(block, ModernBlock):
        raise TypeError(f"block must be a ModernBlock; got {type(block).__name__}")
    require_tensor("x", x)
    require_rank("x", x, 3, "(B, T, D)")
    _require_last_dim("x", x, block.config.d_model, "d_model", block.norm1.weight.dtype)
    h = block.norm1._normalise(x)
    attn = block.attn
    if isinstance(attn, QKNormAttention):
        Q, K = attn.queries_keys(h, h)
    else:
        Q = split_heads(attn._project(h, attn.W_Q, attn.b_Q), attn.config.n_heads)  # (B, H, T, Dh)
        K = split_heads(attn._project(h, attn.W_K, attn.b_K), attn.config.n_heads)  # (B, H, T, Dh)
    return Q @ K.transpose(-2, -1) / math.sqrt(attn.config.d_head)  # (B, H, T, Dh) @ (B, H, Dh, T)


def qk_norm_score_bound(attn: QKNormAttention) -> float:
    """``sqrt(d_head) * max_i |g_q[i] * g_k[i]|``: no score of ``attn`` can exceed it in size.

    Why: after the RMSNorm a head's query ``q_hat`` has ``sum(q_hat**2) <= d_head`` (equality
    without eps), the same for ``k_hat``; the score is
    ``sum_i g_q[i] g_k[i] q_hat[i] k_hat[i] / sqrt(d_head)``, at most
    ``max_i |g_q[i] g_k[i]| * |q_hat| |k_hat| / sqrt(d_head)`` (Cauchy-Schwarz) ``<= max_i |g_q[i] g_k[i]| * sqrt(d_head)``.

    Raises:
        TypeError: ``attn`` is not a :class:`QKNormAttention`.

    Source: chapter 07.
    """
    if not isinstance(attn, QKNormAttention):
        raise TypeError(f"attn must be a QKNormAttention; got {type(attn).__name__}")
    gains = (attn.q_norm.weight * attn.k_norm.weight).detach().abs().max()
    return float(math.sqrt(attn.config.d_head) * gains)


def reference_params(block: ModernBlock) -> dict[str, np.ndarray]:
    """``block``'s parameters as float64 NumPy arrays in the maths' layout read by
    :func:`selfattn.ref.modern_block` (``W_gate = gate_proj.weight.T`` and so on; ``g_q``, ``g_k``
    only with QK-norm).

    Raises:
        TypeError: ``block`` is not a ModernBlock.

    Source: chapter 07.
    """
    if not isinstance(block, ModernBlock):
        raise TypeError(f"block must be a ModernBlock; got {type(block).__name__}")
    a, f = block.attn, block.ffn
    params = {
        "W_Q": a.W_Q, "W_K": a.W_K, "W_V": a.W_V, "W_O": a.W_O, "g_1": block.norm1.weight,
        "g_2": block.norm2.weight, "W_gate": f.gate_proj.weight.T, "W_up": f.up_proj.weight.T,
        "W_down": f.down_proj.weight.T,
    }  # fmt: skip
    if isinstance(a, QKNormAttention):
        params.update(g_q=a.q_norm.weight, g_k=a.k_norm.weight)
    return {k: v.detach().cpu().double().numpy() for k, v in params.items()}


def llama_state_dict(block: ModernBlock) -> dict[str, torch.Tensor]:
    """``block``'s weights under the names of Hugging Face's ``LlamaDecoderLayer`` (copies).

    Mapping (``nn.Linear`` stores (out, in), ``W_Q`` and the others are (in, out)):
    ``self_attn.{q,k,v,o}_proj.weight = W_{Q,K,V,O}^T``; ``mlp.*`` unchanged (same names);
    ``input_layernorm.weight = norm1.weight``; ``post_attention_layernorm.weight = norm2.weight``.
    Llama applies RoPE inside attention; this block has no positions, so a comparison passes Llama
    the identity rotation (cos = 1, sin = 0).

    Raises:
        TypeError: ``block`` is not a ModernBlock. ValueError: it has QK-norm (Llama has none).

    Source: chapter 07.
    """
    if not isinstance(block, ModernBlock):
        raise TypeError(f"block must be a ModernBlock; got {type(block).__name__}")
    if isinstance(block.attn, QKNormAttention):
        raise ValueError("block has QK-norm, which LlamaDecoderLayer does not have; build it with qk_norm=False")
    a = block.attn
    state = {f"self_attn.{n}_proj.weight": W.T for n, W in (("q", a.W_Q), ("k", a.W_K), ("v", a.W_V), ("o", a.W_O))}
    state.update({f"mlp.{k}": v for k, v in block.ffn.state_dict().items()})
    state.update({"input_layernorm.weight": block.norm1.weight, "post_attention_layernorm.weight": block.norm2.weight})
    return {k: v.detach().clone() for k, v in state.items()}
