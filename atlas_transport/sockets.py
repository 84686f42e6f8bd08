"""Socket plumbing for one stream: tuning, exact reads into memoryviews, gathered
writes, and kernel-level timeouts.

Streams stay in blocking mode; SO_RCVTIMEO/SO_SNDTIMEO bound every call instead of
Python-level timeouts, so a chunk is read with one `recv_into(..., MSG_WAITALL)`
system call (the GIL is released for the whole chunk) and a stalled peer still
surfaces after `idle_timeout_s`.
"""

from __future__ import annotations

import contextlib
import fcntl
import socket
import struct
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from .config import TransportConfig
from .errors import ConfigError, ConnectError

SO_MAX_PACING_RATE = getattr(socket, "SO_MAX_PACING_RATE", 47)
TCP_CONGESTION = getattr(socket, "TCP_CONGESTION", 13)
TCP_USER_TIMEOUT = getattr(socket, "TCP_USER_TIMEOUT", 18)
TCP_WINDOW_CLAMP = getattr(socket, "TCP_WINDOW_CLAMP", 10)
_AVAILABLE_CC = Path("/proc/sys/net/ipv4/tcp_available_congestion_control")


class StreamDown(Exception):
    """A stream can no longer be used; the message says why (EOF, reset, idle)."""


def tune(sock: socket.socket, cfg: TransportConfig, *, before_connect: bool = True) -> None:
    """Apply the per-stream settings. Buffers must be set before connect/listen for the
    window scale to account for them."""
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if before_connect:
        if cfg.sndbuf:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, cfg.sndbuf)
        # a window clamp needs a fixed buffer (Linux's autotuning raises the clamp with the
        # buffer), one whose window is not below the clamp: twice it (the kernel doubles a
        # SO_RCVBUF and advertises 40-50% of a buffer as window)
        if cfg.rcvbuf or cfg.window_clamp:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, cfg.rcvbuf or 2 * cfg.window_clamp)
    if cfg.congestion:
        try:
            sock.setsockopt(socket.IPPROTO_TCP, TCP_CONGESTION, cfg.congestion.encode())
        except OSError as exc:
            avail = _AVAILABLE_CC.read_text().strip() if _AVAILABLE_CC.exists() else "unknown"
            raise ConfigError(
                f"congestion={cfg.congestion!r} cannot be set ({exc.strerror}): this kernel offers "
                f"{avail} (unprivileged processes only those in tcp_allowed_congestion_control)"
            ) from None
    if cfg.pacing_rate_mbps:
        sock.setsockopt(socket.SOL_SOCKET, SO_MAX_PACING_RATE, int(cfg.pacing_rate_mbps * 1e6 / 8))
    if cfg.window_clamp:  # on accepted sockets too (tune after accept): what this end receives
        sock.setsockopt(socket.IPPROTO_TCP, TCP_WINDOW_CLAMP, cfg.window_clamp)
    # Unacknowledged data older than the idle timeout kills the connection in the
    # kernel even when the peer's host vanished without a reset.
    sock.setsockopt(socket.IPPROTO_TCP, TCP_USER_TIMEOUT, int(cfg.idle_timeout_s * 1000))


def available_congestion() -> list[str]:
    """Congestion control algorithms this kernel offers (empty where unknown)."""
    try:
        return _AVAILABLE_CC.read_text().split()
    except OSError:
        return []


def set_congestion(sock: socket.socket, name: str) -> bool:
    """Switch a (connected) socket's congestion control; False where the kernel refuses
    (not available, or not allowed to an unprivileged process)."""
    try:
        sock.setsockopt(socket.IPPROTO_TCP, TCP_CONGESTION, name.encode())
    except OSError:
        return False
    return True


SIOCOUTQNSD = 0x894B  # linux/sockios.h: bytes in the send queue not yet sent
SIOCOUTQ = 0x5411  # TIOCOUTQ: bytes in the send queue, sent but unacknowledged included


def kernel_outq(sock: socket.socket) -> int | None:
    """Bytes this TCP socket's send queue holds (unsent and unacknowledged); None
    where the ioctl is missing."""
    try:
        raw = fcntl.ioctl(sock.fileno(), SIOCOUTQ, b"\0\0\0\0")
    except (OSError, ValueError):
        return None
    return int.from_bytes(raw, sys.byteorder, signed=True)


def kernel_unsent(sock: socket.socket) -> int:
    """Bytes the kernel holds for this TCP socket and has not transmitted yet (0 where
    the ioctl is missing or the socket is gone)."""
    try:
        raw = fcntl.ioctl(sock.fileno(), SIOCOUTQNSD, b"\0\0\0\0")
    except (OSError, ValueError):
        return 0
    return int.from_bytes(raw, sys.byteorder, signed=True)


