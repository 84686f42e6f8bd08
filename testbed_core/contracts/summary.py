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
    dp: int
    pp: int
    tp: int
    micro_batch: int
    num_micro_batches: int


class Definitions(_Doc):
    """What the headline figures mean, written into every summary so that the file
    explains itself."""

    iteration_time_s: str = (
        "mean over measured iterations (after warm-up) of: common start -> last training work of any device ends "
        "(or, with dp > 1, the last worker's DP gradient all-reduce ends, where that is later); iterations are "
        "separated by a barrier")
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
    device_utilization: str = "mean over devices of busy time / wall time of the measured iterations"
    bubble_fraction: str = "mean over devices of idle (no training work) / wall time of the measured iterations"
    wan_links: str = ("bytes of the measured iterations; goodput = bytes / time the link had a transfer on the wire "
                      "(both directions)")


DEFINITIONS = Definitions()


# ------------------------------------------------------------------ one variant's parts


class PathRatesUsed(_Doc):
    """``prediction.calibrated_paths[]``: one WAN path the variant crosses, as its
    prediction saw it (the calibration's figures of that path for the variant's streams)."""

    dcs: tuple[str, str]
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

    rates_from: str
    warmup_channel_rate_mbps: float | None
    warmup_transfers_counted: str | None
    with_warmup_rates_iteration_time_s: float | None
    calibrated_channel_rate_mbps: float | None
    calibrated_colliding_aggregate_mbps: float | None
    warmup_colliding_aggregate_mbps: float | None
    warmup_colliding_transfers: int | None
    a_priori_iteration_time_s: float
    a_priori_error: float
    measured_stage_forward_s: list[float] | None
    measured_stage_backward_s: list[float] | None
    measured_overhead_s: float | None
    calibrated_paths: list[PathRatesUsed] | None = None  # each WAN path's own figures (per-path calibration)


class AllReduceResult(_Doc):
    """``allreduce``: the DP gradient all-reduce of modelled workers (a ring over the
    network after each iteration's last backward)."""

    measured_s: list[float]  # per measured iteration: the slowest worker's ring
    mean_s: float
    predicted_added_s: float  # what the a-priori prediction adds after the pipeline for it
    wan_bytes_per_iteration: int  # what the rings send across WAN links (0: every ring inside a DC)


class WanDirection(_Doc):
    """One direction of a WAN link over the measured iterations."""

    bytes: int
    transfers: int
    busy_s: float
    goodput_mbps: float | None
    mean_throughput_mbps: float | None


class WanLink(WanDirection):
    """A WAN link, both directions together; goodput is comparable to the link's rate."""

    directions: list[str]


class Crossing(_Doc):
    boundary: int
    src: str
    dst: str
    path: list[str]
    pipelines: list[int]


class Placement(_Doc):
    """Where the variant's stages ran: DC per (pipeline, stage), hosts per ``p<d>s<s>``."""

    strategy: str
    pp: int
    dp: int
    tp: int
    free_gpus: dict[str, int]
    used_gpus: dict[str, int]
    stage_dc: list[list[str]]
    hosts: dict[str, list[str]]
    wan_crossings: list[Crossing]


class TemporalPlanInfo(_Doc):
    offsets_s: list[float]
    stagger_s: float
    transfers_planned: int


class DelayLineDirection(_Doc):
    """A relay delay line's counters in one direction over the variant
    (testbed/emulation/delayline/stats.py)."""

    rx_frames: int
    rx_bytes: int
    tx_frames: int
    tx_bytes: int
    lost_frames: int
    lost_segments: int
    split_frames: int
    overflow_drops: int
    send_drops: int
    send_errors: int
    truncated: int
    socket_drops: int
    queue_drops: int
    loss_model: int
    relay_drops: int
    down_drops: int = 0
    """Frames dropped while the link was down on purpose (a `down` change or a link fault)."""


class DelayLineWindow(_Doc):
    """One WAN link's relay over the variant: its two directions by name
    (``"dc1->dc2"``), then ``relay_drops`` (the relay's own drops, both ways)."""

    model_config = ConfigDict(extra="allow")
    __pydantic_extra__: dict[str, DelayLineDirection] = Field(init=False)  # type: ignore[assignment]

    relay_drops: int

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
    what: str


class RealCheck(_Doc):
    """``real``: the parameters real-device workers trained, against the one-process
    reference (testbed/training/real_mode.py)."""

    device: str | list[str]
    torch_threads: int
    seed: int
    optimizer: dict[str, Any]
    iterations_trained: int
    note: str
    identical: bool
    max_abs_param_diff: float
    within_tolerance: bool
    equivalent: bool
    reference: RealReference
    losses: list[float] | None
    losses_identical: bool | None
    replicas: dict[str, dict[str, str]]
    params_files: list[str]


