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

A link outage is known before the run (it is in the scenario), so it is predicted,
not left out of the judgement (`forecast`): the planner's healthy iteration says
which WAN transfers are under way when the link goes down; each of their streams
gets nothing through until its first retransmission after the link is back, then
sends its lost window again from one packet in slow start. A stream's retries
(`resume_after_outage`) are Linux's: the tail-loss probe two smoothed RTTs after the
last packet left, then the retransmission timeout (the smoothed RTT + 200 ms),
doubling at every retry. The smoothed RTT is not known before the run: it is the
path's RTT plus whatever the link's queue (and a loaded relay) adds while the tensors
cross, so the forecast takes it anywhere from the RTT to the RTT plus the link's full
queue (`SRTT_SAMPLES` values, evenly) and keeps the mean stall over them, with its
range. Nor is each stream's phase known: its oldest unacknowledged packet may have left
up to a delayed ACK's longest wait (Linux's TCP_DELACK_MAX, `HEAD_AGE_S`) before the
cut, its retries that much earlier; with many streams, one of them is in the worst
phase, and it sets the stall. Where the link comes back while some streams retry (the
same outage then costs one back-off more or less, by chance), the forecast says so: a
scenario should time its outage between the retries' spans (scenarios/faults-2dc.yaml
does). A stream caught mid-flight (its oldest packets arrived, only their
acknowledgements were lost) may have its retry judged spurious and undone, its lost
packets then waiting for a probe at an RTT the outage inflated (`undo_extra_s`): by
chance, so the forecast leaves it out of its mean and says how far past its range it
may go; a scenario predicts its outage by cutting the link while the WAN is idle, the
first tensors sent into the dead link (scenarios/faults-2dc.yaml does). The stall, the
longest over the transfers caught, is added to the iteration the outage starts in (the WAN is on its critical path
while its micro-batches cross); the variant's headline prediction is the mean over
the measured iterations. A delay spike is not forecast (its iterations are predicted
as healthy ones, and the record says so).
"""

from __future__ import annotations

import math
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
from testbed_core.planning.lossy import MSS, pto_s, rto_s
from testbed_core.topology import MAX_DOWN_S, Delay, Duration, _seconds, _within
from testbed_core.units import parse_duration, unit_validator

if TYPE_CHECKING:
    from testbed.emulation.network import Emulation
    from testbed.run.metrics import TransferRecord
    from testbed_core.planning.prediction import Prediction
    from testbed_core.topology import Topology
    from testbed_core.workload import Workload

MAX_FAULTS = 100
MAX_FAULT_AT_S = 3_600.0
RTO_MAX_S = 120.0  # Linux's TCP_RTO_MAX: the retransmission timeout stops doubling there
SRTT_SAMPLES = 21  # smoothed RTTs the outage forecast averages over (RTT to RTT + the link's queue)
HEAD_AGE_S = 0.2  # how much older than the cut a stream's oldest unacknowledged packet may be (TCP_DELACK_MAX)
HEAD_SAMPLES = 9  # ages the forecast tries in that span (the stream that waits longest sets the stall)


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


@dataclass(frozen=True)
class FaultForecast:
    """What a fault is predicted to add, before the run: `delay_s` seconds to iteration
    `iteration` (warm-ups count from 0), or None where the kind has no model."""

    fault: int  # its index in the scenario's faults
    iteration: int
    delay_s: float | None
    why: str


def resume_after_outage(head_s: float, up_s: float, rtt_s: float, srtt_s: float | None = None) -> float:
    """When a TCP stream whose last packet before the outage left at `head_s` gets data
    through again after an outage ending at `up_s`: the tail-loss probe leaves
    ``pto_s(srtt)`` after it, the retransmissions ``RTO (2^k - 1)`` after the probe (the
    timeout, ``rto_s(srtt)``, doubling at each retry, at most RTO_MAX_S apart), and the
    first at or after `up_s` is delivered. `srtt_s`: the stream's smoothed RTT (default
    the path's `rtt_s`)."""
    return _first_retry(head_s, up_s, rtt_s if srtt_s is None else srtt_s)[0]


def _first_retry(head_s: float, up_s: float, srtt_s: float) -> tuple[float, int]:
    """When the first retry at or after `up_s` leaves (`resume_after_outage`), and which
    it is: the tail-loss probe 0, then each retransmission timeout."""
    t, step, k = head_s + pto_s(srtt_s), rto_s(srtt_s), 0
    while t < up_s:
        t, step, k = t + step, min(2 * step, RTO_MAX_S), k + 1
    return t, k


def slow_start_extra_s(window_bytes: float, rtt_s: float) -> float:
    """What re-sending a lost window of `window_bytes` costs after a retransmission
    timeout (the window back to one packet, doubling each round trip) beyond the one
    round trip it takes with the window open: ``(ceil(log2(packets + 1)) - 1) x RTT``."""
    packets = max(1, math.ceil(window_bytes / MSS))
    return (math.ceil(math.log2(packets + 1)) - 1) * rtt_s


