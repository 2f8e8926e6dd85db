"""What a reader of the built book sees, at a desktop width (1280 px) and a phone width (390 px).

- Nothing makes the page scroll sideways; figures, tables, display equations (on a desktop) and
  inline code (long test names, the Colab address) fit the text column.
- No plotly control is drawn over a figure's legend; plotly logs no warning in the console.
- Every figure's texts (title, legend, axis and colour-bar titles, tick labels, annotations, slider and
  menu labels) lie inside the figure and none is drawn over another (issue 31, item 6).
- Exercises: no answer and no "correct" feedback is visible before a click; a hint comes before
  every solution; the solution toggle says what chapter 00 tells the reader to click; clicking opens
  the hint, then the solution and its feedback. Feedback shows code, not backticks.
- The keyboard twins of plotly's sliders and menus (``selfattn.viz``'s renderer) stay in step with
  every plotly control, in both directions.
- The ipywidgets explorers, live-only, are disabled and marked on the static page.
- Prose about a number measured at build time follows that number (chapter 09's time slope).

Pages are loaded once per width (every non-localhost request blocked) and measured in one go;
the tests below read those measurements.
"""

from __future__ import annotations

import re

import pytest

from .browser_support import (
    FIGURE_TEXT_TOLERANCE,
    MEASURE_JS,
    SETTLE_JS,
    chapter_pages,
    is_local,
    open_with_figures,
    page_id,
    toc_pages,
)

PAGES = toc_pages()
CHAPTERS = chapter_pages()
WIDTHS = [1280, 390]
# The collapsed label of every hidden solution; chapter 00 tells the reader to click it.
SOLUTION_PROMPT = "Solution (click to show)"
SLACK = 1  # px: sub-pixel rounding



