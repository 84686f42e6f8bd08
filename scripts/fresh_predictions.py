"""Run every shipped scenario that builds a network and predicts its variants, in short
form at this checkout, and print the table of their a-priori prediction errors.

Issue 40 asks that every variant of every such scenario be predicted within 5% of its
measured iteration time. This script lists ``scenarios/*.yaml``, keeps the `testbed run`
scenarios (a topology and a workload; sweeps, whatif grids and program scenarios are
listed with why they are left out: a program run carries no prediction, a sweep's
points are its base scenario's), runs each with at most ``--iterations`` measured and
``--warmup`` warm-up iterations into one folder (``OUT/runs/<scenario>``), each under
the shared emulation lock (``--lock``; one scenario per hold), then writes and prints
`testbed report predictions` over that folder (``OUT/prediction-errors.txt``, ``.csv``
and ``.json``):

    .venv/bin/python scripts/fresh_predictions.py --out results/prediction-errors/fresh

A scenario whose ``OUT/runs/<scenario>/summary.json`` exists is not run again (so the
command resumes; ``--again`` reruns), ``--only`` picks scenarios by name and
``--report-only`` only tabulates what is there. Needs root (the emulated network).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
SCENARIOS = ROOT / "scenarios"
TESTBED = ROOT / ".venv" / "bin" / "testbed"


def classify(file: Path) -> str | None:
    """None for a `testbed run` scenario that predicts its variants, else why it is left out."""
    try:
        doc = yaml.safe_load(file.read_text())
    except yaml.YAMLError as exc:
        return f"not readable YAML ({exc})"
    if not isinstance(doc, dict):
        return "not a scenario mapping"
    if "base" in doc and "parameters" in doc:
        return f"a sweep (its points are {doc['base']} with parameters changed)"
    if "program" in doc:
        return "a program scenario: runs a user program, which carries no prediction"
    if "grid" in doc or "topology" not in doc:
        return "builds no network (a whatif grid)"
    if "workload" not in doc:
        return "no workload to predict"
    return None


def shipped(only: list[str] | None) -> tuple[list[Path], list[str]]:
    """The run scenarios to run (sorted by name) and the others with why."""
    runs, left = [], []
    files = sorted(SCENARIOS.glob("*.yaml"))
    if only:  # in the order given
        files = sorted((f for f in files if f.stem in only), key=lambda f: only.index(f.stem))
    for file in files:
        why = classify(file)
        if why is None:
            runs.append(file)
        else:
            left.append(f"{file.relative_to(ROOT)}: {why}")
    if only:
        unknown = sorted(set(only) - {f.stem for f in SCENARIOS.glob("*.yaml")})
        if unknown:
            sys.exit(f"--only: no scenarios/{', '.join(unknown)}.yaml (known: "
                     f"{', '.join(sorted(f.stem for f in SCENARIOS.glob('*.yaml')))})")
    return runs, left


def short_sets(file: Path, iterations: int, warmup: int) -> list[str]:
    """--set arguments that cap the scenario's measured and warm-up iterations (a
    scenario already shorter keeps its own; the faults scenario keeps its own: its
    outage is timed to its iterations; so does one over a lossy link: at 0.1% loss a
    channel meets a few losses an iteration, and two iterations' mean is a few random
    draws, testbed_core/planning/lossy.py `run_interval`)."""
    doc = yaml.safe_load(file.read_text())
    if "faults" in doc or _lossy(file, doc):
        return []
    work = doc.get("workload")
    if isinstance(work, str):  # a workload file, relative to the scenario
        work = yaml.safe_load((file.parent / work).read_text())
    work = work or {}
    own_it, own_wu = int(work.get("iterations", iterations)), int(work.get("warmup", warmup))
    return ["--set", f"workload.iterations={min(own_it, iterations)}",
            "--set", f"workload.warmup={min(own_wu, warmup)}"]


def _lossy(file: Path, doc: dict) -> bool:
    """Whether the scenario's topology has a WAN link with loss."""
    topo = doc.get("topology")
    if isinstance(topo, str):
        topo = yaml.safe_load((file.parent / topo).read_text())
    return any(str((link or {}).get("loss", 0)).strip() not in ("0", "0%", "0.0")
               for link in (topo or {}).get("wan") or [])


