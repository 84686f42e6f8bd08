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
