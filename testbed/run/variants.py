"""Variant planning of `testbed run`: which variants run, and for each its stream
count, placement, sharing of the WAN links and predicted iteration time.

Every decision dispatches on the variant's policies in the registry
(testbed_core/variants.py), never on its name: the placement policy picks the
planner's strategy (its own heuristic, ``runner.baseline_placement``, or DP across
DCs), the stream policy the TCP streams per channel, the sharing policy whether the
temporal plan is tried. The planner (testbed_core/planning/) places the stages and
simulates one iteration with the calibrated channel rates (testbed/run/calibration.py);
a variant with sharing ``auto`` gets its temporal plan (testbed_core/planning/temporal.py)
unless, with ``runner.atlas_sharing: auto``, sharing the link is predicted faster (each
way predicted with its own rates: the plan's transfers hold the link ``token_margin``
longer; shared channels move what the collision probe measured).

The prediction uses the calibrated rates (per-flow rate = channel rate / streams)
instead of the window model, each WAN path its own; where the calibration also timed a
placement's paths loaded at once, each path's rate lies between its alone and together
figures by how loaded the other paths keep it in the predicted iteration (predicted
once with the together figures, then again with the weighed ones:
testbed_core/planning/path_load.py). It is made before the variant runs: that is the
headline `predicted_iteration_time_s`. `repredict` makes it again for the same
placement and plan with other inputs: real devices' measured stage times (the compute
model does not know this machine), and, as a diagnostic, the channel rate the
variant's own warm-up iterations measured.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from testbed.progress import Progress
from testbed.run.calibration import (
    Calibration,
    PathCalibration,
    ProbeAgents,
    aggregate_rate,
    calibrate,
    calibrate_lan,
    calibrate_link,
    calibrate_together,
    calibrate_wan_rings,
    dp_lan_pairs,
)
from testbed.run.common import RunnerError, nominal_link
from testbed.run.network import Network
from testbed.run.scenario import Scenario
from testbed_core.contracts.summary import PathRatesUsed
from testbed_core.planning.network import NetParams
from testbed_core.planning.path_load import load_of, path_loads, weighed_rate
from testbed_core.planning.placement import SEARCH, Placement, free_gpus, place, strategy_for
from testbed_core.planning.prediction import (
    Prediction,
    Sharing,
    Variant,
    allreduce_time,
    build_spec,
    choose_sharing,
    predict,
)
from testbed_core.planning.schedule import schedule_options, with_schedule
from testbed_core.planning.search import search_placement
from testbed_core.simulate import simulate
from testbed_core.topology import MAX_RATE_BPS, Topology, shortest_path
from testbed_core.variants import (
    RunVariant,
    VariantDef,
    VariantError,
    get_variant,
    has_bubbletea,
    parse_run_variant,
    parse_run_variants,
)
from testbed_core.whatif.predict import fast_predict
from testbed_core.workload import EffectiveWorkload, Workload

# Share of a WAN link's nominal rate that TCP goodput reaches through the shaper
# (headers, HTB, window dynamics). The fill-the-link stream count fills this much.
FILL_GOODPUT = 0.85
SCHEDULE_MARGIN = 0.03  # atlas_schedule auto: another schedule runs only when predicted this much faster
LOAD_PASSES = 1  # predictions again with each path weighed by the load the last one simulated
STREAMS_MARGIN = 0.05  # fill-link takes the fewest streams timed within this much of the fastest count
LINK_GOODPUT = 1448 / 1514  # TCP payload per Ethernet frame: what a shaped link carries
MAX_STREAMS = 64
DEFAULT_AUTO_STREAMS = 8  # transport.streams: auto before (or without) a calibration


@dataclass(frozen=True)
class PathRates:
    """What the calibration measured on one WAN path a variant crosses, for its stream
    count: its channel's rate alone there, the aggregate of its colliding channels, the
    path's nominal bottleneck, and the aggregate of the DP rings crossing it."""

    dcs: tuple[str, str]
    rate_bps: float | None
    colliding_bps: float | None
    nominal_bps: float | None
    ring_bps: float | None = None
    # where the placement's other paths were also timed loaded at once: how loaded they
    # keep this one in the simulated iteration (0 alone, 1 all busy throughout), the
    # weight its rate and aggregate take between the alone and together figures
    load: float | None = None
    ring_alone_bps: float | None = None  # one DP ring alone there: the channel rate at the rings' streams


@dataclass
class VariantSetup:
    """One variant run as planned: its streams, placement, WAN sharing and prediction."""

    run: RunVariant  # the registry's variant, and whether BubbleTea agents run beside it
    streams: int
    variant: Variant  # the planner's variant as predicted (streams, sharing way, placement strategy)
    placement: Placement
    prediction: Prediction | None
    rate_bps: float | None = None  # calibrated channel rate the a-priori prediction used
    colliding_bps: float | None = None  # calibrated aggregate of the pipelines' channels colliding
    lan_rate_bps: float | None = None  # calibrated rate of one DP all-reduce channel inside a DC
    final_prediction: float | None = None  # the headline prediction (real devices: measured compute)
    sharing: str = "shared"  # how the variant uses WAN links: "temporal" (a plan) or "shared"
    sharing_requested: str = "shared"  # what the scenario asked for: "shared", "temporal" or "auto"
    sharing_alternatives: dict[str, float] | None = None  # sharing "auto": a-priori prediction of each way
    # each WAN path's own calibrated figures (per DC pair): the prediction uses them, not one factor for all
    path_rates: dict[tuple[str, str], PathRates] = field(default_factory=dict)
    workload: Workload | None = None  # what the variant runs where its schedule is not the configured one
    schedule_alternatives: dict[str, float] | None = None  # atlas_schedule auto: a-priori prediction of each
    schedules_refused: dict[str, str] = field(default_factory=dict)  # schedules not weighed, and why

    def runs(self, workload: Workload) -> Workload:
        """The workload this variant runs: `workload` (the scenario's), or its own
        where Atlas's scheduling chose another pipeline schedule."""
        return self.workload if self.workload is not None else workload

    @property
    def schedule(self) -> str | None:
        """The pipeline schedule it runs where it is not the configured one."""
        return self.workload.parallelism.schedule if self.workload is not None else None

    @property
    def name(self) -> str:
        """As reported (the key in summary.json), e.g. "atlas+bubbletea"."""
        return self.run.name

    @property
    def base(self) -> str:
        """The registry variant's name, e.g. "atlas"."""
        return self.run.base

    @property
    def bubbletea(self) -> bool:
        return self.run.bubbletea

    @property
    def definition(self) -> VariantDef:
        return self.run.variant

    def paths_used(self) -> list[PathRatesUsed]:
        """Each WAN path's calibrated figures the prediction used (summary.json
        ``prediction.calibrated_paths``)."""
        def mbps(bps: float | None) -> float | None:
            return None if bps is None else bps / 1e6
        return [PathRatesUsed(dcs=pr.dcs, channel_rate_mbps=mbps(pr.rate_bps),
                              colliding_aggregate_mbps=mbps(pr.colliding_bps), ring_aggregate_mbps=mbps(pr.ring_bps),
                              timed="path alone" if pr.load is None else
                              "alone and with the placement's other paths loaded at once, weighed by their load",
                              load=pr.load)
                for pr in self.path_rates.values()]


