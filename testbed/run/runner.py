"""`testbed run`: geo-distributed pipeline training on the emulated testbed.

`run_scenario` follows the data, one step after the other, each step in its module:

1. **Scenario** (testbed/run/scenario.py): validated once into typed models (topology,
   workload, variants); `check_runnable` (testbed/run/variants.py) adds what the runner
   needs of it.
2. **Variants** (testbed/run/variants.py, from the registry testbed_core/variants.py):
   which variant runs there are, each with or without BubbleTea agents.
3. **Network** (testbed/run/network.py): the scenario's topology built once, or, with
   ``runner.local``, 127.0.0.1 and no emulated network; the run's port block.
4. **Placement** (testbed/run/variants.py `place_variants`): every variant's stages
   placed once; the calibration and the variant's plan both use that placement (a
   placement search is never repeated).
5. **Calibration** (`calibrate_wan`, testbed/run/calibration.py): the channel rates of
   every WAN path those placements cross, for every stream count the variants use.
6. **Prediction** (testbed/run/variants.py `plan_variants`): the planner predicts one
   iteration of each variant on its placement with the calibrated rates; a variant whose
   sharing policy is ``auto`` (Atlas) gets its temporal plan unless, with
   ``runner.atlas_sharing: auto``, sharing the link is predicted faster.
7. **Variant runs** (`play_variant`): one worker process per (pipeline, rank) on its
   placed host (testbed/run/jobs.py, testbed/training/worker/), each with its
   emulated GPU, modelled or, with ``gpu.mode: real``, real torch work checked against
   a one-process reference (testbed/run/real_check.py); every pipeline boundary
   is an atlas_transport channel, and under a temporal plan each WAN send waits for
   its token in the link's planned order. Workers start each iteration at a common
   wall-clock instant and the next when all have finished (testbed/run/workers.py).
8. **Summary**: device timelines and transfer records give iteration times,
   utilization, bubbles and per-WAN-link bytes and goodput (testbed/run/metrics.py),
   a CSV timeline and a Gantt chart per variant, and summary.json. The prediction
   stands as made before the run (real devices: with the compute times their warm-up
   measured); the same model fed with the warm-up's own channel rate is reported
   beside it.

BubbleTea (testbed/run/bubbletea.py): a run ``<name>+bubbletea`` also runs a BubbleTea
agent next to every worker device, and decode servers for the KV caches; its summary
entry adds the agents' requests, TTFT, guard violations and the slowdown against the
same variant without agents.

Shared pieces (the run's error, process helpers, WAN paths) are in
testbed/run/common.py.
"""

from __future__ import annotations

import contextlib
import copy
import json
import secrets
import shutil
import time
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import yaml

from testbed.progress import Progress
from testbed.run.bubbletea import bubbletea_metrics, uses_controller, write_client_token
from testbed.run.calibration import Calibration, calibrate_variants
from testbed.run.common import RunnerError, transport_job
from testbed.run.cpu import cpu_notes
from testbed.run.jobs import build_jobs
from testbed.run.metrics import VariantMetrics, iteration_tail, repeat_stats
from testbed.run.network import Network, open_network, with_ports
from testbed.run.ports import PortPlan
from testbed.run.scenario import Scenario
from testbed.run.variants import (
    Placements,
    VariantSetup,
    check_runnable,
    place_variants,
    plan_variants,
    real_device_prediction,
    repredict,
    run_variants,
)
from testbed.run.workers import VariantRun, run_workers
from testbed_core.atomic import write_text_atomic
from testbed_core.configfile import ConfigError
from testbed_core.contracts.summary import (
    AllReduceResult,
    DelayLineWindow,
    FaultRecord,
    Parallelism,
    RealCheck,
    RealCheckSkipped,
    RepeatRun,
    Summary,
    TemporalPlanInfo,
    VariantFailure,
    VariantResult,
    WanTailDrops,
)
from testbed_core.contracts.summary import Placement as PlacementReport
from testbed_core.contracts.summary import Prediction as PredictionReport
from testbed_core.planning.prediction import Prediction
from testbed_core.planning.wan_paths import grad_wire_bytes
from testbed_core.variants import RunVariant
from testbed_core.workload import EffectiveWorkload, Workload

if TYPE_CHECKING:
    from testbed.emulation.delayline.stats import RelaySnapshot
    from testbed.run.faults import FaultInjector
    from testbed.run.metrics import TransferRecord

AUTO_CANDIDATES = (1, 2, 4, 8, 16)
AUTO_MARGIN = 0.10


def default_out_dir(scenario: Scenario) -> Path:
    return Path("results") / f"{scenario.name}-{datetime.now().strftime('%Y%m%d-%H%M%S')}"


