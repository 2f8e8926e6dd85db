"""The feedback machinery shared by every chapter's exercise checks (``selfattn.exercises``)."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

from selfattn.exercises import (
    Feedback,
    call_learner,
    checker,
    compare_arrays,
    failed,
    not_attempted,
    passed,
    to_numpy,
)

# --- Feedback ----------------------------------------------------------------------------------


def test_feedback_truthiness():
    assert bool(passed("1.1 demo")) is True
    assert bool(failed("1.1 demo", "the rows do not sum to one")) is False
    assert bool(not_attempted("1.1 demo")) is False


def test_feedback_str():
    assert str(passed("2.1 softmax")) == "Exercise 2.1 softmax: correct. Well done."
    assert str(failed("2.1 softmax", "The rows do not sum to one.")) == (
        "Exercise 2.1 softmax: not yet right. The rows do not sum to one."
    )
    text = str(not_attempted("2.1 softmax"))
    assert text.startswith("Exercise 2.1 softmax: not attempted yet.")
    assert "raise NotImplementedError" in text
    assert repr(passed("x")) == str(passed("x"))


def test_feedback_html_escapes_and_colours():
    good = passed("2.1 <softmax>")._repr_html_()
    assert 'data-verdict="ok"' in good and "Exercise 2.1 &lt;softmax&gt;" in good
    bad = failed("2.1", "q < k & <script>")._repr_html_()
    assert 'data-verdict="wrong"' in bad and "q &lt; k &amp; &lt;script&gt;" in bad and "<script>" not in bad
    assert 'data-verdict="todo"' in not_attempted("2.1")._repr_html_()
    assert len({_title_colour(f._repr_html_()) for f in (passed("x"), failed("x", "no"), not_attempted("x"))}) == 3


def _luminance(hex_colour: str) -> float:
    """WCAG 2.x relative luminance of #rrggbb."""
    channels = [int(hex_colour.lstrip("#")[i:i + 2], 16) / 255 for i in (0, 2, 4)]
    lin = [c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4 for c in channels]
    return 0.2126 * lin[0] + 0.7152 * lin[1] + 0.0722 * lin[2]


def _contrast(a: str, b: str) -> float:
    hi, lo = sorted([_luminance(a), _luminance(b)], reverse=True)
    return (hi + 0.05) / (lo + 0.05)


def _title_colour(box: str) -> str:
    return re.search(r'<strong style="color:(#[0-9a-f]{6})">', box).group(1)


def test_feedback_box_brings_its_own_legible_colours():
    """Issue 31.4: in the book's dark mode the box's text (its `code`) was 1.01:1 and its title 3.1-3.6:1,
    drawn in colours meant for another background. The box now sets its background, its text colour and its
    code's colour; each text is >= 4.5:1 (WCAG AA) on that background."""
    assert _contrast("#ffffff", "#000000") == pytest.approx(21.0)  # the formula, on a known pair
    assert _contrast("#777777", "#ffffff") == pytest.approx(4.48, abs=0.01)
    for feedback in (passed("x"), failed("x", "use `a < b`"), not_attempted("x")):
        box = feedback._repr_html_()
        style = re.match(r'<div class="selfattn-feedback" data-verdict="\w+" style="([^"]*)">', box).group(1)
        background = re.search(r"(?:^|;)background:(#[0-9a-f]{6})", style).group(1)
        text = re.search(r"(?:^|;)color:(#[0-9a-f]{6})", style).group(1)
        assert _contrast(text, background) >= 4.5, (box, text, background)
        assert _contrast(_title_colour(box), background) >= 4.5, (box, background)
        for code_style in re.findall(r'<code style="([^"]*)">', box):
            assert "color:inherit" in code_style, code_style
        assert "<code>" not in box, "a code span without its own colour takes the theme's"


def test_feedback_html_shows_code_spans_as_code_not_backticks():
    box = not_attempted("2.1")._repr_html_()
    assert "`" not in box
    assert re.search(r"<code[^>]*>raise NotImplementedError</code>", box)
    assert re.search(r"<code[^>]*>a &lt; b</code>", failed("2.1", "use `a < b`")._repr_html_())


def test_feedback_is_frozen():
    with pytest.raises(AttributeError):
        passed("x").ok = False


# --- call_learner and checker -------------------------------------------------------------------


@checker("9.9 double")
def check_double(fn):
    got = call_learner("9.9 double", fn, np.arange(3.0))
    wrong = compare_arrays("9.9 double", got, np.arange(3.0) * 2, what="Your output")
    return wrong or passed("9.9 double")


def test_checker_passes_a_right_answer():
    fb = check_double(lambda x: 2 * x)
    assert isinstance(fb, Feedback) and fb.ok and fb.attempted


def test_checker_turns_not_implemented_into_not_attempted():
    def stub(x):
        raise NotImplementedError

    fb = check_double(stub)
    assert not fb and fb.attempted is False
    assert "not attempted yet" in str(fb)


