"""What would make `testbed run` fail once the emulation is built, found before anything
is built, as `testbed plan` does: the runner's own requirements (pp >= 2), the variants
(``--variants`` or the scenario's), each variant's placement on the topology (a
placement that does not fit says which pp or dp would) and its prediction, the
workload's compute model (a gpu.profile file), the memory the run's processes would
take against what this machine has available (`memory_estimate`: what would fit is
said, e.g. the largest ``workload.scale``), and, for an emulated run, DCs given as GPU
counts and a machine that cannot build (root, Mininet).

Used by `testbed run` (every problem listed, no result folder created) and by sweeps
(every point checked when the sweep is loaded, once per distinct shape)."""

from __future__ import annotations

import io
import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import ValidationError

from testbed.progress import Progress
from testbed.run.common import RunnerError
from testbed.run.scenario import MAX_STREAMS, Scenario
from testbed.run.variants import (
    check_runnable,
    place_variants,
    plan_variant,
    run_variants,
    variant_placement,
)
from testbed_core.compute_model import param_count
from testbed_core.configfile import ConfigError
from testbed_core.planning.placement import free_gpus, strategy_for
from testbed_core.planning.schedule import activation_memory_bytes, in_flight
from testbed_core.units import format_size
from testbed_core.variants import RunVariant
from testbed_core.workload import Workload


def preflight(scenario: Scenario, only: Sequence[str] | None = None, progress: Progress | None = None, *,
              machine: bool = True, memory: bool = True, available_bytes: int | None = None) -> list[str]:
    """The problems that would stop the run, one line each; empty when it can start.
    `machine`: also check that this machine can build the emulation (not for local runs);
    `memory`: that the run's processes fit in this machine's available memory
    (`available_bytes`, default: MemAvailable of /proc/meminfo)."""
    progress = progress or Progress(stream=io.StringIO(), tty=False)
    try:
        check_runnable(scenario, progress)
        runs = run_variants(scenario, only)
    except (RunnerError, ConfigError) as exc:
        return [str(exc)]
    problems = []
    try:
        scenario.workload.effective(scenario.workload_dir)
    except (ConfigError, ValueError) as exc:
        problems.append(f"{scenario.workload_source or 'workload'}: {exc}")
    placements = place_variants(scenario, runs)  # each variant placed once (a search is not repeated)
    for run in runs:
        placement = placements[run.base]
        if isinstance(placement, ValueError):
            problems.append(unplaced_problem(run, scenario, placement))
            continue
        try:
            plan_variant(run, scenario, scenario.workload, scenario.workload_dir, None, None, scenario.runner.local,
                         placement)
        except (RunnerError, ValueError) as exc:
            text = str(exc)
            prefix = f"variant {run.name}: "
            problems.append(text if text.startswith(prefix) else prefix + text)
    if problems and not only:
        problems.append("drop these from the scenario's variants, or choose others with --variants")
    if memory and not problems:
        too_big = memory_problem(scenario, runs, available_bytes)
        if too_big:
            problems.append(too_big)
    if not scenario.runner.local and not scenario.runner.inventory:  # an inventory run emulates nothing
        try:
            scenario.topology.require_emulable()
        except ConfigError as exc:
            problems.append(str(exc))
        if machine:
            from testbed.emulation.network import EmulationError
            from testbed.emulation.network import preflight as machine_preflight

            try:
                machine_preflight()
            except EmulationError as exc:
                problems.append(f"{exc} (or run the workers without the emulated network: --local)")
    return problems


# ------------------------------------------------------------------ placement


def _source(scenario: Scenario) -> str:
    return scenario.workload_source or scenario.source or "scenario"


def _with_parallelism(workload: Workload, **changes: int) -> Workload | None:
    """`workload` with other parallelism degrees, or None when the workload would not
    be valid with them (e.g. layers not divisible, or fewer layers than stages)."""
    data = workload.model_dump(mode="json")
    data["parallelism"].update(changes)
    try:
        return Workload.model_validate(data)
    except (ValidationError, ValueError):
        return None


