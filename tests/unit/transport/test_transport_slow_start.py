"""A stream whose slow start cubic's HyStart cut short without a loss is put back into
slow start once its send is confirmed (TransportConfig.restart_cut_slow_start).

On the 2dc WAN the second of two channels opened together left slow start at 160-190
segments where its peer's window allowed 456, with no retransmission, and its 8 MiB
tensors took 170-280 ms against 145 ms on the first channel for the next 30 tensors
(docs/results/fidelity.md, "Prediction errors"). Loopback reproduces the cut: HyStart's
ACK-train test fires at once on a microsecond RTT."""

from __future__ import annotations

import logging
import socket
import struct
import threading

import pytest
import torch

from atlas_transport import TransportConfig
from atlas_transport import channel as channel_mod
from atlas_transport.loopback import loopback_pair
from atlas_transport.sockets import (
    TCP_INFINITE_SSTHRESH,
    WindowState,
    available_congestion,
    congestion_of,
    restart_slow_start,
    set_congestion,
    window_state,
)

PACED = 10_000.0  # SO_MAX_PACING_RATE that never binds: paced, as the testbed's channels are
needs_bbr = pytest.mark.skipif(not {"bbr", "cubic"} <= set(available_congestion()),
                               reason="the kernel offers no bbr or cubic")


def _tcp_info(ca_state=0, mss=1448, ssthresh=180, cwnd=471, total_retrans=0, snd_wnd=645 << 10, length=232) -> bytes:
    raw = bytearray(length)
    raw[1] = ca_state
    for off, value in ((16, mss), (76, ssthresh), (80, cwnd), (100, total_retrans), (228, snd_wnd)):
        if off + 4 <= length:
            struct.pack_into("I", raw, off, value)
    return bytes(raw)


def test_the_measured_wan_stream_is_cut_short_and_healthy_ones_are_not():
    measured = WindowState.parse(_tcp_info())  # the 2dc stream: ssthresh 180, window 456 segments
    assert measured is not None and measured.slow_start_cut_short()
    assert not WindowState.parse(_tcp_info(ssthresh=924, cwnd=924)).slow_start_cut_short()  # above the window
    assert not WindowState.parse(_tcp_info(ssthresh=TCP_INFINITE_SSTHRESH, cwnd=10)).slow_start_cut_short()
    assert not WindowState.parse(_tcp_info(total_retrans=3)).slow_start_cut_short()  # a loss set it: kept
    assert not WindowState.parse(_tcp_info(ca_state=3)).slow_start_cut_short()  # in recovery
    assert not WindowState.parse(_tcp_info(snd_wnd=0)).slow_start_cut_short()  # window unknown
    assert WindowState.parse(_tcp_info(length=104)) is None  # a kernel before 6.2: no peer window


def _cut_short_socket_pair() -> tuple[socket.socket, socket.socket, socket.socket]:
    """A cubic loopback connection after 64 MiB; skipped where HyStart did not cut it."""
    ls = socket.socket()
    ls.bind(("127.0.0.1", 0))
    ls.listen(1)
    c = socket.socket()
    assert set_congestion(c, "cubic")
    c.connect(ls.getsockname())
    s, _ = ls.accept()
    total = 64 << 20

    def drain() -> None:
        n = 0
        while n < total:
            n += len(s.recv(1 << 20))

    th = threading.Thread(target=drain)
    th.start()
    c.sendall(b"\0" * total)
    th.join(10)
    state = window_state(c)
    if state is None or not state.slow_start_cut_short():
        for x in (c, s, ls):
            x.close()
        pytest.skip(f"slow start was not cut short on this loopback ({state})")
    return c, s, ls


@needs_bbr
def test_restart_clears_ssthresh_and_keeps_the_algorithm_and_window():
    c, s, ls = _cut_short_socket_pair()
    try:
        before = window_state(c)
        assert restart_slow_start(c)
        after = window_state(c)
        assert congestion_of(c) == "cubic"
        assert after.ssthresh == TCP_INFINITE_SSTHRESH and not after.slow_start_cut_short()
        assert after.cwnd == before.cwnd
    finally:
        for x in (c, s, ls):
            x.close()


def _send_rounds(a, b, rounds: int = 3) -> None:
    x = torch.zeros(32 << 18, dtype=torch.float32)  # 32 MiB
    for _ in range(rounds):
        h = a.isend(x, tag=1)
        b.recv(1, timeout=30)
        h.wait(30)


@needs_bbr
def test_a_channel_leaves_no_stream_cut_short_after_a_confirmed_send():
    with loopback_pair(TransportConfig(streams=2, secret=b"s", congestion="cubic", pacing_rate_mbps=PACED)) as (a, b):
        _send_rounds(a, b)
        states = [window_state(s.sock) for s in a._streams]  # the last send is confirmed: repaired by now
        if a.slow_start_restarts == 0:
            pytest.skip(f"slow start was not cut short on this loopback: nothing to repair ({states})")
        assert not any(st.slow_start_cut_short() for st in states), states
        assert all(congestion_of(s.sock) == "cubic" for s in a._streams)


def test_a_refused_restart_is_said_once_and_not_tried_again(monkeypatch, caplog):
    cut = WindowState.parse(_tcp_info())
    calls = []
    monkeypatch.setattr(channel_mod, "window_state", lambda sock: cut)
    monkeypatch.setattr(channel_mod, "restart_slow_start", lambda sock: calls.append(sock) or False)
    caplog.set_level(logging.INFO, logger="atlas_transport")
    with loopback_pair(TransportConfig(streams=2, secret=b"s", pacing_rate_mbps=PACED)) as (a, b):
        _send_rounds(a, b, rounds=2)
        assert len(calls) == 1 and a.slow_start_restarts == 0
    said = [r.getMessage() for r in caplog.records if "refused to restart" in r.getMessage()]
    assert len(said) == 1
    assert "ssthresh 180 segments, below the peer's window of 456" in said[0]
    assert "net.ipv4.tcp_allowed_congestion_control" in said[0]


def test_no_repair_when_turned_off_unpaced_or_for_small_sends(monkeypatch):
    cut = WindowState.parse(_tcp_info())
    calls = []
    monkeypatch.setattr(channel_mod, "window_state", lambda sock: cut)
    monkeypatch.setattr(channel_mod, "restart_slow_start", lambda sock: calls.append(sock) or True)
    with loopback_pair(TransportConfig(streams=2, secret=b"s")) as (a, b):  # unpaced: BBR would pace it for good
        _send_rounds(a, b, rounds=1)
    assert calls == []
    with loopback_pair(TransportConfig(streams=2, secret=b"s", pacing_rate_mbps=PACED), restart_cut_slow_start=False) as (a, b):
        _send_rounds(a, b, rounds=1)
    assert calls == []
    with loopback_pair(TransportConfig(streams=2, secret=b"s", pacing_rate_mbps=PACED)) as (a, b):
        h = a.isend(torch.zeros(1024, dtype=torch.uint8), tag=1)  # 1 KiB: latency, not window
        b.recv(1, timeout=10)
        h.wait(10)
        assert calls == []
        _send_rounds(a, b, rounds=1)
        assert a.slow_start_restarts == len(calls) >= 1
