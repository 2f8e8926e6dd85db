"""Local and global layers: Gemma 3's stack of sliding-window and global layers, and Longformer's
global tokens in a band.

Gemma 3 repeats ``ratio`` sliding-window ("local") layers then one global layer (5:1, window 1024
tokens); a local layer's cache need hold only the last ``window`` tokens, so at long context the
cache shrinks to about ``global share + (1 - global share) x window / T`` of an all-global stack
(claim 37). Longformer keeps a band of width ``2w + 1`` around each token and lets a few chosen
"global" tokens see, and be seen by, every token: as a ``mask_mod`` it runs through the course's
tiled kernel, whose tiles outside band and global rows/columns are skipped.

Source: Gemma Team 2025 (Gemma 3 technical report), section 2 (5:1 interleaving, 1024-token window);
Beltagy et al. 2020 (Longformer), section 3.1; ``transformers``' ``sliding_window_overlay`` (the
window's exact semantics: key j is seen by query i when ``i - window < j <= i``); chapter 11b.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from .._validate import require_positive_int, require_tensor, shape_of
from ..attention import scaled_dot_product_attention
from ..efficient.variants import sliding_window_mask
from ..gqa import repeat_kv
from ..masks import causal_mask
from ..modern import RMSNorm
from ..positions import apply_rope

__all__ = [
    "layer_types",
    "layer_keep_mask",
    "hybrid_kv_fraction",
    "hybrid_kv_bytes",
    "LocalGlobalConfig",
    "LocalGlobalAttention",
    "longformer_mask_mod",
]

LOCAL, GLOBAL = "sliding_attention", "full_attention"  # the names transformers' Gemma 3 config uses


def layer_types(n_layers: int, ratio: int = 5) -> list[str]:
    """The kind of each layer of a stack with ``ratio`` local layers per global one: layer i
    (0-based) is global when ``(i + 1) % (ratio + 1) == 0``, as Gemma 3 (``ratio=5``: layers 5, 11, ...).
    ``ratio=0`` gives an all-global stack.

    Raises: TypeError / ValueError: ``n_layers`` not a positive int, ``ratio`` not an int >= 0.

    Source: Gemma 3 report, section 2; ``Gemma3TextConfig.layer_types``; chapter 11b.
    """
    n_layers = require_positive_int("n_layers", n_layers)
    if isinstance(ratio, bool) or not isinstance(ratio, int) or ratio < 0:
        raise ValueError(f"ratio must be an int >= 0 (local layers per global layer); got {ratio!r}")
    return [GLOBAL if (i + 1) % (ratio + 1) == 0 else LOCAL for i in range(n_layers)]


def layer_keep_mask(kind: str, T: int, window: int) -> torch.Tensor:
    """Keep-mask (T, T) of a layer: causal for ``"full_attention"``; for ``"sliding_attention"``
    query i sees keys ``i - window < j <= i`` (``window`` keys, itself included).

    Raises: ValueError: an unknown ``kind``; sizes not positive ints.

    Source: ``transformers.masking_utils.sliding_window_causal_mask_function``; chapter 09's
    :func:`selfattn.efficient.variants.sliding_window_mask`; chapter 11b.
    """
    if kind == GLOBAL:
        return causal_mask(require_positive_int("T", T))
    if kind == LOCAL:
        return sliding_window_mask(T, window, causal=True)
    raise ValueError(f"kind must be {LOCAL!r} or {GLOBAL!r}; got {kind!r}")


def hybrid_kv_fraction(n_tokens: int, window: int, ratio: int = 5) -> float:
    """Cache of the hybrid over the cache of an all-global stack, at ``n_tokens`` tokens, in the
    limit of many layers: ``g + (1 - g) min(window, T) / T`` with ``g = 1 / (ratio + 1)``.

    Raises: TypeError / ValueError: sizes not positive ints, ``ratio`` < 0. Source: claim 37.
    """
    T, window = require_positive_int("n_tokens", n_tokens), require_positive_int("window", window)
    if isinstance(ratio, bool) or not isinstance(ratio, int) or ratio < 0:
        raise ValueError(f"ratio must be an int >= 0; got {ratio!r}")
    g = 1 / (ratio + 1)
    return g + (1 - g) * min(window, T) / T


def hybrid_kv_bytes(kinds: list[str], n_tokens: int, window: int, *, n_kv_heads: int, d_head: int,
                    bytes_per_number: float = 2) -> int:
    """Bytes of the KV cache of one sequence after ``n_tokens`` tokens through layers of the given
    kinds: each global layer holds every token, each local layer at most ``window`` (a rolling
    buffer), each token ``2 x n_kv_heads x d_head`` numbers.

    Raises: TypeError / ValueError: sizes not positive ints, an unknown kind. Source: claims 25, 37.
    """
    T, window = require_positive_int("n_tokens", n_tokens), require_positive_int("window", window)
    per_token = 2 * require_positive_int("n_kv_heads", n_kv_heads) * require_positive_int("d_head", d_head)
    total = 0
    for i, kind in enumerate(kinds):
        if kind not in (LOCAL, GLOBAL):
            raise ValueError(f"kinds[{i}] must be {LOCAL!r} or {GLOBAL!r}; got {kind!r}")
        total += (T if kind == GLOBAL else min(window, T)) * per_token
    return int(total * bytes_per_number)


@dataclass(frozen=True)
class LocalGlobalConfig:
    """Sizes of one Gemma-3-style attention layer (grouped-query, QK-norm, RoPE per layer kind).

    Attributes:
        d_model, n_heads, n_kv_heads (dividing n_heads), d_head: positive ints.
        kind: ``"sliding_attention"`` or ``"full_attention"``. window: the local layers' window.
        query_pre_attn_scalar: scores are scaled by its inverse root (Gemma 3: 256 = d_head at 4B).
        local_base, global_base: RoPE bases of local and global layers (Gemma 3: 10k and 1M).
        eps: the QK-norms' epsilon.

    Raises: TypeError / ValueError: bad sizes, an unknown kind.

    Source: Gemma 3 report, section 2; ``Gemma3TextConfig``; chapter 11b.
    """

    d_model: int
    n_heads: int
    n_kv_heads: int
    d_head: int
    kind: str = LOCAL
    window: int = 1024
    query_pre_attn_scalar: float = 256
    local_base: float = 10_000.0
    global_base: float = 1_000_000.0
    eps: float = 1e-6

    def __post_init__(self):
        for name in ("d_model", "n_heads", "n_kv_heads", "d_head", "window"):
            object.__setattr__(self, name, require_positive_int(name, getattr(self, name)))
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_kv_heads={self.n_kv_heads} must divide n_heads={self.n_heads}")
        if self.kind not in (LOCAL, GLOBAL):
            raise ValueError(f"kind must be {LOCAL!r} or {GLOBAL!r}; got {self.kind!r}")


class LocalGlobalAttention(nn.Module):
    """One layer of a Gemma-3-style stack: grouped-query attention with RMS-normed queries and keys,
    RoPE at the layer kind's base, and the layer kind's mask.

    Shapes: forward(x (B, T, D)) -> (B, T, D). Weights W_Q (D, H Dh), W_K and W_V (D, Hkv Dh),
    W_O (H Dh, D).

    Raises: TypeError / ValueError: ``config`` not a LocalGlobalConfig; ``x`` not (B, T, D).

    Source: Gemma 3 report, section 2 (QK-norm, 5:1 local/global, RoPE bases); chapter 11b.
    """

    def __init__(self, config: LocalGlobalConfig):
        super().__init__()
        if not isinstance(config, LocalGlobalConfig):
            raise TypeError(f"config must be a LocalGlobalConfig; got {type(config).__name__}")
        c = self.config = config
        D, H, Hkv, Dh = c.d_model, c.n_heads, c.n_kv_heads, c.d_head
        self.W_Q = nn.Parameter(torch.randn(D, H * Dh) / math.sqrt(D))
        self.W_K = nn.Parameter(torch.randn(D, Hkv * Dh) / math.sqrt(D))
        self.W_V = nn.Parameter(torch.randn(D, Hkv * Dh) / math.sqrt(D))
        self.W_O = nn.Parameter(torch.randn(H * Dh, D) / math.sqrt(H * Dh))
        self.q_norm, self.k_norm = RMSNorm(Dh, c.eps), RMSNorm(Dh, c.eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        c = self.config
        require_tensor("x", x)
        if x.ndim != 3 or x.shape[-1] != c.d_model:
            raise ValueError(f"x must be (B, T, D={c.d_model}); got {shape_of(x)}")
        B, T, _ = x.shape
        base = c.local_base if c.kind == LOCAL else c.global_base
        positions = torch.arange(T)

        def heads(w, n):  # (B, T, D) @ (D, n*Dh) -> (B, n, T, Dh)
            return (x @ w).view(B, T, n, c.d_head).transpose(1, 2)

        q = apply_rope(self.q_norm(heads(self.W_Q, c.n_heads)), positions, base=base)
        k = apply_rope(self.k_norm(heads(self.W_K, c.n_kv_heads)), positions, base=base)
        v = heads(self.W_V, c.n_kv_heads)
        rep = c.n_heads // c.n_kv_heads
        k, v = repeat_kv(k, rep), repeat_kv(v, rep)  # (B, H, T, Dh)
        keep = layer_keep_mask(c.kind, T, c.window)  # (T, T)
        context = scaled_dot_product_attention(q, k, v, keep, scale=c.query_pre_attn_scalar ** -0.5)
        return context.transpose(1, 2).reshape(B, T, -1) @ self.W_O  # (B, T, H*Dh) @ (H*Dh, D)

    @classmethod
    def from_hf(cls, attn, config: LocalGlobalConfig) -> LocalGlobalAttention:
        """Copy a ``transformers`` ``Gemma3Attention``: projections transposed; Gemma's RMSNorm scales
        by ``1 + weight``, so our gain is ``1 + weight``."""
        mine = cls(config)
        with torch.no_grad():
            for name, lin in (("W_Q", attn.q_proj), ("W_K", attn.k_proj), ("W_V", attn.v_proj), ("W_O", attn.o_proj)):
                getattr(mine, name).data = lin.weight.detach().T.clone()
            mine.q_norm.weight.data = 1 + attn.q_norm.weight.detach()
            mine.k_norm.weight.data = 1 + attn.k_norm.weight.detach()
        return mine.to(attn.q_proj.weight.dtype)


def longformer_mask_mod(one_sided: int, global_positions):
    """Longformer's pattern as a mask_mod: query i sees key j when ``|i - j| <= one_sided`` (a band
    of ``2 one_sided + 1`` keys, bidirectional as in the encoder), or when i or j is a global token.

    Args:
        one_sided: w, the band's half-width (Longformer's ``attention_window`` is 2w).
        global_positions: the global tokens' positions (1-D ints; e.g. ``[0]`` for a [CLS] token).

    Returns: ``mask_mod(b, h, q_idx, kv_idx) -> bool tensor`` (see :func:`selfattn.masks.materialize_mask_mod`).

    Raises: TypeError / ValueError: ``one_sided`` not an int >= 0, positions not 1-D ints >= 0.

    Source: Beltagy et al. 2020, section 3.1 (sliding window + global attention); chapter 11b.
    """
    if isinstance(one_sided, bool) or not isinstance(one_sided, int) or one_sided < 0:
        raise ValueError(f"one_sided must be an int >= 0; got {one_sided!r}")
    g = torch.as_tensor(global_positions, dtype=torch.long if len(global_positions) == 0 else None)
    if g.ndim != 1 or g.dtype.is_floating_point or (g < 0).any():
        raise ValueError(f"global_positions must be 1-D non-negative ints; got {global_positions!r}")
    g = g.long()

    def mask_mod(b, h, q_idx, kv_idx):
        band = (q_idx - kv_idx).abs() <= one_sided
        is_global_q = torch.isin(q_idx, g.to(q_idx.device))
        is_global_k = torch.isin(kv_idx, g.to(kv_idx.device))
        return band | is_global_q | is_global_k
    return mask_mod
