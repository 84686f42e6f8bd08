"""The parallelism libraries of torch 2.13 on `atlas`, in one 4-rank world: a 2-D
DeviceMesh (dp x tp) and its DTensors, FSDP2 (also with a gradient divide factor,
which reduces with PREMUL_SUM), FSDP across dp with tensor parallel
(Colwise/Rowwise) inside tp, SequenceParallel, DDP over a mesh dimension,
torch.compile'd functional collectives, state-dict loading broadcast from rank 0 and
distributed checkpoint's async_save. Parameters are checked against one process.
Then inductor-compiled collectives whose all-gathers inductor buckets into the `_out`
all-gather (the form torch's C++ cannot send to a Python group: see
atlas_transport/torch/functional.py). Marked long: each takes most of a minute on 2
busy cores."""

from __future__ import annotations

import pytest
import torch
from test_torch_backend import check_ok, launch

PROGRAM = """
import torch.nn as nn
import torch.distributed._functional_collectives as funcol
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, Shard, distribute_tensor
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, SequenceParallel, parallelize_module
from torch.distributed.fsdp import fully_shard
from torch.nn.parallel import DistributedDataParallel as DDP
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, set_model_state_dict
dist.init_process_group("atlas", timeout=timedelta(seconds=30))
res = {}

mesh = init_device_mesh("cpu", (2, WORLD // 2), mesh_dim_names=("dp", "tp"))
dp, tp = mesh["dp"], mesh["tp"]
res["mesh"] = (dist.get_process_group_ranks(dp.get_group()), dist.get_process_group_ranks(tp.get_group()),
               dist.get_backend(dp.get_group()), dist.get_backend(tp.get_group()))
d = distribute_tensor(torch.arange(32.0).reshape(8, 4), mesh, [Shard(0), Shard(1)])
res["dtensor2d"] = (d.to_local(), d.full_tensor(), d.redistribute(mesh, [Replicate(), Shard(0)]).to_local())

def tiny(width):
    torch.manual_seed(1)
    return nn.Sequential(nn.Linear(6, width), nn.ReLU(), nn.Linear(width, 3))
def batch(r, step):
    return torch.randn(4, 6, generator=torch.Generator().manual_seed(100 * step + r))

# FSDP2 over the whole world (1-D), with and without a gradient divide factor
def fsdp(divide, m1):
    model = tiny(8)
    for part in (model[0], model[2], model):
        fully_shard(part, mesh=m1)
    if divide is not None:
        for part in (model[0], model[2], model):
            part.set_gradient_divide_factor(divide)
    reference = tiny(8)
    opt, ropt = torch.optim.SGD(model.parameters(), lr=0.1), torch.optim.SGD(reference.parameters(), lr=0.1)
    n = m1.size()
    for step in range(3):
        opt.zero_grad(); ropt.zero_grad()
        model(batch(RANK, step)).square().mean().backward()
        opt.step()
        (sum(reference(batch(r, step)).square().mean() for r in range(n)) / (divide or n)).backward()
        ropt.step()
    return max(((p.full_tensor() - q).abs().max() / q.abs().max()).item()
               for p, q in zip(model.parameters(), reference.parameters())), model
world_mesh = init_device_mesh("cpu", (WORLD,))
res["fsdp2"], fmodel = fsdp(None, world_mesh)
res["fsdp2_divide"], _ = fsdp(3.0, world_mesh)

# 2-D: FSDP across dp, tensor parallel inside tp
model = tiny(4 * tp.size())
reference = tiny(4 * tp.size())
parallelize_module(model, tp, {"0": ColwiseParallel(), "2": RowwiseParallel()})
for part in (model[0], model[2], model):
    fully_shard(part, mesh=dp)
opt, ropt = torch.optim.SGD(model.parameters(), lr=0.1), torch.optim.SGD(reference.parameters(), lr=0.1)
dpr = dp.get_local_rank()
for step in range(3):
    opt.zero_grad(); ropt.zero_grad()
    model(batch(dpr, step)).square().mean().backward()    # the tp ranks of one dp rank share a batch
    opt.step()
    (sum(reference(batch(r, step)).square().mean() for r in range(dp.size())) / dp.size()).backward()
    ropt.step()
res["fsdp_tp"] = max(((p.full_tensor() - q).abs().max() / q.abs().max()).item()
                     for p, q in zip(model.parameters(), reference.parameters()))

# SequenceParallel on the tp dim
ln, ref_ln = nn.LayerNorm(4), nn.LayerNorm(4)
with torch.no_grad():
    ln.weight.copy_(torch.arange(4.0) + 1); ref_ln.weight.copy_(torch.arange(4.0) + 1)
parallelize_module(ln, tp, SequenceParallel())
xs = torch.randn(2, 2 * tp.size(), 4, generator=torch.Generator().manual_seed(4))
ys = ln(xs.chunk(tp.size(), dim=1)[tp.get_local_rank()])
yfull = ys.full_tensor()
(yfull * torch.arange(4.0)).sum().backward()
ry = ref_ln(xs)
(ry * torch.arange(4.0)).sum().backward()
res["sp"] = ((yfull - ry).abs().max().item(), (ln.weight.grad.full_tensor() - ref_ln.weight.grad).abs().max().item())

# DDP over a mesh dimension
ddp, reference = DDP(tiny(8), device_mesh=dp), tiny(8)
ddp(batch(RANK, 0)).sum().backward()
(sum(reference(batch(r, 0)).sum() for r in dist.get_process_group_ranks(dp.get_group())) / dp.size()).backward()
res["ddp_mesh"] = max((p.grad - q.grad).abs().max().item() for p, q in zip(ddp.parameters(), reference.parameters()))

# torch.compile'd functional collectives (traced, run eagerly)
@torch.compile(backend="aot_eager", fullgraph=True)
def compiled(x):
    y = funcol.all_reduce(x * 2, "sum", dist.group.WORLD)
    z = funcol.all_gather_tensor(y + 1, 0, dist.group.WORLD)
    return funcol.reduce_scatter_tensor(z, "sum", 0, dist.group.WORLD)
res["compiled"] = compiled(torch.full((2,), float(RANK)))

# state dict: full state broadcast from rank 0, distributed checkpoint async save + load
sd = get_model_state_dict(fmodel, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
target = tiny(8)
for part in (target[0], target[2], target):
    fully_shard(part, mesh=world_mesh)
set_model_state_dict(target, sd if RANK == 0 else {}, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))
res["broadcast_from_rank0"] = max((p.full_tensor() - q.full_tensor()).abs().max().item()
                                  for p, q in zip(target.parameters(), fmodel.parameters()))
ckpt = os.path.join(os.environ["OUT"], "ckpt")
fut = dcp.async_save({"model": get_model_state_dict(fmodel)}, checkpoint_id=ckpt)
fut.result()
loaded = {"model": get_model_state_dict(target)}
with torch.no_grad():
    for p in target.parameters():
        p.zero_()
dcp.load(loaded, checkpoint_id=ckpt)
set_model_state_dict(target, loaded["model"])
res["async_save"] = max((p.full_tensor() - q.full_tensor()).abs().max().item()
                        for p, q in zip(target.parameters(), fmodel.parameters()))
save(res)
dist.barrier()
dist.destroy_process_group()
"""


