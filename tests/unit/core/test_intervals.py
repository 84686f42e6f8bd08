"""testbed_core/intervals.py: merging, covered length and overlap of time intervals."""

from __future__ import annotations

import pytest

from testbed_core.intervals import covered, overlap, union


def test_union_merges_overlapping_and_touching_intervals_and_drops_empty_ones() -> None:
    assert union([(3, 4), (0, 1), (0.5, 2), (2, 2.5), (5, 5)]) == [(0, 2.5), (3, 4)]
    assert union([]) == []
    assert union([(2, 1)]) == []  # reversed: empty


def test_covered_counts_shared_time_once() -> None:
    assert covered([(0, 2), (1, 3), (5, 6)]) == pytest.approx(4.0)
    assert covered([]) == 0.0


def test_overlap_is_the_time_two_merged_lists_share() -> None:
    assert overlap([(0, 2), (3, 5)], [(1, 4)]) == pytest.approx(2.0)
    assert overlap([(0, 1)], [(1, 2)]) == 0.0
    assert overlap([], [(0, 9)]) == 0.0
