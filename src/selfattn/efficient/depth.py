"""How many operations must run one after another: the longest dependency chain (chapter 09).

:func:`dependency_depth` watches every PyTorch operation a function runs (a ``TorchDispatchMode``)
and gives each result a depth: one more than the deepest of its inputs (inputs from outside the
function have depth 0; views and reshapes add nothing, since they compute nothing). The largest
depth is the number of whole operations no amount of parallel hardware can overlap (the "depth" of
a computation, as opposed to its total "work"). Each operation counts as one step, although a
reduction over T terms inside it (a softmax's sum, a matrix product's inner sums) is itself a tree of
depth ceil(log2 T) on parallel hardware. Counted in whole operations, attention's depth does not grow
with T (so O(log T) once the reductions are counted); a recurrent network's grows by a fixed number of
operations per position (O(T)).

Introduced in chapter 09 (claim 15).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

__all__ = ["DependencyCount", "dependency_depth"]

_MATMULS = {"mm", "bmm", "addmm", "baddbmm", "matmul", "dot", "mv", "addmv"}


@dataclass(frozen=True)
class DependencyCount:
    """``depth``: the longest chain of dependent operations; ``operations``: all operations run;
    ``matmul_depth``: the most matrix products on one chain; ``matmuls``: all matrix products."""

    depth: int
    operations: int
    matmul_depth: int
    matmuls: int


class _Depths(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.depth: dict[int, tuple[int, int]] = {}  # storage address -> (depth, matmul depth)
        self.operations = self.matmuls = 0

    def _of(self, t) -> tuple[int, int]:
        return self.depth.get(t.untyped_storage().data_ptr(), (0, 0))

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = [t for t in tree_flatten((args, kwargs or {}))[0] if isinstance(t, torch.Tensor)]
        deepest = max((self._of(t) for t in inputs), default=(0, 0))
        in_storages = {t.untyped_storage().data_ptr() for t in inputs}
        outs = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
        shares = outs and all(t.untyped_storage().data_ptr() in in_storages for t in outs)
        if shares and not func._schema.is_mutable:
            # a view (or _unsafe_view, alias) computes nothing: it shares its input's storage and depth
            step, mm = 0, 0
        else:
            step, mm = 1, int(func.__name__.split(".")[0] in _MATMULS)
            self.operations += 1
            self.matmuls += mm
        # In-place results and new tensors alike get the new depth (a reused address is overwritten).
        for t in outs:
            self.depth[t.untyped_storage().data_ptr()] = (deepest[0] + step, deepest[1] + mm)
        return out


def dependency_depth(fn, *args, **kwargs) -> tuple[DependencyCount, object]:
    """Run ``fn(*args, **kwargs)``; return its :class:`DependencyCount` and its result.

    Depth is counted over tensor storages: an operation's results are one deeper than its deepest
    input (views: as deep). Deterministic: it counts operations, not time.

    Source: chapter 09 (work and depth of a computation, Blelloch 1996).
    """
    mode = _Depths()
    with mode:
        result = fn(*args, **kwargs)
    deepest = max(mode.depth.values(), default=(0, 0))
    return DependencyCount(depth=deepest[0], operations=mode.operations,
                           matmul_depth=max((m for _, m in mode.depth.values()), default=0),
                           matmuls=mode.matmuls), result