def run_scenario(
    scenario: Scenario,
    resolved: dict[str, Any],
    out_dir: str | Path,
    progress: Progress | None = None,
    *,
    variants: Sequence[str] | None = None,
) -> Summary:
    """Run every variant of `scenario`; writes `out_dir/summary.json` (after every
    variant, so that an interrupted run keeps what it measured) and returns it."""
    t_begin = time.time()
    out = Path(out_dir).resolve()  # the workers run from the repository: their paths must be absolute
    out.mkdir(parents=True, exist_ok=True)
    own_progress = progress is None
    progress = progress or Progress(label=f"run {scenario.name}")
    (out / "scenario.resolved.yaml").write_text(yaml.safe_dump(_plain(resolved), sort_keys=False))
    workload, base_dir = scenario.workload, scenario.workload_dir
    par = workload.parallelism
    check_runnable(scenario, progress)
    runs = run_variants(scenario, variants)
    scenario = _resolve_pacing(scenario, resolved, runs, out, progress)
    names = [run.name for run in runs]
    scenario = with_ports(scenario, progress)
    iterations = workload.warmup + workload.iterations
    eff = workload.effective(base_dir)
    repeat = scenario.runner.repeat
    idle_twins = [r.name for r in runs if r.bubbletea and scenario.runner.bubbletea_idle_twin
                  and any(o.name == r.base for o in runs)]
    progress.set_total(1 + (len(names) + len(idle_twins)) * repeat)
    secret = secrets.token_hex(16)
    if uses_controller(scenario):  # a client of the run's prefill controller needs its token
        write_client_token(out, secret)
    summary = Summary(
        scenario=scenario.name, topology=scenario.topology.name, workload=workload.name, delay_backend=None,
        scale=workload.scale,
        scale_note=eff.scale_note(max((link.rate for link in scenario.topology.wan), default=None)),
        seed=scenario.seed, schedule=par.schedule,
        parallelism=Parallelism(dp=par.dp, pp=par.pp, tp=par.tp, micro_batch=par.micro_batch,
                                num_micro_batches=par.num_micro_batches),
        iterations=workload.iterations, warmup=workload.warmup,
        wire_activation_bytes=eff.wire_activation_bytes,
        stage_forward_s=eff.stage_forward_s, stage_backward_s=eff.stage_backward_s,
        runner=scenario.runner.model_dump(),
    )
    try:
        with contextlib.ExitStack() as stack:
            with progress.step("setup"):
                net = stack.enter_context(open_network(scenario, progress))
                if hasattr(net, "adopt"):  # real machines (--inventory): the WAN delays measured between them
                    scenario = net.adopt(scenario, progress)
                ctl_dir = net.temp_dir("ctl")  # the control sockets; removed with the network, or by clean
                stack.callback(shutil.rmtree, ctl_dir, True)
                summary.delay_backend = net.delay_backend
                placements = place_variants(scenario, runs)  # once per variant: calibrated and run alike
                cal, auto = calibrate_wan(scenario, runs, placements, net, out, secret, eff, progress)
                setups = plan_variants(runs, scenario, workload, base_dir, cal, auto, net.local, placements)
                summary.calibration = cal.report() if cal else None
            kept: dict[str, list[tuple[VariantResult, RepeatRun]]] = {}
            for r in range(repeat):
                done: dict[str, VariantResult] = {}  # this repeat's results: the twins compared side by side
                for run in runs:
                    entry = _play_run(run, r, repeat, done, setups, summary, scenario, net, workload, out, ctl_dir,
                                      secret, iterations, progress, base_dir, cal, idle_twins)
                    if isinstance(entry, VariantResult):
                        done[run.name] = entry
                        kept.setdefault(run.name, []).append((entry, _repeat_run(entry, r, out)))
                    if r == 0:
                        summary.variants[run.name] = entry
                    if repeat > 1 and run.name in kept:
                        first = kept[run.name][0][0]
                        first.repeats = repeat_stats([rr for _, rr in kept[run.name]])
                        if r == repeat - 1:
                            progress.log(f"  {run.name}: {repeats_line(first)}")
                    _write_summary(out, summary, t_begin)
    finally:
        _write_summary(out, summary, t_begin)
        if own_progress:
            progress.close()
    return summary


def _resolve_pacing(scenario: Scenario, resolved: dict[str, Any], runs: Sequence[RunVariant], out: Path,
                    progress: Progress) -> Scenario:
    """``transport.pacing: auto`` made true or false for the whole run (testbed/run/pacing.py),
    said in the progress and kept in scenario.resolved.yaml (transport.pacing, the reason
    as the file's first comment line)."""
    from testbed.run.pacing import choose_pacing

    t = scenario.transport
    choice = choose_pacing(scenario.topology, scenario.workload.parallelism.dp, t.streams, t.pacing, runs,
                           local=scenario.runner.local)
    progress.log(choice.why)
    if t.pacing != "auto":
        return scenario
    transport = dict(resolved.get("transport") or {})
    transport["pacing"] = choice.on
    resolved["transport"] = transport
    (out / "scenario.resolved.yaml").write_text(f"# {choice.why}\n" + yaml.safe_dump(_plain(resolved), sort_keys=False))
    return scenario.model_copy(update={"transport": t.model_copy(update={"pacing": choice.on})})


