"""``summary.json``: what one `testbed run` measured and predicted, as one typed document.

The runner (testbed/run/runner.py) builds a `Summary` and writes it with
`Summary.to_json`; `testbed report`, `testbed demo`, `testbed sweep` and the tests read
it back with `Summary.model_validate_json` (or `read_summary`). One model on both
sides: a key the runner renames or drops fails the readers' validation at once,
instead of surfacing as a missing column in a report.

The document keeps the shape it always had: per-variant entries are flat (the
BubbleTea metrics and the real-device check sit beside the iteration time), and a
few keys exist only where they apply. Those keys are listed in a model's
``ABSENT_UNLESS_SET``: they are written only when given (or read), so a plain
variant has no ``ttft_s`` at all rather than ``"ttft_s": null``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import ConfigDict, Field

from testbed_core.contracts.calibration import CalibrationReport
from testbed_core.contracts.document import Document

__all__ = [
    "AgentCounters", "BubbleTeaMetrics", "KVChecks", "Crossing", "FaultRecord", "IterationAround", "DEFINITIONS", "DelayLineDirection", "DelayLineWindow", "Definitions",
    "Parallelism", "Placement", "Prediction", "PrefillRequests", "RealCheck", "RealCheckSkipped",
    "RealReference", "RepeatFigures", "RepeatRun", "Repeats", "SlowdownDecomposition", "Summary", "TemporalPlanInfo", "Ttft", "VariantEntry", "VariantFailure",
    "VariantResult", "WanDirection", "WanLink", "WanTailDrops", "read_summary",
    "ProgramDefinitions", "ProgramRankResult", "ProgramSummary", "ProgramVariantResult", "is_program_summary",
]


class _Doc(Document):
    """A part of summary.json: unknown keys are refused (a renamed key is a bug in the
    writer or a reader, not data), assignments are validated, and the keys named in
    ``ABSENT_UNLESS_SET`` are written only when they were given."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, ser_json_inf_nan="constants")


# ------------------------------------------------------------------ the run


class Parallelism(_Doc):
    dp: int  # data-parallel degree: pipelines (replicas) trained side by side
    pp: int  # pipeline-parallel degree: stages per pipeline
    tp: int  # tensor-parallel degree: devices per stage
    micro_batch: int  # samples per micro-batch
    num_micro_batches: int  # micro-batches per pipeline per iteration


class Definitions(_Doc):
    """What the headline figures mean, written into every summary so that the file
    explains itself."""

    # what iteration_time_s means
    iteration_time_s: str = (
        "mean over measured iterations (after warm-up) of: common start -> last training work of any device ends "
        "(or, with dp > 1, the last worker's DP gradient all-reduce ends, where that is later); iterations are "
        "separated by a barrier")
    # what predicted_iteration_time_s means and where its rates came from
    predicted_iteration_time_s: str = (
        "planner simulation of one iteration (testbed_core/planning/prediction.py) with the variant's placement and "
        "temporal plan, made before the run from the calibration probe's WAN channel rates (a shared link carries, "
        "while transfers collide on it, the probe's aggregate of colliding channels); real devices (gpu.mode: real): "
        "with the stage compute times the warm-up iterations measured, plus their measured time outside the "
        "pipeline. prediction.with_warmup_rates_iteration_time_s: the same fed with the variant's own warm-up "
        "channel rate and colliding aggregate (diagnostic). With dp > 1 the DP gradient all-reduce is run over "
        "the network after every iteration (runner.dp_allreduce, on by default; real devices always) and the "
        "prediction includes it (allreduce.predicted_added_s); with runner.dp_allreduce: false modelled devices "
        "neither run nor predict it")
    # what device_utilization means
    device_utilization: str = "mean over devices of busy time / wall time of the measured iterations"
    # what bubble_fraction means
    bubble_fraction: str = "mean over devices of idle (no training work) / wall time of the measured iterations"
    # what the wan_links figures mean
    wan_links: str = ("bytes of the measured iterations; goodput = bytes / time the link had a transfer on the wire "
                      "(both directions)")


DEFINITIONS = Definitions()


# ------------------------------------------------------------------ one variant's parts


class PathRatesUsed(_Doc):
    """``prediction.calibrated_paths[]``: one WAN path the variant crosses, as its
    prediction saw it (the calibration's figures of that path for the variant's streams)."""

    dcs: tuple[str, str]  # the path's two DCs
    channel_rate_mbps: float | None  # one channel alone on the path
    colliding_aggregate_mbps: float | None  # its channels colliding there, in all
    ring_aggregate_mbps: float | None  # the DP rings crossing it, in all each way
    # "path alone", or also "with the placement's other paths loaded at once" (the WAN links'
    # delay lines share the machine's cores: a calibration probe loads every path the variant
    # crosses), the figures then weighed by `load`
    timed: str | None = None
    # how loaded the other paths keep this one in the predicted iteration: over its transfers'
    # time, the mean share of the other paths busy (0: alone figures, 1: together figures)
    load: float | None = None


