"""Fixtures and helpers for the tests that open the built book in a real browser (issue 6).

- ``site_url``: the built ``_build/html`` served by Python's ``http.server`` on a free localhost
  port, in a thread, for the whole session.
- ``browser``: Debian's ``chromium`` (``/usr/bin/chromium``; ``make test`` installs it when it is
  missing and the user is root), driven headless by Playwright. Playwright's own browser download
  is not used. Without a browser the tests are skipped with the reason, except in CI (``CI=true``),
  where a missing browser is a failure.
- ``toc_pages()``: every page of ``_toc.yml`` in reading order, so the tests cover whatever
  chapters the book holds.
"""

from __future__ import annotations

import functools
import http.server
import os
import re
import shutil
import threading
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "test-artifacts"

# Headless on a machine with no network: no GPU, no background traffic (without the last four flags
# Chromium keeps opening connections to Google services, which fail on a closed network).
# The WCAG 2.x contrast helpers of the legibility tests, as JavaScript statements to open a function with:
# rgba(css colour) -> [r, g, b, a]; lum([r, g, b]) -> relative luminance; background(element) -> the colour
# of the first ancestor (itself included) with an opaque-enough background, else white.
CONTRAST_HELPERS_JS = """  const rgba = (s) => { const m = s.match(/[\\d.]+/g) || [0, 0, 0, 0]; return m.map(Number).concat([1]).slice(0, 4); };
  const lum = (c) => { const f = (v) => { v /= 255; return v <= 0.03928 ? v / 12.92 : Math.pow((v + 0.055) / 1.055, 2.4); };
    return 0.2126 * f(c[0]) + 0.7152 * f(c[1]) + 0.0722 * f(c[2]); };
  const background = (el) => { for (let n = el; n; n = n.parentElement) { const c = rgba(getComputedStyle(n).backgroundColor);
    if (c[3] > 0.5) return c; } return [255, 255, 255, 1]; };
  // The colour a reader sees at one of el's text pixels (text: true) and beside it (text: false): the
  // text's colour over el's background, over each ancestor's, every layer taken with its alpha and
  // every element's opacity applied to all it holds, its own background included (a disabled button
  // at opacity 0.6 fades its face and its label alike onto the page), over a white canvas.
  const drawn = (el, text) => {
    let c = [0, 0, 0], a = 0;
    if (text) { const t = rgba(getComputedStyle(el).color); c = t.slice(0, 3).map((v) => v * t[3]); a = t[3]; }
    for (let n = el; n; n = n.parentElement) {
      const s = getComputedStyle(n), b = rgba(s.backgroundColor), o = parseFloat(s.opacity);
      c = c.map((v, i) => v + (1 - a) * b[i] * b[3]); a += (1 - a) * b[3];
      c = c.map((v) => v * o); a *= o;
    }
    return c.map((v) => v + (1 - a) * 255);
  };
"""

CHROMIUM_ARGS = [
    "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]


def toc_pages() -> list[str]:
    """Every page of the table of contents in reading order, as paths without suffix."""
    # SELFATTN_TOC: the toc a build under test was made from (with SELFATTN_BOOK_BUILD), if not this one.
    toc = yaml.safe_load(Path(os.environ.get("SELFATTN_TOC", ROOT / "_toc.yml")).read_text())
    pages = [toc["root"]]
    for part in toc.get("parts", []):
        for chapter in part.get("chapters", []):
            pages.append(chapter["file"])
            pages.extend(section["file"] for section in chapter.get("sections", []))
    return pages


def chapter_pages() -> list[str]:
    return [p for p in toc_pages() if p.startswith("notebooks/")]


def page_id(page: str) -> str:
    return re.sub(r"[^A-Za-z0-9_]+", "-", page)


def chromium_path() -> str | None:
    """``SELFATTN_CHROMIUM`` if set, else Debian's chromium on the PATH."""
    chosen = os.environ.get("SELFATTN_CHROMIUM")
    if chosen:
        return chosen if Path(chosen).is_file() else None
    return shutil.which("chromium") or shutil.which("chromium-browser")


def _no_browser(reason: str):
    if os.environ.get("CI", "").lower() in ("true", "1"):
        pytest.fail(f"{reason} (CI=true: the browser tests must run in CI)")
    pytest.skip(f"{reason}; `make test` installs it as root (apt-get install -y chromium)")


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format, *args):  # noqa: A002 - the base class's name
        pass


