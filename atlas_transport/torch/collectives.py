"""Collective algorithms over point-to-point exchanges, on contiguous CPU tensors.

Each algorithm is written against `xfer(sends, recvs)`: post every receive and send
of one step ([(peer, tensor)]), wait for all of them. Results are deterministic and
bit-identical on every rank: a reduction combines contributions in rank order
(exchange) or computes each chunk on one rank and copies it to the others (ring).

When `xfer` is also a `hierarchical.Net` that knows the group's topology (the
backend's `MeshNet`: post now, wait later, `xfer.topology`), all_reduce,
reduce_scatter, all_gather and broadcast use the topology-aware, pipelined
algorithms of `hierarchical` instead. When it also carries the site's gloo group
(`xfer.site`, option intra_site="gloo") and the site is the whole group, every
collective runs on that gloo group (`intrasite`); with several sites the
hierarchical algorithms run their intra-site phases on it."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from . import hierarchical as H
from . import intrasite as I
from .reduction import _OPS, check_op, combine, finish_avg, op_name  # noqa: F401 - the backend's names

Xfer = Callable[[Sequence[tuple[int, torch.Tensor]], Sequence[tuple[int, torch.Tensor]]], None]
Scratch = Callable[[torch.dtype, int], torch.Tensor]


def fresh(dtype: torch.dtype, numel: int) -> torch.Tensor:
    return torch.empty(numel, dtype=dtype)

# Below this many bytes all_reduce exchanges whole tensors (one step, n-1 messages
# each way); above it, a ring: 2(n-1) steps of 1/n of the tensor, each one transfer
# per neighbour (striped over the pair's streams).
RING_MIN_BYTES = 256 << 10

def reduce_in_order(parts: Sequence[torch.Tensor], name: str, out: torch.Tensor) -> None:
    """out = parts[0] op parts[1] op ... (rank order, so every rank gets the same bits)."""
    acc = parts[0].clone()
    for p in parts[1:]:
        combine(acc, p, name)
    out.copy_(acc)


def _topology(xfer: object):
    """The group's topology when `xfer` can post and wait separately, else None."""
    return getattr(xfer, "topology", None)


def _whole_site(xfer: object, *tensors: torch.Tensor) -> I.SiteGroup | None:
    """The gloo group to run the collective on: the site is the whole group and gloo
    takes these tensors' dtypes (the same answer on every rank), else None."""
    site = getattr(xfer, "site", None)
    return site if site is not None and site.whole and I.supports(*tensors) else None


def all_reduce(x: torch.Tensor, name: str, rank: int, size: int, xfer: Xfer, scratch: Scratch = fresh) -> None:
    """Reduce the flat contiguous `x` across the group, in place. `scratch(dtype, n)`
    gives the ring's receive buffer (the backend reuses one: no page faults per call)."""
    if size == 1:
        return
    site = _whole_site(xfer, x)
    if site is not None:
        I.group_all_reduce(site, x, name)
        return
    topo = _topology(xfer)
    if topo is not None:
        H.all_reduce(x, name, rank, topo, xfer, scratch)
        return
    if x.numel() >= size and x.numel() * x.element_size() >= RING_MIN_BYTES:
        _ring_all_reduce(x, name, rank, size, xfer, scratch)
    else:
        peers = [p for p in range(size) if p != rank]
        bufs = {p: torch.empty_like(x) for p in peers}
        xfer([(p, x) for p in peers], [(p, bufs[p]) for p in peers])
        parts = [x if p == rank else bufs[p] for p in range(size)]
        reduce_in_order(parts, name, x)
    finish_avg(x, name, size)


def _ring_all_reduce(x: torch.Tensor, name: str, rank: int, size: int, xfer: Xfer, scratch: Scratch) -> None:
    chunks = list(x.tensor_split(size))
    right, left = (rank + 1) % size, (rank - 1) % size
    tmp = scratch(x.dtype, chunks[0].numel())
    for s in range(size - 1):  # reduce-scatter: rank r ends owning chunk (r + 1) % size
        send_i, recv_i = (rank - s) % size, (rank - s - 1) % size
        buf = tmp[: chunks[recv_i].numel()]
        xfer([(right, chunks[send_i])], [(left, buf)])
        combine(chunks[recv_i], buf, name)
    for s in range(size - 1):  # all-gather of the reduced chunks
        send_i, recv_i = (rank + 1 - s) % size, (rank - s) % size
        xfer([(right, chunks[send_i])], [(left, chunks[recv_i])])


def broadcast(x: torch.Tensor, root: int, rank: int, size: int, xfer: Xfer) -> None:
    site = _whole_site(xfer, x)
    if site is not None:
        I.broadcast(site, x, root)
        return
    topo = _topology(xfer)
    if topo is not None:
        H.broadcast(x, root, rank, topo, xfer)
        return
    if rank == root:
        xfer([(p, x) for p in range(size) if p != root], [])
    else:
        xfer([], [(root, x)])


