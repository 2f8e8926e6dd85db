"""``compare_times``: the symmetric three-way comparison that picks chapter 10's sentence about SDPA
against the tiled loop's matrix products (review 13, S2: the old test `sdpa < 1.5 x products` called
an SDPA ten times faster "close")."""

from __future__ import annotations

import math

import pytest

from selfattn.efficient.experiments import compare_times


@pytest.mark.parametrize(("time", "reference", "expected"), [
    (10.0, 100.0, "less"),  # ten times faster: not "close"
    (84.0, 100.0, "less"),
    (86.0, 100.0, "about the same"),
    (100.0, 100.0, "about the same"),
    (114.0, 100.0, "about the same"),
    (116.0, 100.0, "more"),
    (1000.0, 100.0, "more"),
])
def test_each_case_is_chosen_by_the_ratio(time, reference, expected):
    assert compare_times(time, reference) == expected


def test_the_cases_are_symmetric_in_the_unit_and_follow_within():
    # 147 / 171 = 0.86, the review's measurement: the same answer in seconds or milliseconds
    assert compare_times(0.147, 0.171) == compare_times(147.0, 171.0) == "about the same"
    assert compare_times(147.0, 171.0, within=0.1) == "less"
    assert compare_times(171.0, 147.0, within=0.1) == "more"  # 1.16


@pytest.mark.parametrize("bad", [0.0, -1.0, math.nan, math.inf, "1"])
def test_bad_times_are_refused(bad):
    with pytest.raises(ValueError, match="must be a positive finite number"):
        compare_times(bad, 1.0)
    with pytest.raises(ValueError, match="must be a positive finite number"):
        compare_times(1.0, bad)


def test_within_must_be_a_fraction():
    with pytest.raises(ValueError, match=r"within must be in \[0, 1\)"):
        compare_times(1.0, 1.0, within=1.0)