class Prediction(_Doc):
    """``prediction``: where the headline prediction's rates came from, and the same
    model fed with the variant's own warm-up (a diagnostic)."""

    # where the headline prediction's WAN rates came from (calibration probe or the window model;
    # real devices: and the warm-up compute times)
    rates_from: str
    # one channel's rate measured over the variant's own warm-up transfers, Mbit/s (None: too few)
    warmup_channel_rate_mbps: float | None
    # how many warm-up transfers that rate counts, and which (those alone on the link, or all)
    warmup_transfers_counted: str | None
    # the same prediction fed with the warm-up's own rates, seconds (a diagnostic)
    with_warmup_rates_iteration_time_s: float | None
    # one channel's rate from the calibration probe, Mbit/s
    calibrated_channel_rate_mbps: float | None
    # the calibration probe's aggregate of channels colliding on a shared link, Mbit/s
    calibrated_colliding_aggregate_mbps: float | None
    # the same aggregate measured over the warm-up's colliding transfers, Mbit/s
    warmup_colliding_aggregate_mbps: float | None
    warmup_colliding_transfers: int | None  # warm-up transfers that aggregate counts
    # the planner's prediction before any of this variant ran, seconds
    a_priori_iteration_time_s: float
    a_priori_error: float  # (measured - a priori) / a priori iteration time
    # real devices: each stage's forward time the warm-up measured (its mean hold of the worker: the
    # work, the wait to begin it, the hand-over of its tensor; in older summaries the median work), s
    measured_stage_forward_s: list[float] | None
    # real devices: each stage's backward time the warm-up measured, the same way, seconds
    measured_stage_backward_s: list[float] | None
    # real devices: the warm-up's time outside the pipeline's work per iteration, seconds
    measured_overhead_s: float | None
    calibrated_paths: list[PathRatesUsed] | None = None  # each WAN path's own figures (per-path calibration)
    # on lossy paths: the 5th and 95th percentiles of one run's mean iteration by chance
    # around the prediction (testbed_core/planning/lossy.py `chance_interval`), seconds
    chance_interval_s: list[float] | None = None


class MachineCpu(_Doc):
    """``machine_cpu``: this machine's CPU over a variant's measured iterations, in cores
    (CPU seconds over wall seconds). Every process of an emulated run shares the
    machine's cores, and its prediction assumes the run has them to itself: what other
    programs took meanwhile (`outside_cores`) slows the run's transport, delay lines and
    rings, a slowdown the prediction does not hold."""

    cores: int  # the machine's cores
    busy_cores: float  # all its cores' busy time over the wall time
    run_cores: float  # the run's: its workers (agents, decode servers), the runner and its delay lines
    outside_cores: float  # the rest: other programs (never below 0)


class AllReduceResult(_Doc):
    """``allreduce``: the DP gradient all-reduce of modelled workers (a ring over the
    network after each iteration's last backward)."""

    measured_s: list[float]  # per measured iteration: the slowest worker's ring
    mean_s: float  # mean of measured_s, seconds
    predicted_added_s: float  # what the a-priori prediction adds after the pipeline for it
    wan_bytes_per_iteration: int  # what the rings send across WAN links (0: every ring inside a DC)


class WanDirection(_Doc):
    """One direction of a WAN link over the measured iterations."""

    bytes: int  # bytes carried over the measured iterations
    transfers: int  # transfers carried over the measured iterations
    busy_s: float  # seconds with at least one transfer on the wire
    goodput_mbps: float | None  # bytes / busy_s, Mbit/s (None: no transfer)
    # mean over transfers of each one's bytes / its time on the wire, Mbit/s
    mean_throughput_mbps: float | None


class WanLink(WanDirection):
    """A WAN link, both directions together; goodput is comparable to the link's rate."""

    directions: list[str]  # the directions counted (e.g. dc1->dc2, dc2->dc1)


class Crossing(_Doc):
    boundary: int  # the stage boundary that crosses (between stage boundary and boundary + 1)
    src: str  # DC of the earlier stage
    dst: str  # DC of the later stage
    path: list[str]  # the DCs the boundary's tensors pass through, src to dst
    pipelines: list[int]  # the pipelines (DP replicas) whose boundary crosses here


class Placement(_Doc):
    """Where the variant's stages ran: DC per (pipeline, stage), hosts per ``p<d>s<s>``."""

    strategy: str  # how the stages were placed (atlas, even, in-order, round-robin, search, ...)
    pp: int  # stages per pipeline
    dp: int  # pipelines
    tp: int  # devices per stage
    free_gpus: dict[str, int]  # GPUs free per DC before placing
    used_gpus: dict[str, int]  # GPUs used per DC
    stage_dc: list[list[str]]  # per pipeline, the DC of each stage
    hosts: dict[str, list[str]]  # per p<pipeline>s<stage>, the hosts that run it
    # an interleaved schedule's chunks also go from the last stage back to the first (its
    # boundary pp-1 -> 0 is among `wan_crossings` where those two stages sit in different DCs)
    wrap: bool = False
    wan_crossings: list[Crossing]  # every stage boundary whose tensors cross the WAN


class TemporalPlanInfo(_Doc):
    offsets_s: list[float]  # per pipeline, its start offset in the staggered plan, seconds
    stagger_s: float  # the stagger between consecutive pipelines, seconds
    transfers_planned: int  # WAN transfers the plan orders per iteration


class DelayLineDirection(_Doc):
    """A relay delay line's counters in one direction over the variant
    (testbed/emulation/delayline/stats.py)."""

    rx_frames: int  # frames the relay received
    rx_bytes: int  # bytes the relay received
    tx_frames: int  # frames the relay sent on after the delay
    tx_bytes: int  # bytes the relay sent on after the delay
    lost_frames: int  # frames dropped by the link's loss model
    lost_segments: int  # TCP segments in the frames the loss model dropped
    split_frames: int  # oversized frames split into segments before sending
    overflow_drops: int  # frames dropped because the delay line's buffer was full
    send_drops: int  # frames the relay could not send (the socket would block)
    send_errors: int  # frames whose send failed with an error
    truncated: int  # frames received cut short
    socket_drops: int  # frames the kernel dropped before the relay read them
    queue_drops: int  # frames dropped at the link's queue (its tail drops)
    loss_model: int  # frames dropped on purpose by the configured loss
    relay_drops: int  # the relay's own drops in this direction
    down_drops: int = 0
    """Frames dropped while the link was down on purpose (a `down` change or a link fault)."""


