"""Scenario files: a topology, a workload, the variants to compare, and the knobs of
the transport and of BubbleTea, all in one validated, fully resolved document.

A scenario is handled as a plain dict with the topology and workload inlined
(`resolve_scenario`), so that `--set path=value` overrides and sweeps can change
any field by its dotted path (`topology.wan.0.delay`, `workload.parallelism.dp`)
before the whole is validated once (`validate_scenario`) into typed models: the
`Topology`, the `Workload` and the variants of the registry (testbed_core/variants.py),
so nothing downstream parses a part of it again. A resolved scenario is written next
to each run's results, so any run can be repeated exactly.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    JsonValue,
    StrictStr,
    ValidationError,
    field_validator,
)

from atlas_transport.config import TransportConfig
from atlas_transport.protocol import MIN_CHUNK
from testbed.run.faults import MAX_FAULTS, Fault, check_faults
from testbed.run.ports import PORT_SPAN
from testbed_core.compute_model import activation_bytes
from testbed_core.configfile import (
    ConfigError,
    ConfigModel,
    format_validation_error,
    load_yaml_text,
    read_yaml_mapping,
)
from testbed_core.contracts.bubbletea import DECODE_SAME_DC, BubbleTeaSettings
from testbed_core.topology import CongestionControl, Topology, TopologyError, parse_topology
from testbed_core.units import UnitError, format_size, parse_size
from testbed_core.variants import VariantError, default_names, get_variant
from testbed_core.workload import Workload

MAX_CHUNK_BYTES = TransportConfig.__dataclass_fields__["max_chunk_bytes"].default
MAX_TENSOR_BYTES = TransportConfig.__dataclass_fields__["max_tensor_bytes"].default
MAX_STREAMS = 64  # per channel; every stream is a socket and a thread on both ends
MAX_TIMEOUT_S = 86_400.0
MAX_REQUEST_RATE = 100_000.0  # prefill requests per second over the whole cluster
MAX_PROMPT_TOKENS = 2**24
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,99}$"  # it names the result folder


class ScenarioError(ConfigError):
    """A scenario, sweep or override that cannot be used; says where and why."""


class _Model(ConfigModel):
    model_config = ConfigDict(extra="forbid")


class TransportSettings(_Model):
    streams: int | Literal["auto"] = Field(8, description="streams per channel for multi-tcp and atlas")
    chunk: str | int = Field("4MiB", description=f"largest piece of a tensor sent as one frame ({MIN_CHUNK} bytes "
                                                  f"to {format_size(MAX_CHUNK_BYTES)})")
    # TCP congestion control set on every stream's socket (TCP_CONGESTION), e.g. bbr; None: the hosts' own
    # (the topology's tcp.congestion_control)
    congestion: CongestionControl | None = None
    pacing: bool | Literal["auto"] = Field("auto", description=(
        "pace every stream at TCP's own rate (cwnd / RTT x 1.2, twice that in slow start) instead of "
        "sending each window at line rate: Linux's internal pacing, turned on per socket with "
        "SO_MAX_PACING_RATE, as sch_fq would (this kernel has no fq); auto: on where the windows of the "
        "channels that may cross a WAN link at once would overflow its queue (testbed/run/pacing.py), "
        "the run says which and why"))

    @field_validator("streams")
    @classmethod
    def _streams(cls, value: int | str) -> int | str:
        if isinstance(value, int) and not 1 <= value <= MAX_STREAMS:
            raise ValueError(f"streams must be between 1 and {MAX_STREAMS} or 'auto', got {value}")
        return value

    @field_validator("chunk")
    @classmethod
    def _chunk(cls, value: str | int) -> str | int:
        try:
            size = parse_size(value)
        except UnitError as exc:
            raise ValueError(str(exc)) from None
        if not MIN_CHUNK <= size <= MAX_CHUNK_BYTES:
            raise ValueError(f"chunk must be between {MIN_CHUNK} bytes and {format_size(MAX_CHUNK_BYTES)} "
                             f"(the transport's frame limits), got {value!r}")
        return value


EMULATED_BASE_PORT = 29500
MAX_REPEAT = 20


class RunnerSettings(_Model):
    """How `testbed run` plays the scenario (testbed/run/runner.py); every choice visible."""

    local: bool = Field(False, description="workers as local processes on 127.0.0.1, no emulated network")
    inventory: str | None = Field(
        None, description="an inventory file (testbed_core/inventory.py): the topology's hosts are real machines "
        "reached over SSH, nothing emulated or shaped (testbed run --inventory)"
    )
    base_port: int | Literal["auto"] = Field(
        "auto", description="first TCP port of the run (channels, tokens +1000, calibration +2000, decode "
        "servers +3000, DP gradients +4000); auto: 29500 under emulation (every host has its own namespace), "
        "a free block on 127.0.0.1 in local mode, so that two runs on one machine never collide"
    )
    calibrate: bool = Field(True, description="measure per-transfer rates over the WAN before the variants")
    calibration_transfers: int = Field(4, ge=1, le=50, description="timed tensors per stream count")
    slow_start_after_idle: bool = Field(
        False, description="net.ipv4.tcp_slow_start_after_idle on the hosts (off: long-lived channels keep cwnd)"
    )
    baseline_placement: Literal["atlas", "in-order", "even", "round-robin"] = Field(
        "even", description="placement of baseline and multi-tcp (atlas uses its own heuristic)"
    )
    temporal_mode: Literal["token", "slot"] = Field(
        "token", description="atlas: a WAN send waits for the previous one in its link's plan (token) or its slot"
    )
    atlas_sharing: Literal["auto", "temporal", "shared"] = Field(
        "auto", description="atlas: temporal plan, shared links, or auto (temporal unless the calibrated "
        "prediction says sharing the link is faster)"
    )
    atlas_placement: Literal["heuristic", "search"] = Field(
        "heuristic", description="atlas: the DC-selection heuristic (largest DC first), or search (candidate "
        "placements scored by the fast predictor, the fastest kept; testbed_core/planning/search.py)"
    )
    atlas_schedule: Literal["configured", "auto"] = Field(
        "configured", description="atlas: the workload's pipeline schedule (configured), or auto: each schedule "
        "its devices can hold (1f1b, gpipe; testbed_core/planning/schedule.py) planned and predicted with the "
        "calibrated network, at every timed stream count, the fastest run unless the configured one is within 3%; "
        "modelled devices only. Opt-in: the prediction does not know the losses of GPipe's bursts of unpaced "
        "streams (docs/scenarios.md, 'Atlas's pipeline schedule')"
    )
    token_margin: float = Field(
        0.2, ge=0, le=2, description="atlas: plan each WAN transfer this much longer than calibrated (late ones)"
    )
    iteration_lead: float = Field(0.05, ge=0.005, le=5, description="seconds from the barrier to the next common start")
    dp_allreduce: bool = Field(True, description="with dp > 1, all-reduce each stage's gradients over the network "
                               "after every iteration (parameters x dtype bytes x scale; real devices always do)")
    dp_bucket: int = Field(25 << 20, ge=1 << 16, le=1 << 30,
                           description="bytes per DP all-reduce message (the bucket), as DDP's bucket_cap")
    warm_start: bool = Field(True, description="start each local training worker by forking a process that "
                             "imported torch once per run (testbed/emulation/warmstart.py), not a fresh "
                             "interpreter (about 3 s of CPU each on two cores)")
    setup_timeout: float = Field(60.0, gt=0, le=MAX_TIMEOUT_S, description="seconds for workers to start and connect")
    iteration_timeout: float = Field(120.0, gt=0, le=MAX_TIMEOUT_S,
                                     description="seconds an iteration may take before the run fails")
    verify_tensors: bool = Field(False, description="modelled workers send a pattern per (iteration, micro-batch, "
                                 "direction) that the receiver checks byte for byte; the summary counts them")
    repeat: int = Field(1, ge=1, le=MAX_REPEAT, description="play the variants' measured phases this many times "
                        "(interleaved, on one network and calibration); summary.json reports each repeat, the median "
                        "and the spread per variant (testbed run --repeat N)")
    bubbletea_idle_twin: bool = Field(
        True, description="before each +bubbletea variant, play it once more with its agents running but "
        "admitting nothing: the agents' own overhead, one part of the slowdown's decomposition")
    bubbletea_cpu_weight: float | None = Field(
        0.1, gt=0, le=1, description="BubbleTea agents and decode servers run in a cgroup of their own with this "
        "fraction of a normal CPU weight, so that on a small machine they never take a core from the workers and "
        "delay lines (testbed/run/cpu.py); null: no cgroup (the agents compete at their nice level)")
    bubbletea_cpu_idle: bool = Field(
        True, description="the agents' cgroup is idle (cgroup cpu.idle 1, Linux 5.15+): its processes run like "
        "SCHED_IDLE tasks, only on a core no worker, delay line or other process wants, and a waking worker "
        "preempts them at once: the agents' own CPU work waits for free cores, not the workers (their device "
        "holds still run at SCHED_FIFO); false: the group only has its weight (bubbletea_cpu_weight), which shares contended "
        "cores in proportion; ignored with bubbletea_cpu_weight null")


    @field_validator("base_port")
    @classmethod
    def _base_port(cls, value: int | str) -> int | str:
        if isinstance(value, int) and not 1024 <= value <= 60000 - PORT_SPAN:
            raise ValueError(f"base_port must be 'auto' or between 1024 and {60000 - PORT_SPAN} "
                             f"(the run uses {PORT_SPAN} ports above it), got {value}")
        return value


class Scenario(_Model):
    name: str = Field(pattern=NAME_PATTERN, description="letters, digits, . _ + -; it names the result folder")
    description: str = ""  # free text: what the scenario compares
    # the network: a topology file's path (relative to the scenario file) or an inline mapping
    topology: Topology
    # what is trained: a workload file's path (relative to the scenario file) or an inline mapping
    workload: Workload
    workload_source: str | None = Field(
        None, description="the workload file, when it was one (relative gpu.profile paths are read from its "
                          "folder); validate_scenario fills it in"
    )
    variants: list[str] = Field(
        default_factory=lambda: list(default_names()), min_length=1,
        description="variants to compare, in order (names from testbed_core/variants.py)",
    )
    # the run's seed: BubbleTea's prefill request stream is drawn from it; recorded in summary.json
    # (real-mode training seeds itself from the workload's real.seed)
    seed: int = Field(1, ge=0, le=2**32 - 1)
    transport: TransportSettings = TransportSettings()  # how tensors cross the network: streams, chunk size, TCP
    bubbletea: BubbleTeaSettings = BubbleTeaSettings()  # BubbleTea: prefill requests served in pipeline bubbles
    runner: RunnerSettings = RunnerSettings()  # how `testbed run` plays the scenario: where, calibration, ports
    faults: list[Fault] = Field([], max_length=MAX_FAULTS, description=(
        "faults injected on purpose (testbed/run/faults.py): link-down, delay-spike, kill-worker"))
    source: str = ""  # the scenario file the loader read (filled in; its messages name it)

    @field_validator("topology", mode="before")
    @classmethod
    def _topology(cls, value: Any) -> Any:
        if isinstance(value, dict):
            try:
                clean = {k: v for k, v in value.items() if not str(k).startswith("_")}
                return parse_topology(clean, value.get("_source", "topology"))
            except TopologyError as exc:
                raise ValueError(str(exc)) from None
        return value

    @field_validator("variants")
    @classmethod
    def _variants(cls, value: list[str]) -> list[str]:
        for name in value:
            try:
                get_variant(name)
            except VariantError as exc:
                raise ValueError(str(exc)) from None
        return value

    @property
    def workload_dir(self) -> str | None:
        """The workload file's folder (None for an inline workload)."""
        return str(Path(self.workload_source).parent) if self.workload_source else None


