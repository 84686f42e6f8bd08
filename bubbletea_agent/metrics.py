"""BubbleTea metrics from request records and device timelines.

Inputs are plain: request rows as the agent writes them (`requests.jsonl`) and work
records with `kind`, `start`, `end` and `requested` (testbed_core.device_records.WorkRecord). Work of
kind "prefill" is BubbleTea's; everything else on the device is training.

A guard violation is a prefill that training had to wait for: a training piece asked
for the device while the prefill held it (its `requested` fell inside the prefill and it
started only when the prefill ended). That is "a prefill overran its slot" measured where
it matters, on the device, not against a prediction.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from testbed_core.intervals import covered

PREFILL_KINDS = frozenset({"prefill"})
EPS = 1e-4  # seconds: "started when the prefill ended" tolerance (lock hand-over)


class WorkLike(Protocol):
    kind: str
    start: float
    end: float
    requested: float


def is_prefill(rec: WorkLike) -> bool:
    return rec.kind in PREFILL_KINDS


def busy_seconds(records: Iterable[WorkLike], t0: float, t1: float) -> float:
    return covered((max(r.start, t0), min(r.end, t1)) for r in records)


def utilization(records: Iterable[WorkLike], t0: float, t1: float) -> float:
    """Busy fraction of [t0, t1]."""
    if t1 <= t0:
        raise ValueError(f"utilization window is empty: t0={t0} >= t1={t1}")
    return busy_seconds(records, t0, t1) / (t1 - t0)


def percentiles(values: Iterable[float], qs: Sequence[int] = (50, 95, 99)) -> dict[str, float | None]:
    vals = [v for v in values if v is not None and math.isfinite(v)]
    if not vals:
        return {f"p{q}": None for q in qs}
    arr = np.asarray(vals, dtype=float)
    return {f"p{q}": float(np.percentile(arr, q)) for q in qs}


def _waited_for(p: WorkLike, t: WorkLike) -> float | None:
    """How long training piece `t` waited for prefill `p`, or None if it did not: it asked
    while `p` held the device and started when `p` ended, or earlier by revoking its
    lease (testbed_runtime/device.py: then it started without the prefill's lock)."""
    if not p.start - EPS <= t.requested < p.end - EPS:
        return None
    if t.start >= p.end - EPS:
        return p.end - t.requested
    if getattr(t, "revoked_lease", ""):
        return max(0.0, t.start - t.requested)
    return None


def training_waits(records: Sequence[WorkLike]) -> list[tuple[WorkLike, WorkLike, float]]:
    """(prefill, the training piece that waited longest for it, seconds) per prefill that
    made training wait, in the prefills' order."""
    prefills = sorted((r for r in records if is_prefill(r)), key=lambda r: r.end)
    training = [r for r in records if not is_prefill(r)]
    out = []
    for p in prefills:
        waits = [(w, t) for t in training if (w := _waited_for(p, t)) is not None]
        if waits:
            w, t = max(waits, key=lambda x: x[0])
            out.append((p, t, w))
    return out


def guard_violations(records: Sequence[WorkLike]) -> tuple[int, float]:
    """(prefills that made training wait, total seconds training waited for them)."""
    waits = training_waits(records)
    return len(waits), sum(w for _, _, w in waits)


def training_slowdown(iteration_with_s: float | None, iteration_without_s: float | None) -> float | None:
    """Relative growth of the iteration time with BubbleTea (0.01 = 1% slower)."""
    if not iteration_with_s or not iteration_without_s:
        return None
    return iteration_with_s / iteration_without_s - 1.0


def request_summary(rows: Iterable[dict[str, Any]]) -> dict[str, Any]:
    rows = list(rows)
    served = [r for r in rows if r.get("status") == "served"]
    reasons = Counter(r.get("reason") or "unknown" for r in rows if r.get("status") == "rejected")
    open_ = [r for r in rows if r.get("status") not in ("served", "rejected")]
    ttfts = [r["ttft"] for r in served if r.get("ttft") is not None]
    ttft = {f"ttft_{k}_s": v for k, v in percentiles(ttfts).items()}
    errors = [r["actual_s"] / r["predicted_s"] - 1 for r in served
              if r.get("predicted_s") and r.get("actual_s")]
    return {
        "prefill_requests": {
            "arrived": len(rows),
            "served": len(served),
            "rejected": sum(reasons.values()),
            "rejected_by_reason": dict(sorted(reasons.items())),
            "unaccounted": len(open_),
        },
        **ttft,
        "ttft_mean_s": float(np.mean(ttfts)) if ttfts else None,
        "prefill_tokens_served": int(sum(r.get("prompt_tokens", 0) for r in served)),
        "prediction_error_p50": percentiles(errors, (50,))["p50"],
        "prediction_error_p99": percentiles(errors, (99,))["p99"],
    }


def device_summary(records: Sequence[WorkLike], t0: float, t1: float) -> dict[str, Any]:
    training = [r for r in records if not is_prefill(r)]
    prefill = [r for r in records if is_prefill(r)]
    violations, waited = guard_violations(records)
    return {
        "device_utilization_training": utilization(training, t0, t1),
        "device_utilization": utilization(records, t0, t1),
        "prefill_busy_s": busy_seconds(prefill, t0, t1),
        "guard_violations": violations,
        "training_wait_on_prefill_s": waited,
    }


def summarize(rows: Iterable[dict[str, Any]], records: Sequence[WorkLike], t0: float, t1: float) -> dict[str, Any]:
    """Request and device metrics of one device (or pass the records of several)."""
    return {**device_summary(records, t0, t1), **request_summary(rows)}


def read_request_rows(path: str | Path) -> list[dict[str, Any]]:
    """Rows of an agent's requests.jsonl (a missing file: no requests)."""
    path = Path(path)
    if not path.exists():
        return []
    rows = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{n}: not a JSON request record ({exc.msg})") from None
    return rows
