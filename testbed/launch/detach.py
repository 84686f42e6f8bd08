"""Topologies kept up between launches: `testbed topo up --detach`, `launch --attach`,
`topo down`, `topo list`.

A daemon (``python -m testbed.launch.detach serve ...``, its own session) builds the
`Emulation` in its main thread and keeps it until SIGTERM (`topo down`), which
unwinds it like any run. While up it:

* writes a state file, ``<RECORD_DIR>/detached/<prefix>-<name>.json`` (`DetachedState`),
  named with the run prefix and listed in the run record, so that `testbed clean`
  removes it with the rest of the run if the daemon is SIGKILLed;
* serves launches on a Unix socket (SOCK_SEQPACKET, one JSON object per message) in a
  folder of the run (`Emulation.temp_dir`): a launch sends ``spawn`` with the write
  ends of its rank's stdout/stderr pipes (SCM_RIGHTS); the daemon starts the program
  with `HostHandle.popen` (so it is recorded in the run record and ended at teardown
  or by `testbed clean`), answers its PID and later its exit status. When a launch's
  connection closes (it ended, or was killed) the daemon ends that launch's ranks
  still running.

The starter (`start_detached`) reads the daemon's output until its ``READY`` line (the
build's progress is shown meanwhile) or its end (the build's error); afterwards the
daemon's output goes to a log in the run's folder.
"""

from __future__ import annotations

import array
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from testbed.emulation.records import RECORD_DIR, ProcFS
from testbed.launch.models import DetachedHost, DetachedState, DetachedWan
from testbed.launch.plan import HostSlot, LaunchError
from testbed_core.atomic import write_text_atomic

if TYPE_CHECKING:
    from testbed.emulation.network import Emulation

DETACHED_DIR = RECORD_DIR / "detached"
NAME_RE = re.compile(r"^[a-z0-9][a-z0-9-]{0,31}$")
READY = "READY"
MAX_MSG = 1 << 20
START_TIMEOUT_S = 300.0
DOWN_TIMEOUT_S = 60.0
REPLY_TIMEOUT_S = 30.0


def validate_name(name: str) -> str:
    if not NAME_RE.fullmatch(name):
        raise LaunchError(f"detached topology name {name!r}: use 1-32 lowercase letters, digits and '-', "
                          "starting with a letter or digit")
    return name


# --------------------------------------------------------------------------- state files


