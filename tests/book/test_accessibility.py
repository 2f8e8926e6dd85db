"""Accessibility of the published book (issue 6).

- Every figure has a text description (``selfattn.viz.describe``): in the built HTML, each figure's
  wrapper has an ``aria-label`` that is not the renderer's default, and a visually hidden paragraph.
- Colour scales are readable in grayscale and by colour-blind readers: every colour scale in the
  executed notebooks is a perceptually uniform sequential scale (Viridis, Cividis, Plasma, Inferno,
  Magma), or RdBu centred on zero (zmid/cmid = 0, or symmetric limits), or a discrete version of one
  of them (some of its stops, in order: a True/False mask in Viridis's two ends); every colour a trace sets
  by name or hex is from the Okabe-Ito palette (colour-blind safe) or a grey.
- Controls are reachable by keyboard: plotly draws its sliders and menus in SVG, which Tab never
  reaches, so ``selfattn.viz``'s renderer adds HTML controls (range input, select, buttons) bound
  to the same steps under each such figure. The browser test Tabs to them and uses the keyboard.
"""

from __future__ import annotations

import json
import re

import plotly.colors as pc
import pytest

from .browser_support import (
    MAIN_FIGURE_JS,
    SNAPSHOT_JS,
    chapter_pages,
    open_with_figures,
    page_id,
    wait_for_change,
)
from .conftest import BUILD

CHAPTERS = chapter_pages()
PLOTLY_MIME = "application/vnd.plotly.v1+json"
DEFAULT_LABEL = "interactive figure"
FIGURE = re.compile(r'<div class="selfattn-figure" role="figure" aria-label="([^"]*)">\s*<div id="selfattn-fig-[0-9a-f]{12}" class="plotly-graph-div"')
GRAPH_DIV = re.compile(r'<div id="selfattn-fig-[0-9a-f]{12}" class="plotly-graph-div"')

SEQUENTIAL = ["Viridis", "Cividis", "Plasma", "Inferno", "Magma"]
DIVERGING = ["RdBu"]
# Okabe & Ito (2008), "Color Universal Design": distinguishable with every common colour-vision deficiency.
OKABE_ITO = ["#000000", "#E69F00", "#56B4E9", "#009E73", "#F0E442", "#0072B2", "#D55E00", "#CC79A7"]


@pytest.mark.parametrize("page", CHAPTERS, ids=page_id)
def test_every_figure_has_a_text_description(built_html, page):
    html = (built_html / f"{page}.html").read_text()
    labels = FIGURE.findall(html)
    assert len(labels) == len(GRAPH_DIV.findall(html)), f"{page}: a figure div outside the renderer's wrapper"
    bare = [i for i, label in enumerate(labels) if not label.strip() or label == DEFAULT_LABEL]
    assert bare == [], f"{page}: figures {bare} have no description (call selfattn.viz.describe)"
    assert html.count('class="selfattn-figure-text"') >= len(labels)


def _rgb(colour: str) -> tuple[int, ...]:
    colour = colour.strip()
    if colour.startswith("#"):
        return tuple(pc.hex_to_rgb(colour))
    return tuple(round(float(v)) for v in re.findall(r"[\d.]+", colour)[:3])


def _scale(entries) -> tuple:
    return tuple((round(float(pos), 4), _rgb(colour)) for pos, colour in entries)


def _named(names: list[str]) -> list[tuple]:
    return [_scale(pc.get_colorscale(v)) for name in names for v in (name, name + "_r")]


ALLOWED_SEQUENTIAL = _named(SEQUENTIAL)
ALLOWED_DIVERGING = _named(DIVERGING)


def _drawn_from(scale: tuple, allowed: list[tuple]) -> bool:
    """The scale is one of ``allowed``, or a discrete version of one: its colours are stops of that
    scale in the same order (e.g. a True/False mask drawn with Viridis's two ends)."""
    colours = [rgb for _pos, rgb in scale]
    for named in allowed:
        stops = [rgb for _pos, rgb in named]
        if scale == named:
            return True
        if all(c in stops for c in colours):
            index = [stops.index(c) for c in colours]
            if index == sorted(index):
                return True
    return False
PALETTE = {_rgb(c) for c in OKABE_ITO}


def _is_grey(rgb: tuple[int, ...]) -> bool:
    return max(rgb) - min(rgb) <= 8


