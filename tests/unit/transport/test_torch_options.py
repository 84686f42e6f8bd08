"""atlas_transport.torch without processes: option parsing, addresses, staging, the
collective algorithms (ranks as threads over an in-memory exchange), registration."""

from __future__ import annotations

import os
import queue
import subprocess
import sys
import threading
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

import atlas_transport.torch as atl
from atlas_transport.torch import collectives as C
from atlas_transport.torch.mesh import default_streams
from atlas_transport.torch.options import AtlasOptions, parse_intra_site, parse_streams, resolve
from atlas_transport.torch.rendezvous import PeerAddress, own_address, route_source
from atlas_transport.torch.staging import Staged


def test_streams_values_and_their_errors():
    assert parse_streams("8", "ATLAS_STREAMS") == 8
    assert parse_streams(" auto ", "ATLAS_STREAMS") == "auto"
    for bad in ("0", "-2", "eight", "1.5", "300", ""):
        with pytest.raises(ValueError) as e:
            parse_streams(bad, "ATLAS_STREAMS")
        assert f"ATLAS_STREAMS={bad!r}" in str(e.value) and "1..256" in str(e.value) and "'auto'" in str(e.value)
    with pytest.raises(ValueError, match=r"AtlasOptions.streams=True"):
        resolve(AtlasOptions(streams=True), {})


def test_intra_site_values_and_their_errors():
    assert parse_intra_site(" GLOO ", "ATLAS_INTRA_SITE") == "gloo"
    assert parse_intra_site("atlas", "ATLAS_INTRA_SITE") == "atlas"
    assert resolve(None, {}).intra_site == "gloo"  # the default
    assert resolve(None, {"ATLAS_INTRA_SITE": "atlas"}).intra_site == "atlas"
    assert resolve(AtlasOptions(intra_site="gloo"), {"ATLAS_INTRA_SITE": "atlas"}).intra_site == "gloo"
    for bad in ("nccl", "", "gloo,atlas", 1):
        with pytest.raises(ValueError) as e:
            parse_intra_site(bad, "ATLAS_INTRA_SITE")
        assert "ATLAS_INTRA_SITE=" in str(e.value) and "'gloo'" in str(e.value) and "'atlas'" in str(e.value)
    with pytest.raises(ValueError, match=r"ATLAS_INTRA_SITE='mpi': use 'gloo'"):
        resolve(None, {"ATLAS_INTRA_SITE": "mpi"})
    with pytest.raises(ValueError, match=r"AtlasOptions.intra_site='tcp'"):
        resolve(AtlasOptions(intra_site="tcp"), {})


def test_resolve_prefers_pg_options_then_environment():
    env = {"ATLAS_STREAMS": "4", "ATLAS_PACING_MBPS": "250", "ATLAS_CONGESTION": "bbr", "ATLAS_BIND_ADDR": "10.0.0.1"}
    o = resolve(None, env)
    assert (o.streams, o.pacing_rate_mbps, o.congestion, o.bind_addr) == (4, 250.0, "bbr", "10.0.0.1")
    assert resolve(AtlasOptions(streams="auto"), env).streams == "auto"
    assert resolve(None, {}).streams is None
    with pytest.raises(ValueError, match=r"ATLAS_PACING_MBPS='fast': use a positive rate"):
        resolve(None, {"ATLAS_PACING_MBPS": "fast"})
    with pytest.raises(TypeError, match=r"pg_options for backend 'atlas' must be .*AtlasOptions or None, got dict"):
        resolve({"streams": 2}, {})


def test_default_stream_count_follows_the_rtt():
    assert default_streams(0.0002) == 1
    assert default_streams(0.05) == 8


def test_own_address_bind_then_route_then_loopback():
    assert own_address("10.1.2.3", None, {}) == "10.1.2.3"
    assert own_address(None, None, {"MASTER_ADDR": "127.0.0.1"}) == "127.0.0.1"
    assert own_address(None, None, {}) == "127.0.0.1"
    assert route_source("no-such-host.invalid") is None
    a = PeerAddress("10.0.0.2", 4000, 4001)
    assert PeerAddress.decode(a.encode().encode(), 1) == a
    with pytest.raises(ValueError, match=r"store key 'atlas/addr/3' holds 'junk'"):
        PeerAddress.decode(b"junk", 3)


def test_staging_copies_non_contiguous_tensors_in_and_back():
    base = torch.arange(12.0).reshape(3, 4)
    t = base.t()  # non-contiguous view
    s = Staged(t)
    assert not s.in_place and s.host.is_contiguous() and s.host.tolist() == t.reshape(-1).tolist()
    s.host.mul_(10)
    assert base[0, 1].item() == 1.0  # untouched until write_back
    s.write_back()
    assert torch.equal(base, torch.arange(12.0).reshape(3, 4) * 10)
    c = torch.ones(5)
    sc = Staged(c)
    assert sc.in_place and sc.host.data_ptr() == c.data_ptr()
    out = Staged(torch.full((2, 2), 7.0).t(), read=False)
    assert not out.in_place
    with pytest.raises(TypeError, match="only dense"):
        Staged(torch.eye(2).to_sparse())


