"""Prefill requests: where they come from and how each one ends.

A scenario gives the agent one request source: Poisson arrivals at a rate with prompt
lengths drawn from a configurable distribution (seeded, so runs repeat), or a replay of
a CSV trace shaped like the public LLM inference traces (Azure's
`TIMESTAMP,ContextTokens,GeneratedTokens`; column names are configurable).

Every request that arrives ends SERVED (with its TTFT) or REJECTED with a reason; the
`RequestLedger` enforces that none is lost silently (`check()` is the invariant tests use).
"""

from __future__ import annotations

import csv
import enum
import io
import math
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from testbed_core.configfile import MAX_TRACE_BYTES, ConfigError, read_text

MAX_TRACE_REQUESTS = 1_000_000  # rows of a replayed trace
MAX_TRACE_TOKENS = 2**24  # prompt or generated tokens of one request


@dataclass(frozen=True)
class Request:
    """One prefill request. `arrival_s` is seconds after the source's time zero."""

    id: str
    arrival_s: float
    prompt_tokens: int
    generated_tokens: int = 0
    deadline_s: float | None = None  # TTFT budget counted from arrival; None = no deadline

    def expires_at(self) -> float:
        return math.inf if self.deadline_s is None else self.arrival_s + self.deadline_s


# --------------------------------------------------------------------------- lengths


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class _Sharded(_Strict):
    """A cluster-wide source split among agents: agent `shard_index` of `shard_count`
    takes every shard_count-th request (same seed everywhere, so no request is lost or
    served twice)."""

    shard_index: int = Field(default=0, ge=0)
    shard_count: int = Field(default=1, ge=1)

    @model_validator(mode="after")
    def _shard(self) -> _Sharded:
        if self.shard_index >= self.shard_count:
            raise ValueError(f"shard_index {self.shard_index} must be below shard_count {self.shard_count}")
        return self

    def _take(self, reqs: list[Request]) -> list[Request]:
        return reqs[self.shard_index::self.shard_count] if self.shard_count > 1 else reqs


class FixedLength(_Strict):
    kind: Literal["fixed"] = "fixed"
    tokens: int = Field(gt=0)

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return np.full(n, self.tokens, dtype=np.int64)


class UniformLength(_Strict):
    kind: Literal["uniform"] = "uniform"
    min: int = Field(gt=0)
    max: int = Field(gt=0)

    @model_validator(mode="after")
    def _order(self) -> UniformLength:
        if self.max < self.min:
            raise ValueError(f"uniform prompt lengths: max ({self.max}) is below min ({self.min})")
        return self

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return rng.integers(self.min, self.max + 1, size=n, dtype=np.int64)


class LogNormalLength(_Strict):
    """Lognormal, clipped to [min, max]: the long-tailed shape of real prompt lengths.
    Give its `median` (exp(mu)) or its `mean` (exp(mu + sigma^2/2)), and `sigma`."""

    kind: Literal["lognormal"] = "lognormal"
    median: float | None = Field(default=None, gt=0)
    mean: float | None = Field(default=None, gt=0)
    sigma: float = Field(ge=0)
    min: int = Field(default=1, gt=0)
    max: int = Field(default=32768, gt=0)

    @model_validator(mode="after")
    def _check(self) -> LogNormalLength:
        if (self.median is None) == (self.mean is None):
            raise ValueError("lognormal prompt lengths: give exactly one of median or mean")
        if self.max < self.min:
            raise ValueError(f"lognormal prompt lengths: max ({self.max}) is below min ({self.min})")
        return self

    @property
    def mu(self) -> float:
        if self.median is not None:
            return math.log(self.median)
        assert self.mean is not None
        return math.log(self.mean) - self.sigma**2 / 2

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        raw = rng.lognormal(mean=self.mu, sigma=self.sigma, size=n)
        return np.clip(np.rint(raw), self.min, self.max).astype(np.int64)


LengthDist = Annotated[FixedLength | UniformLength | LogNormalLength, Field(discriminator="kind")]


# --------------------------------------------------------------------------- sources


