"""The decode host's check of a received KV cache (real engine only).

A prefill agent ships the KV cache of a request's synthetic prompt (engine.synthetic_prompt:
drawn from the model's seed and the request id) and the first token its prefill produced.
The decode host holds the same model (same shape and seed, built on the same kind of torch
device, so the same weights) and checks the cache by using it:

* decode: one decode step from the received cache, feeding the shipped first token, gives
  the next token;
* reference: the same model in one process, no cache shipped: a prefill of the whole
  prompt (one pass, however the agent chunked it) gives the first token, and a decode step
  from that cache the next token.

The check passes when both first tokens and both next tokens are equal. A cache that lost,
reordered or corrupted bytes, or belongs to another prompt, gives other logits (the
maximum logit difference is reported too: chunked and one-pass prefill differ by float
rounding only, ~1e-7 in float32).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any

import torch

from bubbletea_agent.engine import EngineError, TransformersEngine, synthetic_prompt
from testbed_core.contracts.bubbletea import PrefillModelSpec


@dataclass
class DecodeCheck:
    """One received cache checked against the one-process reference."""

    ok: bool
    first_token: int  # as shipped by the agent
    first_token_ref: int  # the reference prefill's
    next_token: int  # decoded from the received cache
    next_token_ref: int  # decoded from the reference's cache
    max_logit_diff: float  # between the two decode steps' logits
    seconds: float  # time the check took on the decode host
    detail: str = ""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


class DecodeChecker:
    """The decode host's copy of the prefill model, and the check (module docstring)."""

    def __init__(self, spec: PrefillModelSpec, torch_device: str = "auto", threads: int = 1) -> None:
        self.engine = TransformersEngine(spec, torch_device)
        if self.engine.torch_device == "cpu":
            torch.set_num_threads(threads)
        self.spec = spec

    def _cache_from(self, keys: torch.Tensor, values: torch.Tensor) -> Any:
        from transformers import DynamicCache

        cfg = self.engine.model.config
        want = (cfg.num_hidden_layers, 1, cfg.num_key_value_heads)
        if tuple(keys.shape[:3]) != want or keys.shape[4] != self.spec.kv_head_dim:
            raise EngineError(f"received KV cache of shape {tuple(keys.shape)} does not fit this decode host's "
                              f"model ([{want[0]}, 1, {want[2]}, tokens, {self.spec.kv_head_dim}]): the agents "
                              "and the decode server must run the same bubbletea.model")
        cache = DynamicCache(config=cfg)
        dev, dtype = self.engine.torch_device, self.engine.dtype
        for layer in range(keys.shape[0]):
            cache.update(keys[layer].to(dev, dtype), values[layer].to(dev, dtype), layer)
        return cache

    def check(self, request_id: str, keys: torch.Tensor, values: torch.Tensor, first_token: int) -> DecodeCheck:
        """Decode one step from the received cache and compare with the reference."""
        t0 = time.perf_counter()
        tokens = keys.shape[3]
        eng = self.engine
        ids = synthetic_prompt(self.spec.seed, request_id, tokens, eng.model.config.vocab_size).to(eng.torch_device)
        ref_cache, ref_logits = eng.step(ids, None)
        first_ref = int(ref_logits.argmax())
        feed = torch.tensor([[first_token]], device=eng.torch_device)
        _, rx_next_logits = eng.step(feed, self._cache_from(keys, values))
        _, ref_next_logits = eng.step(torch.tensor([[first_ref]], device=eng.torch_device), ref_cache)
        nxt, nxt_ref = int(rx_next_logits.argmax()), int(ref_next_logits.argmax())
        diff = float((rx_next_logits - ref_next_logits).abs().max())
        ok = first_token == first_ref and nxt == nxt_ref
        detail = "" if ok else (
            f"request {request_id}: first token {first_token} (reference {first_ref}), next token {nxt} "
            f"(reference {nxt_ref}), max logit difference {diff:.3g}")
        return DecodeCheck(ok, first_token, first_ref, nxt, nxt_ref, diff, time.perf_counter() - t0, detail)
