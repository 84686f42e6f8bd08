"""Efficiencies measured by a finished `testbed run`, carried to a what-if.

A run folder holds ``summary.json`` (testbed_core/contracts/summary.py, with the WAN
calibration of testbed_core/contracts/calibration.py) and ``scenario.resolved.yaml``
(the topology and workload it ran). From them come ratios, not absolute rates, so
that they carry to another topology:

* ``flow_efficiency``: one TCP flow's measured rate over the window model's
  (window / RTT, testbed_core/planning/network.py) on the run's path; it scales every
  TCP window of the what-if's topology;
* ``link_efficiency``: the best measured channel rate over the link's nominal rate
  (the TCP goodput a shaped link gives one transfer); it scales every WAN link rate;
* ``crowded_fraction``: what channels colliding on the link moved in all, over that
  goodput (the planner's ``NetParams.crowded_fraction``; above 1 when two colliding
  channels together move more than one alone, never above the nominal rate);
* ``compute_scale``: measured stage compute time over the compute model's (only
  when the run trained real devices; else 1);
* ``overhead_s``: time per iteration outside the pipeline the run measured (real
  devices: gradient exchange, optimizer step; else 0), added to each prediction;
* ``temporal_hold``: how much longer than its calibrated wire time Atlas's runner
  holds a link for one planned transfer (``1 + runner.token_margin``, so that a
  transfer running late does not collide with the next; where the run's calibration
  timed the primary path as a plan uses it, the turns probe's mean hold over the alone
  probe's wire time, the slower direction's: testbed_core/planning/calibrated.py
  `turns_hold_s`); temporal predictions use it;
* ``temporal_wire``: where the turns probe timed the path, how much longer than the
  alone probe's a planned transfer's bytes are on the wire (the same direction's mean
  time on the wire, `turns_wire_rate_bps`): a planned transfer's bytes arrive after
  that, while its links stay held for ``temporal_hold`` (as the run's planner models a
  temporal plan, `NetParams.path_hold_factor`); None (no turns probe): the bytes are
  held to the end of the hold.

Without a calibration the what-if uses the model's own numbers (efficiency 1, the
fluid model's sharing, no overhead).
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

from testbed_core.contracts.calibration import CalibrationReport, dc_of_host
from testbed_core.contracts.summary import Summary, VariantResult, read_summary
from testbed_core.planning.calibrated import turns_hold_s, turns_wire_rate_bps
from testbed_core.planning.network import NetParams, wan_path
from testbed_core.topology import Topology, TopologyError, parse_topology
from testbed_core.workload import EffectiveWorkload, Workload, WorkloadError, parse_workload


class CalibrationError(ValueError):
    """A run folder that cannot calibrate a what-if; the message says what is missing."""


class Efficiencies(BaseModel):
    """The measured ratios a what-if applies (see the module docstring)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    source: str
    flow_efficiency: float = 1.0
    link_efficiency: float = 1.0
    crowded_fraction: float | None = None
    compute_scale: float = 1.0
    overhead_s: float = 0.0
    temporal_hold: float = 1.0
    temporal_wire: float | None = None
    measured_on: str = ""

    def apply(self, topology: Topology, net: NetParams) -> tuple[Topology, NetParams]:
        """`topology` with TCP windows and WAN link rates scaled, and `net` with the
        measured sharing of colliding channels."""
        data = topology.model_dump()

        def scale_tcp(tcp: dict | None) -> dict | None:
            if tcp is None:
                return None
            return {**tcp, "rmem_max": max(4096, int(tcp["rmem_max"] * self.flow_efficiency)),
                    "wmem_max": max(4096, int(tcp["wmem_max"] * self.flow_efficiency))}

        data["tcp"] = scale_tcp(data["tcp"])
        for dc in data["dcs"]:
            dc["tcp"] = scale_tcp(dc.get("tcp"))
            if not dc["hosts"]:
                dc.pop("hosts")
            if dc.get("gpus") is None:
                dc.pop("gpus", None)
        for link in data["wan"]:  # steady rates: the predictions never read a link's changes
            link["rate"] = link["rate"] * self.link_efficiency
            link["changes"] = []
            link.pop("trace", None)
        data.pop("source", None)
        try:
            calibrated = Topology.model_validate(data)
        except ValidationError as exc:
            raise CalibrationError(f"{self.source}: the calibrated topology is not valid: {exc}") from None
        crowd = self.crowded_fraction if self.crowded_fraction is not None else net.crowded_fraction
        return calibrated, NetParams(rmem_fraction=net.rmem_fraction, flow_rate_bps=net.flow_rate_bps,
                                     lan_latency_s=net.lan_latency_s, max_streams=net.max_streams,
                                     allreduce=net.allreduce, crowded_fraction=crowd)

    def apply_compute(self, eff: EffectiveWorkload) -> EffectiveWorkload:
        if self.compute_scale == 1.0:
            return eff
        from dataclasses import replace

        return replace(eff, stage_forward_s=[t * self.compute_scale for t in eff.stage_forward_s],
                       stage_backward_s=[t * self.compute_scale for t in eff.stage_backward_s])


