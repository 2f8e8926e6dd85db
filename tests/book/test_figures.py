"""Every figure a notebook makes is rendered in the built HTML, and plotly.js is served locally.

plotly 6+ emits only its JSON mimetype in a kernel, which Jupyter Book 1 drops silently; the
`selfattn` renderer adds an HTML div. This test counts, for every chapter, the plotly figures in
the executed notebook and the figure divs in its page: they must be equal and non-zero.
"""

from __future__ import annotations

import json
import re

import pytest

from .conftest import BUILD, ROOT

PLOTLY_MIME = "application/vnd.plotly.v1+json"
# The figure div as real markup (inside a widget's JSON state the quotes are escaped and it does not match).
DIV = re.compile(r'<div id="selfattn-fig-[0-9a-f]{12}" class="plotly-graph-div"')
NOTEBOOKS = sorted(p.stem for p in (ROOT / "notebooks").glob("*.ipynb"))


def _executed(stem: str) -> dict:
    path = BUILD / "jupyter_execute" / "notebooks" / f"{stem}.ipynb"
    assert path.is_file(), f"no executed copy of {stem} at {path}"
    return json.loads(path.read_text())


def _figure_outputs(nb: dict) -> list[dict]:
    return [
        out
        for cell in nb["cells"] if cell["cell_type"] == "code"
        for out in cell.get("outputs", [])
        if PLOTLY_MIME in out.get("data", {})
    ]


@pytest.mark.parametrize("stem", NOTEBOOKS)
def test_every_notebook_figure_is_rendered(built_html, stem):
    figures = _figure_outputs(_executed(stem))
    assert len(figures) >= 1, f"{stem} makes no plotly figure"
    missing_html = [i for i, out in enumerate(figures) if "text/html" not in out["data"]]
    assert missing_html == [], f"figures {missing_html} of {stem} have no HTML (blank in the book)"
    page = (built_html / "notebooks" / f"{stem}.html").read_text()
    assert len(DIV.findall(page)) == len(figures)


@pytest.mark.parametrize("stem", NOTEBOOKS)
def test_a_static_figure_is_explorable(built_html, stem):
    """At least one figure per chapter has sliders, buttons or frames: it responds with no kernel."""
    figures = _figure_outputs(_executed(stem))
    explorable = [
        f for f in figures
        if f["data"][PLOTLY_MIME].get("frames")
        or f["data"][PLOTLY_MIME].get("layout", {}).get("sliders")
        or f["data"][PLOTLY_MIME].get("layout", {}).get("updatemenus")
    ]
    assert explorable, f"{stem} has no figure with a slider, button or frames"


def test_plotly_js_is_served_by_the_book(built_html):
    served = built_html / "_static" / "selfattn-vendor" / "plotly.min.js"
    assert served.is_file() and served.stat().st_size > 1_000_000
    for stem in NOTEBOOKS:
        page = (built_html / "notebooks" / f"{stem}.html").read_text()
        scripts = re.findall(r'<script[^>]*src="([^"]+)"', page)
        assert any("selfattn-vendor/plotly.min.js" in s for s in scripts), stem
        assert not any("cdn.plot.ly" in s for s in scripts), stem
        # plotly.js must load before require.js, or it registers as an AMD module and window.Plotly is undefined
        order = [i for i, s in enumerate(scripts) if "plotly.min.js" in s or "require" in s]
        assert order == sorted(order) and "plotly.min.js" in scripts[order[0]], stem