def _definition(variant: str | VariantDef | RunVariant) -> VariantDef:
    """The registry entry of a variant given by name ('atlas', 'atlas+bubbletea'), run or entry."""
    if isinstance(variant, RunVariant):
        return variant.variant
    if isinstance(variant, VariantDef):
        return variant
    try:
        return parse_run_variant(variant).variant
    except VariantError as exc:
        raise RunnerError(str(exc)) from None


# ------------------------------------------------------------------ which runs

def run_variants(scenario: Scenario, only: Sequence[str] | None = None) -> list[RunVariant]:
    """The variant runs, in order: the scenario's (or `only`, any variant of the
    registry), each also with BubbleTea when it is enabled (and without it too when
    `compare` is set)."""
    if only:
        try:
            return parse_run_variants(only)
        except VariantError as exc:
            raise RunnerError(f"--variants: {exc}") from None
    out = []
    bt = scenario.bubbletea
    for name in scenario.variants:
        definition = _definition(name)
        if bt.enabled and (bt.variants is None or name in bt.variants):
            if bt.compare:
                out.append(RunVariant(definition))
            out.append(RunVariant(definition, bubbletea=True))
            # dispatch twins (bubbletea.compare_dispatch): the same run, prefill dispatched otherwise
            out += [RunVariant(definition, bubbletea=True, dispatch=mode)
                    for mode in dict.fromkeys(bt.compare_dispatch) if mode != bt.dispatch]
        else:
            out.append(RunVariant(definition))
    return out


def variant_names(scenario: Scenario, only: Sequence[str] | None = None) -> list[str]:
    """The names of `run_variants`, as reported ("atlas", "atlas+bubbletea", ...)."""
    return [r.name for r in run_variants(scenario, only)]


# ------------------------------------------------------------------ streams and sharing

def configured_streams(scenario: Scenario, auto: int | None) -> int:
    """transport.streams, or for 'auto' the calibrated best (`auto`)."""
    s = scenario.transport.streams
    return (auto or DEFAULT_AUTO_STREAMS) if s == "auto" else int(s)


def choose_streams(variant: str | VariantDef | RunVariant, scenario: Scenario, flow_bps: float | None,
                   link_bps: float | None, auto: int | None) -> int:
    """TCP streams per WAN channel by the variant's stream policy: ``one``: 1;
    ``configured``: transport.streams (or the calibrated best for 'auto'); ``fill-link``:
    at least enough streams to fill the link (the planner's rule), counted against the
    goodput a shaped link gives TCP (FILL_GOODPUT of its nominal rate)."""
    policy = _definition(variant).streams
    if policy == "one":
        return 1
    n = configured_streams(scenario, auto)
    if policy == "fill-link" and flow_bps and link_bps:
        n = max(n, min(MAX_STREAMS, math.ceil(FILL_GOODPUT * link_bps / flow_bps - 1e-9)))
    return n


def fill_link_streams(fill: int, scenario: Scenario, cal: Calibration | None, auto: int | None) -> int:
    """Streams per channel of a fill-link variant: of the counts the calibration timed
    (the formula's count to fill the link, transport.streams and the single stream every
    calibration times), the fewest within STREAMS_MARGIN of the fastest. On long RTTs
    many flows collapse together, on short ones a single flow nearly fills the link and
    more overflow its queue; where a tensor is too small to need more than one window,
    one stream is as fast as eight and has no tail of slow streams. Each count is judged
    by its mean transfer time (`timed_rate`), not the median that `rates_bps` holds: a
    count whose transfers now and then wait a round trip longer (the last stream of
    eight opening its window) is slower on average, which a median of a few transfers
    hides (paper sweep, 200 ms RTT: 8 streams 107, 107, 107 and 271 ms against one
    stream's 107 ms each)."""
    if cal is None:
        return fill
    plain = configured_streams(scenario, auto)
    measured = {n: timed_rate(cal, n) for n in {fill, plain, 1} if n in cal.rates_bps}
    if not measured:
        return fill
    best = max(measured.values())
    return min(n for n, rate in measured.items() if rate >= (1 - STREAMS_MARGIN) * best)


def timed_rate(cal: Calibration, streams: int) -> float:
    """A channel's rate at `streams` from the mean of its timed transfers on the
    primary path (`aggregate_rate` of one channel); the calibrated rate where the
    transfers were not kept."""
    times = cal.transfer_s.get(streams)
    return aggregate_rate(cal.nbytes, times, 1, cal.latency_s) if times else cal.rates_bps[streams]


def variant_streams(variant: str | VariantDef | RunVariant, scenario: Scenario, cal: Calibration | None,
                    auto: int | None, nominal_bps: float | None) -> int:
    """The streams a variant runs with: its policy's count, and for fill-link the
    calibration's verdict on it (`fill_link_streams`)."""
    definition = _definition(variant)
    flow1 = cal.rates_bps.get(1) if cal else None
    n = choose_streams(definition, scenario, flow1, nominal_bps, auto)
    if definition.streams == "fill-link":
        n = fill_link_streams(n, scenario, cal, auto)
    return n


def requested_sharing(variant: str | VariantDef | RunVariant, scenario: Scenario) -> Sharing:
    """How the variant asks to use its WAN links: its sharing policy, with ``auto``
    resolved by ``runner.atlas_sharing`` (which may fix it to temporal or shared)."""
    definition = _definition(variant)
    return scenario.runner.atlas_sharing if definition.sharing == "auto" else definition.sharing


# ------------------------------------------------------------------ the prediction's network

