"""Build the book once per test session (executing every notebook, warnings as errors) and hand
the built site to the tests of this folder."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from .browser_support import artifacts, browser, offline_visits, site_url  # noqa: F401 - browser-test fixtures

ROOT = Path(__file__).resolve().parents[2]
# SELFATTN_BOOK_BUILD (with SELFATTN_REUSE_BOOK=1) tests another build, e.g. `--path-output DIR` -> DIR/_build.
BUILD = Path(os.environ.get("SELFATTN_BOOK_BUILD", ROOT / "_build"))
HTML = BUILD / "html"
LOG = BUILD / "book-build.log"
RC = BUILD / "book-build.rc"  # exit status of the build, written by `make test`


@pytest.fixture(scope="session")
def book_build() -> subprocess.CompletedProcess:
    """Run `jupyter-book build . -W -n --keep-going` from scratch, through scripts/build_book.py as
    `make book` does (so that a failure ends with the notebook, cell and assertion); the log is kept
    in _build/. The book's extension (book/_ext/selfattn_parallel_exec.py) executes the notebooks
    two at a time, as in `make book`; SELFATTN_BOOK_JOBS passes through to it.

    Set SELFATTN_REUSE_BOOK=1 to test an already built `_build/html` (e.g. right after `make book`).
    `make test` builds the book while the unit tests run and then runs these tests with
    SELFATTN_REUSE_BOOK=1; it writes the build's exit status to `_build/book-build.rc` (RC), which is
    then the returncode here, and a failed build is reported, not built again.
    """
    if os.environ.get("SELFATTN_REUSE_BOOK") == "1" and ((HTML / "index.html").is_file() or RC.is_file()):
        text = LOG.read_text() if LOG.is_file() else ""
        returncode = int(RC.read_text().strip() or 1) if RC.is_file() else 0
        return subprocess.CompletedProcess(args=["reused"], returncode=returncode, stdout=text, stderr="")
    # From scratch: every notebook is executed again (the execution cache, _build/.jupyter_cache,
    # goes with the rest of _build), so the site tested reflects the current src/ and notebooks.
    shutil.rmtree(BUILD, ignore_errors=True)
    BUILD.mkdir(exist_ok=True)
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "build_book.py"), str(ROOT), "-W", "-n", "--keep-going"],
        cwd=ROOT, capture_output=True, text=True, timeout=3600,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"},
    )
    LOG.write_text(proc.stdout + "\n" + proc.stderr)
    return proc


@pytest.fixture(scope="session")
def built_html(book_build) -> Path:
    if book_build.returncode != 0:
        pytest.fail(f"the book did not build; see {LOG}:\n" + (book_build.stdout + book_build.stderr)[-4000:])
    return HTML