def load_efficiencies(run_dir: str | Path) -> Efficiencies:
    """The efficiencies a finished run measured; CalibrationError says what is missing."""
    folder = Path(run_dir)
    summary_path, scenario_path = folder / "summary.json", folder / "scenario.resolved.yaml"
    for path in (summary_path, scenario_path):
        if not path.is_file():
            raise CalibrationError(f"{folder}: no {path.name}: --calibration takes the folder of a finished "
                                   "`testbed run` (results/<scenario>-<time>/)")
    try:
        summary = read_summary(summary_path)
    except ValidationError as exc:
        raise CalibrationError(f"{summary_path}: not a summary this version reads: {exc}") from None
    cal = summary.calibration
    if cal is None or not cal.channel_rate_mbps:
        raise CalibrationError(f"{summary_path}: the run has no WAN calibration (runner.calibrate was off, or the "
                               "run used --local): run it over the emulated WAN to calibrate a what-if")
    topo, workload = run_setting(folder)
    src, dst = dc_of_host(cal.src), dc_of_host(cal.dst)
    if src == dst:
        raise CalibrationError(f"{summary_path}: the calibration ran inside DC {src}: no WAN path was measured")
    model = wan_path(topo, src, dst, 1, NetParams())
    rates = {int(n): r * 1e6 for n, r in cal.channel_rate_mbps.items()}
    one = rates.get(1)
    flow_eff = one / model.flow_rate_bps if one and math.isfinite(model.flow_rate_bps) else 1.0
    goodput = max(rates.values())
    link_eff = min(1.0, goodput / model.bottleneck_bps)
    crowded = None
    colliding = {int(n): r * 1e6 for n, r in cal.colliding_channels_aggregate_mbps.items()}
    if colliding:
        most = max(colliding)
        crowded = min(1.0 / link_eff, colliding[most] / (model.bottleneck_bps * link_eff))
    return Efficiencies(
        source=str(folder), flow_efficiency=flow_eff, link_efficiency=link_eff, crowded_fraction=crowded,
        compute_scale=_compute_scale(summary), overhead_s=_overhead(summary),
        **_temporal(summary, cal),
        measured_on=f"{summary.scenario}: {src} -> {dst}, {model.rtt_s * 1e3:.0f} ms RTT, "
                    f"{model.bottleneck_bps / 1e6:.0f} Mbit/s nominal",
    )


def _temporal(summary: Summary, cal: CalibrationReport) -> dict[str, float | None]:
    """``temporal_hold``: how much longer than its calibrated wire time a planned
    transfer holds its link: 1 + token_margin (token mode; slots: 1), or, where the
    primary path was timed as a plan uses it, the turns probe's mean hold over the alone
    probe's median wire time at the same stream count (the slower direction; the most
    streams timed so); ``temporal_wire``, there: that direction's mean time on the wire
    in the turns probe over the same alone wire time (its bytes arrive after it:
    `turns_wire_rate_bps`), never above the hold; else None."""
    if summary.runner.get("temporal_mode", "token") != "token":
        return {"temporal_hold": 1.0}
    hold = 1.0 + float(summary.runner.get("token_margin", 0.0) or 0.0)
    if not cal.paths:
        return {"temporal_hold": hold}
    primary = cal.paths[0]
    turns = max(primary.turns or [], key=lambda t: t.streams, default=None)
    alone = primary.transfer_s.get(str(turns.streams)) if turns is not None else None
    if turns is None or not alone or not turns.transfer_s or not turns.return_s:
        return {"temporal_hold": hold}
    wire = statistics.median(alone) - primary.one_way_delay_s
    if wire <= 0:
        return {"temporal_hold": hold}
    delay = primary.one_way_delay_s
    held, way = max((turns_hold_s(way, delay, turns.slot_s), way) for way in (turns.transfer_s, turns.return_s))
    # the same bytes over the way's mean wire time: turns_wire_rate_bps's time on the wire
    on_wire = 8 / turns_wire_rate_bps(1, way, delay)
    return {"temporal_hold": held / wire, "temporal_wire": min(held, on_wire) / wire}


def run_setting(run_dir: str | Path) -> tuple[Topology, Workload]:
    """The topology and workload a run folder's scenario ran (to predict the run itself)."""
    path = Path(run_dir) / "scenario.resolved.yaml"
    try:
        resolved = yaml.safe_load(path.read_text())
        topology = {k: v for k, v in resolved["topology"].items() if not str(k).startswith("_")}  # e.g. _source
        return parse_topology(topology, str(path)), parse_workload(resolved["workload"], str(path))
    except OSError as exc:
        raise CalibrationError(f"{path}: cannot read it ({exc.strerror}): is {run_dir} a `testbed run` folder?") from None
    except (yaml.YAMLError, KeyError, TypeError, TopologyError, WorkloadError) as exc:
        raise CalibrationError(f"{path}: cannot read the run's topology and workload: {exc}") from None


def _results(summary: Summary) -> list[VariantResult]:
    return [r for name in summary.variants if (r := summary.result(name)) is not None]


def _compute_scale(summary: Summary) -> float:
    """Measured over modelled stage compute (real devices only; else 1)."""
    ratios = []
    model = sum(summary.stage_forward_s) + sum(summary.stage_backward_s)
    for r in _results(summary):
        f, b = r.prediction.measured_stage_forward_s, r.prediction.measured_stage_backward_s
        if f and b and model > 0:
            ratios.append((sum(f) + sum(b)) / model)
    return statistics.median(ratios) if ratios else 1.0


def _overhead(summary: Summary) -> float:
    values = [r.prediction.measured_overhead_s for r in _results(summary)
              if r.prediction.measured_overhead_s is not None]
    return statistics.median(values) if values else 0.0
