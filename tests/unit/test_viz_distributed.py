"""selfattn.viz.distributed: the ring schedule shows the block each rank holds at each step and whether it
is computed or skipped; the work figure draws the pairs counted here from the positions."""

from __future__ import annotations

import numpy as np
import pytest

from selfattn.viz import figure_description
from selfattn.viz.distributed import STATES, causal_work_figure, ring_schedule, ring_schedule_figure


def test_ring_schedule_holds_and_states_follow_the_ring():
    holds, pairs, states = ring_schedule(16, 4, "contiguous")
    assert holds[1] == [3, 0, 1, 2]  # at step 1 rank r holds the block of rank r - 1
    assert pairs == [[10, 0, 0, 0], [16, 10, 0, 0], [16, 16, 10, 0], [16, 16, 16, 10]]  # n = 4: 4 * 5 / 2 on the diagonal
    assert np.isnan(states[0][0, 1]) and states[0][0, 0] == 1  # step 0: own block, some pairs (the diagonal)
    assert states[1][0, 3] == 2 and states[1][1, 0] == 0  # rank 0 skips block 3; rank 1 computes block 0 whole
    assert states[3][0, 3] == 4 and states[3][1, 0] == 3 and not np.isnan(states[3]).any()
    _, zig, zstates = ring_schedule(16, 4, "zigzag")
    assert [sum(row) for row in zig] == [34] * 4 and not np.isin(zstates[-1], (2, 4)).any()  # nothing skipped
    _, full, _ = ring_schedule(16, 4, "contiguous", causal=False)
    assert full == [[16] * 4] * 4


def test_ring_schedule_figure_has_a_slider_over_the_steps_and_a_legend_per_state():
    fig = ring_schedule_figure(T=16, P=4)
    assert len(fig.frames) == 4 and [s.label for s in fig.layout.sliders[0].steps] == ["0", "1", "2", "3"]
    assert len(fig.data) == 2 and all(st in fig.layout.annotations[-1].text for st in STATES)  # the key, as text
    last = np.array(fig.frames[-1].data[0].z, dtype=float)  # contiguous, after the last step
    assert int(np.isin(last, (2, 4)).sum()) == 6  # P (P - 1) / 2 blocks above the diagonal skipped
    assert fig.frames[0].data[1].text[0][0] == "10"  # zigzag rank 0, own block (positions 0, 1, 14, 15): 1 + 2 + 3 + 4
    text = figure_description(fig)
    assert "contiguous: 6 of 16 (rank, block) pairs skipped, visible pairs per rank [10, 26, 42, 58]" in text
    assert "zigzag: 0 of 16" in text and "[34, 34, 34, 34]" in text
    with pytest.raises(ValueError, match="divisible by 8; got T=12"):
        ring_schedule_figure(T=12, P=4)


def test_causal_work_figure_draws_the_pairs_of_each_rank():
    fig = causal_work_figure(32, 4)
    assert list(fig.data[0].y) == [36, 100, 164, 228] and list(fig.data[1].y) == [132] * 4
    assert "max/mean 1.727" in fig.data[0].name and "max/mean 1.000" in fig.data[1].name
    assert "mean 132" in figure_description(fig)
