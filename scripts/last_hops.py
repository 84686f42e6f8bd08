"""The last micro-batch's way back to stage 0 in a kept run, hop by hop.

For each variant of a run folder, per measured iteration and pipeline: the backward
chain of the last micro-batch from the top stage down to stage 0 - each boundary's
gradient transfer (from the backward's end to its send: the temporal plan's slot or the
channel's queue; on the wire; handed to the next stage's compute) and each
stage's backward (requested, started, ended, against its modelled time) - and how many
DP rings were running meanwhile (stages whose last backward had ended, both replicas'
rings counted once per stage). The model takes a LAN hop, a hand-over and a modelled
backward as the same whatever else the machine does; on 2 cores the rings of stages
that finished early share them with the pipeline's last hops, and this shows by how
much each hop grew.

    .venv/bin/python scripts/last_hops.py results/window-caps/at-1b203306/held-triangle --variant atlas

Reads only the run folder (summary.json, each variant's iterations.json, timeline.csv
and transfers.csv).
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from testbed.run.jobs import device_parts  # noqa: E402
from testbed_core.schedules import Op  # noqa: E402


@dataclass(frozen=True)
class Hop:
    """One step of the chain: a backward (its run time and modelled time), the wait from
    it to its gradient's send, the gradient on the wire (arrived - sent) or its hand-over
    to the next stage's backward (that backward's request - arrived)."""

    kind: str  # "backward", "wait", "wire" or "hand-over"
    what: str
    at_ms: float  # when it began, after the iteration's start
    took_ms: float
    modelled_ms: float | None  # a backward's modelled time (None: a real device's, or not a backward)
    rings: int  # stages whose rings had started when it began


def _stage(device: str) -> tuple[int, int]:
    """(pipeline, stage) of a worker's device (testbed/run/jobs.py `device_name`)."""
    _host, pipeline, stage = device_parts(device)
    return pipeline, stage


def chain(timeline: list[dict[str, str]], transfers: list[dict[str, str]], start: float, end: float,
          pipeline: int) -> list[Hop]:
    """The last micro-batch's backward chain of `pipeline` in the iteration [start, end)."""
    rows = [r for r in timeline if start <= float(r["start"]) < end]
    backward = {(_stage(r["device"]), r["label"]): r for r in rows if r["kind"] == "backward"}
    stages = sorted({s for (p, s), _ in backward if p == pipeline})
    if not stages:
        return []
    last_mb = max(Op.parse_compute(label).mb for (p, _s), label in backward if p == pipeline)
    stage_end: dict[int, float] = {}  # a stage's ring starts when its last replica's last backward ends
    for ((_p, s), _label), r in backward.items():
        stage_end[s] = max(stage_end.get(s, 0.0), float(r["end"]))

    def rings_at(t: float) -> int:
        return sum(1 for e in stage_end.values() if e <= t)

    hops: list[Hop] = []
    for s in reversed(stages):
        if s != stages[-1]:
            moved = [r for r in transfers if r["direction"] == "bwd" and int(r["pipeline"]) == pipeline
                     and int(r["boundary"]) == s and int(r["mb"]) == last_mb and start <= float(r["sent"]) < end]
            if moved:
                t = moved[0]
                sent, arrived = float(t["sent"]), float(t["arrived"])
                where = t["links"] or "LAN"
                if hops and hops[-1].kind == "backward":  # from the backward's end to the send
                    ended = hops[-1].at_ms + hops[-1].took_ms
                    hops.append(Hop("wait", "until sent (plan, channel)", ended, (sent - start) * 1e3 - ended, None,
                                    rings_at(start + ended / 1e3)))
                hops.append(Hop("wire", f"grad s{s + 1}->s{s} ({where})", (sent - start) * 1e3,
                                (arrived - sent) * 1e3, None, rings_at(sent)))
        row = backward.get(((pipeline, s), f"B{last_mb}@s{s}"))
        if row is None:
            continue
        if hops and hops[-1].kind == "wire":
            arrived = start + (hops[-1].at_ms + hops[-1].took_ms) / 1e3
            hops.append(Hop("hand-over", f"hand-over to B{last_mb}@s{s}", (arrived - start) * 1e3,
                            (float(row["requested"]) - arrived) * 1e3, None, rings_at(arrived)))
        modelled = float(row["modelled_s"]) * 1e3 if row.get("modelled_s") else None
        hops.append(Hop("backward", f"B{last_mb}@s{s}", (float(row["start"]) - start) * 1e3,
                        (float(row["end"]) - float(row["start"])) * 1e3, modelled, rings_at(float(row["start"]))))
    return hops


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", type=Path, help="a run folder (with summary.json)")
    ap.add_argument("--variant", action="append", help="only these variants (default: every one)")
    args = ap.parse_args()
    summary = json.loads((args.run / "summary.json").read_text())
    for name in args.variant or list(summary["variants"]):
        folder = args.run / name
        iterations = json.loads((folder / "iterations.json").read_text())
        with (folder / "timeline.csv").open() as f:
            timeline = list(csv.DictReader(f))
        with (folder / "transfers.csv").open() as f:
            transfers = list(csv.DictReader(f))
        pipelines = sorted({_stage(r["device"])[0] for r in timeline})
        print(f"== {name}")
        for i in range(iterations["warmup"], len(iterations["starts"])):
            start, end = iterations["starts"][i], iterations["ends"][i]
            for p in pipelines:
                hops = chain(timeline, transfers, start, end, p)
                if not hops:
                    continue
                print(f"  iteration {i} pipeline {p}: last backward ends at {hops[-1].at_ms + hops[-1].took_ms:.1f} ms")
                for h in hops:
                    model = f" (modelled {h.modelled_ms:.1f})" if h.modelled_ms is not None else ""
                    print(f"    {h.what:<34} at {h.at_ms:7.1f} ms took {h.took_ms:6.1f} ms{model}, "
                          f"rings running: {h.rings}")


if __name__ == "__main__":
    main()
