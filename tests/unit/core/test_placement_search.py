"""Network-aware placement (testbed_core/planning/search.py): the candidates, the
budget, the choice against Atlas's heuristic on the shipped slow-link topology, and
every error a user can reach with its message."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from testbed_core.planning.placement import PlacementError, place, strategy_for
from testbed_core.planning.prediction import Variant, predict
from testbed_core.planning.search import (
    SearchBudget,
    candidate_rows,
    count_candidates,
    describe_row,
    search_placement,
)
from testbed_core.topology import load_topology
from testbed_core.variants import REGISTRY
from testbed_core.whatif.predict import fast_predict
from testbed_core.workload import load_workload

ROOT = Path(__file__).resolve().parents[3]
SLOW = ROOT / "topologies" / "3dc-slowlink.yaml"
WL = ROOT / "scenarios" / "workloads" / "gpt-350m-pp4.yaml"
ATLAS = Variant.of(REGISTRY["atlas"], 8)


def _valid(row: tuple[str, ...], caps: dict[str, int]) -> bool:
    blocks = [(dc, len(list(g))) for dc, g in itertools.groupby(row)]
    names = [dc for dc, _ in blocks]
    return len(names) == len(set(names)) and all(n <= caps.get(dc, 0) for dc, n in blocks)


@pytest.mark.parametrize(("free", "pp", "dp"), [
    ({"a": 3, "b": 2, "c": 1}, 4, 1),
    ({"a": 8, "b": 8, "c": 8, "d": 8}, 6, 1),
    ({"a": 8, "b": 6, "c": 6, "d": 4}, 8, 2),
    ({"a": 1, "b": 1}, 2, 1),
    ({"a": 5, "b": 0, "c": 4}, 3, 2),
])
def test_candidates_are_every_block_assignment_once_and_counted(free, pp, dp) -> None:
    rows = list(candidate_rows(free, pp, dp))
    caps = {dc: n // dp for dc, n in free.items()}
    assert len(rows) == len(set(rows)) == count_candidates(free, pp, dp)
    assert all(len(r) == pp and _valid(r, caps) for r in rows)
    # brute force: every row over the DCs that is a valid block assignment
    brute = [r for r in itertools.product(sorted(free), repeat=pp) if _valid(r, caps)]
    assert set(rows) == set(brute)
    assert place(free, pp, dp, strategy="atlas").stage_dc[0] in rows


def test_no_candidate_fits_gives_the_heuristics_shortfall() -> None:
    topo, wl = load_topology(SLOW), load_workload(WL)
    assert count_candidates({"big": 1, "far": 1, "near": 1}, 4) == 0
    with pytest.raises(PlacementError, match=r"only 3 of 4 stages fit, short by 1 stages"):
        search_placement(topo, wl, ATLAS, predictor=fast_predict, free={"big": 1, "far": 1, "near": 1})


def test_search_avoids_the_slow_link_the_heuristic_takes() -> None:
    topo, wl = load_topology(SLOW), load_workload(WL)
    # a budget no machine's speed reaches (the first call after a kernel change compiles it): the whole space
    found = search_placement(topo, wl, ATLAS, predictor=fast_predict, budget=SearchBudget(seconds=3600))
    assert found.heuristic.stage_dc[0] == ("big", "big", "big", "far")  # largest DC first: big, then far
    assert "far" not in found.placement.stage_dc[0] and "near" in found.placement.stage_dc[0]
    assert found.placement.strategy == "search"
    assert [h for (_, s), h in sorted(found.placement.hosts.items())] == \
        [("near-h1",), ("big-h1",), ("big-h2",), ("big-h3",)]
    assert found.evaluated == found.space == 18 and found.stopped_by is None
    assert found.speedup is not None and found.speedup >= 1.2  # the floor, as predicted
    assert found.ranked[0] == (found.placement.stage_dc[0], found.iteration_time_s)
    assert [t for _, t in found.ranked] == sorted(t for _, t in found.ranked)
    # the chosen placement, predicted again on its own, is what the search scored
    again = fast_predict(topo, wl, ATLAS, placement=found.placement)
    assert again.iteration_time_s == pytest.approx(found.iteration_time_s)
    doc = found.to_json(topo)
    assert doc["heuristic_stage_dc"] == ["big", "big", "big", "far"] and doc["space"] == 18


def test_exact_and_fast_predictor_choose_the_same() -> None:
    topo, wl = load_topology(SLOW), load_workload(WL)
    fast = search_placement(topo, wl, ATLAS, predictor=fast_predict)
    exact = search_placement(topo, wl, ATLAS, predictor=predict)
    assert exact.placement.stage_dc == fast.placement.stage_dc
    assert exact.iteration_time_s == pytest.approx(fast.iteration_time_s, rel=0.02)


def test_where_the_heuristic_is_best_the_search_keeps_it() -> None:
    topo, wl = load_topology(SLOW), load_workload(WL)
    # the slow DC made the smallest: largest-first now takes big and near
    found = search_placement(topo, wl, ATLAS, predictor=fast_predict, free={"big": 3, "far": 1, "near": 2})
    assert found.heuristic.stage_dc[0] == ("big", "big", "big", "near")
    assert found.speedup is not None and found.speedup >= 1.0
    assert found.iteration_time_s <= found.heuristic_time_s


def test_candidate_budget_stops_the_search_and_says_so() -> None:
    topo, wl = load_topology(SLOW), load_workload(WL)
    found = search_placement(topo, wl, ATLAS, predictor=fast_predict, budget=SearchBudget(candidates=3))
    assert found.evaluated == 3 and found.stopped_by == "candidates"
    assert found.budget_text().startswith("scored 3 of 18 candidates in ")
    assert "budget: at most 3 candidates or 30 s; stopped by the candidates budget, fastest so far kept" \
        in found.budget_text()


def test_time_budget_scores_the_heuristic_then_stops() -> None:
    topo, wl = load_topology(SLOW), load_workload(WL)
    ticks = itertools.count(0.0, 1.0)  # every clock reading one second later
    found = search_placement(topo, wl, ATLAS, predictor=fast_predict, budget=SearchBudget(seconds=0.5),
                             clock=lambda: next(ticks))
    assert found.evaluated == 1 and found.stopped_by == "seconds"
    assert found.placement.stage_dc == found.heuristic.stage_dc and found.speedup == 1.0


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"candidates": 0}, "search budget: candidates must be a whole number >= 1, got 0"),
    ({"seconds": 0}, "search budget: seconds must be a finite number > 0, got 0"),
    ({"seconds": float("inf")}, "search budget: seconds must be a finite number > 0, got inf"),
])
def test_bad_budget_is_refused(kwargs, message) -> None:
    with pytest.raises(PlacementError, match=message):
        SearchBudget(**kwargs)


def test_place_refuses_search_and_says_where_it_runs() -> None:
    with pytest.raises(PlacementError, match=r"placement 'search' scores candidates with the predictor: run it "
                                             r"with testbed_core.planning.search.search_placement"):
        place({"a": 2, "b": 2}, 2, strategy="search")
    with pytest.raises(PlacementError, match=r"unknown placement strategy 'best' .*or search through search_placement"):
        place({"a": 2, "b": 2}, 2, strategy="best")


def test_strategy_for_atlas_placement() -> None:
    assert strategy_for("atlas") == "atlas"
    assert strategy_for("atlas", "even", "search") == "search"
    assert strategy_for("baseline", "atlas", "search") == "atlas"
    assert strategy_for("dp-across", "even", "search") == "dp-across"


def test_describe_row() -> None:
    assert describe_row(("near", "big", "big", "big")) == "near:0 big:1-3"
