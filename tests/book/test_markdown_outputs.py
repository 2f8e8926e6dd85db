"""Markdown that a chapter generates (display(Markdown(...))) is rendered: its tables are tables and
its maths is maths, not raw `| ... |` rows and `$T = 4096$` (issue 31, item 1).

MyST-NB parses text/markdown outputs as CommonMark unless told otherwise (no tables, no dollar
maths); _config.yml sets `nb_render_markdown_format: myst`. The test reads each chapter page's cell
outputs, outside code, preformatted text, scripts and rendered maths.
"""

from __future__ import annotations

import re

import pytest
from bs4 import BeautifulSoup

from .browser_support import chapter_pages

TABLE_ROW = re.compile(r"^\s*\|.*\|\s*$", re.MULTILINE)
RAW_MATH = re.compile(r"(?<![\\$])\$[^$\s][^$]*?\$")
# Tables each chapter generates from its measurements (chapter 09: seven bench tables, 10: the number
# formats of the systems primer, read from torch.finfo; 13: one summary).
# Chapter 09: the dependency-depth table and four of the benchmark's tables (its sliding-window/flex and
# heads-split tables moved out: they show chapter 10's methods, issue 26's order).
# Chapter 10: also the block-size Lab notes' measurements (a Markdown table since issue 31's trial: as a
# fixed-width text block it ran 643 px past the column at 1280 px).
GENERATED_TABLES = {"notebooks/09_parallel_and_quadratic": 5, "notebooks/10_flash_attention": 2,
                    "notebooks/13_attention_explanations": 1}


def _outputs(built_html, page: str):
    soup = BeautifulSoup((built_html / f"{page}.html").read_text(), "html.parser")
    outputs = soup.select("div.cell_output")
    for out in outputs:
        for node in out.select("pre, code, script, style, .math, mjx-container, .plotly-graph-div"):
            node.decompose()
    return outputs


@pytest.mark.parametrize("page", chapter_pages())
def test_generated_markdown_is_rendered(built_html, page):
    raw_rows, raw_math = [], []
    for out in _outputs(built_html, page):
        text = out.get_text("\n")
        raw_rows += TABLE_ROW.findall(text)
        raw_math += RAW_MATH.findall(text)
    assert raw_rows == [], f"{len(raw_rows)} table rows printed as text, e.g. {raw_rows[:2]}"
    assert raw_math == [], f"maths printed as text: {raw_math[:5]}"


@pytest.mark.parametrize("page", sorted(GENERATED_TABLES))
def test_generated_tables_are_html_tables(built_html, page):
    tables = [t for out in _outputs(built_html, page) for t in out.find_all("table")]
    assert len(tables) >= GENERATED_TABLES[page]
    for t in tables:
        assert t.find("th") is not None and len(t.find_all("tr")) >= 2


def test_generated_maths_is_typeset_source(built_html):
    """Chapter 10's generated prose carries its maths as MathJax source (a .math element)."""
    soup = BeautifulSoup((built_html / "notebooks/10_flash_attention.html").read_text(), "html.parser")
    maths = [m.get_text() for out in soup.select("div.cell_output") for m in out.select(".math")]
    assert any(re.search(r"T\s*=\s*\d", m) for m in maths), maths[:5]


def test_chapter_10_lab_notes_hold_tables_not_text_columns(built_html):
    """Issue 31: the block-size Lab notes' measurements are an HTML table inside the folded box, not a
    preformatted block of aligned columns (it ran 643 px past the column at 1280 px)."""
    soup = BeautifulSoup((built_html / "notebooks/10_flash_attention.html").read_text(), "html.parser")
    notes = [d for out in soup.select("div.cell_output") for d in out.select("details.selfattn-labnotes")]
    assert notes, "no Lab notes box in chapter 10's outputs"
    assert [d for d in notes if d.find("pre")] == [], "a Lab notes box holds preformatted text columns"
    heads = [[th.get_text(" ", strip=True) for th in t.find_all("th")] for d in notes for t in d.find_all("table")]
    assert any("block" in h and "tiles" in h for h in heads), heads
