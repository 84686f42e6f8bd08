"""The agent's configuration file (YAML or JSON), validated once at the edge, and the
mapping from a scenario's `bubbletea:` section to one agent's configuration.

Example (one agent next to worker dc0-h1)::

    owner: bubbletea-dc0-h1
    device: {name: dc0-h1-gpu0, run_dir: results/run1, mode: modelled, gpu: H100, efficiency: 0.5}
    slots: results/run1/slots/dc0-h1.jsonl
    out_dir: results/run1/bubbletea/dc0-h1
    epoch: 1718000000.0           # time.time() of request time zero, the same for every agent
    model: {preset: llama-3-8b}
    requests: {kind: poisson, rate_per_s: 20, duration_s: 60, deadline_s: 5,
               lengths: {kind: lognormal, mean: 512, sigma: 0.6, min: 16, max: 4096},
               shard_index: 0, shard_count: 4}
    admission: {chunking: true}
    guard: {initial_rel: 0.05}
    decode: {host: 10.0.2.1, port: 7070, streams: 4}
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from bubbletea_agent.admission import AdmissionConfig, GuardConfig
from bubbletea_agent.latency import DEFAULT_PROFILE_LENGTHS
from bubbletea_agent.requests import (
    FixedLength,
    LogNormalLength,
    PoissonSource,
    RequestSourceConfig,
    TraceSource,
    UniformLength,
)
from testbed_core.configfile import read_text
from testbed_core.contracts.bubbletea import (
    BubbleTeaSettings,
    ControllerAddress,
    KVDestination,
    LivePaths,
    PrefillModelSpec,
)


class AgentConfigError(ValueError):
    """An agent configuration that cannot be used; names the file and field."""


class _M(BaseModel):
    model_config = ConfigDict(extra="forbid")


class DeviceConfig(_M):
    """Which device to share with the training worker (testbed_runtime.device.Device)."""

    name: str
    run_dir: Path
    mode: Literal["modelled", "real"] = "modelled"
    gpu: str = "H100"  # the compute model's GPU (modelled mode): must match the worker's
    peak_tflops: float | None = Field(default=None, gt=0)  # gpu "custom": dense peak
    memory_bandwidth_gbs: float | None = Field(default=None, gt=0)  # gpu "custom"
    efficiency: float = Field(default=0.5, gt=0, le=1)
    tp: int = Field(default=1, ge=1)
    profile: Path | None = None  # measured op times (compute_model.load_profile)
    time_scale: float | None = Field(default=None, gt=0)  # None: TESTBED_TIME_SCALE or 1
    torch_device: str = "auto"  # real mode: "cuda", "cpu" or "auto"
    cpu_threads: int = Field(default=1, ge=1)  # real mode on CPU: torch threads (cores are shared)


class TrackerConfig(_M):
    quantile: float = Field(default=0.9, gt=0, le=1)
    window: int = Field(default=32, ge=1)
    min_gap_s: float = Field(default=0.0005, ge=0)


class DecodeConfig(_M):
    """The decode host that receives KV caches over atlas_transport."""

    host: str
    port: int = Field(default=7070, ge=1, le=65535)
    streams: int | Literal["auto"] = 4
    secret: str | None = None  # None: the ATLAS_SECRET environment variable
    shared_clock: bool = True  # both hosts read the same time.time() (true in the testbed)
    pad_to_logical: bool = True  # scaled-down caches: still put the true size on the wire
    connect_timeout_s: float = Field(default=10.0, gt=0)
    # the part of a cache that does not cross the wire (true size x (1 - wire scale)) is
    # charged at this rate (bits/s) on a modelled link queue: TTFT as if the whole cache
    # had crossed a link of this rate (None: nothing charged)
    rest_rate_bps: float | None = Field(default=None, gt=0)
    # pace shipping to at most this many bits/s on the wire (None: as fast as it goes)
    max_rate_bps: float | None = Field(default=None, gt=0)


class LiveConfig(_M):
    """The training worker's live status (testbed_runtime/live.py)."""

    status: Path  # the worker's status record
    wake: Path | None = None  # FIFO the worker pokes on every state change
    gate: Path | None = None  # the runner's gate record (between iterations)


