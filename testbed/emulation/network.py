"""Build a topology on Mininet nodes, shape it, and tear it down without a trace.

Layout (nothing is created in the root namespace):

    host ──veth── gateway (Linux bridge inside its namespace, LAN IP on the bridge)
    gateway ──veth── WAN link node ──veth── gateway of the other DC

* every host, DC gateway and WAN link is a `mininet.node.Host` (a shell in its own
  network namespace); links are `mininet.link.Link` veth pairs; no switch, no
  OpenFlow controller;
* DC i (0-based) gets subnet lan_base + (i+1)*256 /24: gateway .1, hosts .10, .11 ...;
  WAN link k gets the /30 wan_base + 4k (.1 on between[0]'s gateway, .2 on the other);
* gateways forward (namespaced ip_forward) along `Topology.routes()` (lowest latency),
  so meshes of any shape work without L2 loops; hosts default-route to their gateway;
* the WAN node is layer 2: the `relay` backend runs `python -m testbed.emulation.delayline`
  between its two interfaces, the `netem` backend bridges them; either way both
  egress interfaces get `testbed.emulation.shaping.egress_shaper` (HTB rate + BDP bfifo, with a
  netem leaf under the netem backend). LAN links get HTB at the DC's lan_rate;
* per-host TCP settings (congestion control, tcp_rmem/tcp_wmem maxima) are written
  inside each host's namespace; offloads stay on (the relay wants GSO super-packets);
  receive packet steering keeps each flow on one CPU (no reordering, see _enable_rps).

Everything created is listed in a run record (`testbed.emulation.records`) before or as it is
created; teardown (normal exit, exception, Ctrl-C, SIGTERM) kills what the run
started and deletes the record, and `testbed clean` finishes the job after SIGKILL.
"""

from __future__ import annotations

import ipaddress
import os
import select
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from testbed.emulation.naming import (
    RunNames,
    check_topology_fits,
    display_gateway,
    display_host,
    display_wan,
    new_prefix,
    validate_prefix,
)
from testbed.emulation.records import (
    ENV_RUN,
    ProcFS,
    RecordError,
    RunRecord,
    execute,
    kill_and_wait,
    list_records,
    plan_clean,
    prefix_in_use,
    shared_sysctl_origin,
)
from testbed_core.topology import Topology, WanLink, load_topology

LAN_RTT_S = 0.001  # sizes the LAN queues (one BDP of a 1 ms LAN)
HOST_BASE = 10  # first host address in a DC subnet
RELAY_READY_TIMEOUT_S = 10.0
TERM_GRACE_S = 1.0


class EmulationError(RuntimeError):
    """The emulation could not be built; the message says what to do."""


# --------------------------------------------------------------------------- addressing plan


@dataclass(frozen=True)
class DcPlan:
    index: int
    name: str
    subnet: ipaddress.IPv4Network
    gateway_ip: str
    host_ips: tuple[str, ...]


@dataclass(frozen=True)
class LinkPlan:
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
class Route:
    dst: str  # subnet
    via: str  # next-hop gateway address
    link: int  # index of the WAN link used


@dataclass(frozen=True)
class AddressPlan:
    dcs: tuple[DcPlan, ...]
    links: tuple[LinkPlan, ...]
    routes: dict[str, tuple[Route, ...]]  # gateway DC -> routes to the other DCs

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
    """Subnets, addresses and static routes for `topology` (pure: no I/O)."""
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
    routes: dict[str, tuple[Route, ...]] = {}
    paths = topology.routes()
    for src in dcs:
        entries = []
        for dst in dcs:
            if dst.name == src.name:
                continue
            nxt = paths[(src.name, dst.name)][1]
            hop = plan.link_between(src.name, nxt)
            entries.append(Route(str(dst.subnet), hop.ip_of(nxt), hop.index))
        routes[src.name] = tuple(entries)
    return AddressPlan(tuple(dcs), tuple(links), routes)


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
OPTIONAL_PREFIXES = ("net.ipv6.",)  # absent on kernels without IPv6: skipped


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

    def popen(self, argv: Sequence[str] | str, **popen_kwargs: Any) -> subprocess.Popen:
        """subprocess.Popen of `argv` inside this node's namespace. Recorded, and
        killed at teardown if still running."""
        return self.emu._spawn(self, argv, kind="process", **popen_kwargs)

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
    relay_out: _Drain | None = field(default=None, repr=False)


