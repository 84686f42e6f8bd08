"""What the `testbed topo up` CLI prints for `nodes` and `pingall`, over fake nodes
(Mininet's CLI loop itself is exercised by tests/root/test_teardown.py)."""

from __future__ import annotations

import subprocess
from types import SimpleNamespace

from testbed.emulation.addressing import LinkPlan
from testbed.emulation.mininet_cli import describe_nodes, pingall
from testbed.emulation.nodes import GatewayHandle, HostHandle, WanHandle
from testbed_core.topology import parse_topology


class FakeEmulation:
    """Nodes without namespaces: `ping` succeeds unless the address is unreachable."""

    delay_backend = "relay"

    def __init__(self, unreachable: set[str] = frozenset()) -> None:
        self.unreachable = unreachable
        self.spawned: list[list[str]] = []
        topo = parse_topology({"name": "t", "dcs": [{"name": "a", "hosts": 1}, {"name": "b", "hosts": 1}],
                               "wan": [{"between": ["a", "b"], "rate": "100Mbit", "delay": "5ms"}]})

        def node(name: str, pid: int) -> SimpleNamespace:
            return SimpleNamespace(name=name, pid=pid)

        self._hosts = [HostHandle("a-h1", node("tb001d0h1", 11), self, dc="a", ip="10.200.1.10"),
                       HostHandle("b-h1", node("tb001d1h1", 12), self, dc="b", ip="10.200.2.10")]
        gw = GatewayHandle("a-gw", node("tb001g0", 13), self, dc="a", lan_ip="10.200.1.1",
                           wan_ips={"b": "10.201.0.1"})
        wan = WanHandle("wan-a-b", node("tb001w01", 14), self, link=topo.wan[0],
                        plan=LinkPlan(0, "a", "b", None, "10.201.0.1", "10.201.0.2"))
        self._all = [*self._hosts, gw, wan]

    def nodes(self):
        return list(self._all)

    def hosts(self):
        return list(self._hosts)

    def _spawn(self, handle, argv, kind, **popen_kwargs):
        self.spawned.append([str(a) for a in argv])
        ok = argv[-1] not in self.unreachable
        return subprocess.Popen(["true" if ok else "false"], **popen_kwargs)


def test_nodes_lists_addresses_and_link_settings():
    lines = describe_nodes(FakeEmulation())
    assert len(lines) == 4
    assert lines[0].split()[:4] == ["a-h1", "tb001d0h1", "pid", "11"] and lines[0].endswith("10.200.1.10")
    assert "10.200.1.1 10.201.0.1->b" in lines[2]
    assert "100 Mbit/s, RTT 10 ms (relay)" in lines[3]


def test_pingall_reports_each_pair_and_the_loss():
    emu = FakeEmulation(unreachable={"10.200.2.10"})
    lines = list(pingall(emu))
    assert lines == ["a-h1 -> X", "b-h1 -> a-h1", "*** Results: 50% dropped (1/2 received)"]
    assert emu.spawned == [["ping", "-c1", "-W2", "10.200.2.10"], ["ping", "-c1", "-W2", "10.200.1.10"]]
    assert list(pingall(FakeEmulation()))[-1] == "*** Results: 0% dropped (2/2 received)"
