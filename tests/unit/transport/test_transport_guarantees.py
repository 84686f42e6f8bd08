"""The transport's failure guarantees, against a hand-driven peer that speaks the
wire protocol byte by byte (so it can stop anywhere, even inside a frame):

* a stream whose peer stops sending is dropped `idle_timeout_s` after the last byte
  arrived (within +1 s), whether it stopped between frames or in the middle of one,
  and a peer that still trickles bytes is not dropped;
* the memory of a transfer that failed (peer gone mid-transfer, a tensor announced
  but never sent) is freed when it fails, by reference counting: the tests run with
  the garbage collector disabled;
* `Channel.drop_stream` cuts one stream on purpose; the channel carries on.
"""

from __future__ import annotations

import gc
import os
import socket
import struct
import threading
import time
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import pytest
import torch

from atlas_transport import ChannelClosed, PeerLost, TransportConfig, TransportError, listen
from atlas_transport import protocol as P
from atlas_transport.handshake import client_handshake
from atlas_transport.loopback import loopback_pair

SECRET = "guarantee-tests"
IDLE = 1.5
MiB = 1 << 20


@contextmanager
def no_gc() -> Iterator[None]:
    """Prove that memory is freed by reference counting alone."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


@dataclass
class RawPeer:
    """A one-stream Atlas connector driven frame by frame."""

    port: int
    cid: bytes = field(default_factory=lambda: os.urandom(P.CHANNEL_ID_BYTES))
    sock: socket.socket | None = None
    last_byte_at: float = 0.0

    def connect(self) -> RawPeer:
        self.sock = socket.create_connection(("127.0.0.1", self.port), timeout=10)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        hello = P.Hello(P.VERSION, 0, 0, 1, self.cid, os.urandom(P.NONCE_BYTES))
        client_handshake(self.sock, SECRET.encode(), hello, time.monotonic() + 10, f"127.0.0.1:{self.port}")
        self.sock.settimeout(None)
        return self

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)
        self.last_byte_at = time.monotonic()

    def announce(self, tid: int, tag: int, total: int, chunk: int = MiB) -> None:
        """The first frame of a uint8 transfer: header and description, no payload yet."""
        meta = P.make_meta(tag, 0, "uint8", (total,), chunk)
        self.send(P.encode_data_header(tid, 0, min(chunk, total), meta))

    def reset(self) -> None:
        """Vanish abruptly (RST), as a killed host's kernel would."""
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.sock.close()

    def close(self) -> None:
        if self.sock is not None and self.sock.fileno() >= 0:
            self.sock.close()


def _accept(lst, peers: list[RawPeer]) -> dict[bytes, object]:
    """Accept one channel per raw peer, keyed by channel id."""
    channels = {}
    for _ in peers:
        ch = lst.accept(timeout=10)
        channels[ch.channel_id] = ch
    assert set(channels) == {p.cid for p in peers}
    return channels


