"""The agent's configuration (bubbletea_agent/config.py): errors name the file and the
field, and a scenario's validated `bubbletea:` section becomes one agent's
configuration (its shard of the request stream, chunking, the live window)."""

from __future__ import annotations

from typing import Any

import pytest

from bubbletea_agent.config import AgentConfigError, config_from_scenario, load_config, parse_config
from bubbletea_agent.requests import load_requests
from testbed_core.contracts.bubbletea import BubbleTeaSettings, LivePaths


def section(**fields: Any) -> BubbleTeaSettings:
    return BubbleTeaSettings.model_validate(fields)


def test_config_errors_name_the_file_and_field(tmp_path):
    bad = tmp_path / "a.yaml"
    bad.write_text("device: {name: x, run_dir: /tmp}\nslots: s\nout_dir: o\n"
                   "requests: {kind: poisson, rate_per_s: 1, lengths: {kind: fixed, tokens: 8}}\nfoo: 1\n")
    with pytest.raises(AgentConfigError) as exc:
        load_config(bad)
    msg = str(exc.value)
    assert "a.yaml: invalid BubbleTea agent configuration" in msg
    assert "foo: unknown field" in msg and "requests.poisson: poisson request source needs duration_s or count" in msg
    with pytest.raises(AgentConfigError, match="missing.yaml: no such agent configuration file"):
        load_config(tmp_path / "missing.yaml")
    (tmp_path / "b.yaml").write_text("- 1\n")
    with pytest.raises(AgentConfigError, match="is a mapping"):
        load_config(tmp_path / "b.yaml")


def test_config_from_scenario_section(tmp_path):
    bt = section(enabled=True, requests={"rate": 40, "deadline": 4.0,
                                         "prompt_tokens": {"dist": "lognormal", "mean": 600, "sigma": 0.5,
                                                           "min": 16, "max": 2048}},
                 model={"preset": "llama-3-8b", "num_hidden_layers": 8}, chunk_tokens=256, guard=0.08)
    cfgs = [config_from_scenario(bt, device={"name": f"g{i}", "run_dir": str(tmp_path)},
                                 slots=tmp_path / f"s{i}", out_dir=tmp_path / f"o{i}", shard_index=i,
                                 shard_count=2, duration_s=10, epoch=123.0, seed=9) for i in range(2)]
    c = cfgs[0]
    assert c.requests.rate_per_s == 40 and c.requests.lengths.mean == 600 and c.requests.deadline_s == 4.0
    assert c.admission.chunking and c.admission.max_chunk_tokens == 256
    assert c.guard.initial_rel == 0.08 and c.model.num_hidden_layers == 8 and c.epoch == 123.0
    a, b = (load_requests(x.requests) for x in cfgs)
    assert not {r.id for r in a} & {r.id for r in b} and 300 < len(a) + len(b) < 500
    whole = config_from_scenario(section(chunk_tokens=0, requests={"trace": "t.csv"}),
                                 device={"name": "g", "run_dir": str(tmp_path)}, slots="s", out_dir="o",
                                 shard_index=0, shard_count=1, duration_s=5, base_dir=tmp_path)
    assert not whole.admission.chunking and whole.requests.path == tmp_path / "t.csv"


def test_without_a_model_the_device_decides() -> None:
    kw: dict[str, Any] = dict(slots="/tmp/s", out_dir="/tmp/o", shard_index=0, shard_count=1, duration_s=1.0)
    modelled = config_from_scenario(section(model={}), device={"name": "d", "run_dir": "/tmp"}, **kw)
    real = config_from_scenario(section(), device={"name": "d", "run_dir": "/tmp", "mode": "real"}, **kw)
    assert modelled.model.preset == "llama-3-8b" and real.model.preset == "tiny"


def test_live_window_needs_a_live_section() -> None:
    with pytest.raises(AgentConfigError, match="window 'live' needs a live section"):
        parse_config({"device": {"name": "d", "run_dir": "/tmp"}, "slots": "/tmp/s", "out_dir": "/tmp/o",
                      "requests": {"kind": "poisson", "rate_per_s": 1, "duration_s": 1,
                                   "lengths": {"kind": "fixed", "tokens": 8}}, "window": "live"}, "x.yaml")
    kw: dict[str, Any] = dict(device={"name": "d", "run_dir": "/tmp"}, slots="/tmp/s", out_dir="/tmp/o",
                              shard_index=0, shard_count=1, duration_s=1.0)
    # a scenario section asking for live windows without a published status falls back
    assert config_from_scenario(section(window="live"), **kw).window == "planned"
    live = config_from_scenario(section(window="live"), live=LivePaths(status="/tmp/d.status"), **kw)
    assert live.window == "live" and str(live.live.status) == "/tmp/d.status"


def test_chunk_tokens_forms() -> None:
    kw: dict[str, Any] = dict(device={"name": "d", "run_dir": "/tmp"}, slots="/tmp/s", out_dir="/tmp/o",
                              shard_index=0, shard_count=1, duration_s=1.0)
    assert config_from_scenario(section(chunk_tokens="auto"), **kw).admission.max_chunk_tokens is None
    assert config_from_scenario(section(chunk_tokens=256), **kw).admission.max_chunk_tokens == 256
    assert config_from_scenario(section(chunk_tokens=0), **kw).admission.chunking is False
