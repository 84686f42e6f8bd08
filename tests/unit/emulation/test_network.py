"""The network lifecycle without root: preflight messages, and a build that fails
early creates nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

from testbed.emulation import network as emulation
from testbed.emulation.naming import NamingError
from testbed.emulation.network import EmulationError, preflight
from testbed_core.topology import load_topology

TOPOS = Path(__file__).resolve().parents[3] / "topologies"


def test_preflight_not_root(monkeypatch):
    monkeypatch.setattr(emulation.os, "geteuid", lambda: 1000)
    with pytest.raises(EmulationError, match=r"run as root \(sudo\)"):
        preflight()


def test_preflight_mnexec_missing(monkeypatch):
    monkeypatch.setattr(emulation.os, "geteuid", lambda: 0)
    monkeypatch.setattr(emulation.shutil, "which", lambda name: None if name == "mnexec" else f"/usr/bin/{name}")
    with pytest.raises(EmulationError, match="apt-get install mininet"):
        preflight()


def test_preflight_ifconfig_missing(monkeypatch):
    monkeypatch.setattr(emulation.os, "geteuid", lambda: 0)
    monkeypatch.setattr(emulation.shutil, "which", lambda name: None if name == "ifconfig" else f"/usr/bin/{name}")
    with pytest.raises(EmulationError, match="apt-get install net-tools"):
        preflight()


def test_start_when_not_root_says_so_and_creates_nothing(monkeypatch, tmp_path):
    monkeypatch.setattr(emulation.os, "geteuid", lambda: 1000)
    emu = emulation.Emulation(load_topology(TOPOS / "2dc.yaml"), records_dir=tmp_path)
    with pytest.raises(EmulationError, match=r"run as root \(sudo\)"):
        with emu:
            pass
    assert list(tmp_path.iterdir()) == []
    assert emu.hosts() == []


def test_bad_prefix_is_refused_at_construction():
    with pytest.raises(NamingError, match="'tb' followed by"):
        emulation.Emulation(load_topology(TOPOS / "2dc.yaml"), prefix="node1")
