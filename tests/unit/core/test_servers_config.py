"""The servers section and ``--servers`` file (testbed_core/servers.py): each mistake is
refused before anything connects, naming the file, the field and what to do; the
underlay checks (MTU, capacity) say which server or pair falls short and why."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from testbed_core.constants import TOPOLOGIES_DIR
from testbed_core.servers import (
    ServersError,
    inner_mtu,
    load_servers,
    mtu_problem,
    place_topology,
    underlay_demand,
    underlay_problem,
)
from testbed_core.topology import TopologyError, load_topology

GOOD = {
    "tunnel": "vxlan",
    "ssh": {"user": "root", "identity": "keys/id", "known_hosts": "/abs/known_hosts"},
    "machines": [
        {"name": "s1", "address": "10.203.0.2", "dcs": ["dc1"]},
        {"name": "s2", "address": "10.203.0.3", "dcs": ["dc2"], "underlay_rate": "10Gbit"},
    ],
}


def _topology_with(tmp_path: Path, servers: object) -> Path:
    data = yaml.safe_load((TOPOLOGIES_DIR / "2dc.yaml").read_text())
    data["servers"] = servers
    path = tmp_path / "split.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _servers_file(tmp_path: Path, data: object) -> Path:
    path = tmp_path / "servers.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_a_servers_section_places_each_dc_and_resolves_key_paths(tmp_path):
    topo = load_topology(_topology_with(tmp_path, GOOD))
    plan = topo.servers
    assert plan is not None
    assert plan.server_of("dc1").name == "s1" and plan.server_of("dc2").name == "s2"
    assert plan.ssh.identity == str(tmp_path / "keys/id")  # relative to the topology file
    assert plan.ssh.known_hosts == "/abs/known_hosts"  # absolute stays
    assert plan.machines[1].underlay_rate == 10e9
    assert load_topology(TOPOLOGIES_DIR / "2dc.yaml").servers is None


@pytest.mark.parametrize("change, expected", [
    (lambda d: d["machines"][0].update(dcs=["dc9"]), "servers.machines.0.dcs: unknown DC 'dc9'"),
    (lambda d: d["machines"][1].update(dcs=["dc1"]), "DC 'dc1' is already placed on server s1"),
    (lambda d: d["machines"].pop(), "DCs dc2 are on no server"),
    (lambda d: d["machines"][1].update(name="s1"), "each server needs its own name; repeated: s1"),
    (lambda d: d["machines"][1].update(address="10.203.0.2"), "its own address; repeated: 10.203.0.2"),
    (lambda d: d["machines"][0].update(address="s1.example"), "servers.machines.0.address"),
    (lambda d: d["machines"][0].update(address="127.0.0.1"), "not loopback"),
    (lambda d: d["machines"][0].update(name="S 1"), "servers.machines.0.name"),
    (lambda d: d.update(tunnel="ssh"), "servers.tunnel"),
    (lambda d: d["ssh"].update(password="x"), "servers.ssh.password"),
    (lambda d: d["ssh"].update(port=0), "servers.ssh.port"),
    (lambda d: d["machines"][1].update(underlay_rate="10Gbyte"), "servers.machines.1.underlay_rate"),
    (lambda d: d.update(machines=[]), "servers.machines"),
])
def test_a_wrong_servers_section_names_file_and_field(tmp_path, change, expected):
    import copy

    data = copy.deepcopy(GOOD)
    change(data)
    path = _topology_with(tmp_path, data)
    with pytest.raises(TopologyError) as err:
        load_topology(path)
    assert str(path) in str(err.value)
    assert expected in str(err.value)


def test_a_servers_file_applies_to_a_topology_and_names_itself_when_wrong(tmp_path):
    topo = load_topology(TOPOLOGIES_DIR / "2dc.yaml")
    plan = load_servers(_servers_file(tmp_path, GOOD))
    placed = place_topology(topo, plan, "servers.yaml")
    assert placed.servers is plan and placed.dcs == topo.dcs

    bad = dict(GOOD, machines=[{"name": "s1", "address": "10.203.0.2", "dcs": ["dc1", "dcx"]}])
    path = _servers_file(tmp_path, bad)
    with pytest.raises(ServersError, match=r"servers\.yaml: machines\.0\.dcs: unknown DC 'dcx'"):
        place_topology(topo, load_servers(path), str(path))

    path = _servers_file(tmp_path, dict(GOOD, tunel="gre"))
    with pytest.raises(ServersError, match=r"servers\.yaml: invalid servers section .*\n  - tunel"):
        load_servers(path)
    path = _servers_file(tmp_path, ["s1"])
    with pytest.raises(ServersError, match=r"servers\.yaml.*mapping"):
        load_servers(path)
    with pytest.raises(ServersError, match="no such servers file"):
        load_servers(tmp_path / "missing.yaml")


def test_the_tunnel_mtu_check_says_which_device_and_what_to_set():
    assert inner_mtu(1500, "vxlan") == 1450 and inner_mtu(9000, "vxlan") == 1500
    assert inner_mtu(1500, "gre") == 1458
    assert mtu_problem("s1", "eth0", 1500, "vxlan") is None
    msg = mtu_problem("s1", "eth0", 1300, "vxlan")
    assert msg is not None
    assert "server s1" in msg and "eth0 has MTU 1300" in msg and "raise the MTU of eth0 to 1330" in msg


def test_the_underlay_must_carry_the_tunnelled_wan_rates_with_headroom(tmp_path):
    topo = load_topology(_topology_with(tmp_path, GOOD))
    assert topo.servers is not None
    demand = underlay_demand(topo, topo.servers)
    assert demand == {("s1", "s2"): 1e9}
    assert underlay_problem(("s1", "s2"), 1e9, 10e9, "declared") is None
    msg = underlay_problem(("s1", "s2"), 1e9, 1.05e9, "measured with iperf3")
    assert msg is not None
    assert "servers s1 and s2" in msg and "1.05Gbit (measured with iperf3)" in msg
    assert "lower those WAN rates" in msg
    # DCs on one server: nothing crosses the underlay
    same = dict(GOOD, machines=[{"name": "s1", "address": "10.203.0.2", "dcs": ["dc1", "dc2"]}])
    topo = load_topology(_topology_with(tmp_path, same))
    assert topo.servers is not None and underlay_demand(topo, topo.servers) == {}
