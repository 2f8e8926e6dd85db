"""The book builds with warnings as errors and holds every chapter of the table of contents."""

from __future__ import annotations

import re

import yaml

from .conftest import ROOT


def _toc_files() -> list[str]:
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    files = [toc["root"]]
    for part in toc.get("parts", []):
        for chapter in part.get("chapters", []):
            files.append(chapter["file"])
    return files


def test_book_builds_without_warnings(book_build):
    output = book_build.stdout + book_build.stderr
    assert book_build.returncode == 0, output[-4000:]
    # Sphinx's own warnings look like "path: WARNING: message" (a kernel's log lines do not count).
    warnings = [line for line in output.splitlines() if re.search(r": (WARNING|ERROR|CRITICAL):", line)]
    assert warnings == [], "\n".join(warnings[:20])
    assert "build succeeded" in output and "finished with problems" not in output


def test_every_toc_entry_is_built(built_html):
    missing = [f for f in _toc_files() if not (built_html / f"{f}.html").is_file()]
    assert missing == []
    assert (built_html / "index.html").is_file()


def test_every_notebook_is_in_the_toc():
    in_toc = {f for f in _toc_files() if f.startswith("notebooks/")}
    on_disk = {f"notebooks/{p.stem}" for p in (ROOT / "notebooks").glob("*.ipynb")}
    assert on_disk - in_toc == set(), "notebooks missing from _toc.yml"


def test_every_notebook_was_executed_without_error(built_html):
    """The build ran every notebook of notebooks/ top to bottom: each code cell has an execution count
    and no error output (what `pytest --nbval-lax notebooks` checks; `make test` leaves that to the
    build, so that each chapter is executed once)."""
    import json

    executed = built_html.parent / "jupyter_execute" / "notebooks"
    problems = []
    for stored in sorted((ROOT / "notebooks").glob("*.ipynb")):
        path = executed / stored.name
        if not path.is_file():
            problems.append(f"{stored.name}: not executed (no {path})")
            continue
        source = [c for c in json.loads(stored.read_text())["cells"] if c["cell_type"] == "code"]
        cells = [c for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code"]
        if ["".join(c["source"]) for c in cells] != ["".join(c["source"]) for c in source]:
            problems.append(f"{stored.name}: the executed copy's code cells are not the stored notebook's")
            continue
        for i, cell in enumerate(cells, 1):
            if "".join(cell["source"]).strip() and cell.get("execution_count") is None:
                problems.append(f"{stored.name}: code cell {i} was not executed")
            errors = [o.get("ename", "") for o in cell.get("outputs", []) if o.get("output_type") == "error"]
            if errors:
                problems.append(f"{stored.name}: code cell {i} raised {errors[0]}")
    assert problems == [], "\n".join(problems)
