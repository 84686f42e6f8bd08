"""Warm starts: a Python program started in a node by forking a process that has
already imported its heavy modules, instead of a fresh interpreter each time.

Why: every training worker imports torch, about 3 s of CPU on this 2-core machine; the
four workers of a variant starting together spent 6-15 s before their first iteration,
every variant of every run, and that CPU was taken from the delay lines of the run.
The standard library's fork server (``multiprocessing`` context ``forkserver``) imports
the named modules once per controller process and forks a child per start.

What a warm child does before the program's code runs, in this order: it writes its
output to the log file given (both streams), leaves the controller's session
(``setsid``, as ``mnexec -d`` does), enters the node's network and mount namespaces
(``setns``, as ``mnexec -a`` does), moves to the folder given and takes the environment
given, whole. Then it calls the program's ``main(argv)``; its return value is the exit
status. A start returns once the child is inside the node's network namespace, so the
run's record can identify it by that namespace from the first moment (records.py
``belongs``: the child's command line is the fork server's, not the program's).

The fork server is one per controller process (the standard library keeps one), started
by the first warm start and ended with the controller: it sees its end of a pipe close
when the controller exits, however it exits, so it leaves nothing behind. The modules
it imports are those the first start names (a later start's program imports anything
else it needs itself).
Only local nodes start warm; a node on another server starts through its SSH as before.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import importlib
import multiprocessing
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from testbed.emulation.errors import EmulationError

CLONE_NEWNS = 0x00020000
CLONE_NEWNET = 0x40000000
ENTER_TIMEOUT_S = 30.0  # for a fork and two setns calls; only a machine frozen for that long misses it

_preloaded: tuple[str, ...] | None = None


@dataclass(frozen=True)
class WarmSpec:
    """What a warm child runs, and where: picklable, sent through the fork server."""

    node_pid: int  # a process in the node's namespaces (the Mininet host's shell)
    module: str  # the program: a module with a ``main(argv) -> int`` function
    argv: tuple[str, ...]
    env: tuple[tuple[str, str], ...]
    cwd: str
    log: str  # both output streams go there (opened for appending)


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
    out = os.open(spec.log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(out, 1)
    os.dup2(out, 2)
    os.close(out)
    os.setsid()
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
    main = importlib.import_module(spec.module).main
    sys.exit(main(list(spec.argv)))


class WarmProcess:
    """The subset of ``subprocess.Popen`` the runner uses, for a warm child."""

    def __init__(self, proc: multiprocessing.process.BaseProcess, args: list[str]) -> None:
        self._proc = proc
        self.pid: int = proc.pid  # type: ignore[assignment]
        self.args = args
        self.returncode: int | None = None
        self.stdin = self.stdout = self.stderr = None  # no pipes: the output goes to the log file

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
    """The modules this process's fork server imports (None before the first start)."""
    return _preloaded


def _context(preload: Sequence[str]) -> multiprocessing.context.BaseContext:
    """The fork server's context; the first start's `preload` is what it imports (a
    later start's program imports what that list lacks itself, in the child)."""
    global _preloaded
    ctx = multiprocessing.get_context("forkserver")
    if _preloaded is None:
        _preloaded = tuple(preload)
        ctx.set_forkserver_preload(list(_preloaded))
    return ctx


def warm_start(node_pid: int, module: str, argv: Sequence[str], *, env: Mapping[str, str], cwd: str, log: str,
               preload: Sequence[str], net_inode: int | None = None) -> WarmProcess:
    """Start ``module.main(argv)`` in the namespaces of `node_pid`, forked from the fork
    server that imported `preload`; returns once the child is in the node's network
    namespace (`net_inode`, read from `node_pid` when not given)."""
    if net_inode is None:
        try:
            net_inode = os.stat(f"/proc/{node_pid}/ns/net").st_ino
        except FileNotFoundError:
            raise EmulationError(f"warm start of {module}: the node of PID {node_pid} is not running") from None
    spec = WarmSpec(node_pid, module, tuple(argv), tuple(sorted(env.items())), cwd, log)
    proc = _context(preload).Process(target=_child, args=(spec,), name=f"warm:{module}", daemon=True)
    proc.start()
    handle = WarmProcess(proc, [sys.executable, "-m", module, *argv])
    deadline = time.monotonic() + ENTER_TIMEOUT_S
    while True:
        try:
            if os.stat(f"/proc/{handle.pid}/ns/net").st_ino == net_inode:
                return handle
        except (FileNotFoundError, ProcessLookupError):
            pass
        if handle.poll() is not None or time.monotonic() > deadline:
            handle.kill()
            try:
                tail = " | ".join(open(log, errors="replace").read().strip().splitlines()[-3:])
            except OSError:
                tail = ""
            raise EmulationError(
                f"warm start of {module} in the node of PID {node_pid} did not enter its network namespace "
                f"(exit status {handle.poll()}; is the node still running?); {log}: {tail or '(empty)'}")
        time.sleep(0.002)
