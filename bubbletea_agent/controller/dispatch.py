"""The controller's decisions (sans-IO): which device serves a request, or why none can.

Each agent syncs its device's status (`AgentStatus`): the live window open now (training
leaves the device alone until `live_end`), the planned idle slots ahead, the share of
recent time the device was idle, and the predicted device seconds still queued there.
From that the dispatcher sees, per device, how much prefill time each moment ahead
holds: the open window, then the upcoming slots, then beyond the last known slot the
recent idle share of the wall clock. A request of predicted time `W` on a device with
`B` seconds of work ahead of it starts when the bubbles ahead have absorbed `B` and
finishes when they have absorbed `B + W`. It goes to the device that finishes it soonest
among those that finish it within its deadline (its TTFT budget); when none can it is
refused at once (`deadline_unreachable`), and one that even an empty device could not finish
within `horizon_s`, or longer than the model's context, is `too_long`. That decision is made
once, when the request arrives: a request admitted is served, on whichever device finishes
it soonest then, however late that turns out; it is never left to expire in a queue.

Work dispatched but not yet in an agent's reported backlog (sent since its last status)
is added on the controller's side, so a burst of arrivals between two syncs spreads over
the devices instead of piling onto the one that looked emptiest.

What a device really delivers falls behind its bubbles' prediction when its agent wakes
late for its windows or the host's CPU is short: each device keeps how much slower its
admitted requests ended than predicted (arrival to the last KV byte, over arrival to the
finish predicted when each was admitted, that at least `SLOW_FLOOR_S`; the last
`LATE_WINDOW` that ended within `LATE_AGE_S`), and admission stretches that device's
predicted wait by their `LATE_QUANTILE` (never below 1), or, if more, by how overdue the
requests it holds are now (the oldest past its predicted finish: a device that delivers
nothing shows no ended request, but its overdue ones say how far behind it is). A device whose work drains at a
fraction of its bubbles then takes fewer new requests: the wait ahead of a request grows
with the work queued at the rate it really drains, so the stretch is a ratio, not a delay.
The requests admitted keep within their deadline instead of all ending late.

Late binding (`commit_ahead_s`): a request is sent to its device only once it would start
there within `commit_ahead_s`; until then it waits at the controller, planned on the
device that would finish it soonest (its predicted time counts against that device for
the requests behind it), and is placed again on every tick in arrival order, with the
statuses as they are then. A request therefore goes to whichever device's bubble really
comes first (a window that opened early, a queue that drained faster than predicted),
not to the one that looked best when it arrived; the agents still get it ahead of the
bubble (the lead covers the sync), so the device does not wait for the controller.

Every request that arrives ends exactly once, served or rejected with a reason (the
`RequestLedger` of requests.py enforces it); `check()` is the invariant.
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from dataclasses import dataclass, field

from bubbletea_agent.requests import Reason, Request, RequestLedger, Status
from testbed_core.contracts.prefill_service import (
    AgentHello,
    AgentStatus,
    AgentSync,
    EndedRequest,
    RequestView,
    SyncReply,
    WorkItem,
)

MIN_IDLE_FRACTION = 0.01  # beyond the known slots a device is assumed idle at least this share
# The service's order, at the controller (late binding) and in each agent's queue (runtime.py
# gives the agents this order when they take work from a controller): "arrival", first come
# first served. An admission is a promise that the request finishes within its deadline
# behind the work admitted before it; a later arrival must not push it back. ("shortest",
# fewest prompt tokens first, serves more requests per second of bubbles under overload,
# but every shorter arrival delays the longer prompts admitted before it: measured on the
# unequal-bubbles scenario, admitted prompts waited up to 15 s against a 1 s deadline.)
SERVICE_ORDER = "arrival"
LATE_WINDOW = 64  # admitted requests per device whose lateness admission learns from
LATE_QUANTILE = 0.9  # the share of them admission would have kept within their deadline
LATE_MIN = 8  # ended requests before the lateness counts
LATE_AGE_S = 3.0  # ... that ended this recently (a device given nothing more recovers)
SLOW_FLOOR_S = 0.1  # predicted waits shorter than this count as this long (a ratio to ~0 means nothing)


class Refusal(Exception):
    """A request refused at the door: `code` (an ApiError code and the rejection reason),
    `detail` (what was wrong, what is allowed), `field` (the request field at fault)."""

    def __init__(self, code: str, detail: str, field: str | None = None, recorded: bool = True) -> None:
        super().__init__(detail)
        self.code, self.detail, self.field, self.recorded = code, detail, field, recorded


class Predictor:
    """Predicted prefill seconds by prompt length: linear between the agent's points,
    extrapolated with the last segment's slope (its per-token cost) beyond them."""

    def __init__(self, table: dict[int, float]) -> None:
        pts = sorted((int(n), float(s)) for n, s in table.items() if n > 0 and s >= 0)
        if not pts:
            raise ValueError("an agent's hello carries no prefill predictions (predict_s is empty)")
        self.n = [p[0] for p in pts]
        self.s = [p[1] for p in pts]

    def __call__(self, tokens: int) -> float:
        n, s = self.n, self.s
        if len(n) == 1:
            return s[0] * tokens / n[0]
        i = bisect.bisect_left(n, tokens)
        if i < len(n) and n[i] == tokens:
            return s[i]
        if i == 0:
            return s[0] * tokens / n[0]
        j = min(i, len(n) - 1)
        a, b = j - 1, j
        slope = (s[b] - s[a]) / (n[b] - n[a])
        return max(0.0, s[a] + slope * (tokens - n[a]))