@pytest.fixture(scope="session")
def site_url(built_html):
    """Base URL (no trailing slash) of the built site served on 127.0.0.1."""
    handler = functools.partial(_QuietHandler, directory=str(built_html))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, name="book-http", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


@pytest.fixture(scope="session")
def browser():
    """A headless Chromium (Debian's) for the whole session."""
    path = chromium_path()
    if path is None:
        _no_browser("chromium is not installed")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _no_browser("the Python package playwright is not installed")
    with sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=path, args=CHROMIUM_ARGS, headless=True)
        try:
            yield chromium
        finally:
            chromium.close()


@pytest.fixture(scope="session")
def artifacts() -> Path:
    """``test-artifacts/`` (gitignored): screenshots and the page-weight table."""
    ARTIFACTS.mkdir(exist_ok=True)
    return ARTIFACTS


# --- Loading a page and recording what happened ---------------------------------------------------

SETTLE_JS = """async () => {
  const deadline = Date.now() + 20000;
  const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
  const figuresDrawn = () => [...document.querySelectorAll('.plotly-graph-div')]
    .every((d) => d.querySelector('svg.main-svg') || d.textContent.includes('did not load'));
  const viewScripts = () => [...document.querySelectorAll('script[type="application/vnd.jupyter.widget-view+json"]')];
  const widgetsDrawn = () => viewScripts().every((s) => s.parentElement.querySelector('.jupyter-widgets'));
  while (Date.now() < deadline && !(figuresDrawn() && widgetsDrawn())) await sleep(100);
  if (window.MathJax && window.MathJax.startup && window.MathJax.startup.promise) {
    await Promise.race([window.MathJax.startup.promise, sleep(15000)]);
  }
  await sleep(300);
  const divs = [...document.querySelectorAll('.plotly-graph-div')];
  return {
    figures: divs.length,
    figures_drawn: divs.filter((d) => d.querySelector('svg.main-svg')).length,
    math_source: document.querySelectorAll('.math').length,
    math_drawn: document.querySelectorAll('mjx-container').length,
    math_errors: document.querySelectorAll('mjx-merror').length,
    widget_views: viewScripts().length,
    widget_views_drawn: viewScripts().filter((s) => s.parentElement.querySelector('.jupyter-widgets')).length,
  };
}"""


