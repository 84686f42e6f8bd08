"""The runner's job file (bubbletea_agent/job.py, testbed_core/contracts/bubbletea.py):
what a hand-made job defaults to, how a bad one is reported, and that a job written
with the contract is read back unchanged and becomes the agent's configuration."""

from __future__ import annotations

import json

import pytest

from bubbletea_agent.config import AgentConfigError
from bubbletea_agent.job import config_from_job, load_job
from testbed_core.contracts.bubbletea import (
    AgentDevice,
    AgentJob,
    BubbleTeaSettings,
    KVDestination,
    LivePaths,
)
from testbed_core.workload import GpuConfig


def test_job_file_defaults_and_errors(tmp_path, caplog):
    base = {"device": {"name": "g0", "run_dir": str(tmp_path), "mode": "modelled", "time_scale": 1.0},
            "slots_path": "s.jsonl", "worker": "p1-s0", "out": str(tmp_path / "agents" / "p1-s0.json")}
    (tmp_path / "j.json").write_text(json.dumps(base))
    cfg = config_from_job(load_job(tmp_path / "j.json"))
    assert cfg.model.preset == "llama-3-8b" and cfg.device.gpu == "H100" and cfg.owner == "bubbletea:p1-s0"
    assert cfg.requests.shard_count == 1 and cfg.requests.duration_s == 600 and cfg.epoch is None
    assert cfg.out_dir == tmp_path / "agents" and cfg.decode is None
    assert "takes the whole request rate" in caplog.text
    real = dict(base, device=dict(base["device"], mode="real"),
                gpu={"type": "custom", "peak_tflops": 50, "efficiency": 0.4}, agent_index=2, agent_count=3,
                decode={"host": "10.0.0.9", "port": 7071})
    (tmp_path / "k.json").write_text(json.dumps(real))
    cfg = config_from_job(load_job(tmp_path / "k.json"))
    assert cfg.model.preset == "tiny" and cfg.device.gpu == "custom" and cfg.device.peak_tflops == 50
    assert cfg.requests.shard_index == 2 and cfg.decode.host == "10.0.0.9" and cfg.decode.port == 7071
    (tmp_path / "bad.json").write_text("{nope")
    with pytest.raises(AgentConfigError, match=r"bad.json: the agent job is not JSON"):
        load_job(tmp_path / "bad.json")
    (tmp_path / "short.json").write_text(json.dumps({"device": {"name": "g0", "run_dir": "/tmp"}, "worker": "w"}))
    with pytest.raises(AgentConfigError, match=r"short.json: invalid agent job: slots_path: Field required"):
        load_job(tmp_path / "short.json")
    (tmp_path / "odd.json").write_text(json.dumps(dict(base, colour="blue")))
    with pytest.raises(AgentConfigError, match=r"odd.json: invalid agent job: colour: Extra inputs"):
        load_job(tmp_path / "odd.json")


def test_a_written_job_reads_back_unchanged(tmp_path):
    job = AgentJob(
        device=AgentDevice(name="dc1-h1-p0r0", run_dir=tmp_path / "run", time_scale=1.0),
        slots_path=tmp_path / "run" / "slots" / "d.jsonl", worker="p0r0", host="dc1-h1",
        bubbletea=BubbleTeaSettings.model_validate({"requests": {"rate": 30, "trace": "t.csv"},
                                                    "model": {"preset": "small"}, "kv_wan_rate": "20Mbit"}),
        seed=7, out=tmp_path / "agents" / "p0r0.json", agent_index=1, agent_count=2, iterations=6,
        gpu=GpuConfig(type="A100", efficiency=0.4, profile="prof.yaml"), base_dir=tmp_path, wire_scale=0.01,
        decode=KVDestination(host="10.0.1.11", port=32500, streams=1, rest_rate_bps=1e9, max_rate_bps=25e6),
        live=LivePaths(status=tmp_path / "d.status", wake=tmp_path / "d.wake", gate=tmp_path / "gate.status"),
        nice=-10, realtime_holds=True)
    (tmp_path / "job.json").write_text(job.model_dump_json(indent=1))
    back = load_job(tmp_path / "job.json")
    assert back == job
    cfg = config_from_job(back)
    assert cfg.model.preset == "small" and cfg.device.gpu == "A100" and cfg.device.efficiency == 0.4
    assert cfg.device.profile == tmp_path / "prof.yaml" and cfg.requests.path == tmp_path / "t.csv"
    assert cfg.decode.max_rate_bps == 25e6 and cfg.live.gate == tmp_path / "gate.status"
    assert cfg.arrivals_until_iteration == 5 and cfg.kv_wire_scale == 0.01 and cfg.realtime_holds


def test_bubbletea_variants_come_from_the_registry():
    """`bubbletea.variants` takes the registry's names; a typo is refused with the allowed list."""
    from pydantic import ValidationError

    from testbed_core.variants import variant_names

    assert BubbleTeaSettings(variants=list(variant_names())).variants == list(variant_names())
    with pytest.raises(ValidationError) as err:
        BubbleTeaSettings(variants=["atlas", "atlsa"])
    assert "unknown variant(s) atlsa" in str(err.value)
    assert "allowed: baseline, multi-tcp, atlas, dp-across-dc, torch-gloo" in str(err.value)
