"""Issue 27: every chapter has at least four exercises, each with its checker, counted from the stored notebooks.

Every chapter from 02 to 14 has at least four, and the stored notebooks hold at least 55 in all (issue 27,
"Done when"), each with a registered check.
"""

from __future__ import annotations

import importlib
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MIN_EXERCISES = {n: 4 for n in range(2, 15)}


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


def _numbers(path: Path) -> list[str]:
    cells = json.loads(path.read_text())["cells"]
    markdown = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
    return re.findall(r"\*\*Exercise (\d+[a-z]?\.\d+)", markdown)


def test_at_least_55_exercises_in_all_each_with_its_check():
    """Counted from every stored notebook (00-15, with 11b and 11c): at least 55 numbered exercises, no number
    twice, and each is the exercise of a check of its chapter's module (64 when this was written)."""
    numbers = [n for path in sorted((ROOT / "notebooks").glob("*.ipynb")) for n in _numbers(path)]
    assert len(numbers) >= 55 and len(set(numbers)) == len(numbers), (len(numbers), numbers)
    registered = set()
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        module = importlib.import_module(f"selfattn.exercises.ch{path.name.split('_')[0]}")
        registered |= {getattr(module, n).exercise.split()[0] for n in module.__all__ if n.startswith("check_")}
    assert set(numbers) == registered, sorted(set(numbers) ^ registered)
    in_02_to_14 = [n for n in numbers if 2 <= int(re.match(r"\d+", n).group()) <= 14]
    assert len(in_02_to_14) >= 4 * 13, len(in_02_to_14)
