"""The calibration's probes open their channels as the run opens its own
(testbed/run/calibration.py `run_channels`, `variant_caps`, `probe_caps`, `Prober.run`):
cold on modelled devices and warmed on real ones, the run's untimed warm-up tensors
left out, and each stream's window clamped as the run clamps the variants' channels
(testbed/run/pacing.py `window_caps`) where every variant the figure serves runs so."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from testbed.progress import Progress
from testbed.run import calibration
from testbed.run.calibration import Prober, ProbeTimes, probe_caps, run_channels, variant_caps
from testbed.run.pacing import tensors_at_once, window_caps
from testbed.run.ports import PortPlan
from testbed.run.scenario import load_scenario
from testbed.run.variants import place_variants, run_variants
from testbed_core.constants import warmup_bytes
from testbed_core.contracts.calibration import TURNS_MAX_UNTIMED, Calibration
from testbed_core.contracts.worker_job import ProbeJob

ROOT = Path(__file__).resolve().parents[3]
MB8 = 8388608


def _scenario(name: str = "atlas-2dc.yaml", **changes):
    scenario, _ = load_scenario(ROOT / "scenarios" / name, {"runner.base_port": "29500", **changes})
    return scenario


def test_the_probes_open_channels_as_the_run_does() -> None:
    """Modelled devices: cold channels (the workers send no warm-up tensor); real ones:
    warmed (testbed/training/worker/warm.py); first the tensors of the run's warm-up
    iterations, at most TURNS_MAX_UNTIMED, none without warm-up iterations."""
    at_once = tensors_at_once(_scenario().workload.parallelism)  # pp 2, 1F1B: one at a time
    assert run_channels(_scenario()) == (False, TURNS_MAX_UNTIMED, at_once)  # 3 warm-up iterations of 8 micro-batches
    assert run_channels(_scenario(**{"workload.warmup": 0})) == (False, 0, at_once)
    one = _scenario(**{"workload.warmup": 1, "workload.parallelism.num_micro_batches": 2})
    assert run_channels(one) == (False, 2, tensors_at_once(one.workload.parallelism))
    gpipe = _scenario(**{"workload.parallelism.schedule": "gpipe"})  # every micro-batch at once
    assert run_channels(gpipe).at_once == gpipe.workload.parallelism.num_micro_batches == 8
    real = _scenario("real-tiny-2dc.yaml")
    assert real.workload.gpu.mode == "real" and run_channels(real)[:2] == (True, TURNS_MAX_UNTIMED)


def test_the_alone_probe_times_one_cold_channel_both_ways_after_the_runs_untimed_tensors(monkeypatch,
                                                                                         tmp_path: Path) -> None:
    """sweep-rtt's 200 ms point (issue 40): a warm-up tensor opened the 8-stream
    channel's windows on some calibrations and not on others, while the run's cold
    boundary channels, carrying activations one way and gradients the other, took three
    round trips a tensor. The rate probe sends no warm-up tensor on modelled devices,
    sends tensors both ways over each channel (duplex), leaves the run's untimed count
    out (at most ALONE_MAX_UNTIMED) and takes the median of both ways' rest."""
    calls = []
    untimed = calibration.ALONE_MAX_UNTIMED

    def fake_run(self, pairs, streams, nbytes, count, label="", period_s=None, offsets=None, warm=True,
                 verify=False, caps=None, duplex=False, opened=None):
        calls.append((list(pairs), streams, count, opened, caps, duplex))
        first = [2.0] * untimed  # slow start: not counted
        return [ProbeTimes([0.0] * count, first + [0.1 + 0.42] * (count - untimed), back_sent=[1.0] * count,
                           back_arrived=[3.0] * untimed + [1.1 + 0.44] * (count - untimed)) for _ in pairs]

    monkeypatch.setattr(calibration.Prober, "run", fake_run)
    scenario = _scenario(**{"runner.calibration_transfers": 4})
    assert scenario.workload.warmup * scenario.workload.parallelism.num_micro_batches > untimed
    cal = Calibration(src="dc1-h1", dst="dc2-h1", nbytes=MB8, latency_s=0.1)
    calibration.calibrate(object(), scenario, tmp_path, "s", [("dc1-h1", "dc2-h1")], [8],
                          MB8, 0.1, Progress(label="t", tty=False), cal, agents=object())
    opened = run_channels(scenario, untimed)
    assert calls == [([("dc1-h1", "dc2-h1")], 8, 4 + untimed, opened, None, True)]
    assert not opened.warm and opened.untimed == untimed
    assert cal.transfer_s[8] == pytest.approx([0.52] * 4 + [0.54] * 4)  # forward, then back
    assert cal.rates_bps[8] == pytest.approx(MB8 * 8 / 0.43)
    # real devices: warmed; a run with fewer warm-up tensors: that many untimed
    calls.clear()
    real = _scenario("real-tiny-2dc.yaml", **{"runner.calibration_transfers": 4, "workload.warmup": 1})
    untimed = real.workload.warmup * real.workload.parallelism.num_micro_batches
    assert untimed < calibration.ALONE_MAX_UNTIMED
    calibration.calibrate(object(), real, tmp_path, "s", [("dc1-h1", "dc2-h1")], [8], MB8, 0.1,
                          Progress(label="t", tty=False), agents=object(), caps={("dc1", "dc2"): 1 << 17})
    assert calls == [([("dc1-h1", "dc2-h1")], 8, 4 + untimed, run_channels(real, calibration.ALONE_MAX_UNTIMED),
                      {("dc1", "dc2"): 1 << 17}, True)]
    assert calls[0][3].warm


