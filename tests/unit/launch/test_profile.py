"""`testbed launch --profile` without root: the environment it gives the ranks, the
recorder's wrappers on a real one-rank gloo group, the profile built from the ranks'
records, and the refusals of the CLI."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from click.testing import CliRunner

import testbed.launch.profile_record as rec_mod
from testbed.cli import main
from testbed.launch.models import LaunchReport, LinkBytes, RankReport
from testbed.launch.profile import (
    BOOT_DIR,
    DIR_ENV,
    RECORDS_DIR,
    build_profile,
    prepare,
    profile_env,
)
from testbed_core.topology import load_topology

ROOT = Path(__file__).resolve().parents[3]
TOPO = ROOT / "topologies" / "2dc.yaml"


def test_profile_env_puts_the_boot_folder_first(tmp_path):
    env = profile_env(tmp_path, "/elsewhere")
    assert env["PYTHONPATH"].split(os.pathsep) == [str(BOOT_DIR), "/elsewhere"]
    assert env[DIR_ENV] == str((tmp_path / RECORDS_DIR).resolve())
    assert (BOOT_DIR / "sitecustomize.py").is_file()
    assert profile_env(tmp_path, None)["PYTHONPATH"] == str(BOOT_DIR)


@pytest.fixture
def world(tmp_path):
    """A one-rank gloo group and a recorder writing to tmp_path."""
    store = dist.HashStore()
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    recorder = rec_mod.Recorder(str(tmp_path), "0")
    saved, rec_mod._REC = rec_mod._REC, recorder
    try:
        yield recorder
    finally:
        rec_mod._REC = saved
        recorder.close()
        dist.destroy_process_group()


def _lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]


def test_recorder_wraps_collectives_blocking_and_async(world):
    c10d = dist.distributed_c10d
    all_reduce = rec_mod._collective_wrapper(c10d, "all_reduce", c10d.all_reduce)
    t = torch.ones(1000)
    all_reduce(t)  # blocking
    work = all_reduce(t, async_op=True)
    assert work.wait()
    world.close()
    lines = _lines(Path(world.path))
    ops = [x for x in lines if x["ev"] == "op"]
    assert [(o["op"], o["bytes"], o["blocking"]) for o in ops] == [("all_reduce", 4000, True),
                                                                    ("all_reduce", 4000, False)]
    groups = [x for x in lines if x["ev"] == "group"]
    assert groups == [{"ev": "group", "group": 0, "ranks": [0], "backend": "gloo", "streams": None}]
    waits = [x["id"] for x in lines if x["ev"] == "wait"]
    assert waits == [ops[0]["id"], ops[1]["id"]]  # the blocking call's own wait, then work.wait()
    assert any(x["ev"] == "done" and x["id"] == ops[1]["id"] for x in lines)  # the future's callback


def test_recorder_leaves_an_unprofiled_process_alone(world):
    c10d = dist.distributed_c10d
    all_reduce = rec_mod._collective_wrapper(c10d, "all_reduce", c10d.all_reduce)
    rec_mod._REC = None
    all_reduce(torch.ones(4))
    world.close()
    assert [x["ev"] for x in _lines(Path(world.path))] == ["start", "end"]


def test_install_needs_the_variable(monkeypatch):
    monkeypatch.delenv(DIR_ENV, raising=False)
    saved, rec_mod._REC = rec_mod._REC, None
    try:
        assert rec_mod.install() is False
    finally:
        rec_mod._REC = saved


def _report(tmp_path: Path) -> LaunchReport:
    ranks = [RankReport(rank=k, local_rank=0, host=f"dc{k + 1}-h1", dc=f"dc{k + 1}", ip=f"10.0.0.{k}", exit_code=0,
                        wall_s=5.0, stdout="", stderr="",
                        metrics=[{"step": 0, "step_s": 0.5, "rank": k}, {"final": True}, {"step": 1, "step_s": 0.4}])
             for k in (0, 1)]
    return LaunchReport(command=[sys.executable, str(TOPO)], topology="2dc", topology_file=str(TOPO), started=1000.0,
                        finished=1005.0, wall_s=5.0, ok=True, world_size=2, nproc_per_host=1, master_addr="10.0.0.0",
                        master_port=29500, ranks=ranks,
                        wan_bytes=[LinkBytes(link="dc1-dc2", a="dc1", b="dc2", a_to_b_bytes=4096, b_to_a_bytes=100)])


def _write_records(records: Path) -> None:
    lines0 = [{"ev": "start", "format": 1, "t": 1000.5, "pid": 1, "argv": [], "rank": 0},
              {"ev": "group", "group": 0, "ranks": [0, 1], "backend": "gloo", "streams": None},
              {"ev": "op", "id": 1, "kind": "send", "op": "isend", "bytes": 4096, "peer": 1, "group": 0, "tag": 0,
               "blocking": False, "t": 1001.0, "t_end": 1001.01},
              {"ev": "wait", "id": 1, "t0": 1001.2, "t1": 1001.3, "c1": 2.0},
              {"ev": "op", "id": 2, "kind": "send", "op": "send", "bytes": 8, "peer": 1, "group": 0, "tag": 0,
               "blocking": True, "t": 1001.7, "t_end": 1001.8, "c": 2.1},
              {"ev": "end", "t": 1004.0}]
    lines1 = [{"ev": "start", "format": 1, "t": 1000.6, "pid": 2, "argv": [], "rank": 1},
              {"ev": "group", "group": 0, "ranks": [0, 1], "backend": "gloo", "streams": None},
              {"ev": "op", "id": 1, "kind": "recv", "op": "irecv", "bytes": 4096, "peer": 0, "group": 0, "tag": 0,
               "blocking": False, "t": 1001.0, "t_end": 1001.0},
              {"ev": "wait", "id": 1, "t0": 1001.0, "t1": 1001.4}, '{"ev": "op", "id": 2, "kin']  # cut short
    (records / "rank-0.jsonl").write_text("\n".join(json.dumps(x) for x in lines0) + "\n")
    (records / "rank-1.jsonl").write_text("\n".join(x if isinstance(x, str) else json.dumps(x) for x in lines1))


def test_build_profile_from_the_ranks_records(tmp_path):
    records = prepare(tmp_path)
    _write_records(records)
    report = _report(tmp_path)
    times = {0: [1001.5, 1002.0, 1002.5], 1: [1001.6, 1002.1, 1002.6]}
    profile = build_profile(report, load_topology(TOPO), tmp_path, str(ROOT), times)
    r0, r1 = profile.ranks
    assert [(s.step, s.step_s, s.t_line) for s in r0.steps] == [(0, 0.5, 1.5), (1, 0.4, 2.5)]
    assert r0.ops[0].kind == "send" and r0.ops[0].waits == [(pytest.approx(1.2), pytest.approx(1.3))]
    assert len(r1.ops) == 1  # the line cut short is skipped
    assert r0.t_start == pytest.approx(0.5) and r0.t_end == pytest.approx(4.0)
    assert profile.recorded_wan_bytes == 4096 + 8 and profile.wan_bytes == 4196
    assert r0.compute_wall_s == pytest.approx(0.4) and r0.compute_cpu_s == pytest.approx(0.1)  # a busy machine
    assert r1.compute_wall_s is None
    assert profile.program.files[0].path == str(TOPO)  # every existing file argument is hashed


def test_the_program_modules_it_imported_from_its_folder(tmp_path):
    """The recorder lists the modules imported from the script's folder (not installed
    ones, not the script itself); the profile keeps them relative to the ranks' folder."""
    (tmp_path / "prog.py").write_text("pass\n")
    (tmp_path / "helper_for_profile_test.py").write_text("X = 1\n")
    sys.path.insert(0, str(tmp_path))
    try:
        import helper_for_profile_test  # noqa: F401
        mods = rec_mod.program_modules(str(tmp_path / "prog.py"))
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("helper_for_profile_test", None)
    assert [Path(m["path"]).name for m in mods] == ["helper_for_profile_test.py"]
    assert rec_mod.program_modules(str(tmp_path / "absent.py")) == []
    records = prepare(tmp_path)
    _write_records(records)
    with open(records / "rank-0.jsonl", "a") as fh:
        fh.write(json.dumps({"ev": "modules", "files": mods}) + "\n")
    profile = build_profile(_report(tmp_path), load_topology(TOPO), tmp_path, str(tmp_path), {})
    assert [(m.path, m.sha256) for m in profile.program.modules] == [("helper_for_profile_test.py", mods[0]["sha256"])]


