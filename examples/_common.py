"""What the example programs share: the backend chosen by ``BACKEND``, torchrun's
environment read the way ``env://`` reads it, the JSON lines they print, and the
digest and files of their final parameters.

The examples are plain ``torch.distributed`` programs: they run under ``testbed
launch`` (one process per rank inside the emulated hosts), under ``torchrun`` on one
machine, or alone with ``--reference`` (the same model and data in one process,
without torch.distributed), which prints the same per-step lines so that a test can
compare losses and final parameters.

Output (stdout, one JSON object per line; everything else goes to stderr):
  {"step": 3, "loss": 2.13, "step_s": 0.41, "rank": 0}  one per step and rank
                                                         (loss where the rank knows it)
  {"final": true, "rank": 0, "params": {name: {"sum": s, "abs_sum": a, "sha256": h}}}
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch import nn

BACKENDS = ("gloo", "atlas")


def backend_from_env(name: str = "BACKEND", default: str = "gloo") -> str:
    """The backend the environment asks for: ``gloo`` (default) or ``atlas`` (which
    imports ``atlas_transport.torch`` to register it with torch.distributed)."""
    backend = os.environ.get(name, default).strip().lower() or default
    if backend not in BACKENDS:
        raise SystemExit(f"{name}={backend!r}: unknown backend; use one of {', '.join(BACKENDS)}")
    if backend == "atlas":
        try:
            import atlas_transport.torch  # noqa: F401  (registers the backend "atlas")
        except ImportError as exc:
            raise SystemExit(f"{name}=atlas: cannot import atlas_transport.torch ({exc}); "
                             "is the repository on PYTHONPATH and the backend installed?") from None
    return backend


def init_distributed(backend: str) -> tuple[int, int]:
    """``dist.init_process_group`` from torchrun's environment (RANK, WORLD_SIZE,
    MASTER_ADDR, MASTER_PORT); returns (rank, world size)."""
    import torch.distributed as dist

    missing = [k for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if k not in os.environ]
    if missing:
        raise SystemExit(f"missing {', '.join(missing)} in the environment: start this program with "
                         "`testbed launch TOPOLOGY -- python ...`, with torchrun, or run it with --reference")
    dist.init_process_group(backend=backend)
    return dist.get_rank(), dist.get_world_size()


def emit(**fields: Any) -> None:
    """One JSON line on stdout, flushed (testbed launch collects every such line)."""
    sys.stdout.write(json.dumps(fields, sort_keys=False) + "\n")
    sys.stdout.flush()


def log(text: str) -> None:
    sys.stderr.write(text + "\n")
    sys.stderr.flush()


@contextmanager
def timed() -> Iterator[list[float]]:
    """Wall seconds of the block, appended to the list it yields."""
    box: list[float] = []
    began = time.perf_counter()
    try:
        yield box
    finally:
        box.append(time.perf_counter() - began)


def param_digest(named: dict[str, torch.Tensor]) -> dict[str, dict[str, Any]]:
    """Per parameter: its sum, its sum of absolute values and the sha256 of its bytes."""
    out: dict[str, dict[str, Any]] = {}
    for name, tensor in sorted(named.items()):
        t = tensor.detach().contiguous().cpu()
        out[name] = {"sum": float(t.double().sum()), "abs_sum": float(t.double().abs().sum()),
                     "sha256": hashlib.sha256(t.numpy().tobytes()).hexdigest()[:16]}
    return out


def save_params(directory: str | None, filename: str, named: dict[str, torch.Tensor]) -> None:
    """``--save DIR``: the parameters as ``DIR/<filename>`` (torch.save of name -> tensor)."""
    if not directory:
        return
    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    torch.save({k: v.detach().clone().cpu() for k, v in named.items()}, path / filename)


def seeded(seed: int) -> torch.Generator:
    gen = torch.Generator()
    gen.manual_seed(seed)
    return gen


# --- the flags every example takes ---------------------------------------------------


def add_common_args(p: argparse.ArgumentParser, *, reference: str, world: int) -> None:
    """--lr, --seed, --threads, --save, --reference (`reference`: what one process runs)
    and --world (the ranks the reference stands for, `world` by default)."""
    p.add_argument("--lr", type=float, default=0.05, help="SGD learning rate")
    p.add_argument("--seed", type=int, default=1, help="seed of the parameters and the data")
    p.add_argument("--threads", type=int, default=1, help="torch threads per process")
    p.add_argument("--save", default=None, metavar="DIR", help="save the final parameters to DIR/rank-<k>.pt")
    p.add_argument("--reference", action="store_true", help=reference)
    p.add_argument("--world", type=int, default=world, help="ranks the reference stands for (else the world size)")


def check_at_least_one(p: argparse.ArgumentParser, args: argparse.Namespace, names: tuple[str, ...]) -> None:
    """Refuse (argparse's usage error) any of the integer options `names` below 1."""
    for name in names:
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")


# --- the one-process reference ---------------------------------------------------------


def train_reference(model: torch.nn.Module, args: argparse.Namespace,
                    shard_losses: Callable[[int], list[torch.Tensor]]) -> None:
    """--reference: `args.steps` SGD steps of `model` in one process, each on the mean of
    `shard_losses(step)` (one loss per rank or replica, as the distributed run averages
    its gradients); one JSON line per step, then the final parameters' digest (and
    DIR/reference.pt with --save)."""
    opt = torch.optim.SGD(model.parameters(), lr=args.lr)
    for step in range(args.steps):
        with timed() as took:
            opt.zero_grad(set_to_none=True)
            loss = torch.stack(shard_losses(step)).mean()
            loss.backward()
            opt.step()
        emit(step=step, loss=float(loss.detach()), step_s=round(took[0], 6), rank=0)
    named = dict(model.named_parameters())
    emit(final=True, rank=0, params=param_digest(named))
    save_params(args.save, "reference.pt", named)


# --- the residual MLP model of fsdp2.py and mesh2d.py ------------------------------


class Block(nn.Module):
    """x + W2 gelu(W1 layernorm(x)): a transformer's MLP half."""

    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.up = nn.Linear(dim, hidden)
        self.down = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(nn.functional.gelu(self.up(self.norm(x))))


class Model(nn.Module):
    """`--blocks` residual MLP blocks, a final layer norm and a linear head."""

    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block(args.dim, args.hidden) for _ in range(args.blocks))
        self.norm = nn.LayerNorm(args.dim)
        self.head = nn.Linear(args.dim, args.dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def build_model(args: argparse.Namespace) -> Model:
    """The model, seeded with `--seed` (every rank and the reference build the same)."""
    torch.manual_seed(args.seed)
    return Model(args)
