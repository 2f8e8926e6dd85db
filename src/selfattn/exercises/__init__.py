"""Check functions for the exercises: instant feedback, in words, on a learner's answer.

Each chapter has its own module (``selfattn.exercises.ch02``...). A check returns a
:class:`Feedback`, which is truthy only when the answer is right, prints as one line, and shows as a
coloured box in a notebook. A check never raises because the learner's code is wrong: an
exception inside the learner's function becomes feedback that names it. Introduced in chapter 00.

Every check made with :func:`checker` registers its exercise when its chapter module is imported and
records its verdicts; :func:`progress` lists them for the chapters imported in this kernel.
"""

from __future__ import annotations

import dis
import html
import re
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

__all__ = ["Feedback", "passed", "failed", "not_attempted", "call_learner", "checker", "compare_arrays", "to_numpy", "bool_mask_problem", "is_empty_stub", "part_feedback", "progress"]


@dataclass(frozen=True)
class Feedback:
    """The verdict on one exercise.

    Attributes:
        exercise: its name, e.g. ``"2.1 stable softmax"``.
        ok: True only if the answer is right.
        message: what is right or wrong, in words.
        attempted: False while the learner's function still raises ``NotImplementedError``.
    """

    exercise: str
    ok: bool
    message: str
    attempted: bool = True

    def __bool__(self) -> bool:
        return self.ok

    def __str__(self) -> str:
        mark = "correct" if self.ok else ("not attempted yet" if not self.attempted else "not yet right")
        return f"Exercise {self.exercise}: {mark}. {self.message}"

    __repr__ = __str__

    def _repr_html_(self) -> str:
        """A box with its own background and text colour, so that it reads the same wherever it is drawn
        (the book in light or dark mode, JupyterLab's and Colab's dark themes): every text in it has a
        WCAG contrast of at least 4.5:1 against ``FEEDBACK_BACKGROUND``. The book's stylesheet
        (book/_static/selfattn.css) redraws it in the page's dark colours in dark mode."""
        verdict = "ok" if self.ok else ("todo" if not self.attempted else "wrong")
        colour = FEEDBACK_COLOURS[verdict]
        icon = {"ok": "&#10004;", "todo": "&#9998;", "wrong": "&#10008;"}[verdict]
        return (
            f'<div class="selfattn-feedback" data-verdict="{verdict}" style="border-left:4px solid {colour};'
            f"padding:0.4em 0.8em;margin:0.3em 0;background:{FEEDBACK_BACKGROUND};color:{FEEDBACK_TEXT}\">"
            f'<strong style="color:{colour}">{icon} Exercise {html.escape(self.exercise)}</strong>'
            f"<br>{_inline_code(self.message)}</div>"
        )


# The feedback box's own colours (light): text and the title's colour for each verdict, all at least
# 4.5:1 against the background (WCAG AA; tests/unit/test_exercises_base.py computes the ratios).
FEEDBACK_BACKGROUND = "#f6f8fa"
FEEDBACK_TEXT = "#1f2328"
FEEDBACK_COLOURS = {"ok": "#116329", "wrong": "#a40e26", "todo": "#59636e"}
# Inline code inside the box: the box's text colour on a faint grey (a theme's code colour, chosen for its
# own background, would not do: pydata-sphinx-theme's dark mode draws code in light pink).
FEEDBACK_CODE_STYLE = "color:inherit;background:rgba(175,184,193,0.25);padding:0.05em 0.3em;border-radius:0.2em"


def _inline_code(message: str) -> str:
    """The message as HTML, with its Markdown-style `code` spans drawn as <code> (no literal backticks)."""
    return re.sub(r"`([^`]+)`", rf'<code style="{FEEDBACK_CODE_STYLE}">\1</code>', html.escape(message))


def passed(exercise: str, message: str = "Well done.") -> Feedback:
    return Feedback(exercise, True, message)


def failed(exercise: str, message: str) -> Feedback:
    return Feedback(exercise, False, message)


def not_attempted(exercise: str) -> Feedback:
    return Feedback(exercise, False, "Replace `raise NotImplementedError` with your code, then run the check again.",
                    attempted=False)


class _LearnerError(Exception):
    def __init__(self, feedback: Feedback):
        super().__init__(feedback.message)
        self.feedback = feedback


_DOES_NOTHING = {"RESUME", "NOP", "CACHE", "LOAD_CONST", "RETURN_CONST", "RETURN_VALUE"}


def is_empty_stub(fn) -> bool:
    """True when ``fn``'s body does nothing (``pass``, ``...``, a docstring): not yet attempted.

    Its byte code then only returns the constant None. A body with any code that returns None is
    judged by :func:`call_learner` instead ("did you forget return?")."""
    code = getattr(fn, "__code__", None)
    if code is None:
        return False
    ops = list(dis.get_instructions(code))
    return all(op.opname in _DOES_NOTHING for op in ops) and all(
        op.argval is None for op in ops if op.opname in ("LOAD_CONST", "RETURN_CONST"))


