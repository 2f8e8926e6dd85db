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
           "views_figure", "live_output"]

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


def live_output(render, controls: dict):
    """An ``ipywidgets.Output`` that shows ``render(**values)`` for the controls' values now and after
    each change: what ``ipywidgets.interactive_output`` does, with the view written into the widget's
    own state (its ``outputs``) instead of captured by the front end.

    ``interactive_output`` draws its first view while the Output widget is being created, before it
    is displayed, and that view reaches the widget only if the front end has already routed the
    cell's messages to it. Classic Notebook 6 during Run All had not: chapter 13's explorer stayed
    blank until a control moved (issue 31). Here every view (the figures ``render`` shows, what it
    prints) is captured in the kernel and set as the widget's ``outputs``, which every front end
    (Notebook 6 and 7, JupyterLab, Colab, the book's static page) draws when it draws the widget.

    Args:
        render: ``render(**{name: control.value})``; shows figures (``fig.show()``, ``display``)
            or prints.
        controls: ``{argument name: widget}``, each with a ``value`` trait.

    Returns:
        The ``ipywidgets.Output``; the first view is in it before this returns.

    Raises:
        TypeError: ``controls`` not a non-empty dict of widgets with a ``value``.
        Whatever ``render`` raises for the first view (later views show the error in the output).
    """
    import traceback

    import ipywidgets as widgets
    from IPython.utils.capture import capture_output

    if not isinstance(controls, dict) or not controls or not all(hasattr(w, "observe") and hasattr(w, "value")
                                                                  for w in controls.values()):
        raise TypeError(f"controls must be a non-empty dict {{name: widget with a value}}; got {controls!r}")
    out = widgets.Output()

    def update(change=None):
        values = {name: w.value for name, w in controls.items()}
        outputs = []
        with capture_output(stdout=True, stderr=True, display=True) as got:
            try:
                render(**values)
            except Exception:
                if change is None:
                    raise
                print(traceback.format_exc(), file=sys.stderr)
        for name, text in (("stdout", got.stdout), ("stderr", got.stderr)):
            if text:
                outputs.append({"output_type": "stream", "name": name, "text": text})
        outputs += [{"output_type": "display_data", "data": o.data, "metadata": o.metadata or {}}
                    for o in got.outputs]
        out.outputs = tuple(outputs)

    for w in controls.values():
        w.observe(update, names="value")
    update()
    return out


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
                     side: str = "right", font: dict | None = None, y: float = 1.0) -> go.Figure:
    """A vertical line at data value ``x`` across the plot, labelled ``text`` at its top; returns ``fig``.

    plotly's ``add_vline(annotation_text=...)`` places the label at ``x`` in axis units, but on a log
    axis an annotation's x is log10 of the data value (a shape's is the data value itself): a label
    at block 64 lands at 1e64 and the autorange stretches to it (issue 31). This helper gives the
    annotation ``log10(x)`` when ``log_x`` is true. ``side``: "right" or "left" of the line; ``y``: the
    label's top, as a fraction of the plot's height (1: the top), to stack the labels of close lines.

    plotly widens an autoranged axis until a label referenced to it fits: on a narrow figure (a phone)
    a long label near the axis's end stretches the axis far past the data (issue 31: chapter 10's
    roofline ran to 1e14 at 390 px). A figure with such labels fixes its axis range to its data.

    Raises:
        ValueError: ``x`` not finite, or not > 0 on a log axis; ``side`` not "right" or "left".
    """
    import math

    value = float(x)
    if not math.isfinite(value) or (log_x and value <= 0):
        raise ValueError(f"x must be finite{' and > 0 on a log axis' if log_x else ''}; got {x!r}")
    if side not in ("right", "left"):
        raise ValueError(f"side must be 'right' or 'left'; got {side!r}")
    if not (isinstance(y, (int, float)) and 0 <= y <= 1):
        raise ValueError(f"y must be a fraction of the plot's height in [0, 1]; got {y!r}")
    fig.add_vline(x=value, line=line or {})
    fig.add_annotation(x=math.log10(value) if log_x else value, xref="x", y=float(y), yref="y domain", text=text,
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
        spec = {"data": _colorbar_titles_along_the_bar(fig_dict.get("data", [])), "layout": fig_dict.get("layout", {}),
                "frames": fig_dict.get("frames", [])}
        as_json = pio.to_json(spec, validate=False)
        # The JSON mimetype gets plain JSON (lists, not NumPy arrays): plotly 5 keeps arrays in a figure's
        # dict, and ipykernel before 6.29 refuses them ("Can't clean for JSON", chapters 07 and 11 on a
        # Colab-like stack with plotly 5.24; issue 31 item 8's reader trial).
        plain = json.loads(as_json)
        payload = as_json.replace("</", "<\\/")  # no early </script>
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
      }}).then(function () {{ {_CONTROLS_JS}(el); window._selfattnFit = window._selfattnFit || {_FIT_JS};
        return window._selfattnFit(el); }});
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
            "application/vnd.plotly.v1+json": {**plain, "config": _PLOTLY_CONFIG},
            "text/html": markup,
        }


