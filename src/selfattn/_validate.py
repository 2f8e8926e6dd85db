"""Argument checks shared by every module, so that every error names the argument, what it got and
what was expected (the contracts are listed on the book's "Mask conventions" page and in chapter 04)."""

from __future__ import annotations

import math
import os
from collections.abc import Sequence

import numpy as np
import torch

ArrayLike = "np.ndarray | torch.Tensor"


def shape_of(x) -> tuple[int, ...]:
    return tuple(int(s) for s in x.shape)


def require_tensor(name: str, x) -> None:
    """Raise TypeError unless ``x`` is a torch tensor."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor; got {type(x).__name__}")


def require_array(name: str, x) -> np.ndarray:
    """Return ``x`` as a float64 NumPy array; raise TypeError for non-numeric input."""
    if isinstance(x, torch.Tensor):
        raise TypeError(
            f"{name} must be a NumPy array (selfattn.ref is the NumPy reference); got a torch.Tensor. "
            "Convert it with .detach().cpu().numpy()."
        )
    arr = np.asarray(x)
    if arr.dtype == bool or not (np.issubdtype(arr.dtype, np.floating) or np.issubdtype(arr.dtype, np.integer)):
        raise TypeError(f"{name} must hold real numbers; got dtype {arr.dtype}")
    return arr.astype(np.float64, copy=False)


def require_min_rank(name: str, x, min_rank: int, layout: str) -> None:
    """Raise ValueError unless ``x.ndim >= min_rank``; ``layout`` names the expected axes."""
    if x.ndim < min_rank:
        raise ValueError(f"{name} must have shape {layout} (at least {min_rank} dims); got shape {shape_of(x)}")


def require_rank(name: str, x, rank: int, layout: str) -> None:
    """Raise ValueError unless ``x.ndim == rank``."""
    if x.ndim != rank:
        raise ValueError(f"{name} must have shape {layout} ({rank} dims); got shape {shape_of(x)}")


def require_dtype(name: str, x: torch.Tensor, dtype: torch.dtype) -> None:
    """Raise TypeError unless ``x`` has the dtype of a module's parameters."""
    if x.dtype != dtype:
        raise TypeError(
            f"{name} must have the dtype of the module's parameters, {dtype}; got dtype {x.dtype}. "
            f"Convert the input with {name}.to({dtype}) or the module with .to({x.dtype})"
        )


def require_positive_int(name: str, value) -> int:
    """Return ``value`` as int; raise TypeError/ValueError unless it is an integer > 0."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be a positive int; got {value!r} ({type(value).__name__})")
    if value <= 0:
        raise ValueError(f"{name} must be > 0; got {value}")
    return int(value)


def require_qkv(q, k, v) -> None:
    """Check the (..., T, Dh), (..., S, Dh), (..., S, Dv) contract of attention inputs."""
    require_min_rank("q", q, 2, "(..., T, Dh)")
    require_min_rank("k", k, 2, "(..., S, Dh)")
    require_min_rank("v", v, 2, "(..., S, Dv)")
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(
            f"q and k must have the same last dim d_head; got q {shape_of(q)} and k {shape_of(k)}"
        )
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(
            f"k and v must have the same number of positions S (dim -2); got k {shape_of(k)} and v {shape_of(v)}"
        )
    if k.shape[:-2] != v.shape[:-2] or q.shape[:-2] != k.shape[:-2]:
        raise ValueError(
            "q, k and v must have the same leading (batch, head) dims; got "
            f"q {shape_of(q)}, k {shape_of(k)}, v {shape_of(v)}"
        )
    if q.shape[-1] == 0:
        raise ValueError(f"d_head (the last dim of q and k) must be > 0; got q {shape_of(q)}")
    if k.shape[-2] == 0:
        raise ValueError(f"k and v must hold at least one position (S > 0); got k {shape_of(k)}")


def require_broadcastable(name: str, x, target: Sequence[int], what: str) -> None:
    """Raise ValueError unless ``x`` broadcasts to ``target`` without growing it."""
    shape = shape_of(x)
    target = tuple(int(t) for t in target)
    ok = len(shape) <= len(target) and all(
        s in (1, t) for s, t in zip(reversed(shape), reversed(target), strict=False)
    )
    if not ok:
        raise ValueError(f"{name} must broadcast to {what} {target}; got shape {shape}")


def require_bool_mask(name: str, mask) -> None:
    """A mask is boolean with True = may attend; refuse float 0/1 masks and integer masks."""
    dtype = mask.dtype if isinstance(mask, torch.Tensor) else np.asarray(mask).dtype  # lists too
    is_bool = dtype == torch.bool if isinstance(mask, torch.Tensor) else dtype == np.bool_
    if not is_bool:
        if isinstance(mask, torch.Tensor):
            fix = "mask.bool() if 1 means 'keep', or pass an additive float mask as bias=..."
        else:  # the NumPy reference
            fix = "mask.astype(bool) (NumPy) if 1 means 'keep', or pass an additive float mask as bias=..."
        raise TypeError(
            f"{name} must be a boolean {'tensor' if isinstance(mask, torch.Tensor) else 'array'} "
            f"with True = may attend; got dtype {dtype}. A float or 0/1 mask is refused because its "
            f"meaning is ambiguous: convert it with {fix}"
        )


def require_flag(name: str, value) -> bool:
    """Return ``value`` if it is a bool (or NumPy bool); raise TypeError for anything else, so that
    a string such as ``"no"`` is not silently taken as True."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be True or False; got {value!r} ({type(value).__name__})")
    return bool(value)


