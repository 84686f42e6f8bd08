"""A small GPT-style decoder for the real-device path, split into pipeline stages by layers.

The same classes build the whole model (the one-process reference) and any pipeline
stage of it, and a stage's parameters carry the *global* names of the whole model
(``wte.weight``, ``blocks.3.attn.qkv.weight``, ``head.weight``): the union of the
stages' state dicts is the whole model's state dict, which is how the equivalence
check compares them.

Initialisation is deterministic and independent of the split: every parameter is
drawn from its own generator, seeded by ``(seed, global name)``, with GPT-2's scheme
(N(0, 0.02) weights, residual projections scaled by 1/sqrt(2 x layers), zero biases,
unit norms). A stage therefore starts with exactly the reference's values without
ever building the rest of the model.

Shape follows the workload's `ModelConfig`: layers, hidden, heads, kv_heads (grouped-
query attention), ffn_hidden, gated_mlp (SwiGLU), bias, positional (learned or
rotary), dtype. Pre-LayerNorm blocks; the embedding sits on the first stage, the final
norm and the LM head on the last (as in Megatron-LM and `compute_model.stage_flops`,
whose layer split, earlier stages taking the remainder, is used here too).

One deliberate difference from `tied_embeddings: true`: the LM head is always its own
weight. Tying it to the input embedding across a pipeline would need a gradient
exchange between the first and the last stage every iteration (Megatron's
"embedding group"), a WAN transfer of vocab x hidden that is no part of what the
testbed studies. The reference is untied too, so the comparison is exact.
"""

from __future__ import annotations

import hashlib
import math

import torch
import torch.nn.functional as F
from torch import nn

from testbed_core.compute_model import ComputeModelError, stage_layers
from testbed_core.workload import ModelConfig

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
INIT_STD = 0.02  # GPT-2 (Radford et al. 2019) and GPT-3
ROPE_BASE = 10000.0


class ModelError(ValueError):
    """A stage that cannot be built (bad stage index, too few layers)."""


def torch_dtype(cfg: ModelConfig) -> torch.dtype:
    return DTYPES[cfg.dtype]


def stage_layer_ranges(layers: int, stages: int) -> list[range]:
    """Global layer indices of each stage (as even as possible, earlier stages longer)."""
    try:
        counts = stage_layers(layers, stages)
    except ComputeModelError as exc:
        raise ModelError(str(exc)) from None
    out, start = [], 0
    for n in counts:
        out.append(range(start, start + n))
        start += n
    return out


