"""BubbleTea's contracts: the scenario's ``bubbletea:`` section and the job file the
scenario runner hands each agent (``python -m bubbletea_agent <job.json>``).

The runner (testbed/run/bubbletea.py) builds an `AgentJob` from the validated scenario
and writes it with ``model_dump_json``; the agent (bubbletea_agent/job.py) reads it back
with ``model_validate_json``. Both sides go through these models, so the agent gets the
very settings the scenario validated (its `BubbleTeaSettings`, the workload's
`GpuConfig`) and no field is defaulted a second time on the reading side.

`PrefillModelSpec` is the prefill model's shape (a Llama preset and/or LlamaConfig
fields); it lives here, without torch, because the scenario validates it too.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from testbed_core.topology import Rate
from testbed_core.variants import VariantError, parse_variants
from testbed_core.workload import GpuConfig


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


# --------------------------------------------------------------------------- model

# Llama shapes people ask about; any LlamaConfig field may override a preset.
_PRESET_FIELDS = ("num_hidden_layers", "hidden_size", "intermediate_size", "num_attention_heads",
                  "num_key_value_heads", "vocab_size", "max_position_embeddings")
PRESETS: dict[str, dict[str, int]] = {name: dict(zip(_PRESET_FIELDS, shape, strict=True)) for name, shape in {
    # name: (layers, hidden, intermediate, attention heads, KV heads, vocabulary, context)
    "tiny": (2, 64, 128, 4, 2, 256, 4096),
    "small": (4, 256, 688, 8, 4, 4096, 8192),
    "llama-3.2-1b": (16, 2048, 8192, 32, 8, 128256, 131072),
    "llama-2-7b": (32, 4096, 11008, 32, 32, 32000, 4096),
    "llama-3-8b": (32, 4096, 14336, 32, 8, 128256, 8192),
    "llama-3-70b": (80, 8192, 28672, 64, 8, 128256, 8192),
}.items()}

DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}
"""Bytes per element of the prefill model's dtypes (the KV cache has the model's dtype)."""


class PrefillModelSpec(BaseModel):
    """Shape of the prefill model: a preset name and/or LlamaConfig fields (a preset
    fills the fields not given). Pure arithmetic: the engine (bubbletea_agent/engine.py)
    turns it into a transformers model or a compute-model charge."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # a named model shape (tiny, ...) that fills the fields not given (None: give them all)
    preset: str | None = "tiny"
    num_hidden_layers: int = Field(default=0, ge=0)  # decoder layers (unset: the preset's)
    hidden_size: int = Field(default=0, ge=0)  # hidden size (unset: the preset's)
    intermediate_size: int = Field(default=0, ge=0)  # MLP size (unset: the preset's)
    num_attention_heads: int = Field(default=0, ge=0)  # attention heads (unset: the preset's)
    num_key_value_heads: int = Field(default=0, ge=0)  # key/value heads (unset: the preset's)
    vocab_size: int = Field(default=0, ge=0)  # vocabulary size (unset: the preset's)
    # longest prompt in tokens (unset: the preset's)
    max_position_embeddings: int = Field(default=0, ge=0)
    head_dim: int = Field(default=0, ge=0)  # per-head size (unset or 0: hidden_size / heads)
    dtype: str = "bfloat16"  # the model's dtype
    seed: int = 0  # seed of the random weights (when no weights are given)
    weights: Path | None = None  # a local directory saved with save_pretrained()

    @model_validator(mode="before")
    @classmethod
    def _fill(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        data = dict(data)
        preset = data.get("preset", "tiny")
        if preset is not None:
            if preset not in PRESETS:
                raise ValueError(f"unknown model preset {preset!r} (presets: {', '.join(PRESETS)})")
            for key, value in PRESETS[preset].items():
                data.setdefault(key, value)
        return data

    @model_validator(mode="after")
    def _check(self) -> PrefillModelSpec:
        for name in ("num_hidden_layers", "hidden_size", "intermediate_size", "num_attention_heads",
                     "num_key_value_heads", "vocab_size", "max_position_embeddings"):
            if getattr(self, name) <= 0:
                raise ValueError(f"model field {name} must be > 0 (set it, or name a preset)")
        if self.dtype not in DTYPE_BYTES:
            raise ValueError(f"model dtype {self.dtype!r} unknown (one of {', '.join(DTYPE_BYTES)})")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(f"num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                             f"num_key_value_heads ({self.num_key_value_heads})")
        if not self.head_dim and self.hidden_size % self.num_attention_heads:
            raise ValueError(f"hidden_size ({self.hidden_size}) must be a multiple of "
                             f"num_attention_heads ({self.num_attention_heads}), or set head_dim")
        return self

    @property
    def kv_head_dim(self) -> int:
        return self.head_dim or self.hidden_size // self.num_attention_heads

    @property
    def bytes_per_elem(self) -> int:
        return DTYPE_BYTES[self.dtype]

    def kv_shape(self, tokens: int, batch: int = 1) -> tuple[int, int, int, int, int]:
        return (self.num_hidden_layers, batch, self.num_key_value_heads, tokens, self.kv_head_dim)

    def kv_bytes(self, tokens: int, batch: int = 1) -> int:
        """Bytes of K plus V for `tokens` tokens."""
        return 2 * math.prod(self.kv_shape(tokens, batch)) * self.bytes_per_elem

    def params(self) -> int:
        """Parameter count (embeddings and LM head included, untied)."""
        h, i, L = self.hidden_size, self.intermediate_size, self.num_hidden_layers
        d, q, kv = self.kv_head_dim, self.num_attention_heads, self.num_key_value_heads
        per_layer = h * d * (q + 2 * kv) + q * d * h + 3 * h * i + 2 * h
        return L * per_layer + 2 * self.vocab_size * h + h


# --------------------------------------------------------------------------- scenario section


class PromptLengths(_Model):
    dist: Literal["fixed", "uniform", "lognormal"] = "lognormal"  # how prompt lengths are drawn
    mean: float = Field(512, gt=0, description="tokens (fixed value, uniform midpoint, lognormal mean)")
    sigma: float = Field(0.6, ge=0)  # lognormal: the spread of log length
    min: int = Field(16, ge=1)  # shortest prompt, tokens
    max: int = Field(4096, ge=1)  # longest prompt, tokens


class RequestSource(_Model):
    rate: float = Field(5.0, ge=0, description="Poisson arrivals per second, over the whole cluster")
    prompt_tokens: PromptLengths = PromptLengths()  # how long the prompts are
    trace: str | None = Field(None, description="CSV trace to replay instead of Poisson arrivals")
    deadline: float = Field(5.0, gt=0, description="seconds a request may wait before it is rejected")


DECODE_SAME_DC = "same-dc"

PAPER_UTILIZATION = 0.94
"""BubbleTea's paper (arXiv 2411.14458): up to 94% GPU utilization with prefill in the
bubbles; the line the demo, the report and the what-if plots draw."""

SLOWDOWN_LIMIT = 0.01
"""BubbleTea's promise: training slows down by at most 1%."""


class BubbleTeaSettings(_Model):
    """BubbleTea agents next to the training workers (bubbletea_agent/README.md)."""

    enabled: bool = False  # run the +bubbletea variants (prefill in the training's bubbles)
    compare: bool = Field(True, description="also run each variant without agents, for the slowdown")
    variants: list[str] | None = Field(
        None, description="which of the scenario's variants also run with agents (default: all; names from "
                          "testbed_core/variants.py)"
    )
    # the prefill requests: arrivals, prompt lengths, deadline
    requests: RequestSource = RequestSource()
    decode_host: str | None = Field(
        None, description="where KV caches go: 'same-dc' (a decode server in each DC: LAN only, never the WAN), "
                          "a host (dc-host, e.g. dc2-h2: caches from other DCs cross the WAN, paced at "
                          "kv_wan_rate), or none (TTFT ends with the prefill)"
    )
    kv_wire_scale: float = Field(
        0.001, gt=0, le=1, description="share of a modelled KV cache's true size that crosses the emulated "
                                      "network, at most (the workload's scale when lower; real devices ship whole "
                                      "caches); the rest is charged at the path's nominal rate (TTFT as for the "
                                      "whole cache)"
    )
    kv_wan_rate: Rate | None = Field(
        50e6, description="cap on KV bytes crossing a WAN (bits/s, all agents together; none: no cap)"
    )
    model: PrefillModelSpec | None = Field(
        None, description="prefill model size (a preset and/or LlamaConfig fields); none: llama-3-8b on a "
                          "modelled device, tiny on a real one"
    )
    chunk_tokens: int | Literal["auto"] = Field(
        "auto", description="chunked prefill: 'auto' = chunks of whatever fits, N = at most N tokens, 0 = whole prompts"
    )
    guard: float = Field(0.05, ge=0, description="initial guard, as a fraction of predicted duration")
    window: Literal["live", "planned", "both"] = Field(
        "live", description="what admission fills: the worker's live guarantees (never delay training), the "
                            "planned slots corrected from the timeline, or either"
    )
    dispatch: Literal["controller", "shards", "naive"] = Field(
        "shards", description="how requests reach the devices: 'controller' (one controller per cluster sends "
                              "each to the device whose bubbles serve it soonest; clients may submit over HTTP), "
                              "'shards' (each agent takes a fixed share of the stream), 'naive' (shards, and "
                              "prefill whenever the device is free, no guard: colocation)"
    )
    compare_dispatch: list[Literal["controller", "shards", "naive"]] = Field(
        default_factory=list, description="also run each +bubbletea variant with these dispatch modes, in the "
                                          "same run (names <variant>+bubbletea-<mode>)"
    )
    controller_host: str | None = Field(
        None, description="host of the controller (dispatch: controller); none: the first DC's first host"
    )
    controller_bind: str | None = Field(
        None, description="address the controller listens on; none: its host's address in the run (the emulated "
                          "host's, or the real machine's data address) and no other; 0.0.0.0: every interface "
                          "(every request still needs the run's token)"
    )

    @field_validator("variants")
    @classmethod
    def _known_variants(cls, value: list[str] | None) -> list[str] | None:
        if value is not None:
            try:
                parse_variants(value)
            except VariantError as exc:
                raise ValueError(str(exc)) from None
        return value

    @field_validator("model", mode="before")
    @classmethod
    def _empty_model(cls, value: Any) -> Any:
        return None if value == {} else value  # `model: {}` says nothing: the device decides

    @field_validator("chunk_tokens")
    @classmethod
    def _chunk(cls, value: int | str) -> int | str:
        if isinstance(value, int) and value < 0:
            raise ValueError(f"chunk_tokens must be 'auto', 0 (whole prompts) or a positive token count, got {value}")
        return value


# --------------------------------------------------------------------------- agent job


class AgentDevice(_Model):
    """The worker's device the agent shares (testbed_runtime.device.Device)."""

    name: str
    run_dir: Path
    mode: Literal["modelled", "real"] = "modelled"
    time_scale: float | None = Field(default=None, gt=0)  # None: TESTBED_TIME_SCALE or 1
    torch_device: str | None = None  # real mode: "cuda" or "cpu"; None: the agent's choice (auto)


class KVDestination(_Model):
    """The decode server an agent ships its KV caches to (an address reachable from its host)."""

    host: str
    port: int = Field(7070, ge=1, le=65535)
    streams: int | Literal["auto"] = 4
    secret: str | None = None  # None: the ATLAS_SECRET environment variable
    # the part of a cache that does not cross the wire is charged at this rate (bits/s)
    rest_rate_bps: float | None = Field(default=None, gt=0)
    # pace shipping to at most this many bits/s on the wire (a share of bubbletea.kv_wan_rate)
    max_rate_bps: float | None = Field(default=None, gt=0)


class LivePaths(_Model):
    """Where the worker's live status is (testbed_runtime/live.py)."""

    status: Path  # the worker's status record
    wake: Path | None = None  # FIFO the worker pokes on every state change
    gate: Path | None = None  # the runner's gate record (between iterations)


class ControllerAddress(_Model):
    """Where an agent syncs with the prefill controller (bubbletea_agent/controller/)."""

    host: str
    port: int = Field(ge=1, le=65535)
    name: str = Field(description="the agent's name at the controller")
    decode_host: str | None = Field(None, description="the decode host this agent ships to (a client may ask "
                                                      "for it)")


class AgentJob(_Model):
    """One agent's job: who it sits next to, what it serves, where its results go."""

    device: AgentDevice
    slots_path: Path = Field(description="the slot feed the worker writes (testbed_runtime/slots.py)")
    worker: str = Field(description="the worker this agent sits next to (names its owner on the timeline)")
    host: str = ""
    bubbletea: BubbleTeaSettings = BubbleTeaSettings()
    seed: int = Field(1, description="the scenario seed (the request stream is drawn from it)")
    out: Path = Field(description="the agent's summary JSON; `<out stem>.requests.jsonl` beside it gets one "
                                  "line per request")
    agent_index: int = Field(0, ge=0, description="this agent's shard of the cluster-wide request rate")
    agent_count: int = Field(1, ge=1, description="agents sharing the rate (1: this agent takes all of it)")
    duration_s: float = Field(600.0, gt=0, description="how long requests keep coming (the agent stops when "
                                                       "training ends anyway, and counts the rest as not arrived)")
    epoch: float | None = Field(None, description="time.time() of request time zero (none: the first slot announced)")
    gpu: GpuConfig | None = Field(None, description="the workload's gpu section: what a modelled prefill costs "
                                                    "(none: the agent's device defaults)")
    tp: int = Field(1, ge=1, description="tensor-parallel degree of the device")
    decode: KVDestination | None = Field(None, description="the decode server; none: TTFT ends with the prefill")
    base_dir: Path | None = Field(None, description="folder that relative paths (trace, gpu profile) are "
                                                    "relative to")
    wire_scale: float = Field(1.0, gt=0, le=1, description="wire size / true size of a modelled KV cache "
                                                           "(bubbletea.kv_wire_scale)")
    live: LivePaths | None = None
    iterations: int | None = Field(None, ge=1, description="training iterations of the run: requests stop "
                                                           "arriving a margin before the last one's planned end")
    nice: int | None = Field(None, ge=-20, le=19, description="CPU priority of the agent (negative: wakes "
                                                              "first; needs root)")
    realtime_holds: bool = Field(False, description="run each device hold at SCHED_FIFO 1 (needs root)")
    controller: ControllerAddress | None = Field(None, description="dispatch: controller: take work from it "
                                                                   "instead of a shard of the stream")


# --------------------------------------------------------------------------- what the runner reads back


class _ReadBack(BaseModel):
    """The part of a file written by the agent that the runner reads: the keys it uses,
    typed; the agent's other keys are its own and are ignored here."""

    model_config = ConfigDict(extra="ignore")


class AgentCountersRead(_ReadBack):
    """An agent summary's ``counters`` (bubbletea_agent/agent.py `Counters`), the ones
    the variant's ``bubbletea_agents`` sums."""

    not_arrived: int = 0
    chunks_run: int = 0
    late_starts: int = 0
    device_busy_retries: int = 0


class AgentConfigRead(_ReadBack):
    """An agent summary's ``config``: the admission window it ran with."""

    window: str | None = None


class AgentSummaryRead(_ReadBack):
    """An agent's summary (``<variant>/agents/<worker>.json``, bubbletea_agent/runtime.py),
    as the runner reads it for the variant's entry."""

    engine_mode: str | None = None
    counters: AgentCountersRead = Field(default_factory=AgentCountersRead)
    config: AgentConfigRead = Field(default_factory=AgentConfigRead)
