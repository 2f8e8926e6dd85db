"""Figure builders of chapter 11: the block-table figure draws the cache's real tables and slots; the
utilisation figure draws the simulation's numbers."""

import pytest
import torch

from selfattn.inference.paged import PagedKVCache, simulate_memory_utilisation
from selfattn.viz import figure_description
from selfattn.viz.paged import block_table_data, block_table_figure, utilisation_figure


@pytest.fixture
def cache():
    c = PagedKVCache(10, 4, 1, 2, dtype=torch.float64)
    for s, n in (("a", 3), ("b", 5), ("a", 4), ("c", 2), ("b", 1)):
        c.append(s, torch.zeros(1, n, 2, dtype=torch.float64), torch.zeros(1, n, 2, dtype=torch.float64))
    return c  # a: 7 tokens in blocks [0, 3]; b: 6 in [1, 2]; c: 2 in [4]


def test_block_table_traces_are_the_cache_tables_and_slots(cache):
    fig = block_table_figure(cache)
    tables = {t.name.removeprefix("sequence "): list(t.customdata) for t in fig.data
              if t.name.startswith("sequence ") and not t.name.endswith("tokens")}
    assert tables == {s: cache.block_table(s) for s in cache.sequences} == {"a": [0, 3], "b": [1, 2], "c": [4]}
    tokens = {t.name.split()[1]: list(zip(t.x, t.y, strict=True)) for t in fig.data if t.name.endswith("tokens")}
    assert tokens["a"] == [(0, 0), (0, 1), (0, 2), (0, 3), (3, 0), (3, 1), (3, 2)]
    assert tokens["c"] == [(4, 0), (4, 1)]
    empty = next(t for t in fig.data if t.name == "empty slot")
    # 10 blocks x 4 slots = 40; 7 + 6 + 2 = 15 hold a token
    assert len(empty.x) == 25 and (3, 3) in set(zip(empty.x, empty.y, strict=True))
    desc = figure_description(fig)
    assert "15 tokens fill 20 allocated slots (75.0%)" in desc


def test_block_table_figure_of_some_sequences_leaves_the_others_blocks_out_of_empty(cache):
    fig = block_table_figure(cache, ["a"])
    empty = next(t for t in fig.data if t.name == "empty slot")
    assert len(empty.x) == 40 - 4 * 5 + 1  # a's last free slot; b's and c's blocks are neither
    assert block_table_data(cache, ["a"])["owner"][:5] == ["a", "b", "b", "a", "c"]
    with pytest.raises(KeyError):
        block_table_figure(cache, ["z"])
    with pytest.raises(TypeError, match="cache must be a selfattn.inference.paged.PagedKVCache"):
        block_table_figure(object())


def test_utilisation_figure_shows_the_simulation_numbers():
    fig = utilisation_figure(block_sizes=(1, 16, 256))
    util, fit = fig.data
    sims = {b: simulate_memory_utilisation(block_size=b) for b in (1, 16, 256)}
    assert list(util.x) == ["reserve max_len", "paged, b=1", "paged, b=16", "paged, b=256"]
    assert list(util.y) == [round(100 * sims[1].utilisation_preallocated, 2)] + [
        round(100 * sims[b].utilisation_paged, 2) for b in (1, 16, 256)]
    assert util.y[1] == 100.0 and util.y[1] >= util.y[2] >= util.y[3] > util.y[0]
    assert list(fit.y) == [16] + [sims[b].fit_paged for b in (1, 16, 256)]
    assert "reserving 2048 slots each fills" in figure_description(fig)
