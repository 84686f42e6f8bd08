"""Batched, allocation-light socket reads for the delay line: ``recvmmsg(2)`` through
ctypes into one preallocated area, with each frame's kernel receive timestamp.

Why: the relay's CPU goes mostly to per-frame interpreter work and per-frame wake-ups.
One ``recvmmsg`` returns every frame waiting on a socket (up to ``vlen``) without an
exception for the empty case, and the kernel stamps each frame when it arrives
(``SO_TIMESTAMPNS``), so the relay no longer has to wake up the moment a frame arrives
to know when it did: it can read at its next deadline and still hold each frame
exactly from its arrival (see `relay.Relay.run`).

A TPACKET_V3 memory-mapped ring was tried first: it hands frames over only when a block
is retired, and the retire timer runs on jiffies, so with HZ=250 a 1 ms block timeout
delivered lone frames 3.3 ms late at the median (4.5 ms at worst), longer than the
calibration's 2 ms probe delay and than short or jittery links' delay.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import socket
import struct
import time
from collections.abc import Callable

MSG_TRUNC = 0x20
MSG_DONTWAIT = 0x40
SO_TIMESTAMPNS = 35  # SO_TIMESTAMPNS_OLD: struct timespec of two longs
SCM_TIMESTAMPNS = SO_TIMESTAMPNS
CMSG_SPACE_TIMESPEC = 32  # cmsghdr (16 bytes) + timespec (16 bytes), already aligned
MAX_STAMP_AGE_S = 1.0  # a stamp older than this (a clock step) is not believed
SHIFT_TRIES = 4  # reads of the two clocks, the tightest bracket kept ...
SHIFT_TIGHT_S = 50e-6  # ... or the first this tight


class iovec(ctypes.Structure):  # noqa: N801 (the C names)
    _fields_ = [("iov_base", ctypes.c_void_p), ("iov_len", ctypes.c_size_t)]


class msghdr(ctypes.Structure):  # noqa: N801
    _fields_ = [
        ("msg_name", ctypes.c_void_p),
        ("msg_namelen", ctypes.c_uint32),
        ("msg_iov", ctypes.POINTER(iovec)),
        ("msg_iovlen", ctypes.c_size_t),
        ("msg_control", ctypes.c_void_p),
        ("msg_controllen", ctypes.c_size_t),
        ("msg_flags", ctypes.c_int),
    ]


class mmsghdr(ctypes.Structure):  # noqa: N801
    _fields_ = [("msg_hdr", msghdr), ("msg_len", ctypes.c_uint)]


MMSG_SIZE = ctypes.sizeof(mmsghdr)
_CONTROLLEN_AT = mmsghdr.msg_hdr.offset + msghdr.msg_controllen.offset
_FLAGS_AT = mmsghdr.msg_hdr.offset + msghdr.msg_flags.offset
_LEN_AT = mmsghdr.msg_len.offset
_U32 = struct.Struct("I")
_SIZE_T = struct.Struct("N")
_STAMP_CMSG = struct.Struct("Qiiqq")  # cmsg_len, cmsg_level, cmsg_type, tv_sec, tv_nsec

_libc: ctypes.CDLL | None = None


def libc() -> ctypes.CDLL:
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    return _libc


def realtime_shift(clock: Callable[[], float] = time.monotonic,
                   realtime: Callable[[], float] = time.time) -> float:
    """CLOCK_REALTIME less ``clock`` (the kernel stamps frames on the first, the relay
    holds them on the second), from a read of the realtime clock between two reads of
    ``clock``, the tightest of up to SHIFT_TRIES such brackets: a process preempted
    between its two clock reads (a busy core: a millisecond now and then) would
    otherwise put every stamp of the batch that much earlier, and the relay would
    release those frames that much before their delay (`topo check` counted a quiet
    link's datagrams early). The figure is off by at most half the bracket kept."""
    best_gap, best = float("inf"), 0.0
    for _ in range(SHIFT_TRIES):
        before = clock()
        real = realtime()
        after = clock()
        if after - before < best_gap:
            best_gap, best = after - before, real - (before + after) / 2
            if best_gap <= SHIFT_TIGHT_S:
                break
    return best


class BatchReceiver:
    """Reads up to ``vlen`` frames of at most ``slot - 1`` bytes per call from one
    socket. `recv` returns (offset, length, stamp) per frame: the frame is
    ``view[offset:offset + length]`` until the next call; a length of ``slot`` or more
    means the frame was truncated (its real length, as ``MSG_TRUNC`` reports it).
    Stamps are on ``clock``'s time line (monotonic seconds): the kernel's receive time,
    or the time of the read where the kernel gave none."""

    def __init__(self, sock: socket.socket, slot: int, vlen: int = 32,
                 clock: Callable[[], float] = time.monotonic):
        self.sock = sock
        self.fd = sock.fileno()
        self.slot = slot
        self.vlen = vlen
        self.clock = clock
        self.area = bytearray(slot * vlen)
        self.view = memoryview(self.area)
        self._area_c = (ctypes.c_char * len(self.area)).from_buffer(self.area)
        self._iov = (iovec * vlen)()
        self._ctrl = bytearray(CMSG_SPACE_TIMESPEC * vlen)
        self._ctrl_c = (ctypes.c_char * len(self._ctrl)).from_buffer(self._ctrl)
        self._hdrs = (mmsghdr * vlen)()
        base = ctypes.addressof(self._area_c)
        cbase = ctypes.addressof(self._ctrl_c)
        for i in range(vlen):
            self._iov[i].iov_base = base + i * slot
            self._iov[i].iov_len = slot
            h = self._hdrs[i].msg_hdr
            h.msg_iov = ctypes.pointer(self._iov[i])
            h.msg_iovlen = 1
            h.msg_control = cbase + i * CMSG_SPACE_TIMESPEC
            h.msg_controllen = CMSG_SPACE_TIMESPEC
        self._hv = memoryview(self._hdrs).cast("B")
        self._stamped = True
        try:
            sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        except OSError:
            self._stamped = False
        fn = libc().recvmmsg
        fn.restype = ctypes.c_int
        fn.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_uint, ctypes.c_int, ctypes.c_void_p]
        self._fn = fn
        self._hdrs_addr = ctypes.addressof(self._hdrs)
        self._flags = MSG_DONTWAIT | MSG_TRUNC

    def recv(self) -> list[tuple[int, int, float]]:
        """The frames waiting now (empty list when none). Raises OSError for errors
        other than EAGAIN/EINTR (ENETDOWN, ENXIO, ...)."""
        n = self._fn(self.fd, self._hdrs_addr, self.vlen, self._flags, None)
        if n <= 0:
            if n == 0:
                return []
            err = ctypes.get_errno()
            if err in (errno.EAGAIN, errno.EINTR):
                return []
            raise OSError(err, errno.errorcode.get(err, str(err)))
        now = self.clock()
        hv, ctrl, slot = self._hv, self._ctrl, self.slot
        u32_at, size_at, size_pack = _U32.unpack_from, _SIZE_T.unpack_from, _SIZE_T.pack_into
        shift = realtime_shift(self.clock)  # realtime - monotonic, for the kernel's stamps
        oldest = now - MAX_STAMP_AGE_S
        cmsg_at = _STAMP_CMSG.unpack_from
        out = []
        for i in range(n):
            at = i * MMSG_SIZE
            length = u32_at(hv, at + _LEN_AT)[0]
            if u32_at(hv, at + _FLAGS_AT)[0] & MSG_TRUNC and length < slot:
                length = slot  # truncated, real length unknown
            stamp = now
            if size_at(hv, at + _CONTROLLEN_AT)[0] >= CMSG_SPACE_TIMESPEC:
                _len, level, kind, sec, nsec = cmsg_at(ctrl, i * CMSG_SPACE_TIMESPEC)
                if level == socket.SOL_SOCKET and kind == SCM_TIMESTAMPNS:
                    got = sec + nsec * 1e-9 - shift
                    if oldest <= got:
                        stamp = got if got < now else now
            size_pack(hv, at + _CONTROLLEN_AT, CMSG_SPACE_TIMESPEC)
            out.append((i * slot, length, stamp))
        return out