def test_checker_turns_a_crash_into_a_message_naming_the_exception():
    def crash(x):
        return x @ np.ones((5, 5))

    fb = check_double(crash)
    assert not fb and fb.attempted
    assert fb.message.startswith("Your function raised ValueError: ")
    assert "matmul" in fb.message


def test_checker_refuses_a_non_callable():
    fb = check_double(np.arange(3.0))
    assert not fb
    assert fb.message == "Pass your function itself, not ndarray."


def test_checker_keeps_name_doc_and_exercise():
    assert check_double.__name__ == "check_double"
    assert check_double.exercise == "9.9 double"
    assert check_double.__wrapped__(lambda x: 2 * x).ok  # the undecorated check is reachable


def test_checker_does_not_swallow_bugs_in_the_check_itself():
    @checker("9.8 broken")
    def broken_check(fn):
        raise RuntimeError("bug in the check")

    with pytest.raises(RuntimeError, match="bug in the check"):
        broken_check(lambda: 1)


def test_call_learner_passes_arguments_and_returns_result():
    assert call_learner("x", lambda a, b=0: a + b, 2, b=3) == 5


# --- compare_arrays and to_numpy --------------------------------------------------------------


def test_compare_arrays_accepts_matching_tensor_and_list():
    expected = np.array([[0.25, 0.75]])
    assert compare_arrays("x", torch.tensor([[0.25, 0.75]]), expected, what="The weights") is None
    assert compare_arrays("x", [[0.25, 0.75 + 1e-9]], expected, what="The weights") is None


def test_compare_arrays_wrong_type():
    fb = compare_arrays("x", {"a": 1}, np.zeros(2), what="The weights")
    assert not fb and fb.message == "The weights should be an array or tensor; got dict."


def test_compare_arrays_wrong_shape():
    fb = compare_arrays("x", np.zeros((2, 3)), np.zeros((3, 2)), what="The weights")
    assert not fb and fb.message == "The weights should have shape (3, 2); got (2, 3)."


def test_compare_arrays_nan():
    got = np.array([0.5, np.nan, np.inf])
    fb = compare_arrays("x", got, np.zeros(3), what="The weights")
    assert not fb and fb.message == "The weights: NaN or inf in 2 entries."


def test_compare_arrays_wrong_values_reports_the_largest_error():
    fb = compare_arrays("x", np.array([0.5, 0.6]), np.array([0.5, 0.5]), what="The weights")
    assert not fb
    assert fb.message == "The weights: right shape, wrong values (largest error 0.1)."


def test_compare_arrays_tolerance():
    expected = np.array([1.0])
    assert compare_arrays("x", expected + 5e-7, expected, what="v") is None
    assert compare_arrays("x", expected + 5e-3, expected, what="v", atol=1e-2) is None
    assert compare_arrays("x", expected + 5e-3, expected, what="v") is not None


def test_to_numpy():
    out = to_numpy(torch.tensor([1.0, 2.0], requires_grad=True))
    assert out.dtype == np.float64
    np.testing.assert_array_equal(out, [1.0, 2.0])
    assert to_numpy(object()) is None
    assert to_numpy("abc") is None


def test_a_forgotten_return_is_named():
    # Regression: None became array(nan) and the feedback spoke of shapes or NaN instead.
    from selfattn.exercises import ch00

    def forgot_return(a, b):
        total = (a * b).sum()  # noqa: F841 - computed, never returned

    fb = ch00.check_dot_product(forgot_return)
    assert not fb.ok and fb.attempted and "returned None" in fb.message and "forget `return`" in fb.message


def test_one_number_where_an_array_belongs_is_named_as_such():
    # learner trial (issue 27): a returned NaN or float was reported as "got ()", a shape nobody wrote
    fb = compare_arrays("x", float("nan"), np.zeros((2, 3)), what="The context")
    assert not fb and fb.message == "The context should be an array of shape (2, 3); you returned one number, nan (float)."
    fb = compare_arrays("x", torch.tensor(1.5), np.zeros(4), what="The context")
    assert not fb and "you returned one number, 1.5 (Tensor)" in fb.message


def test_no_feedback_text_carries_markdown_emphasis_the_box_would_print_literally():
    # the feedback box shows plain text: *word* would print its asterisks (learner trial, issue 27)
    import ast
    import pathlib
    import re

    import selfattn.exercises as ex

    emphasis = re.compile(r"(?<![\w*])\*[A-Za-z][^*\n]*[A-Za-z]\*(?![\w*])")
    bad = []
    for path in sorted(pathlib.Path(ex.__file__).parent.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and emphasis.search(node.value):
                if not (node.value.startswith(("``", "Source")) or "\n" in node.value.strip()):  # docstrings aside
                    bad.append(f"{path.name}:{node.lineno}: {emphasis.search(node.value).group()}")
    assert not bad, bad