class ProfileConfig(_M):
    """Real devices: prompt lengths timed at start to fit the latency curve."""

    lengths: list[int] = Field(default_factory=lambda: list(DEFAULT_PROFILE_LENGTHS), min_length=2)
    repeats: int = Field(default=3, ge=1)
    timeout_s: float = Field(default=120.0, gt=0)


class AgentConfig(_M):
    owner: str = "bubbletea"
    device: DeviceConfig
    slots: Path
    out_dir: Path
    epoch: float | None = None  # time.time() of request time zero; None: when the first slot is announced
    model: PrefillModelSpec = Field(default_factory=PrefillModelSpec)
    requests: RequestSourceConfig
    admission: AdmissionConfig = Field(default_factory=AdmissionConfig)
    guard: GuardConfig = Field(default_factory=GuardConfig)
    tracker: TrackerConfig = Field(default_factory=TrackerConfig)
    decode: DecodeConfig | None = None
    live: LiveConfig | None = None
    # which windows admission may fill: "planned" (published slots, corrected from the
    # timeline), "live" (the worker's live guarantees: never delays training), "both"
    # "naive": colocation, no bubbles: a whole chunk whenever the device is free, no guard
    window: Literal["planned", "live", "both", "naive"] = "planned"
    # requests stop arriving `arrivals_margin_s` before the planned end of iteration N (the
    # last one), so that each can still be served (None: until duration_s)
    arrivals_until_iteration: int | None = Field(default=None, ge=0)
    arrivals_margin_s: float = Field(default=0.5, ge=0)
    profile: ProfileConfig = Field(default_factory=ProfileConfig)
    materialise_limit_bytes: int = Field(default=64 << 20, ge=1)
    # modelled KV caches on the wire: true size x this (the workload's `scale`, so a KV
    # cache crosses the emulated WAN in the time the real one would take on the real link)
    kv_wire_scale: float = Field(default=1.0, gt=0, le=1)
    poll_s: float = Field(default=0.002, gt=0)
    idle_poll_s: float = Field(default=0.05, gt=0)
    settle_s: float = Field(default=0.002, ge=0)  # see Agent._settling
    # CPU priority of the agent process (os.setpriority; negative needs root). On an
    # emulated GPU the end of a prefill is the agent waking from a sleep: under CPU
    # contention a late wake-up would hold the device past its window and delay training.
    nice: int | None = Field(default=None, ge=-20, le=19)
    # preemptible holds at real-time priority (SCHED_FIFO 1, needs root; below the relay delay lines at 2)
    realtime_holds: bool = False
    max_runtime_s: float | None = Field(default=None, gt=0)
    slot_wait_s: float = Field(default=60.0, gt=0)  # give up if no slot is ever published
    # dispatch: controller: sync with it and take work from it (bubbletea_agent/controller/)
    controller: ControllerAddress | None = None


def _check_window(cfg: AgentConfig, source: str) -> AgentConfig:
    if cfg.window not in ("planned", "naive") and cfg.live is None:
        raise AgentConfigError(f"{source}: window {cfg.window!r} needs a live section (live.status: the "
                               "worker's status record); use window: planned without one")
    return cfg


def _format(source: str, exc: ValidationError) -> str:
    lines = [f"{source}: invalid BubbleTea agent configuration:"]
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"]) or "(top level)"
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "missing":
            msg = "required field is missing"
        elif err["type"] == "extra_forbidden":
            msg = "unknown field (check the spelling)"
        lines.append(f"  - {loc}: {msg}")
    return "\n".join(lines)


def parse_config(data: dict[str, Any], source: str = "agent config") -> AgentConfig:
    try:
        cfg = AgentConfig.model_validate(data)
    except ValidationError as exc:
        raise AgentConfigError(_format(source, exc)) from None
    return _check_window(cfg, source)


def load_config(path: str | Path) -> AgentConfig:
    path = Path(path)
    text = read_text(path, "agent configuration", AgentConfigError)
    try:
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        raise AgentConfigError(f"{path}: not valid {'JSON' if path.suffix == '.json' else 'YAML'}: {exc}") from None
    if not isinstance(data, dict):
        raise AgentConfigError(f"{path}: an agent configuration is a mapping of fields")
    return parse_config(data, str(path))


