"""Warm starts: a Python program started in a node by forking a process that has
already imported its heavy modules, instead of a fresh interpreter each time.

Why: every training worker imports torch, about 3 s of CPU on this 2-core machine; the
four workers of a variant starting together spent 6-15 s before their first iteration,
every variant of every run, and that CPU was taken from the delay lines of the run.
The standard library's fork server (``multiprocessing`` context ``forkserver``) imports
the named modules once per controller process and forks a child per start.

A warm start is asked for like ``subprocess.Popen`` of ``python -m MODULE ...``
(pipes, files, ``pass_fds``, environment, folder). What a warm child does before the
program's code runs, in this order: it puts the descriptors handed to it in place,
leaves the controller's session (``setsid``, as ``mnexec -d`` does), enters the node's
network and mount namespaces (``setns``, as ``mnexec -a`` does), moves to the folder
given and takes the environment given, whole. Then it calls the program's ``main(argv)``; its return value is the exit
status. A start returns once the child is inside the node's network namespace, so the
run's record can identify it by that namespace from the first moment (records.py
``belongs``: the child's command line is the fork server's, not the program's).

The fork server is one per run (`claim`, `release`): started by the run's first warm
start, importing the modules that run names, its socket in a temporary folder of the
run (recorded, removed with it), ended at the run's teardown. The standard library keeps
one fork server per process, so a second run of the same process at the same time
starts its programs cold. A controller that dies however it dies ends its fork server
too (the server sees its end of a pipe close, and leaves at once: it does not unload
torch, ``_arm_server``); its children have asked the kernel for SIGKILL when the server
dies (``die_with_parent``), so nothing forked from it outlives the run. The server and
the standard library's resource tracker are started by `start_server` with the run's
mark in their environment (``claim``'s `mark`, e.g. ``TESTBED_RUN=<prefix>``), which
every child forked from the server inherits (``/proc/<pid>/environ`` is the one the
server started with), so `testbed clean` finds them all by that mark even when the run
was killed before it could record their PIDs. `testbed clean` removes the folder.
Only local nodes start warm; a node on another server starts through its SSH as before.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import ctypes.util
import fcntl
import importlib
import multiprocessing
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import IO, Any

from testbed.emulation.errors import EmulationError
from testbed_runtime.lifetime import die_with_parent

CLONE_NEWNS = 0x00020000
CLONE_NEWNET = 0x40000000
ENTER_TIMEOUT_S = 30.0  # for a fork and two setns calls; only a machine frozen for that long misses it

_lock = threading.Lock()
_owner: str | None = None  # the folder of the run whose fork server this process runs (claim)
_preloaded: tuple[str, ...] | None = None
_mark: dict[str, str] = {}  # put in the environment the fork server starts with (claim)
_tracker: int | None = None  # the resource tracker's PID where the run's start_server started it
_unreaped: list[int] = []  # trackers let go that had not exited yet (`_stop_tracker`)
TRACKER_EXIT_S = 1.0  # how long `release` waits for a tracker it let go to exit
SERVER_ENV = "TESTBED_WARM_PARENT"  # the controller's PID, in the fork server's environment only


class _Fd:
    """A descriptor handed to the warm child: the fork server's way (it is duplicated
    into the child while the start is sent, multiprocessing.reduction.DupFd)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        from multiprocessing import reduction

        return (_taken, (reduction.DupFd(self.fd),))


def _taken(dup: Any) -> int:
    return int(dup.detach())


@dataclass(frozen=True)
class WarmSpec:
    """What a warm child runs, and where: picklable, sent through the fork server."""

    node_pid: int  # a process in the node's namespaces (the Mininet host's shell)
    server_pid: int  # the fork server: the child dies with it (die_with_parent)
    nice: int  # added to the fork server's niceness, as `nice -n` would
    module: str  # the program: a module (or a package's __main__) with ``entry(argv)`` or ``main(argv) -> int``
    argv: tuple[str, ...]
    env: tuple[tuple[str, str], ...]
    cwd: str
    fds: tuple[tuple[int, Any], ...]  # (descriptor number in the child, _Fd): 0-2 and pass_fds


def _setns(path: str, flag: int) -> None:
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        if libc.setns(fd, flag) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns {path}: {os.strerror(err)}")
    finally:
        os.close(fd)


