"""The job file of a worker process (``python -m testbed.training.worker JOB.json``).

The runner (testbed/run/jobs.py for training workers, testbed/run/calibration.py for
probes) builds one of these models per process and writes it with `model_dump_json`;
the worker reads it back with `model_validate_json` through the same model
(`WORKER_JOB`, which picks the model from ``role``). A training job states every
setting: its fields have no defaults, so the worker runs what the runner decided and
never substitutes a value of its own. Optional parts are ``None`` where they do not
apply (no temporal plan, no BubbleTea, a modelled device).

The shared secret of the channels never appears here: it comes from the environment
(ATLAS_SECRET).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from testbed_core.workload import RealOptimizer, Workload

Port = Annotated[int, Field(ge=1, le=65535)]
Streams = Annotated[int, Field(ge=1, le=64)]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TransportJob(_Model):
    """The atlas_transport settings of every channel a worker or probe opens (the
    scenario's ``transport`` section, testbed/run/common.py `transport_job`)."""

    chunk_bytes: int = Field(ge=1)
    congestion: str | None  # TCP congestion control per stream; None: the system's default
    pacing_rate_mbps: float | None = Field(gt=0)  # per stream (SO_MAX_PACING_RATE); None: unpaced
    connect_timeout_s: float = Field(gt=0)


class ChannelJob(_Model):
    """One pipeline boundary channel of a worker. The downstream worker (stage b+1)
    listens, the upstream one (stage b) connects."""

    boundary: int = Field(ge=0)
    role: Literal["listen", "connect"]
    peer: str
    peer_ip: str
    port: Port
    streams: Streams
    links: list[str]  # WAN link directions ("dc1->dc2") of this worker's *sends* on the channel
    recv_links: list[str]  # ... and of what it receives on it (empty inside a DC)
    latency_s: float = Field(ge=0)  # the path's one-way delay
    # per stream, the most this end advertises as receive window (TCP_WINDOW_CLAMP; the
    # run's cap on shared multi-stream channels, testbed/run/pacing.py `window_caps`); None: the buffers'
    window_clamp: int | None = Field(None, gt=0)


class PlannedSend(_Model):
    """A WAN send of this worker under Atlas's temporal plan
    (testbed/training/transport_comm.py `Planned`)."""

    direction: Literal["fwd", "bwd"]
    boundary: int = Field(ge=0)
    mb: int = Field(ge=0)
    start_s: float  # planned slot start, seconds after the iteration's common start
    duration_s: float = Field(ge=0)  # planned time on the wire
    tokens: list[tuple[str, int]]  # (link direction, position in its planned order)
    next: list[tuple[str, int, str]]  # (link direction, position, worker) of the next transfer


class TokenBusJob(_Model):
    """Where this sender hears token announcements (UDP on its host) and where the
    other senders sharing its links hear them (worker -> (ip, port))."""

    port: Port
    peers: dict[str, tuple[str, int]]


class TemporalJob(_Model):
    """Atlas's temporal plan as one sender sees it: how it is enforced (``token``:
    wait for the previous transfer on each link, or at most `token_timeout_s`;
    ``slot``: wait for the planned start), this worker's planned sends in start
    order, and its token bus (token mode only)."""

    mode: Literal["token", "slot"]
    token_timeout_s: float = Field(gt=0)
    sends: list[PlannedSend] = Field(min_length=1)
    token_bus: TokenBusJob | None


class DeviceJob(_Model):
    """The worker's emulated GPU (`testbed_runtime.device.Device`): shared through the run
    directory with a BubbleTea agent on the same host."""

    name: str
    run_dir: str
    mode: Literal["modelled", "real"]
    time_scale: float = Field(gt=0)
    torch_device: str | None  # real mode: where torch work runs ("cpu", "cuda"); None when modelled


class DpPeerJob(_Model):
    """A channel to the worker of the same stages in another pipeline (DP replica), for
    the gradient average. The lower DP rank listens, the higher one connects."""

    dp_rank: int = Field(ge=0)
    peer: str
    peer_ip: str
    port: Port
    role: Literal["listen", "connect"]
    streams: Streams


class RealJob(_Model):
    """Real-device training of this worker's stages (testbed/training/real_mode.py)."""

    workload: Workload  # the run's workload: the model, its parallelism, its optimizer
    stages: list[int] = Field(min_length=1)  # the (virtual) stages this worker holds
    dp_rank: int = Field(ge=0)
    seed: int = Field(ge=0)
    optimizer: RealOptimizer
    torch_device: str
    threads: int = Field(ge=1)
    out: str  # where the parameters and losses are saved at the end (torch.save)


class DpSyncJob(_Model):
    """The data-parallel gradient all-reduce of this worker's stages with the workers of
    the same stages in the other pipelines, after each iteration's last backward, over
    one atlas_transport channel per pair of replicas (`peers`; the ring uses those to
    its neighbours). Modelled devices send placeholder bytes: a ring all-reduce
    (reduce-scatter, then all-gather: 2(dp-1) steps of ``grad_bytes / dp`` to the next
    replica) in buckets of ``bucket_bytes``. Real devices average their real gradients
    (testbed/training/real_work.py `PeerGradSync`)."""

    dp_rank: int = Field(ge=0)
    dp: int = Field(ge=2)
    peers: list[DpPeerJob] = Field(min_length=1)
    grad_bytes: int = Field(ge=1)  # this worker's gradients on the wire: parameters x dtype bytes x scale
    bucket_bytes: int = Field(ge=1)


class GlooJob(_Model):
    """The ``torch-gloo`` variant's network (testbed/training/gloo_comm.py): one
    torch.distributed process group (gloo) of every worker instead of atlas_transport
    channels; the store listens on the first worker's host."""

    store_ip: str
    port: Port
    rank: int = Field(ge=0)  # this worker's rank in the group
    own_ip: str  # this worker's address: gloo binds to the interface that has it
    world_size: int = Field(ge=2)
    peers: dict[int, int]  # boundary -> the rank across it
    dp_groups: list[list[int]]  # every stage's DP group, in the order each worker creates them
    dp_group: int = Field(ge=0)  # which of them is this worker's


class LiveJob(_Model):
    """BubbleTea's live status of this worker's device (testbed_runtime/live.py): the
    earliest time training can want the device again, kept true as the worker waits."""

    status_path: str
    wake_path: str
    lead_s: float = Field(gt=0, description="the runner's iteration lead (barrier to next start)")
    # boundary -> nominal rate (bits/s) of the slowest shaped link a tensor received on it
    # crosses (0: none known, e.g. local mode)
    recv_rate_bps: dict[int, float]
    slack_bytes: int = Field(ge=0, description="shaper burst: bytes that may pass it at once")
    poll_s: float = Field(gt=0, description="how often a waiting worker refreshes its bound")


class TrainJob(_Model):
    """One training worker: a (pipeline, rank) on its host."""

    role: Literal["train"]
    # who and where
    worker: str
    pipeline: int = Field(ge=0)
    rank: int = Field(ge=0)
    host: str
    bind_ip: str
    # what it computes: the schedule and the modelled stage times
    schedule: str
    pp: int = Field(ge=1)
    microbatches: int = Field(ge=1)
    chunks: int = Field(ge=1)
    forward_s: list[float]
    backward_s: list[float]
    wire_bytes: int = Field(ge=1)
    iterations: int = Field(ge=1, description="all iterations, warm-up included")
    offset_s: float = Field(ge=0)  # its pipeline's planned start after each common start
    # how its tensors travel
    channels: list[ChannelJob]
    transport: TransportJob
    temporal: TemporalJob | None  # None: no planned sends (no plan, or nothing of this worker crosses a WAN)
    # the device, the runner, the records
    device: DeviceJob
    control: str  # the runner's control socket (a UNIX socket path)
    transfers_path: str
    setup_timeout_s: float = Field(gt=0)
    timeout_s: float = Field(gt=0)
    # BubbleTea: planned idle slots and the live status (None: no agent next to it)
    slots_path: str | None
    idle_slots: list[tuple[float, float]]  # planned idle gaps, seconds after the iteration start
    live: LiveJob | None
    real: RealJob | None  # real-device training (None: modelled work)
    dp: DpSyncJob | None  # the DP gradient all-reduce (None: dp 1, or runner.dp_allreduce off)
    verify_tensors: bool = False  # modelled sends carry a per-transfer pattern the receiver checks (faults)
    gloo: GlooJob | None  # torch-gloo: torch.distributed instead of atlas_transport (None: atlas_transport)


class ProbeJob(_Model):
    """One end of a calibration probe: times `count` tensors over one channel."""

    role: Literal["probe-send", "probe-recv"]
    name: str
    bind_ip: str = "0.0.0.0"
    peer_ip: str = ""
    port: Port
    streams: Streams
    nbytes: int = Field(ge=1)
    count: int = Field(ge=1)
    gap_s: float = Field(0.0, ge=0)
    start_at: float | None = None  # wall-clock instant to send the first tensor
    period_s: float | None = Field(None, gt=0, description="send tensor k at start_at + k x period (rounds)")
    wait_go: bool = Field(False, description="once connected, print 'connected' and read 'go <start_at>' on stdin")
    warmup_bytes: int = Field(0, ge=0, description="one untimed tensor of this size first: opens the TCP windows")
    untimed: int = Field(0, ge=0, description="the first tensors, which the runner does not time (the run's warm-up "
                                              "iterations' tensors on its channels)")
    untimed_at_once: int = Field(1, ge=1, description="the untimed tensors handed over this many at once, the next "
                                                      "group once the last is confirmed, as the run's schedule hands "
                                                      "its channels several at once (testbed/run/pacing.py "
                                                      "tensors_at_once); the timed ones one at a time")
    window_clamp: int | None = Field(None, gt=0, description="per stream, the most this end advertises as receive "
                                                             "window (TCP_WINDOW_CLAMP), as the run clamps the "
                                                             "channels it times (ChannelJob.window_clamp); None: "
                                                             "the buffers'")
    duplex: bool = Field(False, description="the receiver sends a tensor of the same size back over the same channel "
                                            "as each arrives, as a run's boundary channel carries activations one way "
                                            "and gradients the other: both ways timed")
    verify: bool = Field(False, description="the tensor checks of runner.verify_tensors, timed: the sender fills "
                                            "each tensor with the training's pattern, the receiver checks every byte")
    out: str
    transport: TransportJob
    timeout_s: float = Field(60.0, gt=0)


class RingProbeJob(_Model):
    """One replica of a calibration ring: the DP all-reduce of the training workers
    (testbed/training/allreduce.py) between two hosts, `count` times, each timed."""

    role: Literal["probe-ring"]
    name: str
    channel: Literal["listen", "connect"]  # this end of the one channel between the two replicas
    bind_ip: str
    peer_ip: str
    port: Port
    streams: Streams
    dp_rank: int = Field(ge=0, le=1)
    grad_bytes: int = Field(ge=1)
    bucket_bytes: int = Field(ge=1)
    count: int = Field(ge=1)
    out: str
    transport: TransportJob
    timeout_s: float = Field(gt=0)


WorkerJob = Annotated[TrainJob | ProbeJob | RingProbeJob, Field(discriminator="role")]
WORKER_JOB: TypeAdapter[TrainJob | ProbeJob | RingProbeJob] = TypeAdapter(WorkerJob)
