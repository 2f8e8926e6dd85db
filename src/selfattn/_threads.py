"""One CPU thread for a block of work, restored afterwards: the chapters' small trainings use it so that
their results do not depend on the machine's thread count or load (a reduction split over threads
adds in another order). Introduced in chapter 02."""

from __future__ import annotations

import contextlib

import torch


@contextlib.contextmanager
def one_thread():
    """``torch.set_num_threads(1)`` inside the block, the previous thread count after it (also on error)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)
