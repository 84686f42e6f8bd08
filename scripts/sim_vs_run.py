"""A kept run's variant against its plan made again at this checkout, span by span.

Two views of where a prediction and its run part:

- **transfers** (always): per boundary and direction, the median time from hand-over to
  arrival in the simulation (`TransferSpan.ready` -> `arrival`; and on the wire, `start`
  -> `arrival`) and in the run's transfers.csv (posted -> arrived; sent -> arrived), over
  the measured iterations. The run's `arrived` is when the receiving rank took the tensor,
  so a tensor sent before its receiver asked for it (1F1B's warm-up) shows that wait too.
- **compute** (`--iteration N`): for that iteration and `--pipeline P`, every forward and
  backward's start and end in the simulation and in the devices' timeline (timeline.csv),
  from the iteration's start, and how far the run lags the model at each.

The plan is made as `scripts/repredict.py` makes it (testbed/report/replan.py
`replan_run`: the run's own calibration, this checkout's planner), so it is the run's
a-priori prediction where the planner has not changed since.

    .venv/bin/python scripts/sim_vs_run.py results/held-back/3dc-line-at-906c71d --variant torch-gloo
    .venv/bin/python scripts/sim_vs_run.py results/held-back/2dc-fast-at-12497bc --variant baseline --iteration 3 --pipeline 1
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from testbed.report.replan import replan_run  # noqa: E402
from testbed.run.jobs import device_parts  # noqa: E402
from testbed_core.schedules import Op  # noqa: E402
from testbed_core.simulate import SimResult  # noqa: E402


@dataclass(frozen=True)
class TransferRow:
    """One boundary and direction: medians in milliseconds (None: none measured)."""

    boundary: int
    direction: str
    sim_ms: float  # hand-over to arrival
    sim_wire_ms: float  # first byte on the wire to arrival
    run_ms: float | None  # posted to arrived
    run_wire_ms: float | None  # sent to arrived
    count: int  # measured transfers


@dataclass(frozen=True)
class ComputeRow:
    """One forward or backward of a pipeline: start and end after the iteration's start, ms."""

    label: str  # e.g. F3@s1
    sim_start_ms: float
    sim_end_ms: float
    run_start_ms: float
    run_end_ms: float

    @property
    def lag_ms(self) -> float:
        return self.run_start_ms - self.sim_start_ms


def _median(values: list[float]) -> float | None:
    return statistics.median(values) * 1e3 if values else None


def transfer_rows(sim: SimResult, transfers: list[dict[str, str]], warmup: int) -> list[TransferRow]:
    """The transfers view: `transfers` are transfers.csv's rows (warm-up iterations left out)."""
    simulated: dict[tuple[int, str], list[tuple[float, float]]] = {}
    for t in sim.transfers:
        simulated.setdefault((t.key.boundary, t.key.direction), []).append((t.arrival - t.ready, t.arrival - t.start))
    measured: dict[tuple[int, str], list[tuple[float, float]]] = {}
    for r in transfers:
        if int(r["iteration"]) < warmup:
            continue
        arrived = float(r["arrived"])
        measured.setdefault((int(r["boundary"]), r["direction"]), []).append(
            (arrived - float(r["posted"]), arrived - float(r["sent"])))
    rows = []
    for (b, d), spans in sorted(simulated.items()):
        ran = measured.get((b, d), [])
        rows.append(TransferRow(b, d, statistics.median(s for s, _ in spans) * 1e3,
                                statistics.median(w for _, w in spans) * 1e3,
                                _median([s for s, _ in ran]), _median([w for _, w in ran]), len(ran)))
    return rows


def compute_rows(sim: SimResult, timeline: list[dict[str, str]], start: float, end: float,
                 pipeline: int) -> list[ComputeRow]:
    """The compute view of `pipeline` in the run's iteration [start, end), in the model's order."""
    simulated = {(c.kind, c.mb, c.stage): c for c in sim.compute if c.pipeline == pipeline}
    ran: dict[tuple[str, int, int], tuple[float, float]] = {}
    for r in timeline:
        if r["kind"] not in ("forward", "backward") or device_parts(r["device"])[1] != pipeline:
            continue
        at = float(r["start"])
        if not start - 1e-3 <= at < end:
            continue
        op = Op.parse_compute(r["label"])
        ran[(op.kind, op.mb, op.stage)] = (at - start, float(r["end"]) - start)
    rows = []
    for key in sorted(set(simulated) & set(ran), key=lambda k: simulated[k].start):
        c, (s, e) = simulated[key], ran[key]
        rows.append(ComputeRow(f"{key[0]}{key[1]}@s{key[2]}", c.start * 1e3, c.end * 1e3, s * 1e3, e * 1e3))
    return rows


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", type=Path, help="a `testbed run` output folder (summary.json, scenario.resolved.yaml)")
    ap.add_argument("--variant", required=True)
    ap.add_argument("--iteration", type=int, default=None, help="also the compute view of this iteration (0: the first warm-up)")
    ap.add_argument("--pipeline", type=int, default=0, help="the compute view's pipeline")
    args = ap.parse_args(argv)
    planned = [r for r in replan_run(args.run) if r.name == args.variant]
    if not planned:
        ap.error(f"{args.run}: no variant {args.variant!r} that ran there")
    pred = planned[0].setup.prediction
    assert pred is not None
    folder = args.run / args.variant
    its = json.loads((folder / "iterations.json").read_text())
    with open(folder / "transfers.csv", newline="") as f:
        transfers = list(csv.DictReader(f))
    print(f"{args.variant}: predicted {pred.iteration_time_s:.3f} s (pipeline {pred.pipeline_time_s:.3f}, "
          f"all-reduce {pred.allreduce_s:.3f}), measured {planned[0].ran.iteration_time_s:.3f} s")
    print(f"{'boundary':>8} {'dir':>4} {'sim ms':>8} {'(wire)':>7} {'run ms':>8} {'(wire)':>7} {'n':>4}")
    for t in transfer_rows(pred.sim, transfers, int(its.get("warmup", 0))):
        print(f"{t.boundary:>8} {t.direction:>4} {t.sim_ms:>8.1f} {t.sim_wire_ms:>7.1f} {_ms(t.run_ms):>8} "
              f"{_ms(t.run_wire_ms):>7} {t.count:>4}")
    if args.iteration is not None:
        if not 0 <= args.iteration < len(its["starts"]):
            ap.error(f"--iteration {args.iteration}: the run has iterations 0 to {len(its['starts']) - 1}")
        with open(folder / "timeline.csv", newline="") as f:
            timeline = list(csv.DictReader(f))
        start, end = its["starts"][args.iteration], its["ends"][args.iteration]
        print(f"iteration {args.iteration}, pipeline {args.pipeline}: {(end - start) * 1e3:.1f} ms measured")
        for c in compute_rows(pred.sim, timeline, start, end, args.pipeline):
            print(f"  {c.label:<8} sim {c.sim_start_ms:7.1f}-{c.sim_end_ms:7.1f}  run {c.run_start_ms:7.1f}-"
                  f"{c.run_end_ms:7.1f}  lag {c.lag_ms:+6.1f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