def set_io_timeout(sock: socket.socket, seconds: float) -> None:
    sock.settimeout(None)
    _set_rcvtimeo(sock, seconds)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, _timeval(seconds))


def _timeval(seconds: float) -> bytes:
    sec = int(seconds)
    return struct.pack("ll", sec, int((seconds - sec) * 1e6))


def _set_rcvtimeo(sock: socket.socket, seconds: float) -> None:
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, _timeval(seconds))


_TCP_INFO_LAST_DATA_RECV = 52  # struct tcp_info: u32 ms since the last data segment arrived
_MIN_REWAIT_S = 0.01


def _tcp_info(sock: socket.socket, nbytes: int) -> bytes | None:
    """The first `nbytes` of the socket's struct tcp_info (fewer where the kernel's is
    shorter), None where unavailable."""
    try:
        return sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, nbytes)
    except (OSError, AttributeError):
        return None


def _tcp_info_u32(sock: socket.socket, offset: int) -> int | None:
    """The u32 at `offset` of the socket's struct tcp_info, None where unavailable."""
    raw = _tcp_info(sock, 104)
    if raw is None or len(raw) < offset + 4:
        return None
    return int(struct.unpack_from("I", raw, offset)[0])


def silent_s(sock: socket.socket) -> float | None:
    """Seconds since the kernel last received data on this TCP socket (TCP_INFO
    tcpi_last_data_recv), or None where that is unavailable."""
    ms = _tcp_info_u32(sock, _TCP_INFO_LAST_DATA_RECV)
    return None if ms is None else ms / 1000.0


# A large read asks the kernel to wake the reader only once this much has arrived
# (SO_RCVLOWAT) instead of at every segment batch: fewer wake-ups and context switches
# per chunk. The last RCVLOWAT_BYTES of the view are read with the mark back at 1 byte
# (a mark above what is still to come would never be reached: the read would stall
# until the next heartbeat). 0 turns it off. Only on paths of sub-millisecond RTT
# (loopback, a LAN): on a WAN the bytes held back until the mark is reached are taken
# out of the advertised window for the time they wait, and with a window of a few times
# the mark the stream slows (measured across the 2dc WAN, 8 streams, 1 MB buffers:
# 672 Mbit/s with the mark against 771 without, iperf3 -P 8 762).
RCVLOWAT_BYTES = 256 << 10
RCVLOWAT_MAX_RTT_S = 0.001
_LOWAT_MIN_READ = 4  # ... for views of at least this many times RCVLOWAT_BYTES
_TCP_INFO_RTT = 68  # struct tcp_info: u32 smoothed RTT, microseconds


def rtt_s(sock: socket.socket) -> float | None:
    """The kernel's smoothed RTT of this TCP socket (TCP_INFO tcpi_rtt), None where
    unavailable or not measured yet."""
    us = _tcp_info_u32(sock, _TCP_INFO_RTT)
    return us / 1e6 if us else None


# --- slow start cut short -----------------------------------------------------------
# Cubic's HyStart ends slow start without a loss as soon as the RTT of a round rises
# by max(4 ms, RTT / 8) (delay detection) or ACKs arrive as a train: a queue another
# channel built on the same link, or a few ms of scheduling delay on a loaded host,
# is enough. It sets ssthresh to the window reached so far, and the stream goes on in
# congestion avoidance, which cubic grows only while the stream sends: a stream of a
# bursty channel (one tensor, then idle) whose slow start was cut at a fifth of what
# its receive window allows stays slow for dozens of tensors. Measured on the 2dc WAN
# (two channels of 8 streams opened together, 8 MiB tensors taking turns): every
# stream of the second channel left slow start at 160-190 segments (nstat
# TcpExtTCPHystartDelayDetect, no retransmission), the peer's window was 456, and its
# tensors took 170-280 ms against 145 ms on the first channel for the next 30 tensors.
_TCP_INFO_CA_STATE = 1  # u8: TCP_CA_Open (0), Disorder, CWR, Recovery, Loss
_TCP_INFO_SND_MSS = 16
_TCP_INFO_SND_SSTHRESH = 76
_TCP_INFO_SND_CWND = 80
_TCP_INFO_TOTAL_RETRANS = 100
_TCP_INFO_SND_WND = 228  # u32 bytes the peer's window allows (Linux 6.2+)
_TCP_INFO_LEN = 232
TCP_INFINITE_SSTHRESH = 0x7FFFFFFF


