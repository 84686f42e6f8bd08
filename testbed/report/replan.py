"""A kept run planned again by this checkout's planner from the run's own calibration.

A run folder keeps its ``summary.json`` (with the calibration the predictions used,
`Calibration.from_report`) and ``scenario.resolved.yaml``; every variant that ran is
planned again (testbed/run/variants.py `plan_variant`: streams, sharing, placement and
prediction), so a change to the planner is judged against runs it did not see, next to
what they measured and what they predicted themselves (scripts/repredict.py prints
it; a unit test holds the kept atlas-4dc run to it).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from testbed.report.loading import ReportError, read_summary_file
from testbed.run.scenario import Scenario, load_scenario
from testbed.run.variants import VariantSetup, plan_variant
from testbed_core.contracts.calibration import Calibration
from testbed_core.contracts.summary import VariantResult


@dataclass(frozen=True)
class Replanned:
    """One variant of a kept run: what it ran and measured, and its plan now."""

    name: str
    ran: VariantResult
    setup: VariantSetup
    with_faults_s: float | None = None  # the mean with the scenario's faults forecast (testbed/run/faults.py)
    # real devices: with the stage times and overhead the run's warm-up measured, as its headline
    with_measured_compute_s: float | None = None

    @property
    def now_s(self) -> float:
        assert self.setup.prediction is not None
        if self.with_faults_s is not None:
            return self.with_faults_s
        if self.with_measured_compute_s is not None:
            return self.with_measured_compute_s
        return self.setup.prediction.iteration_time_s

    @property
    def error(self) -> float:
        """The plan's error now, as summary.json's `prediction_error` (measured / predicted - 1)."""
        return self.ran.iteration_time_s / self.now_s - 1


def replan_run(folder: Path, scenario_file: Path | None = None) -> list[Replanned]:
    """Every variant of the run in `folder` that ran, planned again (BubbleTea twins
    left out: their prediction is their plain variant's). `scenario_file`: the
    scenario of a folder without ``scenario.resolved.yaml``."""
    summary = read_summary_file(folder / "summary.json", lambda why: ReportError(why))
    if summary is None:
        raise ReportError(f"{folder}: no summary.json; give the folder of a `testbed run` or of a sweep point")
    if summary.calibration is None:
        raise ReportError(f"{folder}: the run was not calibrated (runner.calibrate: false): nothing to plan from")
    source = folder / "scenario.resolved.yaml"
    if not source.exists():
        if scenario_file is None:
            raise ReportError(f"{folder}: no scenario.resolved.yaml; give the run's scenario file")
        source = scenario_file
    scenario, _ = load_scenario(source)
    cal = Calibration.from_report(summary.calibration)
    out = []
    for name, ran in summary.variants.items():
        if isinstance(ran, VariantResult) and "+" not in name:
            setup = plan_variant(name, scenario, scenario.workload, scenario.workload_dir, cal, None)
            out.append(Replanned(name, ran, setup, _with_faults(scenario, setup),
                                 _with_measured_compute(scenario, setup, ran, (cal.src, cal.dst))))
    return out


def _with_measured_compute(scenario: Scenario, setup: VariantSetup, ran: VariantResult,
                           pair: tuple[str, str]) -> float | None:
    """Real devices: the plan's prediction with each stage's hold and the pipeline's
    overhead that the run's warm-up measured (summary.json `prediction.measured_*`), as
    the run's headline was made (testbed/run/runner.py `_predictions`; the compute
    model does not know the machine); None where the run measured none."""
    p = ran.prediction
    if p is None or p.measured_stage_forward_s is None or p.measured_stage_backward_s is None \
            or setup.prediction is None:
        return None
    from testbed.run.variants import real_device_prediction

    compute = (list(p.measured_stage_forward_s), list(p.measured_stage_backward_s))
    return real_device_prediction(setup, scenario, scenario.workload, scenario.workload_dir, pair, False,
                                  compute, p.measured_overhead_s or 0.0)


def _with_faults(scenario: Scenario, setup: VariantSetup) -> float | None:
    """The variant's mean over its measured iterations with the scenario's faults
    forecast as the run forecasts them (testbed/run/faults.py), None without faults."""
    if not scenario.faults or setup.prediction is None:
        return None
    from testbed.run.faults import forecast, with_forecasts

    w = scenario.workload
    forecasts = forecast(scenario.faults, w.warmup, setup.prediction, scenario.topology)
    return with_forecasts(setup.prediction.iteration_time_s, forecasts, w.warmup, w.iterations)