@pytest.fixture(scope="session")
def reader_visits(browser, site_url, offline_visits):
    """``get(page, width)`` -> measurements of the page (``MEASURE_JS``) and its console messages,
    loaded once per width with every non-localhost request blocked. At 1280 px this is the load
    ``offline_visits`` makes anyway (the same viewport, blocking and settling; it measures
    ``MEASURE_JS`` too), so a page is not loaded twice at that width."""
    contexts, cache = {}, {}

    def get(page: str, width: int) -> dict:
        if width == 1280:
            record = offline_visits(page)
            return {**record["measure"], "console": record["console"]}
        if (page, width) not in cache:
            if width not in contexts:
                context = browser.new_context(viewport={"width": width, "height": 900})
                context.route("**/*", lambda r: r.continue_() if is_local(r.request.url, site_url) else r.abort())
                contexts[width] = context
            tab = contexts[width].new_page()
            console: list[tuple[str, str]] = []
            tab.on("console", lambda m: console.append((m.type, m.text)))
            try:
                tab.goto(f"{site_url}/{page}.html", wait_until="load", timeout=30000)
                tab.evaluate(SETTLE_JS)
                record = tab.evaluate(MEASURE_JS)
            finally:
                tab.close()
            record["console"] = console
            cache[(page, width)] = record
        return cache[(page, width)]

    yield get
    for context in contexts.values():
        context.close()


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_no_page_scrolls_sideways(reader_visits, page, width):
    r = reader_visits(page, width)
    assert r["scroll_width"] <= r["inner_width"], (
        f"{page} at {width} px is {r['scroll_width']} px wide: it scrolls sideways"
    )


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_figures_fit_the_text_column_and_controls_leave_the_legend_free(reader_visits, page, width):
    r = reader_visits(page, width)
    left, right = r["column"]
    wide = [(f["index"], round(f["width"])) for f in r["figures"]
            if f["right"] > right + SLACK or f["left"] < left - SLACK]
    assert wide == [], f"{page} at {width} px: figures (index, width) wider than the {round(right - left)} px column: {wide}"
    covered = [f["index"] for f in r["figures"] if f["control_over_legend"]]
    assert covered == [], f"{page} at {width} px: a slider or menu is drawn over the legend of figures {covered}"


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("page", CHAPTERS, ids=page_id)
def test_nothing_in_an_output_runs_past_the_column(reader_visits, page, width):
    """Issue 31's trial: at 390 px the static rows of the live explorers' widgets (chapters 02-05),
    tqdm's progress bars (chapters 08, 14) and chapter 07's per-layer figure ran past the text column.
    No element of a cell's output ends past the column at 1280 or 390 px (browser_support.MEASURE_JS,
    "spill": figures' SVGs, tables and display equations have their own tests above)."""
    r = reader_visits(page, width)
    column = round(r["column"][1] - r["column"][0])
    assert r["spill"] == [], f"{page} at {width} px: {len(r['spill'])} output elements past the {column} px column: {r['spill'][:6]}"


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("page", CHAPTERS, ids=page_id)
def test_drawn_axes_cover_their_data_only(reader_visits, page, width):
    """Issue 31, item 2, as drawn: at 1280 and 390 px no autoranged axis of a line or marker plot runs
    past its data by more than AXIS_STRETCH of the data's span (browser_support.MEASURE_JS). plotly
    widens an autoranged axis until each label referenced to it fits, so on a phone a long label near
    an axis's end stretched chapter 10's roofline to 1e14 (tests/figure_extent.py checks the
    coordinates of marks; this checks the axis plotly draws)."""
    r = reader_visits(page, width)
    stretched = [(f["index"], s) for f in r["figures"] for s in f["stretched"]]
    assert stretched == [], f"{page} at {width} px: axes drawn past their data (figure, axis): {stretched}"


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_tables_and_inline_code_fit_the_text_column(reader_visits, page, width):
    r = reader_visits(page, width)
    cut = [t["head"][:3] for t in r["tables"] if t["scroll"] > t["client"] + SLACK or t["right"] > r["column"][1] + SLACK]
    assert cut == [], f"{page} at {width} px: tables wider than the column (part of them off screen): {cut}"
    assert [c["text"] for c in r["code"]] == [], f"{page} at {width} px: inline code runs past its box"


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_printed_output_fits_the_text_column(reader_visits, page, width):
    """Issue 31: at 1280 and at 390 px no printed output (stdout, a value's text, a traceback) is wider
    than its box or runs past the column. The rule: a reader never scrolls sideways to read what a
    cell printed, not even inside its box: long lines wrap at the column (book/_static/selfattn.css)."""
    r = reader_visits(page, width)
    wide = [(o["scroll"], o["client"], o["line"]) for o in r["outputs"]]
    assert wide == [], (f"{page} at {width} px: {len(wide)} output boxes wider than the column "
                        f"(text width, box width, first line that does not fit): {wide[:5]}")


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("page", CHAPTERS, ids=page_id)
def test_figure_texts_are_inside_the_figure_and_apart(reader_visits, page, width):
    """Issue 31: at 1280 and 390 px no figure's title, legend or label is cut off at the figure's edge
    (plotly's SVG clips it) and no two of its texts are drawn over each other: their boxes (each turned
    with its text) overlap by at most FIGURE_TEXT_TOLERANCE px (browser_support.FIGURE_TEXT_JS). Found
    on main's build: e.g. 24 titles cut at 390 px, the colour-bar title over the top tick of every
    attention heatmap, chapter 08's shift-matrix colour bar over the error panel's ticks, chapter 11's
    "logical block" under "the physical pool"."""
    figures = reader_visits(page, width)["figure_texts"]
    assert figures and all(f["texts"] >= 1 for f in figures), f"{page} at {width} px: no figure's texts measured: {figures[:3]}"
    found = [f"figure {f['index']} ({f['title'][:70]!r}): {p['what']} by {p['px']} px: {' / '.join(p['texts'])}"
             for f in figures for p in f["problems"]]
    assert found == [], (f"{page} at {width} px: {len(found)} figure texts cut off or drawn over each other "
                         f"(tolerance {FIGURE_TEXT_TOLERANCE} px):\n" + "\n".join(found[:25]))


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_display_equations_fit_the_column_on_a_desktop(reader_visits, page):
    """At 1280 px every display equation is shown whole (on a phone a long one may scroll in its box)."""
    r = reader_visits(page, 1280)
    cut = [e["text"] for e in r["equations"] if e["scroll"] > e["client"] + SLACK or e["right"] > r["column"][1] + SLACK]
    assert cut == [], f"{page}: display equations cut off at 1280 px: {cut}"


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_plotly_logs_no_warning(reader_visits, page):
    """plotly.js logs through console.trace/log with a "WARN:" or "ERROR:" prefix (Lib.warn, Lib.error)."""
    logged = [text for _kind, text in reader_visits(page, 1280)["console"] if re.match(r"\s*(WARN|ERROR):", text)]
    assert logged == [], f"{page}: plotly logged {len(logged)} warnings, e.g. {logged[:2]}"