def state_alive(state: DetachedState, procfs: ProcFS | None = None) -> bool:
    """Whether the daemon of `state` is still the process that wrote it (not a zombie
    waiting to be reaped after a SIGKILL)."""
    procfs = procfs or ProcFS()
    if procfs.start_time(state.daemon_pid) != state.daemon_start:
        return False
    try:
        stat = (procfs.root / str(state.daemon_pid) / "stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2:].split()[:1] != ["Z"]


def list_detached(directory: Path | None = None) -> list[tuple[DetachedState, bool]]:
    """Every detached topology's state, with whether its daemon is alive."""
    directory = Path(directory or DETACHED_DIR)
    out = []
    try:
        paths = sorted(directory.glob("*.json")) if directory.is_dir() else []
    except PermissionError:
        raise LaunchError(f"cannot read {directory}: detached topologies are root's; run as root (sudo)") from None
    for path in paths:
        try:
            state = DetachedState.model_validate_json(path.read_text())
        except (OSError, ValueError):
            continue
        out.append((state, state_alive(state)))
    return out


def find_detached(name: str, directory: Path | None = None) -> DetachedState:
    """The live detached topology `name`; LaunchError naming the ones up when none is."""
    found = [(s, alive) for s, alive in list_detached(directory) if s.name == name]
    live = [s for s, alive in found if alive]
    if live:
        return live[0]
    up = ", ".join(s.name for s, alive in list_detached(directory) if alive) or "none"
    if found:
        raise LaunchError(f"detached topology {name!r} is not up: its daemon (pid {found[0][0].daemon_pid}) is "
                          f"gone; `testbed clean` removes what it left (up now: {up})")
    raise LaunchError(f"no detached topology named {name!r} is up (up now: {up}); start one with "
                      f"`testbed topo up FILE --detach --name {name}`")


# --------------------------------------------------------------------------- starting and stopping


def start_detached(file: str, name: str, *, backend: str | None = None, servers: str | None = None,
                   say: Callable[[str], None] = lambda _m: None,
                   timeout_s: float = START_TIMEOUT_S) -> DetachedState:
    """Start the daemon for topology `file` under `name`; return its state once the
    topology is built. LaunchError with the build's error when it fails."""
    validate_name(name)
    if any(s.name == name and alive for s, alive in list_detached()):
        raise LaunchError(f"a detached topology named {name!r} is already up: `testbed topo down {name}` first, "
                          "or give another --name")
    argv = [sys.executable, "-m", "testbed.launch.detach", "serve", "--name", name, "--file", str(file)]
    if backend:
        argv += ["--backend", backend]
    if servers:
        argv += ["--servers", str(servers)]
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True, text=True, bufsize=1)
    assert proc.stdout is not None
    lines: list[str] = []
    deadline = time.monotonic() + timeout_s
    state_path = None
    try:
        for line in proc.stdout:
            line = line.rstrip("\n")
            if line.startswith(READY + " "):
                state_path = Path(line[len(READY) + 1:])
                break
            lines.append(line)
            say(line)
            if time.monotonic() > deadline:
                break
    except BaseException:
        proc.terminate()  # the daemon unwinds its emulation on SIGTERM
        proc.wait(timeout=DOWN_TIMEOUT_S)
        raise
    proc.stdout.close()
    if state_path is None:
        if proc.poll() is None:
            proc.terminate()
        try:
            proc.wait(timeout=DOWN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
        tail = "\n".join(lines[-12:]) or "no output"
        raise LaunchError(f"the detached topology {name!r} did not come up (exit code {proc.returncode}):\n{tail}")
    return DetachedState.model_validate_json(state_path.read_text())


def stop_detached(name: str, timeout_s: float = DOWN_TIMEOUT_S) -> DetachedState:
    """Ask the daemon of `name` to tear down (SIGTERM) and wait until it is gone."""
    state = find_detached(name)
    procfs = ProcFS()
    try:
        os.kill(state.daemon_pid, signal.SIGTERM)
    except ProcessLookupError:
        return state
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if procfs.start_time(state.daemon_pid) != state.daemon_start:
            return state
        time.sleep(0.1)
    raise LaunchError(f"the daemon of {name!r} (pid {state.daemon_pid}) did not end within {timeout_s:g} s; "
                      "`kill -9` it, then `testbed clean`")


# --------------------------------------------------------------------------- the daemon


def _send(sock: socket.socket, lock: threading.Lock, message: dict[str, Any]) -> None:
    with lock:
        sock.send(json.dumps(message).encode())


class _Connection(threading.Thread):
    """One launch attached to the daemon."""

    def __init__(self, emu: Emulation, sock: socket.socket) -> None:
        super().__init__(daemon=True, name="detach-conn")
        self.emu, self.sock = emu, sock
        self.lock = threading.Lock()
        self.procs: list[subprocess.Popen] = []

    def run(self) -> None:
        try:
            while True:
                fds = array.array("i")
                data, ancdata, _flags, _addr = self.sock.recvmsg(MAX_MSG, socket.CMSG_SPACE(2 * fds.itemsize))
                if not data:
                    break
                for level, kind, cdata in ancdata:
                    if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                        fds.frombytes(cdata[:len(cdata) - (len(cdata) % fds.itemsize)])
                try:
                    self._handle(json.loads(data), list(fds))
                finally:
                    for fd in fds:
                        os.close(fd)
        except OSError:
            pass
        finally:
            self._end_ranks()
            self.sock.close()

    def _handle(self, msg: dict[str, Any], fds: list[int]) -> None:
        op = msg.get("op")
        try:
            if op == "spawn":
                host = self.emu.node(msg["host"])
                proc = host.popen(msg["argv"], env=msg["env"], cwd=msg["cwd"], stdin=subprocess.DEVNULL,
                                  stdout=fds[0], stderr=fds[1])
                self.procs.append(proc)
                _send(self.sock, self.lock, {"op": "spawned", "pid": proc.pid})
                threading.Thread(target=self._wait, args=(proc,), daemon=True).start()
            elif op == "signal":  # a rank's whole group here; through its server's agent on another server
                proc = next((p for p in self.procs if p.pid == int(msg["pid"])), None)
                if proc is not None and proc.poll() is None:
                    _signal_rank(proc, int(msg["sig"]))
                _send(self.sock, self.lock, {"op": "signalled"})
            elif op == "counters":
                from testbed.launch.run import EmulationSite

                _send(self.sock, self.lock, {"op": "counters", "links": EmulationSite(self.emu).wan_counters()})
            else:
                _send(self.sock, self.lock, {"op": "error", "message": f"unknown request {op!r}"})
        except Exception as exc:
            _send(self.sock, self.lock, {"op": "error", "message": f"{type(exc).__name__}: {exc}"})

    def _wait(self, proc: subprocess.Popen) -> None:
        code = proc.wait()
        try:
            _send(self.sock, self.lock, {"op": "exit", "pid": proc.pid, "code": code})
        except OSError:
            pass

    def _end_ranks(self) -> None:
        live = [p for p in self.procs if p.poll() is None]
        for p in live:
            _signal_rank(p, signal.SIGTERM)
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline and any(p.poll() is None for p in live):
            time.sleep(0.05)
        for p in live:
            if p.poll() is None:
                _signal_rank(p, signal.SIGKILL)


def _signal_rank(proc: subprocess.Popen[bytes], sig: int) -> None:
    """`sig` to a rank the daemon started: its process group on this machine (mnexec -d
    made it a session leader); on another server, through the program's agent there."""
    try:
        if type(proc) is subprocess.Popen:
            os.killpg(proc.pid, sig)
        else:
            proc.send_signal(sig)
    except (ProcessLookupError, PermissionError):
        pass


def serve(name: str, file: str, backend: str | None, servers: str | None) -> None:
    """The daemon: build, write the state, serve launches until SIGTERM."""
    from testbed.emulation.naming import RunNames
    from testbed.emulation.network import Emulation
    from testbed.emulation.nodes import WanHandle
    from testbed_core.servers import load_servers, place_topology
    from testbed_core.topology import load_topology

    def say(message: str) -> None:
        print(message, flush=True)

    topology = load_topology(file)
    if servers:
        topology = place_topology(topology, load_servers(servers), servers)
    emu = Emulation(topology, delay_backend=backend, progress=say)
    state_path: Path | None = None
    with emu:  # SIGTERM and SIGHUP unwind it (the Emulation's handlers)
        assert emu.record is not None
        folder = emu.temp_dir("detach")
        sock_path = folder / "launch.sock"
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        listener.bind(str(sock_path))
        os.chmod(sock_path, 0o600)
        listener.listen(16)
        DETACHED_DIR.mkdir(mode=0o700, parents=True, exist_ok=True)
        state_path = DETACHED_DIR / f"{emu.prefix}-{name}.json"
        emu.record.add_path(state_path)
        log = folder / "daemon.log"
        hosts = [DetachedHost(name=h.name, dc=h.dc, ip=h.ip, intf=RunNames.intf(h.mn_name, 0), node_pid=h.pid,
                              netns=h.netns_inode) for h in emu.hosts()]
        wans = [DetachedWan(link=w.link.name, a=w.plan.a, b=w.plan.b, node_pid=w.pid, intfs=w.intfs)
                for w in emu.nodes() if isinstance(w, WanHandle) and w.link is not None and w.plan is not None]
        pid = os.getpid()
        state = DetachedState(name=name, topology=topology.name, topology_file=str(Path(file).resolve()),
                              prefix=emu.prefix, daemon_pid=pid, daemon_start=ProcFS().start_time(pid) or 0,
                              socket=str(sock_path), log=str(log), delay_backend=emu.delay_backend, built=time.time(),
                              hosts=hosts, wans=wans)
        write_text_atomic(state_path, state.model_dump_json(indent=1) + "\n")

        def accept() -> None:
            while True:
                try:
                    conn, _ = listener.accept()
                except OSError:
                    return
                _Connection(emu, conn).start()

        threading.Thread(target=accept, daemon=True, name="detach-accept").start()
        say(f"{READY} {state_path}")
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
        try:
            while True:
                time.sleep(3600)
        finally:
            listener.close()
            try:
                state_path.unlink()
            except FileNotFoundError:
                pass


# --------------------------------------------------------------------------- attaching


class _AttachedRank:
    def __init__(self, client: Attached, pid: int, stdout: IO[bytes], stderr: IO[bytes]) -> None:
        self.client, self.pid, self.stdout, self.stderr = client, pid, stdout, stderr

    def poll(self) -> int | None:
        code = self.client.codes.get(self.pid)
        if code is None and self.client.lost and ProcFS().start_time(self.pid) is None:
            return -signal.SIGKILL  # the daemon is gone and so is the rank: how it ended is unknown
        return code

    def signal(self, sig: int) -> None:
        if self.poll() is not None:
            return
        try:
            self.client._request({"op": "signal", "pid": self.pid, "sig": int(sig)})
        except LaunchError:  # the daemon is gone: the rank is on this machine or gone with it
            try:
                os.killpg(self.pid, sig)
            except (ProcessLookupError, PermissionError):
                pass


class Attached:
    """A detached topology as a `testbed.launch.run.Site`: ranks are started by its
    daemon (recorded in its run). Use as a context manager; closing the connection
    makes the daemon end the ranks still running."""

    def __init__(self, state: DetachedState) -> None:
        self.state = state
        self.topology_name = state.topology
        self.topology_file = state.topology_file
        self.prefix = state.prefix
        self.attached: str | None = state.name
        self.codes: dict[int, int] = {}
        self.lost = False
        self._replies: list[dict[str, Any]] = []
        self._cond = threading.Condition()
        self._send_lock = threading.Lock()
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self.sock.connect(state.socket)
        except OSError as exc:
            self.sock.close()
            raise LaunchError(f"cannot reach the daemon of detached topology {state.name!r} at {state.socket}: "
                              f"{exc.strerror or exc}") from None
        self._reader = threading.Thread(target=self._read, daemon=True, name="attach-reader")
        self._reader.start()

    @classmethod
    def connect(cls, name: str) -> Attached:
        return cls(find_detached(validate_name(name)))

    def __enter__(self) -> Attached:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()

    def _read(self) -> None:
        try:
            while True:
                data = self.sock.recv(MAX_MSG)
                if not data:
                    break
                msg = json.loads(data)
                if msg.get("op") == "exit":
                    with self._cond:
                        self.codes[int(msg["pid"])] = int(msg["code"])
                else:
                    with self._cond:
                        self._replies.append(msg)
                        self._cond.notify_all()
        except (OSError, ValueError):
            pass
        with self._cond:
            self.lost = True
            self._cond.notify_all()

    def _request(self, msg: dict[str, Any], fds: list[int] | None = None) -> dict[str, Any]:
        with self._send_lock:
            data = json.dumps(msg).encode()
            try:
                if fds:
                    self.sock.sendmsg([data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))])
                else:
                    self.sock.send(data)
            except OSError as exc:
                raise LaunchError(f"the daemon of {self.state.name!r} does not answer: {exc}") from None
            deadline = time.monotonic() + REPLY_TIMEOUT_S
            with self._cond:
                while not self._replies:
                    if self.lost or time.monotonic() > deadline:
                        raise LaunchError(f"the daemon of detached topology {self.state.name!r} went away "
                                          "(`testbed topo list` shows what is up)")
                    self._cond.wait(0.1)
                reply = self._replies.pop(0)
        if reply.get("op") == "error":
            raise LaunchError(f"detached topology {self.state.name!r}: {reply.get('message')}")
        return reply

    # -- Site

    def slots(self) -> list[HostSlot]:
        return [HostSlot(h.name, h.dc, h.ip, h.intf) for h in self.state.hosts]

    def spawn(self, slot: HostSlot, argv: list[str], env: dict[str, str], cwd: str) -> _AttachedRank:
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        try:
            reply = self._request({"op": "spawn", "host": slot.name, "argv": argv, "env": env, "cwd": cwd},
                                  [out_w, err_w])
        except BaseException:
            os.close(out_r)
            os.close(err_r)
            raise
        finally:
            os.close(out_w)
            os.close(err_w)
        return _AttachedRank(self, int(reply["pid"]), os.fdopen(out_r, "rb"), os.fdopen(err_r, "rb"))

    def wan_counters(self) -> list[tuple[str, str, str, int, int]]:
        return [tuple(x) for x in self._request({"op": "counters"})["links"]]  # type: ignore[misc]


def main(argv: list[str] | None = None) -> None:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m testbed.launch.detach")
    sub = parser.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("serve", help="build a topology and keep it up for `testbed launch --attach`")
    s.add_argument("--name", required=True)
    s.add_argument("--file", required=True)
    s.add_argument("--backend", default=None)
    s.add_argument("--servers", default=None)
    args = parser.parse_args(argv)
    try:
        serve(args.name, args.file, args.backend, args.servers)
    except SystemExit:
        raise
    except Exception as exc:
        print(f"error: {exc}", flush=True)
        sys.exit(1)


if __name__ == "__main__":
    main()
