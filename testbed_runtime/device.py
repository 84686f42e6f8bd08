"""The emulated GPU of a worker host: one piece of work at a time, with a timeline.

Every process on a host that wants the GPU (the training worker, a BubbleTea agent)
opens the same ``Device`` by name and run directory. Exclusive use is an
``fcntl.flock`` on ``<run_dir>/devices/<name>.lock``, taken afresh for each piece of
work, so waiting for the device is real contention between processes (and between
threads, each acquisition opening its own file description). When the work ends, a
JSON line is appended to ``<name>.timeline.jsonl`` while the lock is still held; the
timeline is therefore complete, ordered and shared by all processes. While work runs,
``<name>.current.json`` says who holds the device and until when (modelled work), so
an observer can see a busy device without waiting for it.

Modes:

* ``modelled``: the work lasts ``duration_s`` model seconds, or ``flops`` divided by
  the compute model's sustained rate; the device is held (sleeping) for it. If `fn`
  is given too it runs inside the hold (real tensors, modelled time); an `fn` slower
  than the model is recorded as an overrun.
* ``real``: `fn()` runs while the device is held (torch on CUDA when present, else
  CPU; CUDA is synchronised before the clock stops) and its real time is recorded.

``time_scale`` (wall seconds per model second, default from the environment variable
``TESTBED_TIME_SCALE`` or 1.0) stretches or shrinks every modelled hold, so
experiments can run faster (<1) or slower (>1) than real time. Records keep both the
wall times and the model seconds. To keep transfer-to-compute ratios, whatever drives
the network must scale WAN delays and transfer times by the same factor (window-
limited TCP rates do not scale linearly; use 1.0 for network experiments).

**Leases: a hold that cannot outlive its slot.** Training (``run``) has priority over
the work that fills its idle time (``try_run``: BubbleTea's prefill). A ``try_run`` with a
``deadline`` holds the device under a *lease*: ``<name>.lease.json`` says who holds it
(pid, owner, label) and until when (``deadline``, plus ``guard_s``); the holder may move the
deadline (``extend_lease``) as its window is confirmed. The arbiter is the waiting side, not
the holder's good behaviour: a ``run`` that finds the device taken marks that it wants it
(``<name>.want/<pid>.<thread>``: a holder sees it between two pieces of its work,
``should_yield``, and a new ``try_run`` backs off), and waits at most until the lease's
deadline plus its guard, or not at all once the holder is stopped (SIGSTOP) or gone. Then
it *revokes* the lease and runs without the lock: a holder that is descheduled, starved of
CPU, blocked or stopped cannot make training wait past its slot. Revocation and release
are settled by whoever first creates ``<name>.leases/<lease id>`` (``O_EXCL``), so each lease
ends exactly one way. Every revocation and every hold that ended after its deadline is a
JSON line in ``<name>.overruns.jsonl`` (`LeaseEvent`: the request's label, the length past
the deadline, the cause). A holder killed outright (SIGKILL) loses its ``flock`` with its
file descriptors, so the device is free at once.

Times are ``time.time()`` (one clock for every process of the machine). The records
these files hold (`WorkRecord`, `Holding`, `Lease`, `LeaseEvent`) and the busy-time math
on them are pure models of the core (testbed_core/device_records.py); this module is
their I/O.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import math
import os
import re
import select
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Literal, TypedDict, TypeVar, Unpack

from testbed_core.atomic import write_text_atomic
from testbed_core.compute_model import ComputeModel
from testbed_core.device_records import (
    KINDS,
    Holding,
    Lease,
    LeaseEvent,
    WorkRecord,
    busy_time,
    idle_gaps,
)

Mode = Literal["modelled", "real"]
T = TypeVar("T")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


class Work(TypedDict, total=False):
    """A piece of work, as `Device.run` and `Device.try_run` take it (keywords): modelled mode
    holds the device for `duration_s` model seconds, or for `flops` at the compute model's
    rate, running `fn` inside the hold when given; real mode runs `fn` and records its real
    time. `label` names the work on the timeline."""

    flops: float | None
    duration_s: float | None
    fn: Callable[[], Any] | None
    label: str


class DeviceError(RuntimeError):
    """Misuse of a device (bad name, missing duration, real mode without work)."""


def default_time_scale() -> float:
    raw = os.environ.get("TESTBED_TIME_SCALE", "1")
    try:
        value = float(raw)
    except ValueError:
        raise DeviceError(f"TESTBED_TIME_SCALE={raw!r} is not a number (wall seconds per model second)") from None
    if value <= 0:
        raise DeviceError(f"TESTBED_TIME_SCALE={raw!r} must be positive")
    return value


def process_state(pid: int) -> str | None:
    """The one-letter state of process `pid` (/proc/<pid>/stat: R running or runnable,
    S sleeping, D blocked in I/O, T stopped, t traced, Z zombie), None if it is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_bytes()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # the command name is in parentheses and may contain spaces: the state follows the last ')'
    rest = raw[raw.rfind(b")") + 1:].split()
    return rest[0].decode() if rest else None


