"""How nodes are made, the parts without a kernel: sysctls per node kind, RPS mask."""

from __future__ import annotations

from pathlib import Path

from testbed.emulation.nodes import (
    GatewayHandle,
    HostHandle,
    WanHandle,
    node_sysctls,
    rps_mask,
    tcp_sysctls,
)
from testbed_core.topology import load_topology

TOPOS = Path(__file__).resolve().parents[3] / "topologies"


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


def test_node_sysctls_by_kind():
    topo = load_topology(TOPOS / "2dc.yaml")
    host = node_sysctls(HostHandle("dc1-h1", None, None, dc="dc1"), topo)
    gateway = node_sysctls(GatewayHandle("dc1-gw", None, None, dc="dc1"), topo)
    wan = node_sysctls(WanHandle("wan-dc1-dc2", None, None), topo)
    for values in (host, gateway, wan):
        assert values["net.ipv6.conf.all.disable_ipv6"] == "1"
    assert gateway["net.ipv4.ip_forward"] == "1" and gateway["net.ipv4.conf.all.rp_filter"] == "0"
    assert "net.ipv4.ip_forward" not in host and "net.ipv4.ip_forward" not in wan
    tcp = topo.tcp_for("dc1")
    assert host["net.ipv4.tcp_rmem"].split()[-1] == str(tcp.rmem_max)
    assert host["net.ipv4.tcp_congestion_control"] == tcp.congestion_control
    assert not any(key.startswith("net.ipv4.tcp_") for key in {**gateway, **wan})
