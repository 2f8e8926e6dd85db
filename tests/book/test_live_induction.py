"""Chapter 15's live panel (issue 29 item 5, issue 26 item 4): the two-layer attention-only model that has
induction heads, in a real browser with every other host blocked.

Chapter 15's ``selfattn.live.LivePanel`` puts the trained ``AttentionOnly`` model (ONNX, through
``AttentionOnlyExport``), its 32-character alphabet (``selfattn.live.TokenAlphabet``) and the values the
torch model gave at build time for three fixed prompts (random characters written twice, and so on) into
the page; ``_static/selfattn-live.js`` runs it as it runs chapter 14's GPT. These tests open the built page
from a local web server and from ``file://`` and check that:

- the page's logits and attention weights equal the build-time torch values within 1e-4, and greedy
  generation gives the characters the torch model gives (the expected values are written by the notebook;
  the page's are computed by the browser);
- the reader sees one heatmap per layer and head, labelled from layer 0, head 0 as the chapter counts;
- a character outside the alphabet is refused with a message that lists the alphabet, and a prompt past
  the box's limit (32 positions minus the 8 new characters) with its length and the reason;
- chapter 14's page links to this panel, next to its own panel (which has no induction heads).
"""

from __future__ import annotations

import contextlib
import re

import numpy as np
import pytest

from .browser_support import offline_context
from .test_live import READY_JS, TOLERANCE, _max_diff

PAGE = "notebooks/15_circuits"
ANCHOR = "ch15-live-model"


def _url(scheme: str, site_url: str, built_html) -> tuple[str, str]:
    base = site_url if scheme == "http" else built_html.as_uri()
    return f"{base}/{PAGE}.html#{ANCHOR}", base


@contextlib.contextmanager
def _page(browser, site_url, built_html, scheme="http"):
    """Chapter 15's page at its panel's anchor, the panel started; on leaving, no other host was asked for
    anything and the console had no error."""
    url, base = _url(scheme, site_url, built_html)
    blocked, errors = [], []
    context = offline_context(browser, base, blocked)
    try:
        tab = context.new_page()
        tab.on("console", lambda m: m.type == "error" and errors.append(m.text))
        tab.on("pageerror", lambda e: errors.append(str(e)))
        tab.goto(url, wait_until="load", timeout=30000)
        assert tab.evaluate(READY_JS) == {"ok": True}
        tab.evaluate("() => window.selfattnLive.idle()")
        yield tab
    finally:
        context.close()
    assert blocked == [] and errors == [], (blocked, errors)


@pytest.mark.parametrize("scheme", ["http", "file"])
def test_page_computes_the_induction_models_torch_values_offline(browser, site_url, built_html, scheme):
    with _page(browser, site_url, built_html, scheme) as tab:
        expected = tab.evaluate("() => window.selfattnLive.expected()")
        config = tab.evaluate("() => window.selfattnLive.panels[0].config")
        assert config["model"] == "AttentionOnly" and config["vocab"] == "abcdefghijklmnopqrstuvwxyz234567"
        V, L, H = len(config["vocab"]), config["n_layers"], config["n_heads"]
        assert (V, L, H, config["max_positions"], config["count_from"]) == (32, 2, 4, 32, 0)
        assert len(expected) == 3
        unit = expected[0]["prompt"][:12]
        assert expected[0]["prompt"] == unit + unit and len(set(unit)) == 12  # random characters, written twice
        for entry in expected:
            T = entry["T"]
            got = tab.evaluate("(p) => window.selfattnLive.run(p)", entry["prompt"])
            assert got["T"] == T
            d_logits = _max_diff(np.reshape(got["logits"], (T, V)), np.reshape(entry["logits"], (T, V)))
            d_weights = _max_diff(np.reshape(got["weights"], (L, H, T, T)), np.reshape(entry["weights"], (L, H, T, T)))
            greedy = tab.evaluate("([p, n]) => window.selfattnLive.generate(p, n, {greedy: true})",
                                  [entry["prompt"], entry["greedy"]["n_new"]])
            assert d_logits < TOLERANCE and d_weights < TOLERANCE, (entry["prompt"], d_logits, d_weights)
            assert greedy == entry["greedy"]["text"], (entry["prompt"], greedy, entry["greedy"])
        # What the reader sees: the first prompt's continuation and L x H heatmaps, counted from 0.
        assert tab.locator(".selfattn-livemodel-grid canvas").count() == L * H
        captions = tab.eval_on_selector_all(".selfattn-livemodel-grid figcaption", "(cs) => cs.map((c) => c.textContent)")
        assert [c.split(" —")[0] for c in captions] == [f"Layer {l} · head {h}" for l in range(L) for h in range(H)]
        shown = tab.eval_on_selector(".selfattn-livemodel-output", "e => e.textContent")
        assert shown.startswith(expected[0]["prompt"] + expected[0]["greedy"]["text"]), shown


def test_the_panel_refuses_characters_outside_the_alphabet_and_prompts_past_its_limit(browser, site_url, built_html):
    status = ".selfattn-livemodel-status"
    with _page(browser, site_url, built_html) as tab:
        box = tab.locator(".selfattn-livemodel-prompt input")
        box.fill("abcA")
        tab.evaluate("() => window.selfattnLive.idle()")
        text = tab.eval_on_selector(status, "e => e.textContent")
        assert '"A"' in text and "one per token id: abcdefghijklmnopqrstuvwxyz234567" in text, text
        assert tab.locator(".selfattn-livemodel-grid canvas").count() == 0
        limit = tab.evaluate("() => window.selfattnLive.panels[0].config.max_prompt")
        assert limit == 24
        box.fill("abcdefghijklm" * 2)  # 26 characters
        tab.evaluate("() => window.selfattnLive.idle()")
        text = tab.eval_on_selector(status, "e => e.textContent")
        assert "it has 26 characters" in text and "at most 24, so that the continuation fits in the 32 positions" in text, text
        box.fill("abcdefgh" * 3)  # at the limit: it runs, and copies on
        tab.evaluate("() => window.selfattnLive.idle()")
        assert tab.locator(".selfattn-livemodel-grid canvas").count() == 8
        assert "problem" not in (tab.eval_on_selector(status, "e => e.className") or "")


def test_chapter_14_links_to_this_panel(built_html):
    """Chapter 14's page, whose panel runs the capstone (no induction heads), links to chapter 15's panel, and
    the link's target is the section of chapter 15's page that holds the panel."""
    html14 = (built_html / "notebooks/14_capstone_gpt.html").read_text()
    links = re.findall(r'href="([^"]*15_circuits\.html#[^"]+)"', html14)
    assert links, "chapter 14 has no link to chapter 15's panel"
    html15 = (built_html / f"{PAGE}.html").read_text()
    for link in links:
        anchor = link.split("#", 1)[1]
        assert anchor in (ANCHOR, "the-model-in-the-page-type-a-sequence-twice"), link
        assert f'id="{anchor}"' in html15, link
    section = html15[html15.index(f'id="{ANCHOR}"'):]
    section = section[: section.find("<section", 1) if "<section" in section[1:] else len(section)]
    assert 'class="selfattn-livemodel"' in section, "the link's target section holds no live panel"
