"""A process of a run ends itself once the run is gone: no orphan keeps a port or a core.

The run's controller (the ``testbed`` process that owns the emulation) names itself in
the environment of every process it starts, ``TESTBED_OWNER=<boot id>:<pid namespace>:
<pid>:<start time>`` (``owner_mark``). A long-lived program (the training worker, the
probe agent, the BubbleTea agent, decode server and prefill controller) calls
``watch_owner()`` first thing: a daemon thread checks every ``poll_s`` whether that
very process (same PID *and* start time, so a reused PID is not mistaken for it) still
runs, and ends this process with exit status ``EXIT_OWNER_GONE`` when it does not.

Why not only ``PR_SET_PDEATHSIG``: a program started with ``mnexec -da`` (a node's
process, daemonized into the node's namespaces) is reparented at once, so its parent is
not the run; and the signal follows the parent *thread*, not the process. The warm
children of the fork server arm it (``die_with_parent``), the server being the parent
that is right to watch there.

Like ``readiness``, it lives in the runtime layer so that every process of the testbed,
the BubbleTea agent included, can use it without importing ``testbed``.
The mark is only watched on the machine and in the PID namespace it names: a process
started over SSH on another machine cannot see the controller's PID.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import sys
import threading
import time
from pathlib import Path

OWNER_ENV = "TESTBED_OWNER"
"""Environment variable naming the run's controller (``owner_mark``)."""
EXIT_OWNER_GONE = 75
"""Exit status of a process that ended itself because its run's controller is gone."""
PR_SET_PDEATHSIG = 1


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return "?"


def _pidns() -> int:
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return 0


def start_time(pid: int) -> int | None:
    """Start time of `pid` in clock ticks since boot; None when it is gone or a zombie."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rfind(")") + 2:].split()
    if not fields or fields[0] in ("Z", "X"):
        return None
    try:
        return int(fields[19])
    except (IndexError, ValueError):
        return None


def owner_mark(pid: int | None = None) -> str:
    """The value of ``TESTBED_OWNER`` naming process `pid` (default: this one)."""
    pid = os.getpid() if pid is None else pid
    return f"{_boot_id()}:{_pidns()}:{pid}:{start_time(pid) or 0}"


def parse_mark(mark: str) -> tuple[int, int] | None:
    """(pid, start) of an owner mark when it names a process this one can see (same
    machine, same PID namespace); None otherwise (nothing to watch)."""
    parts = mark.rsplit(":", 3)
    if len(parts) != 4:
        return None
    boot, ns, pid, start = parts
    try:
        if boot != _boot_id() or int(ns) != _pidns():
            return None
        return int(pid), int(start)
    except ValueError:
        return None


def owner_alive(mark: str) -> bool:
    """Whether the controller named by `mark` still runs (True when it cannot be seen)."""
    named = parse_mark(mark)
    if named is None:
        return True
    pid, start = named
    return start_time(pid) == start


def watch_owner(poll_s: float = 0.25, environ: dict[str, str] | None = None) -> threading.Thread | None:
    """End this process (``os._exit(EXIT_OWNER_GONE)``) as soon as the run's controller,
    named in ``TESTBED_OWNER``, is gone. Returns the watching daemon thread, or None when
    no controller is named or it is on another machine or PID namespace."""
    mark = (os.environ if environ is None else environ).get(OWNER_ENV, "")
    if parse_mark(mark) is None:
        return None
    if not owner_alive(mark):
        _gone(mark)

    def watch() -> None:
        while owner_alive(mark):
            time.sleep(poll_s)
        _gone(mark)

    thread = threading.Thread(target=watch, name="owner-watch", daemon=True)
    thread.start()
    return thread


def _gone(mark: str) -> None:
    try:
        print(f"{os.path.basename(sys.argv[0] or 'process')} (pid {os.getpid()}): the run's controller "
              f"(pid {mark.rsplit(':', 2)[1]}) is gone; exiting", file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass
    os._exit(EXIT_OWNER_GONE)


def die_with_parent(expected_parent: int, sig: int = signal.SIGKILL) -> None:
    """Ask the kernel to send `sig` to this process when its parent (the thread that
    forked it) exits; exit at once if the parent is already not `expected_parent` (it
    died before the request took effect and this process was reparented)."""
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
    if os.getppid() != expected_parent:
        os._exit(EXIT_OWNER_GONE)

