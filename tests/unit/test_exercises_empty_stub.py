"""An empty body (`pass`, `...`, a docstring) is "not attempted" for every exercise's check, not
"did you forget return?" and not counted failed by progress() (learner 27, finding 2)."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import pytest

import selfattn.exercises as ex

MODULES = [importlib.import_module(f"selfattn.exercises.{m.name}") for m in pkgutil.iter_modules(ex.__path__)
           if m.name.startswith("ch")]
CHECKS = [f for m in MODULES for f in vars(m).values() if callable(f) and hasattr(f, "exercise") and f.__wrapped__.__module__ == m.__name__]


def _pass(*args, **kwargs):
    pass


def _ellipsis(*args, **kwargs):
    ...


def _docstring(*args, **kwargs):
    """Not written yet."""


def test_every_chapter_has_checks():
    assert len(CHECKS) >= 40, len(CHECKS)


@pytest.mark.parametrize("check", CHECKS, ids=lambda f: f.exercise)
@pytest.mark.parametrize("stub", [_pass, _ellipsis, _docstring], ids=lambda f: f.__name__)
def test_an_empty_body_is_not_attempted(check, stub):
    needed = [p for p in inspect.signature(check.__wrapped__).parameters.values()
              if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    feedback = check(*[stub] * len(needed))
    assert not feedback and feedback.attempted is False, f"{check.exercise}: {feedback}"
