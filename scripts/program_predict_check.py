"""`testbed whatif --program` checked against launches: the pipelining and DDP examples,
profiled on topologies/2dc.yaml (50 ms RTT) with each backend, are predicted at other
RTTs and launched there; the table of predicted against measured seconds per step.

    sudo .venv/bin/python scripts/program_predict_check.py [--rtts 10,100,200] [--out results/program-predict]
    .venv/bin/python scripts/program_predict_check.py --reuse --out results/program-predict   # table again, no launch

Each launch is `testbed launch TOPOLOGY --hosts dc1-h1,dc2-h1 --env BACKEND=B -- python
examples/PROG.py --steps N` (the profile adds --profile); the RTT variants are 2dc.yaml with
every WAN link's delay set to RTT/2 (written to OUT/topologies/). Measured seconds per step:
the median of rank 0's step_s after the first step, as `testbed run` reports a program.
Writes OUT/profile-<prog>-<backend>/ (profile.json, launch.json), OUT/results.csv,
OUT/predictions.json and prints the table; the launch folders of the targets are removed
but for their launch.json (OUT/launch-<rtt>-<prog>-<backend>.json). Timing figures: the
machine's load shows in them (say so when keeping them).
"""

from __future__ import annotations

import argparse
import csv
import json
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from testbed_core.program.predict import predict, retarget  # noqa: E402
from testbed_core.program.profile import read_profile  # noqa: E402

TOPOLOGY = REPO / "topologies" / "2dc.yaml"
PROGRAMS = {"pipeline": ["examples/pipeline.py", "--steps", "6"], "ddp": ["examples/ddp.py", "--steps", "20"]}
BACKENDS = ("gloo", "atlas")
PROFILE_RTT_MS = 50


def _topology(rtt_ms: int, out: Path) -> Path:
    if rtt_ms == PROFILE_RTT_MS:
        return TOPOLOGY
    text = TOPOLOGY.read_text()
    lines = []
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("delay:"):
            line = line[: line.index("delay:")] + f"delay: {rtt_ms / 2:g}ms"
        elif line.startswith("name:"):
            line = f"name: 2dc-rtt{rtt_ms}"
        lines.append(line)
    path = out / "topologies" / f"2dc-rtt{rtt_ms}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    return path


def _launch(topology: Path, prog: str, backend: str, out: Path, profile: bool) -> None:
    cmd = [str(REPO / ".venv" / "bin" / "testbed"), "launch", str(topology), "--hosts", "dc1-h1,dc2-h1", "--quiet",
           "--timeout", "600", "--out", str(out), "--env", f"BACKEND={backend}"]
    if profile:
        cmd.append("--profile")
    cmd += ["--", str(REPO / ".venv" / "bin" / "python"), *PROGRAMS[prog]]
    print(f"  {' '.join(cmd[1:])}", flush=True)
    subprocess.run(cmd, cwd=REPO, check=True, stdout=subprocess.DEVNULL)


def measured(launch_json: Path) -> tuple[float, list[float]]:
    """Rank 0's median step_s after the first step, and all its step_s."""
    report = json.loads(launch_json.read_text())
    steps = [m["step_s"] for m in report["ranks"][0]["metrics"] if "step_s" in m]
    return statistics.median(steps[1:] or steps), steps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rtts", default="10,100,200", help="target RTTs in ms (the profiles are at 50 ms)")
    ap.add_argument("--out", default="results/program-predict")
    ap.add_argument("--reuse", action="store_true", help="launch nothing: predict from OUT's profiles, compare with "
                    "OUT's launch-*.json")
    ap.add_argument("--programs", default=",".join(PROGRAMS))
    ap.add_argument("--backends", default=",".join(BACKENDS))
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rtts = [int(x) for x in args.rtts.split(",") if x.strip()]
    progs = [p for p in args.programs.split(",") if p]
    backends = [b for b in args.backends.split(",") if b]
    t0 = time.time()
    if not args.reuse:
        print("profiling at 50 ms:", flush=True)
        for prog in progs:
            for be in backends:
                d = out / f"profile-{prog}-{be}"
                if d.exists():
                    shutil.rmtree(d)
                _launch(TOPOLOGY, prog, be, d, profile=True)
                for f in d.glob("rank-*"):
                    f.unlink()
                shutil.rmtree(d / "profile-records", ignore_errors=True)
        print("launching the targets:", flush=True)
        for rtt in rtts:
            topo = _topology(rtt, out)
            for prog in progs:
                for be in backends:
                    d = out / f"launch-{rtt}-{prog}-{be}"
                    _launch(topo, prog, be, d, profile=False)
                    shutil.copy(d / "launch.json", out / f"launch-{rtt}-{prog}-{be}.json")
                    shutil.rmtree(d)
    rows, preds = [], []
    for prog in progs:
        for be in backends:
            profile = read_profile(out / f"profile-{prog}-{be}")
            for rtt in rtts:
                pred = predict(profile, retarget(profile.network, rtt / 1000), label=f"RTT {rtt} ms")
                m, steps = measured(out / f"launch-{rtt}-{prog}-{be}.json")
                err = pred.seconds_per_step / m - 1 if pred.seconds_per_step else None
                rows.append({"program": prog, "backend": be, "rtt_ms": rtt,
                             "profiled_s_per_step": round(pred.ranks[0].measured_median_s or 0, 4),
                             "predicted_s_per_step": round(pred.seconds_per_step or 0, 4),
                             "measured_s_per_step": round(m, 4), "error": None if err is None else round(err, 4),
                             "extra_rtts": round(pred.extra_rtts, 3),
                             "window_kB": round(pred.paths[0].window_bytes / 1e3, 1) if pred.paths else None,
                             "window_source": pred.paths[0].window_source if pred.paths else None,
                             "measured_steps": " ".join(f"{s:.3f}" for s in steps)})
                preds.append({"program": prog, "backend": be, "rtt_ms": rtt, "prediction": pred.model_dump()})
    with open(out / "results.csv", "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    (out / "predictions.json").write_text(json.dumps(preds, indent=1) + "\n")
    print("\n| program | backend | RTT | profiled at 50 ms | predicted | measured | error |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['program']} | {r['backend']} | {r['rtt_ms']} ms | {r['profiled_s_per_step']:.3f} | "
              f"{r['predicted_s_per_step']:.3f} | {r['measured_s_per_step']:.3f} | {r['error']:+.1%} |")
    worst = max(abs(r["error"]) for r in rows if r["error"] is not None)
    print(f"\nworst error {worst:.1%}; {time.time() - t0:.0f} s; {out}/results.csv")


if __name__ == "__main__":
    main()
