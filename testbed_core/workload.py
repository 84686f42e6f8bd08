"""Workload files: the model, its parallelism, the GPU type, and the scale.

A workload says *what* is trained (a decoder-only transformer's shape), *how* it is
split (dp x pp x tp, micro-batches, schedule) and *on what* (a named GPU and an
efficiency, or a measured profile). From it come the per-stage compute times and the
tensor sizes at pipeline boundaries (testbed_core/compute_model.py).

``scale`` lets a real-world setting run on the slower WAN one machine can emulate:
every tensor put on the wire is ``scale`` times its real size, so on an emulated link
of rate R it takes as long as the real tensor would on a link of rate ``R / scale``.
Compute times are not scaled, so transfer-to-compute ratios hold. Example: scale 0.1
on a 1 Gbit/s emulated link stands for 10 Gbit/s. The effective numbers are in
``Workload.effective()`` and every output states the scale.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import ConfigDict, Field, ValidationError, field_validator, model_validator

from testbed_core.compute_model import (
    GPUS,
    ComputeModel,
    ComputeModelError,
    GpuSpec,
    ModelSpec,
    activation_bytes,
    gpu_spec,
    load_profile,
    stage_flops,
)
from testbed_core.configfile import (
    ConfigError,
    ConfigModel,
    format_validation_error,
    read_yaml_mapping,
)
from testbed_core.constants import WORKLOADS_DIR

# Upper bounds of a workload's numbers: far above any model trained today, low enough
# that the compute model and the planner stay in range (an absurd value is a typo).
MAX_LAYERS = 10_000
MAX_WIDTH = 2**20  # hidden, ffn_hidden
MAX_SEQ_LEN = 2**24
MAX_VOCAB = 2**24
MAX_HEADS = 2**14
MAX_DP = 100_000
MAX_PP = 10_000
MAX_TP = 1024
MAX_MICRO_BATCH = 2**16
MAX_MICRO_BATCHES = 2**16
MAX_CHUNKS = 64
MAX_ITERATIONS = 100_000
MAX_TFLOPS = 1e6  # per GPU; today's largest are a few thousand
MAX_MEMORY_GBS = 1e6


class WorkloadError(ConfigError):
    """A workload file that cannot be used; the message names file, field and fix."""


class _Model(ConfigModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ModelConfig(_Model):
    """A decoder-only transformer. Defaults follow GPT-2/GPT-3 (4h MLP, biases,
    learned positions, tied embeddings); set the rest for Llama-style models."""

    name: str = "model"  # the model's name, shown by `testbed plan` and in real-mode messages
    # transformer layers, split over pp x chunks pipeline stages (earlier stages take the remainder)
    layers: int = Field(ge=1, le=MAX_LAYERS)
    hidden: int = Field(ge=1, le=MAX_WIDTH)  # model width h: the size of every token's activation vector
    # tokens per sequence: with micro_batch and hidden it sets the activation tensor sent between stages
    seq_len: int = Field(ge=1, le=MAX_SEQ_LEN)
    vocab: int = Field(ge=1, le=MAX_VOCAB)  # vocabulary size: the embedding's and the output layer's rows
    heads: int = Field(ge=1, le=MAX_HEADS)  # attention heads; hidden must be a multiple, tp must divide it
    kv_heads: int | None = Field(None, ge=1, le=MAX_HEADS, description="grouped-query attention; default = heads")
    ffn_hidden: int | None = Field(None, ge=1, le=MAX_WIDTH, description="MLP width; default 4 x hidden")
    gated_mlp: bool = False  # true: a gated (SwiGLU) MLP with three weight matrices instead of two
    bias: bool = True  # biases in the linear layers and layer norms (false: none, as in Llama)
    # learned: a position embedding of seq_len x hidden on the first stage; rotary: none (RoPE)
    positional: Literal["learned", "rotary"] = "learned"
    # the output layer shares the input embedding's weight (not counted twice); real mode always
    # keeps its own LM head (testbed/training/model.py says why)
    tied_embeddings: bool = True
    # number format of weights and activations: bytes per value on the wire and the GPU's peak for it
    dtype: Literal["bf16", "fp16", "fp32"] = "bf16"

    @model_validator(mode="after")
    def _shape(self) -> ModelConfig:
        if self.hidden % self.heads:
            raise ValueError(f"hidden ({self.hidden}) must be a multiple of heads ({self.heads})")
        if self.kv_heads is not None and self.heads % self.kv_heads:
            raise ValueError(f"heads ({self.heads}) must be a multiple of kv_heads ({self.kv_heads})")
        return self

    def spec(self) -> ModelSpec:
        return ModelSpec(
            layers=self.layers, hidden=self.hidden, heads=self.heads, seq_len=self.seq_len,
            vocab=self.vocab, kv_heads=self.kv_heads, ffn_hidden=self.ffn_hidden,
            gated_mlp=self.gated_mlp, bias=self.bias, positional=self.positional,
            tied_embeddings=self.tied_embeddings, dtype=self.dtype,
        )


class Parallelism(_Model):
    dp: int = Field(1, ge=1, le=MAX_DP, description="data-parallel pipelines (kept inside a DC by Atlas)")
    pp: int = Field(1, ge=1, le=MAX_PP, description="pipeline stages (the only parallelism that crosses the WAN)")
    tp: int = Field(1, ge=1, le=MAX_TP, description="tensor-parallel GPUs per stage (inside a host group)")
    micro_batch: int = Field(1, ge=1, le=MAX_MICRO_BATCH, description="sequences per micro-batch")
    num_micro_batches: int = Field(ge=1, le=MAX_MICRO_BATCHES, description="micro-batches per iteration per pipeline")
    # pipeline schedule: gpipe (all forwards, then all backwards), 1f1b, or interleaved-1f1b (needs
    # chunks >= 2 and num_micro_batches a multiple of pp)
    schedule: Literal["gpipe", "1f1b", "interleaved-1f1b"] = "1f1b"
    chunks: int = Field(1, ge=1, le=MAX_CHUNKS, description="model chunks per stage (interleaved-1f1b only)")
    # recompute each layer's forward during its backward (backward costs 3x the forward instead of 2x)
    activation_recompute: bool = False

    @model_validator(mode="after")
    def _schedule(self) -> Parallelism:
        if self.schedule == "interleaved-1f1b":
            if self.chunks < 2:
                raise ValueError("schedule interleaved-1f1b needs chunks >= 2 (model chunks per stage)")
            if self.num_micro_batches % self.pp:
                raise ValueError(
                    f"schedule interleaved-1f1b needs num_micro_batches ({self.num_micro_batches}) "
                    f"to be a multiple of pp ({self.pp})"
                )
        elif self.chunks != 1:
            raise ValueError(f"chunks={self.chunks} needs schedule interleaved-1f1b (got {self.schedule})")
        return self


class GpuConfig(_Model):
    type: str = Field(description=f"one of {', '.join(GPUS)} or custom")
    efficiency: float = Field(0.5, gt=0, le=1, description="fraction of peak the kernels sustain (MFU)")
    peak_tflops: float | None = Field(None, gt=0, le=MAX_TFLOPS, description="custom GPUs: dense peak for the model dtype")
    memory_bandwidth_gbs: float | None = Field(None, gt=0, le=MAX_MEMORY_GBS, description="custom GPUs: GB/s")
    profile: str | None = Field(None, description="measured op times (YAML/JSON), relative to the workload file")
    mode: Literal["modelled", "real"] = Field(
        "modelled", description="modelled: work lasts the compute model's time; real: the stages are real torch "
                                "modules trained on this machine (CUDA when present, else CPU; see `real:`)"
    )

    @field_validator("type")
    @classmethod
    def _known(cls, value: str) -> str:
        if value.lower() == "custom":
            return "custom"
        try:
            return gpu_spec(value).name
        except ComputeModelError:
            raise ValueError(f"unknown GPU type {value!r} (allowed: {', '.join(GPUS)}, custom)") from None

    @model_validator(mode="after")
    def _custom(self) -> GpuConfig:
        if self.type == "custom" and self.peak_tflops is None:
            raise ValueError("type custom needs peak_tflops (dense TFLOP/s for the model dtype)")
        if self.type != "custom" and (self.peak_tflops is not None or self.memory_bandwidth_gbs is not None):
            raise ValueError(f"peak_tflops/memory_bandwidth_gbs are for type custom; {self.type} has datasheet figures")
        return self

    def spec(self, dtype: str) -> GpuSpec:
        if self.type != "custom":
            return gpu_spec(self.type)
        peak = self.peak_tflops * 1e12  # type: ignore[operator]
        return GpuSpec("custom", {dtype: peak}, (self.memory_bandwidth_gbs or 1e3) * 1e9, 0.0, "workload file")


class RealOptimizer(_Model):
    """The optimizer of real-mode training (testbed/training/real_work.py `OptimConfig`)."""

    kind: Literal["sgd", "adam"] = "sgd"  # torch.optim.SGD or torch.optim.Adam
    lr: float = Field(0.05, gt=0, le=100)  # learning rate
    momentum: float = Field(0.0, ge=0, lt=1)  # SGD momentum (kind sgd only)
    betas: tuple[float, float] = (0.9, 0.999)  # Adam's decay rates of the gradient's mean and square (kind adam only)
    eps: float = Field(1e-8, gt=0)  # Adam's term added to the denominator (kind adam only)
    weight_decay: float = Field(0.0, ge=0)  # L2 penalty added to the gradients (both kinds)


class RealSettings(_Model):
    """What the workers train when ``gpu.mode: real`` (ignored for modelled GPUs)."""

    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="torch device: auto = CUDA when present")
    seed: int = Field(0, ge=0, le=2**63 - 1, description="initial parameters and synthetic data")
    optimizer: RealOptimizer = RealOptimizer()  # the optimizer every stage trains its parameters with
    threads: int = Field(1, ge=1, le=64, description="torch intra-op threads per worker on CPU (the one-process "
                                                     "reference uses as many: the bit-for-bit check needs it)")
    cpu_max_params: int = Field(25_000_000, ge=1, le=10**13, description="largest model (parameters) trained on a CPU; "
                                                              "bigger ones need CUDA")
    check: bool = Field(True, description="compare the trained parameters with the one-process reference")


class Workload(_Model):
    name: str  # the workload's name, written into run records and shown by `testbed plan`
    description: str = ""  # free text: what the workload stands for
    model: ModelConfig  # the transformer trained: its shape and number format
    parallelism: Parallelism  # how it is split: dp x pp x tp, micro-batches, pipeline schedule
    gpu: GpuConfig  # the GPU each stage runs on and how its compute time is found (modelled or real)
    iterations: int = Field(5, ge=1, le=MAX_ITERATIONS, description="measured iterations, after warm-up")
    warmup: int = Field(1, ge=0, le=MAX_ITERATIONS, description="iterations run first and not measured")
    scale: float = Field(
        1.0, gt=0, le=1,
        description="wire size / real size of every tensor; an emulated link of rate R stands for R/scale",
    )
    real: RealSettings = RealSettings()  # what the workers train with gpu.mode: real (ignored when modelled)

    @model_validator(mode="after")
    def _fits(self) -> Workload:
        par = self.parallelism
        stages = par.pp * par.chunks
        if self.model.layers < stages:
            raise ValueError(
                f"model.layers ({self.model.layers}) must be at least pp x chunks ({stages}): "
                "every pipeline stage needs a layer"
            )
        if self.model.heads % par.tp:
            raise ValueError(f"parallelism.tp ({par.tp}) must divide model.heads ({self.model.heads})")
        if self.gpu.mode == "real" and self.scale != 1:
            raise ValueError(
                f"gpu.mode real sends the real activations and gradients, so scale must be 1 (got {self.scale:g}); "
                "set scale: 1, or use gpu.mode: modelled to send scaled placeholder tensors"
            )
        return self

    # ------------------------------------------------------------ derived

    def model_spec(self) -> ModelSpec:
        return self.model.spec()

    def compute_model(self, base_dir: str | Path | None = None) -> ComputeModel:
        """Compute model of one stage's TP group; a relative profile path is read
        from `base_dir` (the workload file's folder)."""
        profile = None
        if self.gpu.profile:
            path = Path(self.gpu.profile)
            if not path.is_absolute() and base_dir is not None:
                path = Path(base_dir) / path
            try:
                profile = load_profile(path)
            except ComputeModelError as exc:
                raise WorkloadError(f"gpu.profile: {exc}") from None
        return ComputeModel(
            self.gpu.spec(self.model.dtype), dtype=self.model.dtype, efficiency=self.gpu.efficiency,
            tp=self.parallelism.tp, profile=profile,
        )

    def effective(self, base_dir: str | Path | None = None) -> EffectiveWorkload:
        par = self.parallelism
        spec = self.model_spec()
        cm = self.compute_model(base_dir)
        vstages = par.pp * par.chunks
        flops = stage_flops(spec, vstages, par.micro_batch, recompute=par.activation_recompute)
        fwd, bwd = [], []
        for i, st in enumerate(flops):
            weights = st.params * spec.dtype_bytes
            fwd.append(cm.seconds(st.forward, bytes_moved=weights, op="forward", stage=i))
            bwd.append(cm.seconds(st.backward, bytes_moved=2 * weights, op="backward", stage=i))
        act = activation_bytes(spec, par.micro_batch)
        return EffectiveWorkload(
            name=self.name,
            scale=self.scale,
            stages=vstages,
            stage_layers=[st.layers for st in flops],
            stage_params=[st.params for st in flops],
            stage_forward_flops=[st.forward for st in flops],
            stage_backward_flops=[st.backward for st in flops],
            stage_forward_s=fwd,
            stage_backward_s=bwd,
            activation_bytes=act,
            wire_activation_bytes=max(1, round(act * self.scale)),
            effective_tflops=cm.effective_flops / 1e12,
        )


@dataclass(frozen=True)
class EffectiveWorkload:
    """The numbers a run uses, derived from the workload file.

    Per (virtual) stage and micro-batch: forward/backward seconds of compute.
    Per boundary and micro-batch: real activation bytes (gradients are the same size)
    and the bytes actually sent on the emulated wire (real x scale).
    """

    name: str
    scale: float
    stages: int
    stage_layers: list[int]
    stage_params: list[int]
    stage_forward_flops: list[float]
    stage_backward_flops: list[float]
    stage_forward_s: list[float]
    stage_backward_s: list[float]
    activation_bytes: int
    wire_activation_bytes: int
    effective_tflops: float

    def represented_rate(self, emulated_rate_bps: float) -> float:
        """The real-world link an emulated link stands for at this scale."""
        return emulated_rate_bps / self.scale

    def scale_note(self, emulated_rate_bps: float | None = None) -> str:
        if self.scale == 1:
            return "scale 1: tensors are sent at their real size"
        note = f"scale {self.scale:g}: tensors are sent at {self.scale:g}x their real size"
        if emulated_rate_bps:
            from testbed_core.units import format_rate

            note += (
                f", so an emulated {format_rate(emulated_rate_bps)}/s link stands for "
                f"{format_rate(self.represented_rate(emulated_rate_bps))}/s"
            )
        return note

    def to_json(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def parse_workload(data: Any, source: str = "<workload>") -> Workload:
    if not isinstance(data, dict):
        raise WorkloadError(f"{source}: a workload file must be a YAML mapping with 'model', 'parallelism' and 'gpu'")
    clean = {k: v for k, v in data.items() if not str(k).startswith("_")}
    try:
        return Workload.model_validate(clean)
    except ValidationError as exc:
        raise WorkloadError(format_validation_error(source, exc, "workload")) from None


def load_workload(path: str | Path) -> Workload:
    """Read and validate a workload file; errors name the file and the field."""
    path = Path(path)
    shipped = sorted(p.name for p in WORKLOADS_DIR.glob("*.yaml"))
    hint = f" (shipped workloads in scenarios/workloads/: {', '.join(shipped)})" if shipped else ""
    return parse_workload(read_yaml_mapping(path, "workload", WorkloadError, missing_hint=hint), str(path))
