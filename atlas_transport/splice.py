"""Sending a payload without copying it into the kernel (Linux): `vmsplice` maps the
payload's pages into a pipe, `splice` moves them from the pipe into the TCP socket.

Why: `sendmsg` copies every byte from the tensor into socket buffers; on a fast path
that copy is the sender's largest cost and, on loopback, where the sending thread also
runs the receiver's TCP processing, the single stream's bottleneck. Measured with a
bare socket on this project's 2-core VMs (256 MiB from a reused array into a reused
256 MiB array, 5 transfers): sendmsg 28-31 Gbit/s at 780-880 ms CPU per GiB (both
ends), vmsplice + splice 39-42 Gbit/s at 420-460 ms.

Safety: the socket buffers reference the payload's pages instead of holding a copy, so
bytes changed after the call and before TCP sent them would be sent changed. A channel
completes a send only when the receiver confirmed every chunk (DONE), which is also
when the caller may reuse the tensor: nothing the caller may do changes what arrives.

Where the calls are missing (not Linux, an old Python, a seccomp filter) the first
failure turns the path off for the process and `send` falls back to `sendmsg`; a
failure of the socket itself (reset, idle timeout) is the caller's `StreamDown`.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import socket

from .sockets import StreamDown, send_errors, send_parts

SPLICE_F_MORE = getattr(os, "SPLICE_F_MORE", 4)
F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)
F_GETPIPE_SZ = getattr(fcntl, "F_GETPIPE_SZ", 1032)
PIPE_BYTES = 1 << 20  # the unprivileged maximum (/proc/sys/fs/pipe-max-size) by default
MIN_SPLICE_BYTES = 64 << 10  # below this, one gathered sendmsg costs less than 3+ calls

_unavailable: str | None = None  # why the path is off in this process, None while usable


class _IoVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


def _load_vmsplice():
    try:
        fn = ctypes.CDLL(None, use_errno=True).vmsplice
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.POINTER(_IoVec), ctypes.c_ulong, ctypes.c_uint]
    fn.restype = ctypes.c_ssize_t
    return fn


_vmsplice = _load_vmsplice()
if _vmsplice is None or not hasattr(os, "splice"):
    _unavailable = "vmsplice/splice are not available here"


def unavailable() -> str | None:
    """Why zero-copy sends are off in this process, or None while they are used."""
    return _unavailable


def _turn_off(why: str) -> None:
    global _unavailable
    _unavailable = why


def buffer_address(view: memoryview) -> int | None:
    """Address of a writable, contiguous buffer's first byte; None otherwise."""
    try:
        return ctypes.addressof(ctypes.c_char.from_buffer(view))
    except (TypeError, ValueError):
        return None


class PageSender:
    """One stream's pipe for zero-copy sends. Used by the stream's writer thread only;
    `close` it when the writer ends (a failed send may leave pages in the pipe)."""

    def __init__(self) -> None:
        self._r = self._w = -1
        self.capacity = 0
        self.spliced_bytes = 0  # payload bytes sent without a copy (observability, tests)

    def _open(self) -> bool:
        if self._r >= 0:
            return True
        try:
            self._r, self._w = os.pipe2(os.O_CLOEXEC)
        except OSError as exc:
            _turn_off(f"no pipe for zero-copy sends ({exc.strerror})")
            return False
        try:
            fcntl.fcntl(self._w, F_SETPIPE_SZ, PIPE_BYTES)
        except OSError:
            pass  # keep the default size (64 KiB): correct, only more system calls
        self.capacity = fcntl.fcntl(self._w, F_GETPIPE_SZ)
        return True

    def send(self, sock: socket.socket, head: bytes, payload: memoryview, idle_s: float) -> None:
        """Write `head`, then `payload` without copying it; falls back to one gathered
        sendmsg for small payloads, non-writable buffers or where splicing is off."""
        addr = None
        if _unavailable is None and len(payload) >= MIN_SPLICE_BYTES:
            addr = buffer_address(payload)
        if addr is None or not self._open():
            send_parts(sock, [head, payload], idle_s)
            return
        with send_errors(idle_s):
            sock.sendall(head, socket.MSG_MORE)
        self._splice(sock, payload, addr, idle_s)

    def _splice(self, sock: socket.socket, payload: memoryview, addr: int, idle_s: float) -> None:
        fd, n = sock.fileno(), len(payload)
        iov = _IoVec()
        off = 0
        while off < n:
            iov.base, iov.len = addr + off, min(self.capacity, n - off)
            k = _vmsplice(self._w, ctypes.byref(iov), 1, 0)
            if k < 0:
                err = ctypes.get_errno()
                if off == 0 and err in (errno.ENOSYS, errno.EPERM, errno.EINVAL, errno.EFAULT):
                    # Nothing of the payload left yet: turn the path off, send it copied.
                    _turn_off(f"vmsplice failed ({os.strerror(err)})")
                    send_parts(sock, [payload], idle_s)
                    return
                raise StreamDown(f"vmsplice failed ({os.strerror(err)})")
            off += k
            while k:
                with send_errors(idle_s):
                    m = os.splice(self._r, fd, k, flags=SPLICE_F_MORE if off < n else 0)
                if m <= 0:
                    raise StreamDown("splice into the socket moved no data")
                k -= m
                self.spliced_bytes += m

    def close(self) -> None:
        for fd in (self._r, self._w):
            if fd >= 0:
                os.close(fd)
        self._r = self._w = -1
