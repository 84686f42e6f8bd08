"""Large reads raise SO_RCVLOWAT (fewer wake-ups) and read their last RCVLOWAT_BYTES with
it back at 1 byte: a frame whose tail is shorter than the mark never stalls, the mark is
restored, and errors count progress over the whole frame."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from atlas_transport import sockets as S


def _tcp_pair() -> tuple[socket.socket, socket.socket]:
    with socket.create_server(("127.0.0.1", 0)) as srv:
        a = socket.create_connection(srv.getsockname())
        b, _ = srv.accept()
    return a, b


def _send_later(sock: socket.socket, pieces: list[bytes], gap_s: float, then_close: bool = False) -> threading.Thread:
    def run() -> None:
        for p in pieces:
            sock.sendall(p)
            time.sleep(gap_s)
        if then_close:
            sock.close()

    th = threading.Thread(target=run, daemon=True)
    th.start()
    return th


def test_a_large_read_whose_tail_arrives_last_in_a_small_piece_does_not_stall() -> None:
    n = 8 * S.RCVLOWAT_BYTES
    assert n >= S._LOWAT_MIN_READ * S.RCVLOWAT_BYTES  # the split path
    a, b = _tcp_pair()
    try:
        data = bytes(range(256)) * (n // 256)
        # most of the frame, then a piece well below the mark, then the last 1000 bytes
        cut1, cut2 = n - S.RCVLOWAT_BYTES // 2, n - 1000
        th = _send_later(a, [data[:cut1], data[cut1:cut2], data[cut2:]], 0.2)
        buf = bytearray(n)
        t0 = time.monotonic()
        S.recv_exact(b, memoryview(buf), idle_s=10.0)
        took = time.monotonic() - t0
        th.join()
        assert bytes(buf) == data
        assert took < 2.0  # the pieces came 0.2 s apart; a stall would wait for the idle timeout
        assert b.getsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT) == 1
    finally:
        a.close()
        b.close()


def test_small_reads_keep_the_mark_at_one_byte() -> None:
    a, b = _tcp_pair()
    try:
        a.sendall(b"x" * 100)
        buf = bytearray(100)
        S.recv_exact(b, memoryview(buf), idle_s=5.0)
        assert bytes(buf) == b"x" * 100 and b.getsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT) == 1
    finally:
        a.close()
        b.close()


def test_errors_count_progress_over_the_whole_frame() -> None:
    n = 8 * S.RCVLOWAT_BYTES
    got = n - S.RCVLOWAT_BYTES + 4096  # past the split: in the tail part
    a, b = _tcp_pair()
    try:
        _send_later(a, [bytes(got)], 0.0, then_close=True)
        with pytest.raises(S.StreamDown) as info:
            S.recv_exact(b, memoryview(bytearray(n)), idle_s=5.0)
        assert str(info.value) == f"peer closed the connection (EOF), {got} of {n} bytes of a frame read"
    finally:
        b.close()


def test_the_mark_is_raised_only_on_sub_millisecond_paths(monkeypatch) -> None:
    """On a WAN the bytes held back until the mark is reached shrink the advertised
    window while they wait: a socket whose RTT is above RCVLOWAT_MAX_RTT_S (or not
    known) reads the frame in one piece, without the mark."""
    n = 8 * S.RCVLOWAT_BYTES
    calls: list[int] = []
    real = S._recv_exact

    def spy(sock, view, idle_s, before=0, total=None):
        calls.append(len(view))
        real(sock, view, idle_s, before=before, total=total)

    monkeypatch.setattr(S, "_recv_exact", spy)
    a, b = _tcp_pair()
    try:
        rtt = S.rtt_s(b)
        assert rtt is not None and 0 < rtt < S.RCVLOWAT_MAX_RTT_S  # loopback
        for fake_rtt, pieces in ((None, 1), (0.05, 1), (rtt, 2)):
            monkeypatch.setattr(S, "rtt_s", lambda _s, r=fake_rtt: r)
            calls.clear()
            _send_later(a, [bytes(n)], 0.0)
            S.recv_exact(b, memoryview(bytearray(n)), idle_s=5.0)
            assert len(calls) == pieces, (fake_rtt, calls)
    finally:
        a.close()
        b.close()
