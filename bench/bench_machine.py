"""What machine a bench ran on: the CPU model and its vector ISA, for the header of every bench table.

Ratios differ between machine classes (an AMD EPYC and an Intel Xeon with AVX-512 gave 1.22x and 1.39x
for the same code), so a result names the machine it was measured on. Shared by the scripts in bench/.
"""

from __future__ import annotations

import os
import platform
from pathlib import Path


def cpu_name() -> str:
    """The CPU's model name and core count, from /proc/cpuinfo (elsewhere: what platform reports)."""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                return f"{line.split(':', 1)[1].strip()} ({os.cpu_count()} cores)"
    return f"{platform.processor() or platform.machine()} ({os.cpu_count()} cores)"


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
