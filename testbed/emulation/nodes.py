"""The nodes of an emulation: what hosts, DC gateways and WAN link nodes are and how
each kind is made.

Every node is a `mininet.node.Host` (a shell in its own network namespace); no
switch, no OpenFlow controller:

* a host has one interface towards its gateway, an address in its DC's /24, a default
  route to the gateway, HTB at the DC's lan_rate on egress, and the per-host TCP
  settings (congestion control, tcp_rmem/tcp_wmem maxima) written in its namespace;
* a gateway forwards (namespaced ip_forward): a Linux bridge over its host ports
  carries the LAN address, each WAN port its /30 address, and static routes lead to
  the other DCs;
* a WAN link node is layer 2 between two gateways: both egress interfaces get
  `shaping.egress_shaper` (HTB rate + BDP bfifo, with a netem leaf under the netem
  backend); under the netem backend a bridge joins them, under the relay backend the
  lifecycle starts the delay line between them.

Offloads stay on (the relay wants GSO super-packets); receive packet steering keeps
each flow on one CPU (see `enable_rps`). The handles are what callers get back:
run programs inside a node with `popen`/`run`.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from testbed.emulation.addressing import GatewayRoute, LinkPlan
from testbed.emulation.errors import EmulationError
from testbed.emulation.naming import RunNames
from testbed_core.topology import Topology, WanLink

if TYPE_CHECKING:
    from testbed.emulation.network import Emulation
    from testbed.emulation.nodeconf import NodeOp, NodeReply

LAN_RTT_S = 0.001  # sizes the LAN queues (one BDP of a 1 ms LAN)


# --------------------------------------------------------------------------- handles


@dataclass(eq=False)
class NodeHandle:
    """One emulated node (a Mininet Host): run programs inside its namespace."""

    name: str  # display name, e.g. dc1-h1
    node: Any  # mininet.node.Host
    emu: Emulation = field(repr=False)
    netns_inode: int | None = field(default=None, repr=False)

    @property
    def pid(self) -> int:
        return int(self.node.pid)

    @property
    def mn_name(self) -> str:
        return str(self.node.name)

    @property
    def remote(self) -> bool:
        """Whether this node is on a server reached over SSH (its PID is that server's)."""
        cluster = getattr(self.emu, "cluster", None)
        return cluster is not None and cluster.is_remote(self.mn_name)

    def configure(self, *ops: NodeOp) -> NodeReply:
        """Apply configuration requests (testbed.emulation.nodeconf) in this node: through
        its PID on this machine, through its server's node agent on a server reached
        over SSH (the same code, run there, through the PID there);
        the reply (nodeconf.NodeReply). EmulationError, naming the node, when one fails."""
        from testbed.emulation.nodeconf import NodeNs, NodeRequest, apply

        if self.remote:
            reply = self.emu.cluster.request(self.mn_name, ops)
        else:
            reply = apply(NodeRequest(ops=list(ops)), NodeNs.of_pid(self.pid))
        if not reply.ok:
            raise EmulationError(f"{self.name}: {reply.error}")
        return reply

    def fetch(self, path: str | Path, into: Path) -> Path:
        """A file a program in this node wrote (at `path` as the node sees it), where this
        process can read it: the path itself on this machine; on a server reached over
        SSH, a copy in the folder `into`."""
        if not self.remote:
            return Path(path)
        return self.emu.cluster.fetch(self.mn_name, str(path), into)  # type: ignore[no-any-return]

    def tx_counters(self, intfs: Sequence[str]) -> dict[str, tuple[int, int]]:
        """(bytes, packets) each of `intfs` has sent."""
        from testbed.emulation.nodeconf import CountersOp

        return dict(self.configure(CountersOp(intfs=list(intfs))).counters)

    def popen(self, argv: Sequence[str] | str, **popen_kwargs: Any) -> subprocess.Popen:
        """subprocess.Popen of `argv` inside this node's namespace. Recorded, and
        killed at teardown if still running."""
        return self.emu._spawn(self, argv, kind="process", **popen_kwargs)

    def popen_warm(self, argv: Sequence[str], *, preload: Sequence[str], **popen_kwargs: Any) -> Any:
        """Like `popen` for ``python -m MODULE ...``, forked from a fork server that
        imported `preload` once (warmstart.py); on a node of another server, a fresh
        interpreter through its SSH. Recorded, and killed at teardown if still running."""
        return self.emu._spawn_warm(self, argv, preload=preload, **popen_kwargs)

    def run(self, argv: Sequence[str] | str, timeout: float | None = None, check: bool = False,
            input: str | bytes | None = None, text: bool = True,
            **popen_kwargs: Any) -> subprocess.CompletedProcess:
        """Run to completion inside the node; like subprocess.run (output captured)."""
        popen_kwargs.setdefault("stdout", subprocess.PIPE)
        popen_kwargs.setdefault("stderr", subprocess.PIPE)
        if input is not None:
            popen_kwargs.setdefault("stdin", subprocess.PIPE)
        proc = self.popen(argv, text=text, **popen_kwargs)
        try:
            out, err = proc.communicate(input=input, timeout=timeout)
        except BaseException:
            proc.kill()
            proc.communicate()
            raise
        result = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
        if check:
            result.check_returncode()
        return result


@dataclass(eq=False)
class HostHandle(NodeHandle):
    dc: str = ""
    ip: str = ""
    index: int = 0


@dataclass(eq=False)
class GatewayHandle(NodeHandle):
    dc: str = ""
    lan_ip: str = ""
    wan_ips: dict[str, str] = field(default_factory=dict)  # peer DC -> own address on that link


@dataclass(eq=False)
class WanHandle(NodeHandle):
    link: WanLink | None = None
    plan: LinkPlan | None = None
    intfs: tuple[str, str] = ("", "")  # towards between[0], towards between[1]
    relay: subprocess.Popen | None = field(default=None, repr=False)
    relay_out: OutputDrain | None = field(default=None, repr=False)


class OutputDrain(threading.Thread):
    """Keeps reading a pipe so the child never blocks on it; remembers the tail and
    the latest line that starts with `watch` (a relay's STATS line)."""

    def __init__(self, stream: IO[str], keep: int = 50, watch: str | None = None) -> None:
        super().__init__(daemon=True, name="emu-drain")
        self.stream = stream
        self.lines: deque[str] = deque(maxlen=keep)
        self.watch = watch
        self.watched: tuple[int, str] = (0, "")  # (how many seen, the latest)

    def run(self) -> None:
        try:
            for line in self.stream:
                self.lines.append(line.rstrip())
                if self.watch and line.startswith(self.watch):
                    self.watched = (self.watched[0] + 1, line[len(self.watch):].strip())
        except (OSError, ValueError):
            pass

    def tail(self) -> str:
        return "\n".join(self.lines)


# --------------------------------------------------------------------------- Mininet nodes


def new_mininet_host(mn_name: str) -> Any:
    """A Mininet Host: a shell in a fresh network (and mount) namespace."""
    from mininet.node import Host

    return Host(mn_name)


def close_mininet_host(node: Any) -> None:
    """Release a Mininet node whose shell was killed (without Mininet's global cleanup)."""
    from mininet.node import Node

    shell = getattr(node, "shell", None)
    if shell is None:
        return
    try:
        if shell.poll() is None:
            os.killpg(shell.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    master = getattr(node, "stdin", None)
    if master is not None and not master.closed:
        Node.outToNode.pop(master.fileno(), None)
        Node.inToNode.pop(master.fileno(), None)
        close_quietly(master)
    with contextlib.suppress(OSError, TypeError):
        os.close(node.slave)
    wait_quietly(shell, 2.0)
    node.shell = None


def close_quietly(*streams: IO[Any] | None) -> None:
    """Close each of `streams` that is there; one already closed or broken is no error
    (a process being torn down)."""
    for stream in streams:
        if stream is not None:
            with contextlib.suppress(OSError, ValueError):
                stream.close()


def wait_quietly(proc: subprocess.Popen[Any], timeout_s: float) -> None:
    """Give `proc` up to `timeout_s` to end (reaped if it did); one still running is left as is."""
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=timeout_s)


def node_alive(handle: NodeHandle) -> bool:
    """Whether the node's shell (and so its namespace) is still there."""
    shell = getattr(handle.node, "shell", None)
    return shell is not None and shell.poll() is None


# --------------------------------------------------------------------------- sysctls


def tcp_sysctls(rmem_max: int, wmem_max: int, congestion_control: str,
                slow_start_after_idle: bool = True) -> dict[str, str]:
    """The namespaced sysctls that give a host its per-flow window limit."""
    return {
        "net.ipv4.tcp_slow_start_after_idle": "1" if slow_start_after_idle else "0",
        "net.ipv4.tcp_congestion_control": congestion_control,
        "net.ipv4.tcp_rmem": f"4096 {min(131072, rmem_max)} {rmem_max}",
        "net.ipv4.tcp_wmem": f"4096 {min(16384, wmem_max)} {wmem_max}",
        # Do not carry ssthresh/RTT from one measurement to the next.
        "net.ipv4.tcp_no_metrics_save": "1",
    }


NODE_SYSCTLS = {  # every node: no IPv6 chatter (DAD, router solicitations) on the links
    "net.ipv6.conf.all.disable_ipv6": "1",
    "net.ipv6.conf.default.disable_ipv6": "1",
}
GATEWAY_SYSCTLS = {
    "net.ipv4.ip_forward": "1",
    "net.ipv4.conf.all.rp_filter": "0",
    "net.ipv4.conf.default.rp_filter": "0",
}


def node_sysctls(handle: NodeHandle, topology: Topology) -> dict[str, str]:
    """The namespaced sysctls of a node: IPv6 off everywhere, forwarding on gateways,
    the DC's TCP settings on hosts."""
    values = dict(NODE_SYSCTLS)
    if isinstance(handle, GatewayHandle):
        values.update(GATEWAY_SYSCTLS)
    elif isinstance(handle, HostHandle):
        tcp = topology.tcp_for(handle.dc)
        values.update(tcp_sysctls(tcp.rmem_max, tcp.wmem_max, tcp.congestion_control,
                                  tcp.slow_start_after_idle))
    return values


def write_sysctls(handle: NodeHandle, values: dict[str, str]) -> list[str]:
    """Write `values` inside the node's namespace; one message per value that failed."""
    from testbed.emulation.nodeconf import SysctlsOp

    return list(handle.configure(SysctlsOp(values=values)).sysctl_errors)


# --------------------------------------------------------------------------- receive steering


def rps_mask(ncpus: int) -> str:
    """All CPUs as a sysfs cpumask ("3", "ffffffff,ffffffff", ...)."""
    value = (1 << max(1, ncpus)) - 1
    groups = []
    while True:
        groups.append(f"{value & 0xFFFFFFFF:x}")
        value >>= 32
        if not value:
            break
    return ",".join(reversed(groups))


def enable_rps(handle: NodeHandle, mask: str) -> None:
    """Receive packet steering on every interface of a node.

    A veth delivers a packet to the backlog of the CPU that sent it; when the
    packets of one flow are sent from different CPUs (ACK-clocked softirqs, HTB
    timers) they overtake each other, and TCP sees reordering, spurious fast
    retransmits and a halved window, so goodput stays well under the link rate.
    RPS hashes each flow to one CPU, which keeps it in order. The node's own sysfs
    is reached through /proc/<pid>/root (its mount namespace), on this machine or,
    for a server reached over SSH, by that server's node agent; no shell command.
    """
    from testbed.emulation.nodeconf import RpsOp

    handle.configure(RpsOp(mask=mask))


# --------------------------------------------------------------------------- configuration


def configure_host(host: HostHandle, intf: str, gateway_ip: str, lan_rate: float) -> None:
    """Address, default route and LAN shaper of a host whose veth is `intf`."""
    from testbed.emulation import shaping
    from testbed.emulation.nodeconf import HostOp

    host.configure(HostOp(intf=intf, ip=host.ip, gateway_ip=gateway_ip, lan_rate=lan_rate,
                          queue_bytes=shaping.queue_bytes_for(lan_rate, LAN_RTT_S), where=host.name))


def configure_gateway(gw: GatewayHandle, host_ports: Sequence[str], wan_ports: Sequence[tuple[str, str]],
                      routes: Sequence[GatewayRoute], lan_rate: float) -> None:
    """The LAN bridge over `host_ports` (shaped at `lan_rate`, carrying the gateway's
    LAN address), each WAN port with its /30 address (`wan_ports`: (port, address)),
    and the static routes to the other DCs."""
    from testbed.emulation import shaping
    from testbed.emulation.nodeconf import GatewayOp

    gw.configure(GatewayOp(bridge=RunNames.bridge(gw.mn_name), host_ports=list(host_ports),
                           wan_ports=[(p, a) for p, a in wan_ports], routes=[(r.dst, r.via) for r in routes],
                           lan_ip=gw.lan_ip, lan_rate=lan_rate,
                           queue_bytes=shaping.queue_bytes_for(lan_rate, LAN_RTT_S), where=gw.name))


def configure_wan_node(w: WanHandle, delay_backend: str) -> None:
    """Shape both egress interfaces of a WAN link node at the link's rate and queue;
    under the netem backend add the link's delay, jitter and loss as a netem leaf and
    bridge the two interfaces (the relay backend's delay line is started later)."""
    from testbed.emulation.nodeconf import NetemSpec, WanOp

    assert w.link is not None
    link = w.link
    netem = bridge = None
    if delay_backend == "netem":
        netem = NetemSpec(delay_s=link.delay, jitter_s=link.jitter, loss=link.loss)
        bridge = RunNames.bridge(w.mn_name)
    w.configure(WanOp(intfs=w.intfs, rate=link.rate, queue_bytes=link.queue_bytes, netem=netem, bridge=bridge,
                      where=w.name))