# --- Exercises ------------------------------------------------------------------------------------

EXERCISES_JS = """() => {
  const cells = [...document.querySelectorAll('.cell')].filter((c) => (c.querySelector('.cell_input') || {textContent: ''}).textContent.includes('@title Solution'));
  const hints = [...document.querySelectorAll('details')].filter((d) => !d.closest('.cell') && d.querySelector(':scope > summary')
    && d.querySelector(':scope > summary').textContent.trim().startsWith('Hint'));
  const order = [...cells.map((c) => ['S', c]), ...hints.map((h) => ['H', h])]
    .sort((a, b) => (a[1].compareDocumentPosition(b[1]) & Node.DOCUMENT_POSITION_FOLLOWING) ? -1 : 1)
    .map((x) => x[0]).join('');
  cells.forEach((c, i) => c.setAttribute('data-test-solution', i));
  hints.forEach((h, i) => h.setAttribute('data-test-hint', i));
  const prompts = cells.map((c) => { const p = c.querySelector('summary .collapsed'); return p ? p.textContent.trim() : null; });
  return {solutions: cells.length, hints: hints.length, order, prompts};
}"""

HINT = re.compile(r'<details class="selfattn-hint"([^>]*)>\s*<summary>Hint</summary>(.*?)</details>', re.S)


@pytest.mark.parametrize("page", CHAPTERS, ids=page_id)
def test_hints_are_closed_details_in_the_built_html(built_html, page):
    """Each hint is a closed HTML <details> (the form every notebook front end folds too, issue 26.6) whose
    body the book rendered from Markdown (a paragraph; inline code as <code>, maths as MathJax input), and no
    MyST dropdown is left as literal text."""
    html = (built_html / f"{page}.html").read_text()
    hints = HINT.findall(html)
    assert len(hints) >= 2, f"{page}: {len(hints)} hints"
    assert [a for a, _ in hints if "open" in a] == [], f"{page}: a hint is open before a click"
    bodies = [re.sub(r"<[^>]+>", "", body).strip() for _, body in hints]
    assert all(b for b in bodies) and all("<p>" in body for _, body in hints), f"{page}: an empty or unrendered hint"
    assert not [b for b in bodies if any(raw in b for raw in ("$", "`", ":::"))], f"{page}: raw Markdown in a hint: {bodies}"
    text = re.sub(r"<script.*?</script>|<[^>]+>", " ", html, flags=re.S)
    assert "{dropdown}" not in text, f"{page}: a MyST dropdown is shown as text"


# Green "correct" feedback (selfattn.exercises.Feedback) visible on the page, and its text.
VISIBLE_CORRECT_JS = """() => [...document.querySelectorAll('.selfattn-feedback')]
  .filter((f) => f.getClientRects().length && f.getBoundingClientRect().height > 0 && f.checkVisibility())
  .filter((f) => /10004|\\u2714/.test(f.querySelector('strong').innerHTML) || f.querySelector('strong').textContent.includes('\\u2714'))
  .map((f) => f.textContent.trim().slice(0, 80))"""


