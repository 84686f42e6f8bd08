"""Pipeline schedules as per-rank ordered op lists: GPipe, 1F1B, interleaved 1F1B.

An op is a forward ``F`` or backward ``B`` of one micro-batch on one (virtual) stage,
or a transfer at a stage boundary: ``SEND_F``/``RECV_F`` carry activations from stage
k to k+1, ``SEND_B``/``RECV_B`` their gradients from k+1 back to k. Sends are
asynchronous (the worker goes on computing while the tensor travels); a receive
blocks until the tensor has arrived (it may have arrived long before). Each rank
runs its list in order. The forms are those of:

* GPipe (Huang et al. 2019): all forwards, then all backwards.
* 1F1B / PipeDream-Flush (Narayanan et al. 2021, Sec. 2.2.1): stage s first runs
  ``min(p - s - 1, m)`` warm-up forwards, then alternates one forward and one
  backward, then drains the remaining backwards.
* Interleaved 1F1B (Narayanan et al. 2021, Sec. 2.2.2): each rank holds ``v`` model
  chunks (virtual stages ``c*p + rank``); micro-batches go in groups of ``p``, chunk
  by chunk; warm-up is ``(p - rank - 1)*2 + (v - 1)*p`` forwards (Megatron-LM).

The compute orders of GPipe and interleaved 1F1B equal the schedule IR of
``torch.distributed.pipelining`` (tested); 1F1B equals what its ``Schedule1F1B`` runs
(its ``_get_pipeline_order`` IR is off by one micro-batch on the last rank in torch
2.13, so the test checks the known form instead). We write our own because its
schedules drive torch.distributed process groups, while ours drive emulated devices
and the Atlas transport.
"""

from __future__ import annotations

import functools
from collections import Counter
from dataclasses import dataclass
from typing import Literal

OpKind = Literal["F", "B", "SEND_F", "RECV_F", "SEND_B", "RECV_B"]
COMPUTE = ("F", "B")
SCHEDULE_NAMES = ("gpipe", "1f1b", "interleaved-1f1b")


class ScheduleError(ValueError):
    """A schedule that cannot be built or would not run (deadlock, missing op)."""


@dataclass(frozen=True)
class Op:
    kind: OpKind
    mb: int
    stage: int  # the virtual stage doing the op
    peer: int | None = None  # the other end of a transfer

    def __str__(self) -> str:
        if self.kind in COMPUTE:
            return f"{self.kind}{self.mb}@s{self.stage}"
        return f"{self.kind}{self.mb}@s{self.stage}{'->' if self.kind.startswith('SEND') else '<-'}s{self.peer}"

    @property
    def is_compute(self) -> bool:
        return self.kind in COMPUTE

    @classmethod
    def parse_compute(cls, text: str) -> Op:
        """The compute op `str(op)` gave (``F3@s1``: kind, micro-batch, stage), as the
        devices' timelines label it; ValueError for any other text."""
        kind, rest = text[:1], text[1:]
        mb, sep, stage = rest.partition("@s")
        if kind not in COMPUTE or not sep or not mb.isdigit() or not stage.isdigit():
            raise ValueError(f"{text!r} is not a compute op's label (F<mb>@s<stage> or B<mb>@s<stage>)")
        return cls(kind, int(mb), int(stage))  # type: ignore[arg-type]

    def boundary(self) -> int:
        """Boundary index of a transfer: b is between virtual stages b and b+1."""
        if self.peer is None:
            raise ScheduleError(f"{self} is not a transfer")
        return min(self.stage, self.peer)

    def direction(self) -> str:
        return "fwd" if self.kind.endswith("_F") else "bwd"


@dataclass(frozen=True)
class Schedule:
    name: str
    ranks: int  # pipeline ranks (devices) per pipeline, p
    chunks: int  # model chunks per rank, v (1 unless interleaved)
    microbatches: int  # m
    ops: tuple[tuple[Op, ...], ...]  # per rank, in execution order

    @property
    def stages(self) -> int:
        """Virtual stages: p * v."""
        return self.ranks * self.chunks

    def rank_of(self, stage: int) -> int:
        return stage % self.ranks

    def compute_ops(self, rank: int) -> list[Op]:
        return [op for op in self.ops[rank] if op.is_compute]

    def ideal_bubble_fraction(self) -> float:
        """(p-1)/(m+p-1) for GPipe and 1F1B; (p-1)/(v*m+p-1) interleaved (uniform stages)."""
        p, m, v = self.ranks, self.microbatches, self.chunks
        return (p - 1) / (v * m + p - 1)


def _check(p: int, m: int, v: int = 1) -> None:
    if p < 1 or m < 1 or v < 1:
        raise ScheduleError(f"pipeline needs p >= 1 ranks, m >= 1 micro-batches, v >= 1 chunks (got p={p}, m={m}, v={v})")


def gpipe_order(p: int, m: int) -> list[list[Op]]:
    _check(p, m)
    return [[Op("F", i, s) for i in range(m)] + [Op("B", i, s) for i in range(m)] for s in range(p)]


def one_f_one_b_order(p: int, m: int) -> list[list[Op]]:
    _check(p, m)
    ranks = []
    for s in range(p):
        warmup = min(p - s - 1, m)
        order = [Op("F", i, s) for i in range(warmup)]
        for i in range(m - warmup):
            order += [Op("F", warmup + i, s), Op("B", i, s)]
        order += [Op("B", i, s) for i in range(m - warmup, m)]
        ranks.append(order)
    return ranks


