"""Re-make kept runs' a-priori predictions from their own calibration with this
checkout's planner, next to what they measured and what the run itself predicted.

Each run folder needs its `summary.json` and `scenario.resolved.yaml` (a sweep point
keeps both; `--scenario` gives the scenario for a folder without one). Every variant is
planned again (`testbed/run/variants.py` `plan_variant`: streams, sharing, placement
and prediction) from the calibration in its summary (`Calibration.from_report`), so a
change to the planner can be judged against runs it did not see:

    .venv/bin/python scripts/repredict.py results/sweep-paper-1f1b/p00*

The README's before/after figures for the planner's channel windows: this script on
the paper sweep kept at commit 3386d5b (`git worktree add /tmp/old 3386d5b`, then the
folders /tmp/old/results/sweep-paper/p00*): the `stored` column is the old planner's
prediction, `now` this checkout's, each with its error as summary.json's
`prediction_error` gives it (measured / predicted - 1).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from testbed.run.scenario import load_scenario
from testbed.run.variants import plan_variant
from testbed_core.contracts.calibration import Calibration, CalibrationReport


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", type=Path, help="run or sweep-point folders")
    ap.add_argument("--scenario", type=Path, help="the scenario of folders without scenario.resolved.yaml")
    args = ap.parse_args()
    print(f"{'run':34} {'variant':13} {'measured':>8} {'stored':>13} {'now':>13}  streams, sharing now")
    for run in args.runs:
        summary = json.loads((run / "summary.json").read_text())
        source = run / "scenario.resolved.yaml"
        if not source.exists():
            if args.scenario is None:
                raise SystemExit(f"{run}: no scenario.resolved.yaml; give the scenario with --scenario")
            source = args.scenario
        scenario, _ = load_scenario(source)
        cal = Calibration.from_report(CalibrationReport.model_validate(summary["calibration"]))
        for name, v in summary["variants"].items():
            if "iteration_time_s" not in v or name.count("+"):
                continue  # failed variants; BubbleTea twins (their prediction is the plain variant's)
            setup = plan_variant(name, scenario, scenario.workload, scenario.workload_dir, cal, None)
            measured, stored = v["iteration_time_s"], v["predicted_iteration_time_s"]
            now = setup.prediction.iteration_time_s
            print(f"{run.name[:34]:34} {name:13} {measured:8.3f} {stored:7.3f} {measured / stored - 1:+5.0%} "
                  f"{now:7.3f} {measured / now - 1:+5.0%}  {setup.streams}, {setup.sharing}")


if __name__ == "__main__":
    main()