def calibrated_topology(topology: Topology, link_bps: float | None, pair: tuple[str, str] | None,
                        local: bool) -> Topology:
    """The topology as the predictor sees it: WAN link rates scaled so that the link of
    the calibrated path has `link_bps` (what the transport gets from it: protocol
    overhead, shaper accuracy, the traffic pattern); no delays in local mode."""
    data = topology.model_dump()
    if link_bps is not None and pair is not None:
        ref = nominal_link(topology, pair)
        factor = link_bps / ref if ref else 1.0
        for link in data["wan"]:
            link["rate"] = link["rate"] * factor
            for ch in link.get("changes") or []:
                if ch.get("rate") is not None:
                    ch["rate"] *= factor
    if local:
        for link in data["wan"]:
            link["delay"] = 0.0
            link["jitter"] = 0.0
            link["rate"] = max(link["rate"], link_bps or 0.0)
    for link in data["wan"]:  # loopback in local mode can time a transfer too quick to measure
        link["rate"] = min(link["rate"], MAX_RATE_BPS)
        for ch in link.get("changes") or []:
            if ch.get("rate") is not None:
                ch["rate"] = min(ch["rate"], MAX_RATE_BPS)
    data.pop("source", None)
    return type(topology).model_validate(data)


def calibrated_rates(temporal: bool, streams: int, rate_bps: float | None,
                     nominal_bps: float | None, colliding_bps: float | None = None
                     ) -> tuple[float | None, float | None, float | None]:
    """(per-flow rate, link capacity, crowded fraction) the prediction of a variant
    uses, from the measured rate of one channel of `streams` streams.

    Temporal sharing puts one transfer at a time on the link: its capacity is that
    rate. Shared links: the link's TCP goodput (at least one channel's rate), each
    channel capped at its own measured rate; while two or more transfers collide on
    it, the measured aggregate of the colliding channels (their loss and
    recovery make it fall short of the goodput, even of one channel alone), given as
    a fraction of the capacity. No collision measurement (single streams, which stay
    far from the loss that many colliding streams cause): no crowding. Nor where two
    channels at their measured rate fit side by side in the link's goodput: each is
    window-limited, their windows together stay under the link's bandwidth-delay
    product, so no queue builds and nothing is lost in a run's steady state; the
    probe's lockstep collision (both channels starting at once, in slow start) then
    measures its own bursts (sweep-rtt at 100 ms RTT: 372 Mbit/s in all for two
    8-stream channels of 452 each, while multi-tcp's run carried them side by side
    and ran 40% faster than that predicted; atlas's plan, chosen on it, was 15-32%
    slower than multi-tcp)."""
    if rate_bps is None:
        return None, None, None
    if temporal:
        return rate_bps / streams, rate_bps, None
    link = rate_bps if nominal_bps is None else max(rate_bps, LINK_GOODPUT * nominal_bps)
    crowded = None if colliding_bps is None else min(1.0, colliding_bps / link)
    if crowded is not None and nominal_bps is not None and 2 * rate_bps <= link:
        crowded = None
    return rate_bps / streams, link, crowded


def path_topology(topology: Topology, link_bps: dict[tuple[str, str], float], local: bool) -> Topology:
    """The topology as the predictor sees it with every calibrated path's own figure:
    each link on the route of a path in `link_bps` carries that path's calibrated
    capacity (scaled by its share of the route's nominal bottleneck); links no path of
    the variant crosses keep their nominal rate; no delays in local mode."""
    data = topology.model_dump()
    factors: dict[frozenset[str], float] = {}
    for (a, z), bps in link_bps.items():
        route = shortest_path(a, z, topology.wan)
        bottleneck = min(topology.link(x, y).rate for x, y in zip(route, route[1:], strict=False))
        for x, y in zip(route, route[1:], strict=False):
            key = frozenset((x, y))
            factors[key] = min(factors.get(key, math.inf), bps / bottleneck)
    for link in data["wan"]:
        factor = factors.get(frozenset(link["between"]), 1.0)
        link["rate"] = min(link["rate"] * factor, MAX_RATE_BPS)
        for ch in link.get("changes") or []:
            if ch.get("rate") is not None:
                ch["rate"] = min(ch["rate"] * factor, MAX_RATE_BPS)
        if local:
            link["delay"] = 0.0
            link["jitter"] = 0.0
    data.pop("source", None)
    return type(topology).model_validate(data)


def _allreduce_on(scenario: Scenario) -> bool:
    return scenario.workload.parallelism.dp > 1 and (
        scenario.runner.dp_allreduce or scenario.workload.gpu.mode == "real")


def _net_for(setup: VariantSetup, scenario: Scenario, rate_bps: float | None,
             pair: tuple[str, str] | None, local: bool,
             colliding_bps: float | None = None) -> tuple[NetParams, Topology]:
    """The network the prediction of `setup` sees. With `rate_bps` None and per-path
    figures (`setup.path_rates`), each path its own (a temporal plan's transfers hold
    their link ``token_margin`` longer than their measured time); otherwise `rate_bps`
    (and `colliding_bps`) on every link, scaled from the path of `pair`."""
    if rate_bps is None and setup.path_rates:
        return _net_per_path(setup, scenario, local)
    nominal = nominal_link(scenario.topology, pair) if pair else None
    flow, link, crowded = calibrated_rates(setup.variant.sharing == "temporal", setup.streams, rate_bps,
                                           nominal, colliding_bps or setup.colliding_bps)
    net = NetParams(flow_rate_bps=flow, allreduce=_allreduce_on(scenario),
                    crowded_fraction=None if local else crowded, lan_rate_bps=setup.lan_rate_bps)
    return net, calibrated_topology(scenario.topology, link, pair, local)


def _net_per_path(setup: VariantSetup, scenario: Scenario, local: bool) -> tuple[NetParams, Topology]:
    temporal = setup.variant.sharing == "temporal"
    hold = 1 + scenario.runner.token_margin if temporal else 1.0
    flows: dict[tuple[str, str], float] = {}
    crowd: dict[tuple[str, str], float] = {}
    links: dict[tuple[str, str], float] = {}
    rings: dict[tuple[str, str], float] = {}
    rings_alone: dict[tuple[str, str], float] = {}
    for key, pr in setup.path_rates.items():
        if pr.rate_bps is not None:
            flow, link, crowded = calibrated_rates(temporal, setup.streams, pr.rate_bps / hold, pr.nominal_bps,
                                                   pr.colliding_bps)
            flows[key], links[key] = flow, link
            if crowded is not None and not local:
                crowd[key] = crowded
        if pr.ring_bps is not None:
            rings[key] = pr.ring_bps
            if pr.ring_alone_bps is not None:
                rings_alone[key] = pr.ring_alone_bps
    net = NetParams(allreduce=_allreduce_on(scenario), lan_rate_bps=setup.lan_rate_bps,
                    path_flow_rate_bps=flows, link_crowded_fraction=crowd, link_ring_rate_bps=rings,
                    link_ring_alone_bps=rings_alone or None)
    return net, path_topology(scenario.topology, links, local)


