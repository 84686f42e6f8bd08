"""2-D parallel training: FSDP2 across "dp", tensor + sequence parallel inside "tp".

A user's torchtitan-style program: ``init_device_mesh("cpu", (dp, tp),
mesh_dim_names=("dp", "tp"))``; ``parallelize_module`` on ``mesh["tp"]`` with
RowwiseParallel (input projection, replicated input, sequence-sharded output),
SequenceParallel LayerNorms, ColwiseParallel / RowwiseParallel MLPs, and a
ColwiseParallel head whose vocabulary-sharded logits go to ``loss_parallel()``;
then ``fully_shard`` per block and on the root over ``mesh["dp"]``. Ranks
of one dp replica read the same batch.

    torchrun --nproc-per-node 4 tp_fsdp_2d.py --out params.pt   # BACKEND=gloo|atlas
    python tp_fsdp_2d.py --reference --world 4 --out ref.pt      # one process
"""

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

TP, DIN, DIM, SEQ, VOCAB, BATCH = 2, 10, 16, 8, 12, 3


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(DIM)
        self.w1 = nn.Linear(DIM, 4 * DIM)
        self.w2 = nn.Linear(4 * DIM, DIM)

    def forward(self, x):
        return x + self.w2(F.relu(self.w1(self.norm(x))))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(DIN, DIM, bias=False)
        self.layers = nn.ModuleList(Block() for _ in range(2))
        self.norm = nn.LayerNorm(DIM)
        self.head = nn.Linear(DIM, VOCAB, bias=False)

    def forward(self, x):
        h = self.proj(x)
        for layer in self.layers:
            h = layer(h)
        return self.head(self.norm(h))


def data(step, dp_rank):
    g = torch.Generator().manual_seed(100 * step + dp_rank)
    return torch.randn(BATCH, SEQ, DIN, generator=g), torch.randint(0, VOCAB, (BATCH, SEQ), generator=g)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--out", required=True)
    p.add_argument("--reference", action="store_true")
    p.add_argument("--world", type=int, default=4)
    args = p.parse_args()
    torch.manual_seed(42)
    model = Net()
    if args.reference:
        dp = args.world // TP
        opt = torch.optim.AdamW(model.parameters(), lr=5e-3)
        for step in range(args.steps):
            opt.zero_grad()
            for d in range(dp):
                x, y = data(step, d)
                (F.cross_entropy(model(x).flatten(0, 1), y.flatten()) / dp).backward()
            opt.step()
        torch.save({k: v.detach().clone() for k, v in model.state_dict().items()}, args.out)
        return

    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        SequenceParallel,
        loss_parallel,
        parallelize_module,
    )

    backend = os.environ.get("BACKEND", "gloo")
    if backend == "atlas":
        import atlas_transport.torch  # noqa: F401
    dist.init_process_group(backend=backend)
    world = dist.get_world_size()
    mesh = init_device_mesh("cpu", (world // TP, TP), mesh_dim_names=("dp", "tp"))
    tp_mesh, dp_mesh = mesh["tp"], mesh["dp"]
    parallelize_module(model, tp_mesh, {
        "proj": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
        "norm": SequenceParallel(),
        "head": ColwiseParallel(input_layouts=Shard(1), output_layouts=Shard(-1), use_local_output=False),
    })
    for layer in model.layers:
        parallelize_module(layer, tp_mesh, {
            "norm": SequenceParallel(),
            "w1": ColwiseParallel(input_layouts=Shard(1)),
            "w2": RowwiseParallel(output_layouts=Shard(1)),
        })
        fully_shard(layer, mesh=dp_mesh)
    fully_shard(model, mesh=dp_mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=5e-3)
    dp_rank = dp_mesh.get_local_rank()
    for step in range(args.steps):
        opt.zero_grad()
        x, y = data(step, dp_rank)
        with loss_parallel():
            loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
            loss.backward()
        opt.step()
        if dist.get_rank() == 0:
            print(f"step {step} loss {loss.full_tensor().item() if hasattr(loss, 'full_tensor') else loss.item():.6f}",
                  flush=True)
    full = {k: v.full_tensor() for k, v in model.state_dict().items()}
    if dist.get_rank() == 0:
        torch.save(full, args.out)
        print(f"saved {args.out}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