def _play_run(run: RunVariant, r: int, repeat: int, done: Mapping[str, VariantResult],
              setups: Mapping[str, VariantSetup | RunnerError], summary: Summary, scenario: Scenario, net: Network,
              workload: Workload, out: Path, ctl_dir: Path,
              secret: str, iterations: int, progress: Progress, base_dir: str | None, cal: Calibration | None,
              idle_twins: Sequence[str]) -> VariantResult | VariantFailure:
    """One repeat of one variant: its idle twin first (a +bubbletea variant with its plain
    twin in the run, ``runner.bubbletea_idle_twin``), then the variant itself, compared
    with this repeat's plain twin. Repeats after the first keep their files in
    ``<variant>/repeat-<k>/``."""
    name = run.name
    label = name if repeat == 1 else f"{name} ({r + 1}/{repeat})"
    sub = name if r == 0 else f"{name}/repeat-{r + 1}"
    pair = (cal.src, cal.dst) if cal else None
    faults = None
    entry: VariantResult | VariantFailure
    idle: VariantResult | None = None
    twin = done.get(run.base)
    if name in idle_twins and twin is not None and not isinstance(setups[name], Exception):
        with progress.step(f"{label}: agents idle"):
            try:
                idle = play_variant(net, setups[name], scenario, workload, out, ctl_dir, secret, iterations,
                                    progress, base_dir, pair, twin, folder=f"{sub}-idle", admit=False)
            except (RunnerError, ConfigError, ValueError) as exc:
                progress.log(f"  {name}: the idle twin (agents admitting nothing) FAILED: {exc}; the slowdown "
                             "is not decomposed")
    with progress.step(label):
        try:
            setup = setups[name]
            if isinstance(setup, Exception):
                raise setup
            faults = fault_injector(scenario, net, name)
            entry = play_variant(net, setup, scenario, workload, out, ctl_dir, secret, iterations,
                                 progress, base_dir, pair, twin, faults, folder=sub, idle=idle)
            if run.bubbletea:
                _compare_wan_loss(entry, twin, name, progress)
        except (RunnerError, ConfigError, ValueError) as exc:
            error = faults.explain(str(exc)) if faults is not None else str(exc)
            progress.log(f"  {label} FAILED: {error}")
            entry = VariantFailure(error=error)
        if faults is not None:
            records = faults.records(entry.error if isinstance(entry, VariantFailure) else None)
            summary.faults = [*summary.faults, *records]  # assigned: written to summary.json
            for rec in records:
                progress.log(f"  {name}: fault {fault_line(rec)}")
    return entry


def _repeat_run(entry: VariantResult, r: int, out: Path) -> RepeatRun:
    d = entry.slowdown_decomposition
    return RepeatRun(
        repeat=r + 1, iteration_time_s=entry.iteration_time_s, device_utilization=entry.device_utilization,
        device_utilization_training=entry.device_utilization_training, training_slowdown=entry.training_slowdown,
        agent_overhead=None if d is None else d.agent_overhead,
        training_wait_on_prefill_s=entry.training_wait_on_prefill_s,
        folder=str(Path(entry.timeline_csv).parent),
        iteration_times_s=entry.iteration_times_s, max_iteration_time_s=max(entry.iteration_times_s, default=None),
        p95_iteration_time_s=None if (t := iteration_tail(entry.iteration_times_s)) is None else t.p95,
        worst_training_wait_s=None if entry.guard_overruns is None else entry.guard_overruns.worst_training_wait_s,
    )


def repeats_line(entry: VariantResult) -> str:
    """The median and spread over the repeats, for the log."""
    assert entry.repeats is not None
    med, spread = entry.repeats.median, entry.repeats.spread
    text = (f"{len(entry.repeats.runs)} repeats: median {med.iteration_time_s:.3f} s per iteration (spread "
            f"{spread.iteration_time_s:.3f} s), utilization {med.device_utilization:.1%} (spread "
            f"{spread.device_utilization:.1%})")
    if med.training_slowdown is not None:
        text += f", training slowdown {med.training_slowdown:+.1%} (spread {spread.training_slowdown:.1%})"
    if med.agent_overhead is not None:
        text += f", agents' overhead {med.agent_overhead:+.1%}"
    if entry.repeats.tail is not None:  # the tail over every repeat, not a median
        t = entry.repeats.tail
        text += f"; over all {t.n} measured iterations p50 {t.p50:.3f} s, p95 {t.p95:.3f} s, max {t.max:.3f} s"
    return text