# ------------------------------------------------------------------ prediction

def predict_variant(setup: VariantSetup, scenario: Scenario, workload: Workload, base_dir: str | None,
                    rate_bps: float | None, pair: tuple[str, str] | None, local: bool,
                    effective: EffectiveWorkload | None = None, colliding_bps: float | None = None) -> Prediction:
    """The planner's prediction (and, for temporal sharing, the plan) of a placed
    variant whose WAN channels move `rate_bps` each (`effective`: measured compute times)."""
    net, topo = _net_for(setup, scenario, rate_bps, pair, local, colliding_bps)
    return predict(topo, workload, setup.variant, net=net, base_dir=base_dir, placement=setup.placement,
                   effective=effective)


def repredict(setup: VariantSetup, scenario: Scenario, workload: Workload, base_dir: str | None,
              rate_bps: float | None, pair: tuple[str, str] | None, local: bool,
              compute: tuple[list[float], list[float]] | None = None,
              colliding_bps: float | None = None) -> float:
    """Iteration time the planner predicts for the same placement and the same
    temporal plan (token order, offsets) when the channels move `rate_bps` (None:
    the calibrated rate), colliding channels `colliding_bps` in all (None: the
    calibrated aggregate) and, when given, each stage computes for the measured
    (forward, backward) seconds instead of the compute model's."""
    eff = workload.effective(base_dir)
    if compute is not None:
        eff = replace(eff, stage_forward_s=list(compute[0]), stage_backward_s=list(compute[1]))
    if rate_bps is None and not setup.path_rates:
        rate_bps = setup.rate_bps
    assert setup.prediction is not None, "repredict needs the variant's a-priori prediction (plan_variant)"
    plan = setup.prediction.plan
    if plan is not None and setup.rate_bps and rate_bps is not None:
        # with tokens a transfer holds its link for its planned time even when it is
        # done sooner: the link cannot move more than the plan's rate
        rate_bps = min(rate_bps, setup.rate_bps)
    if plan is None:
        return predict_variant(setup, scenario, workload, base_dir, rate_bps, pair, local, eff,
                               colliding_bps).iteration_time_s
    net, topo = _net_for(setup, scenario, rate_bps, pair, local, colliding_bps)
    spec, _ = build_spec(topo, workload, setup.placement, setup.variant, eff, net)
    sim = simulate(plan.apply(spec))
    ring = allreduce_time(topo, workload, setup.placement, eff, sim, setup.variant, net) if net.allreduce else 0.0
    return sim.makespan + ring


# ------------------------------------------------------------------ one variant's plan

def variant_placement(definition: VariantDef, scenario: Scenario, workload: Workload, streams: int,
                      base_dir: str | None) -> Placement:
    """Where a variant's stages go: its placement policy's strategy, or, for
    ``runner.atlas_placement: search``, the search's best placement scored on the
    nominal network (as `testbed plan --search`). ValueError when it does not fit."""
    topo = scenario.topology
    strategy = strategy_for(definition.placement, scenario.runner.baseline_placement, scenario.runner.atlas_placement)
    par = workload.parallelism
    hosts = {dc.name: list(dc.hosts) for dc in topo.dcs}
    if strategy == SEARCH:
        scored = Variant(definition.name, streams, requested_sharing(definition, scenario), SEARCH,
                         fill_link=definition.streams == "fill-link")
        return search_placement(topo, workload, scored, predictor=fast_predict, hosts=hosts, base_dir=base_dir,
                                net=NetParams(allreduce=par.dp > 1 and scenario.runner.dp_allreduce)).placement
    return place(free_gpus(topo), par.pp, par.dp, par.tp, strategy=strategy, hosts=hosts)


def _hosted_placement(definition: VariantDef, scenario: Scenario, streams: int,
                      base_dir: str | None) -> Placement | None:
    """The variant's placement with `streams`, or None where it cannot be placed or a
    stage has no host (the calibration then has nothing of it to time)."""
    try:
        pl = variant_placement(definition, scenario, scenario.workload, streams, base_dir)
    except ValueError:
        return None
    return None if any(not h for h in pl.hosts.values()) else pl


def requested_schedule(variant: str | VariantDef | RunVariant, scenario: Scenario) -> str:
    """"auto" where the variant's schedule policy follows ``runner.atlas_schedule: auto``
    on modelled devices (real ones run the configured schedule), else "configured"."""
    if _definition(variant).schedule != "auto" or scenario.workload.gpu.mode == "real":
        return "configured"
    return scenario.runner.atlas_schedule


def plan_variant(
    variant: str | RunVariant, scenario: Scenario, workload: Workload, base_dir: str | None,
    cal: Calibration | None, auto_streams: int | None, local: bool = False,
) -> VariantSetup:
    """Place a variant run, choose its streams, WAN sharing and (Atlas's scheduling,
    ``runner.atlas_schedule: auto``) its pipeline schedule, and predict it. Each
    schedule the devices can hold is planned in full (streams, sharing, temporal plan)
    and predicted; another than the configured one runs only when predicted faster by
    more than SCHEDULE_MARGIN."""
    run = variant if isinstance(variant, RunVariant) else RunVariant(_definition(variant), has_bubbletea(variant))
    setup = _plan_one(run, scenario, workload, base_dir, cal, auto_streams, local)
    if requested_schedule(run, scenario) != "auto":
        return setup
    options, refused = schedule_options(workload)
    assert setup.prediction is not None
    times = {workload.parallelism.schedule: setup.prediction.iteration_time_s}
    best = setup
    for name in options[1:]:
        other = with_schedule(workload, name)
        # another schedule may want other streams: GPipe sends micro-batches back to back,
        # so a channel's windows, not one transfer's time, can bound it (every timed count)
        plans = [_plan_one(run, scenario, other, base_dir, cal, auto_streams, local, streams=n)
                 for n in [None, *_timed_counts(run, scenario, cal, auto_streams)]]
        alt = min(plans, key=lambda p: p.prediction.iteration_time_s)  # type: ignore[union-attr]
        assert alt.prediction is not None and best.prediction is not None
        times[name] = alt.prediction.iteration_time_s
        if alt.prediction.iteration_time_s < best.prediction.iteration_time_s * (1 - SCHEDULE_MARGIN):
            best, alt.workload = alt, other
    best.schedule_alternatives, best.schedules_refused = times, refused
    return best