class DelayLineWindow(_Doc):
    """One WAN link's relay over the variant: its two directions by name
    (``"dc1->dc2"``), then ``relay_drops`` (the relay's own drops, both ways)."""

    model_config = ConfigDict(extra="allow")
    __pydantic_extra__: dict[str, DelayLineDirection] = Field(init=False)  # type: ignore[assignment]

    relay_drops: int  # the relay's own drops, both directions

    def _ordered(self, data: dict[str, Any]) -> dict[str, Any]:
        if "relay_drops" in data:
            data["relay_drops"] = data.pop("relay_drops")
        return data

    def directions(self) -> dict[str, DelayLineDirection]:
        return dict(self.__pydantic_extra__ or {})

    @classmethod
    def of(cls, directions: dict[str, DelayLineDirection], relay_drops: int) -> DelayLineWindow:
        return cls.model_validate({**{k: v.model_dump() for k, v in directions.items()}, "relay_drops": relay_drops})


class RealReference(_Doc):
    model_config = ConfigDict(extra="allow")  # the comparisons' descriptions and losses
    what: str  # what the reference is (the one-process run the workers are compared with)


class RealCheck(_Doc):
    """``real``: the parameters real-device workers trained, against the one-process
    reference (testbed/training/real_mode.py)."""

    device: str | list[str]  # the device(s) the stages trained on (cpu, cuda:N)
    torch_threads: int  # torch threads per worker
    seed: int  # the seed of the parameters and data
    optimizer: dict[str, Any]  # the optimizer and its settings
    iterations_trained: int  # iterations the workers trained
    note: str  # how to read the comparison
    identical: bool  # the parameters equal the reference's bit for bit
    # the largest absolute difference of any parameter from the reference's
    max_abs_param_diff: float
    within_tolerance: bool  # that difference is within the tolerance
    # identical or within tolerance: the distributed run trained what one process trains
    equivalent: bool
    reference: RealReference  # the reference's description and its losses
    losses: list[float] | None  # per iteration, the loss the workers computed
    losses_identical: bool | None  # those losses equal the reference's
    replicas: dict[str, dict[str, str]]  # per DP replica and stage, the digest of its parameters
    params_files: list[str]  # the files holding the trained parameters, relative to the run folder


class RealCheckSkipped(_Doc):
    """``real`` when the comparison could not be made: why."""

    ABSENT_UNLESS_SET = frozenset({"note"})
    error: str  # why the comparison could not be made
    note: str | None = None  # what that means for the run


class PrefillRequests(_Doc):
    arrived: int  # prefill requests that arrived over the measured iterations
    served: int  # requests whose prefill ran and whose KV cache reached its decode host
    rejected: int  # requests turned away
    # rejected requests per reason (no slot, deadline, KV check, ...)
    rejected_by_reason: dict[str, int] = Field(default_factory=dict)
    unaccounted: int = 0  # arrived requests neither served nor rejected (should be 0)


class Ttft(_Doc):
    """Time to first token of the served prefill requests, seconds (None: none served)."""

    p50: float | None  # median time to first token, seconds
    p95: float | None  # 95th percentile, seconds
    p99: float | None  # 99th percentile, seconds
    mean: float | None  # mean, seconds


class AgentCounters(_Doc):
    engine_mode: list[str]  # the prefill engine each agent ran (modelled or real)
    not_arrived: int  # requests still due when the variant ended
    chunks_run: int  # prefill chunks the agents ran
    late_starts: int  # chunks that started after their planned start
    device_busy_retries: int  # times an agent found the device taken and tried again


class PrefillService(_Doc):
    """How a +bubbletea variant's requests reached its devices (``bubbletea.dispatch``) and
    what became of them; with the controller, TTFT is measured there, from arrival to the
    last KV byte at the decode host (bubbletea_agent/controller/README.md)."""

    # how requests reached the devices: controller, shards or naive
    dispatch: Literal["controller", "shards", "naive"]
    arrived: int  # requests that arrived
    served: int  # requests served
    rejected: int  # requests rejected
    rejected_by_reason: dict[str, int] = Field(default_factory=dict)  # rejected requests per reason
    accounted: bool
    """Every request that arrived ended served or rejected with a reason (arrived == served
    + rejected, none without a reason)."""
    ttft_p50_s: float | None  # median time to first token, seconds
    ttft_p99_s: float | None  # 99th-percentile time to first token, seconds
    not_arrived: int = 0  # requests still due when the variant ended
    by_device: dict[str, int] | None = None  # controller: requests dispatched to each device
    by_origin: dict[str, int] | None = None  # controller: the scenario's source, clients over HTTP
    refused_bodies: int | None = None  # controller: client bodies refused before they were requests


class WanTailDrops(_Doc):
    with_bubbletea: int  # tail drops of the WAN queues in this +bubbletea variant
    without: int  # the same in its plain twin


class IterationTail(_Doc):
    """The tail of measured iteration times, seconds (numpy's linear percentiles)."""

    n: int  # measured iterations counted
    p50: float  # median, seconds
    p95: float  # 95th percentile, seconds
    p99: float  # 99th percentile, seconds
    max: float  # slowest, seconds


class BubbleTeaTail(_Doc):
    """A ``+bubbletea`` variant's measured iterations against its plain twin's in the same
    run: BubbleTea's promise is about the tail, not only the mean (issue 30)."""

    with_bubbletea: IterationTail  # the tail of this variant's measured iterations
    without: IterationTail  # the tail of its plain twin's
    max_ratio: float
    """Slowest iteration with BubbleTea over the slowest without."""
    p99_ratio: float  # p99 with BubbleTea over p99 without
    p95_ratio: float  # p95 with BubbleTea over p95 without
    p50_ratio: float  # median with BubbleTea over median without
    slowed_over_5pct: int
    """Measured iterations with BubbleTea longer than 1.05 x the plain twin's median."""


