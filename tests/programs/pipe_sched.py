"""Pipeline-parallel training with ``torch.distributed.pipelining``, one stage per rank.

Features: the stages built either by hand (``PipelineStage`` over a slice of the layers,
``--split manual``) or by tracing (``pipeline()`` with ``SplitPoint.BEGINNING``,
``--split trace``); ``Schedule1F1B`` or ``ScheduleGPipe`` over ``--microbatches``
micro-batches; SGD with momentum per stage; the parameters of every stage gathered with
``all_gather_object`` at the end. Runs on any number of ranks that divides the layers.

    torchrun --nproc-per-node 4 pipe_sched.py --schedule 1f1b --out params.pt   # BACKEND=gloo|atlas
    python pipe_sched.py --reference --out ref.pt                                  # one process
"""

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

LAYERS, WIDTH, ROWS = 8, 24, 32


class Layer(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(WIDTH, WIDTH)

    def forward(self, x):
        return torch.tanh(self.fc(x)) + x


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.Sequential(*[Layer() for _ in range(LAYERS)])

    def forward(self, x):
        return self.layers(x)


def data(step):
    g = torch.Generator().manual_seed(555 + step)
    x = torch.randn(ROWS, WIDTH, generator=g)
    return x, torch.sin(x.flip(1))


def mse(out, target):
    return F.mse_loss(out, target)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--schedule", choices=["1f1b", "gpipe"], default="1f1b")
    p.add_argument("--split", choices=["manual", "trace"], default="manual")
    p.add_argument("--microbatches", type=int, default=4)
    p.add_argument("--out", required=True)
    p.add_argument("--reference", action="store_true")
    args = p.parse_args()
    torch.manual_seed(3)
    model = Net()
    if args.reference:
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        for step in range(args.steps):
            opt.zero_grad()
            x, y = data(step)
            for xm, ym in zip(x.chunk(args.microbatches), y.chunk(args.microbatches), strict=True):
                (mse(model(xm), ym) / args.microbatches).backward()
            opt.step()
        torch.save({k: v.detach().clone() for k, v in model.state_dict().items()}, args.out)
        return

    from torch.distributed.pipelining import (
        PipelineStage,
        Schedule1F1B,
        ScheduleGPipe,
        SplitPoint,
        pipeline,
    )

    backend = os.environ.get("BACKEND", "gloo")
    if backend == "atlas":
        import atlas_transport.torch  # noqa: F401
    dist.init_process_group(backend=backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    per = LAYERS // world
    mine = list(range(rank * per, (rank + 1) * per))
    if args.split == "manual":
        stage = PipelineStage(nn.Sequential(*[model.layers[i] for i in mine]), rank, world, torch.device("cpu"))
    else:
        example = torch.zeros(ROWS // args.microbatches, WIDTH)
        pipe = pipeline(model, mb_args=(example,),
                        split_spec={f"layers.{i * per}": SplitPoint.BEGINNING for i in range(1, world)})
        stage = pipe.build_stage(rank, torch.device("cpu"))
    params = list(stage.submod.parameters())
    opt = torch.optim.SGD(params, lr=0.05, momentum=0.9)
    cls = Schedule1F1B if args.schedule == "1f1b" else ScheduleGPipe
    sched = cls(stage, n_microbatches=args.microbatches, loss_fn=mse)
    for step in range(args.steps):
        opt.zero_grad()
        x, y = data(step)
        losses = []
        if rank == 0:
            sched.step(x)
        elif rank == world - 1:
            sched.step(target=y, losses=losses)
            print(f"step {step} loss {torch.stack(losses).mean().item():.6f}", flush=True)
        else:
            sched.step()
        opt.step()
    # This stage's parameters under the whole model's names: the slice's i-th parameter is the
    # i-th parameter of layers[mine] in order (tracing keeps the order too).
    names = [f"layers.{i}.{n}" for i in mine for n, _ in model.layers[i].named_parameters()]
    assert len(names) == len(params), (names, [n for n, _ in stage.submod.named_parameters()])
    part = {n: p.detach().clone() for n, p in zip(names, params, strict=True)}
    parts = [None] * world
    dist.all_gather_object(parts, part)
    if rank == 0:
        full = {k: v for d in parts for k, v in d.items()}
        torch.save(full, args.out)
        print(f"saved {args.out}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
