"""Where a run's pipeline time goes between devices: every hand-off of a tensor from
the stage that made it to the stage that needs it, split in three, and the chain of
hand-offs and compute that set the iteration's end.

Issue 40 asked why `atlas-search-3dc`'s atlas row runs a few percent over its
prediction, and whether LAN transfers slowed by WAN traffic are the cause. The
transfer records alone cannot say: a record's ``arrived`` is when the receiver's
``recv`` completed (testbed/training/transport_comm.py), and a receiver that posts its
``recv`` late (busy with other micro-batches) shows a late arrival that the wire did
not cause. So a hand-off is counted only where its receiver was idle, waiting for it
(its previous piece of work ended before the sender's did), and is split into:

* ``posting_s``: the sender's compute end to the tensor handed to the transport;
* ``wire_s``: handed over to arrived at the receiver (the path's one-way delay included);
* ``wake_s``: arrived to the receiver's next compute starting.

`critical_path` walks back from the iteration's last piece of work: each compute
waited either for the device's previous work or for its input tensor, whichever came
later, so the walk names the hand-offs (LAN or WAN) that were on the path that set
the iteration's time. Pure functions over the run folder's own files (timeline.csv,
transfers.csv, iterations.json, written by testbed/run/runner.py); no emulation.

    .venv/bin/python -m testbed.run.handoffs results/prediction-errors/at-8e3216c/runs/atlas-search-3dc atlas
"""

from __future__ import annotations

import argparse
import csv
import json
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from statistics import median

LABEL = re.compile(r"([FB])(\d+)@s(\d+)$")
OWNER = re.compile(r"train:p(\d+)r\d+$")


class HandoffError(ValueError):
    """A run folder that lacks what the hand-off analysis reads."""


@dataclass(frozen=True)
class Op:
    """One piece of training work on a device (wall-clock seconds)."""

    pipeline: int
    stage: int
    kind: str  # "F" or "B"
    mb: int
    device: str
    start: float
    end: float
    modelled_s: float


@dataclass(frozen=True)
class Transfer:
    """One boundary tensor as transfers.csv keeps it (wall-clock seconds)."""

    iteration: int
    pipeline: int
    boundary: int
    mb: int
    direction: str  # "fwd" or "bwd"
    wan: bool  # crossed a WAN link (its ``links`` column is not empty)
    sent: float
    arrived: float  # the receiver's recv completed: late where the receiver posted it late
    landed: float  # the last byte at the receiver: `arrived`, or earlier by its DONE back less the one-way delay
    latency_s: float = 0.0  # the path's one-way delay

    def sender(self) -> tuple[int, int, str, int]:
        """(pipeline, stage, kind, mb) of the work that made the tensor."""
        return ((self.pipeline, self.boundary, "F", self.mb) if self.direction == "fwd"
                else (self.pipeline, self.boundary + 1, "B", self.mb))

    def receiver(self) -> tuple[int, int, str, int]:
        """(pipeline, stage, kind, mb) of the work that needs it."""
        return ((self.pipeline, self.boundary + 1, "F", self.mb) if self.direction == "fwd"
                else (self.pipeline, self.boundary, "B", self.mb))


@dataclass(frozen=True)
class Handoff:
    """A tensor its receiver waited for, in three parts (seconds)."""

    transfer: Transfer
    posting_s: float
    wire_s: float
    wake_s: float

    @property
    def total_s(self) -> float:
        return self.posting_s + self.wire_s + self.wake_s


@dataclass(frozen=True)
class RunRecords:
    """One variant's records, ops grouped by iteration (from the common starts)."""

    ops: dict[int, dict[tuple[int, int, str, int], Op]]  # iteration -> (pipeline, stage, kind, mb) -> op
    transfers: list[Transfer]
    starts: list[float]
    warmup: int
    ends: list[float] | None = None  # each iteration's end (its DP all-reduce included)
    predicted_allreduce_s: float | None = None  # what the run's prediction added after the pipeline

    def after_pipeline_s(self) -> dict[int, float]:
        """Per measured iteration, its end past the last pipeline work (with dp > 1: the
        DP all-reduce's tail, which the prediction adds as `predicted_allreduce_s`)."""
        if not self.ends:
            return {}
        return {it: self.ends[it] - max(o.end for o in ops.values())
                for it, ops in sorted(self.ops.items()) if it >= self.warmup and it < len(self.ends) and ops}