def _child(spec: WarmSpec) -> None:
    """The warm child's whole life (runs in the forked process)."""
    die_with_parent(spec.server_pid)  # the server dies with the run (_arm_server): so does this child
    sys.stdout.flush()
    sys.stderr.flush()
    got = dict(spec.fds)  # each already a descriptor of ours (unpickled), at any number
    staged = {target: fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 256) for target, fd in got.items()}
    for fd in set(got.values()):  # out of the way first: a target number may be another's source
        os.close(fd)
    for target, fd in staged.items():
        os.dup2(fd, target)  # inheritable, as Popen leaves stdio and pass_fds
        os.close(fd)
    if 0 in got:
        sys.stdin = open(0, closefd=False)  # noqa: SIM115 (the program's stdin, for its whole life)
    os.setsid()
    if spec.nice:
        os.nice(spec.nice)
    for kind, flag in (("net", CLONE_NEWNET), ("mnt", CLONE_NEWNS)):  # not when already there (no root needed)
        if os.stat(f"/proc/{spec.node_pid}/ns/{kind}").st_ino != os.stat(f"/proc/self/ns/{kind}").st_ino:
            _setns(f"/proc/{spec.node_pid}/ns/{kind}", flag)
    os.chdir(spec.cwd)
    os.environ.clear()
    os.environ.update(dict(spec.env))
    signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a fresh interpreter
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGCHLD):
        signal.signal(sig, signal.SIG_DFL)
    sys.argv = [spec.module, *spec.argv]
    program = importlib.import_module(spec.module)
    if hasattr(program, "__path__"):  # a package runs as its __main__, as with `python -m`
        program = importlib.import_module(f"{spec.module}.__main__")
    run = getattr(program, "entry", None) or program.main  # a click group's argv form is its `entry`
    sys.exit(run(list(spec.argv)))


class WarmProcess:
    """The subset of ``subprocess.Popen`` the runner uses, for a warm child."""

    def __init__(self, proc: multiprocessing.process.BaseProcess, args: list[str]) -> None:
        self._proc = proc
        self.pid: int = proc.pid  # type: ignore[assignment]
        self.args = args
        self.returncode: int | None = None
        self.stdin: IO[Any] | None = None  # the parent's ends of the pipes asked for
        self.stdout: IO[Any] | None = None
        self.stderr: IO[Any] | None = None

    def poll(self) -> int | None:
        if self.returncode is None and not self._proc.is_alive():
            self.returncode = self._proc.exitcode
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        self._proc.join(timeout)
        if self.poll() is None:
            raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def preloaded() -> tuple[str, ...] | None:
    """The modules the running fork server imported (None when none runs)."""
    return _preloaded


def claim(folder: str | os.PathLike[str], preload: Sequence[str], mark: Mapping[str, str] | None = None) -> bool:
    """Whether warm starts may go through a fork server of the run that owns `folder`
    (a private temporary folder of that run, recorded, where the server's socket goes):
    true for the first run to ask while no run owns the server, and for that run after;
    false for another run of this process at the same time, which then starts its
    programs cold. The server itself starts with the first warm start (or `start_server`),
    importing `preload`, with `mark` (the run's environment variables) in its
    environment; `release` ends it."""
    global _owner, _preloaded
    folder = os.fspath(folder)
    with _lock:
        if _owner is None:
            _owner, _preloaded = folder, tuple(preload)
            _mark.clear()
            _mark.update(mark or {})
            multiprocessing.process.current_process()._config["tempdir"] = folder  # type: ignore[attr-defined]
            # this module last: its import in the server arms the quick exit (_arm_server)
            multiprocessing.get_context("forkserver").set_forkserver_preload([*_preloaded, __name__])
        return _owner == folder


def start_server(folder: str | os.PathLike[str]) -> list[tuple[str, int]]:
    """Start the fork server of the run that claimed `folder` now, if it does not run
    yet, with the run's mark in its environment (and the resource tracker, if that
    starts with it); returns [(kind, pid)] of the processes started here, for the run's
    record ([] when none started)."""
    global _tracker
    from multiprocessing import forkserver, resource_tracker

    with _lock:
        if _owner != os.fspath(folder):
            raise EmulationError(f"fork server of {os.fspath(folder)}: not claimed (the server belongs to {_owner})")
        server = forkserver._forkserver  # type: ignore[attr-defined]
        tracker = resource_tracker._resource_tracker  # type: ignore[attr-defined]
        if server._forkserver_pid is not None:
            return []
        _reap()
        tracker_before = tracker._pid
        saved = {key: os.environ.get(key) for key in (*_mark, SERVER_ENV)}
        os.environ.update(_mark)  # both spawn with this process's environment at this moment
        os.environ[SERVER_ENV] = str(os.getpid())
        try:
            server.ensure_running()  # starts the resource tracker first when it is not running
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value
        started = [("forkserver", int(server._forkserver_pid))]
        if tracker._pid is not None and tracker._pid != tracker_before:
            _tracker = int(tracker._pid)
            started.append(("resource-tracker", _tracker))
        return started


