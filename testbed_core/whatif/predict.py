"""The fast prediction of one variant: the planner's model (testbed_core/planning/), at paper scale.

Same inputs and the same model as `testbed_core.planning.prediction.predict`: the
variant's placement, each stage's compute time, every pipeline boundary carrying the
wire activation bytes each way per micro-batch over a channel (LAN rate inside a DC;
on the WAN ``streams x per-flow rate``, through the link directions of the route,
plus the one-way latency), shared links or Atlas's temporal sharing (pipelines
staggered by each of the planner's candidate strides, links one transfer at a time,
first come first served, each held `NetParams.path_hold_factor` times the transfer's
wire time while its bytes arrive as they left, the fastest stride kept), ``auto`` choosing between them
with the same margin (or, as a calibrated run chooses, `plan_margin`: the plan only
where sharing is predicted slower by more than it, `plan_wins`), and the DP
all-reduce added by the planner's own
`allreduce_time`. What makes it fast (testbed_core/whatif/engine.py):

* shared links: the DP pipelines of a placement are identical and start together, so
  they move in lockstep and one of them stands for all, each holding
  ``capacity(D users) / D`` of a link it shares with the D; if one pipeline's own
  transfers overlap on a link (rates then change over time), that one pipeline goes
  through the exact simulator instead (`FastPrediction.method` says so);
* temporal sharing: every pipeline runs, but no fluid model is solved (a link held
  alone moves a transfer at its full rate), and a stride is skipped when it cannot
  win: the last pipeline starts ``(D - 1) x stride`` late and cannot finish before its
  own run alone (sound when a pipeline has one channel per link direction, so that
  the others can only delay its transfers, not reorder them; otherwise before its
  busiest rank's compute); a stride that runs is stopped as soon as the engine's
  lower bounds reach the best so far (a worker's compute still to run; a link's
  transfers still to come, at their wire time each): the kept stride and its time
  are those of the full search, at a fraction of its runs;
* the bubble fraction, WAN bytes and device busy time are closed forms (compute
  seconds per device do not depend on the timing; bytes are counts x size).

The exact simulator stays the reference (`testbed plan --exact`); the unit tests
check both agree on randomized small cases. The result also keeps every idle gap of
every device, which `testbed_core.whatif.prefill` turns into BubbleTea's prefill
capacity.
"""

from __future__ import annotations

import math
import os
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from testbed_core.planning.network import NetParams, WanPath, wan_path, wan_resource
from testbed_core.planning.placement import Placement, free_gpus, place
from testbed_core.planning.prediction import (
    SHARING_MARGIN,
    Variant,
    allreduce_time,
    choose_sharing,
    lan_tensor_rate,
    plan_wins,
    prediction_fields,
)
from testbed_core.planning.temporal import TemporalPlan, stagger_candidates
from testbed_core.schedules import Schedule, build_schedule
from testbed_core.simulate import (
    ComputeSpan,
    Path,
    Resource,
    SimResult,
    SimSpec,
    TransferKey,
    simulate,
)
from testbed_core.topology import Topology
from testbed_core.whatif.engine import Compiled, EngineResult, Route, overlaps, run
from testbed_core.workload import EffectiveWorkload, Workload

PLAN_TIE = 1e-9  # a stride replaces the best only when faster by this fraction (as derive_plan)
STRIDE_PARALLEL_STEPS = 2_000_000
"""A stride search whose runs have at least this many steps (pipelines x ranks x steps a
rank) runs strides beside each other, one per core up to `STRIDE_MAX_WORKERS`: at 131,072
GPUs one run is most of a second; below it, threads cost more than they give."""
STRIDE_MAX_WORKERS = 4
THREADS_ENV = "TESTBED_WHATIF_THREADS"
"""Set to a count to cap the cores a stride search uses (1: one stride at a time)."""
_stride_pools: dict[int, ThreadPoolExecutor] = {}


def stride_threads_cap() -> int:
    """The most strides a search runs at once: STRIDE_MAX_WORKERS, or
    $TESTBED_WHATIF_THREADS where set (ValueError naming it where it is not a count >= 1)."""
    raw = os.environ.get(THREADS_ENV, "").strip()
    if not raw:
        return STRIDE_MAX_WORKERS
    try:
        cap = int(raw)
    except ValueError:
        cap = 0
    if cap < 1:
        raise ValueError(f"${THREADS_ENV}={raw!r} is not a count: set a whole number >= 1 (1 runs one stride at "
                         "a time) or unset it")
    return cap


