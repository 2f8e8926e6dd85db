"""Issue 27, item 3, over every registered check: a non-finite, wrongly shaped or missing return gets a clear
failure message, never a traceback from inside the check.

Each check is fed its chapter's own solution (taken from the stored notebook's solution cell, so the reference
passes too) and three broken versions of it: (a) the same return with every number NaN, same shapes; (b) the
same return with a wrong shape (one row more, or two numbers where one belongs); (c) None. Each must fail with
a message in words, and no exception may escape the check.
"""

from __future__ import annotations

import ast
import importlib
import itertools
import json
import math
import re
from pathlib import Path

import numpy as np
import pytest
import torch

import selfattn.exercises as ex

ROOT = Path(__file__).resolve().parents[2]
MODULES = ("00", "01", "02", "03", "04", "05", "06", "07", "08", "09", "10", "11", "11b", "11c", "12", "13", "14",
           "15")


def _checks() -> list:
    return [getattr(module, name) for module in (importlib.import_module(f"selfattn.exercises.ch{n}") for n in MODULES)
            for name in module.__all__ if name.startswith("check_")]


def _solutions() -> dict[str, tuple[str, tuple[str, ...]]]:
    """``{check's qualified name: (notebook, names of the solution functions it takes)}``, from the stored
    notebooks' solution cells (6.1 takes two: split and merge)."""
    found = {}
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        for cell in json.loads(path.read_text())["cells"]:
            source = "".join(cell["source"])
            if cell["cell_type"] == "code" and source.startswith("# @title Solution"):
                for module, check, args in re.findall(r"\b(ch\w+)\.(check_\w+)\((\w+_solution(?:, \w+_solution)*)\)",
                                                      source):
                    found[f"selfattn.exercises.{module}.{check}"] = (path.name, tuple(args.split(", ")))
    return found


_NAMESPACES: dict[str, dict] = {}


def _solution(notebook: str, name: str):
    """The solution function, defined as the notebook defines it: every import of the notebook, then every
    function of its solution cells (their other statements print and check; they are not needed here)."""
    if notebook not in _NAMESPACES:
        cells = [c for c in json.loads((ROOT / "notebooks" / notebook).read_text())["cells"] if c["cell_type"] == "code"]
        namespace: dict = {}
        for cell in cells:
            source = "".join(cell["source"])
            if source.lstrip().startswith(("%", "!")):
                continue
            tree = ast.parse(source)
            solution = source.startswith("# @title Solution")
            keep = [node for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom))
                    or (solution and isinstance(node, ast.FunctionDef))]  # fmt: skip
            exec(compile(ast.Module(body=keep, type_ignores=[]), notebook, "exec"), namespace)  # noqa: S102
        _NAMESPACES[notebook] = namespace
    return _NAMESPACES[notebook][name]


def _qualified(check) -> str:
    return f"{check.__wrapped__.__module__}.{check.__name__}"


def test_every_check_has_a_solution_in_its_notebook():
    solutions = _solutions()
    missing = [_qualified(c) for c in _checks() if _qualified(c) not in solutions]
    assert not missing, missing
    assert len(solutions) >= 60


def _nan_like(x):
    """``x`` with every number NaN, shapes kept (a boolean or integer tensor becomes a float one of NaN)."""
    if isinstance(x, torch.Tensor):
        return torch.full(x.shape, math.nan, dtype=x.dtype if x.is_floating_point() else torch.float64)
    if isinstance(x, np.ndarray):
        return np.full(x.shape, np.nan)
    if isinstance(x, (bool, int, float, np.number)):
        return math.nan
    if isinstance(x, (tuple, list)):
        return type(x)(_nan_like(y) for y in x)
    if isinstance(x, dict):
        return {k: _nan_like(v) for k, v in x.items()}
    return x


def _misshaped(x):
    """``x`` with a wrong shape: one row more for an array, two numbers for one, one item more for a list of
    numbers; a tuple or a list of arrays has each item misshaped."""
    if isinstance(x, torch.Tensor):
        return torch.cat([x, x[:1]]) if x.ndim else x.reshape(1).repeat(2)
    if isinstance(x, np.ndarray):
        return np.concatenate([x, x[:1]]) if x.ndim else np.repeat(x, 2)
    if isinstance(x, (bool, int, float, np.number)):
        return [x, x]
    if isinstance(x, (tuple, list)):
        if x and all(isinstance(y, (bool, int, float, np.number)) for y in x):
            return type(x)([*x, x[0]])
        return type(x)(_misshaped(y) for y in x)
    return x


CASES = {"nan": _nan_like, "shape": _misshaped, "none": lambda x: None}


@pytest.fixture
def quiet_registry(monkeypatch):
    """These calls are not a learner's: keep them out of progress()."""
    monkeypatch.setattr(ex, "_REGISTRY", {name: dict(entry, parts={p: dict(s) for p, s in entry["parts"].items()})
                                          for name, entry in ex._REGISTRY.items()})  # fmt: skip


@pytest.mark.parametrize("check", _checks(), ids=_qualified)
def test_a_broken_return_gets_a_clear_message(check, quiet_registry):
    notebook, names = _solutions()[_qualified(check)]
    solutions = [_solution(notebook, name) for name in names]
    fb = check(*solutions)
    assert isinstance(fb, ex.Feedback) and fb.ok, fb
    for (case, broken), which in itertools.product(CASES.items(), range(len(solutions))):

        def fn(*args, _broken=broken, _solution=solutions[which], **kwargs):
            return _broken(_solution(*args, **kwargs))

        fb = check(*solutions[:which], fn, *solutions[which + 1:])  # an exception inside the check fails here
        assert isinstance(fb, ex.Feedback) and not fb.ok and fb.attempted, (case, fb)
        message = fb.message
        assert isinstance(message, str) and len(message) > 20 and "Traceback" not in message, (case, message)
        assert not message.startswith("Your function raised"), (case, message)  # the broken wrapper itself
        if case == "none":
            assert "None" in message, message
        if case == "shape":
            assert re.search(r"shape|one number|return", message, re.I), message
        if case == "nan":
            assert re.search(r"NaN|nan|finite|inf|boolean|int|whole number|one token", message), message
