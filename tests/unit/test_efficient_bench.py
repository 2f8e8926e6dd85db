"""bench/attention_bench.py and bench/decode_bench.py run end to end in --quick mode and print their tables (no timing is
asserted: speed is measured by the bench itself, never by a test)."""

import subprocess
import sys
from pathlib import Path

import pytest

from selfattn.device import cpu_cache_sizes

BENCH = Path(__file__).resolve().parents[2] / "bench" / "attention_bench.py"


@pytest.mark.slow
def test_bench_quick_prints_tables():
    run = subprocess.run([sys.executable, str(BENCH), "--quick"], capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stderr[-3000:]
    out = run.stdout
    assert "| T | causal | naive | SDPA | tiled | NumPy | naive/SDPA | tiled/SDPA |" in out
    assert "| T | causal | naive | SDPA | tiled | NumPy | tiled/SDPA | tiled/naive |" in out
    rows = [line for line in out.splitlines() if line.startswith("| 256 |") or line.startswith("| 512 |")]
    assert len(rows) == 16  # 2 sizes x causal or not, in each of the four tables (forward and training)
    assert "GFLOP/s" in out and "## Targets" in out
    assert "vector ISA" in out and "cores)" in out and "load average" in out  # the machine class of the ratios
    # forward plus backward: time (SDPA and tiled) and peak memory (naive, SDPA, tiled) at both sizes
    assert "| T | causal | SDPA | tiled | tiled/SDPA |" in out
    assert "| T | causal | naive | SDPA | tiled | naive x2T | SDPA x2T | tiled x2T |" in out
    assert "--quick does not compile flex_attention" in out
    # --quick does not reach T=4096 or 8192: each target says so, not "skipped" (which, in the
    # tables, means over the memory budget)
    targets = [t for t in out.split("## Targets", 1)[1].strip().splitlines() if t.startswith("- ")]
    assert len(targets) == 12 and all("NOT MEASURED (T=" in t and "skipped" not in t for t in targets), targets


def test_gpu_check_says_clearly_when_there_is_no_gpu():
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA GPU is present: the GPU check is run by hand (it writes bench/results/)")
    script = BENCH.parent / "gpu_check.py"
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "no CUDA GPU" in run.stdout
    # a GPU runner that got a CPU build of torch must not pass green
    required = subprocess.run([sys.executable, str(script), "--require-gpu"], capture_output=True, text=True,
                              timeout=120)
    assert required.returncode == 1 and "no CUDA GPU" in required.stdout, (required.returncode, required.stderr[-2000:])


@pytest.mark.slow
def test_decode_bench_quick_prints_its_tables_and_names_the_machine():
    script = BENCH.parent / "decode_bench.py"
    run = subprocess.run([sys.executable, str(script), "--quick"], capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stderr[-3000:]
    out = run.stdout
    assert "vector ISA" in out and "cores)" in out  # the header names the CPU class the ratios hold for
    assert "| context L | cached tok/s | uncached tok/s | cached / uncached |" in out
    rows = [line for line in out.splitlines() if line.split("|")[1:2] in ([" 64 "], [" 256 "], [" 1024 "])]
    assert len(rows) == 3
    assert "## Roofline of this machine" in out and "memory-bound by the roofline" in out
    assert "| Llama 3.1 8B | 1.10 | 4096 |" in out  # counted, not timed: the same on every machine


def test_head_groups_table_has_both_passes_and_both_masks():
    """The bench's side-by-side measurement of the head split (run here on a tiny size with 2 threads):
    four rows, each with finite positive times; no timing is asserted."""
    import importlib.util

    import torch

    sys.path.insert(0, str(BENCH.parent))
    try:
        spec = importlib.util.spec_from_file_location("attention_bench_module", BENCH)
        bench = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(bench)
    finally:
        sys.path.remove(str(BENCH.parent))
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        groups = bench.measure_head_groups(1, T=64)
    finally:
        torch.set_num_threads(before)
    assert len(groups) == 12 and all(t > 0 and t == t for t in groups.values())
    rows = [line for line in bench.render_head_groups(groups, 2) if line.startswith("| forward")]
    assert len(rows) == 4 and rows[0].startswith("| forward | no |") and rows[3].startswith("| forward+backward | yes |")


def test_bench_header_names_the_processor_generation_and_its_caches(monkeypatch, tmp_path):
    """"AMD EPYC" alone names no machine class: the header adds the vendor's family, model and stepping
    (from /proc/cpuinfo's first processor) and the data caches a core sees (sysfs), here from a fake
    sysfs; the instruction cache is left out."""
    sys.path.insert(0, str(BENCH.parent))
    try:
        import bench_machine
    finally:
        sys.path.remove(str(BENCH.parent))
    for index, (level, kind, size) in enumerate([("1", "Data", "48K"), ("1", "Instruction", "32K"),
                                                 ("2", "Unified", "1024K"), ("3", "Unified", "32768K")]):
        folder = tmp_path / f"index{index}"
        folder.mkdir()
        for name, text in (("level", level), ("type", kind), ("size", size)):
            (folder / name).write_text(text + "\n")
    monkeypatch.setattr(bench_machine, "cpu_cache_sizes", lambda: cpu_cache_sizes(str(tmp_path)))
    name = bench_machine.cpu_name()
    assert "L1d 48 KiB, L2 1 MiB, L3 32 MiB;" in name and "L1i" not in name, name
    assert name.endswith(" cores)"), name
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists() and "cpu family" in cpuinfo.read_text():
        first = cpuinfo.read_text().split("\n\n")[0]
        field = {k.strip(): v.strip() for k, _, v in (line.partition(":") for line in first.splitlines())}
        assert name.startswith(field["model name"] + " (")
        assert (f"{field['vendor_id']} family {field['cpu family']} model {field['model']} "
                f"stepping {field['stepping']};") in name, name
