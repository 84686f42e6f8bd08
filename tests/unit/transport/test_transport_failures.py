"""Failures surface in bounded time with the peer and transfer named; a cut stream's
chunks are re-sent on the survivors."""

from __future__ import annotations

import os
import signal
import socket
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
import torch
import zygote  # tests/zygote.py: the peers forked from a process that imported torch once

from atlas_transport import ChannelClosed, PeerLost, TransportConfig, TransportError, listen
from atlas_transport.loopback import loopback_pair

SECRET = "failure-tests"

PEER = textwrap.dedent("""
    import sys, time, torch
    from atlas_transport import TransportConfig, connect
    role, port = sys.argv[1], int(sys.argv[2])
    cfg = TransportConfig(streams=2, secret="{secret}", idle_timeout_s=30, pacing_rate_mbps=float(sys.argv[3]))
    ch = connect("127.0.0.1", port, cfg)
    print("connected", flush=True)
    if role == "send":
        ch.send(torch.ones(32 << 20, dtype=torch.uint8), 1)
    time.sleep(60)
""").replace("{secret}", SECRET)


def spawn_peer(script: Path, env: dict[str, str], role: str, port: int, pacing_mbps: float = 10000) -> Any:
    """The peer process, forked from the test zygote (tests/zygote.py: torch imported once)."""
    return zygote.popen([str(script), role, str(port), str(pacing_mbps)], env)


@pytest.fixture()
def peer_factory(child_env: dict[str, str], tmp_path: Path):
    procs = []
    script = tmp_path / "peer.py"
    script.write_text(PEER)

    def make(*args, **kw):
        p = spawn_peer(script, child_env, *args, **kw)
        procs.append(p)
        return p

    yield make
    for p in procs:
        if p.poll() is None:
            os.kill(p.pid, signal.SIGCONT)
            p.kill()
        p.wait(10)


def _accept(lst, proc) -> object:
    try:
        return lst.accept(timeout=30)
    except TimeoutError:
        proc.kill()
        raise AssertionError(f"peer never connected: {proc.communicate()[1][-2000:]}") from None


def test_receiver_killed_mid_transfer_fails_the_send_quickly(peer_factory) -> None:
    cfg = TransportConfig(secret=SECRET, idle_timeout_s=30, pacing_rate_mbps=100)  # ~2.7 s for 32 MiB
    with listen("127.0.0.1", 0, cfg) as lst:
        proc = peer_factory("recv", lst.port)
        with _accept(lst, proc) as ch:
            h = ch.isend(torch.zeros(32 << 20, dtype=torch.uint8), 1)
            time.sleep(0.5)
            assert not h.done()
            proc.kill()
            t0 = time.monotonic()
            with pytest.raises(PeerLost) as info:
                h.wait(20)
            assert time.monotonic() - t0 < 5  # a reset arrives at once; idle timeout is 30 s
    msg = str(info.value)
    assert "send of transfer 0 (tag 1 #0, uint8[33554432], 32.0 MiB) to 127.0.0.1:" in msg
    assert "lost all 2 streams" in msg


def test_sender_killed_mid_transfer_fails_the_receive_quickly(peer_factory) -> None:
    cfg = TransportConfig(secret=SECRET, idle_timeout_s=30)
    with listen("127.0.0.1", 0, cfg) as lst:
        proc = peer_factory("send", lst.port, pacing_mbps=50)  # 2 x 50 Mbit/s: ~2.7 s
        with _accept(lst, proc) as ch:
            h = ch.irecv(1)
            deadline = time.monotonic() + 20
            while ch.bytes_received < (1 << 20) and time.monotonic() < deadline:
                time.sleep(0.02)
            assert ch.bytes_received >= (1 << 20) and not h.done()
            proc.kill()
            t0 = time.monotonic()
            with pytest.raises(PeerLost) as info:
                h.wait(20)
            assert time.monotonic() - t0 < 5
            with pytest.raises(PeerLost):  # the channel stays failed
                ch.isend(torch.ones(1), 2)
    msg = str(info.value)
    assert "recv of transfer 0 (tag 1 #0, uint8[33554432], 32.0 MiB" in msg and "MiB of 32.0 MiB received" in msg
    assert "from 127.0.0.1:" in msg and "lost all 2 streams" in msg


def test_hung_peer_detected_within_idle_timeout(peer_factory) -> None:
    cfg = TransportConfig(secret=SECRET, idle_timeout_s=1.5, sndbuf=1 << 16)
    with listen("127.0.0.1", 0, cfg) as lst:
        proc = peer_factory("recv", lst.port)
        with _accept(lst, proc) as ch:
            os.kill(proc.pid, signal.SIGSTOP)  # alive for the kernel, silent for us
            t0 = time.monotonic()
            h = ch.isend(torch.zeros(64 << 20, dtype=torch.uint8), 1)
            with pytest.raises(PeerLost) as info:
                h.wait(20)
            elapsed = time.monotonic() - t0
            assert elapsed < 1.5 + 2.5, elapsed
    assert "idle timeout" in str(info.value)


def test_one_stream_cut_mid_transfer_completes_on_the_rest(caplog) -> None:
    cfg = TransportConfig(streams=3, secret=SECRET, chunk_bytes=1 << 20, pacing_rate_mbps=300, idle_timeout_s=10)
    x = torch.randint(0, 2**31 - 1, (12 << 20,), dtype=torch.int32)  # 48 MiB: ~0.45 s at 3 x 300 Mbit/s
    with loopback_pair(cfg) as (a, b):
        dest = torch.zeros_like(x)
        r = b.irecv(3, into=dest)
        s = a.isend(x, 3)
        deadline = time.monotonic() + 10
        while b.bytes_received < (4 << 20) and time.monotonic() < deadline:
            time.sleep(0.005)
        assert not r.done()
        b._streams[1].sock.shutdown(socket.SHUT_RDWR)  # cut one TCP connection
        assert r.wait(30) is dest and s.wait(30) is None
        assert torch.equal(dest, x)
        assert a.alive_streams == 2 and b.alive_streams == 2
        assert a.chunks_resent > 0  # stream 1's unconfirmed chunks went out again
        # The channel keeps working on the survivors.
        a.send(torch.arange(10), 4)
        assert torch.equal(b.recv(4, timeout=10), torch.arange(10))
    assert "stream 1 of 3 down" in caplog.text


def test_peer_close_fails_pending_receives_cleanly() -> None:
    cfg = TransportConfig(streams=2, secret=SECRET, idle_timeout_s=10)
    with loopback_pair(cfg) as (a, b):
        h = b.irecv(1)
        a.send(torch.ones(5), 2)  # delivered before the close: still receivable
        a.close()
        with pytest.raises(ChannelClosed, match=r"recv of transfer \(none matched yet\) \(tag 1 #0\) from .* failed: peer 127.0.0.1:\d+ closed channel"):
            h.wait(5)
        assert torch.equal(b.recv(2, timeout=5), torch.ones(5))
        with pytest.raises(ChannelClosed, match="closed"):
            b.recv(3, timeout=5)
        with pytest.raises(TransportError, match="closed locally"):
            a.isend(torch.ones(1), 1)


def test_close_waits_for_pending_sends() -> None:
    cfg = TransportConfig(streams=2, secret=SECRET, pacing_rate_mbps=200, idle_timeout_s=10)
    with loopback_pair(cfg) as (a, b):
        x = torch.ones(8 << 20, dtype=torch.uint8)  # ~0.17 s
        h = a.isend(x, 1)
        a.close()
        assert h.done() and h.wait(0) is None
        assert torch.equal(b.recv(1, timeout=5), x)
