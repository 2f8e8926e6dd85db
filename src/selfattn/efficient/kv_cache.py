"""A key/value cache for decoding one token at a time (chapter 10).

When a causal model generates, the keys and values of earlier positions do not change, so they are
kept and only the new position's are computed: each step costs O(S) instead of O(S^2). The new
queries are the *newest* of the S positions, which is exactly the bottom-right causal alignment
(``selfattn.causal_mask(T_new, S, alignment="bottom_right")``).
"""

from __future__ import annotations

import torch

from .._validate import require_min_rank, require_positive_int, require_tensor, shape_of
from ..attention import scaled_dot_product_attention
from ..masks import causal_mask

__all__ = ["KVCache", "StaticKVCache", "cached_attention"]


class KVCache:
    """Keys and values of the positions decoded so far, for one attention layer.

    ``append(k_new, v_new)`` concatenates along the position axis (-2) and returns all keys and
    values, shapes (..., S, Dh) and (..., S, Dv). ``len(cache)`` is S.

    Raises:
        TypeError / ValueError (from ``append``): see :meth:`extended`. A failed ``append`` leaves
        the cache unchanged.
    """

    def __init__(self):
        self.k: torch.Tensor | None = None
        self.v: torch.Tensor | None = None

    def __len__(self) -> int:
        return 0 if self.k is None else int(self.k.shape[-2])

    def extended(self, k_new: torch.Tensor, v_new: torch.Tensor):
        """The cached keys and values with ``k_new``, ``v_new`` added, without storing them:
        shapes (..., S + T_new, Dh) and (..., S + T_new, Dv). Checks everything first.

        Raises:
            TypeError: non-tensors, non-floating tensors, or a dtype other than the cache's or each
                other's. ValueError: ranks below 2, ``k_new`` and ``v_new`` with different leading
                axes or T_new, or shapes that do not match the cached ones except along dim -2.
        """
        require_tensor("k_new", k_new)
        require_tensor("v_new", v_new)
        require_min_rank("k_new", k_new, 2, "(..., T_new, Dh)")
        require_min_rank("v_new", v_new, 2, "(..., T_new, Dv)")
        if not k_new.dtype.is_floating_point or k_new.dtype != v_new.dtype:
            raise TypeError(f"k_new and v_new must be floating tensors of one dtype; got {k_new.dtype}, {v_new.dtype}")
        if k_new.shape[:-1] != v_new.shape[:-1]:
            raise ValueError(
                f"k_new {shape_of(k_new)} and v_new {shape_of(v_new)} must have the same shape except "
                "the last axis (the same leading axes and the same number T_new of new positions)"
            )
        if self.k is None:
            return k_new, v_new
        if k_new.dtype != self.k.dtype:
            raise TypeError(f"k_new and v_new must have the cache's dtype {self.k.dtype}; got {k_new.dtype}")
        if (k_new.shape[:-2] != self.k.shape[:-2] or k_new.shape[-1] != self.k.shape[-1]
                or v_new.shape[-1] != self.v.shape[-1]):
            raise ValueError(
                f"k_new {shape_of(k_new)} / v_new {shape_of(v_new)} must match the cached k "
                f"{shape_of(self.k)} / v {shape_of(self.v)} except along dim -2"
            )
        return torch.cat([self.k, k_new], dim=-2), torch.cat([self.v, v_new], dim=-2)  # (..., S + T_new, D)

    def append(self, k_new: torch.Tensor, v_new: torch.Tensor):
        """Store ``k_new``, ``v_new`` after the cached positions and return all keys and values,
        (..., S, Dh) and (..., S, Dv). On an error (see :meth:`extended`) the cache is unchanged."""
        self.k, self.v = self.extended(k_new, v_new)
        return self.k, self.v

    def _commit(self, k, v, k_new, v_new) -> None:
        """Store the checked result ``k``, ``v`` of :meth:`extended` (``k_new``, ``v_new`` added)."""
        self.k, self.v = k, v


