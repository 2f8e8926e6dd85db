"""The live model on the capstone page (issue 17), in a real browser with every other host blocked.

Chapter 14's ``selfattn.live.LivePanel`` puts the trained model (ONNX), its vocabulary and the values
the torch model gave at build time for three fixed prompts into the page; ``_static/selfattn-live.js``
runs the model with onnxruntime-web (WebAssembly, one thread). These tests open the built page from a
local web server and from ``file://`` and check that:

- the page's logits and attention weights equal the build-time torch values within 1e-4, and greedy
  generation gives the characters of ``GPT.generate`` (the expected values are the torch model's,
  written by the notebook; the page's are computed by the browser);
- the page's top-k / top-p filtering equals ``selfattn.sampling.filter_logits`` on the same logits;
- the same past ``block_size``: the panel's long probe (more than ``block_size`` characters) against
  ``GPT.forward``'s logits and last query rows of weights, within 1e-4;
- the sampling controls are read as typed (temperature 0 is greedy, top-k 1 the argmax); a value out of
  range stops generation with a message naming the control, the value and the range; a refused prompt
  clears the old heatmaps and continuation; after fast typing the heatmaps drawn are the last prompt's;
  non-finite logits are an error, not token 0; greedy decoding turns the sampling boxes off and does not
  read them; a prompt past the box's limit is refused with its length, never cut;
- pointing at a square of a heatmap reads out the two characters and the weight the model computed;
- every first visit reaches a first result (heatmaps and continuation drawn); the time to it, from the
  panel's start (scrolled into view) and from navigation (a link to the section), is measured and
  written to ``test-artifacts/live_load.json`` against issue 17's 2 s target, not asserted (a timing
  assert is one a busy machine can break);
- the panel is usable by keyboard, fits a 390 px screen, refuses characters outside the vocabulary
  with a message, and says so where WebAssembly is missing;
- only the pages with a panel (chapters 14 and 15) load the runtime; chapter 15's panel is tested in
  ``test_live_induction.py``.
"""

from __future__ import annotations

import contextlib
import json
import math
import re

import numpy as np
import pytest
import torch

from selfattn.sampling import filter_logits

from .browser_support import CONTRAST_HELPERS_JS, FIGURES_DRAWN_JS, offline_context

PAGE = "notebooks/14_capstone_gpt"
ANCHOR = "the-live-model-type-a-prompt-watch-every-head"
TOLERANCE = 1e-4
FIRST_RESULT_TARGET_MS = 2000  # issue 17's target, reported (test-artifacts/live_load.json), not asserted
READY_JS = "async () => { const r = await window.selfattnLive.ready; return r; }"


def _url(scheme: str, site_url: str, built_html) -> tuple[str, str]:
    """(page URL with the section's anchor, base that counts as local) for "http" or "file"."""
    base = site_url if scheme == "http" else built_html.as_uri()
    return f"{base}/{PAGE}.html#{ANCHOR}", base


def _open(browser, url: str, base: str, **options):
    """A tab on ``url`` in a context that blocks every other host; returns (context, tab, record)."""
    record = {"blocked": [], "errors": []}
    context = offline_context(browser, base, record["blocked"], **options)
    tab = context.new_page()
    tab.on("console", lambda m: m.type == "error" and record["errors"].append(m.text))
    tab.on("pageerror", lambda e: record["errors"].append(str(e)))
    tab.goto(url, wait_until="load", timeout=30000)
    return context, tab, record


@contextlib.contextmanager
def _ready_panel(browser, site_url, built_html, **options):
    """The capstone page over http, its panel started and idle; on leaving, no other host was asked for
    anything and the console had no error."""
    url, base = _url("http", site_url, built_html)
    context, tab, record = _open(browser, url, base, **options)
    try:
        assert tab.evaluate(READY_JS) == {"ok": True}
        tab.evaluate("() => window.selfattnLive.idle()")
        yield tab
    finally:
        context.close()
    assert record["blocked"] == [] and record["errors"] == [], record


def _max_diff(got, expected) -> float:
    got, expected = np.asarray(got, dtype=np.float64), np.asarray(expected, dtype=np.float64)
    assert got.shape == expected.shape, (got.shape, expected.shape)
    d = float(np.abs(got - expected).max())
    assert math.isfinite(d), "NaN or inf in the page's values or the expected ones"
    return d


PANEL_PAGES = {PAGE: ANCHOR, "notebooks/15_circuits": "ch15-live-model"}  # chapter 14's GPT, chapter 15's induction model