class AgentsCpu(_Doc):
    """How a ``+bubbletea`` variant kept BubbleTea's processes (agents, decode servers,
    controller) off the cores the training workers need (testbed/run/cpu.py,
    testbed/run/bubbletea.py): BubbleTea promises prefill in training's idle slots
    without slowing training, and on a small machine the agents' own CPU is what could."""

    cgroup: str | None
    """The agents' cgroup (None: none was made; ``how`` says why)."""
    weight: float | None
    """Its CPU weight, a fraction of a normal process's (``runner.bubbletea_cpu_weight``)."""
    idle: bool
    """The group is idle (``runner.bubbletea_cpu_idle``, cgroup ``cpu.idle`` 1): its normal
    threads run only on a core no other process wants (SCHED_IDLE)."""
    agent_nice: int
    """Nice level of the agents inside the group (orders them against the controller and
    decode servers there, not against the workers outside it)."""
    controller_nice: int
    """Nice level of the prefill service's controller inside the group."""
    decode_nice: int
    """Nice level of the decode servers inside the group."""
    realtime_holds: bool
    """The agents' device holds run at SCHED_FIFO 1 (their ends must not wait for a core)."""
    how: str
    """In words, as the run's log says it."""


class SlowdownDecomposition(_Doc):
    """Where a ``+bubbletea`` variant's training slowdown comes from, each part a
    fraction of the plain twin's iteration time (testbed/run/metrics.py
    `decompose_slowdown`). ``total = agent_overhead + prefill_interference``;
    ``network_noise`` is how far the total may sit from zero by chance alone."""

    total: float | None
    """training_slowdown: this variant's iteration time over the plain twin's, minus 1."""
    agent_overhead: float | None
    """The idle twin's iteration time (the same variant with its agents running but
    admitting nothing, ``runner.bubbletea_idle_twin``) over the plain twin's, minus 1:
    what the agents' processes cost training without any prefill. None: no idle twin."""
    prefill_interference: float | None
    """total - agent_overhead: what running prefills cost training. None: no idle twin."""
    training_waited_on_prefill: float
    """The part of the prefill interference the device timelines show directly: time
    training asked for the device while a prefill held it, per measured iteration."""
    network_noise: float
    """The plain twin's own spread: the standard deviation of its measured iterations
    over their mean."""
    noise_on_total: float | None
    """Half-width of a 95% interval of ``total`` from both variants' iteration spreads
    (1.96 x the standard error of the difference of the means, over the plain mean);
    None with fewer than two iterations."""
    # the idle twin's mean measured iteration time, seconds (None: no idle twin)
    idle_twin_iteration_time_s: float | None = None
    # the idle twin's measured iteration times, seconds
    idle_twin_iteration_times_s: list[float] = Field(default_factory=list)
    agents_cpu_cores: float | None = None
    """CPU the agents used over the measured iterations, in cores (CPU seconds over
    wall seconds; None: not read)."""
    idle_agents_cpu_cores: float | None = None
    """The same for the idle twin's agents."""
    emulator_cpu_cores: float | None = None
    """CPU the workers and decode servers used over the measured iterations, in cores."""
    cpu_weights: str | None = None
    """How the emulator's processes were kept ahead of the agents (testbed/run/cpu.py)."""
    agents_cpu: AgentsCpu | None = None
    """The same, typed: the agents' cgroup, weight, idle flag, nice levels and holds."""
    tail: BubbleTeaTail | None = None
    """p50, p95, p99 and max iteration time with and without BubbleTea (issue 30)."""


class TrainingWait(_Doc):
    """Training asked for a device while a prefill held it, and waited (device timelines)."""

    device: str  # the device (e.g. dc2-h1-p0r1)
    request: str
    """The request whose hold it was (the label's request id; a hold may run several)."""
    label: str  # the hold's label on the device's timeline
    training: str
    """The training piece that waited (its label, e.g. F3@s1)."""
    iteration: int | None
    """The measured iteration it fell in (0: the first measured one)."""
    waited_s: float  # how long training waited for the device, seconds
    held_s: float
    """How long the prefill held the device in all."""
    revoked: bool
    """Training took the device back under the lease (testbed_runtime/device.py)."""


class LeaseOverrun(_Doc):
    """A prefill hold that ended after its lease's deadline, or that training revoked
    (``<device>.overruns.jsonl``, testbed_core/device_records.py `LeaseEvent`)."""

    device: str  # the device
    request: str  # the request whose hold it was
    label: str  # the hold's label on the device's timeline
    # revoked: training took the device back; overrun: the hold ended past its deadline
    event: Literal["revoked", "overrun"]
    overrun_s: float
    """Past the lease's deadline (revoked: when training took the device back)."""
    guard_s: float  # the lease guard in force, seconds
    cause: str  # what the records say held the hold up


class GuardOverruns(_Doc):
    """How far BubbleTea's holds went past their slots, over the measured iterations."""

    guard_s: float | None
    """The lease guard: training waits at most a hold's deadline plus this."""
    worst_training_wait_s: float
    """The longest single wait of training on a prefill (0: none)."""
    worst: list[TrainingWait] = Field(default_factory=list)
    """The longest waits, longest first (at most 10)."""
    lease_revocations: int = 0  # holds training took back under the lease (warm-ups included)
    lease_overruns: list[LeaseOverrun] = Field(default_factory=list)
    """Every lease event of the variant (warm-ups included), longest first (at most 50)."""
    worst_lease_overrun_s: float = 0.0  # the longest a hold went past its deadline, seconds


