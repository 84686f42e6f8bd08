"""`testbed launch` and `testbed topo up --detach|down|list` without root: every refusal of
bad input, before anything is built, with its message."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from testbed.cli import main
from testbed.launch.detach import find_detached, list_detached, validate_name
from testbed.launch.models import DetachedState
from testbed.launch.plan import LaunchError

ROOT = Path(__file__).resolve().parents[3]
TOPO = str(ROOT / "topologies" / "2dc.yaml")
PY = ["--", "sh", "-c", "true"]


@pytest.fixture
def runner() -> CliRunner:
    return CliRunner()


def _fails(runner, args, *needles):
    result = runner.invoke(main, ["launch", *args])
    assert result.exit_code != 0, result.output
    for needle in needles:
        assert needle in result.output, result.output
    return result.output


def test_help_explains_the_environment(runner):
    result = runner.invoke(main, ["launch", "--help"])
    assert result.exit_code == 0
    for word in ("--nproc-per-host", "--hosts", "--env", "--attach", "--timeout", "MASTER_ADDR",
                 "GLOO_SOCKET_IFNAME", "launch.json"):
        assert word in result.output


def test_refusals(runner, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the default --out is results/launch-<time>/ under the working folder
    _fails(runner, [TOPO], "no command to launch: put it after `--`")
    _fails(runner, [], "give the TOPOLOGY file and the command after `--`")
    _fails(runner, [TOPO, "--", "no-such-prog-xyz"], "command not found: no-such-prog-xyz")
    _fails(runner, [TOPO, "python", "-u", "x.py"], "No such option '-u': the program's own options go after `--`")
    _fails(runner, [TOPO, "--env", "BACKEND", *PY], "--env 'BACKEND': give KEY=VALUE")
    _fails(runner, [TOPO, "--env", "=gloo", *PY], "the KEY before '=' is empty")
    _fails(runner, [TOPO, "--hosts", "dc1-h1,dc3-h1", *PY],
           "'dc3-h1' is not a host of the topology (hosts: dc1-h1, dc1-h2, dc2-h1, dc2-h2)")
    _fails(runner, [TOPO, "--hosts", "dc1-h1,dc1-h1", *PY], "dc1-h1 is named twice")
    _fails(runner, [TOPO, "--nproc-per-host", "0", *PY], "--nproc-per-host 0: give 1 or more")
    _fails(runner, [TOPO, "--nproc-per-host", "100000", *PY], "more than this machine can hold: at most")
    _fails(runner, ["--attach", "no-such-topo-xyz", *PY], "no detached topology named 'no-such-topo-xyz' is up")
    _fails(runner, ["--attach", "Bad_Name", *PY], "detached topology name 'Bad_Name'")
    _fails(runner, ["--attach", "dev", TOPO, "sh"], f"drop {TOPO}")
    _fails(runner, [TOPO, "--inventory", str(tmp_path / "inv.yaml"), *PY], "inv.yaml")
    _fails(runner, ["--attach", "dev", "--inventory", "inv.yaml", *PY], "--inventory runs on real machines")
    _fails(runner, [str(tmp_path / "missing.yaml"), *PY], "missing.yaml")
    blocker = tmp_path / "file"
    blocker.write_text("")
    _fails(runner, [TOPO, "--out", str(blocker / "out"), *PY], "cannot write there")
    assert not (tmp_path / "results").exists(), "a refused launch left its (empty) output folder"


def test_topo_name_needs_detach_and_down_of_unknown(runner):
    result = runner.invoke(main, ["topo", "up", TOPO, "--name", "dev"])
    assert result.exit_code != 0 and "--name names a topology kept up with --detach" in result.output
    result = runner.invoke(main, ["topo", "down", "no-such-topo-xyz"])
    assert result.exit_code != 0 and "no detached topology named 'no-such-topo-xyz' is up" in result.output
    result = runner.invoke(main, ["topo", "list"])
    assert result.exit_code == 0


def _state(name: str, pid: int, start: int) -> DetachedState:
    return DetachedState(name=name, topology="2dc", topology_file=TOPO, prefix="tb123", daemon_pid=pid,
                         daemon_start=start, socket="/nonexistent/launch.sock", log="/tmp/x", delay_backend="relay",
                         built=0.0, hosts=[], wans=[])


def test_state_files_live_and_gone(tmp_path):
    from testbed.emulation.records import ProcFS

    me = os.getpid()
    (tmp_path / "tb123-up.json").write_text(_state("up", me, ProcFS().start_time(me) or 0).model_dump_json())
    (tmp_path / "tb124-gone.json").write_text(_state("gone", me, 1).model_dump_json())  # another start time
    (tmp_path / "junk.json").write_text("{")
    assert sorted((s.name, alive) for s, alive in list_detached(tmp_path)) == [("gone", False), ("up", True)]
    assert find_detached("up", tmp_path).name == "up"
    with pytest.raises(LaunchError, match=r"'gone' is not up: its daemon .* is gone; `testbed clean` removes "
                                          r"what it left \(up now: up\)"):
        find_detached("gone", tmp_path)
    with pytest.raises(LaunchError, match=r"no detached topology named 'x' is up \(up now: up\); start one with"):
        find_detached("x", tmp_path)
    assert validate_name("dev-1") == "dev-1"
    with pytest.raises(LaunchError, match="lowercase letters"):
        validate_name("-x")
