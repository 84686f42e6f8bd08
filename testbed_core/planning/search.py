"""Network-aware placement: search the stage assignments, score each with the predictor.

Atlas's DC-selection heuristic (testbed_core/planning/placement.py) fills the largest
DC first and reads nothing of the network, so on a topology where the second-largest
DC sits behind a slow, long link it still puts the next stages there. The search
instead enumerates candidate assignments and keeps the one the predictor says is
fastest.

The candidates are what the heuristic could have chosen with eyes open: an ordered
subset of DCs (each holding one block of consecutive stages, as in the heuristic,
since splitting a DC's block only adds WAN crossings) and how many stages each
takes, at least one and at most ``floor(free / (tp x dp))``. As in the heuristic,
a stage's DP replicas stay in one DC, so every pipeline gets the same row. They are
tried in a fixed order: the heuristic's own placement first (so the search is never
predicted slower than it), then fewer DCs before more, DCs largest first, larger
first blocks first.

The predictor is passed in (`testbed plan` and `testbed run` pass the fast one,
testbed_core/whatif/predict.py; the exact planner in testbed_core/planning/prediction.py
takes the same arguments): the planning package may not import the what-if package,
which is built on it. The search is bounded by a `SearchBudget`: at most that many
candidates scored and that many seconds; the result says how many of how many were
scored and which bound stopped it (a search stopped early keeps the fastest so far).
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from testbed_core.planning.network import NetParams
from testbed_core.planning.placement import (
    SEARCH,
    Placement,
    PlacementError,
    free_gpus,
    from_rows,
    place,
)
from testbed_core.topology import Topology
from testbed_core.workload import EffectiveWorkload, Workload

if TYPE_CHECKING:  # the prediction module may use the search
    from testbed_core.planning.prediction import Variant

DEFAULT_CANDIDATES = 1000  # 4 DCs and pp=8: at most 1,432 candidates (fewer when DCs are small)
DEFAULT_SECONDS = 30.0
TIE = 1e-9  # a candidate replaces the best only when faster by this fraction (the heuristic wins ties)
KEEP = 10  # candidates listed in the result, fastest first
Row = tuple[str, ...]


class _Scored(Protocol):
    iteration_time_s: float


Predictor = Callable[..., _Scored]
"""``predictor(topology, workload, variant, *, free, gpus_per_host, net, placement, effective)``
with an ``iteration_time_s``: `fast_predict` or the planner's `predict`."""


@dataclass(frozen=True)
class SearchBudget:
    """How much the search may score: at most `candidates` placements and `seconds`
    of wall time (checked before each candidate; the first is always scored)."""

    candidates: int = DEFAULT_CANDIDATES
    seconds: float = DEFAULT_SECONDS

    def __post_init__(self) -> None:
        if not isinstance(self.candidates, int) or self.candidates < 1:
            raise PlacementError(f"search budget: candidates must be a whole number >= 1, got {self.candidates!r}")
        if not self.seconds > 0 or math.isinf(self.seconds):
            raise PlacementError(f"search budget: seconds must be a finite number > 0, got {self.seconds!r}")

    def text(self) -> str:
        return f"at most {self.candidates} candidates or {self.seconds:g} s"


@dataclass
class SearchResult:
    """The fastest placement found, the heuristic's for comparison, and what was searched."""

    placement: Placement  # strategy "search"
    iteration_time_s: float
    heuristic: Placement  # largest-DC-first, as `place(strategy="atlas")` puts it
    heuristic_time_s: float
    evaluated: int
    space: int  # candidates in the whole space (the heuristic's row among them)
    budget: SearchBudget
    stopped_by: str | None  # "candidates" or "seconds" when the budget cut the search short; None: all scored
    elapsed_s: float
    ranked: list[tuple[Row, float]] = field(default_factory=list)  # the fastest KEEP scored, fastest first

    @property
    def speedup(self) -> float | None:
        """Heuristic's predicted iteration time over the search's (1.0: the heuristic is the best found)."""
        if self.iteration_time_s <= 0:
            return None
        return self.heuristic_time_s / self.iteration_time_s

    def budget_text(self) -> str:
        """'scored 84 of 84 candidates in 1.2 s (budget: at most 2000 candidates or 30 s)'."""
        cut = "" if self.stopped_by is None else f"; stopped by the {self.stopped_by} budget, fastest so far kept"
        return (f"scored {self.evaluated} of {self.space} candidates in {self.elapsed_s:.2f} s "
                f"(budget: {self.budget.text()}{cut})")

    def to_json(self, topology: Topology | None = None) -> dict[str, Any]:
        return {
            "strategy": SEARCH,
            "placement": self.placement.to_json(topology),
            "predicted_iteration_time_s": self.iteration_time_s,
            "heuristic_stage_dc": list(self.heuristic.stage_dc[0]),
            "heuristic_predicted_iteration_time_s": self.heuristic_time_s,
            "speedup_over_heuristic": self.speedup,
            "evaluated": self.evaluated,
            "space": self.space,
            "budget": {"candidates": self.budget.candidates, "seconds": self.budget.seconds},
            "stopped_by": self.stopped_by,
            "elapsed_s": self.elapsed_s,
            "ranked": [{"stages": describe_row(row), "stage_dc": list(row), "predicted_iteration_time_s": t}
                       for row, t in self.ranked],
        }