class IterationStall(_Doc):
    """A measured iteration well above its variant's median, and what held it up, as far
    as the records show: the prefills training waited for (request, device, how long) and
    the transport's own signs (token timeouts, the longest WAN transfer). The verdict
    names the network only when those records show it in this iteration."""

    iteration: int  # the measured iteration (0: the first measured one)
    time_s: float  # its iteration time, seconds
    over_median_s: float  # how far above the variant's median, seconds
    waited_on_prefill_s: float  # time training waited on prefills in it, seconds
    # the prefills training waited for in it
    held_by: list[TrainingWait] = Field(default_factory=list)
    token_timeouts: int = 0  # transport token timeouts in it (a sign of the network)
    longest_wan_transfer_s: float | None = None  # its longest WAN transfer, seconds
    median_wan_transfer_s: float | None = None  # the variant's median WAN transfer, seconds
    training_overrun_s: float = 0.0
    """The longest a piece of training work of this iteration ran past its modelled time
    (the device's own record, ``overrun_s``): its worker was held up between taking the
    device and sleeping out the work (descheduled, or blocked in the file system), not
    waiting for a prefill."""
    training_overrun_at: str | None = None
    """Where that was: the device and the piece (e.g. ``dc2-h2-p1r1 F2@s1``)."""
    verdict: str  # what held the iteration up, as far as the records show


class RepeatFigures(_Doc):
    """The figures of one repeat; over the repeats, their median (or spread: max - min)."""

    iteration_time_s: float  # mean measured iteration time, seconds
    device_utilization: float  # device busy time over wall time (training and prefill)
    device_utilization_training: float  # the same counting training work only
    # +bubbletea: iteration time over the plain twin's, minus 1
    training_slowdown: float | None = None
    # +bubbletea: the idle twin's iteration time over the plain twin's, minus 1
    agent_overhead: float | None = None
    # +bubbletea: time training waited on prefill per measured iteration, seconds
    training_wait_on_prefill_s: float | None = None
    max_iteration_time_s: float | None = None  # slowest measured iteration, seconds
    p95_iteration_time_s: float | None = None  # 95th-percentile measured iteration, seconds
    # the longest single wait of training on a prefill, seconds
    worst_training_wait_s: float | None = None


class RepeatRun(RepeatFigures):
    """One repeat of a variant's measured phase (``runner.repeat``)."""

    repeat: int  # the repeat's number, from 1
    # its measured iteration times, seconds
    iteration_times_s: list[float] = Field(default_factory=list)
    folder: str
    """The repeat's files, relative to the run folder."""


class Repeats(_Doc):
    """A variant played ``runner.repeat`` times: every repeat, and per figure the median
    and the spread. The variant's other fields are its first repeat's."""

    runs: list[RepeatRun]  # every repeat, in the order played
    median: RepeatFigures  # per figure, the median over the repeats
    spread: RepeatFigures  # per figure, max - min over the repeats
    tail: IterationTail | None = None
    """Over every measured iteration of every repeat (not a median of medians)."""
    worst: RepeatFigures | None = None
    """Per figure the worst repeat's (the largest; the smallest utilization)."""


class KVChecks(_Doc):
    """The decode hosts' checks of the KV caches shipped to them (bubbletea_agent/kv_ship.py):
    every cache's xxh64 digest over the bytes that crossed (a mismatch is refused: the
    request is rejected, not served) and, with the real engine, one decode step from the
    received cache whose next token must equal the one-process reference's
    (bubbletea_agent/decode_check.py)."""

    shipped: int
    """Caches that reached a decode host (checked or refused)."""
    digest_ok: int  # caches whose digest matched
    digest_mismatches: int  # caches whose digest did not match (refused)
    decode_checked: int
    """Caches the decode step ran on (real engine; 0 for modelled caches)."""
    decode_passed: int  # decode steps whose next token equalled the reference's
    decode_failed: int  # decode steps whose next token did not
    kv_bytes: int
    """True size of the shipped caches, bytes."""
    wire_bytes: int
    """Bytes that crossed the emulated network to the decode hosts."""
    wire_scale: float | None
    """wire_bytes / kv_bytes (1: whole caches; less: the rest charged at the path's rate)."""


class BubbleTeaMetrics(_Doc):
    """What a ``+bubbletea`` variant's agents add to its entry, as
    testbed/run/bubbletea.py `bubbletea_metrics` measures them (the runner adds
    ``slowdown_decomposition`` once the plain twin ran); each field is the
    `VariantResult` field of the same name."""

    guard_overruns: GuardOverruns
    stalls: list[IterationStall]
    prefill_requests: PrefillRequests
    ttft_s: Ttft
    prefill_tokens_served: int
    guard_violations: int
    guard_violations_all_iterations: int
    training_wait_on_prefill_s: float
    training_slowdown: float | None
    compared_with_iteration_time_s: float | None
    bubbletea_agents: AgentCounters
    kv_checks: KVChecks
    prefill_service: PrefillService


BUBBLETEA_KEYS = frozenset(BubbleTeaMetrics.model_fields) | {"slowdown_decomposition"}
"""The keys a ``+bubbletea`` variant adds (testbed/run/bubbletea.py `bubbletea_metrics`,
then the runner's slowdown decomposition)."""