class PoissonSource(_Sharded):
    """Poisson arrivals: exponential inter-arrival gaps at `rate_per_s`, until `duration_s`
    or `count` requests (whichever comes first; at least one must be set)."""

    kind: Literal["poisson"] = "poisson"
    rate_per_s: float = Field(ge=0)
    lengths: LengthDist
    seed: int = 0
    duration_s: float | None = Field(default=None, gt=0)
    count: int | None = Field(default=None, ge=0)
    deadline_s: float | None = Field(default=None, gt=0)
    start_s: float = Field(default=0.0, ge=0)
    id_prefix: str = "r"

    @model_validator(mode="after")
    def _bounded(self) -> PoissonSource:
        if self.duration_s is None and self.count is None:
            raise ValueError("poisson request source needs duration_s or count (else it never ends)")
        return self

    def requests(self) -> list[Request]:
        rng = np.random.default_rng(self.seed)
        if self.rate_per_s == 0:
            return []
        limit = self.count if self.count is not None else math.inf
        end = self.start_s + self.duration_s if self.duration_s is not None else math.inf
        # exponential gaps drawn in batches (vectorised: an hour at 100/s is 360k requests)
        expected = min(limit, (end - self.start_s) * self.rate_per_s)
        batch = int(min(max(1024, expected * 1.1 + 64), 1 << 22))
        parts: list[np.ndarray] = []
        t, n = self.start_s, 0
        while n < limit and t < end:
            times = t + np.cumsum(rng.exponential(1.0 / self.rate_per_s, size=batch))
            times = times[times < end][: int(min(batch, limit - n))]
            parts.append(times)
            n += len(times)
            if len(times) < batch:
                break
            t = float(times[-1])
        arrivals = np.concatenate(parts) if parts else np.empty(0)
        lengths = self.lengths.sample(rng, len(arrivals))
        return self._take([
            Request(f"{self.id_prefix}{i}", float(t), int(n), 0, self.deadline_s)
            for i, (t, n) in enumerate(zip(arrivals, lengths, strict=True))
        ])


class TraceError(ConfigError):
    """A request trace that cannot be read; the message names the file and line."""


class TraceSource(_Sharded):
    """Replay of a CSV trace. Timestamps are seconds (numbers) or ISO date-times; they are
    made relative to the earliest row and divided by `speedup`; rows are replayed in time
    order (`limit`: the earliest N)."""

    kind: Literal["trace"] = "trace"
    path: Path
    timestamp_column: str = "TIMESTAMP"
    tokens_column: str = "ContextTokens"
    generated_column: str | None = "GeneratedTokens"
    speedup: float = Field(default=1.0, gt=0)
    start_s: float = Field(default=0.0, ge=0)
    limit: int | None = Field(default=None, ge=0)
    deadline_s: float | None = Field(default=None, gt=0)
    id_prefix: str = "t"

    def requests(self) -> list[Request]:
        return self._take(read_trace(self))


RequestSourceConfig = Annotated[PoissonSource | TraceSource, Field(discriminator="kind")]


def _parse_time(text: str) -> float:
    text = text.strip()
    try:
        return float(text)
    except ValueError:
        pass
    # Azure traces carry 7 fractional digits; datetime takes at most 6.
    head, dot, frac = text.partition(".")
    if dot:
        digits = "".join(ch for ch in frac if ch.isdigit())
        rest = frac[len(digits):]
        text = f"{head}.{digits[:6]}{rest}"
    return datetime.fromisoformat(text).timestamp()


def read_trace(cfg: TraceSource) -> list[Request]:
    """The requests of a CSV trace. The file is read through the toolkit's one reading
    path (testbed_core.configfile.read_text: a UTF-8 text file of at most
    MAX_TRACE_BYTES) and may hold at most MAX_TRACE_REQUESTS rows."""
    path = cfg.path
    text = read_text(path, "request trace", TraceError, max_bytes=MAX_TRACE_BYTES)
    try:
        return _read_rows(cfg, path, text)
    except csv.Error as exc:
        raise TraceError(f"{path}: not a CSV trace ({exc})") from None