def fault_injector(scenario: Scenario, net: Network, variant: str) -> FaultInjector | None:
    """The faults of one variant's run (testbed/run/faults.py), None when none are listed."""
    if not scenario.faults:
        return None
    from testbed.run.faults import FaultInjector

    return FaultInjector(scenario.faults, variant, scenario.workload.warmup, getattr(net, "emu", None),
                         topology=scenario.topology)


def fault_line(rec: FaultRecord) -> str:
    """One line of the run's log on a fault and what followed it."""
    if rec.started is None:
        return f"{rec.description}: {rec.outcome}{f' ({rec.error})' if rec.error else ''}"
    lasted = f"{rec.ended - rec.started:.2f} s" if rec.ended is not None else "until the end"
    times = ", ".join(f"{a.iteration}: {a.time_s:.3f} s{'*' if a.overlapped else ''}" for a in rec.around)
    recovery = "-" if rec.recovery_s is None else f"{rec.recovery_s:.2f} s"
    dropped = "" if rec.dropped_frames is None else f", {rec.dropped_frames} frames dropped"
    resumed = "" if rec.transport_resumed_s is None else \
        f", transfers resumed {rec.transport_resumed_s:.2f} s after, the {rec.transfers_caught} caught in it done " \
        f"{'-' if rec.caught_done_s is None else f'{rec.caught_done_s:.2f} s'} after"
    return (f"{rec.description}: {rec.outcome}, lasted {lasted}, iterations {times} (* overlapped), recovery "
            f"{recovery}{dropped}{resumed}")


def calibrate_wan(scenario: Scenario, runs: Sequence[RunVariant], placements: Placements, net: Network, out: Path,
                  secret: str, eff: EffectiveWorkload, progress: Progress) -> tuple[Calibration | None, int | None]:
    """The calibration (None when ``runner.calibrate`` is off) and, for
    ``transport.streams: auto``, the stream count it found best: every WAN path the
    variants' `placements` cross, each on its own (testbed/run/calibration.py,
    `calibrate_variants`)."""
    return calibrate_variants(scenario, runs, placements, net, out, secret, eff, progress, AUTO_CANDIDATES,
                              AUTO_MARGIN)


