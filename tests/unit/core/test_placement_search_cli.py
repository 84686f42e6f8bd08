"""`placement: search` at the front: `testbed plan --search` (heuristic and search side
by side, the budget stated, its errors) and `testbed run`'s `runner.atlas_placement`
(the atlas variant placed by the search, the others untouched)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from testbed.cli import main
from testbed.commands.plan import SEARCH_DEFAULTS
from testbed.run.scenario import ScenarioError, load_scenario
from testbed.run.variants import plan_variant
from testbed_core.planning.search import DEFAULT_CANDIDATES, DEFAULT_SECONDS

ROOT = Path(__file__).resolve().parents[3]
TOPO = str(ROOT / "topologies" / "3dc-slowlink.yaml")
WL = str(ROOT / "scenarios" / "workloads" / "gpt-350m-pp4.yaml")
SCENARIO = ROOT / "scenarios" / "atlas-search-3dc.yaml"


def plan(*args: str):
    return CliRunner().invoke(main, ["plan", "--topology", TOPO, "--workload", WL, *args])


def test_plan_shows_heuristic_and_search_side_by_side() -> None:
    res = plan("--search", "--variants", "baseline,atlas")
    assert res.exit_code == 0, res.output
    out = res.output
    assert "Placement search (used by atlas:search):\n  near: stages 0  hosts near-h1\n" in out
    assert "\n  atlas:search search " in out and "\n  atlas        atlas " in out
    assert "Placement search for atlas: scored 18 of 18 candidates in " in out
    assert "(budget: at most 1000 candidates or 30 s); scored by the fast predictor" in out
    assert "heuristic (largest DC first)    big:0-2 far:3 " in out
    assert "search (fastest predicted)      near:0 big:1-3 " in out and "x the heuristic's speed" in out
    assert "baseline:search" not in out  # only variants placed by Atlas's heuristic are searched


def test_plan_json_has_the_search() -> None:
    res = plan("--search", "--variants", "atlas", "--json", "--search-candidates", "5")
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    found = doc["searches"]["atlas:search"]
    assert found["evaluated"] == 5 and found["space"] == 18 and found["stopped_by"] == "candidates"
    assert found["budget"] == {"candidates": 5, "seconds": 30.0}
    assert doc["variants"]["atlas:search"]["placement"]["strategy"] == "search"
    assert doc["variants"]["atlas:search"]["predicted_iteration_time_s"] == \
        pytest.approx(found["predicted_iteration_time_s"])


def test_plan_without_search_is_unchanged() -> None:
    res = plan("--variants", "atlas")
    assert res.exit_code == 0, res.output
    assert "search" not in res.output


def test_plan_search_budget_needs_search() -> None:
    res = plan("--search-seconds", "2")
    assert res.exit_code == 2
    assert "--search-candidates and --search-seconds bound the search: add --search" in res.output
    res = plan("--search", "--search-candidates", "0")
    assert res.exit_code == 2 and "--search-candidates" in res.output and "0 is not in the range" in res.output


def test_plan_help_states_the_search_defaults() -> None:
    assert SEARCH_DEFAULTS == (DEFAULT_CANDIDATES, DEFAULT_SECONDS)


def test_run_places_atlas_by_search_and_the_baseline_by_the_heuristic() -> None:
    scenario, _ = load_scenario(SCENARIO)
    atlas = plan_variant("atlas", scenario, scenario.workload, scenario.workload_dir, None, None)
    base = plan_variant("baseline", scenario, scenario.workload, scenario.workload_dir, None, None)
    assert atlas.placement.strategy == "search" and atlas.variant.placement == "search"
    assert atlas.placement.stage_dc[0] == ("near", "big", "big", "big")
    assert base.placement.stage_dc[0] == ("big", "big", "big", "far")
    assert all(h for h in atlas.placement.hosts.values())
    # the shipped scenario is built to show the search: predicted at least 20% faster
    assert atlas.prediction.iteration_time_s * 1.2 <= base.prediction.iteration_time_s


def test_run_default_is_the_heuristic(tmp_path: Path) -> None:
    data = yaml.safe_load(SCENARIO.read_text())
    data["runner"].pop("atlas_placement")
    data["topology"] = TOPO
    data["workload"] = WL
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(data))
    scenario, _ = load_scenario(path)
    assert scenario.runner.atlas_placement == "heuristic"
    atlas = plan_variant("atlas", scenario, scenario.workload, scenario.workload_dir, None, None)
    assert atlas.placement.strategy == "atlas" and atlas.placement.stage_dc[0] == ("big", "big", "big", "far")


def test_run_refuses_an_unknown_atlas_placement() -> None:
    with pytest.raises(ScenarioError, match=r"runner\.atlas_placement.*'heuristic' or 'search'"):
        load_scenario(SCENARIO, {"runner.atlas_placement": "best"})
