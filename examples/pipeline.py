"""Pipeline-parallel training with ``torch.distributed.pipelining`` (GPipe or 1F1B):
one stage per rank, the activations of every micro-batch sent forward to the next
stage and their gradients back, by the backend ``BACKEND`` names (gloo or atlas).

Sized so that the tensors crossing a stage boundary dominate a step: many rows of a
narrow hidden size (``--rows`` x ``--hidden`` x 4 bytes per micro-batch: 4 MiB by
default) through cheap linear + tanh layers. Across a WAN whose TCP flows are capped by
their window (topologies/2dc.yaml: 1 MB windows over 50 ms, ~100 Mbit/s a flow) gloo
carries each boundary tensor on one connection, while atlas stripes it over
``ATLAS_STREAMS`` connections.

    testbed launch topologies/2dc.yaml --hosts dc1-h1,dc2-h1 --env BACKEND=atlas -- \\
        python examples/pipeline.py --schedule 1f1b --steps 8
    torchrun --nproc-per-node 2 examples/pipeline.py            # one machine, gloo
    python examples/pipeline.py --reference --stages 2          # one process, no torch.distributed

Every rank prints ``{"step", "step_s", "rank"}`` per step (the last stage adds
``loss``: the mean over the micro-batches) and a final digest of its parameters; the
reference prints the same lines for the whole model (examples/_common.py).
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
    backend_from_env,
    emit,
    init_distributed,
    log,
    param_digest,
    save_params,
    seeded,
    timed,
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--schedule", choices=("gpipe", "1f1b"), default="gpipe", help="pipeline schedule")
    p.add_argument("--steps", type=int, default=6, help="training steps")
    p.add_argument("--microbatches", type=int, default=4, help="micro-batches per step")
    p.add_argument("--rows", type=int, default=16384, help="rows (tokens) per micro-batch")
    p.add_argument("--hidden", type=int, default=64, help="hidden size (boundary tensor: rows x hidden x 4 bytes)")
    p.add_argument("--layers-per-stage", type=int, default=1, help="linear + tanh layers in each stage")
    p.add_argument("--lr", type=float, default=0.05, help="SGD learning rate")
    p.add_argument("--seed", type=int, default=1, help="seed of the parameters and the data")
    p.add_argument("--threads", type=int, default=1, help="torch threads per process")
    p.add_argument("--save", default=None, metavar="DIR", help="save the final parameters to DIR/rank-<k>.pt "
                   "(DIR/reference.pt with --reference)")
    p.add_argument("--reference", action="store_true", help="run the whole model in one process, "
                   "without torch.distributed, and print the same lines")
    p.add_argument("--stages", type=int, default=2, help="pipeline stages of --reference (else the world size)")
    args = p.parse_args(argv)
    for name in ("steps", "microbatches", "rows", "hidden", "layers_per_stage", "stages", "threads"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    return args


class Block(nn.Module):
    """A linear layer and a tanh: cheap next to the tensor it hands on."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.linear = nn.Linear(hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.linear(x))


def build_model(args: argparse.Namespace, stages: int) -> nn.Sequential:
    """The whole model, seeded: every rank builds it and keeps its own slice."""
    torch.manual_seed(args.seed)
    return nn.Sequential(*[Block(args.hidden) for _ in range(stages * args.layers_per_stage)])


def stage_module(model: nn.Sequential, stage: int, per_stage: int) -> nn.Sequential:
    """Stage `stage`'s layers, named by their index in the whole model (so that the
    parameters' names match the reference's)."""
    lo = stage * per_stage
    return nn.Sequential(OrderedDict((str(i), model[i]) for i in range(lo, lo + per_stage)))


def batch(args: argparse.Namespace, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Step `step`'s inputs and targets, the same on every rank and in the reference."""
    rows = args.rows * args.microbatches
    x = torch.randn(rows, args.hidden, generator=seeded(args.seed * 100_003 + 2 * step))
    y = torch.randn(rows, args.hidden, generator=seeded(args.seed * 100_003 + 2 * step + 1))
    return x, y


def loss_fn(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return nn.functional.mse_loss(output, target)


def reference(args: argparse.Namespace) -> None:
    """The same training in one process: per micro-batch forward, loss and backward,
    gradients divided by the number of micro-batches (as the schedules do), one SGD step."""
    model = build_model(args, args.stages)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr)
    for step in range(args.steps):
        x, y = batch(args, step)
        with timed() as took:
            opt.zero_grad(set_to_none=True)
            losses = []
            for xs, ys in zip(x.chunk(args.microbatches), y.chunk(args.microbatches), strict=True):
                loss = loss_fn(model(xs), ys)
                loss.backward()
                losses.append(loss.detach())
            for p in model.parameters():
                if p.grad is not None:
                    p.grad.div_(args.microbatches)
            opt.step()
        emit(step=step, loss=float(torch.stack(losses).mean()), step_s=round(took[0], 6), rank=0)
    named = dict(model.named_parameters())
    emit(final=True, rank=0, params=param_digest(named))
    save_params(args.save, "reference.pt", named)


def distributed(args: argparse.Namespace) -> None:
    import torch.distributed as dist
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    backend = backend_from_env()
    rank, world = init_distributed(backend)
    if args.schedule == "1f1b" and args.microbatches < world:
        raise SystemExit(f"--schedule 1f1b needs at least as many micro-batches as stages "
                         f"({world}), got --microbatches {args.microbatches}")
    model = build_model(args, world)
    module = stage_module(model, rank, args.layers_per_stage)
    example = torch.empty(args.rows, args.hidden)
    # Static shapes: no shape inference (object messages over the link) before the first step. A stage's
    # example input must require grad where it has a stage before it, or no gradient is sent back to it.
    example_in = torch.empty(args.rows, args.hidden, requires_grad=rank > 0)
    stage = PipelineStage(module, rank, world, torch.device("cpu"), input_args=(example_in,),
                          output_args=(example,), output_grads=(example,), input_grads=(example,))
    kind = ScheduleGPipe if args.schedule == "gpipe" else Schedule1F1B
    schedule = kind(stage, args.microbatches, loss_fn=loss_fn)
    opt = torch.optim.SGD(module.parameters(), lr=args.lr)
    first, last = rank == 0, rank == world - 1
    if first:
        log(f"pipeline: {world} stages, backend {backend}, {args.schedule}, {args.microbatches} micro-batches of "
            f"{args.rows * args.hidden * 4 / 2**20:.1f} MiB at each boundary")
    for step in range(args.steps):
        x, y = batch(args, step)
        with timed() as took:
            opt.zero_grad(set_to_none=True)
            losses: list[torch.Tensor] = []
            if first and last:
                schedule.step(x, target=y, losses=losses)
            elif first:
                schedule.step(x)
            elif last:
                schedule.step(target=y, losses=losses)
            else:
                schedule.step()
            opt.step()
        line = {"step": step, "step_s": round(took[0], 6), "rank": rank}
        if last:
            line["loss"] = float(torch.stack([loss.detach() for loss in losses]).mean())
        emit(**line)
    named = dict(module.named_parameters())
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
