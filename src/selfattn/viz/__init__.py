"""Plotly figure builders and ipywidgets explorers. Builders return figures; they never show them.

Importing this module registers the ``"selfattn"`` plotly renderer and makes it the default
(except on Colab, which has its own). Why: plotly 6 and later emit, inside a kernel, only the
``application/vnd.plotly.v1+json`` mimetype, which Jupyter Book 1 drops without a warning, so a
figure would be blank in the published book. The renderer sends that mimetype (for JupyterLab,
VS Code) *and* a ``text/html`` div that draws the figure with the plotly.js the book serves itself
(``book/_ext/selfattn_book.py``), so the static page needs no kernel and no CDN.

Classic Notebook 6 and nbclassic (Binder's interface) render neither the JSON mimetype nor a page
with plotly.js, so the same ``text/html`` asks the kernel, once per page, for the plotly.js that
ships inside the installed ``plotly`` package (:func:`plotlyjs_for_classic_notebook`, over the
Jupyter.notebook.kernel API that only those front ends have) and loads it: offline, and nothing is
added to a figure's output, so the book's pages do not grow.

On Colab, importing this module also turns on Colab's custom widget manager, which the explorers
(ipywidgets) and the tqdm progress bars need to show there.

Topic modules (``selfattn.viz.heatmaps``...) hold the builders; this module holds the plumbing.
"""

from __future__ import annotations

import html
import json
import os
import sys
import uuid

import plotly.graph_objects as go
import plotly.io as pio
from plotly.io.base_renderers import MimetypeRenderer

__all__ = ["RENDERER_NAME", "use_book_renderer", "describe", "figure_description", "COLORSCALE", "DIVERGING",
           "plotlyjs_for_classic_notebook", "enable_colab_widgets", "add_marked_vline", "with_lab_notes",
           "views_figure"]

RENDERER_NAME = "selfattn"

# Perceptually uniform, readable in grayscale and by colour-blind readers (issue: accessibility).
COLORSCALE = "Viridis"
DIVERGING = "RdBu"  # only for signed quantities, centred on zero with zmid=0

_PLOTLY_CONFIG = {"displaylogo": False, "responsive": True}


def figure_description(fig: go.Figure) -> str:
    """The text description attached by :func:`describe` (empty if none)."""
    meta = fig.layout.meta
    if isinstance(meta, dict):
        return str(meta.get("description", ""))
    return ""


def with_lab_notes(main: str, notes: str) -> str:
    """Markdown: ``main`` (the main line), then ``notes`` in a collapsed "Lab notes" box, an HTML
    ``<details class="selfattn-labnotes">`` that stays folded in the built book, JupyterLab, Notebook 7
    and Colab alike (issue 26: measurement methodology out of the main line). No box if ``notes`` is
    empty.

    Raises: TypeError: ``main`` or ``notes`` not a str.
    """
    for name, value in (("main", main), ("notes", notes)):
        if not isinstance(value, str):
            raise TypeError(f"{name} must be a str (Markdown); got {type(value).__name__}")
    if not notes.strip():
        return main
    return (f"{main}\n\n<details class=\"selfattn-labnotes\">\n<summary>Lab notes</summary>\n\n"
            f"{notes.strip()}\n\n</details>\n")


