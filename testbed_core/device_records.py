"""What an emulated device leaves behind, and the math on it: pure models, no I/O.

The shared device (testbed_runtime/device.py) appends a `WorkRecord` to
``<name>.timeline.jsonl`` for every piece of work, says who holds it now in
``<name>.current.json`` (`Holding`), its current lease in
``<name>.lease.json`` (`Lease`) and records every revoked or overrun lease in
``<name>.overruns.jsonl`` (`LeaseEvent`). Whoever reads those files back (the run's
metrics, the BubbleTea agent and its simulator, the report) needs these models and the
busy-time math, not the device's locking: they live here, in the core.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from testbed_core.intervals import covered, union

KINDS = ("forward", "backward", "prefill", "decode", "optimizer", "other")
"""The kinds of work a device records (`WorkRecord.kind`)."""


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
    deadline: float | None = None  # a leased hold (try_run with a deadline): its deadline at release
    revoked_at: float | None = None  # a leased hold training took back at this time
    preempted: bool = False  # modelled work cut short because training asked for the device
    revoked_lease: str = ""  # training work that ran after revoking this lease (without the lock)

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


@dataclass(frozen=True)
class Lease:
    """A ``try_run`` hold with a deadline, as ``<name>.lease.json`` says it."""

    id: str
    pid: int
    owner: str
    label: str
    start: float
    deadline: float  # the holder's slot ends here (wall clock)
    guard_s: float  # training waits at most deadline + guard_s

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Lease:
        return cls(**{k: data[k] for k in cls.__dataclass_fields__})


@dataclass(frozen=True)
class LeaseEvent:
    """One line of ``<name>.overruns.jsonl``.

    ``revoked``: written by the training side when it took the device back (the holder
    may never release: stopped, killed); ``overrun``: written by the holder when its hold
    ended after its deadline (``overrun_s`` past it), revoked or not."""

    event: str  # "revoked" | "overrun"
    device: str
    lease: str
    owner: str
    label: str
    holder_pid: int
    deadline: float
    guard_s: float
    at: float  # revoked: when training took the device; overrun: when the holder released it
    overrun_s: float  # how far past the deadline (revoked: at - deadline, may be < 0 for a stopped holder)
    cause: str  # why, in words: holder state at revocation, or what the holder reports
    revoked: bool = False
    by: str = ""  # revoked: the owner of the training work that took the device

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> LeaseEvent:
        return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})


@dataclass(frozen=True)
class Holding:
    """Who holds the device now, as ``<name>.current.json`` says while the work runs."""

    kind: str
    owner: str
    label: str
    start: float
    expected_end: float | None  # modelled work: when it ends; None in real mode
    pid: int

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Holding:
        return cls(**{k: data[k] for k in cls.__dataclass_fields__})


def busy_time(records: list[WorkRecord], t0: float, t1: float) -> float:
    """Seconds of [t0, t1] covered by some record (overlaps counted once)."""
    return covered((max(r.start, t0), min(r.end, t1)) for r in records)


def idle_gaps(records: list[WorkRecord], t0: float, t1: float, min_s: float = 0.0) -> list[tuple[float, float]]:
    """The stretches of [t0, t1] longer than `min_s` that no record covers."""
    gaps, cursor = [], t0
    for s, e in union((max(r.start, t0), min(r.end, t1)) for r in records):
        if s - cursor > min_s:
            gaps.append((cursor, s))
        cursor = max(cursor, e)
    if t1 - cursor > min_s:
        gaps.append((cursor, t1))
    return gaps
