"""Bytes handed to ``torch.distributed``, counted at its entry points (chapter 12).

:class:`WireCount` wraps, while it is active, ``torch.distributed``'s ``isend``, ``irecv``, ``send``,
``recv``, ``batch_isend_irecv`` (the tensors of its ``P2POp`` list), ``all_to_all`` and
``all_to_all_single``, and adds up the bytes (``numel x element_size``) of the tensors given to them:
those that leave the rank (a send; every all-to-all chunk but the rank's own) and those received.
It shares nothing with :mod:`~selfattn.distributed.comm`'s own count, so the tests and the chapter
can check one against the other and both against the formulas.

Source: chapter 12.
"""

from __future__ import annotations

import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

__all__ = ["WireCount"]

_NAMES = ("isend", "irecv", "send", "recv", "batch_isend_irecv", "all_to_all", "all_to_all_single")


def _nbytes(x) -> int:
    return x.numel() * x.element_size()


class WireCount:
    """Context manager: while active, ``sent`` and ``received`` add up the bytes this process hands to
    torch.distributed's point-to-point and all-to-all functions; :meth:`take` returns ``(sent, received)``
    and starts again from zero. Use it in one process at a time (it replaces module attributes).

    Source: chapter 12."""

    def __init__(self):
        self.sent = self.received = 0
        self._in_batch = False
        self._orig = {}

    def take(self) -> tuple[int, int]:
        out = (self.sent, self.received)
        self.sent = self.received = 0
        return out

    def _point(self, name, sends):
        orig = self._orig[name]

        def wrapper(tensor, *args, **kwargs):
            if not self._in_batch:  # inside batch_isend_irecv its ops were counted already
                if sends:
                    self.sent += _nbytes(tensor)
                else:
                    self.received += _nbytes(tensor)
            return orig(tensor, *args, **kwargs)
        return wrapper

    def __enter__(self):
        self._orig = {name: getattr(c10d, name) for name in _NAMES}
        wrapped = {"isend": self._point("isend", True), "irecv": self._point("irecv", False),
                   "send": self._point("send", True), "recv": self._point("recv", False)}

        def batch(ops):
            for op in ops:  # op.op is the (wrapped) isend or irecv
                if op.op is wrapped["isend"]:
                    self.sent += _nbytes(op.tensor)
                else:
                    self.received += _nbytes(op.tensor)
            self._in_batch = True
            try:
                return self._orig["batch_isend_irecv"](ops)
            finally:
                self._in_batch = False

        def a2a(outputs, inputs, group=None, async_op=False):
            me = dist.get_rank(group)  # chunk `me` stays on this rank
            self.sent += sum(_nbytes(x) for j, x in enumerate(inputs) if j != me)
            self.received += sum(_nbytes(x) for j, x in enumerate(outputs) if j != me)
            return self._orig["all_to_all"](outputs, inputs, group=group, async_op=async_op)

        def a2a_single(output, inp, output_split_sizes=None, input_split_sizes=None, group=None, async_op=False):
            P, me = dist.get_world_size(group), dist.get_rank(group)
            per_row = _nbytes(inp) // max(inp.shape[0], 1)
            sizes_in = input_split_sizes or [inp.shape[0] // P] * P
            sizes_out = output_split_sizes or [output.shape[0] // P] * P
            self.sent += _nbytes(inp) - sizes_in[me] * per_row
            self.received += _nbytes(output) - sizes_out[me] * (_nbytes(output) // max(output.shape[0], 1))
            return self._orig["all_to_all_single"](output, inp, output_split_sizes, input_split_sizes, group, async_op)

        wrapped.update(batch_isend_irecv=batch, all_to_all=a2a, all_to_all_single=a2a_single)
        for name, fn in wrapped.items():  # both modules: P2POp checks its op against c10d's isend and irecv
            setattr(c10d, name, fn)
            setattr(dist, name, fn)
        return self

    def __exit__(self, *exc):
        for name, fn in self._orig.items():
            setattr(c10d, name, fn)
            setattr(dist, name, fn)
        return False
