"""The agent's admit-none hook (BUBBLETEA_ADMIT=none): the loop runs, requests arrive
and end with a reason, but the device is never taken; the runner's idle twin
measures the agents' own overhead with it."""

from __future__ import annotations

import pytest

from bubbletea_agent.requests import FixedLength, PoissonSource
from bubbletea_agent.sim import periodic_schedule, simulate_agent
from testbed_runtime.agent_env import ADMIT_ENV

T0 = 1000.0
BUSY = [(0.0, 0.3), (0.5, 0.3)]


def charge(tokens: int, context: int) -> float:
    return 0.001 + 20e-6 * tokens


def _run() -> object:
    sched = periodic_schedule(T0, 4, 1.0, BUSY)
    reqs = PoissonSource(rate_per_s=50, lengths=FixedLength(tokens=128), seed=3, duration_s=4,
                         deadline_s=0.5).requests()
    return simulate_agent(sched, reqs, charge)


def test_admit_none_never_takes_the_device_and_ends_every_request(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ADMIT_ENV, "none")
    res = _run()
    assert not [r for r in res.device.records if r.kind == "prefill"]
    s = res.summary
    assert s["arrived"] > 50 and s["served"] == 0 and s["arrived"] == s["rejected"]
    assert set(s["rejected_by_reason"]) <= {"deadline_unreachable", "no_slots"}


def test_without_the_hook_the_same_requests_are_served(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ADMIT_ENV, raising=False)
    res = _run()
    assert res.summary["served"] > 50
    assert [r for r in res.device.records if r.kind == "prefill"]
