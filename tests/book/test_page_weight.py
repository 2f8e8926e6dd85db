"""Page weight: each chapter page is at most 3 MB with its figure data (issue 6).

How it is counted: a page's weight is the size in bytes of its HTML file, which holds its figures'
JSON (inline, in the renderer's ``<script>``) and its widgets' saved state, plus the files only that
page loads (images under ``_images/`` it shows). Scripts, style sheets and fonts under ``_static/``
(plotly.min.js, MathJax, require.js, the widget manager, the theme) are shared by every page and
cached by the browser after the first, so they are counted once for the whole book, not per page;
their total is reported, not limited. The table is written to ``test-artifacts/page_weights.json``.
"""

from __future__ import annotations

import json
import re

from .browser_support import chapter_pages, toc_pages

LIMIT = 3_000_000  # bytes (3 MB)
IMAGE = re.compile(r'<img[^>]*\ssrc="([^"]*_images/[^"]+)"')


def _weight(built_html, page: str) -> dict:
    path = built_html / f"{page}.html"
    html = path.read_text()
    images = {(path.parent / src).resolve() for src in IMAGE.findall(html)}
    image_bytes = sum(p.stat().st_size for p in images if p.is_file())
    return {"html": path.stat().st_size, "images": image_bytes, "total": path.stat().st_size + image_bytes}


def test_every_chapter_page_is_at_most_3_mb(built_html, artifacts):
    weights = {page: _weight(built_html, page) for page in toc_pages()}
    shared = sum(p.stat().st_size for p in (built_html / "_static").rglob("*") if p.is_file())
    report = {"limit_bytes": LIMIT, "pages": weights, "shared_static_bytes_counted_once": shared}
    (artifacts / "page_weights.json").write_text(json.dumps(report, indent=1))
    print(json.dumps(report, indent=1))
    heavy = {p: w["total"] for p, w in weights.items() if p in chapter_pages() and w["total"] > LIMIT}
    assert heavy == {}, f"pages over {LIMIT} bytes: {heavy}"
    assert all(w["total"] > 0 for w in weights.values())
