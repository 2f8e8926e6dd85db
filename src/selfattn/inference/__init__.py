"""Attention at inference (chapter 11): what the KV cache costs, and the tricks that shrink it.

- :mod:`~selfattn.inference.costs`: published model configurations (:class:`ModelSpec`), the KV
  cache's size, FLOPs and bytes of a prefill and a decode step, published accelerator figures, and
  the roofline measured on this machine (claim 25).
- :mod:`~selfattn.inference.decode_timing`: tokens per second with and without the KV cache.
- :mod:`~selfattn.inference.convert`: the real MiniLM converted to grouped-query attention by
  mean-pooling key/value heads, and what that changes (claim 26; the layer is :mod:`selfattn.gqa`).
- :mod:`~selfattn.inference.paged`: a paged KV cache with a block table (Kwon et al. 2023) and the
  memory it saves (claim 27).
- :mod:`~selfattn.inference.split_kv`: split-KV decoding (Flash-Decoding), partial results merged in
  any order (claim 27).
- :mod:`~selfattn.inference.streaming`: a sliding-window cache with attention sinks (Xiao et al.
  2023), and what it loses (claim 28).

Sampling rules (greedy, temperature, top-k, top-p) are :mod:`selfattn.sampling`.
"""

from . import convert, costs, decode_timing, paged, split_kv
from .costs import (
    PUBLISHED_ACCELERATORS,
    PUBLISHED_SPECS,
    ModelSpec,
    kv_cache_bytes,
    kv_cache_table,
)
from .paged import PagedKVCache, paged_attention
from .split_kv import merge_partials, partial_attention, split_kv_attention

__all__ = [
    "convert", "costs", "decode_timing", "paged", "split_kv",
    "ModelSpec", "PUBLISHED_ACCELERATORS", "PUBLISHED_SPECS", "kv_cache_bytes", "kv_cache_table",
    "PagedKVCache", "paged_attention", "merge_partials", "partial_attention", "split_kv_attention",
]
