"""The BubbleTea agent loop: one per worker host, next to the training worker.

Each `step()`:
1. reads new slot publications of the worker and new device timeline records, and lets
   the slot tracker learn from slots that have passed; checks its own finished prefills
   for guard violations (training had to wait for one);
2. takes the requests that have arrived; rejects those too long for the model or any
   slot, those that find the queue full, those whose deadline passed while queued;
3. inside an open (corrected) slot, asks admission what fits in what is left of it and
   runs that chunk with `Device.try_run` (never queueing behind training: if training
   still holds the device the slot has not really begun). Until a slot's start has been
   learned, the device must have been idle for `settle_s` first (the worker releases it
   between two back-to-back pieces: such a gap is no slot). Once it holds the device,
   the chunk checks the clock again and runs nothing if it no longer fits (StartedLate);
4. ships each finished KV cache (asynchronously) and records TTFT on arrival.

All I/O is injected (clock, device, slot feed, timeline, shipper), so the loop runs
in-process against a simulated device and clock (`bubbletea_agent.sim`) in tests.
Times are `time.time()` seconds, the device timeline's clock; request arrival times
are offsets from `epoch` (given, or the moment the first slot is announced: requests
cannot be served before training starts, so by default they do not arrive before).
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from bubbletea_agent.admission import Action, Admission, Pending
from bubbletea_agent.engine import DeviceLike, KVCache, PrefillEngine, StartedLate
from bubbletea_agent.kv_ship import ShipResult
from bubbletea_agent.requests import Reason, Request, RequestLedger
from bubbletea_agent.slots import EndOfSlots, Slot, SlotTracker

log = logging.getLogger(__name__)


class Clock(Protocol):
    def now(self) -> float: ...
    def sleep(self, seconds: float) -> None: ...


class WallClock:
    """time.time(), the device timeline's clock."""

    def now(self) -> float:
        return time.time()

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            time.sleep(seconds)


@dataclass(frozen=True)
class Work:
    """A finished piece of device work, as the agent needs it."""

    kind: str
    owner: str
    label: str
    requested: float
    start: float
    end: float


class SlotSource(Protocol):
    def poll(self) -> Sequence[Slot | EndOfSlots]: ...


class TimelineSource(Protocol):
    def poll(self) -> Sequence[Work]:
        """Records finished since the previous poll."""
        ...


class Shipper(Protocol):
    def submit(self, request_id: str, kv: KVCache) -> None: ...
    def poll(self) -> Sequence[ShipResult]: ...
    def pending(self) -> int: ...
    def close(self, timeout: float = 30.0) -> None: ...


