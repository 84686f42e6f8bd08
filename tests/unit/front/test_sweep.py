"""Sweep files: expansion into points, and every malformed sweep refused before anything
runs, with the file, the field and what is allowed."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sweep_fakes import write_base, write_sweep  # noqa: E402

from testbed.sweep import (  # noqa: E402
    RangeSpec,
    SweepError,
    config_hash,
    default_labels,
    load_sweep,
    range_values,
    sweep_size_text,
)

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    write_base(tmp_path)
    return tmp_path


# ---------------------------------------------------------------- expansion


def test_grid_points_ids_and_resolved_values(folder: Path) -> None:
    path = write_sweep(folder, {"parameters": {
        "topology.wan.0.delay": ["5ms", "50ms"], "transport.streams": [1, 8]}})
    plan = load_sweep(path)
    assert [p.id for p in plan.points] == [
        "p001-delay=5ms-streams=1", "p002-delay=5ms-streams=8",
        "p003-delay=50ms-streams=1", "p004-delay=50ms-streams=8",
    ]
    third = plan.points[2]
    assert third.values == {"topology.wan.0.delay": "50ms", "transport.streams": 1}
    assert third.resolved["topology"]["wan"][0]["delay"] == "50ms"
    assert third.resolved["transport"]["streams"] == 1
    assert third.seed == 1
    assert sweep_size_text(plan) == "4 points (2 delay x 2 streams)"


def test_zip_pairs_values(folder: Path) -> None:
    path = write_sweep(folder, {"mode": "zip", "parameters": {
        "topology.wan.0.delay": ["5ms", "50ms", "100ms"], "topology.wan.0.rate": ["1Gbit", "500Mbit", "100Mbit"]}})
    plan = load_sweep(path)
    assert [p.id for p in plan.points] == [
        "p001-delay=5ms-rate=1Gbit", "p002-delay=50ms-rate=500Mbit", "p003-delay=100ms-rate=100Mbit"]


def test_ranges_keep_their_unit() -> None:
    spec = RangeSpec.model_validate({"from": "10ms", "to": "200ms", "steps": 4})
    assert range_values(spec, "s") == ["10ms", "73.3333ms", "136.667ms", "200ms"]
    spec = RangeSpec.model_validate({"from": 1, "to": 16, "steps": 5, "scale": "log"})
    assert range_values(spec, "s") == [1, 2, 4, 8, 16]
    spec = RangeSpec.model_validate({"from": 0.5, "to": 1, "steps": 3})
    assert range_values(spec, "s") == [0.5, 0.75, 1.0]


def test_range_and_values_forms_in_a_file(folder: Path) -> None:
    path = write_sweep(folder, {"parameters": {
        "topology.wan.0.delay": {"from": "5ms", "to": "100ms", "steps": 3},
        "transport.streams": {"values": [2, 4], "label": "n"}}})
    plan = load_sweep(path)
    assert plan.points[0].id == "p001-delay=5ms-n=2"
    assert plan.points[-1].id == "p006-delay=100ms-n=4"
    assert plan.points[2].values["topology.wan.0.delay"] == "52.5ms"


def test_labels_grow_until_unique() -> None:
    labels = default_labels(["topology.wan.0.delay", "topology.wan.1.delay", "transport.streams"], {})
    assert labels == {"topology.wan.0.delay": "wan.0.delay", "topology.wan.1.delay": "wan.1.delay",
                      "transport.streams": "streams"}
    assert default_labels(["topology.wan.*.delay"], {}) == {"topology.wan.*.delay": "delay"}


def test_repeat_gives_seeds(folder: Path) -> None:
    plan = load_sweep(write_sweep(folder, {"parameters": {"transport.streams": [1, 8]}, "repeat": 2}))
    assert [(p.id, p.seed) for p in plan.points] == [
        ("p001-streams=1-seed=1", 1), ("p002-streams=1-seed=2", 2),
        ("p003-streams=8-seed=1", 1), ("p004-streams=8-seed=2", 2)]
    assert plan.points[1].resolved["seed"] == 2
    plan = load_sweep(write_sweep(folder, {"parameters": {"transport.streams": [1]}, "repeat": [7, 42]}))
    assert [p.seed for p in plan.points] == [7, 42]


def test_set_and_cli_overrides_apply_to_every_point(folder: Path) -> None:
    path = write_sweep(folder, {"parameters": {"transport.streams": [1, 8]},
                                "set": {"topology.wan.0.rate": "500Mbit"}})
    plan = load_sweep(path, {"bubbletea.requests.rate": 3})
    for point in plan.points:
        assert point.resolved["topology"]["wan"][0]["rate"] == "500Mbit"
        assert point.resolved["bubbletea"]["requests"]["rate"] == 3


def test_wildcard_sets_every_link(folder: Path) -> None:
    path = write_sweep(folder, {"base": "tri.yaml", "parameters": {"topology.wan.*.delay": ["10ms", "40ms"]}})
    (folder / "tri.yaml").write_text(yaml.safe_dump({
        "name": "tri", "topology": str(ROOT / "topologies" / "3dc-triangle.yaml"), "workload": "wl.yaml"}))
    plan = load_sweep(path)
    links = plan.points[1].resolved["topology"]["wan"]
    assert len(links) == 3 and {link["delay"] for link in links} == {"40ms"}
    assert plan.points[1].id == "p002-delay=40ms"


def test_topology_files_can_be_swept(folder: Path) -> None:
    topos = [str(ROOT / "topologies" / f) for f in ("2dc.yaml", "3dc-triangle.yaml")]
    plan = load_sweep(write_sweep(folder, {"parameters": {"topology": topos}}))
    assert [p.id for p in plan.points] == ["p001-topology=2dc", "p002-topology=3dc-triangle"]
    assert len(plan.points[1].resolved["topology"]["dcs"]) == 3


def test_config_hash_tracks_the_resolved_scenario(folder: Path) -> None:
    plan = load_sweep(write_sweep(folder, {"parameters": {"transport.streams": [1, 8]}}))
    a, b = plan.points
    assert a.config_hash != b.config_hash
    assert config_hash(a.resolved) == a.config_hash
    again = load_sweep(folder / "sweep.yaml")
    assert [p.config_hash for p in again.points] == [a.config_hash, b.config_hash]


def test_shipped_sweep_files_expand_on_a_stand_in_base(folder: Path) -> None:
    """The shipped sweeps' paths and values are valid against a real scenario model."""
    counts = {"sweep-rtt": 4, "sweep-bandwidth": 4, "sweep-streams": 5}
    for name, count in counts.items():
        data = yaml.safe_load((ROOT / "scenarios" / f"{name}.yaml").read_text())
        assert data["base"] == "atlas-2dc.yaml"
        data["base"] = str(folder / "base.yaml")
        path = folder / f"{name}.yaml"
        path.write_text(yaml.safe_dump(data))
        plan = load_sweep(path)
        assert len(plan.points) == count, name
    rtts = [2 * float(v.removesuffix("ms")) for v in yaml.safe_load(
        (ROOT / "scenarios" / "sweep-rtt.yaml").read_text())["parameters"]["topology.wan.0.delay"]]
    assert len(rtts) >= 4 and min(rtts) == 10 and max(rtts) == 200


