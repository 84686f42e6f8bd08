"""`shared_rings_time` (testbed_core/planning/prediction.py): DP rings of unequal
stages that share one WAN link, with what they moved together measured; closed forms."""

from __future__ import annotations

import pytest

from testbed_core.planning.prediction import shared_rings_time


def test_equal_rings_take_the_measured_time() -> None:
    """The calibration's probe runs every ring with the largest stage's bytes: equal
    rings take exactly rings x bits / aggregate, whatever one ring moves alone."""
    assert shared_rings_time([8e8] * 5, 2e8, 3e7) == pytest.approx(5 * 8e8 / 2e8)
    assert shared_rings_time([8e8] * 5, 2e8, 9e9) == pytest.approx(5 * 8e8 / 2e8)


def test_the_largest_ring_ends_alone_at_one_rings_rate() -> None:
    """Four rings of 4e8 bits and one of 5e8, 1.6e8 in all, 5e7 for one ring alone: all
    five at 3.2e7 until the four end (12.5 s), then the last 1e8 bits at 5e7 (2 s), where
    one aggregate for every bit would say 2.1e9 / 1.6e8 = 13.1 s."""
    assert shared_rings_time([4e8] * 4 + [5e8], 1.6e8, 5e7) == pytest.approx(12.5 + 2.0)
    # one ring alone slower than its share with all running: capped at that share (3.2e7)
    assert shared_rings_time([4e8] * 4 + [5e8], 1.6e8, 1e7) == pytest.approx(5e8 / 3.2e7)
    # one ring alone could take the whole aggregate: the total over the aggregate
    assert shared_rings_time([4e8] * 4 + [5e8], 1.6e8, 1e12) == pytest.approx(2.1e9 / 1.6e8)


def test_no_ring_takes_no_time() -> None:
    assert shared_rings_time([], 1e8, 1e7) == 0.0
