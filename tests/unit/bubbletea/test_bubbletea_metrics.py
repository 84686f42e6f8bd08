"""BubbleTea metrics: utilization with and without prefill, TTFT percentiles, guard
violations measured on the device timeline, slowdown."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from bubbletea_agent.metrics import (
    busy_seconds,
    guard_violations,
    percentiles,
    read_request_rows,
    request_summary,
    summarize,
    training_slowdown,
    utilization,
)


@dataclass
class W:
    kind: str
    start: float
    end: float
    requested: float | None = None

    def __post_init__(self) -> None:
        if self.requested is None:
            self.requested = self.start


def test_utilization_merges_overlaps_and_clips_to_the_window():
    recs = [W("forward", 0, 4), W("backward", 3, 5), W("prefill", 6, 7), W("forward", 9, 12)]
    assert busy_seconds(recs, 0, 10) == 5 + 1 + 1
    assert utilization(recs, 0, 10) == pytest.approx(0.7)
    with pytest.raises(ValueError, match="window is empty"):
        utilization(recs, 5, 5)


def test_percentiles():
    p = percentiles(range(1, 101))
    assert p["p50"] == pytest.approx(50.5) and p["p95"] == pytest.approx(95.05) and p["p99"] == pytest.approx(99.01)
    assert percentiles([]) == {"p50": None, "p95": None, "p99": None}
    assert percentiles([None, float("nan"), 2.0])["p50"] == 2.0


def test_guard_violations_are_training_waits_on_prefill():
    recs = [
        W("forward", 0.0, 1.0),
        W("prefill", 1.0, 1.5),
        W("forward", 1.5, 2.0, requested=1.5),  # asked right as the prefill ended: no wait
        W("prefill", 2.0, 2.6),
        W("forward", 2.6, 3.0, requested=2.5),  # asked at 2.5, got it at 2.6: a violation
        W("prefill", 3.0, 3.2),
        W("backward", 3.5, 4.0, requested=3.5),  # asked after the prefill: fine
        W("forward", 4.0, 4.5, requested=3.9),  # waited, but for other training work, not a prefill
    ]
    n, waited = guard_violations(recs)
    assert n == 1 and waited == pytest.approx(0.1)
    s = summarize([], recs, 0.0, 5.0)
    assert s["guard_violations"] == 1
    assert s["device_utilization_training"] == pytest.approx(2.9 / 5)
    assert s["device_utilization"] == pytest.approx(4.2 / 5)
    assert s["prefill_busy_s"] == pytest.approx(1.3)


def test_request_summary_and_slowdown():
    rows = [
        {"id": "a", "status": "served", "ttft": 0.1, "prompt_tokens": 100, "predicted_s": 0.01, "actual_s": 0.011},
        {"id": "b", "status": "served", "ttft": 0.3, "prompt_tokens": 50, "predicted_s": 0.01, "actual_s": 0.01},
        {"id": "c", "status": "rejected", "reason": "queue_full"},
        {"id": "d", "status": "rejected", "reason": "deadline_passed"},
        {"id": "e", "status": "rejected", "reason": "queue_full"},
        {"id": "f", "status": None},
    ]
    s = request_summary(rows)
    assert s["prefill_requests"] == {"arrived": 6, "served": 2, "rejected": 3, "unaccounted": 1,
                                     "rejected_by_reason": {"deadline_passed": 1, "queue_full": 2}}
    assert s["ttft_p50_s"] == pytest.approx(0.2) and s["ttft_mean_s"] == pytest.approx(0.2)
    assert s["prefill_tokens_served"] == 150
    assert s["prediction_error_p99"] == pytest.approx(0.099, abs=1e-3)
    assert training_slowdown(10.1, 10.0) == pytest.approx(0.01)
    assert training_slowdown(None, 10.0) is None


def test_read_request_rows(tmp_path):
    p = tmp_path / "requests.jsonl"
    assert read_request_rows(p) == []
    p.write_text('{"id": "a"}\n\n{"id": "b"}\n')
    assert [r["id"] for r in read_request_rows(p)] == ["a", "b"]
    p.write_text('{"id": "a"}\n{oops\n')
    with pytest.raises(ValueError, match=r"requests.jsonl:2: not a JSON request record"):
        read_request_rows(p)
