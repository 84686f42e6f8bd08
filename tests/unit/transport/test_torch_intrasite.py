"""Collectives on the site's gloo group (intra_site="gloo") through the real backend:
four ProcessGroupAtlas ranks as threads of this process on loopback, in one site or
two, give the same results as atlas channels everywhere (intra_site="atlas") and as
a plain gloo group."""

from __future__ import annotations

import threading
from datetime import timedelta

import torch
import torch.distributed as dist

from atlas_transport.torch.backend import ProcessGroupAtlas
from atlas_transport.torch.options import AtlasOptions
from atlas_transport.torch.topology import Topology

SIZE = 4
SITE_SIZES: dict = {}


def on_gloo_site_size(rank: int) -> int:
    return SITE_SIZES[("sites-gloo", rank)]


def _program(pg, rank: int) -> list[torch.Tensor]:
    """Every kind of collective once; returns what each produced on this rank."""
    out = []
    big = torch.arange(100_003, dtype=torch.float32) * (rank + 1) / 7
    pg.allreduce([big]).wait()
    out.append(big)
    ints = torch.arange(10, dtype=torch.int64) + rank
    opts = dist.AllreduceOptions()
    opts.reduceOp = dist.ReduceOp.MAX
    pg.allreduce([ints], opts).wait()
    out.append(ints)
    rs_out = torch.empty(1000, dtype=torch.float64)
    pg._reduce_scatter_base(rs_out, torch.arange(SIZE * 1000, dtype=torch.float64) + rank).wait()
    out.append(rs_out)
    ag = torch.empty(SIZE * 5)
    pg._allgather_base(ag, torch.full((5,), float(rank))).wait()
    out.append(ag)
    bopts = dist.BroadcastOptions()
    bopts.rootRank = 1
    bc = torch.arange(2000.0) if rank == 1 else torch.zeros(2000)
    pg.broadcast([bc], bopts).wait()
    out.append(bc)
    a2a_in = torch.arange(SIZE * 3, dtype=torch.float32) + 100 * rank
    a2a_out = torch.empty(SIZE * 3)
    pg.alltoall_base(a2a_out, a2a_in, [], []).wait()
    out.append(a2a_out)
    ropts = dist.ReduceOptions()
    ropts.rootRank = 2
    red = torch.full((4,), float(rank + 1))
    pg.reduce([red], ropts).wait()
    out.append(red if rank == 2 else torch.zeros(0))
    gopts = dist.GatherOptions()
    gopts.rootRank = 0
    gath = [torch.empty(2) for _ in range(SIZE)] if rank == 0 else []
    pg.gather([gath] if rank == 0 else [], [torch.full((2,), float(rank))], gopts).wait()
    out.append(torch.cat(gath) if rank == 0 else torch.zeros(0))
    sopts = dist.ScatterOptions()
    sopts.rootRank = 3
    sc = torch.empty(3)
    pg.scatter([sc], [[torch.full((3,), float(p)) for p in range(SIZE)]] if rank == 3 else [], sopts).wait()
    out.append(sc)
    pg.barrier().wait()
    return out


def _rank(rank: int, store, label: str, make, results: dict, errors: list, program=None) -> None:
    pg = None
    try:
        pg = make(store, rank, label)
        results[rank] = (program or _program)(pg, rank)
        if isinstance(pg, ProcessGroupAtlas):  # whether the collectives ran on the site's gloo group
            results[("site", rank)] = pg._posting.site is not None and pg._posting.site.whole
            SITE_SIZES[(label, rank)] = len(pg._posting.site.ranks) if pg._posting.site is not None else 0
    except BaseException as exc:  # noqa: BLE001
        errors.append(exc)
    finally:
        if pg is not None and isinstance(pg, ProcessGroupAtlas):
            pg.shutdown()


