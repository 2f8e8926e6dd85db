"""What attention costs, and exact attention that scales (chapters 09-10).

- :func:`tiled_attention`: exact attention by tiles with the online softmax (FlashAttention),
  memory linear in length; the Triton kernel on CUDA.
- :func:`sliding_window_attention`, :func:`sliding_window_tiled_attention`: sparse (banded) attention.
- :func:`linear_attention`, :func:`linear_attention_recurrent`, :func:`linear_attention_chunkwise`:
  kernelized linear attention (parallel, recurrent, chunkwise).
- :class:`KVCache`, :class:`StaticKVCache` (preallocated, written in place), :func:`cached_attention`:
  decoding one token at a time.
"""

from .kv_cache import KVCache, StaticKVCache, cached_attention
from .tiled import DEFAULT_BLOCK_K, DEFAULT_BLOCK_Q, Visibility, tiled_attention
from .variants import (
    FEATURE_MAPS,
    linear_attention,
    linear_attention_chunkwise,
    linear_attention_recurrent,
    sliding_window_attention,
    sliding_window_mask,
    sliding_window_tiled_attention,
)

__all__ = [
    "tiled_attention",
    "Visibility",
    "DEFAULT_BLOCK_Q",
    "DEFAULT_BLOCK_K",
    "sliding_window_mask",
    "sliding_window_attention",
    "sliding_window_tiled_attention",
    "linear_attention",
    "linear_attention_recurrent",
    "linear_attention_chunkwise",
    "FEATURE_MAPS",
    "KVCache",
    "StaticKVCache",
    "cached_attention",
]
