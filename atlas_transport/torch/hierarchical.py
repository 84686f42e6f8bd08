"""Topology-aware, chunk-pipelined collectives over posted sends and receives.

Written against `Net`: post a send or a receive now, wait for it later, so the
reduction of one piece overlaps the transfer of the next. A `Topology` says which
ranks share a site (a LAN). With S sites of L ranks each, rank (s, j) (site s, j-th
rank of its site):

- all_reduce: reduce-scatter inside each site (local rank j ends with shard j
  reduced over its site), then the ranks holding shard j in every site exchange
  their site's partial (each shard crosses the WAN once per remote site, the L
  cross-site pairs in parallel, each striped over its channel's streams), then an
  all-gather inside each site. Each shard is cut into pieces: a piece moves to the
  next phase as soon as it is reduced. With one site it is a direct reduce-scatter +
  all-gather (what a ring moves, in two rounds instead of 2(n-1)); small tensors
  take one round of direct exchange instead (SMALL_BYTES).
- reduce_scatter / all_gather: the same two levels, each block crossing the WAN once.
- broadcast: the root sends to one rank per remote site, which forwards inside its
  site, piece by piece.

When the net carries the site's gloo group (`net.site`, option intra_site="gloo")
and there are several equal sites, the intra-site phases (reduce-scatter, all-gather,
broadcast inside a site) run on that gloo group, whole tensors at a time, and only
the WAN crossings use the net (atlas channels).

Bit-identical results on every rank: every sum is combined in a fixed order (local
rank order inside a site, then site order), and every rank holding the same shard
computes it from the same operands in that order. Sends whose tensor the algorithm
copied (`detach=True`) may still be unconfirmed when the collective returns (the net
keeps the copy until the peer confirmed it); every other send and every receive is
finished when the function returns.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

import torch

from . import intrasite as I
from .reduction import combine, finish_avg
from .topology import Topology

# Pieces a shard is cut into for pipelining: about this many bytes each.
PIECE_BYTES = 4 << 20
# An all_reduce whose direct exchange (every rank sends its tensor to every other and
# reduces in rank order: one round, the fewest round trips) sends fewer bytes per rank
# than this takes that exchange: up to 256 KiB between 2 ranks (a tensor-parallel
# pair's activations), 85 KiB among 4.
SMALL_BYTES = 256 << 10


class Net(Protocol):
    """Posting sends and receives of one collective (the backend's, or a fake in tests)."""

    def send(self, peer: int, t: torch.Tensor, detach: bool = False) -> object:
        """Post a send of `t` to `peer`. `detach`: `t` is the algorithm's own copy; the
        collective may end before the peer confirmed it."""

    def recv(self, peer: int, t: torch.Tensor) -> object:
        """Post a receive from `peer` into `t`."""

    def wait(self, op: object) -> None:
        """Wait until the posted operation is complete."""

    def finish(self) -> None:
        """Wait for every posted operation that was not detached."""


Scratch = Callable[[torch.dtype, int], torch.Tensor]


def _fresh(dtype: torch.dtype, numel: int) -> torch.Tensor:
    return torch.empty(numel, dtype=dtype)


def _pieces(x: torch.Tensor, piece_bytes: int) -> list[torch.Tensor]:
    k = max(1, -(-x.numel() * x.element_size() // max(1, piece_bytes)))
    return list(x.tensor_split(min(k, max(1, x.numel()))))


def reduce_into(out: torch.Tensor, parts: Sequence[torch.Tensor], name: str, spare: torch.Tensor | None) -> None:
    """out = ((parts[0] op parts[1]) op parts[2]) ...: always this order, so every rank
    computing it from the same parts gets the same bits. `out` may be one of `parts`;
    `spare` (shaped like out) is used when it is parts[i] for i >= 2."""
    if len(parts) == 1:
        if parts[0] is not out:
            out.copy_(parts[0])
        return
    idx = next((i for i, p in enumerate(parts) if p is out), None)
    if idx is not None and idx >= 2:
        if spare is None:
            spare = torch.empty_like(out)
        reduce_into(spare, parts, name, None)
        out.copy_(spare)
        return
    if idx == 1:  # elementwise ops with out aliasing an input are exact; op(a, b) == op(b, a)
        combine(out, parts[0], name)
    else:
        if idx is None:
            out.copy_(parts[0])
        combine(out, parts[1], name)
    for p in parts[2:]:
        combine(out, p, name)


def _layout(topo: Topology, rank: int) -> tuple[int, int, tuple[int, ...], list[int]]:
    s = topo.site_of(rank)
    local = topo.sites[s]
    j = local.index(rank)
    cross = [site[j] for site in topo.sites]  # the ranks holding shard j, in site order
    return s, j, local, cross


def hierarchical(topo: Topology) -> bool:
    """Whether the two-level algorithms apply (equal sites); else the one-site form
    over all ranks is used."""
    return topo.uniform


def _site(net: object, topo: Topology, *tensors: torch.Tensor) -> I.SiteGroup | None:
    """The site's gloo group for the intra-site phases: the net has one, there are
    several equal sites, gloo takes these dtypes (the same answer on every rank)."""
    site = getattr(net, "site", None)
    if site is None or len(topo.sites) < 2 or not hierarchical(topo) or not I.supports(*tensors):
        return None
    return site


def all_reduce(x: torch.Tensor, name: str, rank: int, topo: Topology, net: Net, scratch: Scratch = _fresh,
               piece_bytes: int = PIECE_BYTES, small_bytes: int = SMALL_BYTES) -> None:
    """Reduce the flat contiguous `x` over the group, in place (AVG divides at the end)."""
    size = topo.size
    if size == 1:
        return
    x = x.view(-1)
    if x.numel() * x.element_size() * (size - 1) < small_bytes or x.numel() < size:
        _exchange_all_reduce(x, name, rank, size, net)
    else:
        site = _site(net, topo, x)
        if site is not None:
            _gloo_two_level_all_reduce(x, name, rank, topo, net, site)
        else:
            if not hierarchical(topo):
                topo = Topology.flat(size)
            _two_level_all_reduce(x, name, rank, topo, net, scratch, piece_bytes)
    finish_avg(x, name, size)


def _gloo_two_level_all_reduce(x: torch.Tensor, name: str, rank: int, topo: Topology, net: Net,
                               site: I.SiteGroup) -> None:
    """Reduce-scatter inside the site (gloo), shard j's site partials exchanged between
    the sites' ranks j (atlas), combined in site order, all-gather inside the site (gloo)."""
    s, j, local, cross = _layout(topo, rank)
    L, S = len(local), len(cross)
    n = -(-x.numel() // L)
    flat = x
    if n * L != x.numel():  # gloo's reduce-scatter and all-gather take equal blocks: pad
        flat = torch.zeros(n * L, dtype=x.dtype)
        flat[: x.numel()].copy_(x)
    shards = list(flat.split(n))
    partial = torch.empty(n, dtype=x.dtype)  # fresh: the WAN sends of it are detached
    I.reduce_scatter(site, partial, shards, name)
    bufs = {t: torch.empty(n, dtype=x.dtype) for t in range(S) if t != s}
    recvs = [net.recv(cross[t], bufs[t]) for t in bufs]
    for t in bufs:
        net.send(cross[t], partial, detach=True)
    for op in recvs:
        net.wait(op)
    total = torch.empty(n, dtype=x.dtype)
    reduce_into(total, [partial if t == s else bufs[t] for t in range(S)], name, None)
    I.all_gather(site, shards, total)
    if flat is not x:
        x.copy_(flat[: x.numel()])
    net.finish()


def _exchange_all_reduce(x: torch.Tensor, name: str, rank: int, size: int, net: Net) -> None:
    peers = [p for p in range(size) if p != rank]
    own = x.clone()  # detached sends: the collective does not wait for their confirmation
    bufs = {p: torch.empty_like(x) for p in peers}
    recvs = [net.recv(p, bufs[p]) for p in peers]
    for p in peers:
        net.send(p, own, detach=True)
    for op in recvs:
        net.wait(op)
    reduce_into(x, [own if p == rank else bufs[p] for p in range(size)], name, None)
    net.finish()


def _two_level_all_reduce(x: torch.Tensor, name: str, rank: int, topo: Topology, net: Net, scratch: Scratch,
                          piece_bytes: int) -> None:
    s, j, local, cross = _layout(topo, rank)
    L, S = len(local), len(cross)
    shards = list(x.tensor_split(L))
    k_count = len(_pieces(shards[0], piece_bytes))
    pieces = [list(sh.tensor_split(k_count)) for sh in shards]  # the same cut on every rank
    mine = pieces[j]
    n_mine = shards[j].numel()
    # Receive buffers (reused scratch: every receive ends before the call returns): one
    # shard per local peer (phase A) and per remote site (phase B). The copy of the
    # site partial that crosses the WAN is fresh memory: its sends are detached.
    buf = scratch(x.dtype, n_mine * (L - 1 + S - 1))
    views = list(buf.split(n_mine))
    a_bufs = {m: list(views.pop(0).tensor_split(k_count)) for m in range(L) if m != j}
    b_bufs = {t: list(views.pop(0).tensor_split(k_count)) for t in range(S) if t != s}
    wan_copy = list(torch.empty(n_mine, dtype=x.dtype).tensor_split(k_count)) if S > 1 else None

    # Everything receivable is posted up front, in the order the peers send it.
    a_recv = {m: [net.recv(local[m], a_bufs[m][k]) for k in range(k_count)] for m in a_bufs}
    b_recv = {t: [net.recv(cross[t], b_bufs[t][k]) for k in range(k_count)] for t in b_bufs}
    c_recv = [net.recv(local[m], pieces[m][k]) for m in range(L) if m != j for k in range(k_count)]
    for k in range(k_count):
        for m in range(L):
            if m != j:
                net.send(local[m], pieces[m][k])
    for k in range(k_count):  # phase A: reduce my shard inside the site; piece k leaves for the WAN at once
        for m in a_recv:
            net.wait(a_recv[m][k])
        reduce_into(mine[k], [mine[k] if m == j else a_bufs[m][k] for m in range(L)], name,
                    wan_copy[k] if wan_copy else None)
        if S > 1:
            wan_copy[k].copy_(mine[k])
            for t in range(S):
                if t != s:
                    net.send(cross[t], wan_copy[k], detach=True)
        else:
            _send_final(net, local, j, mine[k])
    if S > 1:
        for k in range(k_count):  # phase B: combine the sites' partials in site order
            for t in b_recv:
                net.wait(b_recv[t][k])
            reduce_into(mine[k], [wan_copy[k] if t == s else b_bufs[t][k] for t in range(S)], name,
                        a_bufs[next(iter(a_bufs))][k] if a_bufs else None)
            _send_final(net, local, j, mine[k])
    for op in c_recv:
        net.wait(op)
    net.finish()


def _send_final(net: Net, local: Sequence[int], j: int, piece: torch.Tensor) -> None:
    for m, peer in enumerate(local):
        if m != j:
            net.send(peer, piece)


def reduce_scatter(out: torch.Tensor, ins: Sequence[torch.Tensor], name: str, rank: int, topo: Topology,
                   net: Net) -> None:
    """out = reduction over ranks of their ins[rank] (ins: one block per rank, each
    shaped like out). Each block's partial crosses the WAN once per remote site."""
    size = topo.size
    if size == 1:
        out.copy_(ins[0])
        finish_avg(out, name, size)
        return
    site = _site(net, topo, out, *ins)
    if site is not None:
        _gloo_reduce_scatter(out, ins, name, rank, topo, net, site)
        finish_avg(out, name, size)
        return
    if not hierarchical(topo):
        topo = Topology.flat(size)
    s, j, local, cross = _layout(topo, rank)
    L, S = len(local), len(cross)
    # Phase A: local rank m gets, from each local peer, the blocks of the ranks (t, m).
    a_bufs = {m: {t: torch.empty_like(out) for t in range(S)} for m in range(L) if m != j}
    a_recv = {m: [net.recv(local[m], a_bufs[m][t]) for t in range(S)] for m in a_bufs}
    b_bufs = {t: torch.empty_like(out) for t in range(S) if t != s}
    b_recv = {t: net.recv(cross[t], b_bufs[t]) for t in b_bufs}
    for m in range(L):
        if m != j:
            for t in range(S):
                net.send(local[m], ins[topo.sites[t][m]])
    partial = None
    for t in [t for t in range(S) if t != s] + [s]:  # remote sites' blocks first: they have the WAN ahead
        for m in a_recv:
            net.wait(a_recv[m][t])
        block = ins[topo.sites[t][j]]
        parts = [block if m == j else a_bufs[m][t] for m in range(L)]
        if t == s:
            partial = out
            reduce_into(out, parts, name, None)
        else:
            acc = torch.empty_like(out)
            reduce_into(acc, parts, name, None)
            net.send(cross[t], acc, detach=True)
    for t in b_recv:
        net.wait(b_recv[t])
    reduce_into(out, [partial if t == s else b_bufs[t] for t in range(S)], name, None)
    net.finish()
    finish_avg(out, name, size)


def _gloo_reduce_scatter(out: torch.Tensor, ins: Sequence[torch.Tensor], name: str, rank: int, topo: Topology,
                         net: Net, site: I.SiteGroup) -> None:
    """One gloo reduce-scatter inside the site gives this rank the site partials of the
    blocks (t, j) of every site t; each goes to its rank across the WAN (atlas)."""
    s, j, local, cross = _layout(topo, rank)
    L, S = len(local), len(cross)
    n = out.numel()
    inputs = [torch.cat([ins[topo.sites[t][m]].reshape(-1) for t in range(S)]) for m in range(L)]
    partials = torch.empty(S * n, dtype=out.dtype)  # fresh: the WAN sends of it are detached
    I.reduce_scatter(site, partials, inputs, name)
    parts = list(partials.split(n))
    bufs = {t: torch.empty(n, dtype=out.dtype) for t in range(S) if t != s}
    recvs = [net.recv(cross[t], bufs[t]) for t in bufs]
    for t in bufs:
        net.send(cross[t], parts[t], detach=True)
    for op in recvs:
        net.wait(op)
    reduce_into(out.view(-1), [parts[s] if t == s else bufs[t] for t in range(S)], name, None)
    net.finish()


def all_gather(outs: Sequence[torch.Tensor], x: torch.Tensor, rank: int, topo: Topology, net: Net) -> None:
    """outs[p] = rank p's x. Each block crosses the WAN once per remote site (between
    ranks with the same local index), then is forwarded inside the site."""
    all_gather_many([(outs, x)], rank, topo, net)


def all_gather_many(items: Sequence[tuple[Sequence[torch.Tensor], torch.Tensor]], rank: int, topo: Topology,
                    net: Net) -> None:
    """Several all_gathers (`items`: (outs, x) each) in one round: everything is posted
    before anything is waited for, so a coalesced call costs one WAN crossing, not
    one per tensor."""
    size = topo.size
    for outs, x in items:
        outs[rank].copy_(x)
    if size == 1:
        return
    site = _site(net, topo, *[t for outs, x in items for t in (*outs, x)])
    if not hierarchical(topo):
        topo = Topology.flat(size)
    s, j, local, cross = _layout(topo, rank)
    L, S = len(local), len(cross)
    if site is not None:  # blocks (t, j) across the WAN (atlas), then each site's blocks inside it (gloo)
        recvs = []
        for outs, x in items:
            recvs += [net.recv(cross[t], outs[cross[t]]) for t in range(S) if t != s]
            own = x.detach().clone()
            for t in range(S):
                if t != s:
                    net.send(cross[t], own, detach=True)
        for op in recvs:
            net.wait(op)
        works = [site.pg.allgather([[outs[topo.sites[t][m]] for m in range(L)]], [outs[topo.sites[t][j]]])
                 for outs, _ in items for t in range(S)]
        for w in works:
            site.run("all_gather", w)
        net.finish()
        return
    posted = []
    for outs, x in items:
        b_recv = {t: net.recv(cross[t], outs[cross[t]]) for t in range(S) if t != s}
        c_recv = [net.recv(local[m], outs[topo.sites[t][m]]) for m in range(L) if m != j for t in range(S)]
        if S > 1:
            own = x.detach().clone()
            for t in b_recv:
                net.send(cross[t], own, detach=True)
        posted.append((outs, b_recv, c_recv))
    for outs, b_recv, _ in posted:
        for t in range(S):  # forward blocks (t, j) inside the site, mine first, the others as they land
            if t != s:
                net.wait(b_recv[t])
            for m in range(L):
                if m != j:
                    net.send(local[m], outs[topo.sites[t][j]])
    for _, _, c_recv in posted:
        for op in c_recv:
            net.wait(op)
    net.finish()


def broadcast(x: torch.Tensor, root: int, rank: int, topo: Topology, net: Net,
              piece_bytes: int = PIECE_BYTES) -> None:
    """x from `root` to every rank: one WAN crossing per remote site (to the rank with
    the root's local index, or the site's first), forwarded inside each site piece by
    piece."""
    size = topo.size
    if size == 1:
        return
    rs = topo.site_of(root)
    rj = topo.sites[rs].index(root)
    heads = [root if t == rs else site[rj] if rj < len(site) else site[0] for t, site in enumerate(topo.sites)]
    s = topo.site_of(rank)
    local = topo.sites[s]
    site = _site(net, topo, x)
    if site is not None:  # root -> the sites' heads (atlas), then each head inside its site (gloo)
        flat = x.view(-1)
        if rank == root:
            for h in heads:
                if h != root:
                    net.send(h, flat)
        elif rank == heads[s]:
            net.wait(net.recv(root, flat))
        I.broadcast(site, flat, local.index(heads[s]))
        net.finish()
        return
    # Pieces only where a site head forwards (a remote site of several ranks): there the
    # forwarding of piece k overlaps the arrival of piece k+1; elsewhere one transfer.
    forwards = any(len(site) > 1 for t, site in enumerate(topo.sites) if t != rs)
    pieces = _pieces(x.view(-1), piece_bytes) if forwards else [x.view(-1)]
    if rank == root:
        for piece in pieces:
            for h in heads:
                if h != root:
                    net.send(h, piece)
            for p in local:
                if p != root:
                    net.send(p, piece)
    elif rank == heads[s]:
        recvs = [net.recv(root, piece) for piece in pieces]
        for op, piece in zip(recvs, pieces, strict=True):
            net.wait(op)
            for p in local:
                if p != rank:
                    net.send(p, piece)
    else:
        for piece in pieces:
            net.recv(heads[s], piece)
    net.finish()
