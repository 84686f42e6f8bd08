"""Expert parallelism: a small mixture-of-experts layer whose experts are sharded over
the ranks, tokens dispatched to them and combined back with ``all_to_all_single`` over
the backend ``BACKEND`` names (gloo or atlas).

Model: ``x -> embed -> x + MoE(layernorm(x)) -> head``. The MoE has ``--experts-per-rank
x world`` experts (each a small MLP; rank k holds experts ``k*E .. k*E+E-1``) and a
router that sends each token to its ``--top-k`` experts, weighted by the softmax of the
chosen logits (dropless: no capacity limit). Each step, on every rank:

1. the router picks experts; the tokens are sorted by expert, so the counts per
   destination rank are the *uneven* splits the router made;
2. ``all_to_all_single`` of the counts, then of the tokens (and of their expert ids):
   every rank receives the tokens its experts were chosen for;
3. the local experts run; ``all_to_all_single`` sends the outputs back (the splits
   reversed) and each rank combines them with the router's weights.

The token exchanges are differentiable (``--a2a functional``: torch's functional
collective ``all_to_all_single_autograd``, as torchtitan calls it; ``--a2a c10d``:
``torch.distributed.nn.functional.all_to_all_single``), so backward sends the
gradients the same way back. Expert gradients arrive whole on the expert's rank; the
replicated parameters (embedding, router, norms, head) are all-reduced.

    testbed launch topologies/2dc.yaml --env BACKEND=atlas -- python examples/moe.py
    torchrun --nproc-per-node 4 examples/moe.py
    python examples/moe.py --reference --world 4     # one process, every expert, no torch.distributed

Rank 0 prints ``{"step", "loss", "step_s", "rank", "tokens_out"}`` per step (loss: the
mean over the whole global batch; tokens_out: the uneven counts it sent to each rank),
every other rank ``{"step", "step_s", "rank", "tokens_out"}``; each rank ends with a
digest of the parameters it holds (the replicated ones and its own experts).
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
    p.add_argument("--tokens", type=int, default=512, help="tokens per rank per step")
    p.add_argument("--dim", type=int, default=128, help="model width")
    p.add_argument("--hidden", type=int, default=512, help="hidden size of each expert's MLP")
    p.add_argument("--experts-per-rank", type=int, default=2, help="experts each rank holds")
    p.add_argument("--top-k", type=int, default=2, help="experts each token is routed to")
    p.add_argument("--a2a", choices=("functional", "c10d"), default="functional",
                   help="the differentiable all_to_all_single to use")
    add_common_args(p, reference="one process, every rank's tokens and every expert", world=4)
    args = p.parse_args(argv)
    check_at_least_one(p, args, ("steps", "tokens", "dim", "hidden", "experts_per_rank", "top_k", "world", "threads"))
    if args.reference and args.top_k > args.experts_per_rank * args.world:
        p.error(f"--top-k {args.top_k} is more than the {args.experts_per_rank * args.world} experts "
                f"(--experts-per-rank {args.experts_per_rank} x --world {args.world})")
    return args


class Expert(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.up = nn.Linear(dim, hidden)
        self.down = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(nn.functional.gelu(self.up(x)))


class Model(nn.Module):
    """Every parameter of the model; a rank of the distributed run uses its own experts only."""

    def __init__(self, args: argparse.Namespace, n_experts: int) -> None:
        super().__init__()
        self.embed = nn.Linear(args.dim, args.dim)
        self.norm = nn.LayerNorm(args.dim)
        self.router = nn.Linear(args.dim, n_experts, bias=False)
        self.experts = nn.ModuleList(Expert(args.dim, args.hidden) for _ in range(n_experts))
        self.head = nn.Linear(args.dim, args.dim)


def build_model(args: argparse.Namespace, world: int) -> Model:
    torch.manual_seed(args.seed)
    return Model(args, args.experts_per_rank * world)


def rank_tokens(args: argparse.Namespace, world: int, step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank `rank`'s tokens of step `step` (the global batch is world x tokens rows)."""
    rows = args.tokens * world
    x = torch.randn(rows, args.dim, generator=seeded(args.seed * 100_003 + 2 * step))
    y = torch.randn(rows, args.dim, generator=seeded(args.seed * 100_003 + 2 * step + 1))
    return x.chunk(world)[rank], y.chunk(world)[rank]


