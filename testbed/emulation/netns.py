"""Network-namespace access without leaving traces.

Mininet hosts live in *unnamed* network namespaces (one per host process). We reach them
through ``/proc/<pid>/ns/net`` with ``setns(2)`` on a helper thread, so nothing is ever
mounted under /run/netns and nothing shows in ``ip netns list``. Python 3.11 has no
``os.setns``/``os.unshare``; we call libc through ctypes.

Namespace targets (``NsTarget``) are: ``None`` (the caller's own namespace), an ``int`` PID
(a Mininet host's ``node.pid``) or a ``str`` path to a namespace file (``/proc/PID/ns/net``,
``/run/netns/NAME``, ``/proc/self/fd/N``).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import itertools
import os
import signal
import socket
import subprocess
import threading
from collections.abc import Callable, Iterator
from typing import TypeVar

from pyroute2 import IPRoute

CLONE_NEWNET = 0x40000000
NETLINK_ROUTE = 0

NsTarget = int | str | None
T = TypeVar("T")

_libc: ctypes.CDLL | None = None
_counter = itertools.count()


class NetnsError(OSError):
    """A namespace could not be entered, created or removed."""


def _c() -> ctypes.CDLL:
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    return _libc


def netns_path(target: NsTarget) -> str | None:
    """The namespace file for a target (None stays None: the caller's namespace)."""
    if target is None:
        return None
    if isinstance(target, bool):
        raise TypeError(f"namespace target must be a PID, a path or None, not {target!r}")
    if isinstance(target, int):
        return f"/proc/{target}/ns/net"
    return target


def _setns_fd(fd: int, where: str) -> None:
    if _c().setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        hint = " (needs root / CAP_SYS_ADMIN)" if err == errno.EPERM else ""
        raise NetnsError(err, f"cannot enter network namespace {where}: {os.strerror(err)}{hint}")


def _open_ns(path: str) -> int:
    try:
        return os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        raise NetnsError(
            errno.ENOENT,
            f"network namespace {path} does not exist (has the host process exited?)",
        ) from None
    except PermissionError:
        raise NetnsError(errno.EPERM, f"cannot open {path}: permission denied (run as root)") from None


@contextlib.contextmanager
def in_netns(target: NsTarget) -> Iterator[None]:
    """Move the *current thread* into a namespace for the block, then back.

    Sockets created inside stay in that namespace for their whole life. Prefer
    `run_in_netns` from code that shares its thread with other work.
    """
    path = netns_path(target)
    if path is None:
        yield
        return
    own = _open_ns("/proc/thread-self/ns/net")
    try:
        fd = _open_ns(path)
        try:
            _setns_fd(fd, path)
        finally:
            os.close(fd)
        try:
            yield
        finally:
            _setns_fd(own, "of this thread (restoring)")
    finally:
        os.close(own)


def _in_thread(fn: Callable[[], T]) -> T:
    box: dict[str, object] = {}

    def body() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # re-raised in the caller's thread
            box["error"] = exc

    t = threading.Thread(target=body, name="netns-helper", daemon=True)
    t.start()
    t.join()
    if "error" in box:
        raise box["error"]  # type: ignore[misc]
    return box["value"]  # type: ignore[return-value]


def run_in_netns(target: NsTarget, fn: Callable[[], T]) -> T:
    """Call ``fn()`` on a helper thread that sits in the target namespace; return its result.

    The helper thread exits afterwards, so the caller's threads never change namespace.
    """
    path = netns_path(target)
    if path is None:
        return fn()

    def body() -> T:
        fd = _open_ns(path)
        try:
            _setns_fd(fd, path)
        finally:
            os.close(fd)
        return fn()

    return _in_thread(body)


def _netlink_socket() -> socket.socket:
    return socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC, NETLINK_ROUTE)


def _iproute_on(sock: socket.socket) -> IPRoute:
    # groups=0: we only send requests; no multicast event flood into our buffers.
    return IPRoute(fileno=sock.detach(), groups=0)


