"""A key/value cache for decoding one token at a time (chapter 09).

When a causal model generates, the keys and values of earlier positions do not change, so they are
kept and only the new position's are computed: each step costs O(S) instead of O(S^2). The new
queries are the *newest* of the S positions, which is exactly the bottom-right causal alignment
(``selfattn.causal_mask(T_new, S, alignment="bottom_right")``).
"""

from __future__ import annotations

import torch

from .._validate import require_min_rank, require_tensor, shape_of
from ..attention import scaled_dot_product_attention
from ..masks import causal_mask

__all__ = ["KVCache", "cached_attention"]


class KVCache:
    """Keys and values of the positions decoded so far, for one attention layer.

    ``append(k_new, v_new)`` concatenates along the position axis (-2) and returns all keys and
    values, shapes (..., S, Dh) and (..., S, Dv). ``len(cache)`` is S.

    Raises:
        TypeError / ValueError (from ``append``): non-tensors, or shapes that do not match the
        cached ones except along the position axis.
    """

    def __init__(self):
        self.k: torch.Tensor | None = None
        self.v: torch.Tensor | None = None

    def __len__(self) -> int:
        return 0 if self.k is None else int(self.k.shape[-2])

    def append(self, k_new: torch.Tensor, v_new: torch.Tensor):
        require_tensor("k_new", k_new)
        require_tensor("v_new", v_new)
        require_min_rank("k_new", k_new, 2, "(..., T_new, Dh)")
        require_min_rank("v_new", v_new, 2, "(..., T_new, Dv)")
        if self.k is not None and (k_new.shape[:-2] != self.k.shape[:-2] or k_new.shape[-1] != self.k.shape[-1]
                                   or v_new.shape[-1] != self.v.shape[-1]):
            raise ValueError(
                f"k_new {shape_of(k_new)} / v_new {shape_of(v_new)} must match the cached k "
                f"{shape_of(self.k)} / v {shape_of(self.v)} except along dim -2"
            )
        self.k = k_new if self.k is None else torch.cat([self.k, k_new], dim=-2)  # (..., S + T_new, Dh)
        self.v = v_new if self.v is None else torch.cat([self.v, v_new], dim=-2)  # (..., S + T_new, Dv)
        return self.k, self.v


def cached_attention(q_new, k_new, v_new, cache: KVCache, *, scale: float | None = None):
    """Causal attention of the newest ``T_new`` positions over everything cached so far.

    Appends ``k_new``, ``v_new`` to ``cache`` and attends with
    ``causal_mask(T_new, S, alignment="bottom_right")``: new query t (position ``S - T_new + t``)
    sees the keys up to its own position. Equal to the last ``T_new`` rows of full causal attention
    over all S positions.

    Args:
        q_new: (..., T_new, Dh); k_new: (..., T_new, Dh); v_new: (..., T_new, Dv).
        cache: the layer's :class:`KVCache` (modified in place).

    Returns:
        ``context`` (..., T_new, Dv).

    Source: chapter 09.
    """
    k, v = cache.append(k_new, v_new)
    keep = causal_mask(q_new.shape[-2], k.shape[-2], alignment="bottom_right", device=q_new.device)
    return scaled_dot_product_attention(q_new, k, v, keep, scale=scale)
