"""Variant planning of `testbed run`: which variants run, where each one's stages go,
and, from the run's calibration, its streams, sharing of the WAN links and predicted
iteration time.

The run's data flow: `run_variants` lists the runs; `place_variants` places every
variant once (before the calibration, which times the paths these placements cross:
testbed/run/calibration.py), and `plan_variants` plans each run on that same
placement. A placement is never searched twice: ``runner.atlas_placement: search``
scores candidates for up to its time budget, and two searches could differ, so the
calibration would time other paths than the run uses.

Every decision dispatches on the variant's policies in the registry
(testbed_core/variants.py), never on its name: the placement policy picks the
planner's strategy (its own heuristic, ``runner.baseline_placement``, the search, or
DP across DCs), the stream policy the TCP streams per channel
(testbed_core/planning/streams.py), the sharing policy whether the temporal plan is
tried. The planner (testbed_core/planning/) simulates one iteration with the
calibrated channel rates; a variant with sharing ``auto`` gets its temporal plan
(testbed_core/planning/temporal.py) unless, with ``runner.atlas_sharing: auto``,
sharing the link is predicted faster (each way predicted with its own rates: the
plan's transfers hold the link ``token_margin`` longer; shared channels move what the
collision probe measured).

The prediction uses the calibrated rates (per-flow rate = channel rate / streams,
testbed_core/planning/calibrated.py) instead of the window model, each WAN path its
own (testbed_core/planning/wan_paths.py); where the calibration also timed a
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

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import NamedTuple

from testbed.progress import Progress
from testbed.run.common import RunnerError, nominal_link
from testbed.run.pacing import tensors_at_once, window_caps
from testbed.run.scenario import Scenario
from testbed_core.contracts.calibration import Calibration, dc_of_host
from testbed_core.contracts.summary import ConfigurationCandidate, PathRatesUsed
from testbed_core.planning.calibrated import calibrated_rates, calibrated_topology, path_topology
from testbed_core.planning.host_cpu import HostCost, with_host_cost
from testbed_core.planning.lossy import lossy_between
from testbed_core.planning.network import NetParams
from testbed_core.planning.path_load import path_loads
from testbed_core.planning.placement import SEARCH, Placement, free_gpus, place, strategy_for
from testbed_core.planning.prediction import (
    CHOICE_MARGIN,
    TEMPORAL_MARGIN,
    Prediction,
    Variant,
    allreduce_time,
    build_spec,
    choose_sharing,
    plan_wins,
    predict,
)
from testbed_core.planning.reverse_load import reverse_loads, weighed_one_way
from testbed_core.planning.schedule import schedule_options, with_schedule
from testbed_core.planning.search import search_placement
from testbed_core.planning.streams import (
    choose_streams,
    configured_streams,
    requested_sharing,
    timed_counts,
    variant_streams,
)
from testbed_core.planning.wan_paths import (
    PathRates,
    first_rated,
    path_rates_of,
    pipeline_crossings,
)
from testbed_core.simulate import simulate
from testbed_core.topology import Topology
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

SCHEDULE_MARGIN = 0.03  # atlas_schedule auto: another schedule runs only when predicted this much faster
LOAD_PASSES = 1  # predictions again with each path weighed by the load the last one simulated

Placements = Mapping[str, Placement | ValueError]
"""Each registry variant's placement (by its name, e.g. "atlas" for "atlas+bubbletea"
too), or why it cannot be placed: `place_variants`."""


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
    lan_rings: int | None = None  # how many rings inside the DCs the calibration timed at once
    lan_alone_bps: float | None = None  # and one of them alone (calibrated)
    lan_tensor_bps: float | None = None  # a pipeline tensor on a one-stream channel inside a DC (calibrated)
    lan_loaded_bps: float | None = None  # and with its pipeline's WAN channels busy (calibrated)
    final_prediction: float | None = None  # the headline prediction (real devices: measured compute)
    sharing: str = "shared"  # how the variant uses WAN links: "temporal" (a plan) or "shared"
    sharing_requested: str = "shared"  # what the scenario asked for: "shared", "temporal" or "auto"
    sharing_alternatives: dict[str, float] | None = None  # sharing "auto": a-priori prediction of each way
    # each WAN path's own calibrated figures (per DC pair): the prediction uses them, not one factor for all
    path_rates: dict[tuple[str, str], PathRates] = field(default_factory=dict)
    workload: Workload | None = None  # what the variant runs where its schedule is not the configured one
    schedule_alternatives: dict[str, float] | None = None  # atlas_schedule auto: a-priori prediction of each
    schedules_refused: dict[str, str] = field(default_factory=dict)  # schedules not weighed, and why
    placement_label: str = ""  # how `configurations` names its placement
    host_cost: HostCost | None = None  # calibrated: the tensor checks (runner.verify_tensors), the device's overhead an op
    even_spread: bool = False  # the calibration's channels spread each tensor evenly (Calibration.even_spread)
    even_spread_stream_bytes: int | None = None  # chunks of this many bytes (None: every size)
    even_spread_chunks: int = 1  # up to this many of them per stream
    # the prediction draws who gets ahead where two channels collide on a link
    # (testbed_core/planning/collisions.py): set once the variant's way is chosen
    # (`_drawn_prediction`); its choices are made with every collision split evenly
    draw_collisions: bool = False
    # shared multi-stream channels: per (sending DC, receiving DC), each stream's receive
    # window clamp (testbed/run/pacing.py `window_caps`), in the prediction and the run's channels
    window_caps: dict[tuple[str, str], int] = field(default_factory=dict)
    # Atlas with calibrated, auto sharing: every configuration predicted (streams, sharing,
    # placement), the one taken marked; None where there was nothing to choose
    configurations: list[ConfigurationCandidate] | None = None

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

def check_runnable(scenario: Scenario, progress: Progress) -> None:
    """What the runner needs of the workload beyond a valid file: a pipeline to split
    across DCs (pp >= 2); a tensor-parallel group is played by one worker."""
    par = scenario.workload.parallelism
    if par.pp < 2:
        where = scenario.workload_source or f"{scenario.source or 'scenario'}: workload"
        raise RunnerError(f"{where}: parallelism.pp is {par.pp}; pipeline training across DCs needs pp >= 2")
    if par.tp != 1:
        progress.log(f"note: tp={par.tp}: each worker plays a whole tensor-parallel group on one host")


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


# ------------------------------------------------------------------ placement, once per variant

_searched: dict[str, Placement] = {}  # search inputs (JSON) -> the placement the search found


def variant_placement(definition: VariantDef, scenario: Scenario, workload: Workload | None = None) -> Placement:
    """Where a variant's stages go (`workload`: another parallelism than the
    scenario's): its placement policy's strategy, or, for ``runner.atlas_placement:
    search``, the search's best placement scored on the nominal network (as `testbed
    plan --search`) with the streams its policy takes before any calibration. A search
    with the same inputs is made once per process (the run's preflight and the run
    share it). ValueError when it does not fit."""
    workload = workload or scenario.workload
    topo = scenario.topology
    strategy = strategy_for(definition.placement, scenario.runner.baseline_placement, scenario.runner.atlas_placement)
    par = workload.parallelism
    hosts = {dc.name: list(dc.hosts) for dc in topo.dcs}
    if strategy != SEARCH:
        return place(free_gpus(topo), par.pp, par.dp, par.tp, strategy=strategy, hosts=hosts, chunks=par.chunks)
    streams = choose_streams(definition, scenario.transport.streams, None, None, None)
    sharing = requested_sharing(definition, scenario.runner.atlas_sharing)
    allreduce = par.dp > 1 and scenario.runner.dp_allreduce
    key = json.dumps([topo.model_dump(mode="json"), workload.model_dump(mode="json"), definition.name, streams,
                      sharing, allreduce, scenario.workload_dir], sort_keys=True, default=str)
    if key not in _searched:
        scored = Variant(definition.name, streams, sharing, SEARCH, fill_link=definition.streams == "fill-link")
        _searched[key] = search_placement(topo, workload, scored, predictor=fast_predict, hosts=hosts,
                                          base_dir=scenario.workload_dir,
                                          net=NetParams(allreduce=allreduce)).placement
    return _searched[key]


def place_variants(scenario: Scenario, runs: Sequence[RunVariant]) -> dict[str, Placement | ValueError]:
    """The placement of Atlas (first: the calibration's primary path is its first
    crossing) and of every variant of `runs`, each computed once, by registry name; a
    variant that cannot be placed gets its error instead (its planning reports it)."""
    out: dict[str, Placement | ValueError] = {}
    for definition in [get_variant("atlas"), *(r.variant for r in runs)]:
        if definition.name in out:
            continue
        try:
            pl = variant_placement(definition, scenario)
        except ValueError as exc:
            out[definition.name] = exc
            continue
        out[definition.name] = pl
    return out


# ------------------------------------------------------------------ the prediction's network

def lossy_history(scenario: Scenario, warmed: bool = True) -> tuple[int, int, int]:
    """What each channel of a variant carries on connections opened for its run: the
    tensors of its warm-up iterations, then those of its measured ones, and the bytes a
    stream of the untimed tensor an atlas_transport worker warms each WAN channel with
    first (`warmed`; testbed/training/worker/warm.py, the calibration's
    PROBE_WARMUP_BYTES_PER_STREAM; real-device workers only, as
    testbed/training/worker/train.py warms them; gloo's pairs are not warmed): a lossy
    path's windows have not come down to the loss's steady state in a short run
    (testbed_core/planning/lossy.py `run_times`)."""
    from testbed.run.calibration import PROBE_WARMUP_BYTES_PER_STREAM

    w = scenario.workload
    per_iteration = w.parallelism.num_micro_batches
    warm = PROBE_WARMUP_BYTES_PER_STREAM if warmed and w.gpu.mode == "real" else 0
    return w.warmup * per_iteration, w.iterations * per_iteration, warm


def lossy_paced(scenario: Scenario, rendezvous: bool = False) -> bool:
    """Whether a variant's WAN streams leave paced, as the loss model times them
    (testbed_core/planning/lossy.py `paced`): ``transport.pacing`` on and the variant's
    channels atlas_transport's, which ask for Linux's internal pacing
    (SO_MAX_PACING_RATE); gloo's sockets (`rendezvous`, the torch-gloo variant) ask
    for none, and without sch_fq Linux paces only the sockets that ask."""
    return scenario.transport.pacing is True and not rendezvous


def unpaced_bursts(setup: VariantSetup, scenario: Scenario, local: bool) -> bool:
    """Whether the prediction of `setup` has its WAN tensors leave as unpaced bursts
    (`NetParams.unpaced_bursts`): gloo's sockets (`rendezvous`) ask for no pacing, so a
    tensor that fits their windows leaves at once and crosses the bottleneck whole, one
    after another at the link's rate. Under emulation only: loopback has no bottleneck
    queue."""
    return setup.variant.rendezvous and setup.variant.sharing == "shared" and not local


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
                                           nominal, colliding_bps or setup.colliding_bps,
                                           lossy=pair is not None and lossy_between(
                                               scenario.topology, dc_of_host(pair[0]), dc_of_host(pair[1])))
    net = NetParams(flow_rate_bps=flow, allreduce=_allreduce_on(scenario),
                    crowded_fraction=None if local else crowded, lan_rate_bps=setup.lan_rate_bps,
                    lan_rings=setup.lan_rings, lan_ring_alone_bps=setup.lan_alone_bps,
                    lan_tensor_bps=setup.lan_tensor_bps, lan_loaded_bps=setup.lan_loaded_bps,
                    lossy_history=lossy_history(scenario, not setup.variant.rendezvous),
                    paced=lossy_paced(scenario, setup.variant.rendezvous),
                    unpaced_bursts=unpaced_bursts(setup, scenario, local),
                    stripe_windows=scenario.workload.gpu.mode != "real", even_spread=setup.even_spread,
                    even_spread_stream_bytes=setup.even_spread_stream_bytes,
                    even_spread_chunks=setup.even_spread_chunks,
                    path_window_bytes=setup.window_caps or None,
                    link_line_bps=None if rate_bps is None else _line_rates(setup, scenario, local))
    return net, calibrated_topology(scenario.topology, link, pair, local)


def _net_per_path(setup: VariantSetup, scenario: Scenario, local: bool) -> tuple[NetParams, Topology]:
    temporal = setup.variant.sharing == "temporal"
    hold = 1 + scenario.runner.token_margin if temporal else 1.0
    flows: dict[tuple[str, str], float] = {}
    crowd: dict[tuple[str, str], float] = {}
    links: dict[tuple[str, str], float] = {}
    rings: dict[tuple[str, str], float] = {}
    rings_alone: dict[tuple[str, str], float] = {}
    holds: dict[tuple[str, str], float] = {}
    splits: dict[tuple[str, str], tuple[float, ...]] = {}
    for key, pr in setup.path_rates.items():
        if pr.rate_bps is not None and temporal and pr.turns_rate_bps is not None:
            # a plan's transfers where the path was timed as a plan uses it: its holds
            # measured, each way (the return way often the slower); the bytes move at
            # the probe's rate on the wire and the link is held the hold's multiple of it
            wires = pr.turns_wire_bps or pr.turns_rate_bps
            for dcs, rate, wire in zip((key, key[::-1]), pr.turns_rate_bps, wires, strict=True):
                # (no turns figures on a lossy route: wan_paths.path_rates_of drops them)
                flows[dcs], link, _ = calibrated_rates(True, setup.streams, max(rate, wire), pr.nominal_bps)
                holds[dcs] = max(1.0, wire / rate)
                links[key] = max(links.get(key, 0.0), link or 0.0)
        elif pr.rate_bps is not None:  # else the alone rate (a plan's transfers token_margin longer)
            flow, link, crowded = calibrated_rates(temporal, setup.streams, pr.rate_bps / hold, pr.nominal_bps,
                                                   pr.colliding_bps, lossy=lossy_between(scenario.topology, *key))
            flows[key], links[key] = flow, link
            if crowded is not None and not local:
                crowd[key] = crowded
                splits.update(_split_shares(setup, scenario, key, pr))
        if pr.ring_bps is not None:
            rings[key] = pr.ring_bps
            if pr.ring_alone_bps is not None:
                rings_alone[key] = pr.ring_alone_bps
    net = NetParams(allreduce=_allreduce_on(scenario), lan_rate_bps=setup.lan_rate_bps,
                    lan_rings=setup.lan_rings, lan_ring_alone_bps=setup.lan_alone_bps,
                    lan_tensor_bps=setup.lan_tensor_bps, lan_loaded_bps=setup.lan_loaded_bps,
                    path_flow_rate_bps=flows, link_crowded_fraction=crowd, link_ring_rate_bps=rings,
                    link_ring_alone_bps=rings_alone or None, lossy_history=lossy_history(scenario, not setup.variant.rendezvous),
                    paced=lossy_paced(scenario, setup.variant.rendezvous),
                    unpaced_bursts=unpaced_bursts(setup, scenario, local),
                    stripe_windows=scenario.workload.gpu.mode != "real", even_spread=setup.even_spread,
                    even_spread_stream_bytes=setup.even_spread_stream_bytes,
                    even_spread_chunks=setup.even_spread_chunks, path_hold_factor=holds or None,
                    path_window_bytes=setup.window_caps or None, link_line_bps=_line_rates(setup, scenario, local),
                    link_split_shares=(splits or None) if setup.draw_collisions else None)
    return net, path_topology(scenario.topology, links, local)


def _split_shares(setup: VariantSetup, scenario: Scenario, key: tuple[str, str],
                  pr: PathRates) -> dict[tuple[str, str], tuple[float, ...]]:
    """The collision probe's shares (testbed_core/planning/collisions.py) for each way of
    the path `key` where two of the variant's channels colliding there split the link
    unequally: a path of one link, without configured loss (the loss model draws its
    tensors' times), each way whose streams the run does not clamp (`setup.window_caps`:
    a clamped stream cannot take what the other leaves, and the runs' pipelines stay in
    lockstep there)."""
    if not pr.collision_shares or lossy_between(scenario.topology, *key) \
            or len(scenario.topology.route(*key)) != 2:
        return {}
    caps = setup.window_caps or {}
    return {way: shares for way, shares in zip((key, key[::-1]), pr.collision_shares, strict=True)
            if way not in caps}


def _line_rates(setup: VariantSetup, scenario: Scenario, local: bool) -> dict[tuple[str, str], float] | None:
    """Each WAN link's shaper rate from the scenario's topology, for a calibrated
    prediction of shared links: tensors queued behind another there move at most at
    the link's sustained goodput, not at the calibration's rate of isolated tensors,
    which had the shaper's burst (simulate.Resource.busy_bps). None in local mode (no
    shaper) and for a temporal plan, whose transfers never start on a busy link (the
    token passes after a hand-over) and whose rates are its holds (the turns probe, or
    the alone rate token_margin longer)."""
    if local or setup.variant.sharing == "temporal":
        return None
    return {link.between: link.rate for link in scenario.topology.wan}


# ------------------------------------------------------------------ prediction

def predict_variant(setup: VariantSetup, scenario: Scenario, workload: Workload, base_dir: str | None,
                    rate_bps: float | None, pair: tuple[str, str] | None, local: bool,
                    effective: EffectiveWorkload | None = None, colliding_bps: float | None = None) -> Prediction:
    """The planner's prediction (and, for temporal sharing, the plan) of a placed
    variant whose WAN channels move `rate_bps` each (`effective`: measured compute times)."""
    net, topo = _net_for(setup, scenario, rate_bps, pair, local, colliding_bps)
    if effective is None and setup.host_cost is not None:
        effective = workload.effective(base_dir)
    return predict(topo, workload, setup.variant, net=net, base_dir=base_dir, placement=setup.placement,
                   effective=with_host_cost(effective, setup.host_cost) if effective is not None else None)


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
    spec, _ = build_spec(topo, workload, setup.placement, setup.variant, with_host_cost(eff, setup.host_cost), net)
    sim = simulate(plan.apply(spec))
    ring = allreduce_time(topo, workload, setup.placement, eff, sim, setup.variant, net) if net.allreduce else 0.0
    return sim.makespan + ring


def real_device_prediction(setup: VariantSetup, scenario: Scenario, workload: Workload, base_dir: str | None,
                           pair: tuple[str, str] | None, local: bool, compute: tuple[list[float], list[float]],
                           overhead_s: float) -> float:
    """The headline prediction of a run on real devices: its plan again with each stage
    computing for the (forward, backward) seconds of `compute`, as its warm-up measured
    them, plus the pipeline's `overhead_s` measured there (the compute model does not
    know the machine). The runner makes it (testbed/run/runner.py `_predictions`), and
    `testbed report`'s re-planning makes it again from the summary's figures."""
    return repredict(setup, scenario, workload, base_dir, None, pair, local, compute) + overhead_s


# ------------------------------------------------------------------ one variant's plan

def requested_schedule(variant: str | VariantDef | RunVariant, scenario: Scenario) -> str:
    """"auto" where the variant's schedule policy follows ``runner.atlas_schedule: auto``
    on modelled devices (real ones run the configured schedule), else "configured"."""
    if _definition(variant).schedule != "auto" or scenario.workload.gpu.mode == "real":
        return "configured"
    return scenario.runner.atlas_schedule


def plan_variant(
    variant: str | RunVariant, scenario: Scenario, workload: Workload, base_dir: str | None,
    cal: Calibration | None, auto_streams: int | None, local: bool = False,
    placement: Placement | ValueError | None = None, others: Sequence[Placement] = (),
) -> VariantSetup:
    """Plan a variant run on its placement (`placement`: as `place_variants` computed
    it; None: placed now), choose its streams, WAN sharing and (Atlas's scheduling,
    ``runner.atlas_schedule: auto``) its pipeline schedule, and predict it. Each
    schedule the devices can hold is planned in full (streams, sharing, temporal plan)
    and predicted; another than the configured one runs only when predicted faster by
    more than SCHEDULE_MARGIN. Atlas's streams, sharing and placement follow its own
    calibrated prediction (`_choose_configuration`; `others`: the placements of the
    run's other variants it may take)."""
    run = variant if isinstance(variant, RunVariant) else RunVariant(_definition(variant), has_bubbletea(variant))
    if placement is None:
        try:
            placement = variant_placement(run.variant, scenario, workload)
        except ValueError as exc:
            placement = exc
    setup = _choose_configuration(run, scenario, workload, placement, base_dir, cal, auto_streams, local, others)
    if requested_schedule(run, scenario) != "auto":
        return _drawn_prediction(setup, scenario, workload, base_dir, local)
    options, refused = schedule_options(workload)
    assert setup.prediction is not None
    times = {workload.parallelism.schedule: setup.prediction.iteration_time_s}
    best = setup
    for name in options[1:]:
        other = with_schedule(workload, name)
        # another schedule may want other streams: GPipe sends micro-batches back to back,
        # so a channel's windows, not one transfer's time, can bound it (every timed count)
        nominal = nominal_link(scenario.topology, (cal.src, cal.dst)) if cal else None
        counts = timed_counts(run.variant, scenario.transport.streams, cal, auto_streams, nominal)
        plans = [_choose_configuration(run, scenario, other, placement, base_dir, cal, auto_streams, local, others)]
        if plans[0].configurations is None:  # no choice made there: each timed count in the policy's way
            plans += [_plan_one(run, scenario, other, placement, base_dir, cal, auto_streams, local, streams=n)
                      for n in counts]
        alt = min(plans, key=lambda p: p.prediction.iteration_time_s)  # type: ignore[union-attr]
        assert alt.prediction is not None and best.prediction is not None
        times[name] = alt.prediction.iteration_time_s
        if alt.prediction.iteration_time_s < best.prediction.iteration_time_s * (1 - SCHEDULE_MARGIN):
            best, alt.workload = alt, other
    best.schedule_alternatives, best.schedules_refused = times, refused
    return _drawn_prediction(best, scenario, workload, base_dir, local)


def _drawn_prediction(setup: VariantSetup, scenario: Scenario, workload: Workload, base_dir: str | None,
                      local: bool) -> VariantSetup:
    """`setup` with its prediction made again where its shared channels collide on a
    link whose collision probe split them unequally (testbed_core/planning/collisions.py:
    who gets ahead is a draw, and pipelines that drift apart collide less), and
    ``draw_collisions`` set for every prediction of it after (`repredict`).

    Its choices (streams, sharing, placement, schedule) were made with every collision
    split evenly, the lockstep in which no collision ends early, as the margins they
    use were set against (TEMPORAL_MARGIN, SHARING_MARGIN): a plan takes the collisions
    out, and whether a run's shared pipelines drift apart is the draw. Over the kept
    runs, choices made with the drawn predictions would have moved Atlas from its plan
    to shared links where multi-TCP's shared links ran slower than the plan
    (docs/results/fidelity.md, "Collisions drawn from the probe's rounds")."""
    setup.draw_collisions = True
    if setup.prediction is None or setup.variant.sharing == "temporal" or not setup.path_rates:
        return setup
    net, _ = _net_for(setup, scenario, None, None, local)
    if net.link_split_shares:
        setup.prediction = predict_variant(setup, scenario, setup.workload or workload, base_dir, None, None, local)
    return setup


class _SharingOption(NamedTuple):
    """One sharing way `_plan_one` planned (temporal plan or shared links), with what the
    variant takes from it if it is chosen."""

    variant: Variant
    prediction: Prediction
    rate_bps: float | None  # the first crossing's channel rate as the prediction weighed it
    colliding_bps: float | None  # its channels colliding there, in all
    path_rates: dict[tuple[str, str], PathRates]
    window_caps: dict[tuple[str, str], int]  # each stream's window clamp per direction (shared ways only)


def _plan_one(run: RunVariant, scenario: Scenario, workload: Workload, placement: Placement | ValueError,
              base_dir: str | None,
              cal: Calibration | None, auto_streams: int | None, local: bool,
              streams: int | None = None, way: str | None = None) -> VariantSetup:
    """`plan_variant` for the workload's own schedule on `placement` (`streams`: this
    count instead of the stream policy's; `way`: "temporal" or "shared" only, instead
    of what the scenario asks for)."""
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
        streams = variant_streams(definition, scenario.transport.streams, cal, auto_streams,
                                  nominal_link(topo, pair) if pair else None)
    if isinstance(placement, ValueError):
        raise RunnerError(f"variant {run.name}: {placement}")
    if any(not h for h in placement.hosts.values()):
        raise RunnerError(f"variant {run.name}: placement {strategy} left a stage without a host")
    rate = cal.rates_bps.get(streams) if cal else None
    sharing = requested_sharing(definition, scenario.runner.atlas_sharing)
    requested = sharing
    if way is not None:
        sharing = way  # type: ignore[assignment]
    setup = VariantSetup(run, streams, Variant(definition.name, streams, "shared", strategy), placement, None,
                         sharing_requested=sharing)
    setup.colliding_bps = cal.colliding_bps.get(streams) if cal else None
    if cal is not None:
        setup.host_cost = HostCost.of(cal.verify if scenario.runner.verify_tensors else None, cal.op_overhead_s)
    setup.lan_rate_bps = cal.lan_rate_bps if cal else None
    setup.lan_tensor_bps = cal.lan_tensor_rate_bps if cal else None
    setup.lan_loaded_bps = cal.lan_loaded_rate_bps if cal else None
    setup.even_spread = cal.even_spread if cal else False
    setup.even_spread_stream_bytes = cal.even_spread_stream_bytes if cal else None
    setup.even_spread_chunks = cal.even_spread_chunks if cal else 1
    if cal is not None and cal.lan_alone_rate_bps is not None and cal.lan_pairs:
        setup.lan_rings, setup.lan_alone_bps = len(cal.lan_pairs), cal.lan_alone_rate_bps
    if cal is not None and cal.paths:
        setup.path_rates = path_rates_of(placement, topo, cal, streams, _allreduce_on(scenario))
        first = first_rated(setup.path_rates)
        if first is not None:  # reported as the variant's channel rate: its first crossing's
            rate, setup.colliding_bps = first.rate_bps, first.colliding_bps
            pc = cal.path(*first.dcs)
            pair = (pc.src, pc.dst) if pc is not None else pair
    options: dict[str, _SharingOption] = {}
    timed, colliding = setup.path_rates, setup.colliding_bps
    for option in ("temporal", "shared"):
        if sharing not in (option, "auto"):
            continue
        setup.variant = Variant(definition.name, streams, option, strategy)
        setup.window_caps = {} if option == "temporal" else \
            shared_caps(scenario, workload, base_dir, placement, streams, local)
        # a planned transfer holds its link token_margin longer than its measured time on
        # the wire, so that one running late does not collide with the next
        hold = 1 + scenario.runner.token_margin if option == "temporal" else 1.0
        setup.path_rates = timed
        pred = _predict_loaded(setup, scenario, workload, base_dir, cal, None if rate is None else rate / hold,
                               pair, local)
        first = first_rated(setup.path_rates)  # the first crossing's figures, as the prediction weighed them
        way_rate, way_colliding = (rate, colliding) if first is None else (first.rate_bps, first.colliding_bps)
        way_rate = None if way_rate is None else way_rate / hold
        if option == "temporal" and first is not None and first.turns_rate_bps is not None:
            way_rate = min(first.turns_rate_bps)  # the plan's transfers as the turns probe timed them (slower way)
        options[option] = _SharingOption(setup.variant, pred, way_rate, way_colliding, setup.path_rates,
                                         setup.window_caps)
    if len(options) == 2:
        times = {option: opt.prediction.iteration_time_s for option, opt in options.items()}
        setup.sharing_alternatives = times
        chosen = choose_sharing(times["temporal"], times["shared"])
    else:
        (chosen,) = options
    taken = options[chosen]
    setup.variant, setup.prediction, setup.path_rates = taken.variant, taken.prediction, taken.path_rates
    setup.rate_bps, setup.colliding_bps, setup.window_caps = taken.rate_bps, taken.colliding_bps, taken.window_caps
    if setup.prediction.plan is None and chosen == "temporal":
        chosen = "shared"  # no WAN link to plan (every crossing inside one DC)
    setup.sharing = chosen
    setup.sharing_requested = requested
    if way is None and sharing == "auto" and definition.streams == "fill-link" and cal is not None:
        _consider_configured_shared(setup, scenario, workload, base_dir, cal, auto_streams, pair, local)
    return setup


def _choose_configuration(run: RunVariant, scenario: Scenario, workload: Workload, placement: Placement | ValueError,
                          base_dir: str | None, cal: Calibration | None, auto_streams: int | None, local: bool,
                          others: Sequence[Placement] = ()) -> VariantSetup:
    """Atlas follows its own calibrated prediction: with a calibration and sharing
    ``auto``, every configuration it may run is planned and predicted, each stream
    count the calibration timed (one stream, the configured count, the count to fill
    the link: the baseline's and multi-TCP's own counts among them) each way
    (temporal plan or shared links), on its own placement and on each of `others`
    whose paths were timed (the baseline's placement), and the fastest by prediction
    runs. Its own configuration (the stream policy's count, the plan unless sharing is
    predicted faster by the sharing margin) is kept unless another is predicted faster
    by more than CHOICE_MARGIN, and a temporal plan only where no shared way is
    predicted within TEMPORAL_MARGIN of it. A shared way at a count above one is weighed only
    where that count's collision was calibrated on every path two pipelines' channels
    cross (the prediction needs its aggregate; `_collision_timed`) or it is the
    policy's own count. Every candidate and the one taken are kept in
    ``setup.configurations`` (summary.json). Other variants, and Atlas without a
    calibration or with fixed sharing: `_plan_one` as it is."""
    definition = run.variant
    own = _plan_one(run, scenario, workload, placement, base_dir, cal, auto_streams, local)
    if cal is None or definition.streams != "fill-link" or own.sharing_requested != "auto" \
            or isinstance(placement, ValueError):
        return own
    pair = (cal.src, cal.dst)
    nominal = nominal_link(scenario.topology, pair)
    counts = timed_counts(definition, scenario.transport.streams, cal, auto_streams, nominal)
    places = [placement] + [pl for pl in others if pl.stage_dc != placement.stage_dc and _timed(pl, scenario, cal)]
    places = list({pl.stage_dc: pl for pl in places}.values())
    pool: list[VariantSetup] = []
    for pl in places:
        for n in sorted(set(counts) | {own.streams}):
            for option in ("temporal", "shared"):
                if pl is placement and n == own.streams and option == own.sharing:
                    continue  # that is `own`
                if option == "shared" and n > 1 and n != own.streams and not _collision_timed(pl, scenario, cal, n):
                    continue
                try:
                    cand = _plan_one(run, scenario, workload, pl, base_dir, cal, auto_streams, local, streams=n,
                                     way=option)
                except (RunnerError, ValueError):
                    continue
                if cand.sharing != option:  # no WAN link to plan: the same as shared
                    continue
                if any(pr.rate_bps is None and pr.ring_bps is None for pr in cand.path_rates.values()):
                    continue  # a path of the baseline's placement not timed at this count
                cand.placement_label = pl.strategy if pl is placement else f"{pl.strategy} (the baseline's)"
                pool.append(cand)
    own.placement_label = placement.strategy
    assert own.prediction is not None
    best = min(pool, key=lambda c: c.prediction.iteration_time_s, default=None)  # type: ignore[union-attr]
    taken = own
    if best is not None and best.prediction is not None and \
            best.prediction.iteration_time_s < own.prediction.iteration_time_s * (1 - CHOICE_MARGIN):
        taken = best
    if taken.sharing == "temporal":  # a plan must win clearly: see TEMPORAL_MARGIN
        shared = min((c for c in [own, *pool] if c.sharing == "shared"),
                     key=lambda c: c.prediction.iteration_time_s, default=None)  # type: ignore[union-attr]
        if shared is not None and shared.prediction is not None and \
                not plan_wins(taken.prediction.iteration_time_s, shared.prediction.iteration_time_s, TEMPORAL_MARGIN):
            taken = shared
    if taken is not own:
        taken.sharing_alternatives = own.sharing_alternatives
    taken.configurations = [
        ConfigurationCandidate(streams=c.streams, sharing=c.sharing, placement=c.placement_label,
                               stage_dcs=list(c.placement.stage_dc[0]),
                               predicted_iteration_time_s=c.prediction.iteration_time_s,  # type: ignore[union-attr]
                               taken=c is taken, own=c is own)
        for c in sorted([own, *pool], key=lambda c: c.prediction.iteration_time_s)]  # type: ignore[union-attr]
    return taken


def _timed(placement: Placement, scenario: Scenario, cal: Calibration) -> bool:
    """Whether the calibration timed every WAN path `placement` crosses (else its
    prediction would rest on rates nobody measured). A calibration of one path stands
    for every link, for any placement, as it does for the variant's own."""
    if not cal.paths:
        return True
    rates = path_rates_of(placement, scenario.topology, cal, 1, _allreduce_on(scenario))
    return all(pr.rate_bps is not None for pr in rates.values())


def _collision_timed(placement: Placement, scenario: Scenario, cal: Calibration, streams: int) -> bool:
    """Whether `streams`-stream channels colliding were calibrated on every path of
    `placement` where they collide: where two or more pipelines' channels cross it. A
    path one pipeline crosses has nothing to collide with, so its alone figure is all its
    prediction needs, as it is for multi-TCP there (a one-pipeline run, such as
    scenarios/lossy-4dc.yaml, has no collision probe: Atlas could not weigh sharing at
    the count it runs, and took a temporal plan predicted slower than that)."""
    crowded = {frozenset(k) for k, ends in pipeline_crossings(placement).items() if len(ends) > 1}
    if cal.paths:
        rates = path_rates_of(placement, scenario.topology, cal, streams, _allreduce_on(scenario))
        return bool(rates) and all(pr.colliding_bps is not None or frozenset(k) not in crowded
                                   for k, pr in rates.items())
    return streams in cal.rates_bps and (streams in cal.colliding_bps or not crowded)


def _predict_loaded(setup: VariantSetup, scenario: Scenario, workload: Workload, base_dir: str | None,
                    cal: Calibration | None, rate_bps: float | None, pair: tuple[str, str] | None,
                    local: bool) -> Prediction:
    """`predict_variant` of `setup` (`rate_bps` on every link where it has no per-path
    figures). Where the calibration also timed the placement's paths loaded at once,
    the first prediction takes their together figures (every other path busy
    throughout); it is then made again LOAD_PASSES times, each path's figures weighed
    by how loaded the last predicted iteration keeps it (``setup.path_rates`` updated);
    then once more where a shared channel was also timed one way alone (`_weigh_one_way`)."""
    pred = predict_variant(setup, scenario, workload, base_dir, None if setup.path_rates else rate_bps, pair, local)
    if cal is None:
        return pred
    for _ in range(LOAD_PASSES if any(pr.load is not None for pr in setup.path_rates.values()) else 0):
        loads = path_loads(pred.sim, pred.spec.schedule, setup.placement)
        setup.path_rates = path_rates_of(setup.placement, scenario.topology, cal, setup.streams,
                                         _allreduce_on(scenario), loads)
        pred = predict_variant(setup, scenario, workload, base_dir, None, pair, local)
    return _weigh_one_way(setup, scenario, workload, base_dir, cal, pair, local, pred)


def _weigh_one_way(setup: VariantSetup, scenario: Scenario, workload: Workload, base_dir: str | None,
                   cal: Calibration | None, pair: tuple[str, str] | None, local: bool, pred: Prediction) -> Prediction:
    """`pred` made again where the calibration also timed the shared variant's channels
    alone one way (`PathCalibration.one_way_bps`): each path's channel rate weighed
    between the rate probe's (the other way busy too) and the one-way figure by how
    much the last predicted iteration's transfers overlap the other way's
    (testbed_core/planning/reverse_load.py), ``setup.path_rates`` updated."""
    if cal is None or setup.variant.sharing != "shared" or not setup.path_rates:
        return pred
    factors: dict[tuple[str, str], float] = {}
    loads = None
    for key, pr in setup.path_rates.items():
        pc = cal.path(*key)
        both = pc.rates_bps.get(setup.streams) if pc is not None else None
        one = pc.one_way_bps.get(setup.streams) if pc is not None else None
        if pr.rate_bps is None or both is None or one is None or one <= both:
            continue
        if loads is None:
            loads = reverse_loads(pred.sim, pred.spec.schedule, setup.placement)
        factors[key] = weighed_one_way(both, one, loads.get(frozenset(key), 1.0)) / both
    if not factors:
        return pred
    setup.path_rates = {key: replace(pr, rate_bps=pr.rate_bps * factors[key]) if key in factors else pr  # type: ignore[operator]
                        for key, pr in setup.path_rates.items()}
    return predict_variant(setup, scenario, workload, base_dir, None, pair, local)


def shared_caps(scenario: Scenario, workload: Workload, base_dir: str | None, placement: Placement,
                streams: int, local: bool) -> dict[tuple[str, str], int]:
    """The window caps of a shared way of `streams` streams on `placement`: shared
    channels colliding past what a path holds get each stream's window capped
    (testbed/run/pacing.py `window_caps`; none in local mode)."""
    if local:
        return {}
    return window_caps(scenario.topology, placement, streams, workload.effective(base_dir).wire_activation_bytes,
                       tensors_at_once(workload.parallelism))


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
    that count was calibrated colliding (the prediction needs its aggregate); with
    multi-TCP's window caps, as the collision probe ran it (before, the caps were dropped:
    Atlas ran uncapped on figures timed capped, 4dc-regions GPipe -8..-11%)."""
    n = configured_streams(scenario.transport.streams, auto)
    if n == setup.streams or setup.prediction is None:
        return
    paths_at_n = path_rates_of(setup.placement, scenario.topology, cal, n, _allreduce_on(scenario)) \
        if cal.paths else {}
    measured = (all(pr.colliding_bps is not None for pr in paths_at_n.values())
                if cal.paths else n in cal.colliding_bps and n in cal.rates_bps)
    if not measured:
        return
    # multi-TCP's way, its window caps included: the collision it is predicted from was
    # timed with them (calibration `variant_caps`, a shared way of `auto` capped)
    alt = replace(setup, streams=n, variant=Variant(setup.variant.name, n, "shared", setup.variant.placement),
                  window_caps=shared_caps(scenario, workload, base_dir, setup.placement, n, local))
    alt.path_rates = paths_at_n
    rate = cal.rates_bps.get(n)
    alt.colliding_bps = cal.colliding_bps.get(n)
    pred = _predict_loaded(alt, scenario, workload, base_dir, cal, rate, pair, local)
    first = first_rated(alt.path_rates)  # the first crossing's figures, as the prediction weighed them
    if first is not None:
        rate, alt.colliding_bps = first.rate_bps, first.colliding_bps
    times = dict(setup.sharing_alternatives or {setup.sharing: setup.prediction.iteration_time_s})
    times[f"shared, {n} streams"] = pred.iteration_time_s
    setup.sharing_alternatives = times
    if choose_sharing(setup.prediction.iteration_time_s, pred.iteration_time_s) == "shared":
        setup.streams, setup.variant, setup.prediction, setup.rate_bps = n, alt.variant, pred, rate
        setup.colliding_bps, setup.path_rates, setup.sharing = alt.colliding_bps, alt.path_rates, "shared"
        setup.window_caps = alt.window_caps


def plan_variants(runs: Sequence[RunVariant], scenario: Scenario, workload: Workload, base_dir: str | None,
                  cal: Calibration | None, auto_streams: int | None,
                  local: bool, placements: Placements | None = None) -> dict[str, VariantSetup | RunnerError]:
    """`plan_variant` of every run, by name, each on its placement in `placements`
    (`place_variants`; None: placed now); a run that cannot be planned gets its error
    instead, so that the others still run."""
    placements = placements if placements is not None else place_variants(scenario, runs)
    setups: dict[str, VariantSetup | RunnerError] = {}
    for run in runs:
        try:
            others = [pl for name, pl in placements.items() if isinstance(pl, Placement) and name != run.base
                      and get_variant(name).placement == "baseline"]
            setup = plan_variant(run, scenario, workload, base_dir, cal, auto_streams, local,
                                 placements[run.base], others)
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


