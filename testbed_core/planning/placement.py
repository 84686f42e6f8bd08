"""Where the pipeline stages go: the DC-selection heuristic of Atlas, and the other
placements the testbed compares it with.

Tensor and data parallelism stay inside a DC, so a pipeline stage with its DP
replicas needs ``tp * dp`` GPUs in one DC. Atlas sorts the DCs by free GPUs, largest
first, and gives each DC ``floor(free / (tp * dp))`` consecutive stages until all
``pp`` are placed; if they do not all fit, the request is infeasible and the error
says by how much. Filling the largest DC first minimises the pipeline boundaries that
cross the WAN. The other strategies (``in-order``, ``even``, ``round-robin``,
``dp-across``, see `place`) exist to compare against it. ``search``
(testbed_core/planning/search.py) is not a rule but a search: it scores candidate
assignments with the predictor, so it is run by `search_placement`, not by `place`.

A variant names a placement *policy* (testbed_core/variants.py); `strategy_for`
turns it into the strategy `place` runs.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

from testbed_core.topology import Topology, shortest_path
from testbed_core.variants import PlacementPolicy

STRATEGIES = ("atlas", "in-order", "even", "round-robin", "dp-across")
SEARCH = "search"  # the network-aware strategy of testbed_core/planning/search.py
AtlasPlacement = Literal["heuristic", "search"]
"""How Atlas places its stages: the paper's DC-selection heuristic, or the search."""


class PlacementError(ValueError):
    """Stages that cannot be placed on the free GPUs; the message says the shortfall."""


@dataclass(frozen=True)
class Crossing:
    """A pipeline boundary whose two stages sit in different DCs."""

    boundary: int  # between stage `boundary` and `boundary + 1`
    src: str
    dst: str
    path: tuple[str, ...]  # DCs along the lowest-latency route
    pipelines: tuple[int, ...]

    def to_json(self) -> dict[str, Any]:
        return {"boundary": self.boundary, "src": self.src, "dst": self.dst, "path": list(self.path),
                "pipelines": list(self.pipelines)}


@dataclass(frozen=True)
class Placement:
    strategy: str
    pp: int
    dp: int
    tp: int
    stage_dc: tuple[tuple[str, ...], ...]  # [pipeline][stage] -> DC
    hosts: dict[tuple[int, int], tuple[str, ...]]  # (pipeline, stage) -> its tp hosts, "dc-host"
    free: dict[str, int]
    # an interleaved schedule's chunks (`place`'s chunks > 1) also go from the last stage
    # back to the first: one more boundary, pp-1 -> 0
    wrap: bool = False

    def next_stage(self, boundary: int) -> int:
        """The stage after `boundary`'s upstream stage (0 after the last, where `wrap`)."""
        return (boundary + 1) % self.pp

    def dc_of(self, pipeline: int, stage: int) -> str:
        return self.stage_dc[pipeline][stage]

    def stages_in(self, dc: str, pipeline: int = 0) -> list[int]:
        return [s for s, name in enumerate(self.stage_dc[pipeline]) if name == dc]

    def used(self) -> dict[str, int]:
        """GPUs taken per DC."""
        out: dict[str, int] = {}
        for row in self.stage_dc:
            for dc in row:
                out[dc] = out.get(dc, 0) + self.tp
        return out

    def wan_boundaries(self) -> Iterator[tuple[int, int]]:
        """(pipeline, boundary) of every pipeline boundary whose two stages sit in
        different DCs, pipeline by pipeline, boundaries in order (boundary b: stage b to
        `next_stage(b)`; with `wrap`, pp-1 to 0 last): the one enumeration of WAN
        crossings that `crossings` and the calibration's paths
        (testbed_core/planning/wan_paths.py) are derived from."""
        last = self.pp if self.wrap and self.pp > 1 else self.pp - 1
        for d, row in enumerate(self.stage_dc):
            for b in range(last):
                if row[b] != row[self.next_stage(b)]:
                    yield d, b

    def replica_pairs(self) -> Iterator[tuple[int, str, str]]:
        """(stage, host of DP replica 0, host of replica 1) of every stage (dp >= 2):
        the two ends of each stage's DP ring channel between its first two replicas."""
        if self.dp < 2:
            return
        for r in range(self.pp):
            yield r, self.hosts[(0, r)][0], self.hosts[(1, r)][0]

    def crossings(self, topology: Topology | None = None) -> list[Crossing]:
        """The WAN crossings, one per (boundary, source DC, destination DC) with the
        pipelines that cross there."""
        found: dict[tuple[int, str, str], list[int]] = {}
        for d, b in self.wan_boundaries():
            found.setdefault((b, self.dc_of(d, b), self.dc_of(d, self.next_stage(b))), []).append(d)
        out = []
        for (b, src, dst), pipes in sorted(found.items()):
            path = tuple(shortest_path(src, dst, topology.wan)) if topology else (src, dst)
            out.append(Crossing(b, src, dst, path, tuple(pipes)))
        return out

    def to_json(self, topology: Topology | None = None) -> dict[str, Any]:
        return {
            "strategy": self.strategy,
            "pp": self.pp, "dp": self.dp, "tp": self.tp,
            "free_gpus": self.free,
            "used_gpus": self.used(),
            "stage_dc": [list(row) for row in self.stage_dc],
            "hosts": {f"p{d}s{s}": list(h) for (d, s), h in sorted(self.hosts.items())},
            "wrap": self.wrap,
            "wan_crossings": [c.to_json() for c in self.crossings(topology)],
        }


