"""``--servers FILE`` on the commands that build a topology (`topo show|up|check`,
`testbed run`): the file places the DCs on servers, and a wrong file is refused
before anything is built, naming the file and the field."""

from __future__ import annotations

from pathlib import Path

import yaml
from click.testing import CliRunner

from testbed.cli import main
from testbed_core.constants import REPO_ROOT, TOPOLOGIES_DIR

SERVERS = {
    "tunnel": "gre",
    "ssh": {"user": "root", "identity": "keys/id"},
    "machines": [
        {"name": "s1", "address": "10.203.0.2", "dcs": ["dc1"]},
        {"name": "s2", "address": "10.203.0.3", "dcs": ["dc2"], "underlay_rate": "10Gbit"},
    ],
}


def _file(tmp_path: Path, data: object) -> Path:
    path = tmp_path / "servers.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_topo_show_places_the_dcs_on_the_servers_of_the_file(tmp_path):
    res = CliRunner().invoke(main, ["topo", "show", str(TOPOLOGIES_DIR / "2dc.yaml"),
                                    "--servers", str(_file(tmp_path, SERVERS))])
    assert res.exit_code == 0, res.output
    assert "Servers (WAN links between servers: gre tunnels)" in res.output
    s1 = next(line for line in res.output.splitlines() if line.startswith("s1"))
    assert "10.203.0.2" in s1 and "dc1" in s1 and "root@10.203.0.2:22" in s1 and "measured at start" in s1
    s2 = next(line for line in res.output.splitlines() if line.startswith("s2"))
    assert "10 Gbit/s" in s2 or "10Gbit" in s2


def test_a_servers_file_that_does_not_fit_is_refused_naming_it(tmp_path):
    bad = dict(SERVERS, machines=[{"name": "s1", "address": "10.203.0.2", "dcs": ["dc1", "dc9"]}])
    path = _file(tmp_path, bad)
    for command in (["topo", "check"], ["topo", "up"], ["topo", "show"]):
        res = CliRunner().invoke(main, [*command, str(TOPOLOGIES_DIR / "2dc.yaml"), "--servers", str(path)])
        assert res.exit_code != 0
        assert f"{path}: machines.0.dcs: unknown DC 'dc9'" in res.output


def test_testbed_run_takes_a_servers_file_and_refuses_it_with_local(tmp_path):
    scenario = REPO_ROOT / "scenarios" / "quickstart.yaml"
    bad = _file(tmp_path, dict(SERVERS, machines=[{"name": "s1", "address": "10.203.0.2", "dcs": ["dcx"]}]))
    res = CliRunner().invoke(main, ["run", str(scenario), "--servers", str(bad)])
    assert res.exit_code != 0 and f"{bad}: machines.0.dcs: unknown DC 'dcx'" in res.output
    good = _file(tmp_path, SERVERS)
    res = CliRunner().invoke(main, ["run", str(scenario), "--local", "--servers", str(good)])
    assert res.exit_code != 0
    assert f"--servers {good}: a local run (--local, runner.local) emulates nothing" in res.output


def test_with_servers_records_the_plan_in_the_resolved_scenario(tmp_path):
    from testbed.run.network import with_servers
    from testbed.run.scenario import load_scenario

    scenario, resolved = load_scenario(REPO_ROOT / "scenarios" / "quickstart.yaml", {})
    placed, resolved2 = with_servers(scenario, resolved, _file(tmp_path, SERVERS))
    assert placed.topology.servers is not None
    assert placed.topology.servers.server_of("dc2").name == "s2"
    assert resolved2["topology"]["servers"]["machines"][1]["dcs"] == ["dc2"]
    assert "servers" not in (resolved.get("topology") or {})
