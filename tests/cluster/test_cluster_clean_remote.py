"""`testbed clean` undoes a run on a server reached over SSH: what the run left there
(a process with the run's mark, a tunnel end in the server's root namespace, a
temporary folder) is found and removed over the server's SSH from the login written in
the run record (testbed/emulation/records.py, ``nodeagent clean``), and the record
goes only once that worked."""

from __future__ import annotations

import re
import secrets
import subprocess
import sys
import time
from pathlib import Path

import pytest

from testbed_core.constants import REPO_ROOT

pytestmark = [pytest.mark.root, pytest.mark.cluster]


@pytest.fixture(scope="module")
def rig():
    from testbed.emulation.cluster.rig import ServerRig

    with ServerRig(1) as rig:
        yield rig


def _ssh(rig, command: str) -> subprocess.CompletedProcess:
    return subprocess.run(rig.head_argv(rig.ssh_argv(rig.servers[0], command)), capture_output=True, text=True,
                          timeout=60, check=False)


def _dead_run_with_a_remote_server(rig, login_update: dict | None = None):
    from testbed.emulation.naming import new_prefix
    from testbed.emulation.records import RunRecord, prefix_in_use
    from testbed.emulation.remote.sshlogin import RemoteLogin

    prefix = new_prefix(lambda p: prefix_in_use(p))
    record = RunRecord.create(prefix, "2dc-split")
    server = rig.servers[0]
    login = RemoteLogin(server=server.name, address=server.address, identity=str(rig.identity),
                        known_hosts=str(rig.known_hosts), python=sys.executable)
    record.add_remote(server.name, login.model_copy(update=login_update or {}).model_dump())
    folder = f"/tmp/{prefix}-agent-{secrets.token_hex(3)}"
    record.add_remote_path(server.name, folder)
    record.owner.pid, record.owner.start = 2**22 + 1, 1  # its controller was killed
    record.save()
    marker = f"{prefix}-left-{secrets.token_hex(3)}"
    res = _ssh(rig, f"mkdir {folder} && ip link add {prefix}t0 type veth peer name {prefix}t1 && "
                    f"(TESTBED_RUN={prefix} nohup bash -c 'exec -a {marker} sleep 300' >/dev/null 2>&1 &)")
    if res.returncode != 0:  # leave nothing behind that no clean could undo
        _ssh(rig, f"rm -rf {folder}; ip link del {prefix}t0")
        record.delete()
        pytest.fail(f"could not leave things on the server: {res.stderr}")
    return prefix, record, folder, marker


def _clean(rig) -> subprocess.CompletedProcess:
    return subprocess.run(rig.head_argv([sys.executable, "-m", "testbed.cli", "clean"]), cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=120, check=False)


def test_testbed_clean_removes_what_a_run_left_on_a_remote_server(rig):
    prefix, record, folder, marker = _dead_run_with_a_remote_server(rig)
    for _ in range(50):
        if subprocess.run(["pgrep", "-f", marker], capture_output=True).returncode == 0:
            break
        time.sleep(0.1)
    else:
        pytest.fail("the marked process did not start on the server")
    res = _clean(rig)
    # clean ends every dead run it finds: a stale record of another (a crashed test's on this
    # machine) may fail on its own; this run's must not
    kept = re.findall(r"failed: /run/testbed/(tb[0-9a-f]+)\.json: kept", res.stdout + res.stderr)
    assert res.returncode == 0 or (kept and prefix not in kept), res.stdout + res.stderr
    assert "remote-clean" in res.stdout and "over SSH root@10.202.0.2" in res.stdout
    time.sleep(0.2)
    assert subprocess.run(["pgrep", "-f", marker], capture_output=True).returncode == 1
    assert not Path(folder).exists()
    assert f"{prefix}t0" not in _ssh(rig, "ip -o link show").stdout
    assert not record.path.exists()


def test_a_server_that_cannot_be_reached_keeps_the_record(rig):
    prefix, record, folder, marker = _dead_run_with_a_remote_server(rig, {"python": "/nonexistent/python3"})
    try:
        res = _clean(rig)
        assert res.returncode != 0
        assert "server s1 (10.202.0.2): clean over SSH failed" in res.stdout + res.stderr
        assert record.path.exists()
    finally:  # undo it for real with the right Python: the kept record lets a later clean finish
        record.remote[0].login["python"] = sys.executable
        record.save()
        # one more try allowed: once in a full suite on the busy machine the first clean after
        # the fix failed over SSH as well (exit status, cause not established) and kept the record
        res = _clean(rig)
        if res.returncode != 0 and record.path.exists():
            print(f"\nfirst clean after the fix failed, trying again: {(res.stdout + res.stderr)[-600:]}")
            res = _clean(rig)
        assert res.returncode == 0 or not record.path.exists(), res.stdout + res.stderr
    assert not record.path.exists() and not Path(folder).exists()


def test_a_rig_that_stops_first_cleans_the_dead_runs_that_used_it():
    """A run over a test rig killed (e.g. by a test's timeout) and the rig stopped after
    it: the rig ends that run over SSH while its sshds and keys still exist, so no record
    is left that names a key folder that is gone."""
    from testbed.emulation.cluster.rig import ServerRig

    own = ServerRig(1)
    own.start()
    try:
        prefix, record, folder, marker = _dead_run_with_a_remote_server(own)
    finally:
        own.stop()
    assert not record.path.exists()
    assert not Path(folder).exists()
    assert subprocess.run(["pgrep", "-f", marker], capture_output=True).returncode == 1
