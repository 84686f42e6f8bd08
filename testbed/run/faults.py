"""Faults injected on purpose during `testbed run` (a scenario's ``faults:``): a WAN
link taken down for a while, a delay spike on a link, a worker killed at an iteration.

Each fault is timed from the start of an iteration: ``iteration`` (its index as the
run's log counts, warm-ups from 0; default the first measured one) plus ``at`` seconds.
The runner tells the `FaultInjector` when each iteration starts and ends (two hooks in
testbed/run/workers.py); the injector arms a timer per fault, applies it through the
emulation (`Emulation.change_link`: the delay line's ``down``, or netem's 100% loss)
or kills the worker, restores the link after ``duration``, and afterwards writes down
what followed (`FaultRecord` in summary.json): the iterations it overlapped, their
times, the recovery time, the frames the link dropped, or the failure it caused.
The specs are validated with the scenario, before anything is built (`check_faults`).
"""

from __future__ import annotations

import re
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import KW_ONLY, dataclass, field
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import ConfigDict, Discriminator, Field, Tag, field_validator

from testbed_core.configfile import ConfigModel
from testbed_core.contracts.summary import FaultRecord, IterationAround
from testbed_core.topology import MAX_DOWN_S, Delay, Duration, _seconds, _within
from testbed_core.units import parse_duration, unit_validator

if TYPE_CHECKING:
    from testbed.emulation.network import Emulation
    from testbed.run.metrics import TransferRecord
    from testbed_core.topology import Topology
    from testbed_core.workload import Workload

MAX_FAULTS = 100
MAX_FAULT_AT_S = 3_600.0


At = Annotated[float, unit_validator(parse_duration), Field(ge=0),
               _within(0, MAX_FAULT_AT_S, _seconds, "at", "seconds after the iteration starts, at most an hour")]
Lasting = Annotated[Duration, _within(0.001, MAX_DOWN_S, _seconds, "duration", "a fault lasts 1ms to an hour")]