def release(folder: str | os.PathLike[str]) -> None:
    """End the fork server of the run that owns `folder`, if it runs (before that run
    removes the folder); its programs are ended by then: a program the server forked
    reads as exited (255) once the server is gone."""
    global _owner, _preloaded, _tracker
    from multiprocessing import forkserver, resource_tracker

    with _lock:
        if _owner != os.fspath(folder):
            return
        server = forkserver._forkserver  # type: ignore[attr-defined]
        if server._forkserver_pid is not None:  # killed: its own exit unloads torch, seconds on a busy machine
            with contextlib.suppress(ProcessLookupError):
                os.kill(server._forkserver_pid, signal.SIGKILL)
        server._stop()  # reaps it, closes our end of its pipe, removes its socket
        tracker = resource_tracker._resource_tracker  # type: ignore[attr-defined]
        if _tracker is not None and tracker._pid == _tracker:
            # the run's resource tracker (marked as the run's) is let go here rather than left
            # for the teardown to kill under this process's feet, which made the process's next
            # run warn "resource_tracker: process died unexpectedly ... Some resources might
            # leak" (a sweep, the demo)
            _stop_tracker(tracker)
        _tracker = None
        multiprocessing.process.current_process()._config.pop("tempdir", None)  # type: ignore[attr-defined]
        _owner, _preloaded = None, None
        _mark.clear()


def _stop_tracker(tracker: Any) -> None:  # multiprocessing's private ResourceTracker
    """Let the standard library's resource tracker go as its own `_stop` does, without
    waiting on it: our end of its pipe closed, it frees what is still registered and exits
    once no program of the run holds the pipe either (the teardown kills any that still
    does, the tracker with them: it is in the run's record); reaped when it has exited
    within TRACKER_EXIT_S, else by the next `start_server` or `release`. This process's
    next use of multiprocessing starts a tracker of its own."""
    pid, fd = tracker._pid, tracker._fd
    tracker._fd = tracker._pid = None
    if fd is not None:
        with contextlib.suppress(OSError):
            os.close(fd)
    if pid is not None:
        _unreaped.append(pid)
    deadline = time.monotonic() + TRACKER_EXIT_S
    while _unreaped and time.monotonic() < deadline:
        _reap()
        if _unreaped:
            time.sleep(0.01)


def _reap() -> None:
    """Reap the trackers `_stop_tracker` let go that have exited (never blocks)."""
    for pid in list(_unreaped):
        try:
            done, _ = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            done = pid  # not ours to reap any more
        if done:
            _unreaped.remove(pid)


def _arm_server() -> None:
    """In the fork server (this module is its last preload): when the controller is gone
    the server's main loop sees its pipe close and raises SystemExit; leave then without
    the interpreter's teardown (unloading torch took seconds of CPU on a busy machine).
    Only the server leaves this way: its forked children run this module too.

    The pipe is not the only guard: a watch thread leaves as soon as the server's parent
    (the controller that started it) is gone and the server was reparented, whatever its
    main loop is doing (a server that outlived a SIGKILLed controller by 20 s was seen on
    a busy machine). Forked children do not inherit the thread."""
    server = os.getpid()
    parent = os.getppid()

    def quick_exit() -> None:
        if os.getpid() == server:
            os._exit(0)

    def watch_parent() -> None:
        while os.getppid() == parent:
            time.sleep(0.25)
        os._exit(0)

    atexit.register(quick_exit)
    threading.Thread(target=watch_parent, name="fork-server-parent-watch", daemon=True).start()


def module_of(argv: Sequence[str]) -> tuple[int, str, list[str]]:
    """(niceness, module, its arguments) of a ``[nice -n N] python -m module ...``
    command line; anything else cannot start warm (ValueError)."""
    argv = [str(a) for a in argv]
    nice = 0
    if argv[:2] == ["nice", "-n"] and len(argv) > 2 and argv[2].lstrip("-").isdigit():
        nice, argv = int(argv[2]), argv[3:]
    if len(argv) < 3 or argv[0] != sys.executable or argv[1] != "-m":
        raise ValueError(f"a warm start runs `[nice -n N] {sys.executable} -m MODULE ...`, not {argv[:3]}")
    return nice, argv[2], argv[3:]