def _read_csv(path: Path) -> list[dict[str, str]]:
    if not path.is_file():
        raise HandoffError(f"{path}: missing; give the folder of a `testbed run` (it holds one folder per variant "
                           "with timeline.csv, transfers.csv and iterations.json)")
    with path.open() as f:
        return list(csv.DictReader(f))


def load_run(folder: Path, variant: str) -> RunRecords:
    """The records of `variant` in the run folder `folder`."""
    where = folder / variant
    if not folder.is_dir():
        raise HandoffError(f"{folder}: no such folder; give the folder of a `testbed run` (its -o)")
    if not where.is_dir():
        ran = sorted(p.name for p in folder.iterdir() if (p / "timeline.csv").is_file()) if folder.is_dir() else []
        raise HandoffError(f"{folder}: no variant '{variant}' (variants with records here: {', '.join(ran) or 'none'})")
    iters_file = where / "iterations.json"
    if not iters_file.is_file():
        raise HandoffError(f"{iters_file}: missing; the variant did not finish its iterations")
    try:
        iters = json.loads(iters_file.read_text())
        starts = [float(s) for s in iters["starts"]]
        warmup, ends = int(iters.get("warmup", 0)), [float(e) for e in iters.get("ends") or []]
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise HandoffError(f"{iters_file}: not a run's iterations record ({type(e).__name__}: {e}); it needs "
                           "'starts', each iteration's start in seconds: run the variant again") from None
    ops: dict[int, dict[tuple[int, int, str, int], Op]] = {}
    for row in _read_csv(where / "timeline.csv"):
        label, owner = LABEL.match(row.get("label", "")), OWNER.match(row.get("owner", ""))
        if label is None or owner is None:
            continue  # not pipeline work (prefill, optimizer)
        start = float(row["start"])
        it = sum(1 for s in starts if s <= start) - 1
        if it < 0:
            continue
        op = Op(int(owner.group(1)), int(label.group(3)), label.group(1), int(label.group(2)), row["device"], start,
                float(row["end"]), float(row.get("modelled_s") or 0.0))
        ops.setdefault(it, {})[(op.pipeline, op.stage, op.kind, op.mb)] = op
    transfers = [Transfer(int(r["iteration"]), int(r["pipeline"]), int(r["boundary"]), int(r["mb"]), r["direction"],
                          bool(r["links"]), float(r["sent"]), float(r["arrived"]), _landed(r),
                          float(r.get("latency_s") or 0.0))
                 for r in _read_csv(where / "transfers.csv") if r.get("sent") and r.get("arrived")]
    pred_file = where / "prediction.json"
    predicted = json.loads(pred_file.read_text()).get("allreduce_s") if pred_file.is_file() else None
    return RunRecords(ops, transfers, starts, warmup, ends, predicted)


def _landed(row: dict[str, str]) -> float:
    """When a tensor's last byte reached its receiver: the receiver's DONE came back
    (``confirmed``) a one-way delay after it, unless its recv completed earlier."""
    arrived = float(row["arrived"])
    if not row.get("confirmed"):
        return arrived
    return min(arrived, float(row["confirmed"]) - float(row.get("latency_s") or 0.0))


def _previous(ops: dict[tuple[int, int, str, int], Op], op: Op) -> Op | None:
    """The work the same device did just before `op`, in the same iteration."""
    before = [o for o in ops.values() if o.device == op.device and o.end <= op.start + 1e-9 and o is not op]
    return max(before, key=lambda o: o.end, default=None)


def handoffs(rec: RunRecords) -> list[Handoff]:
    """Every hand-off of the measured iterations whose receiver was idle waiting for it."""
    out = []
    for t in rec.transfers:
        ops = rec.ops.get(t.iteration, {})
        if t.iteration < rec.warmup or t.sender() not in ops or t.receiver() not in ops:
            continue
        src, dst = ops[t.sender()], ops[t.receiver()]
        before = _previous(ops, dst)
        if before is not None and before.end > src.end:
            continue  # the receiver was busy: its late start is not the hand-off's
        out.append(Handoff(t, t.sent - src.end, t.arrived - t.sent, dst.start - t.arrived))
    return out