def _inline(value: Any, base: Path, kind: str) -> Any:
    if isinstance(value, str):
        path = (base / value) if not Path(value).is_absolute() else Path(value)
        data = read_yaml_mapping(path, kind, ScenarioError)
        data["_source"] = str(path)
        return data
    if isinstance(value, dict):
        return value
    raise ScenarioError(f"{kind} must be a file path or an inline mapping, got {type(value).__name__}")


# A scenario as a document, before validation: what scenario.resolved.yaml holds (the
# scenario with its topology and workload files read in and the overrides applied; the
# form a sweep edits per point): JSON values only.
ScenarioDoc = dict[str, JsonValue]
# `--set path=value` overrides: a dotted path and the value parsed as YAML.
Overrides = dict[str, JsonValue]


def resolve_scenario(path: str | Path) -> ScenarioDoc:
    """The scenario as a dict with its topology and workload files read in."""
    path = Path(path)
    data = read_yaml_mapping(path, "scenario", ScenarioError)
    check_subject(data, str(path))
    for key in ("topology", "workload"):
        if key == "workload" and "program" in data:
            continue  # a program scenario: testbed/run/program.py runs it
        if key not in data:
            raise ScenarioError(f"{path}: {key}: required field is missing (a file path or a mapping)")
        try:
            data[key] = _inline(data[key], path.parent, key)
        except ScenarioError as exc:
            raise ScenarioError(f"{path}: {key}: {exc}") from None
    data.setdefault("source", str(path))
    return data


