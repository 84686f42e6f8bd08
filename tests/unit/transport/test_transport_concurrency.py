"""Several transfers in flight on one channel, tags keeping them apart, and chunks
arriving in any order on any stream (driven by a hand-written peer)."""

from __future__ import annotations

import os
import selectors
import socket
import threading
import time

import pytest
import torch

from atlas_transport import TransportConfig, TransportError, listen
from atlas_transport import protocol as P
from atlas_transport.handshake import client_handshake
from atlas_transport.loopback import loopback_pair

CFG = TransportConfig(streams=4, secret="unit-test", chunk_bytes=64 << 10, connect_timeout_s=5, idle_timeout_s=10)


def test_concurrent_tags_both_directions() -> None:
    with loopback_pair(CFG) as (a, b):
        xs = {tag: torch.randn(1000 * (tag + 1)) for tag in range(8)}
        early = {tag: b.irecv(tag) for tag in range(0, 8, 2)}  # half posted before sending
        sends = [a.isend(x, tag) for tag, x in xs.items()]
        back = b.isend(torch.arange(5000), 99)  # traffic the other way at the same time
        late = {tag: b.irecv(tag) for tag in range(1, 8, 2)}
        for tag, h in {**early, **late}.items():
            assert torch.equal(h.wait(10), xs[tag]), tag
        assert torch.equal(a.recv(99, timeout=10), torch.arange(5000))
        for s in sends + [back]:
            s.wait(10)


def test_same_tag_keeps_send_order_across_streams() -> None:
    with loopback_pair(CFG) as (a, b):
        # A big transfer then small ones on one tag: the small ones finish first on
        # the wire, yet recv(tag) returns them in the order they were sent.
        sizes = [3 << 20, 10, 20000, 1, 0]
        for i, n in enumerate(sizes):
            a.isend(torch.full((n,), float(i)), 7)
        got = [b.recv(7, timeout=10) for _ in sizes]
        assert [t.numel() for t in got] == sizes
        assert all(bool((t == i).all()) for i, t in enumerate(got))


def test_many_threads_share_a_channel() -> None:
    with loopback_pair(CFG) as (a, b):
        errors = []

        def worker(tag: int) -> None:
            try:
                for k in range(5):
                    x = torch.full((777 * (k + 1),), tag * 10 + k, dtype=torch.int64)
                    a.send(x, tag)
                    y = b.recv(tag, timeout=10)
                    assert torch.equal(x, y)
            except Exception as exc:  # pragma: no cover - reported below
                errors.append(exc)

        threads = [threading.Thread(target=worker, args=(t,)) for t in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert not errors


class RawPeer:
    """A connector speaking the protocol by hand, to put chunks on the wire in an
    order the real sender would rarely produce."""

    def __init__(self, port: int, streams: int, secret: bytes = b"unit-test") -> None:
        self.cid = os.urandom(16)
        self.socks = []
        for i in range(streams):
            s = socket.create_connection(("127.0.0.1", port), timeout=5)
            hello = P.Hello(P.VERSION, 0, i, streams, self.cid, os.urandom(16))
            client_handshake(s, secret, hello, time.monotonic() + 5, "test")
            s.settimeout(5)
            self.socks.append(s)

    def send(self, stream: int, data: bytes) -> None:
        self.socks[stream].sendall(data)

    def wait_for(self, kind: int, tid: int, timeout: float = 5.0) -> int:
        """Read control frames from all streams until `kind` for `tid`; returns the stream."""
        decoders = [P.Decoder() for _ in self.socks]
        deadline = time.monotonic() + timeout
        with selectors.DefaultSelector() as sel:
            for i, s in enumerate(self.socks):
                sel.register(s, selectors.EVENT_READ, i)
            while time.monotonic() < deadline:
                for key, _ in sel.select(0.1):
                    i = key.data
                    for f in decoders[i].feed(self.socks[i].recv(65536)):
                        if f.header.type == kind and f.header.tid == tid:
                            return i
        raise AssertionError(f"no {P.FRAME_NAMES[kind]} for transfer {tid} within {timeout} s")

    def close(self) -> None:
        for s in self.socks:
            s.close()


def _chunks(x: torch.Tensor, tid: int, tag: int, chunk: int):
    raw = x.numpy().tobytes()
    m = P.make_meta(tag, 0, "float32", tuple(x.shape), chunk)
    return m, [(off, raw[off:off + m.chunk_length(off)]) for off in range(0, m.total_bytes, chunk)]


@pytest.fixture()
def accepted():
    with listen("127.0.0.1", 0, CFG) as lst:
        box = {}
        t = threading.Thread(target=lambda: box.setdefault("ch", lst.accept(timeout=5)))
        t.start()
        peer = RawPeer(lst.port, 3)
        t.join()
        try:
            yield peer, box["ch"]
        finally:
            peer.close()
            box["ch"].close(timeout=1)


def test_out_of_order_chunks_and_duplicates_assemble(accepted) -> None:
    peer, ch = accepted
    x = torch.randn(10 * 1024 + 7)  # 40988 bytes: chunks of 4096 -> 11 chunks
    m, chunks = _chunks(x, 0, tag=5, chunk=4096)
    h = ch.irecv(5)
    order = list(reversed(range(len(chunks))))  # last chunk first
    seen_on = set()
    for k, i in enumerate(order):
        stream = k % 3
        off, data = chunks[i]
        first = stream not in seen_on
        seen_on.add(stream)
        peer.send(stream, P.encode_data_header(0, off, len(data), m if first else None) + data)
        if k == 3:  # a re-sent duplicate on another stream, mid-transfer
            o2, d2 = chunks[order[0]]
            peer.send(2, P.encode_data_header(0, o2, len(d2)) + d2)
    assert torch.equal(h.wait(10), x)
    peer.wait_for(P.DONE, 0)
    # A late duplicate after completion is dropped, and a QUERY is answered.
    off, data = chunks[0]
    peer.send(1, P.encode_data_header(0, off, len(data)) + data + P.encode_control(P.QUERY, 0))
    peer.wait_for(P.DONE, 0)
    assert ch.alive_streams == 3


def test_garbage_frame_closes_that_stream_only(accepted, caplog) -> None:
    peer, ch = accepted
    peer.send(1, P.encode_data_header(0, 0, 1 << 30))  # absurd chunk length
    deadline = time.monotonic() + 5
    while ch.alive_streams == 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert ch.alive_streams == 2
    assert "protocol error: DATA frame announces a chunk of 1073741824 bytes" in caplog.text
    x = torch.arange(100, dtype=torch.float32)
    m, chunks = _chunks(x, 1, tag=1, chunk=4096)
    peer.send(0, P.encode_data_header(1, 0, 400, m) + chunks[0][1])
    assert torch.equal(ch.recv(1, timeout=5), x)


def test_malformed_bytes_on_every_stream_fail_pending_receives(accepted) -> None:
    peer, ch = accepted
    h = ch.irecv(3)
    bad_meta = bytearray(P.encode_data_header(0, 0, 16, P.make_meta(3, 0, "float32", (4,), 4096)))
    bad_meta[P.HEADER_SIZE + 28] = 250  # unknown dtype code
    for s in range(3):
        peer.send(s, bytes(bad_meta))
    with pytest.raises(TransportError) as info:
        h.wait(5)
    msg = str(info.value)
    assert "recv of transfer (none matched yet) (tag 3 #0)" in msg
    assert "lost all 3 streams" in msg and "protocol error: unknown dtype code 250" in msg
