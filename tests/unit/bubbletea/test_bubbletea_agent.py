"""The agent loop (bubbletea_agent/agent.py) in virtual time (bubbletea_agent/sim.py):
utilization, accounting, rejections with reasons, slot corrections, TTFT to the KV
cache's arrival, preemptible holds in the worker's live windows, and that training is
never delayed."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest

from bubbletea_agent.admission import AdaptiveGuard, Admission, AdmissionConfig, GuardConfig
from bubbletea_agent.agent import Agent
from bubbletea_agent.engine import ModelledEngine
from bubbletea_agent.latency import FunctionLatency
from bubbletea_agent.requests import (
    FixedLength,
    LogNormalLength,
    PoissonSource,
    Request,
    TraceSource,
)
from bubbletea_agent.sim import FakeClock, ListSlotFeed, periodic_schedule, simulate_agent
from bubbletea_agent.slots import SlotTracker
from testbed_core.contracts.bubbletea import PrefillModelSpec
from testbed_runtime.slots import EndOfSlots, Slot

# one iteration per second: training busy [0, 0.3) and [0.5, 0.8); slots [0.3, 0.5), [0.8, 1.0)
BUSY = [(0.0, 0.3), (0.5, 0.3)]
T0 = 1000.0


def charge(tokens: int, context: int) -> float:
    """1 ms per chunk + 20 us per token + attention over the context."""
    return 0.001 + 20e-6 * tokens + 2e-9 * tokens * (tokens + 2 * context)


def poisson(rate: float, seconds: float, tokens=None, deadline=None, seed=0):
    return PoissonSource(rate_per_s=rate, lengths=tokens or FixedLength(tokens=128), seed=seed,
                         duration_s=seconds, deadline_s=deadline).requests()


def test_enough_load_fills_the_bubbles_without_delaying_training():
    sched = periodic_schedule(T0, 10, 1.0, BUSY)
    reqs = poisson(300, 10, LogNormalLength(median=200, sigma=0.8, max=4000), deadline=5.0)
    res = simulate_agent(sched, reqs, charge)
    m = res.metrics()
    assert m["device_utilization_training"] == pytest.approx(0.6, abs=1e-6)
    assert m["device_utilization"] >= 0.9, m
    assert m["guard_violations"] == 0 and max(res.training_delays()) == 0.0
    assert res.summary["arrived"] == res.summary["served"] + res.summary["rejected"]
    assert res.summary["served"] > 100
    assert res.agent.counters.chunks_chunked > 0  # chunked prefill fills the slot ends
    assert m["ttft_p50_s"] is not None and m["ttft_p50_s"] <= m["ttft_p95_s"] <= m["ttft_p99_s"]
    served = [r for r in res.rows if r["status"] == "served"]
    # nothing runs outside a slot: every prefill lies inside a published gap
    for rec in res.device.records:
        if rec.kind == "prefill":
            phase = (rec.start - T0) % 1.0
            assert 0.3 - 1e-9 <= phase and (rec.end - T0) % 1.0 <= 1.0 + 1e-9
            assert not (0.0 <= phase < 0.3 - 1e-9 or 0.5 <= phase < 0.8 - 1e-9)
    assert all(r["ttft"] >= r["predicted_s"] * 0.999 for r in served)


def test_low_load_is_all_served_and_utilization_rises_by_the_work_done():
    sched = periodic_schedule(T0, 10, 1.0, BUSY)
    reqs = poisson(5, 9, deadline=5.0)
    res = simulate_agent(sched, reqs, charge)
    m = res.metrics()
    assert res.summary["served"] == len(reqs) == res.summary["arrived"]
    assert res.summary["rejected"] == 0
    work = sum(charge(128, 0) for _ in reqs) / 10.0
    assert m["device_utilization"] - m["device_utilization_training"] == pytest.approx(work, rel=1e-6)
    assert m["guard_violations"] == 0


def test_overload_rejects_with_reasons_and_training_is_not_slowed():
    sched = periodic_schedule(T0, 6, 1.0, BUSY)
    reqs = poisson(2000, 6, deadline=0.5)
    res = simulate_agent(sched, reqs, charge, admission=AdmissionConfig(max_queue=200))
    reasons = res.summary["rejected_by_reason"]
    # most are refused at arrival (the work queued ahead cannot start them within their deadline)
    assert reasons.get("deadline_unreachable", 0) > 1000
    assert reasons["deadline_unreachable"] > 10 * reasons.get("deadline_passed", 0)
    assert res.summary["arrived"] == res.summary["served"] + res.summary["rejected"]
    assert all(r["reason"] and r["detail"] for r in res.rows if r["status"] == "rejected")
    assert res.metrics()["guard_violations"] == 0 and max(res.training_delays()) == 0.0


def test_too_long_for_any_slot_and_for_the_model():
    sched = periodic_schedule(T0, 3, 1.0, BUSY)
    reqs = [Request("ok", 0.1, 100), Request("huge", 0.2, 20_000), Request("ctx", 0.3, 300_000)]
    res = simulate_agent(sched, reqs, charge, admission=AdmissionConfig(chunking=False))
    by_id = {r["id"]: r for r in res.rows}
    assert by_id["ok"]["status"] == "served"
    assert by_id["huge"]["reason"] == "too_long" and "longest slot is 200.00 ms" in by_id["huge"]["detail"]
    assert by_id["ctx"]["reason"] == "too_long" and "model context" in by_id["ctx"]["detail"]
    # with chunking the long prompt is served across several slots
    res2 = simulate_agent(periodic_schedule(T0, 6, 1.0, BUSY), reqs[:2], charge)
    huge = {r["id"]: r for r in res2.rows}["huge"]
    assert huge["status"] == "served" and huge["chunks"] > 1 and huge["prefilled_tokens"] == 20_000


def test_slots_that_end_early_are_learned():
    # reality: every training piece starts 30 ms before the plan, so each slot ends
    # 30 ms early; the agent first trusts the plan, then corrects it
    sched = periodic_schedule(T0, 12, 1.0, BUSY, start_late_s=-0.03)
    reqs = poisson(300, 12, deadline=5.0)
    res = simulate_agent(sched, reqs, charge)
    late = [r for r in res.device.records if r.kind != "prefill" and r.start - r.requested > 1e-9]
    assert late, "an uncorrected plan must hurt at first"
    assert max(r.requested for r in late) < T0 + 3.0  # ... but only in the first iterations
    ds, de = res.agent.tracker.offsets(0)
    assert de == pytest.approx(-0.03, abs=1e-6)
    assert res.summary["guard_violations"] == len(late)
    assert res.metrics()["guard_violations"] == len(late)


def test_slots_that_start_late_wait_for_the_device():
    sched = periodic_schedule(T0, 5, 1.0, BUSY, start_late_s=0.02)
    res = simulate_agent(sched, poisson(300, 5, deadline=5.0), charge)
    assert res.agent.counters.device_busy_retries > 0
    assert max(res.training_delays()) == 0.0


def test_guard_absorbs_mispredictions():
    # the device is really 15% slower than the agent's model
    sched = periodic_schedule(T0, 10, 1.0, BUSY)

    def slow(n, p):
        return charge(n, p) * 1.15

    g = AdaptiveGuard(GuardConfig(initial_rel=0.3, min_samples=8, quantile=0.99))
    res = simulate_agent(sched, poisson(300, 10, deadline=5.0), slow, predict=charge, guard=g)
    assert res.agent.admission.guard.rel_margin == pytest.approx(0.15, abs=0.01)
    assert max(res.training_delays()) == 0.0
    assert res.metrics()["device_utilization"] > 0.85


def test_end_of_training_ends_every_request():
    sched = periodic_schedule(T0, 2, 1.0, BUSY)
    reqs = poisson(200, 4, deadline=10.0)  # arrivals continue after training ends
    res = simulate_agent(sched, reqs, charge)
    s = res.summary
    assert s["arrived"] + s["counters"]["not_arrived"] == len(reqs)
    assert s["arrived"] == s["served"] + s["rejected"] and s["outstanding"] == 0
    assert s["rejected_by_reason"].get("no_slots", 0) > 0


def test_trace_replay_through_the_agent(tmp_path):
    path = tmp_path / "trace.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                    + "".join(f"2024-05-01 10:00:{i // 10:02d}.{i % 10}000000,{64 + 8 * i},10\n"
                              for i in range(40)))
    reqs = TraceSource(path=path, deadline_s=3.0).requests()
    res = simulate_agent(periodic_schedule(T0, 6, 1.0, BUSY), reqs, charge)
    assert res.summary["served"] == 40
    assert len(res.rows) == 40 and all(r["ttft"] > 0 for r in res.rows)


class VirtualLink:
    """A Shipper whose caches arrive `delay_s` after submission, in virtual time; caches
    of the ids in `fail` are lost."""

    def __init__(self, clock, delay_s, fail=()):
        self.clock, self.delay, self.fail = clock, delay_s, set(fail)
        self.done, self.sent = [], []

    def submit(self, rid, kv):
        from bubbletea_agent.kv_ship import ShipResult

        self.sent.append((rid, kv))
        now = self.clock.now()
        err = "connection reset by decode host" if rid in self.fail else None
        self.done.append(ShipResult(rid, len(self.sent), now, now + self.delay, kv.logical_bytes, err))

    def poll(self):
        out, self.done = self.done, []
        return out

    def pending(self):
        return 0

    def close(self, timeout=30.0):
        pass


def test_ttft_runs_to_kv_arrival_and_lost_caches_are_rejected():
    from bubbletea_agent.admission import AdaptiveGuard, Admission
    from bubbletea_agent.agent import Agent
    from bubbletea_agent.engine import ModelledEngine
    from bubbletea_agent.latency import FunctionLatency
    from bubbletea_agent.sim import FakeClock, ListSlotFeed, SimDevice, SimTimeline
    from bubbletea_agent.slots import SlotTracker
    from testbed_core.contracts.bubbletea import PrefillModelSpec

    sched = periodic_schedule(T0, 3, 1.0, BUSY)
    clock = FakeClock(T0 - 1.0)
    device = SimDevice(clock, list(sched.pieces))
    link = VirtualLink(clock, 0.25, fail={"r2"})
    rows = []
    spec = PrefillModelSpec(preset="llama-3-8b")
    agent = Agent(clock=clock, device=device, slots=ListSlotFeed(clock, sched.published),
                  timeline=SimTimeline(device), tracker=SlotTracker(),
                  admission=Admission(FunctionLatency(charge), AdmissionConfig(), AdaptiveGuard()),
                  engine=ModelledEngine(spec, charge), requests=poisson(5, 2.5, seed=3), epoch=T0,
                  shipper=link, on_record=rows.append)
    agent.run(until=sched.t1 + 1)
    s = agent.finish()
    assert s["served"] == len(link.sent) - 1 and s["rejected_by_reason"] == {"ship_failed": 1}
    by_id = {r["id"]: r for r in rows}
    assert by_id["r2"]["reason"] == "ship_failed" and "connection reset" in by_id["r2"]["detail"]
    for r in rows:
        if r["status"] == "served":
            assert r["ttft"] == pytest.approx(r["end"] - r["arrival"] + 0.25)
            assert r["kv_bytes"] == spec.kv_bytes(128)


def test_a_short_gap_between_training_pieces_is_not_taken_for_the_slot():
    """The plan says the slot starts at 0.3 s, but training really runs 20 more pieces of
    10 ms with 1 ms gaps first (the device is free in each gap). Without settling, the
    agent grabs such a gap and training waits; with it, never."""
    from bubbletea_agent.sim import Piece, Schedule
    from testbed_runtime.slots import EndOfSlots, Slot

    pieces, published = [], []
    for it in range(4):
        base = T0 + it * 1.0
        pieces.append(Piece(base, 0.3, f"it{it}-a"))
        t = base + 0.3
        for k in range(20):  # the unplanned tail of back-to-back pieces
            pieces.append(Piece(t + 0.001, 0.010, f"it{it}-tail{k}"))
            t += 0.011
        pieces.append(Piece(base + 0.8, 0.2, f"it{it}-b"))
        published.append((base - 0.5, Slot(it, 0, base + 0.3, 0.5)))
    published.append((T0 + 4.0, EndOfSlots()))
    sched = Schedule(pieces, published, T0, T0 + 4.0)
    reqs = poisson(200, 4, deadline=5.0)
    careless = simulate_agent(sched, reqs, charge, settle_s=0.0)
    careful = simulate_agent(sched, reqs, charge)  # settle_s 2 ms > the 1 ms gaps
    assert careless.metrics()["guard_violations"] > 0
    assert careful.metrics()["guard_violations"] == 0 and max(careful.training_delays()) == 0.0
    assert careful.agent.counters.settle_waits > 0
    assert careful.metrics()["device_utilization"] > 0.8


# ------------------------------------------------------------------ preemptible holds
# With the worker's live guarantees, a modelled prefill runs layer by layer inside one
# device hold, each group of layers only if it (plus the guard) ends before the
# guarantee as known at that moment; a chunk stops between layers and goes on in a
# later window.


LAYERS = 4


def layer_charge(tokens: int, context: int) -> float:
    """4 ms per chunk (the weights) + 100 us per token."""
    return 0.004 + 1e-4 * tokens


def hold_admission(**cfg: Any) -> Admission:
    return Admission(FunctionLatency(layer_charge), AdmissionConfig(**cfg),
                     AdaptiveGuard(GuardConfig(initial_rel=0.0, rel_floor=0.0, abs_floor_s=0.0005)))


def hold_spec() -> PrefillModelSpec:
    return PrefillModelSpec(preset="tiny", num_hidden_layers=LAYERS)


@dataclass
class HoldDevice:
    """A modelled device whose holds last as long as fn() lets the virtual clock run,
    next to a training worker with fixed busy spans."""

    clock: FakeClock
    training: list[tuple[float, float]]
    mode: str = "modelled"
    time_scale: float = 1.0
    holds: list[tuple[float, float, str]] = field(default_factory=list)

    def busy(self, t: float) -> bool:
        return any(s <= t < e for s, e in self.training)

    def try_run(self, kind: str, owner: str, *, duration_s: float | None = None, fn: Any = None,
                label: str = "", flops: float | None = None) -> Any:
        start = self.clock.now()
        if self.busy(start):
            return None
        fn()
        end = self.clock.now()
        self.holds.append((start, end, label))
        return SimpleNamespace(kind=kind, owner=owner, label=label, requested=start, start=start, end=end)

    def run(self, *a: Any, **kw: Any) -> Any:  # the agent never queues
        raise AssertionError("the agent must not block on the device")

    def timeline(self, since: float | None = None) -> list[Any]:
        return []


class NoTimeline:
    def poll(self) -> list[Any]:
        return []


def live_bound(clock: FakeClock, training: list[tuple[float, float]]):
    """The worker's guarantee: idle until its next busy span (exact, like SCHEDULED)."""
    def bound() -> float:
        now = clock.now()
        if any(s <= now < e for s, e in training):
            return -math.inf
        return min((s for s, _ in training if s > now), default=math.inf)
    return bound


