"""Which WAN paths a placement's traffic crosses, between which hosts, and what the
calibration measured on each.

A WAN path is a pair of DCs, either direction the same path. Pipelines cross it at
their boundaries between stages in different DCs, DP rings (dp-across-dc) where a
stage's replicas sit in different DCs; inside a DC, the DP ring between replicas on
different hosts uses the LAN. Every enumeration here is derived from the placement's
own (`Placement.wan_boundaries`, `Placement.replica_pairs`). The run's calibration
(testbed/run/calibration.py) times the paths `wan_uses` lists; the prediction reads
each path's figures back with `path_rates_of`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from testbed_core.contracts.calibration import (
    Calibration,
    PathCalibration,
    TurnsCalibration,
    dc_of_host,
)
from testbed_core.planning.calibrated import turns_rate_bps, turns_wire_rate_bps
from testbed_core.planning.collisions import round_shares
from testbed_core.planning.lossy import lossy_between
from testbed_core.planning.path_load import load_of, weighed_rate
from testbed_core.planning.placement import Placement
from testbed_core.topology import Topology
from testbed_core.workload import EffectiveWorkload, Workload

HostPair = tuple[str, str]
DcPair = tuple[str, str]
Crossings = dict[DcPair, list[HostPair]]


def path_key(seen: Mapping[DcPair, object], a: str, z: str) -> DcPair:
    """The key of the path between `a` and `z` in `seen`: the direction first seen."""
    return (z, a) if (z, a) in seen else (a, z)


def pipeline_crossings(placement: Placement) -> Crossings:
    """Per WAN path (DC pair, either order merged), the (upstream, downstream) hosts of
    each pipeline's first boundary crossing it."""
    out: Crossings = {}
    seen: set[tuple[int, DcPair]] = set()
    for d, s in placement.wan_boundaries():
        key = path_key(out, placement.dc_of(d, s), placement.dc_of(d, placement.next_stage(s)))
        if (d, key) in seen:
            continue
        seen.add((d, key))
        out.setdefault(key, []).append((placement.hosts[(d, s)][0], placement.hosts[(d, placement.next_stage(s))][0]))
    return out


def ring_crossings(placement: Placement) -> Crossings:
    """Per WAN path, the (replica 0, replica 1) hosts of each stage whose two-replica DP
    ring crosses it (dp = 2; wider rings are left to the model)."""
    out: Crossings = {}
    if placement.dp != 2:
        return out
    for r, a, b in placement.replica_pairs():
        dcs = placement.dc_of(0, r), placement.dc_of(1, r)
        if dcs[0] != dcs[1]:
            out.setdefault(path_key(out, *dcs), []).append((a, b))
    return out


def dp_lan_pairs(placement: Placement) -> list[HostPair]:
    """(host of DP replica 0, host of replica 1) of each stage whose first two replicas
    are in one DC on different hosts: the all-reduce channels the LAN probe times."""
    return [(a, b) for r, a, b in placement.replica_pairs() if a != b and placement.dc_of(0, r) == placement.dc_of(1, r)]


def lan_boundary_pair(placement: Placement) -> HostPair | None:
    """(upstream host, downstream host) of pipeline 0's first boundary whose two stages
    sit in one DC on different hosts: the channel the LAN tensor probe times (None:
    every boundary crosses a WAN or stays on one host)."""
    return next(((a, z) for a, z in boundary_pairs(placement) if dc_of_host(a) == dc_of_host(z)), None)


def boundary_pairs(placement: Placement) -> list[HostPair]:
    """(upstream host, downstream host) of each of pipeline 0's boundaries between two
    hosts, in the pipeline's order (a boundary inside one host left out): the channels
    the loaded LAN tensor probe keeps busy at once."""
    last = placement.pp if placement.wrap and placement.pp > 1 else placement.pp - 1
    out = []
    for b in range(last):
        a, z = placement.hosts[(0, b)][0], placement.hosts[(0, placement.next_stage(b))][0]
        if a != z and (a, z) not in out:
            out.append((a, z))
    return out


def two_way(pairs: Sequence[HostPair]) -> list[HostPair]:
    """A forward channel and a reverse one (another pipeline's, when there is one):
    pipelines send activations and gradients across the WAN at the same time."""
    return [pairs[0], pairs[1][::-1] if len(pairs) > 1 else pairs[0][::-1]]


@dataclass
class PathUse:
    """How the variants' placements use one WAN path (a pair of DCs, in the direction
    first seen): the host pairs of the pipelines crossing it (upstream, downstream; one
    per pipeline), which variants send pipeline traffic over it and with how many
    channels at once each way, and the DP replicas whose rings cross it (dp-across-dc)."""

    dcs: DcPair
    pairs: list[HostPair] = field(default_factory=list)
    channels: dict[str, int] = field(default_factory=dict)  # variant -> pipelines crossing it at once
    ring_pairs: list[HostPair] = field(default_factory=list)
    ring_variants: list[str] = field(default_factory=list)

    @property
    def variants(self) -> list[str]:
        return list(dict.fromkeys([*self.channels, *self.ring_variants]))