def play_variant(net: Network, setup: VariantSetup, scenario: Scenario, workload: Workload, out: Path,
                 ctl_dir: Path, secret: str, iterations: int, progress: Progress, base_dir: str | None,
                 pair: tuple[str, str] | None, plain: VariantResult | None = None,
                 faults: FaultInjector | None = None, *, folder: str | None = None, admit: bool = True,
                 idle: VariantResult | None = None) -> VariantResult:
    """Run one variant and return its summary entry, with its prediction (made
    before the run; real devices: with their warm-up's measured compute times).
    `plain`: the same variant without agents (a +bubbletea variant's slowdown is
    against it); `idle`: its idle twin (agents admitting nothing: `admit` False), for
    the slowdown's decomposition; `folder`: where its files go (default: its name)."""
    from testbed.run.metrics import decompose_slowdown, decomposition_line, variant_metrics

    workload = setup.runs(workload)  # Atlas's scheduling may run another pipeline schedule
    plain_iteration_s = plain.iteration_time_s if plain is not None else None
    name = setup.name if admit else f"{setup.name} (agents idle)"
    folder = out / (folder or setup.name)
    if folder.exists():
        shutil.rmtree(folder)
    kept_dir = folder / "run"  # the variant's step files, kept with its results
    kept_dir.mkdir(parents=True)
    # while it plays they live in memory when they can (testbed/emulation/memfs.py: no journal
    # commit to wait behind between two pieces of training's work), copied here after
    in_memory = net.memory_dir("steps")
    run_dir = in_memory or kept_dir
    host_ips = {h: net.host(h).ip for h in {hs[0] for hs in setup.placement.hosts.values()}}
    t = scenario.transport
    jobs = build_jobs(
        setup=setup, workload=workload, topology=scenario.topology, host_ips=host_ips, run_dir=run_dir,
        control=str(ctl_dir / f"{_safe(setup.name)}.sock"), ports=PortPlan(scenario.runner.base_port),
        iterations=iterations, transport=transport_job(t),
        local=net.local, setup_timeout_s=scenario.runner.setup_timeout,
        timeout_s=max(scenario.runner.iteration_timeout, 5 * setup.prediction.iteration_time_s),
        temporal_mode=scenario.runner.temporal_mode,
        token_timeout_s=max(1.0, 2 * setup.prediction.iteration_time_s),
        iteration_lead_s=scenario.runner.iteration_lead,
        dp_allreduce=scenario.runner.dp_allreduce, dp_bucket_bytes=scenario.runner.dp_bucket,
        variant_folder=folder,
    )
    if scenario.runner.verify_tensors:
        jobs = {w: j.model_copy(update={"verify_tensors": True}) for w, j in jobs.items()}
    pred = setup.prediction
    # a fault is in the scenario, so known before the run: its predicted effect joins the headline
    fault_mean, fault_note = faults.predict(pred, workload.iterations) if faults is not None else (None, "")
    progress.log(f"{setup.name}: {len(jobs)} workers, {setup.streams} stream(s) per WAN channel, placement "
                 f"{setup.placement.strategy}, {setup.sharing} links{_alternatives(setup)}"
                 + ("".join(f", {a}->{z} windows capped at {c / 1e3:.0f} KB a stream" for (a, z), c
                            in sorted(setup.window_caps.items())) + " (testbed/run/pacing.py window_caps)"
                    if setup.window_caps else "") + ", predicted "
                 f"{pred.iteration_time_s:.3f} s per iteration"
                 + (f" (its pipeline the draw nearest the mean of {len(pred.sim.draws_s)} draws of who gets ahead "
                    f"where its channels collide: {min(pred.sim.draws_s):.3f}-{max(pred.sim.draws_s):.3f} s)"
                    if pred.sim.draws_s else "")
                 + (f"; {fault_note}: {fault_mean:.3f} s over the measured iterations" if fault_note else ""))
    lines_before = net.delay_line_stats()
    try:
        run = run_workers(net, setup, jobs, folder, ctl_dir, secret, scenario, iterations, progress, workload,
                          base_dir, faults, admit=admit)
    finally:
        if in_memory is not None:
            keep_step_files(in_memory, kept_dir)
    delay_line = _delay_line_window(lines_before, net.delay_line_stats(), setup.name, progress)
    link_names = {frozenset(link.between): link.name for link in scenario.topology.wan}
    m = variant_metrics(run.timelines, run.starts, workload.warmup, run.transfers, ends=run.ends,
                        link_names=link_names)
    measured_it = m.iteration_time_s
    if faults is not None:
        faults.transfers = run.transfers  # what the transport did around each fault
    predicted, prediction = _predictions(setup, scenario, workload, base_dir, run, pair, net.local, measured_it)
    if fault_mean is not None:
        predicted += fault_mean - pred.iteration_time_s
        prediction.rates_from += f"; {fault_note}"
    setup.final_prediction = predicted
    files = write_variant_outputs(folder, setup.name, run, m, setup, workload.warmup,
                                  faults.records() if faults is not None else ())
    bt, decomposition = None, None
    if setup.run.bubbletea:
        kept = [(s, e) for i, (s, e) in enumerate(zip(run.starts, run.ends, strict=True)) if i >= workload.warmup]
        bt = bubbletea_metrics(folder, run.timelines, kept, plain_iteration_s, measured_it)
        req, slow = bt.prefill_requests, bt.training_slowdown
        p50 = bt.ttft_s.p50
        progress.log(f"  {name}: utilization {m.device_utilization_training:.0%} training -> "
                     f"{m.device_utilization:.0%} with prefill; {req.served} of {req.arrived} requests "
                     f"served, TTFT p50 {'-' if p50 is None else f'{p50:.2f} s'}; training slowdown "
                     f"{'-' if slow is None else f'{slow:+.1%}'}, waited {bt.training_wait_on_prefill_s * 1e3:.0f}"
                     f" ms on prefill ({bt.guard_violations} guard violations)")
        if plain is not None:
            cores = run.cpu_cores or {}
            idle_d = idle.slowdown_decomposition if idle is not None else None
            decomposition = decompose_slowdown(
                plain.iteration_times_s, m.iteration_times_s, idle.iteration_times_s if idle is not None else None,
                bt.training_wait_on_prefill_s, agents_cpu_cores=cores.get("agents"),
                idle_agents_cpu_cores=None if idle_d is None else idle_d.agents_cpu_cores,
                emulator_cpu_cores=cores.get("workers"), cpu_weights=run.cpu_weights,
                agents_cpu=run.agents_cpu)
            progress.log(f"  {name}: {decomposition_line(decomposition)}")
    real = real_check(folder, workload, progress, setup.name)  # real devices: equivalence check (real_check.py)
    result = VariantResult(
        iteration_time_s=measured_it,
        predicted_iteration_time_s=predicted,
        prediction_error=(measured_it - predicted) / predicted,
        prediction=prediction,
        device_utilization=m.device_utilization,
        device_utilization_training=m.device_utilization_training,
        bubble_fraction=m.bubble_fraction,
        predicted_bubble_fraction=pred.bubble_fraction,
        wan_links=m.wan_links,
        wan_directions=m.wan_directions,
        predicted_wan_bytes_per_iteration=pred.wan_bytes,
        iteration_times_s=m.iteration_times_s,
        warmup_iteration_times_s=m.warmup_iteration_times_s,
        iteration_time_stdev_s=m.iteration_time_stdev_s,
        per_device_utilization=m.per_device_utilization,
        mean_plan_wait_s=m.mean_plan_wait_s,
        mean_wan_transfer_s=m.mean_wan_transfer_s,
        streams=setup.streams,
        sharing=setup.sharing,
        sharing_requested=setup.sharing_requested,
        # atlas "auto": the a-priori prediction of each way; the faster (temporal unless
        # sharing wins by more than the planner's SHARING_MARGIN) ran
        sharing_alternatives_s=setup.sharing_alternatives,
        schedule=workload.parallelism.schedule,
        schedule_alternatives_s=setup.schedule_alternatives,
        schedules_refused=setup.schedules_refused or None,
        configurations=setup.configurations,
        placement=PlacementReport.model_validate(setup.placement.to_json(scenario.topology)),
        temporal_plan=None if pred.plan is None else TemporalPlanInfo(
            offsets_s=pred.plan.offsets, stagger_s=pred.plan.stagger_s,
            transfers_planned=sum(len(v) for v in pred.plan.order.values())),
        compute_only_s=pred.compute_only_s,
        allreduce=_allreduce_entry(run, pred, setup, workload, scenario.runner.dp_bucket),
        delay_line=delay_line,
        timeline_csv=files.timeline_csv,
        transfers_csv=files.transfers_csv,
        gantt_png=files.gantt_png,
    )
    # the keys written only when given (VariantResult.ABSENT_UNLESS_SET)
    if scenario.runner.verify_tensors:
        result.tensors_verified = run.tensors_verified
    if real is not None:
        result.device_mode, result.real = "real", real
    if run.machine_cpu is not None:
        result.machine_cpu = run.machine_cpu
        for note in cpu_notes(name, run.machine_cpu, agents=bt is not None):
            progress.log(f"  {note}")
    if bt is not None:
        for key, value in bt:  # the agents' figures, each the entry's field of the same name
            setattr(result, key, value)
        if plain is not None:
            result.slowdown_decomposition = decomposition
    return result


