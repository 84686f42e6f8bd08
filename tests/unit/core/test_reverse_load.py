"""testbed_core/planning/reverse_load.py: how much a path's transfers overlap the other
way's in a simulated iteration, and the channel rate that gives between the rate probe's
figure (both ways busy) and the one-way figure."""

from __future__ import annotations

import pytest

from testbed_core.planning.placement import Placement
from testbed_core.planning.reverse_load import reverse_loads, weighed_one_way
from testbed_core.schedules import build_schedule
from testbed_core.simulate import SimResult, TransferKey, TransferSpan


def _placement(*stage_dc: tuple[str, ...]) -> Placement:
    pp = len(stage_dc[0])
    hosts = {(d, s): (f"{dc}-h1",) for d, row in enumerate(stage_dc) for s, dc in enumerate(row)}
    return Placement("even", pp, len(stage_dc), 1, tuple(stage_dc), hosts, {})


def _sim(*spans: tuple[int, int, str, float, float]) -> SimResult:
    """Transfers (pipeline, boundary, direction, start, end) of one iteration."""
    ts = [TransferSpan(TransferKey(p, b, 0, d), s, s, e, e, 1.0, ()) for p, b, d, s, e in spans]  # type: ignore[arg-type]
    return SimResult(max(t.end for t in ts), [], ts, 2, 3)


def test_ways_taking_turns_have_load_zero_and_together_one() -> None:
    pl = _placement(("a", "a", "b", "b"))
    sched = build_schedule("1f1b", 4, 2)
    turns = _sim((0, 1, "fwd", 0, 1), (0, 1, "bwd", 1, 2), (0, 1, "fwd", 2, 3))
    assert reverse_loads(turns, sched, pl) == {frozenset("ab"): 0.0}
    together = _sim((0, 1, "fwd", 0, 1), (0, 1, "bwd", 0, 1))
    assert reverse_loads(together, sched, pl) == {frozenset("ab"): 1.0}
    # 1 s of 2 + 1 s of wire time each way is shared: 2 x 1 / 3
    half = _sim((0, 1, "fwd", 0, 2), (0, 1, "bwd", 1, 2))
    assert reverse_loads(half, sched, pl)[frozenset("ab")] == pytest.approx(2 / 3)
    # transfers inside a DC are no path's
    inside = _sim((0, 0, "fwd", 0, 1), (0, 0, "bwd", 0, 1))
    assert reverse_loads(inside, sched, pl) == {}


def test_the_rate_lies_between_the_two_figures_by_time() -> None:
    assert weighed_one_way(700e6, 840e6, 1.0) == pytest.approx(700e6)
    assert weighed_one_way(700e6, 840e6, 0.0) == pytest.approx(840e6)
    # half the time at each: the harmonic mean
    assert weighed_one_way(700e6, 840e6, 0.5) == pytest.approx(2 / (1 / 700e6 + 1 / 840e6))
    # no one-way figure, or one below the probe's: the probe's figure
    assert weighed_one_way(700e6, None, 0.0) == 700e6
    assert weighed_one_way(700e6, 650e6, 0.0) == 700e6
