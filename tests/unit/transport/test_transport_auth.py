"""Handshake: only peers holding the secret and speaking our version get a channel;
every refusal is readable on the connector and logged on the listener."""

from __future__ import annotations

import os
import socket
import struct
import threading
import time

import pytest
import torch

from atlas_transport import (
    AuthenticationError,
    ConnectError,
    ProtocolError,
    TransportConfig,
    connect,
    listen,
)
from atlas_transport import protocol as P

CFG = TransportConfig(streams=2, secret="right", connect_timeout_s=3, idle_timeout_s=10)


def _logged(caplog, text: str, timeout: float = 10.0) -> bool:
    """Whether `text` appears in the captured log within `timeout`: the listener logs from
    its own threads, possibly after the connector already has its answer."""
    deadline = time.monotonic() + timeout
    while text not in caplog.text and time.monotonic() < deadline:
        time.sleep(0.01)
    return text in caplog.text


def _accept_async(lst):
    box = {}

    def run():
        try:
            box["ch"] = lst.accept(timeout=5)
        except Exception as exc:
            box["err"] = exc

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, box


def test_wrong_secret_refused_and_logged(caplog) -> None:
    with listen("127.0.0.1", 0, CFG) as lst:
        with pytest.raises(AuthenticationError) as info:
            connect("127.0.0.1", lst.port, TransportConfig(streams=2, secret="wrong", connect_timeout_s=3))
        msg = str(info.value)
        assert f"listener 127.0.0.1:{lst.port} refused our credentials (wrong shared secret)" in msg
        assert "ATLAS_SECRET" in msg
        assert _logged(caplog, "failed the HMAC challenge: the shared secrets differ"), caplog.text
        assert "refused a connection from 127.0.0.1" in caplog.text
        with pytest.raises(TimeoutError, match=f"no channel arrived on port {lst.port} within 0.2 s"):
            lst.accept(timeout=0.2)
        # The listener still serves a peer with the right secret.
        t, box = _accept_async(lst)
        with connect("127.0.0.1", lst.port, CFG) as ch:
            t.join()
            with box["ch"] as other:
                ch.send(torch.ones(3), 0)
                assert torch.equal(other.recv(0, timeout=5), torch.ones(3))


def test_listener_without_the_secret_is_detected() -> None:
    """Mutual authentication: a listener that cannot prove the secret is refused too.
    Simulated with a fake listener that answers OK with a bogus proof."""
    srv = socket.create_server(("127.0.0.1", 0))
    port = srv.getsockname()[1]

    def fake() -> None:
        for _ in range(2):
            c, _ = srv.accept()
            c.recv(P.HELLO_SIZE)
            c.sendall(P.encode_challenge(P.STATUS_OK, os.urandom(16)))
            c.recv(P.AUTH_SIZE)
            c.sendall(P.encode_result(P.STATUS_OK, os.urandom(32)))

    threading.Thread(target=fake, daemon=True).start()
    with pytest.raises(AuthenticationError, match=f"listener 127.0.0.1:{port} failed the HMAC challenge"):
        connect("127.0.0.1", port, CFG)
    srv.close()


def test_wrong_version_refused_with_reason(caplog) -> None:
    with listen("127.0.0.1", 0, CFG) as lst:
        s = socket.create_connection(("127.0.0.1", lst.port), timeout=3)
        s.sendall(P.encode_hello(P.Hello(P.VERSION + 1, 0, 0, 1, os.urandom(16), os.urandom(16))))
        head = s.recv(P.CHALLENGE_SIZE, socket.MSG_WAITALL)
        ch = P.decode_challenge(head)
        reason = s.recv(ch.reason_length, socket.MSG_WAITALL).decode()
        assert ch.status == P.STATUS_BAD_VERSION
        assert f"speaks Atlas protocol version {P.VERSION}, the connector sent version {P.VERSION + 1}" in reason
        s.close()


def test_connector_reports_version_refusal() -> None:
    srv = socket.create_server(("127.0.0.1", 0))
    port = srv.getsockname()[1]

    def old_listener() -> None:
        c, _ = srv.accept()
        c.recv(P.HELLO_SIZE)
        c.sendall(struct.pack("!4sHHH16s", P.MAGIC, 2, P.STATUS_BAD_VERSION, 5, bytes(16)) + b"v2 only")
        time.sleep(0.5)

    threading.Thread(target=old_listener, daemon=True).start()
    with pytest.raises(ProtocolError, match=r"refused the channel \(unsupported protocol version\): v2 on"):
        connect("127.0.0.1", port, TransportConfig(streams=1, secret="x", connect_timeout_s=3))
    srv.close()


def test_garbage_connection_does_not_hurt_the_listener(caplog) -> None:
    with listen("127.0.0.1", 0, CFG) as lst:
        s = socket.create_connection(("127.0.0.1", lst.port))
        s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" + b"x" * 100)
        s.settimeout(3)
        try:
            assert s.recv(100) == b""  # closed without an answer...
        except ConnectionResetError:
            pass  # ...or reset, as our unread bytes were discarded
        s.close()
        assert "HELLO starts with b'GET ', not b'ATLS': the peer is not an Atlas transport endpoint" in caplog.text
        t, box = _accept_async(lst)
        with connect("127.0.0.1", lst.port, CFG):
            t.join()
            box["ch"].close()


def test_non_atlas_server_is_named() -> None:
    srv = socket.create_server(("127.0.0.1", 0))
    port = srv.getsockname()[1]

    def http() -> None:
        c, _ = srv.accept()
        c.recv(100)
        c.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n".ljust(P.CHALLENGE_SIZE, b" "))
        time.sleep(0.5)

    threading.Thread(target=http, daemon=True).start()
    with pytest.raises(ProtocolError, match="not an Atlas transport endpoint"):
        connect("127.0.0.1", port, TransportConfig(streams=1, secret="x", connect_timeout_s=3))
    srv.close()


def test_connect_refused_and_timeouts() -> None:
    free = socket.socket()
    free.bind(("127.0.0.1", 0))
    port = free.getsockname()[1]
    free.close()
    with pytest.raises(ConnectError, match=f"cannot connect to 127.0.0.1:{port}: Connection refused"):
        connect("127.0.0.1", port, CFG)
    silent = socket.create_server(("127.0.0.1", 0))  # accepts (backlog) but never answers
    t0 = time.monotonic()
    with pytest.raises(ConnectError, match="handshake with 127.0.0.1:.* timed out"):
        connect("127.0.0.1", silent.getsockname()[1], TransportConfig(streams=2, secret="x", connect_timeout_s=0.5))
    assert time.monotonic() - t0 < 3
    silent.close()


def test_incomplete_channel_dropped_after_connect_timeout(caplog) -> None:
    cfg = TransportConfig(streams=2, secret="right", connect_timeout_s=0.6)
    with listen("127.0.0.1", 0, cfg) as lst:
        s = socket.create_connection(("127.0.0.1", lst.port))
        from atlas_transport.handshake import client_handshake

        client_handshake(s, b"right", P.Hello(P.VERSION, 0, 0, 2, os.urandom(16), os.urandom(16)),
                         time.monotonic() + 3, "t")
        assert _logged(caplog, "only 1 of 2 streams arrived within 0.6 s"), caplog.text  # the listener's sweep
        s.settimeout(2)
        assert s.recv(10) == b""
        s.close()
