"""The lifecycle of an emulated network: build a topology on Mininet nodes, run
programs in them, change links over time, and tear everything down without a trace.

Layout (nothing is created in the root namespace; see `testbed.emulation.nodes` for
each kind of node and `testbed.emulation.addressing` for the address plan):

    host ──veth── gateway (Linux bridge inside its namespace, LAN IP on the bridge)
    gateway ──veth── WAN link node ──veth── gateway of the other DC

Under the `relay` delay backend each WAN node runs `python -m testbed.emulation.delayline`
between its two interfaces; under `netem` it bridges them.

Everything created is listed in a run record (`testbed.emulation.records`) before or as it is
created; teardown (normal exit, exception, Ctrl-C, SIGTERM) kills what the run
started and deletes the record, and `testbed clean` finishes the job after SIGKILL.
"""

from __future__ import annotations

import os
import secrets
import select
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from testbed.emulation.addressing import Wiring, plan_addresses, plan_wiring
from testbed.emulation.cleanup import execute, kill_and_wait, plan_clean
from testbed.emulation.congestion import allow_congestion_controls
from testbed.emulation.errors import EmulationError
from testbed.emulation.naming import (
    RunNames,
    check_topology_fits,
    display_gateway,
    display_host,
    display_wan,
    new_prefix,
    validate_prefix,
)
from testbed.emulation.nodes import (
    GatewayHandle,
    HostHandle,
    NodeHandle,
    OutputDrain,
    WanHandle,
    close_mininet_host,
    close_quietly,
    configure_gateway,
    configure_host,
    configure_wan_node,
    enable_rps,
    new_mininet_host,
    node_alive,
    node_sysctls,
    rps_mask,
    wait_quietly,
    write_sysctls,
)
from testbed.emulation.records import (
    ENV_RUN,
    ProcFS,
    RecordError,
    RunRecord,
    list_records,
    prefix_in_use,
)
from testbed_core.topology import Topology, load_topology
from testbed_runtime.lifetime import OWNER_ENV, owner_mark

if TYPE_CHECKING:
    from testbed.emulation.cluster.build import ClusterBuild
    from testbed.emulation.delayline.stats import RelaySnapshot

__all__ = [
    "Emulation",
    "EmulationError",
    "GatewayHandle",
    "HostHandle",
    "NodeHandle",
    "WanHandle",
    "preflight",
]

