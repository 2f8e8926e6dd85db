"""Attention across devices (chapter 12): one sequence split over P processes with ``torch.distributed``.

- :mod:`~selfattn.distributed.layout`: contiguous and zigzag sequence layouts, and the causal work
  each rank gets under them (counted and in closed form).
- :mod:`~selfattn.distributed.ring`: ring attention (Liu et al. 2023): key/value blocks passed around
  the ring with non-blocking sends, merged with chapter 11's partials; an exact backward ring.
- :mod:`~selfattn.distributed.ulysses`: all-to-all sequence parallelism (DeepSpeed-Ulysses, Jacobs
  et al. 2023): sequence shards swapped for head shards and back.
- :mod:`~selfattn.distributed.comm`: the bytes every tensor sent carries, and step times.
- :mod:`~selfattn.distributed.launch`: :func:`run_distributed`, P gloo processes on 127.0.0.1.
- :mod:`~selfattn.distributed.workers`: the per-rank functions the chapter and the tests run
  (importable, as spawned processes need).
"""

from . import comm, launch, layout, ring, ulysses, workers
from .comm import Traffic
from .launch import DistributedRunError, run_distributed
from .layout import (
           causal_work,
           causal_work_formula,
           shard_positions,
           shard_sequence,
           unshard_sequence,
)
from .ring import ring_attention, ring_bytes_formula
from .ulysses import ulysses_attention, ulysses_bytes_formula

__all__ = ["comm", "launch", "layout", "ring", "ulysses", "workers", "Traffic", "DistributedRunError",
           "run_distributed", "causal_work", "causal_work_formula", "shard_positions", "shard_sequence",
           "unshard_sequence", "ring_attention", "ring_bytes_formula", "ulysses_attention", "ulysses_bytes_formula"]
