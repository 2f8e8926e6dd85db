"""Work-arounds for defects in the libraries under the package, applied once at import.

MKL's vector maths library (VML) races while it picks its CPU kernels
----------------------------------------------------------------------
PyTorch's CPU build computes ``torch.exp``, ``log``, ``sqrt``, ``tanh``, ``sin``, ``cos`` and
``erf`` of float32 and float64 tensors with MKL VML (``vmsExp``/``vmdExp`` and relatives), asking
for its high-accuracy (HA) kernels, from every OpenMP thread of the operation. VML chooses the
kernel from a table indexed by ``cpu_type + 6 * (accuracy - 1)``. It finds ``cpu_type`` lazily, on
the first call in the process, in ``mkl_vml_serv_cpu_detect``, which has no lock. It stores
the raw result of CPU detection in a global, then stores it again mapped to the table's range
(raw 9 is stored as 5, for example). A second thread that reads the global between the two stores takes
the raw value. On Intel CPUs whose raw type is 8 or 9 (AVX-512 Xeons), that index falls in the
block of enhanced-performance (EP) kernels. For that one call, that thread's share of the tensor
is then computed to about half the bits: a relative error of 3.3e-9 in float64 and 1.5e-4 in
float32, against 1.1e-16 and 6e-8 with the right kernel. Measured with MKL 2024.2 in torch
2.13.0, by writing the raw value into the global; ``tests/unit/test_workarounds.py`` repeats that.

It happens only on the first VML call of a process, only when that call is split over two or more
threads (ATen splits element-wise work of 32768 elements or more), and only when a thread is
descheduled inside that window: the issue's reproduction showed it in 3 of 30 fresh processes on
a busy machine, and chapter 09's float64 check (asserted to 1e-12) failed by 1.6e-9 in 2 of 3
builds. Every raw type from 2 to 9 differs from its mapped one and so selects another row of the
table; raw 8 and 9 (recent Intel CPUs) select EP kernels, measured above. On AMD CPUs MKL's raw
and mapped types are both 0 (seen on the AMD EPYC this course is built on), so it cannot happen
there.

The work-around: run one VML call on this thread before any parallel one. A one-element tensor is
below ATen's parallel grain size, so the call runs on this thread alone and leaves the global
set. Once it is set, no thread writes it again. Source: chapter 09 (its box "Why a float64 check
once failed").
"""

from __future__ import annotations

import torch

__all__ = ["initialise_mkl_vml"]


def initialise_mkl_vml() -> None:
    """Let MKL VML detect the CPU now, on the calling thread, before any multi-threaded call.

    Called once by ``import selfattn``; calling it again does nothing more. It does nothing when
    torch is not built with MKL (no VML is used then). See the module docstring for the race it
    prevents.
    """
    if torch.backends.mkl.is_available():
        torch.exp(torch.zeros(1, dtype=torch.float64))  # one element: runs on this thread only
