"""Building one emulation over several servers with Mininet's cluster edition
(`mininet.examples.cluster`): the lifecycle in testbed/emulation/network.py asks this
module for each node and each link when the topology has a `servers:` section.

* Nodes are `RemoteHost`s: a shell started over SSH on the node's server
  (``sudo -E mnexec -cn bash``), in a fresh network namespace there. A DC's hosts and
  gateway live on the DC's server; a WAN link node lives on the server of the link's
  first DC.
* Links between nodes of one server are veths made there (Mininet's `RemoteLink`). A
  link between servers (the far leg of a WAN link whose DCs are on different
  servers) is a tunnel over the servers' own network: a VXLAN (or gretap) device
  made in the server's root namespace, between the two servers' addresses, and
  moved into the node. The WAN link node keeps both its egress shapers (HTB rate,
  BDP bfifo) and its delay line exactly as on one machine; the tunnel is one of
  its two interfaces.
* Before anything is built: every server must accept the SSH login, have
  mnexec and the tunnel kind, and carry inner frames of at least 1280 bytes
  (`testbed_core.servers.mtu_problem`); the underlay between each pair of servers
  with tunnels must carry the sum of the WAN rates across it with headroom
  (declared `underlay_rate`, or measured with iperf3 -P 4 for one second). When
  the tunnel leaves less than 1500 bytes, every emulated interface gets the
  tunnel's inner MTU, so TCP picks an MSS that fits.

How the nodes are reached (configured, programs started in them) depends on the
server. A server that shares this machine's kernel (same boot_id and PID namespace:
the server namespaces of `testbed.emulation.cluster.rig`) has its nodes reached
through their PIDs and /proc, as on one machine. Any other server, and every server
when `servers.configure: ssh` (or TESTBED_SERVERS_CONFIGURE=ssh) forces it, is
reached over its SSH (testbed/emulation/remote/client.py): a node agent per server
applies the same configuration requests (testbed/emulation/nodeconf.py) to each node
through its PID there, and programs start through ``nodeagent exec``; such a server needs Python with
this package (``servers.python``), mininet and iperf3. Each such server is written in
the run record with its login before anything is made there, and the teardown or
`testbed clean` undoes the run there over SSH (``nodeagent clean``).
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shlex
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from testbed.emulation.errors import EmulationError
from testbed.emulation.nodeconf import MtuOp
from testbed.emulation.remote.sshlogin import ssh_options
from testbed_core.servers import (
    TUNNEL_OVERHEAD,
    Server,
    ServerPlan,
    SshSettings,
    inner_mtu,
    mtu_problem,
    underlay_demand,
    underlay_problem,
)

if TYPE_CHECKING:
    from testbed.emulation.naming import RunNames
    from testbed.emulation.nodeconf import NodeOp, NodeReply
    from testbed.emulation.records import RunRecord
    from testbed.emulation.remote.client import RemoteAgent
    from testbed.emulation.remote.sshlogin import RemoteLogin
    from testbed_core.topology import Topology

ENV_CONFIGURE = "TESTBED_SERVERS_CONFIGURE"  # "ssh": as servers.configure: ssh
CONTROL_MAP_ENV = "TESTBED_CONTROL_MAP"  # as testbed.training.worker.control.CONTROL_MAP_ENV (a later layer)
SSH_TIMEOUT_S = 20.0
VXLAN_PORT = 4789
IPERF_S = 1.0


def _remote_host_class(ssh: SshSettings, control_dir: Path) -> type:
    """Mininet's RemoteHost logging in with the servers section's key and known_hosts."""
    from mininet.examples.cluster import RemoteHost

    base = ["ssh", "-q", *ssh_options(ssh, control_dir), "-tt"]

    class TestbedRemoteHost(RemoteHost):  # type: ignore[misc]
        sshbase = base

        def _popen(self, cmd: Any, sudo: bool = True, tt: bool = True, **params: Any) -> Any:
            # Mininet runs ssh as `sudo -E -u <remote user>` locally; the key is named
            # explicitly, so ssh runs as the controller's own user.
            if self.sshcmd[:4] == ["sudo", "-E", "-u", self.user]:
                self.sshcmd = self.sshcmd[4:]
            return super()._popen(cmd, sudo=sudo, tt=tt, **params)

    return TestbedRemoteHost


class ClusterBuild:
    """The servers of one emulation: connect and check them, then make nodes and links."""

    def __init__(self, topology: Topology, plan: ServerPlan, prefix: str, control_dir: Path,
                 progress: Callable[[str], None], record: RunRecord | None = None) -> None:
        self.topology = topology
        self.plan = plan
        self.prefix = prefix
        self.control_dir = control_dir
        self._progress = progress
        self._placement: dict[str, Server] = {}
        self._classes = {s.name: _remote_host_class(plan.ssh_for(s), control_dir) for s in plan.machines}
        self._tunnel_id = int(prefix[2:], 16) << 8  # VNI / GRE key: the run's prefix, then the link
        self.mtu: int = 1500
        self.underlay: dict[tuple[str, str], tuple[float, str]] = {}  # pair -> (bit/s, how)
        self.facts: dict[str, dict[str, str]] = {}
        self.record = record  # remote servers are written in it before use
        self.remote: dict[str, bool] = {}  # server name -> reached over SSH (another machine, or forced)
        self.agents: dict[str, RemoteAgent] = {}  # server name -> its agent (one per server reached over SSH)
        self._pids: dict[str, int] = {}  # node (Mininet name) -> its PID on its server
        self.configure = "ssh" if os.environ.get(ENV_CONFIGURE) == "ssh" else plan.configure
        self._seen: dict[str, set[str]] = {}  # server -> folders it is known to see
        self._dirs: list[Path] = []  # the emulation's temporary folders (made on the remote servers too)
        self._forwards: dict[tuple[str, str], tuple[subprocess.Popen, str]] = {}  # (server, socket) -> ssh -R
        self._forward_dirs: dict[str, str] = {}
        self._forward_lock = threading.Lock()

    def login(self, server: Server) -> RemoteLogin:
        from testbed.emulation.remote.sshlogin import RemoteLogin

        ssh = self.plan.ssh_for(server)
        return RemoteLogin(server=server.name, address=server.address, user=ssh.user, port=ssh.port,
                           identity=ssh.identity, known_hosts=ssh.known_hosts, python=self.plan.python_for(server))

    # -- ssh

    def ssh_argv(self, server: Server, command: str) -> list[str]:
        ssh = self.plan.ssh_for(server)
        return ["ssh", "-q", *ssh_options(ssh, self.control_dir), f"{ssh.user}@{server.address}", command]

    def run(self, server: Server, command: str, timeout: float = SSH_TIMEOUT_S) -> subprocess.CompletedProcess:
        try:
            return subprocess.run(self.ssh_argv(server, command), capture_output=True, text=True,
                                  timeout=timeout, check=False)
        except subprocess.TimeoutExpired:
            raise EmulationError(f"server {server.name} ({server.address}): `{command}` did not finish in "
                                 f"{timeout:g}s over SSH") from None

    # -- checks before building

    def connect(self) -> None:
        """Log in to every server and check what the build needs; raise EmulationError
        naming the server and the fix for the first thing missing."""
        local_boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        local_pidns = os.readlink("/proc/self/ns/pid")
        others = {s.name: [o for o in self.plan.machines if o is not s] for s in self.plan.machines}
        for server in self.plan.machines:
            self._progress(f"server {server.name} ({server.address}): logging in")
            peer = others[server.name][0].address if others[server.name] else server.address
            kind = "vxlan" if self.plan.tunnel == "vxlan" else "gretap"
            extra = (f"id 1 dstport {VXLAN_PORT}" if kind == "vxlan" else "key 1")
            script = "; ".join([
                "echo boot=$(cat /proc/sys/kernel/random/boot_id)",
                "echo pidns=$(readlink /proc/self/ns/pid)",
                "echo mnexec=$(command -v mnexec)",
                "echo iperf3=$(command -v iperf3)",
                "echo sudo=$(command -v sudo)",
                f"echo inuse=$(pgrep -f 'mininet:[{self.prefix[0]}]{self.prefix[1:]}' | head -1)",  # not itself
                (f"{shlex.quote(self.plan.python_for(server))} -c 'import testbed.emulation.remote.nodeagent, pyroute2, "
                 "pydantic' >/dev/null 2>&1 && echo agent=ok || echo agent=missing"),
                f"echo route=$(ip -o route get {peer} 2>&1 | head -1)",
                (f"sudo -n unshare -n sh -c 'ip link add tbprobe type {kind} {extra} local {server.address} "
                 f"remote {peer} 2>&1 && echo tunnel=ok || echo tunnel=missing' 2>&1 | tail -1"),
            ])
            res = self.run(server, script)
            if res.returncode == 255 or "boot=" not in res.stdout:
                ssh = self.plan.ssh_for(server)
                raise EmulationError(
                    f"server {server.name} ({ssh.user}@{server.address}:{ssh.port}): SSH login failed: "
                    f"{(res.stderr or res.stdout).strip()[-400:] or 'no output'}; the servers section needs a "
                    "key-based login (ssh.identity) and the servers' host keys (ssh.known_hosts)")
            facts = dict(line.split("=", 1) for line in res.stdout.splitlines() if "=" in line)
            self.facts[server.name] = facts
            for tool, pkg in (("mnexec", "mininet"), ("sudo", "sudo")):
                if not facts.get(tool):
                    raise EmulationError(f"server {server.name}: {tool} is not installed there: "
                                         f"apt-get install {pkg} (on every server)")
            if facts.get("tunnel") != "ok":
                raise EmulationError(
                    f"server {server.name}: its kernel cannot make {kind} devices ({facts.get('tunnel', '?')}): "
                    f"choose the other tunnel (servers.tunnel: {'gre' if kind == 'vxlan' else 'vxlan'}) "
                    f"or load the module (modprobe {'vxlan' if kind == 'vxlan' else 'ip_gre'})")
            other_machine = facts.get("boot") != local_boot or facts.get("pidns") != local_pidns
            self.remote[server.name] = other_machine or self.configure == "ssh"
            if self.remote[server.name] and facts.get("inuse"):
                raise EmulationError(
                    f"server {server.name} ({server.address}) already runs nodes of a run named {self.prefix} "
                    "(another controller's): run again (a new run gets another prefix), or `testbed clean` on "
                    "the controller that started them")
            if self.remote[server.name]:
                self._progress(f"server {server.name}: nodes configured and programs started over SSH "
                               f"({'another machine' if other_machine else 'servers.configure: ssh'})")
            if self.remote[server.name] and facts.get("agent") != "ok":
                why = "is another machine" if other_machine else "is reached over SSH (servers.configure: ssh)"
                raise EmulationError(
                    f"server {server.name} ({server.address}) {why}, and its Python "
                    f"({self.plan.python_for(server)!r}, servers.python) cannot import this package's node agent "
                    "(testbed.emulation.remote.nodeagent with pyroute2 and pydantic): install this package there "
                    "(pip install <this checkout>) or name that Python in servers.python")
        self._check_mtu()
        self._check_underlay()
        if self.record is not None:  # before anything is made there: `testbed clean` can undo it over SSH
            for server in self.plan.machines:
                if self.remote[server.name]:
                    self.record.add_remote(server.name, self.login(server).model_dump())

    def is_remote(self, mn_name: str) -> bool:
        return self.remote.get(self._placement[mn_name].name, False)

    def _check_mtu(self) -> None:
        mtus = []
        for server in self.plan.machines:
            route = self.facts[server.name].get("route", "")
            m = re.search(r"\bdev (\S+)", route)
            if not m:
                raise EmulationError(f"server {server.name}: no route to the other servers ({route.strip()}): "
                                     "the servers must reach each other's addresses")
            device = m.group(1)
            res = self.run(server, f"ip -o link show dev {shlex.quote(device)}")
            mm = re.search(r"\bmtu (\d+)", res.stdout)
            if not mm:
                raise EmulationError(f"server {server.name}: cannot read the MTU of {device}: {res.stderr.strip()}")
            mtu = int(mm.group(1))
            problem = mtu_problem(server.name, device, mtu, self.plan.tunnel)
            if problem:
                raise EmulationError(problem)
            mtus.append(inner_mtu(mtu, self.plan.tunnel))
        self.mtu = min(mtus) if len(self.plan.machines) > 1 else 1500

    def _check_underlay(self) -> None:
        by_name = {s.name: s for s in self.plan.machines}
        for pair, demand in underlay_demand(self.topology, self.plan).items():
            a, b = by_name[pair[0]], by_name[pair[1]]
            declared = [s.underlay_rate for s in (a, b) if s.underlay_rate is not None]
            if declared:
                capacity, how = min(declared), "declared underlay_rate"
            else:
                self._progress(f"measuring the underlay {a.name} -> {b.name} (iperf3, {IPERF_S:g}s)")
                capacity, how = self._measure(a, b), f"measured with iperf3 -P 4 over {IPERF_S:g}s"
            self.underlay[pair] = (capacity, how)
            problem = underlay_problem(pair, demand, capacity, how)
            if problem:
                raise EmulationError(problem)

    def _measure(self, a: Server, b: Server) -> float:
        for server in (a, b):
            if not self.facts[server.name].get("iperf3"):
                raise EmulationError(f"server {server.name}: iperf3 is not installed there (it measures the "
                                     "underlay): apt-get install iperf3, or declare underlay_rate")
        # A one-off server (-1) per try: a try that reached it but failed (a busy machine)
        # has ended it, so the next try starts a fresh one rather than meeting a refused port.
        server: subprocess.Popen | None = None
        out = ""
        try:
            deadline = time.monotonic() + 40
            while time.monotonic() < deadline:
                if server is None or server.poll() is not None:
                    port = 5290 + secrets.randbelow(200)
                    server = subprocess.Popen(self.ssh_argv(b, f"timeout 20 iperf3 -s -1 -B {b.address} -p {port}"),
                                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                time.sleep(0.25)
                res = self.run(a, f"iperf3 -c {b.address} -B {a.address} -p {port} -t {IPERF_S:g} -P 4 -J")
                out = res.stdout
                if res.returncode == 0:
                    break
            try:
                return float(json.loads(out)["end"]["sum_received"]["bits_per_second"])
            except (ValueError, KeyError, TypeError):
                raise EmulationError(f"could not measure the underlay {a.name} -> {b.name} with iperf3: "
                                     f"{out.strip()[-300:] or 'no output'}; declare underlay_rate instead") from None
        finally:
            if server is not None:
                server.terminate()
                try:
                    server.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    server.kill()

    # -- nodes and links

    def place_run(self, names: RunNames) -> None:
        """Put each node of the run on its server: a DC's
        gateway and hosts on the DC's server, a WAN link node on its first DC's."""
        index = {dc.name: i for i, dc in enumerate(self.topology.dcs)}
        for i, dc in enumerate(self.topology.dcs):
            server = self.plan.server_of(dc.name)
            self._placement[names.gateway(i)] = server
            for j in range(len(dc.hosts)):
                self._placement[names.host(i, j)] = server
        for link in self.topology.wan:
            a, b = link.between
            self._placement[names.wan(index[a], index[b])] = self.plan.server_of(a)

    def new_node(self, mn_name: str) -> Any:
        server = self._placement[mn_name]
        ssh = self.plan.ssh_for(server)
        cls = self._classes[server.name]
        node = cls(mn_name, server=server.name, user=ssh.user, serverIP=server.address)
        self._pids[mn_name] = int(node.pid)
        if self.remote.get(server.name) and server.name not in self.agents:  # started now, awaited at first use
            from testbed.emulation.remote.client import RemoteAgent

            self.agents[server.name] = RemoteAgent(self.login(server), self.prefix, self.control_dir)
        return node

    def request(self, mn_name: str, ops: Sequence[NodeOp]) -> NodeReply:
        """Configuration requests (nodeconf) for node `mn_name`, through its server's agent."""
        return self.agents[self._placement[mn_name].name].request(mn_name, self._pids[mn_name], ops)

    def spawn(self, mn_name: str, pid: int, argv: list[str], **popen_kwargs: Any) -> subprocess.Popen:
        """A program started in a remote node (remote.client.RemoteProcess)."""
        from testbed.emulation.remote.client import RemoteProcess, env_extra, remote_argv

        server = self._placement[mn_name]
        login = self.login(server)
        extra = env_extra(popen_kwargs.pop("env", None))
        cwd = popen_kwargs.get("cwd")
        self._check_visible(server, [a for a in argv[1:] if a.startswith("/") and os.path.exists(a)]
                            + ([str(cwd)] if cwd is not None else []))
        control = self.control_map(server)
        if control:
            extra[CONTROL_MAP_ENV] = json.dumps(control)
        cwd = popen_kwargs.pop("cwd", None)
        return RemoteProcess(login, self.control_dir, pid, self.prefix, remote_argv(argv, login.python), extra,
                             None if cwd is None else str(cwd), **popen_kwargs)

    def _check_visible(self, server: Server, paths: list[str]) -> None:
        """Refuse to start a program whose files (absolute paths that exist here: job
        files, the result folder, its working folder) the server does not see at the
        same path; asked once per folder and server."""
        folders = sorted({p if os.path.isdir(p) else os.path.dirname(p) for p in paths}
                         - self._seen.setdefault(server.name, set()))
        if not folders:
            return
        probe = "; ".join(f"test -e {shlex.quote(f)} || echo {shlex.quote(f)}" for f in folders)
        res = subprocess.run(self.login(server).ssh_argv(["sh", "-c", probe], self.control_dir), capture_output=True,
                             text=True, timeout=SSH_TIMEOUT_S, check=False, stdin=subprocess.DEVNULL)
        if res.returncode != 0:
            raise EmulationError(f"server {server.name}: could not check the program's folders there: "
                                 f"{(res.stderr or res.stdout).strip()[-300:]}")
        missing = [line for line in res.stdout.splitlines() if line.strip()]
        if missing:
            raise EmulationError(
                f"server {server.name} ({server.address}) does not see {', '.join(missing)}: a program started in "
                "its nodes is given these paths, so they must be at the same path there (a shared file system "
                "such as NFS, or the same checkout path); mount it there, or give --out a folder on the shared "
                "file system")
        self._seen[server.name].update(folders)

    def make_dirs(self, path: Path) -> None:
        """The emulation's temporary folder `path` on every server reached over SSH too
        (the programs of its nodes write there), recorded with the server first."""
        self._dirs.append(path)
        for server in self.plan.machines:
            if not self.remote.get(server.name):
                continue
            self._make_dir(server, path)

    def _make_dir(self, server: Server, path: Path | str) -> None:
        if self.record is not None:
            self.record.add_remote_path(server.name, str(path))
        res = subprocess.run(self.login(server).ssh_argv(["mkdir", "-p", "-m", "700", str(path)], self.control_dir),
                             capture_output=True, text=True, timeout=SSH_TIMEOUT_S, check=False,
                             stdin=subprocess.DEVNULL)
        if res.returncode != 0:
            raise EmulationError(f"server {server.name}: cannot make the folder {path} there: "
                                 f"{(res.stderr or res.stdout).strip()[-300:]}")

    def control_map(self, server: Server) -> dict[str, str]:
        """The runner's control sockets (UNIX sockets in the emulation's ``ctl``
        folders) as paths on `server`: one ``ssh -N -R`` per server and socket, kept for
        the run (a program's own ssh cannot carry it: it would not end while the
        runner's connection stays open). Programs there connect through the path
        (CONTROL_MAP_ENV), retrying until the forward is up."""
        socks = [str(p) for d in self._dirs if "-ctl-" in d.name and d.is_dir()
                 for p in sorted(d.glob("*.sock")) if p.is_socket()]
        out = {}
        with self._forward_lock:
            for sock in socks:
                key = (server.name, sock)
                if key not in self._forwards or self._forwards[key][0].poll() is not None:
                    if server.name not in self._forward_dirs:  # a folder of its own: never the runner's
                        folder = f"/tmp/{self.prefix}-fwd-{secrets.token_hex(4)}"
                        self._make_dir(server, folder)
                        self._forward_dirs[server.name] = folder
                    path = f"{self._forward_dirs[server.name]}/c{len(self._forwards)}.sock"
                    ssh = self.plan.ssh_for(server)
                    proc = subprocess.Popen(["ssh", "-q", *ssh_options(ssh), "-N", "-o", "ExitOnForwardFailure=yes",
                                             "-R", f"{path}:{sock}", f"{ssh.user}@{server.address}"],
                                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                            stderr=subprocess.DEVNULL, start_new_session=True)
                    if self.record is not None:  # its command line carries the run's prefix (the path)
                        self.record.add_process("process", f"{self.prefix}:ssh-forward", proc.pid, None)
                    self._forwards[key] = (proc, path)
                out[sock] = self._forwards[key][1]
        return out

    def fetch(self, mn_name: str, path: str, into: Path) -> Path:
        """A file a program in remote node `mn_name` wrote, copied here into the folder
        `into` (named after its server: never the path it is read from, which on a
        shared file system is the same file)."""
        server = self._placement[mn_name]
        local = into / f"{server.name}-{Path(path).name}"
        with open(local, "wb") as fh:
            res = subprocess.run(self.login(server).ssh_argv(["cat", "--", path], self.control_dir), stdout=fh,
                                 stderr=subprocess.PIPE, timeout=120, check=False, stdin=subprocess.DEVNULL)
        if res.returncode != 0:
            raise EmulationError(f"server {server.name}: cannot copy {path} from node {mn_name}: "
                                 f"{res.stderr.decode(errors='replace').strip()[-300:]}")
        return local

    def close(self) -> None:
        """End the node agents (each one's SSH session) and the control sockets' forwards."""
        for agent in self.agents.values():
            agent.close()
        self.agents.clear()
        with self._forward_lock:
            forwards = [proc for proc, _ in self._forwards.values()]
            self._forwards.clear()
        for proc in forwards:
            if proc.poll() is None:
                proc.terminate()
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def link(self, node1: Any, node2: Any, intf1: str, intf2: str) -> Any:
        """A veth between nodes of one server, a tunnel between servers."""
        self._tunnel_id += 1
        by_name = {s.name: s for s in self.plan.machines}
        cls = _tunnel_link_class(self.plan.tunnel, self._tunnel_id,
                                 lambda server, command: self.run(by_name[server], command))
        return cls(node1, node2, intfName1=intf1, intfName2=intf2)

    def set_mtu(self, handles: list[Any]) -> None:
        """Every emulated interface at the tunnel's inner MTU (when under 1500); `handles`:
        nodes.NodeHandle, each reached its own way (NodeHandle.configure)."""
        if self.mtu >= 1500:
            return
        for handle in handles:
            handle.configure(MtuOp(mtu=self.mtu))