def _shortfall(free: dict[str, int], pp: int, dp: int, tp: int, placed: int, unit: int, what: str) -> PlacementError:
    whole = pp if what == "stages" else dp
    missing = whole - placed
    each = f"each stage needs dp x tp = {dp} x {tp}" if what == "stages" else f"each pipeline needs pp x tp = {pp} x {tp}"
    fits = ", ".join(f"{dc}: {n} free -> {n // unit}" for dc, n in free.items())
    lower = "pp, dp or tp" if what == "stages" else "pp or tp, or use another placement"
    return PlacementError(
        f"infeasible: {each} = {unit} GPUs in one DC (pp={pp}, dp={dp}, tp={tp}: {pp * dp * tp} GPUs in all); "
        f"{what} that fit per DC: {fits}; only {placed} of {whole} {what} fit, short by {missing} "
        f"{what} of {unit} GPUs. Add GPUs (--gpus dc=count), or lower {lower}."
    )


def place(
    free: dict[str, int],
    pp: int,
    dp: int = 1,
    tp: int = 1,
    *,
    strategy: str = "atlas",
    hosts: dict[str, list[str]] | None = None,
    gpus_per_host: int = 1,
    chunks: int = 1,
) -> Placement:
    """Place `pp` stages of `dp` pipelines (each stage `tp` GPUs) on DCs with `free` GPUs;
    `chunks` model chunks per stage (an interleaved schedule's: the placement's `wrap`).

    Strategies: ``atlas`` (largest DC first, consecutive stages, floor(free/(tp*dp))
    per DC), ``in-order`` (the same in the listed DC order), ``even`` (stages spread
    as evenly as possible over all DCs, in order), ``round-robin`` (stage s in DC
    s mod n: the most crossings), ``dp-across`` (pipeline d wholly in one DC, DCs
    taken largest first: DP crosses the WAN).
    """
    if min(pp, dp, tp) < 1:
        raise PlacementError(f"pp, dp and tp must be at least 1 (got pp={pp}, dp={dp}, tp={tp})")
    if not free:
        raise PlacementError("no DCs to place on")
    bad = {dc: n for dc, n in free.items() if n < 0}
    if bad:
        raise PlacementError(f"free GPU counts must be >= 0: {bad}")
    names = list(free)
    unit = tp * dp
    stage_of: list[str] = []
    if strategy in ("atlas", "in-order"):
        order = sorted(names, key=lambda dc: (-free[dc], names.index(dc))) if strategy == "atlas" else names
        for dc in order:
            take = min(free[dc] // unit, pp - len(stage_of))
            stage_of += [dc] * take
            if len(stage_of) == pp:
                break
        if len(stage_of) < pp:
            raise _shortfall(free, pp, dp, tp, len(stage_of), unit, "stages")
        rows = [tuple(stage_of)] * dp
    elif strategy in ("even", "round-robin"):
        k = min(len(names), pp)
        if strategy == "even":
            counts = [pp // k + (1 if i < pp % k else 0) for i in range(k)]
            stage_of = [dc for dc, n in zip(names[:k], counts, strict=True) for _ in range(n)]
        else:
            stage_of = [names[s % k] for s in range(pp)]
        need: dict[str, int] = {}
        for dc in stage_of:
            need[dc] = need.get(dc, 0) + unit
        over = {dc: n for dc, n in need.items() if n > free[dc]}
        if over:
            detail = ", ".join(f"{dc} needs {n}, has {free[dc]}" for dc, n in over.items())
            raise PlacementError(f"infeasible: the {strategy} placement puts more GPUs in a DC than it has ({detail})")
        rows = [tuple(stage_of)] * dp
    elif strategy == "dp-across":
        per_pipe = pp * tp
        left = dict(free)
        rows = []
        for _ in range(dp):
            options = sorted((dc for dc in names if left[dc] >= per_pipe), key=lambda dc: (-left[dc], names.index(dc)))
            if not options:
                raise _shortfall(free, pp, dp, tp, len(rows), per_pipe, "pipelines")
            left[options[0]] -= per_pipe
            rows.append(tuple([options[0]] * pp))
    elif strategy == SEARCH:
        raise PlacementError("placement 'search' scores candidates with the predictor: run it with "
                             "testbed_core.planning.search.search_placement (or place_variant), not place()")
    else:
        raise PlacementError(f"unknown placement strategy {strategy!r} (allowed: {', '.join(STRATEGIES)}, "
                             f"or {SEARCH} through search_placement)")
    return Placement(strategy, pp, dp, tp, tuple(rows), _assign_hosts(rows, tp, hosts, gpus_per_host), dict(free),
                     chunks > 1)


def from_rows(strategy: str, rows: list[tuple[str, ...]], free: dict[str, int], tp: int,
              hosts: dict[str, list[str]] | None = None, gpus_per_host: int = 1, chunks: int = 1) -> Placement:
    """A placement of the given stage rows (one per pipeline), with hosts assigned as
    `place` assigns them (and `chunks` as it takes them); the caller has checked that the
    rows fit `free`."""
    return Placement(strategy, len(rows[0]), len(rows), tp, tuple(rows), _assign_hosts(rows, tp, hosts, gpus_per_host),
                     dict(free), chunks > 1)


def _assign_hosts(
    rows: list[tuple[str, ...]], tp: int, hosts: dict[str, list[str]] | None, gpus_per_host: int
) -> dict[tuple[int, int], tuple[str, ...]]:
    """Stage-major, pipeline-minor: the DP replicas of a stage sit side by side."""
    if hosts is None:
        return {}
    cursor: dict[str, int] = {}
    out: dict[tuple[int, int], tuple[str, ...]] = {}
    pp = len(rows[0])
    for s in range(pp):
        for d, row in enumerate(rows):
            dc = row[s]
            slots = [f"{dc}-{h}" for h in hosts.get(dc, []) for _ in range(gpus_per_host)]
            i = cursor.get(dc, 0)
            chosen = slots[i:i + tp]
            cursor[dc] = i + tp
            out[(d, s)] = tuple(chosen) if len(chosen) == tp else ()
    return out


def free_gpus(topology: Topology, gpus_per_host: int = 1, override: dict[str, int] | None = None) -> dict[str, int]:
    """Free GPUs per DC: its `gpus`, or hosts x gpus_per_host, unless overridden (unknown DCs refused)."""
    free = {dc.name: dc.gpu_count(gpus_per_host) for dc in topology.dcs}
    for dc, n in (override or {}).items():
        if dc not in free:
            raise PlacementError(f"--gpus: unknown DC {dc!r} (DCs in topology {topology.name}: {', '.join(free)})")
        free[dc] = n
    return free



def strategy_for(policy: PlacementPolicy, baseline_placement: str = "even",
                 atlas_placement: AtlasPlacement = "heuristic") -> str:
    """The `place` strategy of a variant's placement policy: ``baseline`` variants use
    the scenario's (or the CLI's) baseline placement, ``atlas`` ones the heuristic or,
    with `atlas_placement` ``search``, the network-aware search; the others their own."""
    if policy == "baseline":
        return baseline_placement
    if policy == "atlas" and atlas_placement == "search":
        return SEARCH
    return policy
