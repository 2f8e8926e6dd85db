"""One way of numbering layers and heads in the whole course: from 0, as Python indexes them (issue 31's
trial: chapter 15 numbered heads from 0, chapter 14 from 1; chapters 03, 08, 11, 11c and 15 and the
hook names ``blocks.{l}`` counted from 0, chapters 06, 13 and 14, the head explorers and the live
panel from 1).

Two checks: no chapter and no figure or explorer builder writes a layer or head label as an index
plus one (``head {h + 1}``, ``L{layer + 1} H{...}``), and the builders' labels, the explorer's sliders
and the live panel start at 0.
"""

from __future__ import annotations

import inspect
import json
import re
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
# A layer or head label numbered from 1: "head {h + 1}", "Head {i+1}", "layer {layer + 1}",
# "L{l + 1}", "H{head + 1}", "heads {a + 1}" inside an f-string (or a JS template literal: "${h + first}").
FROM_ONE = re.compile(r"(?i)\b(?:heads?|layers?|L|H) ?\$?\{[^{}]*?\+ ?(?:1|first)\b[^{}]*\}")
SOURCES = sorted((ROOT / "notebooks").glob("*.ipynb"))
MODULES = sorted((ROOT / "src" / "selfattn" / "viz").glob("*.py")) + [ROOT / "src" / "selfattn" / "live.py"]


def _cell_sources(path: Path) -> list[str]:
    return ["".join(c["source"]) for c in json.loads(path.read_text())["cells"]]


def test_the_pattern_finds_labels_counted_from_one():
    found = FROM_ONE.findall('f"L{layer + 1} H{h + 1}", f"head {ix[1] + 1}", `Layer ${l + first}`, f"layer {i}"')
    assert found == ["L{layer + 1}", "H{h + 1}", "head {ix[1] + 1}", "Layer ${l + first}"]


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: p.stem)
def test_no_chapter_numbers_layers_or_heads_from_one(path):
    found = [m for source in _cell_sources(path) for m in FROM_ONE.findall(source)]
    assert found == [], f"{path.name} labels layers or heads from 1 (the course counts from 0): {found}"


@pytest.mark.parametrize("path", MODULES, ids=lambda p: p.stem)
def test_no_figure_or_explorer_numbers_layers_or_heads_from_one(path):
    found = FROM_ONE.findall(path.read_text())
    assert found == [], f"{path.name} labels layers or heads from 1 (the course counts from 0): {found}"


def test_builders_explorers_and_the_live_panel_start_at_0():
    from selfattn.live import LivePanel
    from selfattn.viz.heads import (
        head_explorer_widget,
        head_summary_figure,
        layer_head_explorer_figure,
    )
    from selfattn.viz.induction import composition_figure, head_scores_figure

    w = np.full((2, 3, 2, 2), 0.5)
    fig = layer_head_explorer_figure(["a", "b"], w)
    assert fig.frames[0].name == "L0 H0" and fig.frames[-1].name == "L1 H2"
    assert [b.label for b in fig.layout.updatemenus[0].buttons] == ["layer 0", "layer 1"]
    summary = head_summary_figure({"m": np.zeros((2, 3))})
    assert list(summary.data[0].x) == ["H0", "H1", "H2"] and list(summary.data[0].y) == ["L0", "L1"]
    scores = head_scores_figure(np.zeros((2, 3)), np.zeros((2, 3)))
    assert list(scores.data[0].x) == ["head 0", "head 1", "head 2"]
    comp = composition_figure({k: np.zeros((2, 2)) for k in ("keys", "queries", "values")},
                              {k: 0.1 for k in ("keys", "queries", "values")})
    assert list(comp.data[0].x)[0] == "L0 H0 → L1 H0"
    box = head_explorer_widget(lambda s: (["a", "b"], w), "ab")
    assert [(s.value, s.min, s.max) for s in box.children[1].children] == [(0, 0, 1), (0, 0, 2)]
    assert inspect.signature(LivePanel).parameters["count_from"].default == 0
    js = (ROOT / "book" / "_static" / "selfattn-live.js").read_text()
    assert "count_from ?? 0" in js and "count_from ?? 1" not in js
