"""The runner's gate (``<run>/live/gate.status``, testbed_runtime/live.py): when the next
iteration can start at the earliest, for the agents of every worker.

Between iterations a worker's own bound ends `lead` after it reported done; the gate
extends it while other workers still run (rolling), and fixes it once the runner decides
the next iteration's start (the optimizer step's barrier).
"""

from __future__ import annotations

import os
import threading
import time

from testbed_runtime.live import LiveState, StatusWriter


class Gate:
    """The runner's gate: says, for the agents of every worker, when the next iteration
    can start at the earliest. A thread rewrites `GATE_ROLLING` (now + lead) every
    `period_s` until `decide` fixes the start; both hold one lock, so every rolling bound
    written precedes the decision and stays below the start it decides."""

    def __init__(self, path: str | os.PathLike, lead_s: float, period_s: float = 0.005) -> None:
        self.writer = StatusWriter(path)
        self.lead_s = lead_s
        self.period_s = period_s
        self._lock = threading.Lock()
        self._next: tuple[int, float] | None = None  # (iteration, start) decided
        self._pending = 0  # iteration whose start is not decided yet
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="bubbletea-gate", daemon=True)
        self._thread.start()

    def decide(self, iteration: int, lead_s: float) -> float:
        """Fix the start of `iteration` at now + lead_s and return it."""
        with self._lock:
            at = time.time() + lead_s
            self._next = (iteration, at)
            self._pending = iteration + 1
            self.writer.write(LiveState.GATE_NEXT, at, time.time(), iteration)
            return at

    def _loop(self) -> None:
        while not self._stop.wait(self.period_s):
            with self._lock:
                now = time.time()
                if self._next is not None and now < self._next[1]:
                    continue  # the decided start still lies ahead: the record says so
                self.writer.write(LiveState.GATE_ROLLING, now + self.lead_s, now, self._pending)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(1.0)
        self.writer.close()
