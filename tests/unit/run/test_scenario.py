"""Scenario files and `--set` overrides: typos are refused before anything is built."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from testbed.run.scenario import (
    ScenarioError,
    apply_override,
    load_scenario,
    parse_set_options,
    resolve_scenario,
    validate_scenario,
)
from testbed_core.workload import Workload

WORKLOAD = Path(__file__).resolve().parents[3] / "scenarios" / "workloads" / "tiny.yaml"

TOPO = {
    "name": "t",
    "dcs": [{"name": "dc1", "hosts": 2}, {"name": "dc2", "hosts": 2}],
    "wan": [{"between": ["dc1", "dc2"], "rate": "1Gbit", "delay": "25ms"}],
}


@pytest.fixture
def scenario_file(tmp_path: Path) -> Path:
    (tmp_path / "topo.yaml").write_text(yaml.safe_dump(TOPO))
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump({"name": "s", "topology": "topo.yaml", "workload": str(WORKLOAD)}))
    return path


def test_resolve_inlines_files(scenario_file: Path) -> None:
    data = resolve_scenario(scenario_file)
    assert data["topology"]["name"] == "t"
    assert data["topology"]["_source"].endswith("topo.yaml")
    assert data["source"] == str(scenario_file)


def test_overrides_reach_topology(scenario_file: Path) -> None:
    scenario, data = load_scenario(scenario_file, parse_set_options(["topology.wan.0.delay=50ms", "transport.streams=4"]))
    assert scenario.topology.wan[0].delay == pytest.approx(0.05)
    assert scenario.transport.streams == 4
    assert data["topology"]["wan"][0]["delay"] == "50ms"


def test_override_may_set_a_defaulted_field(scenario_file: Path) -> None:
    scenario, _ = load_scenario(scenario_file, {"topology.wan.0.jitter": "2ms", "bubbletea.requests.rate": 9})
    assert scenario.topology.wan[0].jitter == pytest.approx(0.002)
    assert scenario.bubbletea.requests.rate == 9


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("topology.wann.0.delay", "unknown parameter 'wann' (fields here: addressing, dcs"),
        ("topology.wan.4.delay", "index '4' out of range (the list has 1 items"),
        ("transport.strems", "unknown parameter 'strems' (fields here: chunk, congestion, pacing, streams)"),
        ("topology.name.x", "topology.name is a value, not a section"),
        ("a..b", "is not a parameter path"),
    ],
)
def test_bad_override_paths(scenario_file: Path, path: str, message: str) -> None:
    data = resolve_scenario(scenario_file)
    with pytest.raises(ScenarioError) as info:
        apply_override(data, path, 1)
    assert message in str(info.value)


def test_wrong_type_names_field(scenario_file: Path) -> None:
    with pytest.raises(ScenarioError, match=r"s.yaml: invalid scenario.*\n  - transport.streams"):
        load_scenario(scenario_file, {"transport.streams": "lots"})


def test_bad_topology_inside_scenario_is_reported(scenario_file: Path) -> None:
    with pytest.raises(ScenarioError, match=r"topo.yaml: invalid topology.*\n  - wan.0.rate: 'fast' is not a rate"):
        load_scenario(scenario_file, {"topology.wan.0.rate": "fast"})


def test_missing_topology_and_unknown_decode_host(tmp_path: Path, scenario_file: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump({"name": "x", "workload": {}}))
    with pytest.raises(ScenarioError, match="topology: required field is missing"):
        resolve_scenario(path)
    data = resolve_scenario(scenario_file)
    data["bubbletea"] = {"decode_host": "dc9-h1"}
    with pytest.raises(ScenarioError, match=r"decode_host: unknown host 'dc9-h1' \(hosts: dc1-h1"):
        validate_scenario(data)


def test_workload_fields_by_model(scenario_file: Path) -> None:
    # `warmup` need not be written in the workload file to be overridable.
    scenario, data = load_scenario(scenario_file, {"workload.warmup": 0, "workload.parallelism.dp": 1})
    assert data["workload"]["warmup"] == 0
    with pytest.raises(ScenarioError, match="unknown parameter 'iters'.*iterations"):
        load_scenario(scenario_file, {"workload.iters": 3})
    with pytest.raises(ScenarioError, match=r"invalid workload.*\n  - workload.parallelism.dp"):
        load_scenario(scenario_file, {"workload.parallelism.dp": 0})


def test_workload_is_typed_once_with_its_file(scenario_file: Path, tmp_path: Path) -> None:
    scenario, _ = load_scenario(scenario_file, {"workload.parallelism.dp": 1})
    assert isinstance(scenario.workload, Workload) and scenario.workload.parallelism.dp == 1
    assert scenario.workload_source == str(WORKLOAD) and scenario.workload_dir == str(WORKLOAD.parent)
    data = resolve_scenario(scenario_file)  # an inline workload has no file, hence no folder
    data["workload"] = {k: v for k, v in data["workload"].items() if k != "_source"}
    inline = validate_scenario(data)
    assert inline.workload == load_scenario(scenario_file)[0].workload
    assert inline.workload_source is None and inline.workload_dir is None
    with pytest.raises(ScenarioError, match=r"^[^\n]*tiny.yaml: invalid workload"):  # the workload file, not s.yaml
        load_scenario(scenario_file, {"workload.gpu.efficiency": 7})


def test_variants_come_from_the_registry(scenario_file: Path) -> None:
    scenario, _ = load_scenario(scenario_file)
    assert scenario.variants == ["baseline", "multi-tcp", "atlas"]
    assert load_scenario(scenario_file, {"variants": ["dp-across-dc", "atlas"]})[0].variants == ["dp-across-dc",
                                                                                                   "atlas"]
    with pytest.raises(ScenarioError, match=r"s.yaml: invalid scenario.*\n  - variants: unknown variant 'turbo' "
                                            r"\(allowed: baseline, multi-tcp, atlas, dp-across-dc, torch-gloo\)"):
        load_scenario(scenario_file, {"variants": ["atlas", "turbo"]})


def test_set_option_syntax() -> None:
    assert parse_set_options(["a.b=8", "c=50ms", "d=[1, 2]"]) == {"a.b": 8, "c": "50ms", "d": [1, 2]}
    with pytest.raises(ScenarioError, match="expected path=value"):
        parse_set_options(["nonsense"])


def test_base_port_is_auto_or_leaves_room_for_the_run(scenario_file: Path) -> None:
    scenario, _ = load_scenario(scenario_file)
    assert scenario.runner.base_port == "auto"
    assert load_scenario(scenario_file, {"runner.base_port": 40000})[0].runner.base_port == 40000
    with pytest.raises(ScenarioError, match=r"runner.base_port.*between 1024 and 54000 \(the run uses 6000 ports"):
        load_scenario(scenario_file, {"runner.base_port": 58000})


def test_local_runs_get_a_free_port_block_of_their_own(scenario_file: Path) -> None:
    """Local mode shares one network stack: each run takes a block nobody listens on,
    so two runs (or test workers) on one machine never collide; emulated runs keep
    29500 (every host has its own namespace)."""
    import socket

    from testbed.progress import Progress
    from testbed.run.common import RunnerError
    from testbed.run.network import with_ports
    from testbed.run.ports import PORTS_CHECKED, PortPlan, free_port_block

    class Seq:  # the candidates free_port_block draws, in order
        def __init__(self, *values: int) -> None:
            self.values = iter(values)

        def randrange(self, lo: int, hi: int) -> int:
            return next(self.values)

    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    busy = taken.getsockname()[1]
    try:
        # a block whose first range starts on the busy port is skipped for the next candidate
        base = free_port_block(5000, rng=Seq(busy, busy - 3000, *range(20000, 55000, 997)))
        assert all(not (r.first <= busy < r.first + PORTS_CHECKED) for r in PortPlan(base).ranges())
        assert base not in (busy, busy - 3000)
        with pytest.raises(RunnerError, match="no free block of ports on 127.0.0.1 after 1 tries"):
            free_port_block(5000, attempts=1, rng=Seq(busy))
    finally:
        taken.close()
    local, _ = load_scenario(scenario_file, {"runner.local": True})
    a = with_ports(local, Progress(enabled=False)).runner.base_port
    b = with_ports(local, Progress(enabled=False)).runner.base_port
    assert isinstance(a, int) and 20000 <= a < 55000 and isinstance(b, int)
    emulated, _ = load_scenario(scenario_file)
    assert with_ports(emulated, Progress(enabled=False)).runner.base_port == 29500
    fixed, _ = load_scenario(scenario_file, {"runner.local": True, "runner.base_port": 40000})
    assert with_ports(fixed, Progress(enabled=False)).runner.base_port == 40000
