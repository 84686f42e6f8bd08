"""The hierarchical collectives through the real backend: four ProcessGroupAtlas
ranks as threads of this process over real atlas channels on loopback, told they sit
in two sites (as ATLAS_SITE would), against hand-computed results."""

from __future__ import annotations

import threading
from datetime import timedelta

import torch
import torch.distributed as dist

from atlas_transport.torch.backend import ProcessGroupAtlas
from atlas_transport.torch.topology import Topology

SIZE = 4
TOPO = Topology(((0, 2), (1, 3)))  # interleaved: every pair of neighbours crosses the "WAN"


def _rank(rank: int, store, results: dict, errors: list) -> None:
    pg = None
    try:
        pg = ProcessGroupAtlas(store, rank, SIZE, timedelta(seconds=30), "sites-test")
        pg._posting.topology = TOPO
        big = torch.arange(300_001, dtype=torch.float32) * (rank + 1) / 7  # past the one-round size
        small = torch.full((3,), float(rank + 1))
        pg.allreduce([big]).wait()
        pg.allreduce([small]).wait()
        rs_out = torch.empty(1000, dtype=torch.float64)
        rs_in = torch.arange(SIZE * 1000, dtype=torch.float64) + rank
        pg.reduce_scatter_single(rs_out, rs_in).wait()
        ag_out = torch.empty(SIZE * 5)
        pg.all_gather_single(ag_out, torch.full((5,), float(rank))).wait()
        opts = dist.BroadcastOptions()
        opts.rootRank = 1
        bc = torch.arange(200_000.0) if rank == 1 else torch.zeros(200_000)
        pg.broadcast([bc], opts).wait()
        results[rank] = (big, small, rs_out, ag_out, bc)
    except BaseException as exc:  # noqa: BLE001
        errors.append(exc)
    finally:
        if pg is not None:
            pg.shutdown()


def test_two_sites_over_real_channels():
    store = dist.HashStore()
    results: dict = {}
    errors: list = []
    threads = [threading.Thread(target=_rank, args=(r, store, results, errors)) for r in range(SIZE)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    base = torch.arange(300_001, dtype=torch.float32) / 7
    parts = [base * (r + 1) for r in range(SIZE)]
    want_big = parts[0] + parts[2] + parts[1] + parts[3]  # any order: within rounding
    for r in range(SIZE):
        big, small, rs_out, ag_out, bc = results[r]
        assert torch.equal(big, results[0][0])  # bit-identical on every rank
        torch.testing.assert_close(big, want_big)
        assert small.tolist() == [10.0] * 3
        rs_want = sum(torch.arange(SIZE * 1000, dtype=torch.float64)[r * 1000:(r + 1) * 1000] + p
                      for p in range(SIZE))
        assert torch.equal(rs_out, rs_want)
        assert ag_out.tolist() == [float(p) for p in range(SIZE) for _ in range(5)]
        assert torch.equal(bc, torch.arange(200_000.0))
