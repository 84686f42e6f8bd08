"""The BubbleTea agent loop: one per worker host, next to the training worker.

Each `step()`:
1. reads new slot publications of the worker and new device timeline records, and lets
   the slot tracker learn from slots that have passed; checks its own finished prefills
   for guard violations (training had to wait for one);
2. takes the requests that have arrived; refuses at once those too long for the model or
   any slot, those that find the queue full, those its device cannot prefill within their
   deadline (the controller decides that where one dispatches); a request taken is served;
3. inside an open (corrected) slot, asks admission what fits in what is left of it and
   runs that chunk with `Device.try_run` (never queueing behind training: if training
   still holds the device the slot has not really begun). Until a slot's start has been
   learned, the device must have been idle for `settle_s` first (the worker releases it
   between two back-to-back pieces: such a gap is no slot). Once it holds the device,
   the chunk checks the clock again and runs nothing if it no longer fits (StartedLate);
4. ships each finished KV cache (asynchronously) and records TTFT on arrival.

All I/O is injected (clock, device, slot feed, timeline, shipper), so the loop runs
in-process against a simulated device and clock (`bubbletea_agent.sim`) in tests; the
file readers are in runtime.py.
Times are `time.time()` seconds, the device timeline's clock; request arrival times
are offsets from `epoch` (given, or the moment the first slot is announced: requests
cannot be served before training starts, so by default they do not arrive before).
"""

from __future__ import annotations

