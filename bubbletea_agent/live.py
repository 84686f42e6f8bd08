"""Live guarantees from the training worker: "training will not want the device before T".

Planned slots (slots.py) are predictions: on an emulated WAN, when a tensor arrives varies
by tens of milliseconds from iteration to iteration, so a prefill that fills a predicted
slot to its end sometimes makes training wait. The live status closes that gap. The
worker knows, at every moment, the earliest time it can need its device again:

* ``WAITING``: it waits for a tensor of which no byte has arrived yet (the transport has
  not seen the transfer's first frame). The whole tensor must still cross the path, which
  takes at least ``floor`` seconds (learned from the channel's past transfers, at first
  the path's nominal rate), so training cannot want the device before
  ``confirmed + floor``, `confirmed` being the last time the worker saw no byte. The
  worker refreshes `confirmed` while it waits (every ``poll_s``): the bound rolls forward.
* ``ARRIVING``: the first bytes came; the bound is fixed at ``last_unseen + floor``.
* ``BETWEEN``: the iteration's work is done (it waits for its last sends to be
  confirmed, then for the next iteration). The runner starts the next iteration
  ``iteration_lead`` after the last worker reported done, so the bound is
  ``now + lead``; the runner's gate file (below) extends it while other workers still run.
* ``SCHEDULED``: the next iteration's start is known: the bound is that instant (plus
  the pipeline's planned offset).
* ``BUSY``: training holds or is about to take the device: no bound (0).
* ``ENDED``: training is over.

Because each bound is computed from the last confirmation, a worker that is descheduled
or slow to write only makes the bound older, never wrong: what the agent reads is always
a lower bound on when training wants the device back. The agent runs a chunk only if it
ends (predicted time plus guard) before that bound, and checks the bound again once it
holds the device.

Files (one fixed-size record each, rewritten in place with one ``pwrite``; a sequence
number at both ends lets a reader reject a torn read):

* ``<run>/live/<device>.status``: the worker's record (state, bound, confirmed, iteration).
* ``<run>/live/gate.status``: the runner's (the optimizer step's barrier): ``GATE_NEXT``
  with the next iteration's start once decided, else ``GATE_ROLLING`` with
  ``confirmed + lead`` (the start of iteration `iteration` is not decided yet).
* ``<run>/live/<device>.wake``: a FIFO; the worker writes a byte on every state change so
  that an agent sleeping in `Waker.wait` starts at once (no polling).

The sans-IO parts (`ArrivalFloor`, `bound_from`) are unit-tested without files.
"""

from __future__ import annotations

import contextlib
import errno
import math
import os
import select
import stat
import struct
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from enum import IntEnum
from pathlib import Path
from typing import Any


class LiveState(IntEnum):
    BUSY = 0
    WAITING = 1
    ARRIVING = 2
    BETWEEN = 3
    SCHEDULED = 4
    ENDED = 5
    GATE_ROLLING = 6
    GATE_NEXT = 7


_RECORD = struct.Struct("<QddiiQ")  # seq, free_until, confirmed, state, iteration, seq


@dataclass(frozen=True)
class LiveStatus:
    state: LiveState
    free_until: float  # training will not want the device before this (time.time())
    confirmed: float  # when the writer last confirmed the state
    iteration: int
    seq: int = 0


def status_path(run_dir: str | os.PathLike, device: str) -> Path:
    return Path(run_dir) / "live" / f"{device}.status"


def wake_path(run_dir: str | os.PathLike, device: str) -> Path:
    return Path(run_dir) / "live" / f"{device}.wake"


def gate_path(run_dir: str | os.PathLike) -> Path:
    return Path(run_dir) / "live" / "gate.status"


# --------------------------------------------------------------------------- records


class StatusWriter:
    """Rewrites one status record in place (a single pwrite: cheap enough every ms)."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        self._seq = 0
        self.last: LiveStatus | None = None

    def write(self, state: LiveState, free_until: float, confirmed: float, iteration: int) -> LiveStatus:
        self._seq += 1
        os.pwrite(self._fd, _RECORD.pack(self._seq, free_until, confirmed, int(state), iteration, self._seq), 0)
        self.last = LiveStatus(state, free_until, confirmed, iteration, self._seq)
        return self.last

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


class StatusReader:
    """Reads a status record; None while the file does not exist or is empty."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        self._fd = -1

    def read(self) -> LiveStatus | None:
        if self._fd < 0:
            try:
                self._fd = os.open(self.path, os.O_RDONLY)
            except FileNotFoundError:
                return None
        for _ in range(8):
            raw = os.pread(self._fd, _RECORD.size, 0)
            if len(raw) < _RECORD.size:
                return None
            s1, free_until, confirmed, state, iteration, s2 = _RECORD.unpack(raw)
            if s1 == s2:
                return LiveStatus(LiveState(state), free_until, confirmed, iteration, s1)
        return None  # being rewritten too fast to read: as good as no bound

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


# --------------------------------------------------------------------------- wake-ups


def _ensure_fifo(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.mkfifo(path, 0o644)
    except FileExistsError:
        if not stat.S_ISFIFO(os.stat(path).st_mode):
            raise ValueError(f"{path} exists and is not a FIFO (remove it)") from None


class Nudger:
    """Writer side of a wake-up FIFO: one byte per state change; never blocks, never fails
    (no reader yet, or a full pipe, simply means nobody needs waking)."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        self._fd = -1

    def poke(self) -> None:
        if self._fd < 0:
            try:
                _ensure_fifo(self.path)
                self._fd = os.open(self.path, os.O_WRONLY | os.O_NONBLOCK)
            except OSError:
                return  # ENXIO: no reader has opened it yet
        try:
            os.write(self._fd, b"!")
        except BlockingIOError:
            pass
        except OSError as exc:  # EPIPE: the reader went away
            if exc.errno in (errno.EPIPE, errno.EBADF):
                self.close()

    def close(self) -> None:
        if self._fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = -1


class Waker:
    """Reader side: sleep until a poke or a timeout. Opened read-write so the FIFO never
    reports end-of-file when writers come and go."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        _ensure_fifo(self.path)
        self._fd = os.open(self.path, os.O_RDWR | os.O_NONBLOCK)
        self.pokes = 0

    def wait(self, timeout: float) -> bool:
        """True if woken by a poke (all pending pokes are consumed)."""
        if timeout > 0:
            ready, _, _ = select.select([self._fd], [], [], timeout)
        else:
            ready = [self._fd]
        woke = False
        if ready:
            with contextlib.suppress(BlockingIOError):
                while os.read(self._fd, 4096):
                    woke = True
                    self.pokes += 1
        return woke

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


# --------------------------------------------------------------------------- sans-IO


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


# --------------------------------------------------------------------------- worker side


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


# --------------------------------------------------------------------------- runner side


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