@dataclass(frozen=True)
class WindowState:
    """The congestion state of one TCP stream, from TCP_INFO."""

    ca_state: int  # 0: open (no loss, no reduction in progress)
    mss: int
    ssthresh: int  # segments; TCP_INFINITE_SSTHRESH while still in the first slow start
    cwnd: int  # segments
    total_retrans: int  # segments retransmitted over the connection's life
    peer_window: int  # bytes the peer's receive window allows

    @classmethod
    def parse(cls, raw: bytes) -> WindowState | None:
        """From the bytes of a TCP_INFO getsockopt; None where the kernel's struct is too
        short to carry the peer's window (before Linux 6.2)."""
        if len(raw) < _TCP_INFO_LEN:
            return None
        u32 = lambda off: int(struct.unpack_from("I", raw, off)[0])  # noqa: E731
        return cls(raw[_TCP_INFO_CA_STATE], u32(_TCP_INFO_SND_MSS), u32(_TCP_INFO_SND_SSTHRESH),
                   u32(_TCP_INFO_SND_CWND), u32(_TCP_INFO_TOTAL_RETRANS), u32(_TCP_INFO_SND_WND))

    def slow_start_cut_short(self) -> bool:
        """True when slow start ended below the window the peer allows although the
        stream never lost a segment: the ssthresh came from a delay signal (HyStart),
        not from congestion that cost data, and holds the stream below its window.
        A stream that retransmitted keeps its ssthresh (a lossy path, a full queue)."""
        if self.ca_state != 0 or self.total_retrans or not self.mss or not self.peer_window:
            return False
        return self.ssthresh < self.peer_window // self.mss


def window_state(sock: socket.socket) -> WindowState | None:
    """The stream's `WindowState`, None where TCP_INFO is unavailable or too old."""
    raw = _tcp_info(sock, _TCP_INFO_LEN)
    return None if raw is None else WindowState.parse(raw)


def congestion_of(sock: socket.socket) -> str | None:
    """The socket's congestion control (TCP_CONGESTION), None where unreadable."""
    try:
        raw = sock.getsockopt(socket.IPPROTO_TCP, TCP_CONGESTION, 16)
    except OSError:
        return None
    return raw.split(b"\0", 1)[0].decode("ascii", "replace") or None


# Initialising BBR sets ssthresh to "infinite" (net/ipv4/tcp_bbr.c bbr_init); switching
# back re-initialises the stream's own algorithm with that ssthresh and its current
# cwnd: the stream is in slow start again, from where it stood, and grows until its
# window is full. User space has no socket option that sets ssthresh itself.
RESET_VIA = "bbr"


def restart_slow_start(sock: socket.socket) -> bool:
    """Put a stream whose slow start was cut short back into slow start, keeping its
    congestion control and window; False where that cannot be done here (the kernel
    lacks BBR or does not allow it to this process, or the stream runs BBR, which has
    no ssthresh to hold it)."""
    name = congestion_of(sock)
    if name is None or name == RESET_VIA:
        return False
    if not set_congestion(sock, RESET_VIA):
        return False
    if not set_congestion(sock, name):  # cannot happen for the algorithm it ran; say so
        raise OSError(f"could not switch the stream back to congestion control {name!r} after {RESET_VIA!r}")
    return True


def recv_exact(sock: socket.socket, view: memoryview, idle_s: float) -> None:
    """Fill `view` completely from the socket (MSG_WAITALL: usually one call; a large
    view in two, the first with a raised SO_RCVLOWAT)."""
    lowat = RCVLOWAT_BYTES
    n = len(view)
    if lowat <= 0 or n < _LOWAT_MIN_READ * lowat:
        _recv_exact(sock, view, idle_s)
        return
    rtt = rtt_s(sock)
    if rtt is None or rtt > RCVLOWAT_MAX_RTT_S:
        _recv_exact(sock, view, idle_s)
        return
    head = n - lowat
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, lowat)
    except OSError:
        _recv_exact(sock, view, idle_s)
        return
    try:
        _recv_exact(sock, view[:head], idle_s, total=n)
    finally:
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, 1)
        except OSError:
            pass
    _recv_exact(sock, view[head:], idle_s, before=head, total=n)


