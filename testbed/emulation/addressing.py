"""The address plan of an emulated topology: subnets, addresses, routes, interfaces.

Pure (no I/O, no Mininet): everything here follows from the topology and the run's
names, so `testbed topo show` can print it and the unit tests can check it without root.

* DC i (0-based) gets the /24 lan_base + (i+1)*256: gateway .1, hosts .10, .11 ...;
* WAN link k gets the /30 wan_base + 4k: .1 on between[0]'s gateway, .2 on the other;
* each gateway has a static route to every other DC's /24 along `Topology.routes()`
  (the lowest-latency path), so meshes of any shape work without L2 loops;
* veth pairs: host `-eth0` to a gateway port; gateway ports are numbered from 0, first
  its hosts in order, then its WAN links in topology order; a WAN node's `-eth0` faces
  between[0], `-eth1` faces between[1].
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from testbed.emulation.errors import EmulationError
from testbed.emulation.naming import RunNames
from testbed_core.topology import Topology

HOST_BASE = 10  # first host address in a DC subnet


@dataclass(frozen=True)
class DcPlan:
    """The LAN of one DC: its /24, the gateway's address and the hosts' addresses."""

    index: int
    name: str
    subnet: ipaddress.IPv4Network
    gateway_ip: str
    host_ips: tuple[str, ...]


@dataclass(frozen=True)
class LinkPlan:
    """The /30 of one WAN link and the address of each gateway on it."""

    index: int
    a: str
    b: str
    subnet: ipaddress.IPv4Network
    ip_a: str
    ip_b: str

    def ip_of(self, dc: str) -> str:
        return self.ip_a if dc == self.a else self.ip_b

    def peer_of(self, dc: str) -> str:
        return self.b if dc == self.a else self.a


@dataclass(frozen=True)
class GatewayRoute:
    """A static route on a DC gateway: another DC's subnet via the next hop's WAN address.

    (Not to be confused with the transport's routes between workers.)
    """

    dst: str  # destination DC's subnet
    via: str  # next-hop gateway address on the shared /30
    link: int  # index of the WAN link used


@dataclass(frozen=True)
class AddressPlan:
    dcs: tuple[DcPlan, ...]
    links: tuple[LinkPlan, ...]
    routes: dict[str, tuple[GatewayRoute, ...]]  # gateway DC -> routes to the other DCs

    def dc(self, name: str) -> DcPlan:
        for d in self.dcs:
            if d.name == name:
                return d
        raise KeyError(name)

    def link_between(self, a: str, b: str) -> LinkPlan:
        for link in self.links:
            if {link.a, link.b} == {a, b}:
                return link
        raise KeyError(f"no WAN link between {a} and {b}")


def plan_addresses(topology: Topology) -> AddressPlan:
    """Subnets, addresses and static routes for `topology`."""
    lan = ipaddress.ip_network(topology.addressing.lan_base)
    wan = ipaddress.ip_network(topology.addressing.wan_base)
    if lan.overlaps(wan):
        raise EmulationError(
            f"addressing.lan_base {lan} and addressing.wan_base {wan} overlap: choose disjoint networks"
        )
    dcs = []
    for i, dc in enumerate(topology.dcs):
        if (i + 1) >= 2 ** (24 - lan.prefixlen):
            raise EmulationError(f"addressing.lan_base {lan} has no room for a /24 for DC #{i + 1}")
        subnet = ipaddress.ip_network(f"{lan.network_address + (i + 1) * 256}/24")
        base = subnet.network_address
        dcs.append(DcPlan(i, dc.name, subnet, str(base + 1),
                          tuple(str(base + HOST_BASE + j) for j in range(len(dc.hosts)))))
    links = []
    for k, link in enumerate(topology.wan):
        if 4 * (k + 1) > wan.num_addresses:
            raise EmulationError(f"addressing.wan_base {wan} has no room for WAN link #{k + 1}")
        net = ipaddress.ip_network(f"{wan.network_address + 4 * k}/30")
        links.append(LinkPlan(k, link.between[0], link.between[1], net,
                              str(net.network_address + 1), str(net.network_address + 2)))
    plan = AddressPlan(tuple(dcs), tuple(links), {})
    routes: dict[str, tuple[GatewayRoute, ...]] = {}
    paths = topology.routes()
    for src in dcs:
        entries = []
        for dst in dcs:
            if dst.name == src.name:
                continue
            nxt = paths[(src.name, dst.name)][1]
            hop = plan.link_between(src.name, nxt)
            entries.append(GatewayRoute(str(dst.subnet), hop.ip_of(nxt), hop.index))
        routes[src.name] = tuple(entries)
    return AddressPlan(tuple(dcs), tuple(links), routes)


# --------------------------------------------------------------------------- interfaces


@dataclass(frozen=True)
class Veth:
    """One veth pair: the Mininet node name and interface name at each end."""

    node1: str
    intf1: str
    node2: str
    intf2: str


@dataclass(frozen=True)
class Wiring:
    """Every veth pair of a run, in creation order, with lookups by node."""

    veths: tuple[Veth, ...]

    def intf_towards(self, node: str, peer: str) -> str:
        """The interface of `node` whose veth leads to `peer` (Mininet names)."""
        for v in self.veths:
            if (v.node1, v.node2) == (node, peer):
                return v.intf1
            if (v.node2, v.node1) == (node, peer):
                return v.intf2
        raise KeyError(f"no veth between {node} and {peer}")


def plan_wiring(topology: Topology, names: RunNames) -> Wiring:
    """The veth pairs of `topology` for the run named by `names` (see the module doc)."""
    ports: dict[int, int] = {}  # DC index -> next free gateway port

    def gateway_port(dc_index: int) -> str:
        port = ports.get(dc_index, 0)
        ports[dc_index] = port + 1
        return RunNames.intf(names.gateway(dc_index), port)

    index = {dc.name: i for i, dc in enumerate(topology.dcs)}
    veths = []
    for i, dc in enumerate(topology.dcs):
        for j in range(len(dc.hosts)):
            host = names.host(i, j)
            veths.append(Veth(host, RunNames.intf(host, 0), names.gateway(i), gateway_port(i)))
    for link in topology.wan:
        a, b = index[link.between[0]], index[link.between[1]]
        wan = names.wan(a, b)
        for end, dc_index in enumerate((a, b)):
            veths.append(Veth(names.gateway(dc_index), gateway_port(dc_index), wan, RunNames.intf(wan, end)))
    return Wiring(tuple(veths))