def interleaved_order(p: int, m: int, v: int) -> list[list[Op]]:
    _check(p, m, v)
    if m % p:
        raise ScheduleError(f"interleaved 1F1B needs the micro-batch count ({m}) to be a multiple of p ({p})")
    total = m * v

    def unit(k: int, backward: bool, rank: int) -> tuple[int, int]:
        group, within = divmod(k, p * v)
        chunk, offset = divmod(within, p)
        if backward:
            chunk = v - 1 - chunk
        return group * p + offset, chunk * p + rank

    def op(k: int, backward: bool, rank: int) -> Op:
        return Op("B" if backward else "F", *unit(k, backward, rank))

    ranks = []
    for r in range(p):
        warmup = min(total, (p - r - 1) * 2 + (v - 1) * p)
        order = [op(f, False, r) for f in range(warmup)]  # warm-up forwards
        for f in range(warmup, total):  # steady state: one forward, one backward
            order += [op(f, False, r), op(f - warmup, True, r)]
        order += [op(b, True, r) for b in range(total - warmup, total)]  # cool-down backwards
        ranks.append(order)
    return ranks


def with_transfers(compute: list[list[Op]], stages: int) -> tuple[tuple[Op, ...], ...]:
    """Insert each receive just before the compute that needs it and each send
    just after the compute that produced it."""
    out = []
    for order in compute:
        ops: list[Op] = []
        for op in order:
            k = op.stage
            if op.kind == "F":
                if k > 0:
                    ops.append(Op("RECV_F", op.mb, k, k - 1))
                ops.append(op)
                if k < stages - 1:
                    ops.append(Op("SEND_F", op.mb, k, k + 1))
            else:
                if k < stages - 1:
                    ops.append(Op("RECV_B", op.mb, k, k + 1))
                ops.append(op)
                if k > 0:
                    ops.append(Op("SEND_B", op.mb, k, k - 1))
        out.append(tuple(ops))
    return tuple(out)


@functools.lru_cache(maxsize=32)
def build_schedule(name: str, p: int, m: int, chunks: int = 1) -> Schedule:
    """The schedule `name` (gpipe, 1f1b, interleaved-1f1b) for p ranks and m micro-batches.
    Kept for the next caller (a frozen value): a prediction asks for the same one once per
    variant, and at paper scale building and checking it is not free."""
    if name == "gpipe":
        order, v = gpipe_order(p, m), 1
    elif name == "1f1b":
        order, v = one_f_one_b_order(p, m), 1
    elif name == "interleaved-1f1b":
        if chunks < 2:
            raise ScheduleError("interleaved-1f1b needs chunks >= 2 model chunks per rank")
        order, v = interleaved_order(p, m, chunks), chunks
    else:
        raise ScheduleError(f"unknown schedule {name!r} (allowed: {', '.join(SCHEDULE_NAMES)})")
    if name != "interleaved-1f1b" and chunks != 1:
        raise ScheduleError(f"chunks={chunks} is only for interleaved-1f1b")
    sched = Schedule(name, p, v, m, with_transfers(order, p * v))
    validate(sched)
    return sched


def validate(s: Schedule) -> None:
    """Each virtual stage runs every micro-batch's F and B once, F before B, on its own
    rank; and the op lists run to completion (no deadlock) when sends are async."""
    p, m = s.ranks, s.microbatches
    if len(s.ops) != p:
        raise ScheduleError(f"{s.name}: {len(s.ops)} op lists for {p} ranks")
    for r, ops in enumerate(s.ops):
        seen_f: set[tuple[int, int]] = set()
        counts = Counter((op.kind, op.stage) for op in ops if op.is_compute)
        for c in range(s.chunks):
            k = c * p + r
            for kind in COMPUTE:
                if counts[(kind, k)] != m:
                    raise ScheduleError(f"{s.name}: rank {r} runs {counts[(kind, k)]} {kind} on stage {k}, expected {m}")
        for op in ops:
            if s.rank_of(op.stage) != r:
                raise ScheduleError(f"{s.name}: rank {r} runs {op}, which belongs to rank {s.rank_of(op.stage)}")
            if op.kind == "F":
                seen_f.add((op.mb, op.stage))
            elif op.kind == "B" and (op.mb, op.stage) not in seen_f:
                raise ScheduleError(f"{s.name}: rank {r} runs {op} before its forward")
    # Dry run: async sends, blocking receives.
    pos = [0] * p
    sent: set[tuple[str, int, int, int]] = set()
    while True:
        progressed = False
        for r in range(p):
            while pos[r] < len(s.ops[r]):
                op = s.ops[r][pos[r]]
                if op.kind.startswith("SEND"):
                    sent.add((op.direction(), op.mb, op.stage, op.peer))  # type: ignore[arg-type]
                elif op.kind.startswith("RECV") and (op.direction(), op.mb, op.peer, op.stage) not in sent:
                    break
                pos[r] += 1
                progressed = True
        if all(pos[r] == len(s.ops[r]) for r in range(p)):
            return
        if not progressed:
            stuck = ", ".join(f"rank {r} at {s.ops[r][pos[r]]}" for r in range(p) if pos[r] < len(s.ops[r]))
            raise ScheduleError(f"{s.name}: deadlock, waiting: {stuck}")
