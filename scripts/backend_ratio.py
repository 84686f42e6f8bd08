"""Seconds per step of the example programs with BACKEND=gloo and BACKEND=atlas, side by
side in one run, across the 2dc WAN and on the 1dc-lan LAN (issue 37's targets: on 2dc
atlas at least 3x faster than gloo for DDP and FSDP2, 2x for the 2-D FSDP x TP
program, 5x for pipelining; on 1dc-lan no program below 0.9x gloo).

    sudo .venv/bin/python scripts/backend_ratio.py [--rounds 3] [--steps N] [--warmup 1] \\
        [--programs ddp,fsdp2,mesh2d,pipeline] [--topologies 2dc,1dc-lan] [--lock /tmp/emulation.lock] \\
        [--out results/bench-backend-ratio]

Method. Each (topology, program) runs in `--rounds` alternating rounds, gloo then atlas
in each (gloo, atlas, gloo, atlas, ...), every run a fresh `testbed launch` of the
program, so that a change in the machine's load lands on both backends rather than on
one. A run's step times are rank 0's `step_s` lines; its first `--warmup` steps (channels
and gloo pairs opening, first-touch allocations) are dropped. Seconds per step of a
backend is the median of all its kept steps over every round, and the ratio is gloo's
median over atlas's (above 1: atlas faster). Each round's own ratio is kept as well:
their spread says how far one round can be trusted. Steps default to 30 on the LAN,
where a step takes 40-200 ms and a median of a few is noise, and 6 on the 2dc WAN,
where a step takes seconds. DDP runs with 8 MiB of gradients (--hidden 16384 --batch 32,
as the issue's DDP program).

`--lock PATH` takes an exclusive flock on PATH around each (topology, program): its
rounds run back to back while the lock is held, other users of the lock run between
programs, instead of the caller holding it for the whole sweep (do not pass it when
the whole command already runs under `flock PATH`: it would wait for itself).

Writes ``ratio.json`` (every run's step times and the 1-minute load when it started,
each row's medians, ratio and per-round ratios) and prints the table. Figures measured
on a machine shared with other work are noisy: compare the ratios, and their spread.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PROGRAMS = {
    "ddp": (["examples/ddp.py", "--hidden", "16384", "--batch", "32"], None),
    "fsdp2": (["examples/fsdp2.py"], None),
    "mesh2d": (["examples/mesh2d.py"], None),
    "pipeline": (["examples/pipeline.py"], {"2dc": "dc1-h1,dc2-h1", "1dc-lan": "dc1-h1,dc1-h2"}),
}
BACKENDS = ("gloo", "atlas")
TARGETS = {("2dc", "ddp"): 3.0, ("2dc", "fsdp2"): 3.0, ("2dc", "mesh2d"): 2.0, ("2dc", "pipeline"): 5.0}
LAN_FLOOR = 0.9
STEPS = {"1dc-lan": 30}  # steps per run by topology when --steps is not given
DEFAULT_STEPS = 6


def steps_of(stdout: Path) -> list[float]:
    out = []
    for line in stdout.read_text().splitlines():
        try:
            d = json.loads(line)
        except ValueError:
            continue
        if isinstance(d, dict) and "step_s" in d:
            out.append(float(d["step_s"]))
    return out


def launch(topology: str, backend: str, program: list[str], hosts: str | None, steps: int, work: Path) -> list[float]:
    out = work / f"{topology}-{backend}-{Path(program[0]).stem}"
    cmd = [str(REPO / ".venv/bin/testbed"), "launch", str(REPO / "topologies" / f"{topology}.yaml"),
           "--env", f"BACKEND={backend}", "--timeout", "600", "-q", "--out", str(out)]
    if hosts:
        cmd += ["--hosts", hosts]
    cmd += ["--", str(REPO / ".venv/bin/python"), *program, "--steps", str(steps)]
    r = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"{backend} {program[0]} on {topology} failed ({r.returncode}):\n{r.stdout[-3000:]}{r.stderr[-3000:]}")
    steps_s = steps_of(out / "rank-0.stdout")
    if not steps_s:
        sys.exit(f"{backend} {program[0]} on {topology}: rank 0 printed no step_s line ({out / 'rank-0.stdout'})")
    return steps_s


@contextlib.contextmanager
def held(path: Path | None) -> Iterator[None]:
    """An exclusive flock on `path` for the block (nothing when None)."""
    if path is None:
        yield
        return
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def compare(runs: list[dict], warmup: int) -> dict:
    """Medians over every round's kept steps, their ratio, and each round's own ratio."""
    kept = {b: [s for r in runs if r["backend"] == b for s in r["steps_s"][warmup:]] for b in BACKENDS}
    for b, steps in kept.items():
        if not steps:
            sys.exit(f"no {b} step left after dropping {warmup} warm-up steps per run: raise --steps")
    med = {b: statistics.median(s) for b, s in kept.items()}
    rounds = sorted({r["round"] for r in runs})
    per_round = []
    for i in rounds:
        m = {r["backend"]: statistics.median(r["steps_s"][warmup:]) for r in runs if r["round"] == i}
        per_round.append(round(m["gloo"] / m["atlas"], 3))
    return {"gloo_s": round(med["gloo"], 5), "atlas_s": round(med["atlas"], 5),
            "gloo_over_atlas": round(med["gloo"] / med["atlas"], 3), "round_ratios": per_round,
            "steps_kept": {b: len(s) for b, s in kept.items()}}


def table(rows: list[dict]) -> str:
    lines = ["| topology | program | gloo s/step | atlas s/step | gloo / atlas | per round | target | load |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        loads = [x["load_1min"] for x in r["runs"]]
        lines.append(f"| {r['topology']} | {r['program']} | {r['gloo_s']:.3f} | {r['atlas_s']:.3f} | "
                     f"{r['gloo_over_atlas']:.2f} | {', '.join(f'{x:.2f}' for x in r['round_ratios'])} | "
                     f"{r['target']} | {min(loads):.1f}-{max(loads):.1f} |")
    return "\n".join(lines)


def write(out: Path, args: argparse.Namespace, rows: list[dict], complete: bool) -> Path:
    """ratio.json with the rows so far (`complete`: every program and topology ran)."""
    out.mkdir(parents=True, exist_ok=True)
    doc = {"time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "commit": subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True,
                                    text=True).stdout.strip(),
           "command": "sudo .venv/bin/python scripts/backend_ratio.py " + " ".join(sys.argv[1:]),
           "complete": complete,
           "method": {"rounds": args.rounds, "warmup": args.warmup, "order": list(BACKENDS),
                      "statistic": "median of every kept step of rank 0 over all rounds; ratio gloo / atlas"},
           "rows": rows}
    path = out / "ratio.json"
    path.write_text(json.dumps(doc, indent=1) + "\n")
    return path


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=None,
                   help="steps per run (default: " + ", ".join(f"{n} on {t}" for t, n in STEPS.items())
                   + f", else {DEFAULT_STEPS})")
    p.add_argument("--rounds", type=int, default=3, help="alternating gloo/atlas rounds per program (default 3)")
    p.add_argument("--warmup", type=int, default=1, help="first steps of each run left out (default 1)")
    p.add_argument("--programs", default=",".join(PROGRAMS))
    p.add_argument("--topologies", default="2dc,1dc-lan")
    p.add_argument("--lock", type=Path, default=None, help="flock this file around each program's rounds")
    p.add_argument("--out", type=Path, default=REPO / "results" / "bench-backend-ratio")
    args = p.parse_args()
    names = args.programs.split(",")
    unknown = [n for n in names if n not in PROGRAMS]
    if unknown:
        p.error(f"--programs: unknown {', '.join(unknown)}; use some of {', '.join(PROGRAMS)}")
    if args.rounds < 1 or args.warmup < 0:
        p.error("--rounds must be at least 1 and --warmup at least 0")
    rows = []
    with tempfile.TemporaryDirectory(prefix="backend-ratio-") as tmp:
        for topology in args.topologies.split(","):
            steps = args.steps or STEPS.get(topology, DEFAULT_STEPS)
            if steps <= args.warmup:
                p.error(f"--steps {steps} leaves nothing after --warmup {args.warmup}")
            for name in names:
                program, hosts = PROGRAMS[name]
                h = hosts.get(topology) if hosts else None
                runs = []
                with held(args.lock):
                    for i in range(args.rounds):
                        for b in BACKENDS:
                            load = os.getloadavg()[0]
                            began = time.monotonic()
                            steps_s = launch(topology, b, program, h, steps, Path(tmp))
                            runs.append({"round": i, "backend": b, "load_1min": round(load, 2),
                                         "wall_s": round(time.monotonic() - began, 1), "steps_s": steps_s})
                            print(f"  {topology} {name} round {i} {b}: median "
                                  f"{statistics.median(steps_s[args.warmup:]):.4f} s/step (load {load:.1f})",
                                  flush=True)
                row = compare(runs, args.warmup)
                target = TARGETS.get((topology, name), LAN_FLOOR if topology == "1dc-lan" else None)
                speedup = row["gloo_over_atlas"]
                rows.append({"topology": topology, "program": name, **row, "target": target,
                             "met": None if target is None else speedup >= target,
                             "met_every_round": None if target is None else min(row["round_ratios"]) >= target,
                             "load_1min": round(statistics.mean(r["load_1min"] for r in runs), 2),
                             "steps": steps, "runs": runs})
                print(f"{topology:8} {name:9} gloo {row['gloo_s']:.4f} s  atlas {row['atlas_s']:.4f} s  "
                      f"gloo/atlas {speedup:.2f} (rounds {row['round_ratios']}, target {target})", flush=True)
                write(args.out, args, rows, complete=False)  # kept if a later program fails
    path = write(args.out, args, rows, complete=True)
    print(table(rows))
    print(f"written: {path}")


if __name__ == "__main__":
    main()