def parse_value(text: str) -> Any:
    """An override's value as YAML would read it (the same strict reading as the files:
    '8' -> 8, 'true' -> True, '50ms' and 'yes' stay text)."""
    try:
        return load_yaml_text(text, "--set", "value", ScenarioError)
    except ScenarioError:
        return text


def _model_for(model: Any, key: str) -> Any:
    """The pydantic model class behind field `key` of `model`, or None for leaves."""
    if model is None or not (isinstance(model, type) and issubclass(model, BaseModel)):
        return None
    field = model.model_fields.get(key)
    if field is None:
        return KeyError
    return _unwrap(field.annotation)


def _unwrap(annotation: Any) -> Any:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    origin = get_origin(annotation)
    if origin in (list, tuple):
        args = get_args(annotation)
        return ("list", _unwrap(args[0]) if args else None)
    for arg in get_args(annotation):
        inner = _unwrap(arg)
        if inner is not None:
            return inner
    return None


def apply_override(data: dict[str, Any], dotted: str, value: Any, source: str = "--set") -> None:
    """Set `dotted` (e.g. 'topology.wan.0.delay') in a resolved scenario dict.

    Unknown paths are refused with the fields that exist at that level, so a typo in
    a sweep is caught before anything is built.
    """
    parts = dotted.split(".")
    if not dotted or any(not p for p in parts):
        raise ScenarioError(f"{source}: {dotted!r} is not a parameter path like topology.wan.0.delay")
    node: Any = data
    model: Any = ProgramScenario if is_program(data) else Scenario
    for depth, part in enumerate(parts):
        here = ".".join(parts[: depth + 1])
        last = depth == len(parts) - 1
        if isinstance(model, tuple):  # a list field
            model = model[1]
        if isinstance(node, list):
            if not part.isdigit() or int(part) >= len(node):
                raise ScenarioError(
                    f"{source}: {here}: index {part!r} out of range (the list has {len(node)} items, 0..{len(node) - 1})"
                )
            key: Any = int(part)
            child_model = model
        elif isinstance(node, dict):
            key = part
            child_model = _model_for(model, part) if model is not None else None
            if key not in node:
                known = _known_fields(node, model)
                if child_model is KeyError or (model is None and known):
                    raise ScenarioError(
                        f"{source}: {here}: unknown parameter {part!r} (fields here: {', '.join(known)})"
                    )
                if not last:
                    node[key] = {}
        else:
            raise ScenarioError(f"{source}: {here}: {'.'.join(parts[:depth]) or 'scenario'} is a value, not a section")
        if last:
            node[key] = value
            return
        node = node[key]
        model = None if child_model is KeyError else child_model


