"""What torch's own libraries call on a process group works on `atlas`, checked in one
3-rank world (default group atlas, the same ranks over gloo beside it to compare
with): every collective's list, single-tensor and coalesced form, all_to_all with
uneven splits, PREMUL_SUM, object collectives, receives from any source, the group's
name as DeviceMesh, functional collectives and DTensor find it, future callbacks that
start collectives (and DDP's PowerSGD hook), and the errors bad input gets."""

from __future__ import annotations

import torch
from test_torch_backend import check_ok, launch

PROGRAM = """
import torch.nn as nn
import torch.distributed._functional_collectives as funcol
from torch.distributed.distributed_c10d import _coalescing_manager
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, Shard, distribute_tensor
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powerSGD

dist.init_process_group("atlas", timeout=timedelta(seconds=30))
G = dist.new_group(backend="gloo")              # the same ranks over gloo, to compare with
pg = dist.group.WORLD
res, ref = {}, {}

def both(key, fn):
    res[key], ref[key] = fn(None), fn(G)

# the group's name and devices, as torch looks them up
res["name"] = (pg.group_name, pg.group_desc, dist.get_backend(), [d.type for d in pg._device_types])
res["resolved"] = dist.distributed_c10d._resolve_process_group(pg.group_name) is pg
res["object_device"] = dist.distributed_c10d._get_object_coll_device(pg)

def agc(g):                                      # as many inputs as ranks: swapped lists would show
    ins = [torch.full((2,), 10.0 * RANK + i) for i in range(WORLD)]
    outs = [[torch.empty(2) for _ in ins] for _ in range(WORLD)]
    dist.all_gather_coalesced(outs, ins, group=g)
    return torch.stack([torch.stack(o) for o in outs])
both("all_gather_coalesced", agc)

def a2a_single(g):                               # uneven: rank r sends p + r + 1 rows to rank p
    ins = [p + RANK + 1 for p in range(WORLD)]
    outs = [RANK + q + 1 for q in range(WORLD)]
    y = torch.empty(sum(outs), 2)
    dist.all_to_all_single(y, torch.arange(float(sum(ins) * 2)).reshape(-1, 2) + 100 * RANK, outs, ins, group=g)
    z = torch.empty(WORLD * 2, 3)                # even (no sizes), and a zero-row part
    dist.all_to_all_single(z, torch.arange(WORLD * 6.0).reshape(WORLD * 2, 3) * (RANK + 1), group=g)
    parts = [int(p != 0 and RANK != 0) for p in range(WORLD)]   # nothing to or from rank 0
    e = torch.empty(sum(parts))
    dist.all_to_all_single(e, torch.full((sum(parts),), float(RANK)), parts, parts, group=g)
    return y, z, e
both("all_to_all_single", a2a_single)

def a2a_list(g):
    outs = [torch.empty(2) for _ in range(WORLD)]
    dist.all_to_all(outs, [torch.full((2,), float(10 * RANK + p)) for p in range(WORLD)], group=g)
    return outs
both("all_to_all", a2a_list)
uneven = [torch.empty(RANK + 1) for _ in range(WORLD)]  # gloo refuses parts of different sizes
dist.all_to_all(uneven, [torch.full((p + 1,), float(10 * RANK + p)) for p in range(WORLD)])
res["all_to_all_uneven"] = uneven

def coalesced(g):
    a, b = torch.full((3,), float(RANK)), torch.full((5,), float(RANK + 1))
    with _coalescing_manager(group=g):
        dist.all_reduce(a, group=g)
        dist.all_reduce(b, group=g)
    outs = [torch.empty(WORLD * 2), torch.empty(WORLD * 3)]
    with _coalescing_manager(group=g, async_ops=True) as cm:
        dist.all_gather_into_tensor(outs[0], torch.full((2,), float(RANK)), group=g)
        dist.all_gather_into_tensor(outs[1], torch.full((3,), -float(RANK)), group=g)
    cm.wait()
    rs = [torch.empty(2), torch.empty(1)]
    with _coalescing_manager(group=g):
        dist.reduce_scatter_tensor(rs[0], torch.arange(2.0 * WORLD) + RANK, group=g)
        dist.reduce_scatter_tensor(rs[1], torch.arange(1.0 * WORLD) * RANK, group=g)
    return a, b, *outs, *rs
both("coalescing_manager", coalesced)

right, left = (RANK + 1) % WORLD, (RANK - 1) % WORLD    # a coalescing block's end covers its sends and receives
ring = torch.zeros(2)
with _coalescing_manager(device=torch.device("cpu"), async_ops=True) as cm:
    dist.isend(torch.full((2,), float(RANK + 1)), right)
    dist.irecv(ring, left)
cm.wait()
res["coalesced_p2p"] = ring.tolist()

def rooted(g):
    t = torch.arange(4.0) * (RANK + 1)
    dist.reduce(t, dst=1, op=dist.ReduceOp.MAX, group=g)
    gl = [torch.empty(2) for _ in range(WORLD)] if RANK == 2 else None
    dist.gather(torch.full((2,), float(RANK)), gl, dst=2, group=g)
    sc = torch.empty(3)
    dist.scatter(sc, [torch.full((3,), float(p * 7)) for p in range(WORLD)] if RANK == 0 else None, src=0, group=g)
    dist.barrier(group=g)
    return (t if RANK == 1 else None), gl, sc
both("rooted", rooted)

def objects(g):
    out = {}
    objs = [None] * WORLD
    dist.all_gather_object(objs, {"rank": RANK, "s": "x" * RANK}, group=g)
    out["all_gather_object"] = objs
    lst = [RANK, "r"] if RANK == 1 else [None, None]
    dist.broadcast_object_list(lst, src=1, group=g)
    out["broadcast_object_list"] = lst
    gl = [None] * WORLD if RANK == 0 else None
    dist.gather_object(("g", RANK), gl, dst=0, group=g)
    out["gather_object"] = gl
    so = [None]
    dist.scatter_object_list(so, [{"to": p} for p in range(WORLD)] if RANK == 2 else None, src=2, group=g)
    out["scatter_object_list"] = so
    if RANK == 0:
        dist.send_object_list([{"hello": 1}, [2, 3]], dst=1, group=g)
    elif RANK == 1:
        got = [None, None]
        dist.recv_object_list(got, src=0, group=g)
        out["recv_object_list"] = got
    return out
both("objects", objects)

def functional(g):                               # C++ finds the group by its name
    g = g or pg
    x = torch.arange(6.0) + RANK
    outs = [funcol.all_reduce(x, "sum", g), funcol.all_reduce(x, "max", g), funcol.all_gather_tensor(x, 0, g),
            funcol.reduce_scatter_tensor(torch.arange(6.0 * WORLD) * (RANK + 1), "sum", 0, g),
            funcol.all_to_all_single(torch.arange(WORLD * 2.0) + 10 * RANK, None, None, g),
            funcol.all_to_all_single(torch.arange(WORLD * (WORLD + 1) / 2) + 10 * RANK, [RANK + 1] * WORLD,
                                     [p + 1 for p in range(WORLD)], g),
            *funcol.all_reduce_coalesced([x, x * 2], "sum", g),
            *funcol.all_gather_into_tensor_coalesced([x, x[:2]], g),
            funcol.broadcast(x, 2, g)]
    return [t.wait() if isinstance(t, funcol.AsyncCollectiveTensor) else t for t in outs]
both("funcol", functional)

def gather_out(g):                               # the _out form torch.compile's bucketing emits
    out = torch.empty(2 * WORLD)
    got = torch.ops._c10d_functional.all_gather_into_tensor_out(torch.full((2,), float(RANK)), WORLD,
                                                                (g or pg).group_name, out=out)
    return torch.ops._c10d_functional.wait_tensor(got), out
both("all_gather_into_tensor_out", gather_out)
rsc = funcol.reduce_scatter_tensor_coalesced([torch.ones(WORLD * 2), torch.arange(float(WORLD))], "sum", [0, 0], pg)
res["funcol_rs_coalesced"] = [t.wait() for t in rsc]   # gloo has no reduce_scatter_tensor_coalesced

mesh = init_device_mesh("cpu", (WORLD,), mesh_dim_names=("dp",))
res["mesh_group"] = mesh.get_group("dp") is pg
d = distribute_tensor(torch.arange(WORLD * 8.0).reshape(WORLD * 2, 4), mesh, [Shard(0)])
res["dtensor"] = [d.to_local(), d.full_tensor(), d.redistribute(mesh, [Replicate()]).to_local(),
                  d.redistribute(mesh, [Shard(1)]).full_tensor(), d.sum().full_tensor()]

# PREMUL_SUM in all_reduce (float and tensor factors), reduce_scatter (input kept) and reduce
p1 = torch.full((3,), float(RANK + 1))
dist.all_reduce(p1, op=dist._make_nccl_premul_sum(0.5))
p2, inp = torch.empty(2), torch.arange(2.0 * WORLD) + RANK
dist.reduce_scatter_tensor(p2, inp, op=dist.ReduceOp.PREMUL_SUM(0.25))
p3 = torch.full((2,), float(RANK + 1), dtype=torch.float64)
dist.all_reduce(p3, op=dist._make_nccl_premul_sum(torch.tensor([2.0], dtype=torch.float64)))
p4 = torch.full((2,), float(RANK + 1))
dist.reduce(p4, dst=0, op=dist._make_nccl_premul_sum(3.0))
res["premul"] = (p1, p2, inp, p3, p4 if RANK == 0 else None)

# receives from any source: the last rank receives one message from every other rank
if RANK == WORLD - 1:
    got = []
    for _ in range(WORLD - 1):
        t = torch.empty(2)
        got.append((dist.recv(t, tag=5), t[0].item()))
    w = dist.irecv(torch.empty(1), tag=6)
    w.wait()
    res["anysource"] = (got, w._source_rank())
else:
    dist.send(torch.full((2,), float(RANK)), WORLD - 1, tag=5)
    if RANK == 0:
        dist.send(torch.ones(1), WORLD - 1, tag=6)

# a future callback that starts collectives and waits for them (deadlocked before: callbacks ran
# on the collectives thread, the nested collective queued behind its own callback)
def callback(fut):
    inner = torch.full((2,), float(RANK))
    v = dist.all_reduce(inner, async_op=True).get_future().wait()[0]
    dist.all_reduce(inner)
    return fut.value()[0] + v
res["callback"] = dist.all_reduce(torch.ones(2), async_op=True).get_future().then(callback).wait()

def ddp_powersgd(g):                             # the same seeds over atlas and gloo
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)), process_group=g or pg)
    state = powerSGD.PowerSGDState(process_group=g or pg, matrix_approximation_rank=1, start_powerSGD_iter=2,
                                   min_compression_rate=0.5)
    model.register_comm_hook(state, powerSGD.powerSGD_hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(RANK)
    for _ in range(4):
        opt.zero_grad()
        model(torch.randn(5, 8, generator=gen)).square().mean().backward()
        opt.step()
    return [p.detach().clone() for p in model.parameters()]
both("powersgd", ddp_powersgd)

def sparse(g):                                   # sparse COO SUM (gloo's), and DDP over a sparse embedding
    idx = torch.tensor([[RANK, RANK + 1, 0], [0, 1, RANK]])[:, :RANK + 1]
    t = torch.sparse_coo_tensor(idx, torch.arange(2.0 * (RANK + 1)).reshape(-1, 2) + RANK, (4, 4, 2))
    dist.all_reduce(t, group=g)
    torch.manual_seed(0)
    model = DDP(nn.Embedding(10, 3, sparse=True), process_group=g or pg)
    model(torch.tensor([RANK, 2 * RANK + 1])).sum().backward()
    return t.to_dense(), model.module.weight.grad.to_dense()
both("sparse", sparse)

errors = {}
for key, fn in (("band_float", lambda: dist.all_reduce(torch.ones(2), op=dist.ReduceOp.BAND)),
                ("premul_int", lambda: dist.all_reduce(torch.ones(2, dtype=torch.int32), op=dist._make_nccl_premul_sum(2.0))),
                ("sum_float8", lambda: dist.all_reduce(torch.zeros(2, dtype=torch.float8_e4m3fn))),
                ("a2a_splits", lambda: dist.all_to_all_single(torch.empty(4), torch.empty(4), [1] * WORLD, [2] * WORLD)),
                ("agc_lists", lambda: dist.all_gather_coalesced([[torch.empty(1)]], [torch.ones(1)]))):
    try:
        fn()
        errors[key] = None
    except Exception as exc:
        errors[key] = f"{type(exc).__name__}: {exc}"
if RANK == 0:                                    # wait(timeout) shorter than the group's: raises, the receive stays
    w = dist.irecv(torch.empty(1), src=1, tag=9)
    try:
        w.wait(timeout=timedelta(seconds=0.2))
    except Exception as exc:
        errors["wait_timeout"] = f"{type(exc).__name__}: {exc}"
    dist.barrier()
    errors["wait_later"] = w.wait()
else:
    dist.barrier()
    if RANK == 1:
        dist.send(torch.ones(1), 0, tag=9)
pg.monitored_barrier(timedelta(seconds=20))          # gloo's monitored barrier, on the group object
pg.monitored_barrier(timedelta(seconds=20), wait_all_ranks=True)
if RANK != 1:                                        # rank 1 stays away: rank 0 names it, rank 2 names rank 0
    try:
        pg.monitored_barrier(timedelta(seconds=1))
    except RuntimeError as exc:
        errors["monitored"] = str(exc)
if RANK == 0:                                        # no time left at all (torch's rank-0-timeout test)
    try:
        pg.monitored_barrier(timedelta(seconds=0))
    except RuntimeError as exc:
        errors["monitored_zero"] = str(exc)
short = dist.new_group(timeout=timedelta(seconds=2))  # only rank 0 enters: it fails within the group's timeout
if RANK == 0:
    t0 = time.monotonic()
    try:
        dist.barrier(group=short)
    except Exception as exc:
        errors["group_timeout"] = (f"{type(exc).__name__}: {exc}", time.monotonic() - t0)
# split_group as torch runs it where init_process_group(device_id=...) bound an accelerator
# (simulated: the cpu stands in for it; torch itself refuses to split without one)
try:
    dist.split_group(split_ranks=[[0, 2], [1]])
except RuntimeError as exc:
    errors["split_unbound"] = str(exc)
torch.accelerator.is_available = lambda: True
torch.accelerator.current_accelerator = lambda check_available=False: torch.device("cpu")
pg.eager_connect_single_device(torch.device("cpu", 0))  # what init_process_group(device_id=) calls
sub = dist.split_group(split_ranks=[[0, 2], [1]])
t = torch.full((2,), float(RANK + 1))
dist.all_reduce(t, group=sub)
res["split"] = (str(pg.bound_device_id), dist.get_process_group_ranks(sub), sub.group_name in
                dist.distributed_c10d._world.pg_names.values(), t.tolist())
dist.barrier()
try:                                             # sizes differ across ranks: the group breaks, named
    dist.all_reduce(torch.ones(3 + RANK))
    errors["sizes"] = None
except Exception as exc:
    errors["sizes"] = f"{type(exc).__name__}: {exc}"
res["errors"] = errors
save({"res": res, "ref": ref})
exit_together()  # a peer may still read its size error
"""