def make_hold_agent(requests: list[Request], training: list[tuple[float, float]], end: float,
               **kw: Any) -> tuple[Agent, HoldDevice, list[dict]]:
    clock = FakeClock(T0)
    device = HoldDevice(clock, training)
    rows: list[dict] = []
    published = [(T0, Slot(0, 0, T0, 0.1)), (end, EndOfSlots())]
    agent = Agent(clock=clock, device=device, slots=ListSlotFeed(clock, published), timeline=NoTimeline(),
                  tracker=SlotTracker(), admission=kw.pop("admission", hold_admission()),
                  engine=ModelledEngine(hold_spec(), layer_charge), requests=requests, epoch=T0, owner="bubbletea:w",
                  on_record=rows.append, live_bound=live_bound(clock, training), window="live", **kw)
    return agent, device, rows


def test_holds_fill_the_windows_and_never_cross_training() -> None:
    # training busy 20 ms of every 100 ms; requests of 300 tokens (34 ms) arrive quickly
    training = [(T0 + 0.1 * k, T0 + 0.1 * k + 0.02) for k in range(10)]
    reqs = [Request(f"r{i}", 0.005 * i, 300) for i in range(60)]
    agent, device, rows = make_hold_agent(reqs, training, T0 + 1.0)
    agent.run(until=T0 + 1.0)
    s = agent.finish()
    assert device.holds and s["served"] > 15
    for start, end, _ in device.holds:
        assert not any(ts < end - 1e-9 and start < te for ts, te in training), (start, end)
    busy = sum(e - s for s, e, _ in device.holds)
    assert busy / 0.8 >= 0.9  # of the 0.8 s of windows
    assert s["arrived"] == s["served"] + s["rejected"] and s["counters"]["holds"] == len(device.holds)
    assert max(r["chunks"] for r in rows if r["status"] == "served") == 1