class _Fault(ConfigModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    iteration: int | None = Field(None, ge=0, description="the iteration whose start `at` counts from (warm-ups "
                                                          "count from 0); default: the first measured one")
    at: At = 0.0  # seconds after that iteration starts when the fault begins (a number or text like 200ms)


class LinkDown(_Fault):
    """The WAN link cut both ways for `duration` (every frame dropped)."""

    kind: Literal["link-down"]  # link-down: cut one WAN link both ways for `duration`
    link: str = Field(description="a WAN link of the topology, dc1-dc2 (either order)")
    duration: Lasting


class DelaySpike(_Fault):
    """The WAN link's one-way delay raised to `delay` for `duration`."""

    kind: Literal["delay-spike"]  # delay-spike: raise one WAN link's one-way delay for `duration`
    link: str  # a WAN link of the topology, dc1-dc2 (either order)
    delay: Delay
    duration: Lasting


class Partition(_Fault):
    """Every WAN link of DC `dc` cut both ways for `duration`: the DC cut off from the others."""

    kind: Literal["partition"]  # partition: cut every WAN link of one DC for `duration`
    dc: str = Field(description="a DC of the topology")
    duration: Lasting


class KillWorker(_Fault):
    """A training worker killed (SIGKILL): the variant must fail cleanly, naming the fault."""

    kind: Literal["kill-worker"]  # kill-worker: SIGKILL one training worker
    worker: str = Field(description="p<pipeline>r<rank>, e.g. p0r1")

    @field_validator("worker")
    @classmethod
    def _worker(cls, value: str) -> str:
        if not re.fullmatch(r"p\d+r\d+", value):
            raise ValueError(f"a worker is named p<pipeline>r<rank> (e.g. p0r1, as in the run's logs), got {value!r}")
        return value


FAULT_KINDS = ("link-down", "delay-spike", "partition", "kill-worker")


def _kind(value: Any) -> str | None:
    kind = value.get("kind") if isinstance(value, dict) else getattr(value, "kind", None)
    return kind if kind in FAULT_KINDS else None


Fault = Annotated[
    Annotated[LinkDown, Tag("link-down")] | Annotated[DelaySpike, Tag("delay-spike")]
    | Annotated[Partition, Tag("partition")] | Annotated[KillWorker, Tag("kill-worker")],
    Discriminator(_kind, custom_error_type="fault_kind",
                  custom_error_message=f"kind must be one of {', '.join(FAULT_KINDS)}"),
]


AnyFault = LinkDown | DelaySpike | Partition | KillWorker


def describe(fault: AnyFault, warmup: int) -> str:
    it = fault.iteration if fault.iteration is not None else warmup
    when = f"iteration {it} + {_seconds(fault.at)}"
    if isinstance(fault, LinkDown):
        return f"link-down {fault.link} for {_seconds(fault.duration)} at {when}"
    if isinstance(fault, DelaySpike):
        return f"delay-spike {fault.link} to {_seconds(fault.delay)} for {_seconds(fault.duration)} at {when}"
    if isinstance(fault, Partition):
        return f"partition {fault.dc} for {_seconds(fault.duration)} at {when}"
    return f"kill-worker {fault.worker} at {when}"


def link_name(topology: Topology, given: str) -> str | None:
    """The topology's name of WAN link `given` (``dc2-dc1`` finds ``dc1-dc2``), or None."""
    ends = given.split("-")
    for link in topology.wan:
        if given == link.name or (len(ends) == 2 and frozenset(ends) == frozenset(link.between)):
            return str(link.name)
    return None


def check_faults(faults: Sequence[AnyFault], topology: Topology, workload: Workload,
                 local: bool) -> None:
    """What the models alone cannot check, against the scenario's topology and workload;
    raises ValueError naming ``faults.<i>.<field>`` and what is allowed."""
    if len(faults) > MAX_FAULTS:
        raise ValueError(f"faults: {len(faults)} listed, at most {MAX_FAULTS}")
    total = workload.warmup + workload.iterations
    par = workload.parallelism
    links = ", ".join(link.name for link in topology.wan) or "none"
    for i, f in enumerate(faults):
        if f.iteration is not None and f.iteration >= total:
            raise ValueError(f"faults.{i}.iteration: {f.iteration} is past the run's last iteration "
                             f"({total - 1}: warm-ups count from 0, {workload.warmup} warm-up + "
                             f"{workload.iterations} measured)")
        if isinstance(f, Partition):
            dcs = [dc.name for dc in topology.dcs]
            if local:
                raise ValueError(f"faults.{i}: a partition needs the emulated network; runner.local runs on "
                                 "127.0.0.1 without WAN links (run as root without --local)")
            if f.dc not in dcs:
                raise ValueError(f"faults.{i}.dc: no DC {f.dc!r} in topology {topology.name} (DCs: {', '.join(dcs)})")
            if not any(f.dc in link.between for link in topology.wan):
                raise ValueError(f"faults.{i}.dc: {f.dc} has no WAN link to cut")
        elif isinstance(f, LinkDown | DelaySpike):
            if local:
                raise ValueError(f"faults.{i}: a {f.kind} needs the emulated network; runner.local runs on "
                                 "127.0.0.1 without WAN links (run as root without --local)")
            if link_name(topology, f.link) is None:
                raise ValueError(f"faults.{i}.link: no WAN link {f.link!r} in topology {topology.name} "
                                 f"(links: {links})")
        else:
            m = re.fullmatch(r"p(\d+)r(\d+)", f.worker)
            if m is None or int(m.group(1)) >= par.dp or int(m.group(2)) >= par.pp:
                raise ValueError(f"faults.{i}.worker: no worker {f.worker!r}: workers are p<pipeline>r<rank> with "
                                 f"pipeline 0 to {par.dp - 1} (dp={par.dp}) and rank 0 to {par.pp - 1} "
                                 f"(pp={par.pp})")


@dataclass(eq=False)
class FaultInjector:
    """Arms and applies the faults of one variant's run and records what followed.

    `emulation` is the running `Emulation` (None in local mode: only kill-worker
    faults then, as `check_faults` ensures); `procs` the workers' processes by name.
    """

    faults: Sequence[AnyFault]
    variant: str
    warmup: int
    emulation: Emulation | None
    _: KW_ONLY
    clock: Callable[[], float] = time.time
    topology: Topology | None = None
    procs: Mapping[str, subprocess.Popen] = field(default_factory=dict)
    starts: dict[int, float] = field(default_factory=dict)
    ends: dict[int, float] = field(default_factory=dict)
    started: dict[int, float] = field(default_factory=dict)
    ended: dict[int, float] = field(default_factory=dict)
    errors: dict[int, str] = field(default_factory=dict)
    transfers: Sequence[TransferRecord] = ()  # the variant's, once it ran (testbed/run/metrics.py)
    _restore: dict[int, Callable[[], None]] = field(default_factory=dict)
    _timers: list[threading.Timer] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _closed: bool = False
    _drops_before: dict[int, int] = field(default_factory=dict)  # by fault: the links' down_drops when it began
    _dropped: dict[int, int] = field(default_factory=dict)  # by fault: frames its links dropped while it lasted (-1: unknown)

    # ------------------------------------------------------------ hooks

    def iteration_started(self, i: int, at: float) -> None:
        """Iteration `i` starts at wall-clock `at`: arm the faults timed from it."""
        self.starts[i] = at
        for n, f in enumerate(self.faults):
            base = f.iteration if f.iteration is not None else self.warmup
            if base == i:
                self._arm(at + f.at - self.clock(), lambda n=n: self._begin(n))

    def iteration_ended(self, i: int, end: float) -> None:
        self.ends[i] = end

    def close(self) -> None:
        """Cancel what has not fired and restore every link still changed."""
        with self._lock:
            self._closed = True
            timers, self._timers = self._timers, []
            restores = list(self._restore.items())
        for t in timers:
            t.cancel()
        for n, restore in restores:
            self._end(n, restore)

    def explain(self, error: str) -> str:
        """A variant's error with the faults that had fired before it."""
        fired = [describe(self.faults[n], self.warmup) for n in sorted(self.started)]
        return f"{error} (after the fault{'s' if len(fired) > 1 else ''} injected on purpose: {'; '.join(fired)})" \
            if fired else error

    # ------------------------------------------------------------ applying

    def _arm(self, delay_s: float, fn: Callable[[], None]) -> None:
        with self._lock:
            if self._closed:
                return
            t = threading.Timer(max(0.0, delay_s), fn)
            t.daemon = True
            self._timers.append(t)
        t.start()

    def _link(self, f: LinkDown | DelaySpike) -> str:
        return link_name(self.topology, f.link) or f.link if self.topology is not None else f.link

    def _links(self, f: LinkDown | DelaySpike | Partition) -> list[str]:
        """The WAN links a link fault changes (a partition: every link of its DC)."""
        if isinstance(f, Partition):
            return [link.name for link in self.topology.wan if f.dc in link.between] if self.topology else []
        return [self._link(f)]

    def _target(self, f: AnyFault) -> str:
        return f.worker if isinstance(f, KillWorker) else f.dc if isinstance(f, Partition) else self._link(f)

    def _begin(self, n: int) -> None:
        f = self.faults[n]
        with self._lock:
            if self._closed:
                return
        try:
            if isinstance(f, KillWorker):
                proc = self.procs.get(f.worker)
                if proc is None:
                    raise RuntimeError(f"no worker process {f.worker} in this variant")
                self.started[n] = self.clock()
                proc.kill()
                self.ended[n] = self.started[n]
                return
            if isinstance(f, LinkDown | Partition):
                names = self._links(f)
                self._drops_before[n] = self._down_drops(names)
                for name in names:
                    self.emulation.change_link(name, down=True)

                def restore() -> None:
                    for name in names:
                        self.emulation.change_link(name, down=False)
            else:
                name = self._link(f)
                old = self.emulation.link_state(name)[1]
                self.emulation.change_link(name, delay=f.delay)
                restore = lambda: self.emulation.change_link(name, delay=old)  # type: ignore[assignment]  # noqa: E731
            self.started[n] = self.clock()
            with self._lock:
                self._restore[n] = restore
                closed = self._closed  # the run ended while it was being applied: undo it now
            if closed:
                self._end(n, restore)
            else:
                self._arm(f.duration, lambda: self._end(n, restore))
        except Exception as exc:  # recorded; the run goes on
            self.errors[n] = f"could not apply {describe(f, self.warmup)}: {exc}"

    def _end(self, n: int, restore: Callable[[], None]) -> None:
        with self._lock:
            if self._restore.pop(n, None) is None:
                return
        try:
            restore()
        except Exception as exc:
            self.errors[n] = f"could not undo {describe(self.faults[n], self.warmup)}: {exc}"
        self.ended[n] = self.clock()
        f = self.faults[n]
        if isinstance(f, LinkDown | Partition):
            before, after = self._drops_before.get(n, -1), self._down_drops(self._links(f))
            self._dropped[n] = after - before if before >= 0 and after >= 0 else -1

    def _ways(self, f: LinkDown | DelaySpike | Partition) -> set[str]:
        """The WAN directions (``dc1->dc2``) of the links the fault changes."""
        out = set()
        for name in self._links(f):
            a, _, b = name.partition("-")
            out |= {f"{a}->{b}", f"{b}->{a}"}
        return out

    def _down_drops(self, names: Sequence[str]) -> int:
        """The relays' down_drops of links `names` so far, both ways (-1: unknown)."""
        try:
            stats = self.emulation.delay_line_stats()
        except Exception:
            return -1
        if any(name not in stats for name in names):
            return -1
        return sum(stats[name].a2b.down_drops + stats[name].b2a.down_drops for name in names)

    # ------------------------------------------------------------ recording

    def records(self, error: str | None = None) -> list[FaultRecord]:
        """What followed each fault, from the iterations the hooks saw."""
        out = []
        done = sorted(i for i in self.starts if i in self.ends)
        for n, f in enumerate(self.faults):
            base = f.iteration if f.iteration is not None else self.warmup
            rec: dict[str, Any] = {
                "variant": self.variant, "kind": f.kind, "description": describe(f, self.warmup),
                "target": self._target(f), "planned_iteration": base,
            }
            start, end = self.started.get(n), self.ended.get(n)
            if start is None:
                out.append(FaultRecord.model_validate({**rec, "outcome": "failed" if n in self.errors else
                                                       "not-reached", "error": self.errors.get(n)}))
                continue
            end_t = end if end is not None else self.clock()
            over = [i for i in done if self.starts[i] <= end_t and self.ends[i] >= start]
            running = [i for i in self.starts if i not in self.ends and self.starts[i] <= end_t]
            after = [i for i in done if self.starts[i] >= end_t]
            before = [i for i in done if self.ends[i] < start]
            near = ([before[-1]] if before else []) + over + ([after[0]] if after else [])
            caught = resumed = caught_done = None
            if not isinstance(f, KillWorker) and self.transfers:
                ways = self._ways(f)
                on_link = [t for t in self.transfers if ways & set(getattr(t, "links", ()))
                           and t.sent is not None and t.arrived is not None]
                hit = [t.arrived for t in on_link if t.sent <= end_t and t.arrived >= start]
                caught = len(hit)
                caught_done = max(hit) - end_t if hit and max(hit) > end_t else None
                later = [t.arrived for t in on_link if t.arrived > end_t]
                resumed = min(later) - end_t if later else None
            dropped = None
            if isinstance(f, LinkDown | Partition) and end is not None:
                d = self._dropped.get(n, -1)
                dropped = d if d >= 0 else None
            rec.update(
                started=start, ended=end, iterations=sorted(set(over + running)),
                around=[IterationAround(iteration=i, time_s=self.ends[i] - self.starts[i], overlapped=i in over)
                        for i in near],
                recovery_s=(self.ends[after[0]] - end_t) if after else None,
                dropped_frames=dropped, transfers_caught=caught, transport_resumed_s=resumed,
                caught_done_s=caught_done,
                outcome="failed" if error is not None or n in self.errors else "survived",
                error=self.errors.get(n) or error,
            )
            out.append(FaultRecord.model_validate(rec))
        return out
