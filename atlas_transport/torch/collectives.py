"""Collective algorithms over point-to-point exchanges, on contiguous CPU tensors.

Each algorithm is written against `xfer(sends, recvs)`: post every receive and send
of one step ([(peer, tensor)]), wait for all of them. Results are deterministic and
bit-identical on every rank: a reduction combines contributions in rank order
(exchange) or computes each chunk on one rank and copies it to the others (ring).

When `xfer` is also a `hierarchical.Net` that knows the group's topology (the
backend's `MeshNet`: post now, wait later, `xfer.topology`), all_reduce,
reduce_scatter, all_gather and broadcast use the topology-aware, pipelined
algorithms of `hierarchical` instead."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from . import hierarchical as H
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


def all_reduce(x: torch.Tensor, name: str, rank: int, size: int, xfer: Xfer, scratch: Scratch = fresh) -> None:
    """Reduce the flat contiguous `x` across the group, in place. `scratch(dtype, n)`
    gives the ring's receive buffer (the backend reuses one: no page faults per call)."""
    if size == 1:
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
    if rank != root:
        xfer([(root, x)], [])
        return
    outs[rank].copy_(x)
    xfer([], [(p, outs[p]) for p in range(size) if p != rank])


def scatter(out: torch.Tensor, ins: Sequence[torch.Tensor] | None, root: int, rank: int, size: int,
            xfer: Xfer) -> None:
    if rank != root:
        xfer([], [(root, out)])
        return
    out.copy_(ins[rank])
    xfer([(p, ins[p]) for p in range(size) if p != rank], [])


def barrier(rank: int, size: int, xfer: Xfer) -> None:
    peers = [p for p in range(size) if p != rank]
    token = torch.zeros(1, dtype=torch.uint8)
    xfer([(p, token) for p in peers], [(p, torch.empty(1, dtype=torch.uint8)) for p in peers])
