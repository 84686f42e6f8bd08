"""Collectives inside one site on a gloo process group of the site's ranks.

On a LAN the network is not the bottleneck and gloo's C++ collectives beat atlas's
Python-driven ones, so (option `intra_site="gloo"`, the default) each atlas group
builds, at its first collective (once the topology is known, the same on every
rank), one `ProcessGroupGloo` per site over a `PrefixStore` of the group's store,
bound to the address the atlas rank listens on (`PeerMesh.host`: emulated hosts use
their own interface). When the whole group is one site every collective runs on it,
and once that group exists a collective of plain CPU tensors with nothing queued
before it goes to it from the caller's thread (`GlooWork`: gloo's work, no hop
through the collectives thread), every form included (coalesced, list, AVG divided
once gloo is done, PREMUL_SUM scaled first, all_to_all_single, barrier); with several
sites the algorithms of `hierarchical` run their intra-site phases on it and cross
the WAN on atlas channels.

gloo's results are bit-identical on every rank of its group. Dtypes gloo does not
reduce or move (bool, complex, float8, ...) keep the atlas algorithms: the choice
depends only on the dtype, so every rank makes the same one."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from datetime import timedelta

import torch
import torch.distributed as dist

from .reduction import finish_avg
from .topology import Topology
from .work import AtlasError, AtlasWork

GLOO_DTYPES = frozenset({torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.uint8,
                         torch.int32, torch.int64})
_GLOO_OPS = {"SUM": dist.ReduceOp.SUM, "AVG": dist.ReduceOp.SUM, "PRODUCT": dist.ReduceOp.PRODUCT,
             "MIN": dist.ReduceOp.MIN, "MAX": dist.ReduceOp.MAX, "BAND": dist.ReduceOp.BAND,
             "BOR": dist.ReduceOp.BOR, "BXOR": dist.ReduceOp.BXOR}


def store_prefix(group: str, site: int) -> str:
    return f"atlas/{group}/site/{site}/"


class SiteGroup:
    """This rank's site as a gloo group: `ranks` (group ranks, ascending), this rank's
    index `local` in them; `whole`: the site is the whole atlas group."""

    def __init__(self, store, topo: Topology, rank: int, host: str, timeout_s: float, group: str) -> None:
        self.site = topo.site_of(rank)
        self.ranks = topo.sites[self.site]
        self.local = self.ranks.index(rank)
        self.whole = len(topo.sites) == 1
        self.group = group
        opts = dist.ProcessGroupGloo._Options()
        opts._timeout = timedelta(seconds=timeout_s)
        opts._devices = [dist.ProcessGroupGloo.create_device(hostname=host)]
        try:
            self.pg = dist.ProcessGroupGloo(dist.PrefixStore(store_prefix(group, self.site), store), self.local,
                                            len(self.ranks), opts)
        except RuntimeError as exc:
            raise AtlasError(f"atlas: group {group!r} on rank {rank}: the gloo group of site {self.site} (ranks "
                             f"{list(self.ranks)}) on {host} could not be built: {str(exc).splitlines()[0]}; set "
                             f"ATLAS_INTRA_SITE=atlas to run collectives inside a site on atlas channels") from None

    def error(self, what: str, exc: BaseException) -> AtlasError:
        """`what` failed on the site's gloo group: an AtlasError naming the other ranks."""
        others = ", ".join(f"rank {r}" for i, r in enumerate(self.ranks) if i != self.local)
        return AtlasError(f"atlas: {what}: the gloo group of this rank's site (group ranks {list(self.ranks)}) "
                          f"failed: one of the other ranks ({others}) is silent, gone, or not running the same "
                          f"collectives ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})")

    def run(self, what: str, work) -> None:
        """Wait for a gloo work; its failure breaks the atlas group (AtlasError)."""
        try:
            work.wait()
        except RuntimeError as exc:
            raise self.error(what, exc) from None

    def shutdown(self) -> None:
        """Drop the gloo group here, on the thread that shuts the atlas group down (the
        caller of destroy_process_group): left to the last reference, its destructor
        could run on a daemon thread that Python's exit kills mid-way (std::terminate)."""
        self.pg = None


