"""book/_ext/selfattn_parallel_exec.py: the book's notebooks are executed two at a time, at every
build in ``force`` mode, and a failing cell still fails the build with the notebook, cell, line and
exception. (The book's ``cache`` mode, which keeps executions across builds, is tested in
test_book_cache.py.)

A tiny throwaway book with two notebooks that import a module next to them (as the chapters
import ``selfattn`` from src/), built three times with the flags `make book` uses: the second
build must show the module's new value (no execution is reused across builds), and the third,
where a cell fails, must end with scripts/build_book.py's summary. The two notebooks wait for each
other before going on, so a build that executed them one after another would fail.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from .tiny_book import EXT, ROOT, build, notebook, write_book

RENDEZVOUS = """\
import time
from pathlib import Path

Path("started-{me}").touch()
deadline = time.monotonic() + 120
while not Path("started-{other}").exists():
    assert time.monotonic() < deadline, "the other notebook did not start: not executed in parallel"
    time.sleep(0.1)"""


def _tiny_book(root: Path) -> Path:
    nbs = write_book(root, "force") / "notebooks"
    (nbs / "01_a.ipynb").write_text(notebook([
        RENDEZVOUS.format(me="a", other="b"),
        "import helper\nprint(f'value={helper.VALUE}')",
        "import os\nprint(f'threads={os.environ.get(\"OMP_NUM_THREADS\")}')",
    ]))
    (nbs / "02_b.ipynb").write_text(notebook([
        RENDEZVOUS.format(me="b", other="a"),
        "import helper\nok = helper.OK\nassert ok, f'helper.OK is {ok}'",
    ]))
    return root


def _build(book: Path, value: str, ok: bool) -> subprocess.CompletedProcess:
    nbs = book / "notebooks"
    (nbs / "helper.py").write_text(f"VALUE = {value!r}\nOK = {ok!r}\n")
    for flag in nbs.glob("started-*"):
        flag.unlink()
    return build(book, dict(os.environ))


def _outputs(book: Path, stem: str) -> str:
    nb = json.loads((book / "_build" / "jupyter_execute" / "notebooks" / f"{stem}.ipynb").read_text())
    texts = [o.get("text", "") for c in nb["cells"] if c["cell_type"] == "code" for o in c["outputs"]]
    return "".join("".join(t) if isinstance(t, list) else t for t in texts)


@pytest.mark.slow
def test_notebooks_run_in_parallel_fresh_at_every_build_and_failures_are_named(tmp_path):
    book = _tiny_book(tmp_path / "book")

    first = _build(book, "first", True)
    assert first.returncode == 0, first.stdout[-4000:] + first.stderr[-4000:]
    log = first.stdout
    assert "Executing 2 notebook(s), 2 at a time" in log, log[-4000:]
    assert len([ln for ln in log.splitlines() if ln.startswith("chapter ") and " done in " in ln]) == 2, log[-4000:]
    assert "Executing notebook using" not in log, log[-4000:]  # MyST-NB executed nothing itself
    assert "value=first" in _outputs(book, "01_a")
    assert "threads=1" in _outputs(book, "01_a")
    assert "value=first" in (book / "_build" / "html" / "notebooks" / "01_a.html").read_text()

    second = _build(book, "second", True)  # the module changed, the notebooks did not
    assert second.returncode == 0, second.stdout[-4000:] + second.stderr[-4000:]
    assert "value=second" in _outputs(book, "01_a"), "an execution of the first build was reused"
    page = (book / "_build" / "html" / "notebooks" / "01_a.html").read_text()
    assert "value=second" in page and "value=first" not in page

    third = _build(book, "third", False)
    assert third.returncode != 0, third.stdout[-4000:]
    last = [ln for ln in third.stdout.splitlines() if ln.strip()][-3:]
    assert last == [
        "FAILED: notebooks/02_b.ipynb, cell 3 (code cell 2), line 3:",
        "    assert ok, f'helper.OK is {ok}'",
        "AssertionError: helper.OK is False",
    ], third.stdout[-4000:] + third.stderr[-4000:]


def test_jobs_reads_the_variable_and_refuses_nonsense(monkeypatch):
    sys.path.insert(0, str(EXT))
    import selfattn_parallel_exec as ext

    monkeypatch.setenv("SELFATTN_BOOK_JOBS", "3")
    assert ext.jobs() == 3
    monkeypatch.delenv("SELFATTN_BOOK_JOBS")
    assert 1 <= ext.jobs() <= 2  # the default: two, or one on a single usable CPU
    for bad in ("0", "-1", "two"):
        monkeypatch.setenv("SELFATTN_BOOK_JOBS", bad)
        with pytest.raises(ValueError, match="SELFATTN_BOOK_JOBS must be a whole number >= 1"):
            ext.jobs()


def test_the_slowest_chapters_start_first_and_the_rest_keep_reading_order():
    sys.path.insert(0, str(EXT))
    import selfattn_parallel_exec as ext

    chosen = {f"notebooks/{n}": Path(f"{n}.ipynb") for n in ("00_a", "08_b", "11_c", "14_d")}
    first = ["notebooks/11_c", "notebooks/99_not_in_this_build", "notebooks/08_b"]
    assert ext.start_order(chosen, first) == ["notebooks/11_c", "notebooks/08_b", "notebooks/00_a", "notebooks/14_d"]
    assert ext.start_order(chosen, []) == list(chosen)


def test_config_names_only_chapters_that_exist():
    import yaml

    config = yaml.safe_load((ROOT / "_config.yml").read_text())
    first = config["sphinx"]["config"]["selfattn_execute_first"]
    assert first and all((ROOT / f"{docname}.ipynb").is_file() for docname in first), first