def warm_start(node_pid: int, argv: Sequence[str], *, server: str | os.PathLike[str], env: Mapping[str, str] | None = None,
               cwd: str | None = None, stdin: Any = None, stdout: Any = None, stderr: Any = None, text: bool = False,
               pass_fds: Sequence[int] = (), net_inode: int | None = None) -> WarmProcess:
    """Start ``python -m module ...`` (`argv`) in the namespaces of `node_pid`, forked from
    the fork server of the run that claimed `server` (its folder; `claim`): like subprocess.Popen for `stdin`, `stdout`
    and `stderr` (None: the controller's own, PIPE, STDOUT, a file object or descriptor),
    `text`, `pass_fds`, `env` (the whole environment) and `cwd`. Returns once the child
    is in the node's network namespace (`net_inode`, read from `node_pid` if not given)."""
    nice, module, args = module_of(argv)
    if _owner != os.fspath(server):
        raise EmulationError(f"warm start of {module}: the fork server of this process belongs to another run "
                             f"({_owner}); claim({os.fspath(server)!r}) first, or start it cold")
    if net_inode is None:
        try:
            net_inode = os.stat(f"/proc/{node_pid}/ns/net").st_ino
        except FileNotFoundError:
            raise EmulationError(f"warm start of {module}: the node of PID {node_pid} is not running") from None
    mine: list[int] = []  # descriptors made here for the child, closed once it has them
    parents: dict[str, IO[Any]] = {}
    fds: list[tuple[int, _Fd]] = []

    def fd_of(target: int, what: Any, name: str) -> None:
        if what is None:
            return
        if what == subprocess.PIPE:
            r, w = os.pipe()
            child, parent = (r, w) if target == 0 else (w, r)
            mine.append(child)
            parents[name] = open(parent, "w" if target == 0 else "r", encoding="utf-8" if text else None,  # noqa: SIM115
                                 **({} if text else {"buffering": 0}))
            fds.append((target, _Fd(child)))
        elif what == subprocess.STDOUT:
            fds.append((target, _Fd(dict(fds)[1].fd if 1 in dict(fds) else 1)))
        elif what == subprocess.DEVNULL:
            null = os.open(os.devnull, os.O_RDWR)
            mine.append(null)
            fds.append((target, _Fd(null)))
        else:
            fds.append((target, _Fd(what if isinstance(what, int) else what.fileno())))

    try:
        fd_of(0, stdin, "stdin")
        fd_of(1, stdout, "stdout")
        fd_of(2, stderr, "stderr")
        fds += [(fd, _Fd(fd)) for fd in pass_fds]
        start_server(server)  # marked; a no-op once it runs
        from multiprocessing import forkserver

        server_pid = forkserver._forkserver._forkserver_pid  # type: ignore[attr-defined]
        spec = WarmSpec(node_pid, int(server_pid or 0), nice, module, tuple(args), tuple(sorted((env if env is not None else os.environ).items())),
                        cwd or os.getcwd(), tuple(fds))
        proc = multiprocessing.get_context("forkserver").Process(target=_child, args=(spec,), name=f"warm:{module}", daemon=True)
        proc.start()
    except BaseException:
        for f in parents.values():
            f.close()
        raise
    finally:
        for fd in mine:
            os.close(fd)
    handle = WarmProcess(proc, [str(a) for a in argv])
    handle.stdin, handle.stdout, handle.stderr = parents.get("stdin"), parents.get("stdout"), parents.get("stderr")
    deadline = time.monotonic() + ENTER_TIMEOUT_S
    while True:
        try:
            if os.stat(f"/proc/{handle.pid}/ns/net").st_ino == net_inode:
                return handle
        except (FileNotFoundError, ProcessLookupError):
            pass
        if handle.poll() is not None or time.monotonic() > deadline:
            handle.kill()
            raise EmulationError(
                f"warm start of {module} in the node of PID {node_pid} did not enter its network namespace "
                f"(exit status {handle.poll()}; is the node still running?)")
        time.sleep(0.002)


if (os.environ.get(SERVER_ENV) == str(os.getppid()) and "multiprocessing.forkserver" in sys.modules
        and multiprocessing.parent_process() is None and os.getpid() != int(os.environ[SERVER_ENV])):
    _arm_server()  # imported as the fork server's preload (claim)
