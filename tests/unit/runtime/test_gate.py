"""The runner's gate (testbed_runtime/gate.py): its rolling bounds stay below the start
it decides."""

from __future__ import annotations

import os
import time
from pathlib import Path

from testbed_runtime.gate import Gate
from testbed_runtime.live import LiveState, StatusReader, gate_path


def test_gate_rolling_bounds_stay_below_the_start_it_decides(tmp_path: Path) -> None:
    path = gate_path(tmp_path)
    gate = Gate(path, lead_s=0.05, period_s=0.002)
    reader = StatusReader(path)
    seen = []
    deadline = time.monotonic() + 2.0
    while len(seen) < 5 and time.monotonic() < deadline:
        s = reader.read()
        if s is not None and s.state is LiveState.GATE_ROLLING and (not seen or s.seq != seen[-1].seq):
            seen.append(s)
        time.sleep(0.003)
    assert seen and all(s.iteration == 0 for s in seen)
    at = gate.decide(0, 0.2)
    assert max(s.free_until for s in seen) < at
    nxt = reader.read()
    assert (nxt.state, nxt.iteration, nxt.free_until) == (LiveState.GATE_NEXT, 0, at)
    gate.close()
    assert os.path.exists(path)