class _Drain(threading.Thread):
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


# --------------------------------------------------------------------------- the emulation


def preflight() -> None:
    """Fail early, in words the user can act on, when the machine cannot build."""
    if os.geteuid() != 0:
        raise EmulationError("building an emulation needs root: run as root (sudo)")
    if shutil.which("mnexec") is None:
        raise EmulationError("mnexec (Mininet's helper) is not installed: apt-get install mininet")
    if shutil.which("ifconfig") is None:  # Mininet's Node class insists on it
        raise EmulationError("ifconfig is not installed (Mininet needs it): apt-get install net-tools")


class Emulation:
    """A topology built on Mininet nodes. Use as a context manager::

        with Emulation.from_file("topologies/2dc.yaml") as emu:
            h = emu.host("dc1", 0)
            h.run(["ping", "-c1", emu.host("dc2", 0).ip])

    Start it from a thread that outlives it (normally the main thread): delay lines
    die with the thread that spawned them (PR_SET_PDEATHSIG follows the thread). In
    the main thread, SIGTERM and SIGHUP unwind through the `with` block like Ctrl-C
    does, and teardown itself ignores them so that it always completes.
    """

    def __init__(self, topology: Topology, prefix: str | None = None,
                 delay_backend: str | None = None, *, records_dir: Path | None = None,
                 progress: Callable[[str], None] | None = None) -> None:
        self.topology = topology
        self.plan = plan_addresses(topology)
        check_topology_fits(len(topology.dcs), [len(dc.hosts) for dc in topology.dcs])
        self._requested_prefix = validate_prefix(prefix) if prefix else None
        self._requested_backend = delay_backend
        self._records_dir = records_dir
        self._progress = progress or (lambda msg: None)
        self.prefix: str = ""
        self.names: RunNames | None = None
        self.record: RunRecord | None = None
        self.delay_backend: str = ""
        self.build_s: float | None = None
        self.teardown_s: float | None = None
        self._hosts: list[HostHandle] = []
        self._gateways: dict[str, GatewayHandle] = {}
        self._wans: list[WanHandle] = []
        self._all: list[NodeHandle] = []
        self._procs: dict[int, subprocess.Popen] = {}
        self._drains: list[_Drain] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._changer: threading.Thread | None = None
        self._saved_handlers: dict[int, Any] = {}
        self._started = False
        self._procfs = ProcFS()

    @classmethod
    def from_file(cls, path: str | Path, prefix: str | None = None,
                  delay_backend: str | None = None, **kwargs: Any) -> Emulation:
        return cls(load_topology(path), prefix=prefix, delay_backend=delay_backend, **kwargs)

    # -- lifecycle

    def __enter__(self) -> Emulation:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        if self._started:
            raise EmulationError("this emulation is already running")
        self._started = True
        self._hosts, self._gateways, self._wans, self._all = [], {}, [], []
        self._stop = threading.Event()
        self.build_s = self.teardown_s = None
        self._install_signal_handlers()
        t0 = time.perf_counter()
        try:
            self._build()
        except BaseException:
            self.stop()
            raise
        self.build_s = time.perf_counter() - t0
        self._start_changes()

    def stop(self) -> None:
        """Tear down everything this run created. Safe to call twice."""
        if not self._started:
            return
        self._started = False
        t0 = time.perf_counter()
        old = self._ignore_signals()
        try:
            self._teardown()
        finally:
            self._restore_signals(old)
            self._restore_signal_handlers()
            self.teardown_s = time.perf_counter() - t0

    # -- accessors

    def host(self, dc: str, index: int = 0) -> HostHandle:
        hosts = self.hosts(dc)
        if not hosts and any(d.name == dc for d in self.topology.dcs):
            raise EmulationError("the emulation is not running: use `with Emulation(...) as emu:`")
        if not hosts:
            raise KeyError(f"no DC named {dc!r} (defined: {', '.join(d.name for d in self.topology.dcs)})")
        if not 0 <= index < len(hosts):
            raise IndexError(f"DC {dc} has {len(hosts)} hosts; index {index} is out of range (0-based)")
        return hosts[index]

    def hosts(self, dc: str | None = None) -> list[HostHandle]:
        return [h for h in self._hosts if dc is None or h.dc == dc]

    def gateway(self, dc: str) -> GatewayHandle:
        try:
            return self._gateways[dc]
        except KeyError:
            raise KeyError(f"no DC named {dc!r}") from None

    def wan_node(self, a: str, b: str) -> WanHandle:
        for w in self._wans:
            if w.plan and {w.plan.a, w.plan.b} == {a, b}:
                return w
        raise KeyError(f"no WAN link between {a!r} and {b!r}")

    def nodes(self) -> list[NodeHandle]:
        return list(self._all)

    def node(self, name: str) -> NodeHandle:
        """A node by display name (dc1-h1, dc1-gw, wan-dc1-dc2) or Mininet name."""
        for n in self._all:
            if name in (n.name, n.mn_name):
                return n
        raise KeyError(f"no node named {name!r}")

    def cli(self) -> None:
        """Mininet's interactive CLI over this emulation's nodes (display names)."""
        _run_cli(self)

    # -- signals

    def _install_signal_handlers(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return

        def unwind(signum: int, _frame: object) -> None:
            raise SystemExit(128 + signum)

        for sig in (signal.SIGTERM, signal.SIGHUP):
            self._saved_handlers[sig] = signal.signal(sig, unwind)

    def _restore_signal_handlers(self) -> None:
        for sig, handler in self._saved_handlers.items():
            signal.signal(sig, handler)
        self._saved_handlers.clear()

    @staticmethod
    def _ignore_signals() -> dict[int, Any]:
        if threading.current_thread() is not threading.main_thread():
            return {}
        return {sig: signal.signal(sig, signal.SIG_IGN)
                for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}

    @staticmethod
    def _restore_signals(old: dict[int, Any]) -> None:
        for sig, handler in old.items():
            signal.signal(sig, handler)

    # -- build

    def _build(self) -> None:
        from testbed.emulation.kernel import BackendError, choose_delay_backend, detect_features

        preflight()
        self._progress("probing kernel features")
        try:
            self.delay_backend = choose_delay_backend(detect_features(), self._requested_backend)
        except BackendError as exc:
            raise EmulationError(str(exc)) from None
        self._claim_record()
        assert self.names is not None and self.record is not None
        self._progress(f"run {self.prefix}: creating nodes")
        self._allow_congestion_controls()
        self._create_nodes()
        self._progress(f"run {self.prefix}: configuring {len(self._all)} namespaces")
        for handle in self._all:
            self._write_sysctls(handle, self._sysctls_for(handle))
        self._progress(f"run {self.prefix}: creating links")
        self._create_links()
        self._configure()
        mask = rps_mask(os.cpu_count() or 1)
        for handle in self._all:
            _enable_rps(handle, mask)
        if self.delay_backend == "relay":
            self._progress(f"run {self.prefix}: starting {len(self._wans)} delay lines")
            self._start_relays()

    def _claim_record(self) -> None:
        procfs = self._procfs
        for _ in range(8):
            prefix = self._requested_prefix or new_prefix(
                lambda p: prefix_in_use(p, self._records_dir, procfs))
            try:
                self.record = RunRecord.create(prefix, self.topology.name, self._records_dir, procfs)
            except RecordError:
                if self._requested_prefix:
                    raise EmulationError(
                        f"run prefix {prefix} is in use by another run (or its leftovers: `testbed clean`)"
                    ) from None
                continue
            self.prefix = prefix
            self.names = RunNames(prefix)
            return
        raise EmulationError("could not claim a free run prefix; `testbed clean` removes leftovers")

    def _new_node(self, mn_name: str) -> Any:
        from mininet.node import Host

        node = Host(mn_name)
        assert self.record is not None
        entry = self.record.add_node(mn_name, node.pid, self._procfs)
        node._tb_netns = entry.netns
        return node

    def _create_nodes(self) -> None:
        names = self.names
        assert names is not None
        for dplan, dc in zip(self.plan.dcs, self.topology.dcs, strict=True):
            gw = GatewayHandle(display_gateway(dc.name), self._new_node(names.gateway(dplan.index)), self,
                               dc=dc.name, lan_ip=dplan.gateway_ip)
            gw.netns_inode = gw.node._tb_netns
            self._gateways[dc.name] = gw
            self._all.append(gw)
            for j, hname in enumerate(dc.hosts):
                h = HostHandle(display_host(dc.name, hname), self._new_node(names.host(dplan.index, j)), self,
                               dc=dc.name, ip=dplan.host_ips[j], index=j)
                h.netns_inode = h.node._tb_netns
                self._hosts.append(h)
                self._all.append(h)
        index = {d.name: d.index for d in self.plan.dcs}
        for lplan, link in zip(self.plan.links, self.topology.wan, strict=True):
            node = self._new_node(names.wan(index[lplan.a], index[lplan.b]))
            w = WanHandle(display_wan(lplan.a, lplan.b), node, self, link=link, plan=lplan,
                          intfs=(RunNames.intf(node.name, 0), RunNames.intf(node.name, 1)))
            w.netns_inode = node._tb_netns
            self._wans.append(w)
            self._all.append(w)

    def _sysctls_for(self, handle: NodeHandle) -> dict[str, str]:
        values = dict(NODE_SYSCTLS)
        if isinstance(handle, GatewayHandle):
            values.update(GATEWAY_SYSCTLS)
        elif isinstance(handle, HostHandle):
            tcp = self.topology.tcp_for(handle.dc)
            values.update(tcp_sysctls(tcp.rmem_max, tcp.wmem_max, tcp.congestion_control,
                                      tcp.slow_start_after_idle))
        return values

    def _write_sysctls(self, handle: NodeHandle, values: dict[str, str]) -> None:
        from testbed.emulation.netns import run_in_netns

        def write() -> list[str]:
            errors = []
            for key, value in values.items():
                path = Path("/proc/sys") / key.replace(".", "/")
                if not path.exists() and key.startswith(OPTIONAL_PREFIXES):
                    continue
                try:
                    with open(path, "w") as fh:
                        fh.write(value)
                except OSError as exc:
                    errors.append(f"{key}={value}: {exc.strerror or exc}")
            return errors

        errors = run_in_netns(handle.pid, write)
        if errors and any("congestion_control" in e for e in errors):
            # Another run may have just restored the machine's allowed list: allow again, retry.
            self._allow_congestion_controls()
            errors = run_in_netns(handle.pid, write)
        if errors:
            hint = ""
            if any("congestion_control" in e for e in errors):
                hint = (" (is the congestion control module loaded? e.g. modprobe tcp_bbr; "
                        "see net.ipv4.tcp_available_congestion_control)")
            raise EmulationError(f"{handle.name}: cannot set {'; '.join(errors)}{hint}")

    def _allow_congestion_controls(self) -> None:
        """A namespace may only pick a congestion control listed in the machine's
        net.ipv4.tcp_allowed_congestion_control; add the ones the topology needs
        (recorded with the old value, restored at teardown)."""
        wanted = {self.topology.tcp_for(dc.name).congestion_control for dc in self.topology.dcs}
        base = Path("/proc/sys/net/ipv4")
        try:
            allowed = (base / "tcp_allowed_congestion_control").read_text().split()
            available = (base / "tcp_available_congestion_control").read_text().split()
        except OSError:
            return
        missing = sorted(wanted - set(allowed))
        key = "net.ipv4.tcp_allowed_congestion_control"
        assert self.record is not None
        # Another live run may have widened the list already: take over its original
        # value too, so whichever run ends last restores the machine's own setting.
        inherited = shared_sysctl_origin(key, self.record)
        if not missing:
            if inherited is not None:
                self.record.add_sysctl(key, inherited, " ".join(allowed))
            return
        unavailable = [cc for cc in missing if cc not in available]
        if unavailable:
            raise EmulationError(
                f"TCP congestion control {', '.join(unavailable)} (topology tcp.congestion_control) is not "
                f"available on this kernel (available: {' '.join(available)}): "
                f"load it with modprobe tcp_{unavailable[0]}"
            )
        old = inherited if inherited is not None else " ".join(allowed)
        new = " ".join(allowed + missing)
        self.record.add_sysctl(key, old, new)
        (base / "tcp_allowed_congestion_control").write_text(new)

    def _create_links(self) -> None:
        from mininet.link import Link

        names = self.names
        assert names is not None
        for h in self._hosts:
            gw = self._gateways[h.dc]
            port = len(gw.node.intfs)
            Link(h.node, gw.node, intfName1=RunNames.intf(h.mn_name, 0),
                 intfName2=RunNames.intf(gw.mn_name, port))
        for w in self._wans:
            assert w.plan is not None
            for end, dc in enumerate((w.plan.a, w.plan.b)):
                gw = self._gateways[dc]
                port = len(gw.node.intfs)
                Link(gw.node, w.node, intfName1=RunNames.intf(gw.mn_name, port), intfName2=w.intfs[end])
                gw.wan_ips[w.plan.peer_of(dc)] = w.plan.ip_of(dc)

    def _gw_intf_towards(self, gw: GatewayHandle, peer_node: Any) -> str:
        for intf in gw.node.intfList():
            link = intf.link
            if link is None:
                continue
            other = link.intf2 if link.intf1 is intf else link.intf1
            if other.node is peer_node:
                return intf.name
        raise EmulationError(f"internal: no interface of {gw.name} towards {peer_node.name}")

    def _configure(self) -> None:
        from testbed.emulation import shaping
        from testbed.emulation.netns import open_iproute

        names = self.names
        assert names is not None
        for h in self._hosts:
            dc = self.topology.dc(h.dc)
            intf = RunNames.intf(h.mn_name, 0)
            with open_iproute(h.pid) as ipr:
                _up(ipr, "lo")
                idx = _index(ipr, intf, h.name)
                ipr.addr("add", index=idx, address=h.ip, prefixlen=24)
                _up(ipr, intf)
                ipr.route("add", dst="0.0.0.0/0", gateway=self.plan.dc(h.dc).gateway_ip)
                shaping.apply(ipr, intf, shaping.egress_shaper(
                    intf, dc.lan_rate, shaping.queue_bytes_for(dc.lan_rate, LAN_RTT_S)))
        for dc in self.topology.dcs:
            gw = self._gateways[dc.name]
            dplan = self.plan.dc(dc.name)
            bridge = RunNames.bridge(gw.mn_name)
            with open_iproute(gw.pid) as ipr:
                _up(ipr, "lo")
                ipr.link("add", ifname=bridge, kind="bridge")
                br = _index(ipr, bridge, gw.name)
                for h in self.hosts(dc.name):
                    port = self._gw_intf_towards(gw, h.node)
                    pidx = _index(ipr, port, gw.name)
                    ipr.link("set", index=pidx, master=br)
                    shaping.apply(ipr, port, shaping.egress_shaper(
                        port, dc.lan_rate, shaping.queue_bytes_for(dc.lan_rate, LAN_RTT_S)))
                ipr.addr("add", index=br, address=dplan.gateway_ip, prefixlen=24)
                _up(ipr, bridge)
                for w in self._wans:
                    assert w.plan is not None
                    if dc.name not in (w.plan.a, w.plan.b):
                        continue
                    port = self._gw_intf_towards(gw, w.node)
                    ipr.addr("add", index=_index(ipr, port, gw.name), address=w.plan.ip_of(dc.name),
                             prefixlen=30)
                    _up(ipr, port)
                for route in self.plan.routes[dc.name]:
                    ipr.route("add", dst=route.dst, gateway=route.via)
        for w in self._wans:
            assert w.link is not None and w.plan is not None
            link = w.link
            netem = None
            if self.delay_backend == "netem":
                netem = shaping.NetemParams(delay_s=link.delay, jitter_s=link.jitter, loss=link.loss)
            with open_iproute(w.pid) as ipr:
                _up(ipr, "lo")
                for intf in w.intfs:
                    _up(ipr, intf)
                    shaping.apply(ipr, intf, shaping.egress_shaper(intf, link.rate, link.queue_bytes, netem))
                if self.delay_backend == "netem":
                    bridge = RunNames.bridge(w.mn_name)
                    ipr.link("add", ifname=bridge, kind="bridge")
                    br = _index(ipr, bridge, w.name)
                    for intf in w.intfs:
                        ipr.link("set", index=_index(ipr, intf, w.name), master=br)
                    _up(ipr, bridge)

    def _start_relays(self) -> None:
        from testbed.emulation.delayline import LinkParams, relay_argv

        for w in self._wans:
            assert w.link is not None
            argv = relay_argv(w.intfs[0], w.intfs[1],
                              LinkParams(delay_s=w.link.delay, jitter_s=w.link.jitter, loss=w.link.loss),
                              python=sys.executable, control="stdin")
            proc = self._spawn(w, argv, kind="relay", stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, bufsize=1)
            w.relay = proc
        for w in self._wans:  # started all at once; now wait for each READY
            self._await_ready(w)

    def _await_ready(self, w: WanHandle) -> None:
        from testbed.emulation.delayline import READY_LINE, STATS_PREFIX

        proc = w.relay
        assert proc is not None and proc.stdout is not None and proc.stderr is not None
        err = _Drain(proc.stderr)
        err.start()
        self._drains.append(err)
        deadline = time.monotonic() + RELAY_READY_TIMEOUT_S
        buf = ""
        while time.monotonic() < deadline:
            ready, _, _ = select.select([proc.stdout], [], [], 0.1)
            if ready:
                line = proc.stdout.readline()
                if line.strip() == READY_LINE:
                    out = _Drain(proc.stdout, watch=STATS_PREFIX)
                    out.start()
                    self._drains.append(out)
                    w.relay_out = out
                    return
                if line == "":
                    break
                buf += line
            elif proc.poll() is not None:
                break
        proc.poll()
        time.sleep(0.05)
        raise EmulationError(
            f"the delay line of {w.name} did not start (exit code {proc.returncode}): "
            f"{(err.tail() or buf).strip()[-800:] or 'no output'}"
        )

    def delay_line_stats(self, timeout_s: float = 2.0) -> dict[str, dict[str, Any]]:
        """Each relay delay line's counters (frames, bytes, and the drops of the relay
        itself vs. those of the shaper queue), by WAN link name; {} with netem. A
        relay that does not answer within `timeout_s` is left out."""
        import json

        asked = {}
        for w in self._wans:
            proc, out = w.relay, w.relay_out
            if proc is None or out is None or proc.stdin is None or proc.poll() is not None:
                continue
            seen = out.watched[0]  # before asking: the answer can come back at once
            try:
                proc.stdin.write("stats\n")
                proc.stdin.flush()
            except (BrokenPipeError, OSError, ValueError):
                continue
            asked[w] = seen
        stats: dict[str, dict[str, Any]] = {}
        deadline = time.monotonic() + timeout_s
        while asked and time.monotonic() < deadline:
            for w in [w for w, seen in asked.items() if w.relay_out.watched[0] > seen]:  # type: ignore[union-attr]
                try:
                    stats[w.link.name if w.link else w.name] = json.loads(w.relay_out.watched[1])  # type: ignore[union-attr]
                except ValueError:
                    pass
                del asked[w]
            time.sleep(0.01)
        return stats

    # -- processes

    def _spawn(self, handle: NodeHandle, argv: Sequence[str] | str, kind: str,
               **popen_kwargs: Any) -> subprocess.Popen:
        if self.record is None or not self._alive_node(handle):
            raise EmulationError(f"{handle.name}: the emulation is not running")
        if isinstance(argv, str):
            argv = shlex.split(argv)
        argv = [str(a) for a in argv]
        env = dict(popen_kwargs.pop("env", None) or os.environ)
        env[ENV_RUN] = self.prefix
        proc = subprocess.Popen(["mnexec", "-da", str(handle.pid), *argv], env=env, **popen_kwargs)
        self.record.add_process(kind, f"{handle.mn_name}:{os.path.basename(argv[0])}", proc.pid,
                                handle.netns_inode, self._procfs)
        with self._lock:
            self._procs[proc.pid] = proc
            finished = [pid for pid, p in self._procs.items() if p.poll() is not None]
            for pid in finished:
                del self._procs[pid]
        if finished:
            self.record.drop_processes(finished)
        return proc

    @staticmethod
    def _alive_node(handle: NodeHandle) -> bool:
        shell = getattr(handle.node, "shell", None)
        return shell is not None and shell.poll() is None

    # -- time-varying links

    def _start_changes(self) -> None:
        events = []
        for w in self._wans:
            assert w.link is not None
            for change in w.link.changes:
                events.append((change.at, w, change))
        if not events:
            return
        events.sort(key=lambda e: e[0])
        t0 = time.monotonic()

        def loop() -> None:
            state = {id(w): (w.link.rate, w.link.delay, w.link.jitter, w.link.loss)
                     for w in self._wans if w.link is not None}
            for at, w, change in events:
                if self._stop.wait(max(0.0, t0 + at - time.monotonic())):
                    return
                rate, delay, jitter, loss = state[id(w)]
                rate = change.rate if change.rate is not None else rate
                delay = change.delay if change.delay is not None else delay
                jitter = change.jitter if change.jitter is not None else jitter
                loss = change.loss if change.loss is not None else loss
                state[id(w)] = (rate, delay, jitter, loss)
                try:
                    self._apply_change(w, change, rate, delay, jitter, loss)
                except Exception as exc:  # report, keep the run going
                    print(f"testbed: change of {w.name} at {at:g}s failed: {exc}", file=sys.stderr)

        self._changer = threading.Thread(target=loop, daemon=True, name="emu-changes")
        self._changer.start()

    def _apply_change(self, w: WanHandle, change: Any, rate: float, delay: float, jitter: float,
                      loss: float) -> None:
        from testbed.emulation import shaping
        from testbed.emulation.netns import open_iproute

        assert w.link is not None
        queue = w.link.queue_bytes
        delay_changed = any(v is not None for v in (change.delay, change.jitter, change.loss))
        with open_iproute(w.pid) as ipr:
            for intf in w.intfs:
                if change.rate is not None:
                    shaping.apply(ipr, intf, shaping.change_rate(rate))
                if delay_changed and self.delay_backend == "netem":
                    shaping.apply(ipr, intf, shaping.change_netem(
                        shaping.NetemParams(delay_s=delay, jitter_s=jitter, loss=loss), rate, queue))
        if delay_changed and self.delay_backend == "relay" and w.relay and w.relay.stdin:
            from testbed.emulation.delayline import set_command

            w.relay.stdin.write(set_command("both", delay_s=delay, jitter_s=jitter, loss=loss))
            w.relay.stdin.flush()

    # -- teardown

    def _teardown(self) -> None:
        self._stop.set()
        if self._changer is not None:
            self._changer.join(timeout=2.0)
        procfs = self._procfs
        with self._lock:
            procs = list(self._procs.values())
            self._procs.clear()
        # 1. what we spawned: SIGTERM to each process group, SIGKILL after a grace.
        targets = []
        for p in procs:
            if p.poll() is None:
                start = procfs.start_time(p.pid)
                if start is None:
                    continue
                targets.append((p.pid, start))
                try:
                    os.killpg(p.pid, signal.SIGTERM)
                except (ProcessLookupError, PermissionError):
                    try:
                        p.terminate()
                    except ProcessLookupError:
                        pass
        if targets:
            deadline = time.monotonic() + TERM_GRACE_S
            while time.monotonic() < deadline and any(p.poll() is None for p in procs):
                time.sleep(0.02)
            kill_and_wait([(pid, s) for pid, s in targets if procfs.start_time(pid) == s], procfs)
        for p in procs:
            for stream in (p.stdin, p.stdout, p.stderr):
                if stream is not None:
                    try:
                        stream.close()
                    except (OSError, ValueError):
                        pass
            try:
                p.wait(timeout=0.5)
            except subprocess.TimeoutExpired:
                pass
        # 2. anything else inside our namespaces, then the node shells (their
        #    namespaces, links and qdiscs go with them), via the record.
        if self.record is not None:
            others, _ = list_records(self.record.path.parent)
            actions = plan_clean(self.record, procfs, others)
            failures = execute(actions, procfs)
        else:
            failures = []
        for n in self._all:
            _close_node(n.node)
        self._all.clear()
        if failures:
            print("testbed: teardown left something behind, run `testbed clean`: "
                  + "; ".join(failures), file=sys.stderr)


def _close_node(node: Any) -> None:
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
        try:
            master.close()
        except OSError:
            pass
    try:
        os.close(node.slave)
    except (OSError, TypeError):
        pass
    try:
        shell.wait(timeout=2.0)
    except subprocess.TimeoutExpired:
        pass
    node.shell = None


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


def _enable_rps(handle: NodeHandle, mask: str) -> None:
    """Receive packet steering on every interface of a node.

    A veth delivers a packet to the backlog of the CPU that sent it; when the
    packets of one flow are sent from different CPUs (ACK-clocked softirqs, HTB
    timers) they overtake each other, and TCP sees reordering, spurious fast
    retransmits and a halved window (measured: tens of retransmits per second at
    1 Gbit/s, goodput well under the link rate). RPS hashes each flow to one CPU,
    which keeps it in order. The node's own sysfs is reached through
    /proc/<pid>/root (its mount namespace), without running a shell command.
    """
    base = Path(f"/proc/{handle.pid}/root/sys/class/net")
    for f in base.glob("*/queues/rx-*/rps_cpus"):
        try:
            f.write_text(mask)
        except OSError:  # kernels without CONFIG_RPS: nothing to do
            return


def _index(ipr: Any, ifname: str, where: str) -> int:
    found = ipr.link_lookup(ifname=ifname)
    if not found:
        raise EmulationError(f"{where}: interface {ifname} is missing")
    return int(found[0])


def _up(ipr: Any, ifname: str) -> None:
    found = ipr.link_lookup(ifname=ifname)
    if found:
        ipr.link("set", index=found[0], state="up")


# --------------------------------------------------------------------------- Mininet CLI


def _run_cli(emu: Emulation, stdin: IO[str] | None = None) -> None:
    """Mininet's CLI, fed a mapping of our display names (and Mininet names) to
    nodes. Commands that need a Mininet network object (switches, controllers,
    the built-in iperf) say they are not available instead of crashing."""
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

    def show(_line: str = "") -> None:
        for n in emu.nodes():
            extra = ""
            if isinstance(n, HostHandle):
                extra = f"{n.ip}"
            elif isinstance(n, GatewayHandle):
                extra = f"{n.lan_ip} " + " ".join(f"{ip}->{peer}" for peer, ip in n.wan_ips.items())
            elif isinstance(n, WanHandle) and n.link is not None:
                extra = (f"{n.link.rate / 1e6:g} Mbit/s, RTT {n.link.rtt_s * 1e3:g} ms "
                         f"({emu.delay_backend})")
            print(f"{n.name:16} {n.mn_name:12} pid {n.pid:<7} {extra}")

    def pingall(_line: str = "") -> None:
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
            print(f"{a.name} -> {' '.join(row)}")
        total = len(hosts) * (len(hosts) - 1)
        print(f"*** Results: {100 * lost // max(total, 1)}% dropped ({total - lost}/{total} received)")

    class TestbedCLI(CLI):
        prompt = "testbed> "
        identchars = CLI.identchars + "-"  # display names are dc1-h1, wan-dc1-dc2

        def do_nodes(self, line: str) -> None:
            "List the nodes: display name, Mininet name, PID, addresses."
            show(line)

        do_net = do_nodes
        do_dump = do_nodes

        def do_pingall(self, line: str) -> None:
            "Ping between all hosts."
            pingall(line)

        def onecmd(self, line: str) -> Any:
            try:
                return super().onecmd(line)
            except AttributeError:
                print("*** this command needs a full Mininet network; it is not available here "
                      "(run programs on nodes instead: `dc1-h1 iperf3 -c dc2-h1`)")
                return None

    setLogLevel("output")
    TestbedCLI(net, stdin=stdin or sys.stdin)