SHIPPED_SWEEPS = sorted(p.stem for p in (ROOT / "scenarios").glob("sweep-*.yaml"))


@pytest.mark.parametrize("name", SHIPPED_SWEEPS)
def test_shipped_sweeps_load_on_their_base(name: str) -> None:
    """Every shipped sweep expands on its own base into valid points, named as its file."""
    plan = load_sweep(ROOT / "scenarios" / f"{name}.yaml")
    assert plan.points and plan.name == name


def test_the_paper_sweep_uses_the_swept_link_at_every_point() -> None:
    """In sweep-paper.yaml, big-mid (the swept link) is the route between big and mid at
    every point: big-small-mid stays longer than the longest delay swept."""
    from testbed.run.scenario import validate_scenario
    from testbed_core.topology import shortest_path

    plan = load_sweep(ROOT / "scenarios" / "sweep-paper.yaml")
    assert len(plan.points) == 8
    for point in plan.points:
        topo = validate_scenario(point.resolved).topology
        assert sorted(topo.wan[0].between) == ["big", "mid"]
        assert shortest_path("big", "mid", topo.wan) == ["big", "mid"], point.id


# ---------------------------------------------------------------- refusals


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"parameters": {"topology.wan.0.dela": ["5ms"]}},
         "sweep.yaml: parameters: topology.wan.0.dela: unknown parameter 'dela' (fields here: between, changes, delay"),
        ({"parameters": {"transport.strems": [1]}},
         "unknown parameter 'strems' (fields here: chunk, congestion, pacing, streams)"),
        ({"parameters": {"topology.wan.3.delay": ["5ms"]}},
         "topology.wan.3: index '3' out of range (the list has 1 items, 0..0)"),
        ({"parameters": {}},
         "sweep.yaml: invalid sweep (1 problem):\n  - parameters: the grid is empty: give at least one parameter"),
        ({"parameters": {"transport.streams": []}},
         "sweep.yaml: parameters.transport.streams: an empty list of values; give at least one"),
        ({"parameters": {"transport.streams": 8}},
         "parameters.transport.streams: expected a list of values, {values: [...]} or a range "
         "{from: 10ms, to: 200ms, steps: 4}; got 8 (a single fixed value belongs under 'set:')"),
        ({"parameters": {"transport.streams": {"from": 1, "to": 8, "stepz": 4}}},
         "  - parameters.transport.streams.stepz: unknown field"),
        ({"parameters": {"transport.streams": {"from": 1, "to": 8, "steps": 1}}},
         "  - parameters.transport.streams.steps: Input should be greater than or equal to 2"),
        ({"parameters": {"topology.wan.0.delay": {"from": "10ms", "to": "1s", "steps": 3}}},
         "parameters.topology.wan.0.delay: from ('10ms') and to ('1s') must be written in the same unit"),
        ({"parameters": {"transport.streams": {"from": 0, "to": 8, "steps": 3, "scale": "log"}}},
         "scale log needs from and to above zero"),
        ({"parameters": {"transport.streams": {"value": [1]}}},
         "expected a list of values, {values: [...]} or a range {from: 10ms, to: 200ms, steps: 4}; "
         "got a mapping with keys value"),
        ({"parameters": {"transport.streams": [1]}, "mode": "cartesian"},
         "  - mode: Input should be 'grid' or 'zip' (got 'cartesian')"),
        ({"parameters": {"transport.streams": [1]}, "paramters": {}},
         "  - paramters: unknown field (check the spelling; the sweep format: docs/reference/formats/sweep.md)"),
        ({"parameters": {"transport.streams": [1]}, "repeat": 0},
         "  - repeat: repeat must be a count of at least 1 or a list of seeds, got 0"),
        ({"parameters": {"seed": [1, 2]}, "repeat": 2},
         "repeat: cannot be combined with a swept 'seed' parameter"),
        ({"name": "has space", "parameters": {"transport.streams": [1]}},
         "  - name: String should match pattern"),
        ({"mode": "zip", "parameters": {"transport.streams": [1, 2], "topology.wan.0.delay": ["5ms"]}},
         "mode: zip pairs the i-th values of every parameter, so all lists must be equally long; "
         "got transport.streams: 2, topology.wan.0.delay: 1 (or use mode: grid)"),
        ({"parameters": {"transport.streams": [1]}, "set": {"transport.streams": 2}},
         "sweep.yaml: set: transport.streams is also a swept parameter; fix it in one place only"),
        ({"parameters": {"transport.streams": [1]}, "set": {"bubbletea.enbled": True}},
         "sweep.yaml: set: bubbletea.enbled: unknown parameter 'enbled'"),
        ({"parameters": {"transport.streams": [1]}, "base": "missing.yaml"},
         "sweep.yaml: base: "),
        ({"parameters": {"topology": ["nowhere.yaml"]}},
         "parameters.topology: "),
    ],
)
def test_malformed_sweeps_are_refused(folder: Path, body: dict, message: str) -> None:
    path = write_sweep(folder, body)
    with pytest.raises(SweepError) as info:
        load_sweep(path)
    assert message in str(info.value)
    assert str(path) in str(info.value)


