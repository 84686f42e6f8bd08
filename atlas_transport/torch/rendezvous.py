"""Rendezvous through the process group's store: which address this rank listens
on, the group's stream secret, and where each peer's listener is.

Every group gets its own store (torch prefixes it with the group's name), so the
keys below are unique to the group."""

from __future__ import annotations

import os
import secrets
import socket
from dataclasses import dataclass

from ..config import SECRET_ENV

SECRET_KEY = "atlas/secret"


def addr_key(rank: int) -> str:
    return f"atlas/addr/{rank}"


@dataclass(frozen=True)
class PeerAddress:
    """Where a rank's atlas listener and its RTT ping socket are."""

    host: str
    port: int
    ping_port: int

    def encode(self) -> str:
        return f"{self.host}|{self.port}|{self.ping_port}"

    @classmethod
    def decode(cls, raw: bytes | str, rank: int) -> PeerAddress:
        text = raw.decode() if isinstance(raw, bytes) else raw
        parts = text.split("|")
        if len(parts) != 3 or not parts[1].isdigit() or not parts[2].isdigit():
            raise ValueError(f"store key {addr_key(rank)!r} holds {text!r}, not host|port|ping_port: "
                             "is another program sharing this store?")
        return cls(parts[0], int(parts[1]), int(parts[2]))


def _store_host(store: object) -> str | None:
    """The host of the TCPStore under (prefix) stores, if there is one."""
    for _ in range(16):
        host = getattr(store, "host", None)
        if isinstance(host, str) and host:
            return host
        store = getattr(store, "underlying_store", None)
        if store is None:
            return None
    return None


def route_source(target: str) -> str | None:
    """The local address the kernel would use to reach `target` (UDP connect, no
    packet is sent), or None when there is no route or `target` does not resolve."""
    try:
        infos = socket.getaddrinfo(target, 9, socket.AF_INET, socket.SOCK_DGRAM)
    except OSError:
        return None
    for family, kind, proto, _, addr in infos:
        with socket.socket(family, kind, proto) as s:
            try:
                s.connect(addr)
                return s.getsockname()[0]
            except OSError:
                continue
    return None


def own_address(bind_addr: str | None, store: object = None, env: dict[str, str] | None = None) -> str:
    """ATLAS_BIND_ADDR / AtlasOptions.bind_addr if set; else the local address that
    routes to the store's host (MASTER_ADDR); else the loopback."""
    if bind_addr:
        return bind_addr
    env = dict(os.environ) if env is None else env
    for target in (_store_host(store), env.get("MASTER_ADDR")):
        if target:
            src = route_source(target)
            if src:
                return src
    return "127.0.0.1"


def group_secret(store, rank: int) -> str:
    """ATLAS_SECRET when set (every rank must set the same); else a random secret
    rank 0 writes to the group's store and the others read from it."""
    if rank == 0:  # always written, so a rank without ATLAS_SECRET never waits for it
        store.set(SECRET_KEY, secrets.token_hex(16))
    env = os.environ.get(SECRET_ENV)
    if env:
        return env
    return store.get(SECRET_KEY).decode()