def test_only_the_panel_pages_load_the_live_model(built_html):
    """The runtime (selfattn-live.js, which loads onnxruntime-web) is on the pages with a live panel, chapters
    14 and 15, each holding one panel under its section's anchor, and on no other page."""
    pages = {p.relative_to(built_html).as_posix() for p in built_html.rglob("*.html")
             if "selfattn-live.js" in p.read_text()}
    assert pages == {f"{page}.html" for page in PANEL_PAGES}
    for page, anchor in PANEL_PAGES.items():
        html = (built_html / f"{page}.html").read_text()
        assert html.count('class="selfattn-livemodel"') == 1 and f'id="{anchor}"' in html, page
    vendor = built_html / "_static" / "selfattn-vendor" / "onnxruntime-web"
    assert (vendor / "dist" / "ort.wasm.min.js").is_file() and (vendor / "ort-wasm-embedded.js").is_file()
    assert "ort-wasm-simd-threaded.wasm" not in {p.name for p in vendor.rglob("*")}  # only the wrapped copy


@pytest.mark.parametrize("scheme", ["http", "file"])
def test_page_computes_the_torch_values_offline(browser, site_url, built_html, artifacts, scheme):
    url, base = _url(scheme, site_url, built_html)
    context, tab, record = _open(browser, url, base)
    try:
        ready = tab.evaluate(READY_JS)
        assert ready == {"ok": True}, ready
        expected = tab.evaluate("() => window.selfattnLive.expected()")
        config = tab.evaluate("() => window.selfattnLive.panels[0].config")
        V, L, H = len(config["vocab"]), config["n_layers"], config["n_heads"]
        assert len(expected) == 3
        figures = []
        for entry in expected:
            T = entry["T"]
            got = tab.evaluate("(p) => window.selfattnLive.run(p)", entry["prompt"])
            assert got["T"] == T
            d_logits = _max_diff(np.reshape(got["logits"], (T, V)), np.reshape(entry["logits"], (T, V)))
            d_weights = _max_diff(np.reshape(got["weights"], (L, H, T, T)), np.reshape(entry["weights"], (L, H, T, T)))
            greedy = tab.evaluate("([p, n]) => window.selfattnLive.generate(p, n, {greedy: true})",
                                  [entry["prompt"], entry["greedy"]["n_new"]])
            figures.append({"prompt": entry["prompt"], "T": T, "logits_max_abs_diff": d_logits,
                            "weights_max_abs_diff": d_weights, "greedy_page": greedy,
                            "greedy_torch": entry["greedy"]["text"]})
            assert d_logits < TOLERANCE and d_weights < TOLERANCE, figures[-1]
            assert greedy == entry["greedy"]["text"], figures[-1]
        (artifacts / f"live_parity_{scheme}.json").write_text(json.dumps(figures, indent=1))
        # What the reader sees: the first prompt's continuation and L x H heatmaps.
        assert tab.locator(".selfattn-livemodel-grid canvas").count() == L * H
        shown = tab.eval_on_selector(".selfattn-livemodel-output", "e => e.textContent")
        first = expected[0]
        assert shown.startswith(first["prompt"] + first["greedy"]["text"]), shown
    finally:
        context.close()
    assert record["blocked"] == [], f"asked another host for {record['blocked']}"
    assert record["errors"] == [], record["errors"]


FILTERS = [{"top_k": 1}, {"top_k": 5}, {"top_p": 0.9}, {"top_p": 0.3}, {"top_k": 10, "top_p": 0.5},
           {"top_k": 3, "top_p": 0.99}]


def test_page_filtering_equals_filter_logits(browser, site_url, built_html):
    url, base = _url("http", site_url, built_html)
    context, tab, record = _open(browser, url, base)
    try:
        expected = tab.evaluate("() => window.selfattnLive.expected()")
        V = len(tab.evaluate("() => window.selfattnLive.panels[0].config.vocab"))
        rows = [np.asarray(e["logits"], dtype=np.float32).reshape(e["T"], V)[-1] for e in expected]
        rows.append(np.array([2.0, 1.0, 2.0, 0.5, 2.0, -1.0], dtype=np.float32))  # ties at the top
        rows.append(np.array([0.0, 0.0, 0.0, 0.0], dtype=np.float32))  # all tied: every rule keeps all
        checked = 0
        for row in rows:
            for options in FILTERS:
                got = np.asarray(tab.evaluate("([x, o]) => window.selfattnLive.filter(x, o)", [row.tolist(), options]),
                                 dtype=np.float64)
                want = filter_logits(torch.from_numpy(row)[None], **options)[0].double().numpy()
                assert np.array_equal(np.isneginf(got), np.isneginf(want)), (row[:8], options)
                kept = ~np.isneginf(want)
                assert kept.any() and np.array_equal(got[kept], want[kept]), (row[:8], options)
                checked += 1
        assert checked == len(rows) * len(FILTERS)
    finally:
        context.close()
    assert record["blocked"] == [] and record["errors"] == []