class RealCheckSkipped(_Doc):
    """``real`` when the comparison could not be made: why."""

    ABSENT_UNLESS_SET = frozenset({"note"})
    error: str
    note: str | None = None


class PrefillRequests(_Doc):
    arrived: int
    served: int
    rejected: int
    rejected_by_reason: dict[str, int] = Field(default_factory=dict)
    unaccounted: int = 0


class Ttft(_Doc):
    """Time to first token of the served prefill requests, seconds (None: none served)."""

    p50: float | None
    p95: float | None
    p99: float | None
    mean: float | None


class AgentCounters(_Doc):
    engine_mode: list[str]
    not_arrived: int
    chunks_run: int
    late_starts: int
    device_busy_retries: int


class PrefillService(_Doc):
    """How a +bubbletea variant's requests reached its devices (``bubbletea.dispatch``) and
    what became of them; with the controller, TTFT is measured there, from arrival to the
    last KV byte at the decode host (bubbletea_agent/controller/README.md)."""

    dispatch: Literal["controller", "shards", "naive"]
    arrived: int
    served: int
    rejected: int
    rejected_by_reason: dict[str, int] = Field(default_factory=dict)
    accounted: bool
    """Every request that arrived ended served or rejected with a reason (arrived == served
    + rejected, none without a reason)."""
    ttft_p50_s: float | None
    ttft_p99_s: float | None
    not_arrived: int = 0
    by_device: dict[str, int] | None = None  # controller: requests dispatched to each device
    by_origin: dict[str, int] | None = None  # controller: the scenario's source, clients over HTTP
    refused_bodies: int | None = None  # controller: client bodies refused before they were requests


class WanTailDrops(_Doc):
    with_bubbletea: int
    without: int


class IterationTail(_Doc):
    """The tail of measured iteration times, seconds (numpy's linear percentiles)."""

    n: int
    p50: float
    p95: float
    p99: float
    max: float


class BubbleTeaTail(_Doc):
    """A ``+bubbletea`` variant's measured iterations against its plain twin's in the same
    run: BubbleTea's promise is about the tail, not only the mean (issue 30)."""

    with_bubbletea: IterationTail
    without: IterationTail
    max_ratio: float
    """Slowest iteration with BubbleTea over the slowest without."""
    p99_ratio: float
    p95_ratio: float
    p50_ratio: float
    slowed_over_5pct: int
    """Measured iterations with BubbleTea longer than 1.05 x the plain twin's median."""


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
    idle_twin_iteration_time_s: float | None = None
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
    tail: BubbleTeaTail | None = None
    """p50, p95, p99 and max iteration time with and without BubbleTea (issue 30)."""


class TrainingWait(_Doc):
    """Training asked for a device while a prefill held it, and waited (device timelines)."""

    device: str
    request: str
    """The request whose hold it was (the label's request id; a hold may run several)."""
    label: str
    training: str
    """The training piece that waited (its label, e.g. F3@s1)."""
    iteration: int | None
    """The measured iteration it fell in (0: the first measured one)."""
    waited_s: float
    held_s: float
    """How long the prefill held the device in all."""
    revoked: bool
    """Training took the device back under the lease (testbed_runtime/device.py)."""


class LeaseOverrun(_Doc):
    """A prefill hold that ended after its lease's deadline, or that training revoked
    (``<device>.overruns.jsonl``, testbed_core/device_records.py `LeaseEvent`)."""

    device: str
    request: str
    label: str
    event: Literal["revoked", "overrun"]
    overrun_s: float
    """Past the lease's deadline (revoked: when training took the device back)."""
    guard_s: float
    cause: str


class GuardOverruns(_Doc):
    """How far BubbleTea's holds went past their slots, over the measured iterations."""

    guard_s: float | None
    """The lease guard: training waits at most a hold's deadline plus this."""
    worst_training_wait_s: float
    """The longest single wait of training on a prefill (0: none)."""
    worst: list[TrainingWait] = Field(default_factory=list)
    """The longest waits, longest first (at most 10)."""
    lease_revocations: int = 0
    lease_overruns: list[LeaseOverrun] = Field(default_factory=list)
    """Every lease event of the variant (warm-ups included), longest first (at most 50)."""
    worst_lease_overrun_s: float = 0.0