def views_figure(views, *, label: str = "view") -> go.Figure:
    """Several figures in one, with a row of buttons to switch between them (works with no kernel).

    Each view keeps its traces, title, axis titles and axis types; the first view shows first. The
    figures should share their axes' kind (all heatmaps over the same grid, or all bar charts).

    Args:
        views: ``{button label: figure}``, at least two, each with at least one trace.
        label: what the buttons choose, for the keyboard controls' name (e.g. ``"seed"``).

    Raises:
        ValueError: fewer than two views, or a view without traces.
        TypeError: a view that is not a ``plotly.graph_objects.Figure``.

    Source: the course's explorers (chapter 09's ``scaling_figure`` is one such figure).
    """
    views = dict(views)
    if len(views) < 2:
        raise ValueError(f"views must hold at least two figures; got {len(views)}")
    for name, fig in views.items():
        if not isinstance(fig, go.Figure):
            raise TypeError(f"views[{name!r}] must be a plotly Figure; got {type(fig).__name__}")
        if not fig.data:
            raise ValueError(f"views[{name!r}] has no traces")
    first = next(iter(views.values()))
    out = go.Figure(layout=first.layout)
    counts = []
    for j, fig in enumerate(views.values()):
        for trace in fig.data:
            trace = go.Figure(data=[trace]).data[0]
            trace.visible = j == 0
            out.add_trace(trace)
        counts.append(len(fig.data))
    buttons, start = [], 0
    for j, (name, fig) in enumerate(views.items()):
        visible = [False] * sum(counts)
        visible[start:start + counts[j]] = [True] * counts[j]
        start += counts[j]
        relayout = {"title": fig.layout.title.to_plotly_json() if fig.layout.title else {},
                    "xaxis.title": fig.layout.xaxis.title.to_plotly_json(), "yaxis.title": fig.layout.yaxis.title.to_plotly_json(),
                    "xaxis.type": fig.layout.xaxis.type, "yaxis.type": fig.layout.yaxis.type,
                    "shapes": [sh.to_plotly_json() for sh in fig.layout.shapes],
                    "annotations": [a.to_plotly_json() for a in fig.layout.annotations]}
        buttons.append({"label": str(name), "method": "update", "args": [{"visible": visible}, relayout]})
    top = (first.layout.margin.t or 80) + 40
    out.update_layout(updatemenus=[{"type": "buttons", "direction": "right", "buttons": buttons, "x": 0.0, "y": 1.0,
                                    "yanchor": "bottom", "xanchor": "left", "pad": {"b": 8}, "showactive": True,
                                    "name": label}],
                      margin={"t": top})
    descriptions = [figure_description(fig) for fig in views.values()]
    return describe(out, f"Buttons ({label}: {', '.join(map(str, views))}) switch between views. "
                         + " ".join(d for d in descriptions if d))


def describe(fig: go.Figure, description: str) -> go.Figure:
    """Attach a text description (for screen readers and readers without JavaScript); returns ``fig``.

    Raises:
        ValueError: the description is empty.
    """
    if not isinstance(description, str) or not description.strip():
        raise ValueError(f"description must be a non-empty string; got {description!r}")
    meta = dict(fig.layout.meta) if isinstance(fig.layout.meta, dict) else {}
    meta["description"] = description.strip()
    fig.update_layout(meta=meta)
    return fig


def add_marked_vline(fig: go.Figure, x: float, text: str, *, log_x: bool, line: dict | None = None,
                     side: str = "right", font: dict | None = None) -> go.Figure:
    """A vertical line at data value ``x`` across the plot, labelled ``text`` at its top; returns ``fig``.

    plotly's ``add_vline(annotation_text=...)`` places the label at ``x`` in axis units, but on a log
    axis an annotation's x is log10 of the data value (a shape's is the data value itself): a label
    at block 64 lands at 1e64 and the autorange stretches to it (issue 31). This helper gives the
    annotation ``log10(x)`` when ``log_x`` is true. ``side``: "right" or "left" of the line.

    Raises:
        ValueError: ``x`` not finite, or not > 0 on a log axis; ``side`` not "right" or "left".
    """
    import math

    value = float(x)
    if not math.isfinite(value) or (log_x and value <= 0):
        raise ValueError(f"x must be finite{' and > 0 on a log axis' if log_x else ''}; got {x!r}")
    if side not in ("right", "left"):
        raise ValueError(f"side must be 'right' or 'left'; got {side!r}")
    fig.add_vline(x=value, line=line or {})
    fig.add_annotation(x=math.log10(value) if log_x else value, xref="x", y=1.0, yref="y domain", text=text,
                       showarrow=False, xanchor="left" if side == "right" else "right", yanchor="top",
                       font=font or {})
    return fig


