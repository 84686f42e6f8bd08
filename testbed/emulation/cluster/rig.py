"""Servers on one machine: network namespaces that stand in for SSH servers, so the
multi-server emulation (and anything else that logs in to servers) can be tested
without a second machine.

Layout (nothing in the root namespace; every name carries the rig's own run prefix):

    head namespace (the controller runs here; bridge <prefix>ub, 10.202.0.1/24)
      ├── veth ── server namespace s1 (10.202.0.2, its own sshd on port 22)
      └── veth ── server namespace s2 (10.202.0.3, its own sshd on port 22)

Each server runs `sshd -D` with a config, host key and authorized key of the rig's
own, in a private temporary folder (generated with ssh-keygen, removed at the end).
Logins are key-based only (root, no password, no PAM). The servers share the
machine's kernel, filesystem and PID space, as separate servers would not; their
network stacks are their own. With ``configure: ssh`` in the servers section the
emulation still treats them as other machines (nodes configured and programs started
over SSH only), which is how the tests exercise that path here. Everything is written in a run record
(testbed/emulation/records.py) before it is created, so `testbed clean` removes
what a killed rig left.
"""

from __future__ import annotations

import ipaddress
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from testbed.emulation.cleanup import execute, plan_clean, uses_rig
from testbed.emulation.congestion import allow_congestion_controls
from testbed.emulation.errors import EmulationError
from testbed.emulation.records import (
    ENV_RUN,
    ProcFS,
    RecordError,
    RunRecord,
    list_records,
    prefix_in_use,
)
from testbed_core.servers import Server, ServerPlan, SshSettings

UNDERLAY = ipaddress.ip_network("10.202.0.0/24")  # private to the rig's head namespace
SSHD_READY_S = 15.0
MAX_SERVERS = 8


@dataclass
class RigServer:
    name: str  # s1, s2, ...
    address: str
    node: Any = field(repr=False)  # mininet Host holding the server's namespace
    sshd: subprocess.Popen | None = field(default=None, repr=False)

    @property
    def pid(self) -> int:
        return int(self.node.pid)