def _known_fields(node: dict[str, Any], model: Any) -> list[str]:
    names = set(k for k in node if not k.startswith("_"))
    if isinstance(model, type) and issubclass(model, BaseModel):
        names |= set(model.model_fields)
    return sorted(names)


def validate_scenario(data: dict[str, Any]) -> Scenario:
    """The resolved scenario dict as a `Scenario`. The workload is validated first, on
    its own, so that its errors name the workload file (``_source``) rather than the
    scenario."""
    source = data.get("source") or "scenario"
    if is_program(data):
        raise ScenarioError(f"{source}: names a program, not a workload: it is run by testbed/run/program.py "
                            "(validate it with validate_any)")
    data = copy.deepcopy(data)
    raw = data.get("workload")
    if isinstance(raw, dict):
        wl_source = raw.get("_source")
        try:
            data["workload"] = Workload.model_validate({k: v for k, v in raw.items() if not str(k).startswith("_")})
        except ValidationError as exc:
            raise ScenarioError(
                format_validation_error(wl_source or source, exc, "workload", prefix="workload")
            ) from None
        if wl_source:
            data["workload_source"] = wl_source
    try:
        scenario = Scenario.model_validate(data)
    except ValidationError as exc:
        raise ScenarioError(format_validation_error(source, exc, "scenario")) from None
    if scenario.workload.gpu.mode == "real":  # real devices: can this machine train the model? (before anything is built)
        from testbed.run.real_check import RealModeError, check_machine

        try:
            check_machine(scenario.workload)
        except RealModeError as exc:
            raise ScenarioError(f"{scenario.workload_source or source}: workload: {exc}") from None
    hosts = {f"{dc.name}-{h}" for dc in scenario.topology.dcs for h in dc.hosts}
    decode = scenario.bubbletea.decode_host
    if decode is not None and decode != DECODE_SAME_DC and decode not in hosts:
        raise ScenarioError(
            f"{source}: bubbletea.decode_host: unknown host {decode!r} (hosts: {', '.join(sorted(hosts))}; or "
            f"'{DECODE_SAME_DC}' for a decode server in each DC)"
        )
    extra = [v for v in scenario.bubbletea.variants or [] if v not in scenario.variants]
    if extra:
        raise ScenarioError(
            f"{source}: bubbletea.variants: {', '.join(extra)} not among the scenario's variants "
            f"({', '.join(scenario.variants)})"
        )
    _check_limits(scenario, source)
    try:
        check_faults(scenario.faults, scenario.topology, scenario.workload, scenario.runner.local)
    except ValueError as exc:
        raise ScenarioError(f"{source}: {exc}") from None
    return scenario


