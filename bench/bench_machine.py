"""What machine a bench ran on: the CPU model and its vector ISA, for the header of every bench table.

Ratios differ between machine classes (an AMD EPYC and an Intel Xeon with AVX-512 gave 1.22x and 1.39x
for the same code), so a result names the machine it was measured on. Shared by the scripts in bench/.
"""

from __future__ import annotations

import os
import platform
from pathlib import Path

from selfattn.device import cpu_cache_sizes


def cpu_name() -> str:
    """The CPU's model name, its vendor's family / model / stepping and the data caches a core sees, and
    the core count, from /proc/cpuinfo and sysfs (elsewhere: what platform reports); e.g. ``AMD EPYC
    (AuthenticAMD family 26 model 2 stepping 1; L1d 48 KiB, L2 1 MiB, L3 32 MiB; 2 cores)``. A model
    name such as "AMD EPYC" alone does not tell one generation from another; family and model do."""
    cpuinfo = Path("/proc/cpuinfo")
    fields = {}
    if cpuinfo.exists():
        for line in cpuinfo.read_text().splitlines():
            key, _, value = line.partition(":")
            fields.setdefault(key.strip(), value.strip())
            if not line.strip():  # the first processor's block is enough
                break
    name = fields.get("model name") or platform.processor() or platform.machine()
    details = []
    if {"vendor_id", "cpu family", "model", "stepping"} <= fields.keys():
        details.append(f"{fields['vendor_id']} family {fields['cpu family']} model {fields['model']} "
                       f"stepping {fields['stepping']}")
    caches = {level: size for level, size in cpu_cache_sizes().items() if level != "L1i"}  # data and unified
    if caches:
        details.append(", ".join(f"{level} {_size(size)}" for level, size in caches.items()))
    details.append(f"{os.cpu_count()} cores")
    return f"{name} ({'; '.join(details)})"


def _size(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale} {unit}"
    return f"{n} B"


def vector_isa() -> str:
    """The widest vector extensions the CPU reports (what the float32 kernels can use)."""
    cpuinfo = Path("/proc/cpuinfo")
    if not cpuinfo.exists():
        return "unknown"
    for line in cpuinfo.read_text().splitlines():
        if line.startswith("flags"):
            flags = set(line.split(":", 1)[1].split())
            found = [f for f in ("avx512f", "avx512_bf16", "avx512_vnni", "avx2", "fma", "neon") if f in flags]
            return ", ".join(found) or "none of avx2/avx512f"
    return "unknown"
