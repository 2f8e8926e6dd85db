"""Learned attention sinks: a per-head logit in the softmax's denominator (gpt-oss), chapter 11c.

A softmax row must sum to one, so a head that has nothing to read must still put its weight
somewhere. Trained models park it on the first token (the "attention sink" of Xiao et al. 2023,
StreamingLLM, section 3.1). gpt-oss (OpenAI 2025, model card, its attention section) gives each head a learned
logit ``s_h`` that joins the row's scores in the denominator and has no value:

    weights[i, j] = exp(scores[i, j]) / (exp(s_h) + sum_j' exp(scores[i, j']))

so a row sums to ``1 - p_sink`` with ``p_sink = exp(s_h) / (exp(s_h) + sum_j' exp(scores[i, j']))``:
the head can give weight to nothing. It is exactly attention with one extra key whose score is
``s_h`` and whose value is zero, which is how :func:`sink_attention` computes it (through the
course's :func:`~selfattn.attention.scaled_dot_product_attention`, so its mask and NaN contracts
hold unchanged). :class:`SinkAttention` is gpt-oss's attention layer (grouped-query, biased
projections, RoPE in the half layout, an optional sliding window) built on it, with
:meth:`SinkAttention.from_hf` reading ``transformers``' ``GptOssAttention`` (tested equal).

Introduced in chapter 11c; the sliding window and StreamingLLM's kept first tokens are chapter 11's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from ._validate import require_positive_int, require_rank, require_tensor, shape_of
from .attention import scaled_dot_product_attention
from .gqa import repeat_kv
from .masks import causal_mask
from .positions import apply_rope

__all__ = ["sink_attention", "SinkAttentionConfig", "SinkAttention"]


def _require_sink_logits(sink_logits, q: torch.Tensor) -> torch.Tensor:
    require_tensor("sink_logits", sink_logits)
    H = q.shape[-3] if q.dim() >= 3 else 1
    if sink_logits.dim() != 1 or sink_logits.shape[0] != H:
        raise ValueError(f"sink_logits must have shape (H,) = ({H},), one logit per head of q "
                         f"{shape_of(q)}; got {shape_of(sink_logits)}")
    if not sink_logits.dtype.is_floating_point:
        raise TypeError(f"sink_logits must be a floating tensor; got dtype {sink_logits.dtype}")
    if not bool(torch.isfinite(sink_logits).all()):
        raise ValueError(f"sink_logits must be finite (a -inf sink is plain attention: call "
                         f"scaled_dot_product_attention); got {sink_logits.tolist()}")
    return sink_logits


def sink_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sink_logits: torch.Tensor,
                   mask: torch.Tensor | None = None, *, scale: float | None = None,
                   return_weights: bool = False):
    """Scaled dot-product attention with a learned sink logit per head in the softmax's denominator.

    Args:
        q: (B, H, T, Dh); k: (B, H, S, Dh); v: (B, H, S, Dv), floating, one dtype.
        sink_logits: (H,) finite floats, ``s_h`` (gpt-oss's ``sinks`` parameter).
        mask: optional bool keep-mask broadcastable to (B, H, T, S) (True = may attend).
        scale: score multiplier, default ``1 / sqrt(Dh)``.
        return_weights: also return the weights on the S keys.

    Returns:
        ``context`` (B, H, T, Dv); with ``return_weights`` also ``weights`` (B, H, T, S), whose rows
        sum to ``1 - p_sink`` (< 1). A query that sees no key gives all its weight to the sink: a
        zero weight row and a zero output row, never NaN.

    Raises:
        TypeError / ValueError: everything :func:`~selfattn.attention.scaled_dot_product_attention`
        refuses; q not of rank 4; ``sink_logits`` not a finite (H,) float tensor.

    Source: OpenAI 2025, gpt-oss model card (learned attention sinks);
    ``transformers``' ``GptOssAttention`` (tested equal); chapter 11c.
    """
    require_tensor("q", q)
    require_rank("q", q, 4, "(B, H, T, Dh)")
    sink_logits = _require_sink_logits(sink_logits, q)
    B, H, T, _ = q.shape
    # The sink is one more key: score s_h (a zero key plus a bias), value zero, visible to every query.
    k_ext = torch.cat([k, k.new_zeros(*k.shape[:-2], 1, k.shape[-1])], dim=-2)  # (B, H, S + 1, Dh)
    v_ext = torch.cat([v, v.new_zeros(*v.shape[:-2], 1, v.shape[-1])], dim=-2)  # (B, H, S + 1, Dv)
    S = k.shape[-2]
    half = q.dtype in (torch.float16, torch.bfloat16)  # scores are float32 then (the course's contract)
    bias = torch.zeros(1, H, 1, S + 1, dtype=torch.float32 if half else q.dtype, device=q.device)
    bias[..., -1] = sink_logits.to(bias.dtype).view(1, H, 1)  # (1, H, 1, S + 1): s_h on the sink column
    mask_ext = None
    if mask is not None:
        if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
            scaled_dot_product_attention(q, k, v, mask)  # raises the course's own error for a bad mask
        try:
            full = mask.expand(B, H, T, S)
        except RuntimeError:
            scaled_dot_product_attention(q, k, v, mask)  # raises the course's own error
            raise
        mask_ext = torch.cat([full, full.new_ones(B, H, T, 1)], dim=-1)  # (B, H, T, S + 1): sink always visible
    context, weights = scaled_dot_product_attention(q, k_ext, v_ext, mask_ext, bias=bias, scale=scale,
                                                    return_weights=True)
    return (context, weights[..., :-1]) if return_weights else context


@dataclass(frozen=True)
class SinkAttentionConfig:
    """Sizes of a gpt-oss attention layer, validated at construction.

    Attributes:
        d_model: D (> 0). n_heads: H (> 0). n_kv_heads: Hkv (> 0, divides H). d_head: Dh (> 0, even:
            RoPE). rope_base: RoPE's frequency base (> 1). sliding_window: None (a global layer) or
            W > 0 (each query reads itself and the W - 1 keys before it, as ``transformers``' mask
            for ``sliding_window=W``). bias: biases on the four projections (gpt-oss: True).

    Raises:
        TypeError / ValueError: a size that is not a positive int, H not divisible by Hkv, an odd
        Dh, a bad ``rope_base`` or ``sliding_window``.
    """

    d_model: int
    n_heads: int
    n_kv_heads: int
    d_head: int
    rope_base: float = 10000.0
    sliding_window: int | None = None
    bias: bool = True

    def __post_init__(self):
        for name in ("d_model", "n_heads", "n_kv_heads", "d_head"):
            require_positive_int(name, getattr(self, name))
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_heads ({self.n_heads}) must be divisible by n_kv_heads ({self.n_kv_heads})")
        if self.d_head % 2:
            raise ValueError(f"d_head must be even (RoPE rotates pairs); got {self.d_head}")
        if not isinstance(self.rope_base, (int, float)) or not (math.isfinite(self.rope_base) and self.rope_base > 1):
            raise ValueError(f"rope_base must be a finite number > 1; got {self.rope_base!r}")
        if self.sliding_window is not None:
            require_positive_int("sliding_window", self.sliding_window)


class SinkAttention(nn.Module):
    """gpt-oss's attention layer: grouped-query attention with RoPE and a learned sink logit per head.

    Weights in the maths' layout (``X @ W``): ``W_Q`` (D, H*Dh), ``W_K`` and ``W_V`` (D, Hkv*Dh),
    ``W_O`` (H*Dh, D), biases ``b_Q``, ``b_K``, ``b_V``, ``b_O``; ``sinks`` (H,). Input (B, T, D) at
    positions ``start .. start + T - 1``; causal, and banded when ``config.sliding_window`` is set.

    Source: OpenAI 2025, gpt-oss model card; ``transformers``' ``GptOssAttention``.
    """

    def __init__(self, config: SinkAttentionConfig, generator: torch.Generator | None = None):
        super().__init__()
        self.config = c = config
        D, Hq, Hkv = c.d_model, c.n_heads * c.d_head, c.n_kv_heads * c.d_head

        def init(*shape):
            return nn.Parameter(torch.randn(*shape, generator=generator) / math.sqrt(shape[0]))

        self.W_Q, self.W_K, self.W_V, self.W_O = init(D, Hq), init(D, Hkv), init(D, Hkv), init(Hq, D)
        zeros = (lambda n: nn.Parameter(torch.zeros(n))) if c.bias else (lambda n: None)
        self.b_Q, self.b_K, self.b_V, self.b_O = zeros(Hq), zeros(Hkv), zeros(Hkv), zeros(D)
        self.sinks = nn.Parameter(torch.zeros(c.n_heads))

    def keep_mask(self, T: int, start: int = 0) -> torch.Tensor:
        """(T, T) bool: causal, and for a sliding window only the last ``sliding_window`` keys."""
        keep = causal_mask(T)
        if self.config.sliding_window is not None:
            i = torch.arange(T)
            keep = keep & (i[:, None] - i[None, :] < self.config.sliding_window)
        return keep

    def project(self, x: torch.Tensor, start: int = 0):
        """(B, T, D) -> q, k, v (B, H, T, Dh): projected, RoPE on q and k, kv heads repeated per group."""
        require_tensor("x", x)
        require_rank("x", x, 3, "(B, T, D)")
        c = self.config
        B, T, _ = x.shape

        def proj(W, b, n):  # (B, T, D) @ (D, n*Dh) -> (B, T, n, Dh) -> (B, n, T, Dh)
            y = x @ W if b is None else x @ W + b
            return y.view(B, T, n, c.d_head).transpose(1, 2)

        positions = torch.arange(start, start + T)
        q = apply_rope(proj(self.W_Q, self.b_Q, c.n_heads), positions, base=c.rope_base, layout="half")
        k = apply_rope(proj(self.W_K, self.b_K, c.n_kv_heads), positions, base=c.rope_base, layout="half")
        v = proj(self.W_V, self.b_V, c.n_kv_heads)
        group = c.n_heads // c.n_kv_heads
        return q, repeat_kv(k, group), repeat_kv(v, group)  # the cache would hold only the Hkv heads

    def output(self, context: torch.Tensor) -> torch.Tensor:
        """context (B, H, T, Dh) -> out (B, T, D): heads merged, then W_O."""
        B, H, T, Dh = context.shape
        out = context.transpose(1, 2).reshape(B, T, H * Dh) @ self.W_O  # (B, T, H*Dh) @ (H*Dh, D) -> (B, T, D)
        return out if self.b_O is None else out + self.b_O

    def forward(self, x: torch.Tensor, *, start: int = 0, return_weights: bool = False):
        """(B, T, D) at positions ``start ..`` -> out (B, T, D) [, weights (B, H, T, T), rows summing to < 1]."""
        q, k, v = self.project(x, start)
        keep = self.keep_mask(x.shape[1]).to(x.device)  # (T, T)
        context, weights = sink_attention(q, k, v, self.sinks, keep, return_weights=True)
        out = self.output(context)
        return (out, weights) if return_weights else out

    @classmethod
    def from_hf(cls, hf_attention) -> SinkAttention:
        """Copy ``transformers``' ``GptOssAttention`` (its ``nn.Linear`` weights are (out, in): transposed)."""
        cfg = hf_attention.config
        params = getattr(cfg, "rope_parameters", None) or {}
        base = float(params.get("rope_theta", getattr(cfg, "rope_theta", 10000.0)))
        config = SinkAttentionConfig(
            d_model=cfg.hidden_size, n_heads=cfg.num_attention_heads, n_kv_heads=cfg.num_key_value_heads,
            d_head=hf_attention.head_dim, rope_base=base, sliding_window=hf_attention.sliding_window,
            bias=hf_attention.q_proj.bias is not None)
        layer = cls(config).to(hf_attention.q_proj.weight.dtype)  # before the copy: float64 stays float64
        with torch.no_grad():
            for ours, theirs in (("Q", hf_attention.q_proj), ("K", hf_attention.k_proj),
                                 ("V", hf_attention.v_proj), ("O", hf_attention.o_proj)):
                getattr(layer, f"W_{ours}").copy_(theirs.weight.T)
                if theirs.bias is not None:
                    getattr(layer, f"b_{ours}").copy_(theirs.bias)
            layer.sinks.copy_(hf_attention.sinks)
        return layer
