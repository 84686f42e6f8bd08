"""testbed/report/replan.py `replan_run`: a kept run planned again by this checkout's
planner from the run's own calibration.

The kept atlas-4dc run (docs/atlas-4dc/: its summary.json and scenario.resolved.yaml):
every variant's prediction, made from the probes before the run, stays within the
issue's 10% of the iteration time the run measured, and the planner still chooses what
the run ran. A planner change that breaks this needs a fresh run (`sudo testbed run
scenarios/atlas-4dc.yaml`) kept in the folder, not a looser bound."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from testbed.report.loading import ReportError
from testbed.report.replan import replan_run

ROOT = Path(__file__).resolve().parents[3]
RUN = ROOT / "docs" / "atlas-4dc"


@pytest.fixture(scope="module")
def replanned():
    return {v.name: v for v in replan_run(RUN)}


def test_the_kept_run_has_the_five_variants_and_atlas_placed_apart(replanned) -> None:
    assert set(replanned) == {"baseline", "multi-tcp", "atlas", "dp-across-dc", "torch-gloo"}
    assert replanned["atlas"].ran.placement.stage_dc != replanned["baseline"].ran.placement.stage_dc


@pytest.mark.parametrize("variant", ["baseline", "multi-tcp", "atlas", "dp-across-dc", "torch-gloo"])
def test_each_prediction_from_the_kept_calibration_is_within_10_percent(replanned, variant: str) -> None:
    v = replanned[variant]
    assert v.setup.streams == v.ran.streams and v.setup.sharing == v.ran.sharing
    assert [list(r) for r in v.setup.placement.stage_dc] == [list(r) for r in v.ran.placement.stage_dc]
    assert v.error == pytest.approx(v.ran.iteration_time_s / v.now_s - 1)
    assert abs(v.error) <= 0.10, f"{variant}: predicted {v.now_s:.3f} s, ran {v.ran.iteration_time_s:.3f} s"


def test_a_folder_without_a_summary_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ReportError, match="no summary.json; give the folder of a `testbed run`"):
        replan_run(tmp_path)


def test_a_run_that_was_not_calibrated_is_refused(tmp_path: Path) -> None:
    data = json.loads((RUN / "summary.json").read_text())
    data["calibration"] = None
    (tmp_path / "summary.json").write_text(json.dumps(data))
    with pytest.raises(ReportError, match=r"not calibrated \(runner.calibrate: false\)"):
        replan_run(tmp_path)


def test_a_folder_without_its_scenario_needs_the_scenario_file(tmp_path: Path) -> None:
    shutil.copy(RUN / "summary.json", tmp_path / "summary.json")
    with pytest.raises(ReportError, match="no scenario.resolved.yaml; give the run's scenario file"):
        replan_run(tmp_path)
    assert {v.name for v in replan_run(tmp_path, RUN / "scenario.resolved.yaml")} >= {"atlas", "baseline"}


def test_a_file_that_is_not_a_summary_is_refused(tmp_path: Path) -> None:
    (tmp_path / "summary.json").write_text('{"scenario": "x"}')
    with pytest.raises(ReportError, match="not the summary.json of a `testbed run`"):
        replan_run(tmp_path)


def test_a_run_with_an_outage_is_replanned_with_its_forecast() -> None:
    """The kept faults-2dc run (a 2 s outage in its second of three measured iterations):
    the prediction now is the healthy iteration plus the outage's forecast over the three,
    as the run makes it (testbed/run/faults.py `forecast`), not the healthy iteration alone."""
    from testbed.run.faults import forecast
    from testbed.run.scenario import load_scenario

    run = ROOT / "results" / "prediction-errors" / "head-1205" / "runs" / "faults-2dc"
    (v,) = replan_run(run)
    healthy = v.setup.prediction.iteration_time_s
    scenario, _ = load_scenario(run / "scenario.resolved.yaml")
    (fc,) = forecast(scenario.faults, scenario.workload.warmup, v.setup.prediction, scenario.topology)
    assert fc.delay_s is not None and fc.delay_s > 2.0
    assert v.now_s == pytest.approx(healthy + fc.delay_s / 3)


def test_a_real_device_run_is_planned_again_with_its_warm_up_compute() -> None:
    """A kept real-device run (real-tiny-2dc at 424521c): its headline took the stage
    times and overhead its warm-up measured; planned again with them, each variant meets
    its stored prediction, where the compute model alone is far off (the machine's
    own small-tensor costs)."""
    run = ROOT / "results" / "prediction-errors" / "at-424521c" / "runs" / "real-tiny-2dc"
    for v in replan_run(run):
        stored = v.ran.predicted_iteration_time_s
        assert v.with_measured_compute_s is not None
        assert v.now_s == pytest.approx(stored, rel=0.01), v.name
        assert abs(v.setup.prediction.iteration_time_s / stored - 1) > 0.2  # the a-priori compute model's