# The texts of every plotly figure drawn on the page (issue 31, item 6): for each visible figure, its
# title (layout's, else the text description) and the problems found:
# - "cut": a text (title, axis or colour-bar title, tick label, annotation, legend entry, slider or
#   menu label) or the legend's box that is not wholly inside the figure's drawing area (the SVG, which
#   clips what lies outside it), by more than FIGURE_TEXT_TOLERANCE px;
# - "overlap": two texts of the figure drawn over each other: their boxes, each the text's own box
#   turned with it (tick labels at an angle), overlap by more than FIGURE_TEXT_TOLERANCE px across
#   both axes of separation (separating-axis test on the two rectangles).
# A legend entry scrolled out of its legend's box is not drawn and not counted.
FIGURE_TEXT_TOLERANCE = 1  # px
FIGURE_TEXT_JS = """() => {
  const TOL = __TOL__;
  const words = (e) => (e.textContent || '').trim().replace(/\\s+/g, ' ');
  const kindOf = (t) => {
    const c = t.getAttribute('class') || '', g = (t.parentElement && t.parentElement.getAttribute('class')) || '';
    if (t.closest('.colorbar')) return t.closest('.cbtitle') ? 'colour-bar title' : 'colour-bar tick';
    if (c === 'gtitle') return 'title';
    if (c === 'legendtext') return 'legend entry';
    if (c === 'legendtitletext') return 'legend title';
    if (c === 'annotation-text') return 'annotation';
    if (/^[xy][0-9]*title$/.test(c)) return 'axis title';
    if (/(^| )[xy][0-9]*tick( |$)/.test(g)) return 'tick label';
    if (c.startsWith('slider')) return 'slider label';
    if (c.startsWith('updatemenu')) return 'menu label';
    return null;
  };
  const corners = (t) => { const b = t.getBBox(), m = t.getScreenCTM();
    return [[b.x, b.y], [b.x + b.width, b.y], [b.x + b.width, b.y + b.height], [b.x, b.y + b.height]]
      .map(([x, y]) => [m.a * x + m.c * y + m.e, m.b * x + m.d * y + m.f]); };
  const normals = (q) => [0, 1].map((i) => { const dx = q[i + 1][0] - q[i][0], dy = q[i + 1][1] - q[i][1], n = Math.hypot(dx, dy) || 1;
    return [-dy / n, dx / n]; });
  // Depth of overlap of two rectangles (corner lists): the smallest overlap of their projections on
  // the four edge normals; <= 0 if they are apart.
  const depth = (p, q) => Math.min(...normals(p).concat(normals(q)).map(([nx, ny]) => {
    const a = p.map(([x, y]) => x * nx + y * ny), b = q.map(([x, y]) => x * nx + y * ny);
    return Math.min(Math.max(...a), Math.max(...b)) - Math.max(Math.min(...a), Math.min(...b)); }));
  const bounds = (q) => { const xs = q.map((c) => c[0]), ys = q.map((c) => c[1]);
    return {left: Math.min(...xs), right: Math.max(...xs), top: Math.min(...ys), bottom: Math.max(...ys)}; };
  const outside = (r, box) => Math.max(box.left - r.left, r.right - box.right, box.top - r.top, r.bottom - box.bottom);
  const out = [];
  document.querySelectorAll('.plotly-graph-div').forEach((d, index) => {
    const paper = d.querySelector('.svg-container');
    if (!paper || !d.getClientRects().length) return;  // not drawn, or in a folded box
    const box = paper.getBoundingClientRect();
    const t = d.layout && d.layout.title, fig = d.closest('.selfattn-figure');
    const title = words({textContent: (t && (t.text !== undefined ? t.text : t)) || ''}).replace(/<[^>]+>/g, ' ').trim()
      || (fig ? (fig.getAttribute('aria-label') || '') : '').slice(0, 80);
    const legendBox = [...d.querySelectorAll('.legend > rect.bg')].map((r) => r.getBoundingClientRect());
    const texts = [];
    d.querySelectorAll('text').forEach((e) => {
      const kind = kindOf(e), text = words(e);
      if (!kind || !text || !e.getBoundingClientRect().width) return;
      if (getComputedStyle(e).visibility === 'hidden' || e.closest('[display="none"], [style*="display: none"]')) return;
      const q = corners(e), r = bounds(q);
      if (kind.startsWith('legend') && legendBox.length && legendBox.every((l) => outside({left: (r.left + r.right) / 2,
          right: (r.left + r.right) / 2, top: (r.top + r.bottom) / 2, bottom: (r.top + r.bottom) / 2}, l) > 0)) return;  // scrolled away
      texts.push({kind, text: text.slice(0, 60), q, r});
    });
    const problems = [];
    for (const x of texts) {
      const by = outside(x.r, box);
      if (by > TOL) problems.push({what: 'cut', texts: [`${x.kind} "${x.text}"`], px: Math.round(by)});
    }
    legendBox.forEach((l) => { const by = outside(l, box);
      if (by > TOL) problems.push({what: 'cut', texts: ['legend box'], px: Math.round(by)}); });
    for (let a = 0; a < texts.length; a++) for (let b = a + 1; b < texts.length; b++) {
      const x = texts[a], y = texts[b];
      if (x.r.right < y.r.left || y.r.right < x.r.left || x.r.bottom < y.r.top || y.r.bottom < x.r.top) continue;
      const by = depth(x.q, y.q);
      if (by > TOL) problems.push({what: 'overlap', texts: [`${x.kind} "${x.text}"`, `${y.kind} "${y.text}"`], px: Math.round(by)});
    }
    out.push({index, title, width: Math.round(box.width), height: Math.round(box.height), texts: texts.length, problems});
  });
  return out;
}""".replace("__TOL__", str(FIGURE_TEXT_TOLERANCE))