def route(model: Model, h: torch.Tensor, top_k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Each (token, choice) pair sorted by expert: the token index, the expert and the
    router's weight of each, as flat tensors of tokens x top_k."""
    logits = model.router(h)
    top, experts = logits.topk(top_k, dim=-1)
    weights = top.softmax(dim=-1)
    flat_experts = experts.reshape(-1)
    order = torch.argsort(flat_experts, stable=True)
    token = torch.arange(h.shape[0]).repeat_interleave(top_k)[order]
    return token, flat_experts[order], weights.reshape(-1)[order]


def run_experts(experts: nn.ModuleList, first: int, x: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Expert ``ids[i]`` (global numbering; this holder's are ``first ..``) applied to row i."""
    out = torch.zeros_like(x)
    for k, expert in enumerate(experts):
        rows = (ids == first + k).nonzero(as_tuple=True)[0]
        if rows.numel():
            out = out.index_add(0, rows, expert(x[rows]))
    return out


def moe_forward(model: Model, x: torch.Tensor, top_k: int,
                dispatch=None) -> tuple[torch.Tensor, list[int] | None]:
    """The model on one rank's tokens. `dispatch(sorted_rows, expert_ids)` returns the
    experts' outputs for the rows (the all_to_all round trip); None runs every expert here."""
    h = model.embed(x)
    normed = model.norm(h)
    token, experts, weights = route(model, normed, top_k)
    rows = normed[token]
    if dispatch is None:
        out, counts = run_experts(model.experts, 0, rows, experts), None
    else:
        out, counts = dispatch(rows, experts)
    combined = torch.zeros_like(h).index_add(0, token, out * weights.unsqueeze(-1))
    return model.head(h + combined), counts


def reference(args: argparse.Namespace) -> None:
    """The same steps in one process: every rank's tokens through the same MoE with all
    experts here; the loss is the mean of the ranks' mean losses."""
    model = build_model(args, args.world)

    def rank_losses(step: int) -> list[torch.Tensor]:
        losses = []
        for r in range(args.world):
            xs, ys = rank_tokens(args, args.world, step, r)
            out, _ = moe_forward(model, xs, args.top_k)
            losses.append(nn.functional.mse_loss(out, ys))
        return losses
    train_reference(model, args, rank_losses)


def distributed(args: argparse.Namespace) -> None:
    import torch.distributed as dist

    backend = backend_from_env()
    rank, world = init_distributed(backend)
    per = args.experts_per_rank
    if args.top_k > per * world:
        raise SystemExit(f"--top-k {args.top_k} is more than the {per * world} experts "
                         f"(--experts-per-rank {per} x {world} ranks)")
    model = build_model(args, world)
    mine = nn.ModuleList(model.experts[rank * per:(rank + 1) * per])
    model.experts = nn.ModuleList()  # the other ranks' experts are not this rank's to hold
    mine_prefix = {f"experts.{rank * per + k}.{n}": p for k, e in enumerate(mine) for n, p in e.named_parameters()}
    shared = list(model.parameters())
    opt = torch.optim.SGD([*shared, *mine.parameters()], lr=args.lr)
    a2a = _a2a(args.a2a)

    def dispatch(rows: torch.Tensor, experts: torch.Tensor) -> tuple[torch.Tensor, list[int]]:
        dest = experts // per  # rows are sorted by expert, hence by destination rank
        send_counts = torch.bincount(dest, minlength=world)
        recv_counts = torch.empty_like(send_counts)
        dist.all_to_all_single(recv_counts, send_counts)
        s, r = send_counts.tolist(), recv_counts.tolist()
        ids = torch.empty(sum(r), dtype=experts.dtype)
        dist.all_to_all_single(ids, experts, r, s)
        got = a2a(rows, r, s)  # the tokens to this rank's experts
        out = run_experts(mine, rank * per, got, ids)
        return a2a(out, s, r), s  # back to where each token came from

    if rank == 0:
        log(f"moe: {world} ranks x {per} experts, top-{args.top_k}, {args.tokens} tokens of {args.dim} floats "
            f"per rank, all_to_all_single ({args.a2a}) over {backend}")
    for step in range(args.steps):
        xs, ys = rank_tokens(args, world, step, rank)
        with timed() as took:
            opt.zero_grad(set_to_none=True)
            out, counts = moe_forward(model, xs, args.top_k, dispatch)
            loss = nn.functional.mse_loss(out, ys)
            (loss / world).backward()  # the global loss is the mean of the ranks' losses
            for p in shared:  # replicated: each rank's part of the gradient, summed
                dist.all_reduce(p.grad)
            opt.step()
        total = loss.detach().clone()
        dist.all_reduce(total)  # the global batch's loss, for the line (outside the step's time)
        line = {"step": step, "step_s": round(took[0], 6), "rank": rank, "tokens_out": counts}
        if rank == 0:
            line["loss"] = float(total / world)
        emit(**line)
    named = {**dict(model.named_parameters()), **mine_prefix}
    emit(final=True, rank=rank, params=param_digest(named))
    save_params(args.save, f"rank-{rank}.pt", named)
    dist.destroy_process_group()


def _a2a(kind: str):
    """A differentiable all_to_all_single(x, output_splits, input_splits) -> received rows."""
    if kind == "functional":
        from torch.distributed._functional_collectives import all_to_all_single_autograd
        from torch.distributed.distributed_c10d import _get_default_group

        group = _get_default_group()

        def functional(x: torch.Tensor, out_splits: list[int], in_splits: list[int]) -> torch.Tensor:
            return all_to_all_single_autograd(x.contiguous(), out_splits, in_splits, group)

        return functional

    import torch.distributed.nn.functional as dist_nn

    def c10d(x: torch.Tensor, out_splits: list[int], in_splits: list[int]) -> torch.Tensor:
        out = x.new_empty(sum(out_splits), *x.shape[1:])
        return dist_nn.all_to_all_single(out, x.contiguous(), out_splits, in_splits)

    return c10d


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.reference:
        reference(args)
    else:
        distributed(args)


if __name__ == "__main__":
    main()
