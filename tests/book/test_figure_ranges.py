"""Every figure's axes cover its data only (issue 31, item 2).

Chapter 10's "time against block size" and chapter 11's "loss per position ... sinks" ran their
x axes to 1e63 and 1e77: their vertical lines were labelled with annotations placed in data units
on log axes, where an annotation's coordinate is log10 of the value. The check
(tests/figure_extent.py) reads every plotly figure of every executed chapter and fails on a shape
or annotation of an autoranged axis outside that axis's data (10% of its span as padding).
"""

from __future__ import annotations

import json

import pytest

from ..figure_extent import data_extent, stray_marks
from .conftest import BUILD, ROOT

PLOTLY_MIME = "application/vnd.plotly.v1+json"
NOTEBOOKS = sorted(p.stem for p in (ROOT / "notebooks").glob("*.ipynb"))


def _figures(stem: str) -> list[dict]:
    path = BUILD / "jupyter_execute" / "notebooks" / f"{stem}.ipynb"
    assert path.is_file(), f"no executed copy of {stem} at {path}"
    nb = json.loads(path.read_text())
    return [out["data"][PLOTLY_MIME] for cell in nb["cells"] if cell["cell_type"] == "code"
            for out in cell.get("outputs", []) if PLOTLY_MIME in out.get("data", {})]


@pytest.mark.parametrize("stem", NOTEBOOKS)
def test_no_mark_stretches_an_axis_beyond_its_data(built_html, stem):
    problems = []
    for i, fig in enumerate(_figures(stem)):
        title = ((fig.get("layout") or {}).get("title") or {})
        title = title.get("text", "") if isinstance(title, dict) else str(title)
        problems += [f"figure {i} ({title!r}): {p}" for p in stray_marks(fig)]
    assert problems == []


def test_the_two_figures_of_the_issue_are_checked(built_html):
    """The check sees the block-size and sinks figures' log x axes and their data (it cannot pass by skipping them)."""
    wanted = {"10_flash_attention": "time against block size", "11_inference": "Loss per position"}
    for stem, words in wanted.items():
        figs = [f for f in _figures(stem) if words in json.dumps((f.get("layout") or {}).get("title"))]
        assert figs, f"no figure titled ...{words}... in {stem}"
        for fig in figs:
            assert fig["layout"]["xaxis"]["type"] == "log"
            lo, hi = data_extent(fig)["xaxis"]
            assert 0 < lo < hi < 1e6
            assert len(fig["layout"].get("annotations") or []) >= 1
