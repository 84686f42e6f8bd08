"""A calibration probe's time budget (testbed/run/calibration.py `probe_budget_s`,
`Prober.run`): it grows with the probe's rounds, bytes and round trips, so that a slow
but healthy probe (Atlas's one-stream turns at 100 ms RTT) is not taken for a hung one,
and the probe's own timeout, which names the transfer, fires before the runner's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import testbed.run.calibration as calibration
from testbed.run.scenario import load_scenario

ROOT = Path(__file__).resolve().parents[3]
MIB8 = 8 * 2**20


def test_a_slow_turns_probe_gets_the_time_its_rounds_need() -> None:
    # sweep-rtt at 100 ms one way: 1-stream 8 MiB tensors took 2.55 s alone; the turns
    # probe's 9 rounds of two channels' turns (2 x 2.8 s each) outlast the old fixed 60 s
    slot = 2.8
    period = 2 * 2 * slot
    budget = calibration.probe_budget_s(9, MIB8, period, [0.0, 2 * slot], [(1e9, 0.2)])
    assert budget > 9 * period + 2 * slot + 2.55
    assert budget < 3 * (9 * period + 60)  # still a bound a hung probe meets


def test_the_budget_grows_with_bytes_round_trips_and_slow_links() -> None:
    base = calibration.probe_budget_s(12, MIB8, None, None, [(1e9, 0.01)])
    assert calibration.probe_budget_s(12, MIB8, None, None, [(1e9, 0.4)]) > base  # window-limited
    assert calibration.probe_budget_s(12, MIB8, None, None, [(1e9, 0.01), (1e7, 0.01)]) > base + 12 * 6
    assert calibration.probe_budget_s(12, 2 * MIB8, None, None, [(1e9, 0.01)]) > base
    assert base >= calibration.PROBE_SLACK_S + 12 * calibration.PROBE_TRANSFER_SLACK_S


def test_the_prober_hands_its_budget_to_both_ends_and_waits_longer_itself(tmp_path: Path) -> None:
    scenario, _ = load_scenario(ROOT / "scenarios" / "atlas-2dc.yaml", {"runner.base_port": "29500"})

    class Net:
        def host(self, name):
            return type("H", (), {"ip": "10.0.0.1"})()

    class Agents:
        def __init__(self) -> None:
            self.jobs, self.waits = [], []

        def start(self, hosts) -> None:
            pass

        def submit(self, host, job) -> None:
            self.jobs.append(job)

        def go(self, name, at) -> None:
            pass

        def expect(self, name, word, timeout_s) -> None:
            self.waits.append((name, word, timeout_s))
            if word == "done":
                job = next(j for j in self.jobs if j.name == name)
                key = "arrived" if job.role == "probe-recv" else "sent"
                Path(job.out).write_text(json.dumps({key: [0.0] * job.count}))

    agents = Agents()
    prober = calibration.Prober(Net(), tmp_path, scenario, "s", calibration.PortPlan(29500).calibration, agents)
    prober.run([("dc1-h1", "dc2-h1")], 1, MIB8, 9, period_s=11.2, offsets=[0.0])
    wan = [(link.rate, link.rtt_s) for link in scenario.topology.wan]
    budget = calibration.probe_budget_s(9, MIB8, 11.2, [0.0], wan)
    assert len(agents.jobs) == 2 and all(j.timeout_s == pytest.approx(budget) for j in agents.jobs)
    assert all(t == pytest.approx(budget + 30) for _, word, t in agents.waits if word == "done")


def test_a_clamped_channel_gets_a_round_trip_per_window_it_may_have_in_flight() -> None:
    # 8 MiB over 8 streams clamped to 16 KiB: 64 windows, each a round trip of 50 ms
    free = calibration.probe_budget_s(4, MIB8, None, None, [(1e9, 0.05)])
    clamped = calibration.probe_budget_s(4, MIB8, None, None, [(1e9, 0.05)], 8 * 16 * 2**10)
    assert clamped - free == pytest.approx(4 * (64 - 8) * 0.05)
    assert calibration.probe_budget_s(4, MIB8, None, None, [(1e9, 0.05)], 8 * 2**20) == free  # wide clamp: as free