def _timings(browser, url: str, base: str, scroll: bool) -> dict:
    """One load in a fresh context (empty cache: a first visit) -> the page's ``selfattnLive.timings``
    (``performance.now()``, ms since navigation). ``scroll``: the page is opened at its top and left
    to finish loading (every figure drawn), then the panel is scrolled into view, as a reader who
    reads down to it; otherwise ``url`` (a link to the section) starts the panel as soon as it is parsed."""
    context, tab, record = _open(browser, url, base)
    try:
        if scroll:
            tab.wait_for_function(FIGURES_DRAWN_JS, timeout=30000)
            tab.wait_for_timeout(500)
            assert tab.evaluate("() => window.selfattnLive.timings.start") is None  # lazy: not started yet
            tab.eval_on_selector(".selfattn-livemodel", "(el) => el.scrollIntoView()")
        assert tab.evaluate(READY_JS) == {"ok": True}
        tab.wait_for_function("() => window.selfattnLive.timings.first_result !== null", timeout=20000)
        timings = tab.evaluate("() => window.selfattnLive.timings")
    finally:
        context.close()
    assert record["blocked"] == [] and record["errors"] == [], record
    assert all(isinstance(v, (int, float)) and math.isfinite(v) for v in timings.values()), timings
    return timings


def test_first_result_time_is_measured_and_reported(browser, site_url, built_html, artifacts):
    """The time to the live model's first result (heatmaps and continuation drawn), measured on first
    visits (empty cache) and written to ``test-artifacts/live_load.json``, per scheme: from the moment
    the panel starts (the page fully loaded, then the panel scrolled into view) and from navigation
    (a link to the section, which adds the page's own loading: the theme's scripts, plotly.js, the
    chapter's figures). Issue 17's target is 2 s; it is reported, not asserted: a timing assert is
    one a busy machine can break (DESIGN.md, time budgets). Asserted: every load reaches a first
    result offline, with no console error, and the timings are finite and in order."""
    summary = {}
    for scheme in ("http", "file"):
        url, base = _url(scheme, site_url, built_html)
        scrolled = [_timings(browser, url.split("#")[0], base, scroll=True) for _ in range(2)]
        linked = [_timings(browser, url, base, scroll=False) for _ in range(2)]
        for t in scrolled + linked:
            assert 0 <= t["start"] <= t["first_result"], t
        summary[scheme] = {
            "scrolled_into_view": {k: [round(t[k]) for t in scrolled] for k in scrolled[0]},
            "start_to_first_result_ms": [round(t["first_result"] - t["start"]) for t in scrolled],
            "link_to_section": {k: [round(t[k]) for t in linked] for k in linked[0]},
            "navigation_to_first_result_ms": [round(t["first_result"]) for t in linked],
            "target_ms": FIRST_RESULT_TARGET_MS,
        }
    (artifacts / "live_load.json").write_text(json.dumps(summary, indent=1))
    print(json.dumps(summary, indent=1))


def test_keyboard_reaches_the_prompt_and_typing_updates_the_heads_at_390_px(browser, site_url, built_html):
    url, base = _url("http", site_url, built_html)
    context, tab, record = _open(browser, url, base, viewport={"width": 390, "height": 844})
    try:
        assert tab.evaluate(READY_JS) == {"ok": True}
        tab.wait_for_function("() => window.selfattnLive.timings.first_result !== null", timeout=20000)
        # From the panel's start, Tab reaches the prompt box, then every control, each with a label; in
        # greedy mode (the default) the sampling boxes are off and skipped, after switching to sampling
        # (by keyboard) they are reached too.
        def tab_through(presses):
            tab.eval_on_selector(".selfattn-livemodel", "(el) => { el.tabIndex = -1; el.focus(); }")
            reached = []
            for _ in range(presses):
                tab.keyboard.press("Tab")
                reached.append(tab.evaluate("""() => { const a = document.activeElement;
                    return {cls: a.className || a.type, label: (a.closest('label') || a).textContent.trim().slice(0, 30),
                            outline: getComputedStyle(a).outlineStyle}; }"""))
            assert reached[0]["cls"] == "text" and reached[0]["label"].startswith("Prompt"), reached[0]
            assert all(r["label"] for r in reached) and all(r["outline"] != "none" for r in reached), reached
            return [r["cls"] for r in reached[1:]]

        assert tab_through(4) == ["selfattn-livemodel-mode", "selfattn-livemodel-new", "selfattn-livemodel-again"]
        tab.focus(".selfattn-livemodel-mode")
        tab.keyboard.press("ArrowDown")  # greedy -> sample
        tab.evaluate("() => window.selfattnLive.idle()")
        assert tab.eval_on_selector(".selfattn-livemodel-mode", "e => e.value") == "sample"
        assert tab_through(7) == ["selfattn-livemodel-mode", "selfattn-livemodel-temperature",
                                  "selfattn-livemodel-topk", "selfattn-livemodel-topp",
                                  "selfattn-livemodel-new", "selfattn-livemodel-again"]
        # Typing in the prompt box (keyboard only) redraws the heatmaps for the longer prompt.
        tab.eval_on_selector(".selfattn-livemodel-prompt input", "(el) => el.focus()")
        before = tab.eval_on_selector(".selfattn-livemodel-grid canvas", "(c) => c.getAttribute('aria-label')")
        tab.keyboard.press("End")
        tab.keyboard.type("the value of")
        tab.wait_for_function("""(before) => { const c = document.querySelector('.selfattn-livemodel-grid canvas');
            return c && c.getAttribute('aria-label') !== before && document.querySelector('.selfattn-livemodel-output')
              .textContent.startsWith('The value of the value of'); }""", arg=before, timeout=10000)
        after = tab.eval_on_selector(".selfattn-livemodel-grid canvas", "(c) => c.getAttribute('aria-label')")
        assert re.search(r"rows the 25 prompt characters", after), after
        # A phone's width: nothing scrolls sideways, the heatmaps wrap inside the panel.
        width = tab.evaluate("() => [document.scrollingElement.scrollWidth, window.innerWidth]")
        assert width[0] <= width[1], width
        boxes = tab.evaluate("""() => { const p = document.querySelector('.selfattn-livemodel').getBoundingClientRect();
            return [...document.querySelectorAll('.selfattn-livemodel-head')].map((f) => {
              const r = f.getBoundingClientRect(); return r.left >= p.left - 1 && r.right <= p.right + 1; }); }""")
        assert len(boxes) == 8 and all(boxes), boxes
        # A character outside the vocabulary: a message naming it, not a silent wrong answer.
        tab.keyboard.type("é")
        tab.wait_for_function("() => document.querySelector('.selfattn-livemodel-status').textContent.includes('vocabulary')",
                              timeout=5000)
        status = tab.eval_on_selector(".selfattn-livemodel-status", "e => e.textContent")
        assert '"é"' in status and "not in the model's vocabulary" in status, status
    finally:
        context.close()
    assert record["blocked"] == [] and record["errors"] == []