def forecast(faults: Sequence[AnyFault], warmup: int, prediction: Prediction,
             topology: Topology | None = None) -> list[FaultForecast]:
    """Each fault's predicted effect on the iteration it starts in (module docstring),
    from the planner's healthy iteration (`prediction`: its simulated transfers, paths
    and time). A fault timed past the healthy iteration's end falls in a later one."""
    healthy = prediction.iteration_time_s
    out = []
    for n, f in enumerate(faults):
        it = f.iteration if f.iteration is not None else warmup
        at = f.at
        if healthy > 0:
            skip = int(at // healthy)
            it, at = it + skip, at - skip * healthy
        if isinstance(f, KillWorker):
            out.append(FaultForecast(n, it, None, "not forecast: a killed worker fails the variant"))
            continue
        if isinstance(f, DelaySpike):
            out.append(FaultForecast(n, it, None, "not forecast: the iterations a delay spike overlaps are predicted "
                                                  "as healthy ones"))
            continue
        if isinstance(f, Partition):
            names = [link.name for link in topology.wan if f.dc in link.between] if topology is not None else []
        else:
            names = [link_name(topology, f.link) or f.link if topology is not None else f.link]
        ways = set()
        for name in names:
            a, _, b = name.partition("-")
            ways |= {f"wan:{a}->{b}", f"wan:{b}->{a}"}
        down, up = at, at + f.duration
        caught = []  # (stopped, rtt, window, queue_s, under way) of each transfer on the link while it is down
        for t in prediction.sim.transfers:
            if not ways & set(t.resources) or t.arrival <= down or t.start >= up:
                continue
            head = max(t.start, down)  # under way when the link went down, or sent into the outage
            path = prediction.spec.path(t.key)
            rtt = 2 * path.latency_s
            wp = next((w for w in prediction.paths.values() if ways & set(w.resources)), None)
            streams = wp.streams if wp is not None else 1
            window = min(wp.window_bytes if wp is not None else math.inf, t.nbytes / max(1, streams))
            window = window if math.isfinite(window) else t.nbytes / max(1, streams)
            # mid-flight: some of its packets got across before the cut (it started more than a
            # one-way delay before it); one started later lost all it sent on the wire
            caught.append((head, rtt, window, _queue_s(topology, names), t.start < down - path.latency_s))
        what = f"{describe(f, warmup)}: "
        if not caught:
            out.append(FaultForecast(n, it, 0.0, what + "no WAN transfer on the link while it is down"))
            continue
        out.append(_outage_forecast(n, it, what, caught, up))
    return out


def _queue_s(topology: Topology | None, names: Sequence[str]) -> float:
    """The most the cut links' queues add to a stream's RTT (a full queue at the link's
    rate, the longest of them); 0 without the topology."""
    if topology is None:
        return 0.0
    links = [link for link in topology.wan if link.name in names]
    return max((link.queue_bytes * 8 / link.rate for link in links if link.rate > 0), default=0.0)


def _outage_forecast(n: int, it: int, what: str, caught: Sequence[tuple[float, float, float, float, bool]],
                     up: float) -> FaultForecast:
    """The stall of the transfers `caught` by an outage ending at `up`: from when each
    stopped to its streams' latest first retry after `up`, plus its lost window in slow
    start, the longest over them; averaged over the smoothed RTTs they may have, with
    the oldest unacknowledged packet of a stream caught mid-flight anywhere in the
    HEAD_AGE_S before the cut (module docstring). A stream caught mid-flight may also
    have its retry judged spurious (`undo_extra_s`): the forecast's mean leaves that out,
    and says by how much it may exceed its range."""
    stalls, setting, toss, undo = [], set(), False, 0.0
    for j in range(SRTT_SAMPLES):
        x = j / (SRTT_SAMPLES - 1)
        worst, worst_k = 0.0, 0
        for stopped, rtt, window, queue_s, under_way in caught:
            srtt = rtt + x * queue_s
            heads = [stopped - HEAD_AGE_S * i / (HEAD_SAMPLES - 1) for i in range(HEAD_SAMPLES)] if under_way \
                else [stopped]
            ks = set()
            for head in heads:
                resume, k = _first_retry(head, up, srtt)
                stall = resume + slow_start_extra_s(window, rtt) - stopped
                ks.add(k)
                if under_way:
                    undo = max(undo, stall + undo_extra_s(resume - head, srtt, window, rtt))
                if stall > worst:  # the queue empty again: slow start at the path's RTT
                    worst, worst_k = stall, k
            toss |= len(ks) > 1  # the stream's phase decides which retry gets through
        stalls.append(worst)
        setting.add(worst_k)
    toss |= len(setting) > 1  # the smoothed RTT decides it
    stall, lo, hi = sum(stalls) / len(stalls), min(stalls), max(stalls)
    text = what + f"+{stall:.2f} s in iteration {it} (the outage, TCP's retransmission back-off after it and the " \
                  "lost windows sent again in slow start"
    if hi - lo > 0.005:
        text += f"; {lo:.2f}-{hi:.2f} s as the streams' smoothed RTT runs from the path's RTT to it plus the " \
                "link's full queue"
    if toss:
        text += ("; the link comes back while some streams retry: the same outage costs one back-off more or "
                 "less by chance (time it between retries to predict it)")
    if undo > hi + 0.005:
        text += (f"; up to {undo:.2f} s where a stream caught mid-flight has its retry judged spurious (its "
                 "oldest packets had arrived, only their acknowledgements were lost), by chance (cut the link "
                 "between transfers to predict it)")
    return FaultForecast(n, it, stall, text + ")")


def undo_extra_s(silent_s: float, srtt_s: float, window_bytes: float, rtt_s: float) -> float:
    """What a stream caught mid-flight may pay after its retry gets through, beyond the
    stall `_outage_forecast` counts: its oldest packets had arrived before the cut and
    only their acknowledgements were lost, so the retry is acknowledged as a duplicate
    (DSACK) past data never sent again, Linux judges the timeout spurious (F-RTO) and
    undoes it: the window is restored and the packets really lost count as still in
    flight. Nothing repairs them until the tail-loss probe, two smoothed RTTs later, and
    that smoothed RTT took in one sample spanning the silence (`silent_s`, the retry's
    acknowledgement echoing a timestamp from before the cut, weight 1/8); then they are
    sent again from a window of a packet or two (`slow_start_extra_s` once more)."""
    inflated = srtt_s + (silent_s + rtt_s - srtt_s) / 8
    return pto_s(inflated) + slow_start_extra_s(window_bytes, rtt_s)


def with_forecasts(healthy_s: float, forecasts: Sequence[FaultForecast], warmup: int, iterations: int) -> float:
    """The mean predicted iteration time over the measured iterations (those after the
    `warmup`), each fault's predicted delay added to the iteration it starts in."""
    extra = sum(fc.delay_s for fc in forecasts
                if fc.delay_s is not None and warmup <= fc.iteration < warmup + iterations)
    return healthy_s + extra / max(1, iterations)


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
    forecasts: list[FaultForecast] = field(default_factory=list)  # `predict`: each fault's a-priori effect
    _drops_before: dict[int, int] = field(default_factory=dict)  # by fault: the links' down_drops when it began
    _cut: set[int] = field(default_factory=set)  # link faults whose cut has begun (no early reading after it)
    _dropped: dict[int, int] = field(default_factory=dict)  # by fault: frames its links dropped while it lasted (-1: unknown)

    # ------------------------------------------------------------ forecast

    def predict(self, prediction: Prediction, iterations: int) -> tuple[float, str]:
        """Before the variant runs: each fault's predicted effect (`forecast`, kept for
        the records) and the variant's headline prediction with them, the mean over its
        `iterations` measured ones, with the sentence that says so."""
        self.forecasts = forecast(self.faults, self.warmup, prediction, self.topology)
        mean = with_forecasts(prediction.iteration_time_s, self.forecasts, self.warmup, iterations)
        return mean, "faults forecast: " + "; ".join(fc.why for fc in self.forecasts)

    # ------------------------------------------------------------ hooks

    def iteration_started(self, i: int, at: float) -> None:
        """Iteration `i` starts at wall-clock `at`: arm the faults timed from it."""
        self.starts[i] = at
        for n, f in enumerate(self.faults):
            base = f.iteration if f.iteration is not None else self.warmup
            if base == i:
                if isinstance(f, LinkDown | Partition):  # the drop counters now, off the cut's own path
                    self._arm(0.0, lambda n=n: self._count_drops_before(n))
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
                with self._lock:
                    self._cut.add(n)
                    counted = n in self._drops_before
                if not counted:  # the early reading has not come back: read now, before the cut
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

    def _count_drops_before(self, n: int) -> None:
        """Read the links' drop counters for fault `n` ahead of its cut: a reading is a
        round trip to the delay line (tens of milliseconds on a loaded host), which, taken
        at the cut, would delay the cut by as much and could let a transfer timed to start
        just after it get under way first (`forecast` then no longer holds). Frames are
        counted only while the link is down, so any reading before the cut serves; one
        that comes back after it is dropped."""
        before = self._down_drops(self._links(self.faults[n]))  # type: ignore[arg-type]
        with self._lock:
            if n not in self._cut:
                self._drops_before[n] = before

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
            fc = next((c for c in self.forecasts if c.fault == n), None)
            if fc is not None:
                rec.update(predicted_delay_s=fc.delay_s, forecast=fc.why)
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
