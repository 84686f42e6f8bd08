"""The BubbleTea entry of a +bubbletea variant (testbed/run/bubbletea.py `bubbletea_metrics`)
is built as typed models from the agents' and the controller's files: every agent summary
read once through its model, an unreadable one left out, the controller's counts where
one ran, and the result fits the variant's summary entry field for field."""

from __future__ import annotations

import json
from pathlib import Path

from testbed.run.bubbletea import agent_summaries, bubbletea_metrics
from testbed_core.contracts.summary import BUBBLETEA_KEYS, BubbleTeaMetrics, VariantResult

ROWS = [
    {"status": "served", "ttft": 0.5, "prompt_tokens": 100, "kv_digest_ok": True, "kv_bytes": 1000,
     "kv_wire_bytes": 10, "kv_decode_ok": True},
    {"status": "rejected", "reason": "deadline"},
    {"status": "served", "ttft": 0.9, "prompt_tokens": 50},
]


def _variant(tmp_path: Path, window: str = "live", controller: dict | None = None) -> Path:
    agents = tmp_path / "agents"
    agents.mkdir(parents=True)
    for w in ("p0r0", "p0r1"):
        (agents / f"{w}.requests.jsonl").write_text("\n".join(json.dumps(r) for r in ROWS))
        (agents / f"{w}.json").write_text(json.dumps({
            "engine_mode": "modelled", "config": {"window": window}, "slots": {"published": 3},
            "counters": {"not_arrived": 2, "chunks_run": 5, "late_starts": 1, "device_busy_retries": 0, "holds": 3}}))
    (agents / "p1r0.json").write_text("{an agent that did not end")
    if controller is not None:
        (tmp_path / "controller").mkdir()
        (tmp_path / "controller" / "requests.jsonl").write_text("\n".join(json.dumps(r) for r in ROWS[:2]))
        if controller:
            (tmp_path / "controller" / "controller.json").write_text(json.dumps(controller))
    return tmp_path


def test_agents_files_are_read_once_each_through_their_model(tmp_path: Path) -> None:
    folder = _variant(tmp_path)
    assert [a.counters.chunks_run for a in agent_summaries(folder)] == [5, 5]  # the unreadable one left out
    m = bubbletea_metrics(folder, {}, [(0.0, 1.0)], 1.0, 1.1)
    assert isinstance(m, BubbleTeaMetrics) and BUBBLETEA_KEYS <= set(VariantResult.model_fields)
    assert (m.prefill_requests.arrived, m.prefill_requests.served, m.prefill_requests.rejected) == (6, 4, 2)
    assert m.ttft_s.p50 == 0.7 and m.prefill_tokens_served == 300
    assert m.bubbletea_agents.model_dump() == {"engine_mode": ["modelled"], "not_arrived": 4, "chunks_run": 10,
                                               "late_starts": 2, "device_busy_retries": 0}
    assert m.kv_checks.shipped == 2 and m.kv_checks.wire_scale == 0.01
    assert m.prefill_service.dispatch == "shards" and m.prefill_service.accounted
    assert m.prefill_service.not_arrived == 4 and m.prefill_service.by_device is None
    assert abs(m.training_slowdown - 0.1) < 1e-9 and m.compared_with_iteration_time_s == 1.0


def test_naive_agents_and_the_controller_name_the_dispatch(tmp_path: Path) -> None:
    assert bubbletea_metrics(_variant(tmp_path / "n", "naive"), {}, [(0.0, 1.0)], None, 1.0
                             ).prefill_service.dispatch == "naive"
    ctl = {"dispatch": "controller", "not_arrived": 7, "by_device": {"g0": 2}, "by_origin": {"source": 2},
           "refused_bodies": 1, "epoch": 0.0}
    svc = bubbletea_metrics(_variant(tmp_path / "c", controller=ctl), {}, [(0.0, 1.0)], None, 1.0).prefill_service
    assert (svc.dispatch, svc.arrived, svc.not_arrived, svc.by_device, svc.refused_bodies) == (
        "controller", 2, 7, {"g0": 2}, 1)
    assert svc.accounted
    broken = bubbletea_metrics(_variant(tmp_path / "b", controller={}), {}, [(0.0, 1.0)], None, 1.0).prefill_service
    assert broken.dispatch == "controller" and not broken.accounted  # no controller.json: it did not end cleanly
