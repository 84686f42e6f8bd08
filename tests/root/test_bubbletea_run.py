"""`testbed run` with BubbleTea end to end on the emulated 2dc topology (root): a short
run of atlas and atlas+bubbletea (quickstart's workload, 1 warm-up + 2 measured
iterations, no calibration), one agent per worker, KV caches to a decode server in each
DC. Checks the summary's BubbleTea figures and that every request is accounted for;
timing is asserted loosely (the machine is shared)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from testbed.progress import Progress
from testbed.run.runner import run_scenario
from testbed.run.scenario import load_scenario

pytestmark = pytest.mark.root
ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(300)
def test_short_bubbletea_run(tmp_path: Path, namespaces) -> None:
    before = namespaces()
    scenario, resolved = load_scenario(ROOT / "scenarios/quickstart.yaml", {
        "variants": ["atlas"], "workload.warmup": 1, "workload.iterations": 2, "runner.calibrate": False,
        "runner.base_port": 39500, "bubbletea.requests.rate": 40,
    })
    out = tmp_path / "out"
    log = io.StringIO()
    run_scenario(scenario, resolved, out, Progress(label="t", stream=log, tty=False))
    print(log.getvalue())
    summary = json.loads((out / "summary.json").read_text())  # what the run hands on: summary.json
    assert list(summary["variants"]) == ["atlas", "atlas+bubbletea"]
    plain, bt = summary["variants"]["atlas"], summary["variants"]["atlas+bubbletea"]
    assert "error" not in plain and "error" not in bt, (plain.get("error"), bt.get("error"))
    for key in ("device_utilization", "device_utilization_training", "iteration_time_s"):
        assert plain[key] > 0 and bt[key] > 0
    for key in ("training_slowdown", "prefill_requests", "ttft_s", "guard_violations",
                "training_wait_on_prefill_s", "compared_with_iteration_time_s", "bubbletea_agents"):
        assert key in bt, key
    assert bt["compared_with_iteration_time_s"] == plain["iteration_time_s"]
    assert bt["training_slowdown"] == pytest.approx(bt["iteration_time_s"] / plain["iteration_time_s"] - 1)
    req = bt["prefill_requests"]
    assert req["arrived"] > 0 and req["unaccounted"] == 0
    assert req["arrived"] == req["served"] + req["rejected"] == sum(req["rejected_by_reason"].values()) + req["served"]
    assert req["served"] > 0  # at idle CPU priority (runner.bubbletea_cpu_idle) the agents still fill bubbles
    assert bt["ttft_s"]["p50"] <= bt["ttft_s"]["p95"] <= bt["ttft_s"]["p99"]
    assert bt["bubbletea_agents"]["engine_mode"] == ["modelled"]
    # prefill work filled former bubbles: utilization with prefill above training alone (by how
    # much depends on the CPU the agents get beside two other root tests: printed; its figure
    # on an idle machine is results/bubbletea-ten-runs, scripts/bubbletea_runs.py)
    assert bt["device_utilization"] > bt["device_utilization_training"] + 0.02
    print(f"utilization {bt['device_utilization_training']:.1%} training -> {bt['device_utilization']:.1%} with prefill")
    assert plain["device_utilization"] == pytest.approx(plain["device_utilization_training"])
    # how long training waited on prefill (a duration the machine's load sets): printed here,
    # its floor in tests/floors/test_bubbletea_training_wait.py (make floors)
    assert bt["training_wait_on_prefill_s"] >= 0
    print(f"training waited {bt['training_wait_on_prefill_s']:.3f} s on prefill")
    agents = sorted(p.name for p in (out / "atlas+bubbletea" / "agents").glob("p*.json"))
    assert agents == ["p0r0.json", "p0r1.json", "p1r0.json", "p1r1.json"]
    decoded = [json.loads(line) for p in (out / "atlas+bubbletea" / "agents").glob("decode-*.jsonl")
               for line in p.read_text().splitlines()]
    assert len(decoded) == req["served"]  # every served cache reached a decode server
    rows = [json.loads(line) for p in (out / "atlas+bubbletea" / "agents").glob("*.requests.jsonl")
            for line in p.read_text().splitlines()]
    assert {r["id"] for r in rows if r["status"] == "served"} == {d["request_id"] for d in decoded}
    assert (out / bt["gantt_png"]).exists()
    # the slowdown decomposed: the idle twin (agents admitting nothing) ran before it
    parts = bt["slowdown_decomposition"]
    assert parts["total"] == pytest.approx(bt["training_slowdown"])
    assert parts["agent_overhead"] is not None and len(parts["idle_twin_iteration_times_s"]) == 2
    assert parts["total"] == pytest.approx(parts["agent_overhead"] + parts["prefill_interference"])
    idle_rows = [json.loads(line) for p in (out / "atlas+bubbletea-idle" / "agents").glob("*.requests.jsonl")
                 for line in p.read_text().splitlines()]
    assert idle_rows and not [r for r in idle_rows if r["status"] == "served"]  # the idle twin admitted nothing
    assert parts["agents_cpu_cores"] is not None and parts["emulator_cpu_cores"] > 0
    agents_cpu = parts["agents_cpu"]  # how the agents were kept off the workers' cores (runner defaults: idle)
    assert agents_cpu["how"] == parts["cpu_weights"] and agents_cpu["realtime_holds"]
    if agents_cpu["cgroup"] is not None:  # the agents' cgroup is gone with the run
        name = agents_cpu["cgroup"]
        if Path("/sys/fs/cgroup/cpu/cpu.idle").exists():  # cgroup v1 with cpu.idle (Linux 5.15+)
            assert agents_cpu["idle"], agents_cpu
        assert not (Path("/sys/fs/cgroup/cpu") / name).exists() and not (Path("/sys/fs/cgroup") / name).exists()
    # the step files played in memory (/dev/shm, testbed/emulation/memfs.py) and were kept here after
    for variant in ("atlas", "atlas+bubbletea"):
        kept = out / variant / "run"
        names = {p.name for p in kept.iterdir()}
        assert names >= ({"devices", "transfers", "live", "slots"} if "+" in variant else {"devices", "transfers"}), names
        assert list((kept / "devices").glob("*.timeline.jsonl")) and list((kept / "transfers").glob("*.jsonl"))
        assert not list((kept / "devices").glob("*.yield"))  # the holders' FIFOs are not copied
        jobs = [json.loads(p.read_text()) for p in (out / variant / "jobs").glob("*.json")]
        played = {Path(j["device"]["run_dir"]) for j in jobs}
        assert len(played) == 1 and not next(iter(played)).exists(), played  # freed after the copy
    assert namespaces() <= before  # nothing of the run is left behind