def _bytes_data_offset() -> int | None:
    """Where a bytes object's data starts, from its id (CPython: after the object
    header), checked on a sample; None where that does not hold (then frames are sent
    one by one)."""
    offset = bytes.__basicsize__ - 1
    sample = b"delay line offset check"
    try:
        if ctypes.string_at(id(sample) + offset, len(sample)) == sample:
            return offset
    except (OSError, ValueError):
        pass
    return None


BYTES_DATA = _bytes_data_offset()
_IOVEC = struct.Struct("PN")


class BatchSender:
    """Sends several frames (bytes) with one ``sendmmsg(2)``. `send` returns how many
    of ``frames[start:]`` the kernel took before the first it refused, and the errno
    of that refusal (0 when all were taken)."""

    def __init__(self, sock: socket.socket, vlen: int = 32):
        if BYTES_DATA is None:
            raise OSError(errno.ENOSYS, "sendmmsg batching needs CPython's bytes layout")
        self.fd = sock.fileno()
        self.vlen = vlen
        self._iov = (iovec * vlen)()
        self._hdrs = (mmsghdr * vlen)()
        for i in range(vlen):
            self._hdrs[i].msg_hdr.msg_iov = ctypes.pointer(self._iov[i])
            self._hdrs[i].msg_hdr.msg_iovlen = 1
        self._iv = memoryview(self._iov).cast("B")
        fn = libc().sendmmsg
        fn.restype = ctypes.c_int
        fn.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_uint, ctypes.c_int]
        self._fn = fn
        self._hdrs_addr = ctypes.addressof(self._hdrs)

    def send(self, frames: list[bytes], start: int = 0) -> tuple[int, int]:
        count = min(len(frames) - start, self.vlen)
        iv, pack, off, size = self._iv, _IOVEC.pack_into, BYTES_DATA, _IOVEC.size
        for i in range(count):
            frame = frames[start + i]
            pack(iv, i * size, id(frame) + off, len(frame))  # type: ignore[operator]
        n = self._fn(self.fd, self._hdrs_addr, count, MSG_DONTWAIT)
        if n < 0:
            return 0, ctypes.get_errno()
        return n, 0
