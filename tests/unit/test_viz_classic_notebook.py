"""Figures show in Classic Notebook 6 / nbclassic (Binder's interface), offline.

Those front ends render neither plotly's JSON mimetype nor a page with plotly.js, so the renderer's
``text/html`` asks the kernel (``Jupyter.notebook.kernel``) once per page for the plotly.js of the
installed plotly package. The book's pages must not grow: plotly.js is never part of a figure's
output (the book serves it once for every page).
"""

from __future__ import annotations

import json
import os
import shutil

import plotly.graph_objects as go
import plotly.io as pio
import pytest
from IPython.core.formatters import DisplayFormatter
from plotly.offline import get_plotlyjs

from selfattn import viz

PLOTLY_MIME = "application/vnd.plotly.v1+json"


def _bundle(fig=None):
    fig = fig or viz.describe(go.Figure(go.Heatmap(z=[[0.1, 0.9], [0.5, 0.5]])), "A 2 by 2 heat map.")
    return pio.renderers[viz.RENDERER_NAME].to_mimebundle(fig.to_dict())


def _expression(markup: str) -> str:
    marker = "user_expressions: {plotlyjs: "
    assert marker in markup, "the figure's html never asks the kernel for plotly.js"
    return json.loads(markup.split(marker, 1)[1].split("}", 1)[0])


def test_html_asks_the_kernel_for_the_installed_plotlyjs():
    expression = _expression(_bundle()["text/html"])
    data, _ = DisplayFormatter().format(eval(expression))  # what IPython sends back for it
    assert data["application/javascript"] == get_plotlyjs()
    assert len(data["text/plain"]) < 100  # the plain repr does not repeat 4 MB of JavaScript


def test_figure_output_does_not_carry_plotlyjs():
    bundle = _bundle()
    assert set(bundle) == {PLOTLY_MIME, "text/html"}
    assert len(bundle["text/html"]) < 50_000 < len(get_plotlyjs())


# A stand-in for Classic Notebook: require.js's AMD `define` is present (it makes plotly.js register
# as a module instead of the global `Plotly`), and Jupyter.notebook.kernel.execute answers the user
# expression with what IPython's formatter gives for it (filled in from Python below).
CLASSIC_PAGE = """<!doctype html><html><head><meta charset="utf-8">
<script>
window.define = function () {}; window.define.amd = {};
window.kernelCalls = [];
window.Jupyter = {notebook: {kernel: {execute: function (code, callbacks, options) {
  window.kernelCalls.push(options);
  var expr = options.user_expressions.plotlyjs;
  setTimeout(function () {
    callbacks.shell.reply({content: {status: "ok", user_expressions: {plotlyjs:
      {status: "ok", data: {"text/plain": "...", "application/javascript": window.answers[expr]}}}}});
  }, window.replyDelay);
}}}};
</script></head><body><div id="out"></div></body></html>"""


@pytest.mark.slow
@pytest.mark.parametrize("reply_ms", [10, 11_000], ids=["idle-kernel", "kernel-busy-11s"])
def test_figures_draw_in_a_classic_notebook_page_offline(reply_ms):
    """Two figures, one request; also when the kernel answers only after its running cell (11 s,
    past the 10 s a figure waits for plotly.js that nobody fetches)."""
    path = os.environ.get("SELFATTN_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    sync_api = pytest.importorskip("playwright.sync_api")
    if path is None:
        if os.environ.get("CI", "").lower() in ("true", "1"):
            pytest.fail("chromium is not installed (CI=true: the browser tests must run in CI)")
        pytest.skip("chromium is not installed")
    first, second = _bundle()["text/html"], _bundle()["text/html"]
    expression = _expression(first)
    answer = DisplayFormatter().format(eval(expression))[0]["application/javascript"]
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=path, headless=True, args=["--no-sandbox"])
        try:
            page = browser.new_page()
            page.route("**/*", lambda route: route.abort())  # offline: no host at all
            page.set_content(CLASSIC_PAGE)
            page.evaluate("([expr, code, ms]) => { window.answers = {[expr]: code}; window.replyDelay = ms; }",
                          [expression, answer, reply_ms])
            # Classic Notebook inserts each text/html output with jQuery, which runs its scripts.
            for markup in (first, second):
                page.evaluate("""(markup) => {
                  const box = document.createElement("div");
                  box.innerHTML = markup;
                  document.getElementById("out").appendChild(box);
                  box.querySelectorAll("script").forEach((old) => {
                    const s = document.createElement("script");
                    s.textContent = old.textContent;
                    old.replaceWith(s);
                  });
                }""", markup)
            page.wait_for_function("document.querySelectorAll('.plotly-graph-div .main-svg').length >= 2",
                                   timeout=reply_ms + 20_000)
            assert page.evaluate("typeof window.Plotly.newPlot") == "function"
            assert page.evaluate("window.kernelCalls.length") == 1  # once per page, not per figure
            assert page.evaluate("window.kernelCalls[0].silent") is True
            assert page.evaluate("""[...document.querySelectorAll('.plotly-graph-div')]
                .filter((el) => el.textContent.includes('needs plotly.js')).length""") == 0
        finally:
            browser.close()


@pytest.mark.slow
def test_a_figure_rendered_before_its_output_widget_joins_the_page_draws_when_it_does():
    """Issue 31, item 5: a live explorer (an ``interactive_output`` Output widget) stayed blank in
    Classic Notebook 6 until a control moved. Its first figure is in the Output widget's state when
    the widget is displayed, and Classic Notebook renders those outputs (running their scripts, as
    jQuery does: in a script element of its own, in the head) into the widget's view *before* it
    puts the view in the page, so the figure's script found no element and gave up."""
    path = os.environ.get("SELFATTN_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    sync_api = pytest.importorskip("playwright.sync_api")
    if path is None:
        if os.environ.get("CI", "").lower() in ("true", "1"):
            pytest.fail("chromium is not installed (CI=true: the browser tests must run in CI)")
        pytest.skip("chromium is not installed")
    markup = _bundle()["text/html"]
    expression = _expression(markup)
    answer = DisplayFormatter().format(eval(expression))[0]["application/javascript"]
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=path, headless=True, args=["--no-sandbox"])
        try:
            page = browser.new_page()
            page.route("**/*", lambda route: route.abort())  # offline: no host at all
            page.set_content(CLASSIC_PAGE)
            page.evaluate("([expr, code]) => { window.answers = {[expr]: code}; window.replyDelay = 10; }",
                          [expression, answer])
            page.evaluate("""(markup) => {
              const view = document.createElement("div");  // the widget's view, not yet in the page
              view.innerHTML = markup;
              view.querySelectorAll("script").forEach((old) => {  // jQuery's DOMEval
                const s = document.createElement("script");
                s.text = old.textContent;
                document.head.appendChild(s).parentNode.removeChild(s);
                old.remove();
              });
              window.widgetView = view;
            }""", markup)
            page.wait_for_timeout(500)  # the view joins the page once the widget manager is done
            assert page.evaluate("document.querySelectorAll('.plotly-graph-div').length") == 0
            page.evaluate("document.getElementById('out').appendChild(window.widgetView)")
            page.wait_for_function("document.querySelectorAll('.plotly-graph-div .main-svg').length >= 1",
                                   timeout=20_000)
            assert page.evaluate("window.kernelCalls.length") == 1
        finally:
            browser.close()