_STATE_CAUSE = {
    "T": "holder stopped (SIGSTOP) while holding the device",
    "t": "holder stopped by a tracer while holding the device",
    "R": "holder runnable past its deadline (waiting for a CPU, or still working)",
    "S": "holder asleep past its deadline (did not wake in time, or slept too long)",
    "D": "holder blocked in the kernel (I/O) past its deadline",
    "Z": "holder exited without releasing the device",
    "X": "holder exited without releasing the device",
}


def _cause_of(state: str | None) -> str:
    if state is None:
        return "holder gone (its process no longer exists)"
    return _STATE_CAUSE.get(state, f"holder in state {state!r} past its deadline")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def torch_device() -> Any:
    """The torch device real work should use: CUDA when present, else CPU."""
    import torch

    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _sync_cuda() -> None:
    try:
        import torch
    except ImportError:
        return
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


class Device:
    """An emulated GPU shared by every process that opens it (same name, same run dir)."""

    def __init__(
        self,
        name: str,
        run_dir: str | Path,
        *,
        mode: Mode = "modelled",
        compute: ComputeModel | None = None,
        time_scale: float | None = None,
    ) -> None:
        if not _NAME.fullmatch(name):
            raise DeviceError(f"device name {name!r}: use letters, digits, '.', '_' or '-' (e.g. 'dc1-h1-gpu0')")
        if mode not in ("modelled", "real"):
            raise DeviceError(f"device mode {mode!r}: allowed modes are 'modelled' and 'real'")
        self.name = name
        self.mode: Mode = mode
        self.compute = compute
        self.time_scale = default_time_scale() if time_scale is None else float(time_scale)
        if self.time_scale <= 0:
            raise DeviceError(f"time_scale must be positive, got {time_scale}")
        self.dir = Path(run_dir) / "devices"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.lock_path = self.dir / f"{name}.lock"
        self.timeline_path = self.dir / f"{name}.timeline.jsonl"
        self.current_path = self.dir / f"{name}.current.json"
        self.lease_path = self.dir / f"{name}.lease.json"
        self.overruns_path = self.dir / f"{name}.overruns.jsonl"
        self.want_dir = self.dir / f"{name}.want"
        self.settled_dir = self.dir / f"{name}.leases"
        self.lock_path.touch(exist_ok=True)
        self.want_dir.mkdir(exist_ok=True)
        self.settled_dir.mkdir(exist_ok=True)
        self.yield_path = self.dir / f"{name}.yield"  # FIFO: training pokes a holder when it asks
        with contextlib.suppress(FileExistsError):
            os.mkfifo(self.yield_path, 0o666)
        self._yield_fd = -1
        self._local = threading.Lock()  # orders threads sharing this object before flock
        self._lease: Lease | None = None  # the lease this object holds now (try_run with a deadline)
        self._lease_cause = ""
        self._lease_seq = 0
        self.poll_s = 0.0005  # how often a waiting run() looks again at a taken device

    def __repr__(self) -> str:
        return f"Device({self.name!r}, mode={self.mode!r}, time_scale={self.time_scale:g})"

    # ------------------------------------------------------------- holding

    @contextlib.contextmanager
    def _hold(self, blocking: bool) -> Iterator[bool]:
        """Hold the device's lock. Blocking (training): wait, but never past a lease's
        deadline plus its guard (then take the device back: `_wait_or_revoke`); the hold
        then yields the revoked lease's id instead of True. Non-blocking: only if free
        now and training does not want it."""
        if not self._local.acquire(blocking=blocking):
            yield False
            return
        try:
            fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o666)
            try:
                if blocking:
                    got = self._wait_or_revoke(fd)
                else:
                    try:
                        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                        got = True
                    except BlockingIOError:
                        got = False
                    if got and self.wanted():
                        fcntl.flock(fd, fcntl.LOCK_UN)  # training asks for it: leave it alone
                        got = False
                    if not got:
                        yield False
                        return
                if got is not True:  # revoked: run without the lock, training marked as wanting it
                    try:
                        yield got
                    finally:
                        self._unwant()
                    return
                try:
                    yield True
                finally:
                    fcntl.flock(fd, fcntl.LOCK_UN)
            finally:
                os.close(fd)
        finally:
            self._local.release()

    # ---------------------------------------------------- leases (arbiter side)

    def _want_marker(self) -> Path:
        return self.want_dir / f"{os.getpid()}.{threading.get_ident()}"

    def _unwant(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self._want_marker().unlink()

    def wanted(self) -> bool:
        """True while training (a `run` of a live process) waits for or runs without
        the lock on this device: a lease holder should yield, a new `try_run` backs off."""
        try:
            names = os.listdir(self.want_dir)
        except FileNotFoundError:
            return False
        for n in names:
            pid = int(n.split(".", 1)[0]) if n.split(".", 1)[0].isdigit() else 0
            if pid == os.getpid() or (pid and _alive(pid)):
                return True
        return False

    def _wait_or_revoke(self, fd: int) -> bool | str:
        """Training's side: True once the lock is held; the revoked lease's id once the
        holder's deadline plus guard has passed (or the holder is stopped)."""
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            pass
        marker = self._want_marker()
        marker.touch()
        self._poke_holder()
        try:
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    self._unwant()
                    return True
                except BlockingIOError:
                    pass
                now = time.time()
                lease = self.lease()
                wait = self.poll_s
                if lease is not None:
                    if self._revoked_at(lease.id) is not None:
                        return lease.id  # revoked before (the holder has not woken since)
                    state = process_state(lease.pid)
                    limit = lease.deadline + lease.guard_s
                    if now >= limit or state in ("T", "t", "Z", "X", None):
                        if self._revoke(lease, state, now):
                            return lease.id
                    else:
                        wait = min(self.poll_s, limit - now)
                time.sleep(wait)
        except BaseException:
            self._unwant()
            raise

    def _poke_holder(self) -> None:
        """Wake a holder sleeping in `wait_yield` (never blocks: no reader, or a full pipe,
        means nobody sleeps there)."""
        try:
            fd = os.open(self.yield_path, os.O_WRONLY | os.O_NONBLOCK)
        except OSError:
            return
        try:
            os.write(fd, b"!")
        except OSError:
            pass
        finally:
            os.close(fd)

    def _revoke(self, lease: Lease, state: str | None, now: float) -> bool:
        """Settle `lease` as revoked if its holder has not released it first."""
        marker = self.settled_dir / lease.id
        try:
            fd = os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        except FileExistsError:
            return False  # the holder is releasing it right now
        try:
            os.write(fd, json.dumps({"revoked_at": now}).encode())
        finally:
            os.close(fd)
        again = self.lease()
        if again is None or again.id != lease.id:
            # the holder had already settled and released it: not a revocation
            with contextlib.suppress(FileNotFoundError):
                marker.unlink()
            return False
        owner = getattr(self, "_waiting_owner", "")
        _append_json(self.overruns_path, LeaseEvent(
            "revoked", self.name, lease.id, lease.owner, lease.label, lease.pid, lease.deadline, lease.guard_s,
            now, now - lease.deadline, _cause_of(state), True, owner).to_json())
        return True

    def lease(self) -> Lease | None:
        """The lease on the device now, or None (none, or its holder's process is gone)."""
        try:
            lease = Lease.from_json(json.loads(self.lease_path.read_text()))
        except (FileNotFoundError, json.JSONDecodeError, KeyError, TypeError):
            return None
        return lease if _alive(lease.pid) else None

    def _revoked_at(self, lease_id: str) -> float | None:
        """When training revoked this lease; None if not (or the holder settled it)."""
        try:
            return float(json.loads((self.settled_dir / lease_id).read_text())["revoked_at"])
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def overruns(self) -> list[LeaseEvent]:
        """Every lease revoked by training and every hold that ended after its deadline."""
        return _read_json_lines(self.overruns_path, LeaseEvent.from_json)

    # ---------------------------------------------------- leases (holder side)

    def extend_lease(self, deadline: float) -> None:
        """Holder: move the deadline of the lease it holds (its window was confirmed
        further, or it commits to less). No-op without a lease."""
        lease = self._lease
        if lease is None or deadline == lease.deadline:
            return
        self._lease = Lease(lease.id, lease.pid, lease.owner, lease.label, lease.start, deadline, lease.guard_s)
        _replace_json(self.lease_path, self._lease.to_json())

    def lease_cause(self, cause: str) -> None:
        """Holder: why its hold may end late (recorded if it does): e.g. 'woke 12 ms late'."""
        self._lease_cause = cause

    def should_yield(self) -> str | None:
        """Holder, between two pieces of its work: why it must stop now ('revoked': training
        took the device back; 'wanted': training asks for it), or None."""
        lease = self._lease
        if lease is not None and (self.settled_dir / lease.id).exists():
            return "revoked"
        if self.wanted():
            return "wanted"
        return None

    def wait_yield(self, timeout: float) -> str | None:
        """Holder: sleep up to `timeout` seconds, woken at once when training asks for the
        device (a poke on ``<name>.yield``); then why it must stop (`should_yield`) or None.
        One wake-up per request instead of polling: a holder starved of CPU wakes as
        rarely as possible."""
        if self._yield_fd < 0:
            with contextlib.suppress(OSError):
                self._yield_fd = os.open(self.yield_path, os.O_RDWR | os.O_NONBLOCK)
        why = self.should_yield()
        if why is not None or timeout <= 0:
            return why
        if self._yield_fd < 0:
            time.sleep(min(timeout, 0.002))
            return self.should_yield()
        ready, _, _ = select.select([self._yield_fd], [], [], timeout)
        if ready:
            with contextlib.suppress(BlockingIOError, OSError):
                while os.read(self._yield_fd, 4096):
                    pass
            return self.should_yield()
        return None

    def lease_revoked_at(self) -> float | None:
        """Holder: when training took back the lease it holds now (None: not revoked)."""
        return None if self._lease is None else self._revoked_at(self._lease.id)

    def _release_lease(self, lease: Lease, end: float) -> float | None:
        """Settle the lease as released (or learn that training revoked it): the time it
        was revoked, or None. Records an overrun if the hold ended after its deadline."""
        marker = self.settled_dir / lease.id
        revoked_at = None
        try:
            fd = os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
            os.close(fd)
        except FileExistsError:
            try:
                revoked_at = float(json.loads(marker.read_text())["revoked_at"])
            except (OSError, ValueError, KeyError, TypeError):
                revoked_at = end
        with contextlib.suppress(FileNotFoundError):
            self.lease_path.unlink()
        with contextlib.suppress(FileNotFoundError):
            marker.unlink()
        over = end - lease.deadline
        if over > 1e-4 or revoked_at is not None:
            cause = self._lease_cause or "the holder released the device after its deadline"
            if revoked_at is not None:
                cause = f"revoked by training after {revoked_at - lease.deadline:+.4f} s; {cause}"
            _append_json(self.overruns_path, LeaseEvent(
                "overrun", self.name, lease.id, lease.owner, lease.label, lease.pid, lease.deadline,
                lease.guard_s, end, over, cause, revoked_at is not None).to_json())
        return revoked_at

    def modelled_seconds(self, flops: float | None, duration_s: float | None, op: str | None = None) -> float:
        """Model seconds of a piece of modelled work: `duration_s` as given, else the
        compute model's time for `flops` (a measured profile's time for `op` first)."""
        if duration_s is not None:
            if duration_s < 0:
                raise DeviceError(f"{self.name}: duration_s must be >= 0, got {duration_s}")
            return float(duration_s)
        if flops is None:
            raise DeviceError(f"{self.name}: modelled work needs flops= or duration_s=")
        if self.compute is None:
            raise DeviceError(f"{self.name}: flops= needs a compute model (Device(..., compute=ComputeModel(...)))")
        return self.compute.seconds(flops, op=op)

    def run(self, kind: str, owner: str, **work: Unpack[Work]) -> WorkRecord:
        """Wait for the device, do the work (`Work`), record it. The record's `result` is fn()'s."""
        record = self._run(kind, owner, work, blocking=True)
        assert record is not None
        return record

    def try_run(self, kind: str, owner: str, *, deadline: float | None = None, guard_s: float = 0.0,
                **work: Unpack[Work]) -> WorkRecord | None:
        """Like run(), but only if the device is free right now and training does not
        want it; None otherwise. With `deadline` (wall clock) the hold is a lease:
        training takes the device back at `deadline + guard_s` whatever this process
        does (module docstring); modelled work then stops as soon as training asks for
        the device (the record says ``preempted``), and `fn` should look at
        `should_yield()` between its pieces."""
        if deadline is not None and (not math.isfinite(deadline) or guard_s < 0):
            raise DeviceError(f"{self.name}: a lease needs a finite deadline and guard_s >= 0 "
                              f"(got deadline={deadline}, guard_s={guard_s})")
        return self._run(kind, owner, work, blocking=False, deadline=deadline, guard_s=guard_s)

    def _run(self, kind: str, owner: str, work: Work, *, blocking: bool,
             deadline: float | None = None, guard_s: float = 0.0) -> WorkRecord | None:
        unknown = sorted(set(work) - set(Work.__annotations__))
        if unknown:
            raise TypeError(f"{self.name}: unknown work argument(s) {', '.join(unknown)}; "
                            f"allowed: {', '.join(Work.__annotations__)}, and for try_run deadline, guard_s")
        flops, duration_s = work.get("flops"), work.get("duration_s")
        fn, label = work.get("fn"), work.get("label", "")
        if not kind or not owner:
            raise DeviceError(f"{self.name}: work needs a kind (e.g. {', '.join(KINDS)}) and an owner")
        modelled = None
        if self.mode == "modelled":
            modelled = self.modelled_seconds(flops, duration_s, op=kind)
        elif fn is None:
            raise DeviceError(f"{self.name}: real mode runs fn(); pass fn= (or use mode='modelled')")
        requested = time.time()
        self._waiting_owner = owner
        with self._hold(blocking) as held:
            if not held:
                return None
            start = time.time()
            lease = None
            if deadline is not None:
                self._lease_seq += 1
                lease = Lease(f"{os.getpid()}-{threading.get_ident()}-{self._lease_seq}-{int(start * 1e6)}",
                              os.getpid(), owner, label, start, float(deadline), float(guard_s))
                self._lease, self._lease_cause = lease, ""
                _replace_json(self.lease_path, lease.to_json())
                if self._yield_fd >= 0:  # pokes meant for an earlier hold
                    with contextlib.suppress(BlockingIOError, OSError):
                        while os.read(self._yield_fd, 4096):
                            pass
            expected = None if modelled is None else start + modelled * self.time_scale
            _replace_json(self.current_path, Holding(kind, owner, label, start, expected, os.getpid()).to_json())
            result, overrun, preempted = None, 0.0, False
            try:
                if fn is not None:
                    result = fn()
                    if self.mode == "real":
                        _sync_cuda()
                if expected is not None:
                    now = time.time()
                    if now < expected:
                        preempted = not _sleep_until(expected, self.wait_yield if lease is not None else None)
                    else:
                        overrun = (now - expected) / self.time_scale
                end = time.time()
                revoked_at = None
                if lease is not None:
                    final = self._lease or lease
                    self._lease = None
                    revoked_at = self._release_lease(final, end)
                    deadline = final.deadline
                    if revoked_at is not None:
                        end = max(start, min(end, revoked_at))  # the device was training's from then on
                record = WorkRecord(
                    self.name, kind, owner, label, requested, start, end, self.mode,
                    modelled, flops, overrun, os.getpid(), result,
                    deadline, revoked_at, preempted, held if isinstance(held, str) else "",
                )
                _append_json(self.timeline_path, record.to_json())
            finally:
                if self._lease is not None:  # fn raised: settle the lease all the same
                    failed, self._lease = self._lease, None
                    self._release_lease(failed, time.time())
                with contextlib.suppress(FileNotFoundError):
                    self.current_path.unlink()
            return record

    # ----------------------------------------------------------- observing

    def current(self) -> Holding | None:
        """Who holds the device now (kind, owner, start, expected_end), or None.
        A file left by a holder that died is ignored: the lock is the truth."""
        try:
            info = Holding.from_json(json.loads(self.current_path.read_text()))
        except (FileNotFoundError, json.JSONDecodeError, KeyError, TypeError):
            return None
        return info if self.busy() else None

    def busy(self) -> bool:
        """True if some process holds the device right now."""
        fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        else:
            fcntl.flock(fd, fcntl.LOCK_UN)
            return False
        finally:
            os.close(fd)

    def timeline(self, since: float | None = None) -> list[WorkRecord]:
        """All finished work of every process on this device, in start order;
        with `since`, only work that ended after it."""
        records = _read_json_lines(self.timeline_path, WorkRecord.from_json)
        return sorted((r for r in records if since is None or r.end > since), key=lambda r: r.start)

    def utilization(self, t0: float, t1: float | None = None) -> float:
        """Busy fraction of [t0, t1] (t1 defaults to now)."""
        t1 = time.time() if t1 is None else t1
        if t1 <= t0:
            raise DeviceError(f"utilization window is empty: t0={t0} >= t1={t1}")
        return busy_time(self.timeline(since=t0), t0, t1) / (t1 - t0)

    def idle_slots(self, t0: float, t1: float | None = None, min_s: float = 0.0) -> list[tuple[float, float]]:
        """Gaps longer than `min_s` in [t0, t1] with no recorded work."""
        t1 = time.time() if t1 is None else t1
        return idle_gaps(self.timeline(since=t0), t0, t1, min_s)


def _append_json(path: Path, data: dict[str, Any]) -> None:
    """Append `data` as one JSON line with one write() on an O_APPEND descriptor, so that
    lines of concurrent writers (every process of the device) never interleave."""
    line = (json.dumps(data, separators=(",", ":")) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


def _read_json_lines(path: Path, parse: Callable[[dict[str, Any]], T]) -> list[T]:
    """Every line of `path` that `parse` accepts, in file order ([] when there is no file):
    a line cut short by a crash, or one that is not a record, is skipped."""
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        return []
    out = []
    for line in lines:
        try:
            out.append(parse(json.loads(line)))
        except (json.JSONDecodeError, TypeError):
            continue
    return out


def _replace_json(path: Path, data: dict[str, Any]) -> None:
    """Replace `path` with `data` as JSON, atomically (a reader sees the old file or the new one)."""
    write_text_atomic(path, json.dumps(data))


def _sleep_until(deadline: float, stop: Callable[[float], Any] | None = None) -> bool:
    """Sleep to a wall-clock deadline (no spinning: the machine's cores are shared); with
    `stop` (`Device.wait_yield`: sleeps up to its argument, says whether to stop), return
    False as soon as it says stop."""
    while (left := deadline - time.time()) > 0:
        if stop is not None:
            if stop(left):
                return False
            continue
        time.sleep(left)
    return True


def write_timeline_csv(records: list[WorkRecord], path: str | Path) -> None:
    """Timeline as CSV (one row per piece of work), for plots and spreadsheets."""
    import csv

    fields = [f for f in WorkRecord.__dataclass_fields__ if f != "result"]
    with open(path, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=fields)
        writer.writeheader()
        for rec in records:
            writer.writerow(rec.to_json())
