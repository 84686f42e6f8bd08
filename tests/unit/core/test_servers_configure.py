"""How the nodes of each server are reached (testbed_core/servers.py's `configure` and
`python`, testbed/emulation/cluster/build.py): the settings' refusals name the file and
field, and TESTBED_SERVERS_CONFIGURE=ssh forces the SSH path as `configure: ssh` does."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from testbed_core.servers import ServersError, load_servers

GOOD = {"machines": [{"name": "s1", "address": "10.203.0.2", "dcs": ["dc1"]},
                     {"name": "s2", "address": "10.203.0.3", "dcs": ["dc2"], "python": "/opt/v/bin/python"}]}


def _load(tmp_path: Path, data: dict) -> object:
    path = tmp_path / "servers.yaml"
    path.write_text(yaml.safe_dump(data))
    return load_servers(path)


def test_defaults_auto_and_python3_with_a_per_server_python(tmp_path):
    plan = _load(tmp_path, GOOD)
    assert plan.configure == "auto" and plan.python == "python3"
    assert [plan.python_for(s) for s in plan.machines] == ["python3", "/opt/v/bin/python"]


@pytest.mark.parametrize(("change", "field"), [
    (lambda d: d.update(configure="pid"), "configure"),
    (lambda d: d.update(python=""), "python"),
    (lambda d: d["machines"][0].update(python=""), "machines.0.python"),
])
def test_a_wrong_setting_is_refused_naming_file_and_field(tmp_path, change, field):
    data = copy.deepcopy(GOOD)
    change(data)
    with pytest.raises(ServersError) as err:
        _load(tmp_path, data)
    assert "servers.yaml" in str(err.value) and field in str(err.value)


def test_the_environment_forces_the_ssh_path(tmp_path, monkeypatch):
    from testbed.emulation.cluster.build import ENV_CONFIGURE, ClusterBuild

    plan = _load(tmp_path, GOOD)
    build = ClusterBuild(None, plan, "tb0f0", tmp_path, lambda msg: None)
    assert build.configure == "auto"
    monkeypatch.setenv(ENV_CONFIGURE, "ssh")
    build = ClusterBuild(None, plan, "tb0f0", tmp_path, lambda msg: None)
    assert build.configure == "ssh"
    login = build.login(plan.machines[1])
    assert (login.server, login.address, login.python) == ("s2", "10.203.0.3", "/opt/v/bin/python")


def test_a_server_that_does_not_see_a_programs_files_is_refused_naming_them(tmp_path, monkeypatch):
    import subprocess

    from testbed.emulation.cluster import build as build_mod
    from testbed.emulation.errors import EmulationError

    plan = _load(tmp_path, GOOD)
    build = build_mod.ClusterBuild(None, plan, "tb0f0", tmp_path, lambda msg: None)
    job = tmp_path / "jobs" / "w0.json"
    job.parent.mkdir()
    job.write_text("{}")
    asked = []

    def fake_run(argv, **kwargs):  # the server sees nothing of this machine's folders
        asked.append(argv[-1])
        return subprocess.CompletedProcess(argv, 0, f"{job.parent}\n", "")

    monkeypatch.setattr(build_mod.subprocess, "run", fake_run)
    with pytest.raises(EmulationError) as err:
        build._check_visible(plan.machines[1], [str(job)])
    assert str(err.value).startswith(f"server s2 (10.203.0.3) does not see {job.parent}: ")
    assert "same path there (a shared file system" in str(err.value)
    assert f"test -e {job.parent}" in asked[0]
    calls = []
    monkeypatch.setattr(build_mod.subprocess, "run",
                        lambda argv, **k: calls.append(argv) or subprocess.CompletedProcess(argv, 0, "", ""))
    build._check_visible(plan.machines[1], [str(job)])  # it sees the folder now
    build._check_visible(plan.machines[1], [str(job), str(job)])
    assert len(calls) == 1  # asked once per folder and server