def _check_limits(scenario: Scenario, source: str) -> None:
    """What a run would otherwise hit only once built: the transport's largest tensor,
    a request source that could not be generated, a request trace that cannot be read."""
    wl = scenario.workload
    wire = max(1, round(activation_bytes(wl.model_spec(), wl.parallelism.micro_batch) * wl.scale))
    if wire > MAX_TENSOR_BYTES:
        where = scenario.workload_source or f"{source}: workload"
        raise ScenarioError(
            f"{where}: one boundary tensor is {format_size(wire)} on the wire (micro_batch x seq_len x hidden "
            f"x dtype bytes x scale), above the transport's {format_size(MAX_TENSOR_BYTES)} per tensor: lower "
            "micro_batch or scale"
        )
    bt = scenario.bubbletea
    if not bt.enabled:
        return
    req = bt.requests
    if req.rate > MAX_REQUEST_RATE:
        raise ScenarioError(f"{source}: bubbletea.requests.rate: {req.rate:g} requests/s is above "
                            f"{MAX_REQUEST_RATE:g} (the whole cluster's arrivals, generated up front)")
    pt = req.prompt_tokens
    if max(pt.mean, pt.max, pt.min) > MAX_PROMPT_TOKENS:
        raise ScenarioError(f"{source}: bubbletea.requests.prompt_tokens: at most {MAX_PROMPT_TOKENS} tokens")
    if req.trace:
        from bubbletea_agent.requests import TraceError, TraceSource, read_trace

        path = Path(req.trace)
        if scenario.workload_dir is not None and not path.is_absolute():
            path = Path(scenario.workload_dir) / path  # as the agents read it (testbed/run/bubbletea.py)
        try:
            stat = path.stat()
            key = (str(path.resolve()), stat.st_mtime_ns, stat.st_size)
        except OSError:
            key = None  # read_trace says what is wrong with it
        if key is None or key not in _READ_TRACES:  # a sweep validates every point: read each trace once
            try:
                read_trace(TraceSource(path=path, deadline_s=req.deadline))
            except TraceError as exc:
                raise ScenarioError(f"{source}: bubbletea.requests.trace: {exc}") from None
            if key is not None:
                _READ_TRACES.add(key)


_READ_TRACES: set[tuple[str, int, int]] = set()  # request traces read without a problem (path, mtime, size)


