"""The code that writes a chapter's generated prose is folded in the book (a learner trial of issue 26).

A cell whose job is to turn measured numbers into sentences (``display(Markdown(f"..."))``, marked by a
first-lines comment "# The text follows ...", or a cell that is nothing but a ``display(Markdown(``
call) showed the reader every paragraph twice: as branching f-string code, then as text. Such cells carry
the tag ``hide-input``: the book shows the text, and the code behind a "Show the code that writes this
text" toggle (MyST-NB). JupyterLab and Colab ignore the tag, so a learner running the notebook still sees
the code.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
PROMPT = "Show the code that writes this text"


def writes_prose(source: str) -> bool:
    """True for a cell whose job is generated prose (see the module docstring)."""
    if not re.search(r"display\(Markdown\(", source):
        return False
    lines = source.split("\n")
    return lines[0].startswith("display(Markdown(") or any(ln.startswith("# The text follows") for ln in lines[:3])


def test_the_rule_picks_prose_writers_only():
    assert writes_prose('display(Markdown(\n    f"{x:.2f} nats"))')
    assert writes_prose('from IPython.display import Markdown\n\n# The text follows the numbers.\ndisplay(Markdown(t))')
    assert not writes_prose("# The text follows the numbers.\nprint(x)")  # no generated Markdown
    assert not writes_prose("loss = train()\n\n\n# The text follows\ndisplay(Markdown(t))")  # computation first


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_cells_that_write_prose_fold_their_code_in_the_book(path):
    cells = json.loads(path.read_text())["cells"]
    bad = []
    for i, cell in enumerate(cells):
        if cell["cell_type"] != "code" or not writes_prose("".join(cell["source"])):
            continue
        meta = cell.get("metadata", {})
        if "hide-input" not in meta.get("tags", []) or meta.get("mystnb", {}).get("code_prompt_show") != PROMPT:
            bad.append(i)
    assert not bad, f"{path.name}: cells {bad} write prose but show their code (tag them hide-input)"


def test_at_least_the_generated_prose_of_the_systems_chapters_is_folded():
    # chapter 11 holds the most generated paragraphs (the learner trial's worst case): at least 6 folded
    cells = json.loads((ROOT / "notebooks" / "11_inference.ipynb").read_text())["cells"]
    folded = [c for c in cells if "hide-input" in c.get("metadata", {}).get("tags", [])]
    assert len(folded) >= 6
