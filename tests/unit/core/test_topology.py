"""Topology files: shipped files load, and every user error names file, field and fix."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from testbed_core.constants import TOPOLOGIES_DIR
from testbed_core.topology import TopologyError, bdp_bytes, load_topology, parse_topology
from testbed_core.units import UnitError, parse_duration, parse_fraction, parse_rate, parse_size


def base() -> dict:
    return {
        "name": "t",
        "dcs": [{"name": "dc1", "hosts": 2}, {"name": "dc2", "hosts": ["a", "b"]}],
        "wan": [{"between": ["dc1", "dc2"], "rate": "1Gbit", "delay": "25ms"}],
    }


@pytest.mark.parametrize("name", ["2dc", "3dc-triangle", "4dc-regions"])
def test_shipped_topologies_load(name: str) -> None:
    topo = load_topology(TOPOLOGIES_DIR / f"{name}.yaml")
    assert topo.dcs and topo.wan
    for link in topo.wan:
        assert link.queue_bytes >= bdp_bytes(link.rate, link.rtt_s)


def test_2dc_is_window_limited() -> None:
    topo = load_topology(TOPOLOGIES_DIR / "2dc.yaml")
    link = topo.wan[0]
    assert link.rtt_s == pytest.approx(0.050)
    assert link.rate == 1e9
    # One flow must be capped well under the link, or Atlas has nothing to show.
    assert topo.tcp_for("dc1").window_limited_rate(link.rtt_s) < link.rate / 4
    assert link.queue_bytes == 6_250_000


def test_host_count_expands_to_names() -> None:
    topo = parse_topology(base())
    assert topo.dc("dc1").hosts == ["h1", "h2"]
    assert topo.dc("dc2").hosts == ["a", "b"]


def test_units() -> None:
    assert parse_rate("1Gbit") == 1e9
    assert parse_rate("2.5Gbps") == 2.5e9
    assert parse_rate("500Mbit/s") == 500e6
    assert parse_size("1MB") == 1_000_000
    assert parse_size("1MiB") == 2**20
    assert parse_duration("25ms") == pytest.approx(0.025)
    assert parse_duration("100us") == pytest.approx(1e-4)
    assert parse_fraction("0.1%") == pytest.approx(0.001)
    with pytest.raises(UnitError, match="bytes per second"):
        parse_rate("100MBps")
    with pytest.raises(UnitError, match="unknown size unit"):
        parse_size("3 bananas")


def check_error(data: dict, *fragments: str) -> str:
    with pytest.raises(TopologyError) as info:
        parse_topology(data, "topologies/x.yaml")
    message = str(info.value)
    assert message.startswith("topologies/x.yaml")
    for fragment in fragments:
        assert fragment in message, message
    return message


def test_bad_unit_names_field_and_allowed_units() -> None:
    data = base()
    data["wan"][0]["rate"] = "1Gbyte"
    check_error(data, "wan.0.rate", "unknown rate unit 'Gbyte'", "gbit")


def test_unknown_dc_lists_defined_ones() -> None:
    data = base()
    data["wan"][0]["between"] = ["dc1", "dc9"]
    check_error(data, "unknown DC 'dc9'", "defined DCs: dc1, dc2")


def test_negative_delay() -> None:
    data = base()
    data["wan"][0]["delay"] = "-5ms"
    check_error(data, "wan.0.delay", "greater than or equal to 0")


def test_missing_field() -> None:
    data = base()
    del data["wan"][0]["rate"]
    check_error(data, "wan.0.rate", "required field is missing")


def test_unknown_field_is_refused() -> None:
    data = base()
    data["wan"][0]["latency"] = "25ms"
    check_error(data, "wan.0.latency", "unknown field")


def test_bad_congestion_control_lists_allowed() -> None:
    data = base()
    data["tcp"] = {"congestion_control": "westwood"}
    check_error(data, "tcp.congestion_control", "'cubic'", "'bbr'", "westwood")


def test_disconnected_dc() -> None:
    data = base()
    data["dcs"].append({"name": "dc3", "hosts": 1})
    check_error(data, "dc3 have no WAN path")


def test_duplicate_link_and_self_link() -> None:
    data = base()
    data["wan"].append({"between": ["dc2", "dc1"], "rate": "1Gbit", "delay": "1ms"})
    check_error(data, "second link between dc2 and dc1")
    data = base()
    data["wan"][0]["between"] = ["dc1", "dc1"]
    check_error(data, "two different DCs")


def test_bad_dc_and_host_names() -> None:
    data = base()
    data["dcs"][0]["name"] = "Datacenter-One"
    check_error(data, "dcs.0.name")
    data = base()
    data["dcs"][1]["hosts"] = ["a", "a"]
    check_error(data, "dcs.1.hosts", "unique")


def test_missing_file_lists_shipped(tmp_path: Path) -> None:
    with pytest.raises(TopologyError, match="no such topology file.*2dc.yaml"):
        load_topology(tmp_path / "nope.yaml")


def test_invalid_yaml(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("name: [unclosed\n")
    with pytest.raises(TopologyError, match="not valid YAML"):
        load_topology(path)
    path.write_text("- just a list\n")
    with pytest.raises(TopologyError, match="must be a YAML mapping"):
        load_topology(path)


def test_routes_follow_lowest_latency() -> None:
    topo = load_topology(TOPOLOGIES_DIR / "3dc-triangle.yaml")
    assert topo.routes()[("dc1", "dc3")] == ["dc1", "dc2", "dc3"]
    assert topo.path_delay("dc1", "dc3") == pytest.approx(0.025)


def test_changes_must_be_ordered() -> None:
    data = base()
    data["wan"][0]["changes"] = [{"at": "10s", "rate": "500Mbit"}, {"at": "5s", "delay": "50ms"}]
    check_error(data, "increasing 'at' order")


def test_mahimahi_trace(tmp_path: Path) -> None:
    # 2 opportunities per ms for 100 ms, then 1 per ms: 24 Mbit/s then 12 Mbit/s.
    stamps = [ms for ms in range(100) for _ in range(2)] + list(range(100, 200))
    (tmp_path / "link.trace").write_text("\n".join(map(str, stamps)) + "\n")
    data = base()
    data["wan"][0]["trace"] = "link.trace"
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump(data))
    changes = load_topology(path).wan[0].changes
    assert changes[0].rate == pytest.approx(24e6)
    assert changes[-1].rate == pytest.approx(12e6, rel=0.02)
    (tmp_path / "link.trace").write_text("1\nbanana\n")
    with pytest.raises(TopologyError, match=r"link.trace:2: .*'banana'"):
        load_topology(path)
