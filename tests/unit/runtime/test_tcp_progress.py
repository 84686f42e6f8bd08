"""Byte counts of a channel's TCP streams (testbed_runtime/tcp_progress.py)."""

from __future__ import annotations

import socket

import pytest

from testbed_runtime.tcp_progress import TcpProgressError, TcpReceived, channel_inodes

TABLE = [
    "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode",
    # listening socket on 7000: not established
    "   0: 00000000:1B58 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 100 1",
    # accepted on 7000 from 10.0.1.10 (two streams)
    "   1: 0A02000A:1B58 0A01000A:C001 01 00000000:00000000 00:00000000 00000000     0        0 201 1",
    "   2: 0A02000A:1B58 0A01000A:C002 01 00000000:00000000 00:00000000 00000000     0        0 202 1",
    # accepted on 7000 from another peer
    "   3: 0A02000A:1B58 0B01000A:C003 01 00000000:00000000 00:00000000 00000000     0        0 203 1",
    # connected to 10.0.1.10:7001
    "   4: 0A02000A:D000 0A01000A:1B59 01 00000000:00000000 00:00000000 00000000     0        0 301 1",
    # closing connection to the same peer and port: not established
    "   5: 0A02000A:D001 0A01000A:1B59 06 00000000:00000000 00:00000000 00000000     0        0 302 1",
]


def test_channel_sockets_are_matched_by_peer_port_and_role() -> None:
    assert channel_inodes("10.0.1.10", 7000, "listen", TABLE) == {201, 202}
    assert channel_inodes("10.0.1.10", 7001, "connect", TABLE) == {301}
    assert channel_inodes("10.0.1.10", 7001, "listen", TABLE) == set()
    with pytest.raises(TcpProgressError, match="neither 'connect' nor 'listen'"):
        channel_inodes("10.0.1.10", 7000, "accept", TABLE)


def test_received_bytes_of_real_loopback_streams() -> None:
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()
    port = srv.getsockname()[1]
    clients = [socket.create_connection(("127.0.0.1", port)) for _ in range(2)]
    accepted = [srv.accept()[0] for _ in range(2)]
    try:
        counter = TcpReceived.for_channel("127.0.0.1", port, "listen", streams=2)
        assert counter.streams == 2
        before = counter.total()
        clients[0].sendall(b"a" * 300_000)
        clients[1].sendall(b"b" * 200_000)
        for s, n in zip(accepted, (300_000, 200_000), strict=True):
            got = 0
            while got < n:
                got += len(s.recv(1 << 20))
        assert counter.total() - before == 500_000
        # the connecting side counts what it receives, not what it sends
        back = TcpReceived.for_channel("127.0.0.1", port, "connect", streams=2)
        assert back.total() == 0
        counter.close()
        back.close()
        with pytest.raises(TcpProgressError, match="found 2 of the channel's 3 TCP streams"):
            TcpReceived.for_channel("127.0.0.1", port, "listen", streams=3)
    finally:
        for s in clients + accepted + [srv]:
            s.close()