class GlooWork(AtlasWork):
    """A collective the caller's thread handed to the site's gloo group: gloo's work(s),
    with atlas's name for it and atlas's error message from wait(). `works`: one gloo
    work, or several issued in order (a coalesced call: one per tensor); `after`: what
    completes the result once gloo is done (AVG's division), run once, by whoever sees
    the completion first. With one work and nothing after it, its future is gloo's own
    (no thread of ours, no Python callback in gloo's threads)."""

    def __init__(self, what: str, result: list[torch.Tensor], site: SiteGroup, works,
                 after: Callable[[], None] | None = None) -> None:
        super().__init__(what, result)
        self._site = site
        self._works = list(works) if isinstance(works, list | tuple) else [works]
        self._after = after
        self._drive_lock = threading.Lock()

    def _complete(self, exc: BaseException | None) -> None:
        if len(self._works) == 1 and self._after is None:
            with self._lock:  # the future, if any, is gloo's: it completes by itself
                if not self._event.is_set():
                    self._error = exc
                    self._event.set()
            return
        super()._complete(exc)  # settles our own future (get_future below)

    def _drive(self) -> None:
        if self._event.is_set():
            return
        with self._drive_lock:  # one driver: `after` runs once
            if self._event.is_set():
                return
            try:
                for w in self._works:
                    w.wait()
                if self._after is not None:
                    self._after()
            except RuntimeError as exc:
                self._complete(self._site.error(self.what, exc))
            else:
                self._complete(None)

    def is_completed(self) -> bool:
        if not self._event.is_set() and all(w.is_completed() for w in self._works):
            self._drive()
        return self._event.is_set()

    def _start_watch(self) -> None:
        threading.Thread(target=self._drive, daemon=True, name="atlas-gloo-watch").start()

    def get_future(self):
        """gloo's own future for one work with nothing after it (its value: the result
        tensors); else atlas's, settled once every work is done and `after` has run.
        wait() names a failure in atlas's words."""
        if len(self._works) == 1 and self._after is None:
            return self._works[0].get_future()
        return super().get_future()


def supports(*tensors: torch.Tensor) -> bool:
    """Whether gloo moves and reduces every one of these tensors' dtypes."""
    return all(t.dtype in GLOO_DTYPES for t in tensors)


def joined(parts: Sequence[torch.Tensor]) -> torch.Tensor | None:
    """One flat tensor over `parts` when they are contiguous, equal-sized and adjacent in
    memory, in order (the per-rank chunks of one buffer), else None: gloo's single-buffer
    collectives then skip a flatten and a copy back."""
    if not parts:
        return None
    first = parts[0]
    n, size = first.numel(), first.element_size()
    for i, p in enumerate(parts):
        if (not p.is_contiguous() or p.numel() != n or p.dtype != first.dtype
                or p.data_ptr() != first.data_ptr() + i * n * size):
            return None
    return first.view(-1).as_strided((n * len(parts),), (1,))


def _opts(cls, **fields):
    o = cls()
    for k, v in fields.items():
        setattr(o, k, v)
    return o


def allreduce_options(name: str) -> dist.AllreduceOptions:
    return _opts(dist.AllreduceOptions, reduceOp=_GLOO_OPS[name])


def broadcast_options(root: int) -> dist.BroadcastOptions:
    return _opts(dist.BroadcastOptions, rootRank=root, rootTensor=0)


def reduce_scatter_options(name: str) -> dist.ReduceScatterOptions:
    return _opts(dist.ReduceScatterOptions, reduceOp=_GLOO_OPS[name])


# --- one collective over the site group (local ranks) -----------------------------------------

def all_reduce(site: SiteGroup, x: torch.Tensor, name: str) -> None:
    """In place, SUM for AVG (the caller divides)."""
    site.run("all_reduce", site.pg.allreduce([x], _opts(dist.AllreduceOptions, reduceOp=_GLOO_OPS[name])))


def _flat(t: torch.Tensor) -> torch.Tensor:
    """`t` as one dimension (gloo checks shapes, the collectives only element counts)."""
    return t.view(-1) if t.is_contiguous() else t


def reduce_scatter_work(site: SiteGroup, out: torch.Tensor, ins: Sequence[torch.Tensor], name: str):
    """gloo's work for out = reduction over the site of its ranks' ins[local] (SUM for AVG)."""
    flat = joined(ins)
    if flat is not None and out.is_contiguous():
        return site.pg._reduce_scatter_base(out.view(-1), flat, reduce_scatter_options(name))
    return site.pg.reduce_scatter([_flat(out)], [[_flat(i) for i in ins]], reduce_scatter_options(name))


