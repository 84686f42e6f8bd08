"""The DP rings inside the DCs of a kept run, against the ring model alone.

For each variant whose modelled workers ran the ring all-reduce inside the DCs (dp 2,
every ring's replicas in one DC), per measured iteration: each stage's last backward
(the later of its replicas', from the variant's timeline.csv), the iteration's end
(iterations.json), and when the staggered-ring model (testbed_core/planning/prediction.py
`staggered_rings_finish`, fed with the run's own calibration: its rings all at once and
one alone) says the last ring ends when the rings start at those measured times. The
difference between the measured tail (end - last backward) and the model's isolates the
ring model from the pipeline's: a run whose tails are longer than the model's lost time
in its rings, not in its pipeline.

    .venv/bin/python scripts/ring_tails.py results/held-back/3dc-triangle-at-d79cd26

Reads only the run folder; variants whose rings cross the WAN (dp-across-dc) or that run
gloo's all-reduce (torch-gloo) are left out.
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from testbed.run.jobs import device_parts  # noqa: E402
from testbed_core.planning.prediction import staggered_rings_finish  # noqa: E402

LEFT_OUT = ("dp-across-dc", "torch-gloo")


def stage_ends(rows: list[dict[str, str]], start: float, end: float) -> list[float]:
    """Each stage's last backward end in one iteration (seconds after its start), the
    later of its replicas' (devices are named <host>-p<pipeline>r<stage>)."""
    last: dict[int, float] = {}
    for row in rows:
        if row["kind"] == "backward" and start <= float(row["start"]) < end:
            _host, _pipeline, stage = device_parts(row["device"])
            last[stage] = max(last.get(stage, 0.0), float(row["end"]) - start)
    return [last[k] for k in sorted(last)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", type=Path, help="run folders (with summary.json)")
    args = ap.parse_args()
    for run in args.runs:
        summary = json.loads((run / "summary.json").read_text())
        cal = summary.get("calibration") or {}
        if not cal.get("lan_transfer_s") or not cal.get("lan_alone_transfer_s"):
            print(f"{run}: no rings inside the DCs were calibrated (dp 1, or rings across the WAN)")
            continue
        rings, bits = len(cal["lan_pairs"]), cal["lan_nbytes"] * 8  # 2(dp-1)/dp of the gradient with dp 2
        aggregate = rings * cal["lan_channel_rate_mbps"] * 1e6
        alone = cal["lan_alone_channel_rate_mbps"] * 1e6
        print(f"== {run}: {rings} rings of {cal['lan_nbytes'] / 1e6:.1f} MB; calibrated all at once "
              f"{[round(t, 3) for t in cal['lan_transfer_s']]} s, one alone "
              f"{[round(t, 3) for t in cal['lan_alone_transfer_s']]} s")
        for variant in summary["variants"]:
            folder = run / variant
            if variant in LEFT_OUT or not (folder / "iterations.json").exists():
                continue
            its = json.loads((folder / "iterations.json").read_text())
            with (folder / "timeline.csv").open() as fh:
                rows = list(csv.DictReader(fh))
            measured, modelled = [], []
            for i in range(its["warmup"], len(its["starts"])):
                start, end = its["starts"][i], its["ends"][i]
                ends = stage_ends(rows, start, end)
                if not ends:
                    continue
                last = max(ends)
                model_end = max(staggered_rings_finish(ends, [bits] * len(ends), aggregate, alone))
                measured.append(end - start - last)
                modelled.append(model_end - last)
            if measured:
                print(f"  {variant:24s} tail after the last backward: measured "
                      f"{statistics.mean(measured):.3f} s, ring model {statistics.mean(modelled):.3f} s "
                      f"({len(measured)} iterations: {', '.join(f'{m:.3f}/{p:.3f}' for m, p in zip(measured, modelled, strict=True))})")


if __name__ == "__main__":
    main()
