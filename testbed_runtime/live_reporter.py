"""The training worker's side of the live status (testbed_runtime/live.py): keeps the
record of its device true as the worker waits for tensors and moves between iterations.

`LiveReporter` writes the states; `WatchedChannel` wraps a boundary channel of the
transport so that a receive, while it waits, reports the earliest time the awaited
tensor can be complete: from the bytes still missing at the path's rate
(`ProgressBound`, where the kernel's byte counts of the channel's sockets can be read:
testbed_runtime/tcp_progress.py), else from the shortest transfer seen so far
(`ArrivalFloor`, sans-IO). `LiveComm` marks the end of an iteration's work.
"""

from __future__ import annotations

import contextlib
import math
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from testbed_runtime.live import LiveState, Nudger, StatusWriter


class ArrivalFloor:
    """The least time a tensor of this channel takes from its first byte to its last.

    Starts at `nominal_s` (the tensor's size at the path's nominal rate) and, after
    `min_samples` transfers, uses the shortest of the last `window` observed ones less a
    safety margin (a relative part and `margin_s`, which must cover the worker's polling
    interval: an observed duration counts from the last poll that saw no byte)."""

    def __init__(self, nominal_s: float, *, window: int = 32, min_samples: int = 3,
                 margin_s: float = 0.003, margin_rel: float = 0.03) -> None:
        self.nominal_s = max(0.0, nominal_s)
        self.samples: deque[float] = deque(maxlen=window)
        self.min_samples = min_samples
        self.margin_s = margin_s
        self.margin_rel = margin_rel

    def observe(self, duration_s: float) -> None:
        if math.isfinite(duration_s) and duration_s > 0:
            self.samples.append(duration_s)

    @property
    def floor_s(self) -> float:
        if len(self.samples) < self.min_samples:
            return self.nominal_s
        return max(0.0, min(self.samples) * (1.0 - self.margin_rel) - self.margin_s)



class LiveReporter:
    """The training worker's side: keeps the status record true as the worker moves on.

    Called from the worker's main thread (and from `WatchedHandle.wait`, which runs in it)."""

    def __init__(self, writer: StatusWriter, nudger: Nudger | None = None, *, lead_s: float = 0.05,
                 poll_s: float = 0.002, clock: Callable[[], float] = time.time) -> None:
        self.writer = writer
        self.nudger = nudger
        self.lead_s = lead_s
        self.poll_s = poll_s
        self.clock = clock
        self.iteration = -1
        self.state = LiveState.BUSY
        self.stats: dict[str, float] = {"waits": 0, "announced_at_entry": 0, "rolled_s": 0.0, "arriving_s": 0.0}
        self._since = clock()

    def _set(self, state: LiveState, free_until: float, confirmed: float, nudge: bool) -> None:
        changed = state != self.state
        if changed:
            now = self.clock()
            key = {LiveState.WAITING: "rolled_s", LiveState.ARRIVING: "arriving_s"}.get(self.state)
            if key is not None:
                self.stats[key] += now - self._since
            self._since = now
        self.state = state
        self.writer.write(state, free_until, confirmed, self.iteration)
        if nudge and changed and self.nudger is not None:
            self.nudger.poke()

    def busy(self) -> None:
        self._set(LiveState.BUSY, 0.0, self.clock(), nudge=False)

    def waiting(self, confirmed: float, floor_s: float) -> None:
        self._set(LiveState.WAITING, confirmed + floor_s, confirmed, nudge=True)

    def arriving(self, last_unseen: float, floor_s: float) -> None:
        self._set(LiveState.ARRIVING, last_unseen + floor_s, self.clock(), nudge=True)

    def arriving_until(self, bound: float) -> None:
        self._set(LiveState.ARRIVING, bound, self.clock(), nudge=True)

    def between(self) -> None:
        """This worker's iteration is done: the next starts at least `lead_s` after the
        runner hears so, which is after now."""
        now = self.clock()
        self._set(LiveState.BETWEEN, now + self.lead_s, now, nudge=True)

    def scheduled(self, iteration: int, start_at: float) -> None:
        self.iteration = iteration
        self._set(LiveState.SCHEDULED, start_at, self.clock(), nudge=True)

    def ended(self) -> None:
        self._set(LiveState.ENDED, math.inf, self.clock(), nudge=True)

    def close(self) -> None:
        self.writer.close()
        if self.nudger is not None:
            self.nudger.close()


