"""Re-make kept runs' a-priori predictions from their own calibration with this
checkout's planner, next to what they measured and what the run itself predicted.

Each run folder needs its `summary.json` and `scenario.resolved.yaml` (a sweep point
keeps both; `--scenario` gives the scenario for a folder without one). Every variant is
planned again (`testbed/report/replan.py` `replan_run`: streams, sharing, placement
and prediction from the calibration in its summary), so a change to the planner can be
judged against runs it did not see:

    .venv/bin/python scripts/repredict.py results/sweep-paper-1f1b/p00* docs/atlas-4dc

The before/after figures for the planner's channel windows (docs/scenarios.md, 'What a
run writes'): this script on the paper sweep kept at commit 3386d5b (`git worktree add
/tmp/old 3386d5b`, then the folders /tmp/old/results/sweep-paper/p00*): the `stored`
column is the old planner's prediction, `now` this checkout's, each with its error as
summary.json's `prediction_error` gives it (measured / predicted - 1).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from testbed.report.replan import replan_run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", type=Path, help="run or sweep-point folders")
    ap.add_argument("--scenario", type=Path, help="the scenario of folders without scenario.resolved.yaml")
    args = ap.parse_args()
    print(f"{'run':34} {'variant':13} {'measured':>8} {'stored':>13} {'now':>13}  streams, sharing now")
    for run in args.runs:
        for v in replan_run(run, args.scenario):
            measured, stored = v.ran.iteration_time_s, v.ran.predicted_iteration_time_s
            print(f"{run.name[:34]:34} {v.name:13} {measured:8.3f} {stored:7.3f} {measured / stored - 1:+5.0%} "
                  f"{v.now_s:7.3f} {v.error:+5.0%}  {v.setup.streams}, {v.setup.sharing}")


if __name__ == "__main__":
    main()
