"""Zero-copy sends (vmsplice + splice): the bytes arrive intact, the path is really
taken for large payloads, small or read-only ones fall back to sendmsg, a failing
vmsplice turns the path off without losing data, and socket failures surface as
StreamDown with a message."""

from __future__ import annotations

import ctypes
import socket
import threading

import numpy as np
import pytest
import torch

from atlas_transport import ConfigError, TransportConfig
from atlas_transport import splice as Z
from atlas_transport.loopback import loopback_pair
from atlas_transport.sockets import StreamDown, set_io_timeout

needs_splice = pytest.mark.skipif(Z.unavailable() is not None, reason=f"zero-copy sends off: {Z.unavailable()}")


@pytest.fixture
def tcp_pair():
    with socket.create_server(("127.0.0.1", 0)) as ls:
        a = socket.create_connection(ls.getsockname())
        b, _ = ls.accept()
    yield a, b
    a.close()
    b.close()


def _read_all(sock: socket.socket, n: int, out: list) -> None:
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if k == 0:
            break
        got += k
    out.append(bytes(buf[:got]))


def _send_and_read(a, b, head: bytes, payload) -> tuple[bytes, Z.PageSender]:
    out: list[bytes] = []
    reader = threading.Thread(target=_read_all, args=(b, len(head) + len(memoryview(payload).cast("B")), out))
    reader.start()
    sender = Z.PageSender()
    try:
        sender.send(a, head, memoryview(payload).cast("B"), idle_s=5)
    finally:
        sender.close()
    reader.join(10)
    return out[0], sender


@needs_splice
def test_a_large_payload_is_spliced_and_arrives_intact(tcp_pair) -> None:
    a, b = tcp_pair
    payload = np.random.default_rng(3).integers(0, 256, (5 << 20) + 12345, dtype=np.uint8)
    got, sender = _send_and_read(a, b, b"HEAD", payload)
    assert got == b"HEAD" + payload.tobytes()
    assert sender.spliced_bytes == payload.nbytes


@needs_splice
def test_an_unaligned_slice_is_spliced_intact(tcp_pair) -> None:
    a, b = tcp_pair
    base = np.random.default_rng(4).integers(0, 256, 3 << 20, dtype=np.uint8)
    part = memoryview(base)[4097:(2 << 20) + 77]
    got, sender = _send_and_read(a, b, b"H", part)
    assert got == b"H" + part.tobytes()
    assert sender.spliced_bytes == len(part)


def test_small_and_read_only_payloads_take_sendmsg(tcp_pair) -> None:
    a, b = tcp_pair
    small = np.arange(1000, dtype=np.uint8)
    got, sender = _send_and_read(a, b, b"x", small)
    assert got == b"x" + small.tobytes() and sender.spliced_bytes == 0
    frozen = bytes(range(256)) * 1024  # 256 KiB, but not writable: no address to map
    got, sender = _send_and_read(a, b, b"y", frozen)
    assert got == b"y" + frozen and sender.spliced_bytes == 0


@needs_splice
def test_a_failing_vmsplice_turns_the_path_off_and_still_delivers(tcp_pair, monkeypatch) -> None:
    a, b = tcp_pair

    def refuse(*args):
        ctypes.set_errno(1)  # EPERM, as under a seccomp filter
        return -1

    monkeypatch.setattr(Z, "_vmsplice", refuse)
    monkeypatch.setattr(Z, "_unavailable", None)
    payload = np.random.default_rng(5).integers(0, 256, 1 << 20, dtype=np.uint8)
    got, sender = _send_and_read(a, b, b"HEAD", payload)
    assert got == b"HEAD" + payload.tobytes()
    assert sender.spliced_bytes == 0
    assert "vmsplice failed" in Z.unavailable() and "not permitted" in Z.unavailable()


@needs_splice
def test_a_peer_that_stops_reading_is_an_idle_timeout(tcp_pair) -> None:
    a, _b = tcp_pair
    set_io_timeout(a, 0.3)
    payload = np.zeros(64 << 20, dtype=np.uint8)  # far more than both socket buffers hold
    sender = Z.PageSender()
    with pytest.raises(StreamDown, match=r"peer accepted no data for 0.3 s \(idle timeout\)"):
        sender.send(a, b"H", memoryview(payload), idle_s=0.3)
    sender.close()


@needs_splice
def test_a_closed_peer_is_a_stream_down(tcp_pair) -> None:
    a, b = tcp_pair
    b.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\0\0\0\0\0\0\0")  # close with a reset
    b.close()
    payload = np.zeros(16 << 20, dtype=np.uint8)
    sender = Z.PageSender()
    with pytest.raises(StreamDown, match=r"reset|Broken pipe"):
        for _ in range(4):
            sender.send(a, b"H", memoryview(payload), idle_s=5)
    sender.close()


@pytest.mark.parametrize("zero_copy", [True, False], ids=["zero-copy", "sendmsg"])
def test_a_channel_delivers_both_ways(zero_copy: bool) -> None:
    cfg = TransportConfig(streams=2, secret="unit-test", chunk_bytes=1 << 20, zero_copy=zero_copy,
                          connect_timeout_s=5, idle_timeout_s=10)
    x = torch.randn(3 << 20, generator=torch.Generator().manual_seed(6))
    with loopback_pair(cfg) as (a, b):
        a.send(x, 7, timeout=20)
        y = b.recv(7, timeout=20)
    assert torch.equal(x, y)


def test_zero_copy_must_be_a_bool() -> None:
    with pytest.raises(ConfigError, match=r"zero_copy='yes': use True .*or False"):
        TransportConfig(secret="s", zero_copy="yes")