class StaticKVCache(KVCache):
    """A :class:`KVCache` whose keys and values live in buffers of ``capacity`` positions, allocated
    at the first ``append`` and written in place: a step copies only its new positions, never the
    whole cache (``KVCache.append`` concatenates, O(S) bytes per step). ``k`` and ``v`` are views of
    the first ``len(cache)`` positions, so what ``append`` returns equals what a ``KVCache`` returns.
    The same idea as ``transformers``' ``StaticCache``; :meth:`selfattn.models.gpt.GPT.generate` uses
    one per layer with ``capacity`` = prompt + new tokens.

    Args:
        capacity: the most positions it will hold (> 0).

    Raises:
        TypeError / ValueError: a ``capacity`` that is not a positive int; from ``append``, as
        :meth:`KVCache.extended`, and ValueError past ``capacity``. A failed ``append`` leaves the
        cache unchanged.

    Source: chapter 10 (the cache); issue 30 (no per-step copies).
    """

    def __init__(self, capacity: int):
        self.capacity = require_positive_int("capacity", capacity)
        self._k: torch.Tensor | None = None  # (..., capacity, Dh) once allocated
        self._v: torch.Tensor | None = None
        self._length = 0

    def __len__(self) -> int:
        return self._length

    @property
    def k(self) -> torch.Tensor | None:
        return None if self._k is None else self._k[..., : self._length, :]  # a view: (..., S, Dh)

    @property
    def v(self) -> torch.Tensor | None:
        return None if self._v is None else self._v[..., : self._length, :]  # (..., S, Dv)

    def append(self, k_new: torch.Tensor, v_new: torch.Tensor):
        """Write ``k_new``, ``v_new`` (..., T_new, D) after the cached positions, in place, and return
        views of all keys and values (..., S, Dh), (..., S, Dv). Checks first (as :meth:`KVCache.extended`,
        and the capacity); the views stay valid until the next ``append``."""
        self._check(k_new, v_new)
        return self._write(k_new, v_new)

    def extended(self, k_new: torch.Tensor, v_new: torch.Tensor):
        """As :meth:`KVCache.extended` (a new tensor, nothing stored), with the capacity checked too."""
        self._check(k_new, v_new)
        return KVCache.extended(self, k_new, v_new)

    def _check(self, k_new, v_new) -> None:
        require_tensor("k_new", k_new)
        require_tensor("v_new", v_new)
        require_min_rank("k_new", k_new, 2, "(..., T_new, Dh)")
        require_min_rank("v_new", v_new, 2, "(..., T_new, Dv)")
        if k_new.shape[-2] != v_new.shape[-2]:
            raise ValueError(f"k_new {shape_of(k_new)} and v_new {shape_of(v_new)} must hold the same number "
                             "T_new of new positions (dim -2)")
        KVCache.extended(self, k_new[..., :0, :], v_new[..., :0, :])  # its checks, on empty views: no copy
        if k_new.shape[-2] > self.capacity - self._length:
            raise ValueError(f"the cache holds {self._length} of {self.capacity} positions; k_new adds "
                             f"{k_new.shape[-2]} more (shape {shape_of(k_new)}): make it with a larger capacity")

    def _commit(self, k, v, k_new, v_new) -> None:
        self._write(k_new, v_new)

    def _write(self, k_new: torch.Tensor, v_new: torch.Tensor):
        """:meth:`append` without the checks (for callers that made them once, e.g. ``generate``)."""
        if self._k is None:
            lead = k_new.shape[:-2]
            self._k = k_new.new_empty(*lead, self.capacity, k_new.shape[-1])  # (..., capacity, Dh)
            self._v = v_new.new_empty(*lead, self.capacity, v_new.shape[-1])  # (..., capacity, Dv)
        start, stop = self._length, self._length + k_new.shape[-2]
        self._k[..., start:stop, :] = k_new  # in place: only the new positions are copied
        self._v[..., start:stop, :] = v_new
        self._length = stop
        return self._k[..., :stop, :], self._v[..., :stop, :]  # views, (..., S, Dh) and (..., S, Dv)


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

    Raises:
        TypeError: ``cache`` is not a :class:`KVCache`.
        TypeError / ValueError: as ``KVCache.append`` and ``selfattn.scaled_dot_product_attention``;
        ValueError also if ``q_new`` and ``k_new`` differ in T_new. A call that raises leaves the
        cache unchanged.

    Source: chapter 10.
    """
    if not isinstance(cache, KVCache):
        raise TypeError(f"cache must be a selfattn.efficient.KVCache (start with KVCache()); got {type(cache).__name__}")
    require_tensor("q_new", q_new)
    require_min_rank("q_new", q_new, 2, "(..., T_new, Dh)")
    k, v = cache.extended(k_new, v_new)  # checked, not yet stored
    if q_new.shape[-2] != k_new.shape[-2]:
        raise ValueError(
            f"q_new and k_new must hold the same new positions T_new; got q_new {shape_of(q_new)} and "
            f"k_new {shape_of(k_new)} (dim -2)"
        )
    if q_new.shape[-2] == 0:
        raise ValueError(f"q_new, k_new and v_new must hold at least one new position (T_new > 0); got q_new {shape_of(q_new)}")
    keep = causal_mask(q_new.shape[-2], k.shape[-2], alignment="bottom_right", device=q_new.device)
    context = scaled_dot_product_attention(q_new, k, v, keep, scale=scale)
    cache._commit(k, v, k_new, v_new)  # stored only once the attention has succeeded
    return context
