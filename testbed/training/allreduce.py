"""The data-parallel gradient all-reduce of a modelled worker: a ring over atlas_transport
channels, moving placeholder bytes of the gradients' wire size.

A ring all-reduce of G bytes over dp replicas is a reduce-scatter then an all-gather:
2(dp-1) steps, in each of which every replica sends G/dp bytes to the next replica
and receives as much from the previous one (so each replica sends 2(dp-1)/dp x G in
all, the bandwidth-optimal volume NCCL's ring moves). A step's G/dp bytes go in
messages of at most the bucket size, all posted at once (the bucket is the unit of
DDP's all-reduce; here it bounds the size of one tensor on the wire); a step waits
for what it receives before the next starts, because in a real ring the next step
sends what this one delivered (reduced). Modelled devices have no real gradients, so
the bytes are placeholders; real devices average their real gradients
(real_work.PeerGradSync).
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from atlas_transport.channel import Channel

RING_TAG = (1 << 40) - 1  # atlas_transport tag of the ring's messages (real_work's DP tags start at 1 << 40)


class AllReduceError(RuntimeError):
    """A ring all-reduce that cannot run (its peers are not its ring neighbours)."""


@dataclass(frozen=True)
class RingPlan:
    """Who a replica sends to and receives from, and the messages of one step."""

    rank: int
    dp: int
    step_bytes: int  # G/dp (rounded up)
    messages: tuple[int, ...]  # the sizes of one step's messages (each at most the bucket)

    @property
    def steps(self) -> int:
        return 2 * (self.dp - 1)

    @property
    def next(self) -> int:
        return (self.rank + 1) % self.dp

    @property
    def prev(self) -> int:
        return (self.rank - 1) % self.dp

    @property
    def bytes_sent(self) -> int:
        return self.steps * self.step_bytes


def ring_plan(rank: int, dp: int, grad_bytes: int, bucket_bytes: int) -> RingPlan:
    """The ring of replica `rank` of `dp` all-reducing `grad_bytes` in buckets (pure)."""
    if dp < 2:
        raise AllReduceError(f"a ring all-reduce needs dp >= 2, got {dp}")
    if not 0 <= rank < dp:
        raise AllReduceError(f"DP rank {rank} is outside 0..{dp - 1}")
    if grad_bytes < 1 or bucket_bytes < 1:
        raise AllReduceError(f"gradient bytes ({grad_bytes}) and bucket bytes ({bucket_bytes}) must be positive")
    step = math.ceil(grad_bytes / dp)
    full, rest = divmod(step, bucket_bytes)
    messages = (bucket_bytes,) * full + ((rest,) if rest else ())
    return RingPlan(rank, dp, step, messages)


def ring_allreduce(plan: RingPlan, channels: Mapping[int, Channel], filler: torch.Tensor, landing: torch.Tensor,
                   timeout_s: float) -> float:
    """Run the ring over `channels` (peer DP rank -> atlas_transport Channel; those to
    the next and previous replica are used): each message sends a slice of `filler` and
    lands in a slice of `landing` (both uint8 tensors of at least one bucket). Returns
    the seconds it took."""
    for peer in {plan.next, plan.prev}:
        if peer not in channels:
            raise AllReduceError(f"DP rank {plan.rank} has no channel to its ring neighbour {peer} "
                                 f"(has {sorted(channels)})")
    out, into = channels[plan.next], channels[plan.prev]
    t0 = time.monotonic()
    for _ in range(plan.steps):
        sends = [out.isend(filler[:n], RING_TAG) for n in plan.messages]
        # every message of the step lands in the same buffer: placeholders, only the
        # bytes' arrival matters, and one buffer bounds the memory to one bucket
        recvs = [into.irecv(RING_TAG, into=landing[:n]) for n in plan.messages]
        deadline = time.monotonic() + timeout_s
        for h in [*recvs, *sends]:
            h.wait(max(0.1, deadline - time.monotonic()))
    return time.monotonic() - t0
