"""Atlas's planner: where the pipeline stages go, and how long an iteration takes.

Placement (the DC-selection heuristic of Atlas): tensor and data parallelism stay
inside a DC, so a pipeline stage with its DP replicas needs ``tp * dp`` GPUs in one
DC. Sort DCs by free GPUs, largest first; give each DC ``floor(free / (tp * dp))``
consecutive stages until all ``pp`` are placed; if they do not all fit, the request
is infeasible and the error says by how much. Filling the largest DC first
minimises the boundaries that cross the WAN. Other strategies exist for comparison
(``in-order``, ``even``, ``round-robin``, ``dp-across``, see `place`).

Iteration time: the pipeline schedule is simulated (testbed_core/simulate.py)
with each stage's compute time from the workload's compute model, every pipeline
boundary carrying ``micro_batch x seq_len x hidden x bytes`` (times the workload's
scale) each way per micro-batch, and every WAN crossing costing its one-way latency
plus the transfer time. Each (pipeline, boundary, direction) is one transport
channel whose tensors go one after another over its N TCP connections, so a channel
moves at most ``N x per-flow rate``; the per-flow rate is the TCP window over the RTT
(window = min(sender tcp_wmem max, receiver tcp_rmem max x rmem_fraction)) and, on
lossy links, Mathis et al.'s ``1.22 MSS / (RTT sqrt(loss))``. Channels crossing the
same WAN link direction share it max-min fairly, or one at a time under a temporal
plan. Variants:

* ``baseline``: 1 stream per channel; pipelines share links when they overlap.
* ``multi-tcp``: N streams per channel, shared.
* ``atlas``: N streams (at least enough to fill the link), Atlas placement, and
  temporal sharing (testbed_core/planning/temporal.py) *when it is predicted to pay*:
  sharing ``auto`` simulates the iteration both ways and keeps temporal sharing
  unless sharing the link is predicted faster by more than ``SHARING_MARGIN`` (a
  fixed token order makes a ready transfer wait for its turn, which loses when the
  link is short or one transfer cannot fill it). The prediction says which ran and
  what each would take.
* ``dp-across-dc``: N streams, shared, each pipeline in its own DC (DP crosses the WAN).

Fill and drain come out of the simulation. The DP gradient all-reduce (ring, after
each stage's last backward) is added unless switched off; it is reported apart.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from testbed_core.planning.temporal import TemporalPlan, derive_plan
from testbed_core.schedules import build_schedule
from testbed_core.simulate import Path, Resource, SimResult, SimSpec, simulate
from testbed_core.topology import Topology, shortest_path
from testbed_core.workload import EffectiveWorkload, Workload

STRATEGIES = ("atlas", "in-order", "even", "round-robin", "dp-across")
MSS = 1448
SHARING_MARGIN = 0.03  # temporal sharing is kept unless sharing is predicted this much faster
Sharing = Literal["shared", "temporal", "auto"]


class PlacementError(ValueError):
    """Stages that cannot be placed on the free GPUs; the message says the shortfall."""


# ------------------------------------------------------------------ placement

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

    def crossings(self, topology: Topology | None = None) -> list[Crossing]:
        found: dict[tuple[int, str, str], list[int]] = {}
        for d, row in enumerate(self.stage_dc):
            for b in range(self.pp - 1):
                if row[b] != row[b + 1]:
                    found.setdefault((b, row[b], row[b + 1]), []).append(d)
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
) -> Placement:
    """Place `pp` stages of `dp` pipelines (each stage `tp` GPUs) on DCs with `free` GPUs.

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
            raise PlacementError(f"infeasible: placement {strategy} puts more GPUs in a DC than it has ({detail})")
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
    else:
        raise PlacementError(f"unknown placement strategy {strategy!r} (allowed: {', '.join(STRATEGIES)})")
    return Placement(strategy, pp, dp, tp, tuple(rows), _assign_hosts(rows, tp, hosts, gpus_per_host), dict(free))


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
    """Free GPUs per DC: hosts x gpus_per_host, unless overridden (unknown DCs refused)."""
    free = {dc.name: len(dc.hosts) * gpus_per_host for dc in topology.dcs}
    for dc, n in (override or {}).items():
        if dc not in free:
            raise PlacementError(f"--gpus: unknown DC {dc!r} (DCs in topology {topology.name}: {', '.join(free)})")
        free[dc] = n
    return free


# ------------------------------------------------------------ iteration model

