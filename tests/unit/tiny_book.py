"""A tiny throwaway book laid out as the real one (notebooks/ under a book folder, a one-file intro,
book/_ext's execution extension), for the tests of that extension (test_book_cache.py,
test_book_parallel_exec.py), and the build they run: scripts/build_book.py with `make book`'s flags."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "build_book.py"
EXT = ROOT / "book" / "_ext"
FLAGS = ["-W", "-n", "--keep-going", "--all"]  # the Makefile's BOOK_FLAGS


def notebook(codes: list[str]) -> str:
    """A stored notebook (outputs stripped): a title cell, then one code cell per source in ``codes``."""
    cells = [{"cell_type": "markdown", "metadata": {}, "source": "# A chapter"}]
    cells += [{"cell_type": "code", "execution_count": None, "metadata": {}, "outputs": [], "source": c}
              for c in codes]
    return json.dumps({
        "cells": cells,
        "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}},
        "nbformat": 4, "nbformat_minor": 4,
    })


def write_book(root: Path, mode: str, extra_config: str = "") -> Path:
    """``_config.yml`` (execution ``mode``, the extension, raise on error; ``extra_config``: more
    lines under ``sphinx.config``), a toc of notebooks/01_a and notebooks/02_b, an intro; the
    notebooks are the caller's. Returns ``root``."""
    (root / "notebooks").mkdir(parents=True)
    (root / "_config.yml").write_text(
        "title: tiny\nonly_build_toc_files: true\n"
        f"execute:\n  execute_notebooks: {mode}\n  timeout: 300\n  allow_errors: false\n"
        f"sphinx:\n  local_extensions:\n    selfattn_parallel_exec: {EXT}\n"
        "  config:\n    nb_execution_raise_on_error: true\n" + extra_config
    )
    (root / "_toc.yml").write_text(
        "format: jb-book\nroot: intro\nchapters:\n  - file: notebooks/01_a\n  - file: notebooks/02_b\n")
    (root / "intro.md").write_text("# Intro\n")
    return root


def build(book: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    """Build ``book`` as `make book` does, two notebooks at a time, with ``env`` (the kernels get their
    one BLAS/OpenMP thread from the extension, not from the caller's OMP_NUM_THREADS)."""
    env = {**env, "SELFATTN_BOOK_JOBS": "2"}
    env.pop("OMP_NUM_THREADS", None)
    return subprocess.run([sys.executable, str(SCRIPT), str(book), *FLAGS], capture_output=True,
                          text=True, timeout=600, cwd=book, env=env)
