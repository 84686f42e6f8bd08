"""How the what-if's time and memory grow with GPUs, 1k to 1M: the 131,072-GPU case's
shape (topologies/5dc-131k.yaml: five unequal DCs on a 100 Gbit/s ring, Atlas routing one
boundary through another DC; scenarios/workloads/qwen-32b-131k.yaml: pp=16, tp=8, 64
micro-batches, 1F1B) at dp = GPUs / 128, every variant, each point one `testbed whatif`
command as a user runs it, in its own process (imports included), its CPU time and peak
memory read from the kernel's accounting of that process.

    .venv/bin/python scripts/whatif_timing.py [--gpus 1024,4096,...] [--out results/whatif-scale]

Other shapes and the stride search's threads, side by side (timing-shapes.csv and .json
under --out, no plot): `--micro-batches 64,128,256` (the workload's micro-batches) and
`--threads 1,auto` ($TESTBED_WHATIF_THREADS of each command; auto: unset), every
combination at every --gpus, the thread counts interleaved per shape.

DC sizes at dp pipelines (u = dp x tp GPUs, one stage with its replicas): 5u + 5tp,
4u + 4tp, 3u + 3tp, 3u and 3u + tp, so that Atlas's largest-first placement is the same
at every size (5, 4, 3 stages in dc1-dc3, 3 in dc5, the last in dc4) and the even one
(4, 3, 3, 3, 3) fits. Writes timing.csv, timing.json and timing.png under --out. Timing
figures: CPU time, since this machine's cores may be shared; run it on a quiet machine.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from testbed_core.whatif.predict import THREADS_ENV

REPO = Path(__file__).resolve().parent.parent
TOPOLOGY = REPO / "topologies" / "5dc-131k.yaml"
WORKLOAD = REPO / "scenarios" / "workloads" / "qwen-32b-131k.yaml"
DEFAULT_GPUS = [1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072, 262144, 524288, 1048576]


def setup(gpus: int, work: Path, micro_batches: int | None = None) -> tuple[Path, Path]:
    """The topology and workload files of one point (see the module docstring)."""
    wl = yaml.safe_load(WORKLOAD.read_text())
    par = wl["parallelism"]
    if micro_batches is not None:
        par["num_micro_batches"] = micro_batches
    unit = par["pp"] * par["tp"]
    if gpus % unit:
        raise SystemExit(f"--gpus: {gpus} is not a multiple of pp x tp = {unit}")
    dp, tp = gpus // unit, par["tp"]
    par["dp"] = dp
    wl["name"] = f"qwen-32b-{gpus}"
    topo = yaml.safe_load(TOPOLOGY.read_text())
    u = dp * tp
    for dc, n in zip(topo["dcs"], [5 * u + 5 * tp, 4 * u + 4 * tp, 3 * u + 3 * tp, 3 * u, 3 * u + tp], strict=True):
        dc["gpus"] = n
    topo["name"] = f"5dc-{gpus}"
    t, w = work / f"topology-{gpus}.yaml", work / f"workload-{gpus}.yaml"
    t.write_text(yaml.safe_dump(topo, sort_keys=False))
    w.write_text(yaml.safe_dump(wl, sort_keys=False))
    return t, w


def measure(gpus: int, work: Path, micro_batches: int | None = None, threads: str = "auto") -> dict:
    """One `testbed whatif --json` of the point, in its own process; its CPU seconds and
    the largest child's peak RSS so far from the children's accounting (the points run in
    increasing size, so the peak is this one's there)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t, w = setup(gpus, work, micro_batches)
    cmd = [str(Path(sys.executable).parent / "testbed"), "whatif", "--topology", str(t), "--workload", str(w), "--json"]
    env = {k: v for k, v in os.environ.items() if k != THREADS_ENV}
    if threads != "auto":
        env[THREADS_ENV] = threads
    wall0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    out, err = proc.communicate()
    wall = time.perf_counter() - wall0
    if proc.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{err}")
    doc = json.loads(out)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return {"gpus": gpus, "dp": gpus // 128, "micro_batches": micro_batches, "threads": threads,
            "wall_s": wall, "predict_s": doc["predict_s"],
            "cpu_s": (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime),
            "peak_rss_gb": after.ru_maxrss / 2**20,
            "variants": {v["variant"]: {"iteration_s": v["iteration_s"], "sharing": v["sharing"],
                                        "method": v["method"], "predict_s": v["predict_s"]}
                         for v in doc["variants"] if v["feasible"]}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gpus", default=",".join(map(str, DEFAULT_GPUS)), help="comma-separated GPU counts")
    ap.add_argument("--out", type=Path, default=REPO / "results" / "whatif-scale")
    ap.add_argument("--replot", action="store_true", help="only redraw timing.png from --out's timing.json")
    ap.add_argument("--micro-batches", default=None, help="comma-separated micro-batch counts (other shapes)")
    ap.add_argument("--threads", default=None, help="comma-separated $TESTBED_WHATIF_THREADS values (auto: unset)")
    args = ap.parse_args()
    if args.replot:
        plot(json.loads((args.out / "timing.json").read_text())["points"], args.out / "timing.png")
        return
    counts = [int(x) for x in args.gpus.split(",") if x.strip()]
    args.out.mkdir(parents=True, exist_ok=True)
    if args.micro_batches is not None or args.threads is not None:
        shapes(counts, [int(x) for x in (args.micro_batches or "64").split(",") if x.strip()],
               [x.strip() for x in (args.threads or "auto").split(",") if x.strip()], args.out)
        return
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        # the first use on a machine compiles the engine's loop (numba, cached afterwards)
        measure(1024, Path(tmp))
        for gpus in counts:
            row = measure(gpus, Path(tmp))
            rows.append(row)
            print(f"{gpus:>9,} GPUs (dp={row['dp']:,}): {row['cpu_s']:6.2f} s CPU, {row['wall_s']:6.2f} s wall, "
                  f"peak {row['peak_rss_gb']:.2f} GB; " + ", ".join(
                      f"{n} {v['predict_s']:.2f} s" for n, v in row["variants"].items()), flush=True)
    with open(args.out / "timing.csv", "w", newline="") as fh:
        wr = csv.writer(fh)
        names = _names(rows)
        wr.writerow(["gpus", "dp", "cpu_s", "wall_s", "peak_rss_gb", *[f"{n}_predict_s" for n in names],
                     *[f"{n}_iteration_s" for n in names]])
        for r in rows:
            wr.writerow([r["gpus"], r["dp"], f"{r['cpu_s']:.3f}", f"{r['wall_s']:.3f}", f"{r['peak_rss_gb']:.3f}",
                         *[_get(r, n, "predict_s", ".3f") for n in names],
                         *[_get(r, n, "iteration_s", ".6g") for n in names]])
    (args.out / "timing.json").write_text(json.dumps({"command": "scripts/whatif_timing.py", "points": rows},
                                                    indent=1))
    plot(rows, args.out / "timing.png")
    print(f"wrote {args.out / 'timing.csv'}, {args.out / 'timing.json'}, {args.out / 'timing.png'}")


def shapes(counts: list[int], mbs: list[int], threads: list[str], out: Path) -> None:
    """Every (GPUs, micro-batches) point once per thread setting, the settings one after
    the other per point (so a machine's slower minutes fall on both): timing-shapes.*."""
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        measure(1024, Path(tmp))  # compile the engine's loop first
        for gpus in counts:
            for mb in mbs:
                for th in threads:
                    row = measure(gpus, Path(tmp), mb, th)
                    rows.append(row)
                    print(f"{gpus:>9,} GPUs, {mb} micro-batches, threads {th}: {row['wall_s']:6.2f} s wall, "
                          f"{row['cpu_s']:6.2f} s CPU; atlas {row['variants']['atlas']['iteration_s']:.6g} s "
                          f"({row['variants']['atlas']['predict_s']:.2f} s)", flush=True)
    with open(out / "timing-shapes.csv", "w", newline="") as fh:
        wr = csv.writer(fh)
        names = _names(rows)
        wr.writerow(["gpus", "dp", "micro_batches", "threads", "wall_s", "cpu_s",
                     *[f"{n}_iteration_s" for n in names]])
        for r in rows:
            wr.writerow([r["gpus"], r["dp"], r["micro_batches"], r["threads"], f"{r['wall_s']:.3f}",
                         f"{r['cpu_s']:.3f}", *[_get(r, n, "iteration_s", ".9g") for n in names]])
    (out / "timing-shapes.json").write_text(json.dumps({"command": "scripts/whatif_timing.py", "points": rows},
                                                      indent=1))
    print(f"wrote {out / 'timing-shapes.csv'}, {out / 'timing-shapes.json'}")


def _names(rows: list[dict]) -> list[str]:
    """Every variant placed at some point (dp-across-dc does not fit the smallest)."""
    return list(dict.fromkeys(n for r in rows for n in r["variants"]))


def _get(row: dict, name: str, key: str, fmt: str) -> str:
    v = row["variants"].get(name)
    return "" if v is None else format(v[key], fmt)


def plot(rows: list[dict], path: Path) -> None:
    """The whole command's CPU seconds (and wall seconds, which a shared machine
    inflates) and its peak memory against GPUs, with the issue's 10 s and 2 GB marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullFormatter, ScalarFormatter

    xs = [r["gpus"] for r in rows]
    fig, (a, b) = plt.subplots(1, 2, figsize=(13, 4.6))
    a.plot(xs, [r["cpu_s"] for r in rows], "k-o", label="CPU seconds (imports included)")
    a.plot(xs, [r["wall_s"] for r in rows], "--", marker=".", color="grey", label="wall seconds (machine shared)")
    a.axhline(10, color="tab:red", ls=":", lw=1)
    a.axvline(131072, color="tab:red", ls=":", lw=1)
    a.text(xs[0], 10, " target: 10 s at 131,072 GPUs", va="bottom", color="tab:red", fontsize=8)
    a.set(xscale="log", yscale="log", xlabel="GPUs (dp = GPUs / 128)", ylabel="seconds",
          title="testbed whatif, every variant: time to predict")
    a.yaxis.set_major_formatter(ScalarFormatter())
    a.yaxis.set_minor_formatter(NullFormatter())
    a.legend(fontsize=8, loc="lower right")
    b.plot(xs, [r["peak_rss_gb"] for r in rows], "k-o")
    b.axhline(2, color="tab:red", ls=":", lw=1)
    b.axvline(131072, color="tab:red", ls=":", lw=1)
    b.text(xs[0], 2, " target: 2 GB at 131,072 GPUs", va="bottom", color="tab:red", fontsize=8)
    b.set(xscale="log", xlabel="GPUs", ylabel="peak RSS (GB)", title="memory of the command", ylim=(0, 2.3))
    fig.suptitle("What-if time and memory: 5 unequal DCs (topologies/5dc-131k.yaml's shape), pp=16, tp=8, "
                 "64 micro-batches, 1F1B")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


if __name__ == "__main__":
    main()
