"""The real-machine mode (``testbed run --inventory``, testbed/run/inventory.py)
against the rig's server namespaces as the "machines" (each with its own sshd on a
private underlay, testbed/emulation/cluster/rig.py): a reduced quickstart runs end to
end over SSH, with its agents, calibrates the path between the machines and writes a
complete summary; nothing is left on the machines; a login the machines refuse stops
the run naming the machine."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import yaml

from testbed_core.constants import REPO_ROOT

pytestmark = [pytest.mark.root, pytest.mark.cluster]

TESTBED = [sys.executable, "-m", "testbed.cli"]
QUICKSTART = REPO_ROOT / "scenarios" / "quickstart.yaml"
REDUCED = ["--set", "workload.warmup=1", "--set", "workload.iterations=1", "--set", "runner.calibration_transfers=1",
           "--set", "runner.bubbletea_idle_twin=false", "--variants", "atlas,atlas+bubbletea"]


def _inventory(rig, tmp_path: Path, identity: str | None = None) -> Path:
    data = {"ssh": {"user": "root", "identity": identity or str(rig.identity), "known_hosts": str(rig.known_hosts)},
            "machines": [{"name": s.name, "address": s.address, "dcs": [dc]}
                         for s, dc in zip(rig.servers, ["dc1", "dc2"], strict=True)]}
    path = tmp_path / "inventory.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _run(rig, inventory: Path, out: Path, *extra: str, timeout: float = 600) -> subprocess.CompletedProcess:
    argv = [*TESTBED, "run", str(QUICKSTART), "--inventory", str(inventory), "-o", str(out), *extra]
    return subprocess.run(rig.head_argv(argv), cwd=REPO_ROOT, capture_output=True, text=True, timeout=timeout,
                          check=False)


@pytest.fixture(scope="module")
def rig():
    from testbed.emulation.cluster.rig import ServerRig

    with ServerRig(2) as rig:
        yield rig


@pytest.mark.slow  # 50 s quiet; issue 16's done-when: in make test (CI)
@pytest.mark.timeout(600)  # 321 s measured at load 21-33 on 2 cores (torch imports over SSH dominate)
def test_the_quickstart_runs_on_the_machines_of_an_inventory(rig, tmp_path):
    before = set(Path("/tmp").glob("tb*-inv-*"))
    t0 = time.monotonic()
    res = _run(rig, _inventory(rig, tmp_path), tmp_path / "out", *REDUCED, timeout=560)
    wall = time.monotonic() - t0
    assert res.returncode == 0, res.stderr[-4000:]
    assert "real machines: logging in to s1, s2" in res.stderr
    assert "real path dc1<->dc2 (machines s1, s2): RTT " in res.stderr  # measured, not the file's 50 ms
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["delay_backend"].startswith("none (real machines over SSH")
    assert summary["runner"]["inventory"] == str((tmp_path / "inventory.yaml").resolve())
    (path,) = summary["calibration"]["paths"]  # the real path between the machines, timed
    assert path["dcs"] == ["dc1", "dc2"] and path["channel_rate_mbps"]["1"] > 0
    for name in ("atlas", "atlas+bubbletea"):
        v = summary["variants"][name]
        assert "iteration_time_s" in v, v  # a result, not a failure
        assert v["iteration_time_s"] > 0 and len(v["iteration_times_s"]) == 1, v
        assert (tmp_path / "out" / v["gantt_png"]).is_file()
    load = Path("/proc/loadavg").read_text().split()[0]
    print(f"\ninventory run on the rig: {wall:.0f} s, atlas {summary['variants']['atlas']['iteration_time_s']:.3f} s/it "
          f"(load {load})")
    # nothing left on the machines: their folders removed, no process of the run alive
    assert set(Path("/tmp").glob("tb*-inv-*")) <= before
    assert not [p for p in Path("/run/testbed").glob("*.json") if '"topology": "inventory"' in p.read_text()
                and str(tmp_path) in p.read_text()]  # its run record went with it
    left = subprocess.run(["pgrep", "-f", str(tmp_path / "out")], capture_output=True, text=True).stdout
    assert left.strip() == ""


def test_a_key_the_machines_refuse_stops_the_run_naming_the_machine(rig, tmp_path):
    other = tmp_path / "other_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    inventory = _inventory(rig, tmp_path, str(other))
    res = _run(rig, inventory, tmp_path / "out", *REDUCED, timeout=180)
    assert res.returncode != 0
    assert f"{inventory.resolve()}: machines.0 (s1, root@10.202.0.2:22): cannot log in over SSH (" in res.stderr
    assert f"key-based login with ssh.identity ({other})" in res.stderr
    assert "machines.1 (s2, root@10.202.0.3:22)" in res.stderr


@pytest.mark.cleans
def test_testbed_clean_ends_what_a_killed_inventory_run_left_on_the_machines(rig, tmp_path):
    """The run's controller killed (SIGKILL) once its first process runs on a machine:
    its folders there and its processes (marked with the run's prefix) stay, with the
    run record that lists the machines; `testbed clean` ends them over SSH and drops
    the record."""
    import os
    import signal

    before = set(Path("/tmp").glob("tb*-inv-*"))
    argv = [*TESTBED, "run", str(QUICKSTART), "--inventory", str(_inventory(rig, tmp_path)), "-o",
            str(tmp_path / "out"), *REDUCED]
    proc = subprocess.Popen(rig.head_argv(argv), cwd=REPO_ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 150
        folders: list[Path] = []
        while time.monotonic() < deadline and proc.poll() is None:
            folders = sorted(set(Path("/tmp").glob("tb*-inv-*")) - before)
            if any(list(f.glob("*.pid")) for f in folders):
                break
            time.sleep(0.2)
        assert proc.poll() is None and folders, "no process started on the machines"
        os.kill(proc.pid, signal.SIGKILL)  # the controller only: what it started stays
        proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    prefix = folders[0].name[:5]
    assert Path(f"/run/testbed/{prefix}.json").exists()
    assert _marked(prefix), "no process of the run carries its mark on the machines"
    ctl = list(Path(tempfile.gettempdir()).glob(f"{prefix}-ctl-*"))  # the controller's own, named and recorded
    assert ctl, "the run's local control-socket folder is not named with its prefix"
    res = subprocess.run(rig.head_argv([*TESTBED, "clean"]), cwd=REPO_ROOT, capture_output=True, text=True,
                         timeout=180, check=False)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "remote-clean" in res.stdout
    time.sleep(0.3)
    assert not [f for f in folders if f.exists()]
    assert not [f for f in ctl if f.exists()], "testbed clean left the controller's local folder"
    assert not Path(f"/run/testbed/{prefix}.json").exists()
    left = subprocess.run(["pgrep", "-f", str(tmp_path / "out")], capture_output=True, text=True).stdout
    assert left.strip() == ""
    assert _marked(prefix) == []


def _marked(prefix: str) -> list[int]:
    """PIDs with TESTBED_RUN=<prefix> (the rig's machines share this machine's /proc)."""
    mark = f"TESTBED_RUN={prefix}".encode()
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if mark in (d / "environ").read_bytes().split(b"\0"):
                    out.append(int(d.name))
            except OSError:
                pass
    return out