def open_iproute(target: NsTarget = None) -> IPRoute:
    """An IPRoute whose netlink socket lives in the target namespace (e.g. ``node.pid``).

    The caller closes it (``with open_iproute(pid) as ipr: ...``).
    """
    return _iproute_on(run_in_netns(target, _netlink_socket))


class PrivateNetns:
    """A fresh, unnamed namespace held open by a file descriptor (see `private_netns`)."""

    def __init__(self, fd: int):
        self.fd = fd
        self.path = f"/proc/{os.getpid()}/fd/{fd}"

    def iproute(self) -> IPRoute:
        return open_iproute(self.path)

    def run(self, fn: Callable[[], T]) -> T:
        return run_in_netns(self.path, fn)


@contextlib.contextmanager
def private_netns() -> Iterator[PrivateNetns]:
    """A brand-new anonymous network namespace, gone as soon as the block ends.

    Nothing is mounted or named: the namespace lives only as long as our fd (and any
    socket created in it), so even a crash or SIGKILL leaves nothing behind. Used for
    kernel feature probes and unit-level root tests.
    """

    def create() -> int:
        if _c().unshare(CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            hint = " (needs root / CAP_SYS_ADMIN)" if err == errno.EPERM else ""
            raise NetnsError(err, f"cannot create a network namespace: {os.strerror(err)}{hint}")
        return _open_ns("/proc/thread-self/ns/net")

    fd = _in_thread(create)
    try:
        yield PrivateNetns(fd)
    finally:
        os.close(fd)


def _ip(*args: str) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    except FileNotFoundError:
        raise NetnsError(errno.ENOENT, "the 'ip' command (iproute2) is missing: apt-get install iproute2") from None


def unique_netns_name(prefix: str) -> str:
    """``<prefix><pid>-<n>``: unique per process and call, recognisable by its prefix."""
    if not prefix or "/" in prefix or len(prefix) > 32:
        raise ValueError(f"netns prefix {prefix!r} must be 1-32 characters without '/'")
    return f"{prefix}{os.getpid()}-{next(_counter)}"


def netns_pids(name: str) -> list[int]:
    out = _ip("netns", "pids", name)
    return [int(p) for p in out.stdout.split()] if out.returncode == 0 else []


def delete_named_netns(name: str) -> None:
    """Kill what still runs in a named namespace of ours, then delete it."""
    for pid in netns_pids(name):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    out = _ip("netns", "delete", name)
    if out.returncode != 0 and os.path.exists(f"/run/netns/{name}"):
        raise NetnsError(errno.EBUSY, f"could not delete netns {name}: {out.stderr.strip()}")


def stale_netns_names(prefix: str, names: list[str]) -> list[str]:
    """Those of `names` that `unique_netns_name(prefix)` gave a process no longer alive
    (``<prefix><pid>-<n>``): what a block of `temporary_netns` left when its process
    died before its end ran (SIGTERM, SIGKILL)."""
    stale = []
    for name in names:
        pid, sep, n = name.removeprefix(prefix).partition("-")
        if not name.startswith(prefix) or not sep or not pid.isdigit() or not n.isdigit():
            continue
        if not os.path.exists(f"/proc/{pid}"):
            stale.append(name)
    return stale


def named_netns() -> list[str]:
    """The names ``ip netns list`` shows."""
    out = _ip("netns", "list")
    return [line.split()[0] for line in out.stdout.splitlines() if line.strip()] if out.returncode == 0 else []


@contextlib.contextmanager
def temporary_netns(prefix: str) -> Iterator[str]:
    """A named namespace (``ip netns add``) for tests that run programs in it with
    ``ip netns exec``; always deleted, with its processes killed, when the block ends.
    Those of the same prefix that a dead process left are deleted first."""
    for stale in stale_netns_names(prefix, named_netns()):
        delete_named_netns(stale)
    name = unique_netns_name(prefix)
    out = _ip("netns", "add", name)
    if out.returncode != 0:
        raise NetnsError(errno.EPERM, f"cannot create netns {name}: {out.stderr.strip()} (run as root)")
    try:
        yield name
    finally:
        delete_named_netns(name)