@pytest.mark.parametrize("page", CHAPTERS, ids=page_id)
def test_exercise_answers_are_hidden_until_asked_with_a_hint_first(browser, site_url, page):
    context, tab = open_with_figures(browser, site_url, page)
    try:
        found = tab.evaluate(EXERCISES_JS)
        assert found["solutions"] >= 2, f"{page}: {found['solutions']} solution cells"
        assert tab.evaluate(VISIBLE_CORRECT_JS) == [], f"{page}: a solution's 'correct' feedback is visible before any click"
        for i in range(found["solutions"]):
            cell = tab.locator(f'[data-test-solution="{i}"]')
            assert not cell.locator(".cell_input").is_visible(), f"{page}: solution {i}'s code is visible before a click"
            assert not cell.locator(".cell_output").is_visible(), f"{page}: solution {i}'s feedback is visible before a click"
        assert found["hints"] == found["solutions"] and "SS" not in found["order"] and not found["order"].startswith("S"), (
            f"{page}: every solution needs a hint just before it; hints (H) and solutions (S) in page order: {found['order']}"
        )
        assert set(found["prompts"]) == {SOLUTION_PROMPT}, f"{page}: solution toggles read {set(found['prompts'])}"
        for i in range(found["hints"]):
            hint = tab.locator(f'[data-test-hint="{i}"]')
            assert hint.get_attribute("open") is None, f"{page}: hint {i} is open before a click"
            body = hint.locator(":scope > :not(summary)").first
            assert not body.is_visible(), f"{page}: hint {i}'s text is visible before a click"
            hint.locator(":scope > summary").click()
            body.wait_for(state="visible", timeout=3000)
            assert body.inner_text().strip(), f"{page}: hint {i} is empty"
        for i in range(found["solutions"]):
            cell = tab.locator(f'[data-test-solution="{i}"]')
            cell.locator("summary").first.click()
            cell.locator(".cell_input").wait_for(state="visible", timeout=3000)
            feedback = cell.locator(".cell_output .selfattn-feedback").first
            feedback.wait_for(state="visible", timeout=3000)
            assert "correct" in feedback.inner_text().lower() or "\u2714" in feedback.inner_text(), (
                f"{page}: solution {i}'s feedback after the click: {feedback.inner_text()[:80]}"
            )
    finally:
        context.close()


def test_chapter_00_names_the_toggle_the_reader_clicks(built_html):
    text = re.sub(r"<[^>]+>", " ", (built_html / "notebooks" / "00_how_to_use.html").read_text())
    assert SOLUTION_PROMPT in text and "Hint" in text


@pytest.mark.parametrize("page", CHAPTERS, ids=page_id)
def test_exercise_feedback_shows_code_not_backticks(built_html, page):
    html = (built_html / f"{page}.html").read_text()
    boxes = re.findall(r'<div class="selfattn-feedback".*?</div>', html, flags=re.S)
    assert boxes, f"{page}: no exercise feedback"
    assert [b for b in boxes if "`" in b] == [], f"{page}: feedback with literal backticks"


# --- Keyboard twins of plotly controls ------------------------------------------------------------

# For the figure marked data-test-fig: each slider's and menu's active index in plotly's layout, and
# the index its keyboard twin shows (range value; selected option; the pressed button of a row).
STATE_JS = """(el) => {
  const box = el.nextElementSibling && el.nextElementSibling.classList.contains('selfattn-controls') ? el.nextElementSibling : null;
  const parts = box ? [...box.children] : [];
  const sliders = (el.layout.sliders || []).filter((s) => (s.steps || []).length);
  const menus = (el.layout.updatemenus || []).filter((m) => (m.buttons || []).length);
  const pairs = [];
  sliders.forEach((s, k) => { const input = parts[k] && parts[k].querySelector('input[type=range]');
    pairs.push(['slider ' + k, s.active || 0, input ? +input.value : null]); });
  menus.forEach((m, k) => { const node = parts[sliders.length + k]; let twin = null;
    if (node && node.querySelector('select')) twin = +node.querySelector('select').value;
    else if (node) { const i = [...node.querySelectorAll('button')].findIndex((b) => b.getAttribute('aria-pressed') === 'true'); twin = i >= 0 ? i : null; }
    pairs.push(['menu ' + k + ' (' + (m.type || 'dropdown') + ')', m.active === undefined ? 0 : m.active, twin]); });
  return pairs;
}"""

