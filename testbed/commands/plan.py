"""`testbed plan`: where Atlas puts the stages, and the predicted iteration times.

Needs no network and no root: it reads a topology and a workload, places the
pipeline stages (Atlas's DC-selection heuristic, and the placement of each compared
variant), lists the WAN crossings and predicts one iteration per variant: with the
fast predictor (testbed_core/whatif/predict.py, the same model, seconds at paper
scale), or with `--exact` the event simulator it is checked against
(testbed_core/planning/prediction.py). The variants, their order and what the options
apply to come from the registry (testbed_core/variants.py).

With `--search`, each variant placed by Atlas's heuristic is also placed by the
network-aware search (testbed_core/planning/search.py: candidates scored by the fast
predictor, within a budget) and shown beside it as `<variant>:search`, with how many
candidates were scored and how much faster the search's placement is predicted.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import click

from testbed_core.constants import RMEM_FRACTION
from testbed_core.units import UnitError, format_size, parse_rate
from testbed_core.variants import (
    REGISTRY,
    VariantDef,
    VariantError,
    allowed_text,
    default_names,
    help_text,
    parse_variants,
)

if TYPE_CHECKING:
    from testbed_core.planning.placement import Placement, PlacementError
    from testbed_core.planning.prediction import Prediction
    from testbed_core.planning.search import SearchResult
    from testbed_core.whatif.predict import FastPrediction

    Planned = Prediction | FastPrediction | PlacementError  # a variant's plan, or why it cannot be placed

SEARCH_DEFAULTS = (1000, 30)  # testbed_core.planning.search's DEFAULT_CANDIDATES, DEFAULT_SECONDS (a test
# checks they agree; importing that module here would slow every command's start)


def _names(keep: Callable[[VariantDef], bool]) -> str:
    """The registry's variants that `keep` accepts, for help texts: 'multi-tcp, atlas'."""
    return ", ".join(n for n, v in REGISTRY.items() if keep(v))


def parse_gpus(text: str | None) -> dict[str, int]:
    """'dc1=4,dc2=2' -> {'dc1': 4, 'dc2': 2}."""
    out: dict[str, int] = {}
    if not text:
        return out
    for item in text.split(","):
        item = item.strip()
        name, sep, count = item.partition("=")
        if not sep or not name.strip():
            raise click.BadParameter(f"{item!r}: expected dc=count, e.g. --gpus dc1=4,dc2=2", param_hint="--gpus")
        try:
            n = int(count)
        except ValueError:
            raise click.BadParameter(f"{item!r}: {count!r} is not a whole number of GPUs", param_hint="--gpus") from None
        if n < 0:
            raise click.BadParameter(f"{item!r}: GPU count must be >= 0", param_hint="--gpus")
        out[name.strip()] = n
    return out


def _streams(value: str) -> int | str:
    if value == "auto":
        return "auto"
    try:
        n = int(value)
    except ValueError:
        raise click.BadParameter(f"{value!r}: a number of streams (1-64) or 'auto'", param_hint="--streams") from None
    if not 1 <= n <= 64:
        raise click.BadParameter(f"{n}: streams must be between 1 and 64", param_hint="--streams")
    return n


def _rate(bps: float | None) -> str:
    if not bps:
        return "-"
    if bps >= 1e9:
        return f"{bps / 1e9:.3g} Gbit/s"
    return f"{bps / 1e6:.3g} Mbit/s"


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.2f} ms"


def _stage_ranges(stages: list[int]) -> str:
    if not stages:
        return "-"
    parts, start = [], stages[0]
    for prev, cur in zip(stages, stages[1:] + [None], strict=False):
        if cur != prev + 1:
            parts.append(f"{start}" if start == prev else f"{start}-{prev}")
            start = cur
    return ",".join(parts)


@click.command(epilog="\b\nVariants:\n" + help_text())
@click.option("--topology", "topology_path", required=True, type=click.Path(dir_okay=False, path_type=Path),
              help="Topology YAML (e.g. topologies/2dc.yaml).")
@click.option("--workload", "workload_path", required=True, type=click.Path(dir_okay=False, path_type=Path),
              help="Workload YAML (e.g. scenarios/workloads/gpt-1.3b.yaml).")
@click.option("--gpus", "gpus_text", default=None, metavar="DC=N,...",
              help="Free GPUs per DC, overriding hosts x --gpus-per-host (e.g. dc1=4,dc2=2).")
@click.option("--gpus-per-host", type=click.IntRange(1, 64), default=1, show_default=True,
              help="GPUs of each host of a DC given as hosts: the DC has hosts x this many free GPUs (DCs "
                   "given as a GPU count keep it), and the placement fills each host's GPUs in turn.")
@click.option("--variants", default=",".join(default_names()), show_default=True,
              help=f"Comma-separated, from: {', '.join(REGISTRY)}.")
