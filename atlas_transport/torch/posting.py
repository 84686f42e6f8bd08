"""How a collective posts its transfers on the group's channels: `MeshNet`, the
backend's implementation of the algorithms' `Net` (post now, wait later) and of the
older one-step `xfer(sends, recvs)`.

All of a collective's traffic uses the one collective tag, so each pair's messages
match by the order in which both sides post them. Sends the algorithm made from its
own copy (`detach=True`), and every send up to SMALL_SEND_BYTES (copied here), end
the collective once their bytes are out (handed to the kernel), not at the peer's
DONE, which arrives a round trip after the bytes left and across a WAN would add one
RTT to every collective. Until confirmed they stay (with their memory, which a
re-send after a stream failure reads) in the group's `detached` list; `reap` raises
the error of any that failed, at the group's next collective."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .intrasite import SiteGroup
from .mesh import COLL_TAG, PeerMesh, PeerOp
from .options import LAN_RTT_S
from .topology import Topology, discover

# Sends up to this size are made from a copy and detached (not waited for), whatever
# the algorithm asked: the copy takes microseconds, the peer's DONE a round trip.
SMALL_SEND_BYTES = 64 << 10


class Posting:
    """A group's collective posting state: its topology (found at the first
    collective, the same on every rank), its site's gloo group (`intra_site="gloo"`:
    built right after the topology, by every rank at the same collective) and its
    detached sends. `store`: the group's own c10d store (gloo's rendezvous)."""

    def __init__(self, mesh: PeerMesh, store=None, intra_site: str = "atlas") -> None:
        self.mesh = mesh
        self.store = store
        self.intra_site = intra_site
        self.detached: list[PeerOp] = []
        self.topology: Topology | None = None
        self.site: SiteGroup | None = None

    def net(self, what: str, deadline: float) -> MeshNet:
        """The next collective's `MeshNet`; raises the error of an earlier detached send
        that failed. Called on the collectives thread, once per collective, in order."""
        reap(self.mesh, self.detached)
        if self.topology is None:
            m = self.mesh
            self.topology = discover(m.store, m.rank, m.size, m.rtt, LAN_RTT_S)
        if (self.site is None and self.intra_site == "gloo" and self.store is not None and self.mesh.size > 1
                and self.topology.uniform):  # the two-level algorithms need equal sites
            m = self.mesh
            self.site = SiteGroup(self.store, self.topology, m.rank, m.host, m.timeout_s, m.group)
        return MeshNet(self.mesh, what, deadline, self.detached, self.topology, self.site)

    def close(self) -> None:
        if self.site is not None:
            self.site.shutdown()


class MeshNet:
    """`topology`: where the group's ranks are (the algorithms choose by it); `site`:
    this rank's site as a gloo group, or None (atlas channels inside sites too)."""

    def __init__(self, mesh: PeerMesh, what: str, deadline: float, detached: list[PeerOp],
                 topology: Topology | None = None, site: SiteGroup | None = None) -> None:
        self.mesh, self.what, self.deadline = mesh, what, deadline
        self.detached = detached
        self.topology = topology
        self.site = site
        self.ops: list[PeerOp] = []
        self.out: list[PeerOp] = []  # this collective's detached sends

    def _post(self, kind: str, peer: int, t: torch.Tensor) -> PeerOp:
        op = PeerOp(kind, peer, t, COLL_TAG, self.deadline, self.what)
        self.mesh.post(op)
        return op

    def send(self, peer: int, t: torch.Tensor, detach: bool = False) -> PeerOp:
        if not detach and t.numel() * t.element_size() <= SMALL_SEND_BYTES:
            t, detach = t.clone(), True  # a copy costs less than waiting for the peer's DONE
        op = self._post("send", peer, t)
        if detach:
            self.detached.append(op)
            self.out.append(op)
        else:
            self.ops.append(op)
        return op

    def recv(self, peer: int, t: torch.Tensor) -> PeerOp:
        op = self._post("recv", peer, t)
        self.ops.append(op)
        return op

    def wait(self, op: PeerOp) -> None:
        self.mesh.wait(op)

    def finish(self) -> None:
        """Wait for every posted operation; detached sends only until their bytes are
        out (handed to the kernel), so that a process that ends right after the
        collective does not leave its peers waiting for bytes it never wrote."""
        for op in self.ops:
            self.mesh.wait(op)
        self.ops.clear()
        for op in self.out:
            self.mesh.wait(op, out_only=True)
        self.out.clear()

    def __call__(self, sends: Sequence[tuple[int, torch.Tensor]], recvs: Sequence[tuple[int, torch.Tensor]]) -> None:
        """One step: post every receive, then every send; wait for all of them."""
        for p, t in recvs:
            self.recv(p, t)
        for p, t in sends:
            self.send(p, t)
        self.finish()


def reap(mesh: PeerMesh, detached: list[PeerOp]) -> None:
    """Forget the detached sends that completed; raise the error of one that failed
    (it is forgotten too)."""
    pending = list(detached)
    detached.clear()
    for i, op in enumerate(pending):
        if not op.done():
            detached.append(op)
            continue
        try:
            mesh.wait(op)
        except BaseException:
            detached.extend(o for o in pending[i + 1:])
            raise
