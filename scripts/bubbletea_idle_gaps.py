#!/usr/bin/env python3
"""Long idle stretches of a BubbleTea variant's devices, and the work that was waiting then.

    .venv/bin/python scripts/bubbletea_idle_gaps.py RUN/atlas+bubbletea [--min-ms 80]

Reads the variant folder's `timeline.csv` (every piece of device work), `iterations.json`
(the iterations' starts and ends; warm-ups skipped with the summary's `warmup`, default 3)
and each agent's `agents/<worker>.requests.jsonl` and `agents/<worker>.json` (its epoch).
For every gap of at least `--min-ms` between two pieces of work on a device inside the
measured iterations it prints the device, the pieces on each side, the gap, and how many
requests of that device's agent had arrived before the gap and started only after it (a
device idle with requests queued is the agent's delay, not an empty queue). Used to find
why bubbles stayed idle (issue 30; results/bubbletea-ten-runs/README.md).
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from testbed_core.device_records import WorkRecord, idle_gaps  # noqa: E402


def gaps(folder: Path, min_s: float, warmup: int) -> list[tuple[str, str, str, float, int]]:
    it = json.loads((folder / "iterations.json").read_text())
    windows = list(zip(it["starts"], it["ends"], strict=True))[warmup:]
    t0, t1 = windows[0][0], windows[-1][1]
    by_device: dict[str, list[WorkRecord]] = defaultdict(list)
    with open(folder / "timeline.csv", newline="") as f:
        for r in csv.DictReader(f):
            by_device[r["device"]].append(WorkRecord(r["device"], r["kind"], r["owner"], r["label"], float(r["requested"]),
                                                     float(r["start"]), float(r["end"]), r["mode"]))
    out = []
    for device, recs in sorted(by_device.items()):
        worker = device.rsplit("-", 1)[-1]
        epoch = float(json.loads((folder / "agents" / f"{worker}.json").read_text())["epoch"])
        requests = [json.loads(line) for line in
                    (folder / "agents" / f"{worker}.requests.jsonl").read_text().splitlines() if line.strip()]
        for g0, g1 in idle_gaps(recs, t0, t1, min_s):  # the device's own busy-time union (device_records.py)
            before = max((r for r in recs if r.end <= g0), key=lambda r: r.end, default=None)
            after = min((r for r in recs if r.start >= g1), key=lambda r: r.start, default=None)
            if before is None or after is None or before.end < t0 or after.start > t1:
                continue  # a stretch cut by the measured window's edge, not a gap between two pieces
            queued = sum(1 for r in requests if r["arrival"] + epoch < g0 and r.get("start") is not None
                         and r["start"] + epoch > g1)
            out.append((device, before.label, after.label, g1 - g0, queued))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("folder", type=Path, help="a +bubbletea variant's folder of a testbed run")
    ap.add_argument("--min-ms", type=float, default=80.0)
    ap.add_argument("--warmup", type=int, default=None, help="warm-up iterations (default: the run's summary, else 3)")
    a = ap.parse_args()
    warmup = a.warmup
    if warmup is None:
        summary = a.folder.parent / "summary.json"
        warmup = json.loads(summary.read_text())["warmup"] if summary.exists() else 3
    found = gaps(a.folder, a.min_ms / 1000, warmup)
    for device, before, after, gap, queued in found:
        print(f"{device}  {before} -> {after}  idle {gap * 1000:.0f} ms  requests queued on its agent: {queued}")
    print(f"{len(found)} gaps of at least {a.min_ms:g} ms, {sum(g[3] for g in found):.2f} s in all")


if __name__ == "__main__":
    main()