def describe_row(row: Row) -> str:
    """'dc1:0-2 dc3:3': each DC's block of stages, in pipeline order."""
    parts = []
    for dc, group in itertools.groupby(enumerate(row), key=lambda item: item[1]):
        stages = [s for s, _ in group]
        span = f"{stages[0]}" if len(stages) == 1 else f"{stages[0]}-{stages[-1]}"
        parts.append(f"{dc}:{span}")
    return " ".join(parts)


def _capacities(free: dict[str, int], pp: int, dp: int, tp: int) -> dict[str, int]:
    """Stages each DC can hold (0 left out), in the heuristic's order: most free GPUs first."""
    names = list(free)
    unit = dp * tp
    order = sorted(names, key=lambda dc: (-free[dc], names.index(dc)))
    return {dc: min(free[dc] // unit, pp) for dc in order if free[dc] // unit >= 1}


def _blocks(pp: int, caps: list[int]) -> Iterator[tuple[int, ...]]:
    """Stage counts (each 1..cap) of consecutive blocks summing to pp, larger first blocks first."""
    if len(caps) == 1:
        if 1 <= pp <= caps[0]:
            yield (pp,)
        return
    rest_max = sum(caps[1:])
    for first in range(min(caps[0], pp - (len(caps) - 1)), 0, -1):
        if pp - first > rest_max:
            break
        for tail in _blocks(pp - first, caps[1:]):
            yield (first, *tail)


def candidate_rows(free: dict[str, int], pp: int, dp: int = 1, tp: int = 1) -> Iterator[Row]:
    """Every candidate stage row (see the module docstring), fewer DCs first, DCs
    largest first, larger first blocks first."""
    caps = _capacities(free, pp, dp, tp)
    dcs = list(caps)
    for k in range(1, min(len(dcs), pp) + 1):
        for order in itertools.permutations(dcs, k):
            for counts in _blocks(pp, [caps[dc] for dc in order]):
                yield tuple(dc for dc, n in zip(order, counts, strict=True) for _ in range(n))


def count_candidates(free: dict[str, int], pp: int, dp: int = 1, tp: int = 1) -> int:
    """How many rows `candidate_rows` yields, without listing them: the sum over DC
    subsets of size k of k! orders x the block counts that fit (a generating function
    over the DCs: ways[k][s] = subsets of k DCs with blocks summing to s stages)."""
    caps = list(_capacities(free, pp, dp, tp).values())
    ways = [[0] * (pp + 1) for _ in range(pp + 1)]
    ways[0][0] = 1
    for cap in caps:
        for k in range(pp, 0, -1):
            row, prev = ways[k], ways[k - 1]
            for s in range(pp, 0, -1):
                row[s] += sum(prev[s - n] for n in range(1, min(cap, s) + 1))
    return sum(math.factorial(k) * ways[k][pp] for k in range(1, pp + 1))


def search_placement(
    topology: Topology,
    workload: Workload,
    variant: Variant,
    *,
    predictor: Predictor,
    free: dict[str, int] | None = None,
    gpus_per_host: int = 1,
    hosts: dict[str, list[str]] | None = None,
    net: NetParams | None = None,
    effective: EffectiveWorkload | None = None,
    base_dir: str | None = None,
    budget: SearchBudget | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> SearchResult:
    """The fastest placement of `workload` on `topology` for `variant` (a planner
    `Variant`: its streams and sharing are scored, its placement field is not read)
    that `predictor` finds among the candidates, within `budget`.

    Raises `PlacementError` (the heuristic's shortfall message) when no candidate fits."""
    budget = budget or SearchBudget()
    net = net or NetParams()
    par = workload.parallelism
    eff = effective or workload.effective(base_dir)
    free = free if free is not None else free_gpus(topology, gpus_per_host)
    if hosts is None:
        hosts = {dc.name: list(dc.hosts) for dc in topology.dcs if dc.hosts} or None
    heuristic = place(free, par.pp, par.dp, par.tp, strategy="atlas", hosts=hosts, gpus_per_host=gpus_per_host,
                      chunks=par.chunks)
    space = count_candidates(free, par.pp, par.dp, par.tp)
    start = clock()
    scored: list[tuple[Row, float]] = []
    best: tuple[Row, float] | None = None
    stopped_by = None
    seen: set[Row] = set()
    for row in itertools.chain([heuristic.stage_dc[0]], candidate_rows(free, par.pp, par.dp, par.tp)):
        if row in seen:
            continue
        if scored and len(scored) >= budget.candidates:
            stopped_by = "candidates"
            break
        if scored and clock() - start >= budget.seconds:
            stopped_by = "seconds"
            break
        seen.add(row)
        candidate = from_rows(SEARCH, [row] * par.dp, free, par.tp, hosts, gpus_per_host, par.chunks)
        t = predictor(topology, workload, variant, free=free, gpus_per_host=gpus_per_host, net=net,
                      placement=candidate, effective=eff).iteration_time_s
        scored.append((row, t))
        if best is None or t < best[1] * (1 - TIE):
            best = (row, t)
    elapsed = clock() - start
    assert best is not None  # the heuristic's row is always scored first
    ranked = sorted(scored, key=lambda item: item[1])[:KEEP]
    return SearchResult(
        placement=from_rows(SEARCH, [best[0]] * par.dp, free, par.tp, hosts, gpus_per_host, par.chunks),
        iteration_time_s=best[1], heuristic=heuristic, heuristic_time_s=scored[0][1],
        evaluated=len(scored), space=space, budget=budget, stopped_by=stopped_by, elapsed_s=elapsed,
        ranked=ranked,
    )
