"""testbed_core/planning/collisions.py: the collision probe's rounds as shares of the
crowded total, and the prediction as the draw nearest the mean of several; numbers
checked by hand."""

from __future__ import annotations

import pytest

from testbed_core.planning.collisions import COLLISION_DRAWS, drawn, round_shares, splits
from testbed_core.schedules import build_schedule
from testbed_core.simulate import Path, Resource, SimResult, SimSpec, simulate

MIB8 = 8 * 2**20  # 67.1 Mbit


def test_each_round_gives_the_share_of_the_channel_that_ended_first() -> None:
    """Two channels each way, two rounds, 25 ms one way, 700 Mbit/s crowded: round one
    ends at 0.1659 s (wire 0.1409 s: 476 Mbit/s, 0.68) and 0.2 s, round two both at
    0.2167 s (wire 0.1917: 350 Mbit/s, 0.50); the way back: in round one a channel at
    twice the total's pace (share 1 at most), in round two both below it (0.3 s: 0.5)."""
    way = [0.1659, 0.2167, 0.2, 0.2167]  # channel 0's two rounds, then channel 1's
    back = [0.3, 0.3, 0.025 + 67.108864e6 / 1.6e9, 0.5]
    ahead, behind = round_shares(way + back, 2, MIB8, 0.025, 7e8)
    assert ahead == pytest.approx((0.680, 0.500), abs=2e-3)
    assert behind == (1.0, 0.5)


def test_no_shares_where_no_collision_of_two_was_timed() -> None:
    assert round_shares([0.2] * 12, 3, MIB8, 0.025, 7e8) == ((), ())  # three channels: no split modelled
    assert round_shares([], 2, MIB8, 0.025, 7e8) == ((), ())
    assert round_shares([0.2] * 6, 2, MIB8, 0.025, 7e8) == ((), ())  # not whole rounds each way
    assert round_shares([0.2] * 8, 2, MIB8, 0.025, 0.0) == ((), ())


def _two_pipelines(shares: tuple[float, ...]) -> SimSpec:
    """Two GPipe pipelines of 2 stages and 4 micro-batches whose boundaries share one
    crowded link each way (1.25 MB tensors, 10 ms alone at 1 Gbit/s)."""
    s = build_schedule("gpipe", 2, 4)
    paths = {(d, 0, dr): Path((f"l-{dr}",), 0.005) for d in range(2) for dr in ("fwd", "bwd")}
    res = {f"l-{dr}": Resource(1e9, crowded_bps=8e8, split_shares=shares) for dr in ("fwd", "bwd")}
    return SimSpec(s, 2, [0.02, 0.02], [0.03, 0.03], [1_250_000], [1_250_000], paths, res)


def test_the_prediction_is_the_draw_nearest_the_mean_of_the_draws() -> None:
    spec = _two_pipelines((0.55, 0.7, 0.9))
    calls: list[int] = []

    def counting(s: SimSpec) -> SimResult:
        calls.append(s.seed)
        return simulate(s)

    chosen = drawn(counting, spec)
    assert calls == list(range(COLLISION_DRAWS))
    spans = [simulate(_seeded(spec, k)).makespan for k in range(COLLISION_DRAWS)]
    mean = sum(spans) / len(spans)
    assert abs(chosen.makespan - mean) == pytest.approx(min(abs(m - mean) for m in spans))
    assert drawn(simulate, spec).makespan == chosen.makespan  # the same spec, the same prediction
    assert list(chosen.draws_s) == spans
    assert len(set(spans)) > 1  # the draws differ
    even = simulate(_two_pipelines(()))
    assert chosen.makespan < even.makespan  # pipelines that drift apart collide less


def _seeded(spec: SimSpec, seed: int) -> SimSpec:
    from dataclasses import replace

    return replace(spec, seed=seed)


def test_one_simulation_where_no_link_splits() -> None:
    calls: list[int] = []

    def counting(s: SimSpec) -> SimResult:
        calls.append(s.seed)
        return simulate(s)

    spec = _two_pipelines(())
    assert not splits(spec)
    drawn(counting, spec)
    assert calls == [0]
    exclusive = _two_pipelines((0.7,))
    exclusive.resources = {k: Resource(1e9, "exclusive", split_shares=(0.7,)) for k in exclusive.resources}
    assert not splits(exclusive)  # one transfer at a time: nothing to split