def _allreduce_entry(run: VariantRun, pred: Prediction, setup: VariantSetup, workload: Workload,
                     bucket: int) -> AllReduceResult | None:
    """The DP all-reduce of a variant whose modelled workers ran it: the slowest
    worker's time per measured iteration, its mean, the a-priori prediction of the
    time it adds after the pipeline, and the bytes its rings send across WAN links
    per iteration (replicas whose ring neighbour is in another DC)."""
    from testbed.training.allreduce import ring_plan

    times = [t for t in run.allreduce_s[workload.warmup:] if t is not None]
    if not times:
        return None
    par, pl = workload.parallelism, setup.placement
    eff = pred.effective or workload.effective()
    wan = sum(ring_plan(d, par.dp, grad_wire_bytes(workload, eff, r), bucket).bytes_sent
              for r in range(par.pp) for d in range(par.dp) if pl.dc_of(d, r) != pl.dc_of((d + 1) % par.dp, r))
    return AllReduceResult(measured_s=times, mean_s=sum(times) / len(times), predicted_added_s=pred.allreduce_s,
                           wan_bytes_per_iteration=wan)


def real_check(folder: Path, workload: Workload, progress: Progress, name: str) -> RealCheck | RealCheckSkipped | None:
    """What a real-device variant adds to its summary entry (with ``device_mode:
    real``): the comparison with the one-process reference; None for modelled GPUs."""
    if workload.gpu.mode != "real":
        return None
    from testbed.run.real_check import summary_entry

    return summary_entry(folder, workload, progress.log, name)


class VariantFiles(NamedTuple):
    """A variant's files, relative to the run folder (its summary entry names them)."""

    timeline_csv: str
    transfers_csv: str
    gantt_png: str


def keep_step_files(src: Path, dst: Path) -> None:
    """Copy a variant's step files from memory (`Network.memory_dir`) into its results
    folder and free the memory: folders and regular files only (the holders' FIFOs mean
    nothing after the run, and opening one to copy it would block)."""

    def not_plain(folder: str, names: list[str]) -> list[str]:
        return [n for n in names if (p := Path(folder, n)).is_symlink() or not (p.is_dir() or p.is_file())]

    shutil.copytree(src, dst, ignore=not_plain, dirs_exist_ok=True)
    shutil.rmtree(src, ignore_errors=True)


