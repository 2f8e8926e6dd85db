"""Order of the course: no chapter's code uses a module first taught in a later chapter (issue 26 item 1).

The chapter -> module table in the package docstring (``src/selfattn/__init__.py``) says where each module
is taught. This test parses every stored notebook's code cells with ``ast``, resolves each use of the package
(``import selfattn.X``, ``from selfattn.X import n``, ``from selfattn import X``, and attribute chains such as
``selfattn.efficient.tiled_attention`` or ``pos.apply_rope`` through aliases) to the module that defines it,
and finds the chapter that teaches that module by the longest matching table entry. ``viz``, ``exercises``,
``device`` and ``data`` are exempt (every chapter has them); prose previews in markdown are not code and stay
allowed. Chapter ids are two digits with an optional letter ("11b"), ordered 11 < 11b < 12.
"""

from __future__ import annotations

import ast
import importlib
import json
import re
import types
from dataclasses import dataclass
from pathlib import Path

import pytest

import selfattn

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = ROOT / "notebooks"
EXEMPT = ("viz", "exercises", "device", "data")
_CHAPTER = re.compile(r"^(\d{2}[a-z]?)_")
_ROW = re.compile(r"^(\d{2}[a-z]?)\s")


def chapter_key(chapter_id: str) -> tuple[int, str]:
    """'11b' -> (11, 'b'): chapters order by number, then letter ('11' < '11b' < '12')."""
    m = re.fullmatch(r"(\d{2})([a-z]?)", chapter_id)
    if m is None:
        raise ValueError(f"chapter id must be two digits and an optional letter, got {chapter_id!r}")
    return int(m.group(1)), m.group(2)


def parse_table(doc: str) -> dict[str, str]:
    """Module path (relative to selfattn) -> first chapter id that lists it, from the docstring's table.

    ``inference`` (``costs``, ``paged``) lists ``inference``, ``inference.costs`` and ``inference.paged``.
    """
    rows: list[tuple[str, str]] = []
    in_table = False
    for line in doc.splitlines():
        if line.startswith("====="):
            in_table = True
            continue
        if not in_table or not line.strip() or line.startswith("chapter "):
            continue
        m = _ROW.match(line)
        if m:
            rows.append((m.group(1), line[40:]))
        elif line.startswith(" ") and rows:
            rows[-1] = (rows[-1][0], rows[-1][1] + " " + line.strip())
    if not rows:
        raise ValueError("no chapter -> module table found in the package docstring")
    first: dict[str, str] = {}
    for chapter, cell in rows:
        chapter_key(chapter)
        parent = None
        depth = 0
        for token in re.finditer(r"``([\w.]+)``|(\()|(\))", cell):
            name, opened, closed = token.groups()
            if opened:
                depth += 1
            elif closed:
                depth -= 1
            elif depth == 0:
                parent = name
                paths = [name]
            else:
                paths = [f"{parent}.{name}"]
            if name:
                for p in paths:
                    if p not in first or chapter_key(chapter) < chapter_key(first[p]):
                        first[p] = chapter
    return first


def canonical(path: str) -> str:
    """'efficient.tiled_attention' -> 'efficient.tiled.tiled_attention': the module that defines the name."""
    obj: object = selfattn
    done: list[str] = []
    for part in path.split(".") if path else []:
        if part.startswith("__"):
            break
        if isinstance(obj, types.ModuleType):
            try:
                obj = importlib.import_module(f"{obj.__name__}.{part}")
                done.append(part)
                continue
            except ModuleNotFoundError:
                pass
            if not hasattr(obj, part):
                raise LookupError(f"selfattn.{path}: {obj.__name__} has no {part!r}")
            obj = getattr(obj, part)
            if isinstance(obj, types.ModuleType):
                done.append(part)
                continue
            module = getattr(obj, "__module__", None)
            if isinstance(module, str) and module.startswith("selfattn"):
                return ".".join([*module.split(".")[1:], getattr(obj, "__name__", part)])
            return ".".join([*done, part])
        break
    return ".".join(done)


def teaching_chapter(module_path: str, table: dict[str, str]) -> str | None:
    """The chapter of the longest table entry that is a prefix of module_path (by whole dotted parts)."""
    parts = module_path.split(".")
    for n in range(len(parts), 0, -1):
        prefix = ".".join(parts[:n])
        if prefix in table:
            return table[prefix]
    return None


def cell_uses(source: str) -> list[str]:
    """Paths (relative to selfattn, as written) that a cell's code imports or calls."""
    lines = [ln for ln in source.splitlines() if not ln.lstrip().startswith(("%", "!"))]
    tree = ast.parse("\n".join(lines))
    aliases: dict[str, str] = {}
    uses: list[str] = []

    def rel(module: str) -> str | None:
        if module == "selfattn":
            return ""
        if module.startswith("selfattn."):
            return module[len("selfattn.") :]
        return None

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                r = rel(a.name)
                if r is None:
                    continue
                if r:
                    uses.append(r)
                if a.asname:
                    aliases[a.asname] = r
                else:
                    aliases["selfattn"] = ""
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            r = rel(node.module)
            if r is None:
                continue
            for a in node.names:
                full = f"{r}.{a.name}" if r else a.name
                uses.append(full)
                aliases[a.asname or a.name] = full
    for parent in ast.walk(tree):
        for child in ast.iter_child_nodes(parent):
            child._parent = parent  # type: ignore[attr-defined]
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and not isinstance(getattr(node, "_parent", None), ast.Attribute):
            chain: list[str] = []
            cur: ast.AST = node
            while isinstance(cur, ast.Attribute):
                chain.append(cur.attr)
                cur = cur.value
            if isinstance(cur, ast.Name) and cur.id in aliases:
                base = aliases[cur.id]
                uses.append(".".join([p for p in [base, *reversed(chain)] if p]))
    return uses


