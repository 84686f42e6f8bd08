"""The address plan: subnets, addresses, lowest-latency routes and veth names (pure)."""

from __future__ import annotations

from pathlib import Path

import pytest

from testbed.emulation.addressing import plan_addresses, plan_wiring
from testbed.emulation.naming import RunNames
from testbed_core.topology import TopologyError, load_topology, parse_topology

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
    # refused when the file is read (Addressing's own check), before any address plan
    with pytest.raises(TopologyError, match="overlap: choose disjoint networks"):
        parse_topology({
            "name": "x", "dcs": [{"name": "a", "hosts": 1}, {"name": "b", "hosts": 1}],
            "wan": [{"between": ["a", "b"], "rate": "1Gbit", "delay": "1ms"}],
            "addressing": {"lan_base": "10.0.0.0/8", "wan_base": "10.201.0.0/16"},
        })


def test_2dc_wiring_numbers_gateway_ports_hosts_first():
    wiring = plan_wiring(load_topology(TOPOS / "2dc.yaml"), RunNames("tb123"))
    assert [(v.node1, v.intf1, v.node2, v.intf2) for v in wiring.veths] == [
        ("tb123d0h1", "tb123d0h1-eth0", "tb123g0", "tb123g0-eth0"),
        ("tb123d0h2", "tb123d0h2-eth0", "tb123g0", "tb123g0-eth1"),
        ("tb123d1h1", "tb123d1h1-eth0", "tb123g1", "tb123g1-eth0"),
        ("tb123d1h2", "tb123d1h2-eth0", "tb123g1", "tb123g1-eth1"),
        ("tb123g0", "tb123g0-eth2", "tb123w01", "tb123w01-eth0"),  # eth0 faces between[0]
        ("tb123g1", "tb123g1-eth2", "tb123w01", "tb123w01-eth1"),
    ]
    assert wiring.intf_towards("tb123g1", "tb123w01") == "tb123g1-eth2"
    assert wiring.intf_towards("tb123w01", "tb123g1") == "tb123w01-eth1"
    with pytest.raises(KeyError, match="no veth between tb123d0h1 and tb123g1"):
        wiring.intf_towards("tb123d0h1", "tb123g1")


def test_triangle_wiring_gives_every_interface_one_unique_name():
    topo = load_topology(TOPOS / "3dc-triangle.yaml")
    wiring = plan_wiring(topo, RunNames("tbfff"))
    ends = [(v.node1, v.intf1) for v in wiring.veths] + [(v.node2, v.intf2) for v in wiring.veths]
    assert len({intf for _, intf in ends}) == len(ends)
    assert all(intf.startswith(node + "-eth") for node, intf in ends)
    hosts = sum(len(dc.hosts) for dc in topo.dcs)
    assert len(wiring.veths) == hosts + 2 * len(topo.wan)
    # each gateway: its hosts on eth0.., then one port per WAN link it ends
    gw0 = sorted(intf for node, intf in ends if node == "tbfffg0")
    assert len(gw0) == len(topo.dcs[0].hosts) + sum(topo.dcs[0].name in w.between for w in topo.wan)
