"""A 2-D ``DeviceMesh``: tensor parallelism inside a DC, FSDP across DCs. ``world =
dp x tp`` ranks on ``init_device_mesh("cpu", (dp, tp), mesh_dim_names=("dp", "tp"))``:
the ranks of a ``tp`` row are consecutive (``testbed launch`` places ranks dc1-h1,
dc1-h2, dc2-h1, dc2-h2, so on topologies/2dc.yaml with ``--tp 2`` each DC holds one
tensor-parallel pair and FSDP shards across the WAN).

- each block's MLP is split Megatron-style over the ``tp`` dimension
  (``parallelize_module``: ``up`` with ``ColwiseParallel``, ``down`` with
  ``RowwiseParallel``: one all_reduce forward and one backward per block, inside the DC);
- every block, then the whole model, is ``fully_shard``-ed over the ``dp`` dimension
  (all-gathers and reduce-scatters across DCs);
- the ranks of a ``tp`` row train on the same shard of the global batch, the ``dp``
  replicas on different shards; the collectives go over the backend ``BACKEND`` names.

    testbed launch topologies/2dc.yaml --env BACKEND=atlas -- python examples/mesh2d.py --tp 2
    torchrun --nproc-per-node 4 examples/mesh2d.py --tp 2
    python examples/mesh2d.py --reference --world 4 --tp 2     # one process, no torch.distributed

Rank 0 prints ``{"step", "loss", "step_s", "rank"}`` per step (loss: the mean over the
whole global batch), every other rank ``{"step", "step_s", "rank"}``; each rank ends with
a digest of the full parameters (``full_tensor()`` of every 2-D DTensor).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (  # noqa: E402
    Model,
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
    p.add_argument("--tp", type=int, default=2, help="tensor-parallel ranks per row (dp = world / tp)")
    p.add_argument("--steps", type=int, default=6, help="training steps")
    p.add_argument("--batch", type=int, default=64, help="rows per data-parallel replica per step")
    p.add_argument("--dim", type=int, default=256, help="model width")
    p.add_argument("--hidden", type=int, default=1024, help="hidden size of each block's MLP (a multiple of --tp)")
    p.add_argument("--blocks", type=int, default=4, help="residual blocks (one fully_shard unit each)")
    add_common_args(p, reference="one process, every replica's data", world=4)
    args = p.parse_args(argv)
    check_at_least_one(p, args, ("tp", "steps", "batch", "dim", "hidden", "blocks", "world", "threads"))
    if args.hidden % args.tp:
        p.error(f"--hidden {args.hidden} is not a multiple of --tp {args.tp}")
    if args.world % args.tp:
        p.error(f"--world {args.world} is not a multiple of --tp {args.tp}")
    return args


def replica_batch(args: argparse.Namespace, dp: int, step: int, replica: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Replica `replica`'s shard of step `step`'s global batch (dp x batch rows)."""
    rows = args.batch * dp
    x = torch.randn(rows, args.dim, generator=seeded(args.seed * 100_003 + 2 * step))
    y = torch.randn(rows, args.dim, generator=seeded(args.seed * 100_003 + 2 * step + 1))
    return x.chunk(dp)[replica], y.chunk(dp)[replica]


def reference(args: argparse.Namespace) -> None:
    """The same steps in one process: each replica's mean loss, averaged over the
    replicas as FSDP averages the gradients over ``dp`` (tensor parallelism splits the
    arithmetic, not the data)."""
    model = build_model(args)
    dp = args.world // args.tp

    def replica_losses(step: int) -> list[torch.Tensor]:
        return [nn.functional.mse_loss(model(xs), ys)
                for xs, ys in (replica_batch(args, dp, step, r) for r in range(dp))]
    train_reference(model, args, replica_losses)


def distributed(args: argparse.Namespace) -> None:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    backend = backend_from_env()
    rank, world = init_distributed(backend)
    if world % args.tp:
        raise SystemExit(f"world size {world} is not a multiple of --tp {args.tp}")
    dp = world // args.tp
    mesh = init_device_mesh("cpu", (dp, args.tp), mesh_dim_names=("dp", "tp"))
    replica = mesh.get_local_rank("dp")
    model = build_model(args)
    for block in model.blocks:
        parallelize_module(block, mesh["tp"], {"up": ColwiseParallel(), "down": RowwiseParallel()})
        fully_shard(block, mesh=mesh["dp"])
    fully_shard(model, mesh=mesh["dp"])
    opt = torch.optim.SGD(model.parameters(), lr=args.lr)
    if rank == 0:
        params = sum(p.numel() for p in Model(args).parameters())
        log(f"mesh2d: dp {dp} x tp {args.tp} (tp rows: "
            f"{', '.join(str(list(range(r * args.tp, (r + 1) * args.tp))) for r in range(dp))}), backend {backend}, "
            f"{params * 4 / 2**20:.1f} MiB of parameters, {args.batch * args.dim * 4 / 2**20:.2f} MiB per "
            "tensor-parallel all_reduce")
    for step in range(args.steps):
        xs, ys = replica_batch(args, dp, step, replica)
        with timed() as took:
            opt.zero_grad(set_to_none=True)
            loss = nn.functional.mse_loss(model(xs), ys)
            loss.backward()
            opt.step()
        total = loss.detach().clone()
        dist.all_reduce(total)  # every rank of a tp row holds its replica's loss (outside the step's time)
        line = {"step": step, "step_s": round(took[0], 6), "rank": rank}
        if rank == 0:
            line["loss"] = float(total / world)
        emit(**line)
    named = {name: p.full_tensor() for name, p in model.named_parameters()}  # 2-D shards gathered
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