AXIS_STRETCH = 0.5  # of the data's span: plotly pads an autorange by ~5% plus its markers' size
# What a reader sees of a page's layout (test_reader.py's tests read it): the page's and the text
# column's width, every figure, display equation, table, inline code and printed output box, and the
# texts of every figure (FIGURE_TEXT_JS, under "figure_texts").
MEASURE_JS = """() => {
  const article = document.querySelector('article.bd-article') || document.querySelector('main');
  const style = getComputedStyle(article);
  const box = article.getBoundingClientRect();
  const left = box.left + parseFloat(style.paddingLeft), right = box.right - parseFloat(style.paddingRight);
  const name = (e) => (e.textContent || '').trim().replace(/\\s+/g, ' ').slice(0, 70);
  const overlap = (a, b) => a && b && a.width && b.width && a.left < b.right && b.left < a.right && a.top < b.bottom && b.top < a.bottom;
  // Axes drawn far past their data (issue 31: chapter 10's roofline ran to 1e14 at 390 px, plotly
  // widening the autoranged axis until a label referenced to it fit): for each autoranged numeric axis
  // whose traces are all scatter lines or markers, the drawn range (log10 units on a log axis) against
  // the extent of those traces' values on it (0 included for a fill to zero); listed when the range
  // passes the data by more than STRETCH of the data's span on either side.
  const STRETCH = __STRETCH__;
  const stretched = (d) => {
    const full = d._fullLayout, data = d._fullData || [], out = [];
    if (!full) return out;
    Object.keys(full).filter((k) => /^[xy]axis[0-9]*$/.test(k)).forEach((key) => {
      const ax = full[key];
      if (!ax || !ax.autorange || !['linear', 'log'].includes(ax.type) || !Array.isArray(ax.range)) return;
      const letter = key[0], id = ax._id;
      const on = data.filter((t) => t.visible !== false && (t[letter + 'axis'] || letter) === id);
      if (!on.length || on.some((t) => t.type !== 'scatter')) return;
      let values = [];
      on.forEach((t) => { values = values.concat([...(t[letter] || [])].map(Number));
        if (letter === 'y' && /tozero/.test(t.fill || '')) values.push(0); });
      values = values.filter((v) => Number.isFinite(v) && (ax.type !== 'log' || v > 0)).map((v) => ax.type === 'log' ? Math.log10(v) : v);
      if (values.length < 2) return;
      const lo = Math.min(...values), hi = Math.max(...values), span = hi - lo;
      if (!(span > 0)) return;
      const past = Math.max(lo - ax.range[0], ax.range[1] - hi) / span;
      if (past > STRETCH) out.push({axis: key, type: ax.type, range: ax.range.map((v) => +(+v).toPrecision(3)),
                                    data: [+lo.toPrecision(3), +hi.toPrecision(3)], past: +past.toFixed(2)});
    });
    return out;
  };
  const figures = [...document.querySelectorAll('.plotly-graph-div')].map((d, i) => {
    const svg = d.querySelector('svg.main-svg');
    const r = (svg || d).getBoundingClientRect();
    const legend = d.querySelector('.legend');
    const legendBox = legend ? legend.getBoundingClientRect() : null;
    const controls = [...d.querySelectorAll('.slider-container, .updatemenu-container')].map((c) => c.getBoundingClientRect());
    return {index: i, left: r.left, right: r.right, width: r.width,
            control_over_legend: controls.some((c) => overlap(c, legendBox)), stretched: stretched(d)};
  });
  const equations = [...document.querySelectorAll('mjx-container[display="true"]')]
    .map((m) => ({scroll: m.scrollWidth, client: m.clientWidth, right: m.getBoundingClientRect().right, text: name(m.parentElement)}));
  const tables = [...article.querySelectorAll('table')].map((t) => ({scroll: t.scrollWidth, client: t.clientWidth,
    right: t.getBoundingClientRect().right, head: [...t.querySelectorAll('th')].map(name)}));
  const code = [...article.querySelectorAll('code.literal')].filter((c) => !c.closest('pre, table, .plotly-graph-div'))
    .map((c) => { const holder = c.closest('.admonition, .cell_output, li, p') || article;
                  const hr = holder.getBoundingClientRect(), cr = c.getBoundingClientRect();
                  return {right: cr.right, limit: Math.min(hr.right, right), text: name(c)}; })
    .filter((c) => c.right > c.limit + 1);
  // Printed output (a printed line, or a code block in a Markdown output, which myst-nb renders
  // outside div.output): a box whose text is wider than the box (it would scroll sideways) or that ends
  // past the column; the text of its first line that does not fit, measured in the box's own font.
  const canvas = document.createElement('canvas').getContext('2d');
  const outputs = [...article.querySelectorAll('div.cell_output pre')]
    .filter((p) => p.scrollWidth > p.clientWidth + 1 || p.getBoundingClientRect().right > right + 1)
    .map((p) => { const cs = getComputedStyle(p); canvas.font = `${cs.fontSize} ${cs.fontFamily}`;
                  const room = p.clientWidth - parseFloat(cs.paddingLeft) - parseFloat(cs.paddingRight);
                  const lines = p.textContent.split('\\n');
                  const wide = lines.find((l) => canvas.measureText(l).width > room + 1) || lines[0];
                  return {scroll: p.scrollWidth, client: p.clientWidth, line: wide.slice(0, 70)}; });
  // Anything else of a cell's output past the column (issue 31: the static rows of the live explorers'
  // widgets, tqdm's progress bars, a figure inside an explorer's snapshot at 390 px), drawn or cut off
  // by a box that clips it: each outermost element whose box ends past the column's right edge (or
  // starts left of it), with its classes and text. Not in a figure's SVG, a table (the theme's own
  // table scroll) or a display equation (its box scrolls on a phone, by design).
  const past = (e) => { const b = e.getBoundingClientRect();
    return b.width > 0 && b.height > 0 && (b.right > right + 1 || b.left < left - 1); };
  const spill = [...article.querySelectorAll('div.cell_output *')]
    .filter((e) => !e.closest('svg, table, mjx-container, script, style, .selfattn-figure-text') && past(e)
            && !(e.parentElement && e.parentElement.closest('div.cell_output') && past(e.parentElement)))
    .map((e) => ({cls: (e.getAttribute('class') || e.tagName.toLowerCase()).slice(0, 60),
                  right: Math.round(e.getBoundingClientRect().right), width: Math.round(e.getBoundingClientRect().width),
                  text: name(e).slice(0, 50)}));
  // ... and a widget's text cut at its own box's edge (tqdm's statistics at 390 px): an element of a
  // widget whose content is wider than its box, which clips it (not a text box or a menu: they scroll
  // or show the start of their value by design).
  article.querySelectorAll('div.cell_output .jupyter-widgets *').forEach((e) => {
    if (e.closest('svg, select, input, textarea, .plotly-graph-div, .selfattn-figure-text') || !e.clientWidth) return;
    const cs = getComputedStyle(e);
    if (cs.overflowX !== 'visible' && cs.overflowX !== 'auto' && cs.overflowX !== 'scroll' && e.scrollWidth > e.clientWidth + 1)
      spill.push({cls: ('cut: ' + (e.getAttribute('class') || e.tagName.toLowerCase())).slice(0, 60), right: Math.round(e.getBoundingClientRect().right),
                  width: e.scrollWidth, text: name(e).slice(0, 50)});
  });
  return {scroll_width: document.scrollingElement.scrollWidth, inner_width: window.innerWidth,
          column: [left, right], figures, equations, tables, code, outputs, spill, figure_texts: (""" + FIGURE_TEXT_JS + """)()};
}"""
MEASURE_JS = MEASURE_JS.replace("__STRETCH__", str(AXIS_STRETCH))


