"""How a process starts on a real machine (testbed/run/inventory.py), with `sh -c`
standing in for ssh: the environment arrives on stdin and never on the command line,
the repository path and interpreter are the machine's, the process announces
readiness through the launcher's relay, stdin stays the caller's, and a signal
reaches the process itself, found by its pid file."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from testbed.process import start
from testbed.run.inventory import InventoryHost, InventoryNetwork, Remote
from testbed_core.inventory import Inventory

CHILD = """
import os, sys, time
from testbed_runtime.readiness import announce_ready
print("secret=" + os.environ.get("ATLAS_SECRET", "-"), "cwd=" + os.getcwd(), flush=True)
print("to stderr", file=sys.stderr, flush=True)
announce_ready(pid=os.getpid(), line=sys.stdin.readline().strip() if len(sys.argv) > 1 else "")
time.sleep(60)
"""


class ShRemote(Remote):
    def ssh(self, *extra: str) -> list[str]:  # the machine is this one, reached through sh -c
        return ["sh", "-c"]


def _host(tmp_path: Path) -> InventoryHost:
    inv = Inventory.model_validate({"machines": [{"name": "m1", "address": "192.0.2.1", "dcs": ["dc1"]}]})
    folder = tmp_path / "machine"
    folder.mkdir()
    remote = ShRemote(inv, inv.machines[0], str(folder), repo=str(tmp_path), python=sys.executable)
    net = InventoryNetwork(inv, None, {"m1": remote}, {"dc1-h1": inv.machines[0]})
    return net.host("dc1-h1")


def test_a_process_starts_announces_readiness_and_is_signalled_on_the_machine(tmp_path):
    host = _host(tmp_path)
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    env = dict(os.environ, ATLAS_SECRET="s3cret", PYTHONPATH=str(Path(__file__).resolve().parents[3]))
    log = tmp_path / "child.log"
    proc = start([sys.executable, str(script)], popen=host.popen, env=env, log_path=log, name="child")
    try:
        info = proc.wait_ready(timeout=60)
        ssh_argv = proc.popen.args
        assert "s3cret" not in " ".join(ssh_argv)  # the secret came on stdin
        pid = int((tmp_path / "machine" / "p0.pid").read_text())
        assert pid == info["pid"] and pid != proc.popen.pid  # the process itself, not the ssh
        proc.popen.send_signal(signal.SIGTERM)
        proc.popen.wait(timeout=30)
        time.sleep(0.2)
        assert subprocess.run(["kill", "-0", str(pid)], capture_output=True).returncode != 0
    finally:
        if proc.popen.poll() is None:
            proc.popen.kill()
    text = log.read_text()
    assert "secret=s3cret" in text and f"cwd={tmp_path}" in text and "to stderr" in text
    assert "testbed-ready" not in text  # the readiness line went to the runner, not the log


def test_stdin_stays_the_callers_after_the_environment(tmp_path):
    host = _host(tmp_path)
    code = "import sys; print('got', sys.stdin.readline().strip(), flush=True)"
    proc = host.popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    out, _ = proc.communicate("job /x.json\n", timeout=60)
    assert out.strip() == "got job /x.json" and proc.returncode == 0