def _timed_counts(run: RunVariant, scenario: Scenario, cal: Calibration | None, auto: int | None) -> list[int]:
    """The stream counts a fill-link variant may take that the calibration timed (the
    formula's count to fill the link, transport.streams, one), fewest first."""
    if cal is None or run.variant.streams != "fill-link":
        return []
    nominal = nominal_link(scenario.topology, (cal.src, cal.dst))
    fill = choose_streams(run.variant, scenario, cal.rates_bps.get(1), nominal, auto)
    paths = [pc for pc in cal.paths if run.base in pc.variants] or cal.paths
    return sorted(n for n in {fill, configured_streams(scenario, auto), 1}
                  if n in cal.rates_bps and all(n in pc.rates_bps for pc in paths))


def _plan_one(run: RunVariant, scenario: Scenario, workload: Workload, base_dir: str | None,
              cal: Calibration | None, auto_streams: int | None, local: bool,
              streams: int | None = None) -> VariantSetup:
    """`plan_variant` for the workload's own schedule (`streams`: this count instead
    of the stream policy's)."""
    definition = run.variant
    if definition.placement == "dp-across" and not scenario.runner.dp_allreduce and scenario.workload.gpu.mode != "real":
        raise RunnerError(
            f"{definition.name} puts each pipeline in one DC, so only the DP gradient all-reduce crosses the WAN, "
            "and runner.dp_allreduce is false: the result would be compute alone. Set runner.dp_allreduce: true "
            f"(--set runner.dp_allreduce=true) or drop {definition.name} from the variants"
        )
    if definition.comm == "gloo" and scenario.workload.gpu.mode == "real":
        raise RunnerError(f"{definition.name} runs modelled devices only (gpu.mode: modelled); real devices "
                          "train over atlas_transport: drop it from the variants of a real-mode run")
    topo = scenario.topology
    strategy = strategy_for(definition.placement, scenario.runner.baseline_placement, scenario.runner.atlas_placement)
    pair = (cal.src, cal.dst) if cal else None
    if streams is None:
        streams = variant_streams(definition, scenario, cal, auto_streams, nominal_link(topo, pair) if pair else None)
    try:
        placement = variant_placement(definition, scenario, workload, streams, base_dir)
    except ValueError as exc:
        raise RunnerError(f"variant {run.name}: {exc}") from None
    if any(not h for h in placement.hosts.values()):
        raise RunnerError(f"variant {run.name}: placement {strategy} left a stage without a host")
    rate = cal.rates_bps.get(streams) if cal else None
    sharing = requested_sharing(definition, scenario)
    setup = VariantSetup(run, streams, Variant(definition.name, streams, "shared", strategy), placement, None,
                         sharing_requested=sharing)
    setup.colliding_bps = cal.colliding_bps.get(streams) if cal else None
    setup.lan_rate_bps = cal.lan_rate_bps if cal else None
    if cal is not None and cal.paths:
        setup.path_rates = path_rates_of(placement, scenario, cal, streams)
        first = _first_rated(setup.path_rates)
        if first is not None:  # reported as the variant's channel rate: its first crossing's
            rate, setup.colliding_bps = first.rate_bps, first.colliding_bps
            pc = cal.path(*first.dcs)
            pair = (pc.src, pc.dst) if pc is not None else pair
    options: dict[str, tuple[Variant, Prediction, float | None, float | None, dict[tuple[str, str], PathRates]]] = {}
    timed, colliding = setup.path_rates, setup.colliding_bps
    for way in ("temporal", "shared"):
        if sharing not in (way, "auto"):
            continue
        setup.variant = Variant(definition.name, streams, way, strategy)
        # a planned transfer holds its link token_margin longer than its measured time on
        # the wire, so that one running late does not collide with the next
        hold = 1 + scenario.runner.token_margin if way == "temporal" else 1.0
        setup.path_rates = timed
        pred = _predict_loaded(setup, scenario, workload, base_dir, cal, None if rate is None else rate / hold,
                               pair, local)
        first = _first_rated(setup.path_rates)  # the first crossing's figures, as the prediction weighed them
        way_rate, way_colliding = (rate, colliding) if first is None else (first.rate_bps, first.colliding_bps)
        options[way] = (setup.variant, pred, None if way_rate is None else way_rate / hold, way_colliding,
                        setup.path_rates)
    if len(options) == 2:
        times = {way: opt[1].iteration_time_s for way, opt in options.items()}
        setup.sharing_alternatives = times
        way = choose_sharing(times["temporal"], times["shared"])
    else:
        (way,) = options
    setup.variant, setup.prediction, setup.rate_bps, setup.colliding_bps, setup.path_rates = options[way]
    if setup.prediction.plan is None and way == "temporal":
        way = "shared"  # no WAN link to plan (every crossing inside one DC)
    setup.sharing = way
    if sharing == "auto" and definition.streams == "fill-link" and cal is not None:
        _consider_configured_shared(setup, scenario, workload, base_dir, cal, auto_streams, pair, local)
    return setup


def _first_rated(path_rates: dict[tuple[str, str], PathRates]) -> PathRates | None:
    """The first path with a channel rate: the variant's first crossing, whose figures
    summary.json reports as the variant's calibrated channel rate and aggregate."""
    return next((pr for pr in path_rates.values() if pr.rate_bps is not None), None)


def _predict_loaded(setup: VariantSetup, scenario: Scenario, workload: Workload, base_dir: str | None,
                    cal: Calibration | None, rate_bps: float | None, pair: tuple[str, str] | None,
                    local: bool) -> Prediction:
    """`predict_variant` of `setup` (`rate_bps` on every link where it has no per-path
    figures). Where the calibration also timed the placement's paths loaded at once,
    the first prediction takes their together figures (every other path busy
    throughout); it is then made again LOAD_PASSES times, each path's figures weighed
    by how loaded the last predicted iteration keeps it (``setup.path_rates`` updated)."""
    pred = predict_variant(setup, scenario, workload, base_dir, None if setup.path_rates else rate_bps, pair, local)
    if cal is None or all(pr.load is None for pr in setup.path_rates.values()):
        return pred
    for _ in range(LOAD_PASSES):
        loads = path_loads(pred.sim, pred.spec.schedule, setup.placement)
        setup.path_rates = path_rates_of(setup.placement, scenario, cal, setup.streams, loads)
        pred = predict_variant(setup, scenario, workload, base_dir, None, pair, local)
    return pred


