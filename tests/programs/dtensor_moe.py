"""A mixture-of-experts layer on all_to_all with uneven splits, its router kept as a DTensor.

Features: one expert per rank; top-1 routing, so each rank sends a different number of
tokens (sometimes none) to each expert: the counts exchanged with ``all_to_all_single``,
the tokens dispatched with the autograd ``torch.distributed.nn.functional.all_to_all_single``
and returned with ``_functional_collectives.all_to_all_single_autograd``; the router weight
is a DTensor sharded by rows (``distribute_tensor``, ``Shard(0)``) that each step is
gathered with ``redistribute(Replicate())``, checked against a ``Shard(1)`` round trip,
and updated ZeRO-style: its gradient made a ``Partial`` DTensor and ``redistribute``d to
``Shard(0)`` (a reduce-scatter). Ranks hold different numbers of tokens.

    torchrun --nproc-per-node 4 dtensor_moe.py --out params.pt   # BACKEND=gloo|atlas
    python dtensor_moe.py --reference --world 4 --out ref.pt      # one process
"""

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

D, LR = 8, 0.1


def tokens(step, rank):
    g = torch.Generator().manual_seed(97 * step + rank)
    x = torch.randn(10 + 3 * rank, D, generator=g)
    return x, torch.cos(2 * x)


def make(world):
    torch.manual_seed(11)
    router = torch.randn(world, D) * 0.5
    experts = nn.ModuleList(nn.Linear(D, D) for _ in range(world))
    return router, experts


def route(x, router):
    probs = torch.softmax(x @ router.t(), dim=-1)
    gate, choice = probs.max(dim=-1)
    order = torch.argsort(choice, stable=True)
    counts = torch.bincount(choice, minlength=router.shape[0])
    return gate, order, counts


def reference(args):
    router, experts = make(args.world)
    router.requires_grad_()
    opt = torch.optim.SGD(list(experts.parameters()) + [router], lr=LR)
    for step in range(args.steps):
        opt.zero_grad()
        for r in range(args.world):
            x, y = tokens(step, r)
            gate, order, counts = route(x, router)
            xs = x[order]
            outs = [torch.tanh(experts[e](part)) for e, part in enumerate(xs.split(counts.tolist()))]
            out = torch.empty_like(x)
            out[order] = torch.cat(outs)
            (F.mse_loss(x + gate[:, None] * out, y) / args.world).backward()
        opt.step()
    state = {f"experts.{e}.{n}": t.detach().clone() for e, m in enumerate(experts)
             for n, t in m.state_dict().items()}
    state["router"] = router.detach().clone()
    torch.save(state, args.out)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--out", required=True)
    p.add_argument("--reference", action="store_true")
    p.add_argument("--world", type=int, default=4)
    args = p.parse_args()
    if args.reference:
        return reference(args)

    import torch.distributed._functional_collectives as funcol
    import torch.distributed.nn.functional as dnnf
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor

    backend = os.environ.get("BACKEND", "gloo")
    if backend == "atlas":
        import atlas_transport.torch  # noqa: F401
    dist.init_process_group(backend=backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (world,))
    full_router, experts = make(world)
    expert = experts[rank]
    router = distribute_tensor(full_router, mesh, [Shard(0)])
    opt = torch.optim.SGD(expert.parameters(), lr=LR)
    for step in range(args.steps):
        opt.zero_grad()
        w = router.redistribute(mesh, [Replicate()]).to_local().clone().requires_grad_()
        assert torch.equal(router.redistribute(mesh, [Shard(1)]).full_tensor(), w.detach())
        x, y = tokens(step, rank)
        gate, order, counts = route(x, w)
        recv_counts = torch.empty_like(counts)
        dist.all_to_all_single(recv_counts, counts)
        send, recv = counts.tolist(), recv_counts.tolist()
        got = dnnf.all_to_all_single(torch.empty(sum(recv), D), x[order], recv, send)
        done = torch.tanh(expert(got))
        back = funcol.all_to_all_single_autograd(done, send, recv, dist.group.WORLD)
        out = torch.empty_like(x)
        out[order] = back
        loss = F.mse_loss(x + gate[:, None] * out, y)
        loss.backward()
        for t in expert.parameters():
            t.grad /= world  # the expert's gradient holds every rank's loss: average them
        grad = DTensor.from_local(w.grad / world, mesh, [Partial()]).redistribute(mesh, [Shard(0)])
        router = DTensor.from_local(router.to_local() - LR * grad.to_local(), mesh, [Shard(0)])
        opt.step()
        if rank == 0:
            print(f"step {step} loss {loss.item():.6f} sends {send}", flush=True)
    state = {}
    for n, t in expert.state_dict().items():
        parts = [torch.empty_like(t) for _ in range(world)]
        dist.all_gather(parts, t.contiguous())
        state.update({f"experts.{e}.{n}": parts[e] for e in range(world)})
    state["router"] = router.full_tensor()
    if rank == 0:
        torch.save(state, args.out)
        print(f"saved {args.out}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