def same(a, b, tol: float = 0.0) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.shape == b.shape and bool(((a - b).abs() <= tol).all())
    if isinstance(a, (list, tuple)):
        return isinstance(b, (list, tuple)) and len(a) == len(b) and all(same(x, y, tol) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k], tol) for k in a)
    return a == b


def test_torch_apis_on_atlas_match_gloo_in_one_world(tmp_path):
    world = 3
    # ATLAS_INTRA_SITE=atlas: this program checks atlas channels' own behaviour too (a
    # collective whose sizes differ across ranks is named by the channel; on the site's
    # gloo group, the default for ranks of one site, gloo does not check sizes).
    # test_torch_intrasite covers the collectives on gloo.
    rcs, outs, saved = launch(tmp_path, PROGRAM, world, {"ATLAS_INTRA_SITE": "atlas"}, timeout=240)
    check_ok(rcs, outs)
    res = [s["res"] for s in saved]
    for r, s in enumerate(saved):
        for key, want in s["ref"].items():  # bit-equal to gloo (PowerSGD's floats within 1e-5)
            assert same(s["res"][key], want, 1e-5 if key == "powersgd" else 0.0), (r, key, s["res"][key], want)

    for r in range(world):
        assert res[r]["name"] == ("0", "default_pg", "atlas", ["cpu", "cuda"])
        assert res[r]["resolved"] and res[r]["mesh_group"] and res[r]["object_device"] == "cpu"
        agc = res[r]["all_gather_coalesced"]  # [rank][input]: rank q's input i is 10 q + i
        assert agc[:, :, 0].tolist() == [[10.0 * q + i for i in range(world)] for q in range(world)]
        rows = res[r]["all_to_all_single"][0][:, 0].tolist()  # rank q sent rank r its rows for r
        want = []
        for q in range(world):
            start = sum(p + q + 1 for p in range(r))
            want += [2.0 * (start + k) + 100 * q for k in range(r + q + 1)]
        assert rows == want
        assert res[r]["all_to_all_single"][2].tolist() == ([] if r == 0 else [float(q) for q in range(1, world)])
        assert [t.tolist() for t in res[r]["all_to_all_uneven"]] == [[10.0 * q + r] * (r + 1) for q in range(world)]
        assert res[r]["all_gather_into_tensor_out"][1].tolist() == [float(q) for q in range(world) for _ in range(2)]
        assert [t.tolist() for t in res[r]["funcol_rs_coalesced"]] == [[3.0, 3.0], [3.0 * r]]
        full = torch.arange(world * 8.0).reshape(world * 2, 4)
        local, gathered, replicated, resharded, total = res[r]["dtensor"]
        assert torch.equal(local, full[2 * r:2 * r + 2]) and torch.equal(gathered, full)
        assert torch.equal(replicated, full) and torch.equal(resharded, full) and total.item() == full.sum().item()
        p1, p2, inp, p3, p4 = res[r]["premul"]
        assert p1.tolist() == [3.0] * 3 and p3.tolist() == [12.0, 12.0]
        assert p2.tolist() == [0.25 * sum(2 * r + j + q for q in range(world)) for j in range(2)]
        assert inp.tolist() == (torch.arange(2.0 * world) + r).tolist()  # PREMUL_SUM left the input as it was
        assert r != 0 or p4.tolist() == [18.0, 18.0]
        assert res[r]["coalesced_p2p"] == [float((r - 1) % world + 1)] * 2
        assert res[r]["callback"].tolist() == [12.0, 12.0]  # 3 + (0 + 1 + 2) summed again: 3 + 9

        assert res[r]["split"] == ("cpu:0", [0, 2] if r != 1 else [1], True, [4.0, 4.0] if r != 1 else [2.0, 2.0])
        assert res[r]["errors"]["split_unbound"] == ("No device associated with the default pg, not safe to split "
                                                     "any process groups")

    got, irecv_src = res[world - 1]["anysource"]
    assert sorted(src for src, _ in got) == list(range(world - 1))
    assert all(value == float(src) for src, value in got) and irecv_src == 0  # the source reported is the sender

    err = res[0]["errors"]
    assert err["band_float"] == "ValueError: atlas: reduce op BAND needs an integer or bool tensor, got torch.float32"
    assert err["premul_int"] == ("ValueError: atlas: all_reduce: reduce op PREMUL_SUM needs a floating point "
                                 "tensor, got torch.int32")
    assert err["sum_float8"] == ("ValueError: atlas: all_reduce: reduce op SUM is not supported for "
                                 "torch.float8_e4m3fn (torch has no CPU kernel for it: \"add_stub\" not implemented "
                                 "for 'Float8_e4m3fn'); reduce in a wider dtype such as torch.float32 and cast back")
    assert "input_split_sizes [2, 2, 2] must be 3 (the group size) non-negative row counts adding up to the " \
           "input's 4 rows" in err["a2a_splits"]
    assert "all_gather_coalesced needs one output list per rank (3), got 1" in err["agc_lists"]
    assert err["wait_timeout"] == ("AtlasError: atlas: recv of (1,) float32 did not complete within the 0.2 s "
                                   "given to wait()") and err["wait_later"] is True
    assert err["monitored"] == "[Rank 0]: Rank 1 failed to pass monitoredBarrier in 1000 ms (group '0')"
    assert err["monitored_zero"].startswith("Rank 0 timed out in monitoredBarrier after 0 ms")
    assert res[2]["errors"]["monitored"].startswith("Rank 2 successfully reached monitoredBarrier, but received "
                                                    "errors while waiting for send/recv from rank 0.")
    assert "monitored" not in res[1]["errors"]
    msg, took = err["group_timeout"]
    assert msg.startswith("AtlasError: atlas: barrier #0 of group ") and " timeout " in msg, msg
    assert "did not appear in the store within the group's timeout of 2 s" in msg and 1.9 < took < 10, (msg, took)
    for r in range(world):  # each rank names itself, the peer whose message did not fit, and both sizes
        msg = res[r]["errors"]["sizes"]
        assert msg.startswith("AtlasError: atlas: all_reduce(SUM) #") and f"on rank {r} from rank" in msg, msg
        assert f"the destination is float32[{3 + r}]" in msg and "(element count differs)" in msg, msg