def _consider_configured_shared(setup: VariantSetup, scenario: Scenario, workload: Workload, base_dir: str | None,
                                cal: Calibration, auto: int | None, pair: tuple[str, str] | None,
                                local: bool) -> None:
    """Atlas with ``atlas_sharing: auto`` also weighs plain multi-TCP's own way: the
    configured streams on shared links. Its streams come from one channel's calibrated
    rate and its sharing from the plan against sharing at that count, so where a
    fill-link count collides badly and a window-limited channel fills under half the
    link (long RTTs: two pipelines' channels side by side carry more than one at a
    time), neither of its ways is the faster one. Taken when it is predicted faster
    than the choice by more than the sharing margin (choose_sharing), and only when
    that count was calibrated colliding (the prediction needs its aggregate)."""
    n = configured_streams(scenario, auto)
    if n == setup.streams or setup.prediction is None:
        return
    measured = (all(pr.colliding_bps is not None for pr in path_rates_of(setup.placement, scenario, cal, n).values())
                if cal.paths else n in cal.colliding_bps and n in cal.rates_bps)
    if not measured:
        return
    alt = replace(setup, streams=n, variant=Variant(setup.variant.name, n, "shared", setup.variant.placement))
    alt.path_rates = path_rates_of(setup.placement, scenario, cal, n) if cal.paths else {}
    rate = cal.rates_bps.get(n)
    alt.colliding_bps = cal.colliding_bps.get(n)
    pred = _predict_loaded(alt, scenario, workload, base_dir, cal, rate, pair, local)
    first = _first_rated(alt.path_rates)  # the first crossing's figures, as the prediction weighed them
    if first is not None:
        rate, alt.colliding_bps = first.rate_bps, first.colliding_bps
    times = dict(setup.sharing_alternatives or {setup.sharing: setup.prediction.iteration_time_s})
    times[f"shared, {n} streams"] = pred.iteration_time_s
    setup.sharing_alternatives = times
    if choose_sharing(setup.prediction.iteration_time_s, pred.iteration_time_s) == "shared":
        setup.streams, setup.variant, setup.prediction, setup.rate_bps = n, alt.variant, pred, rate
        setup.colliding_bps, setup.path_rates, setup.sharing = alt.colliding_bps, alt.path_rates, "shared"


def plan_variants(runs: Sequence[RunVariant], scenario: Scenario, workload: Workload, base_dir: str | None,
                  cal: Calibration | None, auto_streams: int | None,
                  local: bool) -> dict[str, VariantSetup | RunnerError]:
    """`plan_variant` of every run, by name; a run that cannot be planned gets its
    error instead, so that the others still run."""
    setups: dict[str, VariantSetup | RunnerError] = {}
    for run in runs:
        try:
            setup = plan_variant(run, scenario, workload, base_dir, cal, auto_streams, local)
            if cal is not None and not cal.paths and setup.streams not in cal.rates_bps:
                raise RunnerError(f"{setup.streams} streams were not calibrated")
            missing = [f"{a}<->{z}" for (a, z), pr in setup.path_rates.items()
                       if pr.rate_bps is None and pr.ring_bps is None]
            if missing:
                raise RunnerError(f"{setup.streams} streams were not calibrated on {', '.join(missing)}")
            setups[run.name] = setup
        except (RunnerError, ValueError) as exc:
            setups[run.name] = RunnerError(f"variant {run.name}: {exc}")
    return setups


# ------------------------------------------------------------------ per-path calibration

@dataclass
class PathUse:
    """How the variants' placements use one WAN path (a pair of DCs, in the direction
    first seen): the host pairs of the pipelines crossing it (upstream, downstream; one
    per pipeline), which variants send pipeline traffic over it and with how many
    channels at once each way, and the DP replicas whose rings cross it (dp-across-dc)."""

    dcs: tuple[str, str]
    pairs: list[tuple[str, str]] = field(default_factory=list)
    channels: dict[str, int] = field(default_factory=dict)  # variant -> pipelines crossing it at once
    ring_pairs: list[tuple[str, str]] = field(default_factory=list)
    ring_variants: list[str] = field(default_factory=list)

    @property
    def variants(self) -> list[str]:
        return list(dict.fromkeys([*self.channels, *self.ring_variants]))


def _key(uses: dict[tuple[str, str], Any], a: str, z: str) -> tuple[str, str]:
    return (z, a) if (z, a) in uses else (a, z)


def pipeline_crossings(placement: Placement) -> dict[tuple[str, str], list[tuple[str, str]]]:
    """Per WAN path (DC pair, either order merged), the (upstream, downstream) hosts of
    each pipeline's first boundary crossing it."""
    out: dict[tuple[str, str], list[tuple[str, str]]] = {}
    for d in range(placement.dp):
        seen = set()
        for s in range(placement.pp - 1):
            a, z = placement.dc_of(d, s), placement.dc_of(d, s + 1)
            if a == z:
                continue
            key = _key(out, a, z)
            if key in seen:
                continue
            seen.add(key)
            out.setdefault(key, []).append((placement.hosts[(d, s)][0], placement.hosts[(d, s + 1)][0]))
    return out


def ring_crossings(placement: Placement) -> dict[tuple[str, str], list[tuple[str, str]]]:
    """Per WAN path, the (replica 0, replica 1) hosts of each stage whose two-replica DP
    ring crosses it (dp = 2; wider rings are left to the model)."""
    out: dict[tuple[str, str], list[tuple[str, str]]] = {}
    if placement.dp != 2:
        return out
    for r in range(placement.pp):
        a, z = placement.dc_of(0, r), placement.dc_of(1, r)
        if a != z:
            out.setdefault(_key(out, a, z), []).append((placement.hosts[(0, r)][0], placement.hosts[(1, r)][0]))
    return out


