"""The agent's reading of the live status (bubbletea_agent/live.py): the bound each state
of the worker's record gives, extended between iterations by the runner's gate."""

from __future__ import annotations

import math

from bubbletea_agent.live import bound_from
from testbed_runtime.live import LiveState, LiveStatus


def st(state: LiveState, free_until: float, iteration: int = 0) -> LiveStatus:
    return LiveStatus(state, free_until, 0.0, iteration)


def test_bounds_by_state() -> None:
    assert bound_from(None, None) == -math.inf
    assert bound_from(st(LiveState.BUSY, 50.0), None) == -math.inf
    assert bound_from(st(LiveState.ENDED, math.inf), None) == -math.inf
    for s in (LiveState.WAITING, LiveState.ARRIVING, LiveState.SCHEDULED):
        assert bound_from(st(s, 7.0), None) == 7.0


def test_between_iterations_the_gate_extends_the_workers_bound() -> None:
    worker = st(LiveState.BETWEEN, 10.0, iteration=4)
    assert bound_from(worker, None) == 10.0
    assert bound_from(worker, st(LiveState.GATE_ROLLING, 10.4, iteration=5)) == 10.4
    assert bound_from(worker, st(LiveState.GATE_NEXT, 11.0, iteration=5)) == 11.0
    assert bound_from(worker, st(LiveState.GATE_NEXT, 9.0, iteration=5)) == 10.0  # never shortens it
    # a gate about another iteration says nothing about this worker's next start
    assert bound_from(worker, st(LiveState.GATE_ROLLING, 30.0, iteration=4)) == 10.0
    assert bound_from(worker, st(LiveState.GATE_NEXT, 30.0, iteration=6)) == 10.0