def _places(run: RunVariant, scenario: Scenario, workload: Workload) -> bool:
    try:
        variant_placement(run.variant, scenario, workload)
    except ValueError:
        return False
    return True


def placement_problem(run: RunVariant, scenario: Scenario) -> str | None:
    """Why `run`'s placement does not fit on the scenario's topology (`unplaced_problem`);
    None when it fits."""
    try:
        variant_placement(run.variant, scenario)
    except ValueError as exc:
        return unplaced_problem(run, scenario, exc)
    return None


def unplaced_problem(run: RunVariant, scenario: Scenario, error: ValueError) -> str:
    """Why `run`'s placement does not fit on the scenario's topology (`error`: what
    placing it said), naming the workload's file and field and the largest pp (same
    dp) or dp (same pp) that would fit."""
    reason = re.sub(r"\s*Add GPUs \(--gpus dc=count\), or lower [^.]*\.\s*$", "", str(error)).rstrip(". ")
    wl = scenario.workload
    par = wl.parallelism
    topo = scenario.topology
    strategy = strategy_for(run.variant.placement, scenario.runner.baseline_placement, scenario.runner.atlas_placement)
    fits = []
    pp_fit = next((pp for pp in range(par.pp - 1, 1, -1)
                   if (w := _with_parallelism(wl, pp=pp)) is not None and _places(run, scenario, w)), None)
    if pp_fit is not None:
        fits.append(f"workload.parallelism.pp: {pp_fit} (with dp={par.dp})")
    dp_fit = next((dp for dp in range(par.dp - 1, 0, -1)
                   if (w := _with_parallelism(wl, dp=dp)) is not None and _places(run, scenario, w)), None)
    if dp_fit is not None:
        fits.append(f"workload.parallelism.dp: {dp_fit} (with pp={par.pp})")
    gpus = ", ".join(f"{dc}: {n}" for dc, n in free_gpus(topo).items())
    what = ("what would fit: " + " or ".join(fits)) if fits else (
        "no smaller pp or dp fits either")
    return (f"variant {run.name}: {_source(scenario)}: workload.parallelism (pp={par.pp}, dp={par.dp}, "
            f"tp={par.tp}) cannot be placed by placement {strategy} on topology {topo.name} (GPUs per DC: "
            f"{gpus}): {reason}; {what}; or give the DCs more hosts (the topology's dcs[].hosts)")


# ------------------------------------------------------------------ memory

PROCESS_BYTES = 200 << 20
"""Private memory of one worker, agent or decode-server process: Python with torch
imported takes about 150 MiB of its own (measured with /proc/self/smaps_rollup on
this toolkit's worker); the rest is room for its threads and allocator."""
RELAY_BYTES = 64 << 20  # one delay-line relay (Python, no torch) and its queue
SHARED_LIBS_BYTES = 128 << 20  # torch's libraries, mapped once for all processes
STREAM_SCRATCH_BYTES = 1 << 20  # each stream's receive thread keeps a 1 MiB scratch buffer
MEMORY_SHARE = 0.8
"""Of the machine's available memory (MemAvailable) a run may plan to use: the rest
is the margin for what the estimate leaves out (the kernel's socket buffers beyond
one tensor per channel, Python's garbage between collections)."""


def available_memory_bytes(meminfo: str | Path = "/proc/meminfo") -> int | None:
    """MemAvailable of this machine in bytes (None when it cannot be read)."""
    try:
        for line in Path(meminfo).read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


@dataclass
class MemoryEstimate:
    """What a run's processes would take at once (one variant runs at a time): each
    part in bytes; `scaled` is the part that grows with ``workload.scale`` (modelled
    tensors on the wire), already at the scenario's scale."""

    parts: dict[str, int] = field(default_factory=dict)
    scaled: int = 0
    workers: int = 0
    notes: list[str] = field(default_factory=list)

    @property
    def total(self) -> int:
        return sum(self.parts.values())

    def describe(self) -> str:
        return ", ".join(f"{k} {format_size(v)}" for k, v in self.parts.items() if v)


