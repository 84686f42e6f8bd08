"""`testbed whatif --program` checked against launches: the pipelining and DDP examples,
profiled on topologies/2dc.yaml (50 ms RTT) with each backend, are predicted at other
RTTs and launched there; the table of predicted against measured seconds per step.

    .venv/bin/python scripts/program_predict_check.py --backends gloo --out results/program-predict   # as root
    .venv/bin/python scripts/program_predict_check.py --predict-only --out results/program-predict    # freeze
    .venv/bin/python scripts/program_predict_check.py --reuse --out results/program-predict   # table again, no launch

Each launch is `testbed launch TOPOLOGY --hosts dc1-h1,dc2-h1 --env BACKEND=B -- python
examples/PROG.py --steps N` (the profile adds --profile), under `flock /tmp/emulation.lock`
(one emulation at a time on a shared machine; --lock-held when the caller holds it); the
RTT variants are 2dc.yaml with every WAN link's delay set to RTT/2 (written to
OUT/topologies/). --no-profile-launch launches only the targets, so that the predictions
can be frozen in between (--predict-only: OUT/predictions-a-priori.json, with commit and
time). Seconds per step: the median after the first step of each step's mean over the
ranks' step_s (`ranks_mean_median`: where two ranks meet in one exchange a step, one
rank's own timer depends on which of them runs ahead); rank 0's median beside it. The
target launches are profiled too (the recorder costs microseconds per call), so that the
table can set beside each prediction the ranks' compute per step there and the replay of
the target's own profile with the 50 ms profile's network figures (its window and fitted
round trips): that isolates the network model from the compute the replay keeps as
profiled. Writes OUT/profile-<rtt>-<prog>-<backend>/ (profile.json, launch.json,
run-meta.json: commit, time, load; an atlas launch's transport-calibration.json, which
`testbed launch --profile` measures after its ranks end: the predictions use the 50 ms
profile's, --no-transport-cost none), OUT/results.csv, OUT/predictions.json, OUT/table.md.
Timing figures: the machine's load shows in them (say so when keeping them).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from testbed_core.program.predict import (  # noqa: E402
    compute_per_step,
    measured_steps,
    measured_windows,
    predict,
    ranks_mean_median,
    retarget,
)
from testbed_core.program.profile import read_profile  # noqa: E402
from testbed_core.program.transport import read_calibration  # noqa: E402

TOPOLOGY = REPO / "topologies" / "2dc.yaml"
PROGRAMS = {"pipeline": ["examples/pipeline.py", "--steps", "6"], "ddp": ["examples/ddp.py", "--steps", "40"]}
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


LOCK = "/tmp/emulation.lock"
META_FILE = "run-meta.json"  # not summary.json: kept-results tests read those as run summaries


def _commit() -> str:
    """HEAD's short hash, '+dirty' when tracked files differ from it (other helpers' edits)."""
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO, capture_output=True,
                           text=True).stdout.strip()
    return head.strip() + ("+dirty" if dirty else "")


def _launch(topology: Path, prog: str, backend: str, out: Path, profile: bool, lock: bool = True) -> None:
    """One launch, under the shared emulation lock (one emulation at a time on this machine);
    OUT/run-meta.json: when it ran, at which commit, the load average before and after."""
    meta = {"commit": _commit(), "started_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
            "load_before": round(os.getloadavg()[0], 2)}
    cmd = (["flock", LOCK] if lock else []) + [str(REPO / ".venv" / "bin" / "testbed"), "launch", str(topology), "--hosts", "dc1-h1,dc2-h1", "--quiet",
           "--timeout", "600", "--out", str(out), "--env", f"BACKEND={backend}"]
    if profile:
        cmd.append("--profile")
    cmd += ["--", str(REPO / ".venv" / "bin" / "python"), *PROGRAMS[prog]]
    print(f"  {' '.join(cmd[3 if lock else 1:])}", flush=True)
    subprocess.run(cmd, cwd=REPO, check=True, stdout=subprocess.DEVNULL)
    meta["load_after"] = round(os.getloadavg()[0], 2)
    report = json.loads((out / "launch.json").read_text())
    meta["launch_wall_s"] = report.get("wall_s")
    if isinstance(report.get("started"), (int, float)):  # the launch itself, once it held the lock
        meta["launched_utc"] = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(report["started"]))
    (out / META_FILE).write_text(json.dumps(meta) + "\n")


def measured(launch_json: Path) -> tuple[float, list[float]]:
    """Rank 0's median step_s after the first step, and all its step_s."""
    report = json.loads(launch_json.read_text())
    steps = [m["step_s"] for m in report["ranks"][0]["metrics"] if "step_s" in m]
    return statistics.median(steps[1:] or steps), steps


FROZEN = "predictions-a-priori.json"


def _calibration(directory: Path, profile, use: bool):
    """The transport calibration measured with the profile (DIR/transport-calibration.json),
    None where there is none (profiles before it) or `use` is off."""
    return read_calibration(directory, profile) if use else None


