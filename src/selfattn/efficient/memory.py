"""Peak memory of a computation, counted in two honest ways (chapters 08-09 and ``bench/``).

- :func:`peak_tensor_bytes`: the largest total size of tensors created by PyTorch operations and
  alive at the same time while a function runs. Exact, portable and deterministic (a
  ``TorchDispatchMode`` sees every operation), but blind to scratch memory that a single fused
  kernel allocates inside itself (such as ``F.scaled_dot_product_attention``'s CPU kernel).
- :func:`peak_rss_bytes`: the rise of the process's peak resident memory (Linux ``VmHWM``, reset
  through ``/proc/self/clear_refs``) while a function runs: sees everything, kernels included, but
  needs Linux and is only as precise as the allocator returns freed memory (set
  ``MALLOC_MMAP_THRESHOLD_`` small in a fresh process, as ``bench/attention_bench.py`` does).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

__all__ = ["peak_tensor_bytes", "peak_rss_bytes", "rss_measurement_available"]


class _LiveTensorBytes(TorchDispatchMode):
    """Track the storages created by operations and free them when their last reference dies."""

    def __init__(self):
        super().__init__()
        self.live: dict[int, tuple[StorageWeakRef, int]] = {}
        self.current = 0
        self.peak = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for key in [key for key, (ref, _) in self.live.items() if ref.expired()]:
            self.current -= self.live.pop(key)[1]
        if any(ret.alias_info is not None for ret in func._schema.returns):
            return out  # views and in-place results reuse memory that already exists
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and t.device.type != "meta":
                storage = t.untyped_storage()
                key = storage.data_ptr()
                if key not in self.live and storage.nbytes() > 0:
                    self.live[key] = (StorageWeakRef(storage), storage.nbytes())
                    self.current += storage.nbytes()
        self.peak = max(self.peak, self.current)
        return out


def peak_tensor_bytes(fn, *args, **kwargs) -> tuple[int, object]:
    """Run ``fn(*args, **kwargs)``; return ``(peak bytes of tensors it created, its result)``.

    Tensors that exist before the call (the inputs) are not counted; the result is (it is alive at
    the end). Source: chapter 08.
    """
    tracker = _LiveTensorBytes()
    with tracker:
        result = fn(*args, **kwargs)
    return tracker.peak, result


def rss_measurement_available() -> bool:
    """True on Linux, where ``/proc/self/clear_refs`` can reset the peak resident size."""
    return sys.platform.startswith("linux") and Path("/proc/self/clear_refs").exists()


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{field} not found in /proc/self/status")


def peak_rss_bytes(fn, *args, **kwargs) -> tuple[int, object]:
    """Run ``fn``; return ``(rise of peak resident memory in bytes above the resident size just
    before the call, its result)``. Linux only.

    Raises:
        RuntimeError: not Linux, or ``/proc/self/clear_refs`` is not writable.
    """
    if not rss_measurement_available():
        raise RuntimeError("peak_rss_bytes needs Linux (/proc/self/clear_refs); use peak_tensor_bytes")
    Path("/proc/self/clear_refs").write_text("5")  # "5" resets VmHWM to the current VmRSS
    before = _status_kib("VmRSS")
    result = fn(*args, **kwargs)
    return (_status_kib("VmHWM") - before) * 1024, result