def _figures(stem: str) -> list[dict]:
    path = BUILD / "jupyter_execute" / "notebooks" / f"{stem}.ipynb"
    assert path.is_file(), f"no executed copy of {stem}"
    nb = json.loads(path.read_text())
    return [out["data"][PLOTLY_MIME] for cell in nb["cells"] if cell["cell_type"] == "code"
            for out in cell.get("outputs", []) if PLOTLY_MIME in out.get("data", {})]


def _centred(holder: dict) -> bool:
    if holder.get("zmid") == 0 or holder.get("cmid") == 0:
        return True
    for lo, hi in (("zmin", "zmax"), ("cmin", "cmax")):
        if holder.get(lo) is not None and holder.get(hi) is not None and abs(holder[lo] + holder[hi]) < 1e-9:
            return True
    return False


def _walk(node, path, problems, in_template):
    if isinstance(node, dict):
        scale = node.get("colorscale")
        if isinstance(scale, list) and scale:
            got = _scale(scale)
            if _drawn_from(got, ALLOWED_DIVERGING):
                if not in_template and not _centred(node):
                    problems.append(f"{path}: RdBu not centred on zero (set zmid=0)")
            elif not _drawn_from(got, ALLOWED_SEQUENTIAL):
                problems.append(f"{path}: colour scale {scale[:2]}... is not one of {SEQUENTIAL + DIVERGING}")
        for key, value in node.items():
            if not in_template and key == "color" and isinstance(value, str) and not value.startswith("rgba(0,0,0,0"):
                rgb = _rgb(value) if value.startswith(("#", "rgb")) else None
                if rgb is not None and rgb not in PALETTE and not _is_grey(rgb):
                    problems.append(f"{path}/color {value} is not an Okabe-Ito colour or a grey")
            _walk(value, f"{path}/{key}", problems, in_template or key == "template")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            _walk(value, f"{path}[{i}]", problems, in_template)


@pytest.mark.parametrize("page", CHAPTERS, ids=page_id)
def test_colours_are_readable_in_grayscale_and_by_colour_blind_readers(book_build, page):
    problems: list[str] = []
    for k, fig in enumerate(_figures(page.split("/")[-1])):
        _walk(fig, f"figure {k}", problems, False)
    assert problems == [], f"{page}: " + "; ".join(sorted(set(problems))[:10])


FOCUS_JS = """() => {
  const a = document.activeElement;
  return {inside: !!(a && a.closest('[data-test-main="1"] ~ .selfattn-controls, .selfattn-figure:has([data-test-main="1"]) .selfattn-controls')),
          tag: a ? a.tagName.toLowerCase() : null, type: a ? a.type : null};
}"""


@pytest.mark.parametrize("page", CHAPTERS, ids=page_id)
def test_main_figure_controls_are_reachable_and_usable_by_keyboard(browser, site_url, page):
    """Tab from just before the main figure reaches one of its controls; the keyboard alone then
    changes what the figure draws (arrow key on a slider or menu, Enter on a button)."""
    context, tab = open_with_figures(browser, site_url, page)
    try:
        assert tab.evaluate(MAIN_FIGURE_JS) >= 0, f"{page}: no figure with a slider or a menu"
        main = '[data-test-main="1"]'
        tab.wait_for_selector(f"{main} ~ .selfattn-controls", timeout=10000)
        # Start where a keyboard reader who has just read the figure's caption would be.
        tab.eval_on_selector(main, "(el) => { const w = el.closest('.selfattn-figure'); w.tabIndex = -1; w.focus(); }")
        focus = None
        for _ in range(30):  # past plotly's mode bar buttons (zoom, pan, download...)
            tab.keyboard.press("Tab")
            focus = tab.evaluate(FOCUS_JS)
            if focus["inside"]:
                break
        assert focus and focus["inside"], f"{page}: Tab does not reach the main figure's controls (focus on {focus})"
        before = tab.eval_on_selector(main, SNAPSHOT_JS)
        if focus["tag"] == "input":
            tab.keyboard.press("End" if tab.evaluate("document.activeElement.value") == "0" else "Home")
        elif focus["tag"] == "select":
            tab.keyboard.press("ArrowDown" if tab.evaluate("document.activeElement.selectedIndex") == 0 else "ArrowUp")
        else:  # a row of buttons: Enter on the first; if it is the view already shown, the next one
            tab.keyboard.press("Enter")
            if wait_for_change(tab, main, before, timeout_ms=3000) == before:
                tab.keyboard.press("Tab")
                tab.keyboard.press("Enter")
        after = wait_for_change(tab, main, before)
        assert after != before, f"{page}: the keyboard ({focus['tag']}) did not change the figure"
    finally:
        context.close()
