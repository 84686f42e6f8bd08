#!/usr/bin/env python3
"""Gantt charts of one kept run's variants as its calibrated prediction plays them: where
each stage computes, where it waits, and what crosses the WAN, per placement.

    .venv/bin/python scripts/placement_gantt.py                       # docs/atlas-4dc: atlas and baseline
    .venv/bin/python scripts/placement_gantt.py RUN --variants atlas,baseline --out-dir DIR

Each variant of the kept run (`summary.json` and `scenario.resolved.yaml`) is planned again
from the run's own calibration (testbed/report/replan.py, as scripts/repredict.py does),
and the planner's simulation of one iteration's pipeline (testbed_core/simulate.py: every
forward and backward piece, every WAN transfer on the wire) is drawn with the runner's own
chart (testbed/run/gantt.py): one row per stage, named by its DC, one per WAN link
direction. It is the prediction, not the run's own timeline (which is not kept), and the
DP all-reduce after the pipeline is left out; the run measured each variant within 10% of
it (docs/results/multi-dc.md). No run, no root.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from types import SimpleNamespace

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from testbed.report.replan import replan_run  # noqa: E402
from testbed.run.gantt import gantt_png  # noqa: E402
from testbed_core.contracts.summary import VariantResult, read_summary  # noqa: E402
from testbed_core.device_records import WorkRecord  # noqa: E402

KIND = {"F": "forward", "B": "backward"}


def records(prediction) -> tuple[dict[str, list[WorkRecord]], list[SimpleNamespace]]:
    """The simulated iteration as device timelines and WAN transfers (the chart's inputs)."""
    stage_dc = prediction.placement.to_json(None)["stage_dc"]
    lines: dict[str, list[WorkRecord]] = {}
    for c in prediction.sim.compute:
        device = f"{stage_dc[c.pipeline][c.stage]}-p{c.pipeline}r{c.stage}"
        lines.setdefault(device, []).append(WorkRecord(device, KIND.get(c.kind, c.kind), "plan", f"{c.kind}{c.mb}",
                                                       c.start, c.start, c.end, "predicted"))
    transfers = []
    for t in prediction.sim.transfers:
        links = [r.removeprefix("wan:") for r in t.resources if r.startswith("wan:")]
        if links:
            transfers.append(SimpleNamespace(links=links, sent=t.ready, wire_span=(t.start, t.end),
                                             arrived=t.arrival, pipeline=t.key.pipeline, direction=t.key.direction))
    return lines, transfers


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("run", nargs="?", type=Path, default=REPO / "docs" / "atlas-4dc", help="a kept run's folder")
    ap.add_argument("--variants", default="atlas,baseline")
    ap.add_argument("--out-dir", type=Path, default=None, help="default: the run's folder")
    a = ap.parse_args(argv)
    wanted = [v for v in a.variants.split(",") if v]
    try:
        ran = [n for n, v in read_summary(a.run / "summary.json").variants.items() if isinstance(v, VariantResult)]
    except (OSError, ValueError) as exc:
        raise SystemExit(f"{a.run}: not a kept run's folder with its summary.json ({exc})") from None
    missing = [v for v in wanted if v not in ran]
    if missing:
        raise SystemExit(f"{a.run}: no variant {', '.join(missing)} ran there (it has {', '.join(ran)})")
    planned = {v.name: v for v in replan_run(a.run) if v.name in wanted}
    out_dir = a.out_dir or a.run
    for name in wanted:
        v = planned[name]
        pred = v.setup.prediction
        lines, transfers = records(pred)
        crossings = len(pred.placement.to_json(None)["wan_crossings"])
        path = out_dir / f"gantt-{name}-predicted.png"
        gantt_png(lines, transfers, [0.0], [pred.sim.makespan], 0, path,
                  title=f"{name} on {a.run.name}, predicted from the run's calibration: placement "
                        f"{pred.placement.strategy}, {crossings} WAN crossings, pipeline {pred.sim.makespan:.2f} s "
                        f"(measured iteration {v.ran.iteration_time_s:.2f} s, all-reduce included)")
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