class BookRenderer(MimetypeRenderer):
    """Emit plotly's own JSON mimetype plus a self-contained ``text/html`` figure.

    The HTML expects a global ``Plotly`` (served by the book). It waits for it, so the order in
    which scripts load does not matter, and says so in the page if plotly.js never arrives. In
    Classic Notebook 6 / nbclassic, where nothing provides it, it fetches plotly.js from the kernel
    once per page (:data:`_CLASSIC_PLOTLYJS_JS`).
    """

    def to_mimebundle(self, fig_dict):
        fig = go.Figure(fig_dict, skip_invalid=True)
        div_id = f"selfattn-fig-{uuid.uuid4().hex[:12]}"
        description = figure_description(fig)
        spec = {"data": fig_dict.get("data", []), "layout": fig_dict.get("layout", {}),
                "frames": fig_dict.get("frames", [])}
        payload = pio.to_json(spec, validate=False).replace("</", "<\\/")  # no early </script>
        label = html.escape(description or "interactive figure", quote=True)
        hidden = f'<p class="selfattn-figure-text">{html.escape(description)}</p>' if description else ""
        markup = f"""<div class="selfattn-figure" role="figure" aria-label="{label}">
<div id="{div_id}" class="plotly-graph-div" style="width:100%;min-height:{_height(fig)}px"></div>
{hidden}
<script type="text/javascript">
(function () {{
  var spec = {payload};
  var config = {json.dumps(_PLOTLY_CONFIG)};
  var asked = false;
  function draw(tries) {{
    var el = document.getElementById("{div_id}");
    if (!el) {{
      // Not in the page yet: Classic Notebook 6 renders an Output widget's outputs (a live
      // explorer's first view) before it puts the widget in the page. Wait for it (10 s at most).
      if (tries < 200) {{ setTimeout(function () {{ draw(tries + 1); }}, 50); }}
      return;
    }}
    if (!window.Plotly && !asked) {{ asked = true; {_CLASSIC_PLOTLYJS_JS}(); }}
    if (window.Plotly) {{
      window.Plotly.newPlot(el, spec.data, spec.layout, config).then(function () {{
        if (spec.frames && spec.frames.length) {{ return window.Plotly.addFrames(el, spec.frames); }}
      }}).then(function () {{ {_CONTROLS_JS}(el); }});
    }} else if (tries < (window._selfattnPlotlyRequested ? 12000 : 200)) {{
      setTimeout(function () {{ draw(tries + 1); }}, 50);
    }} else {{
      el.textContent = "This figure needs plotly.js, which did not load.";
    }}
  }}
  draw(0);
}})();
</script>
</div>"""
        return {
            "application/vnd.plotly.v1+json": {**spec, "config": _PLOTLY_CONFIG},
            "text/html": markup,
        }


# The expression the classic front ends evaluate in the kernel (a user expression: silent, no cell,
# no history, no output in the notebook) to fetch plotly.js.
_PLOTLYJS_EXPRESSION = "__import__('selfattn.viz').viz.plotlyjs_for_classic_notebook()"


class _PlotlyJS:
    """plotly.js as IPython shows it: its source under ``application/javascript``."""

    def _repr_javascript_(self) -> str:
        from plotly.offline import get_plotlyjs

        return get_plotlyjs()

    def __repr__(self) -> str:
        return "<plotly.js of the installed plotly package>"


def plotlyjs_for_classic_notebook() -> _PlotlyJS:
    """plotly.js, for the figures' HTML to fetch in Classic Notebook 6 / nbclassic (offline).

    Evaluated in the kernel as a user expression; IPython formats it as ``application/javascript``.
    """
    return _PlotlyJS()


# Classic Notebook 6 and nbclassic: no plotly.js in the page, but the kernel has the plotly package.
# Ask it (window.Jupyter.notebook.kernel, which only those front ends define) for plotly.js once per
# page, and run it with require.js's `define` hidden, as the book does, so that plotly.js sets the
# global `Plotly` instead of registering an anonymous AMD module. The kernel answers only once the
# running cell is done, so while the request is open the figures wait up to 10 minutes instead of
# 10 seconds. Elsewhere (the book, JupyterLab, VS Code, Colab) there is no such kernel object and
# this does nothing.
_CLASSIC_PLOTLYJS_JS = """(function () {
  var nb = window.Jupyter && window.Jupyter.notebook, kernel = nb && nb.kernel;
  if (window.Plotly || window._selfattnPlotlyRequested || !kernel || !kernel.execute) return;
  window._selfattnPlotlyRequested = true;
  kernel.execute("", {shell: {reply: function (msg) {
    var got = ((msg && msg.content && msg.content.user_expressions) || {}).plotlyjs || {};
    var code = (got.data || {})["application/javascript"];
    if (!code || window.Plotly) { window._selfattnPlotlyRequested = !!window.Plotly; return; }
    var amd = window.define;
    window.define = undefined;
    try {
      var script = document.createElement("script");
      script.type = "text/javascript";
      script.textContent = code;
      document.head.appendChild(script);
    } finally {
      window.define = amd;
    }
  }}}, {silent: true, store_history: false,
        user_expressions: {plotlyjs: __PLOTLYJS_EXPRESSION__}});
})""".replace("__PLOTLYJS_EXPRESSION__", json.dumps(_PLOTLYJS_EXPRESSION))


