"""The agent's reading of the live status: until when training surely leaves the device
alone, from the worker's record and the runner's gate (the files, their states and what
each guarantees: testbed_runtime/live.py). Sans-IO."""

from __future__ import annotations

import math

from testbed_runtime.live import LiveState, LiveStatus


def bound_from(worker: LiveStatus | None, gate: LiveStatus | None) -> float:
    """Until when training surely leaves the device alone (-inf: no guarantee).

    Between iterations the worker's own bound (its done time plus the lead) is extended by
    the runner's gate for the next iteration: once that start is decided it is the bound;
    before, the gate's rolling `confirmed + lead`."""
    if worker is None:
        return -math.inf
    s = worker.state
    if s in (LiveState.WAITING, LiveState.ARRIVING, LiveState.SCHEDULED):
        return worker.free_until
    if s == LiveState.BETWEEN:
        bound = worker.free_until
        if gate is not None and gate.iteration == worker.iteration + 1 and gate.state in (
                LiveState.GATE_ROLLING, LiveState.GATE_NEXT):
            bound = max(bound, gate.free_until)
        return bound
    return -math.inf  # BUSY, ENDED (the agent stops with the slot feed's end)