def _colorbar_titles_along_the_bar(data: list) -> list:
    """The traces, each colour bar's title set along the bar (``side="right"``) unless the figure
    chose a side: above the bar (plotly's default) it is drawn over the bar's top tick label
    (issue 31: "weight" over "1" on every attention heatmap). Only the colour bar's layout changes."""
    out = []
    for trace in data:
        bar = trace.get("colorbar") if isinstance(trace, dict) else None
        title = bar.get("title") if isinstance(bar, dict) else None
        if title is not None:
            title = {"text": title} if isinstance(title, str) else dict(title)
            if title.get("text") and "side" not in title:
                trace = {**trace, "colorbar": {**bar, "title": {**title, "side": "right"}}}
        out.append(trace)
    return out


# After a figure is drawn (and after each redraw: a view or a step can bring a longer title), the
# renderer fits it to the width it got, most of all on a phone (issue 31: titles, legends and menus
# cut at 390 px, labels drawn over each other). It measures the texts plotly drew, as the book's test
# does (tests/book/browser_support.py, FIGURE_TEXT_JS), and changes only the layout: a title or axis
# title wider than the figure is wrapped at spaces (the top margin grows by its extra lines), a row
# of buttons wider than the figure becomes a dropdown, a legend cut off or drawn over other text goes
# below the plot (the figure grows by its rows), crowded tick labels of one axis get room (category
# labels upright, then a smaller font, then every other tick; log axes: fewer digits between powers
# of ten), an annotation drawn over another moves below it (side-by-side subplot titles wrap), a
# slider drawn over the axis title moves down. At most seven rounds of changes, then it stops.
_FIT_JS = """(function (el) {
  // Fit a drawn figure to the width it got (issue 31): wrap a title or an axis title wider than the
  // figure, turn a row of buttons wider than the figure into a dropdown, move a legend that is cut
  // or drawn over other text below the plot, give crowded tick labels room (upright, smaller, fewer
  // log digits), move an annotation off another text, slider labels off the axis title. Runs after
  // each redraw (a view or a step can bring a new title), until nothing is left to do (6 rounds at most).
  var P = window.Plotly;
  if (!P || !el || !el._fullLayout) return Promise.resolve();
  var TOL = 1;
  var words = function (e) { return (e.textContent || "").trim().replace(/\\s+/g, " "); };
  function kindOf(t) {
    var c = t.getAttribute("class") || "", g = (t.parentNode && t.parentNode.getAttribute && t.parentNode.getAttribute("class")) || "";
    if (t.closest(".colorbar")) return t.closest(".cbtitle") ? "cbtitle" : "cbtick";
    if (c === "gtitle") return "title";
    if (c === "legendtext" || c === "legendtitletext") return "legend";
    if (c === "annotation-text") return "annotation";
    var m = /^([xy][0-9]*)title$/.exec(c);
    if (m) return "axistitle:" + m[1];
    m = /(?:^| )([xy][0-9]*)tick(?: |$)/.exec(g);
    if (m) return "tick:" + m[1];
    if (c.indexOf("slider") === 0) return "slider";
    if (c.indexOf("updatemenu") === 0) return "menu";
    return null;
  }
  function corners(t) {
    var b = t.getBBox(), m = t.getScreenCTM();
    return [[b.x, b.y], [b.x + b.width, b.y], [b.x + b.width, b.y + b.height], [b.x, b.y + b.height]]
      .map(function (p) { return [m.a * p[0] + m.c * p[1] + m.e, m.b * p[0] + m.d * p[1] + m.f]; });
  }
  function normals(q) {
    return [0, 1].map(function (i) { var dx = q[i + 1][0] - q[i][0], dy = q[i + 1][1] - q[i][1], n = Math.hypot(dx, dy) || 1; return [-dy / n, dx / n]; });
  }
  function depth(p, q) {
    return Math.min.apply(null, normals(p).concat(normals(q)).map(function (n) {
      var a = p.map(function (c) { return c[0] * n[0] + c[1] * n[1]; }), b = q.map(function (c) { return c[0] * n[0] + c[1] * n[1]; });
      return Math.min(Math.max.apply(null, a), Math.max.apply(null, b)) - Math.max(Math.min.apply(null, a), Math.min.apply(null, b));
    }));
  }
  function bounds(q) {
    var xs = q.map(function (c) { return c[0]; }), ys = q.map(function (c) { return c[1]; });
    return {left: Math.min.apply(null, xs), right: Math.max.apply(null, xs), top: Math.min.apply(null, ys), bottom: Math.max.apply(null, ys)};
  }
  function outside(r, box) { return Math.max(box.left - r.left, r.right - box.right, box.top - r.top, r.bottom - box.bottom); }
  function texts() {
    var out = [];
    el.querySelectorAll("text").forEach(function (e) {
      var kind = kindOf(e);
      if (!kind || !words(e) || !e.getBoundingClientRect().width) return;
      var q = corners(e);
      out.push({kind: kind, el: e, q: q, r: bounds(q)});
    });
    return out;
  }
  // Break `text` (plotly's <br> kept) into lines of at most `chars` characters, at spaces.
  function wrap(text, chars) {
    return String(text).split(/<br\\s*\\/?>/i).map(function (line) {
      var out = [], cur = "";
      line.split(" ").forEach(function (w) {
        if (cur && (cur + " " + w).length > chars) { out.push(cur); cur = w; } else { cur = cur ? cur + " " + w : w; }
      });
      out.push(cur);
      return out.join("<br>");
    }).join("<br>");
  }
  function lines(text) { return String(text || "").split(/<br\\s*\\/?>/i); }
  function longest(text) { return Math.max.apply(null, lines(text).map(function (l) { return l.replace(/<[^>]+>/g, "").length; })); }
  function titleText(t) { return t && (typeof t === "string" ? t : t.text); }
  function axisName(id) { return id.charAt(0) + "axis" + id.slice(1); }

  function round(n) {
    if (n > 6) return Promise.resolve();
    var L = el._fullLayout, lay = el.layout, W = L.width, H = L.height, upd = {}, restyles = [], menus = null;
    var paper = el.querySelector(".svg-container");
    if (!paper) return Promise.resolve();
    var box = paper.getBoundingClientRect(), all = texts();
    var room = W - 16;
    // Colour-bar titles along the bar, not over its top tick.
    (el.data || []).forEach(function (tr, i) {
      var cb = tr.colorbar, t = cb && cb.title;
      if (t && titleText(t) && !(typeof t === "object" && t.side)) {
        restyles.push([{"colorbar.title.side": "right"}, [i]]);
      }
    });
    // The title: wrapped to the figure's width, pinned to the top, the top margin grown by its extra lines.
    var gt = all.filter(function (x) { return x.kind === "title"; })[0];
    var title = titleText(lay.title);
    if (gt && title) {
      var w = gt.r.right - gt.r.left, size = (L.title.font && L.title.font.size) || 17;
      var space = box.right - 6 - Math.max(gt.r.left, box.left + 6);
      var under = all.filter(function (x) { return x !== gt && depth(gt.q, x.q) > TOL; })
        .map(function (x) { return gt.r.bottom - x.r.top; });
      if (w > space) {
        var chars = Math.max(12, Math.floor(longest(title) * Math.min(1, 0.95 * space / w)));
        var wrapped = wrap(title, chars);
        upd["title.text"] = wrapped;
        upd["margin.t"] = L.margin.t + (lines(wrapped).length - lines(title).length) * size * 1.3;
      } else if (under.length) {
        upd["margin.t"] = L.margin.t + Math.max.apply(null, under) + 4;
      } else if (gt.r.top < box.top - TOL) {
        var y = typeof L.title.y === "number" ? L.title.y : 1 - L.margin.t / 2 / H;
        upd["title.y"] = y - (box.top - gt.r.top + 4) / H;
        upd["margin.t"] = L.margin.t + (box.top - gt.r.top + 4);
      }
    }
    // Button rows wider than the figure become dropdowns.
    // A dropdown whose label is wider than the figure: its labels shortened with an ellipsis (the
    // keyboard twin under the figure keeps them whole).
    var cutMenu = all.filter(function (x) { return x.kind === "menu" && outside(x.r, box) > TOL; })[0];
    if (cutMenu && !(lay.updatemenus || []).some(function (m) { return m.type === "buttons"; })) {
      var mw = cutMenu.r.right - cutMenu.r.left, mspace = box.right - 40 - Math.max(cutMenu.r.left, box.left);
      var keep = Math.max(8, Math.floor(words(cutMenu.el).length * mspace / mw) - 1);
      menus = lay.updatemenus.map(function (m) {
        return Object.assign({}, m, {buttons: (m.buttons || []).map(function (b) {
          var t = String(b.label || "");
          return t.length > keep ? Object.assign({}, b, {label: t.slice(0, keep - 1) + "…"}) : b; })}); });
    }
    if (all.some(function (x) { return x.kind === "menu" && outside(x.r, box) > TOL; })
        && (lay.updatemenus || []).some(function (m) { return m.type === "buttons"; })) {
      // the whole list at once: plotly leaves a menu's old buttons drawn if only its type changes
      menus = lay.updatemenus.map(function (m) {
        return m.type === "buttons" ? Object.assign({}, m, {type: "dropdown", direction: "down"}) : m; });
    }
    // Tick labels of one axis over each other, axis titles wider than the figure or over each other,
    // annotations over other text, the legend cut or over other text, slider labels over text.
    var moveLegend = false, done = {};
    all.forEach(function (x) {
      if ((x.kind === "legend") && outside(x.r, box) > TOL) {
        var lgd = lay.legend || {}, tr = x.el.closest(".traces"), datum = tr && tr.__data__ && tr.__data__[0] && tr.__data__[0].trace;
        if (lgd.orientation === "h" && lgd.yref === "container" && datum && typeof datum.index === "number" && longest(datum.name) > 12) {
          restyles.push([{name: wrap(datum.name, Math.ceil(longest(datum.name) / 2))}, [datum.index]]);
        } else moveLegend = true;
      }
      if (x.kind.indexOf("axistitle:") === 0 && outside(x.r, box) > TOL) {
        var ax = axisName(x.kind.slice(10)), t = titleText((lay[ax] || {}).title) || "";
        if (t && !done[ax + ".title.text"]) { upd[ax + ".title.text"] = wrap(t, Math.max(8, Math.ceil(longest(t) / 2))); done[ax + ".title.text"] = 1; }
      }
      if (x.kind === "annotation" && outside(x.r, box) > TOL) {
        var g = x.el.closest(".annotation"), k = g && +g.getAttribute("data-index"), a = (lay.annotations || [])[k];
        if (a) {
          var cut = outside(x.r, box), key = "annotations[" + k + "]";
          if (longest(a.text) > 12 && lines(a.text).length < 3) upd[key + ".text"] = wrap(a.text, Math.ceil(longest(a.text) / 2));
          else if (x.r.right > box.right) upd[key + ".xshift"] = (a.xshift || 0) - cut;
          else if (x.r.left < box.left) upd[key + ".xshift"] = (a.xshift || 0) + cut;
        }
      }
    });
    for (var i = 0; i < all.length; i++) for (var j = i + 1; j < all.length; j++) {
      var x = all[i], y = all[j];
      if (x.r.right < y.r.left || y.r.right < x.r.left || x.r.bottom < y.r.top || y.r.bottom < x.r.top) continue;
      var d = depth(x.q, y.q);
      if (d <= TOL) continue;
      var pair = [x, y];
      var ticks = pair.filter(function (p) { return p.kind.indexOf("tick:") === 0; });
      if (ticks.length === 2 && x.kind === y.kind) {
        var id = x.kind.slice(5), ax = axisName(id), full = L[ax] || {}, key = ax;
        if (done[key]) continue;
        done[key] = 1;
        if (full.type === "log" && !(lay[ax] || {}).dtick && !(lay[ax] || {}).tickvals) upd[key + ".dtick"] = (full.dtick === "D2") ? 1 : "D2";
        else if (id.charAt(0) === "x" && Math.abs((lay[ax] || {}).tickangle || 0) !== 90 && (full.type === "category" || full.type === "multicategory")) upd[key + ".tickangle"] = -90;
        else if (((lay[ax] || {}).tickfont || {}).size === undefined || (lay[ax].tickfont.size > 9)) upd[key + ".tickfont.size"] = Math.max(9, ((full.tickfont || {}).size || 12) - 2);
        else if (typeof (lay[ax] || {}).dtick === "number") upd[key + ".dtick"] = lay[ax].dtick * 2;
        else upd[key + ".nticks"] = Math.max(2, Math.floor(all.filter(function (p) { return p.kind === x.kind; }).length / 2));
        continue;
      }
      if (ticks.length === 2) {  // an x and a y tick label at a subplot's corner: the y labels step away from the axis
        var yt = ticks.filter(function (p) { return p.kind.charAt(5) === "y"; })[0];
        if (yt) {
          var yax = axisName(yt.kind.slice(5));
          var xax = axisName(ticks.filter(function (p) { return p !== yt; })[0].kind.slice(5));
          if (!done[xax + ".ticklen"]) {  // the x labels step down: invisible outside ticks as long as the overlap
            done[xax + ".ticklen"] = 1;
            var fx = L[xax] || {};
            if (fx.ticks !== "outside") { upd[xax + ".ticks"] = "outside"; upd[xax + ".tickcolor"] = "rgba(0,0,0,0)"; upd[xax + ".ticklen"] = d + 2; }
            else upd[xax + ".ticklen"] = (fx.ticklen || 5) + d + 2;
          }
        }
        continue;
      }
      var axtick = pair.filter(function (p) { return p.kind.indexOf("axistitle:") === 0; });
      if (ticks.length === 1 && axtick.length === 1) {  // an axis title on tick labels: it steps away from its axis
        var tax = axisName(axtick[0].kind.slice(10)), tkey = tax + ".title.standoff";
        if (!done[tkey]) { done[tkey] = 1; upd[tkey] = (((L[tax] || {}).title || {}).standoff || 15) + d + 2; upd[tax + ".automargin"] = true; }
        continue;
      }
      var legend = pair.filter(function (p) { return p.kind === "legend"; });
      if (legend.length) { moveLegend = true; continue; }
      var anns = pair.filter(function (p) { return p.kind === "annotation"; });
      var axt = pair.filter(function (p) { return p.kind.indexOf("axistitle:") === 0; });
      if (axt.length === 2) {
        axt.forEach(function (p) {
          var ax = axisName(p.kind.slice(10)), t = titleText((lay[ax] || {}).title) || "";
          if (t && !done[ax + ".title.text"] && lines(t).length < 3) { upd[ax + ".title.text"] = wrap(t, Math.max(6, Math.ceil(longest(t) / 2))); done[ax + ".title.text"] = 1; }
        });
        continue;
      }
      if (anns.length) {
        // Subplot titles (paper annotations): each wrapped, else smaller, else moved away from the other
        // text; other annotations (labels in a plot) move below the text they cover.
        anns.forEach(function (p) {
          var other = p === x ? y : x;
          var g = p.el.closest(".annotation"), k = g && +g.getAttribute("data-index"), a = (lay.annotations || [])[k];
          var key = "annotations[" + k + "]";
          if (!a || done[key] || (anns.length === 2 && p === x && a.yref !== "paper")) return;
          done[key] = 1;
          var size = (a.font || {}).size || ((L.annotations[k] || {}).font || {}).size || 12;
          if (a.yref === "paper" && longest(a.text) > 12 && lines(a.text).length < 2) upd[key + ".text"] = wrap(a.text, Math.ceil(longest(a.text) / 2));
          else if (a.yref === "paper" && size > 10) upd[key + ".font.size"] = Math.max(10, size - 2);
          else if (a.yref === "paper") {
            var up = (p.r.top + p.r.bottom) < (other.r.top + other.r.bottom);
            var shared = Math.min(p.r.bottom, other.r.bottom) - Math.max(p.r.top, other.r.top);
            upd[key + ".yshift"] = (a.yshift || 0) + (up ? 1 : -1) * (shared + 2);
          } else {
            upd[key + ".yshift"] = (a.yshift || 0) - (Math.min(other.r.bottom - p.r.top, p.r.bottom - p.r.top) + 2);
          }
        });
        continue;
      }
      var sl = pair.filter(function (p) { return p.kind === "slider"; });
      if (sl.length && !done.slider) {
        done.slider = 1;
        (lay.sliders || []).forEach(function (s, k) { upd["sliders[" + k + "].pad.t"] = ((s.pad || {}).t || 20) + d + 4; });
        continue;
      }
      if (pair.some(function (p) { return p.kind === "title"; })) continue;  // handled with the title above
    }
    // The legend's box past the figure: the longest entry goes on two lines.
    var lbg = el.querySelector(".legend > rect.bg");
    if (lbg && outside(lbg.getBoundingClientRect(), box) > TOL && (lay.legend || {}).yref !== "container") moveLegend = true;
    else if (lbg && outside(lbg.getBoundingClientRect(), box) > TOL) {
      var widest = all.filter(function (x) { return x.kind === "legend"; }).sort(function (a, b) { return b.r.right - a.r.right; })[0];
      var wt = widest && widest.el.closest(".traces"), wd = wt && wt.__data__ && wt.__data__[0] && wt.__data__[0].trace;
      if (wd && typeof wd.index === "number" && longest(wd.name) > 12 && lines(wd.name).length < 3)
        restyles.push([{name: wrap(wd.name, Math.ceil(longest(wd.name) / 2))}, [wd.index]]);
    }
    if (moveLegend && !done.legend) {
      var lg = lay.legend || {};
      var entries = all.filter(function (x) { return x.kind === "legend"; }).length;
      if (!(lg.orientation === "h" && lg.yref === "container")) {
        upd["legend.orientation"] = "h"; upd["legend.x"] = 0; upd["legend.xanchor"] = "left";
        upd["legend.yref"] = "container"; upd["legend.y"] = 0; upd["legend.yanchor"] = "bottom";
        upd.height = H + 22 * entries + 20;  // room for one entry a row, the plot keeps its height
        upd["margin.b"] = L.margin.b + 22 * entries + 20;
      } else {  // already below the plot and still over a text: more room under the plot
        upd.height = H + 24; upd["margin.b"] = L.margin.b + 24;
      }
    }
    if (!Object.keys(upd).length && !restyles.length && !menus) return Promise.resolve();
    el._selfattnFitting = true;
    // Menus: removed, then drawn again as dropdowns (plotly leaves a menu's buttons drawn if only its type changes).
    var go = menus ? P.relayout(el, {updatemenus: []}).then(function () { return P.relayout(el, {updatemenus: menus}); }) : Promise.resolve();
    go = restyles.reduce(function (done, r) { return done.then(function () { return P.restyle(el, r[0], r[1]); }); }, go);
    return go.then(function () { return Object.keys(upd).length ? P.relayout(el, upd) : null; })
      .then(function () { return round(n + 1); }, function () { return null; });
  }
  if (el._selfattnFitting) return Promise.resolve();
  return round(0).then(function () {
    el._selfattnFitting = false;
    if (!el._selfattnFitHooked && el.on) {
      el._selfattnFitHooked = true;
      var again = null;
      el.on("plotly_afterplot", function () {
        if (el._selfattnFitting) return;
        clearTimeout(again);
        again = setTimeout(function () { window._selfattnFit && window._selfattnFit(el); }, 50);
      });
    }
  });
})"""

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
