"""Training over the `atlas` backend gives what one process gives: DDP, and
torch.distributed.pipelining's GPipe and 1F1B schedules, in plain env:// programs
(default group atlas), and with a gloo default group and an atlas pipeline subgroup."""

from __future__ import annotations

import torch
from test_torch_backend import check_ok, launch

MODEL = """
import torch
D, B, MB, STEPS = 16, 8, 4, 3
def make_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(D, 32), torch.nn.Tanh(), torch.nn.Linear(32, 32), torch.nn.Tanh(),
                               torch.nn.Linear(32, 1))
def batch(step):
    g = torch.Generator().manual_seed(100 + step)
    return torch.randn(B, D, generator=g), torch.randn(B, 1, generator=g)
loss_fn = torch.nn.MSELoss()
"""

PROGRAM = MODEL + """
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe
from torch.nn.parallel import DistributedDataParallel as DDP
res = {}
if os.environ["MODE"] == "atlas":
    dist.init_process_group(backend=os.environ["BACKEND"])
    pp_group = None
    m = DDP(make_model(), bucket_cap_mb=0.0005)       # several buckets
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    for step in range(STEPS):
        x, y = batch(step)
        opt.zero_grad()
        loss = loss_fn(m(x.chunk(WORLD)[RANK]), y.chunk(WORLD)[RANK])
        loss.backward()
        opt.step()
        res[f"ddp_loss{step}"] = loss.item()
    res["ddp_params"] = [p.detach().clone() for p in m.parameters()]
    schedules = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}
else:                                                 # gloo default group, atlas pipeline subgroup
    dist.init_process_group("gloo")
    pp_group = dist.new_group([0, 1], backend="atlas")
    schedules = {"1f1b": Schedule1F1B}
for name, cls in schedules.items():
    full = make_model()
    part = full[:2] if RANK == 0 else full[2:]
    stage = PipelineStage(part, RANK, 2, torch.device("cpu"), group=pp_group)
    sched = cls(stage, MB, loss_fn=loss_fn)
    opt = torch.optim.SGD(part.parameters(), lr=0.1)
    for step in range(STEPS):
        x, y = batch(step)
        opt.zero_grad()
        if RANK == 0:
            sched.step(x)
        else:
            losses = []
            sched.step(target=y, losses=losses)
            res[f"{name}_losses{step}"] = [l.item() for l in losses]
        opt.step()
    res[f"{name}_params"] = [p.detach().clone() for p in part.parameters()]
dist.barrier()
save(res)
dist.destroy_process_group()
"""


def reference():
    ns: dict = {}
    exec(MODEL, ns)
    out = {}
    m = ns["make_model"]()
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    for step in range(ns["STEPS"]):
        x, y = ns["batch"](step)
        opt.zero_grad()
        loss = ns["loss_fn"](m(x), y)
        loss.backward()
        opt.step()
        out[f"ddp_loss{step}"] = loss.item()
    out["ddp_params"] = [p.detach().clone() for p in m.parameters()]
    m = ns["make_model"]()
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    mb = ns["MB"]
    for step in range(ns["STEPS"]):
        x, y = ns["batch"](step)
        opt.zero_grad()
        losses = [ns["loss_fn"](m(xc), yc) for xc, yc in zip(x.chunk(mb), y.chunk(mb), strict=True)]
        sum(loss / mb for loss in losses).backward()
        opt.step()
        out[f"pp_losses{step}"] = [loss.item() for loss in losses]
    out["pp_params"] = [p.detach().clone() for p in m.parameters()]
    return out


def close(a, b):
    torch.testing.assert_close(torch.as_tensor(a), torch.as_tensor(b), rtol=0, atol=1e-5)


def test_ddp_and_pipelining_schedules_over_atlas_equal_one_process(tmp_path):
    ref = reference()
    rcs, outs, res = launch(tmp_path, PROGRAM, 2, {"MODE": "atlas", "BACKEND": "atlas"})
    check_ok(rcs, outs)
    for step in range(3):
        # each DDP rank saw half the batch: the mean of their losses is the full batch's loss
        close((res[0][f"ddp_loss{step}"] + res[1][f"ddp_loss{step}"]) / 2, ref[f"ddp_loss{step}"])
    for r in range(2):
        for got, want in zip(res[r]["ddp_params"], ref["ddp_params"], strict=True):
            close(got, want)
    for name in ("gpipe", "1f1b"):
        for step in range(3):
            close(res[1][f"{name}_losses{step}"], ref[f"pp_losses{step}"])
        close_params(res, name, ref)


def close_params(res, name, ref):
    got = res[0][f"{name}_params"] + res[1][f"{name}_params"]
    assert len(got) == len(ref["pp_params"])
    for g, w in zip(got, ref["pp_params"], strict=True):
        close(g, w)


def test_pipeline_on_an_atlas_subgroup_under_a_gloo_default_group(tmp_path):
    ref = reference()
    rcs, outs, res = launch(tmp_path, PROGRAM, 2, {"MODE": "hybrid"})
    check_ok(rcs, outs)
    for step in range(3):
        close(res[1][f"1f1b_losses{step}"], ref[f"pp_losses{step}"])
    close_params(res, "1f1b", ref)
