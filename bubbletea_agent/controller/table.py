"""The prefill service's comparison table (docs/results/bubbletea.md), from a run's summary.json:

    python -m bubbletea_agent.controller.table results/<run>/summary.json

One Markdown row per +bubbletea variant (its dispatch mode): requests served of those that
arrived (and their share: the variants' arrival windows differ a little with their iteration
times), the mean prompt length of those served (a dispatch that serves short prompts first
serves more of them), rejected by reason, TTFT p50/p99 (seconds), training slowdown against
the plain twin, training's wait on prefill, and whether every request was accounted for.
From the run's request records beside summary.json: the requests served within their
deadline (TTFT at most the scenario's `bubbletea.requests.deadline`) per second of the
arrival window (first to last arrival: the offered load's span), and how many of the
refused were refused at arrival (`deadline_unreachable`, `too_long`, `queue_full`,
`unknown_decode_host`, `no_device`) rather than later (`deadline_passed`: left to expire in
a queue) or by the run's end (`no_slots`, `run_ended`, `agent_lost`).
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

AT_ARRIVAL = frozenset({"deadline_unreachable", "too_long", "queue_full", "unknown_decode_host", "no_device"})
AT_RUN_END = frozenset({"no_slots", "run_ended", "agent_lost"})


@dataclass(frozen=True)
class WithinDeadline:
    """One variant's requests as its records tell them (controller/requests.jsonl where a
    controller ran, else the agents' agents/*.requests.jsonl)."""

    arrived: int
    served: int
    served_within: int  # TTFT <= deadline
    window_s: float  # first to last arrival
    refused_at_arrival: int
    refused_later: int  # expired in a queue (deadline_passed) or another reason after arrival
    ended_with_run: int  # still queued when training ended

    @property
    def within_per_s(self) -> float:
        return self.served_within / self.window_s if self.window_s > 0 else 0.0


def _records(folder: Path) -> list[dict[str, Any]]:
    files = [folder / "controller" / "requests.jsonl"]
    if not files[0].exists():
        files = sorted((folder / "agents").glob("*.requests.jsonl"))
    rows = []
    for path in files:
        for line in path.read_text().splitlines():
            if line.strip():
                rows.append(json.loads(line))
    return rows


def deadline_of(run: Path) -> float | None:
    """The scenario's request deadline (scenario.resolved.yaml), or None."""
    try:
        doc = yaml.safe_load((run / "scenario.resolved.yaml").read_text())
        return float(doc["bubbletea"]["requests"]["deadline"])
    except (OSError, KeyError, TypeError, ValueError, yaml.YAMLError):
        return None


def within_deadline(folder: Path, deadline_s: float) -> WithinDeadline:
    """Count one variant's requests served within `deadline_s`, and where the refused were refused."""
    rows = _records(folder)
    arrivals = [float(r["arrival"]) for r in rows]
    served = [r for r in rows if r.get("status") == "served"]
    refused = [r for r in rows if r.get("status") == "rejected"]
    # a controller's record of a refusal its agent made (after dispatch) says "at <device>: ..."
    at_arrival = sum(r.get("reason") in AT_ARRIVAL and not (r.get("device") and str(r.get("detail") or "")
                                                            .startswith(f"at {r['device']}:")) for r in refused)
    at_end = sum(r.get("reason") in AT_RUN_END for r in refused)
    return WithinDeadline(
        arrived=len(rows), served=len(served),
        served_within=sum(r.get("ttft") is not None and r["ttft"] <= deadline_s for r in served),
        window_s=max(arrivals) - min(arrivals) if arrivals else 0.0,
        refused_at_arrival=at_arrival, refused_later=len(refused) - at_arrival - at_end, ended_with_run=at_end)


def within_table(run: Path, summary: dict[str, Any]) -> str:
    """Per +bubbletea variant: served within the deadline per second, and where refusals happened."""
    deadline = deadline_of(run)
    if deadline is None:
        return f"{run}: no bubbletea.requests.deadline in scenario.resolved.yaml: nothing to count within"
    rows = [f"| variant | served within {deadline:g} s / served / arrived | arrival window | "
            "served within deadline per s | refused at arrival | refused later | ended with the run |",
            "|---|---|---|---|---|---|---|"]
    for name, v in summary.get("variants", {}).items():
        if not v.get("prefill_service") or not (run / name).is_dir():
            continue
        w = within_deadline(run / name, deadline)
        rows.append(f"| {name} | {w.served_within} / {w.served} / {w.arrived} | {w.window_s:.1f} s | "
                    f"{w.within_per_s:.1f} | {w.refused_at_arrival} | {w.refused_later} | {w.ended_with_run} |")
    return "\n".join(rows)


def _f(x: Any, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


def table(summary: dict[str, Any]) -> str:
    rows = ["| variant | dispatch | served / arrived | tokens per served | rejected by reason | TTFT p50 | "
            "TTFT p99 | training slowdown | training waited on prefill | accounted |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    for name, v in summary.get("variants", {}).items():
        svc = v.get("prefill_service")
        if not svc:
            continue
        reasons = ", ".join(f"{k} {n}" for k, n in sorted(svc.get("rejected_by_reason", {}).items())) or "-"
        share = f" ({svc['served'] / svc['arrived']:.0%})" if svc.get("arrived") else ""
        tokens = v.get("prefill_tokens_served")
        per = tokens / svc["served"] if tokens is not None and svc.get("served") else None
        rows.append(
            f"| {name} | {svc['dispatch']} | {svc['served']} / {svc['arrived']}{share} | {_f(per, '.0f')} | {reasons} | "
            f"{_f(svc.get('ttft_p50_s'), '.3f')} s | {_f(svc.get('ttft_p99_s'), '.3f')} s | "
            f"{_f(v.get('training_slowdown'), '+.1%')} | {_f(v.get('training_wait_on_prefill_s'), '.3f')} s | "
            f"{'yes' if svc.get('accounted') else 'NO'} |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m bubbletea_agent.controller.table <run>/summary.json", file=sys.stderr)
        return 2
    path = Path(args[0])
    try:
        summary = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        print(f"{path}: cannot read the run's summary ({exc})", file=sys.stderr)
        return 1
    print(table(summary))
    print()
    print(within_table(path.parent, summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
