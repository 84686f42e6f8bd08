"""Receive from any source (`dist.recv(t)` / `dist.irecv(t)` without `src`) for the
`atlas` backend.

Every pair of ranks has its own channel, so "any source" means: wait until some
peer's next message on the tag has started to arrive (unclaimed) on its channel,
then post the receive on that channel; the work reports that peer as its source
rank. A lower-ranked peer never opens a channel itself (the higher rank connects),
so every missing channel to a lower rank is opened first. Peers are looked at in
turn starting after the last one served, so no sender is starved."""

from __future__ import annotations

import threading
import time

from .mesh import PeerMesh, PeerOp
from .work import AtlasError

_FIRST_POLL_S = 0.0002
_MAX_POLL_S = 0.005


def open_channels(mesh: PeerMesh) -> None:
    """Start opening the channel to every lower rank that has none (the higher rank of a
    pair connects; a receiver from any source cannot wait for a sender to do it)."""
    for peer in range(mesh.rank):
        p = mesh._peer(peer)
        with p.lock:
            start = p.channel is None and p.error is None and not p.opening
            if start:
                p.opening = True
        if start:
            threading.Thread(target=mesh._connect, args=(peer,), daemon=True,
                             name=f"atlas-pg{mesh.group}-connect-{peer}").start()


def unclaimed(mesh: PeerMesh, peer: int, tag: int) -> bool:
    """Has `peer`'s next message on `tag` started to arrive with no receive posted for it?"""
    p = mesh._peer(peer)
    ch = p.channel
    if ch is None:
        return False
    with ch._lock:
        return (tag, ch._recv_seq[tag]) in ch._arrived


class AnySource:
    """Finds the peer of each any-source receive of one process group, in call order."""

    def __init__(self, mesh: PeerMesh) -> None:
        self._mesh = mesh
        self._next = 0
        self._locks: dict[int, threading.Lock] = {}  # per tag: any-source receives match in call order
        self._guard = threading.Lock()

    def match(self, tag: int, deadline: float, what: str, make_op) -> PeerOp:
        """The posted receive (`make_op(peer)`) for the first peer with an unclaimed
        message on `tag`; AtlasError naming the tag when none arrives by `deadline`."""
        mesh = self._mesh
        peers = [r for r in range(mesh.size) if r != mesh.rank]
        open_channels(mesh)
        with self._guard:
            lock = self._locks.setdefault(tag, threading.Lock())
        with lock:
            pause = _FIRST_POLL_S
            while True:
                n = len(peers)
                for i in range(n):
                    peer = peers[(self._next + i) % n]
                    if unclaimed(mesh, peer, tag):
                        self._next = (peers.index(peer) + 1) % n
                        op = make_op(peer)
                        mesh.post(op)
                        return op
                if time.monotonic() > deadline:
                    raise AtlasError(
                        f"atlas: {what} from any source (group {mesh.group!r}, tag {tag}): no rank sent a "
                        f"message on tag {tag} within {mesh.timeout_s:g} s (the process group's timeout)")
                if mesh._closed:
                    raise AtlasError(f"atlas: {what} from any source (group {mesh.group!r}): the group was shut down")
                time.sleep(pause)
                pause = min(_MAX_POLL_S, pause * 2)
