"""Issue 27: every chapter has at least four exercises, each with its checker, counted from the stored notebooks.

Chapters 02-08 are listed here; a chapter joins MIN_EXERCISES when its exercises are written.
"""

from __future__ import annotations

import importlib
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MIN_EXERCISES = {n: 4 for n in range(2, 9)}


def _notebook(n: int) -> dict:
    (path,) = (ROOT / "notebooks").glob(f"{n:02d}_*.ipynb")
    return json.loads(path.read_text())


@pytest.mark.parametrize("n", sorted(MIN_EXERCISES))
def test_chapter_has_enough_checked_exercises(n):
    cells = _notebook(n)["cells"]
    markdown = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
    numbers = re.findall(rf"\*\*Exercise ({n}\.\d+)", markdown)
    assert len(numbers) >= MIN_EXERCISES[n] and len(set(numbers)) == len(numbers), numbers
    # each exercise's stub is checked by one of the chapter's checks, and each check has its exercise
    module = importlib.import_module(f"selfattn.exercises.ch{n:02d}")
    checks = {name for name in module.__all__ if name.startswith("check_")}
    code = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
    used = set(re.findall(rf"ch{n:02d}\.(check_\w+)\(", code))
    assert checks <= used, f"checks without a notebook exercise: {sorted(checks - used)}"
    exercise_names = {getattr(module, name).exercise.split()[0] for name in checks}
    assert set(numbers) == exercise_names, (sorted(numbers), sorted(exercise_names))
    stubs = [c for c in cells if c["cell_type"] == "code" and "raise NotImplementedError" in "".join(c["source"])]
    assert len(stubs) >= MIN_EXERCISES[n]
