"""A program started in a node on a server reached over SSH (testbed/emulation/cluster/
remote.py, ``nodeagent exec``) behaves as one started on this machine: its environment
arrives (and is on no command line), `terminate()` signals the program itself so it can
still write its last output, its readiness line comes back through the caller's pipe,
and it ends when its ssh client is killed. Run against a rig server (its own sshd), from
the rig's head namespace; the node is the server's own namespace."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from testbed_core.constants import REPO_ROOT

pytestmark = [pytest.mark.root, pytest.mark.cluster]

CHILD = r"""
import json, os, signal, subprocess, sys, time
from testbed.emulation.remote.client import RemoteProcess
from testbed.emulation.remote.sshlogin import RemoteLogin
from testbed.process import start

login = RemoteLogin(**json.loads(sys.argv[1]))
pid, out = int(sys.argv[2]), {}
prog = ("import os, signal, sys, time\n"
        "signal.signal(signal.SIGTERM, lambda *a: (print('last words', flush=True), sys.exit(7)))\n"
        "print(os.environ.get('ATLAS_SECRET'), os.environ.get('TESTBED_RUN'), flush=True)\n"
        "time.sleep(120)\n")
p = RemoteProcess(login, None, pid, "tb0c1", [sys.executable, "-c", prog], {"ATLAS_SECRET": "s3cr3t-x"}, None,
                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
out["env_line"] = p.stdout.readline().strip()
ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
out["secret_on_a_command_line"] = "s3cr3t-x" in ps
p.terminate()
rest, _ = p.communicate(timeout=30)
out["after_term"], out["code"] = rest.strip(), p.returncode

ready = ("from testbed_runtime.readiness import announce_ready\nimport time\n"
         "announce_ready(port=4242)\ntime.sleep(120)\n")
def popen(argv, env=None, **kw):
    extra = {k: v for k, v in env.items() if os.environ.get(k) != v}
    return RemoteProcess(login, None, pid, "tb0c1", argv, extra, None, **kw)
proc = start([sys.executable, "-c", ready], name="ready-probe", popen=popen,
             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
out["ready"] = proc.wait_ready(timeout=30)
proc.popen.kill()
proc.popen.wait(timeout=30)

import tempfile
control = tempfile.mkdtemp(prefix="tb0c1-ctl-")
for how, control_dir in (("own", None), ("shared", control)):  # its own connection; the emulation's shared one
    marker = f"tb0c1-orphan-{how}"  # this script's own command line must not match
    q = RemoteProcess(login, control_dir, pid, "tb0c1", ["bash", "-c", f"exec -a {marker} sleep 120"], {}, None,
                      stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    time.sleep(1.5)
    out[f"running_before_{how}"] = subprocess.run(["pgrep", "-f", marker], capture_output=True).returncode == 0
    os.kill(q.pid, signal.SIGKILL)  # the local ssh client only
    q.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and subprocess.run(["pgrep", "-f", marker], capture_output=True).returncode == 0:
        time.sleep(0.1)
    out[f"running_after_{how}"] = subprocess.run(["pgrep", "-f", marker], capture_output=True).returncode == 0
subprocess.run(["ssh", "-o", f"ControlPath={control}/%C", "-O", "exit", f"root@{login.address}"], capture_output=True)
import shutil
shutil.rmtree(control, ignore_errors=True)
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def rig():
    from testbed.emulation.cluster.rig import ServerRig

    with ServerRig(1) as rig:
        yield rig


def test_a_remote_program_gets_its_environment_signals_readiness_and_no_orphan(rig):
    from testbed.emulation.remote.sshlogin import RemoteLogin

    server = rig.servers[0]
    login = RemoteLogin(server=server.name, address=server.address, identity=str(rig.identity),
                        known_hosts=str(rig.known_hosts), python=sys.executable)
    res = subprocess.run(rig.head_argv([sys.executable, "-c", CHILD, login.model_dump_json(), str(server.pid)]),
                         cwd=REPO_ROOT, capture_output=True, text=True, timeout=180, check=False)
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(res.stdout.splitlines()[-1])
    assert out["env_line"] == "s3cr3t-x tb0c1"
    assert out["secret_on_a_command_line"] is False
    assert out["after_term"] == "last words" and out["code"] == 7
    assert out["ready"] == {"port": 4242}
    for how in ("own", "shared"):  # the ssh client killed: the program on the server ends too
        assert out[f"running_before_{how}"] is True and out[f"running_after_{how}"] is False, how


FORWARD = r"""
import json, os, socket, subprocess, sys, tempfile, threading, time
from pathlib import Path
from testbed.emulation.cluster.build import CONTROL_MAP_ENV, ClusterBuild
from testbed.emulation.errors import EmulationError
from testbed_core.servers import ServerPlan

plan = ServerPlan.model_validate(json.loads(sys.argv[1]))
pid = int(sys.argv[2])
ctl = Path(tempfile.mkdtemp(prefix="tb0c2-ctl-"))
build = ClusterBuild(None, plan, "tb0c2", ctl, lambda m: None)
build.remote = {"s1": True}
build._placement = {"tb0c2h1": plan.machines[0]}
build._dirs.append(ctl)
listener = socket.socket(socket.AF_UNIX)
listener.bind(str(ctl / "runner.sock"))
listener.listen()
got = []
def accept():
    conn, _ = listener.accept()
    got.append(conn.recv(100).decode())
threading.Thread(target=accept, daemon=True).start()
client = ("import json, os, socket, time\n"
          "path = json.loads(os.environ['" + CONTROL_MAP_ENV + "'])[os.environ['SOCK']]\n"
          "for _ in range(100):\n"
          "    try:\n"
          "        s = socket.socket(socket.AF_UNIX); s.connect(path); break\n"
          "    except OSError: time.sleep(0.1)\n"
          "s.sendall(b'hello through ' + path.encode()); print(path)\n")
env = dict(os.environ, SOCK=str(ctl / "runner.sock"))
p = build.spawn("tb0c2h1", pid, [sys.executable, "-c", client], env=env, stdout=subprocess.PIPE, text=True)
out, _ = p.communicate(timeout=60)
time.sleep(0.3)
build.close()
folders = list(build._forward_dirs.values())
subprocess.run(["rm", "-rf", str(ctl), *folders])
print(json.dumps({"remote_path": out.strip(), "got": got, "code": p.returncode}))
"""


def test_a_remote_program_reaches_the_runners_control_socket_through_a_forward(rig):
    """The runner's control socket (a UNIX socket in the emulation's ``ctl`` folder) is
    forwarded to a path of the server (``ssh -N -R``) and named to programs started
    there (TESTBED_CONTROL_MAP): the program connects through the server's path."""
    section = rig.servers_section({"s1": ["dc1"]}, configure="ssh").model_dump(mode="json", exclude_none=True)
    res = subprocess.run(rig.head_argv([sys.executable, "-c", FORWARD, json.dumps(section),
                                        str(rig.servers[0].pid)]),
                         cwd=REPO_ROOT, capture_output=True, text=True, timeout=180, check=False)
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(res.stdout.splitlines()[-1])
    assert out["code"] == 0
    assert out["remote_path"].startswith("/tmp/tb0c2-fwd-") and out["remote_path"].endswith("/c0.sock")
    assert out["got"] == [f"hello through {out['remote_path']}"]