class IterationStall(_Doc):
    """A measured iteration well above its variant's median, and what held it up, as far
    as the records show: the prefills training waited for (request, device, how long) and
    the transport's own signs (token timeouts, the longest WAN transfer). The verdict
    names the network only when those records show it in this iteration."""

    iteration: int
    time_s: float
    over_median_s: float
    waited_on_prefill_s: float
    held_by: list[TrainingWait] = Field(default_factory=list)
    token_timeouts: int = 0
    longest_wan_transfer_s: float | None = None
    median_wan_transfer_s: float | None = None
    training_overrun_s: float = 0.0
    """The longest a piece of training work of this iteration ran past its modelled time
    (the device's own record, ``overrun_s``): its worker was held up between taking the
    device and sleeping out the work (descheduled, or blocked in the file system), not
    waiting for a prefill."""
    training_overrun_at: str | None = None
    """Where that was: the device and the piece (e.g. ``dc2-h2-p1r1 F2@s1``)."""
    verdict: str


class RepeatFigures(_Doc):
    """The figures of one repeat; over the repeats, their median (or spread: max - min)."""

    iteration_time_s: float
    device_utilization: float
    device_utilization_training: float
    training_slowdown: float | None = None
    agent_overhead: float | None = None
    training_wait_on_prefill_s: float | None = None
    max_iteration_time_s: float | None = None
    p95_iteration_time_s: float | None = None
    worst_training_wait_s: float | None = None


class RepeatRun(RepeatFigures):
    """One repeat of a variant's measured phase (``runner.repeat``)."""

    repeat: int
    iteration_times_s: list[float] = Field(default_factory=list)
    folder: str
    """The repeat's files, relative to the run folder."""


class Repeats(_Doc):
    """A variant played ``runner.repeat`` times: every repeat, and per figure the median
    and the spread. The variant's other fields are its first repeat's."""

    runs: list[RepeatRun]
    median: RepeatFigures
    spread: RepeatFigures
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
    digest_ok: int
    digest_mismatches: int
    decode_checked: int
    """Caches the decode step ran on (real engine; 0 for modelled caches)."""
    decode_passed: int
    decode_failed: int
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


class VariantResult(_Doc):
    """The entry of a variant that ran: measured, predicted, how it ran, and where its
    per-variant files are (relative to the run folder)."""

    ABSENT_UNLESS_SET = BUBBLETEA_KEYS | {"device_mode", "real", "wan_tail_drops", "training_slowdown_note",
                                          "tensors_verified", "repeats"}

    iteration_time_s: float
    predicted_iteration_time_s: float
    prediction_error: float
    prediction: Prediction
    device_utilization: float
    device_utilization_training: float
    bubble_fraction: float
    predicted_bubble_fraction: float
    wan_links: dict[str, WanLink]
    wan_directions: dict[str, WanDirection]
    predicted_wan_bytes_per_iteration: dict[str, float]
    iteration_times_s: list[float]
    warmup_iteration_times_s: list[float]
    tensors_verified: int | None = None
    """Modelled tensors whose every byte the receiver checked against the pattern of
    its (iteration, micro-batch, direction) (``runner.verify_tensors``); absent when off."""
    iteration_time_stdev_s: float
    per_device_utilization: dict[str, float]
    mean_plan_wait_s: float
    mean_wan_transfer_s: float
    streams: int
    sharing: str
    sharing_requested: str
    sharing_alternatives_s: dict[str, float] | None
    schedule: str | None = None
    """The pipeline schedule this variant ran (Atlas's scheduling may choose another than
    the workload's ``parallelism.schedule``, the summary's ``schedule``)."""
    schedule_alternatives_s: dict[str, float] | None = None
    """``runner.atlas_schedule: auto``: the a-priori prediction of each schedule the devices
    can hold; the fastest ran unless the configured one was within 3%."""
    schedules_refused: dict[str, str] | None = None
    """Schedules not weighed, and why (memory, interleaved stages, an unknown device)."""
    placement: Placement
    temporal_plan: TemporalPlanInfo | None
    compute_only_s: float
    allreduce: AllReduceResult | None = None  # modelled DP all-reduce (None: dp 1, off, or real devices)
    delay_line: dict[str, DelayLineWindow] | None
    # real devices (gpu.mode: real) only
    device_mode: Literal["real"] | None = None
    real: RealCheck | RealCheckSkipped | None = None
    # +bubbletea variants only
    prefill_requests: PrefillRequests | None = None
    ttft_s: Ttft | None = None
    prefill_tokens_served: int | None = None
    guard_violations: int | None = None
    guard_violations_all_iterations: int | None = None
    training_wait_on_prefill_s: float | None = None
    training_slowdown: float | None = None
    compared_with_iteration_time_s: float | None = None
    bubbletea_agents: AgentCounters | None = None
    prefill_service: PrefillService | None = None
    kv_checks: KVChecks | None = None
    slowdown_decomposition: SlowdownDecomposition | None = None
    guard_overruns: GuardOverruns | None = None
    stalls: list[IterationStall] | None = None
    # runner.repeat > 1: every repeat, median and spread
    repeats: Repeats | None = None
    # the variant's files
    timeline_csv: str
    transfers_csv: str
    gantt_png: str
    # +bubbletea variants whose WAN lost packets (relay delay lines only)
    wan_tail_drops: WanTailDrops | None = None
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

    iteration: int
    time_s: float
    overlapped: bool