def test_without_webassembly_the_panel_says_so(browser, site_url, built_html):
    url, base = _url("http", site_url, built_html)
    blocked: list[str] = []
    context = offline_context(browser, base, blocked)
    context.add_init_script("delete window.WebAssembly;")
    errors: list[str] = []
    try:
        tab = context.new_page()
        tab.on("console", lambda m: m.type == "error" and errors.append(m.text))
        tab.on("pageerror", lambda e: errors.append(str(e)))
        tab.goto(url, wait_until="load")
        ready = tab.evaluate(READY_JS)
        assert ready == {"ok": False, "reason": "WebAssembly"}, ready
        status = tab.locator(".selfattn-livemodel-status")
        assert status.is_visible() and "needs WebAssembly" in status.text_content()
        assert tab.locator(".selfattn-livemodel-prompt input").is_disabled()
    finally:
        context.close()
    assert blocked == [] and errors == [], (blocked, errors)


PANEL_CONTRAST_JS = """() => {
""" + CONTRAST_HELPERS_JS + """  return [...document.querySelectorAll('.selfattn-livemodel p, .selfattn-livemodel label, .selfattn-livemodel figcaption, .selfattn-livemodel input, .selfattn-livemodel select, .selfattn-livemodel button')]
    .filter((e) => (e.value || e.textContent).trim()).map((e) => {
      const fg = rgba(getComputedStyle(e).color), bg = background(e);
      const [a, b] = [lum(fg), lum(bg)].sort((x, y) => y - x);
      return {ratio: (a + 0.05) / (b + 0.05), text: (e.value || e.textContent).trim().slice(0, 40)};
    });
}"""


@pytest.mark.parametrize("mode", ["light", "dark"])
def test_panel_text_is_legible_in_light_and_dark_mode(browser, site_url, built_html, mode):
    """WCAG contrast >= 4.5 for every text of the panel (labels, controls, status, output, captions)
    against the background it is drawn on, once the model has run (the theme's contrast test reads only
    a page's first paragraphs)."""
    url, base = _url("http", site_url, built_html)
    context, tab, record = _open(browser, url, base, color_scheme=mode)
    try:
        tab.evaluate(f"() => {{ localStorage.setItem('mode', '{mode}'); localStorage.setItem('theme', '{mode}'); }}")
        tab.reload(wait_until="load")
        assert tab.evaluate("() => document.documentElement.dataset.theme") == mode
        assert tab.evaluate(READY_JS) == {"ok": True}
        ratios = tab.evaluate(PANEL_CONTRAST_JS)
    finally:
        context.close()
    assert record["blocked"] == [] and record["errors"] == [], record
    assert len(ratios) >= 15, ratios
    low = [r for r in ratios if not r["ratio"] >= 4.5]
    assert low == [], f"{mode}: panel text below 4.5:1: {low[:8]}"


