"""Variant planning of `testbed run`: which variants run, and for each its stream
count, placement, sharing of the WAN links and predicted iteration time.

The Atlas planner places the stages (its own heuristic for ``atlas``,
``runner.baseline_placement`` for ``baseline`` and ``multi-tcp``, DP across DCs for
``dp-across-dc``) and simulates one iteration with the calibrated channel rates
(testbed/run/calibration.py); ``atlas`` gets its temporal plan
(testbed_core/planning/temporal.py) unless, with ``runner.atlas_sharing: auto``, sharing
the link is predicted faster (each way predicted with its own rates: the plan's
transfers hold the link ``token_margin`` longer; shared channels move what the
collision probe measured).

The prediction uses the calibrated rates (per-flow rate = channel rate / streams)
instead of the window model, and is made before the variant runs: that is the
headline `predicted_iteration_time_s`. `repredict` makes it again for the same
placement and plan with other inputs: real devices' measured stage times (the compute
model does not know this machine), and, as a diagnostic, the channel rate the
variant's own warm-up iterations measured.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from testbed.run.calibration import Calibration
from testbed.run.common import BT_SUFFIX, RunnerError, nominal_link
from testbed.run.scenario import Scenario

# Share of a WAN link's nominal rate that TCP goodput reaches through the shaper
# (headers, HTB, window dynamics): 8 window-limited flows reached ~850 Mbit/s on the
# 2dc topology's 1 Gbit/s link. Atlas's stream count fills this much.
FILL_GOODPUT = 0.85
STREAMS_MARGIN = 0.05  # atlas leaves its fill-the-link stream count only for one measured this much faster
LINK_GOODPUT = 1448 / 1514  # TCP payload per Ethernet frame: what a shaped link carries (topo check: 955/1000)


@dataclass
class VariantSetup:
    name: str  # as reported, e.g. "atlas+bubbletea"
    base: str  # baseline, multi-tcp, atlas, dp-across-dc
    bubbletea: bool
    streams: int
    variant: Any  # testbed_core.planning.planner.Variant
    placement: Any
    prediction: Any
    rate_bps: float | None = None  # calibrated channel rate the a-priori prediction used
    colliding_bps: float | None = None  # calibrated aggregate of the pipelines' channels colliding
    final_prediction: float | None = None  # the headline prediction (real devices: measured compute)
    sharing: str = "shared"  # how the variant uses WAN links: "temporal" (a plan) or "shared"
    sharing_alternatives: dict[str, float] | None = None  # atlas "auto": a-priori prediction of each way


def variant_names(scenario: Scenario, only: Sequence[str] | None = None) -> list[str]:
    """The variants to run, in order: the scenario's (or `only`), each also with
    BubbleTea when it is enabled (and without it too when `compare` is set)."""
    names = list(scenario.variants)
    if only:
        allowed = set(names) | {f"{n}{BT_SUFFIX}" for n in names}
        unknown = [v for v in only if v not in allowed and v.removesuffix(BT_SUFFIX) not in
                   ("baseline", "multi-tcp", "atlas", "dp-across-dc")]
        if unknown:
            raise RunnerError(f"--variants: unknown variant(s) {', '.join(unknown)} "
                              f"(allowed: baseline, multi-tcp, atlas, dp-across-dc, each optionally +bubbletea)")
        return list(dict.fromkeys(only))
    out = []
    bt = scenario.bubbletea
    for n in names:
        if bt.enabled and (bt.variants is None or n in bt.variants):
            if bt.compare:
                out.append(n)
            out.append(n + BT_SUFFIX)
        else:
            out.append(n)
    return out


def choose_streams(base: str, scenario: Scenario, flow_bps: float | None, link_bps: float | None,
                   auto: int | None) -> int:
    """TCP streams per WAN channel: 1 for baseline; transport.streams (or the
    calibrated best for 'auto') for multi-tcp and dp-across-dc; for atlas at least
    enough streams to fill the link (the planner's rule), counted against the
    goodput a shaped link gives TCP (FILL_GOODPUT of its nominal rate)."""
    if base == "baseline":
        return 1
    s = scenario.transport.streams
    n = (auto or 8) if s == "auto" else int(s)
    if base == "atlas" and flow_bps and link_bps:
        n = max(n, min(64, math.ceil(FILL_GOODPUT * link_bps / flow_bps - 1e-9)))
    return n


def atlas_streams(fill: int, scenario: Scenario, cal: Calibration | None, auto: int | None) -> int:
    """Atlas's streams per channel: enough to fill the link by formula, unless the
    calibration measured another count faster (more than STREAMS_MARGIN): on long
    RTTs many flows collapse together, on short ones a single flow nearly fills the
    link and more overflow its queue. Candidates: that count, transport.streams and
    the single stream every calibration times."""
    if cal is None:
        return fill
    plain = choose_streams("multi-tcp", scenario, None, None, auto)
    measured = {n: cal.rates_bps[n] for n in (fill, plain, 1) if n in cal.rates_bps}
    if not measured:
        return fill
    best = max(measured, key=lambda n: measured[n])
    keep = fill if fill in measured else max(measured)
    return keep if measured[keep] >= (1 - STREAMS_MARGIN) * measured[best] else best


def shared_stream_counts(scenario: Scenario, names: Sequence[str], cal: Calibration, auto: int | None,
                         nominal_bps: float | None) -> set[int]:
    """Stream counts of the variants that may send on a shared link at once (baseline's
    single streams stay under the link and need no collision measurement)."""
    counts = set()
    for name in names:
        base = name.removesuffix(BT_SUFFIX)
        if base == "baseline" or (base == "atlas" and scenario.runner.atlas_sharing == "temporal"):
            continue
        n = choose_streams(base, scenario, cal.rate(1), nominal_bps, auto)
        if base == "atlas":
            n = atlas_streams(n, scenario, cal, auto)
        counts.add(n)
    return counts


def calibrated_topology(topology: Any, link_bps: float | None, pair: tuple[str, str] | None, local: bool) -> Any:
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
    far from the loss that many colliding streams cause): no crowding."""
    if rate_bps is None:
        return None, None, None
    if temporal:
        return rate_bps / streams, rate_bps, None
    link = rate_bps if nominal_bps is None else max(rate_bps, LINK_GOODPUT * nominal_bps)
    crowded = None if colliding_bps is None else min(1.0, colliding_bps / link)
    return rate_bps / streams, link, crowded


def _net_for(setup: VariantSetup, scenario: Scenario, rate_bps: float | None,
             pair: tuple[str, str] | None, local: bool, colliding_bps: float | None = None) -> tuple[Any, Any]:
    from testbed_core.planning.planner import NetParams

    nominal = nominal_link(scenario.topology, pair) if pair else None
    flow, link, crowded = calibrated_rates(setup.variant.sharing == "temporal", setup.streams, rate_bps,
                                           nominal, colliding_bps or setup.colliding_bps)
    net = NetParams(flow_rate_bps=flow, allreduce=False, crowded_fraction=None if local else crowded)
    return net, calibrated_topology(scenario.topology, link, pair, local)


def predict_variant(setup: VariantSetup, scenario: Scenario, workload: Any, base_dir: str | None,
                    rate_bps: float | None, pair: tuple[str, str] | None, local: bool,
                    effective: Any = None, colliding_bps: float | None = None) -> Any:
    """The planner's prediction (and, for atlas, temporal plan) of a placed variant
    whose WAN channels move `rate_bps` each (`effective`: measured compute times)."""
    from testbed_core.planning.planner import predict

    net, topo = _net_for(setup, scenario, rate_bps, pair, local, colliding_bps)
    return predict(topo, workload, setup.variant, net=net, base_dir=base_dir, placement=setup.placement,
                   effective=effective)


def repredict(setup: VariantSetup, scenario: Scenario, workload: Any, base_dir: str | None,
              rate_bps: float | None, pair: tuple[str, str] | None, local: bool,
              compute: tuple[list[float], list[float]] | None = None,
              colliding_bps: float | None = None) -> float:
    """Iteration time the planner predicts for the same placement and the same
    temporal plan (token order, offsets) when the channels move `rate_bps` (None:
    the calibrated rate), colliding channels `colliding_bps` in all (None: the
    calibrated aggregate) and, when given, each stage computes for the measured
    (forward, backward) seconds instead of the compute model's."""
    from dataclasses import replace

    from testbed_core.planning.planner import build_spec
    from testbed_core.simulate import simulate

    eff = workload.effective(base_dir)
    if compute is not None:
        eff = replace(eff, stage_forward_s=list(compute[0]), stage_backward_s=list(compute[1]))
    if rate_bps is None:
        rate_bps = setup.rate_bps
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
    return simulate(plan.apply(spec)).makespan


def plan_variant(
    name: str, scenario: Scenario, workload: Any, base_dir: str | None, cal: Calibration | None,
    auto_streams: int | None, local: bool = False,
) -> VariantSetup:
    from testbed_core.planning.planner import Variant, default_variants, free_gpus, place

    base = name.removesuffix(BT_SUFFIX)
    if base == "dp-across-dc":
        raise RunnerError(
            "dp-across-dc puts each pipeline in one DC, so only the DP gradient all-reduce crosses the WAN, "
            "and the runner does not emulate the all-reduce yet: the result would be compute alone. "
            "`testbed plan --variants dp-across-dc` predicts it; drop it from variants here"
        )
    table = default_variants(8, scenario.runner.baseline_placement)
    proto = table[base]
    topo = scenario.topology
    pair = (cal.src, cal.dst) if cal else None
    flow1 = cal.rates_bps.get(1) if cal else None
    streams = choose_streams(base, scenario, flow1, nominal_link(topo, pair) if pair else None, auto_streams)
    if base == "atlas":
        streams = atlas_streams(streams, scenario, cal, auto_streams)
    par = workload.parallelism
    hosts = {dc.name: list(dc.hosts) for dc in topo.dcs}
    try:
        placement = place(free_gpus(topo), par.pp, par.dp, par.tp, strategy=proto.placement, hosts=hosts)
    except ValueError as exc:
        raise RunnerError(f"variant {name}: {exc}") from None
    if any(not h for h in placement.hosts.values()):
        raise RunnerError(f"variant {name}: placement {proto.placement} left a stage without a host")
    rate = cal.rates_bps.get(streams) if cal else None
    sharing = scenario.runner.atlas_sharing if base == "atlas" else proto.sharing
    setup = VariantSetup(name, base, name.endswith(BT_SUFFIX), streams,
                         Variant(base, streams, "shared", proto.placement, fill_link=False), placement, None)
    setup.colliding_bps = cal.colliding_bps.get(streams) if cal else None
    options: dict[str, tuple[Any, Any, float | None]] = {}
    for way in ("temporal", "shared"):
        if sharing not in (way, "auto"):
            continue
        setup.variant = Variant(base, streams, way, proto.placement, fill_link=False)
        way_rate = rate
        if rate is not None and way == "temporal":
            # a transfer holds its link token_margin longer than its measured time on
            # the wire, so that one running late does not collide with the next
            way_rate = rate / (1 + scenario.runner.token_margin)
        pred = predict_variant(setup, scenario, workload, base_dir, way_rate, pair, local)
        options[way] = (setup.variant, pred, way_rate)
    if len(options) == 2:
        from testbed_core.planning.planner import choose_sharing

        times = {way: opt[1].iteration_time_s for way, opt in options.items()}
        setup.sharing_alternatives = times
        way = choose_sharing(times["temporal"], times["shared"])
    else:
        (way,) = options
    setup.variant, setup.prediction, setup.rate_bps = options[way]
    if setup.prediction.plan is None and way == "temporal":
        way = "shared"  # no WAN link to plan (every crossing inside one DC)
    setup.sharing = way
    return setup