def _run(make, label: str, program=None) -> dict:
    store = dist.HashStore()
    results: dict = {}
    errors: list = []
    threads = [threading.Thread(target=_rank, args=(r, store, label, make, results, errors, program)) for r in range(SIZE)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    return results


def _atlas(intra: str, topo: Topology | None = None):
    def make(store, rank, label):
        pg = ProcessGroupAtlas(store, rank, SIZE, timedelta(seconds=30), label, options=AtlasOptions(
            intra_site=intra))
        if topo is not None:
            pg._posting.topology = topo  # as ATLAS_SITE per rank would set it
        return pg
    return make


def _gloo(store, rank, label):
    return dist.ProcessGroupGloo(store, rank, SIZE, timedelta(seconds=30))


def test_one_site_on_gloo_equals_atlas_channels_and_gloo(monkeypatch):
    monkeypatch.setenv("ATLAS_SITE", "dc")
    on_gloo = _run(_atlas("gloo"), "intra-gloo")
    on_atlas = _run(_atlas("atlas"), "intra-atlas")
    plain = _run(_gloo, "plain-gloo")
    assert all(on_gloo[("site", r)] for r in range(SIZE))
    assert not any(on_atlas[("site", r)] for r in range(SIZE))
    for r in range(SIZE):
        for i, (a, b, c) in enumerate(zip(on_gloo[r], on_atlas[r], plain[r], strict=True)):
            torch.testing.assert_close(a, b, msg=f"rank {r}, result {i}: intra_site gloo vs atlas")
            assert torch.equal(a, c), f"rank {r}, result {i}: intra_site gloo vs a plain gloo group"
        for i in (0, 1, 3, 4):  # all_reduce, all_gather, broadcast: the same bits on every rank
            assert torch.equal(on_gloo[r][i], on_gloo[0][i]), (r, i)


def test_two_sites_run_their_intra_site_phases_on_gloo():
    topo = Topology(((0, 2), (1, 3)))  # interleaved: neighbours cross the "WAN"
    on_gloo = _run(_atlas("gloo", topo), "sites-gloo")
    on_atlas = _run(_atlas("atlas", topo), "sites-atlas")
    plain = _run(_gloo, "sites-plain")
    for r in range(SIZE):
        assert on_gloo[("site", r)] is False and on_gloo_site_size(r) == 2  # a site group, not the whole group
        for i, (a, b, c) in enumerate(zip(on_gloo[r], on_atlas[r], plain[r], strict=True)):
            torch.testing.assert_close(a, b, msg=f"rank {r}, result {i}: intra_site gloo vs atlas")
            torch.testing.assert_close(a, c, msg=f"rank {r}, result {i}: intra_site gloo vs a plain gloo group")
        for i in (0, 1, 3, 4):
            assert torch.equal(on_gloo[r][i], on_gloo[0][i]), (r, i)


def _premul(factor: float):
    return dist._make_nccl_premul_sum(factor)


def _direct_program(pg, rank: int) -> list[torch.Tensor]:
    """After a first collective (which finds the topology and builds the site's gloo
    group), every form of collective a one-site group hands to gloo from the caller's
    thread; records on the group whether each work was gloo's (`direct`)."""
    pg.allreduce([torch.ones(1)]).wait()
    out, kinds = [], []

    def opt(cls, **fields):
        o = cls()
        for k, v in fields.items():
            setattr(o, k, v)
        return o

    def done(work, *tensors):
        kinds.append(type(work).__name__)
        if len(kinds) % 2:
            work.wait()
        else:  # every other one through its future (atlas's when AVG divides after gloo)
            work.get_future().wait()
            work.wait()  # and then wait() too: the division happens once
        out.extend(t.clone() for t in tensors)

    x = torch.arange(12, dtype=torch.float32) + rank
    done(pg.allreduce([x], opt(dist.AllreduceOptions, reduceOp=dist.ReduceOp.AVG)), x)
    y = torch.arange(6, dtype=torch.float64) * (rank + 1)
    done(pg.allreduce([y], opt(dist.AllreduceOptions, reduceOp=_premul(0.25))), y)
    a, b = torch.full((3,), float(rank)), torch.arange(5, dtype=torch.int64) * rank
    done(pg.allreduce_coalesced([a, b]), a, b)
    rs = torch.empty(2, 4)
    done(pg._reduce_scatter_base(rs, torch.arange(SIZE * 8, dtype=torch.float32).view(SIZE * 2, 4) + rank,
                                 opt(dist.ReduceScatterOptions, reduceOp=dist.ReduceOp.AVG)), rs)
    rp = torch.empty(3)
    done(pg._reduce_scatter_base(rp, torch.arange(SIZE * 3, dtype=torch.float32) * (rank + 1),
                                 opt(dist.ReduceScatterOptions, reduceOp=_premul(0.5))), rp)
    rl = torch.empty(4)
    done(pg.reduce_scatter([rl], [[torch.full((4,), float(rank * SIZE + p)) for p in range(SIZE)]],
                           opt(dist.ReduceScatterOptions, reduceOp=dist.ReduceOp.AVG)), rl)
    c1, c2 = torch.empty(2), torch.empty(3, dtype=torch.float64)
    done(pg.reduce_scatter_tensor_coalesced([c1, c2], [torch.arange(SIZE * 2.0) + rank,
                                                       torch.arange(SIZE * 3, dtype=torch.float64) * rank]), c1, c2)
    gl = [torch.empty(2) for _ in range(SIZE)]
    done(pg.allgather([gl], [torch.full((2,), float(rank))]), *gl)
    gc = [[torch.empty(1), torch.empty(2, dtype=torch.int64)] for _ in range(SIZE)]
    done(pg.allgather_coalesced(gc, [torch.full((1,), float(rank)), torch.full((2,), rank)]), *(t for ts in gc for t in ts))
    g1, g2 = torch.empty(SIZE * 2), torch.empty(SIZE, dtype=torch.int32)
    done(pg.allgather_into_tensor_coalesced([g1, g2], [torch.full((2,), float(rank)),
                                                       torch.full((1,), rank, dtype=torch.int32)]), g1, g2)
    b1, b2 = (torch.arange(3.0), torch.arange(4)) if rank == 2 else (torch.zeros(3), torch.zeros(4, dtype=torch.int64))
    done(pg.broadcast([b1, b2], opt(dist.BroadcastOptions, rootRank=2)), b1, b2)
    splits = [p + 1 for p in range(SIZE)]  # uneven: rank r sends p + 1 rows to rank p
    a2a_in = torch.arange(sum(splits) * 2, dtype=torch.float32).view(-1, 2) + 100 * rank
    a2a_out = torch.empty(SIZE * (rank + 1), 2)
    done(pg.alltoall_base(a2a_out, a2a_in, [rank + 1] * SIZE, splits), a2a_out)
    done(pg.barrier())
    DIRECT_KINDS[(pg._label, rank)] = kinds
    return out


DIRECT_KINDS: dict = {}


def test_a_one_site_group_hands_every_form_to_gloo_from_the_callers_thread(monkeypatch):
    """AVG and PREMUL_SUM, the coalesced and list forms, uneven all_to_all and barrier
    go to the site's gloo group as gloo's works (no hop through the collectives thread),
    with the results of atlas channels (AVG divided once, also through the future)."""
    monkeypatch.setenv("ATLAS_SITE", "dc")
    on_gloo = _run(_atlas("gloo"), "direct-gloo", _direct_program)
    on_atlas = _run(_atlas("atlas"), "direct-atlas", _direct_program)
    for r in range(SIZE):
        assert set(DIRECT_KINDS[("direct-gloo", r)]) == {"GlooWork"}, DIRECT_KINDS[("direct-gloo", r)]
        assert "GlooWork" not in DIRECT_KINDS[("direct-atlas", r)]
        for i, (a, b) in enumerate(zip(on_gloo[r], on_atlas[r], strict=True)):
            torch.testing.assert_close(a, b, msg=f"rank {r}, result {i}: direct to gloo vs atlas channels")
    mean = sum(torch.arange(12, dtype=torch.float32) + r for r in range(SIZE)) / SIZE
    assert torch.equal(on_gloo[0][0], mean)  # AVG: summed by gloo, divided once
    assert torch.equal(on_gloo[1][1], sum(torch.arange(6, dtype=torch.float64) * (r + 1) for r in range(SIZE)) * 0.25)