def call_learner(exercise: str, fn: Callable, *args, **kwargs):
    """Call the learner's function; turn a missing or crashing answer into feedback.

    Returns the function's result. Raises ``_LearnerError`` carrying the Feedback; use it through
    :func:`checker`. A function whose body does nothing (:func:`is_empty_stub`) is not attempted yet.
    """
    if not callable(fn):
        raise _LearnerError(failed(exercise, f"Pass your function itself, not {type(fn).__name__}."))
    if is_empty_stub(fn):  # `pass`, `...` or a docstring: not attempted yet, in every chapter alike
        raise _LearnerError(not_attempted(exercise))
    try:
        result = fn(*args, **kwargs)
    except NotImplementedError:
        raise _LearnerError(not_attempted(exercise)) from None
    except Exception as err:  # the learner's bug is reported, not raised
        raise _LearnerError(failed(exercise, f"Your function raised {type(err).__name__}: {err}")) from None
    if result is None:
        raise _LearnerError(failed(exercise, "Your function returned None: did you forget `return`?"))
    _ANSWERS[0] += 1  # one of the learner's functions answered: a check of two functions has begun
    return result


# How many learner functions have answered (returned a value) through call_learner: a check of two functions
# (6.1's split and merge) whose second still raises NotImplementedError has its first part attempted.
_ANSWERS = [0]


# The progress registry: exercise name -> its chapter module and, per part (each check made for the exercise,
# by the check's name: a main part and a follow-up, a forward and a backward), the learner's function followed
# and its latest verdict. A check registers its part when its module is imported (the @checker below), so
# every chapter's checks take part without code of their own.
_REGISTRY: dict[str, dict] = {}


def _learner_name(args, kwargs) -> str | None:
    """The name of the first function handed to a check, None for a lambda or a chapter's own solution
    (``..._solution``): those show the check at work and are not the learner's attempt."""
    for value in (*args, *kwargs.values()):
        if callable(value):
            name = getattr(value, "__name__", None)
            if not isinstance(name, str) or name == "<lambda>" or name.endswith("_solution"):
                return None
            return name
    return None


def _record(exercise: str, part: str, args, kwargs, feedback: Feedback, started: bool = False) -> None:
    """Keep ``feedback`` as the verdict on ``part`` of ``exercise`` when it judged the learner's function: the
    first function checked for a part (the stub the chapter asks to fill in) is the one followed; a function
    of another name (a chapter's demonstration of a wrong answer) does not change the verdict. ``started``:
    the verdict is "not attempted", but one of the several functions handed to the check answered."""
    entry = _REGISTRY.get(exercise)
    name = _learner_name(args, kwargs)
    if entry is None or name is None or part not in entry["parts"]:
        return
    state = entry["parts"][part]
    if state["name"] is None:
        state["name"] = name
    if state["name"] == name:
        state["feedback"], state["started"] = feedback, started


def part_feedback(exercise: str, part: str) -> Feedback | None:
    """The latest verdict recorded in this kernel on ``part`` (a check's name) of ``exercise`` for the learner's
    function, None while none was recorded. A follow-up's check uses it to say that the main part still fails."""
    state = _REGISTRY.get(exercise, {}).get("parts", {}).get(part)
    return None if state is None else state["feedback"]


def _part_status(state: dict) -> str:
    feedback = state["feedback"]
    if feedback is None or not getattr(feedback, "attempted", True):
        return "in progress" if state.get("started") else "not attempted"
    return "passed" if bool(feedback) else "failed"


def _status(entry: dict) -> str:
    """An exercise's status from its parts': passed when every part passed, failed when any part failed, not
    attempted when no part was attempted, in progress otherwise (some parts passed, the others not attempted;
    or a check of two functions, one answered and the other still a stub)."""
    parts = [_part_status(state) for state in entry["parts"].values()]
    if any(s == "failed" for s in parts):
        return "failed"
    if all(s == "passed" for s in parts):
        return "passed"
    if all(s == "not attempted" for s in parts):
        return "not attempted"
    return "in progress"


def progress(*, file=None) -> dict[str, str]:
    """Print, per chapter whose exercises were imported in this kernel, which exercises passed, failed or
    are not attempted yet (a stub that raises ``NotImplementedError`` counts as not attempted, and so does
    an exercise never checked). An exercise of several parts (several checks, e.g. a main part and its
    follow-up) passed when all its parts passed, failed when any failed, is not attempted when none was
    attempted, and in progress when some passed and the others are not attempted yet (so is a check of two
    functions, 6.1's split and merge, while one answers and the other is still a stub).

    Args:
        file: where to print (default ``sys.stdout``).

    Returns:
        ``{exercise name: "passed" | "failed" | "in progress" | "not attempted"}``, in chapter order.
        Chapter 00.
    """
    import sys

    out = sys.stdout if file is None else file
    result = {name: _status(entry) for name, entry in _REGISTRY.items()}
    if not result:
        print("No exercises yet in this kernel: run a chapter's exercise cells, then progress() again.", file=out)
        return result
    by_chapter: dict[str, list[str]] = {}
    for name, entry in _REGISTRY.items():
        by_chapter.setdefault(entry["module"].rsplit(".", 1)[-1], []).append(name)
    for module in sorted(by_chapter):
        names = sorted(by_chapter[module], key=_exercise_order)
        counts = {s: sum(result[n] == s for n in names) for s in ("passed", "failed", "in progress", "not attempted")}
        started = f"{counts['in progress']} in progress, " if counts["in progress"] else ""
        print(f"Chapter {module[2:]}: {counts['passed']} of {len(names)} passed, {counts['failed']} failed, "
              f"{started}{counts['not attempted']} not attempted", file=out)  # fmt: skip
        for name in names:
            print(f"  {result[name]:<14} {name}", file=out)
    return {name: result[name] for module in sorted(by_chapter) for name in sorted(by_chapter[module], key=_exercise_order)}  # fmt: skip