import gc
import logging
import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from bubbletea_agent.admission import Action, Admission, Pending, PieceRun
from bubbletea_agent.engine import DeviceLike, KVCache, PrefillEngine, StartedLate
from bubbletea_agent.kv_ship import ShipResult
from bubbletea_agent.requests import Reason, Request, RequestLedger
from bubbletea_agent.slots import SlotTracker
from testbed_core.contracts.prefill_service import AgentStatus, Window
from testbed_runtime.agent_env import ADMIT_ENV
from testbed_runtime.slots import EndOfSlots, Slot

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
    holds: int = 0  # preemptible holds (layers of one or more chunks in one device hold)
    hold_wake_late_max_s: float = 0.0  # longest a hold's sleep overran its committed end
    yielded: int = 0  # holds that stopped early because training asked for the device
    revoked: int = 0  # holds training took back at their lease's deadline + guard (device.py)
    preempted_chunks: int = 0  # whole chunks cut short by training (run again in a later window)
    predicted_slot_overruns: int = 0  # a chunk ended after the slot end it was admitted for
    guard_violations: int = 0  # training had to wait for one of our prefills
    training_wait_s: float = 0.0
    prefill_busy_s: float = 0.0
    not_arrived: int = 0  # requests of the source whose arrival time the run never reached
    kv_digest_mismatches: int = 0  # caches the decode host refused: their xxh64 differed (not served)
    kv_decode_passed: int = 0  # caches whose decode step at the decode host gave the reference's next token
    kv_decode_failed: int = 0  # ... gave another token (served, flagged)


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
    # the worker's live guarantee (live.py): until when training surely leaves the device
    # alone (-inf: no guarantee); None: no live status
    live_bound: Callable[[], float] | None = None
    window: str = "planned"  # what admission may fill: planned | live | both (config.py)
    waker: Any = None  # live.Waker: sleeps end early when the worker changes state
    arrivals_until_iteration: int | None = None  # no arrival once this iteration is nearly over
    arrivals_margin_s: float = 0.5  # ... that is, this long before its planned end
    hold_chunk_tokens: int = 2048  # preemptible holds: chunk size when max_chunk_tokens is not set
    # run each hold at real-time priority (SCHED_FIFO 1, below the relay delay lines at 2): on an
    # emulated GPU the hold ends when this thread wakes, which must not wait for a busy core
    realtime_holds: bool = False
    # every hold is a lease (testbed_runtime/device.py): training takes the device back at the
    # window's end (as committed) plus this guard, whatever this process is doing then
    lease_guard_s: float = 0.005
    # False: never take the device (ADMIT_ENV=none): the agent's cost without its prefills
    admit: bool = field(default_factory=lambda: os.environ.get(ADMIT_ENV, "all") != "none")
    # dispatch: controller (bubbletea_agent/controller/): requests the controller sent this
    # agent (drained at every look at arrivals), and where the device's status goes
    inbox: Callable[[], Sequence[Request]] | None = None
    on_status: Callable[[AgentStatus], None] | None = None
    status_every_s: float = 0.05
    # "shortest": queued requests not yet started run fewest prompt tokens first (the
    # controller's order, controller/dispatch.py SERVICE_ORDER); "arrival": in arrival order
    order: str = "arrival"
    # refuse at arrival a request that cannot be prefilled within its deadline (its TTFT
    # budget): the work queued ahead of it plus its own, at the device's recent idle share,
    # would take longer (Reason.DEADLINE_UNREACHABLE, with the figures), instead of letting
    # it expire queued. Off where a controller decided already (dispatch: controller).
    refuse_unreachable: bool = True
    # a request taken into the queue is served, however late it turns out (the refusal is
    # made at arrival, once); False: one whose deadline passes before it starts is rejected
    # then (Reason.DEADLINE_PASSED)
    serve_admitted: bool = True
    # ... and once training has ended (the device is free) the queue is finished in one last
    # hold of at most this long; what is left then is rejected (Reason.NO_SLOTS)
    drain_s: float = 3.0

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
    _arrivals_closed_at: float | None = None
    _next_learn: float = -math.inf
    _ahead_s: float = 0.0  # predicted prefill seconds queued (refuse_unreachable), refreshed every 50 ms
    _ahead_at: float = -math.inf
    _next_scan: float = -math.inf
    _rt_on: bool = False
    _drain_until: float | None = None
    _taken: int = 0  # requests taken from the inbox
    _ahead: list[Request] = field(default_factory=list)  # from the inbox, sent ahead of their arrival
    _next_status: float = -math.inf
    _predicted: dict[str, float] = field(default_factory=dict)  # id -> predicted whole-prompt seconds
    # recent holds: start -> (window end at the last commit, committed end, actual end),
    # so that a guard violation says whether the window or the wake-up was late
    _recent_holds: dict[float, tuple[float, float, float]] = field(default_factory=dict)

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
            if (isinstance(msg, Slot) and self.arrivals_until_iteration is not None
                    and msg.iteration >= self.arrivals_until_iteration):
                # the last iteration began: requests stop arriving a margin before its
                # planned end (its last slot's end), so each can still be served
                close = max(now, msg.end - self.arrivals_margin_s)
                if self._arrivals_closed_at is None:
                    log.info("iteration %d announced: requests stop arriving in %.2f s", msg.iteration, close - now)
                self._arrivals_closed_at = max(self._arrivals_closed_at or close, close)
            self.tracker.publish(msg)
        self._poll_timeline()
        if self._preemptible() and now < self._next_learn:
            return  # live windows decide; the slot corrections are only statistics: learn now and then
        self._next_learn = now + 0.25
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
        dbg = self._recent_holds.get(round(p.start, 6))
        extra = "" if dbg is None else (f" (window end {dbg[0]:.4f}, committed to {dbg[1]:.4f}, held until "
                                        f"{dbg[2]:.4f}, training asked at {p.end - waited:.4f})")
        log.warning("guard violation: training waited %.2f ms for prefill %s%s", waited * 1e3, p.label, extra)
        self._unchecked = [(q, r) for q, r in self._unchecked if q is not p]

    # ----------------------------------------------------------------- requests

    def _arrivals(self, now: float) -> float | None:
        """Admit arrived requests to the queue; returns the next arrival time."""
        if self.epoch is None:
            self._publish_status(now)
            return None
        longest = None if self._preemptible() else self.tracker.longest_s()
        inbox_next = None
        if self.inbox is not None:
            # the controller sent these here; one sent ahead of its arrival waits for it
            got = self.inbox()
            if got:
                self._ahead.extend(got)
                self._ahead.sort(key=lambda r: r.arrival_s)
            while self._ahead and self.epoch + self._ahead[0].arrival_s <= now:
                req = self._ahead.pop(0)
                self._taken += 1
                self._admit(req, longest)
                self.ledger.get(req.id).taken = now - self.epoch
            if self._ahead:
                inbox_next = self.epoch + self._ahead[0].arrival_s
        self._publish_status(now)
        while self._next_req < len(self.requests):
            req = self.requests[self._next_req]
            if self._arrivals_closed_at is not None and self.epoch + req.arrival_s > self._arrivals_closed_at:
                return inbox_next  # after the arrival window: counted as not arrived
            if self.epoch + req.arrival_s > now:
                at = self.epoch + req.arrival_s
                return at if inbox_next is None else min(at, inbox_next)
            self._next_req += 1
            self._admit(req, longest)
        return inbox_next

    def _admit(self, req: Request, longest: float | None) -> None:
        assert self.epoch is not None
        self.ledger.arrive(req)
        why = self.admission.too_long(req, longest)
        if why is not None:
            self._reject(req.id, Reason.TOO_LONG, why)
        elif len(self.queue) >= self.admission.cfg.max_queue:
            self._reject(req.id, Reason.QUEUE_FULL, f"{len(self.queue)} requests queued")
        elif self.refuse_unreachable and (why := self._unreachable(req)) is not None:
            self._reject(req.id, Reason.DEADLINE_UNREACHABLE, why)
        else:
            i = len(self.queue)
            if self.order == "shortest":
                while (i > 0 and not self.queue[i - 1].started
                       and self.queue[i - 1].request.prompt_tokens > req.prompt_tokens):
                    i -= 1
            self.queue.insert(i, Pending(req))
            self._ahead_s += self._predict_whole(req)
            if not self.serve_admitted:
                self._next_expiry = min(self._next_expiry, self.epoch + req.expires_at())

    def _idle_share(self, now: float, span: float = 3.0) -> float:
        """The device's idle share over the last `span` seconds (training's records)."""
        busy = sum(max(0.0, min(e, now) - max(s, now - span)) for s, e in self._training[-512:])
        return min(1.0, max(0.0, 1.0 - busy / span))

    def _predict_whole(self, req: Request) -> float:
        whole = self._predicted.get(req.id)
        if whole is None:
            whole = self._predicted[req.id] = self.admission.model.predict(req.prompt_tokens, 0)
        return whole

    def _unreachable(self, req: Request) -> str | None:
        """Why `req` cannot start within its deadline here, or None: the prefill queued
        ahead of it (predicted seconds, the unfinished part of each; summed every 50 ms,
        admissions added meanwhile: this runs inside holds) at the device's recent idle
        share would take longer than its deadline."""
        if req.deadline_s is None:
            return None
        now = self.clock.now()
        if now - self._ahead_at > 0.05:  # a full sum now and then; admissions add to it meanwhile
            self._ahead_s = sum(self._predict_whole(p.request) * (p.left / max(1, p.request.prompt_tokens))
                                for p in self.queue)
            self._ahead_at = now
        ahead = self._ahead_s if self.queue else 0.0
        own = self._predict_whole(req)
        idle = max(self._idle_share(now), 0.05)
        wait = (ahead + own) / idle
        if wait <= req.deadline_s:
            return None
        return (f"{len(self.queue)} requests queued ahead ({ahead * 1e3:.0f} ms of prefill) and its own "
                f"{own * 1e3:.0f} ms: at this device's idle share of {idle:.0%} they take ~{wait:.2f} s, "
                f"past its {req.deadline_s:g} s deadline")

    # ------------------------------------------------------------------ status

    def _publish_status(self, now: float) -> None:
        if self.on_status is None or now < self._next_status:
            return
        self._next_status = now + self.status_every_s
        self.on_status(self.status(now))

    def status(self, now: float) -> AgentStatus:
        """The device as the controller needs it: the live window open now, the planned
        idle slots ahead (corrected), the recent idle share, the work queued here."""
        live = self._live_end(now) if self.window != "naive" else None
        upcoming = []
        if self.window != "naive":
            for slot in list(self.tracker.slots.values()):
                c = self.tracker.corrected(slot)
                if c.length > 0 and c.end > now:
                    upcoming.append(Window(start=c.start, end=c.end))
        idle = self._idle_share(now)
        backlog = 0.0
        for p in self.queue:
            whole = self._predicted.get(p.request.id, 0.0)
            backlog += whole * (p.left / max(1, p.request.prompt_tokens))
        upcoming.sort(key=lambda w: w.start)
        return AgentStatus(at=now, epoch=self.epoch, live_end=live, upcoming=upcoming[:8], idle_fraction=idle,
                           backlog_s=backlog, queued=len(self.queue), taken=self._taken,
                           arrivals_closed_at=self._arrivals_closed_at, ended=self.tracker.ended)

    def _expire(self, now: float) -> None:
        """Reject queued requests whose deadline passed (a started one is finished: its
        partial work is not thrown away), and, when the longest slot changed, those
        that no longer fit any slot."""
        if self.epoch is None:
            return
        preemptible = self._preemptible()
        longest = None if preemptible else self.tracker.longest_s()
        rescreen = longest != self._screened_for
        self._screened_for = longest
        if not rescreen and now <= self._next_expiry:
            return
        if preemptible and not rescreen and now < self._next_scan:
            return  # holds skip expired requests themselves: a full scan now and then is enough
        self._next_scan = now + 0.05
        keep = []
        self._next_expiry = math.inf
        for p in self.queue:
            req = p.request
            if not p.started and not self.serve_admitted and now > self.epoch + req.expires_at():
                self._reject(req.id, Reason.DEADLINE_PASSED,
                             f"waited {now - self.epoch - req.arrival_s:.3f} s > deadline {req.deadline_s} s")
            elif rescreen and not p.started and (why := self.admission.too_long(req, longest)) is not None:
                self._reject(req.id, Reason.TOO_LONG, why)
            else:
                keep.append(p)
                if not p.started and not self.serve_admitted:
                    self._next_expiry = min(self._next_expiry, self.epoch + req.expires_at())
        self.queue = keep

    def _reject(self, rid: str, reason: Reason, detail: str) -> None:
        self.ledger.reject(rid, reason, detail)

    def _ship_results(self) -> None:
        if self.shipper is None:
            return
        for res in self.shipper.poll():
            self._shipping.pop(res.request_id, None)
            rec = self.ledger.get(res.request_id)
            rec.kv_digest_ok, rec.kv_decode_ok = res.digest_ok, res.decode_ok
            self.counters.kv_digest_mismatches += int(res.digest_ok is False)
            self.counters.kv_decode_passed += int(res.decode_ok is True)
            self.counters.kv_decode_failed += int(res.decode_ok is False)
            if res.error is not None:
                self._reject(res.request_id, Reason.SHIP_FAILED, res.error)
            else:
                rec.kv_wire_bytes = res.wire_bytes
                rec.kv_modelled_s = res.modelled_s
                self.ledger.serve(res.request_id, res.arrival - self.epoch)

    # --------------------------------------------------------------------- run

    def step(self) -> float:
        """One round of the loop; returns how long to sleep before the next."""
        now = self.clock.now()
        if self._preemptible() and self.queue and not self.tracker.ended and self.admit:
            # a live window just opened (the worker woke us): take it first, look around
            # while its first layers run (`_hold` observes and admits arrivals meanwhile)
            live_end = self._live_end(now)
            if live_end is not None and self.admission.next_pieces(
                    live_end - now, self.queue, self._layers(), self._chunk_cap(),
                    now - self.epoch if self.epoch is not None and not self.serve_admitted else None) is not None:
                return self._hold(lambda: self._live_end(self.clock.now()) or -math.inf, now)
        self._realtime(False)
        self._observe(now)
        self._ship_results()
        next_arrival = self._arrivals(now)
        self._expire(now)
        if self.tracker.ended and self.tracker.next_start(now) is None and self.tracker.current(now) is None:
            if self.serve_admitted and self.admit and self.queue and self._preemptible():
                # training is over and the device free: finish what was admitted
                if self._drain_until is None:
                    self._drain_until = now + self.drain_s
                    log.info("training ended: finishing %d queued requests (at most %.1f s)", len(self.queue),
                             self.drain_s)
                if now < self._drain_until:
                    until = self._drain_until
                    self._hold(lambda: until, now)
                    if self.queue and self.clock.now() < until:
                        return self.poll_s
            for p in list(self.queue):
                self._reject(p.request.id, Reason.NO_SLOTS, "training ended; no idle slot will come")
            self.queue.clear()
            self.stopped = True
            return 0.0
        planned_start = None if self.window == "live" else self.tracker.next_start(now)
        wake = [t for t in (next_arrival, planned_start) if t is not None]
        slot = self.tracker.current(now) if self.window != "live" else None
        live_end = self._live_end(now)
        if (slot is None and live_end is None) or not self.queue:
            return self._sleep_for(now, wake)
        end = max(e for e in (slot.end if slot else None, live_end) if e is not None)
        # the work starts a little after this decision: leave it the usual delay, or a
        # chunk cut to fill the window exactly would no longer fit once it holds the device
        slack = self.admission.guard.start_latency(0.9) or 0.0
        if self._preemptible():
            fits = self.admission.next_pieces(end - now - slack, self.queue, self._layers(),
                                              self._chunk_cap()) is not None
            decision = None
        else:
            decision = self.admission.decide(end - now - slack, self.queue)
            fits = decision.action is not Action.WAIT
        if not fits or not self.admit:
            # a live window may widen as the worker confirms it (rolling bounds): look again soon
            again = [now + self.poll_s] if live_end is not None else []
            return self._sleep_for(now, wake + again + ([slot.end] if slot is not None else []))
        if live_end is None or (slot is not None and slot.end > live_end + 1e-9):
            assert slot is not None
            wait = self._settling(slot)  # a planned window: make sure it has begun
            if wait > 0:
                self.counters.settle_waits += 1
                return wait

        def end_now() -> float:
            live = self._live_end(self.clock.now())
            return max(e for e in (slot.end if slot else None, live, -math.inf) if e is not None)

        if decision is None:
            return self._hold(end_now, now)
        return self._run(decision, end_now, now)

    # ------------------------------------------------------------ preemptible holds

    def _preemptible(self) -> bool:
        """Layer-granular holds: modelled engines, with the worker's live windows."""
        return self.window != "planned" and self.live_bound is not None and getattr(self.engine, "mode", "") == "modelled"

    def _layers(self) -> int:
        return int(self.engine.spec.num_hidden_layers)

    def _chunk_cap(self) -> int:
        return self.admission.cfg.max_chunk_tokens or self.hold_chunk_tokens

    def _hold(self, end_now: Callable[[], float], decided_at: float) -> float:
        """One device hold that runs layers of queued chunks back to back, each group of
        layers only if its predicted time plus the guard ends before the window's end as
        known at that moment (`end_now`, re-read between groups). A chunk may stop between
        two layers and go on in a later window (a real engine keeps the hidden states at
        that layer); nothing ever runs past what the window allowed when it was committed.
        Bookkeeping (finished requests, KV shipping, new arrivals) is done while a group
        of layers runs, never after the last one: the hold ends when its work does."""
        clock, layers, cap = self.clock, self._layers(), self._chunk_cap()
        first = self.queue[0].request.id if self.queue else "idle"
        ran: list[PieceRun] = []
        finished: list[tuple[Pending, float]] = []
        last = {"end": 0.0, "cursor": 0.0}

        def pick(t: float) -> tuple[PieceRun | None, float]:
            end = end_now()
            rel_now = t - self.epoch if self.epoch is not None and not self.serve_admitted else None
            return self.admission.next_pieces(end - t, self.queue, layers, cap, rel_now), end

        leased = hasattr(self.device, "extend_lease")
        dev: Any = self.device

        def body() -> None:
            cursor = clock.now()
            while True:
                now = clock.now()
                t = max(now, cursor)
                if leased and dev.should_yield() is not None:
                    self.counters.yielded += 1
                    if not ran:
                        raise StartedLate  # training asked for the device before any layer ran
                    return
                run, end = pick(t)
                if run is None and not self.queue:
                    self._realtime(False)  # bookkeeping: at normal priority (below)
                    self._arrivals(now)  # the queue ran dry: take what arrived meanwhile
                    self._realtime(True)
                    run, end = pick(t)
                if run is None:
                    if not ran:
                        raise StartedLate  # the window closed before we held the device
                    return
                cursor = t + run.predicted_s
                last.update(end=end, cursor=cursor)
                if leased:
                    dev.extend_lease(min(end, cursor + run.guard_s))  # what this group committed to
                # while these layers run: settle what finished, look around, admit new arrivals,
                # at normal priority (in the run's idle cgroup: on a core training leaves free):
                # a real-time thread runs ahead of every training worker (issue 40). Starved
                # here, the hold only loses time of its own: its lease ends where committed.
                # Deciding, sleeping to the layers' end and handing the device back stay
                # real-time: training may be waiting for them
                self._realtime(False)
                self._settle(finished)
                if not ran:
                    self._observe(clock.now())
                    self._ship_results()
                self._arrivals(clock.now())
                busy_until = clock.now()
                self._realtime(True)
                stopped = self._sleep_in_hold(cursor) if leased else clock.sleep(cursor - clock.now())
                woke = clock.now()
                late = woke - cursor
                self.counters.hold_wake_late_max_s = max(self.counters.hold_wake_late_max_s, late)
                if leased and late > run.guard_s:
                    dev.lease_cause(f"{run.pending.request.id}: woke {late * 1e3:.1f} ms after its layers' end "
                                    f"(bookkeeping until {max(0.0, busy_until - cursor) * 1e3:+.1f} ms; "
                                    "descheduled or starved of CPU)")
                if stopped or (leased and dev.lease_revoked_at() is not None):
                    # training asked mid-group, or took the device back while we overslept:
                    # keep the layers that ran before then, on the device's clock
                    revoked_at = dev.lease_revoked_at() if leased else None
                    ran_until = woke if revoked_at is None else min(woke, revoked_at)
                    done_layers = min(run.pieces, int((ran_until - t) / run.piece_s)) if run.piece_s > 0 else 0
                    self.counters.yielded += 1
                    if done_layers > 0:
                        part = replace(run, pieces=done_layers)
                        done = self._advance(part, t, woke)
                        if done is not None:
                            finished.append((done, woke))
                        ran.append(part)
                    if not ran:
                        raise StartedLate
                    return
                whole_chunk = run.finishes_chunk
                done = self._advance(run, t, woke)
                if done is not None:
                    finished.append((done, woke))
                ran.append(run)
                if self.window == "naive" and whole_chunk:
                    return  # colocation: one whole chunk, then the device is free for whoever asks

        collecting = gc.isenabled()
        gc.disable()  # a garbage collection pause inside the hold would overrun the window
        self._realtime(True)
        try:
            rec = self.device.try_run("prefill", self.owner, duration_s=0.0, fn=body, label=f"{first}:hold",
                                      **self._lease_kw(end_now()))
        except StartedLate:
            self.counters.late_starts += 1
            return 0.0
        finally:
            self._realtime(False)
            if collecting:
                gc.enable()
        self._settle(finished)
        if rec is None:
            self.counters.device_busy_retries += 1
            return self.poll_s
        if getattr(rec, "revoked_at", None) is not None:
            self.counters.revoked += 1
        w = as_work(rec)
        self._recent_holds[round(w.start, 6)] = (last["end"], last["cursor"], w.end)
        if len(self._recent_holds) > 256:
            for key in sorted(self._recent_holds)[:128]:
                del self._recent_holds[key]
        self.counters.holds += 1
        self.counters.prefill_busy_s += w.end - w.start
        self.admission.guard.observe(0.0, 0.0, w.start - decided_at)  # start latency only
        return 0.0

    def _lease_kw(self, deadline: float) -> dict[str, Any]:
        """The lease arguments of a hold on a device that has leases (testbed_runtime/device.py)."""
        if not hasattr(self.device, "extend_lease") or not math.isfinite(deadline):
            return {}
        return {"deadline": deadline, "guard_s": self.lease_guard_s}

    def _sleep_in_hold(self, until: float) -> bool:
        """Sleep inside a leased hold until `until`, woken at once when training asks for
        the device (`Device.wait_yield`); True if it does or took it back (stop now)."""
        dev: Any = self.device
        while (left := until - self.clock.now()) > 0:
            if dev.wait_yield(left) is not None:
                return True
        return dev.should_yield() is not None

    def _realtime(self, on: bool) -> bool:
        """Switch this thread to SCHED_FIFO 1 (on) or back to normal; False where not allowed.
        On while it holds the device and while it sleeps waiting for the worker (so that
        it wakes at once), off for its bookkeeping, inside holds too (a real-time thread
        runs ahead of every training worker)."""
        if not self.realtime_holds or on == self._rt_on:
            return self._rt_on
        try:
            if on:
                os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))
            else:
                os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
            self._rt_on = on
        except (OSError, AttributeError) as exc:
            log.warning("real-time holds unavailable (%s): holds may end late under CPU contention", exc)
            self.realtime_holds = False
        return self._rt_on

    def _advance(self, run: PieceRun, start: float, end: float) -> Pending | None:
        """Progress of layers that ran from `start` to `end` (wall clock): cheap state only.
        Returns the pending if its whole prompt is now prefilled (taken off the queue)."""
        p = run.pending
        rec = self.ledger.get(p.request.id)
        self.admission.guard.observe(run.predicted_s, end - start)
        if rec.start is None:
            rec.start = start - self.epoch
        rec.end = end - self.epoch
        rec.predicted_s += run.predicted_s
        rec.actual_s += end - start
        if p.chunk_tokens == 0:
            p.chunk_tokens = run.tokens
        p.chunk_pieces_done += run.pieces
        if p.chunk_pieces_done < run.pieces_total:
            return None
        self.counters.chunks_run += 1
        self.counters.chunks_chunked += int(run.tokens < p.left)
        rec.chunks += 1
        p.done_tokens += run.tokens
        p.kv = p.done_tokens
        p.chunk_tokens = p.chunk_pieces_done = 0
        rec.prefilled_tokens = p.done_tokens
        if p.left > 0:
            return None
        self.queue.remove(p)
        return p

    def _settle(self, finished: list[tuple[Pending, float]]) -> None:
        """KV caches of fully prefilled requests: finish and ship (or serve) them."""
        while finished:
            p, end = finished.pop(0)
            self._complete(p, Work("prefill", self.owner, p.request.id, end, end, end))

    def _live_end(self, now: float) -> float | None:
        """The worker's live guarantee, if it leaves any time from `now` (window live/both)."""
        if self.live_bound is None or self.window == "planned":
            return None
        bound = self.live_bound()
        return bound if bound > now else None

    def _sleep_for(self, now: float, wake: list[float]) -> float:
        return max(0.0, min([self.idle_poll_s] + [t - now for t in wake]))

    def _run(self, decision: Any, end_now: Callable[[], float], decided_at: float) -> float:
        """Run the decided chunk if, once the device is held, it still ends (predicted time
        plus guard) before the window's end as known then (`end_now`)."""
        p: Pending = decision.pending
        rid = p.request.id
        rec = self.ledger.get(rid)
        label = f"{rid}:{rec.chunks}:{decision.tokens}"
        need = decision.predicted_s + decision.guard_s
        window_end = end_now()

        def start_check() -> None:
            nonlocal window_end
            window_end = end_now()
            if self.clock.now() + need > window_end:
                raise StartedLate

        try:
            result = self.engine.run_chunk(self.device, self.owner, label, decision.tokens,
                                           decision.context, p.kv, final=decision.tokens == p.left,
                                           start_check=start_check, **self._lease_kw(window_end))
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
        if getattr(result.record, "preempted", False):
            # training asked for the device mid-chunk: nothing of it counts; it runs again later
            self.counters.preempted_chunks += 1
            self.counters.prefill_busy_s += w.end - w.start
            return 0.0
        self.admission.guard.observe(decision.predicted_s, w.end - w.start, w.start - decided_at)
        self.counters.chunks_run += 1
        self.counters.chunks_chunked += int(decision.chunked)
        self.counters.prefill_busy_s += w.end - w.start
        if w.end > window_end:
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
            if self.waker is not None and dt > 0:
                self._realtime(True)  # wake at once when the worker pokes
                self.waker.wait(dt)  # the worker's state changes end the sleep early
            else:
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
        for req in self._ahead:  # sent ahead by the controller, not arrived yet: they end here too
            self.ledger.arrive(req)
        self._ahead.clear()
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