def test_a_chunk_longer_than_any_window_goes_on_in_the_next_ones() -> None:
    # windows of 35 ms; one 1000-token prompt needs 104 ms (4 layers of 26 ms): it stops between layers
    training = [(T0 + 0.035 + 0.045 * k, T0 + 0.045 + 0.045 * k) for k in range(20)]
    agent, device, rows = make_hold_agent([Request("big", 0.0, 1000)], training, T0 + 0.8)
    agent.run(until=T0 + 0.8)
    s = agent.finish()
    assert s["served"] == 1
    row = rows[0]
    assert row["chunks"] == 1 and row["actual_s"] == pytest.approx(layer_charge(1000, 0))
    assert len(device.holds) >= 4  # four windows for one chunk of four layers
    for start, end, _ in device.holds:
        assert not any(ts < end - 1e-9 and start < te for ts, te in training)


def test_no_hold_when_not_even_one_layer_fits() -> None:
    # windows of 5 ms; one layer of a 300-token chunk needs 8.5 ms
    training = [(T0 + 0.005 + 0.01 * k, T0 + 0.01 + 0.01 * k) for k in range(30)]
    agent, device, _ = make_hold_agent([Request("r", 0.0, 300)], training, T0 + 0.25)
    agent.drain_s = 0.0
    agent.run(until=T0 + 0.3)
    s = agent.finish()
    assert device.holds == [] and s["served"] == 0 and s["rejected_by_reason"] == {"no_slots": 1}
    # by default what was admitted is finished once training has ended, on the free device
    agent, device, _ = make_hold_agent([Request("r", 0.0, 300)], training, T0 + 0.25)
    agent.run(until=T0 + 0.5)
    s = agent.finish()
    assert s["served"] == 1 and device.holds and all(start >= T0 + 0.25 for start, _, _ in device.holds)


