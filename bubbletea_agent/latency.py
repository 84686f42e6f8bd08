"""Prefill latency model: t(n) = a + b*n + c*n^2 for a prompt of n tokens.

Prefill cost is a fixed launch/overhead term, a linear term (the weight matmuls) and a
quadratic term (attention over the prompt). A chunk of n new tokens after p cached ones
pays the attention part of the tokens it adds: a + b*n + c*((p+n)^2 - p^2), so the chunks
of a prompt add up to the whole prompt plus one `a` per extra chunk.

The coefficients come from profiling the real device at agent start (time a few prompt
lengths, least squares), or, for a modelled device, from the compute model's charge for
the same lengths. Coefficients are kept non-negative (a negative slope would predict
that longer prompts are faster, which admission must never believe).
"""

from __future__ import annotations

import itertools
import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

DEFAULT_PROFILE_LENGTHS: tuple[int, ...] = (16, 64, 128, 256, 512, 1024)


class LatencyFitError(ValueError):
    """Too few or unusable samples to fit a latency curve."""


class LatencyModel:
    """Predicted prefill seconds; subclasses give `predict`, the search is shared."""

    source: str = "model"

    def predict(self, tokens: int, context: int = 0) -> float:
        """Seconds to prefill `tokens` new tokens after `context` cached ones."""
        raise NotImplementedError

    def max_tokens_within(self, budget_s: float, context: int = 0, limit: int | None = None) -> int:
        """The largest n (<= limit) with predict(n, context) <= budget_s; 0 if none.
        Relies on predict growing with n (every model here does)."""
        if (limit is not None and limit <= 0) or self.predict(1, context) > budget_s:
            return 0
        if limit is not None:
            hi = limit
        else:
            hi = 2
            while self.predict(hi, context) <= budget_s:
                hi *= 2
                if hi > 1 << 40:
                    return hi  # free tokens: the model charges nothing per token
        if self.predict(hi, context) <= budget_s:
            return hi
        lo = 1  # predict(lo) <= budget, predict(hi) > budget
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if self.predict(mid, context) <= budget_s:
                lo = mid
            else:
                hi = mid
        return lo

    def describe(self) -> str:
        return f"latency model [{self.source}]"

    def to_json(self) -> dict:
        return {"source": self.source}


@dataclass(frozen=True)
class QuadraticLatency(LatencyModel):
    """t = a + b*n + c*((p+n)^2 - p^2) for n new tokens after p cached ones."""

    a: float
    b: float
    c: float
    source: str = "fit"  # "profiled:<device>", ...
    samples: tuple[tuple[int, float], ...] = field(default=(), compare=False)
    rel_rmse: float = 0.0  # relative RMS error of the fit on its samples

    def predict(self, tokens: int, context: int = 0) -> float:
        if tokens <= 0:
            return 0.0
        total = context + tokens
        return self.a + self.b * tokens + self.c * (total * total - context * context)

    def describe(self) -> str:
        return (f"t(n) = {self.a * 1e3:.3f} ms + {self.b * 1e6:.4f} us*n + {self.c * 1e9:.6f} ns*n^2 "
                f"[{self.source}, {len(self.samples)} samples, rel rmse {self.rel_rmse:.1%}]")

    def to_json(self) -> dict:
        return {"a": self.a, "b": self.b, "c": self.c, "source": self.source,
                "rel_rmse": self.rel_rmse, "samples": [list(s) for s in self.samples]}


def fit(samples: Sequence[tuple[int, float]], source: str = "fit") -> QuadraticLatency:
    """Least-squares fit of a + b*n + c*n^2 with a, b, c >= 0.

    Solves every subset of the three terms and keeps the best fit whose coefficients are
    all non-negative: exact non-negative least squares for three unknowns, no SciPy.
    Residuals are weighted by 1/t so short and long prompts count alike (admission cares
    about relative error)."""
    pts = [(int(n), float(t)) for n, t in samples]
    if len(pts) < 2:
        raise LatencyFitError(f"need at least 2 (tokens, seconds) samples to fit a latency curve, got {len(pts)}")
    for n, t in pts:
        if n <= 0 or not math.isfinite(t) or t <= 0:
            raise LatencyFitError(f"bad latency sample ({n} tokens, {t} s): tokens and seconds must be > 0")
    if len({n for n, _ in pts}) < 2:
        raise LatencyFitError("latency samples cover a single prompt length; profile at least two lengths")
    n = np.array([p[0] for p in pts], dtype=np.float64)
    t = np.array([p[1] for p in pts], dtype=np.float64)
    w = 1.0 / t
    cols = [np.ones_like(n), n, n * n]
    best: tuple[float, np.ndarray] | None = None
    for k in (3, 2, 1):
        for subset in itertools.combinations(range(3), k):
            A = np.stack([cols[i] for i in subset], axis=1) * w[:, None]
            coef, *_ = np.linalg.lstsq(A, t * w, rcond=None)
            if np.any(coef < 0):
                continue
            full = np.zeros(3)
            full[list(subset)] = coef
            pred = full[0] + full[1] * n + full[2] * n * n
            err = float(np.sum(((pred - t) / t) ** 2))
            if best is None or err < best[0] - 1e-15:
                best = (err, full)
    assert best is not None  # the constant-only fit is always non-negative for t > 0
    err, (a, b, c) = best
    rel_rmse = math.sqrt(err / len(pts))
    return QuadraticLatency(float(a), float(b), float(c), source, tuple(pts), rel_rmse)


def profile(
    run_once: Callable[[int], float],
    lengths: Sequence[int] = DEFAULT_PROFILE_LENGTHS,
    repeats: int = 3,
    warmup: int = 1,
) -> list[tuple[int, float]]:
    """Median seconds of `run_once(n)` per length (run_once returns the time it measured)."""
    if repeats < 1:
        raise ValueError("repeats must be >= 1")
    for n in lengths[:1] * warmup:
        run_once(n)
    out = []
    for n in lengths:
        out.append((n, statistics.median(run_once(n) for _ in range(repeats))))
    return out


def timed(fn: Callable[[], object], sync: Callable[[], None] | None = None) -> float:
    """Wall seconds of fn(), synchronising the accelerator before stopping the clock."""
    t0 = time.perf_counter()
    fn()
    if sync is not None:
        sync()
    return time.perf_counter() - t0


@dataclass(frozen=True)
class FunctionLatency(LatencyModel):
    """Predictions straight from a cost function (tokens, context) -> seconds: for a
    modelled device this is the very charge the device will hold itself busy for."""

    fn: Callable[[int, int], float]
    source: str = "compute-model"

    def predict(self, tokens: int, context: int = 0) -> float:
        return 0.0 if tokens <= 0 else float(self.fn(tokens, context))