def _read_rows(cfg: TraceSource, path: Path, text: str) -> list[Request]:
    rows: list[tuple[float, int, int]] = []
    with io.StringIO(text, newline="") as handle:
        reader = csv.DictReader(handle)
        header = reader.fieldnames
        if not header:
            raise TraceError(f"{path}: empty trace (expected a header line with "
                             f"{cfg.timestamp_column!r} and {cfg.tokens_column!r})")
        header = [h.strip() for h in header]
        reader.fieldnames = header
        wanted = [cfg.timestamp_column, cfg.tokens_column]
        if cfg.generated_column is not None and cfg.generated_column in header:
            wanted.append(cfg.generated_column)
        for col in (cfg.timestamp_column, cfg.tokens_column):
            if col not in header:
                raise TraceError(f"{path}:1: no column {col!r} in header {header}; "
                                 "set timestamp_column / tokens_column to the trace's names")
        for row in reader:
            line = reader.line_num
            if len(rows) >= MAX_TRACE_REQUESTS:
                raise TraceError(f"{path}:{line}: more than {MAX_TRACE_REQUESTS} requests; replay a part of the "
                                 "trace (cut the file)")
            if None in row or any(row.get(c) is None for c in wanted):
                raise TraceError(f"{path}:{line}: expected {len(header)} fields ({', '.join(header)}), "
                                 f"got a row of a different length")
            raw_t = row[cfg.timestamp_column]
            try:
                t = _parse_time(raw_t)
            except ValueError:
                raise TraceError(f"{path}:{line}: timestamp {raw_t!r} in column "
                                 f"{cfg.timestamp_column!r} is neither seconds nor an ISO date-time") from None
            if not math.isfinite(t):
                raise TraceError(f"{path}:{line}: timestamp {raw_t!r} is not finite")
            tokens = _parse_count(row[cfg.tokens_column], path, line, cfg.tokens_column)
            if tokens == 0:
                raise TraceError(f"{path}:{line}: {cfg.tokens_column} is 0; a prefill needs at least one token")
            gen = 0
            if cfg.generated_column is not None and cfg.generated_column in header:
                gen = _parse_count(row[cfg.generated_column], path, line, cfg.generated_column)
            rows.append((t, tokens, gen))
    if not rows or cfg.limit == 0:
        return []
    rows.sort(key=lambda r: r[0])
    if cfg.limit is not None:
        rows = rows[: cfg.limit]
    t0 = rows[0][0]
    return [
        Request(f"{cfg.id_prefix}{i}", cfg.start_s + (t - t0) / cfg.speedup, n, g, cfg.deadline_s)
        for i, (t, n, g) in enumerate(rows)
    ]


def _parse_count(text: str, path: Path, line: int, column: str) -> int:
    try:
        value = float(text.strip())
    except ValueError:
        raise TraceError(f"{path}:{line}: {column} {text!r} is not a number") from None
    if not math.isfinite(value) or value < 0 or value != int(value):
        raise TraceError(f"{path}:{line}: {column} {text!r} is not a whole, non-negative token count")
    if value > MAX_TRACE_TOKENS:
        raise TraceError(f"{path}:{line}: {column} {text!r} is above {MAX_TRACE_TOKENS} tokens")
    return int(value)


def load_requests(cfg: PoissonSource | TraceSource) -> list[Request]:
    """The request list of a source, sorted by arrival."""
    return sorted(cfg.requests(), key=lambda r: r.arrival_s)


# --------------------------------------------------------------------------- ledger


class Status(enum.StrEnum):
    SERVED = "served"
    REJECTED = "rejected"


class Reason(enum.StrEnum):
    """Why a request was rejected."""

    QUEUE_FULL = "queue_full"
    DEADLINE_PASSED = "deadline_passed"
    TOO_LONG = "too_long"  # longer than the model's context or than any slot can hold
    NO_SLOTS = "no_slots"  # the training worker announced its end; no slot will come
    RUN_ENDED = "run_ended"  # still waiting when the agent stopped
    SHIP_FAILED = "ship_failed"  # KV cache could not reach the decode host
    ENGINE_ERROR = "engine_error"
    # the prefill controller (bubbletea_agent/controller/)
    DEADLINE_UNREACHABLE = "deadline_unreachable"  # no device's bubbles could start it within its deadline
    UNKNOWN_DECODE_HOST = "unknown_decode_host"  # a client named a decode host the cluster does not have
    NO_DEVICE = "no_device"  # every device's training ended, or no agent synced lately (stale)
    AGENT_LOST = "agent_lost"  # dispatched to an agent that stopped without reporting its end