def test_requests_stop_arriving_a_margin_before_the_last_iteration_ends() -> None:
    clock = FakeClock(T0)
    # iteration 1 is announced at 0.5 s; its last slot ends at 0.95 s
    published = [(T0, Slot(0, 0, T0, 0.1)), (T0 + 0.5, Slot(1, 0, T0 + 0.5, 0.1)),
                 (T0 + 0.5, Slot(1, 1, T0 + 0.8, 0.15)), (T0 + 1.0, EndOfSlots())]
    reqs = [Request(f"r{i}", 0.1 * i, 10) for i in range(10)]
    agent = Agent(clock=clock, device=HoldDevice(clock, []), slots=ListSlotFeed(clock, published),
                  timeline=NoTimeline(), tracker=SlotTracker(), admission=hold_admission(),
                  engine=ModelledEngine(hold_spec(), layer_charge), requests=reqs, epoch=T0,
                  live_bound=lambda: math.inf, window="live", arrivals_until_iteration=1,
                  arrivals_margin_s=0.3)
    agent.run(until=T0 + 1.0)
    s = agent.finish()
    assert s["arrived"] == 7 and s["served"] == 7  # arrivals at 0.0 .. 0.6 s (until 0.95 - 0.3)
    assert s["counters"]["not_arrived"] == 3


def test_requests_that_cannot_start_in_time_are_refused_at_arrival_with_the_figures():
    sched = periodic_schedule(T0, 3, 1.0, BUSY)
    res = simulate_agent(sched, poisson(2000, 3, deadline=0.5), charge, admission=AdmissionConfig(max_queue=100000))
    refused = [r for r in res.rows if r["reason"] == "deadline_unreachable"]
    assert refused, res.summary["rejected_by_reason"]
    r = refused[0]
    assert r["start"] is None and r["end"] is None  # never queued: refused when it arrived
    assert "requests queued ahead" in r["detail"] and "past its 0.5 s deadline" in r["detail"]
    # a request taken is served: none expires in the queue
    assert "deadline_passed" not in res.summary["rejected_by_reason"]
    # off (and admitted requests not kept to the end): they wait in the queue and expire there instead
    res = simulate_agent(sched, poisson(2000, 3, deadline=0.5), charge, admission=AdmissionConfig(max_queue=100000),
                         refuse_unreachable=False, serve_admitted=False)
    reasons = res.summary["rejected_by_reason"]
    assert "deadline_unreachable" not in reasons and reasons["deadline_passed"] > 1000
