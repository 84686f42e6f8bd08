"""Opening channels: `listen()` / `Listener.accept()` on one side, `connect()` on the other
(the streams themselves are opened by `connector.open_channel`).

The connector opens the N streams of a channel in parallel, each with its own
handshake; the listener authenticates each stream, groups streams by channel id and
hands out a `Channel` once all N have arrived. Streams of a channel that never
completes are dropped after `connect_timeout_s`. Probe channels (opened by the
"auto" stream-count prober) are answered by the listener itself.
"""

from __future__ import annotations

import logging
import queue
import socket
import threading
import time
from dataclasses import dataclass, field

from .auto import streams_for
from .channel import Channel
from .config import TransportConfig
from .connector import open_channel
from .errors import (
    ChannelClosed,
    ConfigError,
    ConnectError,
    TransportError,
)
from .handshake import server_handshake
from .sockets import tune

log = logging.getLogger("atlas_transport")


@dataclass
class _Partial:
    count: int
    probe: bool
    host: str
    first_seen: float
    socks: dict[int, socket.socket] = field(default_factory=dict)


class Listener:
    """Accepts channels on one TCP port. Use as a context manager or call close()."""

    def __init__(self, host: str, port: int, cfg: TransportConfig) -> None:
        self.cfg = cfg
        self._secret = cfg.resolved_secret()
        infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        family, kind, proto, _, addr = infos[0]
        self._sock = socket.socket(family, kind, proto)
        try:
            self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            tune(self._sock, cfg)  # buffer sizes are inherited by accepted sockets
            self._sock.bind(addr)
            self._sock.listen(256)
        except OSError as exc:
            self._sock.close()
            raise ConnectError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
        except ConfigError:
            self._sock.close()
            raise
        self.host = host
        self.port: int = self._sock.getsockname()[1]
        self._ready: queue.Queue[Channel | None] = queue.Queue()
        self._partial: dict[bytes, _Partial] = {}
        self._lock = threading.Lock()
        self._closed = False
        self._thread = threading.Thread(target=self._accept_loop, name=f"atlas-listen-{self.port}", daemon=True)
        self._thread.start()

    def accept(self, timeout: float | None = None) -> Channel:
        """The next complete channel; TimeoutError if none arrives within `timeout`."""
        if self._closed:
            raise ChannelClosed(f"listener on port {self.port} is closed")
        try:
            ch = self._ready.get(timeout=timeout)
        except queue.Empty:
            raise TimeoutError(f"no channel arrived on port {self.port} within {timeout:g} s") from None
        if ch is None:
            raise ChannelClosed(f"listener on port {self.port} is closed")
        return ch

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._thread.join(2.0)
        self._sock.close()
        with self._lock:
            partial = list(self._partial.values())
            self._partial.clear()
        for p in partial:
            for s in p.socks.values():
                s.close()
        while True:  # channels nobody accepted
            try:
                ch = self._ready.get_nowait()
            except queue.Empty:
                break
            if ch is not None:
                ch.close(timeout=1.0)
        self._ready.put(None)

    def __enter__(self) -> Listener:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _accept_loop(self) -> None:
        self._sock.settimeout(0.5)
        while not self._closed:
            try:
                conn, addr = self._sock.accept()
            except TimeoutError:
                self._sweep()
                continue
            except OSError:
                if self._closed:
                    return
                time.sleep(0.05)
                continue
            threading.Thread(target=self._handshake, args=(conn, addr), daemon=True,
                             name=f"atlas-hs-{addr[1]}").start()

    def _handshake(self, conn: socket.socket, addr: tuple) -> None:
        peer = f"{addr[0]}:{addr[1]}"
        deadline = time.monotonic() + self.cfg.connect_timeout_s
        try:
            tune(conn, self.cfg, before_connect=False)
            hello = server_handshake(conn, self._secret, deadline, peer)
        except (TransportError, ConfigError, OSError) as exc:
            log.warning("listener on port %d refused a connection from %s: %s", self.port, peer, exc)
            conn.close()
            return
        done = None
        with self._lock:
            p = self._partial.get(hello.channel_id)
            if p is None:
                p = _Partial(hello.stream_count, hello.probe, addr[0], time.monotonic())
                self._partial[hello.channel_id] = p
            problem = None
            if p.count != hello.stream_count or p.probe != hello.probe:
                problem = f"announces {hello.stream_count} streams, the channel's first stream said {p.count}"
            elif p.host != addr[0]:
                problem = f"comes from {addr[0]}, the channel's first stream from {p.host}"
            elif hello.stream_index in p.socks:
                problem = f"repeats stream index {hello.stream_index}"
            if problem is None:
                p.socks[hello.stream_index] = conn
                if len(p.socks) == p.count:
                    done = self._partial.pop(hello.channel_id)
        if problem is not None:
            log.warning("listener on port %d dropped a stream from %s: it %s", self.port, peer, problem)
            conn.close()
            return
        if done is None:
            return
        socks = [done.socks[i] for i in range(done.count)]
        try:
            ch = Channel(socks, self.cfg, hello.channel_id, f"{done.host}:{socks[0].getpeername()[1]}",
                         probe=done.probe)
        except OSError as exc:  # a stream died between its handshake and now
            log.warning("listener on port %d dropped channel %s from %s: %s", self.port,
                        hello.channel_id.hex()[:8], done.host, exc)
            for s in socks:
                s.close()
            return
        if done.probe:
            from .auto import serve_probe

            threading.Thread(target=serve_probe, args=(ch,), daemon=True, name=f"atlas-probe-{ch.name}").start()
        elif self._closed:
            ch.close(timeout=1.0)
        else:
            self._ready.put(ch)

    def _sweep(self) -> None:
        now = time.monotonic()
        with self._lock:
            stale = [(cid, p) for cid, p in self._partial.items() if now - p.first_seen > self.cfg.connect_timeout_s]
            for cid, _ in stale:
                del self._partial[cid]
        for cid, p in stale:
            log.warning("listener on port %d dropped channel %s from %s: only %d of %d streams arrived within %g s",
                        self.port, cid.hex()[:8], p.host, len(p.socks), p.count, self.cfg.connect_timeout_s)
            for s in p.socks.values():
                s.close()


def listen(host: str, port: int, cfg: TransportConfig | None = None) -> Listener:
    """Listen for channels on host:port (port 0 picks a free one: see `.port`)."""
    return Listener(host, port, cfg or TransportConfig())


def connect(host: str, port: int, cfg: TransportConfig | None = None) -> Channel:
    """Open a channel to a listener. With streams="auto" the stream count is probed
    once per (host, port) and remembered (see `atlas_transport.auto`)."""
    cfg = cfg or TransportConfig()
    cfg.resolved_secret()
    n = cfg.streams
    if n == "auto":
        n = streams_for(host, port, cfg)
    return open_channel(host, port, cfg, n)
