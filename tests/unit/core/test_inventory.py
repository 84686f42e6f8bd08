"""The inventory of real machines (testbed_core/inventory.py, ``testbed run
--inventory``): which machine plays which host, and every mistake refused before a
process starts, naming the file, the field and what to do: an unknown DC or host, a
host on two machines or on none, a missing key, an unreachable machine."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from testbed.cli import main
from testbed.progress import Progress
from testbed.run.common import RunnerError
from testbed_core.constants import REPO_ROOT, TOPOLOGIES_DIR
from testbed_core.inventory import InventoryError, load_inventory
from testbed_core.topology import load_topology

QUICKSTART = REPO_ROOT / "scenarios" / "quickstart.yaml"
GOOD = {
    "ssh": {"user": "root", "identity": "keys/id"},
    "machines": [
        {"name": "m1", "address": "10.204.0.2", "dcs": ["dc1"]},
        {"name": "m2", "address": "10.204.0.3", "hosts": ["dc2-h1"], "data_address": "10.205.0.3"},
        {"name": "m3", "address": "10.204.0.4", "hosts": ["dc2-h2"], "python": "/opt/py/bin/python"},
    ],
}


def _file(tmp_path: Path, data: object, name: str = "inventory.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data))
    return path


def _machines(*changes: dict) -> dict:
    machines = [dict(m) for m in GOOD["machines"]]
    for i, change in enumerate(changes):
        machines[i].update(change)
    return dict(GOOD, machines=machines)


@pytest.fixture(scope="module")
def topo():
    return load_topology(TOPOLOGIES_DIR / "2dc.yaml")


def test_each_host_is_played_by_one_machine(tmp_path, topo):
    inv = load_inventory(_file(tmp_path, GOOD))
    where = inv.assignment(topo)
    assert {h: m.name for h, m in where.items()} == {"dc1-h1": "m1", "dc1-h2": "m1", "dc2-h1": "m2", "dc2-h2": "m3"}
    assert where["dc2-h1"].ip == "10.205.0.3" and where["dc1-h1"].ip == "10.204.0.2"
    assert inv.ssh.identity == str(tmp_path / "keys/id")  # relative to the inventory's folder
    assert inv.python_for(where["dc2-h2"], "/here/python") == "/opt/py/bin/python"
    assert inv.python_for(where["dc1-h1"], "/here/python") == "/here/python"
    assert inv.repo_for(where["dc1-h1"], "/repo") == "/repo"


@pytest.mark.parametrize("data, expected", [
    (_machines({"dcs": ["dc1", "dc7"]}), r"machines\.0\.dcs\.1: unknown DC 'dc7' \(topology 2dc has dc1, dc2\)"),
    (_machines({}, {"hosts": ["dc2-h9"]}), r"machines\.1\.hosts\.0: unknown host 'dc2-h9' .*named <dc>-<host>"),
    (_machines({}, {"hosts": ["dc1-h2"]}),
     r"machines\.1\.hosts\.0: host dc1-h2 is already on machine m1 \(machines\.0\.dcs\.0\); a host runs on "
     r"exactly one machine"),
    (dict(GOOD, machines=GOOD["machines"][:2]),
     r"machines: hosts dc2-h2 of topology 2dc are on no machine; list them under a machine's `hosts:`"),
])
def test_a_wrong_mapping_names_the_file_and_field(tmp_path, topo, data, expected):
    path = _file(tmp_path, data)
    with pytest.raises(InventoryError, match=rf"{path}: {expected}"):
        load_inventory(path).assignment(topo)


@pytest.mark.parametrize("data, expected", [
    (_machines({"address": "m1.example"}), r"machines\.0\.address.*not an IPv4 address"),
    (_machines({"dcs": [], "hosts": []}), r"machines\.0.*machine m1 plays nothing: give `dcs:`"),
    (_machines({}, {"name": "m1"}), r"each machine needs its own name; repeated: m1"),
    (dict(GOOD, password="x"), r"password"),
])
def test_a_wrong_inventory_file_names_the_file_and_field(tmp_path, data, expected):
    path = _file(tmp_path, data)
    with pytest.raises(InventoryError, match=rf"(?s){path}.*{expected}"):
        load_inventory(path)
    with pytest.raises(InventoryError, match="no such inventory file"):
        load_inventory(tmp_path / "nope.yaml")


def test_a_missing_key_is_named_with_its_field(tmp_path):
    from testbed.run.inventory import file_problems

    (tmp_path / "keys").mkdir()
    (tmp_path / "keys" / "id").write_text("key")
    data = _machines({}, {"ssh": {"identity": "keys/other", "known_hosts": "kh"}})
    path = _file(tmp_path, data)
    problems = file_problems(load_inventory(path))
    assert problems == [
        f"{path}: machines.1.ssh.identity: {tmp_path}/keys/other does not exist or cannot be read; give the "
        "private key the machines accept (ssh-keygen -t ed25519; its .pub in ~/.ssh/authorized_keys on each "
        "machine)",
        f"{path}: machines.1.ssh.known_hosts: {tmp_path}/kh does not exist or cannot be read; give a known_hosts "
        "file with the machines' host keys (ssh-keyscan ADDRESS >> FILE, after checking them)",
    ]


def test_testbed_run_refuses_a_wrong_inventory_before_anything_starts(tmp_path):
    bad = _file(tmp_path, _machines({"dcs": ["dcx"]}))
    res = CliRunner().invoke(main, ["run", str(QUICKSTART), "--inventory", str(bad), "-o", str(tmp_path / "out")])
    assert res.exit_code != 0
    assert f"{bad}: machines.0.dcs.0: unknown DC 'dcx'" in res.output
    good = _file(tmp_path, GOOD, "good.yaml")
    res = CliRunner().invoke(main, ["run", str(QUICKSTART), "--local", "--inventory", str(good)])
    assert res.exit_code != 0
    assert f"--inventory {good}: real machines replace the emulation; --local, --servers" in res.output
    assert not (tmp_path / "out").exists()


def test_an_unreachable_machine_is_refused_naming_it(tmp_path):
    """A machine whose SSH port refuses connections (nothing listens on 127.0.0.1:1):
    the run stops at the login, naming the file, the machine and what to check."""
    from testbed.run.inventory import open_inventory
    from testbed.run.network import with_inventory
    from testbed.run.scenario import load_scenario

    (tmp_path / "id").write_text("not a key")
    (tmp_path / "id").chmod(0o600)
    data = {"ssh": {"identity": "id", "port": 1},
            "machines": [{"name": "m1", "address": "127.0.0.1", "dcs": ["dc1", "dc2"]}]}
    path = _file(tmp_path, data)
    scenario, resolved = load_scenario(QUICKSTART, {})
    scenario, _ = with_inventory(scenario, resolved, path)
    with pytest.raises(RunnerError) as err, open_inventory(scenario, Progress(stream=io.StringIO(), tty=False)):
        pass
    msg = str(err.value)
    assert msg.startswith(f"{path.resolve()}: machines.0 (m1, root@127.0.0.1:1): cannot log in over SSH (")
    assert "check the address, that the machine is reachable from here, that sshd runs there and accepts " \
           f"key-based login with ssh.identity ({tmp_path.resolve()}/id)" in msg


def test_link_faults_are_refused_on_real_machines_before_any_login(tmp_path):
    """Nothing is shaped on real machines: a scenario that takes a link down cannot
    run there; the refusal comes before any machine is contacted (the address is one
    nobody answers, the test would wait for ssh otherwise)."""
    from testbed.run.inventory import open_inventory
    from testbed.run.network import with_inventory
    from testbed.run.scenario import load_scenario

    (tmp_path / "keys").mkdir()
    (tmp_path / "keys" / "id").write_text("key")
    path = _file(tmp_path, GOOD)
    scenario, resolved = load_scenario(REPO_ROOT / "scenarios" / "faults-2dc.yaml", {})
    scenario, _ = with_inventory(scenario, resolved, path)
    with pytest.raises(RunnerError, match=r"faults-2dc\.yaml: faults\.0: a link-down needs the emulated network; "
                                          r"on real machines \(.*inventory\.yaml\) only kill-worker faults are "
                                          r"played"), \
            open_inventory(scenario, Progress(stream=io.StringIO(), tty=False)):
        pass