class ProgressBound:
    """When the awaited tensor can be complete at the earliest, from the bytes still missing.

    A shaper of rate R on the path cannot deliver `missing` bytes in less than missing / R:
    bytes it has not passed yet come at most at R, and those it passed in the last
    one-way delay sit in the delay line at the pace the shaper gave them (the delay
    cancels out). `received()` counts every byte the channel's sockets received; the bytes
    of tensors completed before are subtracted, so control frames and headers only make
    the count larger (a smaller, safe bound). `slack_bytes` covers the shaper's burst."""

    def __init__(self, received: Any, rate_bps: float, slack_bytes: int) -> None:
        self.received = received  # zero-argument callable: bytes received so far
        self.rate_bps = rate_bps
        self.slack_bytes = slack_bytes
        self.base = received()  # bytes before the first tensor (the handshake)
        self.consumed = 0  # bytes of the tensors received so far

    def bound(self, now: float, nbytes: int) -> float:
        got = self.received() - self.base - self.consumed
        return now + max(0, nbytes - got - self.slack_bytes) * 8 / self.rate_bps

    def completed(self, nbytes: int) -> None:
        self.consumed += nbytes


class WatchedHandle:
    """An atlas_transport receive handle whose wait() keeps the live status true while the
    worker waits: the bound from the bytes still missing (`ProgressBound`) when the
    channel's sockets can be read, else `confirmed + floor` until the tensor's first frame
    is seen (the handle gets its transfer id) and a fixed bound from then on."""

    def __init__(self, handle: Any, channel: WatchedChannel) -> None:
        self._h = handle
        self._ch = channel

    def __getattr__(self, name: str) -> Any:
        return getattr(self._h, name)

    def wait(self, timeout: float | None = None) -> Any:
        h, ch = self._h, self._ch
        rep, clock, progress = ch.reporter, ch.reporter.clock, ch.progress
        deadline = None if timeout is None else time.monotonic() + timeout
        last_unseen: float | None = None
        announced = h.tid is not None or h.done()
        rep.stats["waits"] += 1
        rep.stats["announced_at_entry"] += announced
        while not h.done():
            now = clock()
            seen = h.tid is not None
            if progress is not None:
                bound = progress.bound(now, h.nbytes if h.nbytes is not None else ch.tensor_bytes)
                if seen:
                    rep.arriving_until(bound)
                else:
                    rep.waiting(now, bound - now)
            elif not announced:
                if not seen:
                    last_unseen = now
                    rep.waiting(now, ch.floor.floor_s)
                else:
                    announced = True
                    if last_unseen is not None:
                        rep.arriving(last_unseen, ch.floor.floor_s)
                    else:
                        rep.busy()
            left = rep.poll_s if deadline is None else min(rep.poll_s, deadline - time.monotonic())
            if left <= 0:
                break
            _sleep_on(h, left)
        rep.busy()
        if not h.done():
            raise TimeoutError(f"{h.describe()} not complete after {timeout:g} s")
        if progress is not None and h.nbytes is not None:
            progress.completed(h.nbytes)
        if last_unseen is not None and h.completed_at is not None:
            done_wall = time.time() - (time.monotonic() - h.completed_at)
            ch.floor.observe(done_wall - last_unseen)
        return h.wait(0)


def _sleep_on(handle: Any, seconds: float) -> None:
    """Sleep until the handle completes or `seconds` pass. The handle's event when it
    has one (no exception per poll), else its public wait()."""
    event = getattr(handle, "_event", None)
    if isinstance(event, threading.Event):
        event.wait(seconds)
        return
    with contextlib.suppress(TimeoutError):
        handle.wait(seconds)


class WatchedChannel:
    """A boundary channel whose receives report to the live status (all else passes
    through). `progress` (a `ProgressBound`) when its sockets' byte counts can be read;
    otherwise the learned `floor`."""

    def __init__(self, channel: Any, reporter: LiveReporter, floor: ArrivalFloor, tensor_bytes: int,
                 progress: ProgressBound | None = None) -> None:
        self._ch = channel
        self.reporter = reporter
        self.floor = floor
        self.tensor_bytes = tensor_bytes
        self.progress = progress

    def __getattr__(self, name: str) -> Any:
        return getattr(self._ch, name)

    def irecv(self, tag: int, **kw: Any) -> WatchedHandle:
        return WatchedHandle(self._ch.irecv(tag, **kw), self)


class LiveComm:
    """The worker's Comm for the schedule loop: marks the end of an iteration's work
    (the final flush) so that the tail of the iteration counts as free."""

    def __init__(self, comm: Any, reporter: LiveReporter) -> None:
        self.comm = comm
        self.reporter = reporter

    def send(self, key: Any, payload: Any) -> None:
        self.comm.send(key, payload)

    def recv(self, key: Any) -> Any:
        return self.comm.recv(key)  # the channel's WatchedHandle reports while it waits

    def flush(self) -> None:
        self.reporter.between()
        self.comm.flush()
