"""Prefill engines: turn a prompt (or a chunk of one) into a KV cache on the device.

Two modes, and every result says which one ran:

* `real`: a Llama-architecture model from `transformers` (LlamaConfig/LlamaForCausalLM),
  random weights from a seed by default or local weights from a directory (never the hub),
  on the GPU when there is one, on the CPU for small sizes. Its forward pass runs inside
  `Device.run(fn=...)`, so the device timeline holds the real time it took.
* `modelled`: the device is held for the time the compute model charges for this model
  size (`Device.run(flops=...)`), and the KV cache is a tensor of the model's true shape
  and dtype. Caches too large to hold are materialised scaled down (fewer layers first,
  then fewer tokens) and say so: `KVCache.scale` < 1, `logical_shape` the true shape.

The model's shape is a `PrefillModelSpec` (testbed_core/contracts/bubbletea.py: the
scenario validates it too); the torch side of it (dtype, LlamaConfig) is here.

KV layout: `keys` and `values` are each [layers, batch, kv_heads, tokens, head_dim]
(per layer: [batch, kv_heads, tokens, head_dim], the layout of transformers' caches).

Requests carry prompt lengths, not text: the real engine's prompt is a synthetic one drawn
from the model's seed and the request id (`synthetic_prompt`), the same for every chunk of
the request and reproducible elsewhere, so a decode host with the same model can check a
received cache against the model run in one process (bubbletea_agent/decode_check.py).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch

from testbed_core.contracts.bubbletea import PrefillModelSpec

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}

class EngineError(RuntimeError):
    """The prefill engine cannot be built or run as configured; says what to change."""


class StartedLate(Exception):  # noqa: N818 - a signal, not a failure
    """Raised by a start check inside the device hold: the device came too late for the
    chunk to fit its slot, so nothing ran (the hold ends at once, nothing is recorded)."""


StartCheck = Callable[[], None]


def torch_dtype(spec: PrefillModelSpec) -> torch.dtype:
    """The torch dtype of the model's weights and KV cache."""
    return _DTYPES[spec.dtype]


def llama_config(spec: PrefillModelSpec) -> Any:
    """The transformers LlamaConfig of this shape."""
    from transformers import LlamaConfig

    fields = {k: getattr(spec, k) for k in (
        "num_hidden_layers", "hidden_size", "intermediate_size", "num_attention_heads",
        "num_key_value_heads", "vocab_size", "max_position_embeddings")}
    if spec.head_dim:
        fields["head_dim"] = spec.head_dim
    return LlamaConfig(**fields)