class ServerRig:
    """`count` server namespaces, each with its own sshd, on a private underlay.
    Use as a context manager; `head_argv(argv)` runs a command where the servers
    are reachable (the head namespace), `servers_section(dcs)` writes the topology
    section that places DCs on them."""

    def __init__(self, count: int = 2, *, mtu: int = 1500, records_dir: Path | None = None) -> None:
        if not 1 <= count <= MAX_SERVERS:
            raise ValueError(f"a rig has 1 to {MAX_SERVERS} servers, not {count}")
        self.count = count
        self.mtu = mtu
        self._records_dir = records_dir
        self._procfs = ProcFS()
        self.prefix = ""
        self.record: RunRecord | None = None
        self.dir: Path | None = None
        self.head: Any = None
        self.servers: list[RigServer] = []

    # -- paths of the login material
    @property
    def identity(self) -> Path:
        assert self.dir is not None
        return self.dir / "id_ed25519"

    @property
    def known_hosts(self) -> Path:
        assert self.dir is not None
        return self.dir / "known_hosts"

    def __enter__(self) -> ServerRig:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        from testbed.emulation.naming import new_prefix

        if os.geteuid() != 0:
            raise EmulationError("the server rig builds namespaces: run as root (sudo)")
        if shutil.which("mnexec") is None:
            raise EmulationError("mnexec (Mininet's helper) is not installed: apt-get install mininet")
        sshd = shutil.which("sshd") or ("/usr/sbin/sshd" if Path("/usr/sbin/sshd").exists() else None)
        if sshd is None or shutil.which("ssh-keygen") is None:
            raise EmulationError("the server rig needs sshd and ssh-keygen: apt-get install openssh-server "
                                 "(make install does)")
        for _ in range(8):
            prefix = new_prefix(lambda p: prefix_in_use(p, self._records_dir, self._procfs))
            try:
                self.record = RunRecord.create(prefix, "server-rig", self._records_dir, self._procfs)
            except RecordError:
                continue
            self.prefix = prefix
            break
        else:
            raise EmulationError("could not claim a run prefix for the server rig; `testbed clean`")
        record = self.record
        assert record is not None
        self.dir = Path(tempfile.gettempdir()).resolve() / f"{self.prefix}-rig-{secrets.token_hex(4)}"
        record.add_path(self.dir)
        self.dir.mkdir(mode=0o700)
        self._keys()
        self._allow_congestion_controls()
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege-separation folder
        self.head = self._node(f"{self.prefix}hd")
        hosts = list(UNDERLAY.hosts())
        for i in range(self.count):
            self.servers.append(RigServer(f"s{i + 1}", str(hosts[i + 1]), self._node(f"{self.prefix}s{i + 1}")))
        self._underlay(str(hosts[0]))
        for server in self.servers:
            self._start_sshd(server, sshd)
        for server in self.servers:
            self._await_login(server)

    def _allow_congestion_controls(self) -> None:
        """Separate servers each have their own net.ipv4.tcp_allowed_congestion_control;
        the rig's servers and head share this machine's, which only the machine's initial
        namespace can change (a run controlled from the head could not widen it). So the
        rig allows every available algorithm here, as a server's admin would, recorded
        with the old value (restored at stop, or by `testbed clean`)."""
        assert self.record is not None
        allow_congestion_controls(None, self.record, "the server rig's servers")

    def _node(self, name: str) -> Any:
        from testbed.emulation.nodes import new_mininet_host

        node = new_mininet_host(name)
        assert self.record is not None
        node._tb_netns = self.record.add_node(name, node.pid, self._procfs).netns
        return node

    def _keys(self) -> None:
        assert self.dir is not None
        for key in (self.identity, self.dir / "host_ed25519"):
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"{self.prefix}-rig",
                            "-f", str(key)], check=True, capture_output=True)
        (self.dir / "authorized_keys").write_text(Path(f"{self.identity}.pub").read_text())
        host_pub = Path(self.dir / "host_ed25519.pub").read_text().split()
        lines = [f"{h} {host_pub[0]} {host_pub[1]}\n" for h in list(UNDERLAY.hosts())[1:self.count + 1]]
        self.known_hosts.write_text("".join(lines))

    def _underlay(self, head_ip: str) -> None:
        from mininet.link import Link

        from testbed.emulation.netns import open_iproute

        bridge = f"{self.prefix}ub"
        ports = []
        for i, server in enumerate(self.servers):
            port = f"{self.prefix}hd-u{i + 1}"
            Link(self.head, server.node, intfName1=port, intfName2=f"{self.prefix}s{i + 1}-u0")
            ports.append(port)
        with open_iproute(self.head.pid) as ipr:
            ipr.link("add", ifname=bridge, kind="bridge")
            br = ipr.link_lookup(ifname=bridge)[0]
            ipr.link("set", index=br, mtu=self.mtu)
            for port in ports:
                idx = ipr.link_lookup(ifname=port)[0]
                ipr.link("set", index=idx, mtu=self.mtu, master=br, state="up")
            ipr.addr("add", index=br, address=head_ip, prefixlen=UNDERLAY.prefixlen)
            ipr.link("set", index=br, state="up")
            ipr.link("set", index=ipr.link_lookup(ifname="lo")[0], state="up")
        for i, server in enumerate(self.servers):
            with open_iproute(server.pid) as ipr:
                idx = ipr.link_lookup(ifname=f"{self.prefix}s{i + 1}-u0")[0]
                ipr.link("set", index=idx, mtu=self.mtu, state="up")
                ipr.addr("add", index=idx, address=server.address, prefixlen=UNDERLAY.prefixlen)
                ipr.link("set", index=ipr.link_lookup(ifname="lo")[0], state="up")

    def _start_sshd(self, server: RigServer, sshd: str) -> None:
        assert self.dir is not None and self.record is not None
        config = self.dir / f"sshd_{server.name}.conf"
        config.write_text("\n".join([
            f"ListenAddress {server.address}",
            "Port 22",
            f"HostKey {self.dir / 'host_ed25519'}",
            "PidFile none",
            f"AuthorizedKeysFile {self.dir / 'authorized_keys'}",
            "PermitRootLogin prohibit-password",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "UsePAM no",
            "UseDNS no",
            "StrictModes no",
            "PermitTunnel yes",
            "MaxSessions 64",
            "MaxStartups 64:30:128",
            "LogLevel ERROR",
            # The servers share this machine's files, the head's login files included:
            # bash would source root's ~/.bashrc in every SSH session (Debian's bash does
            # for sshd's sessions at shell level 1), and a controller's profile (pyenv and
            # the like, 0.2-0.4 s a session) is not a server's. At level 2 bash skips it.
            "SetEnv SHLVL=1",
            "",
        ]))
        env = dict(os.environ, **{ENV_RUN: self.prefix})
        proc = subprocess.Popen(["mnexec", "-da", str(server.pid), sshd, "-D", "-e", "-f", str(config)],
                                env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.record.add_process("process", f"{self.prefix}{server.name}:sshd", proc.pid,
                                server.node._tb_netns, self._procfs)
        server.sshd = proc

    def ssh_argv(self, server: RigServer, *command: str) -> list[str]:
        return ["ssh", "-q", "-o", "BatchMode=yes", "-o", f"UserKnownHostsFile={self.known_hosts}",
                "-o", "StrictHostKeyChecking=yes", "-i", str(self.identity), f"root@{server.address}", *command]

    def head_argv(self, argv: list[str]) -> list[str]:
        """`argv` run in the head namespace (where the servers' addresses are reachable)."""
        return ["mnexec", "-a", str(self.head.pid), *argv]

    def _await_login(self, server: RigServer) -> None:
        deadline = time.monotonic() + SSHD_READY_S
        last = ""
        while time.monotonic() < deadline:
            if server.sshd is not None and server.sshd.poll() is not None:
                err = server.sshd.stderr.read() if server.sshd.stderr else ""
                raise EmulationError(f"sshd of rig server {server.name} exited ({server.sshd.returncode}): "
                                     f"{err.strip()[-500:]}")
            res = subprocess.run(self.head_argv(self.ssh_argv(server, "echo", "ok")), capture_output=True,
                                 text=True, timeout=10, check=False)
            if res.stdout.strip() == "ok":
                return
            last = (res.stderr or res.stdout).strip()
            time.sleep(0.2)
        raise EmulationError(f"rig server {server.name} ({server.address}) accepts no SSH login after "
                             f"{SSHD_READY_S:g}s: {last[-500:] or 'no output'}")

    def servers_section(self, placement: dict[str, list[str]], tunnel: Literal["vxlan", "gre"] = "vxlan",
                        configure: Literal["auto", "ssh"] = "auto") -> ServerPlan:
        """The topology's `servers:` section placing DCs (`{server name: [dc, ...]}`) on the rig
        (for a topology file: ``.model_dump(mode="json", exclude_none=True)``).
        `configure: ssh` reaches the rig's nodes over SSH as those of other machines are
        (the servers' Python is this one, which has this package)."""
        by_name = {s.name: s for s in self.servers}
        return ServerPlan(
            tunnel=tunnel, configure=configure, python=sys.executable,
            ssh=SshSettings(user="root", identity=str(self.identity), known_hosts=str(self.known_hosts)),
            machines=[Server(name=name, address=by_name[name].address, dcs=dcs) for name, dcs in placement.items()])

    def stop(self) -> None:
        """Stop the sshds, remove the namespaces and the key folder, drop the record."""
        from testbed.emulation.nodes import close_mininet_host

        for server in self.servers:
            if server.sshd is not None and server.sshd.poll() is None:
                server.sshd.terminate()
                try:
                    server.sshd.wait(timeout=3)
                except subprocess.TimeoutExpired:
                    server.sshd.kill()
        if self.record is not None:
            others, _ = list_records(self.record.path.parent)
            failures = execute(plan_clean(self.record, self._procfs, others), self._procfs)
            if failures:
                print("testbed: the server rig left something behind, run `testbed clean`: "
                      + "; ".join(failures))
            else:  # dead runs that used its servers (e.g. killed by a test's timeout): cleaned here now
                for other in others:
                    if other.prefix != self.prefix and uses_rig(other, self.prefix):
                        plan = plan_clean(other, self._procfs, others)
                        left = [] if any(a.kind == "skip" for a in plan) else execute(plan, self._procfs)
                        if left:
                            print(f"testbed: run {other.prefix} over the server rig left something behind, "
                                  "run `testbed clean`: " + "; ".join(left))
        for node in [s.node for s in self.servers] + ([self.head] if self.head is not None else []):
            close_mininet_host(node)
        self.servers, self.head, self.record = [], None, None
