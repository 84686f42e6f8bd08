"""Hybrid parallelism as Atlas places it: pipeline stages across DCs, data parallelism
inside each DC. A world of ``pp x dp`` ranks (4 = 2 DCs x 2 hosts by default): ranks
``s*dp .. s*dp+dp-1`` hold stage ``s``; replica ``r`` is the pipeline ``r, dp+r, ...``.

- the default group is gloo;
- each pipeline's neighbouring stages talk in a subgroup of the backend ``BACKEND``
  names (``dist.new_group([a, b], backend="atlas")``): the activations of every
  micro-batch forward, their gradients back, by ``batch_isend_irecv`` (GPipe order);
- the replicas of a stage average their gradients over a gloo subgroup (``all_reduce``),
  which stays inside the DC.

    testbed launch topologies/2dc.yaml --env BACKEND=atlas -- python examples/hybrid.py
    torchrun --nproc-per-node 4 examples/hybrid.py
    python examples/hybrid.py --reference --world 4     # one process, no torch.distributed

Per step, rank 0 prints ``{"step", "step_s", "rank"}`` and the first rank of the last
stage adds ``loss`` (the mean over all replicas and micro-batches); every rank ends
with a digest of its stage's parameters (examples/_common.py).
"""

from __future__ import annotations

import argparse
import sys
from collections import OrderedDict
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (  # noqa: E402
    add_common_args,
    backend_from_env,
    check_at_least_one,
    emit,
    init_distributed,
    log,
    param_digest,
    save_params,
    seeded,
    timed,
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--stages", type=int, default=2, help="pipeline stages (pp); dp = world / pp")
    p.add_argument("--steps", type=int, default=6, help="training steps")
    p.add_argument("--microbatches", type=int, default=4, help="micro-batches per replica per step")
    p.add_argument("--rows", type=int, default=4096, help="rows per micro-batch")
    p.add_argument("--hidden", type=int, default=64, help="hidden size (boundary tensor: rows x hidden x 4 bytes)")
    add_common_args(p, reference="one process, every replica's data", world=4)
    args = p.parse_args(argv)
    check_at_least_one(p, args, ("stages", "steps", "microbatches", "rows", "hidden", "world", "threads"))
    if args.world % args.stages:
        p.error(f"--world {args.world} is not a multiple of --stages {args.stages}")
    return args


def build_model(args: argparse.Namespace) -> nn.Sequential:
    torch.manual_seed(args.seed)
    layers = OrderedDict()
    for i in range(args.stages):
        layers[f"stage{i}"] = nn.Sequential(nn.Linear(args.hidden, args.hidden), nn.Tanh())
    return nn.Sequential(layers)


def replica_batch(args: argparse.Namespace, dp: int, step: int, replica: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Replica `replica`'s share of step `step`'s global batch."""
    rows = args.rows * args.microbatches * dp
    x = torch.randn(rows, args.hidden, generator=seeded(args.seed * 100_003 + 2 * step))
    y = torch.randn(rows, args.hidden, generator=seeded(args.seed * 100_003 + 2 * step + 1))
    return x.chunk(dp)[replica], y.chunk(dp)[replica]


def reference(args: argparse.Namespace) -> None:
    model = build_model(args)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr)
    dp = args.world // args.stages
    n = args.microbatches
    for step in range(args.steps):
        with timed() as took:
            opt.zero_grad(set_to_none=True)
            losses = []
            for r in range(dp):
                x, y = replica_batch(args, dp, step, r)
                for xs, ys in zip(x.chunk(n), y.chunk(n), strict=True):
                    loss = nn.functional.mse_loss(model(xs), ys)
                    (loss / (n * dp)).backward()
                    losses.append(loss.detach())
            opt.step()
        emit(step=step, loss=float(torch.stack(losses).mean()), step_s=round(took[0], 6), rank=0)
    named = dict(model.named_parameters())
    emit(final=True, rank=0, params=param_digest(named))
    save_params(args.save, "reference.pt", named)


def distributed(args: argparse.Namespace) -> None:
    import torch.distributed as dist

    pipe_backend = backend_from_env()
    rank, world = init_distributed("gloo")
    pp = args.stages
    if world % pp:
        raise SystemExit(f"world size {world} is not a multiple of --stages {pp}")
    dp = world // pp
    stage, replica = divmod(rank, dp)
    # every rank creates every group, in the same order (torch.distributed's rule)
    pairs = {}
    for r in range(dp):
        for s in range(pp - 1):
            pairs[(s, r)] = dist.new_group([s * dp + r, (s + 1) * dp + r], backend=pipe_backend)
    dp_groups = [dist.new_group([s * dp + i for i in range(dp)], backend="gloo") for s in range(pp)]
    model = build_model(args)
    module = model[stage]
    prefix = f"stage{stage}."
    opt = torch.optim.SGD(module.parameters(), lr=args.lr)
    n = args.microbatches
    prev = (stage - 1) * dp + replica if stage > 0 else None
    nxt = (stage + 1) * dp + replica if stage < pp - 1 else None
    if rank == 0:
        log(f"hybrid: pp {pp} x dp {dp}, pipeline pairs over {pipe_backend}, data parallel over gloo, "
            f"{args.rows * args.hidden * 4 / 2**20:.1f} MiB per boundary tensor")
    for step in range(args.steps):
        x, y = replica_batch(args, dp, step, replica)
        xs, ys = x.chunk(n), y.chunk(n)
        with timed() as took:
            opt.zero_grad(set_to_none=True)
            # forward: every micro-batch in (from the stage before, or the data) and out (to the next)
            inputs: list[torch.Tensor] = []
            if prev is None:
                inputs = [t for t in xs]
            else:
                inputs = [torch.empty(args.rows, args.hidden) for _ in range(n)]
                _wait(dist.batch_isend_irecv([dist.P2POp(dist.irecv, t, prev, pairs[(stage - 1, replica)])
                                              for t in inputs]))
                for t in inputs:
                    t.requires_grad_(True)
            outputs = [module(t) for t in inputs]
            losses: list[torch.Tensor] = []
            if nxt is not None:
                _wait(dist.batch_isend_irecv([dist.P2POp(dist.isend, o.detach(), nxt, pairs[(stage, replica)])
                                              for o in outputs]))
                grads = [torch.empty(args.rows, args.hidden) for _ in range(n)]
                _wait(dist.batch_isend_irecv([dist.P2POp(dist.irecv, g, nxt, pairs[(stage, replica)])
                                              for g in grads]))
                for o, g in zip(outputs, grads, strict=True):
                    o.backward(g)
            else:
                for o, t in zip(outputs, ys, strict=True):
                    loss = nn.functional.mse_loss(o, t)
                    (loss / (n * dp)).backward()
                    losses.append(loss.detach())
            if prev is not None:
                _wait(dist.batch_isend_irecv([dist.P2POp(dist.isend, t.grad, prev, pairs[(stage - 1, replica)])
                                              for t in inputs]))
            for p in module.parameters():  # the replicas' gradients summed (each already / dp) inside the DC
                dist.all_reduce(p.grad, group=dp_groups[stage])
            opt.step()
        line = {"step": step, "step_s": round(took[0], 6), "rank": rank}
        if nxt is None:
            total = torch.stack(losses).mean()
            dist.all_reduce(total, group=dp_groups[stage])
            if replica == 0:
                line["loss"] = float(total / dp)
        if rank == 0 or "loss" in line:
            emit(**line)
    named = {prefix + k: v for k, v in module.named_parameters()}
    emit(final=True, rank=rank, params=param_digest(named))
    save_params(args.save, f"rank-{rank}.pt", named)
    dist.destroy_process_group()


def _wait(works: list) -> None:
    for w in works:
        w.wait()


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.reference:
        reference(args)
    else:
        distributed(args)


if __name__ == "__main__":
    main()
