#!/usr/bin/env python3
"""A Gantt chart of BubbleTea filling the bubbles, drawn from a kept run's own records.

    .venv/bin/python scripts/bubbletea_gantt.py                 # docs/bubbletea-gantt.png from the kept record
    .venv/bin/python scripts/bubbletea_gantt.py --record DIR_OR_TAR --iterations 2 --out FILE.png

Reads a `+bubbletea` variant's `timeline.csv` (every piece of work on every device:
training's forward and backward, the agents' prefill holds) and `iterations.json` (the
iterations' common starts and ends), from a folder or from a kept `.tar.gz` of them (by
default `results/bubbletea-ten-runs/before-rt-budget/run-2/timeline-and-requests.tar.gz`,
the one run whose timeline is kept), picks the measured iterations whose devices sat idle
least, and draws them with the runner's own chart (testbed/run/gantt.py): one row per
device, training in blue and orange, prefill in green, idle time pale red. No run, no root.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import sys
import tarfile
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from testbed.run.gantt import gantt_png  # noqa: E402
from testbed_core.device_records import WorkRecord, idle_gaps  # noqa: E402

KEPT = REPO / "results/bubbletea-ten-runs/before-rt-budget/run-2/timeline-and-requests.tar.gz"
WARMUP = 3  # the scenario's warm-up iterations (its summary.json's `warmup`)


def read_record(source: Path) -> tuple[str, dict]:
    """The timeline CSV's text and iterations.json, from a folder or a .tar.gz of them."""
    if source.is_dir():
        return (source / "timeline.csv").read_text(), json.loads((source / "iterations.json").read_text())
    with tarfile.open(source) as tar:
        def text(name: str) -> str:
            member = tar.extractfile(name)
            if member is None:
                raise SystemExit(f"{source}: no {name} in it")
            return member.read().decode()
        return text("timeline.csv"), json.loads(text("iterations.json"))


def timelines(csv_text: str) -> dict[str, list[WorkRecord]]:
    out: dict[str, list[WorkRecord]] = defaultdict(list)
    for r in csv.DictReader(io.StringIO(csv_text)):
        out[r["device"]].append(WorkRecord(
            r["device"], r["kind"], r["owner"], r["label"], float(r["requested"]), float(r["start"]), float(r["end"]),
            r["mode"], revoked_at=float(r["revoked_at"]) if r.get("revoked_at") else None))
    return dict(out)


def idle_s(lines: dict[str, list[WorkRecord]], t0: float, t1: float) -> float:
    """Idle seconds summed over devices inside [t0, t1] (gaps of any length)."""
    return sum(g1 - g0 for recs in lines.values() for g0, g1 in idle_gaps(recs, t0, t1, 0.0))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--record", type=Path, default=KEPT, help="a +bubbletea variant's folder or a .tar.gz of it")
    ap.add_argument("--iterations", type=int, default=2, help="consecutive measured iterations to draw")
    ap.add_argument("--warmup", type=int, default=WARMUP)
    ap.add_argument("--out", type=Path, default=REPO / "docs" / "bubbletea-gantt.png")
    a = ap.parse_args(argv)
    text, its = read_record(a.record)
    lines = timelines(text)
    starts, ends = its["starts"], its["ends"]
    n = max(1, a.iterations)
    candidates = range(a.warmup, len(starts) - n + 1)
    if not candidates:
        raise SystemExit(f"{a.record}: fewer than {n} measured iterations after {a.warmup} warm-ups")
    best = min(candidates, key=lambda i: idle_s(lines, starts[i], ends[i + n - 1]))
    picked_starts, picked_ends = starts[best:best + n], ends[best:best + n]
    busy = 1 - idle_s(lines, picked_starts[0], picked_ends[-1]) / (len(lines) * (picked_ends[-1] - picked_starts[0]))
    gantt_png(lines, [], picked_starts, picked_ends, 0, a.out,
              title=f"atlas+bubbletea on 2 DCs: {n} consecutive measured iterations of a kept run (its least idle), "
                    f"devices busy {busy:.0%}: training blue/orange, prefill green, idle pale red")
    print(f"wrote {a.out} (iterations {best}-{best + n - 1}, devices busy {busy:.1%})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
