"""Real machines instead of the emulation (``testbed run SCENARIO --inventory FILE``).

Each host of the topology is a machine of the inventory (testbed_core/inventory.py),
reached over SSH with a key (BatchMode: a password is never asked for). The runner
starts its processes there exactly as on emulated hosts, through the `Host`
protocol: `popen(argv)` becomes one `ssh` whose remote side is a tiny launcher that
reads the process's environment from the first line of stdin (so the channels'
secret is never on a command line), writes its pid to the run's folder on that
machine (so the process can be signalled, and cleaned up at the end), changes to the
repository's folder there and execs the command. The process's stdin, stdout and
stderr are ssh's, so the runner's pipes and log files work unchanged.

The runner's control sockets (UNIX sockets in the run's control folder) are
forwarded to a private path on each machine (one ``ssh -N -R`` per machine and
socket), and the worker is told where (``TESTBED_CONTROL_MAP``). The job files and result folder are not
copied: every machine must see them at the same path (a shared file system, e.g.
NFS), which is checked, per folder, before a process that names them starts.

Nothing is shaped: the WAN is the real network between the machines; the runner
calibrates it as it calibrates an emulated WAN.

What the run makes on the machines (their folders, ``/tmp/<prefix>-inv-*``, and its
processes, marked TESTBED_RUN=<prefix> in their environment) is written, with each
machine's login, in a run record (testbed/emulation/records.py) before the run starts
there, where records can be written (root): the run's normal end removes it all and
drops the record; after a crash `testbed clean` ends it over SSH (``python -m
testbed.emulation.remote.nodeagent clean`` from the machine's repository, as the login's user).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import secrets
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from testbed.emulation.records import ENV_RUN
from testbed.emulation.remote.nodeagent import READY_MARK
from testbed.emulation.remote.readyrelay import relay_stderr, start_relay
from testbed.progress import Progress
from testbed.run.common import RunnerError
from testbed.training.worker.control import CONTROL_MAP_ENV
from testbed_core.constants import REPO_ROOT
from testbed_core.inventory import Inventory, InventoryError, Machine, load_inventory
from testbed_runtime.readiness import READY_FD_ENV

if TYPE_CHECKING:
    from testbed.emulation.delayline.stats import RelaySnapshot
    from testbed.emulation.records import RunRecord
    from testbed.emulation.remote.sshlogin import RemoteLogin
    from testbed.run.scenario import Scenario
    from testbed_core.topology import Topology

CONNECT_TIMEOUT_S = 8
LOGIN_TIMEOUT_S = 60.0
SIGNAL_TIMEOUT_S = 20.0
DELAY_BACKEND = "none (real machines over SSH: the network between them, nothing shaped)"

# Runs on the machine: the environment from stdin's first line (read byte by byte so
# the rest of stdin stays the command's), the pid to a file, then exec. When the
# runner waits for the process to announce readiness (testbed_runtime/readiness.py),
# the launcher stays as its parent: it hands the command a pipe of its own and writes
# what comes out of it to stderr after READY_MARK, and the runner's side passes that
# line on to the runner's pipe (`RemotePopen`).
# READY_MARK: the node agent's (testbed/emulation/remote/nodeagent.py), relayed by testbed/emulation/remote/readyrelay.py
LAUNCHER = (
    "import json,os,sys\n"
    "b=b''\n"
    "while not b.endswith(b'\\n'):\n"
    "    c=os.read(0,1)\n"
    "    if not c: sys.exit('testbed launcher: no environment on stdin')\n"
    "    b+=c\n"
    "e=dict(os.environ); e.update(json.loads(b))\n"
    "os.chdir(sys.argv[2])\n"
    "if 'TESTBED_READY_FD' not in e:\n"
    "    open(sys.argv[1],'w').write(str(os.getpid()))\n"
    "    os.execvpe(sys.argv[3],sys.argv[3:],e)\n"
    "r,w=os.pipe(); os.set_inheritable(w,True); e['TESTBED_READY_FD']=str(w)\n"
    "pid=os.fork()\n"
    "if pid==0:\n"
    "    os.close(r); os.execvpe(sys.argv[3],sys.argv[3:],e)\n"
    "os.close(w); open(sys.argv[1],'w').write(str(pid))\n"
    "d=b''\n"
    "while True:\n"
    "    c=os.read(r,65536)\n"
    "    if not c: break\n"
    "    d+=c\n"
    "if d: os.write(2,b'" + READY_MARK.replace("\x1e", "\\x1e") + "'+d.split(b'\\n')[0]+b'\\n')\n"
    "sys.exit(os.waitstatus_to_exitcode(os.waitpid(pid,0)[1]) % 256)\n"
)


def ssh_options(inv: Inventory, machine: Machine) -> list[str]:
    """ssh's options for `machine`: key-based only (BatchMode), the inventory's key
    and known_hosts when given, dead connections noticed within about 15 s."""
    ssh = inv.ssh_for(machine)
    argv = ["-q", "-T", "-o", "BatchMode=yes", "-o", f"ConnectTimeout={CONNECT_TIMEOUT_S}",
            "-o", "ServerAliveInterval=5", "-o", "ServerAliveCountMax=3", "-p", str(ssh.port)]
    if ssh.identity:
        argv += ["-i", ssh.identity, "-o", "IdentitiesOnly=yes"]
    if ssh.known_hosts:
        argv += ["-o", f"UserKnownHostsFile={ssh.known_hosts}", "-o", "StrictHostKeyChecking=yes"]
    return argv


def login(inv: Inventory, machine: Machine) -> str:
    return f"{inv.ssh_for(machine).user}@{machine.address}"


def _field(inv: Inventory, machine: Machine, name: str) -> str:
    i = inv.machines.index(machine)
    return f"machines.{i}.ssh.{name}" if machine.ssh is not None else f"ssh.{name}"


def file_problems(inv: Inventory) -> list[str]:
    """The key and known_hosts files the inventory names that this machine cannot read."""
    problems: list[str] = []
    seen: set[tuple[str, str]] = set()
    for m in inv.machines:
        ssh = inv.ssh_for(m)
        for name, value, what in (("identity", ssh.identity, "the private key the machines accept "
                                   "(ssh-keygen -t ed25519; its .pub in ~/.ssh/authorized_keys on each machine)"),
                                  ("known_hosts", ssh.known_hosts, "a known_hosts file with the machines' host "
                                   "keys (ssh-keyscan ADDRESS >> FILE, after checking them)")):
            key = (_field(inv, m, name), str(value))
            if value is None or key in seen:
                continue
            seen.add(key)
            if not os.access(value, os.R_OK) or not Path(value).is_file():
                problems.append(f"{inv.where()}: {key[0]}: {value} does not exist or cannot be read; give {what}")
    return problems


@dataclass
class Remote:
    """One machine of the run: how to reach it and its private folder there."""

    inv: Inventory
    machine: Machine
    folder: str  # the run's folder on the machine: pid files, forwarded control sockets
    repo: str
    python: str
    record: RunRecord | None = None  # the run's record (None where none could be written)
    _seen: set[str] = field(default_factory=set)  # folders known to be visible there
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def label(self) -> str:
        ssh = self.inv.ssh_for(self.machine)
        return f"machine {self.machine.name} ({login(self.inv, self.machine)}:{ssh.port})"

    def ssh(self, *extra: str) -> list[str]:
        return ["ssh", *ssh_options(self.inv, self.machine), *extra, login(self.inv, self.machine)]

    def login_record(self) -> RemoteLogin:
        """The login as run records keep it (testbed.emulation.remote.sshlogin.RemoteLogin): the
        login's own user (no sudo), this machine's Python and repository."""
        from testbed.emulation.remote.sshlogin import RemoteLogin

        ssh = self.inv.ssh_for(self.machine)
        return RemoteLogin(server=self.machine.name, address=self.machine.address, user=ssh.user, port=ssh.port,
                           identity=ssh.identity, known_hosts=ssh.known_hosts, python=self.python, sudo=False,
                           cwd=self.repo)

    def run(self, command: str, timeout: float) -> subprocess.CompletedProcess:
        return subprocess.run([*self.ssh(), command], capture_output=True, text=True, timeout=timeout,
                              check=False, stdin=subprocess.DEVNULL)

    def check_visible(self, paths: Sequence[str]) -> None:
        """Refuse to start a process whose files (absolute paths that exist here) the
        machine does not see at the same path; asked once per folder."""
        folders = sorted({p if os.path.isdir(p) else os.path.dirname(p) for p in paths} - self._seen)
        if not folders:
            return
        probe = "; ".join(f"test -e {shlex.quote(f)} || echo {shlex.quote(f)}" for f in folders)
        res = self.run(probe, timeout=SIGNAL_TIMEOUT_S)
        if res.returncode != 0:
            raise RunnerError(f"{self.label}: could not check the run's folders there: "
                              f"{(res.stderr or res.stdout).strip()[-300:]}")
        missing = [line for line in res.stdout.splitlines() if line.strip()]
        if missing:
            raise RunnerError(f"{self.label} does not see {', '.join(missing)}: the job files and the result "
                              "folder must be at the same path on every machine (a shared file system such as "
                              "NFS); mount it there, or give --out a folder on the shared file system")
        with self._lock:
            self._seen.update(folders)

    def signal(self, pidfile: str, sig: int) -> None:
        with contextlib.suppress(subprocess.TimeoutExpired, OSError):
            self.run(f"kill -{int(sig)} \"$(cat {shlex.quote(pidfile)} 2>/dev/null)\" 2>/dev/null", SIGNAL_TIMEOUT_S)

    def cleanup(self) -> str | None:
        """End whatever the run left running there and remove its folder; a message when that failed."""
        folder = shlex.quote(self.folder)
        cmd = (f"for f in {folder}/*.pid; do [ -f \"$f\" ] && kill -9 \"$(cat \"$f\")\" 2>/dev/null; done; "
               f"rm -rf {folder}")
        try:
            res = self.run(cmd, SIGNAL_TIMEOUT_S)
        except (subprocess.TimeoutExpired, OSError) as exc:
            return f"{self.label}: {exc}"
        return None if res.returncode in (0, 1) else f"{self.label}: {(res.stderr or res.stdout).strip()[-200:]}"


class RemotePopen(subprocess.Popen):
    """An ssh running one process on a machine; signals go to the remote process."""

    def __init__(self, remote: Remote, pidfile: str, argv: list[str], env_line: str, keep_stdin: bool,
                 ready_fd: int | None = None, **kwargs: Any) -> None:
        relay_to = -1
        if ready_fd is not None:  # the readiness line comes back on ssh's stderr
            relay_to, ready_fd = relay_stderr(kwargs, ready_fd)
        super().__init__(argv, **kwargs)
        self.remote, self.pidfile = remote, pidfile
        if ready_fd is not None:
            start_relay(self, ready_fd, relay_to, f"ready-relay-{pidfile}")
        assert self.stdin is not None
        try:
            self.stdin.write(env_line if kwargs.get("text") or kwargs.get("universal_newlines")
                             else env_line.encode())
            self.stdin.flush()
            if not keep_stdin:
                self.stdin.close()
                self.stdin = None
        except (BrokenPipeError, OSError):
            pass  # ssh ended already: its exit status and log say why

    def send_signal(self, sig: int) -> None:
        if self.poll() is not None:
            return
        self.remote.signal(self.pidfile, sig)
        if sig == signal.SIGKILL:
            super().send_signal(sig)


@dataclass
class InventoryHost:
    """A topology host played by a real machine: its processes run there over SSH."""

    name: str
    dc: str
    ip: str
    remote: Remote
    net: InventoryNetwork = field(repr=False)

    def popen(self, argv: Sequence[str], **kwargs: Any) -> subprocess.Popen:
        r = self.remote
        argv = [r.python if a == sys.executable else a for a in argv]
        env = kwargs.pop("env", None) or dict(os.environ)
        cwd = str(kwargs.pop("cwd", None) or REPO_ROOT)
        cwd = r.repo if cwd == str(REPO_ROOT) else cwd
        here = str(REPO_ROOT)
        changed = {k: v.replace(here, r.repo) for k, v in env.items() if os.environ.get(k) != v}
        if r.record is not None:  # the run's mark: `testbed clean` finds what is left by it (nodeagent clean)
            changed[ENV_RUN] = r.record.prefix
        files = [a for a in argv[1:] if a.startswith("/") and a != r.python and os.path.exists(a)]
        r.check_visible(files)
        n = next(self.net.counter)
        control = {sock: self.net.forward(r, sock) for sock in self.net.control_sockets()}
        if control:
            changed[CONTROL_MAP_ENV] = json.dumps(control)
        pidfile = f"{r.folder}/p{n}.pid"
        command = shlex.join([r.python, "-c", LAUNCHER, pidfile, cwd, *argv])
        keep = kwargs.pop("stdin", None) == subprocess.PIPE
        ready = env.get(READY_FD_ENV)
        kwargs.pop("pass_fds", None)  # descriptors do not cross ssh: the readiness pipe is relayed
        return RemotePopen(r, pidfile, [*r.ssh(), command], json.dumps(changed) + "\n", keep,
                           int(ready) if ready else None, stdin=subprocess.PIPE, **kwargs)

    def popen_warm(self, argv: Sequence[str], *, preload: Sequence[str], **kwargs: Any) -> subprocess.Popen:
        """A real machine has no fork server of ours: a fresh interpreter there (popen)."""
        return self.popen(argv, **kwargs)


@dataclass
class InventoryNetwork:
    """The run's hosts as real machines (the `Network` protocol of testbed/run/network.py)."""

    inv: Inventory
    topology: Topology
    remotes: dict[str, Remote]
    assignment: dict[str, Machine]
    delay_backend: str = DELAY_BACKEND
    local: bool = False
    counter: Iterator[int] = field(default_factory=itertools.count)
    _temp: list[Path] = field(default_factory=list)
    record: RunRecord | None = None  # the run record: local temporary folders are written in it before they are made
    _tunnels: dict[tuple[str, str], tuple[subprocess.Popen, str]] = field(default_factory=dict)
    _tunnel_lock: threading.Lock = field(default_factory=threading.Lock)

    def helper_pids(self) -> list[int] | None:
        return None  # the workers run on other machines: this one's CPU says nothing of theirs

    def forward(self, remote: Remote, sock: str) -> str:
        """The path on `remote` where the runner's control socket `sock` answers: one
        ``ssh -N -R`` per machine and socket, kept for the run (a process's own ssh
        cannot carry it: it would wait for the runner to close the connection before
        it could exit). Workers retry the connection until the forward is up."""
        key = (remote.machine.name, sock)
        with self._tunnel_lock:
            if key in self._tunnels and self._tunnels[key][0].poll() is None:
                return self._tunnels[key][1]
            path = f"{remote.folder}/ctl{len(self._tunnels)}.sock"
            proc = subprocess.Popen([*remote.ssh("-N", "-o", "ExitOnForwardFailure=yes", "-R", f"{path}:{sock}")],
                                    stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            if remote.record is not None:  # a local ssh: its command line carries the run's prefix (the path)
                remote.record.add_process("process", f"{remote.record.prefix}:ssh-forward", proc.pid, None)
            self._tunnels[key] = (proc, path)
            return path

    def close_tunnels(self) -> None:
        for proc, _ in self._tunnels.values():
            if proc.poll() is None:
                proc.terminate()
        for proc, _ in self._tunnels.values():
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            if proc.stderr:
                proc.stderr.close()

    def host(self, name: str) -> InventoryHost:
        machine = self.assignment.get(name)
        if machine is None:
            raise RunnerError(f"no host {name!r} in topology {self.topology.name} ({self.inv.where()})")
        dc = name.rsplit("-", 1)[0]
        return InventoryHost(name, dc, machine.ip, self.remotes[machine.name], self)

    def temp_dir(self, purpose: str) -> Path:
        """A private local folder (the runner's control sockets, before they are forwarded):
        recorded first, so `testbed clean` removes it after a run that was killed."""
        if self.record is None:
            path = Path(tempfile.mkdtemp(prefix=f"tbrun-{purpose}-"))
        else:
            path = Path(tempfile.gettempdir()).resolve() / f"{self.record.prefix}-{purpose}-{secrets.token_hex(4)}"
            self.record.add_path(path)
            path.mkdir(mode=0o700)
        self._temp.append(path)
        return path

    def memory_dir(self, purpose: str) -> Path | None:
        """None: the run's processes are on other machines and share the results folder."""
        return None

    def control_sockets(self) -> list[str]:
        """The runner's listening control sockets now (forwarded to each new process)."""
        out = []
        for folder in self._temp:
            if "-ctl-" in folder.name and folder.is_dir():
                out += sorted(str(p) for p in folder.glob("*.sock") if p.is_socket())
        return out

    def delay_line_stats(self) -> dict[str, RelaySnapshot]:
        return {}

    def adopt(self, scenario: Scenario, progress: Progress) -> Scenario:
        """The scenario as it runs here: its topology's WAN delays measured between the machines."""
        return scenario.model_copy(update={"topology": real_topology(self, scenario.topology, progress)})


# Runs on a machine: the best of N TCP handshakes to ADDRESS:PORT (a refusal answers
# within one round trip too), in seconds.
RTT_PROBE = (
    "import socket,sys,time\n"
    "best=None\n"
    "for _ in range(int(sys.argv[3])):\n"
    "    s=socket.socket(); s.settimeout(5); t=time.perf_counter()\n"
    "    try: s.connect((sys.argv[1],int(sys.argv[2])))\n"
    "    except ConnectionRefusedError: pass\n"
    "    except OSError as e: print('ERR',e); sys.exit(0)\n"
    "    d=time.perf_counter()-t; best=d if best is None else min(best,d); s.close()\n"
    "print(best)\n"
)
RTT_PROBES = 7


def measure_rtt(src: Remote, dst: Machine) -> float:
    """The round trip from machine `src` to `dst` (its data address): the quickest TCP handshake."""
    port = src.inv.ssh_for(dst).port
    res = src.run(shlex.join([src.python, "-c", RTT_PROBE, dst.ip, str(port), str(RTT_PROBES)]), SIGNAL_TIMEOUT_S * 2)
    out = res.stdout.strip().splitlines()[-1:] or [""]
    try:
        return float(out[0])
    except ValueError:
        raise RunnerError(f"{src.label}: could not time a round trip to machine {dst.name} ({dst.ip}:{port}): "
                          f"{(out[0] or res.stderr.strip())[-300:]}; the machines must reach each other's "
                          "data addresses") from None


def real_topology(net: InventoryNetwork, topology: Topology, progress: Progress) -> Topology:
    """`topology` with each WAN link's delay the real one between the machines of its
    DCs (half the measured round trip), no jitter, loss, trace or scheduled changes:
    the real network is not shaped, and the calibration and predictions must start
    from what it is, not from what the file says an emulated WAN would be."""
    first = {dc.name: f"{dc.name}-{dc.hosts[0]}" for dc in topology.dcs}
    data = topology.model_dump()
    for link, raw in zip(topology.wan, data["wan"], strict=True):
        a, b = (net.assignment[first[dc]] for dc in link.between)
        rtt = measure_rtt(net.remotes[a.name], b)
        progress.log(f"real path {link.between[0]}<->{link.between[1]} (machines {a.name}, {b.name}): RTT "
                     f"{rtt * 1e3:.3f} ms (the topology's {link.rtt_s * 1e3:g} ms replaced: nothing is shaped)")
        raw.update(delay=rtt / 2, jitter=0.0, loss=0.0, changes=[], trace=None)
    data.pop("source", None)
    return type(topology).model_validate(data)


def _login_check(remote: Remote) -> str | None:
    """Log in, check the interpreter and repository there, make the run's folder."""
    m = remote.machine
    cmd = (f"test -x {shlex.quote(remote.python)} || {{ echo 'no-python'; exit 3; }}; "
           f"cd {shlex.quote(remote.repo)} 2>/dev/null || {{ echo 'no-repo'; exit 3; }}; "
           f"{shlex.quote(remote.python)} -c 'import testbed_core, atlas_transport' 2>/dev/null "
           "|| { echo 'no-import'; exit 3; }; "
           f"mkdir -m 700 {shlex.quote(remote.folder)} && echo ok")
    i = remote.inv.machines.index(m)
    where = f"{remote.inv.where()}: machines.{i} ({m.name}, {login(remote.inv, m)}:{remote.inv.ssh_for(m).port})"
    try:
        res = remote.run(cmd, LOGIN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return f"{where}: no answer over SSH within {LOGIN_TIMEOUT_S:g} s; check that the machine is up"
    out = res.stdout.strip()
    if res.returncode == 255:
        why = (res.stderr.strip().splitlines() or ["no message from ssh"])[-1]
        return (f"{where}: cannot log in over SSH ({why}); check the address, that the machine is reachable "
                f"from here, that sshd runs there and accepts key-based login with {_field(remote.inv, m, 'identity')}"
                f" ({remote.inv.ssh_for(m).identity or 'ssh default keys'}), and that its host key is in "
                f"{_field(remote.inv, m, 'known_hosts')}")
    if out.endswith("no-python"):
        return f"{where}: no interpreter {remote.python} there; set python: (or machines.{i}.python) to its path"
    if out.endswith("no-repo"):
        return f"{where}: no repository at {remote.repo} there; set repo: (or machines.{i}.repo) to its path"
    if out.endswith("no-import"):
        return (f"{where}: {remote.python} there cannot import testbed_core and atlas_transport from "
                f"{remote.repo}; install the project there (make install) at the same version as here")
    if not out.endswith("ok"):
        return f"{where}: could not make the run's folder {remote.folder}: {(res.stderr or out).strip()[-200:]}"
    return None


def _claim_record(progress: Progress) -> RunRecord | None:
    """A run record (testbed/emulation/records.py) for the machines' folders and
    processes, so that `testbed clean` can end them over SSH when this run is killed;
    None, said once, where records cannot be written (not root)."""
    from testbed.emulation.naming import new_prefix
    from testbed.emulation.records import RecordError, RunRecord, prefix_in_use

    for _ in range(8):
        try:
            return RunRecord.create(new_prefix(prefix_in_use), "inventory")
        except RecordError as exc:
            if "already taken" in str(exc):
                continue
            progress.log(f"real machines: no run record ({exc}): if this run is killed, what it started on the "
                         "machines stays there until it ends")
            return None
    return None


def _refused_faults(scenario: Scenario, inv: Inventory) -> list[str]:
    return [f"{scenario.source or 'scenario'}: faults.{i}: a {f.kind} needs the emulated network; on real "
            f"machines ({inv.where()}) only kill-worker faults are played (drop it, or run without --inventory)"
            for i, f in enumerate(scenario.faults or []) if f.kind != "kill-worker"]


@contextlib.contextmanager
def open_inventory(scenario: Scenario, progress: Progress) -> Iterator[InventoryNetwork]:
    """The scenario's hosts on the inventory's machines: files checked, every machine
    logged in to (in parallel) and given a private folder; at the end, whatever the run
    left there is ended and the folders removed."""
    try:
        inv = load_inventory(scenario.runner.inventory)
        assignment = inv.assignment(scenario.topology)
    except InventoryError as exc:
        raise RunnerError(str(exc)) from None
    problems = file_problems(inv) + _refused_faults(scenario, inv)
    if problems:
        raise RunnerError("\n".join(problems))
    record = _claim_record(progress)
    prefix = record.prefix if record is not None else f"tb{secrets.token_hex(2)[:3]}"
    used = {m.name: m for m in assignment.values()}
    remotes = {name: Remote(inv, m, f"/tmp/{prefix}-inv-{secrets.token_hex(3)}-{name}",
                            inv.repo_for(m, str(REPO_ROOT)), inv.python_for(m, sys.executable), record=record)
               for name, m in used.items()}
    if record is not None:  # before anything is made there: `testbed clean` undoes it after a crash
        for r in remotes.values():
            record.add_remote(r.machine.name, r.login_record().model_dump())
            record.add_remote_path(r.machine.name, r.folder)
    progress.log(f"real machines: logging in to {', '.join(sorted(remotes))} ({inv.where()})")
    with ThreadPoolExecutor(max_workers=min(16, len(remotes))) as pool:
        results = dict(zip(remotes, pool.map(_login_check, remotes.values()), strict=True))
    failed = [msg for msg in results.values() if msg]
    net = InventoryNetwork(inv, scenario.topology, remotes, assignment, record=record)
    try:
        if failed:
            raise RunnerError("\n".join(failed))
        yield net
    finally:
        net.close_tunnels()
        reached = [r for name, r in remotes.items() if not results[name]]
        with ThreadPoolExecutor(max_workers=max(1, min(16, len(reached)))) as pool:
            left = [msg for msg in pool.map(Remote.cleanup, reached) if msg]
        for path in net._temp:
            shutil.rmtree(path, ignore_errors=True)
        if left:
            progress.log("real machines: could not clean up " + "; ".join(left)
                         + ("; `testbed clean` tries again" if record is not None else ""))
        elif record is not None:
            record.delete()
