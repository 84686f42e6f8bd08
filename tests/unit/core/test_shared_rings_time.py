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


def test_a_ring_alone_is_held_to_its_windows_per_round_trip() -> None:
    """`window_rate`: a path whose channel rate was measured (5e8 bit/s with tensors of
    a window or less) carries a long transfer at most streams x window per RTT: one
    stream of a 256 KiB window over 20 ms is 262144 x 8 / 0.02 = 104.8576 Mbit/s; two
    streams twice that; where the rate is the window model's own, that rate."""
    from testbed_core.planning.network import WanPath
    from testbed_core.planning.prediction import window_rate

    def path(streams: int, measured: bool) -> WanPath:
        return WanPath("a", "b", ("a", "b"), ("wan:a->b",), 0.01, 1e9, 5e8 if measured else 4e7, streams,
                       window_bytes=262144, measured=measured)

    assert window_rate(path(1, True)) == pytest.approx(104.8576e6)
    assert window_rate(path(2, True)) == pytest.approx(2 * 104.8576e6)
    assert window_rate(path(1, False)) == pytest.approx(4e7)
    # the rings of unequal stages, each held to its window: with 4 rings measured at
    # 5.2e8 in all, a ring alone gets at least its share with all running (1.3e8), so the
    # largest (2.8e8 bits) takes 2.8e8 / 1.3e8 s whatever the smaller ones do
    assert shared_rings_time([2.6e8] * 3 + [2.8e8], 5.2e8, 104.8576e6) == pytest.approx(2.8e8 / 1.3e8)