def _set_controls(tab, values: dict) -> None:
    """Set the panel's controls (class suffix -> value) as a reader would, then wait for the panel to settle."""
    tab.evaluate("""(values) => { const root = document.querySelector('.selfattn-livemodel');
        for (const [cls, value] of Object.entries(values)) {
          const el = cls === 'prompt' ? root.querySelector('.selfattn-livemodel-prompt input')
                                      : root.querySelector('.selfattn-livemodel-' + cls);
          el.value = value;
          el.dispatchEvent(new Event(cls === 'prompt' ? 'input' : 'change', {bubbles: true}));
        } }""", values)
    tab.evaluate("() => window.selfattnLive.idle()")


def _panel_text(tab) -> dict:
    return tab.evaluate("""() => ({status: document.querySelector('.selfattn-livemodel-status').textContent,
        problem: document.querySelector('.selfattn-livemodel-status').classList.contains('selfattn-livemodel-problem'),
        prompt: document.querySelector('.selfattn-livemodel-out-prompt').textContent,
        continuation: document.querySelector('.selfattn-livemodel-out-new').textContent,
        heads: document.querySelectorAll('.selfattn-livemodel-grid canvas').length})""")


def test_sampling_controls_are_read_as_typed_not_replaced(browser, site_url, built_html):
    """Temperature 0 is greedy (it was read as 1); top-k 1 keeps only the argmax; a temperature, top-k or
    top-p outside its range stops generation with a message naming the control, the value and the range
    (top-p 0 used to keep every token, temperature -1 became 0.05)."""
    with _ready_panel(browser, site_url, built_html) as tab:
        first = tab.evaluate("() => window.selfattnLive.expected()")[0]
        n, greedy = first["greedy"]["n_new"], first["greedy"]["text"]
        assert len(greedy) == n > 0
        _set_controls(tab, {"prompt": first["prompt"], "new": str(n), "mode": "sample", "temperature": "0",
                            "topk": "0", "topp": "1"})
        shown = _panel_text(tab)
        assert shown["continuation"] == greedy and not shown["problem"], shown
        assert "greedy: temperature 0" in shown["status"], shown
        _set_controls(tab, {"temperature": "0.8", "topk": "1"})  # sampling among the single top token
        shown = _panel_text(tab)
        assert shown["continuation"] == greedy and "top-k 1" in shown["status"], shown
        for values, control, value, valid in [
            ({"topk": "0", "topp": "0"}, "Top-p", '"0"', "(0, 1]"),
            ({"topp": "1.5"}, "Top-p", '"1.5"', "(0, 1]"),
            ({"topp": "1", "temperature": "-1"}, "Temperature", '"-1"', ">= 0"),
            ({"temperature": "abc"}, "Temperature", '""', ">= 0"),  # a number box holding text reads ""
            ({"temperature": "0.8", "topk": "2.5"}, "Top-k", '"2.5"', "whole number"),
            ({"topk": "0", "new": "0"}, "New characters", '"0"', "from 1 to"),
        ]:
            _set_controls(tab, values)
            shown = _panel_text(tab)
            assert shown["problem"] and f"{control} {value} is not valid" in shown["status"], (values, shown)
            assert valid in shown["status"], (values, shown)
            assert shown["continuation"] == "" and shown["heads"] == 0, (values, shown)  # nothing stale on show
        _set_controls(tab, {"new": str(n), "mode": "greedy"})
        shown = _panel_text(tab)
        assert shown["continuation"] == greedy and not shown["problem"], shown
        parsed = tab.evaluate("() => window.selfattnLive.parseOptions('sample', '0.5', '3', '0.9')")
        assert parsed == {"greedy": False, "temperature": 0.5, "top_k": 3, "top_p": 0.9}, parsed


def test_non_finite_logits_are_an_error_not_token_0(browser, site_url, built_html):
    url, base = _url("http", site_url, built_html)
    context, tab, record = _open(browser, url, base)
    try:
        assert tab.evaluate(READY_JS) == {"ok": True}
        for row, options in [([0.5, float("nan"), 1.0], {"greedy": True}), ([float("nan")] * 3, {"greedy": True}),
                             ([0.5, 2.0, float("nan")], {"greedy": False, "temperature": 1})]:
            message = tab.evaluate("""([row, o]) => { try { return 'picked ' + window.selfattnLive.pick(row, o); }
                catch (e) { return e.message; } }""", [row, options])
            assert "non-finite logit (NaN)" in message, (row, options, message)
        assert tab.evaluate("() => window.selfattnLive.pick([0.5, 2.0, 1.0], {greedy: true})") == 1
    finally:
        context.close()
    assert record["blocked"] == [] and record["errors"] == [], record