class ConfigurationCandidate(_Doc):
    """One configuration Atlas weighed before it ran (testbed/run/variants.py
    `_choose_configuration`): its streams per WAN channel, how it shares the links,
    where its stages go, and its calibrated a-priori prediction."""

    streams: int  # TCP streams per WAN channel
    # temporal: Atlas's temporal plan gives each WAN link's sends turns; shared: the channels share the links at once
    sharing: Literal["temporal", "shared"]
    placement: str  # its placement strategy; "(the baseline's)" where it is another variant's
    stage_dcs: list[str]  # the DC of each stage (of pipeline 0)
    # its a-priori iteration time, predicted from the calibration's rates before the variant ran, seconds
    predicted_iteration_time_s: float
    taken: bool  # the one that ran
    own: bool  # Atlas's own (its stream policy's count, the plan unless sharing is clearly faster)


class VariantResult(_Doc):
    """The entry of a variant that ran: measured, predicted, how it ran, and where its
    per-variant files are (relative to the run folder)."""

    ABSENT_UNLESS_SET = BUBBLETEA_KEYS | {"device_mode", "real", "wan_tail_drops", "training_slowdown_note",
                                          "tensors_verified", "repeats", "machine_cpu"}

    iteration_time_s: float  # mean measured iteration time, seconds (definitions.iteration_time_s)
    # the prediction made before the run, seconds (definitions.predicted_iteration_time_s)
    predicted_iteration_time_s: float
    prediction_error: float  # (measured - predicted) / predicted
    prediction: Prediction  # where the prediction's rates came from, and diagnostics
    device_utilization: float  # mean over devices of busy time over wall time, training and prefill
    device_utilization_training: float  # the same counting training work only
    bubble_fraction: float  # mean over devices of idle (no training) time over wall time
    predicted_bubble_fraction: float  # the bubble fraction the planner predicted
    wan_links: dict[str, WanLink]  # per WAN link, both directions together
    wan_directions: dict[str, WanDirection]  # per WAN link direction
    # per WAN link, the bytes the planner predicted per iteration
    predicted_wan_bytes_per_iteration: dict[str, float]
    iteration_times_s: list[float]  # every measured iteration's time, seconds
    warmup_iteration_times_s: list[float]  # the warm-up iterations' times, seconds
    tensors_verified: int | None = None
    """Modelled tensors whose every byte the receiver checked against the pattern of
    its (iteration, micro-batch, direction) (``runner.verify_tensors``); absent when off."""
    iteration_time_stdev_s: float  # standard deviation of the measured iteration times, seconds
    per_device_utilization: dict[str, float]  # per device, busy time over wall time
    # mean seconds a WAN transfer waited for its planned slot (temporal plans)
    mean_plan_wait_s: float
    mean_wan_transfer_s: float  # mean seconds from a WAN transfer's hand-over to its arrival
    streams: int  # TCP streams per channel
    # how the WAN links were shared: shared (all at once) or temporal (one transfer at a time)
    sharing: str
    sharing_requested: str  # what the scenario asked for: shared, temporal or auto
    # sharing auto: the a-priori prediction of each way, seconds (the faster ran)
    sharing_alternatives_s: dict[str, float] | None
    schedule: str | None = None
    """The pipeline schedule this variant ran (Atlas's scheduling may choose another than
    the workload's ``parallelism.schedule``, the summary's ``schedule``)."""
    schedule_alternatives_s: dict[str, float] | None = None
    """``runner.atlas_schedule: auto``: the a-priori prediction of each schedule the devices
    can hold; the fastest ran unless the configured one was within 3%."""
    schedules_refused: dict[str, str] | None = None
    """Schedules not weighed, and why (memory, interleaved stages, an unknown device)."""
    configurations: list[ConfigurationCandidate] | None = None
    """Atlas with a calibration and ``runner.atlas_sharing: auto``: every configuration it
    could run (each calibrated stream count, one included, each way of sharing, its own
    placement and the baseline's), fastest first by prediction, and which ran: the
    fastest, unless its own was predicted within 1% of it. None for other variants."""
    placement: Placement  # where the variant's stages ran
    temporal_plan: TemporalPlanInfo | None  # the temporal plan (None: links shared)
    compute_only_s: float  # the iteration time with an infinitely fast network, seconds (predicted)
    allreduce: AllReduceResult | None = None  # modelled DP all-reduce (None: dp 1, off, or real devices)
    # per WAN link, the relay delay line's counters (None: netem)
    delay_line: dict[str, DelayLineWindow] | None
    # real devices (gpu.mode: real) only
    device_mode: Literal["real"] | None = None  # real: the stages trained a real model
    # real devices: the trained parameters against the one-process reference
    real: RealCheck | RealCheckSkipped | None = None
    # +bubbletea variants only
    # +bubbletea: what became of the prefill requests
    prefill_requests: PrefillRequests | None = None
    ttft_s: Ttft | None = None  # +bubbletea: time to first token of the served requests
    prefill_tokens_served: int | None = None  # +bubbletea: prompt tokens prefilled
    # +bubbletea: holds past their deadline plus guard in the measured iterations
    guard_violations: int | None = None
    # +bubbletea: the same over every iteration, warm-ups included
    guard_violations_all_iterations: int | None = None
    # +bubbletea: time training waited on prefill per measured iteration, seconds
    training_wait_on_prefill_s: float | None = None
    # +bubbletea: iteration time over the plain twin's in the same run, minus 1
    training_slowdown: float | None = None
    # +bubbletea: the plain twin's iteration time, seconds
    compared_with_iteration_time_s: float | None = None
    bubbletea_agents: AgentCounters | None = None  # +bubbletea: the agents' counters
    # +bubbletea: how requests reached the devices and what became of them
    prefill_service: PrefillService | None = None
    # +bubbletea: the decode hosts' checks of the shipped KV caches
    kv_checks: KVChecks | None = None
    # +bubbletea: where the slowdown comes from
    slowdown_decomposition: SlowdownDecomposition | None = None
    guard_overruns: GuardOverruns | None = None  # +bubbletea: how far holds went past their slots
    # +bubbletea: measured iterations well above the median and what held them up
    stalls: list[IterationStall] | None = None
    # runner.repeat > 1: every repeat, median and spread
    repeats: Repeats | None = None
    machine_cpu: MachineCpu | None = None
    """This machine's CPU over the measured iterations, the run's and other programs'
    (absent where the run's processes are not all on this machine)."""
    # the variant's files
    timeline_csv: str
    transfers_csv: str  # every WAN transfer of the variant, relative to the run folder
    gantt_png: str  # the variant's Gantt chart, relative to the run folder
    # +bubbletea variants whose WAN lost packets (relay delay lines only)
    wan_tail_drops: WanTailDrops | None = None
    # +bubbletea: why the slowdown may be the network's (WAN loss the plain twin did not see)
    training_slowdown_note: str | None = None

    @property
    def has_bubbletea(self) -> bool:
        return "prefill_requests" in self.model_fields_set

    def headline(self, name: str) -> Any:
        """A headline figure (iteration_time_s, device_utilization, training_slowdown, ...):
        the median over the repeats when the variant was repeated, else its own."""
        if self.repeats is not None and name in RepeatFigures.model_fields:
            return getattr(self.repeats.median, name)
        return getattr(self, name)

    def goodput_mbps(self) -> float | None:
        """Total WAN goodput: the one link's, or the sum over links (None without WAN traffic)."""
        values = [link.goodput_mbps for link in self.wan_links.values() if link.goodput_mbps]
        if not values:
            return None
        return values[0] if len(values) == 1 else sum(values)

    def wan_bytes(self) -> int:
        """The pipeline's tensors on the WAN over the measured iterations."""
        return sum(link.bytes for link in self.wan_links.values())

    def allreduce_wan_bytes(self) -> int:
        """The DP all-reduce rings' bytes on the WAN over the measured iterations
        (dp-across-dc's gradients; 0 when every ring stays inside a DC)."""
        if self.allreduce is None:
            return 0
        return self.allreduce.wan_bytes_per_iteration * len(self.allreduce.measured_s)

    def tail_drops(self) -> int | None:
        """The emulated WAN queues' tail drops over the variant (relay delay lines only)."""
        if not self.delay_line:
            return None
        return sum(d.queue_drops for w in self.delay_line.values() for d in w.directions().values())


