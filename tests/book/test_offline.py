"""The book reads offline: every script, style sheet and font comes from the book itself (issue 6).

plotly.js comes from the installed plotly package; require.js, the ipywidgets HTML manager and
MathJax 3 are fetched by ``scripts/vendor_js.py`` (``make vendor``) and copied by
``book/_ext/selfattn_book.py`` into ``_static/selfattn-vendor/``. The browser test loads every toc
page with all non-localhost requests aborted (``offline_visits``) and checks that figures, math
and widgets are still drawn.
"""

from __future__ import annotations

import re

import pytest

from .browser_support import page_id, toc_pages

PAGES = toc_pages()

# Non-localhost requests a page may make (and that fail offline without harm), each with the reason.
BLOCKED_ALLOW: list[tuple[re.Pattern[str], str]] = []

# A resource the page loads by itself: <script src>, <link rel=stylesheet|preload|icon href>, <img src>.
LOADED = re.compile(
    r'<script[^>]*\ssrc="([^"]+)"|<link[^>]*rel="(?:stylesheet|preload|icon|modulepreload)"[^>]*href="([^"]+)"'
    r'|<link[^>]*href="([^"]+)"[^>]*rel="(?:stylesheet|preload|icon|modulepreload)"|<img[^>]*\ssrc="([^"]+)"'
)


@pytest.mark.parametrize("page", PAGES + ["search", "genindex"], ids=page_id)
def test_pages_load_nothing_from_another_host(built_html, page):
    html = (built_html / f"{page}.html").read_text()
    external = [u for groups in LOADED.findall(html) for u in groups if u and re.match(r"(https?:)?//", u)]
    assert external == [], f"{page} loads {external}"


def test_vendored_files_are_served(built_html):
    vendor = built_html / "_static" / "selfattn-vendor"
    for rel in ["plotly.min.js", "requirejs/require.js", "html-manager/dist/embed-amd.js",
                "mathjax/es5/tex-mml-chtml.js", "mathjax/es5/output/chtml/fonts/woff-v2/MathJax_Main-Regular.woff",
                "onnxruntime-web/dist/ort.wasm.min.js", "onnxruntime-web/ort-wasm-embedded.js"]:
        assert (vendor / rel).is_file() and (vendor / rel).stat().st_size > 0, rel


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_page_works_with_every_other_host_blocked(offline_visits, page):
    record = offline_visits(page)
    blocked = [u for u in record["blocked"] if not any(p.search(u) for p, _why in BLOCKED_ALLOW)]
    assert blocked == [], f"{page} asked another host for {blocked}"
    failed = [(u, why) for u, why in record["failed"] if u not in record["blocked"]]
    assert failed == [] and record["http_errors"] == [], f"{page}: failed requests {failed} {record['http_errors']}"
    assert record["figures_drawn"] == record["figures"], f"{page}: figures not drawn offline"
    if record["math_source"]:
        assert record["math_drawn"] >= 1, f"{page}: MathJax drew no math offline"
        assert record["math_errors"] == 0, f"{page}: MathJax reports {record['math_errors']} TeX errors"
    assert record["widget_views_drawn"] == record["widget_views"], (
        f"{page}: {record['widget_views'] - record['widget_views_drawn']} of {record['widget_views']} widgets not drawn"
    )
