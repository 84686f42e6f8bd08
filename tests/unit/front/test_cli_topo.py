"""`testbed topo|doctor|clean` without root: tables, error messages, verdicts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from testbed.cli import main
from testbed.commands import doctor as doctor_mod
from testbed.emulation import network as emulation
from testbed.emulation.kernel import KernelFeatures

TOPOS = Path(__file__).resolve().parents[3] / "topologies"


@pytest.fixture
def runner() -> CliRunner:
    return CliRunner()


def test_topo_show_tables(runner):
    result = runner.invoke(main, ["topo", "show", str(TOPOS / "3dc-triangle.yaml")])
    assert result.exit_code == 0, result.output
    out = result.output
    assert "Topology 3dc-triangle" in out
    assert "10.200.3.0/24" in out and "10.200.3.1" in out
    assert "dc2 <-> dc3" in out and "500Mbit" in out and "30 ms" in out
    assert "dc1 > dc2 > dc3" in out and "via dc2" in out  # lowest-latency route


def test_topo_show_missing_file(runner):
    result = runner.invoke(main, ["topo", "show", "nope.yaml"])
    assert result.exit_code == 1
    assert "nope.yaml: no such topology file" in result.output
    assert "2dc.yaml" in result.output  # lists the shipped ones


def test_topo_show_schema_error(runner, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\ndcs: [{name: a, hosts: 1}, {name: b, hosts: 1}]\n"
                   "wan: [{between: [a, b], rate: 1Gbs, delay: 5ms}]\n")
    result = runner.invoke(main, ["topo", "show", str(bad)])
    assert result.exit_code == 1
    assert "wan.0.rate" in result.output and "unknown rate unit" in result.output


@pytest.mark.parametrize("cmd", [["topo", "check"], ["topo", "up"]])
def test_topo_build_commands_need_root(runner, monkeypatch, cmd):
    monkeypatch.setattr(emulation.os, "geteuid", lambda: 1000)
    result = runner.invoke(main, [*cmd, str(TOPOS / "2dc.yaml")])
    assert result.exit_code == 1
    assert "run as root (sudo)" in result.output


def test_topo_check_mnexec_missing(runner, monkeypatch):
    monkeypatch.setattr(emulation.os, "geteuid", lambda: 0)
    monkeypatch.setattr(emulation.shutil, "which", lambda name: None)
    result = runner.invoke(main, ["topo", "check", str(TOPOS / "2dc.yaml"), "--json"])
    assert result.exit_code == 1
    assert "apt-get install mininet" in result.output


def test_clean_needs_root(runner, monkeypatch):
    import os

    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    result = runner.invoke(main, ["clean", "--dry-run"])
    assert result.exit_code == 1
    assert "run as root (sudo)" in result.output


def _facts(**changes) -> doctor_mod.Facts:
    facts = doctor_mod.Facts(
        euid=0,
        features=KernelFeatures(netns=True, veth=True, htb=True, tbf=True, netem=False, packet_vnet_hdr=True,
                                packet_ignore_outgoing=True, kernel="6.1",
                                notes={"netem": "adding a netem qdisc failed: module missing"}),
        backend="relay",
        tools={name: f"/usr/bin/{name}" for name in doctor_mod.TOOLS},
        versions={dist: "1.0" for dist in doctor_mod.PY_PACKAGES},
        libiperf="iperf 3.12",
        gpu=doctor_mod.GpuInfo(available=False, error="no CUDA device"),
    )
    for key, value in changes.items():
        setattr(facts, key, value)
    return facts


def test_doctor_assess_ready_without_netem_or_gpu():
    checks = {c.name: c for c in doctor_mod.assess(_facts())}
    assert all(c.ok for c in checks.values() if c.essential)
    assert not checks["netem qdisc (delay)"].ok and not checks["netem qdisc (delay)"].essential
    assert "relay" in checks["delay backend"].detail
    assert not checks["GPU"].ok and not checks["GPU"].essential


def test_doctor_assess_says_what_to_install():
    tools = {name: f"/usr/bin/{name}" for name in doctor_mod.TOOLS}
    tools["mnexec"] = None
    checks = {c.name: c for c in doctor_mod.assess(_facts(tools=tools, euid=1000, libiperf=None,
                                                          libiperf_error="no libiperf"))}
    assert checks["mnexec"].fix == "apt-get install mininet" and checks["mnexec"].essential
    assert checks["root"].fix == "run as root (sudo)"
    assert checks["libiperf"].fix == "apt-get install libiperf0"


def test_doctor_command_exit_code_and_json(runner, monkeypatch):
    tools = {name: f"/usr/bin/{name}" for name in doctor_mod.TOOLS}
    tools["mnexec"] = None
    monkeypatch.setattr(doctor_mod, "gather", lambda: _facts(tools=tools))
    result = runner.invoke(main, ["doctor"])
    assert result.exit_code == 1
    assert "MISSING" in result.output and "apt-get install mininet" in result.output
    assert "delay backend that will be used: relay" in result.output
    monkeypatch.setattr(doctor_mod, "gather", lambda: _facts())
    result = runner.invoke(main, ["doctor", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["ok"] is True and data["delay_backend"] == "relay"
    assert {"name", "ok", "essential", "detail", "fix"} <= set(data["checks"][0])