def write_variant_outputs(folder: Path, name: str, run: VariantRun, metrics: VariantMetrics,
                          setup: VariantSetup, warmup: int, faults: Sequence[FaultRecord] = ()) -> VariantFiles:
    """The variant's timeline and transfers (CSV), prediction, iteration spans and Gantt chart."""
    from testbed.run.gantt import gantt_png
    from testbed_runtime.device import write_timeline_csv

    records = sorted((r for recs in run.timelines.values() for r in recs), key=lambda r: (r.device, r.start))
    write_timeline_csv(records, folder / "timeline.csv")
    _write_transfers_csv(run.transfers, folder / "transfers.csv")
    (folder / "prediction.json").write_text(json.dumps(setup.prediction.to_json(), indent=1, default=str))
    (folder / "iterations.json").write_text(json.dumps({"starts": run.starts, "ends": run.ends, "warmup": warmup}))
    title = (f"{name}: {metrics.iteration_time_s:.3f} s per iteration "
             f"(predicted {setup.final_prediction or setup.prediction.iteration_time_s:.3f} s), utilization "
             f"{metrics.device_utilization:.0%}, {setup.streams} stream(s) per WAN channel")
    gantt_png(run.timelines, run.transfers, run.starts, run.ends, warmup, folder / "gantt.png", title=title,
              faults=faults)
    return VariantFiles(f"{folder.name}/timeline.csv", f"{folder.name}/transfers.csv", f"{folder.name}/gantt.png")


def _write_transfers_csv(transfers: Sequence[TransferRecord], path: Path) -> None:
    import csv

    cols = ["iteration", "pipeline", "boundary", "mb", "direction", "src", "dst", "nbytes", "links", "streams",
            "latency_s", "posted", "not_before", "sent", "arrived", "confirmed"]
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(cols)
        for t in transfers:
            row = t.to_json()
            row["links"] = " ".join(row["links"])
            w.writerow([row.get(c) for c in cols])


def _predictions(setup: VariantSetup, scenario: Scenario, workload: Workload, base_dir: str | None, run: VariantRun,
                 pair: tuple[str, str] | None, local: bool, measured_it: float) -> tuple[float, PredictionReport]:
    """The variant's headline prediction and the summary's ``prediction`` block.

    The headline is made before the measured iterations from the calibration probe's
    rates (a shared link: a channel's rate alone on it, the probe's colliding
    aggregate while transfers collide); real devices add the stage times their
    warm-up measured (the compute model does not know this machine): each stage's mean
    hold of its worker, the work with the wait to begin it and the hand-over after it
    (metrics.stage_hold_times). The same model
    fed with the variant's own warm-up (solo channel rate, and the aggregate its
    colliding transfers reached) is kept as a diagnostic: TCP's loss recovery under
    collisions varies from iteration to iteration, so a few warm-up iterations are a
    noisier sample of the shared link than the probe's (docs/scenarios.md, 'What a run
    writes': how the prediction treats a shared link)."""
    from testbed.run.metrics import (
        channel_rate,
        colliding_rate,
        pipeline_overhead,
        stage_hold_times,
    )
    from testbed.run.metrics import iterations as iteration_spans

    pred = setup.prediction
    predicted = pred.iteration_time_s
    how = "calibration probe" if setup.rate_bps else "window model"
    band = None
    if not local and any(link.loss > 0 for link in scenario.topology.wan):
        note, band = lossy_note(pred, scenario, workload)
        how += note
    compute, overhead = None, 0.0
    first = 1 if workload.warmup >= 2 else 0  # iteration 0 also opens TCP windows, pays lazy init
    warmup_its = range(first, workload.warmup)
    if workload.gpu.mode == "real" and workload.warmup:
        its = {it.index: (it.start, it.end) for it in iteration_spans(run.timelines, run.starts, run.ends)
               if it.index in warmup_its}
        spans = list(its.values())
        # each stage's mean hold of its worker (work, the wait to begin it, the hand-over after)
        compute = stage_hold_times(run.timelines, run.transfers, its, len(pred.effective.stage_forward_s))
        if compute is not None:
            overhead = pipeline_overhead(run.timelines, spans)
            how += " and warm-up compute times"
            predicted = real_device_prediction(setup, scenario, workload, base_dir, pair, local, compute, overhead)
    temporal = setup.sharing == "temporal"
    crowd = None
    if not temporal and setup.colliding_bps is not None and pair is not None and workload.warmup:
        crowd = colliding_rate(run.transfers, warmup_its, workload.parallelism.dp)
    warm, warm_predicted = None, None
    if workload.warmup and pair is not None:  # a temporal plan holds the link alone: all its transfers
        warm = channel_rate(run.transfers, warmup_its, solo_only=not temporal)
        if warm is not None and warm[2] == "all" and not temporal and setup.streams > 1:
            warm = None  # too few transfers had the link alone: their rate would count the sharing twice
        if warm is not None:
            warm_predicted = repredict(setup, scenario, workload, base_dir, warm[0], pair, local, compute,
                                       None if crowd is None else crowd[0]) + overhead
    return predicted, PredictionReport(
        rates_from=how,
        warmup_channel_rate_mbps=None if warm is None else warm[0] / 1e6,
        warmup_transfers_counted=None if warm is None else f"{warm[1]} ({warm[2]})",
        with_warmup_rates_iteration_time_s=warm_predicted,
        calibrated_channel_rate_mbps=None if setup.rate_bps is None else setup.rate_bps / 1e6,
        calibrated_colliding_aggregate_mbps=None if setup.colliding_bps is None else setup.colliding_bps / 1e6,
        warmup_colliding_aggregate_mbps=None if crowd is None else crowd[0] / 1e6,
        warmup_colliding_transfers=None if crowd is None else crowd[1],
        a_priori_iteration_time_s=pred.iteration_time_s,
        a_priori_error=(measured_it - pred.iteration_time_s) / pred.iteration_time_s,
        measured_stage_forward_s=None if compute is None else compute[0],
        measured_stage_backward_s=None if compute is None else compute[1],
        measured_overhead_s=None if compute is None else overhead,
        calibrated_paths=setup.paths_used() or None,
        chance_interval_s=None if band is None else list(band),
    )