def test_refused_prompt_clears_the_old_result_and_the_last_prompt_typed_is_drawn(browser, site_url, built_html):
    with _ready_panel(browser, site_url, built_html) as tab:
        config = tab.evaluate("() => window.selfattnLive.panels[0].config")
        L, H = config["n_layers"], config["n_heads"]
        assert _panel_text(tab)["heads"] == L * H
        # A character outside the vocabulary: the message, and no heatmaps or continuation of the old prompt.
        box = tab.locator(".selfattn-livemodel-prompt input")
        box.focus()
        tab.keyboard.press("End")
        tab.keyboard.type("é")
        tab.evaluate("() => window.selfattnLive.idle()")
        shown = _panel_text(tab)
        assert shown["problem"] and '"é"' in shown["status"], shown
        assert shown["heads"] == 0 and shown["prompt"] == "" and shown["continuation"] == "", shown
        assert tab.evaluate("() => window.selfattnLive.shown()") is None
        _set_controls(tab, {"prompt": ""})
        shown = _panel_text(tab)
        assert shown["problem"] and "Type a prompt" in shown["status"] and shown["heads"] == 0, shown
        # Rapid typing (no pause for the debounce, plus a direct update mid-way): what is drawn is the last prompt's.
        box.fill("")
        for i, ch in enumerate("the value of a class"):
            tab.keyboard.type(ch, delay=5)
            if i == 6:
                tab.evaluate("() => { window.selfattnLive.panels[0].safeUpdate(); }")
        tab.evaluate("() => window.selfattnLive.idle()")
        final = "the value of a class"
        drawn = tab.evaluate("() => window.selfattnLive.shown()")
        assert drawn is not None and drawn["prompt"] == final and drawn["T"] == len(final), drawn
        run = tab.evaluate("(p) => window.selfattnLive.run(p)", final)
        T = len(final)
        assert _max_diff(np.reshape(drawn["weights"], (L, H, T, T)), np.reshape(run["weights"], (L, H, T, T))) < 1e-6
        shown = _panel_text(tab)
        assert shown["heads"] == L * H and shown["prompt"] == final and not shown["problem"], shown
        assert len(shown["continuation"]) == int(tab.eval_on_selector(".selfattn-livemodel-new", "e => e.value")), shown
        label = tab.eval_on_selector(".selfattn-livemodel-grid canvas", "(c) => c.getAttribute('aria-label')")
        assert f"rows the {T} prompt characters" in label, label


def test_page_computes_the_torch_values_past_block_size(browser, site_url, built_html):
    """Positions >= block_size (RoPE past the training length) in the browser: the page's run() on the
    panel's long probe (more than block_size characters, written at build time with GPT.forward's logits
    and the last query rows of every head's weights) equals the torch values within 1e-4."""
    url, base = _url("http", site_url, built_html)
    context, tab, record = _open(browser, url, base)
    try:
        assert tab.evaluate(READY_JS) == {"ok": True}
        config = tab.evaluate("() => window.selfattnLive.panels[0].config")
        V, L, H = len(config["vocab"]), config["n_layers"], config["n_heads"]
        probe = tab.evaluate("() => window.selfattnLive.long()")
        assert probe is not None, "the page has no selfattn-livemodel-long block (LivePanel's long probe)"
        T, row0, rows = probe["T"], probe["row0"], probe["rows"]
        assert config["block_size"] < T <= config["max_positions"] and len(probe["prompt"]) == T, probe["prompt"]
        assert row0 + rows == T and row0 >= config["block_size"], (row0, rows)
        got = tab.evaluate("(p) => window.selfattnLive.run(p)", probe["prompt"])
        assert got["T"] == T
        d_logits = _max_diff(np.reshape(got["logits"], (T, V)), np.reshape(probe["logits"], (T, V)))
        weights = np.reshape(got["weights"], (L, H, T, T))
        d_weights = _max_diff(weights[:, :, row0:, :], np.reshape(probe["weights"], (L, H, rows, T)))
        assert d_logits < TOLERANCE and d_weights < TOLERANCE, (T, d_logits, d_weights)
    finally:
        context.close()
    assert record["blocked"] == [] and record["errors"] == [], record


def test_greedy_mode_turns_the_sampling_boxes_off_and_does_not_read_them(browser, site_url, built_html):
    """Greedy decoding ignores temperature, top-k and top-p: their boxes are disabled (and a value left
    in them out of range does not stop greedy generation); back to sampling they are on and read again."""
    boxes_off = """() => ['temperature', 'topk', 'topp'].map((c) =>
        document.querySelector('.selfattn-livemodel-' + c).disabled)"""
    with _ready_panel(browser, site_url, built_html) as tab:
        first = tab.evaluate("() => window.selfattnLive.expected()")[0]
        n, greedy = first["greedy"]["n_new"], first["greedy"]["text"]
        assert tab.evaluate(boxes_off) == [True, True, True], "greedy is the default: the boxes start off"
        _set_controls(tab, {"prompt": first["prompt"], "new": str(n), "temperature": "-1", "topp": "0"})
        shown = _panel_text(tab)
        assert shown["continuation"] == greedy and not shown["problem"] and "(greedy)" in shown["status"], shown
        _set_controls(tab, {"mode": "sample"})
        assert tab.evaluate(boxes_off) == [False, False, False]
        shown = _panel_text(tab)
        assert shown["problem"] and 'Temperature "-1" is not valid' in shown["status"], shown
        _set_controls(tab, {"mode": "greedy"})
        assert tab.evaluate(boxes_off) == [True, True, True]
        assert _panel_text(tab)["continuation"] == greedy
        assert tab.evaluate("() => window.selfattnLive.parseOptions('greedy', '-1', 'x', '7')") == {
            "greedy": True, "temperature": None, "top_k": None, "top_p": None}