def require_attention_tensors(q, k, v) -> None:
    """q, k, v: torch tensors of one floating dtype on one device, with the shapes of
    :func:`require_qkv`."""
    for name, x in (("q", q), ("k", k), ("v", v)):
        require_tensor(name, x)
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k and v must share one dtype; got {q.dtype}, {k.dtype}, {v.dtype}")
    if not q.dtype.is_floating_point:
        raise TypeError(f"q, k and v must be floating-point tensors; got dtype {q.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k and v must be on one device; got {q.device}, {k.device}, {v.device}")
    require_qkv(q, k, v)


def require_scale(scale) -> None:
    if isinstance(scale, bool) or (scale is not None and not isinstance(scale, (int, float, np.number))):
        raise TypeError(f"scale must be a number or None; got {scale!r} ({type(scale).__name__})")
    if scale is not None and not (np.isfinite(scale) and scale > 0):
        raise ValueError(f"scale must be a finite number > 0 or None (meaning 1/sqrt(d_head)); got {scale!r}")


def require_probability(name: str, p) -> None:
    """Raise TypeError unless ``p`` is a real number, ValueError unless it lies in [0, 1)."""
    if isinstance(p, bool) or not isinstance(p, (int, float, np.integer, np.floating)):
        raise TypeError(f"{name} must be a number in [0, 1); got {p!r} ({type(p).__name__})")
    if not (0.0 <= float(p) < 1.0):
        raise ValueError(f"{name} must be in [0, 1); got {p!r}")


def _host_memory() -> int | None:
    """The machine's RAM in bytes (None if unknown), read once at import."""
    try:
        total = int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (AttributeError, ValueError, OSError):  # no sysconf (Windows): psutil if it is there
        try:
            import psutil

            total = int(psutil.virtual_memory().total)
        except ImportError:
            total = None
    return total if total and total > 0 else None


_HOST_MEMORY = _host_memory()


def _total_memory(device: torch.device) -> int | None:
    """Total memory of ``device`` in bytes: the GPU's for CUDA, the machine's RAM otherwise; None if unknown."""
    if device.type == "cuda":
        return int(torch.cuda.get_device_properties(device).total_memory)  # a host-side query: no sync
    return _HOST_MEMORY


def _bytes(n: int) -> str:
    for unit, size in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def require_scores_fit(inputs: str, lead: Sequence[int], T: int, S: int, dtype: torch.dtype,
                       device: torch.device) -> None:
    """Raise MemoryError, before anything is allocated, when one (..., T, S) scores tensor alone would
    need more bytes than the device's total memory (the GPU's for CUDA, the machine's RAM otherwise).

    The bound is deliberately loose (the softmax holds a few such tensors at once), so that it never
    refuses a run that could fit; it turns the allocator's raw error from deep inside into one that
    names the shapes and the bytes. ``inputs`` describes the arguments and their shapes.
    """
    if torch.compiler.is_compiling():
        return  # made in eager calls only: int() of a symbolic size would specialise the traced graph
    shape = (*(int(n) for n in lead), int(T), int(S))
    need = math.prod(shape) * dtype.itemsize  # Python ints: no overflow
    total = _total_memory(device)
    if total is not None and need > total:
        raise MemoryError(
            f"{inputs}: the attention scores, shape {shape} (..., T, S) in {dtype}, would need {need} bytes "
            f"({_bytes(need)}), more than the {_bytes(total)} total memory of the device ({device}); "
            "use shorter sequences, fewer batch rows or heads, or selfattn.efficient.tiled_attention, "
            "which never holds the T x S scores")