def _max_streams(scenario: Scenario, runs: Sequence[RunVariant]) -> int:
    """The most streams any run opens per channel: the configured count, one, or for
    fill-link enough window-limited flows to fill the fastest WAN link (at most
    twice the calibrated choice's count it may end up with: MAX_STREAMS)."""
    configured = scenario.transport.streams if isinstance(scenario.transport.streams, int) else 16
    fill = configured
    topo = scenario.topology
    for link in topo.wan:
        flow = topo.tcp.window_limited_rate(link.rtt_s)
        if math.isfinite(flow) and flow > 0:
            fill = max(fill, min(MAX_STREAMS, math.ceil(link.rate / flow)))
    counts = [1 if r.variant.streams == "one" else configured if r.variant.streams == "configured" else fill
              for r in runs]
    return max(counts or [1])


def memory_estimate(scenario: Scenario, runs: Sequence[RunVariant]) -> MemoryEstimate:
    """The memory of the run's processes at once (the heaviest variant; they run one
    after another). Per worker (one per stage and DP replica): its process; in modelled
    mode the tensor it sends (micro_batch x seq_len x hidden x dtype bytes x scale),
    the tensors that may wait received but not yet used (every micro-batch, from each
    neighbour) and one in flight per channel, and the DP all-reduce's two bucket
    buffers; in real mode the stage's weights, gradients and optimizer state and the
    activations of the micro-batches in flight (`activation_memory_bytes`); each
    stream's receive scratch. Beside them: the runner, a relay per WAN link, the
    BubbleTea agents (one per worker) and decode servers, and for real mode the
    one-process reference that checks the result."""
    wl, par, runner = scenario.workload, scenario.workload.parallelism, scenario.runner
    est = MemoryEstimate()
    workers = par.pp * par.dp
    est.workers = workers
    m = par.num_micro_batches
    wire = max(1, round(wl.effective(scenario.workload_dir).wire_activation_bytes)) if wl.gpu.mode != "real" \
        else wl.model.seq_len * par.micro_batch * wl.model.hidden * wl.model_spec().dtype_bytes
    neighbours = 2 * par.chunks  # a stage receives from the previous and the next (per model chunk)
    channels = neighbours + (2 if par.dp > 1 else 0)
    tensors = 1 + neighbours * m + neighbours  # sent, waiting received, in flight per pipeline channel
    if runner.verify_tensors and wl.gpu.mode != "real":
        tensors += 1 + m  # the seeded pattern and the rotated copies queued for sending
    est.parts["processes"] = (workers + 1) * PROCESS_BYTES + SHARED_LIBS_BYTES
    per_tensors = tensors * wire
    if wl.gpu.mode != "real":
        est.scaled = workers * per_tensors
    est.parts["tensors"] = workers * per_tensors
    if par.dp > 1 and (runner.dp_allreduce or wl.gpu.mode == "real"):
        grad = math.ceil(param_count(wl.model_spec()) / par.pp * wl.model_spec().dtype_bytes * wl.scale)
        est.parts["all-reduce buffers"] = workers * 2 * max(1, min(grad, runner.dp_bucket))
    est.parts["stream buffers"] = workers * channels * _max_streams(scenario, runs) * STREAM_SCRATCH_BYTES
    if wl.gpu.mode == "real":
        from testbed.run.real_check import model_params

        opt = wl.real.optimizer
        states = 2 if opt.kind == "adam" else 1 if opt.momentum > 0 else 0
        per_param = wl.model_spec().dtype_bytes * (2 + states)
        params = model_params(wl)
        layers = math.ceil(wl.model.layers / par.pp)
        est.parts["model state"] = int(par.dp * params * per_param)
        est.parts["activations"] = workers * in_flight(par.schedule, par.pp, m) * layers * activation_memory_bytes(wl)
        est.parts["reference"] = int(params * per_param) + PROCESS_BYTES  # the one-process check
        est.notes.append("real mode: the model's weights, gradients and optimizer state are counted on the host")
    est.parts["relays"] = len(scenario.topology.wan) * RELAY_BYTES if not runner.local else 0
    if scenario.bubbletea.enabled:
        from bubbletea_agent.config import AgentConfig

        kv = AgentConfig.model_fields["materialise_limit_bytes"].default
        dcs = len(scenario.topology.dcs)
        est.parts["bubbletea"] = workers * (PROCESS_BYTES + 2 * kv) + dcs * (PROCESS_BYTES + kv)
    return est