@dataclass
class RequestRecord:
    """What happened to one request; one JSON line of the agent's `requests.jsonl`."""

    id: str
    arrival: float
    prompt_tokens: int
    status: str | None = None
    reason: str | None = None
    detail: str | None = None
    start: float | None = None  # first prefill chunk began on the device
    end: float | None = None  # last chunk finished on the device
    kv_arrival: float | None = None  # KV cache arrived at the decode host
    ttft: float | None = None  # kv_arrival - arrival
    chunks: int = 0
    prefilled_tokens: int = 0
    predicted_s: float = 0.0  # sum over chunks
    actual_s: float = 0.0
    kv_bytes: int = 0  # true size of the KV cache
    kv_wire_bytes: int = 0  # what crossed the network to the decode host
    kv_modelled_s: float = 0.0  # part of the TTFT charged for the bytes that did not cross
    kv_digest_ok: bool | None = None  # the decode host's xxh64 check of the bytes (None: never reached it)
    kv_decode_ok: bool | None = None  # its decode step from the cache gave the reference's next token
    # (None: not run: modelled cache, or no model at the decode host)
    guard_violations: int = 0
    taken: float | None = None  # dispatch: controller: when this agent took it from the controller

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


class LedgerError(RuntimeError):
    """An accounting bug: a request changed state twice or never ended."""


@dataclass
class RequestLedger:
    """The single place where requests are recorded; a request ends exactly once."""

    records: dict[str, RequestRecord] = field(default_factory=dict)
    on_end: Callable[[RequestRecord], None] | None = None  # called once as each request ends

    def arrive(self, req: Request) -> RequestRecord:
        if req.id in self.records:
            raise LedgerError(f"request id {req.id!r} arrived twice (ids must be unique in a source)")
        rec = RequestRecord(req.id, req.arrival_s, req.prompt_tokens)
        self.records[req.id] = rec
        return rec

    def _open(self, req_id: str) -> RequestRecord:
        rec = self.records.get(req_id)
        if rec is None:
            raise LedgerError(f"request {req_id!r} never arrived")
        if rec.status is not None:
            raise LedgerError(f"request {req_id!r} already ended as {rec.status} ({rec.reason})")
        return rec

    def get(self, req_id: str) -> RequestRecord:
        return self.records[req_id]

    def serve(self, req_id: str, kv_arrival: float, detail: str = "") -> RequestRecord:
        rec = self._open(req_id)
        rec.detail = detail or None
        rec.status = Status.SERVED.value
        rec.kv_arrival = kv_arrival
        rec.ttft = kv_arrival - rec.arrival
        if self.on_end is not None:
            self.on_end(rec)
        return rec

    def reject(self, req_id: str, reason: Reason, detail: str = "") -> RequestRecord:
        rec = self._open(req_id)
        rec.status = Status.REJECTED.value
        rec.reason = reason.value
        rec.detail = detail or None
        if self.on_end is not None:
            self.on_end(rec)
        return rec

    def outstanding(self) -> list[str]:
        return [rid for rid, rec in self.records.items() if rec.status is None]

    def close(self, reason: Reason = Reason.RUN_ENDED, detail: str = "") -> int:
        """End every request still open (the agent is stopping); returns how many."""
        left = self.outstanding()
        for rid in left:
            self.reject(rid, reason, detail)
        return len(left)

    def counts(self) -> dict[str, Any]:
        served = sum(1 for r in self.records.values() if r.status == Status.SERVED)
        reasons = Counter(r.reason for r in self.records.values() if r.status == Status.REJECTED)
        return {
            "arrived": len(self.records),
            "served": served,
            "rejected": sum(reasons.values()),
            "rejected_by_reason": dict(sorted(reasons.items())),
            "outstanding": len(self.outstanding()),
            "guard_violations": sum(r.guard_violations for r in self.records.values()),
        }

    def check(self, expected: Iterable[str] | None = None) -> None:
        """Raise unless every request ended once, and (if given) every expected id arrived."""
        left = self.outstanding()
        if left:
            raise LedgerError(f"{len(left)} request(s) never ended: {left[:5]}")
        if expected is not None:
            missing = [rid for rid in expected if rid not in self.records]
            if missing:
                raise LedgerError(f"{len(missing)} request(s) never arrived: {missing[:5]}")
        for rec in self.records.values():
            if rec.status == Status.SERVED and rec.ttft is None:
                raise LedgerError(f"request {rec.id!r} served without a TTFT")
            if rec.status == Status.REJECTED and not rec.reason:
                raise LedgerError(f"request {rec.id!r} rejected without a reason")
