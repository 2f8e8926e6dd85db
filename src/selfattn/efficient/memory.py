"""Peak memory of a computation, counted in two honest ways (chapters 09-10 and ``bench/``).

- :func:`peak_tensor_bytes`: the largest total size of tensors created by PyTorch operations and
  alive at the same time while a function runs. Exact, portable and deterministic (a
  ``TorchDispatchMode`` sees every operation), but blind to scratch memory that a single fused
  kernel allocates inside itself (such as ``F.scaled_dot_product_attention``'s CPU kernel).
- :func:`peak_rss_bytes`: the rise of the process's peak resident memory (Linux ``VmHWM``, reset
  through ``/proc/self/clear_refs``) while a function runs: sees everything, kernels included, but
  needs Linux. It counts memory the function newly touches, whatever the process freed before: the
  C allocator keeps freed blocks resident and hands them out again (glibc raises its mmap threshold
  to the size of a freed mmapped block, up to 32 MiB, so later blocks come from the heap and stay there
  once freed). A 64 MiB tensor could then be served from a 75 MiB hole left by earlier work, and
  the counter saw 1.6 MiB. So the free memory is returned to the system first (glibc's
  ``malloc_trim``), and reusing it costs fresh pages again.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys
from functools import cache
from pathlib import Path

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

__all__ = ["peak_tensor_bytes", "peak_rss_bytes", "release_free_heap", "rss_measurement_available"]


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
    the end). Source: chapter 09.
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


@cache
def _malloc_trim():
    """glibc's ``malloc_trim``, or None with another C library (musl returns freed memory itself)."""
    name = ctypes.util.find_library("c")
    libc = ctypes.CDLL(name) if name else None
    return getattr(libc, "malloc_trim", None)


def release_free_heap() -> None:
    """Give the pages of every free block in the C heap back to the system (glibc's ``malloc_trim``).

    Afterwards, memory handed out again is touched anew, so it shows in the resident size.
    """
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


def peak_rss_bytes(fn, *args, **kwargs) -> tuple[int, object]:
    """Run ``fn``; return ``(rise of peak resident memory in bytes above the resident size just
    before the call, its result)``. Linux only.

    The memory the process freed earlier is released first (:func:`release_free_heap`), so what
    ``fn`` touches counts even where the allocator hands it a block that was freed before the call.

    Raises:
        RuntimeError: not Linux, or ``/proc/self/clear_refs`` is not writable.
    """
    if not rss_measurement_available():
        raise RuntimeError("peak_rss_bytes needs Linux (/proc/self/clear_refs); use peak_tensor_bytes")
    release_free_heap()
    Path("/proc/self/clear_refs").write_text("5")  # "5" resets VmHWM to the current VmRSS
    before = _status_kib("VmRSS")
    result = fn(*args, **kwargs)
    return (_status_kib("VmHWM") - before) * 1024, result