def test_the_collision_probe_is_cold_and_clamped_as_asked(monkeypatch, tmp_path: Path) -> None:
    calls = []

    def fake_run(self, pairs, streams, nbytes, count, label="", period_s=None, offsets=None, warm=True,
                 verify=False, caps=None, duplex=False, opened=None):
        calls.append((len(pairs), count, opened, caps, duplex))
        return [ProbeTimes([0.0] * count, [9.0] * TURNS_MAX_UNTIMED + [0.3] * (count - TURNS_MAX_UNTIMED))
                for _ in pairs]

    monkeypatch.setattr(calibration.Prober, "run", fake_run)
    scenario = _scenario()
    cal = Calibration(src="dc1-h1", dst="dc2-h1", nbytes=MB8, latency_s=0.1, transfer_s={8: [0.5]})
    caps = {("dc1", "dc2"): 200_000, ("dc2", "dc1"): 150_000}
    calibration.calibrate_link(object(), scenario, tmp_path, "s", [("dc1-h1", "dc2-h1"), ("dc1-h2", "dc2-h2")], 8,
                               cal, Progress(label="t", tty=False), agents=object(), caps=caps)
    assert calls == [(4, calibration.COLLISION_ROUNDS + TURNS_MAX_UNTIMED, run_channels(scenario), caps, False)]
    assert cal.colliding_bps[8] == pytest.approx(2 * MB8 * 8 / 0.2)  # the slow untimed ones left out
    # GPipe: every micro-batch at once (Prober.run then hands at most what the route holds, `probe_burst`)
    calls.clear()
    gpipe = _scenario(**{"workload.parallelism.schedule": "gpipe"})
    calibration.calibrate_link(object(), gpipe, tmp_path, "s", [("dc1-h1", "dc2-h1"), ("dc1-h2", "dc2-h2")], 8,
                               cal, Progress(label="t", tty=False), agents=object(), caps=caps)
    assert calls[0][2] == run_channels(gpipe) and run_channels(gpipe).at_once == 8


def test_the_rate_probes_hand_their_untimed_tensors_as_the_schedule_does(monkeypatch, tmp_path: Path) -> None:
    """The alone probe hands the untimed tensors as many at once as the schedule hands a
    channel (GPipe: every micro-batch)."""
    seen = []

    def fake_run(self, pairs, streams, nbytes, count, label="", opened=None, **kwargs):
        seen.append(opened)
        return [ProbeTimes([0.0] * count, [0.3] * count, back_sent=[0.0] * count, back_arrived=[0.3] * count)
                for _ in pairs]

    monkeypatch.setattr(calibration.Prober, "run", fake_run)
    gpipe = _scenario(**{"workload.parallelism.schedule": "gpipe"})
    calibration.calibrate(object(), gpipe, tmp_path, "s", [("dc1-h1", "dc2-h1")], [8], MB8, 0.1,
                          Progress(label="t", tty=False), agents=object())
    assert seen == [run_channels(gpipe, calibration.ALONE_MAX_UNTIMED)] and seen[0].at_once == 8


