"""The prediction: how long one training iteration takes for a variant on a placement.

The pipeline schedule is simulated (testbed_core/simulate.py) with each stage's
compute time from the workload's compute model, every pipeline boundary carrying
``micro_batch x seq_len x hidden x bytes`` (times the workload's scale) each way per
micro-batch, and every WAN crossing costing its one-way latency plus the transfer
time at the rates of the network model (testbed_core/planning/network.py). Channels
crossing the same WAN link direction share it max-min fairly, or go one at a time
under a temporal plan (testbed_core/planning/temporal.py).

What a variant changes is defined once, in testbed_core/variants.py; `Variant` is
that definition made concrete for one prediction (a stream count, a placement
strategy). Sharing ``auto`` (Atlas) simulates the iteration both ways and keeps
temporal sharing unless sharing the link is predicted faster by more than
``SHARING_MARGIN``: a fixed token order makes a ready transfer wait for its turn,
which loses when the link is short or one transfer cannot fill it. The prediction
says which ran and what each would take.

Fill and drain come out of the simulation. The DP gradient all-reduce (ring, after
each stage's last backward) is added unless switched off; it is reported apart.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal

from testbed_core.planning.collisions import drawn
from testbed_core.planning.interleave import interleave
from testbed_core.planning.lossy import lossy_between, lossy_routes, spread_makespan
from testbed_core.planning.network import (
    NetParams,
    WanPath,
    refill_s,
    sustained_bps,
    wan_path,
    wan_resource,
)
from testbed_core.planning.placement import Placement, free_gpus, place, strategy_for
from testbed_core.planning.temporal import TemporalPlan, derive_plan
from testbed_core.schedules import Schedule, build_schedule
from testbed_core.simulate import Path, Resource, SimResult, SimSpec, simulate
from testbed_core.topology import Topology
from testbed_core.variants import REGISTRY, VariantDef
from testbed_core.workload import EffectiveWorkload, Workload

if TYPE_CHECKING:  # the fast prediction is built on this module
    from testbed_core.whatif.predict import FastPrediction

SHARING_MARGIN = 0.03  # temporal sharing is kept unless sharing is predicted this much faster
CHOICE_MARGIN = 0.01  # Atlas's own configuration is kept unless another it may run is predicted this much faster
TEMPORAL_MARGIN = 0.05
"""A calibrated Atlas runs a temporal plan only where it is predicted faster than the
fastest shared way it may run by more than this (`plan_wins`; the run's
testbed/run/variants.py `_choose_configuration` and the what-if's fast prediction
both). The plan gives each transfer its link for the calibrated time (token_margin
longer; where the calibration timed the path as a plan uses it, cold channels taking
turns, the mean hold it measured each way: testbed/run/calibration.py
`calibrate_turns`) and no one else, so it assumes every channel moves as the calibration
measured, again and again. A channel in a run need not:
its streams' windows are what its history left them (a loss, an early end of slow
start), and a transfer lasts only a few round trips, so a window left small reopens
slowly (with the link idle meanwhile), most of all at long RTTs. Such a channel holds
the link longer (the token passes at the later of its planned end and its last byte
out), leaves part of it unused, and every transfer after it on that link waits; on
shared links the other channels take what it leaves. So the plan's measured times lie
above its prediction more often and further than shared channels' do, and a small
predicted gain is not worth that risk (docs/results/sweep-rtt.md, "Atlas's choice")."""
Sharing = Literal["shared", "temporal", "auto"]


@dataclass(frozen=True)
class Variant:
    """A variant as one prediction runs it.

    streams: TCP connections per channel ("auto": enough to fill the link);
    sharing: how channels crossing one WAN link use it ("auto": temporal unless
    sharing is predicted faster, see `choose_sharing`);
    placement: the `place` strategy;
    fill_link: use at least as many streams as fill the link (Atlas: giving the link
    to one transfer at a time only pays if that transfer can use all of it)."""

    name: str
    streams: int | Literal["auto"]
    sharing: Sharing
    placement: str
    fill_link: bool = False

    @property
    def rendezvous(self) -> bool:
        """Whether its sends wait for the receiver's posted receive (the registry's
        ``comm: gloo``: gloo's TCP pairs send an unbound buffer only after the peer's
        recv-ready notice, one path latency after the receive was posted)."""
        definition = REGISTRY.get(self.name)
        return definition is not None and definition.comm == "gloo"

    @classmethod
    def of(cls, definition: VariantDef, streams: int | Literal["auto"] = 8,
           baseline_placement: str = "even") -> Variant:
        """The registry's `definition` with `streams` for the variants whose stream
        policy is not a single stream, and `baseline_placement` for those placed
        like the baseline."""
        return cls(
            definition.name,
            1 if definition.streams == "one" else streams,
            definition.sharing,
            strategy_for(definition.placement, baseline_placement),
            fill_link=definition.streams == "fill-link",
        )


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
            **prediction_fields(self, topology),
            "wan_paths": [p.to_json() for p in self.paths.values()],
            "wan_bytes_per_iteration": self.wan_bytes,
            "temporal_plan": self.plan.to_json() if self.plan else None,
        }


def prediction_fields(pred: Prediction | FastPrediction, topology: Topology | None) -> dict[str, object]:
    """What the planner's prediction and the fast one (testbed_core/whatif/predict.py)
    both write at the head of their JSON, in order: the variant as predicted, its
    placement and the iteration's times and bubbles."""
    return {
        "variant": pred.variant.name,
        "streams": pred.variant.streams,
        "fill_link": pred.variant.fill_link,
        "sharing": pred.sharing,
        "sharing_requested": pred.variant.sharing,
        "sharing_alternatives_s": pred.sharing_alternatives,
        "placement": pred.placement.to_json(topology),
        "predicted_iteration_time_s": pred.iteration_time_s,
        "pipeline_time_s": pred.pipeline_time_s,
        "allreduce_s": pred.allreduce_s,
        "compute_only_s": pred.compute_only_s,
        "bubble_fraction": pred.bubble_fraction,
        "ideal_bubble_fraction": pred.ideal_bubble_fraction,
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
    bursts: dict[str, bool] = {}  # net.unpaced_bursts: whether every tensor crossing a link fits its windows
    for d in range(par.dp):
        for b in range(sched.stages - 1):
            ra, rb = sched.rank_of(b), sched.rank_of(b + 1)
            for direction, src, dst in (("fwd", ra, rb), ("bwd", rb, ra)):
                a, z = placement.dc_of(d, src), placement.dc_of(d, dst)
                chan = channel_resource(d, b, direction)
                if a == z:
                    resources[chan] = Resource(lan_tensor_rate(topology, a, variant, net), "exclusive")
                    paths[(d, b, direction)] = Path((chan,), net.lan_latency_s)
                    continue
                if (a, z) not in wan:
                    wan[(a, z)] = wan_path(topology, a, z, variant.streams, net, fill_link=variant.fill_link,
                                           transfer_bytes=nbytes[b])
                wp = wan[(a, z)]
                hold = (net.path_hold_factor or {}).get((a, z), 1.0)
                for x, y in zip(wp.dcs, wp.dcs[1:], strict=False):
                    rate = topology.link(x, y).rate
                    fraction = net.crowded_for(x, y)
                    crowded = None if fraction is None else rate * fraction
                    before = resources.get(wan_resource(x, y))
                    line = net.line_rate_for(x, y)
                    resources[wan_resource(x, y)] = Resource(
                        rate, crowded_bps=crowded, hold_factor=max(hold, before.hold_factor if before else 1.0),
                        busy_bps=None if line is None else sustained_bps(line),
                        refill_s=0.0 if line is None else refill_s(line),
                        split_shares=(net.link_split_shares or {}).get((x, y), ()))
                # a tensor that finds its channel idle: the measured time of one alone; one
                # handed over behind another (a backlog): at the link's rate, within the whole
                # windows of the streams that carry it (simulate.py, `Resource.backlog_bps`;
                # network.py `warm_lanes`: a small tensor rides only the first few streams),
                # paced or not (docs/results/sweep-paper.md, held-back/README.md). One
                # stream too, where its sender hands it tensors as they come (atlas_transport:
                # a GPipe burst's stream never runs dry and its window grows to the buffer's;
                # docs/results/fidelity.md, "The one-stream burst, bit by bit"); gloo's pairs
                # wait for each receiver's notice, their stream idle between tensors
                lossy = lossy_between(topology, a, z)
                backlog = wp.measured and not lossy and (wp.streams > 1 or not variant.rendezvous)
                resources[chan] = Resource(wp.streams * wp.flow_rate_bps, "exclusive",
                                           backlog_bps=wp.bottleneck_bps if backlog else None)
                if net.unpaced_bursts:
                    # (a lossy route's tensors keep the loss model's rounds: planning/lossy.py)
                    fits = nbytes[b] <= wp.streams * wp.window_bytes and not lossy
                    if fits:  # one burst: at the link's rate, however the channel was timed paced
                        resources[chan] = Resource(wp.bottleneck_bps, "exclusive")
                    for name in wp.resources:
                        bursts[name] = bursts.get(name, True) and fits
                paths[(d, b, direction)] = Path((chan, *wp.resources), wp.latency_s, window_bits=wp.window_bits,
                                                backlog_window_bits=wp.backlog_window_bits if backlog else None,
                                                fluid_window=wp.streams == 1)
    if net.lan_loaded_bps is not None and not variant.rendezvous:
        paths = _loaded_lan_paths(sched, paths, resources, net.lan_loaded_bps)
    for name, only_bursts in bursts.items():
        if only_bursts:  # first come, first served: a burst waits whole behind the one before it
            resources[name] = replace(resources[name], policy="exclusive")
    spec = SimSpec(sched, par.dp, list(eff.stage_forward_s), list(eff.stage_backward_s), nbytes, list(nbytes),
                   paths, resources, rendezvous=variant.rendezvous)
    return spec, wan


def _loaded_lan_paths(sched: Schedule, paths: dict[tuple[int, int, str], Path], resources: Mapping[str, Resource],
                      loaded_bps: float) -> dict[tuple[int, int, str], Path]:
    """`paths` with each channel inside a DC loaded by the WAN channels of its pipeline
    that start or end on one of its two ranks (`Path.loaded_by`): the ranks' transport
    loops share the machine's cores, and a transfer inside the DC that starts while one
    of those moves moves at most at `loaded_bps` (the calibration's loaded LAN tensor
    probe, the pipeline's channels all busy: testbed/run/calibration.py
    `calibrate_lan_loaded`), or its own rate where that is lower."""
    inside = {key for key, path in paths.items() if len(path.resources) == 1}
    out = dict(paths)
    for d, b, direction in inside:
        ranks = {sched.rank_of(b), sched.rank_of(b + 1)}
        near = tuple(channel_resource(d2, b2, dir2) for d2, b2, dir2 in paths
                     if d2 == d and (d2, b2, dir2) not in inside
                     and {sched.rank_of(b2), sched.rank_of(b2 + 1)} & ranks)
        if near:
            own = resources[paths[(d, b, direction)].resources[0]].capacity_bps
            out[(d, b, direction)] = replace(paths[(d, b, direction)], loaded_by=near,
                                             loaded_bps=min(own, loaded_bps))
    return out


def lan_tensor_rate(topology: Topology, dc: str, variant: Variant, net: NetParams) -> float:
    """The rate of a pipeline tensor between two stages inside DC `dc`. Over atlas_transport:
    the calibration's measured LAN channel rate (its DP rings inside the DCs, which run
    beside the pipeline's tensors, or, where it timed no ring, the pipeline's own tensor
    on a one-stream channel between two hosts of a DC: the transport's own Python loop is
    what bounds a channel on the emulated LAN), else the DC's nominal rate. Through
    torch.distributed's gloo (`variant.rendezvous`): the DC's nominal rate, as gloo's C++
    pairs are not bound by that loop (1 MiB in 0.6-1.0 ms on the 10 Gbit/s LANs of the
    held-back triangle and line runs, where the transport's rings measured 1.3 Gbit/s a
    replica: 6-8 ms)."""
    if variant.rendezvous:
        return topology.dc(dc).lan_rate
    if net.lan_rate_bps is not None:
        return net.lan_rate_bps
    if net.lan_tensor_bps is not None:
        return net.lan_tensor_bps
    return topology.dc(dc).lan_rate


def allreduce_time(
    topology: Topology, workload: Workload, placement: Placement, eff: EffectiveWorkload,
    sim: SimResult, variant: Variant, net: NetParams,
) -> float:
    """Extra time the ring all-reduce of each stage's gradients adds after its last
    backward: 2(dp-1)/dp of the stage's (wire-scaled) gradient bytes at the slowest
    hop of the ring, plus 2(dp-1) one-way latencies. Stages whose rings share a WAN
    link share it: one ring alone moves at its channel's rate, several together at
    what colliding channels get of the link (``net.crowded_fraction`` of its rate, at
    least one channel's rate), or, where the rings crossing the link were measured
    running together (``net.link_ring_rate_bps``), at that aggregate: shared evenly by
    the rings still running (`shared_rings_time`), each at most what one ring moves
    alone there (``net.link_ring_alone_bps``, when measured, and no more than its
    flows' windows per round trip, `window_rate`). Inside the DCs, where the
    calibration timed the rings all at once and one alone (``net.lan_rings`` rings at
    ``net.lan_rate_bps`` each, ``net.lan_ring_alone_bps``), each stage's ring starts at
    its own last backward and shares that aggregate with the rings running beside it
    (`staggered_rings_finish`); else each at the measured (or nominal) LAN rate."""
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
    wan_window_rate: dict[str, float] = {}  # per link, what one ring's flows carry a window per RTT
    wan_rings: dict[str, int] = {}
    wan_volumes: dict[str, list[float]] = {}
    routes: dict[tuple[str, str], WanPath] = {}
    lan_starts: list[float] = []
    lan_volumes: list[float] = []
    for k in range(sched.stages):
        r = sched.rank_of(k)
        grad_bytes = eff.stage_params[k] * dtype_bytes * workload.scale
        volume = 2 * (dp - 1) / dp * grad_bytes * 8
        last_b = max(c.end for c in sim.compute if c.stage == k and c.kind == "B")
        ring = [placement.dc_of(d, r) for d in range(dp)]
        hops = [(ring[i], ring[(i + 1) % dp]) for i in range(dp) if ring[i] != ring[(i + 1) % dp]]
        if not hops:
            lan = net.lan_rate_bps or topology.dc(ring[0]).lan_rate
            if net.lan_rate_bps is not None and net.lan_ring_alone_bps is not None and net.lan_rings:
                lan_starts.append(last_b)  # the rings inside the DCs overlap as their stages end
                lan_volumes.append(volume)
                continue
            finish = max(finish, last_b + volume / lan + 2 * (dp - 1) * net.lan_latency_s)
            continue
        for a, z in hops:
            wp = routes.get((a, z))
            if wp is None:  # thousands of hops at paper scale, a handful of routes
                wp = routes[(a, z)] = wan_path(topology, a, z, variant.streams, net, fill_link=variant.fill_link)
            for res in wp.resources:
                wan_load[res] = wan_load.get(res, 0.0) + volume
                wan_volumes.setdefault(res, []).append(volume)
                wan_start[res] = min(wan_start.get(res, math.inf), last_b)
                lat, rate = wan_info.get(res, (0.0, math.inf))
                wan_info[res] = (max(lat, wp.latency_s), min(rate, wp.rate_bps))
                wan_window_rate[res] = min(wan_window_rate.get(res, math.inf), window_rate(wp))
                wan_rings[res] = wan_rings.get(res, 0) + 1
    if lan_starts:  # measured: the rings all at once (an aggregate) and one alone
        assert net.lan_rate_bps is not None and net.lan_ring_alone_bps is not None and net.lan_rings
        ends = staggered_rings_finish(lan_starts, lan_volumes, net.lan_rings * net.lan_rate_bps,
                                      net.lan_ring_alone_bps)
        finish = max(finish, max(ends) + 2 * (dp - 1) * net.lan_latency_s)
    for res, bits in wan_load.items():
        lat, rate = wan_info[res]
        a, z = res.removeprefix("wan:").split("->")
        measured = net.ring_rate_for(a, z)
        # one ring alone: at most its channel's measured rate (a tensor of the pipeline's
        # size, a window or less) and, its gradients being many windows long, at most its
        # flows' windows per round trip
        alone = min(net.ring_alone_for(a, z) or math.inf, wan_window_rate[res])
        if measured is not None and alone < math.inf:  # the rings of unequal stages end one by one
            finish = max(finish, wan_start[res] + shared_rings_time(wan_volumes[res], measured, alone)
                         + 2 * (dp - 1) * lat)
            continue
        if measured is not None:  # what these rings moved together, measured (the calibration's ring probe)
            rate = measured
        elif wan_rings[res] > 1:  # several rings' channels share the link: together they get
            # what colliding channels get of it, but never more than each channel's own
            # (window-limited) rate times their number
            link_share = topology.link(a, z).rate * (net.crowded_for(a, z) or 1.0)
            rate = max(rate, min(link_share, wan_rings[res] * rate))
        finish = max(finish, wan_start[res] + bits / rate + 2 * (dp - 1) * lat)
    return finish - sim.makespan


def window_rate(wp: WanPath) -> float:
    """What a long transfer over `wp` carries at most: its channel's rate, and where
    that rate was measured, its streams' windows once per round trip (the window
    model's rate already is that). A measured channel rate comes from tensors of the
    pipeline's wire size, often a window or less, which arrive in about one RTT
    whatever the window; a ring's gradients (megabytes) wait for acknowledgements."""
    if wp.rtt_s <= 0:
        return wp.rate_bps
    return min(wp.rate_bps, wp.window_bits / wp.rtt_s)


def staggered_rings_finish(starts: list[float], volumes: list[float], aggregate_bps: float,
                           alone_bps: float) -> list[float]:
    """When each ring all-reduce inside the DCs ends, ring i starting at `starts[i]`
    with `volumes[i]` bits to send each way: the rings running at a moment share
    `aggregate_bps` (what all the calibration's rings moved at once, measured) evenly,
    each at most `alone_bps` (what one ring moved timed alone). A stage's ring starts at
    its last backward, so in a pipeline the rings start one after another, each
    running alone or beside few others for part of its time: the rate of all of them at
    once would make every ring as slow as the calibration's crowd (the emulated hosts
    share the machine's cores; on real hosts the aggregate is the rings' sum and each
    ring keeps its own rate)."""
    if not starts:
        return []
    if len(starts) != len(volumes):
        raise ValueError(f"{len(starts)} ring starts but {len(volumes)} volumes")
    if aggregate_bps <= 0 or alone_bps <= 0:
        raise ValueError(f"ring rates must be positive (aggregate {aggregate_bps}, alone {alone_bps} bit/s)")
    left = list(volumes)
    ends: list[float | None] = [None] * len(starts)
    t = min(starts)
    while any(e is None for e in ends):
        running = [i for i, e in enumerate(ends) if e is None and starts[i] <= t]
        later = min((starts[i] for i, e in enumerate(ends) if e is None and starts[i] > t), default=math.inf)
        if not running:
            t = later
            continue
        rate = min(alone_bps, aggregate_bps / len(running))
        step = min(min(left[i] for i in running) / rate, later - t)
        for i in running:
            left[i] -= rate * step
            if left[i] <= 1e-9 * max(1.0, volumes[i]):
                ends[i] = t + step
        t += step
    return [e for e in ends if e is not None]


def shared_rings_time(volumes: list[float], aggregate_bps: float, alone_bps: float) -> float:
    """Time for rings of `volumes` (bits each way) that start together on one link to
    finish: the rings still running share `aggregate_bps` (what all of them moved
    together, measured) evenly, each at most what one ring moves alone (never less than
    its share with all of them running, so equal rings take exactly the measured time)."""
    if not volumes:
        return 0.0
    cap = max(alone_bps, aggregate_bps / len(volumes))
    left = sorted(volumes)
    t = 0.0
    while left:
        rate = min(cap, aggregate_bps / len(left))
        dt = left[0] / rate
        t += dt
        left = [v - rate * dt for v in left[1:]]
    return t


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
                          hosts={dc.name: list(dc.hosts) for dc in topology.dcs}, gpus_per_host=gpus_per_host,
                          chunks=par.chunks)
    spec, paths = build_spec(topology, workload, placement, variant, eff, net)
    # tensors handed to a multi-stream channel back to back cross side by side
    # (testbed_core/planning/interleave.py), unless the channels spread each evenly
    if not net.even_spread or net.even_spread_stream_bytes is not None:
        spread = None if not net.even_spread or net.even_spread_stream_bytes is None \
            else net.even_spread_stream_bytes * net.even_spread_chunks
        spec = interleave(spec, paths, lambda dc: topology.tcp_for(dc).wmem_max, simulate, even_stream_bytes=spread)
    plan = None
    alternatives = None
    sim = None
    links = [name for name in spec.resources if name.startswith("wan:")]
    if variant.sharing != "shared" and links:
        plan = derive_plan(spec, links)
        planned = plan.apply(spec)
        sim = drawn(simulate, planned)
        if variant.sharing == "auto":
            shared = drawn(simulate, spec)
            alternatives = {"temporal": sim.makespan, "shared": shared.makespan}
            if choose_sharing(sim.makespan, shared.makespan) == "shared":
                plan, sim = None, shared
            else:
                spec = planned
        else:
            spec = planned
    if sim is None:  # two channels colliding on a link: who gets ahead is a draw (planning/collisions.py)
        sim = drawn(simulate, spec)
    # a lossy route's tensors take random times around the rate's mean: the pipeline
    # waits for the slow ones (testbed_core/planning/lossy.py `spread_makespan`)
    lossy = lossy_routes(topology, paths.values(), eff.wire_activation_bytes, net.slow_start_after_idle,
                         net.lossy_history, par.num_micro_batches, net.paced, (spec, sim))
    makespan = spread_makespan(spec, lossy, lambda s: drawn(simulate, s)) if lossy else sim.makespan
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
        iteration_time_s=makespan + (ar if net.allreduce else 0.0),
        pipeline_time_s=makespan, allreduce_s=ar, compute_only_s=compute_only,
        bubble_fraction=sim.bubble_fraction(), ideal_bubble_fraction=sched.ideal_bubble_fraction(),
        paths=paths, wan_bytes=wan_bytes, sim=sim, spec=spec, plan=plan, effective=eff,
        sharing_alternatives=alternatives,
    )


def plan_wins(temporal_s: float, shared_s: float, margin: float = TEMPORAL_MARGIN) -> bool:
    """Whether a calibrated Atlas runs its temporal plan (predicted `temporal_s`) rather
    than the fastest shared way it may run (`shared_s`): only where sharing is predicted
    slower by more than `margin` (TEMPORAL_MARGIN)."""
    return shared_s > temporal_s * (1 + margin)


def choose_sharing(temporal_s: float, shared_s: float, margin: float = SHARING_MARGIN) -> str:
    """"temporal" unless sharing the links is predicted faster by more than `margin`
    (the plan is the point of Atlas; only a clear predicted loss overrides it)."""
    return "shared" if shared_s < temporal_s * (1 - margin) else "temporal"
