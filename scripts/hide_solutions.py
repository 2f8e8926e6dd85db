"""Mark every solution cell of the stored notebooks hidden in JupyterLab, Notebook 7 and VS Code.

A solution cell (code starting ``# @title Solution``) is hidden in the book by its ``hide-cell`` tag and
in Colab by ``cellView: form``; the other front ends read the nbformat-standard
``"jupyter": {"source_hidden": true, "outputs_hidden": true}`` (issue 27, item 3). Run it after adding
an exercise: ``python scripts/hide_solutions.py`` edits the notebooks in place, in their stored format
(indent 1, keys sorted or not as stored, trailing newline); ``--check`` only lists the cells missing it
and exits 1 if there are any. tests/unit/test_notebooks_stored.py checks the same.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HIDDEN = {"source_hidden": True, "outputs_hidden": True}


def _dump(nb: dict, sort_keys: bool) -> str:
    return json.dumps(nb, indent=1, ensure_ascii=False, sort_keys=sort_keys) + "\n"


def main(argv: list[str]) -> int:
    check = "--check" in argv
    missing = []
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        text = path.read_text(encoding="utf-8")
        nb = json.loads(text)
        sort_keys = _dump(nb, True) == text
        if not sort_keys and _dump(nb, False) != text:
            raise SystemExit(f"{path.name}: not in the stored format (indent 1, trailing newline)")
        changed = False
        for i, cell in enumerate(nb["cells"]):
            if cell["cell_type"] == "code" and "".join(cell["source"]).startswith("# @title Solution"):
                if cell["metadata"].get("jupyter") != HIDDEN:
                    missing.append(f"{path.name} cell {i}")
                    cell["metadata"]["jupyter"] = dict(HIDDEN)
                    changed = True
        if changed and not check:
            path.write_text(_dump(nb, sort_keys), encoding="utf-8")
    for where in missing:
        print(("not hidden: " if check else "hidden: ") + where)
    return 1 if check and missing else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
