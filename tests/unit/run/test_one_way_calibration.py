"""A shared channel timed one way alone too (testbed/run/calibration.py
`calibrate_one_way`) and the prediction weighing it by how much the transfers overlap
the other way's (testbed/run/variants.py `_weigh_one_way`): a pipeline whose transfers
take turns across the path (scenarios/bubbletea-unequal-bubbles.yaml) moves what a
channel alone one way moves."""

from __future__ import annotations

from pathlib import Path

import pytest

from testbed.progress import Progress
from testbed.run import calibration
from testbed.run.calibration import ProbeTimes
from testbed.run.scenario import load_scenario
from testbed.run.variants import plan_variant
from testbed_core.contracts.calibration import (
    Calibration,
    CalibrationReport,
    PathCalibration,
)

ROOT = Path(__file__).resolve().parents[3]
MB8 = 8388608


def _scenario(**changes):
    scenario, _ = load_scenario(ROOT / "scenarios" / "bubbletea-unequal-bubbles.yaml", changes or None)
    return scenario


def _path(**figures) -> PathCalibration:
    return PathCalibration(dcs=("dc1", "dc2"), src="dc1-h2", dst="dc2-h1", nbytes=MB8, latency_s=0.025,
                           nominal_bps=1e9, rates_bps={1: 1.09e8, 8: 7.33e8}, transfer_s={1: [0.64], 8: [0.117]},
                           **figures)


def test_one_channel_is_timed_alone_one_way_per_count_not_timed_yet(monkeypatch, tmp_path: Path) -> None:
    calls = []

    def fake_run(self, pairs, streams, nbytes, count, label="", warm=True, caps=None, opened=None, **kwargs):
        calls.append((list(pairs), streams, count, label, opened.warm, caps))
        return [ProbeTimes([0.0] * count, [9.0] * untimed + [0.1 + 0.025] * (count - untimed))]

    monkeypatch.setattr(calibration.Prober, "run", fake_run)
    scenario = _scenario(**{"runner.calibration_transfers": 3, "runner.base_port": 20000})
    untimed = calibration.run_channels(scenario).untimed
    assert untimed == 3  # the run's channels carry 2 warm-up iterations' tensors (the turns probe's cap) first
    path = _path(one_way_bps={4: 5e8}, one_way_s={4: [0.2]})
    calibration.calibrate_one_way(object(), scenario, tmp_path, "s", ("dc1-h2", "dc2-h1"), [4, 8], path,
                                  Progress(label="t", tty=False), agents=object(), caps={("dc1", "dc2"): 65536})
    # 4 was timed already; at least ONE_WAY_ROUNDS timed transfers (3 asked for), cold channels as the run's
    # (modelled devices), clamped as asked
    assert calls == [([("dc1-h2", "dc2-h1")], 8, calibration.ONE_WAY_ROUNDS + untimed, "dc1-dc2-oneway-", False,
                      {("dc1", "dc2"): 65536})]
    assert path.one_way_bps[8] == pytest.approx(MB8 * 8 / 0.1)
    assert path.one_way_s[8] == [0.125] * calibration.ONE_WAY_ROUNDS
    back = PathCalibration.from_report(path.report(), MB8)
    assert back.one_way_bps == path.one_way_bps and back.one_way_s == path.one_way_s


def test_transfers_taking_turns_are_predicted_at_the_one_way_rate() -> None:
    scenario = _scenario(**{"runner.atlas_sharing": "shared"})
    both = Calibration(src="dc1-h2", dst="dc2-h1", nbytes=MB8, latency_s=0.025, paths=[_path()])
    both.mirror_primary()
    one = Calibration(src="dc1-h2", dst="dc2-h1", nbytes=MB8, latency_s=0.025,
                      paths=[_path(one_way_bps={8: 8.34e8}, one_way_s={8: [0.105]})])
    one.mirror_primary()
    plain = plan_variant("atlas", scenario, scenario.workload, None, both, None)
    weighed = plan_variant("atlas", scenario, scenario.workload, None, one, None)
    assert plain.sharing == weighed.sharing == "shared"
    # the 1F1B pipeline of 4 stages, 2 in each DC, sends one way then the other: faster
    assert weighed.prediction.iteration_time_s < 0.97 * plain.prediction.iteration_time_s
    assert 7.33e8 < weighed.rate_bps < 8.34e8
    assert "alone one way too" in CalibrationReport.model_validate_json(one.report().model_dump_json()).method