def load_scenario(path: str | Path, overrides: Overrides | None = None) -> tuple[Scenario, ScenarioDoc]:
    """Validated scenario and the resolved dict it came from (to save with results)."""
    data = resolve_scenario(path)
    for dotted, value in (overrides or {}).items():
        apply_override(data, dotted, value)
    return validate_scenario(data), data


def parse_set_options(items: tuple[str, ...] | list[str]) -> Overrides:
    out: Overrides = {}
    for item in items:
        if "=" not in item:
            raise ScenarioError(f"--set {item!r}: expected path=value, e.g. --set topology.wan.0.delay=50ms")
        key, _, raw = item.partition("=")
        out[key.strip()] = parse_value(raw)
    return out


# ---------------------------------------------------------------------------- program scenarios
#
# A scenario may name a program (your own torch.distributed program, run once per rank
# by `testbed launch`) instead of a workload. Its variants are environment sets, e.g.
# {gloo: {BACKEND: gloo}, atlas: {BACKEND: atlas}}, each run on the same network;
# testbed/run/program.py runs it and reports the seconds per step the program prints.

ENV_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*$"
MAX_PROGRAM_TIMEOUT_S = MAX_TIMEOUT_S
MAX_PROGRAM_WARMUP = 1000


class ProgramSection(_Model):
    """What to run on every rank, as `testbed launch TOPOLOGY [options] -- COMMAND` would."""

    command: list[str] = Field(min_length=1, description="the program and its arguments, e.g. [python, "
                               "examples/pipeline.py, --steps, '8']; relative paths from cwd")
    env: dict[str, str] = Field(default_factory=dict, description="environment of every rank (each variant's "
                                "set is added on top)")
    hosts: list[str] | None = Field(None, min_length=1, description="hosts in rank order, by name (dc1-h1, ...); "
                                    "default: every host of the topology")
    nproc_per_host: int = Field(1, ge=1, le=64, description="ranks per host")
    timeout: float = Field(900.0, gt=0, le=MAX_PROGRAM_TIMEOUT_S, description="seconds one variant's launch may "
                           "take before it is ended and recorded as failed")
    warmup: int = Field(1, ge=0, le=MAX_PROGRAM_WARMUP, description="rank 0's first steps left out of the "
                        "seconds per step (connection set-up, first-touch allocations)")
    cwd: str = Field(".", description="the ranks' working folder, relative to where testbed runs")
    master_port: int | None = Field(None, ge=1024, le=65535, description="MASTER_PORT (default: a free port)")

    @field_validator("command")
    @classmethod
    def _command(cls, value: list[str]) -> list[str]:
        if not value[0].strip():
            raise ValueError("the command's first item (the program) is empty; e.g. [python, examples/pipeline.py]")
        return value

    @field_validator("env", mode="before")
    @classmethod
    def _env_text(cls, value: Any) -> Any:
        if isinstance(value, dict):
            for key, val in value.items():
                if not isinstance(val, str):
                    raise ValueError(f"{key}: {val!r} is not a string; quote it ({key}: '{val}'): environment "
                                     "values are text")
        return value

    @field_validator("env")
    @classmethod
    def _env(cls, value: dict[str, str]) -> dict[str, str]:
        _check_env(value, "env")
        return value


def _check_env(env: dict[str, str], where: str) -> None:
    import re

    for key in env:
        if not re.match(ENV_NAME_PATTERN, key):
            raise ValueError(f"{where}: {key!r} is not an environment variable name (letters, digits, _; "
                             "not starting with a digit)")