@pytest.mark.long
def test_fsdp2_tensor_parallel_2d_mesh_compile_and_checkpoints_on_atlas(tmp_path):
    world = 4
    rcs, outs, res = launch(tmp_path, PROGRAM, world, timeout=300)
    check_ok(rcs, outs)
    full = torch.arange(32.0).reshape(8, 4)
    for r, got in enumerate(res):
        dp_ranks, tp_ranks = [r % 2, r % 2 + 2], [r // 2 * 2, r // 2 * 2 + 1]
        assert got["mesh"] == (dp_ranks, tp_ranks, "atlas", "atlas")
        local, gathered, resharded = got["dtensor2d"]
        assert torch.equal(local, full.chunk(2)[r // 2].chunk(2, dim=1)[r % 2]) and torch.equal(gathered, full)
        assert torch.equal(resharded, full.chunk(2)[r % 2])
        for key in ("fsdp2", "fsdp2_divide", "fsdp_tp", "ddp_mesh"):  # against one process
            assert got[key] < 1e-5, (r, key, got[key])
        assert max(got["sp"]) < 1e-5, got["sp"]
        assert got["compiled"].tolist() == [52.0, 52.0]  # all_reduce(2r) + 1 = 13, gathered, reduce-scattered
        assert got["broadcast_from_rank0"] == 0.0 and got["async_save"] == 0.0


INDUCTOR = """
import torch._inductor.config as inductor_config
import torch.distributed._functional_collectives as funcol
from torch._inductor.utils import run_and_get_code
inductor_config.bucket_all_gathers_fx = "all"     # two all-gathers become one _out all-gather
dist.init_process_group("atlas", timeout=timedelta(seconds=120))

@torch.compile(fullgraph=True)
def step(a, b):
    x = funcol.all_gather_tensor(a * 2, 0, dist.group.WORLD)
    y = funcol.all_reduce(funcol.all_gather_tensor(b + 1, 0, dist.group.WORLD), "sum", dist.group.WORLD)
    return x, y

(x, y), code = run_and_get_code(step, torch.full((3,), float(RANK)), torch.full((2,), float(RANK)))
save({"x": x, "y": y, "out_form": any("all_gather_into_tensor_out" in c for c in code)})
dist.destroy_process_group()
"""


@pytest.mark.long
def test_inductor_compiled_collectives_with_the_out_all_gather_on_atlas(tmp_path):
    rcs, outs, res = launch(tmp_path, INDUCTOR, 2, timeout=400)
    check_ok(rcs, outs)
    for r in res:
        assert r["out_form"]  # inductor's bucketing emitted the _out all-gather, and it ran on atlas
        assert r["x"].tolist() == [0.0] * 3 + [2.0] * 3 and r["y"].tolist() == [2.0, 2.0, 4.0, 4.0]
