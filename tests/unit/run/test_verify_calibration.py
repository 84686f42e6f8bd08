"""The tensor checks' calibration (testbed/run/calibration.py `calibrate_verify`) and its
use in a run's plan (testbed/run/variants.py: `VariantSetup.host_cost`): a scenario with
``runner.verify_tensors`` is predicted with each fill and check on its ranks' time."""

from __future__ import annotations

from pathlib import Path

import pytest

from testbed.progress import Progress
from testbed.run import calibration
from testbed.run.calibration import ProbeTimes, RunnerError
from testbed.run.scenario import load_scenario
from testbed.run.variants import plan_variant
from testbed_core.contracts.calibration import PROBE_WARMUP, Calibration, VerifyCalibration

ROOT = Path(__file__).resolve().parents[3]


def _scenario(**changes):
    scenario, _ = load_scenario(ROOT / "scenarios" / "faults-2dc.yaml", changes or None)
    return scenario


def test_the_checks_are_timed_on_the_rate_probes_channels_warm_ups_left_out(monkeypatch, tmp_path: Path) -> None:
    calls = []

    def fake_run(self, pairs, streams, nbytes, count, label="", period_s=None, offsets=None, warm=True,
                 verify=False):
        calls.append((list(pairs), streams, nbytes, count, label, verify))
        first = [9.0] * PROBE_WARMUP  # warm-up tensors: slow, not counted
        return [ProbeTimes([], [], first + [0.004] * (count - PROBE_WARMUP), first + [0.02] * (count - PROBE_WARMUP))
                for _ in pairs]

    monkeypatch.setattr(calibration.Prober, "run", fake_run)
    scenario = _scenario(**{"runner.calibration_transfers": 3, "runner.base_port": 20000})
    pairs = [("dc1-h1", "dc2-h1"), ("dc2-h2", "dc1-h2")]
    got = calibration.calibrate_verify(object(), scenario, tmp_path, "s", pairs, 8, 1 << 20,
                                       Progress(label="t", tty=False), agents=object())
    count = calibration.VERIFY_ROUNDS + PROBE_WARMUP  # at least VERIFY_ROUNDS timed, more than the 3 asked
    assert calls == [(pairs, 8, 1 << 20, count, "verify-", True)]
    assert got.fill_s == [0.004] * (2 * calibration.VERIFY_ROUNDS) and got.check_mean_s == pytest.approx(0.02)
    # a probe that timed nothing (an agent without the checks) is an error naming the path
    monkeypatch.setattr(calibration.Prober, "run", lambda self, pairs, *a, **k: [ProbeTimes([], [])])
    with pytest.raises(RunnerError, match=r"tensor-check probe between dc1-h1 and dc2-h1 timed 0 fill\(s\)"):
        calibration.calibrate_verify(object(), scenario, tmp_path, "s", pairs, 8, 1 << 20,
                                     Progress(label="t", tty=False), agents=object())


def test_a_verified_run_is_planned_with_its_checks() -> None:
    scenario = _scenario()
    cal = Calibration(src="dc1-h1", dst="dc2-h1", nbytes=1 << 20, latency_s=0.025,
                      rates_bps={1: 1e8, 8: 7e8}, transfer_s={1: [0.1], 8: [0.04]})
    plain = plan_variant("atlas", scenario, scenario.workload, None, cal, None)
    cal.verify = VerifyCalibration(nbytes=1 << 20, fill_s=[0.005], check_s=[0.012])
    checked = plan_variant("atlas", scenario, scenario.workload, None, cal, None)
    assert plain.host_cost is None and checked.host_cost is not None
    assert checked.prediction.iteration_time_s > plain.prediction.iteration_time_s + 4 * 0.017 - 1e-9
    # the checks off (runner.verify_tensors: false): a calibration's figures are not used
    off = _scenario(**{"runner.verify_tensors": False})
    assert plan_variant("atlas", off, off.workload, None, cal, None).host_cost is None
