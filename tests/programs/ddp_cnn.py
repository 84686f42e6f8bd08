"""A small CNN trained with DistributedDataParallel, written the way a user would.

Features: BatchNorm buffers broadcast from rank 0 (broadcast_buffers=True), gradient
accumulation with ``no_sync()``, SGD with momentum, ``find_unused_parameters=True`` with a branch that
only odd ranks use, ``bucket_cap_mb`` small enough for several buckets, and a comm hook
whose future callback starts another collective and waits for it (as PowerSGD does).

    torchrun --nproc-per-node 4 ddp_cnn.py --out params.pt    # BACKEND=gloo|atlas
    python ddp_cnn.py --reference --world 4 --out ref.pt       # one process, same math
"""

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

ACCUM = 2
BATCH = 8


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 16, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(16)
        self.fc = nn.Linear(16 * 4 * 4, 10)
        self.extra = nn.Linear(16 * 4 * 4, 10)  # used by odd ranks only

    def forward(self, x, use_extra=False):
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 2)
        x = F.max_pool2d(F.relu(self.bn2(self.conv2(x))), 2)
        x = x.flatten(1)
        out = self.fc(x)
        if use_extra:
            out = out + 0.5 * self.extra(x)
        return out


def batch(step, micro, rank):
    g = torch.Generator().manual_seed(1000 * step + 10 * micro + rank)
    x = torch.randn(BATCH, 3, 16, 16, generator=g)
    y = torch.randint(0, 10, (BATCH,), generator=g)
    return x, y


def checked_allreduce_hook(state, bucket):
    """Average the bucket; in the last bucket's callback, all-reduce its norm (MAX) on a group
    of its own and wait for it, as PowerSGD starts collectives from its callbacks. (On DDP's
    own group that would race DDP's unused-parameter all-reduce, which the autograd thread
    issues meanwhile: ranks could issue the two in different orders, with any backend.)"""
    world = dist.get_world_size()
    buf = bucket.buffer()
    fut = dist.all_reduce(buf, async_op=True).get_future()

    def then(f):
        out = f.value()[0].div_(world)
        state["calls"] += 1
        if not bucket.is_last():
            return out
        norm = out.norm().reshape(1).clone()
        dist.all_reduce(norm, op=dist.ReduceOp.MAX, group=state["group"], async_op=True).get_future().wait()
        assert torch.isfinite(norm).all()
        state["nested"] += 1
        return out

    return fut.then(then)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--out", required=True)
    p.add_argument("--reference", action="store_true")
    p.add_argument("--world", type=int, default=4)
    args = p.parse_args()
    torch.manual_seed(0)
    model = Net()
    if args.reference:
        return reference(model, args)

    backend = os.environ.get("BACKEND", "gloo")
    if backend == "atlas":
        import atlas_transport.torch  # noqa: F401
    dist.init_process_group(backend=backend)
    rank = dist.get_rank()
    ddp = DDP(model, broadcast_buffers=True, find_unused_parameters=True, bucket_cap_mb=0.004)
    state = {"calls": 0, "nested": 0, "group": dist.new_group()}
    ddp.register_comm_hook(state, checked_allreduce_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-4)
    for step in range(args.steps):
        opt.zero_grad()
        for micro in range(ACCUM):
            x, y = batch(step, micro, rank)
            if micro < ACCUM - 1:
                with ddp.no_sync():
                    F.cross_entropy(ddp(x, use_extra=rank % 2 == 1), y).backward()
            else:
                F.cross_entropy(ddp(x, use_extra=rank % 2 == 1), y).backward()
        opt.step()
    assert state["calls"] >= 2 * args.steps, f"hook ran {state['calls']} times (want several buckets)"
    assert state["nested"] == args.steps, state
    if rank == 0:
        torch.save({k: v.detach().clone() for k, v in model.state_dict().items()}, args.out)
        print(f"saved {args.out}", flush=True)
    dist.destroy_process_group()


def reference(model, args):
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-4)
    buffers = [b for b in model.buffers()]
    for step in range(args.steps):
        opt.zero_grad()
        grads = {n: torch.zeros_like(p) for n, p in model.named_parameters()}
        for micro in range(ACCUM):
            start = [b.clone() for b in buffers]
            after_rank0 = None
            for r in range(args.world):
                for b, s in zip(buffers, start, strict=True):
                    b.copy_(s)  # every rank starts from rank 0's broadcast buffers
                model.zero_grad()
                x, y = batch(step, micro, r)
                F.cross_entropy(model(x, use_extra=r % 2 == 1), y).backward()
                for n, p in model.named_parameters():
                    if p.grad is not None:
                        grads[n] += p.grad
                if r == 0:
                    after_rank0 = [b.clone() for b in buffers]
            for b, s in zip(buffers, after_rank0, strict=True):
                b.copy_(s)
        for n, p in model.named_parameters():
            p.grad = grads[n] / args.world
        opt.step()
    torch.save({k: v.detach().clone() for k, v in model.state_dict().items()}, args.out)


if __name__ == "__main__":
    main()
