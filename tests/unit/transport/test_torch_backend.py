"""The `atlas` torch.distributed backend between real processes on loopback: every
point-to-point operation and collective, subgroups next to gloo, and the errors a
dead or silent peer gives. Each test starts its ranks as plain env:// programs
(RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT), as torchrun would."""

from __future__ import annotations

import os
import socket
import textwrap
import time
from pathlib import Path

import pytest
import torch
import zygote  # tests/zygote.py: ranks forked from a process that imported torch once

pytestmark = pytest.mark.spread  # each test starts its own ranks and shares nothing

PRELUDE = """\
import os, sys, time, torch, torch.distributed as dist
import atlas_transport.torch
from datetime import timedelta
RANK, WORLD = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
def save(obj):
    torch.save(obj, os.path.join(os.environ["OUT"], f"r{RANK}.pt"))
def exit_together(timeout=timedelta(seconds=60)):
    # os._exit once every rank got here: a rank exiting early closes its channels, and a peer
    # still reading would see "peer closed" instead of what it was to read. Through the default
    # store (a broken atlas group has no barrier); rank 0 serves the TCPStore, so it leaves last,
    # after every other rank's last store call.
    store = dist.distributed_c10d._get_default_store()
    store.set(f"exit_together/{RANK}", "here")
    store.wait([f"exit_together/{r}" for r in range(WORLD)], timeout)
    if RANK == 0:
        store.wait([f"exit_together/gone/{r}" for r in range(1, WORLD)], timeout)
    else:
        store.set(f"exit_together/gone/{RANK}", "gone")
    os._exit(0)
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(tmp_path: Path, body: str, world: int, env: dict[str, str] | None = None, timeout: float = 120,
           stop_rank: int | None = None) -> tuple[list[int], list[str], list[object]]:
    """Run PRELUDE + body once per rank; (exit codes, outputs, what each rank save()d)."""
    script = tmp_path / "prog.py"
    script.write_text(PRELUDE + textwrap.dedent(body))
    port = free_port()
    base = {**os.environ, "PYTHONPATH": os.getcwd(), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
            "WORLD_SIZE": str(world), "OUT": str(tmp_path), **(env or {})}
    procs = [zygote.popen([str(script)], {**base, "RANK": str(r)}, merge=True) for r in range(world)]
    outs = []
    deadline = time.monotonic() + timeout
    try:
        for r, p in enumerate(procs):
            if r == stop_rank:
                continue
            outs.append(p.communicate(timeout=max(1, deadline - time.monotonic()))[0])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    if stop_rank is not None:
        outs.insert(stop_rank, procs[stop_rank].communicate(timeout=30)[0])
    results = []
    for r in range(world):
        f = tmp_path / f"r{r}.pt"
        results.append(torch.load(f, weights_only=False) if f.exists() else None)
    return [p.returncode for p in procs], outs, results


def check_ok(rcs, outs):
    for r, (rc, out) in enumerate(zip(rcs, outs, strict=True)):
        assert rc == 0, f"rank {r} exited {rc}:\n{out[-4000:]}"


def test_point_to_point_ops_keep_order_per_tag_and_never_block(tmp_path):
    body = """
    dist.init_process_group("atlas", timeout=timedelta(seconds=60))
    res = {}
    if RANK == 0:
        t0 = time.monotonic()
        w = dist.isend(torch.arange(1 << 20, dtype=torch.float32), 1, tag=3)  # peer posts in 2 s
        res["isend_returned_s"] = time.monotonic() - t0
        res["isend_done_at_once"] = w.is_completed()
        for i in range(4):                      # several sends on one tag, interleaved with another tag
            dist.send(torch.full((3,), float(i)), 1, tag=7)
            dist.isend(torch.full((2,), 100.0 + i), 1, tag=8).wait()
        w.wait()
        dist.send(torch.arange(12.0).reshape(3, 4).t(), 1)            # non-contiguous send
        dist.send(torch.tensor([1.5, -2.25], dtype=torch.bfloat16), 1)
        dist.send(torch.tensor([7, 8, 9], dtype=torch.int64), 1, tag=2**40)
    else:
        time.sleep(2.0)
        big = torch.empty(1 << 20)
        wb = dist.irecv(big, 0, tag=3)
        sevens = [torch.empty(3) for _ in range(4)]
        eights = [torch.empty(2) for _ in range(4)]
        ws = [dist.irecv(t, 0, tag=8) for t in eights] + [dist.irecv(t, 0, tag=7) for t in sevens]
        for w in ws:
            w.wait()
        wb.wait()
        res["big_ok"] = torch.equal(big, torch.arange(1 << 20, dtype=torch.float32))
        res["tag7"] = [t[0].item() for t in sevens]
        res["tag8"] = [t[0].item() for t in eights]
        dest = torch.zeros(3, 4).t()                                   # non-contiguous destination
        dist.recv(dest, 0)
        res["noncontig"] = dest.tolist()
        bf = torch.empty(2, dtype=torch.bfloat16)
        dist.recv(bf, 0)
        res["bf16"] = bf.float().tolist()
        i64 = torch.empty(3, dtype=torch.int64)
        dist.recv(i64, 0, tag=2**40)
        res["int64"] = i64.tolist()
    # batch_isend_irecv around a ring, as torch.distributed.pipelining posts it
    right, left = (RANK + 1) % WORLD, (RANK - 1) % WORLD
    got = torch.empty(5)
    reqs = dist.batch_isend_irecv([dist.P2POp(dist.irecv, got, left), dist.P2POp(dist.isend, torch.full((5,), float(RANK)), right)])
    for r in reqs:
        r.wait()
    res["ring"] = got[0].item()
    res["streams"] = dist.distributed_c10d._get_default_group().streams_used   # by RTT: 1 on loopback
    if RANK == 0:                                   # from any source: dist.recv returns the sender
        got = torch.empty(2)
        res["anysource"] = (dist.recv(got), got.tolist())
    else:
        dist.send(torch.tensor([4.0, 5.0]), 0)
    save(res)
    dist.destroy_process_group()
    """
    rcs, outs, res = launch(tmp_path, body, 2)
    check_ok(rcs, outs)
    r0, r1 = res
    assert r0["isend_returned_s"] < 1.5 and not r0["isend_done_at_once"]
    assert r1["big_ok"] and r1["tag7"] == [0.0, 1.0, 2.0, 3.0] and r1["tag8"] == [100.0, 101.0, 102.0, 103.0]
    assert r1["noncontig"] == torch.arange(12.0).reshape(3, 4).t().tolist()
    assert r1["bf16"] == [1.5, -2.25] and r1["int64"] == [7, 8, 9]
    assert (r0["ring"], r1["ring"]) == (1.0, 0.0)
    assert r0["streams"] == {1: 1} and r1["streams"] == {0: 1}
    assert r0["anysource"] == (1, [4.0, 5.0])


COLLECTIVES = """
dist.init_process_group(os.environ["BACKEND"], timeout=timedelta(seconds=60))
res = {}
g = torch.Generator().manual_seed(RANK)
for n in (7, 200_000):          # the small exchange and the ring
    for op in ("SUM", "AVG", "MIN", "MAX", "PRODUCT"):
        t = torch.rand(n, generator=g) + 0.5
        res[f"in_{op}_{n}"] = t.clone()
        if op == "AVG" and os.environ["BACKEND"] == "gloo":
            continue                            # gloo has no AVG
        dist.all_reduce(t, op=getattr(dist.ReduceOp, op))
        res[f"{op}_{n}"] = t
