"""The per-stream handshake on a socket (the byte layout lives in protocol.py).

The connector names the channel and stream; the listener challenges it with a nonce;
each side proves it holds the shared secret with an HMAC; a wrong version or secret
is refused with a readable reason before any tensor byte is accepted.
"""

from __future__ import annotations

import os
import socket
import time

from . import protocol as P
from .errors import AuthenticationError, ConnectError, ProtocolError


def _read(sock: socket.socket, n: int, deadline: float, peer: str) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise ConnectError(f"handshake with {peer} timed out")
        sock.settimeout(remaining)
        try:
            part = sock.recv(n - len(buf))
        except TimeoutError:
            raise ConnectError(f"handshake with {peer} timed out") from None
        except OSError as exc:
            raise ConnectError(f"handshake with {peer} failed: {exc.strerror or exc}") from None
        if not part:
            raise ConnectError(f"{peer} closed the connection during the handshake")
        buf += part
    return bytes(buf)


def _send(sock: socket.socket, data: bytes, deadline: float, peer: str) -> None:
    sock.settimeout(max(0.001, deadline - time.monotonic()))
    try:
        sock.sendall(data)
    except TimeoutError:
        raise ConnectError(f"handshake with {peer} timed out") from None
    except OSError as exc:
        raise ConnectError(f"handshake with {peer} failed: {exc.strerror or exc}") from None


def client_handshake(sock: socket.socket, secret: bytes, hello: P.Hello, deadline: float, peer: str) -> None:
    """Run the connector side; raises AuthenticationError/ProtocolError/ConnectError."""
    hello_b = P.encode_hello(hello)
    _send(sock, hello_b, deadline, peer)
    ch = P.decode_challenge(_read(sock, P.CHALLENGE_SIZE, deadline, peer))
    reason = P.decode_reason(_read(sock, ch.reason_length, deadline, peer))
    if ch.status != P.STATUS_OK:
        raise ProtocolError(f"listener {peer} refused the channel ({P.status_name(ch.status)}): {reason}")
    auth = P.client_mac(secret, hello_b, ch.nonce)
    _send(sock, auth, deadline, peer)
    res = P.decode_result(_read(sock, P.RESULT_SIZE, deadline, peer))
    reason = P.decode_reason(_read(sock, res.reason_length, deadline, peer))
    if res.status == P.STATUS_AUTH_FAILED:
        raise AuthenticationError(
            f"listener {peer} refused our credentials ({reason}): both endpoints need the same "
            "secret (TransportConfig.secret or the ATLAS_SECRET environment variable)"
        )
    if res.status != P.STATUS_OK:
        raise ProtocolError(f"listener {peer} refused the channel ({P.status_name(res.status)}): {reason}")
    P.verify_mac(P.server_mac(secret, hello_b, ch.nonce, auth), res.mac, f"listener {peer}")


def server_handshake(sock: socket.socket, secret: bytes, deadline: float, peer: str) -> P.Hello:
    """Run the listener side; returns the connector's HELLO once it is authenticated."""
    hello_b = _read(sock, P.HELLO_SIZE, deadline, peer)
    try:
        hello = P.decode_hello(hello_b)
    except ProtocolError as exc:
        if hello_b.startswith(P.MAGIC):
            _send(sock, P.encode_challenge(P.STATUS_BAD_REQUEST, bytes(16), str(exc)), deadline, peer)
        raise
    if hello.version != P.VERSION:
        reason = (f"this listener speaks Atlas protocol version {P.VERSION}, the connector sent "
                  f"version {hello.version}; run the same atlas_transport on both ends")
        _send(sock, P.encode_challenge(P.STATUS_BAD_VERSION, bytes(16), reason), deadline, peer)
        raise ProtocolError(f"connector {peer}: {reason}")
    nonce = os.urandom(P.NONCE_BYTES)
    _send(sock, P.encode_challenge(P.STATUS_OK, nonce), deadline, peer)
    auth = _read(sock, P.AUTH_SIZE, deadline, peer)
    try:
        P.verify_mac(P.client_mac(secret, hello_b, nonce), auth, f"connector {peer}")
    except AuthenticationError:
        _send(sock, P.encode_result(P.STATUS_AUTH_FAILED, bytes(32), "wrong shared secret"), deadline, peer)
        raise
    _send(sock, P.encode_result(P.STATUS_OK, P.server_mac(secret, hello_b, nonce, auth)), deadline, peer)
    return hello