def _exercise_order(name: str):
    number = re.match(r"(\d+)\.(\d+)", name)
    return (int(number.group(1)), int(number.group(2)), name) if number else (10**6, 0, name)


def checker(exercise: str):
    """Decorator for check functions: a ``_LearnerError`` raised inside becomes the returned Feedback.

    It also registers ``exercise`` for :func:`progress`, this check as one of its parts (an exercise may have
    several checks: a main part and a follow-up), and records each verdict on the learner's function."""

    def wrap(check):
        entry = _REGISTRY.setdefault(exercise, {"module": check.__module__, "parts": {}})
        entry["parts"].setdefault(check.__name__, {"name": None, "feedback": None, "started": False})

        def run(*args, **kwargs) -> Feedback:
            answers = _ANSWERS[0]
            try:
                # An empty body (`pass`, `...`, a docstring) in every function handed in: not attempted yet,
                # for every check alike, also those that call the learner without call_learner. (Of two
                # functions, an empty one is found by call_learner when the check reaches it.)
                functions = [a for a in (*args, *kwargs.values()) if callable(a)]
                if functions and all(is_empty_stub(a) for a in functions):
                    raise _LearnerError(not_attempted(exercise))
                feedback = check(*args, **kwargs)
            except _LearnerError as err:
                feedback = err.feedback
            started = not feedback.attempted and len(functions) > 1 and _ANSWERS[0] > answers
            _record(exercise, check.__name__, args, kwargs, feedback, started)
            return feedback

        run.__name__ = check.__name__
        run.__doc__ = check.__doc__
        run.__wrapped__ = check
        run.exercise = exercise
        return run

    return wrap


def to_numpy(x) -> np.ndarray | None:
    """Learner output as a float64 array, or None if it is not array-like."""
    if isinstance(x, torch.Tensor):
        return x.detach().cpu().double().numpy()
    try:
        arr = np.asarray(x, dtype=np.float64)
    except (TypeError, ValueError):
        return None
    return arr


def compare_arrays(exercise: str, got, expected: np.ndarray, *, what: str, atol: float = 1e-6,
                   rtol: float = 1e-6) -> Feedback | None:
    """Return failure Feedback for a wrong type, shape, NaN or value; None if ``got`` matches.

    The tolerance is ``|got - expected| <= atol + rtol * |expected|`` elementwise.
    """
    arr = to_numpy(got)
    if arr is None:
        return failed(exercise, f"{what} should be an array or tensor; got {type(got).__name__}.")
    if arr.shape != expected.shape:
        if arr.ndim == 0 and expected.ndim > 0:  # one number (a NaN, a float, a 0-d tensor) where an array belongs
            return failed(exercise, f"{what} should be an array of shape {expected.shape}; you returned one number, "
                                    f"{float(arr):.6g} ({type(got).__name__}).")
        return failed(exercise, f"{what} should have shape {expected.shape}; got {arr.shape}.")
    if not np.isfinite(arr).all():
        return failed(exercise, f"{what}: NaN or inf in {int((~np.isfinite(arr)).sum())} entries.")
    if not np.allclose(arr, expected, atol=atol, rtol=rtol):
        worst = float(np.max(np.abs(arr - expected)))
        return failed(exercise, f"{what}: right shape, wrong values (largest error {worst:.3g}).")
    return None


def bool_mask_problem(got) -> str | None:
    """What is wrong with the dtype of a learner's mask, in words; None if it is boolean (or not array-like).

    The course's rule for every mask exercise: a mask is boolean, True = may attend. A torch bool
    tensor, a NumPy bool array and nested lists of Python bools are all fine; a 0/1 integer or float
    mask (tensor, array or list) is refused as ambiguous (added to the scores? 1 = blocked?).
    """
    if isinstance(got, torch.Tensor):
        dtype = got.dtype
        if dtype == torch.bool:
            return None
    else:
        try:
            dtype = np.asarray(got).dtype
        except (TypeError, ValueError):
            return None
        if dtype.kind not in "iufc":  # bool, or not an array of numbers: judged by the value checks
            return None
    return (f"Return a boolean tensor (True = may attend); you returned dtype {dtype}. A 0/1 number mask is "
            "ambiguous here (added to the scores? 1 = blocked?): convert with .bool() (NumPy: .astype(bool)) "
            "if 1 means keep.")  # fmt: skip