def request_source(bubbletea: BubbleTeaSettings, *, seed: int, duration_s: float,
                   base_dir: str | Path | None = None, shard_index: int = 0, shard_count: int = 1,
                   id_prefix: str | None = None) -> PoissonSource | TraceSource:
    """The request source of a scenario's `bubbletea.requests` (Poisson or a trace; a
    relative trace path is relative to `base_dir`), this shard of it."""
    req = bubbletea.requests
    shard: dict[str, Any] = {"shard_index": shard_index, "shard_count": shard_count}
    if id_prefix is not None:
        shard["id_prefix"] = id_prefix
    if req.trace:
        path = Path(req.trace)
        if base_dir is not None and not path.is_absolute():
            path = Path(base_dir) / path
        return TraceSource(path=path, deadline_s=req.deadline, **shard)
    pt = req.prompt_tokens
    if pt.dist == "fixed":
        lengths: Any = FixedLength(tokens=int(round(pt.mean)))
    elif pt.dist == "uniform":
        lengths = UniformLength(min=pt.min, max=pt.max)
    else:
        lengths = LogNormalLength(mean=pt.mean, sigma=pt.sigma, min=pt.min, max=pt.max)
    return PoissonSource(rate_per_s=req.rate, lengths=lengths, seed=seed,
                         duration_s=duration_s, deadline_s=req.deadline, **shard)


def config_from_scenario(
    bubbletea: BubbleTeaSettings,
    *,
    device: dict[str, Any],
    slots: str | Path,
    out_dir: str | Path,
    shard_index: int,
    shard_count: int,
    duration_s: float,
    epoch: float | None = None,
    seed: int = 1,
    decode: KVDestination | None = None,
    owner: str | None = None,
    base_dir: str | Path | None = None,
    kv_wire_scale: float = 1.0,
    live: LivePaths | None = None,
    arrivals_until_iteration: int | None = None,
    nice: int | None = None,
    realtime_holds: bool = False,
    controller: ControllerAddress | None = None,
) -> AgentConfig:
    """One agent's configuration from a scenario's validated `bubbletea:` section. The
    request rate there is for the whole cluster: every agent draws the same seeded
    stream and keeps its own shard of it. With no model in the section, the device
    decides: Llama-3-8B where it is modelled, the tiny preset (what a CPU can run) where
    it is real."""
    source = request_source(bubbletea, seed=seed, duration_s=duration_s, base_dir=base_dir,
                            shard_index=shard_index, shard_count=shard_count)
    if bubbletea.dispatch == "controller" and controller:
        # the controller sends this agent its work: no shard of the stream of its own
        source = source.model_copy(update={"count": 0}) if isinstance(source, PoissonSource) else \
            source.model_copy(update={"limit": 0})
    if bubbletea.chunk_tokens == "auto":
        admission: dict[str, Any] = {"chunking": True}
    else:
        chunk = bubbletea.chunk_tokens
        admission = {"chunking": chunk > 0, **({"max_chunk_tokens": chunk} if chunk > 0 else {})}
    model = bubbletea.model
    if model is None:
        model = PrefillModelSpec(preset="llama-3-8b" if device.get("mode", "modelled") == "modelled" else "tiny")
    window = "naive" if bubbletea.dispatch == "naive" else bubbletea.window
    if live is None and window not in ("planned", "naive"):
        window = "planned"  # no live status published (e.g. a hand-made job): predictions only
    data: dict[str, Any] = {
        "owner": owner or f"bubbletea-{device.get('name', 'gpu')}",
        "device": device,
        "slots": str(slots),
        "out_dir": str(out_dir),
        "epoch": epoch,
        "model": model,
        "requests": source.model_dump(),
        "admission": admission,
        "guard": {"initial_rel": bubbletea.guard},
        "decode": None if decode is None else decode.model_dump(),
        "kv_wire_scale": kv_wire_scale,
        "live": None if live is None else live.model_dump(),
        "window": window,
        "arrivals_until_iteration": arrivals_until_iteration,
        "nice": nice,
        "realtime_holds": realtime_holds,
        "controller": None if controller is None else controller.model_dump(),
    }
    return parse_config(data, "scenario bubbletea section")