def capacity_times(status: AgentStatus, now: float, need: list[float]) -> list[float]:
    """When the device's bubbles ahead of `now` will have held each amount in `need`
    (ascending device seconds): the open live window, the upcoming slots, then the
    recent idle share of the wall clock."""
    spans: list[tuple[float, float]] = []
    if status.live_end is not None and status.live_end > now:
        spans.append((now, status.live_end))
    for w in sorted(status.upcoming, key=lambda w: w.start):
        s, e = max(w.start, now), w.end
        if spans and s < spans[-1][1]:
            s = spans[-1][1]
        if e > s:
            spans.append((s, e))
    out: list[float] = []
    held, k, t = 0.0, 0, now
    for amount in need:
        while k < len(spans) and held + (spans[k][1] - spans[k][0]) < amount:
            held += spans[k][1] - spans[k][0]
            t = spans[k][1]
            k += 1
        if k < len(spans):
            out.append(max(spans[k][0], spans[k][0] + amount - held))
            continue
        frac = max(status.idle_fraction, MIN_IDLE_FRACTION)
        out.append(max(t, now) + (amount - held) / frac)
    return out


def device_times(status: AgentStatus, now: float, ahead: float, work: float) -> tuple[float, float]:
    """(start, finish) of `work` device seconds behind `ahead` on this device. The backlog
    the agent reported drains in the bubbles from the moment it reported it (`status.at`),
    not from now: between two syncs the device keeps working. When what was ahead is done
    by now, the work starts in the first capacity from now."""
    ref = min(now, status.at)
    start, finish = capacity_times(status, ref, [ahead, ahead + work])
    if start < now:
        start, finish = capacity_times(status, now, [0.0, work])
    return start, finish


TOKEN_BUCKETS = 8 * 18  # prompt lengths up to 2**18 tokens, eight buckets per doubling


def token_bucket(tokens: int) -> int:
    """Prompt lengths in buckets about 9% wide (eight per doubling)."""
    return min(TOKEN_BUCKETS - 1, max(0, int(math.log2(max(1, tokens)) * 8)))