# plotly draws its sliders and menus in SVG, which the keyboard cannot reach. Under every figure that
# has them, the renderer adds HTML controls bound to the same steps and buttons (issue 6:
# accessibility): an <input type=range> per slider, a <select> per dropdown, <button>s per button
# row. Each runs the step's own plotly command and moves the SVG control with it, and follows it when
# the mouse moves the SVG control.
_CONTROLS_JS = """(function (el) {
  var P = window.Plotly, layout = el.layout || {};
  var sliders = layout.sliders || [], menus = layout.updatemenus || [];
  if (!sliders.length && !menus.length) return;
  var box = document.createElement("div");
  box.className = "selfattn-controls";
  box.setAttribute("role", "group");
  box.setAttribute("aria-label", "Figure controls");
  function run(item, active) {
    var method = item && item.method, call = method && method !== "skip" && P[method];
    var done = call ? call.apply(P, [el].concat(item.args || [])) : null;
    return Promise.resolve(done).then(function () { return P.relayout(el, active); });
  }
  function named(text, fallback) {
    return String(text || fallback).replace(/[\\s:=]+$/, "");
  }
  sliders.forEach(function (s, i) {
    var steps = s.steps || [];
    if (!steps.length) return;
    var label = document.createElement("label");
    var name = named((s.currentvalue || {}).prefix || s.name, sliders.length > 1 ? "Step " + (i + 1) : "Step");
    var input = document.createElement("input");
    var out = document.createElement("output");
    input.type = "range"; input.min = 0; input.max = steps.length - 1; input.step = 1;
    input.value = s.active || 0;
    input.setAttribute("aria-label", name);
    function show() {
      var step = steps[+input.value] || {};
      out.textContent = step.label !== undefined ? String(step.label) : input.value;
      input.setAttribute("aria-valuetext", out.textContent);
    }
    input.addEventListener("input", function () {
      var k = +input.value, active = {};
      active["sliders[" + i + "].active"] = k;
      show();
      run(steps[k], active);
    });
    el.on("plotly_sliderchange", function (e) {
      if (e && e.slider && e.slider._index === i && e.step) { input.value = e.step._index; show(); }
    });
    show();
    label.appendChild(document.createTextNode(name + " "));
    label.appendChild(input);
    label.appendChild(out);
    box.appendChild(label);
  });
  menus.forEach(function (m, i) {
    var buttons = m.buttons || [];
    if (!buttons.length) return;
    var name = named(m.name, menus.length > 1 ? "View " + (i + 1) : "View");
    function activate(j) {
      var active = {};
      active["updatemenus[" + i + "].active"] = j;
      return run(buttons[j], active);
    }
    if (m.type === "buttons") {
      var group = document.createElement("span");
      group.setAttribute("role", "group");
      group.setAttribute("aria-label", name);
      buttons.forEach(function (b, j) {
        var button = document.createElement("button");
        button.type = "button";
        button.textContent = named(b.label, "Option " + (j + 1));
        button.addEventListener("click", function () { activate(j); });
        group.appendChild(button);
      });
      box.appendChild(group);
    } else {
      var label = document.createElement("label");
      var select = document.createElement("select");
      select.setAttribute("aria-label", name);
      buttons.forEach(function (b, j) {
        var option = document.createElement("option");
        option.value = j;
        option.textContent = named(b.label, "Option " + (j + 1));
        select.appendChild(option);
      });
      select.value = m.active || 0;
      select.addEventListener("change", function () { activate(+select.value); });
      label.appendChild(document.createTextNode(name + " "));
      label.appendChild(select);
      box.appendChild(label);
    }
  });
  el.parentNode.insertBefore(box, el.nextSibling);
})"""


def _height(fig: go.Figure) -> int:
    return int(fig.layout.height) if fig.layout.height else 450


def _in_colab() -> bool:
    return "google.colab" in sys.modules


def enable_colab_widgets() -> bool:
    """On Colab, turn on its custom widget manager; returns whether it did.

    Colab's own manager renders only the widgets it ships with; the explorers (ipywidgets) and the
    tqdm progress bars of the training chapters show there only with the custom manager
    (``google.colab.output.enable_custom_widget_manager``). Elsewhere this does nothing.
    """
    if not _in_colab():
        return False
    try:
        from google.colab import output
    except ImportError:
        return False
    enable = getattr(output, "enable_custom_widget_manager", None)
    if enable is None:  # a Colab too old to have it: its own manager is all there is
        return False
    enable()
    return True


def use_book_renderer() -> None:
    """Register the ``"selfattn"`` renderer and make it plotly's default (Colab keeps ``"colab"``).

    Set the environment variable ``SELFATTN_PLOTLY_RENDERER`` to pick another renderer.
    """
    pio.renderers[RENDERER_NAME] = BookRenderer()
    chosen = os.environ.get("SELFATTN_PLOTLY_RENDERER")
    if chosen:
        pio.renderers.default = chosen
    elif _in_colab():
        pio.renderers.default = "colab"
    else:
        pio.renderers.default = RENDERER_NAME


use_book_renderer()
enable_colab_widgets()
