"""testbed.launch.models: launch.json and the detached state file round-trip through their models."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from testbed.launch.models import (
    DetachedHost,
    DetachedState,
    DetachedWan,
    LaunchReport,
    LaunchSpec,
    LinkBytes,
    RankReport,
    read_report,
    write_report,
)


def test_spec_defaults_and_bounds():
    spec = LaunchSpec(command=["python", "x.py"])
    assert spec.nproc_per_host == 1 and spec.hosts is None and spec.env == {} and spec.cwd
    with pytest.raises(ValidationError):
        LaunchSpec(command=["x"], nproc_per_host=0)
    with pytest.raises(ValidationError):
        LaunchSpec(command=["x"], master_port=70000)
    with pytest.raises(ValidationError):
        LaunchSpec(command=["x"], bogus=1)


def test_report_round_trip(tmp_path: Path):
    report = LaunchReport(
        command=["python", "x.py"], topology="2dc", topology_file="topologies/2dc.yaml", started=1.0, finished=2.0,
        wall_s=1.0, ok=False, failure="rank 1 (dc2/dc2-h1) exited with 3", world_size=2, nproc_per_host=1,
        master_addr="10.200.1.10", master_port=29500,
        ranks=[RankReport(rank=0, local_rank=0, host="dc1-h1", dc="dc1", ip="10.200.1.10", exit_code=-15,
                          ended_by_launch=True, wall_s=1.0, stdout="a", stderr="b", metrics=[{"loss": 1.5}])],
        wan_bytes=[LinkBytes(link="dc1-dc2", a="dc1", b="dc2", a_to_b_bytes=10, b_to_a_bytes=20)])
    path = write_report(report, tmp_path)
    assert path.name == "launch.json"
    assert read_report(path) == report


def test_detached_state_round_trip():
    state = DetachedState(name="dev", topology="2dc", topology_file="/x/2dc.yaml", prefix="tb123", daemon_pid=10,
                          daemon_start=5, socket="/tmp/tb123-detach-x/launch.sock", log="/tmp/l", delay_backend="relay",
                          built=1.0, hosts=[DetachedHost(name="dc1-h1", dc="dc1", ip="10.200.1.10",
                                                         intf="tb123d0h1-eth0", node_pid=11, netns=99)],
                          wans=[DetachedWan(link="dc1-dc2", a="dc1", b="dc2", node_pid=12,
                                            intfs=("tb123w01-eth0", "tb123w01-eth1"))])
    assert DetachedState.model_validate_json(state.model_dump_json()) == state
