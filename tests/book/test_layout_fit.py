"""What a chapter prints and draws fits its column, at 1280 px and on a 390 px phone (issue 31, item 6).

Measured in Chromium (Playwright, ``browser_support``) on every chapter page:

- printed output: at 1280 px each line of every output ``<pre>`` (streams and text/plain results) is
  measured in the pre's own font; a line wider than the pre's content box (the column) is counted,
  whatever the CSS does with it: the chapters' prints are written to fit (shorter lines, lists
  wrapped, fewer columns). At 390 px (about 40 monospace characters) printed tables cannot be that
  narrow; there the book's CSS wraps an output line inside the column, and the test counts output
  blocks whose text still runs past the column (scrollWidth > clientWidth): no part of a line may
  be hidden behind a horizontal scroll.
- figures: the bounding box of each figure's title and legend lies inside the figure's drawing
  (the SVG that clips it), 1 px of tolerance.
- overprinted labels: no two pieces of text of a figure (title, axis and colour-bar titles, tick
  labels, annotations, legend) overlap by more than 2 px each way, for every figure of the pages.

Screenshots of the pages at 390 px go to test-artifacts/screenshots/narrow/.
"""

from __future__ import annotations

import pytest

try:
    from playwright.sync_api import TimeoutError as PlaywrightTimeout
except ImportError:  # the browser fixture skips (or fails in CI) with the reason
    PlaywrightTimeout = Exception

from .browser_support import FIGURES_DRAWN_JS, chapter_pages, page_id

FITTED_JS = "() => [...document.querySelectorAll('.plotly-graph-div')].every((d) => d.dataset.selfattnFit === 'done')"
WIDTHS = {"desktop": (1280, 900), "phone": (390, 844)}

PRE_LINES_JS = """() => {
  const wide = [];
  const canvas = document.createElement('canvas').getContext('2d');
  const pres = [...document.querySelectorAll('div.cell_output pre')].filter((p) => p.offsetParent !== null);
  for (const pre of pres) {
    const cs = getComputedStyle(pre);
    canvas.font = `${cs.fontStyle} ${cs.fontWeight} ${cs.fontSize} ${cs.fontFamily}`;
    const room = pre.clientWidth - parseFloat(cs.paddingLeft) - parseFloat(cs.paddingRight);
    for (const line of pre.textContent.split('\\n')) {
      const w = canvas.measureText(line.replace(/\\t/g, '        ')).width;
      if (w > room + 1) wide.push({width: Math.round(w), room: Math.round(room), line: line.slice(0, 120)});
    }
  }
  const scrolled = pres.filter((p) => p.scrollWidth > p.clientWidth + 1)
    .map((p) => ({width: p.scrollWidth, room: p.clientWidth, line: p.textContent.split('\n').sort((a, b) => b.length - a.length)[0].slice(0, 120)}));
  return {pres: pres.length, wide, scrolled};
}"""

