"""Data-parallel training with ``DistributedDataParallel``: a small MLP replicated on
every rank, each rank a shard of the global batch, the gradients all-reduced every step
by the backend ``BACKEND`` names (gloo or atlas).

    testbed launch topologies/2dc.yaml --hosts dc1-h1,dc2-h1 --env BACKEND=atlas -- \\
        python examples/ddp.py --steps 8
    torchrun --nproc-per-node 2 examples/ddp.py
    python examples/ddp.py --reference --world 2     # one process, no torch.distributed

Rank 0 prints ``{"step", "loss", "step_s", "rank"}`` per step (loss: the mean over the
whole global batch), every other rank ``{"step", "step_s", "rank"}``; each rank ends with
a digest of its parameters (examples/_common.py).
"""

from __future__ import annotations

import argparse
import sys
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
    train_reference,
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=6, help="training steps")
    p.add_argument("--batch", type=int, default=256, help="rows per rank per step")
    p.add_argument("--inputs", type=int, default=64, help="input features")
    p.add_argument("--hidden", type=int, default=1024, help="hidden size (parameters ~ 2 x inputs x hidden)")
    add_common_args(p, reference="one process, the whole global batch", world=2)
    args = p.parse_args(argv)
    check_at_least_one(p, args, ("steps", "batch", "inputs", "hidden", "world", "threads"))
    return args


def build_model(args: argparse.Namespace) -> nn.Sequential:
    torch.manual_seed(args.seed)
    return nn.Sequential(nn.Linear(args.inputs, args.hidden), nn.ReLU(), nn.Linear(args.hidden, args.inputs))


def global_batch(args: argparse.Namespace, world: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Step `step`'s global batch (world x batch rows); rank k trains on the k-th shard."""
    rows = args.batch * world
    x = torch.randn(rows, args.inputs, generator=seeded(args.seed * 100_003 + 2 * step))
    y = torch.randn(rows, args.inputs, generator=seeded(args.seed * 100_003 + 2 * step + 1))
    return x, y


def reference(args: argparse.Namespace) -> None:
    """The same steps in one process: the shards' mean losses averaged, as DDP averages
    the gradients."""
    model = build_model(args)

    def shard_losses(step: int) -> list[torch.Tensor]:
        x, y = global_batch(args, args.world, step)
        return [nn.functional.mse_loss(model(xs), ys)
                for xs, ys in zip(x.chunk(args.world), y.chunk(args.world), strict=True)]
    train_reference(model, args, shard_losses)


def distributed(args: argparse.Namespace) -> None:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    backend = backend_from_env()
    rank, world = init_distributed(backend)
    model = build_model(args)
    ddp = DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=args.lr)
    if rank == 0:
        params = sum(p.numel() for p in model.parameters())
        log(f"ddp: {world} ranks, backend {backend}, {params * 4 / 2**20:.1f} MiB of gradients all-reduced a step")
    for step in range(args.steps):
        x, y = global_batch(args, world, step)
        xs, ys = x.chunk(world)[rank], y.chunk(world)[rank]
        with timed() as took:
            opt.zero_grad(set_to_none=True)
            loss = nn.functional.mse_loss(ddp(xs), ys)
            loss.backward()
            opt.step()
        total = loss.detach().clone()
        dist.all_reduce(total)  # the global batch's loss, for the line (outside the step's time)
        line = {"step": step, "step_s": round(took[0], 6), "rank": rank}
        if rank == 0:
            line["loss"] = float(total / world)
        emit(**line)
    named = dict(model.named_parameters())
    emit(final=True, rank=rank, params=param_digest(named))
    save_params(args.save, f"rank-{rank}.pt", named)
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.reference:
        reference(args)
    else:
        distributed(args)


if __name__ == "__main__":
    main()
