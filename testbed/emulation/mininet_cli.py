"""Mininet's interactive CLI over a running emulation (`testbed topo up`).

Mininet's CLI expects a `Mininet` network object; an emulation has no switches or
controller, so the CLI gets a mapping of our display names (dc1-h1, dc1-gw,
wan-dc1-dc2) to nodes instead, with `nodes` and `pingall` of our own. Commands that
need a full Mininet network say they are not available instead of crashing.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import IO, TYPE_CHECKING, Any

from testbed.emulation.nodes import GatewayHandle, HostHandle, WanHandle

if TYPE_CHECKING:
    from testbed.emulation.network import Emulation


def describe_nodes(emu: Emulation) -> list[str]:
    """One line per node: display name, Mininet name, PID, addresses or link settings."""
    lines = []
    for n in emu.nodes():
        extra = ""
        if isinstance(n, HostHandle):
            extra = f"{n.ip}"
        elif isinstance(n, GatewayHandle):
            extra = f"{n.lan_ip} " + " ".join(f"{ip}->{peer}" for peer, ip in n.wan_ips.items())
        elif isinstance(n, WanHandle) and n.link is not None:
            extra = (f"{n.link.rate / 1e6:g} Mbit/s, RTT {n.link.rtt_s * 1e3:g} ms "
                     f"({emu.delay_backend})")
        lines.append(f"{n.name:16} {n.mn_name:12} pid {n.pid:<7} {extra}")
    return lines


def pingall(emu: Emulation) -> Iterator[str]:
    """Ping every host from every other one; one line per source host as it is done,
    then a summary."""
    hosts = emu.hosts()
    lost = 0
    for a in hosts:
        row = []
        for b in hosts:
            if a is b:
                continue
            ok = a.run(["ping", "-c1", "-W2", b.ip], timeout=5).returncode == 0
            lost += not ok
            row.append(b.name if ok else "X")
        yield f"{a.name} -> {' '.join(row)}"
    total = len(hosts) * (len(hosts) - 1)
    yield f"*** Results: {100 * lost // max(total, 1)}% dropped ({total - lost}/{total} received)"


def run_cli(emu: Emulation, stdin: IO[str] | None = None) -> None:
    """Mininet's CLI on `emu`'s nodes until the user exits (or `stdin` ends)."""
    from mininet.cli import CLI
    from mininet.log import setLogLevel

    class _Net(dict):
        switches: list = []
        controllers: list = []
        links: list = []
        terms: list = []

    net = _Net()
    for n in emu.nodes():
        net[n.name] = n.node
    net.hosts = [h.node for h in emu.hosts()]

    class TestbedCLI(CLI):
        prompt = "testbed> "
        identchars = CLI.identchars + "-"  # display names are dc1-h1, wan-dc1-dc2

        def do_nodes(self, line: str) -> None:
            "List the nodes: display name, Mininet name, PID, addresses."
            print("\n".join(describe_nodes(emu)))

        do_net = do_nodes
        do_dump = do_nodes

        def do_pingall(self, line: str) -> None:
            "Ping between all hosts."
            for text in pingall(emu):
                print(text)

        def onecmd(self, line: str) -> Any:
            try:
                return super().onecmd(line)
            except AttributeError:
                print("*** this command needs a full Mininet network; it is not available here "
                      "(run programs on nodes instead: `dc1-h1 iperf3 -c dc2-h1`)")
                return None

    setLogLevel("output")
    TestbedCLI(net, stdin=stdin or sys.stdin)