def _tunnel_link_class(tunnel: str, tunnel_id: int,
                       root_cmd: Callable[[str, str], subprocess.CompletedProcess]) -> type:
    from mininet.examples.cluster import RemoteLink

    class TunnelLink(RemoteLink):  # type: ignore[misc]
        """Mininet's RemoteLink with an in-kernel tunnel (VXLAN or gretap) between servers."""

        def makeTunnel(self, node1: Any, node2: Any, intfname1: str, intfname2: str,  # noqa: N802 (Mininet's name)
                       addr1: Any = None, addr2: Any = None) -> Any:
            if tunnel == "vxlan":
                spec = "type vxlan id {id} local {local} remote {remote} dstport " + str(VXLAN_PORT)
            else:
                spec = "type gretap local {local} remote {remote} ttl 64 key {id}"
            for node, intf, local, remote in ((node1, intfname1, node1.serverIP, node2.serverIP),
                                              (node2, intfname2, node2.serverIP, node1.serverIP)):
                add = f"ip link add name {intf} " + spec.format(id=tunnel_id, local=local, remote=remote)
                res = root_cmd(node.server, f"sudo -n {add} && sudo -n ip link set {intf} netns {node.pid}")
                if res.returncode != 0:
                    raise EmulationError(f"cannot make the {tunnel} tunnel end {intf} on server {node.server}: "
                                         f"{(res.stderr or res.stdout).strip()[-300:]}")
            return tunnel_id

        def stop(self) -> None:  # the tunnel ends go with their nodes' namespaces
            self.tunnel = None

    return TunnelLink


__all__ = ["TUNNEL_OVERHEAD", "ClusterBuild", "ssh_options"]