def all_gather(outs: Sequence[torch.Tensor], x: torch.Tensor, rank: int, size: int, xfer: Xfer) -> None:
    """outs[p] = rank p's x (outs contiguous, each shaped like x)."""
    site = _whole_site(xfer, x)
    if site is not None:
        I.group_all_gather_many(site, [(outs, x)])
        return
    topo = _topology(xfer)
    if topo is not None:
        H.all_gather(outs, x, rank, topo, xfer)
        return
    peers = [p for p in range(size) if p != rank]
    outs[rank].copy_(x)
    xfer([(p, x) for p in peers], [(p, outs[p]) for p in peers])


def all_gather_many(items: Sequence[tuple[Sequence[torch.Tensor], torch.Tensor]], rank: int, size: int,
                    xfer: Xfer) -> None:
    """all_gather for each (outs, x) of `items` (a coalesced call): one round when the
    net can post and wait separately, else one after the other."""
    topo = _topology(xfer)
    if topo is not None:
        H.all_gather_many(items, rank, topo, xfer)
        return
    for outs, x in items:
        all_gather(outs, x, rank, size, xfer)


def reduce_scatter(out: torch.Tensor, ins: Sequence[torch.Tensor], name: str, rank: int, size: int,
                   xfer: Xfer) -> None:
    """out = reduction over ranks of their ins[rank]."""
    site = _whole_site(xfer, out, *ins)
    if site is not None:
        I.group_reduce_scatter(site, out, ins, name)
        return
    topo = _topology(xfer)
    if topo is not None:
        H.reduce_scatter(out, ins, name, rank, topo, xfer)
        return
    peers = [p for p in range(size) if p != rank]
    bufs = {p: torch.empty_like(ins[rank]) for p in peers}
    xfer([(p, ins[p]) for p in peers], [(p, bufs[p]) for p in peers])
    reduce_in_order([ins[rank] if p == rank else bufs[p] for p in range(size)], name, out)
    finish_avg(out, name, size)


def reduce(x: torch.Tensor, name: str, root: int, rank: int, size: int, xfer: Xfer) -> None:
    site = _whole_site(xfer, x)
    if site is not None:
        I.group_reduce(site, x, name, root)
        return
    if rank != root:
        xfer([(root, x)], [])
        return
    peers = [p for p in range(size) if p != rank]
    bufs = {p: torch.empty_like(x) for p in peers}
    xfer([], [(p, bufs[p]) for p in peers])
    reduce_in_order([x if p == rank else bufs[p] for p in range(size)], name, x)
    finish_avg(x, name, size)


def gather(outs: Sequence[torch.Tensor] | None, x: torch.Tensor, root: int, rank: int, size: int,
           xfer: Xfer) -> None:
    site = _whole_site(xfer, x)
    if site is not None:
        I.group_gather(site, outs, x, root)
        return
    if rank != root:
        xfer([(root, x)], [])
        return
    outs[rank].copy_(x)
    xfer([], [(p, outs[p]) for p in range(size) if p != rank])


def scatter(out: torch.Tensor, ins: Sequence[torch.Tensor] | None, root: int, rank: int, size: int,
            xfer: Xfer) -> None:
    site = _whole_site(xfer, out)
    if site is not None:
        I.group_scatter(site, out, ins, root)
        return
    if rank != root:
        xfer([], [(root, out)])
        return
    out.copy_(ins[rank])
    xfer([(p, ins[p]) for p in range(size) if p != rank], [])


def all_to_all(outs: Sequence[torch.Tensor], ins: Sequence[torch.Tensor], rank: int, size: int,
               xfer: Xfer) -> None:
    """outs[p] = rank p's ins[rank] (each pair's parts may differ in size, also be empty)."""
    site = _whole_site(xfer, *outs, *ins)
    if site is not None:
        I.group_all_to_all(site, outs, ins)
        return
    outs[rank].copy_(ins[rank])
    peers = [p for p in range(size) if p != rank]
    topo = _topology(xfer)
    if topo is None or len(topo.sites) < 2:
        xfer([(p, ins[p]) for p in peers], [(p, outs[p]) for p in peers])
        return
    # Parts for another site are sent from a copy and detached: the collective ends
    # when this rank's receives are done and its bytes are out, not a round trip later
    # at the remote peers' DONE (parts inside the site are confirmed within microseconds).
    here = topo.site_of(rank)
    recvs = [xfer.recv(p, outs[p]) for p in peers]
    for p in peers:
        if topo.site_of(p) != here:
            xfer.send(p, ins[p].clone(), detach=True)
        else:
            xfer.send(p, ins[p])
    for op in recvs:
        xfer.wait(op)
    xfer.finish()


def barrier(rank: int, size: int, xfer: Xfer) -> None:
    site = getattr(xfer, "site", None)
    if site is not None and site.whole:
        I.group_barrier(site)
        return
    peers = [p for p in range(size) if p != rank]
    token = torch.zeros(1, dtype=torch.uint8)
    xfer([(p, token) for p in peers], [(p, torch.empty(1, dtype=torch.uint8)) for p in peers])
