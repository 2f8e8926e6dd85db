"""Pick the fastest available device: CUDA, then Apple MPS, then CPU. Introduced in chapter 00."""

from __future__ import annotations

import os
from pathlib import Path

import torch

__all__ = ["pick_device", "describe_device", "cpu_cache_sizes", "parse_cache_size"]

CPU_CACHE_SYSFS = "/sys/devices/system/cpu/cpu0/cache"


def pick_device(prefer: str | None = None) -> torch.device:
    """Return ``cuda`` if a CUDA GPU is usable, else ``mps`` (Apple silicon), else ``cpu``.

    Args:
        prefer: force one of ``"cuda"``, ``"mps"``, ``"cpu"``; default: the environment variable
            ``SELFATTN_DEVICE`` if set, else automatic.

    Raises:
        ValueError: ``prefer`` names an unknown device, or one that is not available here.
    """
    prefer = prefer if prefer is not None else os.environ.get("SELFATTN_DEVICE") or None
    available = {
        "cuda": torch.cuda.is_available(),
        "mps": bool(getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()),
        "cpu": True,
    }
    if prefer is not None:
        if prefer not in available:
            raise ValueError(f"prefer must be one of {sorted(available)} or None; got {prefer!r}")
        if not available[prefer]:
            raise ValueError(f"prefer={prefer!r} but no {prefer} device is available on this machine")
        return torch.device(prefer)
    for name in ("cuda", "mps", "cpu"):
        if available[name]:
            return torch.device(name)
    raise AssertionError("unreachable: the CPU is always available")


def describe_device(device: torch.device | None = None) -> str:
    """One line naming the device and, for CUDA, the GPU model."""
    device = pick_device() if device is None else torch.device(device)
    if device.type == "cuda":
        return f"cuda ({torch.cuda.get_device_name(device)})"
    if device.type == "mps":
        return "mps (Apple silicon GPU)"
    threads = torch.get_num_threads()
    return f"cpu ({threads} thread{'' if threads == 1 else 's'})"


def parse_cache_size(text: str) -> int | None:
    """Bytes in a Linux cache-size string such as ``"32K"``, ``"1024K"``, ``"32768K"`` or ``"2M"``;
    None if the text is not such a size."""
    text = text.strip()
    units = {"K": 2**10, "M": 2**20, "G": 2**30}
    number, unit = (text[:-1], text[-1].upper()) if text[-1:].upper() in units else (text, "")
    return int(number) * units.get(unit, 1) if number.isdigit() else None


def cpu_cache_sizes(root: str = CPU_CACHE_SYSFS) -> dict[str, int]:
    """The caches of CPU 0 as Linux reports them, by name (``"L1d"``, ``"L1i"``, ``"L2"``, ``"L3"``)
    in bytes; empty where the system does not report them (macOS, Windows, some containers).

    Per core for L1 and L2 on x86; L3 is shared by a group of cores. Introduced in chapter 10 (the
    time of tiled attention against its block size)."""
    sizes = {}
    for folder in sorted(Path(root).glob("index*")):
        try:
            level = (folder / "level").read_text().strip()
            kind = (folder / "type").read_text().strip()
            size = parse_cache_size((folder / "size").read_text())
        except OSError:
            continue
        if size is not None and level.isdigit():
            suffix = {"Data": "d", "Instruction": "i"}.get(kind, "")
            sizes[f"L{level}{suffix}"] = size
    return sizes
