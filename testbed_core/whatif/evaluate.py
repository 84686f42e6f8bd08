"""One what-if: every variant of a workload on a topology, with BubbleTea's prefill capacity.

`evaluate` runs the fast predictor (testbed_core/whatif/predict.py) per variant
(Atlas also on the baseline's placement, kept where predicted faster by CHOICE_MARGIN,
as a run chooses),
applies a run's measured efficiencies when given (testbed_core/whatif/calibration.py),
and turns each variant's bubbles into prefill capacity (testbed_core/whatif/prefill.py).
Each variant's result is an `Outcome`: the row of the what-if's table, CSV and JSON.
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from testbed_core.planning.network import NetParams
from testbed_core.planning.placement import PlacementError, free_gpus, place
from testbed_core.planning.prediction import CHOICE_MARGIN, TEMPORAL_MARGIN, Variant
from testbed_core.topology import Topology
from testbed_core.variants import VariantDef, parse_variants
from testbed_core.whatif.calibration import Efficiencies
from testbed_core.whatif.grid import Prefill
from testbed_core.whatif.predict import FastPrediction, fast_predict, fast_predict_below
from testbed_core.whatif.prefill import prefill_capacity
from testbed_core.workload import EffectiveWorkload, Workload


class Outcome(BaseModel):
    """One variant's predicted iteration (None where it could not be placed: `error` says why)."""

    model_config = ConfigDict(extra="forbid")

    variant: str
    feasible: bool
    error: str | None = None
    placement: str | None = None
    sharing: str | None = None
    method: str | None = None
    iteration_s: float | None = None
    pipeline_s: float | None = None
    allreduce_s: float | None = None
    overhead_s: float | None = None
    compute_only_s: float | None = None
    utilization: float | None = None
    bubble_fraction: float | None = None
    wan_bytes: float | None = None
    allreduce_wan_bytes: float | None = None
    prefill_tokens_per_s: float | None = None
    utilization_with_bubbletea: float | None = None
    devices: int | None = None
    predict_s: float | None = None


def evaluate(
    topology: Topology,
    workload: Workload,
    names: list[str],
    *,
    streams: int | str = 8,
    baseline_placement: str = "even",
    net: NetParams | None = None,
    calibration: Efficiencies | None = None,
    prefill: Prefill | None = None,
    free: dict[str, int] | None = None,
    base_dir: str | Path | None = None,
    keep: dict[str, FastPrediction] | None = None,
) -> list[Outcome]:
    """Every variant of `names` predicted on `topology` (with `calibration` applied);
    `keep`, when given, receives each variant's full prediction."""
    net = net or NetParams()
    prefill = prefill or Prefill()
    if calibration is not None:
        topology, net = calibration.apply(topology, net)
    eff = workload.effective(base_dir)
    cm = workload.compute_model(base_dir)
    spec = workload.model_spec()
    scale = calibration.compute_scale if calibration is not None else 1.0
    overhead = calibration.overhead_s if calibration is not None else 0.0
    if calibration is not None:
        eff = calibration.apply_compute(eff)

    def cost(tokens: int) -> float:
        return cm.prefill_seconds(spec, tokens) * scale

    out = []
    for definition in parse_variants(names):
        variant = Variant.of(definition, streams, baseline_placement)  # type: ignore[arg-type]
        t0 = time.perf_counter()
        hold = calibration.temporal_hold if calibration is not None else 1.0
        wire = calibration.temporal_wire if calibration is not None else None
        margin = TEMPORAL_MARGIN if calibration is not None else None  # as a calibrated run chooses
        try:
            p = _predict_variant(topology, workload, definition, variant, baseline_placement, free, net, eff, hold,
                                 margin, wire)
        except PlacementError as exc:
            out.append(Outcome(variant=definition.name, feasible=False, error=str(exc)))
            continue
        iteration = p.iteration_time_s + overhead
        cap = prefill_capacity(p.gaps, iteration, p.devices, p.busy_s, cost, chunk_tokens=prefill.chunk_tokens,
                               min_tokens=min(prefill.min_tokens, prefill.chunk_tokens), guard=prefill.guard)
        out.append(Outcome(
            variant=definition.name, feasible=True, placement=p.placement.strategy, sharing=p.sharing,
            method=p.method, iteration_s=iteration, pipeline_s=p.pipeline_time_s, allreduce_s=p.allreduce_s,
            overhead_s=overhead, compute_only_s=p.compute_only_s, utilization=p.busy_s / iteration,
            bubble_fraction=p.bubble_fraction, wan_bytes=sum(p.wan_bytes.values()),
            allreduce_wan_bytes=sum(p.allreduce_wan_bytes.values()), prefill_tokens_per_s=cap.tokens_per_s,
            utilization_with_bubbletea=cap.utilization_with_prefill, devices=p.devices,
            predict_s=time.perf_counter() - t0,
        ))
        if keep is not None:
            keep[definition.name] = p
    return out


def outcome_fields() -> list[str]:
    return list(Outcome.model_fields)


def _predict_variant(topology: Topology, workload: Workload, definition: VariantDef, variant: Variant,
                     baseline_placement: str, free: dict[str, int] | None, net: NetParams, eff: EffectiveWorkload,
                     hold: float, plan_margin: float | None = None, wire: float | None = None) -> FastPrediction:
    """`fast_predict` of the variant; Atlas (its placement, sharing ``auto``) follows its own
    prediction as a run does (testbed/run/variants.py `_choose_configuration`): where the
    baseline's placement differs from its own, it runs there when that is predicted
    faster by more than CHOICE_MARGIN. The baseline's placement is predicted first, and
    its own only as far as it can still be kept (`fast_predict_below`). `plan_margin`:
    with a run's calibration, a temporal plan only where sharing is predicted slower by
    more than TEMPORAL_MARGIN, as the run's `_choose_configuration` takes it. `hold`,
    `wire`: a calibration's planned holds and time on the wire (`fast_predict`)."""
    if definition.placement != "atlas" or definition.sharing != "auto" or variant.placement == baseline_placement:
        return fast_predict(topology, workload, variant, free=free, net=net, effective=eff, hold=hold, plan_margin=plan_margin, wire=wire)
    par = workload.parallelism
    free = free if free is not None else free_gpus(topology)
    own = place(free, par.pp, par.dp, par.tp, strategy=variant.placement, chunks=par.chunks)
    try:
        other = place(free, par.pp, par.dp, par.tp, strategy=baseline_placement, chunks=par.chunks)
    except PlacementError:
        other = None
    if other is None or other.stage_dc == own.stage_dc:
        return fast_predict(topology, workload, variant, free=free, net=net, effective=eff, hold=hold, placement=own,
                            plan_margin=plan_margin, wire=wire)
    alt = fast_predict(topology, workload, replace(variant, placement=baseline_placement), free=free, net=net,
                       effective=eff, hold=hold, placement=other, plan_margin=plan_margin, wire=wire)
    keep = alt.iteration_time_s / (1 - CHOICE_MARGIN)  # its own is kept up to this
    mine = fast_predict_below(keep * (1 + 1e-12), topology, workload, variant, free=free, net=net, effective=eff,
                              hold=hold, placement=own, plan_margin=plan_margin, wire=wire)
    if mine is None or alt.iteration_time_s < mine.iteration_time_s * (1 - CHOICE_MARGIN):
        return alt
    return mine