for op in ("BAND", "BOR", "BXOR"):
    t = torch.tensor([RANK + 1, 6, 3 * RANK, -1])
    dist.all_reduce(t, op=getattr(dist.ReduceOp, op))
    res[op] = t
nc = torch.arange(12.0).reshape(3, 4).t() * (RANK + 1)      # non-contiguous in place
dist.all_reduce(nc)
res["noncontig"] = nc
b = torch.full((4,), float(RANK))
dist.broadcast(b, src=WORLD - 1)
res["broadcast"] = b
outs = [torch.empty(2, 3) for _ in range(WORLD)]
dist.all_gather(outs, torch.full((2, 3), float(RANK)))
res["all_gather"] = torch.stack(outs)
big = torch.empty(WORLD * 3)
dist.all_gather_into_tensor(big, torch.full((3,), float(RANK)))
res["all_gather_into_tensor"] = big
rs = torch.empty(2)
dist.reduce_scatter(rs, [torch.full((2,), float(10 * RANK + j)) for j in range(WORLD)])
res["reduce_scatter"] = rs
rst = torch.empty(2)
dist.reduce_scatter_tensor(rst, torch.arange(2.0 * WORLD) * (RANK + 1), op=dist.ReduceOp.MAX)
res["reduce_scatter_tensor"] = rst
dist.barrier()
objs = [None] * WORLD
dist.all_gather_object(objs, {"rank": RANK})
res["objects"] = objs
w = dist.all_reduce(torch.ones(3), async_op=True)
res["future"] = w.get_future().wait()[0]
save(res)
dist.destroy_process_group()
"""


def test_collectives_match_gloo_and_hand_computed_results(tmp_path):
    world = 3
    (tmp_path / "atlas").mkdir()
    rcs, outs, res = launch(tmp_path / "atlas", COLLECTIVES, world, {"BACKEND": "atlas"})
    check_ok(rcs, outs)
    (tmp_path / "gloo").mkdir()
    rcs, outs, gloo = launch(tmp_path / "gloo", COLLECTIVES, world, {"BACKEND": "gloo"})
    check_ok(rcs, outs)
    for n in (7, 200_000):
        for op, fold in (("SUM", lambda s: s.sum(0)), ("AVG", lambda s: s.mean(0)), ("MIN", lambda s: s.min(0).values),
                         ("MAX", lambda s: s.max(0).values), ("PRODUCT", lambda s: s.prod(0))):
            want = fold(torch.stack([r[f"in_{op}_{n}"] for r in res]))
            for r in res:  # bit-identical on every rank, and right
                assert torch.equal(r[f"{op}_{n}"], res[0][f"{op}_{n}"]), (op, n)
            torch.testing.assert_close(res[0][f"{op}_{n}"], want, rtol=1e-5, atol=1e-6)
            if op != "AVG":
                torch.testing.assert_close(res[0][f"{op}_{n}"], gloo[0][f"{op}_{n}"], rtol=1e-5, atol=1e-6)
    for key in ("BAND", "BOR", "BXOR", "noncontig", "broadcast", "all_gather", "all_gather_into_tensor",
                "reduce_scatter", "reduce_scatter_tensor", "objects", "future"):
        for r in range(world):
            a, g = res[r][key], gloo[r][key]
            assert (torch.equal(a, g) if isinstance(a, torch.Tensor) else a == g), (key, r, a, g)
    assert res[0]["BXOR"].tolist() == [1 ^ 2 ^ 3, 6, 0 ^ 3 ^ 6, -1]
    assert res[1]["reduce_scatter"].tolist() == [33.0, 33.0]


def test_subgroups_of_atlas_next_to_gloo_and_the_reverse(tmp_path):
    body = """
    default, sub = ("gloo", "atlas") if os.environ["MODE"] == "gloo-default" else ("atlas", "gloo")
    dist.init_process_group(default, timeout=timedelta(seconds=60))
    opts = atlas_transport.torch.AtlasOptions(streams=2) if sub == "atlas" else None
    g02 = dist.new_group([0, 2], backend=sub, pg_options=opts)
    g12 = dist.new_group([1, 2], backend=sub)
    res = {"backends": (dist.get_backend(), dist.get_backend(g12 if RANK == 1 else g02))}
    t = torch.full((2,), float(RANK + 1))
    dist.all_reduce(t)
    res["world"] = t.tolist()
    for grp, members in ((g02, (0, 2)), (g12, (1, 2))):
        if RANK in members:
            x = torch.full((3,), float(RANK))
            dist.all_reduce(x, group=grp)
            res[f"sum{members}"] = x.tolist()
            if RANK == members[0]:
                dist.send(torch.arange(3.0) + RANK, dst=members[1], group=grp)
            else:
                y = torch.empty(3)
                dist.recv(y, src=members[0], group=grp)
                res[f"recv{members}"] = y.tolist()
    if sub == "atlas" and RANK in (0, 2):
        res["streams"] = g02.streams_used
    dist.barrier()
    save(res)
    dist.destroy_process_group()
    """
    for mode in ("gloo-default", "atlas-default"):
        (tmp_path / mode).mkdir()
        rcs, outs, res = launch(tmp_path / mode, body, 3, {"MODE": mode})
        check_ok(rcs, outs)
        assert res[0]["backends"] == (("gloo", "atlas") if mode == "gloo-default" else ("atlas", "gloo"))
        assert all(r["world"] == [6.0, 6.0] for r in res)
        assert res[0]["sum(0, 2)"] == res[2]["sum(0, 2)"] == [2.0] * 3
        assert res[1]["sum(1, 2)"] == res[2]["sum(1, 2)"] == [3.0] * 3
        assert res[2]["recv(0, 2)"] == [0.0, 1.0, 2.0] and res[2]["recv(1, 2)"] == [1.0, 2.0, 3.0]
        if mode == "gloo-default":  # pg_options=AtlasOptions(streams=2) on the atlas subgroup
            assert res[0]["streams"] == {1: 2} and res[2]["streams"] == {0: 2}


def test_a_peer_that_exits_mid_receive_is_named_within_the_timeout(tmp_path):
    body = """
    dist.init_process_group("atlas", timeout=timedelta(seconds=30))
    if RANK == 0:
        dist.send(torch.ones(4), 1)
        dist.isend(torch.ones(64 << 20, dtype=torch.uint8), 1)
        time.sleep(0.3)
        os._exit(0)                          # dies with the big transfer in flight
    dist.recv(torch.empty(4), 0)
    t0 = time.monotonic()
    try:
        dist.recv(torch.empty(64 << 20, dtype=torch.uint8), 0)
        save({"error": None})
    except Exception as exc:
        save({"error": f"{type(exc).__name__}: {exc}", "after_s": time.monotonic() - t0,
              "streams": dist.distributed_c10d._get_default_group().streams_used})
    """
    rcs, outs, res = launch(tmp_path, body, 2, {"ATLAS_STREAMS": "4", "ATLAS_PACING_MBPS": "100"})
    err = res[1]["error"]
    assert err is not None and err.startswith("AtlasError: atlas: recv of (67108864,) uint8 from rank 0"), outs[1]
    assert "lost rank 0" in err
    assert res[1]["after_s"] < 15 and res[1]["streams"] == {0: 4}


def test_a_silent_peer_is_named_within_the_timeout(tmp_path):
    body = """
    dist.init_process_group("atlas", timeout=timedelta(seconds=4))
    dist.barrier()                           # channels open, both alive
    if RANK == 0:                            # alive but never posts what rank 1 waits for,
        save({})
        exit_together()                      # until rank 1 has its errors
    res = {}
    for what, fn in (("recv", lambda: dist.recv(torch.empty(3), 0)),
                     ("all_reduce", lambda: dist.all_reduce(torch.ones(3)))):
        t0 = time.monotonic()
        try:
            fn()
        except Exception as exc:
            res[what] = (f"{type(exc).__name__}: {exc}", time.monotonic() - t0)
    save(res)
    exit_together()
    """
    rcs, outs, res = launch(tmp_path, body, 2)
    msg, took = res[1]["recv"]
    assert msg.startswith("AtlasError: atlas: recv of (3,) float32 from rank 0"), outs[1]
    assert "did not complete within 4 s (the process group's timeout): rank 0 is silent" in msg
    assert took < 8
    msg, took = res[1]["all_reduce"]
    # rank 0 still lives: the collective, too, waits out the group's timeout (it ended at
    # ~3 s with "connection closed" when rank 0 exited after a fixed sleep)
    assert "all_reduce(SUM)" in msg and "rank 0" in msg and 3.9 < took < 8, (msg, took)


def test_a_stopped_peer_is_lost_by_its_heartbeats(tmp_path):
    body = """
    import signal
    dist.init_process_group("atlas", timeout=timedelta(seconds=60))
    dist.barrier()
    if RANK == 0:
        os.kill(os.getpid(), signal.SIGSTOP)     # silent: not even heartbeats
    t0 = time.monotonic()
    try:
        dist.recv(torch.empty(3), 0)
    except Exception as exc:
        save({"error": f"{type(exc).__name__}: {exc}", "after_s": time.monotonic() - t0})
    os._exit(0)
    """
    # ATLAS_INTRA_SITE=atlas: the barrier opens the pair's atlas channel (on gloo, the default
    # for ranks of one site, it would not, and a channel first opened to a stopped peer
    # waits for its hello up to the group's timeout: no heartbeats before it is open)
    rcs, outs, res = launch(tmp_path, body, 2, {"ATLAS_IDLE_TIMEOUT_S": "2", "ATLAS_INTRA_SITE": "atlas"},
                            timeout=60, stop_rank=0)
    err = res[1]["error"]
    assert err.startswith("AtlasError: atlas: recv of (3,) float32 from rank 0"), outs[1]
    assert "lost rank 0" in err and res[1]["after_s"] < 20


@pytest.mark.gpu
def test_cuda_tensors_over_atlas(tmp_path):
    body = """
    dist.init_process_group("atlas", timeout=timedelta(seconds=60))
    t = torch.full((1 << 20,), float(RANK + 1), device="cuda")
    dist.all_reduce(t)
    x = torch.arange(6.0, device="cuda").reshape(2, 3).t()
    if RANK == 0:
        dist.send(x, 1)
    else:
        y = torch.empty(3, 2, device="cuda")
        dist.recv(y, 0)
        x = y
    import torch.distributed._functional_collectives as funcol
    a2a = torch.empty(2 * WORLD, device="cuda")
    dist.all_to_all_single(a2a, torch.arange(2.0 * WORLD, device="cuda") + 10 * RANK)
    ag = torch.empty(2 * WORLD, device="cuda")
    dist.all_gather_into_tensor(ag, torch.full((2,), float(RANK), device="cuda"))
    pm = torch.full((2,), float(RANK + 1), device="cuda")
    dist.all_reduce(pm, op=dist._make_nccl_premul_sum(0.5))
    fut = dist.all_reduce(torch.ones(2, device="cuda"), async_op=True).get_future().then(lambda f: f.value()[0] * 2)
    fc = funcol.all_reduce(torch.ones(2, device="cuda"), "sum", dist.group.WORLD).wait()
    save({"sum": t.cpu()[:3].tolist(), "x": x.cpu().tolist(), "dev": str(t.device), "a2a": a2a.tolist(),
          "ag": ag.tolist(), "premul": pm.tolist(), "future": fut.wait().tolist(), "funcol": fc.tolist()})
    dist.destroy_process_group()
    """
    rcs, outs, res = launch(tmp_path, body, 2)
    check_ok(rcs, outs)
    assert res[0]["sum"] == res[1]["sum"] == [3.0] * 3 and res[1]["dev"].startswith("cuda")
    assert res[1]["x"] == torch.arange(6.0).reshape(2, 3).t().tolist()
    assert res[0]["a2a"] == [0.0, 1.0, 10.0, 11.0] and res[1]["a2a"] == [2.0, 3.0, 12.0, 13.0]
    for r in res:
        assert r["ag"] == [0.0, 0.0, 1.0, 1.0] and r["premul"] == [1.5, 1.5]
        assert r["future"] == [4.0, 4.0] and r["funcol"] == [2.0, 2.0]