class IterationAround(_Doc):
    """One iteration near a fault: its index (warm-ups count from 0), its measured time,
    and whether it overlapped the fault."""

    iteration: int  # its index (warm-ups count from 0)
    time_s: float  # its iteration time, seconds
    overlapped: bool  # it ran while the fault lasted


class FaultRecord(_Doc):
    """A fault injected on purpose (a scenario's ``faults:``, testbed/run/faults.py) and
    what followed it in one variant's run. Times are wall-clock seconds (time.time())."""

    variant: str  # the variant the fault hit
    kind: Literal["link-down", "delay-spike", "partition", "kill-worker"]  # what was injected
    target: str
    """The WAN link (``dc1-dc2``), the DC cut off (``dc2``) or the worker (``p0r1``)."""
    description: str  # the fault in words
    planned_iteration: int
    """The iteration whose start the fault's ``at`` counts from."""
    outcome: Literal["survived", "failed", "not-reached"]
    """survived: the run finished every iteration; failed: the variant failed after it
    (``error``); not-reached: the run ended (or failed) before the fault's time."""
    started: float | None = None  # when it started (time.time())
    ended: float | None = None  # when it ended (time.time())
    iterations: list[int] = Field(default_factory=list)
    """The iterations that were running while the fault lasted."""
    around: list[IterationAround] = Field(default_factory=list)
    """The iteration before the fault, those it overlapped, and the one after."""
    recovery_s: float | None = None
    """From the fault's end to the end of the first iteration that started after it
    (None: no iteration started after it)."""
    transfers_caught: int | None = None
    """WAN transfers on the link that were under way while the fault lasted (link faults)."""
    transport_resumed_s: float | None = None
    """From the fault's end to the first transfer on the link that completed after it:
    how long the transport (TCP's retransmission back-off, the streams) took to carry
    data again (link faults; None: no transfer completed after it)."""
    caught_done_s: float | None = None
    """From the fault's end to the completion of the last transfer caught in it: how
    long the transfers it interrupted took to get through once it was over."""
    dropped_frames: int | None = None
    """Frames the delay line dropped while the link was down (TCP sends them again);
    None where unknown (netem, or not a link-down)."""
    predicted_delay_s: float | None = None
    """What the planner predicted, before the run, the fault adds to the iteration it
    starts in (testbed/run/faults.py `forecast`: a link outage and TCP's retransmission
    back-off after it); the variant's headline prediction includes it. None: not
    forecast (a delay spike, a killed worker, or a run before forecasts)."""
    forecast: str | None = None  # the forecast in words, or why there is none
    error: str | None = None  # failed: the variant's error


class VariantFailure(_Doc):
    """The entry of a variant that failed: what went wrong."""

    error: str  # what went wrong


VariantEntry = VariantResult | VariantFailure


