"""`testbed launch` on a topology split over two servers (the rig's server namespaces,
each with its own sshd; testbed/emulation/cluster/rig.py) with every node reached over
SSH: an unchanged gloo env:// program across the split, and a rank that dies ending the
other one (signalled through its server's agent); and on the same "servers" as the real
machines of an inventory (`--inventory`)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from testbed.emulation.records import ProcFS
from testbed.launch.models import read_report

pytestmark = [pytest.mark.root, pytest.mark.cluster, pytest.mark.slow, pytest.mark.long]
REPO = Path(__file__).resolve().parents[2]
TESTBED = [sys.executable, "-m", "testbed.cli"]

GLOO_PROG = r"""
import json, os, signal, sys, time
import torch
import torch.distributed as dist
dist.init_process_group("gloo")
r = dist.get_rank()
t = torch.full((1 << 18,), float(r + 1))
dist.all_reduce(t)
print(json.dumps({"sum": float(t[0]), "host": os.environ["TESTBED_HOST"], "pid": os.getpid(),
                  "ifname": os.environ["GLOO_SOCKET_IFNAME"]}), flush=True)
if os.environ.get("DIE") == str(r):
    os.kill(os.getpid(), signal.SIGKILL)
time.sleep(float(os.environ.get("SLEEP", "0")))
"""


@pytest.fixture(scope="module")
def rig():
    from testbed.emulation.cluster.rig import ServerRig

    with ServerRig(2, mtu=9000) as rig:
        yield rig


def test_launch_over_the_split(rig, tmp_path: Path):
    topo = {"name": "launch-split", "dcs": [{"name": "dc1", "hosts": 1}, {"name": "dc2", "hosts": 1}],
            "wan": [{"between": ["dc1", "dc2"], "rate": "1Gbit", "delay": "2ms"}],
            "servers": rig.servers_section({"s1": ["dc1"], "s2": ["dc2"]}, configure="ssh")
                .model_dump(mode="json", exclude_none=True)}
    (tmp_path / "split.yaml").write_text(yaml.safe_dump(topo))
    (tmp_path / "prog.py").write_text(GLOO_PROG)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    # one launch (each build over the rig takes a while): both ranks all-reduce across the split and print,
    # then rank 1 dies and rank 0 (sleeping) is ended through its server's agent
    res = subprocess.run(rig.head_argv([*TESTBED, "launch", "split.yaml", "--out", "out", "--env", "DIE=1",
                                        "--env", "SLEEP=120", "--", sys.executable, "prog.py"]),
                         cwd=tmp_path, capture_output=True, text=True, timeout=300, env=env)
    # a rank on another server reports a signal as its shell does (128 + N)
    assert res.returncode == 1 and "rank 1 (dc2/dc2-h1) exited with 137 (killed by SIGKILL)" in res.stderr, \
        res.stderr[-4000:]
    assert '[rank 1 dc2/dc2-h1] {"sum": 3.0' in res.stdout
    report = read_report(tmp_path / "out" / "launch.json")
    assert [r.metrics[0]["sum"] for r in report.ranks] == [3.0, 3.0]
    assert report.ranks[1].metrics[0]["ifname"] == f"{report.prefix}d1h1-eth0"
    assert report.wan_bytes[0].a_to_b_bytes > 1 << 20
    assert report.ranks[0].ended_by_launch and report.ranks[0].wall_s < 100  # not its 120 s sleep
    pid = report.ranks[0].metrics[0]["pid"]  # the rig's servers share this machine's PID space
    assert ProcFS().start_time(pid) is None


PLAIN_PROG = r"""
import json, os, signal, time
r = int(os.environ["RANK"])
print(json.dumps({"rank": r, "pid": os.getpid(), "host": os.environ["TESTBED_HOST"],
                  "master": os.environ["MASTER_ADDR"], "world": os.environ["WORLD_SIZE"],
                  "ifname": os.environ.get("GLOO_SOCKET_IFNAME")}), flush=True)
if os.environ.get("DIE") == str(r):
    time.sleep(0.5)
    os.kill(os.getpid(), signal.SIGKILL)
time.sleep(120)
"""


def test_launch_on_the_machines_of_an_inventory(tmp_path: Path):
    from testbed.emulation.cluster.rig import ServerRig

    topo = {"name": "launch-inv", "dcs": [{"name": "dc1", "hosts": 1}, {"name": "dc2", "hosts": 1}],
            "wan": [{"between": ["dc1", "dc2"], "rate": "1Gbit", "delay": "2ms"}]}
    (tmp_path / "t.yaml").write_text(yaml.safe_dump(topo))
    (tmp_path / "prog.py").write_text(PLAIN_PROG)
    with ServerRig(2) as rig:  # a rig of its own: the split's teardown above may have ended the other's sshd
        inv = {"ssh": {"user": "root", "identity": str(rig.identity), "known_hosts": str(rig.known_hosts)},
               "machines": [{"name": s.name, "address": s.address, "dcs": [dc]}
                            for s, dc in zip(rig.servers, ["dc1", "dc2"], strict=True)]}
        (tmp_path / "inv.yaml").write_text(yaml.safe_dump(inv))
        res = subprocess.run(rig.head_argv([*TESTBED, "launch", "t.yaml", "--inventory", "inv.yaml", "--out", "out",
                                            "--env", "DIE=1", "--", sys.executable, "prog.py"]),
                             cwd=tmp_path, capture_output=True, text=True, timeout=300,
                             env={**os.environ, "PYTHONPATH": str(REPO)})
        addresses = [s.address for s in rig.servers]
    assert res.returncode == 1, res.stderr[-4000:]
    # over the inventory's launcher a death by signal comes back as ssh's exit status (255)
    assert "launch failed: rank 1 (dc2/dc2-h1) exited with " in res.stderr, res.stderr[-4000:]
    assert report_code(tmp_path) != 0
    report = read_report(tmp_path / "out" / "launch.json")
    m0, m1 = report.ranks[0].metrics[0], report.ranks[1].metrics[0]
    assert (m0["host"], m1["host"], m0["world"]) == ("dc1-h1", "dc2-h1", "2")
    assert m0["master"] == m1["master"] == addresses[0] == report.master_addr
    assert m0["ifname"] is None and report.wan_bytes == []
    assert report.ranks[0].ended_by_launch and report.ranks[0].wall_s < 100  # not its 120 s sleep
    assert ProcFS().start_time(m0["pid"]) is None  # the rig's machines share this PID space


def report_code(tmp_path: Path) -> int | None:
    return read_report(tmp_path / "out" / "launch.json").ranks[1].exit_code
