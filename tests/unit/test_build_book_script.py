"""scripts/build_book.py (what `make book` runs) ends a failed build with the failing notebook, cell,
source line and exception, instead of Sphinx's "please report this" banner."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "build_book.py"


def _load_script():
    spec = importlib.util.spec_from_file_location("build_book", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def _notebook(cells: list[tuple[str, str]]) -> str:
    return json.dumps({
        "cells": [
            {"cell_type": kind, "metadata": {}, "source": src,
             **({"outputs": [], "execution_count": None} if kind == "code" else {})}
            for kind, src in cells
        ],
        "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}},
        "nbformat": 4, "nbformat_minor": 5,
    })


def _tiny_book(root: Path) -> Path:
    (root / "notebooks").mkdir(parents=True)
    (root / "_config.yml").write_text(
        "title: tiny\nexecute:\n  execute_notebooks: force\n  allow_errors: false\n"
        "sphinx:\n  config:\n    nb_execution_raise_on_error: true\n"
    )
    (root / "_toc.yml").write_text("format: jb-book\nroot: intro\nchapters:\n  - file: notebooks/08_x\n")
    (root / "intro.md").write_text("# Intro\n")
    (root / "notebooks" / "08_x.ipynb").write_text(_notebook([
        ("markdown", "# A failing chapter"),
        ("code", "x = 1\nprint(x)"),
        ("markdown", "The next cell fails."),
        ("code", "y = 2\nassert x == y, f'x is {x}, not {y}'\nprint('never')"),
    ]))
    return root


@pytest.mark.slow
def test_failed_build_ends_with_notebook_cell_line_and_assertion(tmp_path):
    book = _tiny_book(tmp_path / "book")
    proc = subprocess.run([sys.executable, str(SCRIPT), str(book)], capture_output=True, text=True,
                          timeout=300, cwd=tmp_path)
    assert proc.returncode != 0
    last = [ln for ln in proc.stdout.splitlines() if ln.strip()][-3:]
    assert last == [
        "FAILED: notebooks/08_x.ipynb, cell 4 (code cell 2), line 2:",
        "    assert x == y, f'x is {x}, not {y}'",
        "AssertionError: x is 1, not 2",
    ], proc.stdout[-3000:]
    assert (book / "_build" / "book-build.log").is_file()


def test_report_file_form_is_read_too(tmp_path):
    """With nb_execution_raise_on_error false, MyST-NB saves the traceback in html/reports/."""
    build_book = _load_script()
    book = _tiny_book(tmp_path / "book")
    reports = book / "_build" / "html" / "reports" / "notebooks"
    reports.mkdir(parents=True)
    (reports / "08_x.err.log").write_text(
        "An error occurred while executing the following cell:\n------------------\n"
        "y = 2\nassert x == y, f'x is {x}, not {y}'\nprint('never')\n------------------\n\n\n"
        "\x1b[31mAssertionError\x1b[39m                            Traceback (most recent call last)\n"
        "Cell In[2], line 2\n      1 y = 2\n----> 2 assert x == y, f'x is {x}, not {y}'\n\n"
        "\x1b[31mAssertionError\x1b[39m: x is 1, not 2\n"
    )
    lines = build_book.summary("build output without an exception\n", 1, book,
                               book / "_build" / "html" / "reports", Path("log"))
    assert lines[-3:] == [
        "FAILED: notebooks/08_x.ipynb, cell 4 (code cell 2), line 2:",
        "    assert x == y, f'x is {x}, not {y}'",
        "AssertionError: x is 1, not 2",
    ]


def test_timeout_names_the_cell_from_nbclients_preview(tmp_path):
    build_book = _load_script()
    book = _tiny_book(tmp_path / "book")
    nb = book / "notebooks" / "08_x.ipynb"
    nb.write_text(_notebook([("markdown", "# t"), ("code", "import time\ntime.sleep(20)\nprint(1)")]))
    output = (
        "Traceback (most recent call last):\n"
        "nbclient.exceptions.CellTimeoutError: A cell timed out while it was being executed, after 3 seconds.\n"
        "The message was: Cell execution timed out.\nHere is a preview of the cell contents:\n"
        "-------------------\nimport time\ntime.sleep(20)\n-------------------\n\n"
        "The above exception was the direct cause of the following exception:\n\n"
        f"myst_nb.core.execute.base.ExecutionError: {nb}\n"
    )
    lines = build_book.summary(output, 1, book, None, Path("log"))
    assert lines[-3:] == [
        "FAILED: notebooks/08_x.ipynb, cell 2 (code cell 1):",
        "    import time",
        "CellTimeoutError: A cell timed out while it was being executed, after 3 seconds.",
    ]


def test_error_raised_inside_a_function_names_the_cells_line(tmp_path):
    build_book = _load_script()
    book = _tiny_book(tmp_path / "book")
    nb = book / "notebooks" / "08_x.ipynb"
    nb.write_text(_notebook([("code", "import selfattn\n\nselfattn.causal_mask(3, 4)")]))
    output = (
        "nbclient.exceptions.CellExecutionError: An error occurred while executing the following cell:\n"
        "------------------\nimport selfattn\n\nselfattn.causal_mask(3, 4)\n------------------\n\n\n"
        "ValueError                                Traceback (most recent call last)\n"
        "Cell In[1], line 3\n      1 import selfattn\n----> 3 selfattn.causal_mask(3, 4)\n\n"
        "File ~/src/selfattn/masks.py:40, in causal_mask(T, S, alignment)\n"
        "     39 if S != T and alignment is None:\n"
        "---> 40     raise ValueError(\"causal_mask: T=3 != S=4 needs alignment\")\n\n"
        "ValueError: causal_mask: T=3 != S=4 needs alignment\n\n\n"
        "The above exception was the direct cause of the following exception:\n\n"
        f"myst_nb.core.execute.base.ExecutionError: {nb}\n"
    )
    assert build_book.summary(output, 1, book, None, Path("log"))[-3:] == [
        "FAILED: notebooks/08_x.ipynb, cell 1 (code cell 1), line 3:",
        "    selfattn.causal_mask(3, 4)",
        "ValueError: causal_mask: T=3 != S=4 needs alignment",
    ]


def test_warnings_are_summarised_when_no_notebook_failed(tmp_path):
    build_book = _load_script()
    output = "reading sources...\n/book/intro.md:3: WARNING: undefined label: 'nowhere'\nbuild finished with problems\n"
    lines = build_book.summary(output, 1, tmp_path, None, Path("log"))
    assert lines[-2:] == ["FAILED: 1 warning(s), errors under -W; the first:",
                          "/book/intro.md:3: WARNING: undefined label: 'nowhere'"]