def critical_path(rec: RunRecords, iteration: int) -> list[tuple[Op | Transfer, str]]:
    """The chain that set `iteration`'s end, last first. Each compute waited for the
    device's previous work ("device") or for its input tensor ("LAN", "WAN"),
    whichever came later; each tensor for its sender's compute or, where the tensor
    before it on the same channel was still on the wire when it was handed over, for
    that one ("queued"); the first work of the iteration waited for its "start"."""
    ops = rec.ops.get(iteration)
    if not ops:
        raise HandoffError(f"iteration {iteration} has no pipeline work in the records "
                           f"(iterations {sorted(rec.ops) or 'none'})")
    mine = [t for t in rec.transfers if t.iteration == iteration]
    inputs = {t.receiver(): t for t in mine}
    ahead: dict[Transfer, Transfer] = {}  # a tensor -> the one before it on its channel
    channels: dict[tuple[int, int, str], list[Transfer]] = {}
    for t in mine:
        channels.setdefault((t.pipeline, t.boundary, t.direction), []).append(t)
    for queue in channels.values():
        queue.sort(key=lambda t: t.sent)
        ahead.update(zip(queue[1:], queue, strict=False))
    node: Op | Transfer | None = max(ops.values(), key=lambda o: o.end)
    chain: list[tuple[Op | Transfer, str]] = []
    seen: set[int] = set()  # two zero-length ops on one device may each come before the other
    while node is not None and id(node) not in seen:
        seen.add(id(node))
        if isinstance(node, Transfer):
            before_t = ahead.get(node)
            if before_t is not None and before_t.landed - before_t.latency_s > node.sent:
                chain.append((node, "queued"))
                node = before_t
            else:
                chain.append((node, "sender"))
                node = ops.get(node.sender())
            continue
        before = _previous(ops, node)
        t = inputs.get((node.pipeline, node.stage, node.kind, node.mb))
        if t is not None and t.sender() in ops and (before is None or t.landed >= before.end):
            chain.append((node, "WAN" if t.wan else "LAN"))
            node = t
        elif before is not None:
            chain.append((node, "device"))
            node = before
        else:
            chain.append((node, "start"))
            node = None
    return chain


def _stats(values: Sequence[float]) -> str:
    if not values:
        return "none"
    return f"median {median(values) * 1e3:.2f} ms (min {min(values) * 1e3:.2f}, max {max(values) * 1e3:.2f}, n {len(values)})"


def report(rec: RunRecords) -> str:
    """The hand-offs by kind and part, the compute overruns, and each measured
    iteration's critical path as counts of what it waited for."""
    lines = []
    hs = handoffs(rec)
    for wan in (False, True):
        group = [h for h in hs if h.transfer.wan == wan]
        name = "WAN" if wan else "LAN"
        lines.append(f"{name} hand-offs to an idle receiver: {len(group)}")
        for part in ("posting_s", "wire_s", "wake_s", "total_s"):
            lines.append(f"  {part:10s} {_stats([getattr(h, part) for h in group])}")
    measured = [op for it, ops in rec.ops.items() if it >= rec.warmup for op in ops.values()]
    over = [op.end - op.start - op.modelled_s for op in measured if op.modelled_s > 0]
    lines.append(f"compute beyond its modelled time: {_stats(over)}")
    after = rec.after_pipeline_s()
    if after and max(after.values()) > 1e-3:
        lines.append("after the last pipeline work (the DP all-reduce's tail): "
                     + ", ".join(f"{v * 1e3:.0f}" for v in after.values()) + " ms"
                     + ("" if rec.predicted_allreduce_s is None else
                        f" (predicted {rec.predicted_allreduce_s * 1e3:.0f} ms)"))
    for it in sorted(i for i in rec.ops if i >= rec.warmup):
        chain = critical_path(rec, it)
        counts = {k: sum(1 for _, w in chain if w == k) for k in ("WAN", "LAN", "device", "queued")}
        work = sum(1 for n, _ in chain if isinstance(n, Op))
        lines.append(f"iteration {it}: critical path of {work} pieces of work: waited {counts['WAN']} times on a WAN "
                     f"and {counts['LAN']} on a LAN hand-off, {counts['device']} on the device's previous work, "
                     f"{counts['queued']} tensor(s) queued behind another on their channel")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", type=Path, help="a `testbed run` folder")
    parser.add_argument("variants", nargs="+", help="variant folders in it")
    args = parser.parse_args(argv)
    try:
        for v in args.variants:
            print(f"== {args.run} {v}\n{report(load_run(args.run, v))}")
    except HandoffError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
