"""The connecting side of a channel: open its N streams in parallel, each with its own
handshake, and hand them to a `Channel` once all have been accepted.

Its own module so that both `endpoints.connect` and the "auto" stream-count prober
(`auto.probe_streams`) open channels the same way without importing each other.
"""

from __future__ import annotations

import os
import socket
import threading
import time

from . import protocol as P
from .channel import Channel
from .config import TransportConfig
from .errors import AuthenticationError, ConfigError, ConnectError, ProtocolError
from .handshake import client_handshake
from .sockets import open_stream

_ERROR_RANK = (AuthenticationError, ProtocolError, ConfigError, ConnectError)


def open_channel(host: str, port: int, cfg: TransportConfig, n: int, *, probe: bool = False) -> Channel:
    secret = cfg.resolved_secret()
    cid = os.urandom(P.CHANNEL_ID_BYTES)
    deadline = time.monotonic() + cfg.connect_timeout_s
    peer = f"{host}:{port}"
    socks: list[socket.socket | None] = [None] * n
    errors: list[Exception] = []

    def one(i: int) -> None:
        try:
            sock = open_stream(host, port, cfg, deadline)
        except Exception as exc:
            errors.append(exc)
            return
        try:
            hello = P.Hello(P.VERSION, P.FLAG_PROBE if probe else 0, i, n, cid, os.urandom(P.NONCE_BYTES))
            client_handshake(sock, secret, hello, deadline, peer)
            socks[i] = sock
        except Exception as exc:
            sock.close()
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(n)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    if errors:
        for s in socks:
            if s is not None:
                s.close()
        errors.sort(key=lambda e: next((k for k, cls in enumerate(_ERROR_RANK) if isinstance(e, cls)), 99))
        raise errors[0]
    return Channel(socks, cfg, cid, peer, probe=probe)  # type: ignore[arg-type]