def _stride_workers(steps: int) -> int:
    """How many strides a search of runs of `steps` steps runs at once: one below
    STRIDE_PARALLEL_STEPS, else the cores this process may use, at most
    `stride_threads_cap()`."""
    if steps < STRIDE_PARALLEL_STEPS:
        return 1
    return max(1, min(stride_threads_cap(), len(os.sched_getaffinity(0))))


def _stride_pool(workers: int) -> ThreadPoolExecutor:
    """The threads that run a search's strides, the one it takes next and those after it
    (one pool per process and size: a what-if grid runs many searches)."""
    pool = _stride_pools.get(workers)
    if pool is None:
        pool = _stride_pools[workers] = ThreadPoolExecutor(workers, thread_name_prefix="whatif-stride")
    return pool


@dataclass
class Gaps:
    """Idle gaps of the devices over one pipeline iteration: `seconds[i]` of idle
    time on `weight[i]` devices (identical pipelines are counted once, weighted)."""

    seconds: np.ndarray
    weight: np.ndarray


@dataclass
class FastPrediction:
    """What `predict` reports, plus what the what-if needs (busy time, idle gaps,
    the all-reduce's WAN bytes) and how it was computed."""

    variant: Variant
    placement: Placement
    iteration_time_s: float
    pipeline_time_s: float
    allreduce_s: float
    compute_only_s: float
    bubble_fraction: float  # mean over devices of idle / pipeline time (as the planner's)
    ideal_bubble_fraction: float
    paths: dict[tuple[str, str], WanPath]
    wan_bytes: dict[str, float]  # pipeline transfers per link direction per iteration
    allreduce_wan_bytes: dict[str, float]  # the DP all-reduce's, per link direction
    devices: int  # stage replicas (each a tp-GPU group)
    busy_s: float  # mean compute seconds per device per iteration
    gaps: Gaps = field(repr=False)
    method: str = "fast"
    sharing_alternatives: dict[str, float] | None = None
    stagger_s: float | None = None
    staggers: list[tuple[float, float | None]] = field(default_factory=list)  # (stride, time; None: cannot win)
    plan: TemporalPlan | None = field(default=None, repr=False)
    offsets: list[float] | None = None

    @property
    def sharing(self) -> str:
        return "temporal" if self.stagger_s is not None else "shared"

    @property
    def utilization(self) -> float:
        """Mean over devices of compute time / iteration time (all-reduce included)."""
        return self.busy_s / self.iteration_time_s if self.iteration_time_s > 0 else 0.0

    def to_json(self, topology: Topology | None = None) -> dict[str, Any]:
        return {
            "variant": self.variant.name,
            "method": self.method,
            **prediction_fields(self, topology),  # its "variant" stays first, "method" after it
            "utilization": self.utilization,
            "wan_paths": [p.to_json() for p in self.paths.values()],
            "wan_bytes_per_iteration": self.wan_bytes,
            "allreduce_wan_bytes_per_iteration": self.allreduce_wan_bytes,
            "stagger_s": self.stagger_s,
            "staggers_tried": [{"stagger_s": s, "iteration_s": t} for s, t in self.staggers],
            "temporal_plan": self.plan.to_json() if self.plan else None,
        }


@dataclass
class _Net:
    """The channels of every placement row (a pipeline class), as engine routes."""

    rows: list[tuple[str, ...]]  # distinct placement rows
    row_of: list[int]  # per pipeline
    shared: list[list[Route]]  # per row, per channel: link shares of the lockstep pipelines
    exclusive: list[list[Route]]  # per row, per channel: links held alone
    links: list[str]  # link direction resource ids
    capacity: list[float]
    crowded: list[float | None]
    hold: list[float]  # per link: how many times its wire time a planned transfer holds it
    wan_channels: dict[tuple[int, int], tuple[str, WanPath]]  # (row, channel) -> (channel resource, path)
    paths: dict[tuple[str, str], WanPath]
    lan: dict[tuple[int, int], float]  # (row, channel) -> LAN rate


