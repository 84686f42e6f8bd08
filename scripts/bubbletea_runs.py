#!/usr/bin/env python3
"""Consecutive single runs of a BubbleTea scenario, and their tails side by side (issue 30).

    sudo .venv/bin/python scripts/bubbletea_runs.py --runs 10 --out results/bubbletea-ten-runs
    sudo .venv/bin/python scripts/bubbletea_runs.py --table results/bubbletea-ten-runs     (rebuild from kept runs)

Each run is a whole `testbed run SCENARIO` of its own (its own network, calibration and
plain twin), not a repeat inside one run, so a run that goes wrong is seen as one. Per run
and for its ``+bubbletea`` variant (summary.json): the slowest measured iteration against
the slowest of the plain twin (``max_ratio``), p99 likewise, training's longest wait on a
prefill against the lease guard, the slowdown and the device utilization; then the median
slowdown and utilization over the runs. The bounds of issue 30 are printed beside the
figures (worst iteration <= 1.15x in every run, no wait on a prefill longer than twice the
guard, median slowdown <= 1% at a median utilization >= 94%); nothing is asserted.

Writes ``runs.json``, ``runs.csv`` and ``runs.png`` in ``--out``; each run's folder is
``--out/run-<k>/`` (its summary.json, timelines and Gantt charts).
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

from pydantic import BaseModel

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from testbed_core.contracts.summary import read_summary  # noqa: E402

MAX_RATIO_BOUND = 1.15
MEDIAN_SLOWDOWN_BOUND = 0.01
MEDIAN_UTILIZATION_BOUND = 0.94


class RunFigures(BaseModel):
    """One run's `+bubbletea` figures against its plain twin (summary.json)."""

    run: int
    folder: str
    variant: str
    iteration_s: float
    plain_iteration_s: float
    slowdown: float
    utilization: float
    max_with_s: float
    max_without_s: float
    max_ratio: float
    p99_ratio: float
    slowed_over_5pct: int
    worst_wait_on_prefill_s: float
    guard_s: float
    lease_revocations: int


class Runs(BaseModel):
    scenario: str
    runs: list[RunFigures]
    median_slowdown: float
    median_utilization: float
    worst_max_ratio: float
    bounds: dict[str, bool]


def figures(k: int, folder: Path) -> RunFigures:
    summary = read_summary(folder / "summary.json")
    name, v = next((n, v) for n, v in summary.variants.items() if n.endswith("+bubbletea"))
    d = v.slowdown_decomposition
    g = v.guard_overruns
    if d is None or d.tail is None or g is None or v.training_slowdown is None:
        raise SystemExit(f"{folder}/summary.json: {name} has no tail or guard figures (a run without its plain twin?)")
    tail = d.tail
    return RunFigures(
        run=k, folder=folder.name, variant=name, iteration_s=v.iteration_time_s,
        plain_iteration_s=v.compared_with_iteration_time_s or 0.0, slowdown=v.training_slowdown,
        utilization=v.device_utilization, max_with_s=tail.with_bubbletea.max, max_without_s=tail.without.max,
        max_ratio=tail.max_ratio, p99_ratio=tail.p99_ratio, slowed_over_5pct=tail.slowed_over_5pct,
        worst_wait_on_prefill_s=g.worst_training_wait_s, guard_s=g.guard_s or 0.0,
        lease_revocations=g.lease_revocations)