@dataclass(frozen=True)
class Violation:
    chapter: str
    cell: int
    used: str
    module: str
    taught_in: str | None

    def __str__(self) -> str:
        where = f"chapter {self.taught_in}" if self.taught_in else "no chapter (not in the table)"
        return (f"chapter {self.chapter}, cell {self.cell}: uses selfattn.{self.used} "
                f"(module selfattn.{self.module}), which is taught in {where}")


def check_notebook(chapter: str, nb: dict, table: dict[str, str]) -> list[Violation]:
    """Every use in a chapter's code cells of a non-exempt module taught after that chapter (or nowhere)."""
    found: list[Violation] = []
    for i, cell in enumerate(nb["cells"]):
        if cell["cell_type"] != "code":
            continue
        source = cell["source"] if isinstance(cell["source"], str) else "".join(cell["source"])
        for used in cell_uses(source):
            module = canonical(used)
            if not module or module.split(".")[0] in EXEMPT:
                continue
            taught = teaching_chapter(module, table)
            if taught is None or chapter_key(taught) > chapter_key(chapter):
                found.append(Violation(chapter, i, used, module, taught))
    return found


def _notebooks() -> list[tuple[str, Path]]:
    out = []
    for path in sorted(NOTEBOOKS.glob("*.ipynb")):
        m = _CHAPTER.match(path.name)
        if m:
            out.append((m.group(1), path))
    return sorted(out, key=lambda cp: chapter_key(cp[0]))


def test_no_chapter_uses_a_module_taught_later():
    table = parse_table(selfattn.__doc__)
    problems = []
    for chapter, path in _notebooks():
        problems += check_notebook(chapter, json.loads(path.read_text()), table)
    assert not problems, "forward references in the course's code:\n" + "\n".join(map(str, problems))


# The checker itself, on synthetic notebooks (so the test above can fail).

_TABLE = """x

=====  ====
chapter                                     modules
=====  ====
02 first                                    ``attention`` (``masked_softmax``)
03 second                                   ``attention`` (``scaled_dot_product_attention``)
10 tiles                                    ``efficient.tiled``
11b extra                                   ``inference`` (``costs``,
                                           ``paged``)
=====  ====
"""


def _nb(*sources: str) -> dict:
    cells = [{"cell_type": "markdown", "source": "Chapter 10 will show the tiled loop."}]
    cells += [{"cell_type": "code", "source": s} for s in sources]
    return {"cells": cells}


def test_table_parser_reads_letters_continuations_and_submodules():
    table = parse_table(_TABLE)
    assert table == {"attention": "02", "attention.masked_softmax": "02",
                     "attention.scaled_dot_product_attention": "03", "efficient.tiled": "10",
                     "inference": "11b", "inference.costs": "11b", "inference.paged": "11b"}
    assert sorted(["12", "11b", "11", "15", "02"], key=chapter_key) == ["02", "11", "11b", "12", "15"]
    assert _CHAPTER.match("11b_x.ipynb").group(1) == "11b"


@pytest.mark.parametrize("code", [
    "from selfattn.efficient.tiled import tiled_attention",
    "from selfattn.efficient import tiled_attention",
    "import selfattn\nselfattn.efficient.tiled_attention",
    "import selfattn.efficient as eff\neff.tiled_attention(1)",
    "from selfattn import efficient\nefficient.tiled.tiled_attention",
])
def test_a_forward_reference_fails_with_chapter_cell_and_module(code):
    problems = check_notebook("04", _nb("import numpy as np", code), parse_table(_TABLE))
    assert len(problems) >= 1
    p = next(p for p in problems if p.taught_in is not None)
    assert (p.chapter, p.cell, p.taught_in) == ("04", 2, "10")
    assert p.module.startswith("efficient.tiled")
    assert "chapter 04, cell 2" in str(p) and "chapter 10" in str(p)


def test_a_name_taught_later_in_an_earlier_module_fails():
    problems = check_notebook("02", _nb("import selfattn\nselfattn.scaled_dot_product_attention(1)"),
                              parse_table(_TABLE))
    assert [(p.module, p.taught_in) for p in problems] == [
        ("attention.scaled_dot_product_attention", "03")]


def test_a_clean_notebook_passes_and_exempt_modules_and_prose_are_allowed():
    nb = _nb("import selfattn\nimport selfattn.viz\nfrom selfattn.device import pick_device",
             "from selfattn.data import load_corpus\nfrom selfattn.exercises import ch04",
             "selfattn.masked_softmax(1)\nselfattn.__version__")
    assert check_notebook("02", nb, parse_table(_TABLE)) == []
    assert check_notebook("11b", _nb("from selfattn.inference import costs"), parse_table(_TABLE)) == []
    assert check_notebook("11", _nb("from selfattn.inference import costs"), parse_table(_TABLE))


def test_a_module_missing_from_the_table_fails():
    problems = check_notebook("14", _nb("from selfattn import gqa"), parse_table(_TABLE))
    assert [(p.module, p.taught_in) for p in problems] == [("gqa", None)]