def _network(topology: Topology, sched: Schedule, placement: Placement, variant: Variant, net: NetParams,
             bits: float) -> _Net:
    rows = list(dict.fromkeys(placement.stage_dc))
    index = {row: i for i, row in enumerate(rows)}
    row_of = [index[row] for row in placement.stage_dc]
    count = [row_of.count(i) for i in range(len(rows))]
    paths: dict[tuple[str, str], WanPath] = {}
    links: list[str] = []
    capacity: list[float] = []
    crowded: list[float | None] = []
    hold: list[float] = []
    wan_channels: dict[tuple[int, int], tuple[str, WanPath]] = {}
    lan: dict[tuple[int, int], float] = {}
    raw: list[list[tuple[float, float, tuple[int, ...]]]] = []  # per row, per channel: (cap, latency, links)
    for i, row in enumerate(rows):
        chans: list[tuple[float, float, tuple[int, ...]]] = []
        for b in range(sched.stages - 1):
            ra, rb = sched.rank_of(b), sched.rank_of(b + 1)
            for direction, src, dst in (("fwd", ra, rb), ("bwd", rb, ra)):
                a, z = row[src], row[dst]
                if a == z:
                    lan_bps = lan_tensor_rate(topology, a, variant, net)  # as build_spec
                    lan[(i, len(chans))] = lan_bps
                    chans.append((lan_bps, net.lan_latency_s, ()))
                    continue
                if (a, z) not in paths:
                    paths[(a, z)] = wan_path(topology, a, z, variant.streams, net, fill_link=variant.fill_link,
                                             transfer_bytes=bits / 8)  # as build_spec: the loss model's tensor
                wp = paths[(a, z)]
                # as build_spec: a link direction is held the most times its wire time of
                # any way crossing it (NetParams.path_hold_factor, the turns probe's hold)
                factor = (net.path_hold_factor or {}).get((a, z), 1.0)
                ids = []
                for x, y in zip(wp.dcs, wp.dcs[1:], strict=False):
                    res = wan_resource(x, y)
                    if res not in links:
                        rate = topology.link(x, y).rate
                        links.append(res)
                        capacity.append(rate)
                        crowded.append(None if net.crowded_fraction is None else rate * net.crowded_fraction)
                        hold.append(1.0)
                    k = links.index(res)
                    hold[k] = max(hold[k], factor)
                    ids.append(k)
                wan_channels[(i, len(chans))] = (f"chan:{b}:{direction}", wp)
                chans.append((wp.streams * wp.flow_rate_bps, wp.latency_s, tuple(ids)))
        raw.append(chans)
    shared: list[list[Route]] = []
    exclusive: list[list[Route]] = []
    for i, chans in enumerate(raw):
        d = count[i]
        sh, ex = [], []
        for cap, lat, ids in chans:
            alone = min([cap] + [capacity[k] for k in ids])
            # d lockstep pipelines on a link: d users (crowded from 2), each a 1/d share
            share = min([cap] + [_lockstep_share(capacity[k], crowded[k], d) for k in ids])
            sh.append(Route(bits / share, lat, ids))
            ex.append(Route(bits / alone, lat, ids))
        shared.append(sh)
        exclusive.append(ex)
    return _Net(rows, row_of, shared, exclusive, links, capacity, crowded, hold, wan_channels, paths, lan)


def _lockstep_share(capacity: float, crowded: float | None, pipelines: int) -> float:
    total = crowded if pipelines >= 2 and crowded is not None else capacity
    return total / pipelines