@dataclass(frozen=True)
class Variant:
    """streams: TCP connections per channel ("auto": enough to fill the link);
    sharing: how channels crossing one WAN link use it ("auto": temporal unless
    sharing is predicted faster, see `choose_sharing`);
    fill_link: use at least as many as fill the link (Atlas: giving the link to one
    transfer at a time only pays if that transfer can use all of it)."""

    name: str
    streams: int | Literal["auto"]
    sharing: Sharing
    placement: str
    fill_link: bool = False


def default_variants(streams: int | Literal["auto"] = 8, baseline_placement: str = "even") -> dict[str, Variant]:
    return {
        "baseline": Variant("baseline", 1, "shared", baseline_placement),
        "multi-tcp": Variant("multi-tcp", streams, "shared", baseline_placement),
        "atlas": Variant("atlas", streams, "auto", "atlas", fill_link=True),
        "dp-across-dc": Variant("dp-across-dc", streams, "shared", "dp-across"),
    }


@dataclass(frozen=True)
class NetParams:
    """Knobs of the network model (all visible in the output)."""

    rmem_fraction: float = 0.5  # share of tcp_rmem advertised as window (Linux tcp_adv_win_scale=1)
    flow_rate_bps: float | None = None  # a measured single-flow rate; overrides the window model
    lan_latency_s: float = 0.0
    max_streams: int = 64
    allreduce: bool = True  # add the DP gradient all-reduce to the iteration time
    # share of a WAN link's rate that two or more colliding transfers get in total
    # (measured by the runner's collision probe; None: the fluid model, all of it)
    crowded_fraction: float | None = None


@dataclass(frozen=True)
class WanPath:
    src: str
    dst: str
    dcs: tuple[str, ...]
    resources: tuple[str, ...]
    latency_s: float
    bottleneck_bps: float
    flow_rate_bps: float
    streams: int

    @property
    def rtt_s(self) -> float:
        return 2 * self.latency_s

    @property
    def rate_bps(self) -> float:
        """One transfer's rate when it has the path to itself."""
        return min(self.bottleneck_bps, self.streams * self.flow_rate_bps)

    def to_json(self) -> dict[str, Any]:
        return {"src": self.src, "dst": self.dst, "path": list(self.dcs), "links": list(self.resources),
                "one_way_latency_s": self.latency_s, "bottleneck_bps": self.bottleneck_bps,
                "per_flow_rate_bps": self.flow_rate_bps, "streams": self.streams,
                "transfer_rate_bps": self.rate_bps}


def wan_resource(a: str, b: str) -> str:
    return f"wan:{a}->{b}"


def wan_path(
    topology: Topology, src: str, dst: str, streams: int | str, net: NetParams, *, fill_link: bool = False
) -> WanPath:
    """Route, latency and rates between two DCs; with `fill_link`, at least enough
    streams for one transfer to fill the bottleneck link."""
    dcs = tuple(shortest_path(src, dst, topology.wan))
    links = [topology.link(x, y) for x, y in zip(dcs, dcs[1:], strict=False)]
    latency = sum(link.delay for link in links)
    rtt = 2 * latency
    bottleneck = min(link.rate for link in links)
    if net.flow_rate_bps is not None:
        flow = net.flow_rate_bps
    else:
        window = min(topology.tcp_for(src).wmem_max, topology.tcp_for(dst).rmem_max * net.rmem_fraction)
        flow = window * 8 / rtt if rtt > 0 else math.inf
        loss = 1 - math.prod(1 - link.loss for link in links)
        if loss > 0 and rtt > 0:
            flow = min(flow, 1.22 * MSS * 8 / (rtt * math.sqrt(loss)))  # Mathis et al. 1997
    fill = 1 if flow >= bottleneck else min(net.max_streams, math.ceil(bottleneck / flow - 1e-9))
    n = fill if streams == "auto" else int(streams)
    if fill_link:
        n = max(n, fill)
    return WanPath(src, dst, dcs, tuple(wan_resource(x, y) for x, y in zip(dcs, dcs[1:], strict=False)),
                   latency, bottleneck, flow, n)


