"""Seconds per step of the example programs with BACKEND=gloo and BACKEND=atlas, side by
side in one run, across the 2dc WAN and on the 1dc-lan LAN (issue 37's targets: on 2dc
atlas at least 3x faster than gloo for DDP and FSDP2, 2x for the 2-D FSDP x TP
program, 5x for pipelining; on 1dc-lan no program below 0.9x gloo).

    sudo .venv/bin/python scripts/backend_ratio.py [--steps 6] [--out results/bench-backend-ratio]

Each (program, topology) runs gloo then atlas through `testbed launch`; seconds per
step is the median of rank 0's step_s after the first step. DDP runs with 8 MiB of
gradients (--hidden 16384 --batch 32, as the issue's DDP program). Writes
``ratio.json`` (every step time) and prints the table; the machine's load is recorded
since figures on a shared machine are noisy (compare the ratios).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PROGRAMS = {
    "ddp": (["examples/ddp.py", "--hidden", "16384", "--batch", "32"], None),
    "fsdp2": (["examples/fsdp2.py"], None),
    "mesh2d": (["examples/mesh2d.py"], None),
    "pipeline": (["examples/pipeline.py"], {"2dc": "dc1-h1,dc2-h1", "1dc-lan": "dc1-h1,dc1-h2"}),
}
TARGETS = {("2dc", "ddp"): 3.0, ("2dc", "fsdp2"): 3.0, ("2dc", "mesh2d"): 2.0, ("2dc", "pipeline"): 5.0}
LAN_FLOOR = 0.9


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
    return steps_of(out / "rank-0.stdout")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--programs", default=",".join(PROGRAMS))
    p.add_argument("--topologies", default="2dc,1dc-lan")
    p.add_argument("--out", type=Path, default=REPO / "results" / "bench-backend-ratio")
    args = p.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="backend-ratio-") as tmp:
        for topology in args.topologies.split(","):
            for name in args.programs.split(","):
                program, hosts = PROGRAMS[name]
                h = hosts.get(topology) if hosts else None
                load = os.getloadavg()[0]
                times = {b: launch(topology, b, program, h, args.steps, Path(tmp)) for b in ("gloo", "atlas")}
                med = {b: statistics.median(t[1:]) for b, t in times.items()}
                speedup = med["gloo"] / med["atlas"]
                target = TARGETS.get((topology, name), LAN_FLOOR if topology == "1dc-lan" else None)
                rows.append({"topology": topology, "program": name, "gloo_s": med["gloo"], "atlas_s": med["atlas"],
                             "gloo_over_atlas": round(speedup, 3), "target": target,
                             "met": None if target is None else speedup >= target, "load_1min": round(load, 2),
                             "steps_s": times})
                print(f"{topology:8} {name:9} gloo {med['gloo']:.3f} s  atlas {med['atlas']:.3f} s  "
                      f"gloo/atlas {speedup:.2f}  (target {target}, load {load:.1f})", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    doc = {"time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "commit": subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True,
                                    text=True).stdout.strip(),
           "command": "sudo .venv/bin/python scripts/backend_ratio.py " + " ".join(sys.argv[1:]), "rows": rows}
    (args.out / "ratio.json").write_text(json.dumps(doc, indent=1) + "\n")
    print(f"written: {args.out / 'ratio.json'}")


if __name__ == "__main__":
    main()
