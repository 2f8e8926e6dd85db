"""One `make test` run computes each long experiment once: the book's build writes it, the tests read it.

The chapters train small models (chapter 08's five position schemes, chapter 11's RoPE model and its
streaming losses, chapter 11c's sink models, chapters 14 and 15's induction models) and the chapter
tests check the chapter's own run with the chapter's settings. ``make test`` builds the book while
the tests run, so without this each of those runs was computed twice in one CI run (about 1,300 s of
the 2 cores' time, measured in one run on an AMD EPYC).

:func:`shared_run` wraps such a function. With neither variable below set (a reader's ``make book``,
a notebook on Colab, ``pytest`` on its own) it only calls the function. In ``make test``:

- the book's build sets ``SELFATTN_RUN_CACHE_WRITE=DIR``: every call is computed as usual (so the
  chapter shows its own progress bars and timings) and its result saved in DIR under a key;
- the tests set ``SELFATTN_RUN_CACHE_READ=DIR``: a call whose key is in DIR returns the saved result,
  waiting first while the build is still computing that key; any other call is computed as usual.

The key is a SHA-256 of the function's name, its bound arguments (tensors, arrays and modules by
their contents; ``progress`` left out), the package's source (every ``.py`` under ``selfattn/``),
torch's version and its thread count, so a result is only reused for the same computation by the
same code. A call with an argument it cannot key (a function, an open file) is computed as usual.
Only functions that seed torch's random state themselves (``torch.manual_seed(seed)``, their own
generators) or draw nothing from it may be wrapped: a key does not hold the random state before the
call. When the call left the random state changed, the state after it is saved and restored when the
result is read, so the code after a reused call sees the same random numbers as after a computed one. DIR is under ``_build``,
which ``make test`` empties first.
"""

from __future__ import annotations

import dataclasses
import fcntl
import functools
import hashlib
import inspect
import os
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import torch

WRITE = "SELFATTN_RUN_CACHE_WRITE"
READ = "SELFATTN_RUN_CACHE_READ"
IGNORED = frozenset({"progress"})  # arguments that change what is printed, not what is computed


class _Unkeyable(Exception):
    pass


@functools.lru_cache(maxsize=1)
def _source_digest() -> str:
    h = hashlib.sha256()
    root = Path(__file__).resolve().parent
    for path in sorted(root.rglob("*.py")):
        h.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


def _feed(h, value) -> None:
    """Feed ``value`` into the hash ``h`` by its contents; raise _Unkeyable for what has none."""
    if value is None or isinstance(value, (bool, int, float, complex, str, bytes)):
        h.update(f"{type(value).__name__}:{value!r};".encode())
    elif isinstance(value, torch.Tensor):
        t = value.detach().cpu().contiguous()
        h.update(f"tensor:{t.dtype}:{tuple(t.shape)}:{value.requires_grad};".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    elif isinstance(value, np.ndarray):
        h.update(f"ndarray:{value.dtype}:{value.shape};".encode() + np.ascontiguousarray(value).tobytes())
    elif isinstance(value, torch.nn.Module):
        h.update(f"module:{type(value).__module__}.{type(value).__qualname__}:{value.training};".encode())
        for name, tensor in value.state_dict().items():
            h.update(name.encode())
            _feed(h, tensor)
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        h.update(f"dataclass:{type(value).__module__}.{type(value).__qualname__};".encode())
        for field in dataclasses.fields(value):
            h.update(field.name.encode())
            _feed(h, getattr(value, field.name))
    elif isinstance(value, Mapping):
        h.update(f"mapping:{len(value)};".encode())
        for k in sorted(value, key=repr):
            _feed(h, k)
            _feed(h, value[k])
    elif isinstance(value, (list, tuple)):  # a list and a tuple of the same items key alike
        h.update(f"sequence:{len(value)};".encode())
        for item in value:
            _feed(h, item)
    elif isinstance(value, (torch.dtype, torch.device)):
        h.update(f"{type(value).__name__}:{value};".encode())
    else:
        raise _Unkeyable(type(value).__name__)


def run_key(fn, args: tuple, kwargs: dict) -> str:
    """The key of the call ``fn(*args, **kwargs)``: see the module docstring. Raises _Unkeyable."""
    bound = inspect.signature(fn).bind(*args, **kwargs)
    bound.apply_defaults()
    h = hashlib.sha256()
    h.update(f"{fn.__module__}.{fn.__qualname__};{_source_digest()};{torch.__version__};"
             f"{torch.get_num_threads()};".encode())
    for name, value in bound.arguments.items():
        if name in IGNORED:
            continue
        h.update(name.encode())
        _feed(h, value)
    return h.hexdigest()[:32]


def shared_run(fn):
    """Wrap an experiment so that one `make test` run computes it once (see the module docstring)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        write, read = os.environ.get(WRITE), os.environ.get(READ)
        folder = write or read
        if not folder:
            return fn(*args, **kwargs)
        try:
            key = run_key(fn, args, kwargs)
        except _Unkeyable:
            return fn(*args, **kwargs)
        folder = Path(folder)
        saved, lock = folder / f"{key}.pt", folder / f"{key}.lock"
        if write:
            folder.mkdir(parents=True, exist_ok=True)
            with open(lock, "a") as handle:
                fcntl.flock(handle, fcntl.LOCK_EX)  # readers of this key wait until it is saved
                before = torch.get_rng_state()
                result = fn(*args, **kwargs)
                after = torch.get_rng_state()
                partial = folder / f"{key}.{os.getpid()}.partial"
                try:  # the random state is kept only when the call set it (seeded) or drew from it
                    torch.save({"result": result, "rng": None if torch.equal(before, after) else after}, partial)
                    os.replace(partial, saved)
                except Exception:  # a result torch cannot save is simply not shared
                    partial.unlink(missing_ok=True)
            return result
        if not saved.exists() and lock.exists():
            with open(lock) as handle:
                fcntl.flock(handle, fcntl.LOCK_SH)  # the build is computing it: wait
        if saved.exists():
            entry = torch.load(saved, weights_only=False)
            if entry["rng"] is not None:
                torch.set_rng_state(entry["rng"])
            return entry["result"]
        return fn(*args, **kwargs)

    wrapper.__wrapped_run__ = fn
    return wrapper
