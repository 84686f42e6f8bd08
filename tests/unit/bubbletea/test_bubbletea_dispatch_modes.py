"""Dispatch modes: the agent's side of the controller (inbox, status), naive colocation,
the dispatch twins of the variant registry, and the jobs the runner writes."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from test_bubbletea_agent import T0, make_hold_agent

from bubbletea_agent.config import config_from_scenario, request_source
from bubbletea_agent.requests import Request, TraceError, load_requests
from testbed_core.contracts.bubbletea import BubbleTeaSettings, ControllerAddress
from testbed_core.variants import (
    base_name,
    dispatch_of,
    has_bubbletea,
    parse_run_variant,
    parse_run_variants,
)


def test_inbox_requests_arrive_now_and_status_reports_them():
    training = [(T0 + 0.1 * k, T0 + 0.1 * k + 0.05) for k in range(10)]
    inbox: list[Request] = [Request("c1", 0.0, 300, 0, 2.0)]
    seen = []
    agent, device, rows = make_hold_agent([], training, T0 + 1.0, status_every_s=0.01)
    agent.inbox = lambda: [inbox.pop()] if inbox else []
    agent.on_status = seen.append
    agent.run(until=T0 + 1.0)
    s = agent.finish()
    assert s["arrived"] == 1 and s["served"] == 1
    assert seen and seen[0].epoch == T0 and seen[0].taken == 1
    assert all(0.0 <= st.idle_fraction <= 1.0 for st in seen)
    assert any(st.live_end is not None and st.live_end > st.at for st in seen)  # an open window was reported
    assert rows[0]["id"] == "c1"


def test_status_backlog_is_the_queued_predicted_work():
    training = [(T0, T0 + 10.0)]  # busy all the time: nothing runs, everything queues
    agent, _, _ = make_hold_agent([Request(f"r{i}", 0.0, 1000, 0, 5.0) for i in range(3)], training, T0 + 1.0)
    agent.on_status = lambda st: None
    agent.step()
    st = agent.status(T0)
    assert st.queued == 3
    assert st.backlog_s == pytest.approx(3 * (0.004 + 0.1))  # layer_charge(1000) each
    assert st.idle_fraction == pytest.approx(1.0)  # the timeline showed no training yet (NoTimeline)


def test_controller_order_runs_the_shortest_queued_request_first():
    # training holds the device for the first 0.3 s: the controller's work queues, then runs
    training = [(T0, T0 + 0.3)]
    for order, first in (("shortest", "short"), ("arrival", "long")):
        inbox = [Request("long", 0.0, 1000, 0, 5.0), Request("mid", 0.0, 500, 0, 5.0),
                 Request("short", 0.0, 100, 0, 5.0)]
        agent, _, rows = make_hold_agent([], training, T0 + 1.0, status_every_s=0.01)
        agent.order = order
        agent.inbox = lambda inbox=inbox: [inbox.pop(0) for _ in range(len(inbox))]
        agent.on_status = lambda st: None
        agent.run(until=T0 + 1.0)
        s = agent.finish()
        assert s["served"] == 3
        starts = sorted((r["start"], r["id"]) for r in rows)
        assert starts[0][1] == first, (order, starts)
        if order == "shortest":
            assert [i for _, i in starts] == ["short", "mid", "long"]
        assert all(r["taken"] == pytest.approx(0.0, abs=0.02) for r in rows)  # when it took them


def test_work_sent_ahead_waits_at_the_agent_until_it_arrives():
    training = [(T0 + 0.1 * k, T0 + 0.1 * k + 0.02) for k in range(10)]
    inbox = [Request("c1", 0.35, 300, 0, 2.0)]  # sent at once, arrives 0.35 s after the epoch
    agent, _, rows = make_hold_agent([], training, T0 + 1.0, status_every_s=0.01)
    agent.inbox = lambda: [inbox.pop()] if inbox else []
    agent.on_status = lambda st: None
    agent.run(until=T0 + 1.0)
    s = agent.finish()
    assert s["served"] == 1
    assert rows[0]["taken"] == pytest.approx(0.35, abs=0.005) and rows[0]["start"] >= 0.35
    # one still ahead when the agent stops is ended with the run, not lost
    inbox2 = [Request("late", 5.0, 300, 0, 2.0)]
    agent2, _, rows2 = make_hold_agent([], training, T0 + 1.0, status_every_s=0.01)
    agent2.inbox = lambda: [inbox2.pop()] if inbox2 else []
    agent2.on_status = lambda st: None
    agent2.run(until=T0 + 0.5)
    s2 = agent2.finish()
    assert s2["arrived"] == 1 and rows2[0]["reason"] == "run_ended"


def test_naive_runs_one_whole_chunk_per_hold_and_crosses_training():
    # training wants the device 2 ms into every 100 ms; naive takes it whenever it is free
    training = [(T0 + 0.1 * k + 0.002, T0 + 0.1 * k + 0.01) for k in range(10)]
    reqs = [Request(f"r{i}", 0.0, 300) for i in range(4)]
    agent, device, _ = make_hold_agent(reqs, training, T0 + 1.0)
    agent.window, agent.live_bound = "naive", lambda: math.inf
    agent.run(until=T0 + 1.0)
    s = agent.finish()
    assert s["served"] == 4
    assert len(device.holds) == 4  # one chunk (the whole 300-token prompt) per hold
    crossed = [h for h in device.holds if any(h[0] < ts < h[1] for ts, _ in training)]
    assert crossed  # no guard: a chunk ran into training's next piece


def test_dispatch_twins_in_the_registry():
    run = parse_run_variant("atlas+bubbletea-naive")
    assert run.bubbletea and run.dispatch == "naive" and run.name == "atlas+bubbletea-naive"
    assert base_name("atlas+bubbletea-shards") == "atlas" and has_bubbletea("atlas+bubbletea-shards")
    assert dispatch_of("atlas+bubbletea") is None and parse_run_variant("atlas+bubbletea").dispatch is None
    assert [r.name for r in parse_run_variants(["atlas", "atlas+bubbletea-controller"])] == [
        "atlas", "atlas+bubbletea-controller"]


def test_scenario_runs_the_dispatch_twins(tmp_path: Path):
    from testbed.run.scenario import load_scenario
    from testbed.run.variants import variant_names

    root = Path(__file__).resolve().parents[3]
    scenario, _ = load_scenario(root / "scenarios/prefill-service-2dc.yaml", {})
    assert variant_names(scenario) == ["atlas", "atlas+bubbletea", "atlas+bubbletea-shards", "atlas+bubbletea-naive"]
    with pytest.raises(Exception, match="compare_dispatch"):
        load_scenario(root / "scenarios/prefill-service-2dc.yaml", {"bubbletea.compare_dispatch": ["random"]})


def test_agent_config_per_dispatch_mode(tmp_path: Path):
    dev = {"name": "g", "run_dir": str(tmp_path)}
    common = dict(device=dev, slots=tmp_path / "s.jsonl", out_dir=tmp_path, shard_index=1, shard_count=4,
                  duration_s=10.0)
    naive = config_from_scenario(BubbleTeaSettings(dispatch="naive"), **common)
    assert naive.window == "naive" and naive.controller is None and naive.requests.shard_count == 4
    addr = ControllerAddress(host="10.0.0.1", port=7080, name="p0r0")
    ctl = config_from_scenario(BubbleTeaSettings(dispatch="controller", requests={"rate": 50}), **common,
                               controller=addr)
    assert ctl.controller == addr and load_requests(ctl.requests) == []  # its work comes from the controller
    shards = config_from_scenario(BubbleTeaSettings(requests={"rate": 50}), **common)
    assert shards.window == "live" or shards.window == "planned"
    assert len(load_requests(shards.requests)) > 0


def test_malformed_trace_row_names_file_line_and_column(tmp_path: Path):
    trace = tmp_path / "t.csv"
    trace.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n0.0,100,5\n0.5,lots,5\n")
    src = request_source(BubbleTeaSettings(requests={"trace": str(trace)}), seed=1, duration_s=10.0)
    with pytest.raises(TraceError, match=r"t\.csv:3: ContextTokens 'lots' is not a number"):
        load_requests(src)


def test_runner_builds_controller_and_agent_jobs(tmp_path: Path):
    from testbed.run.bubbletea import controller_job

    bt = BubbleTeaSettings(enabled=True, dispatch="controller")

    class S:
        bubbletea = bt
        seed = 3

    job = controller_job({"p1r0": None, "p0r0": None}, tmp_path, S, None, ["dc1-h2"], 43063, 60.0, "10.0.1.1")
    assert job.agents == ["p0r0", "p1r0"] and job.port == 43063 and job.out == tmp_path / "controller"
    assert job.host == "10.0.1.1"  # its host's address in the run, not every interface
    assert job.decode_hosts == ["dc1-h2"] and job.seed == 3


def test_comparison_table_from_a_summary(tmp_path: Path, capsys):
    import json

    from bubbletea_agent.controller.table import main

    svc = {"dispatch": "controller", "arrived": 10, "served": 8, "rejected": 2,
           "rejected_by_reason": {"deadline_unreachable": 2}, "accounted": True, "ttft_p50_s": 0.1,
           "ttft_p99_s": 0.5}
    summary = {"variants": {"atlas": {"iteration_time_s": 2.0},
                            "atlas+bubbletea": {"prefill_service": svc, "training_slowdown": 0.004,
                                                "training_wait_on_prefill_s": 0.0,
                                                "prefill_tokens_served": 4096}}}
    path = tmp_path / "summary.json"
    path.write_text(json.dumps(summary))
    assert main([str(path)]) == 0
    out = capsys.readouterr().out
    assert ("| atlas+bubbletea | controller | 8 / 10 (80%) | 512 | deadline_unreachable 2 | 0.100 s | 0.500 s "
            "| +0.4% |") in out
    assert "| atlas |" not in out
    assert main([str(tmp_path / "missing.json")]) == 1
    assert "cannot read the run's summary" in capsys.readouterr().err
