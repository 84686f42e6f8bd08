"""One rank of `testbed bench collectives`: times torch.distributed collectives over
the backend ``BACKEND`` names (gloo or atlas), size by size, and (rank 0) reports
each point as one JSON line.

A plain ``env://`` program, so it runs wherever `testbed launch` starts ranks (inside
the emulated hosts) and, through `run_local`, as N torch.multiprocessing children on
loopback:

    BACKEND=atlas python -m testbed.bench.collectives_worker --config '{"sizes": [4096], ...}'

The default process group is the backend under test; a gloo group beside it carries
the bookkeeping (agreeing on iterations, a barrier before each timed loop, the slowest
rank's time, errors), so that none of it is counted or depends on the backend measured.

Per collective and size (nccl-tests' conventions for the size S, doc/PERFORMANCE.md):

- all_reduce: a float32 tensor of S bytes, summed in place;
- all_gather: ``all_gather_single`` (``all_gather_into_tensor`` before torch 2.13), S
  bytes gathered (S/n from each rank);
- reduce_scatter: ``reduce_scatter_single`` (``reduce_scatter_tensor``), S bytes in,
  S/n out per rank;
- all_to_all: ``all_to_all_single``, S bytes in and out per rank, S/n to each peer;
- send_recv: a ring: each rank sends S bytes to the next (``isend``) while it receives
  S bytes from the one before (``irecv``).

The first warm-up call's result is checked on every rank (values that differ per
rank, chunk and element, so a swapped chunk or a missed peer shows); then
``iters`` calls (fewer when the warm-up says they would take more than ``budget_s``)
run back to back after a barrier; the time of a call is the slowest rank's loop
time divided by ``iters``. A collective that fails on any rank is reported with the
first failing rank's error and its larger sizes are skipped, as are the sizes after
one whose call took longer than ``max_op_s``.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING

from testbed.bench.collectives import (
    BenchConfig,
    CollectivesError,
    PointResult,
    algbw_gbit_s,
    busbw_gbit_s,
)

if TYPE_CHECKING:
    import torch

PATTERN = 1009  # element i of a chunk carries i % PATTERN (exact in float32 with the offsets below)
STRIDE = 2000.0  # a rank's or a chunk's offset step: > PATTERN, small enough to stay exact


def _pattern(count: int, offset: float = 0.0) -> torch.Tensor:
    import torch

    return (torch.arange(count, dtype=torch.int64) % PATTERN).to(torch.float32) + offset


class _Point:
    """The tensors of one (collective, size) on one rank, the call, and its check."""

    def __init__(self, collective: str, size: int, rank: int, world: int) -> None:
        import torch

        self.collective, self.rank, self.world = collective, rank, world
        count = max(world, size // 4 // world * world)  # float32 elements, a multiple of the world
        self.count, self.chunk = count, count // world
        self.size_bytes = count * 4
        n, c = world, self.chunk
        if collective == "all_reduce":
            self.inp = _pattern(count, rank)
        elif collective == "all_gather":
            self.inp = _pattern(c, STRIDE * rank)
            self.out = torch.empty(count)
        elif collective == "reduce_scatter":
            self.inp = _pattern(count, rank)
            self.out = torch.empty(c)
        elif collective == "all_to_all":
            self.inp = torch.cat([_pattern(c, STRIDE * (rank * n + j)) for j in range(n)])
            self.out = torch.empty(count)
        elif collective == "send_recv":
            self.inp = _pattern(count, rank)
            self.out = torch.empty(count)
        else:
            raise ValueError(f"unknown collective {collective!r}")

    def call(self) -> None:
        import torch.distributed as dist

        kind = self.collective
        if kind == "all_reduce":
            dist.all_reduce(self.inp)
        elif kind == "all_gather":  # all_gather_into_tensor, as torch 2.13 names it
            dist.all_gather_single(self.out, self.inp)
        elif kind == "reduce_scatter":  # reduce_scatter_tensor, as torch 2.13 names it
            dist.reduce_scatter_single(self.out, self.inp)
        elif kind == "all_to_all":
            dist.all_to_all_single(self.out, self.inp)
        else:
            nxt, prev = (self.rank + 1) % self.world, (self.rank - 1) % self.world
            works = dist.batch_isend_irecv([dist.P2POp(dist.isend, self.inp, nxt),
                                            dist.P2POp(dist.irecv, self.out, prev)])
            for w in works:
                w.wait()

    def check(self) -> str | None:
        """After the first call: None when every element is what it must be, else what differs."""
        import torch

        n, c, kind = self.world, self.chunk, self.collective
        if kind == "all_reduce":
            got, want = self.inp, _pattern(self.count) * n + n * (n - 1) / 2
        elif kind == "all_gather":
            got, want = self.out, torch.cat([_pattern(c, STRIDE * k) for k in range(n)])
        elif kind == "reduce_scatter":
            start = self.rank * c
            base = (torch.arange(start, start + c, dtype=torch.int64) % PATTERN).to(torch.float32)
            got, want = self.out, base * n + n * (n - 1) / 2
        elif kind == "all_to_all":
            got, want = self.out, torch.cat([_pattern(c, STRIDE * (j * n + self.rank)) for j in range(n)])
        else:
            got, want = self.out, _pattern(self.count, (self.rank - 1) % n)
        bad = (got != want).nonzero()
        if not bad.numel():
            return None
        i = int(bad[0])
        return (f"rank {self.rank}: {bad.numel()} of {got.numel()} elements wrong, the first at {i} "
                f"(chunk {i // c}): {float(got[i])} where {float(want[i])} was due")


def run_rank(cfg: BenchConfig, backend: str, emit: Callable[[PointResult], None],
             say: Callable[[str], None]) -> None:
    """Every point of `cfg` on this rank (the process group is already up); rank 0
    passes each result to `emit` and progress to `say`."""
    import torch
    import torch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()
    ctrl = dist.new_group(backend="gloo")
    lead = rank == 0

    def agree_max(*values: float) -> list[float]:
        t = torch.tensor(values, dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=ctrl)
        return t.tolist()

    def first_error(err: str | None) -> str | None:
        """The first rank's error, on every rank (None when no rank failed)."""
        if not agree_max(1.0 if err else 0.0)[0]:
            return None
        errs: list[str | None] = [None] * world
        dist.all_gather_object(errs, err, group=ctrl)
        return next(f"rank {k}: {e}" for k, e in enumerate(errs) if e)

    for kind in cfg.collectives:
        skip: str | None = None
        for size in cfg.sizes:
            row = PointResult(backend=backend, collective=kind, world_size=world, size=size, size_bytes=size)
            if skip:
                row.skipped = skip
                if lead:
                    emit(row)
                continue
            point = _Point(kind, size, rank, world)
            row.size_bytes = point.size_bytes
            err: str | None = None
            wrong: str | None = None
            t0 = time.perf_counter()
            try:
                point.call()
                wrong = point.check()
                for _ in range(cfg.warmup - 1):
                    point.call()
            except Exception as exc:  # reported (and the collective's larger sizes skipped), not raised
                err = f"{type(exc).__name__}: {exc}"
                traceback.print_exc(file=sys.stderr)
            warm_s = (time.perf_counter() - t0) / cfg.warmup
            row.error = first_error(err)
            if row.error is None:
                wrong_any = first_error(wrong)
                row.verified = wrong_any is None
                if wrong_any:
                    row.error = f"wrong result: {wrong_any}"
            if row.error is not None:
                skip = f"{kind} failed at {point.size_bytes} bytes"
                if lead:
                    emit(row)
                    say(f"{backend} {kind} {point.size_bytes} B: {row.error}")
                continue
            (warm_max,) = agree_max(warm_s)
            iters = max(1, min(cfg.iters, int(cfg.budget_s / warm_max) if warm_max > 0 else cfg.iters))
            dist.barrier(group=ctrl)
            t0 = time.perf_counter()
            try:
                for _ in range(iters):
                    point.call()
            except Exception as exc:
                err = f"{type(exc).__name__}: {exc}"
                traceback.print_exc(file=sys.stderr)
            elapsed = time.perf_counter() - t0
            row.error = first_error(err)
            if row.error is not None:
                skip = f"{kind} failed at {point.size_bytes} bytes"
            else:
                (slowest,) = agree_max(elapsed)
                row.iters = iters
                row.time_s = slowest / iters
                row.algbw_gbit_s = algbw_gbit_s(point.size_bytes, row.time_s)
                row.busbw_gbit_s = busbw_gbit_s(kind, world, point.size_bytes, row.time_s)
                if row.time_s > cfg.max_op_s:
                    skip = (f"the {point.size_bytes}-byte {kind} took {row.time_s:.1f} s a call, over "
                            f"max_op_s {cfg.max_op_s:g}")
            if lead:
                emit(row)
                say(f"{backend} {kind} {point.size_bytes} B: "
                    + (row.error or f"{row.time_s * 1e3:.2f} ms x {iters}, busbw {row.busbw_gbit_s:.3f} Gbit/s"))
            del point