def _reduced_exact(compiled: Compiled, fwd: list[float], bwd: list[float], nbytes: float, netw: _Net, row: int,
                   pipelines: int, rendezvous: bool = False) -> EngineResult:
    """One pipeline of a lockstep class through the exact simulator, each link at the
    class's lockstep share (used when the pipeline's own transfers overlap on a link)."""
    sched = compiled.schedule
    resources: dict[str, Resource] = {}
    paths: dict[tuple[int, int, str], Path] = {}
    for ch in range(compiled.channels):
        b, direction = divmod(ch, 2)
        dname = "fwd" if direction == 0 else "bwd"
        chan = f"chan:{b}:{dname}"
        if (row, ch) in netw.lan:
            resources[chan] = Resource(netw.lan[(row, ch)], "exclusive")
            paths[(0, b, dname)] = Path((chan,), netw.shared[row][ch].latency_s)
            continue
        _, wp = netw.wan_channels[(row, ch)]
        resources[chan] = Resource(wp.streams * wp.flow_rate_bps, "exclusive")
        for k in netw.shared[row][ch].links:
            cap, crowd = netw.capacity[k], netw.crowded[k]
            if pipelines >= 2:
                resources[netw.links[k]] = Resource(_lockstep_share(cap, crowd, pipelines))
            else:
                resources[netw.links[k]] = Resource(cap, crowded_bps=crowd)
        paths[(0, b, dname)] = Path((chan, *wp.resources), wp.latency_s)
    nb = [nbytes] * (sched.stages - 1)
    sim = simulate(SimSpec(sched, 1, list(fwd), list(bwd), nb, list(nb), paths, resources, rendezvous=rendezvous))
    return _from_sim(sim, compiled, fwd, bwd)


def _from_sim(sim: SimResult, compiled: Compiled, fwd: list[float], bwd: list[float]) -> EngineResult:
    p = compiled.schedule.ranks
    starts = np.empty((sim.pipelines * p, compiled.compute_per_rank))
    fill = [0] * (sim.pipelines * p)
    for c in sim.compute:  # appended in each worker's execution order
        w = c.pipeline * p + c.rank
        starts[w, fill[w]] = c.start
        fill[w] += 1
    durations = np.array([[bwd[x] if y else fwd[x] for kind, x, y in compiled.ops[r] if kind == 0]
                          for r in range(p)])
    return EngineResult(sim.makespan, starts, durations, [], sim.pipelines, p)


def _last_backward(result: EngineResult, compiled: Compiled) -> dict[int, float]:
    """Per virtual stage, when its last backward ends (over all pipelines)."""
    p = compiled.schedule.ranks
    ends = result.ends
    out: dict[int, float] = {}
    for r in range(p):
        j = -1
        last: dict[int, int] = {}
        for kind, x, y in compiled.ops[r]:
            if kind == 0:
                j += 1
                if y:
                    last[x] = j
        rows = ends[r::p]
        for stage, idx in last.items():
            out[stage] = max(out.get(stage, -math.inf), float(rows[:, idx].max()))
    return out


def _gaps(result: EngineResult, makespan: float, weight: float) -> Gaps:
    starts, ends = result.starts, result.ends
    before = starts[:, :1]
    between = starts[:, 1:] - ends[:, :-1]
    after = makespan - ends[:, -1:]
    g = np.concatenate([before, between, after], axis=1).ravel()
    g = g[g > 1e-12]
    return Gaps(g, np.full(g.shape, float(weight)))


def _allreduce(topology: Topology, workload: Workload, placement: Placement, eff: EffectiveWorkload,
               makespan: float, last_b: dict[int, float], variant: Variant, net: NetParams
               ) -> tuple[float, dict[str, float]]:
    """The planner's all-reduce time (its own function, fed the last backward of each
    stage) and the bytes its rings put on each WAN link direction."""
    sched_ranks = workload.parallelism.pp
    spans = [ComputeSpan(0, k % sched_ranks, k, "B", 0, t, t) for k, t in sorted(last_b.items())]
    fake = SimResult(makespan, spans, [], 1, sched_ranks)
    ar = allreduce_time(topology, workload, placement, eff, fake, variant, net)
    dp = workload.parallelism.dp
    wan: dict[str, float] = {}
    if dp > 1:
        dtype_bytes = workload.model_spec().dtype_bytes
        routes: dict[tuple[str, str], WanPath] = {}
        for k in range(eff.stages):
            r = k % sched_ranks
            volume = 2 * (dp - 1) / dp * eff.stage_params[k] * dtype_bytes * workload.scale
            ring = [placement.dc_of(d, r) for d in range(dp)]
            for i in range(dp):
                a, z = ring[i], ring[(i + 1) % dp]
                if a == z:
                    continue
                if (a, z) not in routes:
                    routes[(a, z)] = wan_path(topology, a, z, variant.streams, net, fill_link=variant.fill_link)
                for res in routes[(a, z)].resources:
                    wan[res] = wan.get(res, 0.0) + volume
    return ar, wan