def is_local(url: str, base: str) -> bool:
    return url.startswith(base) or url.startswith("data:") or url.startswith("blob:") or url == "about:blank"


def visit(context, url: str, base: str, measure: bool = False) -> dict:
    """Open ``url`` in a new tab of ``context``, wait for figures, widgets and math; return a record:
    console messages by type, uncaught page errors, failed requests, HTTP errors, blocked requests
    (non-localhost, if the context blocks them) and what was drawn (``SETTLE_JS``); with ``measure``,
    also ``MEASURE_JS``'s layout measurements, under "measure"."""
    page = context.new_page()
    record = {"url": url, "console": [], "page_errors": [], "failed": [], "http_errors": []}
    page.on("console", lambda m: record["console"].append((m.type, m.text)))
    page.on("pageerror", lambda e: record["page_errors"].append(str(e)))
    page.on("requestfailed", lambda r: record["failed"].append((r.url, r.failure)))
    page.on("response", lambda r: r.status >= 400 and record["http_errors"].append((r.status, r.url)))
    try:
        page.goto(url, wait_until="load", timeout=30000)
        record.update(page.evaluate(SETTLE_JS))
        if measure:
            record["measure"] = page.evaluate(MEASURE_JS)
    finally:
        page.close()
    return record


def offline_context(browser, base: str, blocked: list[str], **options):
    """A browser context in which every request that is not to ``base`` is aborted (and noted)."""
    context = browser.new_context(**{"viewport": {"width": 1280, "height": 900}, **options})

    def route(r):
        if is_local(r.request.url, base):
            r.continue_()
        else:
            blocked.append(r.request.url)
            r.abort()

    context.route("**/*", route)
    return context


