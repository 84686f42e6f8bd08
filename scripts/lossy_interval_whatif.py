"""What a lossy run's prediction and chance interval would be with other iteration counts:
a kept run re-planned (testbed/report/replan.py `replan_run`, from its own calibration)
with its scenario's ``workload.warmup`` and ``workload.iterations`` changed, each
variant's prediction next to the 5th-95th percentile of one run's mean
(testbed_core/planning/lossy.py `chance_interval`, as `testbed run` computes it):

    .venv/bin/python scripts/lossy_interval_whatif.py results/prediction-errors/head-1205/runs/lossy-4dc --warmup 1 --iterations 24

A what-if of the model, not a measurement (docs/results/fidelity.md, 'Loss on the path').
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

import yaml

from testbed.report.loading import ReportError
from testbed.report.replan import replan_run
from testbed.run.runner import lossy_note
from testbed.run.scenario import load_scenario


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", type=Path, help="a kept run folder (summary.json, scenario.resolved.yaml)")
    ap.add_argument("--warmup", type=int, required=True, help="warm-up iterations")
    ap.add_argument("--iterations", type=int, required=True, help="measured iterations")
    args = ap.parse_args()
    if args.warmup < 0 or args.iterations < 1:
        sys.exit(f"--warmup must be 0 or more and --iterations 1 or more, got {args.warmup} and {args.iterations}")
    source = args.run / "scenario.resolved.yaml"
    if not (args.run / "summary.json").exists() or not source.exists():
        sys.exit(f"{args.run}: needs summary.json and scenario.resolved.yaml (a `testbed run` folder)")
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        shutil.copy(args.run / "summary.json", folder / "summary.json")
        doc = yaml.safe_load(source.read_text())
        doc["workload"].update(warmup=args.warmup, iterations=args.iterations)
        (folder / "scenario.resolved.yaml").write_text(yaml.safe_dump(doc))
        scenario, _ = load_scenario(folder / "scenario.resolved.yaml")
        try:
            planned = replan_run(folder)
        except ReportError as exc:
            sys.exit(str(exc))
        print(f"{args.run}: {args.warmup} warm-up + {args.iterations} measured iterations")
        for v in planned:
            _, band = lossy_note(v.setup.prediction, scenario, scenario.workload)
            line = f"{v.name:13} predicted {v.now_s:7.3f} s"
            if band is not None:
                lo, hi = band
                line += f", one run's mean {lo:.3f}-{hi:.3f} s ({lo / v.now_s - 1:+.0%} to {hi / v.now_s - 1:+.0%})"
            print(line + f"; the kept run measured {v.ran.iteration_time_s:.3f} s")


if __name__ == "__main__":
    main()