@click.option("--streams", default="8", show_default=True,
              help=f"TCP streams per channel for {_names(lambda v: v.streams != 'one')} ('auto' fills the "
                   f"link); those that fill the link ({_names(lambda v: v.streams == 'fill-link')}) use at least "
                   "enough to fill it.")
@click.option("--baseline-placement", default="even", show_default=True,
              type=click.Choice(["atlas", "in-order", "even", "round-robin"]),
              help=f"Placement of {_names(lambda v: v.placement == 'baseline')}.")
@click.option("--rmem-fraction", type=click.FloatRange(0.05, 1.0), default=RMEM_FRACTION, show_default=True,
              help="Share of tcp_rmem a receiver advertises as TCP window (Linux 6.6+ measures it from "
                   "the segments it receives; 0.5 before: tcp_adv_win_scale=1).")
@click.option("--flow-rate", default=None, metavar="RATE",
              help="Measured single-flow rate (e.g. 107Mbit) instead of the window model.")
@click.option("--no-allreduce", is_flag=True, help="Leave the DP gradient all-reduce out of the iteration time.")
@click.option("--search", "search", is_flag=True,
              help=f"Also place {_names(lambda v: v.placement == 'atlas')} by the network-aware search (candidate "
                   "DC subsets, orders and stages per DC, scored by the fast predictor) and show it beside the "
                   "heuristic as <variant>:search.")
@click.option("--search-candidates", type=click.IntRange(1, 1_000_000), default=None, metavar="N",
              help=f"Search budget: at most N candidates scored [default: {SEARCH_DEFAULTS[0]}].")
@click.option("--search-seconds", type=click.FloatRange(0.01, 3600), default=None, metavar="S",
              help=f"Search budget: stop after S seconds, keeping the fastest so far [default: {SEARCH_DEFAULTS[1]:g}].")
@click.option("--exact", is_flag=True,
              help="Simulate with the exact event simulator (the reference; minutes to hours beyond a few "
                   "hundred GPUs) instead of the fast predictor.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document instead of text.")
def plan(topology_path: Path, workload_path: Path, gpus_text: str | None, gpus_per_host: int, variants: str,
         streams: str, baseline_placement: str, rmem_fraction: float, flow_rate: str | None,
         no_allreduce: bool, search: bool, search_candidates: int | None, search_seconds: float | None,
         exact: bool, as_json: bool) -> None:
    """Place the workload's pipeline stages on the topology's DCs and predict the
    iteration time of each variant (no emulation is started)."""
    from testbed_core.configfile import ConfigError
    from testbed_core.planning.network import NetParams
    from testbed_core.planning.placement import PlacementError, free_gpus
    from testbed_core.planning.prediction import Variant, predict
    from testbed_core.planning.search import SEARCH, SearchBudget, search_placement
    from testbed_core.topology import TopologyError, load_topology
    from testbed_core.whatif.predict import fast_predict
    from testbed_core.workload import load_workload

    names = [v.strip() for v in variants.split(",") if v.strip()]
    if not names:
        raise click.BadParameter(f"give at least one variant (allowed: {allowed_text()})", param_hint="--variants")
    try:
        chosen = parse_variants(names)
    except VariantError as exc:
        raise click.BadParameter(str(exc), param_hint="--variants") from None
    try:
        net = NetParams(
            rmem_fraction=rmem_fraction,
            flow_rate_bps=parse_rate(flow_rate) if flow_rate else None,
            allreduce=not no_allreduce,
        )
    except UnitError as exc:
        raise click.BadParameter(str(exc), param_hint="--flow-rate") from None
    try:
        topo = load_topology(topology_path)
        wl = load_workload(workload_path)
        eff = wl.effective(workload_path.parent)
    except (TopologyError, ConfigError) as exc:
        raise click.ClickException(str(exc)) from None
    try:
        free = free_gpus(topo, gpus_per_host, parse_gpus(gpus_text))
    except PlacementError as exc:
        raise click.ClickException(str(exc)) from None
    if (search_candidates is not None or search_seconds is not None) and not search:
        raise click.UsageError("--search-candidates and --search-seconds bound the search: add --search")
    budget = SearchBudget(**{k: v for k, v in (("candidates", search_candidates), ("seconds", search_seconds))
                             if v is not None})
    n_streams = _streams(streams)
    results: dict[str, Planned] = {}
    searches: dict[str, SearchResult] = {}
    par = wl.parallelism
    where = (f"{workload_path}: workload.parallelism (pp={par.pp}, dp={par.dp}, tp={par.tp}) on topology "
             f"{topology_path}")  # a refused placement names the files it came from

    def one(name: str, variant: Variant, placement: Placement | None = None) -> None:
        try:
            if exact:
                results[name] = predict(topo, wl, variant, free=free, gpus_per_host=gpus_per_host, net=net,
                                        base_dir=str(workload_path.parent), effective=eff, placement=placement)
            else:
                results[name] = fast_predict(topo, wl, variant, free=free, gpus_per_host=gpus_per_host, net=net,
                                             effective=eff, keep_plan=True, placement=placement)
        except PlacementError as exc:
            results[name] = PlacementError(f"{where}: {exc}")

    for definition in chosen:
        variant = Variant.of(definition, n_streams, baseline_placement)
        one(definition.name, variant)
        if search and definition.placement == "atlas":
            name = f"{definition.name}:{SEARCH}"
            found = Variant.of(definition, n_streams, baseline_placement)
            found = Variant(found.name, found.streams, found.sharing, SEARCH, fill_link=found.fill_link)
            try:
                searches[name] = search_placement(topo, wl, found, predictor=fast_predict, free=free,
                                                  gpus_per_host=gpus_per_host, net=net, effective=eff, budget=budget)
            except PlacementError as exc:
                results[name] = PlacementError(f"{where}: {exc}")
                continue
            one(name, found, searches[name].placement)
    if all(isinstance(r, Exception) for r in results.values()):
        raise click.ClickException("no variant can be placed:\n" + "\n".join(f"  {n}: {r}" for n, r in results.items()))

    wan_rate = max((link.rate for link in topo.wan), default=None)
    if as_json:
        doc = {
            "topology": topo.name,
            "workload": wl.name,
            "predictor": "exact" if exact else "fast",
            "scale": wl.scale,
            "scale_note": eff.scale_note(wan_rate),
            "free_gpus": free,
            "effective": eff.to_json(),
            "net": {"rmem_fraction": net.rmem_fraction, "flow_rate_bps": net.flow_rate_bps,
                    "allreduce_included": net.allreduce},
            "variants": {n: ({"error": str(r)} if isinstance(r, Exception) else r.to_json(topo))
                         for n, r in results.items()},
            "searches": {n: r.to_json(topo) for n, r in searches.items()},
        }
        click.echo(json.dumps(doc, indent=2))
        return
    _print_text(topo, wl, eff, free, results, net, wan_rate)
    for name, found in searches.items():
        _print_search(name, found, results)
    click.echo("  predicted by " + ("the exact event simulator (--exact)" if exact else
                                    "the fast predictor (the same model; --exact for the event simulator)"))
    for name, res in results.items():  # Atlas's own placement is the point of the plan: it must fit
        if isinstance(res, Exception) and REGISTRY[name.split(":")[0]].placement == "atlas":
            raise click.ClickException(f"{name} placement: {res}")


