"""selfattn._runcache: in `make test` the book's build computes each long experiment and the tests
read it; the same call by the same code is reused, any other is computed, and nothing is reused
outside `make test`."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
import torch

from selfattn import _runcache
from selfattn._runcache import READ, WRITE, run_key, shared_run

ROOT = Path(__file__).resolve().parents[2]
CALLS: list[tuple] = []


@shared_run
def _experiment(ids: torch.Tensor, *, seed: int = 0, sizes=(1, 2), progress: bool = False):
    CALLS.append((seed, tuple(sizes), progress))
    torch.manual_seed(seed)
    return {"total": float(ids.double().sum()) + seed, "draw": torch.rand(3)}


@pytest.fixture
def runs(tmp_path, monkeypatch):
    CALLS.clear()
    monkeypatch.delenv(WRITE, raising=False)
    monkeypatch.delenv(READ, raising=False)
    return tmp_path / "runs"


def test_without_the_variables_every_call_is_computed(runs):
    ids = torch.arange(5)
    assert _experiment(ids)["total"] == 10.0 and _experiment(ids)["total"] == 10.0
    assert len(CALLS) == 2 and not runs.exists()


def test_the_tests_read_what_the_build_wrote_and_compute_anything_else(runs, monkeypatch):
    ids = torch.arange(5)
    monkeypatch.setenv(WRITE, str(runs))
    written = _experiment(ids, seed=3, progress=True)
    assert len(CALLS) == 1 and len(list(runs.glob("*.pt"))) == 1
    monkeypatch.delenv(WRITE)
    monkeypatch.setenv(READ, str(runs))
    read = _experiment(ids, seed=3)  # progress is not part of the key
    assert len(CALLS) == 1, "the build's result was computed again"
    assert read["total"] == written["total"] == 13.0 and torch.equal(read["draw"], written["draw"])
    _experiment(ids, seed=4)  # another argument: computed
    _experiment(torch.arange(1, 6), seed=3)  # other contents of a tensor: computed
    _experiment(ids, seed=3, sizes=[1, 2])  # a list keys as the tuple of the same items: reused
    assert [c[0] for c in CALLS] == [3, 4, 3]
    assert len(list(runs.glob("*.pt"))) == 1, "a reader wrote to the build's folder"


def test_a_reused_call_leaves_the_random_state_as_a_computed_one_does(runs, monkeypatch):
    ids = torch.arange(4)
    _experiment(ids, seed=7)
    after_computed = torch.rand(4)
    monkeypatch.setenv(WRITE, str(runs))
    _experiment(ids, seed=7)
    monkeypatch.delenv(WRITE)
    monkeypatch.setenv(READ, str(runs))
    torch.manual_seed(12345)  # a different state before the call
    _experiment(ids, seed=7)
    assert len(CALLS) == 2
    assert torch.equal(torch.rand(4), after_computed)


def test_keys_follow_contents_modules_and_the_package_source(monkeypatch):
    a, b = torch.nn.Linear(3, 2), torch.nn.Linear(3, 2)
    with torch.no_grad():
        b.load_state_dict(a.state_dict())
    fn = _experiment.__wrapped_run__
    assert run_key(fn, (a,), {}) == run_key(fn, (b,), {})
    with torch.no_grad():
        b.weight[0, 0] += 1.0
    assert run_key(fn, (a,), {}) != run_key(fn, (b,), {})
    assert run_key(fn, (a.eval(),), {}) != run_key(fn, (b.train(),), {})
    same = run_key(fn, (torch.zeros(2),), {"seed": 1})
    assert same == run_key(fn, (torch.zeros(2),), {"seed": 1, "progress": True})
    assert same != run_key(fn, (torch.zeros(2, dtype=torch.float64),), {"seed": 1})
    monkeypatch.setattr(_runcache, "_source_digest", lambda: "another package source")
    assert same != run_key(fn, (torch.zeros(2),), {"seed": 1})
    with pytest.raises(_runcache._Unkeyable):
        run_key(fn, (lambda: 0,), {})


def test_an_argument_without_contents_is_computed_every_time(runs, monkeypatch):
    monkeypatch.setenv(READ, str(runs))
    runs.mkdir()

    @shared_run
    def apply(f):
        CALLS.append(f)
        return f()

    assert apply(lambda: 2) == 2 and apply(lambda: 2) == 2 and len(CALLS) == 2


def test_a_reader_waits_for_the_build_computing_the_same_call(runs, tmp_path, monkeypatch):
    """The build holds the key's lock while it computes; a test reaching the same call meanwhile
    waits and reads the result, it does not compute it a second time."""
    module = tmp_path / "gated_experiment.py"
    module.write_text(textwrap.dedent("""
        import os, time
        import torch
        from selfattn._runcache import shared_run

        @shared_run
        def gated(n, gate):
            open(gate + ".started", "w").close()  # the lock is held from here on
            while not os.path.exists(gate):
                time.sleep(0.02)
            with open(gate + ".calls", "a") as f:
                f.write("x")
            return torch.arange(n) * 2
    """))
    gate = str(tmp_path / "gate")
    env = {**os.environ, WRITE: str(runs), "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT / "src")])}
    env.pop(READ, None)
    writer = subprocess.Popen([sys.executable, "-c", f"import gated_experiment as g; g.gated(5, {gate!r})"], env=env)
    try:
        for _ in range(3000):  # the writer has started computing, or died
            if os.path.exists(gate + ".started") or writer.poll() is not None:
                break
            time.sleep(0.02)
        assert os.path.exists(gate + ".started"), f"the writer did not start (exit {writer.poll()})"
        monkeypatch.syspath_prepend(str(tmp_path))
        monkeypatch.setenv(READ, str(runs))
        import gated_experiment

        got = []
        reader = threading.Thread(target=lambda: got.append(gated_experiment.gated(5, gate)))
        reader.start()
        Path(gate).touch()  # let the writer finish
        reader.join(timeout=120)
        assert writer.wait(timeout=120) == 0
    finally:
        Path(gate).touch()
        writer.kill()
    assert not reader.is_alive()
    assert torch.equal(got[0], torch.arange(5) * 2)
    assert Path(gate + ".calls").read_text() == "x", "the reader computed the call itself"


def test_make_test_shares_one_folder_between_the_build_and_the_tests():
    recipe = (ROOT / "Makefile").read_text().split("\ntest:", 1)[1].split("\n\n", 1)[0]
    assert f"{WRITE}=$(RUNS)" in recipe and f"{READ}=$(RUNS)" in recipe
    assert "RUNS" in (ROOT / "Makefile").read_text().split("\ntest:", 1)[0]