def _stub_spec(sched: Schedule, pipelines: int, fwd: list[float], bwd: list[float], nbytes: float,
               netw: _Net, wire: float = 1.0) -> SimSpec:
    """A spec with the WAN paths of one pipeline per row: enough for the planner's
    `stagger_candidates` (which looks at one transfer alone on a link, its hold, and the
    stage times). `wire`: planned transfers' time on the wire over the paths' model (a
    calibration's; their rates divided by it, as the planner's calibrated rates)."""
    resources: dict[str, Resource] = {}
    paths: dict[tuple[int, int, str], Path] = {}
    for (row, ch), (chan, wp) in netw.wan_channels.items():
        b, direction = divmod(ch, 2)
        resources[f"{chan}:{row}"] = Resource(wp.streams * wp.flow_rate_bps / wire, "exclusive")
        for k in netw.exclusive[row][ch].links:
            resources[netw.links[k]] = Resource(netw.capacity[k] / wire, hold_factor=netw.hold[k])
        paths[(row, b, "fwd" if direction == 0 else "bwd")] = Path((f"{chan}:{row}", *wp.resources), wp.latency_s)
    nb = [nbytes] * max(sched.stages - 1, 0)
    return SimSpec(sched, pipelines, list(fwd), list(bwd), nb, list(nb), paths, resources)


def _plan(result: EngineResult, compiled: Compiled, netw: _Net, offsets: list[float], stagger: float,
          tried: list[tuple[float, float]]) -> TemporalPlan:
    """The token order and slots of the kept stride, as the planner's TemporalPlan."""
    order: dict[str, list[tuple[float, TransferKey]]] = {}
    slots: dict[TransferKey, tuple[float, float]] = {}
    resources_of: dict[TransferKey, tuple[str, ...]] = {}
    for d, x, s, e in result.wan:
        b, mb, direction = compiled.channel_of(x)
        key = TransferKey(d, b, mb, "fwd" if direction == 0 else "bwd")
        ch = b * 2 + direction
        ids = netw.exclusive[netw.row_of[d]][ch].links
        names = tuple(netw.links[k] for k in ids)
        slots[key] = (s, s + (e - s) * max([netw.hold[k] for k in ids], default=1.0))  # its hold, as derive_plan
        resources_of[key] = names
        for name in names:
            order.setdefault(name, []).append((s, key))
    ordered = {name: [k for _, k in sorted(v)] for name, v in sorted(order.items())}
    return TemporalPlan(list(offsets), ordered, slots, resources_of, stagger, result.makespan, list(tried))


def fast_predict(
    topology: Topology,
    workload: Workload,
    variant: Variant,
    *,
    free: dict[str, int] | None = None,
    gpus_per_host: int = 1,
    net: NetParams | None = None,
    base_dir: str | None = None,
    placement: Placement | None = None,
    effective: EffectiveWorkload | None = None,
    keep_plan: bool = False,
    hold: float = 1.0,
    plan_margin: float | None = None,
    wire: float | None = None,
) -> FastPrediction:
    """The planner's prediction of `workload` on `topology` under `variant`, computed
    the fast way (see the module docstring); `keep_plan` also builds Atlas's token
    order (as `TemporalPlan`, for display). `hold` > 1: under temporal sharing a
    transfer holds its links that many times its wire time (a runner that plans each
    transfer longer than calibrated, as `testbed run`'s token margin does; 1 is the
    planner's model). `wire`: under temporal sharing a transfer's bytes reach its
    receiver after that many times its wire time (the turns probe's time on the wire,
    0 < wire <= hold), its links held `hold` times it, as the planner's
    `NetParams.path_hold_factor` (hold / wire); None: `hold`, the bytes held to the
    hold's end. `plan_margin`: with sharing ``auto``, the plan runs only where
    sharing is predicted slower by more than this (`plan_wins`, as a calibrated run
    chooses: TEMPORAL_MARGIN); None: `choose_sharing`, as the planner's `predict`."""
    out = _predict(topology, workload, variant, free, gpus_per_host, net, base_dir, placement, effective, keep_plan,
                   hold, math.inf, plan_margin, wire)
    assert out is not None  # nothing to beat
    return out


