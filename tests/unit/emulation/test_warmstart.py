"""Warm starts (testbed/emulation/warmstart.py) in this process's own namespaces (no
root needed): like Popen of ``python -m MODULE``: the exit status, output to a file or
a pipe, input from a pipe, a passed descriptor, folder, environment and session; the
fork server's preloaded modules; refusals."""

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
from testbed.emulation.warmstart import module_of, preloaded, warm_start
from testbed.run.common import RUN_PRELOAD

PROGRAM = textwrap.dedent('''
    import json, os, sys, time
    def main(argv):
        if argv[0] == "sleep":
            time.sleep(60)
        if argv[0] == "echo":  # a line in, a line out; then the passed descriptor
            print(sys.stdin.readline().strip().upper(), flush=True)
            os.write(int(os.environ["READY"]), b"ready\\n")
            return 0
        print(json.dumps({"argv": argv, "nice": os.nice(0), "cwd": os.getcwd(), "mark": os.environ.get("WARM_MARK"),
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


def env(**more: str) -> dict[str, str]:
    return {"WARM_MARK": "m1", "PATH": os.environ["PATH"], **more}


def test_a_warm_program_gets_its_argv_folder_environment_session_and_exit_status(program, tmp_path):
    log = tmp_path / "out.log"
    with open(log, "w") as fh:
        proc = warm_start(os.getpid(), ["nice", "-n", "3", sys.executable, "-m", program, "3", "x"],
                          preload=RUN_PRELOAD,
                          env=env(), cwd=str(tmp_path), stdout=fh, stderr=subprocess.STDOUT)
    assert proc.wait(60) == 3 and proc.returncode == 3 and proc.poll() == 3
    first, second = log.read_text().splitlines()[:2]
    seen = json.loads(first)
    assert seen["argv"] == ["3", "x"] and seen["cwd"] == str(tmp_path)
    assert seen["nice"] == os.nice(0) + 3
    assert seen["mark"] == "m1" and seen["home"] is None  # the environment given, whole, nothing else
    # forked from the process that imported the first start's list (the suite's first start may be another
    # test's): what it names is there at once, what it does not is not
    assert preloaded() is not None and seen["torch"] == ("torch" in preloaded())
    assert seen["pydoc_data"] is False
    assert seen["session"] is True  # its own session: the controller's Ctrl-C is not its signal
    assert second == "to stderr"
    assert proc.stdin is None and proc.stdout is None and proc.args[-2:] == ["3", "x"]


def test_pipes_and_a_passed_descriptor_work_as_with_popen(program, tmp_path):
    r, w = os.pipe()
    try:
        proc = warm_start(os.getpid(), [sys.executable, "-m", program, "echo"], preload=RUN_PRELOAD,
                          env=env(READY=str(w)), cwd=str(tmp_path), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                          stderr=subprocess.DEVNULL, text=True, pass_fds=(w,))
        proc.stdin.write("hello\n")
        proc.stdin.flush()
        assert proc.stdout.readline() == "HELLO\n"
        assert os.read(r, 100) == b"ready\n"
        assert proc.wait(60) == 0
        proc.stdin.close()
        proc.stdout.close()
    finally:
        os.close(r)
        os.close(w)


def test_wait_times_out_like_popen_and_a_killed_program_reports_the_signal(program, tmp_path):
    proc = warm_start(os.getpid(), [sys.executable, "-m", program, "sleep"], preload=RUN_PRELOAD, env=env(),
                      cwd=str(tmp_path), stdout=subprocess.DEVNULL)
    assert proc.poll() is None
    with pytest.raises(subprocess.TimeoutExpired):
        proc.wait(0.2)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == -signal.SIGTERM
    proc.kill()  # after its end: nothing happens
    assert proc.returncode == -signal.SIGTERM


def test_only_python_m_command_lines_start_warm():
    assert module_of([sys.executable, "-m", "a.b", "x"]) == (0, "a.b", ["x"])
    assert module_of(["nice", "-n", "5", sys.executable, "-m", "a", "-v"]) == (5, "a", ["-v"])
    with pytest.raises(ValueError, match=r"a warm start runs `\[nice -n N\] .* -m MODULE \.\.\.`, "
                                         r"not \['sleep', '1'\]"):
        module_of(["sleep", "1"])


def test_a_node_that_is_gone_is_named(program, tmp_path):
    dead = subprocess.Popen(["true"])
    dead.wait()
    argv = [sys.executable, "-m", program, "0"]
    with pytest.raises(EmulationError, match=rf"the node of PID {dead.pid} is not running"):
        warm_start(dead.pid, argv, preload=RUN_PRELOAD, env={}, cwd=str(tmp_path))
    with pytest.raises(EmulationError, match=rf"node of PID {dead.pid} did not enter its network namespace "
                                             r"\(exit status 1; is the node still running\?\)"):
        warm_start(dead.pid, argv, preload=RUN_PRELOAD, env={}, cwd=str(tmp_path), stderr=subprocess.DEVNULL,
                   net_inode=os.stat("/proc/self/ns/net").st_ino + 1)