def _oriented(use: PathUse, a: str, z: str, pairs: list[HostPair]) -> list[HostPair]:
    """`pairs` crossing from `a` to `z` as `use` lists them: crossing the other way, the
    same path with its hosts the other way round."""
    return pairs if use.dcs == (a, z) else [(y, x) for x, y in pairs]


def wan_uses(placements: Mapping[str, Placement], rings: bool) -> dict[DcPair, PathUse]:
    """Every WAN path the `placements` (variant name -> placement, Atlas's first: its
    first crossing is the primary path, whose figures also stand at the top of the
    calibration) cross, with the pipelines' and (`rings`: the DP all-reduce is timed)
    the DP rings' host pairs on it."""
    uses: dict[DcPair, PathUse] = {}
    for name, pl in placements.items():
        for (a, z), pairs in pipeline_crossings(pl).items():
            use = uses.setdefault(path_key(uses, a, z), PathUse(path_key(uses, a, z)))
            pairs = _oriented(use, a, z, pairs)
            if not use.pairs or len(pairs) > len(use.pairs):
                use.pairs = pairs
            use.channels[name] = len(pairs)
        for (a, z), pairs in (ring_crossings(pl).items() if rings else ()):
            use = uses.setdefault(path_key(uses, a, z), PathUse(path_key(uses, a, z)))
            pairs = _oriented(use, a, z, pairs)
            if len(pairs) > len(use.ring_pairs):
                use.ring_pairs = pairs
            use.ring_variants.append(name)
    return uses


@dataclass(frozen=True)
class TogetherLoad:
    """One way a variant loads its paths at once: its name, the stream count, whether
    its plan puts one transfer at a time on a link (temporal sharing), its placement."""

    variant: str
    streams: int
    temporal: bool
    placement: Placement


LoadGroup = list[tuple[PathCalibration, list[HostPair]]]


def together_loads(loads: Sequence[TogetherLoad], uses: Mapping[DcPair, PathUse],
                   paths: Sequence[PathCalibration]) -> dict[int, list[LoadGroup]]:
    """Per stream count, the sets of WAN paths to time loaded at once: those a variant's
    pipelines cross together (two or more paths, every one of them calibrated), each
    with the host pairs of the pipelines crossing it (temporal: one, its plan puts one
    transfer at a time on a link); one set per distinct (count, paths), keeping the
    most channels on each path."""
    by_dcs = {pc.dcs: pc for pc in paths}
    seen: dict[tuple[int, frozenset[frozenset[str]]], LoadGroup] = {}
    for load in loads:
        keys = [path_key(uses, a, z) for a, z in pipeline_crossings(load.placement)]
        group = [(by_dcs[k], uses[k].pairs[:1 if load.temporal else max(1, uses[k].channels.get(load.variant, 1))])
                 for k in keys if k in by_dcs and k in uses and uses[k].pairs]
        ident = (load.streams, frozenset(frozenset(k) for k in keys))
        if len(group) < 2 or len(group) != len(keys):
            continue
        if ident in seen:  # the same paths at the same count: keep the most channels on each
            mine = {pc.dcs: pairs for pc, pairs in group}
            seen[ident] = [(pc, max(pairs, mine[pc.dcs], key=len)) for pc, pairs in seen[ident]]
        else:
            seen[ident] = group
    out: dict[int, list[LoadGroup]] = {}
    for (n, _), group in seen.items():
        out.setdefault(n, []).append(group)
    return out


@dataclass(frozen=True)
class PathRates:
    """What the calibration measured on one WAN path a variant crosses, for its stream
    count: its channel's rate alone there, the aggregate of its colliding channels, the
    path's nominal bottleneck, and the aggregate of the DP rings crossing it."""

    dcs: DcPair
    rate_bps: float | None
    colliding_bps: float | None
    nominal_bps: float | None
    ring_bps: float | None = None
    # where the placement's other paths were also timed loaded at once: how loaded they
    # keep this one in the simulated iteration (0 alone, 1 all busy throughout), the
    # weight its rate and aggregate take between the alone and together figures
    load: float | None = None
    ring_alone_bps: float | None = None  # one DP ring alone there: the channel rate at the rings' streams
    # the rate a temporal plan's transfers move through their link, holds included, each
    # way (dcs[0] -> dcs[1], then back), from the path timed as a plan uses it
    # (testbed_core/planning/calibrated.py `turns_rate_bps`; None: not timed so, the
    # plan's holds are the alone rate's, token_margin longer)
    turns_rate_bps: tuple[float, float] | None = None
    # the same transfers' rate on the wire, each way (`turns_wire_rate_bps`: their bytes
    # arrive as they left, the next holder waits for the hold); None: not timed so
    turns_wire_bps: tuple[float, float] | None = None
    # each way (dcs[0] -> dcs[1], then back), the collision probe's rounds as shares of
    # the crowded total the channel that ended first moved (testbed_core/planning/
    # collisions.py `round_shares`; None: no collision of two channels timed)
    collision_shares: tuple[tuple[float, ...], tuple[float, ...]] | None = None


