"""Fully sharded data parallelism with FSDP2 (``torch.distributed.fsdp.fully_shard``):
a small residual MLP "transformer-ish" stack (LayerNorm, Linear, GELU, Linear per
block) whose parameters are sharded over every rank of a 1-D ``DeviceMesh``; each
block is all-gathered before its forward and backward and its gradients are
reduce-scattered after, over the backend ``BACKEND`` names (gloo or atlas).

    testbed launch topologies/2dc.yaml --env BACKEND=atlas -- python examples/fsdp2.py
    torchrun --nproc-per-node 2 examples/fsdp2.py
    python examples/fsdp2.py --reference --world 2     # one process, no torch.distributed

Rank 0 prints ``{"step", "loss", "step_s", "rank"}`` per step (loss: the mean over the
whole global batch), every other rank ``{"step", "step_s", "rank"}``; each rank ends with
a digest of the full parameters (the shards gathered with ``full_tensor()``).
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
    build_model,
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
    p.add_argument("--batch", type=int, default=64, help="rows per rank per step")
    p.add_argument("--dim", type=int, default=256, help="model width")
    p.add_argument("--hidden", type=int, default=1024, help="hidden size of each block's MLP")
    p.add_argument("--blocks", type=int, default=4, help="residual blocks (one fully_shard unit each)")
    add_common_args(p, reference="one process, the whole global batch", world=2)
    args = p.parse_args(argv)
    check_at_least_one(p, args, ("steps", "batch", "dim", "hidden", "blocks", "world", "threads"))
    return args


def global_batch(args: argparse.Namespace, world: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Step `step`'s global batch (world x batch rows); rank k trains on the k-th shard."""
    rows = args.batch * world
    x = torch.randn(rows, args.dim, generator=seeded(args.seed * 100_003 + 2 * step))
    y = torch.randn(rows, args.dim, generator=seeded(args.seed * 100_003 + 2 * step + 1))
    return x, y


def reference(args: argparse.Namespace) -> None:
    """The same steps in one process: the shards' mean losses averaged, as FSDP
    averages the reduce-scattered gradients."""
    model = build_model(args)

    def shard_losses(step: int) -> list[torch.Tensor]:
        x, y = global_batch(args, args.world, step)
        return [nn.functional.mse_loss(model(xs), ys)
                for xs, ys in zip(x.chunk(args.world), y.chunk(args.world), strict=True)]
    train_reference(model, args, shard_losses)


def distributed(args: argparse.Namespace) -> None:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    backend = backend_from_env()
    rank, world = init_distributed(backend)
    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("dp",))
    model = build_model(args)
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr)
    if rank == 0:
        params = sum(p.numel() for p in model.parameters())
        log(f"fsdp2: {world} ranks, backend {backend}, {params * 4 / 2**20:.1f} MiB of parameters "
            f"in {args.blocks + 1} units, all-gathered for forward and backward, gradients reduce-scattered")
    for step in range(args.steps):
        x, y = global_batch(args, world, step)
        xs, ys = x.chunk(world)[rank], y.chunk(world)[rank]
        with timed() as took:
            opt.zero_grad(set_to_none=True)
            loss = nn.functional.mse_loss(model(xs), ys)
            loss.backward()
            opt.step()
        total = loss.detach().clone()
        dist.all_reduce(total)  # the global batch's loss, for the line (outside the step's time)
        line = {"step": step, "step_s": round(took[0], 6), "rank": rank}
        if rank == 0:
            line["loss"] = float(total / world)
        emit(**line)
    named = {name: p.full_tensor() for name, p in model.named_parameters()}  # DTensor shards gathered
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