def _print_text(topo, wl, eff, free, results, net, wan_rate) -> None:
    from testbed_core.planning.prediction import SHARING_MARGIN

    m, par = wl.model, wl.parallelism
    echo = click.echo
    echo(f"Workload {wl.name}: {m.name}, {m.layers} layers, hidden {m.hidden}, seq {m.seq_len}, {m.dtype}; "
         f"dp={par.dp} pp={par.pp} tp={par.tp}, {par.num_micro_batches} micro-batches of {par.micro_batch}, "
         f"{par.schedule}" + (f" (chunks {par.chunks})" if par.chunks > 1 else ""))
    echo(f"  {eff.scale_note(wan_rate)}")
    echo(f"  GPU {wl.gpu.type} {m.dtype} at {wl.gpu.efficiency:.0%} of peak x tp {par.tp} = "
         f"{eff.effective_tflops:.1f} TFLOP/s per stage")
    for k in range(eff.stages):
        echo(f"  stage {k}: {eff.stage_layers[k]} layers, per micro-batch F {_ms(eff.stage_forward_s[k])}, "
             f"B {_ms(eff.stage_backward_s[k])}")
    echo(f"  boundary tensor per micro-batch, each way: {format_size(eff.activation_bytes)} real, "
         f"{format_size(eff.wire_activation_bytes)} on the wire")
    echo(f"Topology {topo.name}: " + ", ".join(f"{dc} {n} free GPUs" for dc, n in free.items()))
    shown: set[tuple] = set()
    for res in results.values():
        if isinstance(res, Exception):
            continue
        pl = res.placement
        if pl.stage_dc in shown:
            continue
        shown.add(pl.stage_dc)
        same = [(n, r.placement.strategy) for n, r in results.items()
                if not isinstance(r, Exception) and r.placement.stage_dc == pl.stage_dc]
        strategies = " = ".join(dict.fromkeys(st for _, st in same))
        echo(f"Placement {strategies} (used by {', '.join(n for n, _ in same)}):")
        for d in range(pl.dp if pl.strategy == "dp-across" else 1):
            prefix = f"  pipeline {d}: " if pl.strategy == "dp-across" else "  "
            for dc in dict.fromkeys(pl.stage_dc[d]):
                hosts = sorted({h for (pd, s), hs in pl.hosts.items() for h in hs
                                if pl.stage_dc[pd][s] == dc and (pl.strategy != "dp-across" or pd == d)})
                where = f"hosts {' '.join(hosts)}" if hosts else f"{len(pl.stages_in(dc, d)) * pl.tp * (1 if pl.strategy == 'dp-across' else pl.dp)} GPUs"
                echo(f"{prefix}{dc}: stages {_stage_ranges(pl.stages_in(dc, d))}  {where}")
        crossings = pl.crossings(topo)
        if not crossings:
            echo("  WAN crossings: none (pipeline boundaries stay inside DCs)")
        for c in crossings:
            delay = topo.path_delay(c.src, c.dst)
            via = f" via {'-'.join(c.path)}" if len(c.path) > 2 else ""
            echo(f"  WAN crossing: boundary {c.boundary}|{c.boundary + 1} {c.src} -> {c.dst}{via}, "
                 f"{delay * 1e3:.1f} ms one way, pipelines {_stage_ranges(list(c.pipelines))}")
    echo("Predicted iteration time" + ("" if net.allreduce else " (DP all-reduce excluded)") + ":")
    echo(f"  {'variant':<13}{'placement':<11}{'streams':>8}{'per flow':>13}{'per transfer':>14}"
         f"{'iteration':>11}{'pipeline':>10}{'allreduce':>11}{'bubble':>8}")
    for name, res in results.items():
        if isinstance(res, Exception):
            echo(f"  {name:<13}infeasible: {res}")
            continue
        paths = list(res.paths.values())
        streams = "/".join(sorted({str(p.streams) for p in paths})) or "-"
        flow = min((p.flow_rate_bps for p in paths), default=None)
        rate = min((p.rate_bps for p in paths), default=None)
        echo(f"  {name:<13}{res.placement.strategy:<11}{streams:>8}{_rate(flow):>13}{_rate(rate):>14}"
             f"{res.iteration_time_s:>10.3f}s{res.pipeline_time_s:>9.3f}s{res.allreduce_s:>10.3f}s"
             f"{res.bubble_fraction:>8.2f}")
        if res.plan is not None:
            firsts = res.plan.first_transfer_s(res.placement.dp)
            echo(f"  {'':<13}temporal plan: offsets {', '.join(f'{o * 1e3:.1f}' for o in res.plan.offsets)} ms; "
                 f"first WAN transfer per pipeline at "
                 f"{', '.join('-' if f is None else f'{f * 1e3:.1f}' for f in firsts)} ms; "
                 f"{sum(len(v) for v in res.plan.order.values())} transfers in planned order on "
                 f"{len(res.plan.order)} link direction(s)")
        alt = res.sharing_alternatives
        if alt:
            echo(f"  {'':<13}sharing {res.sharing} (pipeline predicted: temporal {alt['temporal']:.3f} s, "
                 f"shared {alt['shared']:.3f} s; temporal unless shared is {SHARING_MARGIN:.0%} faster)")
    first = next((r for r in results.values() if not isinstance(r, Exception)), None)
    if first is not None:
        echo(f"  compute only (free network): {first.compute_only_s:.3f} s; ideal bubble (p-1)/(m+p-1) = "
             f"{first.ideal_bubble_fraction:.2f}")