@dataclass
class DeviceState:
    name: str
    hello: AgentHello | None = None
    predict: Predictor | None = None
    status: AgentStatus | None = None
    synced_at: float = -math.inf
    # every request dispatched here, in order; `sent[received:]` goes out with each reply until
    # the agent confirms it received it (a reply lost on the way is sent again)
    sent: list[WorkItem] = field(default_factory=list)
    sent_predicted: list[float] = field(default_factory=list)
    received: int = 0  # the agent's count of work items received
    open: dict[str, float] = field(default_factory=dict)  # id -> predicted s, dispatched and not ended
    final: bool = False
    # the open requests' predicted seconds by prompt length (token_bucket), for shortest first
    open_by_len: list[float] = field(default_factory=lambda: [0.0] * TOKEN_BUCKETS)
    _bucket: dict[str, int] = field(default_factory=dict)
    # (when, ratio) of recent admitted requests: how much longer they took than predicted
    slow: deque[tuple[float, float]] = field(default_factory=lambda: deque(maxlen=LATE_WINDOW))

    # id -> (arrival, finish predicted at admission) of the open requests, in dispatch order
    promised: dict[str, tuple[float, float]] = field(default_factory=dict)

    def slowness(self, now: float) -> float:
        """How many times longer than its bubbles predict this device takes to finish what
        it is given: the LATE_QUANTILE of the ratios of the requests that ended here in the
        last LATE_AGE_S (when at least LATE_MIN did), or, if more, the ratio the most overdue
        open request has reached by now; never below 1."""
        xs = sorted(x for t, x in self.slow if now - t <= LATE_AGE_S)
        ended = xs[min(len(xs) - 1, int(LATE_QUANTILE * len(xs)))] if len(xs) >= LATE_MIN else 1.0
        overdue = 1.0
        for arrival, finish in self.promised.values():
            if now > finish:
                overdue = max(overdue, (now - arrival) / max(SLOW_FLOOR_S, finish - arrival))
        return max(1.0, ended, overdue)

    def add_open(self, rid: str, work: float, tokens: int) -> None:
        self.open[rid] = work
        b = self._bucket[rid] = token_bucket(tokens)
        self.open_by_len[b] += work

    def pop_open(self, rid: str) -> None:
        self.promised.pop(rid, None)
        work = self.open.pop(rid, None)
        b = self._bucket.pop(rid, None)
        if work is not None and b is not None:
            self.open_by_len[b] = max(0.0, self.open_by_len[b] - work)

    def clear_open(self) -> None:
        self.promised.clear()
        self.open.clear()
        self._bucket.clear()
        self.open_by_len = [0.0] * TOKEN_BUCKETS

    @property
    def dispatched(self) -> int:
        return len(self.sent)

    @property
    def outbox(self) -> list[WorkItem]:
        """Work the agent has not confirmed receiving."""
        return self.sent[self.received:]

    def ready(self, now: float, stale_s: float) -> bool:
        st = self.status
        return (not self.final and self.predict is not None and st is not None and st.epoch is not None
                and not st.ended and now - self.synced_at <= stale_s)

    def unseen_s(self, taken: int) -> float:
        """Predicted seconds dispatched that the agent's reported backlog does not hold yet."""
        return sum(self.sent_predicted[taken:])


@dataclass
class Entry:
    request: Request
    origin: str  # "source" | "client"
    arrival: float  # time.time() at the controller
    decode_host: str | None = None
    device: str | None = None
    state: str = "queued"  # queued | dispatched | ended
    now: float | None = None  # when it was last placed (controller time)
    # while it waits at the controller (late binding): the device it is planned on, its
    # predicted seconds there, and when it would start; once sent: when and the prediction
    planned: str | None = None
    planned_s: float = 0.0
    predicted_start: float | None = None
    predicted_finish: float | None = None
    dispatched_at: float | None = None
    admitted: bool = False  # placed once within its deadline: from then on it is served, never refused
    admitted_finish: float | None = None  # the finish its device's bubbles predicted when it was admitted