# Text of a figure: [selector, kind]. The checks skip text hidden by plotly (display none / empty).
FIGURE_TEXT_JS = """() => {
  const cut = [], overlaps = [];
  const box = (n) => n.getBoundingClientRect();
  const visible = (n) => { const r = box(n); return r.width > 0 && r.height > 0 && n.textContent.trim() !== ''
    && getComputedStyle(n).visibility !== 'hidden' && getComputedStyle(n).display !== 'none'
    && ![...n.querySelectorAll('*'), n].some((m) => m.getAttribute && m.getAttribute('opacity') === '0'); };
  const title = (d) => ((d.layout || {}).title || {}).text || (typeof (d.layout || {}).title === 'string' ? d.layout.title : '');
  const divs = [...document.querySelectorAll('.plotly-graph-div')];
  divs.forEach((div, i) => {
    const svg = div.querySelector('svg.main-svg');
    if (!svg) return;
    const frame = box(svg);
    const name = `figure ${i} (${String(title(div)).slice(0, 50)})`;
    for (const [sel, kind] of [['.g-gtitle .gtitle', 'title'], ['.legend', 'legend']]) {
      for (const n of div.querySelectorAll(sel)) {
        if (!visible(n)) continue;
        const r = box(n);
        if (r.left < frame.left - 1 || r.right > frame.right + 1 || r.top < frame.top - 1 || r.bottom > frame.bottom + 1) {
          cut.push({figure: name, kind, text: n.textContent.slice(0, 60),
                    box: [r.left - frame.left, r.right - frame.left, r.top - frame.top, r.bottom - frame.top].map(Math.round),
                    frame: [Math.round(frame.width), Math.round(frame.height)]});
        }
      }
    }
    // every label: text elements outside the legend, and the legend as one box
    const labels = [...div.querySelectorAll('text')].filter((t) => !t.closest('.legend') && !t.closest('.slider-container')
        && !t.closest('.updatemenu-container') && !t.closest('.hoverlayer') && !t.closest('.modebar') && visible(t))
      .map((t) => ({text: t.textContent.slice(0, 40), r: box(t), cls: (t.getAttribute('class') || '') + ' ' + (t.parentElement.getAttribute('class') || '')}));
    const legend = div.querySelector('.legend');
    if (legend && visible(legend)) labels.push({text: 'legend', r: box(legend), cls: 'legend'});
    for (let a = 0; a < labels.length; a++) {
      for (let b = a + 1; b < labels.length; b++) {
        const p = labels[a].r, q = labels[b].r;
        const dx = Math.min(p.right, q.right) - Math.max(p.left, q.left);
        const dy = Math.min(p.bottom, q.bottom) - Math.max(p.top, q.top);
        if (dx > 2 && dy > 2) overlaps.push({figure: name, a: labels[a].text, b: labels[b].text});
      }
    }
  });
  return {figures: divs.length, cut, overlaps};
}"""


def _measure(browser, site_url, width, height, shots=None):
    context = browser.new_context(viewport={"width": width, "height": height})
    results = {}
    try:
        tab = context.new_page()
        for page in chapter_pages():
            tab.goto(f"{site_url}/{page}.html", wait_until="load")
            tab.wait_for_function(FIGURES_DRAWN_JS, timeout=30000)
            try:  # book/_static/selfattn-figure-fit.js marks each figure once it has fitted it
                tab.wait_for_function(FITTED_JS, timeout=15000)
            except PlaywrightTimeout:
                pass  # a build without the script: measure what is drawn
            tab.wait_for_timeout(300)
            results[page] = {**tab.evaluate(PRE_LINES_JS), **tab.evaluate(FIGURE_TEXT_JS)}
            if shots is not None:
                tab.screenshot(path=str(shots / f"{page_id(page)}.png"), full_page=True)
    finally:
        context.close()
    return results


@pytest.fixture(scope="module")
def measured(browser, site_url, artifacts):
    shots = artifacts / "screenshots" / "narrow"
    shots.mkdir(parents=True, exist_ok=True)
    return {name: _measure(browser, site_url, w, h, shots if name == "phone" else None)
            for name, (w, h) in WIDTHS.items()}


@pytest.mark.parametrize("width", sorted(WIDTHS))
def test_printed_lines_fit_the_column(measured, width):
    results = measured[width]
    assert sum(r["pres"] for r in results.values()) > 50, "the pages' printed outputs were not found"
    key = "wide" if width == "desktop" else "scrolled"
    wide = [(page, w["line"], f"{w['width']} > {w['room']} px") for page, r in results.items() for w in r[key]]
    assert wide == [], f"{len(wide)} printed lines wider than the column at {WIDTHS[width][0]} px: {wide[:12]}"


@pytest.mark.parametrize("width", sorted(WIDTHS))
def test_figure_titles_and_legends_are_not_cut(measured, width):
    results = measured[width]
    assert sum(r["figures"] for r in results.values()) > 30
    cut = [(page, c) for page, r in results.items() for c in r["cut"]]
    assert cut == [], f"{len(cut)} titles/legends cut at {WIDTHS[width][0]} px: {cut[:10]}"


@pytest.mark.parametrize("width", sorted(WIDTHS))
def test_figure_labels_do_not_overprint(measured, width):
    results = measured[width]
    over = [(page, o) for page, r in results.items() for o in r["overlaps"]]
    assert over == [], f"{len(over)} overlapping labels at {WIDTHS[width][0]} px: {over[:12]}"