def memory_problem(scenario: Scenario, runs: Sequence[RunVariant], available_bytes: int | None = None) -> str | None:
    """Why the run would not fit in this machine's memory, naming the file, the field
    and what would fit (the largest workload.scale, or fewer workers); None when it
    fits or the machine's memory cannot be read."""
    avail = available_bytes if available_bytes is not None else available_memory_bytes()
    if avail is None:
        return None
    est = memory_estimate(scenario, runs)
    budget = int(MEMORY_SHARE * avail)
    if est.total <= budget:
        return None
    wl = scenario.workload
    fixed = est.total - est.scaled
    head = (f"{_source(scenario)}: the run would need about {format_size(est.total)} of memory at once "
            f"({est.workers} workers, pp x dp = {wl.parallelism.pp} x {wl.parallelism.dp}: {est.describe()}), more "
            f"than the {format_size(budget)} it may use ({MEMORY_SHARE:.0%} of the {format_size(avail)} this machine "
            "has available)")
    if est.scaled and fixed < budget:
        scale = wl.scale * (budget - fixed) / est.scaled
        digits = max(0, -math.floor(math.log10(scale)) + 1) if scale > 0 else 0
        fit = math.floor(scale * 10**digits) / 10**digits
        return (f"{head}; workload.scale: at {wl.scale:g} each worker holds about "
                f"{format_size(est.scaled // max(1, est.workers))} of tensors; what would fit: workload.scale <= "
                f"{fit:g} (link rates then stand for rate / scale), or fewer micro-batches "
                f"(workload.parallelism.num_micro_batches, now {wl.parallelism.num_micro_batches}) or a smaller "
                "micro_batch")
    if wl.gpu.mode == "real":
        return (f"{head}; workload.model: what would fit: a smaller model or micro_batch "
                "(workload.parallelism.micro_batch), activation_recompute: true, or fewer DP replicas "
                "(workload.parallelism.dp)")
    per_worker = max(1, fixed // max(1, est.workers + 1))
    workers_fit = budget // per_worker - 1
    without = ", without bubbletea.enabled" if scenario.bubbletea.enabled else ""
    if workers_fit < 2:
        return (f"{head}; workload.parallelism: even the smallest run (pp=2, dp=1{without}) would not fit; "
                "free memory on this machine (other runs?) and try again")
    return (f"{head}; workload.parallelism: the processes alone exceed it; what would fit: at most about "
            f"{workers_fit} workers (pp x dp){without}")


def shape_key(scenario: Scenario) -> str:
    """What `preflight` (without the machine and memory checks) depends on, as a
    string: points of a sweep that share it share the verdict (a sweep over delays
    plans once); `point_memory_problem` checks each point's memory apart."""
    topo, wl, runner, bt = scenario.topology, scenario.workload, scenario.runner, scenario.bubbletea
    return json.dumps({
        "dcs": [(dc.name, list(dc.hosts), dc.gpus) for dc in topo.dcs],
        "links": [list(link.between) for link in topo.wan],
        "parallelism": wl.parallelism.model_dump(mode="json"), "gpu": wl.gpu.model_dump(mode="json"),
        "workload_dir": scenario.workload_dir, "variants": scenario.variants,
        "bubbletea": [bt.enabled, bt.compare, bt.variants],
        "runner": [runner.local, runner.baseline_placement, getattr(runner, "dp_allreduce", None)],
    }, sort_keys=True, default=str)


def point_memory_problem(scenario: Scenario, available_bytes: int | None = None) -> str | None:
    """`memory_problem` of a sweep point with the scenario's own variants (cheap: no
    planning, so it runs for every point, outside the `shape_key` cache)."""
    try:
        runs = run_variants(scenario)
    except RunnerError:
        return None  # preflight says why
    return memory_problem(scenario, runs, available_bytes)