def param_seed(seed: int, name: str) -> int:
    """A stable 63-bit seed for one named parameter (not Python's salted hash)."""
    digest = hashlib.blake2b(f"{seed}:{name}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 63) - 1)


def _rope(seq_len: int, head_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    inv = 1.0 / (ROPE_BASE ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    ang = torch.outer(torch.arange(seq_len, dtype=torch.float64), inv)
    return ang.cos().float(), ang.sin().float()


def _apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate pairs (x[..., 2i], x[..., 2i+1]) by position-dependent angles (Su et al. 2021)."""
    t = x.shape[-2]
    c, s = cos[:t].to(x.dtype), sin[:t].to(x.dtype)
    x1, x2 = x[..., 0::2], x[..., 1::2]
    out = torch.stack((x1 * c - x2 * s, x1 * s + x2 * c), dim=-1)
    return out.flatten(-2)


class Attention(nn.Module):
    """Causal self-attention (grouped-query when kv_heads < heads, rotary or learned positions)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.heads = cfg.heads
        self.kv_heads = cfg.kv_heads or cfg.heads
        self.head_dim = cfg.hidden // cfg.heads
        self.qkv = nn.Linear(cfg.hidden, (self.heads + 2 * self.kv_heads) * self.head_dim, bias=cfg.bias)
        self.proj = nn.Linear(cfg.hidden, cfg.hidden, bias=cfg.bias)
        self.rotary = cfg.positional == "rotary"
        if self.rotary:
            if self.head_dim % 2:
                raise ModelError(f"rotary positions need an even head size, got hidden/heads = {self.head_dim}")
            cos, sin = _rope(cfg.seq_len, self.head_dim)
            self.register_buffer("cos", cos, persistent=False)
            self.register_buffer("sin", sin, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        d = self.head_dim
        q, k, v = self.qkv(x).split([self.heads * d, self.kv_heads * d, self.kv_heads * d], dim=-1)
        q = q.view(b, t, self.heads, d).transpose(1, 2)
        k = k.view(b, t, self.kv_heads, d).transpose(1, 2)
        v = v.view(b, t, self.kv_heads, d).transpose(1, 2)
        if self.rotary:
            q, k = _apply_rope(q, self.cos, self.sin), _apply_rope(k, self.cos, self.sin)
        if self.kv_heads != self.heads:
            rep = self.heads // self.kv_heads
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, t, -1))


class Mlp(nn.Module):
    """The block's MLP (gated when the config says so)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        ffn = cfg.ffn_hidden or 4 * cfg.hidden
        self.gated = cfg.gated_mlp
        self.fc = nn.Linear(cfg.hidden, 2 * ffn if self.gated else ffn, bias=cfg.bias)
        self.proj = nn.Linear(ffn, cfg.hidden, bias=cfg.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        if self.gated:  # SwiGLU (Shazeer 2020)
            gate, up = h.chunk(2, dim=-1)
            h = F.silu(gate) * up
        else:
            h = F.gelu(h)
        return self.proj(h)


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.hidden, bias=cfg.bias)
        self.attn = Attention(cfg)
        self.ln2 = nn.LayerNorm(cfg.hidden, bias=cfg.bias)
        self.mlp = Mlp(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPTStage(nn.Module):
    """Layers `layers` of the model; the first stage embeds tokens (B, T) -> (B, T, H),
    the last one returns logits (B, T, vocab); the whole model is first and last."""

    def __init__(self, cfg: ModelConfig, layers: range, *, first: bool, last: bool) -> None:
        super().__init__()
        self.cfg = cfg
        self.first, self.last = first, last
        self.layer_ids = layers
        if first:
            self.wte = nn.Embedding(cfg.vocab, cfg.hidden)
            if cfg.positional == "learned":
                self.wpe = nn.Embedding(cfg.seq_len, cfg.hidden)
        self.blocks = nn.ModuleDict({str(i): Block(cfg) for i in layers})
        if last:
            self.ln_f = nn.LayerNorm(cfg.hidden, bias=cfg.bias)
            self.head = nn.Linear(cfg.hidden, cfg.vocab, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.first:
            if x.dtype not in (torch.int64, torch.int32):
                raise ModelError(f"the first stage takes token ids, got a {x.dtype} tensor")
            t = x.shape[-1]
            if t > self.cfg.seq_len:
                raise ModelError(f"sequence of {t} tokens is longer than model.seq_len ({self.cfg.seq_len})")
            h = self.wte(x)
            if self.cfg.positional == "learned":
                h = h + self.wpe(torch.arange(t, device=x.device))
        else:
            h = x
        for block in self.blocks.values():
            h = block(h)
        if self.last:
            h = self.head(self.ln_f(h))
        return h


def init_parameters(module: nn.Module, seed: int, layers: int) -> None:
    """GPT-2 init, each parameter from its own (seed, global name) generator."""
    resid_std = INIT_STD / math.sqrt(2 * layers)
    norms = {f"{m}.{leaf}".lstrip(".") for m, mod in module.named_modules() if isinstance(mod, nn.LayerNorm)
             for leaf in ("weight", "bias")}
    with torch.no_grad():
        for name, p in module.named_parameters():
            if name in norms:
                p.fill_(1.0 if name.endswith("weight") else 0.0)
            elif name.endswith("bias"):
                p.zero_()
            else:
                std = resid_std if name.endswith("proj.weight") else INIT_STD
                gen = torch.Generator().manual_seed(param_seed(seed, name))
                p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float32) * std)


def build_stage(cfg: ModelConfig, stage: int, stages: int, seed: int,
                device: torch.device | str | None = None) -> GPTStage:
    """Stage `stage` of `stages` (virtual stages for interleaved schedules), initialised
    from `seed`, in the model's dtype, on `device` (default CPU)."""
    if not 0 <= stage < stages:
        raise ModelError(f"stage {stage} does not exist: the model is split into {stages} stages (0..{stages - 1})")
    ranges = stage_layer_ranges(cfg.layers, stages)
    mod = GPTStage(cfg, ranges[stage], first=stage == 0, last=stage == stages - 1)
    init_parameters(mod, seed, cfg.layers)
    return mod.to(device=device or "cpu", dtype=torch_dtype(cfg))


def build_model(cfg: ModelConfig, seed: int, device: torch.device | str | None = None) -> GPTStage:
    """The whole model in one module (the one-process reference)."""
    return build_stage(cfg, 0, 1, seed, device)