def wan_uses(scenario: Scenario, runs: Sequence[RunVariant], base_dir: str | None) -> dict[tuple[str, str], PathUse]:
    """Every WAN path the placements of `runs` cross, Atlas's own first (its first
    crossing is the primary path, whose figures also stand at the top of the
    calibration). A variant that cannot be placed is left out (its planning says why)."""
    uses: dict[tuple[str, str], PathUse] = {}
    rings = scenario.workload.parallelism.dp > 1 and scenario.runner.dp_allreduce \
        and scenario.workload.gpu.mode != "real"
    seen = set()
    for definition in [get_variant("atlas"), *(r.variant for r in runs)]:
        if definition.name in seen:
            continue
        seen.add(definition.name)
        pl = _hosted_placement(definition, scenario, DEFAULT_AUTO_STREAMS, base_dir)
        if pl is None:
            continue
        for (a, z), pairs in pipeline_crossings(pl).items():
            use = uses.setdefault(_key(uses, a, z), PathUse(_key(uses, a, z)))
            if use.dcs != (a, z):  # crossing the other way: the same path, its hosts the other way round
                pairs = [(y, x) for x, y in pairs]
            if not use.pairs or len(pairs) > len(use.pairs):
                use.pairs = pairs
            use.channels[definition.name] = len(pairs)
        for (a, z), pairs in (ring_crossings(pl).items() if rings else ()):
            use = uses.setdefault(_key(uses, a, z), PathUse(_key(uses, a, z)))
            if use.dcs != (a, z):
                pairs = [(y, x) for x, y in pairs]
            if len(pairs) > len(use.ring_pairs):
                use.ring_pairs = pairs
            use.ring_variants.append(definition.name)
    return uses


def path_rates_of(placement: Placement, scenario: Scenario, cal: Calibration, streams: int,
                  loads: Mapping[frozenset[str], float] | None = None) -> dict[tuple[str, str], PathRates]:
    """The calibrated figures of every WAN path `placement` crosses, for `streams`.
    Where the calibration also timed the placement's paths loaded at once, a path's
    rate and aggregate lie between its alone and together figures by how loaded the
    other paths keep it (`loads`, testbed_core/planning/path_load.py; None: all of
    them throughout, the together figures)."""
    out: dict[tuple[str, str], PathRates] = {}
    topo = scenario.topology
    rings = ring_crossings(placement) if _allreduce_on(scenario) else {}
    loaded = {frozenset(k) for k in pipeline_crossings(placement)}
    for (a, z) in [*pipeline_crossings(placement), *rings]:
        if (a, z) in out or (z, a) in out:
            continue
        pc = cal.path(a, z)
        route = shortest_path(a, z, topo.wan)
        nominal = min(topo.link(x, y).rate for x, y in zip(route, route[1:], strict=False))
        piped = (a, z) in pipeline_crossings(placement) or (z, a) in pipeline_crossings(placement)
        ringed = (a, z) in rings or (z, a) in rings
        together = pc.together_for(streams, loaded) if pc and piped and len(loaded) > 1 else None
        rate = pc.rates_bps.get(streams) if pc and piped else None
        colliding = pc.colliding_bps.get(streams) if pc and piped else None
        load = None
        if together is not None:  # timed with the placement's other paths loaded at once too
            load = load_of(loads, a, z)
            rate = weighed_rate(rate, together.rate_bps, load)
            colliding = weighed_rate(colliding, together.colliding_bps, load)
        out[(a, z)] = PathRates(
            (a, z),
            rate_bps=rate,
            colliding_bps=colliding,
            nominal_bps=nominal,
            ring_bps=pc.ring_bps if pc and ringed and pc.ring_streams == streams else None,
            ring_alone_bps=pc.rates_bps.get(streams) if pc and ringed and pc.ring_streams == streams else None,
            load=load,
        )
        if pc and ringed and not piped and out[(a, z)].ring_bps is None and pc.rates_bps.get(streams):
            out[(a, z)] = replace(out[(a, z)], rate_bps=pc.rates_bps[streams])
    return out


def grad_wire_bytes(workload: Any, eff: Any, rank: int) -> int:
    """The gradient bytes a worker of `rank` all-reduces: its stages' parameters x the
    dtype's bytes x the workload's scale (at least one byte)."""
    par = workload.parallelism
    params = sum(eff.stage_params[c * par.pp + rank] for c in range(par.chunks))
    return max(1, int(params * workload.model_spec().dtype_bytes * workload.scale))