@dataclass
class Prediction:
    variant: Variant
    placement: Placement
    iteration_time_s: float
    pipeline_time_s: float  # the schedule alone, without the all-reduce
    allreduce_s: float  # time the all-reduce adds (included in iteration_time_s if net.allreduce)
    compute_only_s: float  # the same schedule with a free, instant network
    bubble_fraction: float
    ideal_bubble_fraction: float
    paths: dict[tuple[str, str], WanPath]
    wan_bytes: dict[str, float]  # per link direction, per iteration (wire bytes)
    sim: SimResult = field(repr=False)
    spec: SimSpec = field(repr=False)
    plan: TemporalPlan | None = field(default=None, repr=False)
    effective: EffectiveWorkload | None = field(default=None, repr=False)
    # "auto" sharing: the predicted iteration time of each way ({"temporal": s, "shared": s})
    sharing_alternatives: dict[str, float] | None = None

    @property
    def sharing(self) -> str:
        """How this prediction's WAN links are used: temporal (a plan) or shared."""
        return "temporal" if self.plan is not None else "shared"

    def to_json(self, topology: Topology | None = None) -> dict[str, Any]:
        return {
            "variant": self.variant.name,
            "streams": self.variant.streams,
            "fill_link": self.variant.fill_link,
            "sharing": self.sharing,
            "sharing_requested": self.variant.sharing,
            "sharing_alternatives_s": self.sharing_alternatives,
            "placement": self.placement.to_json(topology),
            "predicted_iteration_time_s": self.iteration_time_s,
            "pipeline_time_s": self.pipeline_time_s,
            "allreduce_s": self.allreduce_s,
            "compute_only_s": self.compute_only_s,
            "bubble_fraction": self.bubble_fraction,
            "ideal_bubble_fraction": self.ideal_bubble_fraction,
            "wan_paths": [p.to_json() for p in self.paths.values()],
            "wan_bytes_per_iteration": self.wan_bytes,
            "temporal_plan": self.plan.to_json() if self.plan else None,
        }


def channel_resource(pipeline: int, boundary: int, direction: str) -> str:
    return f"chan:p{pipeline}:b{boundary}:{direction}"


def build_spec(
    topology: Topology,
    workload: Workload,
    placement: Placement,
    variant: Variant,
    eff: EffectiveWorkload,
    net: NetParams,
) -> tuple[SimSpec, dict[tuple[str, str], WanPath]]:
    """The simulation of one iteration of `workload` placed on `topology`.

    Each (pipeline, boundary, direction) is one transport channel: its tensors go
    one after another over its own connections (a FIFO resource at streams x per-flow
    rate on the WAN, the LAN rate inside a DC); on the WAN they also share the link
    directions of their route with every other channel.
    """
    par = workload.parallelism
    sched = build_schedule(par.schedule, par.pp, par.num_micro_batches, par.chunks)
    nbytes = [float(eff.wire_activation_bytes)] * (sched.stages - 1)
    resources: dict[str, Resource] = {}
    paths: dict[tuple[int, int, str], Path] = {}
    wan: dict[tuple[str, str], WanPath] = {}
    for d in range(par.dp):
        for b in range(sched.stages - 1):
            ra, rb = sched.rank_of(b), sched.rank_of(b + 1)
            for direction, src, dst in (("fwd", ra, rb), ("bwd", rb, ra)):
                a, z = placement.dc_of(d, src), placement.dc_of(d, dst)
                chan = channel_resource(d, b, direction)
                if a == z:
                    resources[chan] = Resource(topology.dc(a).lan_rate, "exclusive")
                    paths[(d, b, direction)] = Path((chan,), net.lan_latency_s)
                    continue
                if (a, z) not in wan:
                    wan[(a, z)] = wan_path(topology, a, z, variant.streams, net, fill_link=variant.fill_link)
                wp = wan[(a, z)]
                for x, y in zip(wp.dcs, wp.dcs[1:], strict=False):
                    rate = topology.link(x, y).rate
                    crowded = None if net.crowded_fraction is None else rate * net.crowded_fraction
                    resources[wan_resource(x, y)] = Resource(rate, crowded_bps=crowded)
                resources[chan] = Resource(wp.streams * wp.flow_rate_bps, "exclusive")
                paths[(d, b, direction)] = Path((chan, *wp.resources), wp.latency_s)
    spec = SimSpec(sched, par.dp, list(eff.stage_forward_s), list(eff.stage_backward_s), nbytes, list(nbytes),
                   paths, resources)
    return spec, wan


