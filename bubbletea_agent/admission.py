"""Admission control (sans-IO): what, if anything, may run now in the current slot.

Rule: a request, or a chunk of it, starts only inside an open idle slot and only if its
predicted duration plus a guard fits in what is left of the slot. The guard adapts to the
observed prediction error: a high quantile of recent duration errors (actual/predicted - 1),
clamped to [rel_floor, rel_ceiling], times the prediction (`initial_rel` until
`min_samples`), plus `abs_floor_s` for the jitter of starting work at all. Late starts
need no margin here: the agent re-checks the clock once it holds the device and runs
nothing if the chunk no longer fits (agent.py, StartedLate); start latencies are only
kept as a statistic.

Everything here is pure: the agent passes the clock, the slot and the queue in.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from bubbletea_agent.latency import LatencyModel
from bubbletea_agent.requests import Request


class GuardConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    quantile: float = Field(default=0.99, gt=0, le=1)
    window: int = Field(default=256, ge=1)
    min_samples: int = Field(default=8, ge=1)
    initial_rel: float = Field(default=0.10, ge=0)
    rel_floor: float = Field(default=0.02, ge=0)
    rel_ceiling: float = Field(default=0.50, ge=0)
    abs_floor_s: float = Field(default=0.001, ge=0)
    # preemptible holds: the guard is absolute (a layer group ends late when the host wakes
    # the agent late, by about the same however long the group): this quantile of recent
    # overruns, clamped to [abs_floor_s, hold_ceiling_s]
    hold_quantile: float = Field(default=0.9, gt=0, le=1)
    hold_ceiling_s: float = Field(default=0.005, ge=0)

    @model_validator(mode="after")
    def _order(self) -> GuardConfig:
        if self.rel_ceiling < self.rel_floor:
            raise ValueError(f"guard rel_ceiling ({self.rel_ceiling}) is below rel_floor ({self.rel_floor})")
        return self


class AdaptiveGuard:
    """Safety margin for a predicted duration, learned from prediction errors."""

    def __init__(self, cfg: GuardConfig | None = None) -> None:
        self.cfg = cfg or GuardConfig()
        self._errors: deque[float] = deque(maxlen=self.cfg.window)
        self._overruns: deque[float] = deque(maxlen=self.cfg.window)
        self._latency: deque[float] = deque(maxlen=self.cfg.window)
        self._hold_margin: float | None = None
        self.observed = 0
        self._margin: float | None = None

    def observe(self, predicted_s: float, actual_s: float, start_latency_s: float | None = None) -> None:
        """One finished chunk: its predicted and actual device time, and how long it took
        from the admission decision to the device starting it."""
        if start_latency_s is not None and math.isfinite(start_latency_s):
            self._latency.append(max(0.0, start_latency_s))
        if predicted_s <= 0 or not math.isfinite(actual_s):
            return
        self._errors.append(actual_s / predicted_s - 1.0)
        self._overruns.append(actual_s - predicted_s)
        self._hold_margin = None
        self.observed += 1
        self._margin = None

    @property
    def abs_margin(self) -> float:
        return self.cfg.abs_floor_s

    def start_latency(self, q: float = 0.5) -> float | None:
        """A quantile of the recent decision-to-device-start latencies (a statistic)."""
        if not self._latency:
            return None
        return float(np.quantile(np.fromiter(self._latency, float), q))

    @property
    def rel_margin(self) -> float:
        if self._margin is None:
            c = self.cfg
            if len(self._errors) < c.min_samples:
                rel = c.initial_rel
            else:
                rel = float(np.quantile(np.fromiter(self._errors, float), c.quantile))
            self._margin = min(max(rel, c.rel_floor), c.rel_ceiling)
        return self._margin

    @property
    def hold_margin(self) -> float:
        """Absolute guard of a layer group in a preemptible hold."""
        if self._hold_margin is None:
            c = self.cfg
            late = (float(np.quantile(np.fromiter(self._overruns, float), c.hold_quantile))
                    if len(self._overruns) >= c.min_samples else c.hold_ceiling_s)
            self._hold_margin = min(max(late, c.abs_floor_s), max(c.hold_ceiling_s, c.abs_floor_s))
        return self._hold_margin

    def guard_s(self, predicted_s: float) -> float:
        return predicted_s * self.rel_margin + self.abs_margin


class AdmissionConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    chunking: bool = True
    min_chunk_tokens: int = Field(default=32, ge=1)
    chunk_granularity: int = Field(default=16, ge=1)  # chunk sizes are multiples of this
    max_chunk_tokens: int | None = Field(default=None, ge=1)  # cap on a chunk (None: what fits)
    max_prompt_tokens: int = Field(default=131072, ge=1)  # the model's context window
    max_queue: int = Field(default=1024, ge=0)
    lookahead: int = Field(default=16, ge=1)  # queued requests scanned for one that fits
    max_in_progress: int = Field(default=1, ge=1)  # partly prefilled requests (their KV waits in memory)


@dataclass(eq=False)
class Pending:
    """A request in the agent's queue and how far its prefill got (compared by identity)."""

    request: Request
    done_tokens: int = 0
    # opaque handle to the partial KV cache (engine-specific); None before the first chunk
    kv: object | None = None
    # a chunk stopped between two layers (preemptible holds): its tokens and the layers done
    chunk_tokens: int = 0
    chunk_pieces_done: int = 0

    @property
    def left(self) -> int:
        return self.request.prompt_tokens - self.done_tokens

    @property
    def started(self) -> bool:
        return self.done_tokens > 0 or self.chunk_pieces_done > 0


