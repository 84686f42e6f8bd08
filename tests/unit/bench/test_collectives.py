"""`testbed bench collectives`: nccl-tests' bus-bandwidth arithmetic, the size ladder,
the worker's result checks, the report on made-up rows, every argument error of the
command, and the local mode end to end on small sizes (gloo in make test, gloo and atlas
under long)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from testbed.bench.collectives import (
    BenchConfig,
    BenchReport,
    CollectivesError,
    PointResult,
    algbw_gbit_s,
    bus_factor,
    busbw_gbit_s,
    plot,
    read_json,
    results_from_metrics,
    size_ladder,
    table,
    write_csv,
    write_json,
)
from testbed.bench.collectives_worker import _pattern, _Point
from testbed.cli import main

KiB, MiB = 1 << 10, 1 << 20


@pytest.mark.parametrize(("collective", "world", "factor"), [
    ("all_reduce", 2, 1.0), ("all_reduce", 4, 1.5), ("all_reduce", 8, 1.75),
    ("all_gather", 2, 0.5), ("all_gather", 4, 0.75),
    ("reduce_scatter", 4, 0.75), ("all_to_all", 4, 0.75), ("all_to_all", 3, 2 / 3),
    ("send_recv", 2, 1.0), ("send_recv", 4, 1.0),
])
def test_bus_factor_is_nccl_tests(collective: str, world: int, factor: float) -> None:
    assert bus_factor(collective, world) == pytest.approx(factor)


def test_algbw_and_busbw_in_gbit_per_second() -> None:
    # 256 MiB in 2 s: 1.073741824 Gbit/s; an all_reduce on 4 ranks moved 1.5x that per rank
    assert algbw_gbit_s(256 * MiB, 2.0) == pytest.approx(256 * MiB * 8 / 2 / 1e9)
    assert busbw_gbit_s("all_reduce", 4, 256 * MiB, 2.0) == pytest.approx(1.5 * 256 * MiB * 8 / 2 / 1e9)
    assert busbw_gbit_s("send_recv", 4, 1000, 1e-6) == pytest.approx(8.0)
    with pytest.raises(ValueError, match="unknown collective 'broadcast'; known: all_reduce"):
        bus_factor("broadcast", 4)
    with pytest.raises(ValueError, match="the time must be positive"):
        algbw_gbit_s(10, 0.0)


def test_size_ladder() -> None:
    assert size_ladder(4 * KiB, 256 * MiB, 4) == [4 * KiB * 4**k for k in range(9)]
    assert size_ladder(4 * KiB, 20 * KiB, 4) == [4 * KiB, 16 * KiB, 20 * KiB]  # the largest is always measured
    assert size_ladder(64, 64, 2) == [64]
    with pytest.raises(ValueError, match="largest size 1KiB is under the smallest 4KiB"):
        size_ladder(4 * KiB, KiB, 4)
    with pytest.raises(ValueError, match="factor 1: use 2 or more"):
        size_ladder(4, 64, 1)


@pytest.mark.parametrize("collective", ["all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv"])
def test_worker_check_accepts_the_right_result_and_names_a_wrong_one(collective: str) -> None:
    """What each rank must hold after the call, built by hand from every rank's input;
    then the same with two chunks swapped (or one element off)."""
    world, rank = 4, 1
    points = [_Point(collective, 4 * KiB + 12, r, world) for r in range(world)]  # 1027 floats: rounded to 1024
    me = points[rank]
    assert me.size_bytes == 4 * KiB and me.chunk == 256
    c = me.chunk
    if collective == "all_reduce":
        me.inp = sum(p.inp for p in points)
        target = me.inp
    elif collective == "all_gather":
        me.out.copy_(torch.cat([p.inp for p in points]))
        target = me.out
    elif collective == "reduce_scatter":
        me.out.copy_(sum(p.inp for p in points)[rank * c:(rank + 1) * c])
        target = me.out
    elif collective == "all_to_all":
        me.out.copy_(torch.cat([p.inp[rank * c:(rank + 1) * c] for p in points]))
        target = me.out
    else:
        me.out.copy_(points[rank - 1].inp)
        target = me.out
    assert me.check() is None
    if collective in ("all_gather", "all_to_all"):
        a, b = target[:c].clone(), target[c:2 * c].clone()
        target[:c], target[c:2 * c] = b, a
        assert me.check().startswith(f"rank 1: {2 * c} of {4 * c} elements wrong, the first at 0 (chunk 0)")
    else:
        target[7] += 1
        assert me.check() == (f"rank 1: 1 of {target.numel()} elements wrong, the first at 7 (chunk 0): "
                              f"{float(target[7])} where {float(target[7]) - 1} was due")


def test_pattern_stays_exact_in_float32() -> None:
    t = _pattern(5000, 2000.0 * 63)
    assert t.dtype == torch.float32 and float(t.max()) == 1008 + 2000.0 * 63


def rows() -> list[PointResult]:
    out = []
    for backend, bw in (("gloo", 0.1), ("atlas", 0.4)):
        for size in (4 * KiB, 64 * MiB):
            t = size * 8 / (bw * 1e9)
            out.append(PointResult(backend=backend, collective="all_reduce", world_size=4, size=size, size_bytes=size,
                                   iters=3, time_s=t, algbw_gbit_s=bw / 1.5, busbw_gbit_s=bw, verified=True))
    out.append(PointResult(backend="atlas", collective="all_to_all", world_size=4, size=4 * KiB, size_bytes=4 * KiB,
                           error="rank 2: RuntimeError: not supported"))
    out.append(PointResult(backend="atlas", collective="all_to_all", world_size=4, size=64 * MiB,
                           size_bytes=64 * MiB, skipped="all_to_all failed at 4096 bytes"))
    out.append(PointResult(backend="gloo", collective="all_to_all", world_size=4, size=4 * KiB, size_bytes=4 * KiB,
                           iters=3, time_s=0.01, algbw_gbit_s=0.004, busbw_gbit_s=0.003, verified=False))
    return out


def test_table_json_csv_and_plot(tmp_path: Path) -> None:
    text = table(rows())
    lines = text.splitlines()
    assert lines[0].split()[:4] == ["collective", "size", "gloo", "ms"]
    big = next(x for x in lines if x.startswith("all_reduce") and "64MiB" in x)
    assert big.split()[2:] == ["5368.709", "0.1000", "1342.177", "0.4000", "4.00x"]
    assert "atlas all_to_all 4KiB: rank 2: RuntimeError: not supported" in text
    assert "atlas all_to_all 64MiB: all_to_all failed at 4096 bytes" in text
    report = BenchReport(command="testbed bench collectives --local 4", mode="local 4", world_size=4,
                         time="2026-12-04T22:00:00Z", host="h", config=BenchConfig(sizes=[4 * KiB, 64 * MiB]),
                         results=rows())
    write_json(report, tmp_path / "results.json")
    assert read_json(tmp_path / "results.json") == report
    write_csv(rows(), tmp_path / "results.csv")
    head, *body = (tmp_path / "results.csv").read_text().splitlines()
    assert head.startswith("backend,collective,world_size,size,size_bytes,iters,time_s,algbw_gbit_s,busbw_gbit_s")
    assert len(body) == len(rows())
    plot(rows(), tmp_path / "busbw.png", title="made up")
    assert (tmp_path / "busbw.png").read_bytes()[:4] == b"\x89PNG"


def test_results_from_metrics_reads_rank_0s_result_lines() -> None:
    good = {"event": "result", **rows()[0].model_dump()}
    got = results_from_metrics([{"step": 1}, good, {"event": "done"}])
    assert got == [rows()[0]]
    with pytest.raises(CollectivesError, match="a rank printed a result line that is not a PointResult"):
        results_from_metrics([{"event": "result", "backend": "gloo"}])


def test_config_refuses_unknown_collectives_and_tiny_sizes() -> None:
    with pytest.raises(ValueError, match="unknown collective\\(s\\) broadcast; choose from all_reduce"):
        BenchConfig(collectives=["broadcast"], sizes=[4096])
    with pytest.raises(ValueError, match="sizes of 4 bytes"):
        BenchConfig(sizes=[2])


@pytest.mark.parametrize(("args", "message"), [
    (["--local", "2", "--collectives", "all_reduce,broadcast"],
     "unknown collective(s) broadcast; choose from all_reduce, all_gather, reduce_scatter, all_to_all, send_recv"),
    (["--local", "2", "--backends", "nccl"], "unknown backend(s) nccl; choose from gloo, atlas"),
    (["--local", "2", "--min-size", "4 apples"], "--min-size"),
    (["--local", "2", "--max-size", "2B"], "2B is under one float32 (4 bytes)"),
    (["--local", "2", "--min-size", "1MiB", "--max-size", "4KiB"],
     "--min-size/--max-size/--factor: the largest size 4KiB is under the smallest 1MiB"),
    (["--local", "2", "--factor", "1"], "factor 1: use 2 or more"),
    (["--local", "2", "--iters", "0"], "0: use 1 or more"),
    (["--local", "2", "--budget", "0"], "0: use a positive number of seconds"),
    (["--local", "1"], "1: collectives need 2 or more ranks"),
    (["--local", "2", "--topology", "topologies/2dc.yaml"],
     "--local N runs on loopback: it goes without --topology, --hosts and --nproc-per-host"),
    (["--local", "100000"], "100000 ranks on"),
    (["--nproc-per-host", "0"], "0: give 1 or more ranks per host"),
    (["--topology", "no/such.yaml"], "topology file no/such.yaml not found"),
])
def test_argument_errors(args: list[str], message: str, tmp_path: Path) -> None:
    r = CliRunner().invoke(main, ["bench", "collectives", *args, "--out", str(tmp_path)])
    assert r.exit_code == 2 or r.exit_code == 1, r.output
    assert message in " ".join(r.output.split()), r.output


def test_topology_needs_root(monkeypatch, tmp_path: Path) -> None:
    import testbed.emulation.network  # noqa: F401  (importable: the command gets to the root check)

    monkeypatch.setattr("os.geteuid", lambda: 1000)
    r = CliRunner().invoke(main, ["bench", "collectives", "--out", str(tmp_path)])
    assert r.exit_code == 1
    assert "needs root: run with sudo, or use --local N" in r.output


def _local(tmp_path: Path, backends: str, sizes: list[int]) -> dict:
    out = tmp_path / "out"
    r = CliRunner().invoke(main, ["bench", "collectives", "--local", "2", "--backends", backends,
                                  "--min-size", str(sizes[0]), "--max-size", str(sizes[-1]), "--iters", "1",
                                  "--json", "--out", str(out)])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout[r.stdout.index("{"):])
    got = {(x["backend"], x["collective"], x["size"]) for x in doc["results"]}
    assert got == {(b, c, s) for b in backends.split(",")
                   for c in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv")
                   for s in sizes}
    for x in doc["results"]:
        assert x["verified"] is True and x["error"] is None and x["time_s"] > 0, x
        assert x["busbw_gbit_s"] == pytest.approx(busbw_gbit_s(x["collective"], 2, x["size_bytes"], x["time_s"]))
    assert doc["mode"] == "local 2" and doc["world_size"] == 2 and not doc["failures"]
    for name in ("results.json", "results.csv", "busbw.png"):
        assert (out / name).stat().st_size > 0
    return doc


@pytest.mark.slow
def test_local_mode_end_to_end(tmp_path: Path) -> None:
    """Two ranks on loopback, gloo, every collective at 4 KiB (make test)."""
    _local(tmp_path, "gloo", [4 * KiB])


@pytest.mark.long
def test_local_mode_both_backends(tmp_path: Path) -> None:
    """gloo and atlas, two sizes each (make test-long)."""
    _local(tmp_path, "gloo,atlas", [4 * KiB, 16 * KiB])


def test_unknown_host_is_refused_before_anything_is_built(monkeypatch, tmp_path: Path) -> None:
    import testbed.emulation.network as network

    monkeypatch.setattr("os.geteuid", lambda: 0)

    def no_build(*_a, **_k):
        raise AssertionError("the emulation was built")

    monkeypatch.setattr(network.Emulation, "__init__", no_build)
    r = CliRunner().invoke(main, ["bench", "collectives", "--hosts", "dc1-h1,dc9-h1", "--out", str(tmp_path)])
    assert r.exit_code == 1, r.output
    assert "--hosts: 'dc9-h1' is not a host of the topology (hosts: dc1-h1, dc1-h2, dc2-h1, dc2-h2)" in r.output