def path_rates_of(placement: Placement, topology: Topology, cal: Calibration, streams: int, allreduce: bool,
                  loads: Mapping[frozenset[str], float] | None = None) -> dict[DcPair, PathRates]:
    """The calibrated figures of every WAN path `placement` crosses, for `streams`
    (`allreduce`: the DP rings' paths too). Where the calibration also timed the
    placement's paths loaded at once, a path's rate and aggregate lie between its alone
    and together figures by how loaded the other paths keep it (`loads`,
    testbed_core/planning/path_load.py; None: all of them throughout, the together
    figures)."""
    out: dict[DcPair, PathRates] = {}
    piped = {frozenset(k) for k in pipeline_crossings(placement)}
    rings = {frozenset(k) for k in ring_crossings(placement)} if allreduce else set()
    for (a, z) in [*pipeline_crossings(placement), *(ring_crossings(placement) if allreduce else ())]:
        if (a, z) in out or (z, a) in out:
            continue
        pc = cal.path(a, z)
        on_pipe, on_ring = pc is not None and frozenset((a, z)) in piped, pc is not None and frozenset((a, z)) in rings
        together = pc.together_for(streams, piped) if pc and on_pipe and len(piped) > 1 else None
        rate = pc.rates_bps.get(streams) if pc and on_pipe else None
        colliding = pc.colliding_bps.get(streams) if pc and on_pipe else None
        load = None
        if together is not None:  # timed with the placement's other paths loaded at once too
            load = load_of(loads, a, z)
            rate = weighed_rate(rate, together.rate_bps, load)
            colliding = weighed_rate(colliding, together.colliding_bps, load)
        ringed = pc is not None and on_ring and pc.ring_streams == streams
        # not on a lossy route: the loss model spreads its transfers (testbed_core/planning/lossy.py),
        # and the probe's transfers met the same loss
        turns = pc.turns_for(streams) if pc and on_pipe and not lossy_between(topology, a, z) else None
        shares = None
        if pc and on_pipe and pc.colliding_s.get(streams) and pc.colliding_bps.get(streams):
            ahead, back = round_shares(pc.colliding_s[streams], pc.concurrent, pc.nbytes, pc.latency_s,
                                       pc.colliding_bps[streams])
            if ahead and back:
                shares = (ahead, back) if pc.dcs == (a, z) else (back, ahead)
        out[(a, z)] = PathRates(
            (a, z), rate_bps=rate, colliding_bps=colliding, nominal_bps=topology.bottleneck_rate(a, z),
            ring_bps=pc.ring_bps if ringed else None,
            ring_alone_bps=pc.rates_bps.get(streams) if ringed else None,
            load=load,
            turns_rate_bps=None if turns is None else _turns_rates(pc, turns, (a, z)),
            turns_wire_bps=None if turns is None else _turns_rates(pc, turns, (a, z), wire=True),
            collision_shares=shares,
        )
        if pc and on_ring and not on_pipe and out[(a, z)].ring_bps is None and pc.rates_bps.get(streams):
            out[(a, z)] = replace(out[(a, z)], rate_bps=pc.rates_bps[streams])
    return out


def _turns_rates(pc: PathCalibration, turns: TurnsCalibration, dcs: DcPair,
                 wire: bool = False) -> tuple[float, float]:
    """The turns probe's rates on `pc` (holds included; `wire`: on the wire), `dcs[0]`
    -> `dcs[1]` first (the probe's path may be named the other way round)."""
    if wire:
        ahead = turns_wire_rate_bps(pc.nbytes, turns.transfer_s, pc.latency_s)
        back = turns_wire_rate_bps(pc.nbytes, turns.return_s, pc.latency_s)
    else:
        ahead = turns_rate_bps(pc.nbytes, turns.transfer_s, pc.latency_s, turns.slot_s)
        back = turns_rate_bps(pc.nbytes, turns.return_s, pc.latency_s, turns.slot_s)
    return (ahead, back) if pc.dcs == dcs else (back, ahead)


def first_rated(path_rates: Mapping[DcPair, PathRates]) -> PathRates | None:
    """The first path with a channel rate: the variant's first crossing, whose figures
    summary.json reports as the variant's calibrated channel rate and aggregate."""
    return next((pr for pr in path_rates.values() if pr.rate_bps is not None), None)


def grad_wire_bytes(workload: Workload, eff: EffectiveWorkload, rank: int) -> int:
    """The gradient bytes a worker of pipeline rank `rank` all-reduces: its stages'
    parameters x the dtype's bytes x the workload's scale (at least one byte)."""
    par = workload.parallelism
    params = sum(eff.stage_params[c * par.pp + rank] for c in range(par.chunks))
    return max(1, int(params * workload.model_spec().dtype_bytes * workload.scale))
