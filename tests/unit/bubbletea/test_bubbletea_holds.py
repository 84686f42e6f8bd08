"""Preemptible holds: with the worker's live guarantees, a modelled prefill runs layer by
layer inside one device hold, each group of layers only if it (plus the guard) ends
before the guarantee as known at that moment; a chunk stops between layers and goes on
in a later window. Virtual time; the admission rule itself is tested on its own."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest

from bubbletea_agent.admission import (
    AdaptiveGuard,
    Admission,
    AdmissionConfig,
    GuardConfig,
    Pending,
)
from bubbletea_agent.agent import Agent
from bubbletea_agent.engine import ModelledEngine, ModelSpec
from bubbletea_agent.latency import FunctionLatency
from bubbletea_agent.requests import Request
from bubbletea_agent.sim import FakeClock, ListSlotFeed
from bubbletea_agent.slots import EndOfSlots, Slot, SlotTracker

T0 = 1000.0
LAYERS = 4


def charge(tokens: int, context: int) -> float:
    """4 ms per chunk (the weights) + 100 us per token."""
    return 0.004 + 1e-4 * tokens


def spec() -> ModelSpec:
    return ModelSpec(preset="tiny", num_hidden_layers=LAYERS)


def admission(**cfg: Any) -> Admission:
    return Admission(FunctionLatency(charge), AdmissionConfig(**cfg),
                     AdaptiveGuard(GuardConfig(initial_rel=0.0, rel_floor=0.0, abs_floor_s=0.0005)))


# ------------------------------------------------------------------ the rule


def test_pieces_within_counts_layers_that_fit_with_the_guard() -> None:
    a = admission()
    assert a.guard.hold_margin == 0.005  # no overrun seen yet: the ceiling
    assert a.pieces_within(0.010, 4, 0.0455) == 4
    assert a.pieces_within(0.010, 4, 0.0349) == 2  # 3 x 10 ms + 5 ms guard would not fit
    assert a.pieces_within(0.010, 4, 0.0140) == 0
    assert a.pieces_within(0.010, 2, 1.0) == 2  # never more than are left
    assert a.pieces_within(0.010, 2, float("inf")) == 2


def test_the_hold_guard_learns_how_late_layer_groups_end() -> None:
    g = AdaptiveGuard(GuardConfig(abs_floor_s=0.0005, hold_ceiling_s=0.005, min_samples=4))
    for late in (0.0001, 0.0002, 0.0001, 0.0003):
        g.observe(0.010, 0.010 + late)
    assert g.hold_margin == 0.0005  # small overruns: the floor
    for _ in range(20):
        g.observe(0.002, 0.004)  # 2 ms late, whatever the group's length
    assert g.hold_margin == pytest.approx(0.002)
    for _ in range(50):
        g.observe(0.002, 0.050)
    assert g.hold_margin == 0.005  # clamped: a stalled host is not what the guard is for


def test_next_pieces_continues_the_started_chunk_first() -> None:
    a = admission()
    started = Pending(Request("r1", 0.0, 1000), chunk_tokens=1000, chunk_pieces_done=3)
    fresh = Pending(Request("r2", 0.1, 10))
    run = a.next_pieces(0.5, [fresh, started], LAYERS, chunk_cap=2048)
    assert run is not None and run.pending is started and run.pieces == 1 and run.finishes_chunk
    assert run.piece_s == pytest.approx(charge(1000, 0) / LAYERS)
    # no room for its next layer: nothing else jumps ahead of it
    assert a.next_pieces(0.02, [fresh, started], LAYERS, chunk_cap=2048) is None


def test_next_pieces_cuts_new_chunks_at_the_cap() -> None:
    a = admission()
    p = Pending(Request("r1", 0.0, 5000))
    run = a.next_pieces(10.0, [p], LAYERS, chunk_cap=2048)
    assert run.tokens == 2048 and run.pieces == LAYERS
    capped = admission(max_chunk_tokens=256).next_pieces(10.0, [p], LAYERS, chunk_cap=2048)
    assert capped.tokens == 256


# ------------------------------------------------------------------ the loop


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


def make_agent(requests: list[Request], training: list[tuple[float, float]], end: float,
               **kw: Any) -> tuple[Agent, HoldDevice, list[dict]]:
    clock = FakeClock(T0)
    device = HoldDevice(clock, training)
    rows: list[dict] = []
    published = [(T0, Slot(0, 0, T0, 0.1)), (end, EndOfSlots())]
    agent = Agent(clock=clock, device=device, slots=ListSlotFeed(clock, published), timeline=NoTimeline(),
                  tracker=SlotTracker(), admission=kw.pop("admission", admission()),
                  engine=ModelledEngine(spec(), charge), requests=requests, epoch=T0, owner="bubbletea:w",
                  on_record=rows.append, live_bound=live_bound(clock, training), window="live", **kw)
    return agent, device, rows


def test_holds_fill_the_windows_and_never_cross_training() -> None:
    # training busy 20 ms of every 100 ms; requests of 300 tokens (34 ms) arrive quickly
    training = [(T0 + 0.1 * k, T0 + 0.1 * k + 0.02) for k in range(10)]
    reqs = [Request(f"r{i}", 0.005 * i, 300) for i in range(60)]
    agent, device, rows = make_agent(reqs, training, T0 + 1.0)
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
    agent, device, rows = make_agent([Request("big", 0.0, 1000)], training, T0 + 0.8)
    agent.run(until=T0 + 0.8)
    s = agent.finish()
    assert s["served"] == 1
    row = rows[0]
    assert row["chunks"] == 1 and row["actual_s"] == pytest.approx(charge(1000, 0))
    assert len(device.holds) >= 4  # four windows for one chunk of four layers
    for start, end, _ in device.holds:
        assert not any(ts < end - 1e-9 and start < te for ts, te in training)


def test_no_hold_when_not_even_one_layer_fits() -> None:
    # windows of 5 ms; one layer of a 300-token chunk needs 8.5 ms
    training = [(T0 + 0.005 + 0.01 * k, T0 + 0.01 + 0.01 * k) for k in range(30)]
    agent, device, _ = make_agent([Request("r", 0.0, 300)], training, T0 + 0.25)
    agent.run(until=T0 + 0.3)
    s = agent.finish()
    assert device.holds == [] and s["served"] == 0 and s["rejected_by_reason"] == {"no_slots": 1}


def test_requests_stop_arriving_a_margin_before_the_last_iteration_ends() -> None:
    clock = FakeClock(T0)
    # iteration 1 is announced at 0.5 s; its last slot ends at 0.95 s
    published = [(T0, Slot(0, 0, T0, 0.1)), (T0 + 0.5, Slot(1, 0, T0 + 0.5, 0.1)),
                 (T0 + 0.5, Slot(1, 1, T0 + 0.8, 0.15)), (T0 + 1.0, EndOfSlots())]
    reqs = [Request(f"r{i}", 0.1 * i, 10) for i in range(10)]
    agent = Agent(clock=clock, device=HoldDevice(clock, []), slots=ListSlotFeed(clock, published),
                  timeline=NoTimeline(), tracker=SlotTracker(), admission=admission(),
                  engine=ModelledEngine(spec(), charge), requests=reqs, epoch=T0,
                  live_bound=lambda: math.inf, window="live", arrivals_until_iteration=1,
                  arrivals_margin_s=0.3)
    agent.run(until=T0 + 1.0)
    s = agent.finish()
    assert s["arrived"] == 7 and s["served"] == 7  # arrivals at 0.0 .. 0.6 s (until 0.95 - 0.3)
    assert s["counters"]["not_arrived"] == 3
