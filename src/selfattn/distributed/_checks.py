"""Argument checks shared by ring and all-to-all attention (validated once, at the public boundary)."""

from __future__ import annotations

import torch
import torch.distributed as dist

from .._validate import (
    require_attention_tensors,
    require_flag,
    require_rank,
    require_scale,
    require_tensor,
    shape_of,
)
from .layout import require_layout


def group_size_rank(group) -> tuple[int, int]:
    """(P, rank) of the process group; a clear error if torch.distributed is not initialised."""
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("torch.distributed is not initialised: call this inside a process started by "
                           "selfattn.distributed.run_distributed (or after dist.init_process_group)")
    return dist.get_world_size(group), dist.get_rank(group)


def check_shards(q, k, v, key_padding_mask, causal, layout, scale, P):
    """Validate one rank's shards: q, k, v (B, H, T/P, Dh), one dtype and shape; the mask (B, T/P) bool."""
    require_attention_tensors(q, k, v)
    for name, x in (("q", q), ("k", k), ("v", v)):
        require_rank(name, x, 4, "(B, H, T/P, Dh), this rank's shard")
    if not (q.shape == k.shape == v.shape):
        raise ValueError(f"q, k and v must be shards of one shape (B, H, T/P, Dh) (self-attention, split by "
                         f"sequence); got {shape_of(q)}, {shape_of(k)}, {shape_of(v)}")
    causal = require_flag("causal", causal)
    layout = require_layout(layout)
    require_scale(scale)
    n = q.shape[2]
    if layout == "zigzag" and n % 2:
        raise ValueError(f"the zigzag layout cuts a sequence into 2P equal chunks, so T must be divisible by "
                         f"2P={2 * P}; got T={n * P} (shards of {n} positions, P={P})")
    if key_padding_mask is not None:
        require_tensor("key_padding_mask", key_padding_mask)
        if key_padding_mask.dtype != torch.bool:
            raise TypeError(f"key_padding_mask must be a torch.bool tensor (True = real token); got {key_padding_mask.dtype}")
        if tuple(key_padding_mask.shape) != (q.shape[0], n):
            raise ValueError(f"key_padding_mask must have shape (B, T/P) = ({q.shape[0]}, {n}), this rank's shard "
                             f"of the (B, T) mask; got {shape_of(key_padding_mask)}")
        if key_padding_mask.device != q.device:
            raise ValueError(f"key_padding_mask must be on the device of q ({q.device}); got {key_padding_mask.device}")
    return causal, layout
