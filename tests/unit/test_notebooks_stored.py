"""How notebooks are stored: outputs stripped, the standard setup cell, the chapter anatomy."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
REPO_URL = yaml.safe_load((ROOT / "_config.yml").read_text())["repository"]["url"]


def _load(path: Path) -> dict:
    return json.loads(path.read_text())


def _code(nb: dict) -> list[str]:
    return ["".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code"]


def _markdown(nb: dict) -> str:
    return "\n".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "markdown")


def test_there_are_notebooks():
    assert len(NOTEBOOKS) >= 1


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_stored_without_outputs(path):
    nb = _load(path)
    with_outputs = [i for i, c in enumerate(nb["cells"]) if c["cell_type"] == "code" and (c.get("outputs") or c.get("execution_count"))]
    assert with_outputs == [], f"{path.name}: cells {with_outputs} were committed with outputs"
    assert nb["metadata"]["kernelspec"]["name"] == "python3"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_name_and_title(path):
    assert re.fullmatch(r"\d\d[a-z]?_[a-z0-9_]+", path.stem)  # 11b: a chapter placed after 11
    number = path.stem.split("_", 1)[0]
    titles = [line for line in _markdown(_load(path)).splitlines() if line.startswith("# ")]
    assert len(titles) == 1 and titles[0].startswith(f"# {number} "), titles


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_setup_cell_installs_from_the_configured_repository_on_colab_only(path):
    first = _code(_load(path))[0]
    assert 'if "google.colab" in sys.modules' in first
    assert f"git+{REPO_URL}" in first, "the Colab install step must use _config.yml's repository.url"
    assert "torch" not in first.split("install", 1)[1].split("\n", 1)[0], "leave Colab's torch alone"
    assert "manual_seed" in first and "pick_device" in first


# The toggle of a hidden solution in the book; chapter 00 tells the reader to click it.
SOLUTION_PROMPT = "Solution (click to show)"
# A hint is a closed HTML <details> (issue 26.6): the book, JupyterLab, Notebook 7 and Colab all draw it
# folded. The blank line after <summary> lets the body be Markdown (code, maths) in all of them.
HINT_OPENING = '<details class="selfattn-hint">\n<summary>Hint</summary>\n\n'
HINT_CLOSING = "\n\n</details>"
# A "Lab notes" box (issue 26, item 2): measurement methodology folded out of the main line, at the end of
# a prose cell, one per cell, closed like a hint.
LABNOTES_OPENING = '<details class="selfattn-labnotes">\n<summary>Lab notes</summary>\n\n'


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_anatomy(path):
    nb = _load(path)
    text = _markdown(nb)
    assert "Learning goals" in text or "learning goals" in text
    assert "Verified facts" in text
    exercises = re.findall(r"\*\*Exercise \d+[a-z]?\.\d+", text)
    assert len(exercises) >= 2, f"{path.name} has {len(exercises)} exercises"
    # A solution is hidden whole (input and its feedback: tag hide-cell), behind the toggle the
    # prose names, with a hint (a closed HTML <details>, see HINT_OPENING) just before it.
    cells = nb["cells"]
    solutions = [i for i, c in enumerate(cells) if c["cell_type"] == "code" and "# @title Solution" in "".join(c["source"])]
    assert len(solutions) >= len(exercises)
    for i in solutions:
        cell = cells[i]
        source = "".join(cell["source"])
        assert source.startswith("# @title Solution") and cell["metadata"].get("cellView") == "form"
        assert "hide-cell" in cell["metadata"].get("tags", []), f"{path.name} cell {i}: its feedback shows the answer"
        assert cell["metadata"].get("mystnb", {}).get("code_prompt_show") == SOLUTION_PROMPT
        # JupyterLab, Notebook 7 and VS Code read neither the tag nor cellView: the nbformat-standard
        # jupyter.source_hidden collapses the code there (issue 27.3); scripts/hide_solutions.py adds it.
        assert cell["metadata"].get("jupyter") == {"source_hidden": True, "outputs_hidden": True}, (
            f"{path.name} cell {i}: the solution shows in JupyterLab (run scripts/hide_solutions.py)"
        )
        hint = "".join(cells[i - 1]["source"])
        assert cells[i - 1]["cell_type"] == "markdown" and hint.startswith(HINT_OPENING), (
            f"{path.name} cell {i}: no hint just before the solution"
        )
        assert "assert " in source, "a solution cell asserts that its check passes"


@pytest.mark.parametrize("path", [p for p in NOTEBOOKS if p.stem.split("_")[0] in ("09", "10", "11", "12", "13", "14")],
                         ids=lambda p: p.stem)
def test_later_chapters_have_four_exercises_each_with_a_check_stub_hint_and_solution(path):
    """Issue 27: at least four exercises in each of chapters 09-14, each a stub that raises NotImplementedError and
    calls a check of selfattn.exercises, numbered in order, distinct (no exercise twice)."""
    cells = _load(path)["cells"]
    chapter = int(path.name[:2])
    numbers = [m for c in cells if c["cell_type"] == "markdown" for m in re.findall(r"\*\*Exercise (\d+\.\d+)", "".join(c["source"]))]
    assert len(numbers) >= 4 and numbers == [f"{chapter}.{i}" for i in range(1, len(numbers) + 1)], numbers
    stubs = [c for c in cells if c["cell_type"] == "code" and "raise NotImplementedError" in "".join(c["source"])
             and "# @title Solution" not in "".join(c["source"])]
    checks = [re.findall(rf"ch{chapter:02d}\.(check_\w+)\(", "".join(c["source"]))[-1] for c in stubs]
    assert len(checks) == len(numbers) and len(set(checks)) == len(checks), checks


def test_chapter_00_names_the_solution_toggle():
    text = _markdown(_load(ROOT / "notebooks" / "00_how_to_use.ipynb"))
    assert f"*{SOLUTION_PROMPT}*" in text and "*Hint*" in text


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_hints_are_folded_in_every_front_end(path):
    """No markdown cell uses a MyST directive that only the book understands to hide text (issue 26.6):
    JupyterLab, Notebook 7 and Colab show a ```{dropdown} or :::{dropdown} block as literal text, its hint
    in plain sight. Every <details> is a whole hint cell: opened, Markdown body, closed, never `open`; or one
    Lab notes box that ends a prose cell, closed the same way."""
    for i, cell in enumerate(_load(path)["cells"]):
        if cell["cell_type"] != "markdown":
            continue
        source = "".join(cell["source"])
        assert not re.search(r"^\s*(```+|:::+)\s*\{(dropdown|toggle)\}", source, re.M), (
            f"{path.name} cell {i}: a MyST dropdown/toggle shows as plain text outside the book; use <details>"
        )
        if LABNOTES_OPENING in source:
            head, box = source.split(LABNOTES_OPENING, 1)
            assert head.strip() and "<details" not in head and box.endswith(HINT_CLOSING), (
                f"{path.name} cell {i}: a Lab notes box closes its prose cell: ... {LABNOTES_OPENING!r} ... "
                f"{HINT_CLOSING!r}"
            )
            assert box[:-len(HINT_CLOSING)].strip() and "<details" not in box, f"{path.name} cell {i}: empty or nested"
        elif "<details" in source:
            assert source.startswith(HINT_OPENING) and source.endswith(HINT_CLOSING), (
                f"{path.name} cell {i}: a <details> cell must read {HINT_OPENING!r} ... {HINT_CLOSING!r}"
            )
            body = source[len(HINT_OPENING):-len(HINT_CLOSING)]
            assert body.strip() and "<details" not in body and "open" not in source.split(">", 1)[0], (
                f"{path.name} cell {i}: an empty, nested or open hint"
            )
