"""BubbleTea in scenarios and in the runner (testbed/run/bubbletea.py): the `bubbletea:`
section's validation, the agents' jobs (decode server placement, KV pacing, live status,
written and read through the contract), the live section of the workers' jobs, which
variants run with agents, and waiting for agents and decode servers."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import yaml

from bubbletea_agent.job import config_from_job, load_job
from testbed.process import Process, start
from testbed.run.bubbletea import (
    Endpoint,
    build_agent_jobs,
    decode_hosts,
    wait_ready,
)
from testbed.run.common import RunnerError, transport_job
from testbed.run.jobs import build_jobs
from testbed.run.ports import PortPlan
from testbed.run.scenario import ScenarioError, load_scenario
from testbed.run.variants import plan_variant, variant_names
from testbed.training.worker.job import parse_job
from testbed_core.contracts.calibration import dc_of_host
from testbed_core.contracts.worker_job import TrainJob

ROOT = Path(__file__).resolve().parents[3]


def scenario_file(tmp_path: Path, **bubbletea) -> Path:
    wl = yaml.safe_load((ROOT / "scenarios/workloads/gpt-1.3b.yaml").read_text())
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump({
        "name": "bt-test", "topology": str(ROOT / "topologies" / "2dc.yaml"), "workload": wl,
        "variants": ["multi-tcp", "atlas"], "bubbletea": {"enabled": True, **bubbletea},
    }))
    return path


def setup_jobs(tmp_path: Path, **bubbletea):
    scenario, _ = load_scenario(scenario_file(tmp_path, **bubbletea))
    workload = scenario.workload
    setup = plan_variant("atlas+bubbletea", scenario, workload, None, None, None)
    ips = {f"{dc.name}-{h}": f"10.0.{i}.{j + 10}" for i, dc in enumerate(scenario.topology.dcs)
           for j, h in enumerate(dc.hosts)}
    jobs = build_jobs(setup=setup, workload=workload, topology=scenario.topology, host_ips=ips,
                      run_dir=tmp_path / "run", control="/tmp/ctl.sock", ports=PortPlan(30000), iterations=5,
                      transport=transport_job(scenario.transport), iteration_lead_s=0.08)
    return scenario, workload, jobs, ips


# ------------------------------------------------------------------ scenario


def test_section_defaults(tmp_path: Path) -> None:
    scenario, _ = load_scenario(scenario_file(tmp_path))
    bt = scenario.bubbletea
    assert bt.window == "live" and bt.chunk_tokens == "auto" and bt.kv_wire_scale == 0.001
    assert bt.kv_wan_rate == 50e6 and bt.variants is None and bt.decode_host is None


@pytest.mark.parametrize("bubbletea, message", [
    ({"decode_host": "dc3-h1"}, "bubbletea.decode_host: unknown host 'dc3-h1' (hosts: dc1-h1, dc1-h2, dc2-h1, "
                                "dc2-h2; or 'same-dc' for a decode server in each DC)"),
    ({"variants": ["baseline"]}, "bubbletea.variants: baseline not among the scenario's variants (multi-tcp, atlas)"),
    ({"chunk_tokens": -5}, "chunk_tokens must be 'auto', 0 (whole prompts) or a positive token count, got -5"),
    ({"kv_wan_rate": "50Mbyte"}, "kv_wan_rate"),
    ({"kv_wire_scale": 0}, "kv_wire_scale"),
    ({"window": "guess"}, "window"),
])
def test_section_errors_name_the_field(tmp_path: Path, bubbletea: dict, message: str) -> None:
    with pytest.raises(ScenarioError) as err:
        load_scenario(scenario_file(tmp_path, **bubbletea))
    assert message in str(err.value) and "s.yaml" in str(err.value)


def test_only_the_listed_variants_run_with_agents(tmp_path: Path) -> None:
    scenario, _ = load_scenario(scenario_file(tmp_path, variants=["atlas"]))
    assert variant_names(scenario) == ["multi-tcp", "atlas", "atlas+bubbletea"]
    scenario, _ = load_scenario(scenario_file(tmp_path, variants=["atlas"], compare=False))
    assert variant_names(scenario) == ["multi-tcp", "atlas+bubbletea"]


# ------------------------------------------------------------------ jobs


def test_workers_of_a_bubbletea_variant_publish_live_status(tmp_path: Path) -> None:
    _, workload, jobs, _ = setup_jobs(tmp_path)
    for wid, job in jobs.items():
        parsed = parse_job(job.model_dump_json(), wid)  # what the worker reads
        assert isinstance(parsed, TrainJob) and parsed.live is not None
        name = job.device.name
        assert parsed.live.status_path.endswith(f"run/live/{name}.status")
        assert parsed.live.wake_path.endswith(f"run/live/{name}.wake")
        assert parsed.live.lead_s == 0.08
        # every boundary of this placement crosses the 1 Gbit/s WAN
        assert parsed.live.recv_rate_bps == {c.boundary: 1e9 for c in parsed.channels}
        assert parsed.live.slack_bytes == 125_000 + (32 << 10)  # the shaper's 1 ms burst and some


def test_agents_ship_to_a_decode_server_in_their_own_dc(tmp_path: Path) -> None:
    scenario, workload, jobs, ips = setup_jobs(tmp_path, decode_host="same-dc")
    where = decode_hosts(scenario, jobs)
    assert {dc_of_host(jobs[w].host): dc_of_host(h) for w, h in where.items()} == {"dc1": "dc1", "dc2": "dc2"}
    decode = {w: Endpoint(host=h, ip=ips[h], port=33000) for w, h in where.items()}
    agents = build_agent_jobs(jobs, tmp_path / "v", scenario, workload, None, decode, 5)
    assert sorted(a.agent_index for a in agents.values()) == [0, 1, 2, 3]
    for wid, a in agents.items():
        (tmp_path / f"{wid}.json").write_text(a.model_dump_json())
        job = load_job(tmp_path / f"{wid}.json")  # what the agent reads is what the runner wrote
        assert job == a and job.bubbletea == scenario.bubbletea and job.gpu == workload.gpu
        assert job.iterations == 5 and job.nice == -10 and job.wire_scale == 0.001
        assert a.decode.host == ips[where[wid]] and a.decode.rest_rate_bps == 10e9  # the LAN
        assert a.decode.max_rate_bps is None  # nothing crosses the WAN: no pacing
        assert str(a.live.status) == jobs[wid].live.status_path
        assert str(a.live.gate).endswith("run/live/gate.status")
        cfg = config_from_job(job)
        assert cfg.window == "live" and cfg.arrivals_until_iteration == 4 and cfg.admission.chunking
        assert cfg.decode.rest_rate_bps == 10e9 and cfg.nice == -10


def test_a_decode_host_in_another_dc_is_paced_at_the_wan_rate(tmp_path: Path) -> None:
    scenario, workload, jobs, ips = setup_jobs(tmp_path, decode_host="dc2-h2", kv_wan_rate="40Mbit")
    decode = {w: Endpoint(host="dc2-h2", ip=ips["dc2-h2"], port=33000) for w in jobs}
    agents = build_agent_jobs(jobs, tmp_path / "v", scenario, workload, None, decode, 5)
    dc1 = [a for a in agents.values() if a.host.startswith("dc1")]
    dc2 = [a for a in agents.values() if a.host.startswith("dc2")]
    assert all(a.decode.max_rate_bps == 20e6 and a.decode.rest_rate_bps == 1e9 for a in dc1)
    assert all(a.decode.max_rate_bps is None and a.decode.rest_rate_bps == 10e9 for a in dc2)


def test_no_decode_host_means_no_shipping(tmp_path: Path) -> None:
    scenario, workload, jobs, _ = setup_jobs(tmp_path)
    assert set(decode_hosts(scenario, jobs).values()) == {None}
    agents = build_agent_jobs(jobs, tmp_path / "v", scenario, workload, None, {w: None for w in jobs}, 5)
    assert all(a.decode is None for a in agents.values())


# ------------------------------------------------------------------ processes


def _start(tmp_path: Path, name: str, code: str) -> Process:
    return start([sys.executable, "-c", code], log_path=tmp_path / f"{name}.log", name=name, cwd=str(ROOT))


ANNOUNCE = "from testbed_runtime.readiness import announce_ready; import time; announce_ready(); time.sleep(30)"


def test_an_agent_that_dies_before_training_is_reported(tmp_path: Path) -> None:
    dead = _start(tmp_path, "agent-p0r0", "import sys; print(\"agent error: the model preset 'huge' is unknown\"); "
                                          "sys.exit(3)")
    with pytest.raises(RunnerError, match=r"BubbleTea agent-p0r0 did not start: .*exited with code 3 before it "
                                          r"was ready(.|\n)*preset 'huge' is unknown"):
        wait_ready({"agent-p0r0": dead}, 10.0)


def test_agents_that_never_get_ready_time_out(tmp_path: Path) -> None:
    ready = _start(tmp_path, "agent-p0r0", ANNOUNCE)
    slow = _start(tmp_path, "agent-p1r0", "import time; time.sleep(30)")
    try:
        with pytest.raises(RunnerError, match=r"agent-p1r0 did not start: .*not ready within"):
            wait_ready({"agent-p0r0": ready, "agent-p1r0": slow}, 3.0)
        assert ready.info == {}  # the first one announced, so only the second is named
    finally:
        for p in (ready, slow):
            p.popen.kill()
            p.popen.wait()


def test_training_waits_for_decode_servers_to_listen(tmp_path: Path) -> None:
    """The real decode server announces readiness once it listens (port 0: any free one);
    one that cannot bind is reported with its own message."""
    argv = [sys.executable, "-m", "bubbletea_agent", "decode-server", "--host", "127.0.0.1", "--port", "0",
            "--streams", "1"]
    env = {**os.environ, "ATLAS_SECRET": "test-secret"}
    server = start(argv, log_path=tmp_path / "decode-a.log", name="decode-a", env=env, cwd=str(ROOT))
    try:
        wait_ready({"decode-a": server}, 60.0)
        port = server.info["port"]
        assert port > 0
        taken = start([*argv[:-3], str(port), "--streams", "1"], log_path=tmp_path / "decode-b.log",
                      name="decode-b", env=env, cwd=str(ROOT))
        with pytest.raises(RunnerError, match=rf"decode-b did not start: .*exited with code 1(.|\n)*:{port}"):
            wait_ready({"decode-b": taken}, 60.0)
    finally:
        server.popen.terminate()
        server.popen.wait(10)


# ------------------------------------------------------------------ KV caches