def test_missing_base_names_the_file(folder: Path) -> None:
    path = write_sweep(folder, {"parameters": {"transport.streams": [1]}, "base": "missing.yaml"})
    with pytest.raises(SweepError, match=r"sweep.yaml: base: .*missing.yaml: no such scenario file"):
        load_sweep(path)


def test_wrong_type_names_parameter_value_and_field(folder: Path) -> None:
    path = write_sweep(folder, {"parameters": {"transport.streams": [4, "lots"]}})
    with pytest.raises(SweepError) as info:
        load_sweep(path)
    text = str(info.value)
    assert f"{path}: parameters.transport.streams: value 'lots' is not a valid scenario:" in text
    assert "invalid scenario" in text and "transport.streams" in text


def test_bad_unit_value_names_topology_field(folder: Path) -> None:
    path = write_sweep(folder, {"parameters": {"topology.wan.0.delay": ["5ms", "fast"]}})
    with pytest.raises(SweepError) as info:
        load_sweep(path)
    text = str(info.value)
    assert "parameters.topology.wan.0.delay: value 'fast' is not a valid scenario" in text
    assert "wan.0.delay: 'fast' is not a duration" in text


def test_invalid_combination_names_the_point(folder: Path) -> None:
    # layers=2 is fine with pp=2, pp=4 is fine with layers=4; layers=2 with pp=4 is not.
    path = write_sweep(folder, {"parameters": {
        "workload.model.layers": [2, 4], "workload.parallelism.pp": [2, 4]}})
    with pytest.raises(SweepError) as info:
        load_sweep(path)
    text = str(info.value)
    assert "point p002-layers=2-pp=4 (workload.model.layers=2, workload.parallelism.pp=4) is not a valid scenario" in text
    assert "model.layers (2) must be at least pp x chunks (4)" in text


def test_cli_set_with_unknown_path_is_refused(folder: Path) -> None:
    path = write_sweep(folder, {"parameters": {"transport.streams": [1]}})
    with pytest.raises(SweepError, match=r"--set: workload.iteratons: unknown parameter 'iteratons'"):
        load_sweep(path, {"workload.iteratons": 2})
    with pytest.raises(SweepError, match=r"--set: transport.streams is also a swept parameter"):
        load_sweep(path, {"transport.streams": 2})
