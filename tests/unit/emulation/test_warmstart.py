"""Warm starts (testbed/emulation/warmstart.py) in this process's own namespaces (no
root needed): the program's exit status, output, folder, environment and session,
the fork server's preloaded modules, and the Popen subset the runner uses."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from testbed.emulation.errors import EmulationError
from testbed.emulation.warmstart import preloaded, warm_start
from testbed.run.common import WORKER_PRELOAD

PROGRAM = textwrap.dedent('''
    import json, os, sys, time
    def main(argv):
        if argv[0] == "sleep":
            time.sleep(60)
        print(json.dumps({"argv": argv, "cwd": os.getcwd(), "mark": os.environ.get("WARM_MARK"),
                          "home": os.environ.get("HOME"), "torch": "torch" in sys.modules,
                          "pydoc_data": "pydoc_data.topics" in sys.modules,
                          "session": os.getsid(0) == os.getpid()}), flush=True)
        print("to stderr", file=sys.stderr, flush=True)
        return int(argv[0])
''')


@pytest.fixture
def program(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    (tmp_path / "warm_program_mod.py").write_text(PROGRAM)
    monkeypatch.syspath_prepend(str(tmp_path))  # the fork server's child gets this process's sys.path
    return "warm_program_mod"


def start(program: str, tmp_path: Path, *argv: str):
    log = tmp_path / "out.log"
    proc = warm_start(os.getpid(), program, list(argv), env={"WARM_MARK": "m1", "PATH": os.environ["PATH"]},
                      cwd=str(tmp_path), log=str(log), preload=WORKER_PRELOAD)
    return proc, log


def test_a_warm_program_gets_its_argv_folder_environment_session_and_exit_status(program, tmp_path):
    proc, log = start(program, tmp_path, "3", "x")
    assert proc.wait(60) == 3 and proc.returncode == 3 and proc.poll() == 3
    first, second = log.read_text().splitlines()[:2]
    seen = json.loads(first)
    assert seen["argv"] == ["3", "x"] and seen["cwd"] == str(tmp_path)
    assert seen["mark"] == "m1" and seen["home"] is None  # the environment given, whole, nothing else
    # forked from the process that imported the first start's list (the suite's first start may be another
    # test's): what it names is there at once, what it does not is not
    assert preloaded() is not None and seen["torch"] == ("torch" in preloaded())
    assert seen["pydoc_data"] is False
    assert seen["session"] is True  # its own session: the controller's Ctrl-C is not its signal
    assert second == "to stderr"
    assert proc.stdin is None and proc.stdout is None and proc.args[:2] == [sys.executable, "-m"]


def test_wait_times_out_like_popen_and_a_killed_program_reports_the_signal(program, tmp_path):
    proc, _ = start(program, tmp_path, "sleep")
    assert proc.poll() is None
    with pytest.raises(subprocess.TimeoutExpired):
        proc.wait(0.2)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == -signal.SIGTERM
    proc.kill()  # after its end: nothing happens
    assert proc.returncode == -signal.SIGTERM


def test_a_node_that_is_gone_is_named_with_the_log(program, tmp_path):
    dead = subprocess.Popen(["true"])
    dead.wait()
    with pytest.raises(EmulationError, match=rf"node of PID {dead.pid} did not enter its network namespace "
                                             r".*is the node still running\?.*out.log: .*"):
        warm_start(dead.pid, program, ["0"], env={}, cwd=str(tmp_path), log=str(tmp_path / "out.log"),
                   preload=WORKER_PRELOAD, net_inode=os.stat("/proc/self/ns/net").st_ino + 1)


def test_a_node_pid_that_does_not_exist_is_refused_before_anything_starts(program, tmp_path):
    dead = subprocess.Popen(["true"])
    dead.wait()
    with pytest.raises(EmulationError, match=rf"the node of PID {dead.pid} is not running"):
        warm_start(dead.pid, program, ["0"], env={}, cwd=str(tmp_path), log=str(tmp_path / "o.log"),
                   preload=WORKER_PRELOAD)
    assert not (tmp_path / "o.log").exists()