class FaultRecord(_Doc):
    """A fault injected on purpose (a scenario's ``faults:``, testbed/run/faults.py) and
    what followed it in one variant's run. Times are wall-clock seconds (time.time())."""

    variant: str
    kind: Literal["link-down", "delay-spike", "partition", "kill-worker"]
    target: str
    """The WAN link (``dc1-dc2``), the DC cut off (``dc2``) or the worker (``p0r1``)."""
    description: str
    planned_iteration: int
    """The iteration whose start the fault's ``at`` counts from."""
    outcome: Literal["survived", "failed", "not-reached"]
    """survived: the run finished every iteration; failed: the variant failed after it
    (``error``); not-reached: the run ended (or failed) before the fault's time."""
    started: float | None = None
    ended: float | None = None
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
    error: str | None = None


class VariantFailure(_Doc):
    """The entry of a variant that failed: what went wrong."""

    error: str


VariantEntry = VariantResult | VariantFailure


class Summary(_Doc):
    """The whole ``summary.json`` of one `testbed run`."""

    ABSENT_UNLESS_SET = frozenset({"calibration", "duration_s", "faults"})

    scenario: str
    topology: str
    workload: str
    delay_backend: str | None = None
    scale: float
    scale_note: str
    seed: int
    schedule: str
    parallelism: Parallelism
    iterations: int
    warmup: int
    wire_activation_bytes: int
    stage_forward_s: list[float]
    stage_backward_s: list[float]
    definitions: Definitions = Field(default_factory=Definitions)
    runner: dict[str, Any]
    """The scenario's ``runner`` section as the run used it (ports fixed)."""
    variants: dict[str, VariantEntry] = Field(default_factory=dict)
    calibration: CalibrationReport | None = None
    """None: not calibrated (``runner.calibrate: false``); absent: the set-up failed first."""
    duration_s: float | None = None
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

    seconds_per_step: str = (
        "median over rank 0's steps after the first `warmup` of the step_s it printed (one JSON object per line "
        "on stdout with a numeric step_s); when rank 0 printed none, the launch's wall time (source: wall)")
    wan_bytes: str = "bytes the emulated WAN links carried during the launch, both directions, from their counters"


class ProgramRankResult(_Doc):
    rank: int
    host: str
    dc: str
    exit_code: int | None
    wall_s: float
    json_lines: int
    """The JSON objects it printed on stdout."""


class ProgramVariantResult(_Doc):
    """One variant (environment set) of a program scenario."""

    env: dict[str, str]
    ok: bool
    exit_status: int | None
    """0 when every rank exited 0; else the first failing rank's status (None: never started)."""
    failure: str | None = None
    seconds_per_step: float
    """The headline: `step_s_median` when rank 0 printed step times, else `wall_s`."""
    source: Literal["step_s", "wall"]
    step_s_median: float | None
    steps: int
    """Steps rank 0 reported (warm-up included)."""
    warmup_steps: int
    step_times_s: list[float]
    losses: list[float] | None = None
    """Per step, the loss the first rank that printed one gave (None: no rank did)."""
    wall_s: float
    wan_bytes: int | None
    wan_bytes_by_link: dict[str, int] | None = None
    launch_dir: str
    ranks: list[ProgramRankResult]


class ProgramSummary(_Doc):
    """``summary.json`` of a program scenario (``kind: program``)."""

    kind: Literal["program"] = "program"
    scenario: str
    topology: str
    command: list[str]
    hosts: list[str] | None
    nproc_per_host: int
    warmup: int
    seed: int
    delay_backend: str | None = None
    definitions: ProgramDefinitions = Field(default_factory=ProgramDefinitions)
    variants: dict[str, ProgramVariantResult | VariantFailure] = Field(default_factory=dict)
    duration_s: float | None = None

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