def test_a_prompt_past_the_limit_is_refused_not_cut(browser, site_url, built_html):
    """A pasted prompt longer than the box's limit (block_size characters) is refused with its length and
    the limit; it used to be cut silently by the box. At the limit it runs; one character is singular."""
    with _ready_panel(browser, site_url, built_html) as tab:
        limit = tab.evaluate("() => window.selfattnLive.panels[0].config.max_prompt")
        assert limit == 64
        text = ("the value of a class " * 4)[: limit + 6]
        tab.locator(".selfattn-livemodel-prompt input").fill(text)  # as a paste: one input event
        tab.evaluate("() => window.selfattnLive.idle()")
        assert tab.eval_on_selector(".selfattn-livemodel-prompt input", "e => e.value") == text, "nothing cut"
        shown = _panel_text(tab)
        assert shown["problem"] and f"it has {limit + 6} characters" in shown["status"], shown
        assert f"at most {limit}" in shown["status"] and shown["heads"] == 0 and shown["continuation"] == "", shown
        _set_controls(tab, {"prompt": text[:limit]})
        shown = _panel_text(tab)
        assert not shown["problem"] and shown["heads"] == 8 and shown["prompt"] == text[:limit], shown
        _set_controls(tab, {"prompt": "T"})
        shown = _panel_text(tab)
        assert "the weights of the 1 prompt character in every" in shown["status"], shown
        label = tab.eval_on_selector(".selfattn-livemodel-grid canvas", "(c) => c.getAttribute('aria-label')")
        assert "rows the 1 prompt character that ask" in label, label
        # one character has no previous one: no share of weight on it is made up (it said 0.00)
        assert "previous character none (one character)" in label, label
        caption = tab.eval_on_selector(".selfattn-livemodel-grid figcaption", "(c) => c.textContent")
        assert "previous char. —;" in caption, caption


def test_a_number_box_holding_text_that_is_no_number_is_refused_not_read_as_every_token(
        browser, site_url, built_html):
    """Typed "3-" in the top-k box, the browser reports its value as "", which top-k reads as every token:
    generation went on, sampled from every character, with no word. Each box that takes part is checked."""
    with _ready_panel(browser, site_url, built_html) as tab:
        _set_controls(tab, {"prompt": "The value of ", "mode": "sample"})
        for box, name in (("topk", "Top-k"), ("topp", "Top-p"), ("temperature", "Temperature"),
                          ("new", "New characters")):
            field = tab.locator(f".selfattn-livemodel-{box}")
            before = field.input_value()
            field.focus()
            tab.keyboard.press("Control+A")
            tab.keyboard.type("3-")  # a number box keeps the text; its value reads ""
            tab.keyboard.press("Enter")
            field.dispatch_event("change")
            tab.evaluate("() => window.selfattnLive.idle()")
            assert field.evaluate("(e) => e.validity.badInput"), box
            shown = _panel_text(tab)
            assert shown["problem"] and f"the {name} box holds text that is not a number" in shown["status"], shown
            assert shown["continuation"] == "" and shown["heads"] == 0, shown
            _set_controls(tab, {box: before})
            assert not _panel_text(tab)["problem"], box
        # in greedy mode the sampling boxes take no part: unreadable text there stops nothing
        field = tab.locator(".selfattn-livemodel-topk")
        field.focus()
        tab.keyboard.press("Control+A")
        tab.keyboard.type("3-")
        _set_controls(tab, {"mode": "greedy"})
        shown = _panel_text(tab)
        assert not shown["problem"] and shown["heads"] == 8 and shown["continuation"], shown


