"""Pure parts of the builder: addressing, routes, names, sysctls, preflight messages."""

from __future__ import annotations

from pathlib import Path

import pytest

from testbed.emulation import network as emulation
from testbed.emulation.naming import (
    IFNAMSIZ,
    NamingError,
    RunNames,
    check_topology_fits,
    new_prefix,
    validate_prefix,
)
from testbed.emulation.network import (
    EmulationError,
    plan_addresses,
    preflight,
    rps_mask,
    tcp_sysctls,
)
from testbed_core.topology import load_topology, parse_topology

TOPOS = Path(__file__).resolve().parents[3] / "topologies"


def test_2dc_addresses():
    plan = plan_addresses(load_topology(TOPOS / "2dc.yaml"))
    dc1, dc2 = plan.dcs
    assert str(dc1.subnet) == "10.200.1.0/24" and dc1.gateway_ip == "10.200.1.1"
    assert dc1.host_ips == ("10.200.1.10", "10.200.1.11")
    assert str(dc2.subnet) == "10.200.2.0/24"
    (link,) = plan.links
    assert (link.a, link.b, str(link.subnet), link.ip_a, link.ip_b) == (
        "dc1", "dc2", "10.201.0.0/30", "10.201.0.1", "10.201.0.2")
    # each gateway reaches the other DC through the peer's end of the /30
    assert [(r.dst, r.via) for r in plan.routes["dc1"]] == [("10.200.2.0/24", "10.201.0.2")]
    assert [(r.dst, r.via) for r in plan.routes["dc2"]] == [("10.200.1.0/24", "10.201.0.1")]


def test_triangle_routes_follow_lowest_latency():
    topo = load_topology(TOPOS / "3dc-triangle.yaml")
    plan = plan_addresses(topo)
    d12 = plan.link_between("dc1", "dc2")
    d23 = plan.link_between("dc2", "dc3")
    routes = {r.dst: r for r in plan.routes["dc1"]}
    # dc1 -> dc3 goes via dc2 (10 + 15 ms) rather than the direct 40 ms link
    assert routes["10.200.3.0/24"].via == d12.ip_of("dc2")
    assert routes["10.200.3.0/24"].link == d12.index
    back = {r.dst: r for r in plan.routes["dc3"]}
    assert back["10.200.1.0/24"].via == d23.ip_of("dc2")
    # subnets of the three /30s do not overlap
    nets = [link.subnet for link in plan.links]
    assert len({str(n) for n in nets}) == 3
    assert not any(a.overlaps(b) for i, a in enumerate(nets) for b in nets[i + 1:])


def test_overlapping_bases_are_refused():
    topo = parse_topology({
        "name": "x", "dcs": [{"name": "a", "hosts": 1}, {"name": "b", "hosts": 1}],
        "wan": [{"between": ["a", "b"], "rate": "1Gbit", "delay": "1ms"}],
        "addressing": {"lan_base": "10.0.0.0/8", "wan_base": "10.201.0.0/16"},
    })
    with pytest.raises(EmulationError, match="overlap: choose disjoint networks"):
        plan_addresses(topo)


def test_names_fit_ifnamsiz_at_the_limits():
    names = RunNames("tbfff")
    worst = [names.host(35, 63), names.gateway(35), names.wan(34, 35)]
    assert worst == ["tbfffdzh64", "tbfffgz", "tbfffwyz"]
    for node in worst:
        assert len(RunNames.intf(node, 99 if "g" in node[5] else 1)) <= IFNAMSIZ
    assert RunNames.intf(names.host(0, 0), 0) == "tbfffd0h1-eth0"
    with pytest.raises(NamingError, match="at most 36 DCs"):
        names.gateway(36)
    with pytest.raises(NamingError, match="at most 64 per DC"):
        names.host(0, 64)
    with pytest.raises(NamingError, match="longer than 15"):
        RunNames.intf("tbfffd0h64xyz", 0)


def test_prefix_rules():
    assert validate_prefix("tb3a7") == "tb3a7"
    with pytest.raises(NamingError, match="'tb' followed by 3 lowercase hex digits"):
        validate_prefix("xx123")
    taken = {f"tb{i:03x}" for i in range(4095)}  # all but tbfff
    assert new_prefix(lambda p: p in taken, attempts=100000) == "tbfff"
    with pytest.raises(NamingError, match="testbed clean"):
        new_prefix(lambda p: True, attempts=5)
    with pytest.raises(NamingError, match="at most 36"):
        check_topology_fits(37, [1] * 37)


def test_tcp_sysctls_cap_the_window():
    values = tcp_sysctls(1_000_000, 1_000_000, "cubic")
    assert values["net.ipv4.tcp_rmem"] == "4096 131072 1000000"
    assert values["net.ipv4.tcp_wmem"] == "4096 16384 1000000"
    assert values["net.ipv4.tcp_congestion_control"] == "cubic"
    small = tcp_sysctls(65536, 8192, "bbr")
    assert small["net.ipv4.tcp_rmem"] == "4096 65536 65536"
    assert small["net.ipv4.tcp_wmem"] == "4096 8192 8192"
    assert values["net.ipv4.tcp_slow_start_after_idle"] == "1"  # Linux's default, unless asked
    assert tcp_sysctls(1 << 20, 1 << 20, "cubic", slow_start_after_idle=False)["net.ipv4.tcp_slow_start_after_idle"] == "0"


def test_rps_mask():
    assert rps_mask(2) == "3"
    assert rps_mask(1) == "1"
    assert rps_mask(36) == "f,ffffffff"
    assert rps_mask(64) == "ffffffff,ffffffff"


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
