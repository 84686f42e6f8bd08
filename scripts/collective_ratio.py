"""Collectives on loopback, atlas against gloo in one run: median seconds per call and
the atlas / gloo ratio, after checking that both give the same results.

    .venv/bin/python scripts/collective_ratio.py [--ranks 4] [--sites 2] [--sizes 4KiB,8MiB,64MiB] [--iters 5]
    sudo .venv/bin/testbed launch topologies/2dc.yaml --env BACKEND=atlas -- \
        .venv/bin/python scripts/collective_ratio.py --launched --sizes 1MiB,8MiB   # one backend, env://

`--sites S` gives the ranks S site labels (ATLAS_SITE, consecutive ranks per site),
so the hierarchical algorithms run even on one machine; 1: one LAN. Each backend runs
in its own set of processes (torch.multiprocessing), one after the other; ops:
all_reduce, reduce_scatter_tensor, all_gather_into_tensor, broadcast, and a send/recv
between ranks 0 and 1. Figures on a shared machine are noisy: compare the ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

UNITS = {"kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "b": 1}


def parse_size(text: str) -> int:
    t = text.strip().lower()
    for unit, mult in UNITS.items():
        if t.endswith(unit):
            return int(float(t[: -len(unit)]) * mult)
    return int(t)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _timed(fn, iters: int) -> float:
    fn()  # warm-up: channels open, buffers fault in
    times = []
    for _ in range(iters):
        dist.barrier()
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def measure(rank: int, world: int, nbytes: int, iters: int) -> list[tuple[str, int, float, float]]:
    """(op, bytes, median seconds, digest of the result) for each op at one size."""
    n = max(world, nbytes // 4) // world * world
    g = torch.Generator().manual_seed(rank * 7919 + n)
    base = torch.randn(n, generator=g)
    x = base.clone()
    rows = []

    def ar() -> None:
        x.copy_(base)
        dist.all_reduce(x)
    rows.append(("all_reduce", nbytes, _timed(ar, iters), float(x.double().sum())))
    rs_out = torch.empty(n // world)
    rows.append(("reduce_scatter", nbytes, _timed(lambda: dist.reduce_scatter_tensor(rs_out, base), iters),
                 float(rs_out.double().sum())))
    ag_out = torch.empty(n)
    part = base[: n // world].clone()
    rows.append(("all_gather", nbytes, _timed(lambda: dist.all_gather_into_tensor(ag_out, part), iters),
                 float(ag_out.double().sum())))
    bc = base.clone()
    rows.append(("broadcast", nbytes, _timed(lambda: dist.broadcast(bc, src=0), iters), float(bc.double().sum())))

    def p2p() -> None:
        if rank == 0:
            dist.send(base, 1)
        elif rank == 1:
            dist.recv(x, 0)
    rows.append(("send_recv", nbytes, _timed(p2p, iters), 0.0))
    return rows


def worker(rank: int, world: int, backend: str, port: int, sites: int, sizes: list[int], iters: int, out) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    per_site = max(1, world // sites)
    os.environ["ATLAS_SITE"] = f"site{rank // per_site}"
    torch.set_num_threads(1)
    if backend == "atlas":
        import atlas_transport.torch  # noqa: F401
    dist.init_process_group(backend, rank=rank, world_size=world)
    rows = []
    for nbytes in sizes:
        rows += measure(rank, world, nbytes, iters)
    if rank in (0, 1):
        out.put((rank, rows))
    dist.barrier()
    dist.destroy_process_group()


def launched(backend: str, sizes: list[int], iters: int) -> None:
    torch.set_num_threads(1)
    if backend == "atlas":
        import atlas_transport.torch  # noqa: F401
    dist.init_process_group(backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    for nbytes in sizes:
        for op, size, sec, _ in measure(rank, world, nbytes, iters):
            if rank == 0:
                print(json.dumps({"backend": backend, "op": op, "bytes": size, "ms": round(sec * 1e3, 2)}), flush=True)
    dist.barrier()
    dist.destroy_process_group()


def run(backend: str, world: int, sites: int, sizes: list[int], iters: int) -> dict:
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=worker, args=(r, world, backend, port, sites, sizes, iters, q)) for r in range(world)]
    for p in procs:
        p.start()
    got = dict(q.get(timeout=900) for _ in range(2))
    for p in procs:
        p.join(60)
    if any(p.exitcode != 0 for p in procs):
        sys.exit(f"{backend}: a rank failed: exit codes {[p.exitcode for p in procs]}")
    rows = {}
    for op, nbytes, sec, digest in got[0]:
        rows[(op, nbytes)] = {"s": sec, "digest": digest}
    for op, nbytes, sec, _ in got[1]:
        if op == "send_recv":
            rows[(op, nbytes)]["s"] = max(rows[(op, nbytes)]["s"], sec)
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--sites", type=int, default=2)
    p.add_argument("--sizes", default="4KiB,8MiB,64MiB")
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--json", default=None, help="also write the rows to this file")
    p.add_argument("--launched", action="store_true",
                   help="run as one rank of an env:// launch (BACKEND, RANK, WORLD_SIZE...) and print rank 0's rows")
    args = p.parse_args()
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    if args.launched:
        launched(os.environ.get("BACKEND", "gloo"), sizes, args.iters)
        return
    res = {b: run(b, args.ranks, args.sites, sizes, args.iters) for b in ("gloo", "atlas")}
    print(f"{args.ranks} ranks on loopback, {args.sites} site label(s); median of {args.iters} calls")
    print(f"{'op':16}{'bytes':>12}{'gloo ms':>10}{'atlas ms':>10}{'atlas/gloo':>12}  same result")
    table = []
    for key in res["gloo"]:
        g, a = res["gloo"][key], res["atlas"][key]
        same = abs(g["digest"] - a["digest"]) <= 1e-3 * max(1.0, abs(g["digest"]))
        print(f"{key[0]:16}{key[1]:>12}{g['s'] * 1e3:>10.2f}{a['s'] * 1e3:>10.2f}{a['s'] / g['s']:>12.2f}  {same}")
        table.append({"op": key[0], "bytes": key[1], "gloo_s": g["s"], "atlas_s": a["s"], "same": same})
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"ranks": args.ranks, "sites": args.sites, "iters": args.iters, "rows": table}, f, indent=1)


if __name__ == "__main__":
    main()