def _recv_exact(sock: socket.socket, view: memoryview, idle_s: float, before: int = 0,
                total: int | None = None) -> None:
    """Fill `view` completely from the socket (MSG_WAITALL: usually one call).
    `before` / `total`: where `view` lies in the frame, for the messages.

    The stream is declared dead once the peer has sent nothing for `idle_s`, counted
    from the last byte that arrived, also in the middle of a frame. SO_RCVTIMEO bounds
    one whole call, so a call that returns only part of `view` may have waited up to
    `idle_s` already: instead of waiting a full `idle_s` again (which would detect a
    peer that stopped mid-frame only after up to twice the timeout), the next call
    waits only for what is left of the idle window, measured by the kernel
    (TCP_INFO). Only this slow path pays for the extra system calls.
    """
    n = len(view)
    got = 0
    shortened = False
    try:
        while got < n:
            try:
                r = sock.recv_into(view[got:], n - got, socket.MSG_WAITALL)
            except (BlockingIOError, TimeoutError):
                # Nothing at all for a whole (possibly shortened) window: since the
                # window is what was left of idle_s, the peer was silent for idle_s.
                raise StreamDown(_idle_message(idle_s, before + got, total or n)) from None
            except OSError as exc:
                raise StreamDown(_describe(exc)) from None
            if r == 0:
                raise StreamDown("peer closed the connection (EOF)" + _progress(before + got, total or n))
            got += r
            if got == n:
                return
            # A short read: the call's timer ran out (or a signal arrived) mid-frame.
            silent = silent_s(sock)
            if silent is None:
                continue  # no kernel clock: wait a full window again (conservative)
            left = idle_s - silent
            if left <= 0:
                raise StreamDown(_idle_message(idle_s, before + got, total or n))
            _set_rcvtimeo(sock, max(_MIN_REWAIT_S, left))
            shortened = True
    finally:
        if shortened:
            try:
                _set_rcvtimeo(sock, idle_s)
            except OSError:
                pass


def _progress(got: int, n: int) -> str:
    return f", {got} of {n} bytes of a frame read" if got else ""


def _idle_message(idle_s: float, got: int, n: int) -> str:
    return f"no data for {idle_s:g} s (idle timeout){_progress(got, n)}"


def recv_bytes(sock: socket.socket, n: int, idle_s: float) -> bytes:
    buf = bytearray(n)
    recv_exact(sock, memoryview(buf), idle_s)
    return bytes(buf)


def discard(sock: socket.socket, n: int, scratch: memoryview, idle_s: float) -> None:
    while n:
        step = min(n, len(scratch))
        recv_exact(sock, scratch[:step], idle_s)
        n -= step


@contextlib.contextmanager
def send_errors(idle_s: float) -> Iterator[None]:
    """A failed or timed-out write (SO_SNDTIMEO) as the stream's `StreamDown`."""
    try:
        yield
    except (BlockingIOError, TimeoutError):
        raise StreamDown(f"peer accepted no data for {idle_s:g} s (idle timeout)") from None
    except OSError as exc:
        raise StreamDown(_describe(exc)) from None


def send_parts(sock: socket.socket, parts: list, idle_s: float) -> None:
    """Write header and payload with one gathered sendmsg (no copy of the payload);
    finish with sendall if the kernel took only part of it."""
    with send_errors(idle_s):
        total = sum(len(p) for p in parts)
        sent = sock.sendmsg(parts)
        if sent == total:
            return
        for p in parts:
            mv = memoryview(p).cast("B")
            if sent >= len(mv):
                sent -= len(mv)
                continue
            sock.sendall(mv[sent:])
            sent = 0


def _describe(exc: OSError) -> str:
    return exc.strerror or str(exc) or type(exc).__name__


def open_stream(host: str, port: int, cfg: TransportConfig, deadline: float) -> socket.socket:
    """TCP connect with the per-stream tuning applied before the SYN."""
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        raise ConnectError(f"connect to {host}:{port} timed out after {cfg.connect_timeout_s:g} s")
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise ConnectError(f"cannot resolve {host!r}: {exc.strerror}") from None
    last: Exception | None = None
    for family, kind, proto, _, addr in infos:
        sock = socket.socket(family, kind, proto)
        try:
            tune(sock, cfg)
            sock.settimeout(max(0.001, deadline - time.monotonic()))
            sock.connect(addr)
            return sock
        except ConfigError:
            sock.close()
            raise
        except TimeoutError:
            sock.close()
            raise ConnectError(
                f"connect to {host}:{port} timed out after {cfg.connect_timeout_s:g} s "
                "(is the listener up and the address reachable?)"
            ) from None
        except OSError as exc:
            sock.close()
            last = exc
    raise ConnectError(f"cannot connect to {host}:{port}: {_describe(last) if isinstance(last, OSError) else last}")
