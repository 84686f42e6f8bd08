"""What keeps a warm start from outliving its run (testbed/emulation/warmstart.py, issue
32): the fork server starts with the run's mark in its environment, which its children
inherit where `testbed clean` reads it (/proc/<pid>/environ); a child dies with the
server; the server is reported for the run's record. No root needed."""

from __future__ import annotations

import os
import signal
import sys
import textwrap
import time
from pathlib import Path

from testbed.emulation.records import ENV_RUN, ProcFS
from testbed.emulation.warmstart import claim, release, start_server, warm_start

PROGRAM = textwrap.dedent('''
    import time
    def main(argv):
        time.sleep(60)
        return 0
''')


def _eventually(check, timeout: float = 3.0) -> bool:
    """`check()` true within `timeout` (a process just started may not show its
    final environment at once on a loaded machine)."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _gone(pid: int, timeout: float = 20.0) -> bool:
    procfs = ProcFS()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if procfs.start_time(pid) is None or procfs.state(pid) == "Z":
            return True
        time.sleep(0.05)
    return False


def test_server_and_children_carry_the_mark_and_die_with_the_server(tmp_path: Path) -> None:
    (tmp_path / "warm_sleeper_mod.py").write_text(PROGRAM)
    sys.path.insert(0, str(tmp_path))
    procfs = ProcFS()
    try:
        assert claim(tmp_path, (), {ENV_RUN: "tb9f9"})
        started = dict(start_server(tmp_path))
        assert "forkserver" in started and start_server(tmp_path) == []  # once
        server = started["forkserver"]
        assert _eventually(lambda: procfs.environ_has(server, ENV_RUN, "tb9f9")), \
            f"the fork server {server} does not carry the run's mark: {procfs.cmdline(server)!r}"
        assert ENV_RUN not in os.environ or os.environ[ENV_RUN] != "tb9f9"  # put back once it started
        child = warm_start(os.getpid(), [sys.executable, "-m", "warm_sleeper_mod"], server=tmp_path,
                           env={"PATH": os.environ.get("PATH", "")})
        assert procfs.environ_has(child.pid, ENV_RUN, "tb9f9")  # what clean reads: the server's, inherited
        os.kill(server, signal.SIGKILL)  # the server gone (as with its run): the child goes too
        assert _gone(child.pid), "a warm child outlived its fork server"
    finally:
        release(tmp_path)
        sys.path.remove(str(tmp_path))


CONTROLLER = textwrap.dedent('''
    import os, sys, time
    sys.path.insert(0, sys.argv[1])
    from testbed.emulation.warmstart import claim, start_server, warm_start
    claim(sys.argv[1], (), {"TESTBED_RUN": "tb9fa"})
    server = dict(start_server(sys.argv[1]))["forkserver"]
    child = warm_start(os.getpid(), [sys.executable, "-m", "warm_sleeper_mod"], server=sys.argv[1],
                       env={"PATH": os.environ.get("PATH", "")})
    print(server, child.pid, flush=True)
    time.sleep(60)
''')


def test_a_killed_controller_takes_its_fork_server_and_children_along(tmp_path: Path) -> None:
    """The controller SIGKILLed: the server sees its pipe close and leaves at once (no
    interpreter teardown), and its children die with it."""
    import subprocess

    (tmp_path / "warm_sleeper_mod.py").write_text(PROGRAM)
    proc = subprocess.Popen([sys.executable, "-c", CONTROLLER, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        server, child = (int(x) for x in proc.stdout.readline().split())
        assert ProcFS().environ_has(child, ENV_RUN, "tb9fa")
        proc.kill()
        proc.wait()
        assert _gone(server), "the fork server outlived its controller"
        assert _gone(child), "a warm child outlived its controller"
    finally:
        proc.kill()


TWO_RUNS = textwrap.dedent('''
    import os, signal, sys, warnings
    warnings.simplefilter("error")  # "resource_tracker: process died unexpectedly" fails the run
    from testbed.emulation.warmstart import claim, release, start_server
    for i in range(2):
        folder = os.path.join(sys.argv[1], f"run{i}")
        os.makedirs(folder)
        claim(folder, (), {"TESTBED_RUN": f"tb9f{i}"})
        started = dict(start_server(folder))
        release(folder)
        for pid in started.values():  # what the run's teardown does with what its record lists
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        print(" ".join(sorted(started)), flush=True)
''')


def test_a_process_runs_again_after_its_run_without_a_dead_resource_tracker(tmp_path: Path) -> None:
    """A run's resource tracker starts with its fork server (marked as the run's, in its
    record) and `release` lets it go, so that the teardown killing what the record lists
    leaves this process no dead tracker: its next run (a sweep's next point, the demo's
    next scenario) starts its own, without multiprocessing's warning that resources may
    leak."""
    import subprocess

    res = subprocess.run([sys.executable, "-c", TWO_RUNS, str(tmp_path)], capture_output=True, text=True,
                         timeout=120, cwd=Path(__file__).resolve().parents[3])
    assert res.returncode == 0, res.stderr[-3000:]
    assert "died unexpectedly" not in res.stderr
    assert res.stdout.split("\n")[:2] == ["forkserver resource-tracker"] * 2, res.stdout