def test_each_probe_end_clamps_what_it_receives(tmp_path: Path) -> None:
    """Prober.run hands each end its direction's cap: the receiver the cap of what it
    receives (sending DC -> receiving DC), the sender the other way's (what it would
    receive on the run's channel), as testbed/run/jobs.py gives the run's ends; a cold
    probe carries no warm-up tensor, a warmed one the workers' (warmup_bytes)."""
    jobs: dict[str, ProbeJob] = {}

    class Agents:
        def start(self, hosts) -> None:
            pass

        def submit(self, host, job) -> str:
            jobs[job.name] = job
            times = {"sent": [0.0, 1.0]} if job.role == "probe-send" else {"arrived": [0.5, 1.5]}
            if job.duplex:
                times |= {"returned": [0.9, 1.9]} if job.role == "probe-send" else {"returned_sent": [0.5, 1.5]}
            Path(job.out).write_text(json.dumps(times))
            return job.name

        def expect(self, name, word, timeout_s) -> None:
            pass

        def go(self, name, start_at) -> None:
            pass

    class Host:
        def __init__(self, name: str) -> None:
            self.ip = f"10.0.0.{len(name)}"

    class Net:
        def host(self, name: str) -> Host:
            return Host(name)

    scenario = _scenario()
    prober = Prober(Net(), tmp_path, scenario, "s", PortPlan(29500).calibration, Agents())
    caps = {("dc1", "dc2"): 200_000}
    res = prober.run([("dc1-h1", "dc2-h1"), ("dc2-h2", "dc1-h2")], 8, MB8, 2, "t-", warm=False, caps=caps)
    assert [r.timed(0) for r in res] == [[0.5, 0.5]] * 2
    assert jobs["t-s8-c0-recv"].window_clamp == 200_000 and jobs["t-s8-c0-send"].window_clamp is None
    assert jobs["t-s8-c1-recv"].window_clamp is None and jobs["t-s8-c1-send"].window_clamp == 200_000
    assert {j.warmup_bytes for j in jobs.values()} == {0}
    assert not any(j.duplex for j in jobs.values()) and res[0].timed_back(0) == []
    (res,) = prober.run([("dc1-h1", "dc2-h1")], 8, MB8, 2, "w-", duplex=True)
    assert jobs["w-s8-c0-recv"].window_clamp is None and jobs["w-s8-c0-send"].warmup_bytes == warmup_bytes(8)
    assert jobs["w-s8-c0-recv"].duplex and jobs["w-s8-c0-send"].duplex
    assert res.timed_back(0) == pytest.approx([0.4, 0.4])  # handed back on arrival, back at the sender


def test_a_probe_takes_the_cap_only_where_every_variant_it_serves_runs_with_it() -> None:
    """variant_caps: a shared variant's caps are the run's (window_caps on its placement);
    a temporal plan by request runs uncapped (None), and Atlas's ``auto`` sharing counts
    as capped only for the figures its shared way alone reads (collisions). probe_caps:
    per direction the cap all agree on, none where one runs uncapped or otherwise."""
    scenario = _scenario("atlas-4dc.yaml")
    runs = {r.variant.name: r for r in run_variants(scenario)}
    placements = place_variants(scenario, list(runs.values()))
    nbytes = scenario.workload.effective(None).wire_activation_bytes
    mt = window_caps(scenario.topology, placements["multi-tcp"], 8, nbytes,
                     tensors_at_once(scenario.workload.parallelism))
    assert mt  # atlas-4dc's multi-tcp runs capped
    assert variant_caps(scenario, runs["multi-tcp"], placements["multi-tcp"], 8, nbytes, False, False) == mt
    assert variant_caps(scenario, runs["multi-tcp"], placements["multi-tcp"], 8, nbytes, True, False) == {}  # local
    assert variant_caps(scenario, runs["multi-tcp"], placements["multi-tcp"], 1, nbytes, False, False) == {}
    assert variant_caps(scenario, runs["atlas"], placements["atlas"], 8, nbytes, False, False) is None  # auto
    at = variant_caps(scenario, runs["atlas"], placements["atlas"], 8, nbytes, False, True)
    assert at and set(at) < set(mt)
    temporal = _scenario("atlas-4dc.yaml", **{"runner.atlas_sharing": "temporal"})
    assert variant_caps(temporal, runs["atlas"], placements["atlas"], 8, nbytes, False, True) is None
    assert probe_caps([mt]) == mt
    assert probe_caps([mt, None]) == {} and probe_caps([]) == {}
    assert probe_caps([mt, at]) == {w: c for w, c in mt.items() if at.get(w) == c} == at
    assert probe_caps([mt, {**at, ("east", "west"): 1 << 20}]) == {w: c for w, c in at.items() if w != ("east", "west")}