def _freeze(out: Path, progs: list[str], backends: list[str], rtts: list[int], use_cost: bool = True) -> None:
    """The predictions from the 50 ms profiles alone, added to those kept before, with when and
    at which commit (model) they were made: made before a target's launch
    (target_launched_already false), they cannot have been fitted to it."""
    path = out / FROZEN
    kept = json.loads(path.read_text()) if path.is_file() else []
    for prog in progs:
        for be in backends:
            pdir = out / f"profile-{PROFILE_RTT_MS}-{prog}-{be}"
            profile = read_profile(pdir)
            cal = _calibration(pdir, profile, use_cost)
            windows = measured_windows(profile, profile.network, transport=cal)
            for rtt in rtts:
                pred = predict(profile, retarget(profile.network, rtt / 1000), windows=windows, transport=cal)
                targets = out / f"profile-{rtt}-{prog}-{be}" / META_FILE
                kept.append({"program": prog, "backend": be, "rtt_ms": rtt, "commit": _commit(),
                             "made_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
                             "target_launched_already": targets.is_file(),
                             "rank0_s_per_step": round(pred.seconds_per_step or 0, 4),
                             "ranks_mean_s_per_step": round(pred.ranks_mean_s_per_step or 0, 4),
                             "extra_rtts": round(pred.extra_rtts, 3),
                             "transport_calibration": None if cal is None else
                             {"measured_utc": cal.measured_utc, "load_average": cal.load_average,
                              "costs": [c.model_dump() for c in cal.costs]}})
                print(kept[-1])
    path.write_text(json.dumps(kept, indent=1) + "\n")


def _commit_at(utc: str | None, queued: str | None) -> str | None:
    """HEAD when a launch started (the newest commit before then: the launch may have waited
    for the lock after it was queued at `queued`), '+dirty' as when queued."""
    if not utc:
        return queued
    head = subprocess.run(["git", "rev-list", "-1", f"--before={utc} +0000", "HEAD"], cwd=REPO, capture_output=True,
                          text=True).stdout.strip()[:7]
    return (head or "?") + ("+dirty" if queued and queued.endswith("+dirty") else "")


def _started(directory: Path) -> str | None:
    """When the launch in `directory` started (its launch.json), UTC."""
    path = directory / "launch.json"
    started = json.loads(path.read_text()).get("started") if path.is_file() else None
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(started)) if isinstance(started, (int, float)) else None


def _meta(directory: Path) -> dict:
    path = directory / META_FILE
    return json.loads(path.read_text()) if path.is_file() else {}