RELAY_READY_TIMEOUT_S = 10.0
TERM_GRACE_S = 1.0


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
        topology.require_emulable()  # DCs given as GPU counts are for predictions only
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
        self._warm: Path | None = None  # the folder of this run's fork server (warmstart.py), once used
        self._drains: list[OutputDrain] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._changer: threading.Thread | None = None
        self._relay_io = threading.Lock()
        self._link_state: dict[str, tuple[float, float, float, float, bool]] = {}  # see change_link
        self._saved_handlers: dict[int, Any] = {}
        self._started = False
        self._procfs = ProcFS()
        self._wiring: Wiring | None = None
        self.path_offsets: dict[str, Any] = {}  # link name -> delayline.calibrate.PathOffset (relay only)
        self.cluster: ClusterBuild | None = None  # when the topology places DCs on servers

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

    def temp_dir(self, purpose: str, root: Path | None = None) -> Path:
        """A new private folder in the system's temporary directory (or in `root`, e.g. a
        memory file system: testbed/emulation/memfs.py), named
        ``<prefix>-<purpose>-<random>`` and recorded before it is created, so that the
        teardown, or `testbed clean` after a crash, removes it with what is in it
        (e.g. the runner's control sockets)."""
        if self.record is None or not self._started:
            raise EmulationError("the emulation is not running: use `with Emulation(...) as emu:`")
        if not purpose.replace("-", "").isalnum():
            raise ValueError(f"temp_dir purpose {purpose!r}: letters, digits and '-' only")
        base = Path(root) if root is not None else Path(tempfile.gettempdir())
        path = base.resolve() / f"{self.prefix}-{purpose}-{secrets.token_hex(4)}"
        self.record.add_path(path)
        path.mkdir(mode=0o700)
        if self.cluster is not None:  # and on the servers reached over SSH, for their nodes' programs
            self.cluster.make_dirs(path)
        return path

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

    def relay_pids(self) -> list[int]:
        """The process ids of the relay delay lines running on this machine (none with
        netem; a relay on another server is left out)."""
        return [w.relay.pid for w in self._wans
                if w.relay is not None and w.relay.poll() is None and not w.remote]

    def node(self, name: str) -> NodeHandle:
        """A node by display name (dc1-h1, dc1-gw, wan-dc1-dc2) or Mininet name."""
        for n in self._all:
            if name in (n.name, n.mn_name):
                return n
        raise KeyError(f"no node named {name!r}")

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
        if self.topology.servers is not None:  # DCs on several servers (testbed/emulation/cluster/)
            self._start_cluster()
        self._progress(f"run {self.prefix}: creating nodes")
        self._allow_congestion_controls()
        self._create_nodes()
        self._progress(f"run {self.prefix}: configuring {len(self._all)} namespaces")
        for handle in self._all:
            self._write_sysctls(handle, node_sysctls(handle, self.topology))
        self._progress(f"run {self.prefix}: creating links")
        self._create_links()
        self._configure()
        mask = rps_mask(os.cpu_count() or 1)
        for handle in self._all:
            enable_rps(handle, mask)
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

    def _start_cluster(self) -> None:
        from testbed.emulation.cluster.build import ClusterBuild

        assert self.names is not None and self.topology.servers is not None
        self.cluster = ClusterBuild(self.topology, self.topology.servers, self.prefix, self.temp_dir("ssh"),
                                    self._progress, record=self.record)
        self.cluster.place_run(self.names)
        self.cluster.connect()

    def _new_node(self, mn_name: str) -> Any:
        node = self.cluster.new_node(mn_name) if self.cluster is not None else new_mininet_host(mn_name)
        assert self.record is not None
        if self.cluster is not None and self.cluster.is_remote(mn_name):  # its PID is the server's:
            node._tb_netns = None  # recorded with the server (its clean goes over SSH), not in /proc
            return node
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

    def _write_sysctls(self, handle: NodeHandle, values: dict[str, str]) -> None:
        errors = write_sysctls(handle, values)
        if errors and any("congestion_control" in e for e in errors):
            # Another run may have just restored the machine's allowed list: allow again, retry.
            self._allow_congestion_controls()
            errors = write_sysctls(handle, values)
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
        assert self.record is not None
        allow_congestion_controls({self.topology.tcp_for(dc.name).congestion_control for dc in self.topology.dcs},
                                  self.record, "topology tcp.congestion_control")

    def _create_links(self) -> None:
        from mininet.link import Link

        assert self.names is not None
        self._wiring = plan_wiring(self.topology, self.names)
        by_mn_name = {n.mn_name: n for n in self._all}
        for veth in self._wiring.veths:
            if self.cluster is not None:  # a veth on one server, a tunnel between two
                self.cluster.link(by_mn_name[veth.node1].node, by_mn_name[veth.node2].node, veth.intf1, veth.intf2)
                continue
            Link(by_mn_name[veth.node1].node, by_mn_name[veth.node2].node,
                 intfName1=veth.intf1, intfName2=veth.intf2)
        if self.cluster is not None:
            self.cluster.set_mtu(self._all)
        for w in self._wans:
            assert w.plan is not None
            for dc in (w.plan.a, w.plan.b):
                self._gateways[dc].wan_ips[w.plan.peer_of(dc)] = w.plan.ip_of(dc)

    def _configure(self) -> None:
        wiring = self._wiring
        assert wiring is not None
        for h in self._hosts:
            configure_host(h, wiring.intf_towards(h.mn_name, self._gateways[h.dc].mn_name),
                           self.plan.dc(h.dc).gateway_ip, self.topology.dc(h.dc).lan_rate)
        for dc in self.topology.dcs:
            gw = self._gateways[dc.name]
            host_ports = [wiring.intf_towards(gw.mn_name, h.mn_name) for h in self.hosts(dc.name)]
            wan_ports = []
            for w in self._wans:
                assert w.plan is not None
                if dc.name in (w.plan.a, w.plan.b):
                    wan_ports.append((wiring.intf_towards(gw.mn_name, w.mn_name), w.plan.ip_of(dc.name)))
            configure_gateway(gw, host_ports, wan_ports, self.plan.routes[dc.name], dc.lan_rate)
        for w in self._wans:
            configure_wan_node(w, self.delay_backend)

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
        from testbed.emulation.delayline.calibrate import calibrate_relays

        # the path's own latency, measured per link, is left out of each relay's delay
        self.path_offsets = calibrate_relays(self._wans, self._gateways, self._progress)

    def _await_ready(self, w: WanHandle) -> None:
        from testbed.emulation.delayline import READY_LINE, STATS_PREFIX

        proc = w.relay
        assert proc is not None and proc.stdout is not None and proc.stderr is not None
        err = OutputDrain(proc.stderr)
        err.start()
        self._drains.append(err)
        deadline = time.monotonic() + RELAY_READY_TIMEOUT_S
        buf = ""
        while time.monotonic() < deadline:
            ready, _, _ = select.select([proc.stdout], [], [], 0.1)
            if ready:
                line = proc.stdout.readline()
                if line.strip() == READY_LINE:
                    out = OutputDrain(proc.stdout, watch=STATS_PREFIX)
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

    def delay_line_stats(self, timeout_s: float = 2.0) -> dict[str, RelaySnapshot]:
        """Each relay delay line's counters (frames, bytes, and the drops of the relay
        itself vs. those of the shaper queue), by WAN link name; {} with netem. A
        relay that does not answer within `timeout_s` is left out."""
        from testbed.emulation.delayline.stats import RelaySnapshot

        asked = {}
        for w in self._wans:
            proc, out = w.relay, w.relay_out
            if proc is None or out is None or proc.stdin is None or proc.poll() is not None:
                continue
            seen = out.watched[0]  # before asking: the answer can come back at once
            try:
                with self._relay_io:
                    proc.stdin.write("stats\n")
                    proc.stdin.flush()
            except (BrokenPipeError, OSError, ValueError):
                continue
            asked[w] = seen
        stats: dict[str, RelaySnapshot] = {}
        deadline = time.monotonic() + timeout_s
        while asked and time.monotonic() < deadline:
            for w in [w for w, seen in asked.items() if w.relay_out.watched[0] > seen]:  # type: ignore[union-attr]
                try:
                    line = w.relay_out.watched[1]  # type: ignore[union-attr]
                    stats[w.link.name if w.link else w.name] = RelaySnapshot.model_validate_json(line)
                except ValueError:  # not a STATS line (pydantic's ValidationError is a ValueError)
                    pass
                del asked[w]
            time.sleep(0.01)
        return stats

    # -- processes

    def _spawn(self, handle: NodeHandle, argv: Sequence[str] | str, kind: str,
               **popen_kwargs: Any) -> subprocess.Popen:
        if self.record is None or not node_alive(handle):
            raise EmulationError(f"{handle.name}: the emulation is not running")
        if isinstance(argv, str):
            argv = shlex.split(argv)
        argv = [str(a) for a in argv]
        env = dict(popen_kwargs.pop("env", None) or os.environ)
        env[ENV_RUN] = self.prefix
        env[OWNER_ENV] = owner_mark()  # the program ends itself when this process is gone (lifetime.py)
        if handle.remote:  # over the server's SSH (remote/client.py); the local ssh client is recorded
            proc = self.cluster.spawn(handle.mn_name, handle.pid, argv, env=env, **popen_kwargs)
        else:
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

    def _spawn_warm(self, handle: NodeHandle, argv: Sequence[str], *, preload: Sequence[str],
                    **popen_kwargs: Any) -> Any:
        if self.record is None or not node_alive(handle):
            raise EmulationError(f"{handle.name}: the emulation is not running")
        from testbed.emulation.warmstart import claim, start_server, warm_start

        if handle.remote:  # no fork server on another machine: a fresh interpreter through its SSH
            return self._spawn(handle, argv, kind="process", **popen_kwargs)
        if self._warm is None:
            self._warm = self.temp_dir("warm")  # the fork server's socket: recorded, removed with the run
        mark = {ENV_RUN: self.prefix, OWNER_ENV: owner_mark()}
        if not claim(self._warm, preload, mark):  # another run of this process has the fork server: start cold
            return self._spawn(handle, argv, kind="process", **popen_kwargs)
        for kind, pid in start_server(self._warm):  # marked before it starts, recorded once it runs
            self.record.add_process(kind, f"{self.prefix}:{kind}", pid, None, self._procfs)
        env = dict(popen_kwargs.pop("env", None) or os.environ)
        env.update(mark)
        proc = warm_start(handle.pid, argv, server=self._warm, env=env, net_inode=handle.netns_inode, **popen_kwargs)
        self.record.add_process("process", f"{handle.mn_name}:{argv[2] if len(argv) > 2 else argv[0]}", proc.pid,
                                handle.netns_inode, self._procfs)
        with self._lock:
            self._procs[proc.pid] = proc  # type: ignore[assignment]  (a Popen-like handle)
        return proc

    # -- time-varying links

    def _start_changes(self) -> None:
        events = []
        for w in self._wans:
            assert w.link is not None
            self._link_state[w.link.name] = (w.link.rate, w.link.delay, w.link.jitter, w.link.loss, False)
            for change in w.link.steps():
                events.append((change.at, w, change))
        if not events:
            return
        events.sort(key=lambda e: e[0])
        t0 = time.monotonic()

        def loop() -> None:
            for at, w, change in events:
                if self._stop.wait(max(0.0, t0 + at - time.monotonic())):
                    return
                try:
                    self.change_link(w.link.name, rate=change.rate, delay=change.delay, jitter=change.jitter,
                                     loss=change.loss, down=change.down)
                except Exception as exc:  # report, keep the run going
                    print(f"testbed: change of {w.name} at {at:g}s failed: {exc}", file=sys.stderr)

        self._changer = threading.Thread(target=loop, daemon=True, name="emu-changes")
        self._changer.start()

    def link_state(self, name: str) -> tuple[float, float, float, float, bool]:
        """(rate bit/s, one-way delay s, jitter s, loss, down) of WAN link `name` now."""
        with self._lock:
            try:
                return self._link_state[name]
            except KeyError:
                raise EmulationError(f"no WAN link {name!r} (links: {', '.join(sorted(self._link_state))})") from None

    def change_link(self, name: str, *, rate: float | None = None, delay: float | None = None,
                    jitter: float | None = None, loss: float | None = None, down: bool | None = None) -> None:
        """Change WAN link `name` now, both ways (None keeps a value): the topology's
        `changes` and the faults of `testbed run` (testbed/run/faults.py) come here. A
        link that is down drops every frame: the relay's ``down`` (frames on the wire
        are lost too), or netem's loss of 100% with the shaper."""
        with self._lock:
            old = self._link_state.get(name)
            if old is None:
                raise EmulationError(f"no WAN link {name!r} (links: {', '.join(sorted(self._link_state))})")
            new = tuple(o if v is None else v for o, v in zip(old, (rate, delay, jitter, loss, down), strict=True))
            self._link_state[name] = new  # type: ignore[assignment]
        handle = next(w for w in self._wans if w.link is not None and w.link.name == name)
        self._apply_change(handle, old, new)  # type: ignore[arg-type]

    def _apply_change(self, w: WanHandle, old: tuple[float, float, float, float, bool],
                      new: tuple[float, float, float, float, bool]) -> None:
        from testbed.emulation.nodeconf import ChangeOp, NetemSpec

        assert w.link is not None
        queue = w.link.queue_bytes
        rate, delay, jitter, loss, down = new
        rate_changed = rate != old[0]
        delay_changed = new[1:] != old[1:]
        netem = None
        if delay_changed and self.delay_backend == "netem":
            netem = NetemSpec(delay_s=delay, jitter_s=jitter, loss=1.0 if down else loss)
        if rate_changed or netem is not None:
            w.configure(ChangeOp(intfs=w.intfs, rate=rate if rate_changed else None, netem=netem,
                                 netem_rate=rate, queue_bytes=queue))
        if delay_changed and self.delay_backend == "relay" and w.relay and w.relay.stdin:
            from testbed.emulation.delayline import set_command

            with self._relay_io:  # one whole line at a time: the changes, the faults and stats share the pipe
                w.relay.stdin.write(set_command("both", delay_s=delay, jitter_s=jitter, loss=loss, down=down))
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
            close_quietly(p.stdin, p.stdout, p.stderr)
            wait_quietly(p, 0.5)
        if self._warm is not None:  # the fork server, its programs ended above, before its folder goes
            from testbed.emulation.warmstart import release

            release(self._warm)
        # 2. anything else inside our namespaces, then the node shells (their
        #    namespaces, links and qdiscs go with them), via the record.
        if self.record is not None:
            others, _ = list_records(self.record.path.parent)
            actions = plan_clean(self.record, procfs, others)
            failures = execute(actions, procfs)
        else:
            failures = []
        if self.cluster is not None:
            self.cluster.close()
        for n in self._all:
            close_mininet_host(n.node)
        self._all.clear()
        if failures:
            print("testbed: teardown left something behind, run `testbed clean`: "
                  + "; ".join(failures), file=sys.stderr)

