"""BubbleTea's prefill capacity in the predicted bubbles.

Every idle gap of every device (a stage replica: one tp-GPU group) over a predicted
iteration is offered to prefill work the way BubbleTea's admission does it
(bubbletea_agent/admission.py): a chunk runs only if its predicted time plus the
guard (a fraction of that time) fits in what is left of the gap; whole chunks of
`chunk_tokens` first, then the largest smaller chunk (a multiple of `min_tokens`)
that still fits. A chunk costs the compute model's prefill time of a prompt of that
many tokens on the device's GPU group (`ComputeModel.prefill_seconds`: the roofline
of its FLOPs and of reading the model's weights once), so each chunk is costed as a
fresh prompt (the attention to earlier chunks of the same prompt is left out).

Only the pipeline's bubbles count (fill, drain, waits for tensors); the time the
all-reduce adds at the end is left to the all-reduce, whose kernels share the GPU.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from testbed_core.whatif.predict import Gaps


@dataclass(frozen=True)
class PrefillCapacity:
    """Prefill the bubbles of one iteration can take, over all devices."""

    tokens_per_iteration: float
    tokens_per_s: float  # per second of training (tokens_per_iteration / iteration time)
    busy_s_per_iteration: float  # device-seconds of prefill work per iteration
    utilization_with_prefill: float  # (training + prefill busy) / (devices x iteration time)
    chunk_tokens: int
    chunk_s: float
    guard: float

    def to_json(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def prefill_capacity(
    gaps: Gaps,
    iteration_s: float,
    devices: int,
    training_busy_s: float,
    cost: Callable[[int], float],
    *,
    chunk_tokens: int = 512,
    min_tokens: int = 32,
    guard: float = 0.05,
) -> PrefillCapacity:
    """Fill `gaps` (seconds, each on `weight` devices) with chunks whose run time
    `cost(tokens)` plus `guard` x that fits; `training_busy_s` is the mean compute
    time per device (for the utilization with prefill)."""
    if chunk_tokens < 1 or min_tokens < 1 or min_tokens > chunk_tokens:
        raise ValueError(f"need 1 <= min_tokens ({min_tokens}) <= chunk_tokens ({chunk_tokens})")
    if guard < 0:
        raise ValueError(f"guard must be >= 0, got {guard}")
    sizes = np.arange(min_tokens, chunk_tokens + 1, min_tokens)
    if sizes[-1] != chunk_tokens:
        sizes = np.append(sizes, chunk_tokens)
    times = np.array([cost(int(n)) for n in sizes])
    need = times * (1 + guard)  # nondecreasing in tokens: the roofline is
    t_chunk, need_chunk = float(times[-1]), float(need[-1])
    g = gaps.seconds
    full = np.floor(g / need_chunk) if need_chunk > 0 else np.zeros_like(g)
    rest = g - full * need_chunk
    fits = np.searchsorted(need, rest, side="right")  # how many sizes fit in the rest
    part_tokens = np.where(fits > 0, sizes[np.maximum(fits - 1, 0)], 0)
    part_s = np.where(fits > 0, times[np.maximum(fits - 1, 0)], 0.0)
    tokens = float(np.sum(gaps.weight * (full * chunk_tokens + part_tokens)))
    busy = float(np.sum(gaps.weight * (full * t_chunk + part_s)))
    wall = devices * iteration_s
    return PrefillCapacity(
        tokens_per_iteration=tokens,
        tokens_per_s=tokens / iteration_s if iteration_s > 0 else 0.0,
        busy_s_per_iteration=busy,
        utilization_with_prefill=(devices * training_busy_s + busy) / wall if wall > 0 else 0.0,
        chunk_tokens=chunk_tokens, chunk_s=t_chunk, guard=guard,
    )
