"""A small transformer-ish MLP stack trained with FSDP2 (``fully_shard``), as a user writes it.

Features: ``fully_shard`` on each block (alternating ``reshard_after_forward`` True/False)
then on the root, AdamW, ``clip_grad_norm_`` over the DTensor gradients, gradient
accumulation with ``set_requires_gradient_sync(False)``, and the full state dict gathered
with ``get_model_state_dict(full_state_dict=True, cpu_offload=True)`` at the end (plus a
``full_tensor()`` check of one parameter), after a round trip through
``torch.distributed.checkpoint``: the sharded state saved with ``dcp.save`` (to
``OUT.dcp/``) and loaded with ``dcp.load`` into a freshly sharded model, which is the one
whose parameters are written.

    torchrun --nproc-per-node 4 fsdp2_blocks.py --out params.pt   # BACKEND=gloo|atlas
    python fsdp2_blocks.py --reference --world 4 --out ref.pt      # one process
"""

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

DIM, BLOCKS, BATCH, ACCUM = 32, 4, 6, 2


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(DIM)
        self.up = nn.Linear(DIM, 3 * DIM)
        self.down = nn.Linear(3 * DIM, DIM)

    def forward(self, x):
        return x + self.down(F.gelu(self.up(self.norm(x))))


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(12, DIM)
        self.blocks = nn.ModuleList(Block() for _ in range(BLOCKS))
        self.out = nn.Linear(DIM, 5)

    def forward(self, x):
        x = self.inp(x)
        for b in self.blocks:
            x = b(x)
        return self.out(x)


def data(step, micro, rank):
    g = torch.Generator().manual_seed(7919 * step + 31 * micro + rank)
    return torch.randn(BATCH, 12, generator=g), torch.randint(0, 5, (BATCH,), generator=g)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--out", required=True)
    p.add_argument("--reference", action="store_true")
    p.add_argument("--world", type=int, default=4)
    args = p.parse_args()
    torch.manual_seed(1234)
    model = Model()
    if args.reference:
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
        for step in range(args.steps):
            opt.zero_grad()
            for micro in range(ACCUM):
                for r in range(args.world):
                    x, y = data(step, micro, r)
                    (F.cross_entropy(model(x), y) / args.world).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=0.5)
            opt.step()
        torch.save({k: v.detach().clone() for k, v in model.state_dict().items()}, args.out)
        return

    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor

    backend = os.environ.get("BACKEND", "gloo")
    if backend == "atlas":
        import atlas_transport.torch  # noqa: F401
    dist.init_process_group(backend=backend)
    rank = dist.get_rank()
    for i, block in enumerate(model.blocks):
        fully_shard(block, reshard_after_forward=(i % 2 == 0))
    fully_shard(model)
    assert all(isinstance(p, DTensor) for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    for step in range(args.steps):
        opt.zero_grad()
        for micro in range(ACCUM):
            model.set_requires_gradient_sync(micro == ACCUM - 1)
            x, y = data(step, micro, rank)
            F.cross_entropy(model(x), y).backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=0.5)
        if rank == 0:
            print(f"step {step} grad norm {float(norm.full_tensor() if isinstance(norm, DTensor) else norm):.6f}",
                  flush=True)
        opt.step()
    import torch.distributed.checkpoint as dcp

    ckpt = args.out + ".dcp"
    dcp.save({"model": model.state_dict()}, checkpoint_id=ckpt)
    torch.manual_seed(99)  # other values, so that the load must bring them
    model = Model()
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    state = {"model": model.state_dict()}
    dcp.load(state, checkpoint_id=ckpt)
    model.load_state_dict(state["model"])
    w = model.blocks[0].up.weight.full_tensor()
    sd = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if rank == 0:
        assert torch.equal(w, sd["blocks.0.up.weight"])
        torch.save({k: v.detach().clone() for k, v in sd.items()}, args.out)
        print(f"saved {args.out}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
