"""A placement is computed once per variant and passed on (testbed/run/variants.py
`place_variants`): with ``runner.atlas_placement: search`` the search (a time budget:
two searches can differ) is never repeated between the preflight, the calibration's
choice of paths and the variants' plans, so the run times the paths it runs on."""

from __future__ import annotations

from pathlib import Path

import pytest

import testbed.run.variants as variants
from testbed.run.calibration import path_uses
from testbed.run.preflight import preflight
from testbed.run.scenario import load_scenario
from testbed.run.variants import place_variants, plan_variants, run_variants

ROOT = Path(__file__).resolve().parents[3]
SCENARIO = ROOT / "scenarios" / "atlas-search-3dc.yaml"


@pytest.fixture
def searches(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The variants each placement search was made for, in order (none remembered from before)."""
    made: list[str] = []
    real = variants.search_placement

    def counted(*args, **kwargs):
        made.append(args[2].name)
        return real(*args, **kwargs)

    monkeypatch.setattr(variants, "search_placement", counted)
    monkeypatch.setattr(variants, "_searched", {})
    return made


def test_the_run_searches_once_per_variant_and_plans_on_that_placement(searches: list[str],
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    scenario, _ = load_scenario(SCENARIO, {"runner.local": True})
    runs = run_variants(scenario, ["baseline", "atlas", "atlas+bubbletea"])
    placements = place_variants(scenario, runs)
    assert list(placements) == ["atlas", "baseline"]  # by registry name: a BubbleTea twin shares its variant's
    uses = path_uses(scenario, placements)  # the paths the calibration times
    assert searches == ["atlas"]
    monkeypatch.setattr(variants, "_searched", {})  # nothing remembered: another search would be counted
    setups = plan_variants(runs, scenario, scenario.workload, scenario.workload_dir, None, None, True, placements)
    assert searches == ["atlas"]
    for name in ("atlas", "atlas+bubbletea"):
        setup = setups[name]
        assert not isinstance(setup, Exception) and setup.placement is placements["atlas"]
    (atlas_path,) = [dcs for dcs, use in uses.items() if "atlas" in use.channels]
    assert placements["atlas"].strategy == "search"
    assert set(atlas_path) == set(placements["atlas"].stage_dc[0])  # the calibration times the searched placement


def test_the_preflight_and_the_run_share_one_search(searches: list[str]) -> None:
    scenario, _ = load_scenario(SCENARIO, {"runner.local": True})
    assert preflight(scenario, ["atlas"], machine=False, memory=False) == []
    assert searches == ["atlas"]
    place_variants(scenario, run_variants(scenario, ["atlas"]))
    assert searches == ["atlas"]
