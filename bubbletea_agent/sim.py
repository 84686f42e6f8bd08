"""An in-process world for the agent: a fake clock, a simulated device that plays a
training schedule, and a slot feed. It runs the real agent loop (admission, tracker,
engine, ledger) in virtual time, so tests and quick what-ifs take milliseconds.

The simulated training worker asks for the device for each piece of its schedule at
the piece's planned time, or when its previous piece ends if that is later (the
pipeline dependency), and waits if a prefill holds the device: a prefill that
overruns its slot delays training here exactly as it would on the emulated GPU, and
the timeline shows it (`requested` < `start`). `simulate_agent` plays a whole run and
returns an `AgentSimResult` (not to be confused with testbed_core.simulate, the
pipeline-schedule simulator).
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from bubbletea_agent.agent import Work
from testbed_core.device_records import WorkRecord
from testbed_runtime.slots import EndOfSlots, Slot

SIM_DEVICE = "sim"  # the one device of a simulation, as its records name it


class FakeClock:
    def __init__(self, start: float = 1_000.0) -> None:
        self.t = start

    def now(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        self.t += max(0.0, seconds)


@dataclass
class Piece:
    """One piece of training work: planned start and duration."""

    planned: float
    duration: float
    label: str = ""
    kind: str = "forward"


@dataclass
class SimDevice:
    """A device shared by a scripted training worker and the agent (virtual time)."""

    clock: FakeClock
    training: list[Piece]
    mode: str = "modelled"
    time_scale: float = 1.0
    records: list[WorkRecord] = field(default_factory=list)
    _next: int = 0
    _free_at: float = -np.inf
    _prev_end: float = -np.inf
    _visible: list[tuple[float, int, WorkRecord]] = field(default_factory=list)
    _seq: int = 0

    def _add(self, rec: WorkRecord) -> None:
        self.records.append(rec)
        heapq.heappush(self._visible, (rec.end, self._seq, rec))
        self._seq += 1

    def _settle(self, now: float) -> None:
        """Start every training piece the worker has asked for by `now`."""
        while self._next < len(self.training):
            piece = self.training[self._next]
            requested = max(piece.planned, self._prev_end)
            if requested > now:
                return
            start = max(requested, self._free_at)
            end = start + piece.duration
            self._add(WorkRecord(SIM_DEVICE, piece.kind, "trainer", piece.label, requested, start, end, self.mode))
            self._free_at = self._prev_end = end
            self._next += 1

    def busy(self) -> bool:
        now = self.clock.now()
        self._settle(now)
        return self._free_at > now

    def _do(self, kind: str, owner: str, duration_s: float | None, fn: Callable[[], Any] | None,
            label: str) -> WorkRecord | None:
        now = self.clock.now()
        self._settle(now)
        if self._free_at > now:
            return None
        result = None
        if fn is not None:
            t0 = time.perf_counter()
            result = fn()
            measured = time.perf_counter() - t0
            if self.mode == "real":  # modelled: fn is free in virtual time (keeps the sim exact)
                duration_s = measured
        if duration_s is None:
            raise ValueError("simulated work needs duration_s or fn")
        end = now + duration_s * (self.time_scale if self.mode == "modelled" else 1.0)
        rec = WorkRecord(SIM_DEVICE, kind, owner, label, now, now, end, self.mode, result=result)
        self._add(rec)
        self._free_at = end
        self.clock.t = end
        return rec

    def try_run(self, kind: str, owner: str, *, flops: float | None = None, duration_s: float | None = None,
                fn: Callable[[], Any] | None = None, label: str = "") -> WorkRecord | None:
        return self._do(kind, owner, duration_s, fn, label)

    def run(self, kind: str, owner: str, *, flops: float | None = None, duration_s: float | None = None,
            fn: Callable[[], Any] | None = None, label: str = "") -> WorkRecord:
        while (rec := self._do(kind, owner, duration_s, fn, label)) is None:
            self.clock.t = self._free_at
        return rec

    def timeline(self, since: float | None = None) -> list[WorkRecord]:
        now = self.clock.now()
        self._settle(now)
        return sorted((r for r in self.records if r.end <= now and (since is None or r.end > since)),
                      key=lambda r: r.start)

    def finish_training(self) -> None:
        """Play the rest of the training schedule (after the agent stopped)."""
        self._settle(np.inf)


class SimTimeline:
    """TimelineSource over a SimDevice: records become visible when they end."""

    def __init__(self, device: SimDevice) -> None:
        self.device = device

    def poll(self) -> list[Work]:
        now = self.device.clock.now()
        self.device._settle(now)
        out = []
        vis = self.device._visible
        while vis and vis[0][0] <= now:
            _, _, r = heapq.heappop(vis)
            out.append(Work(r.kind, r.owner, r.label, r.requested, r.start, r.end))
        return out


class ListSlotFeed:
    """SlotSource releasing (publish_time, message) items as the clock passes them."""

    def __init__(self, clock: FakeClock, items: Sequence[tuple[float, Slot | EndOfSlots]]) -> None:
        self.clock = clock
        self.items = sorted(items, key=lambda it: it[0])
        self._i = 0

    def poll(self) -> list[Slot | EndOfSlots]:
        out = []
        while self._i < len(self.items) and self.items[self._i][0] <= self.clock.now():
            out.append(self.items[self._i][1])
            self._i += 1
        return out


@dataclass
class Schedule:
    """A periodic training schedule and the slots a worker would publish for it."""

    pieces: list[Piece]
    published: list[tuple[float, Slot | EndOfSlots]]
    t0: float
    t1: float  # planned end of training


def periodic_schedule(
    t0: float,
    iterations: int,
    period_s: float,
    busy: Sequence[tuple[float, float]],
    *,
    jitter_s: float = 0.0,
    start_late_s: float = 0.0,
    seed: int = 0,
    lead_s: float | None = None,
) -> Schedule:
    """Training busy spans (offset, duration) repeated every `period_s`; the idle gaps
    between them are the published slots (predicted from the plan). `start_late_s`
    makes every real piece start that much later than planned and `jitter_s` adds
    uniform noise in [0, jitter_s] to each piece's duration: the reality the agent's
    corrections must learn. Slots are published `lead_s` before each iteration
    (default: one period)."""
    rng = np.random.default_rng(seed)
    spans = sorted(busy)
    pieces: list[Piece] = []
    published: list[tuple[float, Slot | EndOfSlots]] = []
    lead = period_s if lead_s is None else lead_s
    for it in range(iterations):
        base = t0 + it * period_s
        idx = 0
        for k, (off, dur) in enumerate(spans):
            noise = float(rng.uniform(0, jitter_s)) if jitter_s else 0.0
            pieces.append(Piece(base + off + start_late_s, dur + noise, f"it{it}-p{k}"))
            gap_start = base + off + dur
            gap_end = base + (spans[k + 1][0] if k + 1 < len(spans) else period_s + spans[0][0])
            if gap_end - gap_start > 1e-9:
                published.append((base - lead, Slot(it, idx, gap_start, gap_end - gap_start)))
                idx += 1
    t1 = t0 + iterations * period_s
    published.append((t1, EndOfSlots()))
    return Schedule(pieces, published, t0, t1)


@dataclass
class AgentSimResult:
    agent: Any  # bubbletea_agent.agent.Agent
    device: SimDevice
    schedule: Schedule
    summary: dict[str, Any]
    rows: list[dict[str, Any]]

    def metrics(self) -> dict[str, Any]:
        from bubbletea_agent.metrics import summarize

        return summarize(self.rows, self.device.records, self.schedule.t0, self.schedule.t1)

    def training_delays(self) -> list[float]:
        """How long each training piece waited for the device."""
        return [r.start - r.requested for r in self.device.records if r.kind != "prefill"]


def simulate_agent(
    schedule: Schedule,
    requests: Sequence[Any],
    charge: Callable[[int, int], float],
    *,
    predict: Callable[[int, int], float] | None = None,
    admission: Any = None,
    guard: Any = None,
    tracker: Any = None,
    epoch: float | None = None,
    spec: Any = None,
    **agent_kw: Any,
) -> AgentSimResult:
    """Run the real agent loop against `schedule` in virtual time.

    `charge(tokens, context)` is what a prefill chunk really costs on the simulated
    device; `predict` what the agent believes (default: the same, a perfect model)."""
    from bubbletea_agent.admission import AdaptiveGuard, Admission, AdmissionConfig
    from bubbletea_agent.agent import Agent
    from bubbletea_agent.engine import ModelledEngine
    from bubbletea_agent.latency import FunctionLatency
    from bubbletea_agent.slots import SlotTracker
    from testbed_core.contracts.bubbletea import PrefillModelSpec

    clock = FakeClock(schedule.t0 - 1.0)
    device = SimDevice(clock, list(schedule.pieces))
    engine = ModelledEngine(spec or PrefillModelSpec(preset="tiny"), charge)
    model = FunctionLatency(predict or charge, source="sim")
    rows: list[dict[str, Any]] = []
    agent = Agent(
        clock=clock, device=device, slots=ListSlotFeed(clock, schedule.published),
        timeline=SimTimeline(device), tracker=tracker or SlotTracker(),
        admission=Admission(model, admission or AdmissionConfig(), guard or AdaptiveGuard()),
        engine=engine, requests=list(requests), epoch=schedule.t0 if epoch is None else epoch,
        on_record=rows.append, **agent_kw,
    )
    agent.run(until=schedule.t1 + 1.0)
    summary = agent.finish()
    device.finish_training()
    return AgentSimResult(agent, device, schedule, summary, rows)
