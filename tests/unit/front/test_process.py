"""Starting a process and knowing it is ready (testbed.process with
testbed_runtime.readiness), on real child processes: ready, exited early (with its code or
signal, its log quoted), still not ready at the timeout, a garbled line, and started
through a Mininet node's popen (mnexec in front of the command)."""

from __future__ import annotations

import functools
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from mininet.node import Node

from testbed.process import ProcessError, start

READY = textwrap.dedent("""
    import os, sys, time
    from testbed_runtime.readiness import announce_ready
    print("loading the model", flush=True)
    announce_ready(port=4242, pid=os.getpid())
    print("serving", flush=True)
    time.sleep(float(sys.argv[1]) if len(sys.argv) > 1 else 60)
""")


def _python(script: str, *args: str) -> list[str]:
    return [sys.executable, "-c", script, *args]


def _open_fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


def test_ready_child_returns_its_info(tmp_path: Path, child_env: dict[str, str]) -> None:
    before = _open_fds()
    log = tmp_path / "worker.log"
    proc = start(_python(READY), env=child_env, log_path=log, name="worker p0r1")
    try:
        info = proc.wait_ready(20)
        assert info == {"port": 4242, "pid": proc.pid}
        assert proc.wait_ready(0) is info  # asked again: the same answer
        assert proc.poll() is None
        assert _open_fds() == before  # the pipe's read end is released, the log is the child's
    finally:
        assert proc.stop(grace_s=5) == -signal.SIGTERM
    assert "loading the model" in log.read_text()


def test_a_child_that_exits_early_is_named_with_its_code_and_log(tmp_path: Path,
                                                                    child_env: dict[str, str]) -> None:
    script = "import sys; print('reading jobs/p0r1.json'); sys.exit('boom: no field \"rank\"')"
    proc = start(_python(script), env=child_env, log_path=tmp_path / "p0r1.log", name="worker p0r1")
    t0 = time.monotonic()
    with pytest.raises(ProcessError) as info:
        proc.wait_ready(30)
    assert time.monotonic() - t0 < 10  # the pipe's end of file, not the timeout
    err = info.value
    msg = str(err)
    assert msg.startswith(f"worker p0r1 (pid {proc.pid}) exited with code 1 before it was ready")
    assert f"last lines of {tmp_path / 'p0r1.log'}:" in msg
    assert "  | reading jobs/p0r1.json" in msg and '  | boom: no field "rank"' in msg
    assert (err.name, err.returncode, err.timed_out) == ("worker p0r1", 1, False)
    assert 'boom: no field "rank"' in err.log_tail
    with pytest.raises(ProcessError) as again:  # asked again: the same failure
        proc.wait_ready(1)
    assert again.value is err


def test_a_child_killed_by_a_signal_says_which(tmp_path: Path, child_env: dict[str, str]) -> None:
    script = "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"
    proc = start(_python(script), env=child_env, log_path=tmp_path / "agent.log")
    with pytest.raises(ProcessError, match=r"exited on signal SIGKILL before it was ready; its log .* is empty"):
        proc.wait_ready(30)


def test_a_slow_child_times_out_and_is_left_running(tmp_path: Path, child_env: dict[str, str]) -> None:
    script = "import time; print('still loading weights', flush=True); time.sleep(60)"
    proc = start(_python(script), env=child_env, log_path=tmp_path / "slow.log", name="bubbletea dc1-h2")
    try:
        deadline = time.monotonic() + 20
        while "still loading" not in (tmp_path / "slow.log").read_text() and time.monotonic() < deadline:
            time.sleep(0.05)
        t0 = time.monotonic()
        with pytest.raises(ProcessError) as info:
            proc.wait_ready(0.5)
        assert 0.5 <= time.monotonic() - t0 < 5
        msg = str(info.value)
        assert "bubbletea dc1-h2 (pid" in msg and "was not ready within 0.5 s and is still running" in msg
        assert "raise the timeout" in msg and "  | still loading weights" in msg
        assert info.value.timed_out and info.value.returncode is None
        assert proc.poll() is None
    finally:
        assert proc.stop(grace_s=5) == -signal.SIGTERM


def test_a_line_that_is_not_json_is_reported(tmp_path: Path, child_env: dict[str, str]) -> None:
    script = "import os, time; os.write(int(os.environ['TESTBED_READY_FD']), b'ready!\\n'); time.sleep(60)"
    proc = start(_python(script), env=child_env, log_path=tmp_path / "x.log", name="odd")
    try:
        with pytest.raises(ProcessError, match=r"odd \(pid \d+\) announced readiness with a line that is not "
                                               r"a JSON object: b'ready!'"):
            proc.wait_ready(20)
    finally:
        proc.stop()


def test_ready_then_exit_still_counts(child_env: dict[str, str]) -> None:
    """A quick job announces and ends before the parent reads: the line is in the pipe."""
    proc = start(_python(READY, "0"), env=child_env, stdout=subprocess.DEVNULL)
    proc.popen.wait(20)
    assert proc.wait_ready(5)["port"] == 4242


def test_start_failures_and_names(tmp_path: Path) -> None:
    before = _open_fds()
    with pytest.raises(ProcessError, match=r"could not start no-such-program \(/nonexistent/no-such-program\)"):
        start(["/nonexistent/no-such-program"], log_path=tmp_path / "x.log")
    assert _open_fds() == before  # neither pipe end nor the log leaked
    with pytest.raises(ValueError, match="argv is empty"):
        start([])
    with pytest.raises(ValueError, match="pass log_path or stdout/stderr, not both"):
        start(["true"], log_path=tmp_path / "x.log", stdout=None)
    proc = start([sys.executable, "-m", "json.tool", "--help"], stdout=subprocess.DEVNULL)
    assert proc.name == "json.tool"
    proc.stop()


class _Node:
    """A Mininet node without a namespace: mininet's own Node.popen, with `mncmd`
    replaced by a command that execs the rest of the line as mnexec -da <pid> does."""

    pid = os.getpid()
    popen = Node.popen
    _popen = Node._popen


_EXEC = [sys.executable, "-c", "import os, sys; os.execvp(sys.argv[1], sys.argv[1:])"]
_MNEXEC = shutil.which("mnexec")


@pytest.mark.parametrize("mncmd", [_EXEC, pytest.param(
    ["mnexec", "-d"], marks=pytest.mark.skipif(_MNEXEC is None, reason="mnexec is not installed (Debian: mininet)"))],
    ids=["exec", "mnexec"])
def test_through_a_mininet_node_popen(tmp_path: Path, child_env: dict[str, str], mncmd: list[str]) -> None:
    node = _Node()
    log = tmp_path / "h1.log"
    proc = start(_python(READY), popen=functools.partial(node.popen, mncmd=mncmd), env=child_env,
                 log_path=log, name="dc1-h1 worker")
    try:
        info = proc.wait_ready(20)
        assert info == {"port": 4242, "pid": proc.pid}  # mnexec execs: the same pid
    finally:
        proc.stop()
    assert "loading the model" in log.read_text()  # not Mininet's default stdout=PIPE
    quiet = start(_python("import sys; sys.exit(4)"), popen=functools.partial(node.popen, mncmd=mncmd),
                  env=child_env, log_path=tmp_path / "q.log", name="dc1-h1 agent")
    with pytest.raises(ProcessError, match=r"dc1-h1 agent \(pid \d+\) exited with code 4 before it was ready"):
        quiet.wait_ready(20)