class ProgramScenario(_Model):
    """A scenario whose subject is a program: a topology, the program, and its variants
    as environment sets (no workload)."""

    name: str = Field(pattern=NAME_PATTERN, description="letters, digits, . _ + -; it names the result folder")
    description: str = ""  # free text: what the scenario compares
    # the network: a topology file's path (relative to the scenario file) or an inline mapping
    topology: Topology
    program: ProgramSection  # the program every rank runs: its command, environment, hosts, ranks per host, limits
    variants: dict[str, dict[str, StrictStr]] = Field(
        min_length=1, description="variant name -> the environment it adds, e.g. {gloo: {BACKEND: gloo}, "
        "atlas: {BACKEND: atlas}}; values are strings (quote numbers: '8')")
    seed: int = Field(1, ge=0, le=2**32 - 1, description="recorded with the results; the program seeds itself")
    source: str = ""  # the scenario file the loader read (filled in; its messages name it)

    @field_validator("topology", mode="before")
    @classmethod
    def _topology(cls, value: Any) -> Any:
        return Scenario._topology(value)  # the same reading as a workload scenario's

    @field_validator("variants", mode="before")
    @classmethod
    def _env_sets(cls, value: Any) -> Any:
        if not isinstance(value, dict):
            raise ValueError("variants of a program are a mapping of environment sets, e.g. "
                             "{gloo: {BACKEND: gloo}, atlas: {BACKEND: atlas}}")
        for name, env in value.items():
            if env is None:
                continue
            if not isinstance(env, dict):
                raise ValueError(f"variant {name!r}: an environment set (a mapping NAME: value), got {env!r}")
            for key, val in env.items():
                if not isinstance(val, str):
                    raise ValueError(f"variant {name!r}: {key}: {val!r} is not a string; quote it ({key}: "
                                     f"'{val}'): environment values are text")
        return {name: env or {} for name, env in value.items()}

    @field_validator("variants")
    @classmethod
    def _variants(cls, value: dict[str, dict[str, str]]) -> dict[str, dict[str, str]]:
        import re

        for name, env in value.items():
            if not re.match(NAME_PATTERN, name):
                raise ValueError(f"variant name {name!r}: letters, digits, . _ + - only (it names a folder)")
            _check_env(env, f"variants.{name}")
        return value


def is_program(data: dict[str, Any]) -> bool:
    """Whether a resolved scenario dict names a program (testbed/run/program.py runs it)."""
    return isinstance(data, dict) and "program" in data


def check_subject(data: dict[str, Any], source: str) -> None:
    """A scenario names exactly one of a workload and a program."""
    if "program" in data and "workload" in data:
        raise ScenarioError(f"{source}: names both a workload and a program; a scenario runs one of them: keep "
                            "workload (the modelled training) or program (your own program under testbed launch)")
    if "program" not in data and "workload" not in data:
        raise ScenarioError(f"{source}: workload: required field is missing (a file path or a mapping), or give "
                            "a program instead (program: {command: [python, examples/pipeline.py]})")


def validate_program_scenario(data: dict[str, Any]) -> ProgramScenario:
    """The resolved dict of a program scenario as a `ProgramScenario`; its hosts are
    checked against the topology as `testbed launch` would, before anything is built."""
    source = data.get("source") or "scenario"
    check_subject(data, source)
    try:
        scenario = ProgramScenario.model_validate(copy.deepcopy(data))
    except ValidationError as exc:
        raise ScenarioError(format_validation_error(source, exc, "scenario")) from None
    from testbed.emulation.addressing import plan_addresses
    from testbed.emulation.naming import display_host
    from testbed.launch.plan import HostSlot, LaunchError, plan_ranks

    topo = scenario.topology
    try:
        plan = plan_addresses(topo)
        slots = [HostSlot(display_host(dc.name, h), dc.name, ip, "")
                 for dc, dplan in zip(topo.dcs, plan.dcs, strict=True)
                 for h, ip in zip(dc.hosts, dplan.host_ips, strict=True)]
        plan_ranks(slots, scenario.program.hosts, scenario.program.nproc_per_host)
    except LaunchError as exc:
        text = str(exc).replace("--hosts", "program.hosts").replace("--nproc-per-host", "program.nproc_per_host")
        raise ScenarioError(f"{source}: {text}") from None
    return scenario


def validate_any(data: dict[str, Any]) -> Scenario | ProgramScenario:
    """A resolved scenario dict as the model its subject calls for: a `ProgramScenario`
    when it names a program, else a `Scenario` (`validate_scenario`)."""
    if is_program(data):
        return validate_program_scenario(data)
    return validate_scenario(data)


def load_any(path: str | Path, overrides: Overrides | None = None
             ) -> tuple[Scenario | ProgramScenario, ScenarioDoc]:
    """`load_scenario` for either kind of scenario."""
    data = resolve_scenario(path)
    for dotted, value in (overrides or {}).items():
        apply_override(data, dotted, value)
    return validate_any(data), data
