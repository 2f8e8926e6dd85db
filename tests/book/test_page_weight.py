"""Page weight: each chapter page is at most 3 MB with its figure data (issue 6).

How it is counted: a page's weight is the size in bytes of its HTML file, which holds its figures'
JSON (inline, in the renderer's ``<script>``) and its widgets' saved state, plus the files only that
page loads (images under ``_images/`` it shows). Scripts, style sheets and fonts under ``_static/``
(plotly.min.js, MathJax, require.js, the widget manager, the theme) are shared by every page and
cached by the browser after the first, so they are counted once for the whole book, not per page;
their total is reported, not limited. The table is written to ``test-artifacts/page_weights.json``.

The live model of chapter 14 (issue 17): the model itself (ONNX, base64), its vocabulary and the
build-time values the browser test compares with are inline in the capstone page's HTML, so they
count against that page's 3 MB. The runtime (onnxruntime-web: its script and the wrapped WebAssembly
binary) is a shared static file under ``_static/selfattn-vendor/onnxruntime-web/`` that only that page
loads; it is reported beside the page (page + runtime = what a first visit downloads for the model)
and capped a little above its measured size, so that an upgrade that bloats it fails here.
"""

from __future__ import annotations

import json
import re

from .browser_support import chapter_pages, toc_pages

LIMIT = 3_000_000  # bytes (3 MB)
LIVE_PAGE = "notebooks/14_capstone_gpt"
LIVE_RUNTIME = ["onnxruntime-web/dist/ort.wasm.min.js", "onnxruntime-web/ort-wasm-embedded.js"]
# onnxruntime-web 1.30.0 measured 4,945,631 bytes (50,196 + 4,895,435); about 5 % of headroom.
RUNTIME_LIMIT = 5_200_000
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


def test_the_live_model_page_and_its_runtime(built_html, artifacts):
    page = _weight(built_html, LIVE_PAGE)
    html = (built_html / f"{LIVE_PAGE}.html").read_text()
    start = html.index('<script type="application/json" class="selfattn-livemodel-onnx">')
    model_b64 = len(html[start:html.index("</script>", start)].split(">", 1)[1].strip('"'))
    vendor = built_html / "_static" / "selfattn-vendor"
    runtime = {rel: (vendor / rel).stat().st_size for rel in LIVE_RUNTIME}
    report = {"page": LIVE_PAGE, "page_bytes": page["total"], "model_base64_bytes_in_page": model_b64,
              "runtime_bytes": runtime, "runtime_total_bytes": sum(runtime.values()),
              "page_plus_runtime_bytes": page["total"] + sum(runtime.values()),
              "page_limit_bytes": LIMIT, "runtime_limit_bytes": RUNTIME_LIMIT}
    path = artifacts / "page_weights.json"
    table = json.loads(path.read_text()) if path.is_file() else {}
    table["live_model"] = report
    path.write_text(json.dumps(table, indent=1))
    print(json.dumps(report, indent=1))
    assert 100_000 < model_b64 < page["total"] <= LIMIT, report
    assert 0 < sum(runtime.values()) <= RUNTIME_LIMIT, report