def test_pointing_at_a_square_reads_its_characters_and_weight(browser, site_url, built_html):
    """The heatmaps' readout: the pointer over row t, column s of a head's square names the character
    that asks, the one it reads and the weight the model computed (shown() holds the drawn weights);
    above the diagonal it says the causal mask hides the pair."""
    with _ready_panel(browser, site_url, built_html) as tab:
        prompt = "the object"
        _set_controls(tab, {"prompt": prompt})
        drawn = tab.evaluate("() => window.selfattnLive.shown()")
        config = tab.evaluate("() => window.selfattnLive.panels[0].config")
        L, H, T = config["n_layers"], config["n_heads"], len(prompt)
        weights = np.reshape(drawn["weights"], (L, H, T, T))
        readout = ".selfattn-livemodel-readout"
        assert "Point at" in tab.eval_on_selector(readout, "e => e.textContent")
        canvases = tab.locator(".selfattn-livemodel-grid canvas")
        for index, t, s in [(0, 9, 8), (5, 4, 0), (7, 9, 9), (2, 0, 0)]:
            l, h = divmod(index, H)
            canvas = canvases.nth(index)
            canvas.scroll_into_view_if_needed()
            box = canvas.bounding_box()
            side = box["width"] - 2  # the 1 px border on each side
            tab.mouse.move(box["x"] + 1 + (s + 0.5) * side / T, box["y"] + 1 + (t + 0.5) * side / T)
            text = tab.eval_on_selector(readout, "e => e.textContent")
            ask, read = prompt[t].replace(" ", "␣"), prompt[s].replace(" ", "␣")
            assert text == (f"Layer {l} · head {h}: “{ask}” (character {t + 1}) reads “{read}” "
                            f"(character {s + 1}) with weight {weights[l, h, t, s]:.3f}."), (index, t, s, text)
        box = canvases.nth(1).bounding_box()
        tab.mouse.move(box["x"] + 1 + 6.5 * (box["width"] - 2) / T, box["y"] + 1 + 2.5 * (box["width"] - 2) / T)
        text = tab.eval_on_selector(readout, "e => e.textContent")
        assert "“e” (character 3) may not read “j” (character 7)" in text and "causal mask" in text, text
        tab.mouse.move(box["x"] - 40, box["y"] - 40)
        assert "Point at" in tab.eval_on_selector(readout, "e => e.textContent")


TAPPED_JS = """() => new Promise((done) => requestAnimationFrame(() => requestAnimationFrame(() =>
  done(document.querySelector('.selfattn-livemodel-readout').textContent))))"""


# Whether the readout and the canvas tapped lie wholly inside the window, and the readout just under
# the canvas (at most 60 px below its bottom edge: near the square the reader's finger is on).
IN_VIEW_JS = """(index) => {
  const inside = (r) => r.top >= 0 && r.left >= 0 && r.bottom <= innerHeight && r.right <= innerWidth;
  const readout = document.querySelector('.selfattn-livemodel-readout');
  const canvas = document.querySelectorAll('.selfattn-livemodel-grid canvas')[index];
  const r = readout.getBoundingClientRect(), c = canvas.getBoundingClientRect();
  return {readout: inside(r) && r.top >= c.bottom - 1 && r.top <= c.bottom + 60, canvas: inside(c),
          readout_box: [r.top, r.bottom], canvas_box: [c.top, c.bottom], height: innerHeight};
}"""


def test_tapping_a_square_on_a_phone_reads_its_characters_and_weight(browser, site_url, built_html):
    """On a touch screen (a 390 px phone: touch events, mobile viewport) a tap on a heatmap square leaves
    the readout of that square in place: the browser follows a touch's pointerup with a pointerleave,
    which must not wipe what the tap wrote. A second tap reads the second square. The readout is on the
    screen, with the square tapped (issue 31: it was written below the fold, under the grid of heads)."""
    phone = {"viewport": {"width": 390, "height": 844}, "device_scale_factor": 3, "is_mobile": True, "has_touch": True}
    with _ready_panel(browser, site_url, built_html, **phone) as tab:
        prompt = "the object"
        _set_controls(tab, {"prompt": prompt})
        drawn = tab.evaluate("() => window.selfattnLive.shown()")
        config = tab.evaluate("() => window.selfattnLive.panels[0].config")
        L, H, T = config["n_layers"], config["n_heads"], len(prompt)
        weights = np.reshape(drawn["weights"], (L, H, T, T))
        canvases = tab.locator(".selfattn-livemodel-grid canvas")
        for index, t, s in [(0, 9, 8), (3, 5, 2)]:
            l, h = divmod(index, H)
            canvas = canvases.nth(index)
            canvas.scroll_into_view_if_needed()
            box = canvas.bounding_box()
            side = box["width"] - 2  # the 1 px border on each side
            tab.touchscreen.tap(box["x"] + 1 + (s + 0.5) * side / T, box["y"] + 1 + (t + 0.5) * side / T)
            text = tab.evaluate(TAPPED_JS)
            seen = tab.evaluate(IN_VIEW_JS, index)
            assert seen["readout"] and seen["canvas"], (index, seen)
            ask, read = prompt[t].replace(" ", "\u2423"), prompt[s].replace(" ", "\u2423")
            assert text == (f"Layer {l} \u00b7 head {h}: \u201c{ask}\u201d (character {t + 1}) reads \u201c{read}\u201d "
                            f"(character {s + 1}) with weight {weights[l, h, t, s]:.3f}."), (index, t, s, text)
