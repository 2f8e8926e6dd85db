"""What the distributed attention modules send, counted tensor by tensor (chapter 12).

Every tensor :mod:`~selfattn.distributed.ring` and :mod:`~selfattn.distributed.ulysses` hand to
``torch.distributed`` passes through the helpers here, which add its bytes (``numel x element_size``,
only the parts that leave the rank) to a :class:`Traffic` record, forward and backward separately,
and time each step. The counts are what the code sends, not what a formula predicts; the tests and
the chapter compare the two.

Source: chapter 12.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import NamedTuple

import torch
import torch.distributed as dist

__all__ = ["Traffic", "StepRecord", "nbytes", "Link", "PUBLISHED_LINKS"]

class Link(NamedTuple):
    """A published interconnect and the GPU it serves: ``both_ways`` bytes/s (both directions together,
    as the datasheets count them; a ring sends one way, so it can use half), ``gpu_flops`` the dense
    bfloat16 Tensor Core FLOP/s of that GPU, and where the figures come from."""

    gpu: str
    both_ways: float
    gpu_flops: float
    source: str


# Each bandwidth with the GPU it belongs to. Sources: NVIDIA H100 Tensor Core GPU datasheet (2022):
# H100 SXM 989 TFLOP/s dense BF16 (1,979 with sparsity), NVLink 900 GB/s; H100 PCIe 756 TFLOP/s dense
# BF16 (1,513 with sparsity), PCIe Gen5 128 GB/s. NVIDIA ConnectX-7 adapter cards user manual: one
# NDR InfiniBand port at 400 Gb/s = 50 GB/s each way (a DGX H100 has one such port per GPU).
PUBLISHED_LINKS = {
    "NVLink 4": Link("H100 SXM", 900e9, 989e12, "NVIDIA H100 datasheet"),
    "PCIe Gen5": Link("H100 PCIe", 128e9, 756e12, "NVIDIA H100 datasheet"),
    "InfiniBand NDR, between nodes": Link("H100 SXM", 2 * 400e9 / 8, 989e12, "NVIDIA ConnectX-7 user manual"),
}

PHASES = ("forward", "backward")


def nbytes(x: torch.Tensor) -> int:
    """Bytes of a tensor's elements: ``numel x element_size``."""
    return x.numel() * x.element_size()


@dataclass
class StepRecord:
    """One step of a ring (or one all-to-all): its phase, index, bytes sent and seconds spent.

    ``compute_s`` is the wall-clock time of the attention arithmetic of the step and ``compute_cpu_s``
    the CPU time of the thread that did it (unaffected by other processes taking the core), ``wait_s``
    the time spent waiting for the transfers posted before it (what the overlap did not hide), ``pairs``
    the visible (batch row, query, key) triples the step computed (0 for a skipped block)."""

    phase: str
    step: int
    bytes_sent: int
    compute_s: float = 0.0
    wait_s: float = 0.0
    pairs: int = 0
    compute_cpu_s: float = 0.0


@dataclass
class Traffic:
    """Bytes one rank sends, per phase, and a record per step. Pass one to ``ring_attention`` or
    ``ulysses_attention`` (``traffic=``); it is filled in as they run (forward and backward)."""

    bytes_sent: dict = field(default_factory=lambda: {"forward": 0, "backward": 0})
    steps: list = field(default_factory=list)

    def add(self, phase: str, n: int) -> None:
        self.bytes_sent[phase] += int(n)

    def as_dict(self) -> dict:
        """Plain Python (picklable) form: bytes per phase and one dict per step."""
        return {"bytes_sent": dict(self.bytes_sent), "steps": [vars(s).copy() for s in self.steps]}


def _add(traffic, phase, n):
    if traffic is not None:
        traffic.add(phase, n)


def post_ring_exchange(send, recv, dst: int, src: int, group, traffic, phase: str):
    """Post, without waiting, the sends of ``send`` to rank ``dst`` and the receives into ``recv``
    from rank ``src`` (``dist.batch_isend_irecv``; ranks within ``group``); return the requests.
    Counts the bytes sent."""
    ops = ([dist.P2POp(dist.isend, x, group=group, group_peer=dst) for x in send]
           + [dist.P2POp(dist.irecv, y, group=group, group_peer=src) for y in recv])
    _add(traffic, phase, sum(nbytes(x) for x in send))
    return dist.batch_isend_irecv(ops) if ops else []


def wait_all(requests) -> float:
    """Wait for every request; return the seconds waited."""
    t0 = time.perf_counter()
    for req in requests:
        req.wait()
    return time.perf_counter() - t0


def all_to_all(chunks, group, traffic, phase: str, rank: int):
    """``dist.all_to_all`` of a list of P tensors (chunk j goes to rank j); returns the P received.

    Counts the bytes of the chunks that leave the rank (all but chunk ``rank``, which stays)."""
    chunks = [c.contiguous() for c in chunks]
    out = [torch.empty_like(c) for c in chunks]
    dist.all_to_all(out, chunks, group=group)
    _add(traffic, phase, sum(nbytes(c) for j, c in enumerate(chunks) if j != rank))
    return out
