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

Times are ``time.time()`` (one clock for every process of the machine).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from testbed_core.compute_model import ComputeModel

Mode = Literal["modelled", "real"]
KINDS = ("forward", "backward", "prefill", "decode", "optimizer", "other")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


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


@dataclass(frozen=True)
class WorkRecord:
    """One piece of work on a device, as written to its timeline."""

    device: str
    kind: str
    owner: str
    label: str
    requested: float  # when the caller asked for the device
    start: float  # when it got it
    end: float
    mode: str
    modelled_s: float | None = None  # model seconds (before time_scale); None in real mode
    flops: float | None = None
    overrun_s: float = 0.0  # modelled mode: how far fn() ran past the modelled time
    pid: int = 0
    result: Any = field(default=None, compare=False, repr=False)

    @property
    def duration(self) -> float:
        return self.end - self.start

    @property
    def wait_s(self) -> float:
        return self.start - self.requested

    def to_json(self) -> dict[str, Any]:
        # not dataclasses.asdict: it would deep-copy `result` (a tensor, say)
        return {name: getattr(self, name) for name in self.__dataclass_fields__ if name != "result"}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> WorkRecord:
        known = {k: data[k] for k in cls.__dataclass_fields__ if k in data and k != "result"}
        return cls(**known)


def merge_intervals(spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The union of `spans` as sorted, disjoint intervals (empty spans dropped)."""
    out: list[tuple[float, float]] = []
    for s, e in sorted(spans):
        if e <= s:
            continue
        if out and s <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], e))
        else:
            out.append((s, e))
    return out


def busy_time(records: list[WorkRecord], t0: float, t1: float) -> float:
    """Seconds of [t0, t1] covered by some record (overlaps counted once)."""
    spans = [(max(r.start, t0), min(r.end, t1)) for r in records]
    return sum(e - s for s, e in merge_intervals(spans))


def idle_gaps(records: list[WorkRecord], t0: float, t1: float, min_s: float = 0.0) -> list[tuple[float, float]]:
    """The stretches of [t0, t1] longer than `min_s` that no record covers."""
    gaps, cursor = [], t0
    for s, e in merge_intervals([(max(r.start, t0), min(r.end, t1)) for r in records]):
        if s - cursor > min_s:
            gaps.append((cursor, s))
        cursor = max(cursor, e)
    if t1 - cursor > min_s:
        gaps.append((cursor, t1))
    return gaps


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
        self.lock_path.touch(exist_ok=True)
        self._local = threading.Lock()  # orders threads sharing this object before flock

    def __repr__(self) -> str:
        return f"Device({self.name!r}, mode={self.mode!r}, time_scale={self.time_scale:g})"

    # ------------------------------------------------------------- holding

    @contextlib.contextmanager
    def _hold(self, blocking: bool) -> Iterator[bool]:
        if not self._local.acquire(blocking=blocking):
            yield False
            return
        try:
            fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o666)
            try:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
                except BlockingIOError:
                    yield False
                    return
                try:
                    yield True
                finally:
                    fcntl.flock(fd, fcntl.LOCK_UN)
            finally:
                os.close(fd)
        finally:
            self._local.release()

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

    def run(
        self,
        kind: str,
        owner: str,
        *,
        flops: float | None = None,
        duration_s: float | None = None,
        fn: Callable[[], Any] | None = None,
        label: str = "",
    ) -> WorkRecord:
        """Wait for the device, do the work, record it. The record's `result` is fn()'s."""
        record = self._run(kind, owner, flops, duration_s, fn, label, blocking=True)
        assert record is not None
        return record

    def try_run(
        self,
        kind: str,
        owner: str,
        *,
        flops: float | None = None,
        duration_s: float | None = None,
        fn: Callable[[], Any] | None = None,
        label: str = "",
    ) -> WorkRecord | None:
        """Like run(), but only if the device is free right now; None otherwise."""
        return self._run(kind, owner, flops, duration_s, fn, label, blocking=False)

    def _run(self, kind, owner, flops, duration_s, fn, label, *, blocking: bool) -> WorkRecord | None:
        if not kind or not owner:
            raise DeviceError(f"{self.name}: work needs a kind (e.g. {', '.join(KINDS)}) and an owner")
        modelled = None
        if self.mode == "modelled":
            modelled = self.modelled_seconds(flops, duration_s, op=kind)
        elif fn is None:
            raise DeviceError(f"{self.name}: real mode runs fn(); pass fn= (or use mode='modelled')")
        requested = time.time()
        with self._hold(blocking) as held:
            if not held:
                return None
            start = time.time()
            expected = None if modelled is None else start + modelled * self.time_scale
            self._write_current(kind, owner, label, start, expected)
            result, overrun = None, 0.0
            try:
                if fn is not None:
                    result = fn()
                    if self.mode == "real":
                        _sync_cuda()
                if expected is not None:
                    now = time.time()
                    if now < expected:
                        _sleep_until(expected)
                    else:
                        overrun = (now - expected) / self.time_scale
                end = time.time()
                record = WorkRecord(
                    self.name, kind, owner, label, requested, start, end, self.mode,
                    modelled, flops, overrun, os.getpid(), result,
                )
                self._append(record)
            finally:
                with contextlib.suppress(FileNotFoundError):
                    self.current_path.unlink()
            return record

    def _write_current(self, kind: str, owner: str, label: str, start: float, expected: float | None) -> None:
        tmp = self.current_path.with_suffix(f".{os.getpid()}.{threading.get_ident()}.tmp")
        tmp.write_text(json.dumps(
            {"kind": kind, "owner": owner, "label": label, "start": start, "expected_end": expected,
             "pid": os.getpid()}
        ))
        os.replace(tmp, self.current_path)

    def _append(self, record: WorkRecord) -> None:
        line = (json.dumps(record.to_json(), separators=(",", ":")) + "\n").encode()
        fd = os.open(self.timeline_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
        try:
            os.write(fd, line)
        finally:
            os.close(fd)

    # ----------------------------------------------------------- observing

    def current(self) -> dict[str, Any] | None:
        """Who holds the device now (kind, owner, start, expected_end), or None.
        A file left by a holder that died is ignored: the lock is the truth."""
        try:
            info = json.loads(self.current_path.read_text())
        except (FileNotFoundError, json.JSONDecodeError):
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
        try:
            lines = self.timeline_path.read_text().splitlines()
        except FileNotFoundError:
            return []
        records = []
        for line in lines:
            try:
                rec = WorkRecord.from_json(json.loads(line))
            except (json.JSONDecodeError, TypeError):
                continue  # a line cut short by a crash
            if since is None or rec.end > since:
                records.append(rec)
        return sorted(records, key=lambda r: r.start)

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


def _sleep_until(deadline: float) -> None:
    """Sleep to a wall-clock deadline (no spinning: the machine's cores are shared)."""
    while (left := deadline - time.time()) > 0:
        time.sleep(left)


def write_timeline_csv(records: list[WorkRecord], path: str | Path) -> None:
    """Timeline as CSV (one row per piece of work), for plots and spreadsheets."""
    import csv

    fields = [f for f in WorkRecord.__dataclass_fields__ if f != "result"]
    with open(path, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=fields)
        writer.writeheader()
        for rec in records:
            writer.writerow(rec.to_json())