class TimelineTail:
    """Tails a device's timeline JSONL (testbed.device writes one line per finished work)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._offset = 0
        self._partial = b""

    def poll(self) -> list[Work]:
        try:
            with self.path.open("rb") as f:
                f.seek(self._offset)
                data = f.read()
        except FileNotFoundError:
            return []
        self._offset += len(data)
        *lines, self._partial = (self._partial + data).split(b"\n")
        out = []
        for raw in lines:
            try:
                d = json.loads(raw)
                out.append(Work(d["kind"], d["owner"], d.get("label", ""), float(d.get("requested", d["start"])),
                                float(d["start"]), float(d["end"])))
            except (ValueError, KeyError, TypeError):
                log.warning("%s: skipping unreadable timeline line %r", self.path, raw[:80])
        return out


def as_work(rec: Any) -> Work:
    return Work(rec.kind, rec.owner, getattr(rec, "label", ""), getattr(rec, "requested", rec.start),
                rec.start, rec.end)


@dataclass
class Counters:
    chunks_run: int = 0
    chunks_chunked: int = 0
    device_busy_retries: int = 0  # admitted, but training still held the device
    settle_waits: int = 0  # admitted, but training had released the device only just now
    late_starts: int = 0  # got the device too late for the chunk to fit: nothing ran
    predicted_slot_overruns: int = 0  # a chunk ended after the slot end it was admitted for
    guard_violations: int = 0  # training had to wait for one of our prefills
    training_wait_s: float = 0.0
    prefill_busy_s: float = 0.0
    not_arrived: int = 0  # requests of the source whose arrival time the run never reached


@dataclass
class Agent:
    """One agent; build with `make_agent` or by hand (tests)."""

    clock: Clock
    device: DeviceLike
    slots: SlotSource
    timeline: TimelineSource
    tracker: SlotTracker
    admission: Admission
    engine: PrefillEngine
    requests: Sequence[Request]
    epoch: float | None  # request arrival_s is relative to this; None: when the first slot is announced
    shipper: Shipper | None = None
    owner: str = "bubbletea"
    poll_s: float = 0.002  # re-check interval while waiting inside a slot
    idle_poll_s: float = 0.05  # longest sleep when nothing is expected sooner
    settle_s: float = 0.002  # idle time that proves a slot began before its sure start
    on_record: Callable[[dict[str, Any]], None] | None = None  # called once per ended request

    ledger: RequestLedger = field(default_factory=RequestLedger)
    queue: list[Pending] = field(default_factory=list)
    counters: Counters = field(default_factory=Counters)
    stopped: bool = False
    _next_req: int = 0
    _shipping: dict[str, Pending] = field(default_factory=dict)
    _training: list[tuple[float, float]] = field(default_factory=list)
    _unchecked: list[tuple[Work, str]] = field(default_factory=list)  # own prefills to check
    _last_training_start: float = -math.inf
    _last_training_end: float = -math.inf
    _screened_for: float | None = None
    _next_expiry: float = -math.inf

    def __post_init__(self) -> None:
        if self.on_record is not None:
            hook = self.on_record
            self.ledger.on_end = lambda rec: hook(rec.to_json())

    # ------------------------------------------------------------------ observe

    def _observe(self, now: float) -> None:
        for msg in self.slots.poll():
            if self.epoch is None and isinstance(msg, Slot):
                self.epoch = now  # training is about to start: requests start arriving now
                log.info("first slot announced: request time zero is %.3f", now)
            self.tracker.publish(msg)
        self._poll_timeline()
        self.tracker.observe(self._training, now)
        horizon = self.tracker.horizon_start()
        keep_from = (horizon if horizon is not None else now) - 1.0
        if self._training and self._training[0][1] < keep_from - 10.0:
            self._training = [t for t in self._training if t[1] >= keep_from]
        self.tracker.prune(now - 1.0)

    def _poll_timeline(self) -> None:
        for w in self.timeline.poll():
            if w.kind == "prefill":
                if w.owner == self.owner:
                    self._unchecked.append((w, w.label.split(":", 1)[0]))
                continue
            self._training.append((w.start, w.end))
            self._last_training_start = max(self._last_training_start, w.start)
            self._last_training_end = max(self._last_training_end, w.end)
            # a training piece that waited: did one of our prefills hold the device?
            for p, rid in self._unchecked:
                if p.start - 1e-4 <= w.requested < p.end - 1e-4 and w.start >= p.end - 1e-4:
                    self._violation(p, rid, p.end - w.requested)
        # a prefill is cleared once training has started after it (nobody waited)
        self._unchecked = [(p, r) for p, r in self._unchecked if p.end > self._last_training_start]

    def _settling(self, slot: Slot) -> float:
        """Seconds to wait before taking the device, 0 when it may be taken now.

        A free device may be the short gap between two training pieces (the worker
        releases the device between them), not the slot: take it only once training has
        left it idle for `settle_s`, unless the slot's start has been learned (this slot
        index was seen at least twice) and its sure start has passed."""
        now = self.clock.now()
        if now >= self.tracker.sure_start(slot) and self.tracker.observed(slot.index) >= 2:
            return 0.0
        self._poll_timeline()
        idle_for = now - self._last_training_end
        if idle_for >= self.settle_s:
            return 0.0
        return max(1e-4, self.settle_s - idle_for)

    def _violation(self, p: Work, rid: str, waited: float) -> None:
        self.counters.guard_violations += 1
        self.counters.training_wait_s += waited
        rec = self.ledger.records.get(rid)
        if rec is not None:
            rec.guard_violations += 1
        log.warning("guard violation: training waited %.2f ms for prefill %s", waited * 1e3, p.label)
        self._unchecked = [(q, r) for q, r in self._unchecked if q is not p]

    # ----------------------------------------------------------------- requests

    def _arrivals(self, now: float) -> float | None:
        """Admit arrived requests to the queue; returns the next arrival time."""
        if self.epoch is None:
            return None
        longest = self.tracker.longest_s()
        while self._next_req < len(self.requests):
            req = self.requests[self._next_req]
            if self.epoch + req.arrival_s > now:
                return self.epoch + req.arrival_s
            self._next_req += 1
            self.ledger.arrive(req)
            why = self.admission.too_long(req, longest)
            if why is not None:
                self._reject(req.id, Reason.TOO_LONG, why)
            elif len(self.queue) >= self.admission.cfg.max_queue:
                self._reject(req.id, Reason.QUEUE_FULL, f"{len(self.queue)} requests queued")
            else:
                self.queue.append(Pending(req))
                self._next_expiry = min(self._next_expiry, self.epoch + req.expires_at())
        return None

    def _expire(self, now: float) -> None:
        """Reject queued requests whose deadline passed (a started one is finished: its
        partial work is not thrown away), and, when the longest slot changed, those
        that no longer fit any slot."""
        if self.epoch is None:
            return
        longest = self.tracker.longest_s()
        rescreen = longest != self._screened_for
        self._screened_for = longest
        if not rescreen and now <= self._next_expiry:
            return
        keep = []
        self._next_expiry = math.inf
        for p in self.queue:
            req = p.request
            if not p.started and now > self.epoch + req.expires_at():
                self._reject(req.id, Reason.DEADLINE_PASSED,
                             f"waited {now - self.epoch - req.arrival_s:.3f} s > deadline {req.deadline_s} s")
            elif rescreen and not p.started and (why := self.admission.too_long(req, longest)) is not None:
                self._reject(req.id, Reason.TOO_LONG, why)
            else:
                keep.append(p)
                if not p.started:
                    self._next_expiry = min(self._next_expiry, self.epoch + req.expires_at())
        self.queue = keep

    def _reject(self, rid: str, reason: Reason, detail: str) -> None:
        self.ledger.reject(rid, reason, detail)

    def _ship_results(self) -> None:
        if self.shipper is None:
            return
        for res in self.shipper.poll():
            self._shipping.pop(res.request_id, None)
            if res.error is not None:
                self._reject(res.request_id, Reason.SHIP_FAILED, res.error)
            else:
                self.ledger.get(res.request_id).kv_bytes = res.wire_bytes
                self.ledger.serve(res.request_id, res.arrival - self.epoch)

    # --------------------------------------------------------------------- run

    def step(self) -> float:
        """One round of the loop; returns how long to sleep before the next."""
        now = self.clock.now()
        self._observe(now)
        self._ship_results()
        next_arrival = self._arrivals(now)
        self._expire(now)
        if self.tracker.ended and self.tracker.next_start(now) is None and self.tracker.current(now) is None:
            for p in list(self.queue):
                self._reject(p.request.id, Reason.NO_SLOTS, "training ended; no idle slot will come")
            self.queue.clear()
            self.stopped = True
            return 0.0
        wake = [t for t in (next_arrival, self.tracker.next_start(now)) if t is not None]
        slot = self.tracker.current(now)
        if slot is None or not self.queue:
            return self._sleep_for(now, wake)
        decision = self.admission.decide(slot.end - now, self.queue)
        if decision.action is Action.WAIT:
            return self._sleep_for(now, wake + [slot.end])
        wait = self._settling(slot)
        if wait > 0:
            self.counters.settle_waits += 1
            return wait
        return self._run(decision, slot, now)

    def _sleep_for(self, now: float, wake: list[float]) -> float:
        return max(0.0, min([self.idle_poll_s] + [t - now for t in wake]))

    def _run(self, decision: Any, slot: Slot, decided_at: float) -> float:
        p: Pending = decision.pending
        rid = p.request.id
        rec = self.ledger.get(rid)
        label = f"{rid}:{rec.chunks}:{decision.tokens}"
        latest = slot.end - decision.predicted_s - decision.guard_s  # latest start that still fits

        def start_check() -> None:
            if self.clock.now() > latest:
                raise StartedLate

        try:
            result = self.engine.run_chunk(self.device, self.owner, label, decision.tokens,
                                           decision.context, p.kv, final=decision.tokens == p.left,
                                           start_check=start_check)
        except StartedLate:  # the device came too late: nothing ran; decide again
            self.counters.late_starts += 1
            return 0.0
        except Exception as exc:  # noqa: BLE001 - a broken request must not stop the agent
            log.exception("prefill of %s failed", rid)
            self.queue.remove(p)
            self._reject(rid, Reason.ENGINE_ERROR, f"{type(exc).__name__}: {exc}")
            return 0.0
        if result is None:  # training still holds the device: the slot has not begun
            self.counters.device_busy_retries += 1
            return self.poll_s
        w = as_work(result.record)
        self.admission.guard.observe(decision.predicted_s, w.end - w.start, w.start - decided_at)
        self.counters.chunks_run += 1
        self.counters.chunks_chunked += int(decision.chunked)
        self.counters.prefill_busy_s += w.end - w.start
        if w.end > slot.end:
            self.counters.predicted_slot_overruns += 1
        if rec.start is None:
            rec.start = w.start - self.epoch
        rec.end = w.end - self.epoch
        rec.chunks += 1
        rec.predicted_s += decision.predicted_s
        rec.actual_s += w.end - w.start
        p.done_tokens += decision.tokens
        p.kv = result.partial
        rec.prefilled_tokens = p.done_tokens
        if p.left == 0:
            self.queue.remove(p)
            self._complete(p, w)
        return 0.0

    def _complete(self, p: Pending, w: Work) -> None:
        rid = p.request.id
        kv = self.engine.finish(p.kv)
        p.kv = None
        rec = self.ledger.get(rid)
        rec.kv_bytes = kv.logical_bytes
        if self.shipper is None:
            # no decode host: TTFT ends with the prefill on this device
            self.ledger.serve(rid, w.end - self.epoch,
                              "no decode host configured: TTFT measured to the end of prefill")
            return
        self._shipping[rid] = p
        try:
            self.shipper.submit(rid, kv)
        except Exception as exc:  # noqa: BLE001
            self._shipping.pop(rid, None)
            self._reject(rid, Reason.SHIP_FAILED, str(exc))

    def run(self, until: float | None = None, should_stop: Callable[[], bool] | None = None) -> None:
        """Loop until training ends (the worker's `end`), `until`, or should_stop()."""
        while not self.stopped:
            if should_stop is not None and should_stop():
                break
            if until is not None and self.clock.now() >= until:
                break
            dt = self.step()
            if until is not None:
                dt = min(dt, max(0.0, until - self.clock.now()))
            self.clock.sleep(dt)

    def finish(self, ship_timeout_s: float = 30.0, reason: Reason = Reason.RUN_ENDED,
               detail: str = "agent stopped before this request was served") -> dict[str, Any]:
        """Drain shipping, end every open request (with `reason`), return the counters."""
        if self.shipper is not None:
            self.shipper.close(ship_timeout_s)
            self._ship_results()
        for p in list(self.queue):
            if p.started:
                p.kv = None
        self.queue.clear()
        self.ledger.close(reason, detail)
        self.counters.not_arrived = len(self.requests) - self._next_req
        self.ledger.check()
        return self.summary()

    def summary(self) -> dict[str, Any]:
        counts = self.ledger.counts()
        counts["guard_violations"] = self.counters.guard_violations
        return {
            "engine_mode": self.engine.mode,
            **counts,
            "source_requests": len(self.requests),
            "counters": self.counters.__dict__,
            "guard_rel_margin": self.admission.guard.rel_margin,
            "start_latency_p50_s": self.admission.guard.start_latency(0.5),
            "start_latency_p99_s": self.admission.guard.start_latency(0.99),
            "latency_model": self.admission.model.describe(),
            "slots": self.tracker.stats(),
        }