def lossy_note(pred: Prediction, scenario: Scenario,
               workload: Workload) -> tuple[str, tuple[float, float] | None]:
    """What the prediction of a run over lossy links is, and where one run's mean may
    fall by chance (testbed_core/planning/lossy.py `chance_interval`), with that interval."""
    from testbed.run.variants import lossy_history, lossy_paced
    from testbed_core.planning.lossy import chance_interval

    note = (", held on lossy paths to the short-transfer loss model (testbed_core/planning/lossy.py: the run's "
            "fresh connections, the iteration averaged over the spread of their transfer times)")
    band = chance_interval(pred, scenario.topology, workload.iterations,
                           lossy_history(scenario, not pred.variant.rendezvous),
                           lossy_paced(scenario, pred.variant.rendezvous), scenario.runner.slow_start_after_idle)
    if band is not None:
        note += (f"; one run's mean over {workload.iterations} iteration(s) falls by chance between "
                 f"{band[0]:.3f} and {band[1]:.3f} s (5th-95th percentile)")
    return note, band


def _compare_wan_loss(entry: VariantResult, plain: VariantResult | None, name: str, progress: Progress) -> None:
    """A +bubbletea variant whose WAN lost packets that its plain twin did not: TCP then
    carries smaller windows for the rest of the run, and the slowdown it measures is
    the network's, not the prefill's. Say so next to the slowdown."""
    mine, theirs = entry.tail_drops(), None if plain is None else plain.tail_drops()
    if mine is None or theirs is None:
        return
    entry.wan_tail_drops = WanTailDrops(with_bubbletea=mine, without=theirs)
    slow = entry.training_slowdown
    if mine > theirs and slow is not None and slow > 0.01:
        note = (f"the WAN queue dropped {mine} packets in this variant and {theirs} without BubbleTea: TCP windows "
                "shrank and stayed small, so part or all of the slowdown is the network's (waited on prefill: "
                f"{(entry.training_wait_on_prefill_s or 0) * 1e3:.0f} ms); rerun to compare")
        entry.training_slowdown_note = note
        progress.log(f"  {name}: note: {note}")


def _delay_line_window(before: Mapping[str, RelaySnapshot], after: Mapping[str, RelaySnapshot], name: str,
                       progress: Progress) -> dict[str, DelayLineWindow] | None:
    """The relay delay lines' counters over one variant (None with netem or local
    mode), and a warning when a relay itself dropped packets."""
    from testbed.emulation.delayline.stats import windows

    if not after:
        return None
    stats = windows(before, after)
    for link, w in stats.items():
        if w.relay_drops:
            progress.log(f"  {name}: warning: the delay line of {link} itself dropped {w.relay_drops} packets "
                         "(its queue or socket overflowed): the link lost more than configured; the machine may be "
                         "overloaded")
    return stats


def _alternatives(setup: VariantSetup) -> str:
    alt, text = setup.sharing_alternatives, ""
    if alt:
        text = f" (predicted temporal {alt['temporal']:.3f} s, shared {alt['shared']:.3f} s)"
    if setup.schedule_alternatives:
        ran = setup.schedule or next(iter(setup.schedule_alternatives))
        weighed = ", ".join(f"{k} {v:.3f} s" for k, v in setup.schedule_alternatives.items())
        text += f", schedule {ran} (predicted {weighed})"
    if setup.configurations:
        taken = next(c for c in setup.configurations if c.taken)
        text += (f", of {len(setup.configurations)} configurations predicted ran {taken.streams} stream(s) "
                 f"{taken.sharing} on {taken.placement}")
    return text


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in name)


def _plain(data: Any) -> Any:
    """The resolved scenario as plain YAML data (no private '_source' keys dropped:
    they say where the topology and workload came from)."""
    return json.loads(json.dumps(copy.deepcopy(data), default=str))


def _write_summary(out: Path, summary: Summary, t_begin: float) -> None:
    """summary.json through its model (testbed_core/contracts/summary.py), replaced whole."""
    summary.duration_s = time.time() - t_begin
    write_text_atomic(out / "summary.json", summary.to_json())
