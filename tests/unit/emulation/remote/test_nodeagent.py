"""The node agent's command line (testbed/emulation/remote/nodeagent.py), run as a
process: what it refuses and what it says when nothing matches. No root needed."""

from __future__ import annotations

import subprocess
import sys

from testbed_core.constants import REPO_ROOT


def _agent(*args: str, stdin: str = "") -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "testbed.emulation.remote.nodeagent", *args], input=stdin,
                          capture_output=True, text=True, timeout=60, cwd=REPO_ROOT)


def test_agent_clean_refuses_what_is_not_the_runs() -> None:
    res = _agent("clean", "--run", "../etc")
    assert res.returncode == 2 and "'../etc' is not a run prefix" in res.stderr
    res = _agent("clean", "--run", "tb0f0", "--path", "/etc/passwd")
    assert res.returncode == 1 and "/etc/passwd: not a path of run tb0f0; left alone" in res.stderr


def test_agent_exec_wants_a_program_and_the_environment_line() -> None:
    res = _agent("exec", "--pid", "1", "--run", "tb0f0", "--token", "t")
    assert res.returncode == 2 and "the program to start follows --" in res.stderr
    res = _agent("exec", "--pid", "1", "--run", "tb0f0", "--token", "t", "--", "true", stdin="")
    assert res.returncode == 1 and "no environment on stdin" in res.stderr


def test_agent_signal_says_when_no_program_carries_the_token() -> None:
    res = _agent("signal", "--token", "no-such-token-0123", "--sig", "15")
    assert res.returncode == 3 and res.stdout.strip() == "signalled 0"
