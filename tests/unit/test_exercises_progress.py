"""selfattn.exercises.progress() lists, per chapter imported in this kernel, what passed, failed or waits."""

from __future__ import annotations

import io

import pytest

import selfattn.exercises as ex
from selfattn.exercises import ch00


@pytest.fixture
def fresh_registry(monkeypatch):
    """Only chapter 00's exercises, none checked yet (as in a kernel that has just imported ch00)."""
    registry = {name: dict(entry, parts={part: {"name": None, "feedback": None} for part in entry["parts"]})
                for name, entry in ex._REGISTRY.items() if entry["module"].endswith(".ch00")}  # fmt: skip
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


def _two_part_exercise():
    """An exercise checked by two checks (a forward and a backward), registered as chapter 00's 0.9."""
    name = "0.9 a forward and its backward"

    @ex.checker(name)
    def check_forward(fn):
        got = ex.call_learner(name, fn, 3.0)
        return ex.passed(name) if got == 6.0 else ex.failed(name, f"2 x 3 is 6; you returned {got}.")

    @ex.checker(name)
    def check_backward(fn):
        got = ex.call_learner(name, fn, 3.0)
        return ex.passed(name) if got == 2.0 else ex.failed(name, f"d(2x)/dx is 2; you returned {got}.")

    check_forward.__module__ = check_backward.__module__ = "selfattn.exercises.ch00"
    ex._REGISTRY[name]["module"] = "selfattn.exercises.ch00"
    return name, check_forward, check_backward


def test_an_exercise_of_two_parts_passes_only_when_both_pass(fresh_registry):
    name, check_forward, check_backward = _two_part_exercise()
    assert sorted(fresh_registry[name]["parts"]) == ["check_backward", "check_forward"]

    def forward(x):
        raise NotImplementedError

    def backward(x):
        raise NotImplementedError

    check_forward(forward), check_backward(backward)
    assert _progress()[0][name] == "not attempted"

    def forward(x):
        return 2 * x

    assert check_forward(forward)  # the backward is still a stub: not passed, not failed, not "not attempted"
    result, text = _progress()
    assert result[name] == "in progress"
    assert "Chapter 00: 0 of 3 passed, 0 failed, 1 in progress, 2 not attempted" in text
    assert "  in progress    0.9 a forward and its backward" in text

    def backward(x):
        return x  # wrong
    assert not check_backward(backward)
    assert _progress()[0][name] == "failed"

    def backward(x):
        return 2.0
    assert check_backward(backward)
    assert _progress()[0][name] == "passed"

    def forward(x):  # the first part broken again: one failed part fails the exercise
        return x
    assert not check_forward(forward)
    assert _progress()[0][name] == "failed"


def test_a_part_never_checked_keeps_the_exercise_from_passing(fresh_registry):
    name, check_forward, _ = _two_part_exercise()

    def forward(x):
        return 2 * x

    assert check_forward(forward)
    assert _progress()[0][name] == "in progress"


def test_a_failed_part_fails_the_exercise_even_while_the_other_is_not_attempted(fresh_registry):
    name, check_forward, check_backward = _two_part_exercise()

    def forward(x):
        return x

    def backward(x):
        raise NotImplementedError

    assert not check_forward(forward) and not check_backward(backward).attempted
    assert _progress()[0][name] == "failed"


def test_each_part_follows_its_own_learner_function(fresh_registry):
    """The function followed is chosen per part: the backward's stub is not a demonstration of the forward."""
    name, check_forward, check_backward = _two_part_exercise()

    def forward(x):
        return 2 * x

    def backward(x):
        return 2.0

    def forward_by_addition(x):  # a chapter's demonstration, after the learner's forward: does not count
        return x + 1

    assert check_forward(forward) and check_backward(backward)
    assert not check_forward(forward_by_addition)
    assert _progress()[0][name] == "passed"


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
            assert check.__name__ in ex._REGISTRY[check.exercise]["parts"]


def test_one_check_of_two_functions_is_in_progress_while_the_second_is_a_stub(monkeypatch):
    """6.1 checks split_heads and merge_heads together: split written, merge still raising NotImplementedError, the
    exercise is in progress (it read 'not attempted', as if neither were written)."""
    from selfattn.exercises import ch06

    name = ch06.check_split_merge_heads.exercise
    entry = ex._REGISTRY[name]
    monkeypatch.setattr(ex, "_REGISTRY", {name: dict(entry, parts={p: {"name": None, "feedback": None} for p in entry["parts"]})})

    def my_split_heads(x, n_heads):
        B, T, D = x.shape
        return x.reshape(B, T, n_heads, D // n_heads).transpose(1, 2)

    def my_merge_heads(x):
        raise NotImplementedError

    fb = ch06.check_split_merge_heads(my_split_heads, my_merge_heads)
    assert not fb.attempted
    assert _progress()[0] == {name: "in progress"}

    def stub_split(x, n_heads):
        raise NotImplementedError

    monkeypatch.setattr(ex, "_REGISTRY", {name: dict(entry, parts={p: {"name": None, "feedback": None} for p in entry["parts"]})})
    assert not ch06.check_split_merge_heads(stub_split, my_merge_heads).attempted
    assert _progress()[0] == {name: "not attempted"}

    def my_merge_heads(x):  # noqa: F811  (the learner fills in the second stub)
        B, H, T, Dh = x.shape
        return x.transpose(1, 2).reshape(B, T, H * Dh)

    monkeypatch.setattr(ex, "_REGISTRY", {name: dict(entry, parts={p: {"name": None, "feedback": None} for p in entry["parts"]})})
    assert ch06.check_split_merge_heads(my_split_heads, my_merge_heads)
    assert _progress()[0] == {name: "passed"}

    def my_split_heads_empty(x, n_heads):
        pass

    monkeypatch.setattr(ex, "_REGISTRY", {name: dict(entry, parts={p: {"name": None, "feedback": None} for p in entry["parts"]})})
    assert not ch06.check_split_merge_heads(my_split_heads_empty, lambda x: x).attempted  # an empty body: not attempted
