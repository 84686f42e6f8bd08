"""testbed.launch.run on a fake site: ranks are plain local processes (no namespaces, no
root), so the streaming, metrics, failure handling, timeout and report are checked fast."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from testbed.launch.models import LaunchSpec, read_report
from testbed.launch.plan import HostSlot, LaunchError
from testbed.launch.run import _PopenRank, run_launch

PROG = r"""
import json, os, signal, sys, time
r = int(os.environ["RANK"])
print(f"hello {r} {os.environ['TESTBED_HOST']} {os.environ['GLOO_SOCKET_IFNAME']}", file=sys.stderr)
print(json.dumps({"rank": r, "world": int(os.environ["WORLD_SIZE"]), "master": os.environ["MASTER_ADDR"],
                  "port": os.environ["MASTER_PORT"], "extra": os.environ.get("EXTRA")}))
print("not json {")
print("[1, 2]")
mode = os.environ.get("MODE", "")
if mode == "die" and r == 1:
    time.sleep(0.3)
    os.kill(os.getpid(), signal.SIGKILL)
if mode == "exit3" and r == 0:
    sys.exit(3)
time.sleep(float(os.environ.get("SLEEP", "0")))
"""


class FakeSite:
    """Two hosts; a rank is a local process in its own session; WAN counters grow per call."""

    topology_name = "fake"
    topology_file = "fake.yaml"
    prefix = "tb000"
    attached = None

    def __init__(self) -> None:
        self.calls = 0
        self.started: list[subprocess.Popen] = []

    def slots(self) -> list[HostSlot]:
        return [HostSlot("dc1-h1", "dc1", "10.0.1.10", "if1"), HostSlot("dc2-h1", "dc2", "10.0.2.10", "if2")]

    def spawn(self, slot, argv, env, cwd):
        proc = subprocess.Popen(argv, env=env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, start_new_session=True)
        self.started.append(proc)
        return _PopenRank(proc, group=True)

    def wan_counters(self):
        self.calls += 1
        return [("dc1-dc2", "dc1", "dc2", 1000 * self.calls, 10 * self.calls)]


@pytest.fixture
def prog(tmp_path: Path) -> list[str]:
    path = tmp_path / "prog.py"
    path.write_text(PROG)
    return [sys.executable, str(path)]


def test_a_good_launch_reports_everything(tmp_path, prog, capsys):
    site = FakeSite()
    spec = LaunchSpec(command=prog, env={"EXTRA": "x"}, master_port=29555, cwd=str(tmp_path))
    report = run_launch(site, spec, out_dir=tmp_path / "out", echo=True)
    assert report.ok and report.failure is None and report.world_size == 2
    assert [r.exit_code for r in report.ranks] == [0, 0]
    assert report.ranks[1].metrics == [{"rank": 1, "world": 2, "master": "10.0.1.10", "port": "29555",
                                        "extra": "x"}]  # JSON objects only: not the list, not the broken line
    assert report.wan_bytes[0].a_to_b_bytes == 1000 and report.wan_bytes[0].b_to_a_bytes == 10
    out, err = capsys.readouterr()
    assert '[rank 0 dc1/dc1-h1] {"rank": 0' in out and "[rank 1 dc2/dc2-h1] not json {" in out
    assert "[rank 1 dc2/dc2-h1] hello 1 dc2-h1 if2" in err
    assert (tmp_path / "out" / "rank-1.stderr").read_text() == "hello 1 dc2-h1 if2\n"
    assert read_report(tmp_path / "out" / "launch.json") == report


def test_quiet_prints_nothing(tmp_path, prog, capsys):
    run_launch(FakeSite(), LaunchSpec(command=prog, cwd=str(tmp_path)), out_dir=tmp_path / "out", echo=False)
    assert capsys.readouterr() == ("", "")


def test_a_killed_rank_ends_the_others_quickly_and_is_named(tmp_path, prog):
    site = FakeSite()
    spec = LaunchSpec(command=prog, env={"MODE": "die", "SLEEP": "60"}, cwd=str(tmp_path))
    t0 = time.monotonic()
    report = run_launch(site, spec, out_dir=tmp_path / "out", echo=False)
    assert time.monotonic() - t0 < 30  # the other rank sleeps 60 s: it was ended
    assert not report.ok
    assert report.failure.startswith("rank 1 (dc2/dc2-h1) was killed by SIGKILL — its log: ")
    assert "rank-1.stderr" in report.failure and "ended the other ranks still running: 0" in report.failure
    assert "hello 1 dc2-h1 if2" in report.failure  # the last lines
    assert report.ranks[1].exit_code == -9 and report.ranks[0].ended_by_launch
    assert report.ranks[0].exit_code == -15
    assert all(p.poll() is not None for p in site.started)


def test_a_non_zero_exit_is_named_with_its_code(tmp_path, prog):
    report = run_launch(FakeSite(), LaunchSpec(command=prog, env={"MODE": "exit3", "SLEEP": "60"}, cwd=str(tmp_path)),
                        out_dir=tmp_path / "out", echo=False)
    assert report.failure.startswith("rank 0 (dc1/dc1-h1) exited with 3 — its log: ")


def test_timeout_names_the_ranks_still_running(tmp_path, prog):
    site = FakeSite()
    report = run_launch(site, LaunchSpec(command=prog, env={"SLEEP": "60"}, timeout_s=1.5, cwd=str(tmp_path)),
                        out_dir=tmp_path / "out", echo=False)
    assert not report.ok
    assert report.failure.startswith("timed out after 1.5 s (--timeout) with ranks still running: "
                                     "rank 0 (dc1/dc1-h1), rank 1 (dc2/dc2-h1)")
    assert "never connects" in report.failure
    assert all(p.poll() is not None for p in site.started)


def test_bad_input_raises_before_anything_starts(tmp_path, prog):
    site = FakeSite()
    with pytest.raises(LaunchError, match="not a host of the topology"):
        run_launch(site, LaunchSpec(command=prog, hosts=["dc9-h1"], cwd=str(tmp_path)), out_dir=tmp_path / "o")
    with pytest.raises(LaunchError, match="command not found"):
        run_launch(site, LaunchSpec(command=["no-such-prog-xyz"], cwd=str(tmp_path)), out_dir=tmp_path / "o")
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(LaunchError, match=r"--out .*file/out: cannot write there"):
        run_launch(site, LaunchSpec(command=prog, cwd=str(tmp_path)), out_dir=blocker / "out")
    assert site.started == []


def test_a_rank_that_cannot_start_ends_the_started_ones(tmp_path, prog):
    site = FakeSite()
    real = site.spawn

    def spawn(slot, argv, env, cwd):
        if slot.name == "dc2-h1":
            raise RuntimeError("dc2-h1: the emulation is not running")
        return real(slot, argv, [env, {**env, "SLEEP": "60"}][1], cwd)

    site.spawn = spawn
    with pytest.raises(LaunchError, match="could not start rank 1 \\(dc2/dc2-h1\\): dc2-h1: the emulation is not"):
        run_launch(site, LaunchSpec(command=prog, cwd=str(tmp_path)), out_dir=tmp_path / "o", echo=False)
    assert all(p.poll() is not None for p in site.started)
    assert not read_report(tmp_path / "o" / "launch.json").ok


def test_exit_descriptions():
    from testbed.launch.run import _describe_exit

    assert _describe_exit(1) == "exited with 1"
    assert _describe_exit(-9) == "was killed by SIGKILL"
    assert _describe_exit(137) == "exited with 137 (killed by SIGKILL)"
    assert _describe_exit(255) == "exited with 255"


def test_interruptions_are_named():
    from testbed.launch.run import _interruption

    assert _interruption(KeyboardInterrupt()) == "Ctrl-C"
    assert _interruption(SystemExit(143)) == "SIGTERM"
    assert _interruption(SystemExit("x")) == "SystemExit"