def _load(profile) -> float | None:
    """Rank 0's compute: wall over CPU seconds (1.0: a core to itself; more: the machine was busy)."""
    r = profile.ranks[0]
    return round(r.compute_wall_s / r.compute_cpu_s, 2) if r.compute_wall_s and r.compute_cpu_s else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rtts", default="10,100,200", help="target RTTs in ms (the profiles are at 50 ms)")
    ap.add_argument("--out", default="results/program-predict")
    ap.add_argument("--reuse", action="store_true", help="launch nothing: predict from OUT's profiles, compare with "
                    "OUT's launch-*.json")
    ap.add_argument("--programs", default=",".join(PROGRAMS))
    ap.add_argument("--backends", default=",".join(BACKENDS))
    ap.add_argument("--lock-held", action="store_true", help=f"the caller holds {LOCK} (flock {LOCK} python "
                    "scripts/program_predict_check.py ...): launch without taking it per launch")
    ap.add_argument("--predict-only", action="store_true", help="launch nothing: predict from OUT's 50 ms profiles "
                    f"and add the figures to OUT/{FROZEN} with the commit and time (before the targets are launched)")
    ap.add_argument("--no-transport-cost", action="store_true", help="predict without the transport calibration "
                    "measured with each 50 ms profile (transport-calibration.json): the network alone")
    ap.add_argument("--no-profile-launch", action="store_true", help="launch only the targets (the 50 ms profiles "
                    "are in OUT already)")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rtts = [int(x) for x in args.rtts.split(",") if x.strip()]
    progs = [p for p in args.programs.split(",") if p]
    backends = [b for b in args.backends.split(",") if b]
    t0 = time.time()
    if args.predict_only:
        _freeze(out, progs, backends, rtts, not args.no_transport_cost)
        return
    if not args.reuse:
        for rtt in ([] if args.no_profile_launch else [PROFILE_RTT_MS]) + rtts:
            print(f"launching at {rtt} ms (profiled):", flush=True)
            topo = _topology(rtt, out)
            for prog in progs:
                for be in backends:
                    d = out / f"profile-{rtt}-{prog}-{be}"
                    if d.exists():
                        shutil.rmtree(d)
                    _launch(topo, prog, be, d, profile=True, lock=not args.lock_held)
                    for f in d.glob("rank-*"):
                        f.unlink()
                    shutil.rmtree(d / "profile-records", ignore_errors=True)
    rows, preds = [], []
    for prog in progs:
        for be in backends:
            pdir = out / f"profile-{PROFILE_RTT_MS}-{prog}-{be}"
            profile = read_profile(pdir)
            cal = _calibration(pdir, profile, not args.no_transport_cost)
            windows = measured_windows(profile, profile.network, transport=cal)
            compute0 = statistics.median(compute_per_step(profile.ranks[0])[1:])
            for rtt in rtts:
                pred = predict(profile, retarget(profile.network, rtt / 1000), label=f"RTT {rtt} ms", windows=windows,
                               transport=cal)
                target_dir = out / f"profile-{rtt}-{prog}-{be}"
                m, steps = measured(target_dir / "launch.json")
                err = pred.seconds_per_step / m - 1 if pred.seconds_per_step else None
                target = read_profile(target_dir)
                m_mean = ranks_mean_median(measured_steps(target), 1)
                p_mean = pred.ranks_mean_s_per_step
                err_mean = p_mean / m_mean - 1 if p_mean and m_mean else None
                own = predict(target, target.network, windows=windows, extra_rtts=pred.extra_rtts, transport=cal)
                compute_t = statistics.median(compute_per_step(target.ranks[0])[1:])
                meta_p, meta_t = _meta(out / f"profile-{PROFILE_RTT_MS}-{prog}-{be}"), _meta(target_dir)
                rows.append({"program": prog, "backend": be, "rtt_ms": rtt,
                             "profile_commit": meta_p.get("commit"),
                             "profile_utc": meta_p.get("launched_utc") or _started(out / f"profile-{PROFILE_RTT_MS}-{prog}-{be}"),
                             "profile_load": meta_p.get("load_after"),
                             "profile_commit_at_launch": _commit_at(meta_p.get("launched_utc"), meta_p.get("commit")),
                             "launch_commit": _commit_at(meta_t.get("launched_utc"), meta_t.get("commit")),
                             "launch_utc": meta_t.get("launched_utc") or _started(target_dir),
                             "launch_load": meta_t.get("load_after"),
                             "profiled_s_per_step": round(pred.ranks[0].measured_median_s or 0, 4),
                             "predicted_s_per_step": round(pred.seconds_per_step or 0, 4),
                             "measured_s_per_step": round(m, 4), "error": None if err is None else round(err, 4),
                             "profiled_ranks_mean_s": round(pred.measured_ranks_mean_s_per_step or 0, 4),
                             "predicted_ranks_mean_s": round(p_mean or 0, 4), "measured_ranks_mean_s": round(m_mean or 0, 4),
                             "error_ranks_mean": None if err_mean is None else round(err_mean, 4),
                             "extra_rtts": round(pred.extra_rtts, 3),
                             "transport_cost": "none" if cal is None else " ".join(
                                 f"{c.pattern}:{c.overhead_s * 1e3:.2f}ms+{c.rate_Bps / 1e6:.0f}MB/s" for c in cal.costs),
                             "rank0_compute_profiled_s": round(compute0, 4), "rank0_compute_target_s": round(compute_t, 4),
                             "replay_with_target_compute_s": round(own.ranks_mean_s_per_step or 0, 4),
                             "rank0_wall_over_cpu_profiled": _load(profile), "rank0_wall_over_cpu_target": _load(target),
                             "window_kB": round(pred.paths[0].window_bytes / 1e3, 1) if pred.paths else None,
                             "window_source": pred.paths[0].window_source if pred.paths else None,
                             "measured_steps": " ".join(f"{s:.3f}" for s in steps),
                             "measured_steps_rank1": " ".join(f"{s.step_s:.3f}" for s in target.ranks[1].steps)
                             if len(target.ranks) > 1 else ""})
                preds.append({"program": prog, "backend": be, "rtt_ms": rtt, "prediction": pred.model_dump()})
    if not rows:  # profiles only (--rtts '')
        return
    with open(out / "results.csv", "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    (out / "predictions.json").write_text(json.dumps(preds, indent=1) + "\n")
    table = _table(rows)
    print("\n" + table)
    worst = max(abs(r["error_ranks_mean"]) for r in rows if r["error_ranks_mean"] is not None)
    print(f"\nworst error {worst:.1%}; {time.time() - t0:.0f} s; {out}/results.csv")
    (out / "table.md").write_text(table + "\n")  # the README (written by hand) says how the launches were made


def _table(rows: list[dict]) -> str:
    lines = ["| program | backend | RTT | predicted | measured | error | rank 0: predicted / measured (error) | "
             "rank 0 compute/step (50 ms -> there) | replay with the compute there | launched (UTC), commit, load after |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        own_err = r["replay_with_target_compute_s"] / r["measured_ranks_mean_s"] - 1
        lines.append(f"| {r['program']} | {r['backend']} | {r['rtt_ms']} ms | {r['predicted_ranks_mean_s']:.3f} | "
                     f"{r['measured_ranks_mean_s']:.3f} | {r['error_ranks_mean']:+.1%} | "
                     f"{r['predicted_s_per_step']:.3f} / {r['measured_s_per_step']:.3f} ({r['error']:+.1%}) | "
                     f"{r['rank0_compute_profiled_s']:.3f} -> {r['rank0_compute_target_s']:.3f} | "
                     f"{r['replay_with_target_compute_s']:.3f} ({own_err:+.1%}) | "
                     f"{(r['launch_utc'] or '-')[11:16]}, {r['launch_commit'] or '-'}, {r['launch_load']} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