def fast_predict_below(
    beat: float,
    topology: Topology,
    workload: Workload,
    variant: Variant,
    *,
    free: dict[str, int] | None = None,
    net: NetParams | None = None,
    placement: Placement | None = None,
    effective: EffectiveWorkload | None = None,
    hold: float = 1.0,
    plan_margin: float | None = None,
    wire: float | None = None,
) -> FastPrediction | None:
    """`fast_predict`, when its pipeline time (the iteration without the all-reduce) is
    below `beat`; None as soon as it is known not to be (an alternative that only
    matters if it wins: Atlas's stride search then stops every stride at `beat`)."""
    return _predict(topology, workload, variant, free, 1, net, None, placement, effective, False, hold, beat,
                    plan_margin, wire)


def _predict(topology: Topology, workload: Workload, variant: Variant, free: dict[str, int] | None,
             gpus_per_host: int, net: NetParams | None, base_dir: str | None, placement: Placement | None,
             effective: EffectiveWorkload | None, keep_plan: bool, hold: float, beat: float,
             plan_margin: float | None = None, wire: float | None = None) -> FastPrediction | None:
    net = net or NetParams()
    par = workload.parallelism
    eff = effective or workload.effective(base_dir)
    free = free if free is not None else free_gpus(topology, gpus_per_host)
    if placement is None:
        hosts = {dc.name: list(dc.hosts) for dc in topology.dcs if dc.hosts}
        placement = place(free, par.pp, par.dp, par.tp, strategy=variant.placement, hosts=hosts or None,
                          gpus_per_host=gpus_per_host, chunks=par.chunks)
    sched = build_schedule(par.schedule, par.pp, par.num_micro_batches, par.chunks)
    compiled = Compiled.of(sched)
    fwd, bwd = list(eff.stage_forward_s), list(eff.stage_backward_s)
    nbytes = float(eff.wire_activation_bytes)
    if hold < 1:
        raise ValueError(f"hold must be >= 1, got {hold}")
    wire = hold if wire is None else wire
    if not 0 < wire <= hold:
        raise ValueError(f"wire must be above 0 and at most hold ({hold}), got {wire}")
    netw = _network(topology, sched, placement, variant, net, nbytes * 8)
    if wire != 1.0:
        netw.exclusive = [[Route(r.seconds * wire, r.latency_s, r.links) if r.links else r for r in row]
                          for row in netw.exclusive]
    if hold != wire:  # the bytes arrive after `wire`, the links are handed on after `hold`
        netw.hold = [max(h, hold / wire) for h in netw.hold]
    link_hold = netw.hold if any(h != 1.0 for h in netw.hold) else None
    D = par.dp
    counts = [netw.row_of.count(i) for i in range(len(netw.rows))]
    wan_rows = sorted({row for row, _ in netw.wan_channels})

    # ---- shared links: one pipeline per placement row, in lockstep with its twins
    def shared_run() -> tuple[float, list[tuple[EngineResult, int]], str]:
        # rows that meet on links do not move in lockstep, and the fast engine's gloo
        # notices are kept for 1F1B and GPipe (not interleaved chunks): the exact model
        if len(wan_rows) > 1 or (variant.rendezvous and par.chunks > 1):
            whole = _from_sim(simulate(_full_spec(topology, workload, placement, variant, eff, net)),
                              compiled, fwd, bwd)
            return whole.makespan, [(whole, 1)], "exact"
        out, method = [], "fast"
        for i in range(len(netw.rows)):
            res = run(compiled, fwd, bwd, [netw.shared[i]], [0], record_wan=True, rendezvous=variant.rendezvous)
            if res.wan and overlaps(res, compiled, [netw.shared[i]], [0]):
                res, method = (_reduced_exact(compiled, fwd, bwd, nbytes, netw, i, counts[i], variant.rendezvous),
                               "fast+exact-pipeline")
            out.append((res, counts[i]))
        return max(r.makespan for r, _ in out), out, method

    def shared_floor() -> float:
        """A lower bound of shared_run's makespan: the lockstep pipelines of one row each
        hold capacity(D users) / D of a link, so one pipeline's transfers there take at
        least their bits over that share, one after another or together (0 where rows
        meet on links: not bounded here)."""
        if len(wan_rows) != 1:
            return 0.0
        (row,) = wan_rows
        per_link: dict[int, int] = {}
        for (r, ch) in netw.wan_channels:
            if r == row:
                for k in netw.shared[r][ch].links:
                    per_link[k] = per_link.get(k, 0) + sched.microbatches
        return max((n * nbytes * 8 / _lockstep_share(netw.capacity[k], netw.crowded[k], counts[row])
                    for k, n in per_link.items()), default=0.0)

    # ---- temporal: every pipeline, links held alone, the planner's strides
    def temporal_run(limit: float = math.inf
                     ) -> tuple[float, EngineResult, float, list[tuple[float, float | None]], list[float]] | None:
        """The stride search; None where every stride reaches `limit`."""
        stub = _stub_spec(sched, D, fwd, bwd, nbytes, netw, wire)
        candidates = stagger_candidates(stub, set(netw.links))
        last_row = netw.row_of[-1]
        alone = run(compiled, fwd, bwd, [netw.exclusive[last_row]], [0], links=len(netw.links),
                    exclusive_links=True, link_hold=link_hold).makespan
        # The skip bound holds when a pipeline has at most one channel on each link
        # direction: its own transfers there then keep their order, and the others only
        # delay them. Otherwise (an order among its own transfers could change) every
        # stride runs.
        users = [(row, k) for (row, ch) in netw.wan_channels for k in netw.exclusive[row][ch].links]
        may_skip = len(users) == len(set(users))
        # Always sound: the last pipeline starts (D - 1) x stride late and its busiest
        # rank still has all its compute to run.
        compute = max(sum(bwd[x] if y else fwd[x] for kind, x, y in ops if kind == 0) for ops in compiled.ops)
        def stride(delta: float, cutoff: float) -> EngineResult:
            return run(compiled, fwd, bwd, netw.exclusive, netw.row_of, [d * delta for d in range(D)],
                       links=len(netw.links), exclusive_links=True, record_wan=keep_plan, cutoff=cutoff,
                       link_hold=link_hold)

        best: tuple[float, float, EngineResult] | None = None
        tried: list[tuple[float, float | None]] = []

        def bar_now() -> float:
            return limit if best is None else best[1] * (1 - PLAN_TIE)

        def skipped(delta: float, bar: float) -> bool:
            floor = (D - 1) * delta + (alone if may_skip else compute)
            return (best is not None or math.isfinite(limit)) and floor >= bar

        def cutoff_of(bar: float) -> float:
            # a stride that cannot beat the best (or the limit) is stopped as soon as the
            # engine's bounds show it (the margin keeps rounding from stopping a winner)
            return bar * (1 + 1e-12) if math.isfinite(bar) else math.inf

        # Where the search is large, the strides run on `workers` threads, this one and the
        # next ones (the compiled engine releases the GIL; `_stride_workers`), each under
        # the bar known when it starts, which is never below the bar it meets in order.
        # The results are taken in candidate order under that bar, so the choice and
        # `tried` are the one-at-a-time search's: a stride that ran past the bar it meets
        # in order counts as stopped, one the bar would have skipped as skipped.
        workers = _stride_workers(D * compiled.schedule.ranks * compiled.compute_per_rank)
        ahead: dict[int, Future[EngineResult]] = {}
        nxt = 0
        for i, delta in enumerate(candidates):
            bar = bar_now()
            nxt = max(nxt, i + 1)
            while workers > 1 and nxt < len(candidates) and len(ahead) < workers:
                if not skipped(candidates[nxt], bar):
                    ahead[nxt] = _stride_pool(workers).submit(stride, candidates[nxt], cutoff_of(bar))
                nxt += 1
            job = ahead.pop(i, None)
            if skipped(delta, bar):
                if job is not None:
                    job.cancel()  # not started yet: never run it
                tried.append((delta, None))
                continue
            if job is not None and job.cancel():  # still queued behind a stride the bar skipped: run it here
                job = None
            res = job.result() if job is not None else stride(delta, cutoff_of(bar))
            if res.stopped or res.makespan >= cutoff_of(bar):
                tried.append((delta, None))
                continue
            tried.append((delta, res.makespan))
            if best is None or res.makespan < best[1] * (1 - PLAN_TIE):
                best = (delta, res.makespan, res)
        if best is None:  # every stride reached the limit (without one: stagger_candidates always has 0)
            return None
        return best[1], best[2], best[0], tried, [d * best[0] for d in range(D)]

    method = "fast"
    alternatives = None
    stagger = None
    staggers: list[tuple[float, float | None]] = []
    plan = None
    offsets = None
    if variant.sharing != "shared" and netw.links:
        temporal = temporal_run(beat)
        if temporal is None and variant.sharing != "auto":
            return None  # every stride reaches `beat`
        chosen = "temporal"
        if variant.sharing == "auto":
            if temporal is None and shared_floor() >= beat:
                return None  # neither way comes in under `beat`
            s_makespan, s_runs, s_method = shared_run()
            if temporal is None:  # the plan takes `beat` or more: sharing wins only where clearly below it
                if s_makespan >= beat:
                    return None
                # choose_sharing needs the plan's own time; plan_wins never takes a plan above a faster sharing
                if plan_margin is None and s_makespan >= beat * (1 - SHARING_MARGIN):
                    temporal = temporal_run()
            if temporal is None:
                alternatives, chosen = {"shared": s_makespan}, "shared"
            else:
                alternatives = {"temporal": temporal[0], "shared": s_makespan}
                if plan_margin is None:
                    chosen = choose_sharing(temporal[0], s_makespan)
                else:
                    chosen = "temporal" if plan_wins(temporal[0], s_makespan, plan_margin) else "shared"
        if chosen == "temporal":
            assert temporal is not None
            t_makespan, t_res, delta, staggers, offs = temporal
            makespan, runs, stagger, offsets = t_makespan, [(t_res, 1)], delta, offs
            if keep_plan:
                plan = _plan(t_res, compiled, netw, offs, delta, [(s, t) for s, t in staggers if t is not None])
        else:
            makespan, runs, method = s_makespan, s_runs, s_method
    else:
        makespan, runs, method = shared_run()
    if makespan >= beat:
        return None

    last_b: dict[int, float] = {}
    for res, _ in runs:
        for k, t in _last_backward(res, compiled).items():
            last_b[k] = max(last_b.get(k, -math.inf), t)
    ar, ar_wan = _allreduce(topology, workload, placement, eff, makespan, last_b, variant, net)
    gaps = [_gaps(res, makespan, w) for res, w in runs]
    all_gaps = Gaps(np.concatenate([g.seconds for g in gaps]), np.concatenate([g.weight for g in gaps]))
    busy_rank = runs[0][0].durations.sum(axis=1)
    busy = float(busy_rank.mean())
    free_net = [[Route(0.0, 0.0)] * compiled.channels]
    compute_only = run(compiled, fwd, bwd, free_net, [0]).makespan
    wan_bytes: dict[str, float] = {}
    for (row, ch), _ in netw.wan_channels.items():
        for k in netw.shared[row][ch].links:
            name = netw.links[k]
            wan_bytes[name] = wan_bytes.get(name, 0.0) + nbytes * sched.microbatches * counts[row]
    return FastPrediction(
        variant=variant, placement=placement,
        iteration_time_s=makespan + (ar if net.allreduce else 0.0),
        pipeline_time_s=makespan, allreduce_s=ar, compute_only_s=compute_only,
        bubble_fraction=1 - busy / makespan if makespan > 0 else 0.0,
        ideal_bubble_fraction=sched.ideal_bubble_fraction(),
        paths=netw.paths, wan_bytes=wan_bytes, allreduce_wan_bytes=ar_wan,
        devices=D * sched.ranks, busy_s=busy, gaps=all_gaps, method=method,
        sharing_alternatives=alternatives, stagger_s=stagger, staggers=staggers, plan=plan, offsets=offsets,
    )


def _full_spec(topology: Topology, workload: Workload, placement: Placement, variant: Variant,
               eff: EffectiveWorkload, net: NetParams) -> SimSpec:
    from testbed_core.planning.prediction import build_spec

    return build_spec(topology, workload, placement, variant, eff, net)[0]