def _import_backend(backend: str) -> None:
    if backend == "atlas":
        import atlas_transport.torch  # noqa: F401  (registers the backend "atlas")


def run_env_rank(cfg: BenchConfig, emit: Callable[[PointResult], None], say: Callable[[str], None]) -> None:
    """This process as one rank of an ``env://`` launch: the backend from ``BACKEND``."""
    import torch
    import torch.distributed as dist

    backend = os.environ.get("BACKEND", "gloo").strip().lower() or "gloo"
    if backend not in ("gloo", "atlas"):
        raise SystemExit(f"BACKEND={backend!r}: unknown backend; use gloo or atlas")
    torch.set_num_threads(1)
    _import_backend(backend)
    dist.init_process_group(backend=backend, timeout=timedelta(seconds=cfg.timeout_s))
    try:
        run_rank(cfg, backend, emit, say)
    finally:
        dist.destroy_process_group()


def run_local_rank(rank: int, world: int, port: int, backend: str, config_json: str, results_path: str) -> None:
    """A torch.multiprocessing child of the local mode: rank `rank` on 127.0.0.1; rank 0
    appends each result as a JSON line to `results_path`."""
    os.environ.update({"RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank),
                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "BACKEND": backend,
                       "GLOO_SOCKET_IFNAME": "lo"})
    cfg = BenchConfig.model_validate_json(config_json)

    def emit(row: PointResult) -> None:
        with open(results_path, "a") as fh:
            fh.write(row.model_dump_json() + "\n")

    run_env_rank(cfg, emit, _say)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_local(world: int, backends: list[str], cfg: BenchConfig,
              on_result: Callable[[PointResult], None] | None = None) -> tuple[list[PointResult], list[str]]:
    """`world` ranks on 127.0.0.1 (torch.multiprocessing, spawned), once per backend;
    the results and a message per backend whose ranks failed (what they did measure is
    kept)."""
    import torch.multiprocessing as mp

    if world < 2:
        raise CollectivesError(f"--local {world}: collectives need 2 or more ranks")
    results: list[PointResult] = []
    failures: list[str] = []
    for backend in backends:
        with tempfile.TemporaryDirectory(prefix="bench-collectives-") as tmp:
            path = Path(tmp) / "results.jsonl"
            path.write_text("")
            try:
                mp.start_processes(run_local_rank, args=(world, _free_port(), backend, cfg.model_dump_json(), str(path)),
                                   nprocs=world, join=True, start_method="spawn")
            except Exception as exc:  # ProcessRaisedException / ProcessExitedException: one rank failed
                first = str(exc).strip().splitlines()
                failures.append(f"{backend}: a rank failed: {first[-1] if first else type(exc).__name__}")
            rows = [PointResult.model_validate_json(line) for line in path.read_text().splitlines() if line.strip()]
        for row in rows:
            if on_result:
                on_result(row)
        results += rows
    return results, failures


def _say(text: str) -> None:
    sys.stderr.write(f"[collectives] {text}\n")
    sys.stderr.flush()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m testbed.bench.collectives_worker", description=__doc__.split("\n\n")[0])
    p.add_argument("--config", required=True, help="the BenchConfig as JSON")
    a = p.parse_args(argv)
    cfg = BenchConfig.model_validate_json(a.config)

    def emit(row: PointResult) -> None:
        sys.stdout.write(json.dumps({"event": "result", **row.model_dump()}) + "\n")
        sys.stdout.flush()

    run_env_rank(cfg, emit, _say)
    return 0


if __name__ == "__main__":
    sys.exit(main())