@pytest.mark.gpu
def test_staging_of_a_cuda_tensor_goes_through_pinned_memory():
    t = torch.arange(6.0, device="cuda")
    s = Staged(t)
    assert s.host.device.type == "cpu" and s.host.is_pinned()
    s.host.add_(1)
    s.write_back()
    assert t.cpu().tolist() == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]


def test_unsupported_reduce_ops_are_named():
    assert C.op_name(dist.ReduceOp.AVG) == "AVG"
    with pytest.raises(ValueError, match=r"reduce op PREMUL_SUM is not supported; use one of SUM, AVG"):
        C.op_name(dist._make_nccl_premul_sum(2.0))
    with pytest.raises(ValueError, match="BXOR needs an integer or bool tensor, got torch.float32"):
        C.check_op("BXOR", torch.float32)
    with pytest.raises(ValueError, match="AVG needs a floating point tensor"):
        C.check_op("AVG", torch.int64)


def _run_threads(size, fn):
    """Run fn(rank, xfer) on `size` threads joined by in-memory queues."""
    qs = {(a, b): queue.Queue() for a in range(size) for b in range(size)}
    errors = []

    def xfer_for(rank):
        def xfer(sends, recvs):
            for p, t in sends:
                qs[(rank, p)].put(t.clone())
            for p, t in recvs:
                t.copy_(qs[(p, rank)].get(timeout=10))
        return xfer

    def run(rank):
        try:
            fn(rank, xfer_for(rank))
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)

    ths = [threading.Thread(target=run, args=(r,)) for r in range(size)]
    for th in ths:
        th.start()
    for th in ths:
        th.join(30)
    assert not errors, errors


@pytest.mark.parametrize("numel", [5, 300_000])  # exchange and ring
@pytest.mark.parametrize("size", [2, 3, 4])
def test_all_reduce_algorithms_give_identical_bits_on_every_rank(size, numel):
    g = torch.Generator().manual_seed(size)
    inputs = [torch.randn(numel, generator=g) for _ in range(size)]
    for name in ("SUM", "AVG", "MAX", "MIN", "PRODUCT"):
        outs = [x.clone() for x in inputs]
        _run_threads(size, lambda r, xfer, outs=outs, name=name: C.all_reduce(outs[r], name, r, size, xfer))
        stack = torch.stack(inputs)
        want = {"SUM": stack.sum(0), "AVG": stack.mean(0), "MAX": stack.max(0).values,
                "MIN": stack.min(0).values, "PRODUCT": stack.prod(0)}[name]
        for o in outs:
            assert torch.equal(o, outs[0]), name  # bit-identical across ranks
        torch.testing.assert_close(outs[0], want, rtol=1e-5, atol=1e-6)
    ints = [torch.tensor([r + 1, 6, 3 * r], dtype=torch.int64) for r in range(size)]
    for name, fold in (("BAND", lambda a, b: a & b), ("BOR", lambda a, b: a | b), ("BXOR", lambda a, b: a ^ b)):
        outs = [x.clone() for x in ints]
        _run_threads(size, lambda r, xfer, outs=outs, name=name: C.all_reduce(outs[r], name, r, size, xfer))
        want = ints[0].clone()
        for x in ints[1:]:
            want = fold(want, x)
        assert all(torch.equal(o, want) for o in outs), name


def test_reduce_scatter_and_all_gather_algorithms():
    size = 3
    ins = [[torch.full((2,), float(10 * r + j)) for j in range(size)] for r in range(size)]
    outs = [torch.empty(2) for _ in range(size)]
    _run_threads(size, lambda r, xfer: C.reduce_scatter(outs[r], ins[r], "SUM", r, size, xfer))
    assert [o.tolist() for o in outs] == [[30.0, 30.0], [33.0, 33.0], [36.0, 36.0]]
    gathered = [[torch.empty(2) for _ in range(size)] for _ in range(size)]
    _run_threads(size, lambda r, xfer: C.all_gather(gathered[r], torch.full((2,), float(r)), r, size, xfer))
    assert all([o.tolist() for o in g] == [[0.0] * 2, [1.0] * 2, [2.0] * 2] for g in gathered)


def test_import_registers_the_backend_once_and_cheaply():
    code = ("import sys, atlas_transport.torch, atlas_transport.torch as a2, torch.distributed as d;"
            "print(d.Backend.ATLAS, d.Backend.backend_list.count('atlas'), d.is_initialized(),"
            " any(t.name.startswith('atlas') for t in __import__('threading').enumerate()))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": os.getcwd()})
    assert out.stdout.split() == ["atlas", "1", "False", "False"], out.stderr
    assert atl.BACKEND_NAME.upper() in dist.Backend._plugins


def test_bad_streams_env_fails_at_init_naming_the_variable(monkeypatch):
    monkeypatch.setenv("ATLAS_STREAMS", "many")
    store = dist.HashStore()
    with pytest.raises(ValueError, match=r"ATLAS_STREAMS='many': use an integer 1..256"):
        dist.init_process_group("atlas", store=store, rank=0, world_size=1, timeout=timedelta(seconds=10))
    if dist.is_initialized():
        dist.destroy_process_group()
