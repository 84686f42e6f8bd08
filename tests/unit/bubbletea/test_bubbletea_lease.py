"""An agent's holds are leases on the real emulated device (testbed_runtime/device.py):
when training asks for the device the hold stops between two layers, keeps the layers
that ran and goes on in a later window; its deadline follows what each group committed
to. Wall clock, real files, a training thread next to the agent (issue 30)."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

from bubbletea_agent.admission import AdaptiveGuard, Admission, AdmissionConfig, GuardConfig
from bubbletea_agent.agent import Agent, WallClock
from bubbletea_agent.engine import ModelledEngine
from bubbletea_agent.latency import FunctionLatency
from bubbletea_agent.requests import Request
from bubbletea_agent.slots import SlotTracker
from testbed_core.contracts.bubbletea import PrefillModelSpec
from testbed_runtime.device import Device
from testbed_runtime.slots import Slot


def layer_charge(tokens: int, context: int) -> float:
    """0.4 s a chunk: 4 layers of 100 ms, so a hold is long enough to be interrupted."""
    return 0.4


class Feed:
    def __init__(self, items: list[Any]) -> None:
        self.items = items

    def poll(self) -> list[Any]:
        out, self.items = self.items, []
        return out


class NoTimeline:
    def poll(self) -> list[Any]:
        return []


def test_a_hold_yields_to_training_and_resumes_later(tmp_path: Path) -> None:
    agent_dev, train_dev = Device("gpu0", tmp_path), Device("gpu0", tmp_path)
    t0 = time.time()
    # a live bound far ahead: the worker's guarantee is wrong (or stale), as in issue 30's
    # 10 s holds; only the device's arbitration stands between the hold and training
    agent = Agent(clock=WallClock(), device=agent_dev, slots=Feed([Slot(0, 0, t0, 10.0)]), timeline=NoTimeline(),
                  tracker=SlotTracker(),
                  admission=Admission(FunctionLatency(layer_charge), AdmissionConfig(),
                                      AdaptiveGuard(GuardConfig(initial_rel=0.0, rel_floor=0.0, abs_floor_s=0.0005))),
                  engine=ModelledEngine(PrefillModelSpec(preset="tiny", num_hidden_layers=4), layer_charge),
                  requests=[Request("r1601", 0.0, 512, deadline_s=30.0)], epoch=t0, owner="bubbletea:gpu0",
                  live_bound=lambda: t0 + 10.0, window="live")
    holds: list[Any] = []
    done = threading.Event()

    def loop() -> None:
        while not done.is_set() and agent.queue or not holds:
            agent.step()
            holds[:] = [r for r in agent_dev.timeline() if r.kind == "prefill"]
            time.sleep(0.001)
            if time.time() - t0 > 20:
                break

    th = threading.Thread(target=loop)
    th.start()
    t_end = time.time() + 10
    while agent_dev.lease() is None and time.time() < t_end:
        time.sleep(0.001)
    lease = agent_dev.lease()
    assert lease is not None and lease.label == "r1601:hold"
    assert lease.deadline <= t0 + 10.0 + 1e-6  # never beyond the window the hold was admitted for
    time.sleep(0.15)  # one layer ran, the second is under way
    asked = time.time()
    rec = train_dev.run("forward", "train:p0r0", duration_s=0.05, label="F0")
    done.set()
    th.join(30)
    assert rec.revoked_lease == ""  # the holder gave the lock back itself ...
    assert rec.start - asked < 1.0  # ... between two sleeps of 2 ms, not after its 0.4 s chunk
    assert agent.counters.yielded >= 1
    first = min(holds, key=lambda r: r.start)
    assert first.end <= rec.start + 1e-3
    row = agent.ledger.get("r1601")
    assert row.actual_s > 0  # the layers that ran are kept: the chunk goes on in a later window


def test_no_lease_arguments_for_a_device_without_leases() -> None:
    agent = Agent.__new__(Agent)
    agent.device = object()  # the simulator's device and the tests' fakes have no leases
    agent.lease_guard_s = 0.005
    assert agent._lease_kw(time.time() + 1) == {}
    agent.device = Device.__new__(Device)
    assert agent._lease_kw(5.0) == {"deadline": 5.0, "guard_s": 0.005}
    assert agent._lease_kw(float("inf")) == {}




def test_a_holds_bookkeeping_runs_at_normal_priority(tmp_path: Path, monkeypatch: Any) -> None:
    """Inside a hold the agent sleeps to each group's end at SCHED_FIFO (the hold ends on
    time, and hands the device back at once) but settles and admits at normal priority:
    a real-time thread runs ahead of every training worker, and in the run's idle cgroup
    bookkeeping must wait for a core training leaves free (issue 40)."""
    import os

    import bubbletea_agent.agent as agent_mod

    events: list[str] = []
    policy = {"now": "other"}

    def sched(pid: int, pol: int, param: Any) -> None:
        policy["now"] = "fifo" if pol == os.SCHED_FIFO else "other"

    monkeypatch.setattr(agent_mod.os, "sched_setscheduler", sched, raising=False)
    monkeypatch.setattr(agent_mod.os, "SCHED_FIFO", 1, raising=False)
    monkeypatch.setattr(agent_mod.os, "SCHED_OTHER", 0, raising=False)
    t0 = time.time()

    def fast(tokens: int, context: int) -> float:
        return 0.02  # 4 layers of 5 ms

    agent = Agent(clock=WallClock(), device=Device("gpu0", tmp_path), slots=Feed([Slot(0, 0, t0, 5.0)]),
                  timeline=NoTimeline(), tracker=SlotTracker(),
                  admission=Admission(FunctionLatency(fast), AdmissionConfig(),
                                      AdaptiveGuard(GuardConfig(initial_rel=0.0, rel_floor=0.0, abs_floor_s=0.0005))),
                  engine=ModelledEngine(PrefillModelSpec(preset="tiny", num_hidden_layers=4), fast),
                  requests=[Request("r1", 0.0, 512, deadline_s=30.0)], epoch=t0, owner="bubbletea:gpu0",
                  live_bound=lambda: t0 + 5.0, window="live", realtime_holds=True)
    for name in ("_settle", "_arrivals"):
        real = getattr(agent, name)

        def spy(*a: Any, _real: Any = real, _name: str = name) -> Any:
            events.append(f"{_name}@{policy['now']}")
            return _real(*a)

        monkeypatch.setattr(agent, name, spy)
    real_sleep = agent._sleep_in_hold

    def sleep_spy(until: float) -> bool:
        events.append(f"sleep@{policy['now']}")
        return real_sleep(until)

    monkeypatch.setattr(agent, "_sleep_in_hold", sleep_spy)
    def served() -> bool:
        return "r1" in agent.ledger.records and agent.ledger.get("r1").end is not None

    while not served() and time.time() - t0 < 1.5:
        agent.step()
        time.sleep(0.001)
    assert served() and agent.realtime_holds  # prefilled, its holds real-time throughout
    in_hold = [e for e in events if e.startswith(("sleep", "_settle"))]
    assert in_hold and {e for e in in_hold if e.startswith("sleep")} == {"sleep@fifo"}
    assert {e for e in events if not e.startswith("sleep")} <= {"_settle@other", "_arrivals@other"}
    assert policy["now"] == "other"  # back to normal once the hold is over
