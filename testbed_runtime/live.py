"""Live guarantees from the training worker: "training will not want the device before T".

Planned slots (testbed_runtime/slots.py) are predictions: on an emulated WAN, when a tensor arrives varies
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

This module holds the files (paths, record, writer and reader, wake-ups); the worker's
side that keeps its record true is testbed_runtime/live_reporter.py, the runner's gate
testbed_runtime/gate.py, and the agent's reading of both records (`bound_from`)
bubbletea_agent/live.py.
"""

from __future__ import annotations

import contextlib
import errno
import os
import select
import stat
import struct
from dataclasses import dataclass
from enum import IntEnum
from pathlib import Path


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