def run_one(file: Path, out: Path, args: argparse.Namespace) -> str:
    """Run one scenario into `out` under the lock; returns a line saying how it went."""
    if out.exists():
        shutil.rmtree(out)
    # the time limit runs inside the lock: waiting for it does not count
    cmd = ["timeout", f"{args.timeout:g}", str(TESTBED), "run", str(file), "-o", str(out),
           *short_sets(file, args.iterations, args.warmup)]
    if args.lock:
        cmd = ["flock", args.lock, *cmd]
    started = time.time()
    print(f"== {file.stem}: {' '.join(cmd)}", flush=True)
    done = subprocess.run(cmd, cwd=ROOT)
    took = time.time() - started
    if done.returncode == 124:
        return f"{file.stem}: stopped after {args.timeout:g} s of running (--timeout)"
    if done.returncode != 0 or not (out / "summary.json").exists():
        return f"{file.stem}: failed (exit {done.returncode}) after {took:.0f} s"
    return f"{file.stem}: {took:.0f} s with the wait for the lock"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path("results/prediction-errors/fresh"),
                    help="folder of the runs (OUT/runs/<scenario>) and the table")
    ap.add_argument("--iterations", type=int, default=4,
                    help="measured iterations at most (default 4: dp-2dc's multi-stream iterations scatter by "
                         "+-8%%, and a mean of two missed 5%% now and then by chance)")
    ap.add_argument("--warmup", type=int, default=2, help="warm-up iterations at most (default 2)")
    ap.add_argument("--only", nargs="+", metavar="NAME",
                    help="only these scenarios (file names without .yaml), run in this order")
    ap.add_argument("--again", action="store_true", help="rerun scenarios that already have a summary.json")
    ap.add_argument("--report-only", action="store_true", help="run nothing; tabulate the runs under OUT")
    ap.add_argument("--lock", default="/tmp/emulation.lock", help="flock file held around each run ('' for none)")
    ap.add_argument("--timeout", type=float, default=600,
                    help="seconds one scenario may run once it holds the lock (default 600)")
    args = ap.parse_args()
    if args.iterations < 1 or args.warmup < 0:
        sys.exit(f"--iterations must be at least 1 and --warmup at least 0 (got {args.iterations}, {args.warmup})")
    runs_dir = args.out / "runs"
    scenarios, left = shipped(args.only)
    notes = []
    if not args.report_only:
        for file in scenarios:
            out = runs_dir / file.stem
            if (out / "summary.json").exists() and not args.again:
                notes.append(f"{file.stem}: kept from an earlier run (--again reruns it)")
                continue
            notes.append(run_one(file, out, args))
            print(notes[-1], flush=True)
    from testbed.report.loading import ReportError
    from testbed.report.predictions import prediction_table

    if not runs_dir.is_dir():
        sys.exit(f"no table: no runs under {runs_dir} (run without --report-only first)")
    try:
        table = prediction_table([runs_dir])
    except ReportError as exc:
        sys.exit(f"no table: {exc}")
    missing = [f.stem for f in scenarios if not (runs_dir / f.stem / "summary.json").exists()]
    text = table.text()
    lines = [text, ""]
    lines += [f"not run: {name}" for name in missing]
    lines += [f"left out: {why}" for why in left]
    lines += [f"skipped: {why}" for why in table.skipped]
    lines += [f"run: {n}" for n in notes]
    report = "\n".join(lines).rstrip() + "\n"
    table.write(args.out)
    (args.out / "prediction-errors.txt").write_text(report)
    print(report, end="")


if __name__ == "__main__":
    main()
