"""The explorers' first view is in their Output widget's own state (issue 31: chapter 13's explorer
stayed blank in classic Notebook 6 after Run All until a control moved).

``ipywidgets.interactive_output`` draws the first view while the Output widget is being created and
relies on the front end to route that cell's display messages into the widget: kernel-side its
``outputs`` stay empty, and a front end that has not yet set up the routing (Notebook 6 during Run
All) shows nothing. ``selfattn.viz.live_output`` captures each view in the kernel and sets it as the
widget's ``outputs``, which every front end draws with the widget. Checked here in the kernel, the
mechanism itself (this machine's Notebook 6 could not create Output widgets at all, offline).
"""

from __future__ import annotations

import json

import ipywidgets as widgets
import numpy as np
import pytest
from IPython.core.interactiveshell import InteractiveShell

from selfattn.viz import live_output
from selfattn.viz.interpret import edge_measures_widget

PLOTLY_MIME = "application/vnd.plotly.v1+json"


@pytest.fixture(scope="module")
def shell():
    """A kernel-like IPython shell, so that fig.show() and display() publish rich output."""
    return InteractiveShell.instance()


def _title(output: dict) -> str:
    return json.dumps(output["data"][PLOTLY_MIME]["layout"]["title"])


def test_interactive_output_leaves_the_widget_state_empty(shell):
    """Why the helper exists: the first view of interactive_output is not in the widget's state."""
    slider = widgets.IntSlider(value=1)
    out = widgets.interactive_output(lambda n: print(n), {"n": slider})
    assert out.outputs == ()


def test_chapter_13_explorer_holds_its_first_view_and_follows_its_controls(shell):
    tokens = ["[CLS]", "a", "b", "[SEP]"]
    rng = np.random.default_rng(0)
    measures = {"weight": rng.random((2, 4, 4)), "moved norm": rng.random((2, 4, 4))}
    box = edge_measures_widget(tokens, measures, ["L5 H0", "L5 H1"])
    head, measure = box.children[0].children
    out = box.children[1]
    assert [o["output_type"] for o in out.outputs] == ["display_data"], out.outputs
    assert "L5 H0: weight" in _title(out.outputs[0]) and "text/html" in out.outputs[0]["data"]
    head.value = "L5 H1"
    assert len(out.outputs) == 1 and "L5 H1: weight" in _title(out.outputs[0])
    measure.value = "moved norm"
    assert len(out.outputs) == 1 and "L5 H1: moved norm" in _title(out.outputs[0])


def test_live_output_keeps_printed_text_and_shows_a_later_error(shell):
    slider = widgets.IntSlider(value=2, min=0, max=5)

    def render(n):
        if n == 0:
            raise ZeroDivisionError("n is 0")
        print(f"1/n = {1 / n:.2f}")

    out = live_output(render, {"n": slider})
    assert out.outputs == ({"output_type": "stream", "name": "stdout", "text": "1/n = 0.50\n"},)
    slider.value = 0
    assert out.outputs[0]["name"] == "stderr" and "ZeroDivisionError: n is 0" in out.outputs[0]["text"]
    with pytest.raises(ZeroDivisionError):  # the first view's error is the caller's
        live_output(render, {"n": widgets.IntSlider(value=0)})
    with pytest.raises(TypeError, match="controls must be a non-empty dict"):
        live_output(render, {})