def table(out: Path, scenario: str) -> Runs:
    runs = [figures(int(p.name.split("-")[1]), p) for p in sorted((p for p in out.glob("run-*") if p.is_dir()), key=lambda p: int(p.name[4:]))
            if (p / "summary.json").exists()]
    if not runs:
        raise SystemExit(f"{out}: no run-<k>/summary.json here")
    med_s = statistics.median(r.slowdown for r in runs)
    med_u = statistics.median(r.utilization for r in runs)
    res = Runs(scenario=scenario, runs=runs, median_slowdown=med_s, median_utilization=med_u,
               worst_max_ratio=max(r.max_ratio for r in runs), bounds={
                   "max_ratio_every_run": all(r.max_ratio <= MAX_RATIO_BOUND for r in runs),
                   "wait_within_twice_the_guard": all(r.worst_wait_on_prefill_s <= 2 * r.guard_s for r in runs),
                   "median_slowdown": med_s <= MEDIAN_SLOWDOWN_BOUND,
                   "median_utilization": med_u >= MEDIAN_UTILIZATION_BOUND})
    print(f"{'run':>3} {'iter s':>7} {'plain s':>7} {'slowdown':>8} {'util':>6} {'max with':>8} {'max w/o':>8} "
          f"{'max x':>6} {'p99 x':>6} {'>5%':>3} {'wait ms':>7}")
    for r in runs:
        print(f"{r.run:>3} {r.iteration_s:7.3f} {r.plain_iteration_s:7.3f} {r.slowdown:+8.1%} {r.utilization:6.1%} "
              f"{r.max_with_s:8.3f} {r.max_without_s:8.3f} {r.max_ratio:6.2f} {r.p99_ratio:6.2f} "
              f"{r.slowed_over_5pct:3d} {r.worst_wait_on_prefill_s * 1000:7.1f}")
    print(f"median slowdown {med_s:+.2%} (bound <= {MEDIAN_SLOWDOWN_BOUND:.0%}), median utilization {med_u:.1%} "
          f"(bound >= {MEDIAN_UTILIZATION_BOUND:.0%}), worst max ratio {res.worst_max_ratio:.3f} "
          f"(bound <= {MAX_RATIO_BOUND} in every run)")
    print("bounds: " + ", ".join(f"{k} {'met' if ok else 'NOT met'}" for k, ok in res.bounds.items()))
    (out / "runs.json").write_text(res.model_dump_json(indent=1) + "\n")
    with open(out / "runs.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(RunFigures.model_fields))
        w.writeheader()
        for r in runs:
            w.writerow(r.model_dump())
    plot(res, out / "runs.png")
    return res


def plot(res: Runs, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ks = [r.run for r in res.runs]
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.6))
    a.bar(ks, [r.max_ratio for r in res.runs], color="tab:blue", label="slowest iteration, with / without")
    a.plot(ks, [r.p99_ratio for r in res.runs], "o", color="tab:orange", label="p99, with / without")
    a.axhline(MAX_RATIO_BOUND, color="red", ls="--", lw=1, label=f"bound {MAX_RATIO_BOUND}x")
    a.set_ylim(0.8, max(1.3, res.worst_max_ratio + 0.05))
    a.set_xlabel("run")
    a.set_ylabel("ratio")
    a.set_title("tail per run (each a whole testbed run)")
    a.legend(fontsize=7, loc="upper left")
    b.bar(ks, [100 * r.slowdown for r in res.runs], color="tab:blue", label="training slowdown %")
    b.axhline(100 * MEDIAN_SLOWDOWN_BOUND, color="tab:blue", ls="--", lw=1, label="median bound +1%")
    b.axhline(0, color="black", lw=0.5)
    b.set_xlabel("run")
    b.set_ylabel("training slowdown, %")
    u = b.twinx()
    u.plot(ks, [100 * r.utilization for r in res.runs], "s", color="tab:green", label="utilization %")
    u.axhline(100 * MEDIAN_UTILIZATION_BOUND, color="tab:green", ls=":", lw=1, label="median bound 94%")
    u.set_ylim(80, 100)
    u.set_ylabel("device utilization with prefill, %")
    b.set_title(f"median slowdown {res.median_slowdown:+.1%}, utilization {res.median_utilization:.1%}")
    h1, l1 = b.get_legend_handles_labels()
    h2, l2 = u.get_legend_handles_labels()
    b.legend(h1 + h2, l1 + l2, fontsize=7, loc="lower left")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--scenario", default="scenarios/atlas-2dc-bubbletea.yaml")
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--out", type=Path, default=REPO / "results" / "bubbletea-ten-runs")
    ap.add_argument("--table", type=Path, help="only rebuild the table and plot of a kept folder")
    a = ap.parse_args()
    if a.table is not None:
        kept = a.table / "runs.json"
        scenario = json.loads(kept.read_text())["scenario"] if kept.exists() else a.scenario
        table(a.table, scenario)
        return
    a.out.mkdir(parents=True, exist_ok=True)
    for k in range(1, a.runs + 1):
        t0 = time.time()
        folder = a.out / f"run-{k}"
        log = a.out / f"run-{k}.log"
        print(f"run {k}/{a.runs}: testbed run {a.scenario} --out {folder} (log {log})", flush=True)
        with open(log, "w") as fh:
            rc = subprocess.run([str(REPO / ".venv" / "bin" / "testbed"), "run", a.scenario, "--out", str(folder)],
                                stdout=fh, stderr=subprocess.STDOUT, cwd=REPO, check=False).returncode
        if rc != 0:
            raise SystemExit(f"run {k} failed (exit {rc}); its log: {log}")
        f = figures(k, folder)
        print(f"  done in {time.time() - t0:.0f} s: max ratio {f.max_ratio:.3f}, slowdown {f.slowdown:+.1%}, "
              f"utilization {f.utilization:.1%}", flush=True)
    table(a.out, a.scenario)


if __name__ == "__main__":
    main()
