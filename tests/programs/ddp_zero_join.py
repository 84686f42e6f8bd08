"""DDP with ZeroRedundancyOptimizer, then uneven inputs under ``Join``, as a user writes it.

Phase 1: ``DDP(gradient_as_bucket_view=True)`` with ``ZeroRedundancyOptimizer`` (SGD with
momentum; each rank steps its shard of the parameters and broadcasts it). Phase 2: rank r
has ``BATCHES - r`` batches; ``with Join([ddp]):`` lets the ranks that run out shadow the
others' all-reduces (zeros; the gradient is still divided by the world size), with a plain
SGD optimizer. Also a ``broadcast_object_list`` of the run's settings, a ``barrier`` and an
``all_gather_object`` of each rank's batch count. Rank 0 (which has the most batches)
writes the parameters.

    torchrun --nproc-per-node 4 ddp_zero_join.py --out params.pt    # BACKEND=gloo|atlas
    python ddp_zero_join.py --reference --world 4 --out ref.pt       # one process
"""

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

STEPS_ZERO, BATCHES = 2, 5


def model_fn():
    torch.manual_seed(21)
    return nn.Sequential(nn.Linear(20, 64), nn.SiLU(), nn.Linear(64, 64), nn.SiLU(), nn.Linear(64, 3))


def batch(phase, step, rank):
    g = torch.Generator().manual_seed(10_000 * phase + 100 * step + rank)
    x = torch.randn(16, 20, generator=g)
    return x, x[:, :3].tanh()


def reference(args):
    model = model_fn()
    world = args.world
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for step in range(STEPS_ZERO):
        opt.zero_grad()
        for r in range(world):
            x, y = batch(1, step, r)
            (F.mse_loss(model(x), y) / world).backward()
        opt.step()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.5)
    for step in range(BATCHES):
        opt.zero_grad()
        for r in range(world):
            if step < BATCHES - r:
                x, y = batch(2, step, r)
                (F.mse_loss(model(x), y) / world).backward()
        opt.step()
    torch.save({k: v.detach().clone() for k, v in model.state_dict().items()}, args.out)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--reference", action="store_true")
    p.add_argument("--world", type=int, default=4)
    args = p.parse_args()
    if args.reference:
        return reference(args)

    from torch.distributed.algorithms.join import Join
    from torch.distributed.optim import ZeroRedundancyOptimizer
    from torch.nn.parallel import DistributedDataParallel as DDP

    backend = os.environ.get("BACKEND", "gloo")
    if backend == "atlas":
        import atlas_transport.torch  # noqa: F401
    dist.init_process_group(backend=backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    assert world <= BATCHES, f"needs at most {BATCHES} ranks"
    settings = [{"lr": 0.1, "momentum": 0.9}] if rank == 0 else [None]
    dist.broadcast_object_list(settings, src=0)
    model = model_fn()
    ddp = DDP(model, gradient_as_bucket_view=True)
    zero = ZeroRedundancyOptimizer(ddp.parameters(), optimizer_class=torch.optim.SGD, **settings[0])
    for step in range(STEPS_ZERO):
        zero.zero_grad()
        x, y = batch(1, step, rank)
        F.mse_loss(ddp(x), y).backward()
        zero.step()
    dist.barrier()
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.5)
    mine = BATCHES - rank
    counts = [None] * world
    dist.all_gather_object(counts, mine)
    assert counts == [BATCHES - r for r in range(world)], counts
    with Join([ddp]):
        for step in range(mine):
            opt.zero_grad()
            x, y = batch(2, step, rank)
            F.mse_loss(ddp(x), y).backward()
            opt.step()
    if rank == 0:
        torch.save({k: v.detach().clone() for k, v in model.state_dict().items()}, args.out)
        print(f"saved {args.out}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
