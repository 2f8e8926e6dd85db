"""selfattn.exercises.progress() lists, per chapter imported in this kernel, what passed, failed or waits."""

from __future__ import annotations

import io

import pytest

import selfattn.exercises as ex
from selfattn.exercises import ch00


@pytest.fixture
def fresh_registry(monkeypatch):
    """Only chapter 00's exercises, none checked yet (as in a kernel that has just imported ch00)."""
    registry = {name: dict(entry, name=None, feedback=None) for name, entry in ex._REGISTRY.items()
                if entry["module"].endswith(".ch00")}  # fmt: skip
    assert sorted(registry) == ["0.1 swap the last two axes", "0.2 dot product"]
    monkeypatch.setattr(ex, "_REGISTRY", registry)
    return registry


def _progress():
    out = io.StringIO()
    result = ex.progress(file=out)
    return result, out.getvalue()


def test_progress_before_any_check_says_not_attempted(fresh_registry):
    result, text = _progress()
    assert result == {"0.1 swap the last two axes": "not attempted", "0.2 dot product": "not attempted"}
    assert "Chapter 00: 0 of 2 passed, 0 failed, 2 not attempted" in text


def test_progress_follows_the_learners_function(fresh_registry):
    def swap(X):
        raise NotImplementedError

    def dot(a, b):
        return (a * b).mean()  # a typical mistake

    assert not ch00.check_swap_last_two(swap).attempted
    assert not ch00.check_dot_product(dot)
    assert _progress()[0] == {"0.1 swap the last two axes": "not attempted", "0.2 dot product": "failed"}

    def swap(X):  # the learner fills in the stub and runs the check again
        return X.transpose(-2, -1)

    assert ch00.check_swap_last_two(swap)
    result, text = _progress()
    assert result == {"0.1 swap the last two axes": "passed", "0.2 dot product": "failed"}
    assert "Chapter 00: 1 of 2 passed, 1 failed, 0 not attempted" in text
    assert "  passed         0.1 swap the last two axes" in text


def test_progress_ignores_solutions_lambdas_and_demonstrations(fresh_registry):
    def swap_last_two(X):
        raise NotImplementedError

    def swap_last_two_solution(X):
        return X.transpose(-2, -1)

    def swap_by_reshape(X):  # a chapter's demonstration of a wrong answer, after the learner's stub
        return X.reshape(X.shape[0], X.shape[2], X.shape[1])

    ch00.check_swap_last_two(swap_last_two)
    assert ch00.check_swap_last_two(swap_last_two_solution)
    assert ch00.check_swap_last_two(lambda X: X.transpose(-2, -1))
    assert not ch00.check_swap_last_two(swap_by_reshape)
    assert _progress()[0]["0.1 swap the last two axes"] == "not attempted"


def test_progress_without_exercises_says_so(monkeypatch):
    monkeypatch.setattr(ex, "_REGISTRY", {})
    result, text = _progress()
    assert result == {} and "No exercises yet" in text


def test_every_chapter_check_registers_itself():
    """The registry is filled by @checker alone: every check function of a chapter module is in it."""
    import importlib

    for n in range(15):
        module = importlib.import_module(f"selfattn.exercises.ch{n:02d}")
        checks = [getattr(module, name) for name in module.__all__ if name.startswith("check_")]
        assert checks, module.__name__
        for check in checks:
            assert check.exercise in ex._REGISTRY and ex._REGISTRY[check.exercise]["module"] == module.__name__