@pytest.fixture(scope="session")
def offline_visits(browser, site_url):
    """``get(page)`` -> the record of ``visit`` for a toc page, loaded once per session with every
    non-localhost request blocked; the console, offline, figure and reader (at 1280 px) tests all
    read these records."""
    cache: dict[str, dict] = {}
    blocked: list[str] = []
    context = offline_context(browser, site_url, blocked)

    def get(page: str) -> dict:
        if page not in cache:
            start = len(blocked)
            record = visit(context, f"{site_url}/{page}.html", site_url, measure=True)
            record["blocked"] = blocked[start:]
            cache[page] = record
        return cache[page]

    yield get
    context.close()


# Figures: the first figure of a page with a slider or a menu, and a snapshot of what it draws.

MAIN_FIGURE_JS = """() => {
  const divs = [...document.querySelectorAll('.plotly-graph-div')];
  const i = divs.findIndex((d) => d.layout && ((d.layout.sliders || []).length || (d.layout.updatemenus || []).length));
  if (i >= 0) divs[i].setAttribute('data-test-main', '1');
  return i;
}"""

# What the figure draws: its traces' data and title, and the SVG of its plot area, title and
# annotations (not its controls, which move whether or not the figure changes).
SNAPSHOT_JS = """(el) => {
  const drawn = [...el.querySelectorAll('.cartesianlayer, .polarlayer, .pielayer, .layer-above, .shapelayer, .g-gtitle, .annotation, .legend')]
    .map((n) => n.innerHTML).join('|');
  const data = (el.data || []).map((t) => [t.x, t.y, t.z, t.text, t.visible, t.name]);
  const title = el.layout && el.layout.title;
  return JSON.stringify([data, title, (el.layout || {}).annotations]) + drawn;
}"""


def wait_for_change(page, selector: str, before: str, timeout_ms: int = 8000) -> str:
    """The figure's snapshot once it differs from ``before`` (or the last one after the timeout)."""
    after = before
    for _ in range(timeout_ms // 100):
        page.wait_for_timeout(100)
        after = page.eval_on_selector(selector, SNAPSHOT_JS)
        if after != before:
            break
    return after


FIGURES_DRAWN_JS = (
    "() => [...document.querySelectorAll('.plotly-graph-div')].every((d) => d.querySelector('svg.main-svg'))"
)
# Not needed to use a figure, and most of a page load's CPU: left out of the interaction tests.
HEAVY = ("/selfattn-vendor/mathjax/", "/selfattn-vendor/html-manager/")


def open_with_figures(browser, site_url: str, page: str):
    """(context, tab) on ``page`` once its figures are drawn; MathJax and the widget manager are
    not loaded. The caller closes the context."""
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    context.route("**/*", lambda r: r.abort() if any(h in r.request.url for h in HEAVY) else r.continue_())
    tab = context.new_page()
    tab.goto(f"{site_url}/{page}.html", wait_until="load")
    tab.wait_for_function(FIGURES_DRAWN_JS, timeout=20000)
    return context, tab
