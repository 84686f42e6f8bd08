"""A channel's RTT and congestion control, and the backend's WAN choice (on a channel
whose streams measure an RTT of 2 ms or more, unless the group chose: cubic with warm
streams for small sends, BBR for large ones)."""

from __future__ import annotations

import socket

import torch

from atlas_transport import TransportConfig
from atlas_transport.loopback import loopback_pair
from atlas_transport.sockets import TCP_CONGESTION, available_congestion
from atlas_transport.torch import mesh as M
from atlas_transport.torch.options import AtlasOptions


def _cc(sock: socket.socket) -> str:
    return sock.getsockopt(socket.IPPROTO_TCP, TCP_CONGESTION, 16).rstrip(b"\0").decode()


def test_channel_rtt_and_congestion_switch():
    with loopback_pair(TransportConfig(streams=2, secret=b"s")) as (a, b):
        rtt = a.rtt_s()
        assert rtt is not None and 0 < rtt < 0.05
        assert a.set_congestion("reno")
        assert all(_cc(s.sock) == "reno" for s in a._streams)
        assert not a.set_congestion("no-such-algorithm")
        assert all(_cc(s.sock) == "reno" for s in a._streams)  # refused: unchanged
        x = torch.arange(1 << 16, dtype=torch.float32)
        h = a.isend(x, tag=1)
        assert torch.equal(b.recv(1, timeout=10), x)
        h.wait(10)


class FakeChannel:
    def __init__(self, rtt: float | None) -> None:
        self.rtt, self.set_to, self.warm = rtt, None, None

    def rtt_s(self):
        return self.rtt

    def set_congestion(self, name: str) -> bool:
        self.set_to = name
        return True

    def keep_warm(self, interval_s):
        self.warm = interval_s


def _mesh(congestion: str | None) -> M.PeerMesh:
    m = M.PeerMesh.__new__(M.PeerMesh)  # only what _tune_wan reads
    m.opts, m.rank = AtlasOptions(congestion=congestion), 0
    return m


def test_wan_channels_start_on_cubic_with_warm_streams_unless_the_group_chose():
    wan, lan, unknown = FakeChannel(0.05), FakeChannel(0.0001), FakeChannel(None)
    adaptive = [_mesh(None)._tune_wan(1, ch) for ch in (wan, lan, unknown)]
    both = {"bbr", "cubic"} <= set(available_congestion())
    assert adaptive == [both, False, False]
    assert wan.set_to == ("cubic" if both else None) and wan.warm == (M.KEEP_WARM_S if both else None)
    assert lan.set_to is None and unknown.set_to is None and lan.warm is None
    chosen = FakeChannel(0.05)
    assert not _mesh("reno")._tune_wan(1, chosen)
    assert chosen.set_to is None and chosen.warm is None


def test_a_small_send_is_written_by_the_sending_thread(monkeypatch):
    """Small transfers skip the hand-off to a stream's writer thread (most of a small
    message's latency); large ones are striped by the writers."""
    import threading

    from atlas_transport import channel as C

    writers: list[str] = []
    orig = C.Channel._send_chunk

    def spy(self, s, c):
        writers.append(threading.current_thread().name)
        return orig(self, s, c)

    monkeypatch.setattr(C.Channel, "_send_chunk", spy)
    with loopback_pair(TransportConfig(streams=2, secret=b"s")) as (a, b):
        small = torch.arange(100, dtype=torch.float32)
        a.isend(small, tag=1).wait(10)
        assert torch.equal(b.recv(1, timeout=10), small)
        assert writers == [threading.current_thread().name]
        writers.clear()
        big = torch.zeros(1 << 20)
        a.isend(big, tag=2).wait(10)
        assert torch.equal(b.recv(2, timeout=10), big)
        assert writers and all("-tx" in w for w in writers)


