"""book/_ext/selfattn_parallel_exec.py in ``cache`` mode (the book's): a second build with nothing
changed executes nothing; a change to the package the notebooks import re-executes them and the
rebuilt page shows the new number; a change to one notebook's code re-executes that notebook only.

A tiny throwaway book laid out as the real one (notebooks/ importing a package from src/ through
PYTHONPATH, as the chapters import ``selfattn``), built with scripts/build_book.py and the flags
`make book` uses. Each notebook also appends a line to a file of its own at every execution, so that
"executed nothing" is counted by the notebooks themselves, not only read from the build's log.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from .tiny_book import EXT, build, notebook, write_book


def _count_run(me: str) -> str:
    return f"with open('runs-{me}.txt', 'a') as f:\n    f.write('ran\\n')"


def _tiny_book(root: Path) -> Path:
    write_book(root, "cache", "    selfattn_execution_inputs: [src]\n")
    (root / "src" / "tinypkg").mkdir(parents=True)
    (root / "src" / "tinypkg" / "__init__.py").write_text("from .numbers import value\n")
    _write_a(root, "print(f'a says {tinypkg.value()}')")
    (root / "notebooks" / "02_b.ipynb").write_text(notebook([
        _count_run("b"),
        "import tinypkg\nprint(f'b says {tinypkg.value() + 1}')",
    ]))
    return root


def _write_a(book: Path, line: str) -> None:
    (book / "notebooks" / "01_a.ipynb").write_text(notebook([_count_run("a"), f"import tinypkg\n{line}"]))


def _set_value(book: Path, value: int) -> None:
    (book / "src" / "tinypkg" / "numbers.py").write_text(f"def value():\n    return {value}\n")


def _build(book: Path) -> subprocess.CompletedProcess:
    proc = build(book, {**os.environ, "PYTHONPATH": str(book / "src")})
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return proc


def _runs(book: Path, me: str) -> int:
    path = book / "notebooks" / f"runs-{me}.txt"
    return len(path.read_text().splitlines()) if path.is_file() else 0


def _page(book: Path, stem: str) -> str:
    return (book / "_build" / "html" / "notebooks" / f"{stem}.html").read_text()


def _executed(book: Path, stem: str) -> dict:
    return json.loads((book / "_build" / "jupyter_execute" / "notebooks" / f"{stem}.ipynb").read_text())


def _progress(log: str) -> list[str]:
    return [ln.split(" (total ")[0] for ln in log.splitlines() if ln.startswith("chapter ")]


@pytest.mark.slow
def test_cache_reuses_executions_until_the_package_or_the_notebook_changes(tmp_path):
    book = _tiny_book(tmp_path / "book")
    _set_value(book, 41)

    first = _build(book)
    assert (_runs(book, "a"), _runs(book, "b")) == (1, 1), first.stdout[-4000:]
    assert "a says 41" in _page(book, "01_a") and "b says 42" in _page(book, "02_b")
    assert "Executing 2 notebook(s), 2 at a time" in first.stdout, first.stdout[-4000:]
    progress = _progress(first.stdout)  # "chapter i/n <docname> done in Xs", in the order they finish
    assert [p.split()[1] for p in progress] == ["1/2", "2/2"], first.stdout[-4000:]
    assert sorted(p.split()[2] for p in progress) == ["notebooks/01_a", "notebooks/02_b"], progress
    assert all(p.split()[3:5] == ["done", "in"] for p in progress), progress
    executed_first = _executed(book, "01_a")

    # Nothing changed: nothing is executed, the pages and executed notebooks are the same.
    second = _build(book)
    assert (_runs(book, "a"), _runs(book, "b")) == (1, 1), second.stdout[-4000:]
    assert "Executing 0 notebook(s)" in second.stdout and "2 of 2 from the cache" in second.stdout, \
        second.stdout[-4000:]
    assert _progress(second.stdout) == ["chapter 1/2 notebooks/01_a from the cache",
                                        "chapter 2/2 notebooks/02_b from the cache"], second.stdout[-4000:]
    assert "a says 41" in _page(book, "01_a") and "b says 42" in _page(book, "02_b")
    executed_second = _executed(book, "01_a")
    assert executed_second["cells"] == executed_first["cells"]
    assert [c["outputs"] for c in executed_second["cells"] if c["cell_type"] == "code"][1] != []

    # One file of the package changes the number both notebooks print: both are executed again.
    _set_value(book, 7)
    third = _build(book)
    assert (_runs(book, "a"), _runs(book, "b")) == (2, 2), third.stdout[-4000:]
    page_a, page_b = _page(book, "01_a"), _page(book, "02_b")
    assert "a says 7" in page_a and "a says 41" not in page_a, "a stale output was served"
    assert "b says 8" in page_b and "b says 42" not in page_b, "a stale output was served"
    caches = [p.name for p in (book / "_build" / ".jupyter_cache").iterdir()]
    assert len(caches) == 1 and caches[0].startswith("selfattn-"), caches  # the old key's folder is gone

    # One notebook's code changes: that notebook only is executed again.
    _write_a(book, "print(f'a now says {tinypkg.value() * 10}')")
    fourth = _build(book)
    assert (_runs(book, "a"), _runs(book, "b")) == (3, 2), fourth.stdout[-4000:]
    assert "a now says 70" in _page(book, "01_a") and "b says 8" in _page(book, "02_b")
    assert "1 of 2 from the cache" in fourth.stdout, fourth.stdout[-4000:]


def test_inputs_key_follows_every_file_and_ignores_bytecode(tmp_path):
    sys.path.insert(0, str(EXT))
    import selfattn_parallel_exec as ext

    pkg = tmp_path / "src" / "pkg"
    pkg.mkdir(parents=True)
    (pkg / "a.py").write_text("X = 1\n")
    (pkg / "data.json").write_text("{}\n")

    def key(**settings) -> str:
        return ext.inputs_key(tmp_path, ["src", "bench"], **{"timeout": 900, "allow_errors": False,
                                                             "in_temp": False, **settings})

    base = key()
    assert len(base) == 20 and base == key()
    (pkg / "__pycache__").mkdir()
    (pkg / "__pycache__" / "a.cpython-312.pyc").write_bytes(b"\0bytecode")
    assert key() == base  # bytecode is not an input
    (pkg / "data.json").write_text("{\"x\": 1}\n")
    changed = key()
    assert changed != base  # any file, not only Python
    (pkg / "data.json").write_text("{}\n")
    assert key() == base
    (tmp_path / "bench").mkdir()
    assert key() != base  # a listed path that appears (here an empty folder) changes the key
    (tmp_path / "bench").rmdir()
    (pkg / "b.py").write_text("")
    assert key() != base  # a new file, even empty
    (pkg / "b.py").unlink()
    assert key() == base
    assert key(timeout=60) != base and key(allow_errors=True) != base and key(in_temp=True) != base