def test_a_rank_without_records_is_noted(tmp_path):
    prepare(tmp_path)
    profile = build_profile(_report(tmp_path), load_topology(TOPO), tmp_path, str(ROOT), {})
    assert "no records" in profile.ranks[0].notes[0] and profile.ranks[0].steps == []


def test_launch_profile_refuses_real_machines():
    result = CliRunner().invoke(main, ["launch", str(TOPO), "--profile", "--inventory", "inv.yaml", "--",
                                       sys.executable, "-c", "pass"])
    assert result.exit_code != 0
    assert "--profile times every rank on one clock" in result.output


CHILD = """
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
assert hasattr(dist.all_reduce, "__wrapped__") and hasattr(dist.isend, "__wrapped__")  # patched before re-export
dist.init_process_group("gloo", rank=0, world_size=1)
model = DDP(torch.nn.Linear(4, 4))
model(torch.ones(2, 4)).sum().backward()
t = torch.ones(3)
dist.all_reduce(t)
dist.destroy_process_group()
print("ok")
"""


def test_the_boot_folder_records_an_unchanged_program(tmp_path):
    """A real interpreter with the launch's PYTHONPATH: torch.distributed comes patched,
    and DDP's gradient all-reduce is recorded (marked ddp) beside the program's own."""
    import socket
    import subprocess

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, **profile_env(tmp_path, None), "RANK": "0", "WORLD_SIZE": "1",
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]
    lines = _lines(tmp_path / RECORDS_DIR / "rank-0.jsonl")
    ops = [(x["op"], x["bytes"], x.get("ddp", False), x["blocking"]) for x in lines if x["ev"] == "op"]
    assert ops == [("all_reduce", 4 * 20, True, False), ("all_reduce", 12, False, True)]
    assert lines[0]["ev"] == "start" and lines[-1]["ev"] == "end"