def test_a_silent_stream_is_dropped_idle_timeout_after_its_last_byte() -> None:
    """Three peers at once, each stopping differently; every stall is reported within
    idle_timeout_s + 1 s of the last byte, none before idle_timeout_s."""
    cfg = TransportConfig(secret=SECRET, idle_timeout_s=IDLE)
    total = 4 * MiB
    with listen("127.0.0.1", 0, cfg) as lst:
        peers = {name: RawPeer(lst.port).connect() for name in ("mid-frame", "between-frames", "trickle")}
        channels = _accept(lst, list(peers.values()))
        handles = {name: channels[p.cid].irecv(7) for name, p in peers.items()}

        def mid_frame(p: RawPeer) -> None:  # a quarter of the first chunk, then nothing
            p.announce(0, 7, total)
            p.send(bytes(MiB // 4))

        def between_frames(p: RawPeer) -> None:  # one whole chunk, then nothing
            p.announce(0, 7, total)
            p.send(bytes(MiB))

        def trickle(p: RawPeer) -> None:  # slow but alive for longer than the timeout, then nothing
            p.announce(0, 7, total)
            end = time.monotonic() + IDLE * 1.2
            while time.monotonic() < end:
                p.send(bytes(1024))
                time.sleep(IDLE / 5)

        behaviours = {"mid-frame": mid_frame, "between-frames": between_frames, "trickle": trickle}
        threads = [threading.Thread(target=behaviours[n], args=(p,)) for n, p in peers.items()]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        failed_after = {}
        errors = {}
        for name, h in handles.items():
            with pytest.raises(PeerLost) as info:
                h.wait(IDLE * 4)
            failed_after[name] = h.completed_at - peers[name].last_byte_at
            errors[name] = str(info.value)
        for p in peers.values():
            p.close()
        for ch in channels.values():
            ch.close(timeout=1)
    for name, elapsed in failed_after.items():
        assert IDLE - 0.15 <= elapsed <= IDLE + 1.0, (name, elapsed, errors[name])
        assert f"no data for {IDLE:g} s (idle timeout)" in errors[name], errors[name]
        assert "recv of transfer 0 (tag 7 #0, uint8[4194304], 4.0 MiB" in errors[name]
    # Where the peer stopped is named: inside a frame, how much of it had arrived.
    assert f"{MiB // 4} of {MiB} bytes of a frame read" in errors["mid-frame"]
    assert "1.0 MiB of 4.0 MiB received" in errors["between-frames"]
    assert "bytes of a frame read" not in errors["between-frames"]


def test_receive_buffer_of_a_peer_gone_mid_transfer_is_freed_when_the_receive_fails() -> None:
    cfg = TransportConfig(secret=SECRET, idle_timeout_s=10)
    with listen("127.0.0.1", 0, cfg) as lst, no_gc():
        peer = RawPeer(lst.port).connect()
        ch = _accept(lst, [peer])[peer.cid]
        h = ch.irecv(3)
        peer.announce(0, 3, 64 * MiB)
        peer.send(bytes(MiB))  # the first chunk lands
        _wait_for(lambda: ch.bytes_received == MiB, "the first chunk to land")
        assert ch.held_bytes() == 64 * MiB
        buffer = weakref.ref(ch._rx.active[0].owner.dest.buffer)
        peer.reset()
        with pytest.raises(PeerLost) as info:
            h.wait(10)
        assert buffer() is None, "the 64 MiB receive buffer outlived the failed transfer"
        assert ch.held_bytes() == 0
        ch.close(timeout=1)
    msg = str(info.value)
    assert "recv of transfer 0 (tag 3 #0, uint8[67108864], 64.0 MiB, 1.0 MiB of 64.0 MiB received)" in msg
    assert "lost all 1 streams (stream 0: " in msg


def test_announced_but_never_sent_transfer_is_freed_when_the_channel_fails() -> None:
    """No receive posted: the buffer the announcement made the channel allocate is
    freed as soon as the peer is declared gone, while the channel object lives on."""
    cfg = TransportConfig(secret=SECRET, idle_timeout_s=IDLE)
    with listen("127.0.0.1", 0, cfg) as lst, no_gc():
        peer = RawPeer(lst.port).connect()
        ch = _accept(lst, [peer])[peer.cid]
        peer.announce(0, 9, 32 * MiB)  # the description arrives, not one payload byte
        _wait_for(lambda: ch.held_bytes() == 32 * MiB, "the announcement to arrive")
        buffer = weakref.ref(ch._rx.active[0].owner.dest.buffer)
        _wait_for(lambda: ch.error is not None, "the idle timeout", timeout=IDLE + 2)
        assert buffer() is None, "the announced 32 MiB outlived the channel's failure"
        assert ch.held_bytes() == 0
        assert isinstance(ch.error, PeerLost) and "idle timeout" in str(ch.error)
        with pytest.raises(PeerLost, match=rf"channel {ch.name} to 127.0.0.1:\d+ lost all 1 streams \(stream 0: "
                                           r"no data for 1.5 s \(idle timeout\)"):
            ch.recv(9, timeout=1)  # nothing half-received is handed out afterwards
        peer.close()
        ch.close(timeout=1)


def test_send_staging_copy_is_freed_when_the_peer_vanishes() -> None:
    """A non-contiguous tensor is sent from a contiguous copy the channel owns; that
    copy goes when the send fails, not when the collector runs."""
    cfg = TransportConfig(secret=SECRET, idle_timeout_s=10, sndbuf=1 << 16)
    with listen("127.0.0.1", 0, cfg) as lst, no_gc():
        peer = RawPeer(lst.port).connect()
        ch = _accept(lst, [peer])[peer.cid]
        x = torch.zeros(4096, 8192, dtype=torch.uint8).t()  # 32 MiB, not contiguous
        h = ch.isend(x, 5)
        staging = weakref.ref(ch._sendq.inflight[0].keepalive)
        assert staging() is not None and staging().data_ptr() != x.data_ptr()
        peer.sock.recv(1 << 16)  # some of it arrived; the rest waits in the kernel
        peer.reset()
        with pytest.raises(PeerLost) as info:
            h.wait(10)
        assert staging() is None, "the 32 MiB staging copy outlived the failed send"
        ch.close(timeout=1)
    assert "send of transfer 0 (tag 5 #0, uint8[8192, 4096], 32.0 MiB) to 127.0.0.1:" in str(info.value)


def test_drop_stream_cuts_one_stream_and_the_transfer_completes_on_the_rest(caplog) -> None:
    cfg = TransportConfig(streams=3, secret=SECRET, chunk_bytes=MiB, pacing_rate_mbps=300, idle_timeout_s=10)
    x = torch.randint(0, 2**31 - 1, (12 << 20,), dtype=torch.int32)  # 48 MiB: ~0.45 s at 3 x 300 Mbit/s
    with loopback_pair(cfg) as (a, b):
        dest = torch.zeros_like(x)
        r = b.irecv(3, into=dest)
        s = a.isend(x, 3)
        _wait_for(lambda: b.bytes_received >= 4 * MiB, "4 MiB to arrive")
        assert not r.done()
        assert b.drop_stream(1, reason="fault test") is True
        assert b.drop_stream(1) is False  # already down: nothing to do
        assert r.wait(30) is dest and s.wait(30) is None
        assert torch.equal(dest, x)
        assert a.alive_streams == 2 and b.alive_streams == 2
        assert a.chunks_resent > 0  # stream 1's unconfirmed chunks went out again
        a.send(torch.arange(10), 4)  # the channel goes on with two streams
        assert torch.equal(b.recv(4, timeout=10), torch.arange(10))
        with pytest.raises(ValueError, match=rf"drop_stream\(3\): channel {b.name} to 127.0.0.1:\d+ has streams 0..2"):
            b.drop_stream(3)
        with pytest.raises(ValueError, match="has streams 0..2"):
            b.drop_stream(True)
        # Dropping every stream is losing the peer.
        h = b.irecv(5)
        b.drop_stream(0, reason="fault test")
        b.drop_stream(2, reason="fault test")
        with pytest.raises(PeerLost) as info:
            h.wait(5)
    assert "stream 1 of 3 down: dropped locally: fault test" in caplog.text
    msg = str(info.value)
    assert "lost all 3 streams (stream 0: dropped locally: fault test; stream 1: dropped locally: fault test; " \
           "stream 2: dropped locally: fault test)" in msg


def test_refused_receive_allocates_nothing_and_the_channel_goes_on() -> None:
    """A receive into a tensor of the wrong size fails with the reason; its bytes are
    read off the wire and discarded, nothing is allocated for them."""
    cfg = TransportConfig(streams=2, secret=SECRET, idle_timeout_s=10, pacing_rate_mbps=400)
    with loopback_pair(cfg) as (a, b):
        wrong = torch.empty(10, dtype=torch.uint8)
        h = b.irecv(1, into=wrong)
        s = a.isend(torch.ones(32 * MiB, dtype=torch.uint8), 1)  # ~0.35 s at 2 x 400 Mbit/s
        with pytest.raises(TransportError, match=r"cannot receive into the given tensor: the transfer carries "
                                            r"uint8\[33554432\], the destination is uint8\[10\]"):
            h.wait(10)
        held = []
        while not s.done():
            held.append(b.held_bytes())
            time.sleep(0.01)
        assert s.wait(10) is None and max(held, default=0) == 0
        a.send(torch.arange(4), 2)
        assert torch.equal(b.recv(2, timeout=10), torch.arange(4))


def test_closed_channel_holds_nothing_but_unclaimed_complete_tensors() -> None:
    cfg = TransportConfig(streams=2, secret=SECRET, idle_timeout_s=10)
    with loopback_pair(cfg) as (a, b):
        a.send(torch.ones(MiB, dtype=torch.uint8), 1)
        assert b.held_bytes() == MiB  # complete, nobody asked for it yet
        a.close()
        _wait_for(lambda: b.error is not None, "the peer's close")
        assert isinstance(b.error, ChannelClosed) and b.held_bytes() == MiB
        assert torch.equal(b.recv(1, timeout=5), torch.ones(MiB, dtype=torch.uint8))
        assert b.held_bytes() == 0


def _wait_for(cond, what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(0.005)