def compute_spec(spec: PrefillModelSpec) -> Any:
    """The same model in the compute model's terms (Llama: gated MLP, no biases, rotary
    positions, untied head)."""
    from testbed_core.compute_model import ModelSpec as CMSpec

    if spec.head_dim and spec.head_dim * spec.num_attention_heads != spec.hidden_size:
        raise EngineError(f"head_dim {spec.head_dim} x {spec.num_attention_heads} heads != hidden_size "
                          f"{spec.hidden_size}: the compute model cannot charge this shape")
    return CMSpec(layers=spec.num_hidden_layers, hidden=spec.hidden_size, heads=spec.num_attention_heads,
                  seq_len=spec.max_position_embeddings, vocab=spec.vocab_size,
                  kv_heads=spec.num_key_value_heads, ffn_hidden=spec.intermediate_size, gated_mlp=True,
                  bias=False, positional="rotary", tied_embeddings=False,
                  dtype={"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}[spec.dtype])


def chunk_flops(cm_spec: Any, tokens: int, context: int = 0) -> float:
    """Forward FLOPs of `tokens` new tokens after `context` cached ones, counted as the
    compute model counts a prompt (Narayanan et al.: full score matrix, 4*s^2*h per layer
    for a whole prompt; a chunk's queries see context + tokens keys), logits for the last
    position only. With context 0 this is `compute_model.prefill_flops`."""
    from testbed_core.compute_model import layer_forward_flops, logits_forward_flops

    per_layer = layer_forward_flops(cm_spec, 1, tokens) + 4.0 * tokens * context * cm_spec.hidden
    return cm_spec.layers * per_layer + logits_forward_flops(cm_spec, 1, 1)


def compute_model_charge(spec: PrefillModelSpec, compute_model: Any) -> Callable[[int, int], float]:
    """seconds(tokens, context) the compute model charges for a prefill chunk: the
    roofline of its FLOPs and of reading the weights once."""
    from testbed_core.compute_model import layer_params

    cm_spec = compute_spec(spec)
    weights = cm_spec.layers * layer_params(cm_spec) * cm_spec.dtype_bytes

    def seconds(tokens: int, context: int = 0) -> float:
        if tokens <= 0:
            return 0.0
        return compute_model.seconds(chunk_flops(cm_spec, tokens, context), bytes_moved=weights,
                                     op="prefill", tokens=tokens)

    return seconds


@dataclass
class KVCache:
    """The KV cache of one prefilled prompt, ready to ship."""

    keys: torch.Tensor  # [layers, batch, kv_heads, tokens, head_dim], maybe scaled down
    values: torch.Tensor
    logical_shape: tuple[int, ...]  # the model's true shape of `keys`
    mode: str  # "real" or "modelled"
    first_token: int | None = None  # real engine: the token the prefill produced (argmax of its last logits)

    @property
    def tokens(self) -> int:
        return self.logical_shape[3]

    @property
    def materialised_bytes(self) -> int:
        return (self.keys.numel() + self.values.numel()) * self.keys.element_size()

    @property
    def logical_bytes(self) -> int:
        return 2 * math.prod(self.logical_shape) * self.keys.element_size()

    @property
    def scale(self) -> float:
        """Materialised bytes / true bytes (1.0: the whole cache is here)."""
        return self.materialised_bytes / self.logical_bytes if self.logical_bytes else 1.0


@dataclass
class ChunkResult:
    record: Any  # the device's WorkRecord for this chunk
    partial: Any  # engine state to continue from (pass to the next chunk or finish())


class DeviceLike(Protocol):
    """The part of testbed_runtime.device.Device the agent uses."""

    mode: str
    time_scale: float

    def run(self, kind: str, owner: str, *, flops: float | None = None,
            duration_s: float | None = None, fn: Callable[[], Any] | None = None,
            label: str = "") -> Any: ...

    def try_run(self, kind: str, owner: str, *, flops: float | None = None,
                duration_s: float | None = None, fn: Callable[[], Any] | None = None,
                label: str = "") -> Any | None: ...

    def timeline(self, since: float | None = None) -> list[Any]: ...


class PrefillEngine(Protocol):
    mode: str
    spec: PrefillModelSpec

    def run_chunk(self, device: DeviceLike, owner: str, label: str, tokens: int,
                  context: int, partial: Any, final: bool = False,
                  start_check: StartCheck | None = None, **lease: Any) -> ChunkResult | None:
        """Run one chunk if the device is free right now (never queue behind training);
        None if it was busy. With `final` the KV cache is made ready inside the same
        device hold (as an engine copies it out), so `finish` costs nothing more.
        `start_check` runs first inside the hold and may raise StartedLate (which
        propagates: nothing ran)."""
        ...

    def finish(self, partial: Any) -> KVCache: ...


# --------------------------------------------------------------------------- real


def synthetic_prompt(seed: int, request_id: str, tokens: int, vocab: int) -> torch.Tensor:
    """Token ids [1, tokens] of request `request_id`'s synthetic prompt: drawn from a generator
    seeded by the model's seed and the request id (xxh64), so every chunk of a request and
    every host holding the same model sees the same prompt."""
    import xxhash

    gen = torch.Generator().manual_seed(xxhash.xxh64_intdigest(f"{seed}:{request_id}".encode()) & ((1 << 63) - 1))
    return torch.randint(0, vocab, (1, tokens), generator=gen)


def request_of(label: str) -> str:
    """The request id in a chunk label `<request id>:<chunk>:<tokens>` (agent.py)."""
    return label.rsplit(":", 2)[0]


def pick_torch_device(prefer: str = "auto") -> str:
    if prefer != "auto":
        return prefer
    return "cuda" if torch.cuda.is_available() else "cpu"


class TransformersEngine:
    """A real Llama model that prefills on the GPU (or the CPU for small sizes)."""

    mode = "real"

    def __init__(self, spec: PrefillModelSpec, device: str = "auto", cpu_max_params: int = 300_000_000) -> None:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        from transformers import LlamaForCausalLM

        self.spec = spec
        self.torch_device = pick_torch_device(device)
        if self.torch_device == "cpu" and spec.params() > cpu_max_params:
            raise EngineError(
                f"model of {spec.params() / 1e6:.0f}M parameters is too large for CPU prefill "
                f"(limit {cpu_max_params / 1e6:.0f}M): use a GPU, a smaller model (preset 'tiny' or "
                f"'small'), or a modelled device")
        dtype = torch_dtype(spec)
        if self.torch_device == "cpu" and dtype == torch.float16:
            dtype = torch.float32  # fp16 matmuls are slow or missing on CPU
        self.dtype = dtype
        if spec.weights is not None:
            if not Path(spec.weights).is_dir():
                raise EngineError(f"model weights {spec.weights}: not a directory "
                                  "(expected a save_pretrained() folder with config.json)")
            try:
                model = LlamaForCausalLM.from_pretrained(str(spec.weights), local_files_only=True,
                                                         dtype=dtype)
            except (OSError, ValueError) as exc:
                raise EngineError(f"model weights {spec.weights}: cannot load ({exc})") from None
        else:
            # Built where it runs: on the CPU first, a Llama-3-8B takes minutes and 32 GB of
            # host memory before it ever reaches the GPU (random weights differ per device type).
            target = torch.device(self.torch_device)
            rng = [] if target.type != "cuda" else [
                target.index if target.index is not None else torch.cuda.current_device()]
            with torch.random.fork_rng(devices=rng), target:
                torch.manual_seed(spec.seed)
                model = LlamaForCausalLM(llama_config(spec)).to(dtype)
        self.model = model.to(self.torch_device).eval()
        self._gen = torch.Generator().manual_seed(spec.seed)

    def sync(self) -> None:
        if self.torch_device.startswith("cuda"):
            torch.cuda.synchronize()

    def prompt_ids(self, tokens: int, request_id: str | None = None, start: int = 0) -> torch.Tensor:
        """Token ids for a synthetic prompt (requests carry lengths, not text): positions
        [start, start + tokens) of `request_id`'s prompt (`synthetic_prompt`), or fresh
        ones from the engine's generator without a request (profiling)."""
        vocab = self.model.config.vocab_size
        if request_id is None:
            return torch.randint(0, vocab, (1, tokens), generator=self._gen).to(self.torch_device)
        ids = synthetic_prompt(self.spec.seed, request_id, start + tokens, vocab)
        return ids[:, start:].to(self.torch_device)

    def step(self, ids: torch.Tensor, cache: Any | None) -> tuple[Any, torch.Tensor]:
        """One forward pass of `ids` after `cache` (None: a new one): (the cache, the
        logits of the last position, [vocab], on the CPU)."""
        from transformers import DynamicCache

        if cache is None:
            cache = DynamicCache(config=self.model.config)
        with torch.inference_mode():
            out = self.model(input_ids=ids, cache=cache, use_cache=True, logits_to_keep=1)
        self.sync()
        return out.cache, out.logits[0, -1].float().cpu()

    def forward(self, tokens: int, cache: Any | None, request_id: str | None = None) -> Any:
        """Prefill `tokens` new tokens after `cache` (None: a new prompt); returns the cache."""
        return self._prefill(tokens, cache, request_id)[0]

    def _prefill(self, tokens: int, cache: Any | None, request_id: str | None) -> tuple[Any, int]:
        start = 0 if cache is None else cache.get_seq_length()
        cache, logits = self.step(self.prompt_ids(tokens, request_id, start), cache)
        return cache, int(logits.argmax())

    def run_chunk(self, device: DeviceLike, owner: str, label: str, tokens: int,
                  context: int, partial: Any, final: bool = False,
                  start_check: StartCheck | None = None, request_id: str | None = None,
                  **lease: Any) -> ChunkResult | None:
        """As PrefillEngine.run_chunk; the prompt is `request_id`'s synthetic one (None:
        the request named by `label`). `lease` (deadline, guard_s) goes to the device's
        try_run: training takes the device back at its deadline plus guard."""
        have = 0 if partial is None else (partial.tokens if isinstance(partial, KVCache)
                                          else partial.get_seq_length())
        if have != context:
            raise EngineError(f"chunk continues at token {context} but the cache holds {have}")
        rid = request_id if request_id is not None else request_of(label)
        box: dict[str, Any] = {}

        def work() -> None:
            if start_check is not None:
                start_check()
            cache, token = self._prefill(tokens, partial, rid)
            box["cache"] = self.finish(cache, token) if final else cache

        record = device.try_run("prefill", owner, fn=work, label=label, **lease)
        if record is None:
            return None
        if "cache" not in box:
            raise EngineError(f"device ran no prefill for {label} (record {record})")
        return ChunkResult(record, box["cache"])

    def finish(self, partial: Any, first_token: int | None = None) -> KVCache:
        if isinstance(partial, KVCache):
            return partial
        keys = torch.stack([layer.keys for layer in partial.layers])
        values = torch.stack([layer.values for layer in partial.layers])
        return KVCache(keys, values, tuple(keys.shape), self.mode, first_token)


def checked_wire_scale(wire_scale: float, error: type[Exception]) -> float:
    """`wire_scale` (the share of a KV cache's true size that crosses the wire), or `error`
    saying what is allowed: the engine that sizes the cache and the shipper that pads it
    take the same figure."""
    if not 0 < wire_scale <= 1:
        raise error(f"wire_scale {wire_scale} must be in (0, 1] (wire size / real size)")
    return wire_scale


# --------------------------------------------------------------------------- modelled


class ModelledEngine:
    """Holds the device for the compute model's time; KV cache of the true shape/dtype."""

    mode = "modelled"

    def __init__(self, spec: PrefillModelSpec, seconds_fn: Callable[[int, int], float],
                 materialise_limit_bytes: int = 64 << 20, fill: str = "zeros", wire_scale: float = 1.0) -> None:
        if fill not in ("zeros", "random"):
            raise EngineError(f"KV fill {fill!r}: use 'zeros' or 'random'")
        self.wire_scale = checked_wire_scale(wire_scale, EngineError)
        self.spec = spec
        self.seconds_fn = seconds_fn
        self.limit = materialise_limit_bytes
        self.fill = fill
        self._gen = torch.Generator().manual_seed(spec.seed)
        self._zero = torch.zeros(0, dtype=torch_dtype(spec))

    def _zeros(self, shape: tuple[int, ...]) -> torch.Tensor:
        """A read-only zero tensor of `shape`: a view of one cached buffer, so a modelled
        KV cache costs no allocation (fresh allocations take milliseconds on a busy host)."""
        n = math.prod(shape)
        if self._zero.numel() < n:
            cap = self.limit // (2 * self.spec.bytes_per_elem)
            self._zero = torch.zeros(max(n, min(2 * self._zero.numel(), cap)), dtype=torch_dtype(self.spec))
        return self._zero[:n].view(shape)

    def run_chunk(self, device: DeviceLike, owner: str, label: str, tokens: int,
                  context: int, partial: Any, final: bool = False,
                  start_check: StartCheck | None = None, request_id: str | None = None,
                  **lease: Any) -> ChunkResult | None:
        have = partial or 0
        if have != context:
            raise EngineError(f"chunk continues at token {context} but {have} tokens are cached")
        total = context + tokens
        box: dict[str, Any] = {}

        def work() -> None:  # runs inside the modelled hold
            if start_check is not None:
                start_check()
            if final:
                box["kv"] = self.finish(total)

        fn = work if (final or start_check is not None) else None
        record = device.try_run("prefill", owner, duration_s=self.seconds_fn(tokens, context),
                                fn=fn, label=label, **lease)
        if record is None:
            return None
        return ChunkResult(record, box.get("kv", total))

    def materialised_shape(self, tokens: int) -> tuple[int, ...]:
        """At most materialise_limit_bytes, and at most the wire size (true size times
        wire_scale): fewer layers first, then fewer tokens."""
        layers, batch, heads, _, dim = self.spec.kv_shape(tokens)
        per_token_layer = 2 * batch * heads * dim * self.spec.bytes_per_elem
        limit = min(self.limit, max(1, int(self.spec.kv_bytes(tokens) * self.wire_scale)))
        keep_layers = max(1, min(layers, limit // max(1, per_token_layer * tokens)))
        keep_tokens = tokens
        if keep_layers == 1 and per_token_layer * tokens > limit:
            keep_tokens = max(1, limit // per_token_layer)
        return (keep_layers, batch, heads, keep_tokens, dim)

    def finish(self, partial: Any) -> KVCache:
        if isinstance(partial, KVCache):
            return partial
        tokens = int(partial)
        shape = self.materialised_shape(tokens)
        dtype = torch_dtype(self.spec)
        if self.fill == "zeros":
            keys = values = self._zeros(shape)
        else:
            keys = torch.randn(shape, generator=self._gen).to(dtype)
            values = torch.randn(shape, generator=self._gen).to(dtype)
        return KVCache(keys, values, self.spec.kv_shape(tokens), self.mode)


def build_engine(mode: str, spec: PrefillModelSpec, *, seconds_fn: Callable[[int, int], float] | None = None,
                 torch_device: str = "auto", materialise_limit_bytes: int = 64 << 20) -> PrefillEngine:
    if mode == "real":
        return TransformersEngine(spec, torch_device)
    if mode == "modelled":
        if seconds_fn is None:
            raise EngineError("a modelled engine needs the compute model's charge (seconds_fn)")
        return ModelledEngine(spec, seconds_fn, materialise_limit_bytes)
    raise EngineError(f"engine mode {mode!r}: use 'real' or 'modelled'")