@dataclass
class Dispatcher:
    """The cluster's prefill dispatcher; one per controller."""

    agents: list[str]
    decode_hosts: list[str] = field(default_factory=list)
    deadline_s: float = 5.0  # default for requests that give none
    horizon_s: float = 30.0
    max_queue: int = 4096  # requests waiting at the controller for a device to be ready
    stale_s: float = 1.0  # an agent not heard from for this long gets no new work
    # late binding: send a request once it would start on its device within this many
    # seconds (None: at once, on arrival); until then it waits here, planned
    commit_ahead_s: float | None = None
    # which waiting request goes first: "shortest" (fewest prompt tokens, then arrival) or
    # "arrival", here (late binding) and in the agents' queues (SERVICE_ORDER)
    order: str = SERVICE_ORDER
    ledger: RequestLedger = field(default_factory=RequestLedger)
    devices: dict[str, DeviceState] = field(default_factory=dict)
    entries: dict[str, Entry] = field(default_factory=dict)
    # requests waiting at the controller for a device to be ready, in arrival order
    queue: dict[str, None] = field(default_factory=dict)
    epoch: float | None = None  # request time zero: when the first agent saw training start
    arrivals_closed_at: float | None = None
    refused_bodies: int = 0  # bodies refused before they were requests (bad JSON, wrong fields)
    _synced: bool = False  # an agent synced since the last tick
    _client_seq: int = 0
    # predicted seconds of the requests waiting here, per device they are planned on
    _planned: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in self.agents:
            self.devices.setdefault(name, DeviceState(name))

    # ------------------------------------------------------------------ arrivals

    def new_client_id(self) -> str:
        self._client_seq += 1
        while f"c{self._client_seq}" in self.entries:
            self._client_seq += 1
        return f"c{self._client_seq}"

    def submit(self, req: Request, now: float, origin: str = "client",
               decode_host: str | None = None, arrival: float | None = None) -> Entry:
        """A request arrives now (or, known ahead, at `arrival`: the scenario's source): it
        is dispatched, queued (no device ready yet) or rejected (recorded, and raised as a
        Refusal for the caller to answer with). One sent ahead of its arrival is placed
        for then: its agent holds it until it arrives."""
        if req.id in self.entries:
            raise Refusal("duplicate_id", f"request id {req.id!r} was already submitted; ids must be unique",
                          "id", recorded=False)
        at = now if arrival is None else arrival
        entry = Entry(req, origin, at, decode_host)
        self.entries[req.id] = entry
        # the controller's ledger keeps time.time() seconds: its TTFT is kv_arrival - arrival
        self.ledger.arrive(Request(req.id, at, req.prompt_tokens, 0, req.deadline_s))
        if decode_host is not None and decode_host not in self.decode_hosts:
            allowed = ", ".join(self.decode_hosts) or "none: this cluster ships no KV caches"
            self._end_rejected(entry, Reason.UNKNOWN_DECODE_HOST,
                               f"unknown decode host {decode_host!r} (decode hosts: {allowed})", now)
            raise Refusal(Reason.UNKNOWN_DECODE_HOST, self.ledger.get(req.id).detail or "", "decode_host")
        context = self._context()
        if context is not None and req.prompt_tokens > context:
            self._end_rejected(entry, Reason.TOO_LONG, f"{req.prompt_tokens} prompt tokens exceed the model "
                                                       f"context ({context})", now)
            raise Refusal(Reason.TOO_LONG, self.ledger.get(req.id).detail or "", "prompt_tokens")
        self._place(entry, now, raise_on_reject=True)
        return entry

    def _context(self) -> int | None:
        known = [d.hello.max_prompt_tokens for d in self.devices.values() if d.hello is not None]
        return min(known) if known else None

    def _eligible(self, entry: Entry) -> list[DeviceState]:
        now = entry.now if entry.now is not None else entry.arrival
        return [d for d in self.devices.values() if d.ready(now, self.stale_s)
                and (entry.decode_host is None or (d.hello is not None and d.hello.decode_host == entry.decode_host))]

    def _place(self, entry: Entry, now: float, raise_on_reject: bool = False,
               planned: dict[str, float] | None = None, into: dict[str, float] | None = None) -> None:
        """Send the request to the device that finishes it soonest among those that finish it
        within its deadline (any device once it was admitted), behind the work `planned` there for the requests that go before
        it (default: those waiting here ahead of it in `order`), or reject it. Late binding:
        sent only once it would start within `commit_ahead_s`; until then it waits here,
        planned, its time added to `into` (default: the dispatcher's plan)."""
        req = entry.request
        deadline = req.deadline_s if req.deadline_s is not None else self.deadline_s
        entry.now = sent_at = now
        now = max(now, entry.arrival)  # a request sent ahead is placed for when it arrives
        if planned is None:
            planned = self._planned if self.order == "arrival" else self._planned_before(entry)
        if into is None and planned is not self._planned:
            into = self._planned
        devices = self._eligible(entry)
        if not devices:
            started = [d for d in self.devices.values() if d.status is not None and d.status.epoch is not None
                       and not d.final and not d.status.ended]
            if started and not entry.admitted and entry.decode_host is None:
                # training runs, but no agent synced lately (starved of CPU, stopped): refused now,
                # not left to expire here
                quiet = min(now - d.synced_at for d in started)
                self._end_rejected(entry, Reason.NO_DEVICE, f"no device's agent has synced for {quiet:.2f} s "
                                                            f"(stale after {self.stale_s:g} s)", now, raise_on_reject)
                return
            if any(not d.final and not (d.status is not None and d.status.ended) for d in self.devices.values()):
                if req.id not in self.queue:
                    if len(self.queue) >= self.max_queue:
                        self._end_rejected(entry, Reason.QUEUE_FULL, f"{len(self.queue)} requests wait for a "
                                                                     "device", now, raise_on_reject)
                        return
                    self.queue[req.id] = None
                entry.planned = None
                return  # a device will be ready (training has not started yet)
            self._end_rejected(entry, Reason.NO_DEVICE, "every device's training ended; none takes work", now,
                               raise_on_reject)
            return
        best: tuple[float, float, DeviceState, float, float] | None = None
        fastest = math.inf
        for d in devices:
            assert d.status is not None and d.predict is not None
            work = d.predict(req.prompt_tokens)
            ahead = d.status.backlog_s + d.unseen_s(d.status.taken)
            if self.order == "shortest" and ahead > 0:
                ahead = self._ahead_shortest(d, ahead, req.prompt_tokens)
            start, finish = device_times(d.status, now, ahead + planned.get(d.name, 0.0), work)
            bubbles = finish
            slow = d.slowness(now)
            start, finish = now + (start - now) * slow, now + (finish - now) * slow
            empty = capacity_times(d.status, now, [work])[0]
            fastest = min(fastest, empty - now)
            if best is None or finish < best[1]:
                if entry.admitted or finish - entry.arrival <= deadline:
                    best = (start, finish, d, work, bubbles)
        if entry.admitted:
            pass  # admitted at arrival: served wherever it finishes soonest, never refused now
        elif fastest > self.horizon_s:
            self._end_rejected(entry, Reason.TOO_LONG,
                               f"its prefill would take {fastest:.1f} s of wall time even on the emptiest "
                               f"device's bubbles (limit {self.horizon_s:g} s)", now, raise_on_reject)
            return
        elif best is None:
            self._end_rejected(entry, Reason.DEADLINE_UNREACHABLE,
                               f"no device's bubbles can prefill it within its {deadline:g} s deadline", now,
                               raise_on_reject)
            return
        assert best is not None
        start, finish, dev, work, bubbles = best
        if not entry.admitted:
            entry.admitted, entry.admitted_finish = True, bubbles
        entry.predicted_start, entry.predicted_finish = start, finish
        if self.commit_ahead_s is not None and start > now + self.commit_ahead_s:
            if req.id not in self.queue:
                if len(self.queue) >= self.max_queue:
                    self._end_rejected(entry, Reason.QUEUE_FULL, f"{len(self.queue)} requests wait for a device",
                                       now, raise_on_reject)
                    return
                self.queue[req.id] = None
            entry.planned, entry.planned_s = dev.name, work
            into = self._planned if into is None else into
            into[dev.name] = into.get(dev.name, 0.0) + work
            return
        self.queue.pop(req.id, None)
        entry.planned = None
        entry.state, entry.device, entry.dispatched_at = "dispatched", dev.name, sent_at
        dev.add_open(req.id, work, req.prompt_tokens)
        if entry.admitted_finish is not None:
            dev.promised[req.id] = (entry.arrival, entry.admitted_finish)
        dev.sent.append(WorkItem(id=req.id, arrival=entry.arrival, prompt_tokens=req.prompt_tokens,
                                 deadline_s=deadline))
        dev.sent_predicted.append(work)

    def _ahead_shortest(self, d: DeviceState, queued: float, tokens: int) -> float:
        """Of the `queued` device seconds at `d`, those that run before a request of
        `tokens` prompt tokens when the agent runs shortest first: the requests sent there
        and not ended that are shorter (or in its length bucket, about 9% wide), plus the
        part of the queue the controller cannot explain by what it sent; never more than
        all of it. Some of the shorter ones may have been prefilled already (shipping):
        counted all the same, it errs on the late side. (Subtracting the longer ones
        instead made the device with most work sent look emptiest: measured, 262 of 634
        requests went to one device and 80 to another.) Constant time: buckets, not a scan
        of the open requests (they pile up when agents sync late)."""
        shorter = sum(d.open_by_len[: token_bucket(tokens) + 1])
        sent = sum(d.open_by_len)
        return min(queued, shorter + max(0.0, queued - sent))

    def _key(self, rid: str) -> tuple[int, float, str]:
        e = self.entries[rid]
        return (e.request.prompt_tokens, e.arrival, rid)

    def _planned_before(self, entry: Entry) -> dict[str, float]:
        """Predicted seconds, per device, of the requests waiting here that go before `entry`
        (order "shortest": those with fewer prompt tokens, or as many and earlier)."""
        key = self._key(entry.request.id) if entry.request.id in self.entries else (entry.request.prompt_tokens,
                                                                                   entry.arrival, entry.request.id)
        out: dict[str, float] = {}
        for rid in self.queue:
            e = self.entries[rid]
            if rid != entry.request.id and e.planned is not None and self._key(rid) < key:
                out[e.planned] = out.get(e.planned, 0.0) + e.planned_s
        return out

    def _end_rejected(self, entry: Entry, reason: str, detail: str, now: float, raise_it: bool = False) -> None:
        rid = entry.request.id
        if rid in self.queue and entry.planned is not None:  # its planned time no longer counts
            self._planned[entry.planned] = max(0.0, self._planned.get(entry.planned, 0.0) - entry.planned_s)
        self.queue.pop(rid, None)
        entry.planned = None
        entry.state = "ended"
        self.ledger.reject(rid, Reason(reason), detail)
        if raise_it:
            raise Refusal(str(reason), detail, None)

    # ---------------------------------------------------------------------- time

    def tick(self, now: float) -> None:
        """Requests waiting here: reject expired ones not yet admitted (no device was ready
        when they arrived); place the others again in `order`
        (shortest first, or arrival) (sent once they would start within `commit_ahead_s`, else planned again),
        after an agent synced or once the first of them is due; stop placing at the first
        that stays (the later ones would not start sooner: every device's work ahead of
        them only grows), and keep the rest planned where they were. Cheap when nothing
        changed: it runs every few ms."""
        synced, self._synced = self._synced, False
        if not self.queue:
            self._planned = {}
            return
        for rid in list(self.queue):
            entry = self.entries[rid]
            req = entry.request
            deadline = req.deadline_s if req.deadline_s is not None else self.deadline_s
            if not entry.admitted and now - entry.arrival > deadline:
                self._end_rejected(entry, Reason.DEADLINE_PASSED,
                                   f"waited {now - entry.arrival:.3f} s for a device > deadline {deadline:g} s", now)
        if not self.queue:
            self._planned = {}
            return
        order = list(self.queue) if self.order == "arrival" else sorted(self.queue, key=self._key)
        head = self.entries[order[0]]
        due = (head.planned is not None and head.predicted_start is not None and self.commit_ahead_s is not None
               and head.predicted_start <= now + self.commit_ahead_s)
        if not synced and not due:
            return
        planned: dict[str, float] = {}
        placing = True
        for rid in order:
            entry = self.entries[rid]
            if placing:
                self._place(entry, now, planned=planned, into=planned)
                if rid in self.queue and (entry.decode_host is None or entry.planned is not None):
                    placing = False  # it waits: the later ones would too
            elif entry.planned is not None:
                planned[entry.planned] = planned.get(entry.planned, 0.0) + entry.planned_s
        self._planned = planned

    # --------------------------------------------------------------------- agents

    def sync(self, name: str, msg: AgentSync, now: float) -> SyncReply:
        """An agent's sync: its status and ended requests in, new work out."""
        dev = self.devices.get(name)
        if dev is None:
            raise Refusal("unknown_agent", f"agent {name!r} is not one of this controller's agents "
                                           f"({', '.join(self.agents)})", "name", recorded=False)
        if msg.hello is not None:
            try:
                dev.predict = Predictor(msg.hello.predict_s)
            except ValueError as exc:
                raise Refusal("bad_hello", str(exc), "hello.predict_s", recorded=False) from None
            dev.hello = msg.hello
        elif dev.hello is None:
            raise Refusal("no_hello", f"agent {name!r}: the first sync must carry a hello (device, predictions)",
                          "hello", recorded=False)
        dev.status, dev.synced_at = msg.status, now
        self._synced = True
        dev.received = min(max(dev.received, msg.received), len(dev.sent))
        if msg.status.epoch is not None and self.epoch is None:
            self.epoch = msg.status.epoch
        if msg.status.arrivals_closed_at is not None:
            closed = msg.status.arrivals_closed_at
            self.arrivals_closed_at = closed if self.arrivals_closed_at is None else min(self.arrivals_closed_at,
                                                                                       closed)
        for ended in msg.ended:
            self._ended(dev, ended)
        if msg.final:
            dev.final = True
            for rid in list(dev.open):
                self._end_rejected(self.entries[rid], Reason.AGENT_LOST,
                                   f"agent {name} stopped without reporting it", now)
                dev.pop_open(rid)
            return SyncReply(stop=True)
        return SyncReply(work=dev.outbox, first=dev.received)

    def _ended(self, dev: DeviceState, e: EndedRequest) -> None:
        entry = self.entries.get(e.id)
        if entry is None or entry.device != dev.name or e.id not in dev.open:
            return  # not ours to end (or already ended): the ledger never ends a request twice
        dev.pop_open(e.id)
        entry.state = "ended"
        rec = self.ledger.get(e.id)
        rec.chunks, rec.prefilled_tokens, rec.kv_bytes = e.chunks, e.prefilled_tokens, e.kv_bytes
        rec.start, rec.end = e.start, e.end
        done = e.kv_arrival if e.kv_arrival is not None else e.end
        if done is not None and entry.admitted_finish is not None:
            predicted = max(SLOW_FLOOR_S, entry.admitted_finish - entry.arrival)
            dev.slow.append((done, (done - entry.arrival) / predicted))
        if e.status == "served" and e.kv_arrival is not None:
            self.ledger.serve(e.id, e.kv_arrival, f"at {dev.name}")
        else:
            reason = e.reason if e.reason in Reason.__members__.values() else Reason.AGENT_LOST
            self.ledger.reject(e.id, Reason(reason), f"at {dev.name}: {e.detail or e.reason or 'no reason given'}")

    def finish(self, now: float, detail: str = "the controller stopped before this request ended") -> None:
        """End every open request (run_ended)."""
        for entry in self.entries.values():
            if entry.state != "ended":
                self._end_rejected(entry, Reason.RUN_ENDED, detail, now)
        for dev in self.devices.values():
            dev.clear_open()
        self.ledger.check()

    # ---------------------------------------------------------------------- views

    def view(self, rid: str) -> RequestView | None:
        entry = self.entries.get(rid)
        if entry is None:
            return None
        rec = self.ledger.get(rid)
        status = rec.status if rec.status is not None else entry.state
        return RequestView(id=rid, origin=entry.origin, prompt_tokens=entry.request.prompt_tokens,  # type: ignore[arg-type]
                           arrival=entry.arrival, status=status, device=entry.device,  # type: ignore[arg-type]
                           reason=rec.reason, detail=rec.detail, ttft_s=rec.ttft)

    def counts(self) -> dict:
        c = self.ledger.counts()
        c["by_device"] = {d.name: d.dispatched for d in self.devices.values()}
        c["by_origin"] = {o: sum(1 for e in self.entries.values() if e.origin == o) for o in ("source", "client")}
        c["refused_bodies"] = self.refused_bodies
        return c

    def served_ttfts(self) -> list[float]:
        return [r.ttft for r in self.ledger.records.values() if r.status == Status.SERVED and r.ttft is not None]