def reduce_scatter(site: SiteGroup, out: torch.Tensor, ins: Sequence[torch.Tensor], name: str) -> None:
    """out = reduction over the site of its ranks' ins[local] (SUM for AVG)."""
    site.run("reduce_scatter", reduce_scatter_work(site, out, ins, name))


def all_gather_work(site: SiteGroup, outs: Sequence[torch.Tensor], x: torch.Tensor):
    """gloo's work for outs[p] = local rank p's x (one buffer when outs are its chunks)."""
    flat = joined(outs)
    if flat is not None and x.is_contiguous():
        return site.pg._allgather_base(flat, x.view(-1))
    return site.pg.allgather([[_flat(o) for o in outs]], [_flat(x)])


def all_gather(site: SiteGroup, outs: Sequence[torch.Tensor], x: torch.Tensor) -> None:
    site.run("all_gather", all_gather_work(site, outs, x))


def broadcast(site: SiteGroup, x: torch.Tensor, root: int) -> None:
    site.run("broadcast", site.pg.broadcast([x], _opts(dist.BroadcastOptions, rootRank=root, rootTensor=0)))


# --- the whole group is the site: group ranks are local ranks ---------------------------------

def group_all_reduce(site: SiteGroup, x: torch.Tensor, name: str) -> None:
    all_reduce(site, x, name)
    finish_avg(x, name, len(site.ranks))


def group_reduce_scatter(site: SiteGroup, out: torch.Tensor, ins: Sequence[torch.Tensor], name: str) -> None:
    reduce_scatter(site, out, ins, name)
    finish_avg(out, name, len(site.ranks))


def group_all_gather_many(site: SiteGroup, items: Sequence[tuple[Sequence[torch.Tensor], torch.Tensor]]) -> None:
    works = [all_gather_work(site, outs, x) for outs, x in items]  # all issued, then waited for
    for w in works:
        site.run("all_gather", w)


def group_reduce(site: SiteGroup, x: torch.Tensor, name: str, root: int) -> None:
    site.run("reduce", site.pg.reduce([x], _opts(dist.ReduceOptions, reduceOp=_GLOO_OPS[name], rootRank=root,
                                                    rootTensor=0)))
    if site.local == root:
        finish_avg(x, name, len(site.ranks))


def group_gather(site: SiteGroup, outs: Sequence[torch.Tensor] | None, x: torch.Tensor, root: int) -> None:
    site.run("gather", site.pg.gather([list(outs)] if outs is not None else [], [x],
                                      _opts(dist.GatherOptions, rootRank=root)))


def group_scatter(site: SiteGroup, out: torch.Tensor, ins: Sequence[torch.Tensor] | None, root: int) -> None:
    site.run("scatter", site.pg.scatter([out], [list(ins)] if ins is not None else [],
                                        _opts(dist.ScatterOptions, rootRank=root)))


def group_all_to_all(site: SiteGroup, outs: Sequence[torch.Tensor], ins: Sequence[torch.Tensor]) -> None:
    """outs[p] = rank p's ins[this rank]; parts may differ in size (flat, element splits)."""
    flat_in = torch.cat([i.reshape(-1) for i in ins]) if ins else torch.empty(0)
    flat_out = torch.empty(sum(o.numel() for o in outs), dtype=flat_in.dtype)
    site.run("all_to_all", site.pg.alltoall_base(flat_out, flat_in, [o.numel() for o in outs],
                                                 [i.numel() for i in ins], dist.AllToAllOptions()))
    for o, part in zip(outs, flat_out.split([o.numel() for o in outs]), strict=True):
        o.view(-1).copy_(part)


def group_barrier(site: SiteGroup) -> None:
    site.run("barrier", site.pg.barrier(dist.BarrierOptions()))


def avg_after(tensors: Sequence[torch.Tensor], name: str, size: int) -> Callable[[], None] | None:
    """What completes AVG once gloo's SUM is done (each tensor divided by the group
    size, as the atlas path does); None for every other op."""
    if name != "AVG":
        return None

    def after() -> None:
        for t in tensors:
            finish_avg(t.detach(), name, size)
    return after


def barrier_work(site: SiteGroup):
    return site.pg.barrier(dist.BarrierOptions())