CONTROLLED_JS = """() => [...document.querySelectorAll('.plotly-graph-div')].map((d, i) => {
  d.setAttribute('data-test-fig', i);
  return {index: i, slider: (d.layout.sliders || []).length ? d.layout.sliders[0].steps.length : 0,
          menu: (d.layout.updatemenus || []).length ? {type: d.layout.updatemenus[0].type || 'dropdown', n: d.layout.updatemenus[0].buttons.length} : null};
}).filter((f) => f.slider || f.menu)"""


def _in_step(tab, fig: str, timeout_ms: int = 4000) -> list:
    pairs = []
    for _ in range(timeout_ms // 100):
        pairs = tab.eval_on_selector(fig, STATE_JS)
        if all(plotly == twin for _name, plotly, twin in pairs):
            return []
        tab.wait_for_timeout(100)
    return [p for p in pairs if p[1] != p[2]]


def _active(tab, fig: str, what: str) -> int:
    return tab.eval_on_selector(fig, f"(el) => el.layout.{what}[0].active || 0")


@pytest.mark.parametrize("page", CHAPTERS, ids=page_id)
def test_keyboard_twins_stay_in_step_with_every_plotly_control(browser, site_url, page):
    """Use each figure's plotly slider and menu with the mouse: every twin follows; use each twin:
    plotly's control follows."""
    context, tab = open_with_figures(browser, site_url, page)
    problems = []
    try:
        figures = tab.evaluate(CONTROLLED_JS)
        assert figures, f"{page}: no figure with a slider or a menu"
        for f in figures:
            fig = f'[data-test-fig="{f["index"]}"]'
            tab.wait_for_selector(f"{fig} ~ .selfattn-controls", timeout=10000)
            twins = tab.locator(f"{fig} ~ .selfattn-controls")
            if f["menu"] and f["menu"]["n"] > 1:  # the figure's own menu, then its twin
                n = f["menu"]["n"]
                target = n - 1 if _active(tab, fig, "updatemenus") != n - 1 else 0
                if f["menu"]["type"] != "buttons":
                    tab.locator(f"{fig} .updatemenu-header-group").first.click()
                tab.locator(f"{fig} .updatemenu-button, {fig} .updatemenu-dropdown-button").nth(target).click()
                problems += [(f["index"], "plotly menu", p) for p in _in_step(tab, fig)]
                back = 0 if target else 1
                select = twins.locator("select")
                if select.count():
                    select.first.select_option(str(back))
                else:
                    twins.locator("span[role=group]").last.locator("button").nth(back).click()
                problems += [(f["index"], "twin menu", p) for p in _in_step(tab, fig)]
            if f["slider"] > 1:  # the figure's own slider, then its twin
                steps = f["slider"]
                target = 0 if _active(tab, fig, "sliders") == steps - 1 else steps - 1
                container = tab.locator(f"{fig} .slider-container").first
                tick = container.locator(".slider-tick-rect").nth(target)
                tick.scroll_into_view_if_needed()
                rail, mark = container.locator(".slider-rail-touch-rect").bounding_box(), tick.bounding_box()
                tab.mouse.click(mark["x"] + mark["width"] / 2, rail["y"] + rail["height"] / 2)
                problems += [(f["index"], "plotly slider", p) for p in _in_step(tab, fig)]
                twins.locator("input[type=range]").first.evaluate(
                    "(input, v) => { input.value = v; input.dispatchEvent(new Event('input', {bubbles: true})); }",
                    str(steps // 2),
                )
                problems += [(f["index"], "twin slider", p) for p in _in_step(tab, fig)]
    finally:
        context.close()
    assert problems == [], f"{page}: (figure, control used, [control out of step, plotly, twin]): {problems}"


# --- Live-only widgets ----------------------------------------------------------------------------

WIDGETS_JS = """() => {
  const areas = [...document.querySelectorAll('script[type="application/vnd.jupyter.widget-view+json"]')].map((s) => s.parentElement);
  const controls = areas.flatMap((a) => [...a.querySelectorAll('.jupyter-widgets input, .jupyter-widgets select, .jupyter-widgets textarea, .jupyter-widgets button, .jupyter-widgets .noUi-target')])
    .filter((c) => !c.closest('.widget-output, .plotly-graph-div'));
  const live = controls.filter((c) => !(c.disabled || c.hasAttribute('disabled')));
  const noted = (a) => [...a.querySelectorAll('.selfattn-live-note')].some((n) => n.checkVisibility() && /kernel/i.test(n.textContent));
  const withControls = areas.filter((a) => controls.some((c) => a.contains(c)));
  const bare = areas.filter((a) => !withControls.includes(a));  // e.g. tqdm's progress bar: nothing to disable
  return {areas: areas.length, controls: controls.length, live: live.map((c) => c.tagName + '.' + c.className),
          unmarked: withControls.filter((a) => !noted(a)).length,
          noted_bare: bare.filter(noted).map((a) => a.textContent.replace(/\\s+/g, ' ').trim().slice(0, 80))};
}"""


@pytest.mark.parametrize("page", CHAPTERS, ids=page_id)
def test_live_only_widget_controls_are_disabled_and_marked(browser, site_url, page):
    """The ipywidgets explorers need a kernel: on the static page their controls are disabled (a
    dragged slider does not move its readout away from the figure it shows) and a note says so. A
    widget with no control (tqdm's progress bar in chapters 08 and 14) gets no such note: above a
    plain progress bar it announced an explorer that is not there (issue 26, learner26's report)."""
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    context.route("**/*", lambda r: r.continue_() if is_local(r.request.url, site_url) else r.abort())
    tab = context.new_page()
    try:
        tab.goto(f"{site_url}/{page}.html", wait_until="load")
        tab.evaluate(SETTLE_JS)
        r = tab.evaluate(WIDGETS_JS)
        if not r["areas"]:
            pytest.skip(f"{page} embeds no widget")
        assert r["controls"] >= 1, f"{page}: widget views but no control drawn"
        assert r["live"] == [], f"{page}: live-only controls usable on the static page: {r['live'][:5]}"
        assert r["unmarked"] == 0, f"{page}: {r['unmarked']} widget views without a note that they need a kernel"
        assert r["noted_bare"] == [], f"{page}: a widget without controls says it needs a kernel: {r['noted_bare']}"
        handle = tab.locator(".jupyter-widgets .noUi-handle").first
        if handle.count():
            readout = tab.locator(".jupyter-widgets .widget-readout").first
            before = readout.text_content()
            handle.scroll_into_view_if_needed()
            box = handle.bounding_box()
            tab.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
            tab.mouse.down()
            tab.mouse.move(box["x"] + 150, box["y"] + box["height"] / 2, steps=5)
            tab.mouse.up()
            assert readout.text_content() == before, f"{page}: a dragged widget slider moved ({before} -> {readout.text_content()})"
    finally:
        context.close()


# --- Numbers measured at build time ---------------------------------------------------------------


def test_chapter_09_time_sentence_follows_the_measured_slope(built_html):
    text = re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", (built_html / "notebooks" / "09_parallel_and_quadratic.html").read_text()))
    printed = re.search(r"naive time \(ms\): \[[^\]]*\] slope (-?\d+\.\d+)", text)
    said = re.search(r"Measured time slope: (-?\d+\.\d+) , (below 2|close to 2|above 2)", text)
    assert printed and said, "chapter 09 prints the time slope and states it in a sentence"
    slope = float(printed.group(1))
    assert float(said.group(1)) == slope
    expected = "below 2" if slope < 1.8 else ("close to 2" if slope <= 2.2 else "above 2")
    assert said.group(2) == expected
    assert not (slope >= 1.8 and "grows more slowly than T" in text), "the prose says slower than T^2 against the number"


def test_references_show_no_raw_tex(built_html):
    text = re.sub(r"<[^>]+>", " ", (built_html / "book" / "references.html").read_text())
    body = text.split("References", 1)[-1]
    assert "$" not in body and "\\(" not in body, "a reference title shows raw TeX"