def test_a_transfer_of_few_chunks_rides_the_lowest_streams(monkeypatch):
    """Fewer chunks than streams: the lowest-numbered live streams carry them (they
    stay warm), not whichever streams' writers wake first."""
    from atlas_transport import channel as C

    used: list[int] = []
    orig = C.Channel._send_chunk

    def spy(self, s, c):
        if c.length >= C.SPLIT_MIN_BYTES:
            used.append(s.index)
        return orig(self, s, c)

    monkeypatch.setattr(C.Channel, "_send_chunk", spy)
    with loopback_pair(TransportConfig(streams=8, secret=b"s")) as (a, b):
        for i in range(5):
            x = torch.zeros(C.SPLIT_MIN_BYTES * 2 // 4)  # two chunks
            a.isend(x, tag=i).wait(10)
            b.recv(i, timeout=10)
        assert set(used) <= {0, 1}
        a.drop_stream(0)
        used.clear()
        a.isend(torch.zeros(C.SPLIT_MIN_BYTES * 2 // 4), tag=9).wait(10)
        b.recv(9, timeout=10)
        assert used and set(used) <= {1, 2}  # the lowest live ones


def test_wait_out_returns_when_the_bytes_are_out_not_at_done(monkeypatch):
    """A send's bytes handed to the kernel: wait_out returns without the peer's DONE
    (ignored here), while wait() still waits for it."""
    import pytest

    from atlas_transport import channel as C

    held: list = []
    orig = C.Channel._on_done
    monkeypatch.setattr(C.Channel, "_on_done", lambda self, tid: held.append((self, tid)))
    with loopback_pair(TransportConfig(streams=2, secret=b"s")) as (a, b):
        for n in (10, 1 << 20):  # inline, and striped by the writers
            x = torch.ones(n)
            h = a.isend(x, tag=n)
            h.wait_out(10)
            assert torch.equal(b.recv(n, timeout=10), x)
            with pytest.raises(TimeoutError):
                h.wait(0.2)
        monkeypatch.setattr(C.Channel, "_on_done", orig)  # a DONE still on its way goes through
        for ch, tid in list(held):  # the DONEs, late: now the sends complete
            orig(ch, tid)
        assert h.wait(1) is None


class FakeWanChannel(FakeChannel):
    def __init__(self, streams: int = 8, refuse: str | None = None) -> None:
        super().__init__(0.05)
        self.streams, self.refuse, self.switches = streams, refuse, []

    def set_congestion(self, name: str) -> bool:
        if name == self.refuse:
            return False
        self.switches.append(name)
        return True


def _wan_peer(ch: FakeWanChannel) -> tuple[M.PeerMesh, M._Peer]:
    m = _mesh(None)
    p = M._Peer(1)
    p.channel, p.adaptive, p.congestion = ch, True, M.WAN_CONGESTION
    return m, p


def test_a_wan_channel_of_small_sends_leaves_bbr_and_a_large_send_brings_it_back():
    """BBR paces small bursts slowly (its estimate stays low): a WAN channel whose last
    BURST_WINDOW sends were all small switches to cubic with warm streams; one large
    send switches it back to BBR at once."""
    ch = FakeWanChannel(streams=8)
    m, p = _wan_peer(ch)
    small, big = 512 << 10, M.BIG_SHARE_BYTES * 8
    p.congestion = M.SMALL_CONGESTION  # as a channel starts: small sends change nothing
    for _ in range(M.BURST_WINDOW * 2):
        m._adapt(p, small)
    assert ch.switches == []
    m._adapt(p, big)
    assert ch.switches == [M.WAN_CONGESTION] and ch.warm is None
    ch.switches.clear()
    p.recent.clear()
    for _ in range(M.BURST_WINDOW - 1):
        m._adapt(p, small)
    assert ch.switches == [] and ch.warm is None  # not yet a whole window
    m._adapt(p, small)
    assert ch.switches == [M.SMALL_CONGESTION] and p.congestion == M.SMALL_CONGESTION
    assert ch.warm == M.KEEP_WARM_S
    m._adapt(p, big)
    assert ch.switches == [M.SMALL_CONGESTION, M.WAN_CONGESTION] and ch.warm is None
    for _ in range(M.BURST_WINDOW - 1):  # the large send is still in the window
        m._adapt(p, small)
    assert p.congestion == M.WAN_CONGESTION
    m._adapt(p, small)
    assert p.congestion == M.SMALL_CONGESTION


def test_the_size_that_counts_as_large_follows_the_stream_count():
    ch = FakeWanChannel(streams=2)
    m, p = _wan_peer(ch)
    for _ in range(M.BURST_WINDOW):
        m._adapt(p, M.BIG_SHARE_BYTES * 2)  # large for 2 streams
    assert ch.switches == []


def test_a_refused_switch_stops_the_adaptation():
    ch = FakeWanChannel(refuse=M.SMALL_CONGESTION)
    m, p = _wan_peer(ch)
    for _ in range(M.BURST_WINDOW * 2):
        m._adapt(p, 1024)
    assert not p.adaptive and p.congestion == M.WAN_CONGESTION and ch.warm is None


def test_keep_warm_pings_an_idle_stream():
    """keep_warm(s): a stream with nothing to send writes a PING every s seconds (the
    peer's idle clock sees it); None goes back to the heartbeat alone."""
    import time

    import pytest

    from atlas_transport import channel as C

    with loopback_pair(TransportConfig(streams=2, secret=b"s", idle_timeout_s=30)) as (a, b):
        with pytest.raises(ValueError, match="positive number of seconds"):
            a.keep_warm(0)
        sent: list[int] = []
        orig = C.send_parts

        def spy(sock, parts, timeout):
            if parts and parts[0] == C._PING:
                sent.append(1)
            return orig(sock, parts, timeout)

        C.send_parts = spy
        try:
            a.keep_warm(0.05)
            time.sleep(0.5)
            warm = len(sent)
            a.keep_warm(None)
            # a PING a stream decided on just before may still go out (late on a loaded host):
            # wait for 0.3 s without one (a warm stream pings every 0.05 s), then none in 0.4 s
            quiet_from, n, give_up = time.monotonic(), len(sent), time.monotonic() + 10
            while time.monotonic() - quiet_from < 0.3 and time.monotonic() < give_up:
                time.sleep(0.01)
                if len(sent) != n:
                    quiet_from, n = time.monotonic(), len(sent)
            sent.clear()
            time.sleep(0.4)
        finally:
            C.send_parts = orig
        assert warm >= 8  # two streams, about ten each
        assert sent == []  # heartbeat every 7.5 s: none in 0.4 s
        x = torch.arange(1000, dtype=torch.float32)
        a.isend(x, tag=3).wait(10)
        assert torch.equal(b.recv(3, timeout=10), x)
