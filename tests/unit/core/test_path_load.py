"""testbed_core/planning/path_load.py: how busy a placement's other WAN paths keep each
path in a simulated iteration, and the rate that load gives between a path's alone and
together calibration figures."""

from __future__ import annotations

import pytest

from testbed_core.planning.path_load import (
    load_of,
    path_busy,
    path_loads,
    weighed_rate,
)
from testbed_core.planning.placement import Placement
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


def test_transfers_are_grouped_by_the_dc_pair_their_boundary_crosses_either_way() -> None:
    pl = _placement(("a", "b", "c"), ("a", "b", "c"))
    sched = build_schedule("1f1b", 3, 2)
    sim = _sim((0, 0, "fwd", 0, 1), (0, 0, "bwd", 4, 5), (1, 0, "fwd", 0.5, 1.5), (0, 1, "fwd", 2, 3))
    busy = path_busy(sim, sched, pl)
    assert busy == {frozenset("ab"): [(0, 1.5), (4, 5)], frozenset("bc"): [(2, 3)]}


def test_a_path_alone_has_load_zero_and_one_under_busy_others_throughout() -> None:
    pl = _placement(("a", "b", "c"))
    sched = build_schedule("1f1b", 3, 2)
    apart = _sim((0, 0, "fwd", 0, 1), (0, 1, "fwd", 1, 2))
    assert path_loads(apart, sched, pl) == {frozenset("ab"): 0.0, frozenset("bc"): 0.0}
    # b-c busy over half of a-b's time; a-b over all of b-c's
    half = _sim((0, 0, "fwd", 0, 2), (0, 1, "fwd", 1, 2))
    loads = path_loads(half, sched, pl)
    assert loads[frozenset("ab")] == pytest.approx(0.5) and loads[frozenset("bc")] == pytest.approx(1.0)


def test_the_load_counts_how_many_of_the_other_paths_are_busy() -> None:
    pl = _placement(("a", "b", "c", "d"))
    sched = build_schedule("1f1b", 4, 2)
    # over a-b's 2 s: b-c busy 2 s, c-d busy 1 s: 1.5 of 2 other paths on average
    sim = _sim((0, 0, "fwd", 0, 2), (0, 1, "fwd", 0, 2), (0, 2, "fwd", 1, 2))
    assert path_loads(sim, sched, pl)[frozenset("ab")] == pytest.approx(0.75)


def test_one_path_has_no_load_to_weigh() -> None:
    pl = _placement(("a", "b"), ("a", "b"))
    sim = _sim((0, 0, "fwd", 0, 1), (1, 0, "fwd", 0, 1))
    assert path_loads(sim, build_schedule("1f1b", 2, 2), pl) == {}


def test_the_rate_lies_between_the_alone_and_together_figures_by_the_load() -> None:
    assert weighed_rate(100.0, 60.0, 0.0) == 100.0
    assert weighed_rate(100.0, 60.0, 1.0) == 60.0
    assert weighed_rate(100.0, 60.0, 0.25) == pytest.approx(90.0)
    assert weighed_rate(100.0, 60.0, 7.0) == 60.0  # clamped
    assert weighed_rate(None, 60.0, 0.5) == 60.0 and weighed_rate(100.0, None, 0.5) == 100.0
    assert weighed_rate(None, None, 0.5) is None
    # loading the others cannot speed a path up: an alone figure below the together one was low
    assert weighed_rate(50.0, 60.0, 0.0) == 60.0


def test_a_path_not_simulated_yet_counts_as_fully_loaded() -> None:
    assert load_of(None, "a", "b") == 1.0
    assert load_of({frozenset("ab"): 0.3}, "b", "a") == 0.3
    assert load_of({frozenset("ab"): 0.3}, "a", "c") == 1.0
