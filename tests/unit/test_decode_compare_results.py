"""The committed results of bench/decode_compare.py (issue 30 item 3), as chapter 11 reads them: the newest
bench/results/decode-compare-*.json has every engine, size, batch and context, finite positive numbers and
the three verdict lines; its figure shows them. Structure only: no timing is asserted (speed is measured by
the bench itself, never by a test)."""

import json
import math
import sys
from pathlib import Path

import pytest

from selfattn.viz.inference import decode_compare_figure, find_decode_compare

ROOT = Path(__file__).resolve().parents[2]
ENGINES = ["course eager", "course compiled", "HF dynamic", "HF static"]
SIZES = {"capstone": (64, 4, 2), "gpt2-small": (768, 12, 12)}  # d_model, n_heads, n_layers
CONTEXTS = [128, 512, 1024, 2048, 4096]


@pytest.fixture(scope="module")
def record():
    path = find_decode_compare(ROOT)
    assert path is not None and path.parent == ROOT / "bench" / "results", path
    assert path.with_suffix(".md").exists()
    return json.loads(path.read_text())


def test_every_engine_size_batch_and_context_is_there_with_finite_positive_numbers(record):
    assert record["engines"] == ENGINES
    assert record["batches"] == [1, 8]
    assert record["contexts"] == CONTEXTS
    assert set(record["sizes"]) == set(SIZES)
    for name, (d_model, n_heads, n_layers) in SIZES.items():
        size = record["sizes"][name]
        assert (size["d_model"], size["n_heads"], size["n_layers"]) == (d_model, n_heads, n_layers)
        for batch in ("1", "8"):
            for engine in ENGINES:
                seconds = record["seconds_per_step"][name][batch][engine]
                tps = record["tokens_per_second"][name][batch][engine]
                assert len(seconds) == len(tps) == len(CONTEXTS)
                assert all(math.isfinite(s) and s > 0 for s in seconds), (name, batch, engine, seconds)
                # tokens per second is the batch over the step's seconds (to rounding of the JSON floats)
                for s, t in zip(seconds, tps, strict=True):
                    assert t == pytest.approx(int(batch) / s, rel=1e-12)


def test_the_header_names_the_machine_versions_and_load(record):
    meta = record["meta"]
    for key in ("cpu", "isa", "torch", "transformers", "threads", "load_start", "load_end", "rounds", "steps"):
        assert key in meta, key
    assert meta["threads"] >= 1 and math.isfinite(meta["load_start"]) and math.isfinite(meta["load_end"])
    md = find_decode_compare(ROOT).with_suffix(".md").read_text()
    assert "1-minute load average" in md and "vector ISA" in md and "transformers" in md
    assert "random keys and values" in md  # the caches are filled, not prefilled: said in the header


def test_three_verdicts_each_met_or_missed_with_numbers(record):
    verdicts = record["verdicts"]
    assert set(verdicts) == {"a", "b", "c"}
    for key, v in verdicts.items():
        word = "MET" if v["met"] else "MISSED"
        assert f": {word};" in v["text"], (key, v["text"])
        assert any(ch.isdigit() for ch in v["text"].split(word, 1)[1]), v["text"]  # the numbers follow
    md = find_decode_compare(ROOT).with_suffix(".md").read_text()
    for key in "abc":
        assert f"- ({key}) " in md


def test_the_figure_has_one_view_per_size_and_batch_with_the_files_numbers(record):
    fig = decode_compare_figure(record)
    assert len(fig.data) == len(SIZES) * 2 * len(ENGINES)
    assert len(fig.layout.updatemenus[0].buttons) == len(SIZES) * 2
    first = fig.data[0]  # capstone, batch 1, course eager: shown first
    assert first.visible is True and list(first.x) == CONTEXTS
    assert list(first.y) == record["tokens_per_second"]["capstone"]["1"]["course eager"]


def test_verdicts_read_the_numbers():
    """The verdict logic on made-up step times: eager faster than transformers everywhere, within 1.5x of the
    compiled step, flat until the cache's bytes pass the weights'."""
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import decode_compare as dc
    finally:
        sys.path.pop(0)
    contexts = [128, 512, 1024, 2048, 4096]
    flat = [1e-3] * 5
    seconds = {"capstone": {B: {"course eager": flat, "course compiled": [0.8e-3] * 5, "HF dynamic": [2e-3] * 5,
                                "HF static": [1.5e-3] * 5} for B in (1, 8)}}
    v = dc.verdicts(seconds, contexts)
    assert v["a"]["met"] and v["b"]["met"] and v["c"]["met"]
    assert "1.50x HF static" in v["a"]["text"] and "1.25x" in v["b"]["text"]
    seconds["capstone"][1]["HF static"] = [1.5e-3] * 4 + [0.9e-3]  # transformers faster at 4096
    seconds["capstone"][8]["course compiled"] = [0.5e-3] * 5  # eager 2x the compiled step
    # GPT-2 small at batch 1: its cache (302 MB at 4096) stays below its weights (~0.6 GB), so a step that
    # grows by 1.3x at 512 is not flat where reading the cache does not dominate
    seconds["gpt2-small"] = {1: {**seconds["capstone"][8], "course compiled": [0.8e-3] * 5,
                                 "course eager": [1e-3, 1.3e-3, 1.3e-3, 1.3e-3, 1.3e-3]}}
    v = dc.verdicts(seconds, contexts)
    assert not v["a"]["met"] and "batch 1, context 4096" in v["a"]["text"]
    assert not v["b"]["met"] and "2.00x (batch 8" in v["b"]["text"]
    assert not v["c"]["met"] and "gpt2-small batch 1: 1.30x" in v["c"]["text"]
    assert "first above 1.2x at context 512; the cache's bytes pass the weights' at no context measured" in v["c"]["text"]
