"""How many bytes a channel's TCP streams have received so far (Linux TCP_INFO).

The live status (live.py) bounds when an awaited tensor can be complete from what is
still missing: a WAN shaper of rate R cannot deliver the missing bytes faster than
missing / R. TCP_INFO's `tcpi_bytes_received` counts every payload byte a socket has
received in order, whether or not the transport's reader has taken it yet, so the count
never lags behind what has arrived (the safe direction for that bound).

The sockets of a channel are found the way `ss` finds them: the process's own file
descriptors (/proc/self/fd) matched against the established TCP connections of its
network namespace (/proc/net/tcp) to the channel's peer and port. No private state of
the transport is touched; where the sockets cannot be found (another OS, IPv6) the
caller falls back to a learned bound.
"""

from __future__ import annotations

import contextlib
import os
import socket
import struct
from collections.abc import Iterable
from pathlib import Path

TCPI_BYTES_RECEIVED = 128  # offset of tcpi_bytes_received (u64) in struct tcp_info (Linux >= 4.1)
_INFO_LEN = TCPI_BYTES_RECEIVED + 8
_ESTABLISHED = "01"


class TcpProgressError(RuntimeError):
    """The channel's sockets could not be found or read."""


def _proc_addr(ip: str, port: int) -> str:
    """An IPv4 address as /proc/net/tcp writes it (hex, host byte order on little-endian)."""
    return f"{socket.inet_aton(ip)[::-1].hex().upper()}:{port:04X}"


def channel_inodes(peer_ip: str, port: int, role: str, table: Iterable[str] | None = None) -> set[int]:
    """Inodes of the established connections of a channel: for the connecting end,
    those to peer_ip:port; for the listening end, those on local `port` from peer_ip."""
    if role not in ("connect", "listen"):
        raise TcpProgressError(f"channel role {role!r} is neither 'connect' nor 'listen'")
    lines = list(table) if table is not None else Path("/proc/net/tcp").read_text().splitlines()
    peer_hex = socket.inet_aton(peer_ip)[::-1].hex().upper()
    want_remote = _proc_addr(peer_ip, port)
    port_hex = f"{port:04X}"
    out = set()
    for line in lines[1:]:
        f = line.split()
        if len(f) < 10 or f[3] != _ESTABLISHED:
            continue
        local, remote = f[1].upper(), f[2].upper()
        if role == "connect":
            ok = remote == want_remote
        else:
            ok = local.endswith(":" + port_hex) and remote.split(":")[0] == peer_hex
        if ok:
            out.add(int(f[9]))
    return out


def own_fds(inodes: set[int]) -> list[int]:
    """This process's file descriptors of those socket inodes."""
    fds = []
    for name in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError, ValueError):
            link = os.readlink(f"/proc/self/fd/{name}")
            if link.startswith("socket:[") and int(link[8:-1]) in inodes:
                fds.append(int(name))
    return sorted(fds)


def bytes_received(sock: socket.socket) -> int:
    raw = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, _INFO_LEN)
    if len(raw) < _INFO_LEN:
        raise TcpProgressError(f"TCP_INFO has {len(raw)} bytes, no tcpi_bytes_received (kernel older than 4.1?)")
    return struct.unpack_from("<Q", raw, TCPI_BYTES_RECEIVED)[0]


class TcpReceived:
    """Bytes received so far over a set of TCP sockets (duplicates of the channel's)."""

    def __init__(self, fds: Iterable[int]) -> None:
        self._socks = [socket.socket(fileno=os.dup(fd)) for fd in fds]
        if not self._socks:
            raise TcpProgressError("no socket to read")
        self.total()  # fail now, not in the middle of a wait

    @property
    def streams(self) -> int:
        return len(self._socks)

    def total(self) -> int:
        return sum(bytes_received(s) for s in self._socks)

    def close(self) -> None:
        for s in self._socks:
            with contextlib.suppress(OSError):
                s.close()
        self._socks = []

    @classmethod
    def for_channel(cls, peer_ip: str, port: int, role: str, streams: int) -> TcpReceived:
        """The counter of a channel's `streams` sockets; TcpProgressError if they are not
        all found (the caller falls back)."""
        fds = own_fds(channel_inodes(peer_ip, port, role))
        if len(fds) != streams:
            raise TcpProgressError(f"found {len(fds)} of the channel's {streams} TCP streams to {peer_ip} "
                                   f"(port {port}, {role})")
        return cls(fds)
