"""Multi-head latent attention (MLA): the attention of DeepSeek-V2 and DeepSeek-V3.

Keys and values are not cached per head. Each token is compressed to one latent vector
``c_KV = RMSNorm(x W_DKV)`` of width ``kv_lora_rank`` (r), from which every head's key (its "nope"
part, no positions) and value are re-expanded by the up-projections ``W_UK`` and ``W_UV``. RoPE
cannot act on a key that is re-expanded from a position-free latent (see :func:`mla_decode_absorbed`),
so a small extra key ``k_R = RoPE(x W_KR)`` of width ``qk_rope_head_dim`` (dr), one for all heads,
carries the positions: the cache holds ``r + dr`` numbers per token and layer (claim 35).

Layout of the weights (the maths' layout, ``x @ W``; the fused layout of ``transformers``'
``DeepseekV3Attention`` is documented in :meth:`MultiHeadLatentAttention.from_hf`):

- ``W_DQ`` (D, Rq), ``q_norm``, ``W_UQ`` (Rq, H * (dn + dr)) when ``q_lora_rank`` Rq is set, else
  ``W_Q`` (D, H * (dn + dr));
- ``W_DKV`` (D, r + dr): the latent's down-projection and the RoPE key's projection side by side;
- ``kv_norm`` (r,), ``W_UKV`` (r, H * (dn + dv)): per head, the key up-projection (dn columns) then
  the value up-projection (dv columns);
- ``W_O`` (H * dv, D).

Source: DeepSeek-AI 2024 (DeepSeek-V2), section 2.1, eqs. 9-19; DeepSeek-AI 2024 (DeepSeek-V3),
section 2.1.1; chapter 11b.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from .._validate import require_positive_int, require_tensor, shape_of
from ..attention import scaled_dot_product_attention
from ..masks import causal_mask
from ..modern import RMSNorm
from ..positions import apply_rope

__all__ = [
    "MLAConfig",
    "MLACache",
    "MultiHeadLatentAttention",
    "mla_decode_absorbed",
    "cache_numbers_per_token",
    "mla_flops",
    "absorption_break_even",
    "DEEPSEEK_V3",
]

ROPE_LAYOUTS = ("deepseek", "half")


@dataclass(frozen=True)
class MLAConfig:
    """Sizes of one MLA layer.

    Attributes:
        d_model (D), n_heads (H): positive ints.
        kv_lora_rank (r): width of the cached latent. qk_nope_head_dim (dn): per-head key/query width
            without positions. qk_rope_head_dim (dr): width of the shared RoPE key and of each query's
            RoPE part, even. v_head_dim (dv): per-head value width.
        q_lora_rank (Rq): None for a full-rank query projection, else the width of the query's
            latent (DeepSeek-V3: 1536).
        rope_base: RoPE frequency base. rope_layout: ``"deepseek"`` (pairs (2i, 2i+1) of the
            projection's output, written out de-interleaved, first halves then second halves: what
            DeepSeek's checkpoints and ``transformers``' ``rope_interleave=True`` do) or ``"half"``
            (pairs (i, i + dr/2): Llama's convention).
        eps: the RMSNorms' epsilon.

    Raises:
        TypeError / ValueError: sizes not positive ints, dr odd, an unknown rope_layout, eps <= 0.

    Source: DeepSeek-V2, section 2.1 (d_c = r, d_h^R = dr); chapter 11b.
    """

    d_model: int
    n_heads: int
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    q_lora_rank: int | None = None
    rope_base: float = 10000.0
    rope_layout: str = "deepseek"
    eps: float = 1e-6

    def __post_init__(self):
        for name in ("d_model", "n_heads", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
            object.__setattr__(self, name, require_positive_int(name, getattr(self, name)))
        if self.q_lora_rank is not None:
            object.__setattr__(self, "q_lora_rank", require_positive_int("q_lora_rank", self.q_lora_rank))
        if self.qk_rope_head_dim % 2:
            raise ValueError(f"qk_rope_head_dim must be even (RoPE rotates pairs); got {self.qk_rope_head_dim}")
        if self.rope_layout not in ROPE_LAYOUTS:
            raise ValueError(f"rope_layout must be one of {ROPE_LAYOUTS}; got {self.rope_layout!r}")
        if not (isinstance(self.eps, (int, float)) and math.isfinite(self.eps) and self.eps > 0):
            raise ValueError(f"eps must be a finite number > 0; got {self.eps!r}")

    @property
    def qk_head_dim(self) -> int:
        """dn + dr: the width of a query and of a key per head (the scores' scale is its root)."""
        return self.qk_nope_head_dim + self.qk_rope_head_dim


DEEPSEEK_V3 = MLAConfig(d_model=7168, n_heads=128, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64,
                        v_head_dim=128, q_lora_rank=1536)
"""DeepSeek-V3's attention sizes (61 layers of it): the defaults of ``transformers``' ``DeepseekV3Config``
and DeepSeek-V3's technical report, section 4.2 (d_c = 512, d_h^R = 64, 128 heads of 128)."""


@dataclass
class MLACache:
    """What an MLA layer caches: ``latent`` (B, S, r), the normed c_KV of each token, and
    ``k_rope`` (B, S, dr), the RoPE key of each token, already rotated to its position."""

    latent: torch.Tensor
    k_rope: torch.Tensor

    @property
    def length(self) -> int:
        return self.latent.shape[1]

    def append(self, latent: torch.Tensor, k_rope: torch.Tensor) -> MLACache:
        return MLACache(torch.cat([self.latent, latent], dim=1), torch.cat([self.k_rope, k_rope], dim=1))


def _rope(x: torch.Tensor, positions: torch.Tensor, base: float, layout: str) -> torch.Tensor:
    """RoPE on the last axis of ``x`` (..., T, dr) in the given layout (see :class:`MLAConfig`)."""
    if layout == "deepseek":  # pairs (2i, 2i+1), written out de-interleaved: [evens, odds]
        x = torch.cat([x[..., 0::2], x[..., 1::2]], dim=-1)
    return apply_rope(x, positions, base=base, layout="half")


class MultiHeadLatentAttention(nn.Module):
    """Causal multi-head latent attention with a latent KV cache.

    Shapes:
        forward(x: (B, T, D), cache: MLACache | None, keep: optional (B, T, S) bool) ->
        (out (B, T, D), cache with S = previous length + T). Positions run from the cache's length;
        ``keep`` (True = may attend) is ANDed with the causal mask (DeepSeek-V3.2's top-k selection
        enters this way).

    Raises:
        TypeError / ValueError: ``config`` not an MLAConfig; at call time ``x`` not a (B, T, D)
        floating tensor of the parameters' dtype, a cache of another batch size or width, a ``keep``
        of the wrong shape or not bool.

    Source: DeepSeek-V2, section 2.1, eqs. 9-19 (the decoupled RoPE: eqs. 14-19); chapter 11b.
    """

    def __init__(self, config: MLAConfig):
        super().__init__()
        if not isinstance(config, MLAConfig):
            raise TypeError(f"config must be an MLAConfig; got {type(config).__name__}")
        c = self.config = config
        H, D, r = c.n_heads, c.d_model, c.kv_lora_rank

        def p(*shape):
            return nn.Parameter(torch.randn(*shape) / math.sqrt(shape[0]))

        if c.q_lora_rank is None:
            self.W_Q = p(D, H * c.qk_head_dim)
        else:
            self.W_DQ, self.q_norm, self.W_UQ = p(D, c.q_lora_rank), RMSNorm(c.q_lora_rank, c.eps), p(c.q_lora_rank, H * c.qk_head_dim)
        self.W_DKV = p(D, r + c.qk_rope_head_dim)
        self.kv_norm = RMSNorm(r, c.eps)
        self.W_UKV = p(r, H * (c.qk_nope_head_dim + c.v_head_dim))
        self.W_O = p(H * c.v_head_dim, D)

    # ---- the pieces -------------------------------------------------------------------------------
    def queries(self, x: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(q_nope (B, H, T, dn), q_rope (B, H, T, dr))``, the RoPE part rotated to ``positions``."""
        c = self.config
        B, T, _ = x.shape
        q = x @ self.W_Q if c.q_lora_rank is None else self.q_norm(x @ self.W_DQ) @ self.W_UQ  # (B, T, H*(dn+dr))
        q = q.view(B, T, c.n_heads, c.qk_head_dim).transpose(1, 2)  # (B, H, T, dn+dr)
        q_nope, q_rope = q.split([c.qk_nope_head_dim, c.qk_rope_head_dim], dim=-1)
        return q_nope, _rope(q_rope, positions, c.rope_base, c.rope_layout)

    def compress(self, x: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """What the cache stores for ``x`` (B, T, D): ``(latent (B, T, r), k_rope (B, T, dr))``."""
        c = self.config
        latent, k_rope = (x @ self.W_DKV).split([c.kv_lora_rank, c.qk_rope_head_dim], dim=-1)  # (B, T, r), (B, T, dr)
        return self.kv_norm(latent), _rope(k_rope, positions, c.rope_base, c.rope_layout)

    def expand(self, cache: MLACache) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-head keys (B, H, S, dn + dr) and values (B, H, S, dv) from the cache: the latent
        up-projected, and the one RoPE key repeated for every head."""
        c = self.config
        B, S, _ = cache.latent.shape
        kv = (cache.latent @ self.W_UKV).view(B, S, c.n_heads, -1).transpose(1, 2)  # (B, H, S, dn+dv)
        k_nope, v = kv.split([c.qk_nope_head_dim, c.v_head_dim], dim=-1)
        k_rope = cache.k_rope[:, None].expand(B, c.n_heads, S, c.qk_rope_head_dim)  # shared by all heads
        return torch.cat([k_nope, k_rope], dim=-1), v

    def forward(self, x: torch.Tensor, cache: MLACache | None = None, keep: torch.Tensor | None = None):
        c = self.config
        require_tensor("x", x)
        if x.ndim != 3 or x.shape[-1] != c.d_model or x.dtype != self.W_DKV.dtype:
            raise ValueError(f"x must be (B, T, D={c.d_model}) of dtype {self.W_DKV.dtype}; got {shape_of(x)} {x.dtype}")
        B, T, _ = x.shape
        past = 0 if cache is None else cache.length
        if cache is not None and (cache.latent.shape[0] != B or cache.latent.shape[-1] != c.kv_lora_rank):
            raise ValueError(f"cache must hold (B={B}, S, r={c.kv_lora_rank}) latents; got {shape_of(cache.latent)}")
        positions = torch.arange(past, past + T)
        q_nope, q_rope = self.queries(x, positions)
        latent, k_rope = self.compress(x, positions)
        cache = MLACache(latent, k_rope) if cache is None else cache.append(latent, k_rope)
        k, v = self.expand(cache)  # (B, H, S, dn+dr), (B, H, S, dv)
        mask = causal_mask(T, cache.length, alignment="bottom_right")  # (T, S)
        if keep is not None:
            require_tensor("keep", keep)
            if keep.dtype != torch.bool or keep.shape != (B, T, cache.length):
                raise ValueError(f"keep must be a bool (B, T, S)=({B}, {T}, {cache.length}) mask; got {shape_of(keep)} {keep.dtype}")
            mask = mask & keep[:, None]  # (B, 1, T, S)
        q = torch.cat([q_nope, q_rope], dim=-1)  # (B, H, T, dn+dr)
        context = scaled_dot_product_attention(q, k, v, mask, scale=c.qk_head_dim ** -0.5)  # (B, H, T, dv)
        return context.transpose(1, 2).reshape(B, T, -1) @ self.W_O, cache  # (B, T, H*dv) @ (H*dv, D)

    # ---- conversion -------------------------------------------------------------------------------
    @classmethod
    def from_hf(cls, attn, config: MLAConfig) -> MultiHeadLatentAttention:
        """Copy the weights of a ``transformers`` ``DeepseekV3Attention`` (or ``DeepseekV32Attention``).

        Its ``nn.Linear`` weights are (out, in): ours are their transposes. ``q_a_proj`` -> ``W_DQ``,
        ``q_a_layernorm`` -> ``q_norm``, ``q_b_proj`` -> ``W_UQ`` (or ``q_proj`` -> ``W_Q``);
        ``kv_a_proj_with_mqa`` -> ``W_DKV`` (latent columns, then RoPE-key columns); ``kv_a_layernorm``
        -> ``kv_norm``; ``kv_b_proj`` -> ``W_UKV`` (per head: dn key columns, then dv value columns);
        ``o_proj`` -> ``W_O``. Biases are refused (DeepSeek has none: ``attention_bias=False``).

        Raises:
            ValueError: a projection with a bias, or a shape that does not match ``config``.
        """
        mine = cls(config)
        pairs = [("W_DKV", attn.kv_a_proj_with_mqa), ("W_UKV", attn.kv_b_proj), ("W_O", attn.o_proj)]
        pairs += [("W_Q", attn.q_proj)] if config.q_lora_rank is None else [("W_DQ", attn.q_a_proj), ("W_UQ", attn.q_b_proj)]
        with torch.no_grad():
            for name, linear in pairs:
                if linear.bias is not None:
                    raise ValueError(f"{name}'s source has a bias; MLA here has none")
                target = getattr(mine, name)
                if target.shape != linear.weight.T.shape:
                    raise ValueError(f"{name} is {tuple(target.shape)}; the source weight is {tuple(linear.weight.T.shape)}")
                target.data = linear.weight.detach().T.clone()
            mine.kv_norm.weight.data = attn.kv_a_layernorm.weight.detach().clone()
            if config.q_lora_rank is not None:
                mine.q_norm.weight.data = attn.q_a_layernorm.weight.detach().clone()
        return mine.to(attn.o_proj.weight.dtype)


def mla_decode_absorbed(mla: MultiHeadLatentAttention, x: torch.Tensor, cache: MLACache):
    """One decode step computed on the latent itself: ``W_UK`` absorbed into the query and ``W_UV``
    into the output, so no per-head key or value is ever expanded.

    The nope score of head h is ``q_h^T (W_UK,h^T c_j) = (W_UK,h q_h)^T c_j``: the query is moved into
    latent space once, and scores are taken against the cached latents directly. The context
    ``sum_j w_j W_UV,h^T c_j = W_UV,h^T (sum_j w_j c_j)`` is likewise formed in latent space and
    expanded once. The RoPE part cannot be absorbed: between ``W_UK`` and the query would sit the
    rotation R(m - n), which depends on the key's position, so no single matrix can be folded in
    (DeepSeek-V2, section 2.1.3); it is scored separately, against the one shared ``k_rope``.

    Args:
        mla: the layer. x: (B, 1, D) the new token. cache: the cache before it.

    Returns:
        ``(out (B, 1, D), cache with the token appended)``, equal to ``mla(x, cache)`` to rounding.

    Raises:
        ValueError: ``x`` not (B, 1, D), a cache of another batch size.

    Source: DeepSeek-V2, section 2.1.2 (absorbing W^UK into W^Q and W^UV into W^O); chapter 11b.
    """
    c = mla.config
    require_tensor("x", x)
    if x.ndim != 3 or x.shape[1] != 1 or x.shape[2] != c.d_model or cache.latent.shape[0] != x.shape[0]:
        raise ValueError(f"x must be (B, 1, D={c.d_model}) with the cache's batch size; got {shape_of(x)}")
    H, r, dn = c.n_heads, c.kv_lora_rank, c.qk_nope_head_dim
    positions = torch.arange(cache.length, cache.length + 1)
    q_nope, q_rope = mla.queries(x, positions)  # (B, H, 1, dn), (B, H, 1, dr)
    latent, k_rope = mla.compress(x, positions)
    cache = cache.append(latent, k_rope)
    W = mla.W_UKV.view(r, H, dn + c.v_head_dim)  # (r, H, dn+dv)
    W_UK, W_UV = W[..., :dn].permute(1, 0, 2), W[..., dn:].permute(1, 0, 2)  # (H, r, dn), (H, r, dv)
    q_latent = q_nope @ W_UK.transpose(1, 2)  # (B, H, 1, dn) @ (H, dn, r) -> (B, H, 1, r)
    scores = q_latent @ cache.latent[:, None].transpose(-1, -2)  # (B, H, 1, r) @ (B, 1, r, S) -> (B, H, 1, S)
    scores = scores + q_rope @ cache.k_rope[:, None].transpose(-1, -2)  # + (B, H, 1, dr) @ (B, 1, dr, S)
    weights = torch.softmax(scores * c.qk_head_dim ** -0.5, dim=-1)  # the new token sees the whole cache
    context_latent = weights @ cache.latent[:, None]  # (B, H, 1, S) @ (B, 1, S, r) -> (B, H, 1, r)
    W_OV = W_UV @ mla.W_O.view(H, c.v_head_dim, c.d_model)  # (H, r, dv) @ (H, dv, D) -> (H, r, D): W_UV absorbed
    out = torch.einsum("bhtr,hrd->btd", context_latent, W_OV)  # sum over heads -> (B, 1, D)
    return out, cache


def cache_numbers_per_token(config: MLAConfig, kind: str = "mla", *, n_kv_heads: int | None = None) -> int:
    """Numbers cached per token and layer.

    ``"mla"``: ``r + dr`` (the latent and the shared RoPE key). ``"mha"``: ``H * (dn + dr + dv)``
    (every head's full key and value, the same heads and head widths). ``"gqa"``: ``n_kv_heads * (dn +
    dr + dv)``.

    Raises:
        ValueError: an unknown ``kind``; ``n_kv_heads`` missing for ``"gqa"`` or not dividing H.

    Source: DeepSeek-V2, section 2.1.4 and Table 1; claim 35; chapter 11b.
    """
    if kind == "mla":
        return config.kv_lora_rank + config.qk_rope_head_dim
    width = config.qk_head_dim + config.v_head_dim
    if kind == "mha":
        return config.n_heads * width
    if kind == "gqa":
        g = require_positive_int("n_kv_heads", n_kv_heads)
        if config.n_heads % g:
            raise ValueError(f"n_kv_heads={g} must divide n_heads={config.n_heads}")
        return g * width
    raise ValueError(f"kind must be 'mla', 'mha' or 'gqa'; got {kind!r}")


def mla_flops(config: MLAConfig, n_queries: int, n_keys: int, *, absorbed: bool) -> int:
    """Attention FLOPs (a multiply-add = 2) of one layer for ``n_queries`` queries over ``n_keys``
    cached tokens, from the cache's contents (the query and output projections of W_Q and W_O
    left out: they are the same in both ways, except where stated).

    Unabsorbed: expand every cached latent to keys and values, ``2 S r H (dn + dv)``, then attend per
    head, ``2 T S H (dn + dr)`` for the scores and ``2 T S H dv`` for the context. Absorbed: move
    each query into latent space, ``2 T H dn r``, score against the latents and the RoPE key, ``2 T S
    H (r + dr)``, form the latent context, ``2 T S H r``, and expand it once per query, ``2 T H r dv``.

    Raises:
        TypeError / ValueError: counts not positive ints.

    Source: counted from :class:`MultiHeadLatentAttention` and :func:`mla_decode_absorbed`; chapter 11b.
    """
    T, S = require_positive_int("n_queries", n_queries), require_positive_int("n_keys", n_keys)
    c = config
    H, r, dn, dr, dv = c.n_heads, c.kv_lora_rank, c.qk_nope_head_dim, c.qk_rope_head_dim, c.v_head_dim
    if absorbed:
        return 2 * T * H * dn * r + 2 * T * S * H * (r + dr) + 2 * T * S * H * r + 2 * T * H * r * dv
    return 2 * S * r * H * (dn + dv) + 2 * T * S * H * (dn + dr) + 2 * T * S * H * dv


def absorption_break_even(config: MLAConfig, n_keys: int) -> int:
    """The smallest number of queries per block at which the unabsorbed way (expand the cache once,
    then attend) costs fewer FLOPs than the absorbed way, over ``n_keys`` cached tokens; counted by
    :func:`mla_flops` (raises as it does)."""
    T = 1
    while mla_flops(config, T, n_keys, absorbed=True) <= mla_flops(config, T, n_keys, absorbed=False):
        T *= 2
    lo, hi = T // 2, T  # absorbed no dearer at lo (or lo = 0), dearer at hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if mla_flops(config, mid, n_keys, absorbed=True) <= mla_flops(config, mid, n_keys, absorbed=False):
            lo = mid
        else:
            hi = mid
    return hi