class Action(StrEnum):
    RUN = "run"  # run `tokens` of `pending` now
    WAIT = "wait"  # nothing fits in what is left of this slot


@dataclass(frozen=True)
class Decision:
    action: Action
    pending: Pending | None = None
    tokens: int = 0
    context: int = 0
    predicted_s: float = 0.0
    guard_s: float = 0.0
    why: str = ""

    @property
    def chunked(self) -> bool:
        return self.pending is not None and self.tokens < self.pending.left


@dataclass(frozen=True)
class PieceRun:
    """Layers of a chunk to run now inside a preemptible hold (`Admission.next_pieces`)."""

    pending: Pending
    tokens: int  # the chunk's tokens
    context: int  # tokens cached before the chunk
    pieces: int  # layers to run now
    pieces_total: int  # layers of the chunk
    piece_s: float  # predicted seconds per layer
    guard_s: float

    @property
    def predicted_s(self) -> float:
        return self.pieces * self.piece_s

    @property
    def finishes_chunk(self) -> bool:
        return self.pending.chunk_pieces_done + self.pieces >= self.pieces_total


@dataclass
class Admission:
    """Admission decisions for one device."""

    model: LatencyModel
    cfg: AdmissionConfig = field(default_factory=AdmissionConfig)
    guard: AdaptiveGuard = field(default_factory=AdaptiveGuard)

    def fits(self, tokens: int, context: int, remaining_s: float) -> tuple[bool, float, float]:
        pred = self.model.predict(tokens, context)
        g = self.guard.guard_s(pred)
        return pred + g <= remaining_s, pred, g

    def largest_fit(self, pending: Pending, remaining_s: float) -> int:
        """Most tokens of `pending` that fit in remaining_s with the guard; 0 if none.
        Whole remainder, or (with chunking) a chunk of >= min_chunk_tokens rounded down to
        the granularity."""
        left, ctx = pending.left, pending.done_tokens
        cap = self.cfg.max_chunk_tokens if self.cfg.chunking and self.cfg.max_chunk_tokens else left
        if left <= cap and self.fits(left, ctx, remaining_s)[0]:
            return left
        if not self.cfg.chunking:
            return 0
        # guard grows with the prediction: solve pred*(1+rel) + abs <= remaining for pred
        budget = (remaining_s - self.guard.abs_margin) / (1.0 + self.guard.rel_margin)
        n = self.model.max_tokens_within(budget, ctx, limit=min(left, cap))
        n -= n % self.cfg.chunk_granularity
        while n >= self.cfg.min_chunk_tokens and not self.fits(n, ctx, remaining_s)[0]:
            n -= self.cfg.chunk_granularity  # float edge: step down until it truly fits
        return n if n >= self.cfg.min_chunk_tokens else 0

    def too_long(self, req: Request, longest_slot_s: float | None) -> str | None:
        """Why the request can never be served, or None. `longest_slot_s` is the longest
        slot seen (None: no slot known yet, so only the context limit is checked)."""
        if req.prompt_tokens > self.cfg.max_prompt_tokens:
            return (f"{req.prompt_tokens} prompt tokens exceed the model context "
                    f"({self.cfg.max_prompt_tokens})")
        if longest_slot_s is None:
            return None
        probe = Pending(req)
        if self.cfg.chunking:
            unit = min(req.prompt_tokens, self.cfg.min_chunk_tokens)
            ok = self.fits(unit, 0, longest_slot_s)[0]
            what = f"its smallest chunk ({unit} tokens)"
        else:
            ok = self.largest_fit(probe, longest_slot_s) == req.prompt_tokens
            what = f"its {req.prompt_tokens}-token prefill"
        if ok:
            return None
        pred = self.model.predict(min(req.prompt_tokens, self.cfg.min_chunk_tokens)
                                  if self.cfg.chunking else req.prompt_tokens)
        return (f"{what} needs {pred * 1e3:.2f} ms plus guard; the longest slot is "
                f"{longest_slot_s * 1e3:.2f} ms")

    def pieces_within(self, piece_s: float, pieces_left: int, room_s: float) -> int:
        """Most layers (each `piece_s`) whose predicted time plus the hold guard (absolute:
        `AdaptiveGuard.hold_margin`) fit in room_s."""
        if piece_s <= 0:
            return pieces_left
        budget = room_s - self.guard.hold_margin
        if math.isinf(budget):
            return pieces_left if budget > 0 else 0
        k = min(pieces_left, max(0, math.floor(budget / piece_s + 1e-9)))
        while k > 0 and k * piece_s + self.guard.hold_margin > room_s:
            k -= 1  # float edge
        return k

    def next_pieces(self, room_s: float, queue: Sequence[Pending], layers: int,
                    chunk_cap: int | None = None, now_s: float | None = None) -> PieceRun | None:
        """What to run next inside a preemptible hold with `room_s` left before the window
        closes: layers of the chunk in progress first, else a new chunk (the whole rest
        of the request, up to `chunk_cap` tokens or max_chunk_tokens) of the first
        queued request of which at least one layer fits; requests not started whose
        deadline passed by `now_s` (request time) are skipped. None: nothing fits."""
        if room_s <= 0 or not queue:
            return None
        started = [p for p in queue if p.started]
        fresh = [p for p in queue if not p.started and (now_s is None or p.request.expires_at() >= now_s)]
        fresh = fresh[: self.cfg.lookahead]
        if len(started) >= self.cfg.max_in_progress:
            fresh = []
        for p in started + fresh:
            if p.chunk_tokens:
                tokens = p.chunk_tokens
            else:
                cap = min(x for x in (chunk_cap, self.cfg.max_chunk_tokens if self.cfg.chunking else None, p.left)
                          if x is not None)
                tokens = max(1, cap)
            piece_s = self.model.predict(tokens, p.done_tokens) / layers
            k = self.pieces_within(piece_s, layers - p.chunk_pieces_done, room_s)
            if k > 0:
                return PieceRun(p, tokens, p.done_tokens, k, layers, piece_s, self.guard.hold_margin)
            if p.started:
                return None  # the chunk in progress goes first: wait for room for its next layer
        return None

    def decide(self, remaining_s: float, queue: Sequence[Pending]) -> Decision:
        """Choose the work to start now, given `remaining_s` seconds left in an open slot.

        Partly prefilled requests go first (their KV cache is waiting in memory); then
        the queue in arrival order, up to `lookahead` entries, taking the first that fits
        whole or, while fewer than `max_in_progress` are partly done, as a chunk."""
        if remaining_s <= 0 or not queue:
            return Decision(Action.WAIT, why="slot over" if remaining_s <= 0 else "queue empty")
        in_progress = [p for p in queue if p.started]
        fresh = [p for p in queue if not p.started][: self.cfg.lookahead]
        may_chunk_fresh = len(in_progress) < self.cfg.max_in_progress
        for p in in_progress + fresh:
            n = self.largest_fit(p, remaining_s)
            if n == 0:
                continue
            if n < p.left and not p.started and not may_chunk_fresh:
                continue  # would leave one more partial KV cache waiting
            pred = self.model.predict(n, p.done_tokens)
            return Decision(Action.RUN, p, n, p.done_tokens, pred, self.guard.guard_s(pred),
                            "whole" if n == p.left else "chunk")
        return Decision(Action.WAIT, why=f"nothing fits in {remaining_s * 1e3:.2f} ms")