def calibrate_variants(scenario: Scenario, runs: Sequence[RunVariant], net: Network, out: Path, secret: str,
                       eff: EffectiveWorkload, progress: Progress, auto_candidates: Sequence[int],
                       auto_margin: float) -> tuple[Calibration | None, int | None]:
    """The run's calibration (None when ``runner.calibrate`` is off) and, for
    ``transport.streams: auto``, the stream count it found best.

    Every WAN path the variants' placements cross is timed on its own, through one
    probe agent per host (testbed/run/calibration.py): tensors of the workload's wire
    size with a single stream and the configured count (or the auto candidates), then
    the count each variant crossing it will use, then, where two or more of a shared
    variant's pipelines cross it at once, their colliding aggregate; a path the DP
    rings cross (dp-across-dc) times those rings themselves, all at once. Inside the
    DCs, the DP ring of Atlas's placement. The first path is Atlas's first crossing
    (or, with no crossing, the path between the first and the last DC)."""
    if not scenario.runner.calibrate:
        return None, None
    t0 = time.monotonic()
    par = scenario.workload.parallelism
    topo = scenario.topology
    base_dir = scenario.workload_dir
    uses = wan_uses(scenario, runs, base_dir)
    if not any(u.pairs for u in uses.values()):  # no pipeline crosses a WAN: probe the first and last DC
        a, z = topo.dcs[0], topo.dcs[-1]
        key = _key(uses, a.name, z.name)
        use = uses.pop(key, PathUse(key))
        use.pairs = [(f"{a.name}-{a.hosts[0]}", f"{z.name}-{z.hosts[0]}")] if key == (a.name, z.name) \
            else [(f"{z.name}-{z.hosts[0]}", f"{a.name}-{a.hosts[0]}")]
        uses = {key: use, **uses}
    atlas_pl = None
    try:
        atlas_pl = variant_placement(get_variant("atlas"), scenario, scenario.workload, DEFAULT_AUTO_STREAMS,
                                     base_dir)
    except ValueError:
        pass
    lan = dp_lan_pairs(atlas_pl) if atlas_pl is not None and par.dp > 1 and scenario.runner.dp_allreduce \
        and scenario.workload.gpu.mode != "real" else []
    s = scenario.transport.streams
    counts = {1} | (set(auto_candidates) if s == "auto" else {int(s)})
    folder = out / "calibration"
    nbytes = eff.wire_activation_bytes
    by_name = {r.variant.name: r for r in runs}
    agents = ProbeAgents(net, folder, secret, warm=scenario.runner.warm_start)
    progress.log(f"calibrating {len(uses)} WAN path(s): "
                 + ", ".join(f"{a}<->{z} ({', '.join(u.variants) or 'probe'})" for (a, z), u in uses.items()))
    try:
        hosts = [h for u in uses.values() for pair in [*u.pairs, *u.ring_pairs] for h in pair]
        agents.start([*hosts, *(h for pair in lan for h in pair)])  # every agent at once
        paths: list[PathCalibration] = []
        for (a, z), use in uses.items():
            first = use.pairs[0] if use.pairs else use.ring_pairs[0]
            latency = 0.0 if net.local else topo.path_delay(a, z)
            pc = PathCalibration(dcs=(a, z), src=first[0], dst=first[1], nbytes=nbytes, latency_s=latency,
                                 nominal_bps=nominal_link(topo, first), variants=use.variants)
            paths.append(pc)
            if use.pairs:
                calibrate(net, scenario, folder, secret, _two_way(use.pairs), sorted(counts), nbytes, latency,
                          progress, pc, agents)
        cal = Calibration(src=paths[0].src, dst=paths[0].dst, nbytes=nbytes, latency_s=paths[0].latency_s,
                          paths=paths)
        cal.mirror_primary()
        auto = None
        if s == "auto":
            from atlas_transport.auto import choose

            auto = choose({n: cal.rates_bps[n] for n in auto_candidates}, auto_margin)
        nominal = nominal_link(topo, (cal.src, cal.dst))
        for pc, use in zip(paths, uses.values(), strict=True):
            # the count each variant's policy asks for (fill-link: by formula on the primary
            # path); plan_variant then keeps, of the counts measured, the fastest on the primary
            runs_here = [by_name[v] for v in use.channels if v in by_name]
            if use.pairs and runs_here:
                wanted = {choose_streams(run, scenario, cal.rate(1), nominal, auto) for run in runs_here}
                calibrate(net, scenario, folder, secret, _two_way(use.pairs), sorted(wanted), nbytes, pc.latency_s,
                          progress, pc, agents)
            cal.mirror_primary()
        for pc, use in zip(paths, uses.values(), strict=True):
            collide: dict[int, int] = {}
            for name in use.channels:
                if name not in by_name:
                    continue
                definition = by_name[name].variant
                if definition.streams == "one" or requested_sharing(definition, scenario) == "temporal":
                    continue
                n = variant_streams(definition, scenario, cal, auto, nominal)
                collide[n] = max(collide.get(n, 0), use.channels[name])
            for n, k in sorted(collide.items()):
                if k > 1:
                    calibrate_link(net, scenario, folder, secret, use.pairs[:k], n, pc, progress, agents)
            ring_runs = [by_name[v] for v in use.ring_variants if v in by_name]
            if use.ring_pairs and ring_runs:
                n = variant_streams(ring_runs[0], scenario, cal, auto, nominal)
                grad = max(grad_wire_bytes(scenario.workload, eff, r) for r in range(par.pp))
                calibrate_wan_rings(net, scenario, folder, secret, use.ring_pairs, n, grad, pc, progress, agents)
            cal.mirror_primary()
        for n, loads in together_loads(scenario, runs, uses, paths, cal, auto, nominal, base_dir).items():
            for group in loads:
                calibrate_together(net, scenario, folder, secret, group, n, progress, agents)
        cal.mirror_primary()
        if lan:
            grad = max(grad_wire_bytes(scenario.workload, eff, r) for r in range(par.pp))
            calibrate_lan(net, scenario, folder, secret, lan, grad, cal, progress, agents)
    finally:
        agents.close()
    cal.wall_s = time.monotonic() - t0
    progress.log(f"  calibration took {cal.wall_s:.1f} s")
    return cal, auto


def together_loads(scenario: Scenario, runs: Sequence[RunVariant], uses: dict[tuple[str, str], PathUse],
                   paths: Sequence[PathCalibration], cal: Calibration, auto: int | None, nominal: float | None,
                   base_dir: str | None) -> dict[int, list[list[tuple[PathCalibration, list[tuple[str, str]]]]]]:
    """Per stream count, the sets of WAN paths to time loaded at once: those a variant's
    pipelines cross together (two or more paths), each with the host pairs of the
    pipelines crossing it (temporal sharing by request: one, its plan puts one transfer
    at a time on a link). Every multi-stream variant (single streams stay window-limited,
    far from what loads the machine), at its stream count and, for Atlas's ``auto``
    sharing, at the configured count it also weighs; one set per distinct (count, paths)."""
    by_dcs = {pc.dcs: pc for pc in paths}
    out: dict[int, list[list[tuple[PathCalibration, list[tuple[str, str]]]]]] = {}
    seen: dict[tuple[int, frozenset[frozenset[str]]], list[tuple[PathCalibration, list[tuple[str, str]]]]] = {}
    for run in runs:
        definition = run.variant
        if definition.streams == "one":
            continue
        temporal = requested_sharing(definition, scenario) == "temporal"
        counts = [variant_streams(definition, scenario, cal, auto, nominal)]
        if requested_sharing(definition, scenario) == "auto" and definition.streams == "fill-link":
            counts.append(configured_streams(scenario, auto))
        for n in counts:
            pl = _hosted_placement(definition, scenario, n, base_dir)
            if pl is None:
                continue
            keys = [_key(uses, a, z) for a, z in pipeline_crossings(pl)]
            group = [(by_dcs[k], uses[k].pairs[:1 if temporal else max(1, uses[k].channels.get(definition.name, 1))])
                     for k in keys if k in by_dcs and k in uses and uses[k].pairs]
            ident = (n, frozenset(frozenset(k) for k in keys))
            if len(group) < 2 or len(group) != len(keys):
                continue
            if ident in seen:  # the same paths at the same count: keep the most channels on each
                mine = {pc.dcs: pairs for pc, pairs in group}
                seen[ident] = [(pc, max(pairs, mine[pc.dcs], key=len)) for pc, pairs in seen[ident]]
            else:
                seen[ident] = group
    for (n, _), group in seen.items():
        out.setdefault(n, []).append(group)
    return out


def _two_way(pairs: Sequence[tuple[str, str]]) -> list[tuple[str, str]]:
    """A forward channel and a reverse one (another pipeline's, when there is one):
    pipelines send activations and gradients across the WAN at the same time."""
    return [pairs[0], pairs[1][::-1] if len(pairs) > 1 else pairs[0][::-1]]
