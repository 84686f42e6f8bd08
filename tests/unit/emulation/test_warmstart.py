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
from testbed.emulation.warmstart import claim, module_of, preloaded, release, warm_start
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


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    """One fork server for this module's tests (a run's, in real use), its program on sys.path."""
    folder = tmp_path_factory.mktemp("warm")
    (folder / "warm_program_mod.py").write_text(PROGRAM)
    sys.path.insert(0, str(folder))  # the fork server's children get this process's sys.path at each start
    assert claim(folder, RUN_PRELOAD) and claim(folder, ("ignored",)) and preloaded() == RUN_PRELOAD
    assert not claim(folder / "another-run", RUN_PRELOAD)  # one run of a process has it at a time
    try:
        yield folder
    finally:
        release(folder)
        sys.path.remove(str(folder))
    assert preloaded() is None and not any(p.name.startswith("listener-") for p in folder.iterdir())


@pytest.fixture
def program(server: Path) -> str:
    return "warm_program_mod"


def env(**more: str) -> dict[str, str]:
    return {"WARM_MARK": "m1", "PATH": os.environ["PATH"], **more}


def test_a_warm_program_gets_its_argv_folder_environment_session_and_exit_status(program, server, tmp_path):
    log = tmp_path / "out.log"
    with open(log, "w") as fh:
        proc = warm_start(os.getpid(), ["nice", "-n", "3", sys.executable, "-m", program, "3", "x"],
                          server=server,
                          env=env(), cwd=str(tmp_path), stdout=fh, stderr=subprocess.STDOUT)
    assert proc.wait(60) == 3 and proc.returncode == 3 and proc.poll() == 3
    first, second = log.read_text().splitlines()[:2]
    seen = json.loads(first)
    assert seen["argv"] == ["3", "x"] and seen["cwd"] == str(tmp_path)
    assert seen["nice"] == os.nice(0) + 3
    assert seen["mark"] == "m1" and seen["home"] is None  # the environment given, whole, nothing else
    assert seen["torch"] is True and seen["pydoc_data"] is False  # the run's list was imported once, nothing else
    assert seen["session"] is True  # its own session: the controller's Ctrl-C is not its signal
    assert second == "to stderr"
    assert proc.stdin is None and proc.stdout is None and proc.args[-2:] == ["3", "x"]


def test_pipes_and_a_passed_descriptor_work_as_with_popen(program, server, tmp_path):
    r, w = os.pipe()
    try:
        proc = warm_start(os.getpid(), [sys.executable, "-m", program, "echo"], server=server,
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


def test_wait_times_out_like_popen_and_a_killed_program_reports_the_signal(program, server, tmp_path):
    proc = warm_start(os.getpid(), [sys.executable, "-m", program, "sleep"], server=server, env=env(),
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


def test_a_node_that_is_gone_is_named(program, server, tmp_path):
    dead = subprocess.Popen(["true"])
    dead.wait()
    argv = [sys.executable, "-m", program, "0"]
    with pytest.raises(EmulationError, match=rf"the node of PID {dead.pid} is not running"):
        warm_start(dead.pid, argv, server=server, env={}, cwd=str(tmp_path))
    with pytest.raises(EmulationError, match=rf"node of PID {dead.pid} did not enter its network namespace "
                                             r"\(exit status 1; is the node still running\?\)"):
        warm_start(dead.pid, argv, server=server, env={}, cwd=str(tmp_path), stderr=subprocess.DEVNULL,
                   net_inode=os.stat("/proc/self/ns/net").st_ino + 1)


def test_a_start_through_a_server_this_run_does_not_own_is_refused(program, server, tmp_path):
    with pytest.raises(EmulationError, match=r"warm start of warm_program_mod: the fork server of this process "
                                             r"belongs to another run .*claim\(.*\) first, or start it cold"):
        warm_start(os.getpid(), [sys.executable, "-m", program, "0"], server=tmp_path, env={}, cwd=str(tmp_path))