def _print_search(name: str, found: SearchResult, results: dict[str, Planned]) -> None:
    """The search beside the heuristic: both placements, their predicted times, the budget."""
    from testbed_core.planning.search import describe_row

    echo = click.echo
    base = name.split(":")[0]
    echo(f"Placement search for {base}: {found.budget_text()}; scored by the fast predictor")
    echo(f"  {'heuristic (largest DC first)':<32}{describe_row(found.heuristic.stage_dc[0]):<36}"
         f"{found.heuristic_time_s:>9.3f}s")
    speed = found.speedup
    gain = "" if speed is None else (f"  {speed:.2f}x the heuristic's speed" if speed > 1 + 1e-9
                                     else "  (the heuristic's placement is the fastest found)")
    echo(f"  {'search (fastest predicted)':<32}{describe_row(found.placement.stage_dc[0]):<36}"
         f"{found.iteration_time_s:>9.3f}s{gain}")
    others = [(row, t) for row, t in found.ranked if row != found.placement.stage_dc[0]][:3]
    if others:
        echo("  next: " + "; ".join(f"{describe_row(row)} {t:.3f} s" for row, t in others))
    res = results.get(name)
    if res is not None and not isinstance(res, Exception) and abs(res.iteration_time_s - found.iteration_time_s) > \
            1e-6 * max(1.0, found.iteration_time_s):
        echo(f"  (row {name} above: the same placement by the predictor asked for, {res.iteration_time_s:.3f} s)")