class Summary(_Doc):
    """The whole ``summary.json`` of one `testbed run`."""

    ABSENT_UNLESS_SET = frozenset({"calibration", "duration_s", "faults"})

    scenario: str  # the scenario's name
    topology: str  # the topology's name
    workload: str  # the workload's name
    delay_backend: str | None = None  # the delay backend the WAN links used (netem or relay)
    scale: float  # workload.scale: the share of the real tensor sizes sent
    scale_note: str  # what the scale means for this run's figures
    seed: int  # the scenario's seed
    schedule: str  # the workload's pipeline schedule (gpipe, 1f1b, ...)
    parallelism: Parallelism  # the workload's parallelism
    iterations: int  # measured iterations per variant
    warmup: int  # warm-up iterations per variant (not measured)
    wire_activation_bytes: int  # bytes one boundary carries per micro-batch each way (at scale)
    # the compute model's forward time of each stage per micro-batch, seconds
    stage_forward_s: list[float]
    # the compute model's backward time of each stage per micro-batch, seconds
    stage_backward_s: list[float]
    definitions: Definitions = Field(default_factory=Definitions)  # what the headline figures mean
    runner: dict[str, Any]
    """The scenario's ``runner`` section as the run used it (ports fixed)."""
    # per variant, its result or its failure
    variants: dict[str, VariantEntry] = Field(default_factory=dict)
    calibration: CalibrationReport | None = None
    """None: not calibrated (``runner.calibrate: false``); absent: the set-up failed first."""
    duration_s: float | None = None  # the run's wall time, seconds
    faults: list[FaultRecord] = Field(default_factory=list)
    """The faults injected on purpose and what followed each (empty: none listed)."""

    def result(self, name: str) -> VariantResult | None:
        """The entry of variant `name` if it ran (None: absent or failed)."""
        entry = self.variants.get(name)
        return entry if isinstance(entry, VariantResult) else None

    def failed(self) -> list[str]:
        return [n for n, v in self.variants.items() if isinstance(v, VariantFailure)]

    def to_json(self) -> str:
        """The file's text (what `testbed run` writes)."""
        return self.model_dump_json(indent=2)


def read_summary(path: str | Path) -> Summary:
    """A run's summary.json; raises OSError, or pydantic's ValidationError naming the key."""
    return Summary.model_validate_json(Path(path).read_text())


# ---------------------------------------------------------------------------- program scenarios
#
# A scenario that names a program (testbed/run/program.py) writes a summary.json of its
# own kind: per variant (an environment set) the seconds per step its rank 0 printed,
# else the launch's wall time.


class ProgramDefinitions(_Doc):
    """What the figures of a program run mean (written into summary.json)."""

    # what seconds_per_step means
    seconds_per_step: str = (
        "median over rank 0's steps after the first `warmup` of the step_s it printed (one JSON object per line "
        "on stdout with a numeric step_s); when rank 0 printed none, the launch's wall time (source: wall)")
    # what wan_bytes means
    wan_bytes: str = "bytes the emulated WAN links carried during the launch, both directions, from their counters"


class ProgramRankResult(_Doc):
    rank: int  # the rank (RANK)
    host: str  # its emulated host
    dc: str  # its DC
    exit_code: int | None  # its exit status (None: did not end)
    wall_s: float  # its wall time, seconds
    json_lines: int
    """The JSON objects it printed on stdout."""


class ProgramVariantResult(_Doc):
    """One variant (environment set) of a program scenario."""

    env: dict[str, str]  # the variant's environment set, given to every rank
    ok: bool  # every rank exited 0
    exit_status: int | None
    """0 when every rank exited 0; else the first failing rank's status (None: never started)."""
    failure: str | None = None  # what went wrong (None: nothing)
    seconds_per_step: float
    """The headline: `step_s_median` when rank 0 printed step times, else `wall_s`."""
    # where seconds_per_step came from: rank 0's step_s lines, or the wall time
    source: Literal["step_s", "wall"]
    step_s_median: float | None  # median of rank 0's step times after the warm-up, seconds
    steps: int
    """Steps rank 0 reported (warm-up included)."""
    warmup_steps: int  # steps left out of the median
    step_times_s: list[float]  # every step time rank 0 printed, seconds
    losses: list[float] | None = None
    """Per step, the loss the first rank that printed one gave (None: no rank did)."""
    wall_s: float  # the launch's wall time, seconds
    wan_bytes: int | None  # bytes the WAN links carried, both ways (None: not counted)
    wan_bytes_by_link: dict[str, int] | None = None  # the same per link
    launch_dir: str  # the launch's folder (launch.json, rank outputs), relative to the run folder
    ranks: list[ProgramRankResult]  # every rank's exit and wall time


class ProgramSummary(_Doc):
    """``summary.json`` of a program scenario (``kind: program``)."""

    kind: Literal["program"] = "program"  # program: a program scenario's summary
    scenario: str  # the scenario's name
    topology: str  # the topology's name
    command: list[str]  # the program's command
    hosts: list[str] | None  # the hosts ranks ran on, in rank order (None: every host)
    nproc_per_host: int  # ranks per host
    warmup: int  # steps left out of seconds_per_step
    seed: int  # the scenario's seed
    delay_backend: str | None = None  # the delay backend of the WAN links
    # what the figures mean
    definitions: ProgramDefinitions = Field(default_factory=ProgramDefinitions)
    # per variant, its result or failure
    variants: dict[str, ProgramVariantResult | VariantFailure] = Field(default_factory=dict)
    duration_s: float | None = None  # the run's wall time, seconds

    def result(self, name: str) -> ProgramVariantResult | None:
        entry = self.variants.get(name)
        return entry if isinstance(entry, ProgramVariantResult) else None

    def failed(self) -> list[str]:
        return [n for n, v in self.variants.items()
                if isinstance(v, VariantFailure) or (isinstance(v, ProgramVariantResult) and not v.ok)]

    def to_json(self) -> str:
        return self.model_dump_json(indent=2)


def is_program_summary(text: str) -> bool:
    """Whether a summary.json's text is a program scenario's (``"kind": "program"``)."""
    import json

    try:
        data = json.loads(text)
    except ValueError:
        return False
    return isinstance(data, dict) and data.get("kind") == "program"