def allreduce_time(
    topology: Topology, workload: Workload, placement: Placement, eff: EffectiveWorkload,
    sim: SimResult, variant: Variant, net: NetParams,
) -> float:
    """Extra time the ring all-reduce of each stage's gradients adds after its last
    backward: 2(dp-1)/dp of the stage's (wire-scaled) gradient bytes at the slowest
    hop of the ring, plus 2(dp-1) one-way latencies. Stages whose rings share a WAN
    link share its rate."""
    dp = workload.parallelism.dp
    if dp == 1:
        return 0.0
    sched = build_schedule(workload.parallelism.schedule, workload.parallelism.pp,
                           workload.parallelism.num_micro_batches, workload.parallelism.chunks)
    dtype_bytes = workload.model_spec().dtype_bytes
    finish = sim.makespan
    wan_load: dict[str, float] = {}
    wan_start: dict[str, float] = {}
    wan_info: dict[str, tuple[float, float]] = {}
    for k in range(sched.stages):
        r = sched.rank_of(k)
        grad_bytes = eff.stage_params[k] * dtype_bytes * workload.scale
        volume = 2 * (dp - 1) / dp * grad_bytes * 8
        last_b = max(c.end for c in sim.compute if c.stage == k and c.kind == "B")
        ring = [placement.dc_of(d, r) for d in range(dp)]
        hops = [(ring[i], ring[(i + 1) % dp]) for i in range(dp) if ring[i] != ring[(i + 1) % dp]]
        if not hops:
            lan = topology.dc(ring[0]).lan_rate
            finish = max(finish, last_b + volume / lan + 2 * (dp - 1) * net.lan_latency_s)
            continue
        for a, z in hops:
            wp = wan_path(topology, a, z, variant.streams, net, fill_link=variant.fill_link)
            for res in wp.resources:
                wan_load[res] = wan_load.get(res, 0.0) + volume
                wan_start[res] = min(wan_start.get(res, math.inf), last_b)
                lat, rate = wan_info.get(res, (0.0, math.inf))
                wan_info[res] = (max(lat, wp.latency_s), min(rate, wp.rate_bps))
    for res, bits in wan_load.items():
        lat, rate = wan_info[res]
        finish = max(finish, wan_start[res] + bits / rate + 2 * (dp - 1) * lat)
    return finish - sim.makespan


def predict(
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
) -> Prediction:
    """Predicted iteration time of `workload` on `topology` under `variant`;
    `effective` replaces the workload's derived numbers (e.g. measured compute times)."""
    net = net or NetParams()
    par = workload.parallelism
    eff = effective or workload.effective(base_dir)
    free = free if free is not None else free_gpus(topology, gpus_per_host)
    if placement is None:
        placement = place(free, par.pp, par.dp, par.tp, strategy=variant.placement,
                          hosts={dc.name: list(dc.hosts) for dc in topology.dcs}, gpus_per_host=gpus_per_host)
    spec, paths = build_spec(topology, workload, placement, variant, eff, net)
    plan = None
    alternatives = None
    sim = None
    links = [name for name in spec.resources if name.startswith("wan:")]
    if variant.sharing != "shared" and links:
        plan = derive_plan(spec, links)
        planned = plan.apply(spec)
        sim = simulate(planned)
        if variant.sharing == "auto":
            shared = simulate(spec)
            alternatives = {"temporal": sim.makespan, "shared": shared.makespan}
            if choose_sharing(sim.makespan, shared.makespan) == "shared":
                plan, sim = None, shared
            else:
                spec = planned
        else:
            spec = planned
    if sim is None:
        sim = simulate(spec)
    idle_net = replace(spec, paths={}, resources={}, offsets=None)
    compute_only = simulate(idle_net).makespan
    ar = allreduce_time(topology, workload, placement, eff, sim, variant, net)
    wan_bytes: dict[str, float] = {}
    for t in sim.transfers:
        for res in t.resources:
            if res.startswith("wan:"):
                wan_bytes[res] = wan_bytes.get(res, 0.0) + t.nbytes
    sched = spec.schedule
    return Prediction(
        variant=variant, placement=placement,
        iteration_time_s=sim.makespan + (ar if net.allreduce else 0.0),
        pipeline_time_s=sim.makespan, allreduce_s=ar, compute_only_s=compute_only,
        bubble_fraction=sim.bubble_fraction(), ideal_bubble_fraction=sched.ideal_bubble_fraction(),
        paths=paths, wan_bytes=wan_bytes, sim=sim, spec=spec, plan=plan, effective=eff,
        sharing_alternatives=alternatives,
    )


def choose_sharing(temporal_s: float, shared_s: float, margin: float = SHARING_MARGIN) -> str:
    """"temporal" unless sharing the links is predicted faster by more than `margin`
    (the plan is the point of Atlas; only a clear predicted loss overrides it)."""
    return "shared" if shared_s < temporal_s * (1 - margin) else "temporal"
