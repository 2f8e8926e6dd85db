"""Pick the fastest available device: CUDA, then Apple MPS, then CPU. Introduced in chapter 00."""

from __future__ import annotations

import os

import torch

__all__ = ["pick_device", "describe_device"]


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
    return f"cpu ({torch.get_num_threads()} threads)"
