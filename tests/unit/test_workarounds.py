"""The work-around for MKL VML's racy CPU detection (selfattn._workarounds), and the race itself.

The race needs two threads inside the first VML call of a process and an Intel CPU, so it cannot
be waited for in a test. Instead these tests read and write the global that MKL's
``mkl_vml_serv_cpu_detect`` keeps (a static symbol of libtorch_cpu.so, found in its ELF symbol
table), each in a fresh Python process:
- with the raw value a racing thread can read on an AVX-512 Xeon, exp is computed by the low-accuracy
  kernels (the defect, seen as chapter 09's 1.6e-9 float64 difference);
- after ``import selfattn`` the global is already set, so no later call can race (the work-around:
  this test fails if ``initialise_mkl_vml`` is removed).
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import textwrap

import pytest
import torch

pytestmark = pytest.mark.skipif(
    not torch.backends.mkl.is_available(), reason="torch is not built with MKL: no VML is used"
)

# Finds the address of MKL's static `vml_cpu_type` in this process: its offset from the ELF symbol
# table of libtorch_cpu.so, plus the load address (an exported VML function's address minus its offset).
_PROBE = textwrap.dedent(
    '''
    import ctypes, mmap, struct
    from pathlib import Path
    import numpy as np
    import torch

    def vml_cpu_type_cell():
        lib = Path(torch.__file__).parent / "lib" / "libtorch_cpu.so"
        entry = np.dtype([("name", "<u4"), ("info", "u1"), ("other", "u1"), ("shndx", "<u2"),
                          ("value", "<u8"), ("size", "<u8")])
        with open(lib, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
            shoff, = struct.unpack_from("<Q", m, 0x28)
            shentsize, shnum = struct.unpack_from("<HH", m, 0x3A)
            sections = [struct.unpack_from("<IIQQQQIIQQ", m, shoff + i * shentsize) for i in range(shnum)]
            symtab = next(s for s in sections if s[1] == 2)  # SHT_SYMTAB
            strtab = sections[symtab[6]]
            names = m[strtab[4]:strtab[4] + strtab[5]]
            symbols = np.frombuffer(m[symtab[4]:symtab[4] + symtab[5]], dtype=entry)

            def offset(name):
                at = names.find(b"\\0" + name + b"\\0")
                assert at >= 0, f"{name} is not in the symbol table of {lib}: has MKL changed?"
                return int(symbols[symbols["name"] == at + 1]["value"][0])

            cpu_type, get_mode = offset(b"mkl_vml_serv_cpu_detect.vml_cpu_type"), offset(b"vmlGetMode")
        base = ctypes.cast(ctypes.CDLL(str(lib)).vmlGetMode, ctypes.c_void_p).value - get_mode
        return ctypes.c_int.from_address(base + cpu_type)

    def exp_error(dtype):
        """Largest relative error of torch.exp over 4096 values in [-20, 0], against NumPy in float64."""
        x = torch.linspace(-20, 0, 4096, dtype=torch.float64)
        got = torch.exp(x.to(dtype)).double().numpy()
        want = np.exp(x.to(dtype).double().numpy())
        err = np.abs(got - want) / want
        assert np.isfinite(err).all()
        return float(err.max())
    '''
)


def _run(body: str) -> dict:
    """Run the probe and then ``body`` in a fresh Python (one thread), return the dict it prints."""
    code = _PROBE + textwrap.dedent(body)
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert out.returncode == 0, out.stderr
    return ast.literal_eval(out.stdout.strip().splitlines()[-1])  # a dict of numbers


def test_the_raw_cpu_type_a_racing_thread_can_read_selects_low_accuracy_kernels():
    result = _run(
        """
        cell = vml_cpu_type_cell()
        assert cell.value == -1, cell.value  # torch alone has not called VML yet
        cell.value = 9  # what a thread that races the first call reads on an AVX-512 Xeon
        raced = {"raced64": exp_error(torch.float64), "raced32": exp_error(torch.float32)}
        cell.value = -1  # detect again, properly, on this one thread
        print({**raced, "ok64": exp_error(torch.float64), "ok32": exp_error(torch.float32)})
        """
    )
    # The right kernels: a few units of rounding. The raced ones: about half the bits.
    assert result["ok64"] < 4 * torch.finfo(torch.float64).eps, result
    assert result["ok32"] < 4 * torch.finfo(torch.float32).eps, result
    assert 1e-10 < result["raced64"] < 1e-7, result
    assert 1e-5 < result["raced32"] < 1e-2, result


def test_import_selfattn_sets_the_vml_cpu_type_before_any_parallel_call():
    result = _run(
        """
        cell = vml_cpu_type_cell()
        before = cell.value
        import selfattn
        after_import = cell.value
        exp_error(torch.float64)
        print({"before": before, "after_import": after_import, "after_exp": cell.value})
        """
    )
    assert result["before"] == -1, result  # not yet detected: the first VML call would race
    assert result["after_import"] != -1, result  # detected during import, on one thread
    assert result["after_import"] == result["after_exp"], result  # and never written again
