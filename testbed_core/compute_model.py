"""How long a piece of GPU work takes: named GPUs, transformer FLOPs, tensor sizes.

The emulated device (testbed_runtime/device.py) holds itself busy for the time this module
predicts, so the formulas here decide what the testbed's GPUs "do". Sources:

* FLOPs of a transformer layer: Narayanan et al., "Efficient Large-Scale Language
  Model Training on GPU Clusters Using Megatron-LM", SC'21 (arXiv 2104.04473), Sec. 5.1:
  a layer's forward pass costs ``24*B*s*h^2 + 4*B*s^2*h`` FLOPs (the 2*m*n*k rule for
  each matmul: QKV and output projections 8Bsh^2, the 4h MLP 16Bsh^2, attention scores
  and attention-over-values 4Bs^2h) and the logit layer ``2*B*s*h*V``; the backward
  pass costs twice the forward (gradients w.r.t. inputs and w.r.t. weights), three
  times with activation recomputation (not applied to the logit layer). Their
  per-iteration totals ``96*B*s*l*h^2*(1 + s/(6h) + V/(16*l*h))`` (recomputation) and
  ``72*B*s*l*h^2*(1 + s/(6h) + V/(12*l*h))`` (without) are the sums of these terms
  (tested, as is the match with torch's FlopCounterMode on a transformers GPT-2).
  We generalise the projections to grouped-query attention (kv_heads < heads) and the
  MLP to any width, gated or not, by counting each matmul with the same 2*m*n*k rule.
  Attention is counted over the full s x s score matrix, as Narayanan et al. do
  (causal kernels skip about half of it; the efficiency factor absorbs that).
* Forward FLOPs ~ 2 x parameters x tokens: Kaplan et al., "Scaling Laws for Neural
  Language Models" (arXiv 2001.08361), Sec. 2.1; used for the prefill sanity check.
* GPU peaks: NVIDIA datasheets (dense tensor-core figures; the datasheets print the
  2:4-sparsity figure, twice the dense one, for H100/H200), cited at each entry.

A run time is a roofline: ``max(FLOPs / (peak * efficiency), bytes / (bandwidth *
efficiency))``; training micro-batches are compute-bound, short prefill chunks are
bound by reading the weights. A measured profile file overrides the model per op.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from testbed_core.configfile import ConfigError, load_yaml_text, read_text

DTYPE_BYTES: dict[str, int] = {"bf16": 2, "fp16": 2, "fp32": 4}

#: Backward pass / forward pass FLOPs (Narayanan et al. 2021, Sec. 5.1).
BACKWARD_FACTOR = 2.0
#: ... with full activation recomputation (one extra forward in the backward).
BACKWARD_FACTOR_RECOMPUTE = 3.0


class ComputeModelError(ConfigError):
    """A GPU, profile or model description the compute model cannot use."""


@dataclass(frozen=True)
class GpuSpec:
    """Peak dense throughput per dtype (FLOP/s) and memory (bytes, bytes/s)."""

    name: str
    peak_flops: dict[str, float]
    memory_bandwidth: float
    memory_bytes: float
    source: str = ""

    def peak(self, dtype: str) -> float:
        try:
            return self.peak_flops[dtype]
        except KeyError:
            raise ComputeModelError(
                f"GPU {self.name} has no peak figure for dtype {dtype!r} "
                f"(known: {', '.join(sorted(self.peak_flops))})"
            ) from None


T = 1e12


def _datasheet(name: str, tensor_tflops: float, fp32_tflops: float, memory_bandwidth: float, memory_bytes: float,
               source: str) -> GpuSpec:
    """A GPU from its datasheet: BF16 and FP16 tensor throughput (dense, the same
    figure for both), FP32, memory bandwidth (bytes/s) and size (bytes)."""
    tensor = tensor_tflops * T
    return GpuSpec(name, {"bf16": tensor, "fp16": tensor, "fp32": fp32_tflops * T},
                   memory_bandwidth=memory_bandwidth, memory_bytes=memory_bytes, source=source)


GPUS: dict[str, GpuSpec] = {gpu.name: gpu for gpu in (
    # NVIDIA A100 Tensor Core GPU datasheet (A100 80GB SXM): BF16/FP16 tensor 312
    # TFLOPS dense (624 with sparsity), FP32 19.5 TFLOPS, HBM2e 2,039 GB/s, 80 GB.
    _datasheet("A100", 312, 19.5, 2039e9, 80e9, "NVIDIA A100 datasheet, A100 80GB SXM"),
    # NVIDIA H100 Tensor Core GPU datasheet (H100 SXM): BF16/FP16 tensor 1,979
    # TFLOPS with sparsity = 989.5 dense, FP32 67 TFLOPS, HBM3 3.35 TB/s, 80 GB.
    _datasheet("H100", 989.5, 67, 3.35e12, 80e9, "NVIDIA H100 datasheet, H100 SXM"),
    # NVIDIA H200 Tensor Core GPU datasheet (H200 SXM): same compute as H100 SXM
    # (BF16/FP16 1,979 TFLOPS sparse = 989.5 dense, FP32 67), HBM3e 4.8 TB/s, 141 GB.
    _datasheet("H200", 989.5, 67, 4.8e12, 141e9, "NVIDIA H200 datasheet, H200 SXM"),
)}


def gpu_spec(name: str) -> GpuSpec:
    """Look up a named GPU (case-insensitive)."""
    for key, spec in GPUS.items():
        if key.lower() == name.lower():
            return spec
    raise ComputeModelError(f"unknown GPU {name!r} (known: {', '.join(GPUS)}, or 'custom' with peak_tflops)")


@dataclass(frozen=True)
class ModelSpec:
    """The shape of a decoder-only transformer (GPT-2/GPT-3/Llama family)."""

    layers: int
    hidden: int
    heads: int
    seq_len: int
    vocab: int
    kv_heads: int | None = None
    ffn_hidden: int | None = None
    gated_mlp: bool = False
    bias: bool = True
    positional: Literal["learned", "rotary"] = "learned"
    tied_embeddings: bool = True
    dtype: str = "bf16"

    def __post_init__(self) -> None:
        for name in ("layers", "hidden", "heads", "seq_len", "vocab"):
            if getattr(self, name) < 1:
                raise ComputeModelError(f"model.{name} must be at least 1, got {getattr(self, name)}")
        if self.hidden % self.heads:
            raise ComputeModelError(f"model.hidden ({self.hidden}) must be a multiple of model.heads ({self.heads})")
        if self.heads % self.n_kv_heads:
            raise ComputeModelError(f"model.heads ({self.heads}) must be a multiple of model.kv_heads ({self.n_kv_heads})")
        if self.dtype not in DTYPE_BYTES:
            raise ComputeModelError(f"model.dtype {self.dtype!r} is not one of {', '.join(DTYPE_BYTES)}")

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def n_kv_heads(self) -> int:
        return self.kv_heads or self.heads

    @property
    def kv_dim(self) -> int:
        return self.n_kv_heads * self.head_dim

    @property
    def ffn(self) -> int:
        return self.ffn_hidden or 4 * self.hidden

    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]


# ----------------------------------------------------------------- parameters

def layer_params(m: ModelSpec) -> int:
    """Parameters of one transformer layer (attention, MLP, two layer norms)."""
    h = m.hidden
    mats = 3 if m.gated_mlp else 2
    attn = h * (h + 2 * m.kv_dim) + h * h
    mlp = mats * h * m.ffn
    norms = 2 * 2 * h  # two LayerNorms, weight and bias
    biases = (h + 2 * m.kv_dim + h + (mats - 1) * m.ffn + h) if m.bias else 0
    return attn + mlp + norms + biases


def embedding_params(m: ModelSpec) -> int:
    """Token embedding, plus learned position embeddings (none with rotary positions)."""
    return m.vocab * m.hidden + (m.seq_len * m.hidden if m.positional == "learned" else 0)


def head_params(m: ModelSpec) -> int:
    """Final layer norm, plus the output projection unless tied to the embedding."""
    return 2 * m.hidden + (0 if m.tied_embeddings else m.vocab * m.hidden)


def param_count(m: ModelSpec) -> int:
    """All parameters of the model (tested against the published GPT-2 small count)."""
    return embedding_params(m) + m.layers * layer_params(m) + head_params(m)


# ---------------------------------------------------------------------- FLOPs

def layer_forward_flops(m: ModelSpec, micro_batch: int, seq_len: int | None = None) -> float:
    """One layer's forward FLOPs for `micro_batch` sequences of `seq_len` tokens.

    Narayanan et al. 2021: 24*B*s*h^2 + 4*B*s^2*h for a 4h MLP and full attention.
    """
    s = seq_len or m.seq_len
    tokens = micro_batch * s
    h = m.hidden
    mats = 3 if m.gated_mlp else 2
    projections = 2 * tokens * (h * h + 2 * h * m.kv_dim + h * h)  # Q, K, V, output
    mlp = 2 * tokens * mats * h * m.ffn
    attention = 4 * micro_batch * s * s * h  # scores QK^T and scores x V
    return float(projections + mlp + attention)


def logits_forward_flops(m: ModelSpec, micro_batch: int, seq_len: int | None = None) -> float:
    """The output projection to the vocabulary: 2*B*s*h*V."""
    s = seq_len or m.seq_len
    return float(2 * micro_batch * s * m.hidden * m.vocab)


def backward_factor(recompute: bool) -> float:
    """Backward FLOPs per forward FLOP of a transformer layer."""
    return BACKWARD_FACTOR_RECOMPUTE if recompute else BACKWARD_FACTOR


def stage_layers(layers: int, stages: int) -> list[int]:
    """Layers per pipeline stage: as even as possible, earlier stages take the remainder."""
    if stages < 1 or layers < stages:
        raise ComputeModelError(f"cannot split {layers} layers into {stages} pipeline stages (need layers >= stages)")
    base, extra = divmod(layers, stages)
    return [base + (1 if i < extra else 0) for i in range(stages)]


@dataclass(frozen=True)
class StageFlops:
    layers: int
    forward: float
    backward: float
    params: int


def stage_flops(m: ModelSpec, stages: int, micro_batch: int, *, recompute: bool = False) -> list[StageFlops]:
    """Forward/backward FLOPs of one micro-batch on each pipeline stage.

    The embedding lookup (no FLOPs worth counting) sits on the first stage, the
    logits on the last one, as in Megatron-LM.
    """
    out = []
    split = stage_layers(m.layers, stages)
    for i, n in enumerate(split):
        fwd = n * layer_forward_flops(m, micro_batch)
        bwd = fwd * backward_factor(recompute)
        params = n * layer_params(m)
        if i == 0:
            params += embedding_params(m)
        if i == stages - 1:
            logits = logits_forward_flops(m, micro_batch)
            fwd += logits
            bwd += logits * BACKWARD_FACTOR  # the logit layer is not recomputed
            params += head_params(m)
        out.append(StageFlops(n, fwd, bwd, params))
    return out


def prefill_flops(m: ModelSpec, tokens: int, *, all_logits: bool = False) -> float:
    """Forward FLOPs of prefilling a prompt of `tokens` tokens (batch 1).

    Only the last position's logits are needed to sample the first output token.
    """
    if tokens < 1:
        raise ComputeModelError(f"a prompt has at least one token, got {tokens}")
    logits = logits_forward_flops(m, 1, tokens) if all_logits else logits_forward_flops(m, 1, 1)
    return m.layers * layer_forward_flops(m, 1, tokens) + logits


# ----------------------------------------------------------------- tensor sizes

def activation_bytes(m: ModelSpec, micro_batch: int, seq_len: int | None = None) -> int:
    """Bytes crossing a pipeline boundary per micro-batch, each way:
    micro_batch x seq_len x hidden x bytes_per_elem (activations forward, their
    gradients backward, same shape)."""
    return micro_batch * (seq_len or m.seq_len) * m.hidden * m.dtype_bytes


# --------------------------------------------------------------- measured profiles

@dataclass(frozen=True)
class Profile:
    """Measured op times that override the model.

    File format (YAML or JSON): ``{ops: {name: seconds}}`` or the bare mapping.
    Names: ``forward``/``backward`` (any stage), ``forward/stage1`` (one stage),
    ``prefill/512`` (a prompt of 512 tokens; other lengths are interpolated
    linearly between measured lengths, and extrapolated from the two nearest).
    """

    ops: dict[str, float]
    path: str = "<profile>"

    def lookup(self, op: str, *, stage: int | None = None, tokens: int | None = None) -> float | None:
        if stage is not None and f"{op}/stage{stage}" in self.ops:
            return self.ops[f"{op}/stage{stage}"]
        if tokens is not None:
            if f"{op}/{tokens}" in self.ops:
                return self.ops[f"{op}/{tokens}"]
            points = sorted(
                (int(k.split("/", 1)[1]), v)
                for k, v in self.ops.items()
                if k.startswith(op + "/") and k.split("/", 1)[1].isdigit()
            )
            if len(points) == 1:
                n, secs = points[0]
                return secs * tokens / n
            if len(points) >= 2:
                lo, hi = points[0], points[1]
                for a, b in zip(points, points[1:], strict=False):
                    lo, hi = a, b
                    if tokens <= b[0]:
                        break
                (n0, t0), (n1, t1) = lo, hi
                return max(0.0, t0 + (t1 - t0) * (tokens - n0) / (n1 - n0))
        return self.ops.get(op)


def load_profile(path: str | Path) -> Profile:
    """Read a measured profile (YAML, or JSON by suffix); errors name the file and the op."""
    path = Path(path)
    text = read_text(path, "profile", ComputeModelError)  # a regular UTF-8 file of sane size
    if path.suffix == ".json":
        try:
            data = json.loads(text)
        except (json.JSONDecodeError, RecursionError) as exc:
            raise ComputeModelError(f"{path}: not valid JSON: {exc}") from None
    else:
        data = load_yaml_text(text, str(path), "profile", ComputeModelError)
    if isinstance(data, dict) and "ops" in data:
        data = data["ops"]
    if not isinstance(data, dict) or not data:
        raise ComputeModelError(f"{path}: a profile is a mapping of op name to seconds, e.g. 'forward: 0.012'")
    ops: dict[str, float] = {}
    for key, value in data.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0 or not math.isfinite(value):
            raise ComputeModelError(f"{path}: ops.{key}: expected seconds as a non-negative number, got {value!r}")
        ops[str(key)] = float(value)
    return Profile(ops, str(path))


# ------------------------------------------------------------------ the model

@dataclass(frozen=True)
class ComputeModel:
    """Run time of work on one (possibly tensor-parallel) GPU group.

    With tensor parallelism the FLOPs and weight bytes are split evenly over `tp`
    GPUs; TP's own communication (inside a DC, NVLink) is not modelled.
    """

    gpu: GpuSpec
    dtype: str = "bf16"
    efficiency: float = 0.5
    tp: int = 1
    profile: Profile | None = field(default=None)

    def __post_init__(self) -> None:
        if not 0 < self.efficiency <= 1:
            raise ComputeModelError(f"efficiency must be in (0, 1], got {self.efficiency}")
        if self.tp < 1:
            raise ComputeModelError(f"tp must be at least 1, got {self.tp}")
        self.gpu.peak(self.dtype)

    @property
    def effective_flops(self) -> float:
        """Sustained FLOP/s of the TP group."""
        return self.gpu.peak(self.dtype) * self.efficiency * self.tp

    def seconds(
        self,
        flops: float,
        *,
        bytes_moved: float = 0.0,
        op: str | None = None,
        stage: int | None = None,
        tokens: int | None = None,
    ) -> float:
        """Roofline time of `flops` (plus `bytes_moved` of memory traffic), unless
        the profile has a measurement for `op`."""
        if op is not None and self.profile is not None:
            measured = self.profile.lookup(op, stage=stage, tokens=tokens)
            if measured is not None:
                return measured
        compute = flops / self.effective_flops
        memory = bytes_moved / (self.gpu.memory_bandwidth * self.efficiency * self.tp)
        return max(compute, memory)

    def prefill_seconds(self, m: ModelSpec, tokens: int) -> float:
        """Prefill of a prompt through the whole model on this GPU group: the roofline
        of its FLOPs and of reading the layers' weights once (BubbleTea's engine charges
        its chunks by the same rule, and its tests compare against this)."""
        weights = m.layers * layer_params(m) * m.dtype_bytes
        return self.seconds(prefill_flops(m, tokens), bytes_moved=weights, op="prefill", tokens=tokens)
