"""What a packet train (`testbed.emulation.linkmeasure.probe`) says about one direction of a link,
and the verdicts `testbed topo check` draws from it. Pure: no I/O beyond reading the
records file.

Loss (`judge_loss`): the two directions of a link share its configured rate p, so
their counts pool into one binomial estimate. A lossy link is `ok` when
- the pooled loss is within a relative tolerance (20%) of p, and
- each direction's own count lies inside the central 1 - DIRECTION_ALPHA (99.99%)
  range of Binomial(sent, p), so a link that loses too much one way and too little
  the other (an asymmetric or wrong link) fails even when the pool looks right.
The train is sized (`train_size`) so that the tolerance is LOSS_Z = 4 standard
deviations of the pooled estimate (at 0.1%: 400 expected losses, 200,000 datagrams
each way, 40 s at MAX_PPS); a train capped by MAX_TRAIN widens the tolerance to those 4
standard deviations instead of failing correct links, and the report says so. The
false-alarm rate, the chance that a correct link fails, is computed exactly from the
binomial tails for the train actually sent (`LossVerdict.false_alarm`, a union bound
over the three tests): about 6e-5 for the pooled test plus 1e-4 per direction, so at
most ~3e-4 per lossy link. A link at 0.07% or 0.14% when 0.1% is configured is 30% or
40% off, 6 to 8 standard deviations at that size: it fails. A loss-free link must lose
nothing (no false alarm: a correct relay drops nothing).

Delay: the delay line keeps order (a FIFO link), so under jitter a datagram can wait
for the one before it, and the delay distribution depends on how closely the
datagrams follow each other. `fifo_model_quantiles` draws the configured uniform
jitter for the train's own send times, applies the same ordering rule and gives the
distribution the link should show; the measured median is compared with the model's
(within 0.3 ms plus 4 standard deviations of the median's own sampling spread, taken
from several model draws, so a short train under wide jitter does not fail by chance).
Early datagrams (below delay - jitter less the relay path's calibrated offset, at least
0.3 ms) cannot come from a correct relay; late ones (over delay + jitter + 1 ms, which
the FIFO model never exceeds) come from late wake-ups of a busy machine and are allowed
up to 5%.
netem (under HTB, without its own rate) sorts by send time instead, so jitter there
reorders and delays are independent: with ``keep_order=False`` the model has no
ordering rule and reordering is not held against the link.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from pydantic import BaseModel, ConfigDict

from testbed.emulation.linkmeasure.probe import RECORD

Z95 = 1.959964
Z99 = 2.575829
LOSS_REL_TOL = 0.2  # the pooled loss within +-20% of the configured rate
TARGET_REL_HALF_WIDTH = LOSS_REL_TOL  # (the name `topo check --loss-precision` passes in)
LOSS_Z = 4.0  # the train makes the tolerance this many standard deviations of the pooled estimate
DIRECTION_ALPHA = 1e-4  # each direction's count outside its central 99.99% binomial range fails
LOSSLESS_TRAIN = 2000  # datagrams on a loss-free link: 0 lost bounds the loss below 0.15% (95%)
MAX_TRAIN = 300_000  # per direction: 60 s at MAX_PPS
MAX_PPS = 5_000  # per direction: the Python delay line keeps up with small datagrams on a busy 2-core box
MIN_PPS = 2_000
MAX_TRAIN_S = 20.0
DELAY_TOL_S = 0.0003  # median delay and min delay within 0.3 ms of the model
LATE_TOL_S = 0.001  # later than delay + jitter by more than this counts as late
MEDIAN_Z = 4.0  # the median may also differ by this many standard deviations of its sampling spread
MODEL_DRAWS = 8  # model draws that give the median's sampling spread
LATE_FRACTION = 0.05  # at most 5% late: a shared machine's late wake-ups, not the link's shape
RATE_TOL = 0.05  # measured shaper rate within 5% of the configured rate
MSS = 1448


def wilson_interval(lost: int, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval of a binomial proportion (good also at 0 or few events)."""
    if n <= 0:
        return 0.0, 1.0
    p = lost / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    lo = 0.0 if lost == 0 else max(0.0, centre - half)  # (rounding left ~1e-19 at 0 lost)
    return lo, min(1.0, centre + half)


def train_size(loss: float, rel_tol: float = LOSS_REL_TOL, z: float = LOSS_Z, directions: int = 2) -> int:
    """Datagrams per direction so that `rel_tol` of `loss` is `z` standard deviations of
    the estimate pooled over `directions` (normal approximation: N p = (z / rel_tol)^2 (1 - p)
    expected losses in all), within [LOSSLESS_TRAIN, MAX_TRAIN]."""
    if loss <= 0:
        return LOSSLESS_TRAIN
    n = math.ceil((z / rel_tol) ** 2 * (1 - loss) / loss / max(1, directions))
    return max(LOSSLESS_TRAIN, min(MAX_TRAIN, n))


def _log_pmf(ks: np.ndarray, n: int, p: float) -> np.ndarray:
    lg = np.vectorize(math.lgamma, otypes=[float])
    return lg(n + 1.0) - lg(ks + 1.0) - lg(n - ks + 1.0) + ks * math.log(p) + (n - ks) * math.log1p(-p)


def _pmf_window(n: int, p: float) -> tuple[np.ndarray, np.ndarray]:
    """(k, P(K = k)) of Binomial(n, p) over every k with non-negligible mass (mean +- 40
    standard deviations: what lies outside is below 1e-300)."""
    mean, sd = n * p, math.sqrt(n * p * (1 - p))
    lo, hi = max(0, math.floor(mean - 40 * sd - 50)), min(n, math.ceil(mean + 40 * sd + 50))
    ks = np.arange(lo, hi + 1, dtype=float)
    return ks.astype(np.int64), np.exp(_log_pmf(ks, n, p))


def binom_tail_outside(n: int, p: float, lo: float, hi: float) -> float:
    """P(K < lo or K > hi) for K ~ Binomial(n, p), exactly (lo, hi real: bounds on k)."""
    if n <= 0 or p <= 0 or p >= 1:
        k = n * p
        return 0.0 if lo <= k <= hi else 1.0
    ks, pmf = _pmf_window(n, p)
    return float(np.clip(pmf[(ks < lo) | (ks > hi)].sum(), 0.0, 1.0))


def binom_central(n: int, p: float, alpha: float = DIRECTION_ALPHA) -> tuple[int, int]:
    """The counts [lo, hi] holding the central 1 - alpha of Binomial(n, p): P(K < lo) and
    P(K > hi) are each at most alpha / 2."""
    if n <= 0 or p <= 0:
        return 0, 0
    if p >= 1:
        return n, n
    ks, pmf = _pmf_window(n, p)
    cdf = np.cumsum(pmf)
    below = cdf - pmf  # P(K < k)
    above = 1.0 - cdf  # P(K > k)
    lo = int(ks[np.nonzero(below <= alpha / 2)[0][-1]])
    hi = int(ks[np.nonzero(above <= alpha / 2)[0][0]])
    return lo, hi


class _Report(BaseModel):
    """A part of `testbed topo check`'s report (``--json``), as the verdicts left it."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class LossVerdictReport(_Report):
    """`LossVerdict` as reported: `pooled` the pooled loss (None when nothing was sent),
    `rel_error` its error relative to the configured rate (None on a loss-free link)."""

    configured: float
    sent: int
    lost: int
    pooled: float | None
    rel_error: float | None
    rel_tol: float
    sigmas: float
    pooled_ok: bool
    direction_alpha: float
    directions: list[DirectionLoss]
    false_alarm: float
    ok: bool


class DirectionLoss(_Report):
    """One direction against the configured rate: its count and the range a correct
    link's count falls in with probability 1 - DIRECTION_ALPHA."""

    sent: int
    lost: int
    accept: tuple[int, int]
    ok: bool


@dataclass
class LossVerdict:
    """A link's loss verdict over both directions (see the module docstring)."""

    configured: float
    sent: int  # pooled over the directions
    lost: int
    rel_tol: float  # the tolerance applied (widened when the train was capped)
    sigmas: float  # that tolerance in standard deviations of the pooled estimate
    pooled_ok: bool
    directions: list[DirectionLoss]
    false_alarm: float  # P(a correct link fails this verdict), at most (union bound)
    direction_alpha: float = DIRECTION_ALPHA

    @property
    def loss(self) -> float:
        return self.lost / self.sent if self.sent else math.nan

    @property
    def rel_error(self) -> float | None:
        """(pooled loss - configured) / configured; None on a loss-free link."""
        return self.loss / self.configured - 1.0 if self.configured > 0 and self.sent else None

    @property
    def ok(self) -> bool:
        return self.pooled_ok and all(d.ok for d in self.directions)

    def report(self) -> LossVerdictReport:
        rel = self.rel_error
        return LossVerdictReport(
            configured=self.configured, sent=self.sent, lost=self.lost,
            pooled=None if math.isnan(self.loss) else self.loss,
            rel_error=None if rel is None else round(rel, 4), rel_tol=round(self.rel_tol, 4),
            sigmas=round(self.sigmas, 2), pooled_ok=self.pooled_ok, direction_alpha=self.direction_alpha,
            directions=list(self.directions),
            false_alarm=float(f"{self.false_alarm:.3g}"), ok=self.ok)


def judge_loss(counts: Sequence[tuple[int, int]], configured: float, rel_tol: float = LOSS_REL_TOL,
               z: float = LOSS_Z, alpha: float = DIRECTION_ALPHA) -> LossVerdict:
    """The loss verdict of a link from each direction's (sent, lost).

    Loss-free (`configured` 0): every direction loses nothing. Lossy: the pooled loss
    is within `rel_tol` of `configured`, widened to `z` standard deviations when the
    train was too short for `rel_tol` to be that many; and each direction's count is
    inside its central 1 - `alpha` binomial range."""
    sent = sum(n for n, _ in counts)
    lost = sum(k for _, k in counts)
    if not counts or any(n <= 0 for n, _ in counts):
        dirs = [DirectionLoss(sent=n, lost=k, accept=(0, 0), ok=False) for n, k in counts]
        return LossVerdict(configured, sent, lost, rel_tol, 0.0, False, dirs, 1.0, alpha)
    if configured <= 0:
        dirs = [DirectionLoss(sent=n, lost=k, accept=(0, 0), ok=k == 0) for n, k in counts]
        return LossVerdict(configured, sent, lost, 0.0, math.inf, lost == 0, dirs, 0.0, alpha)
    p = configured
    sd_rel = math.sqrt((1 - p) / (sent * p)) if p < 1 else 0.0
    tol = max(rel_tol, z * sd_rel)
    sigmas = tol / sd_rel if sd_rel > 0 else math.inf
    lo_k, hi_k = (1 - tol) * p * sent, (1 + tol) * p * sent
    pooled_ok = lo_k - 1e-9 <= lost <= hi_k + 1e-9
    dirs = []
    false_alarm = binom_tail_outside(sent, p, lo_k - 1e-9, hi_k + 1e-9)
    for n, k in counts:
        lo, hi = binom_central(n, p, alpha)
        dirs.append(DirectionLoss(sent=n, lost=k, accept=(lo, hi), ok=lo <= k <= hi))
        false_alarm += binom_tail_outside(n, p, lo, hi)
    return LossVerdict(configured, sent, lost, tol, sigmas, pooled_ok, dirs, min(1.0, false_alarm), alpha)


def train_pps(count: int, max_seconds: float = MAX_TRAIN_S) -> float:
    """Send rate: the whole train within `max_seconds`, between MIN_PPS and MAX_PPS."""
    return float(max(MIN_PPS, min(MAX_PPS, math.ceil(count / max_seconds))))


def read_records(path: Path) -> np.ndarray:
    """(seq, send ns, receive ns) rows in arrival order."""
    raw = path.read_bytes()
    n = len(raw) // RECORD.size
    dt = np.dtype([("seq", "<u4"), ("sent", "<u8"), ("rx", "<u8")])
    return np.frombuffer(raw[: n * RECORD.size], dtype=dt)


def fifo_model_delays(send_s: Sequence[float] | np.ndarray, delay_s: float, jitter_s: float,
                      seed: int = 1, keep_order: bool = True) -> np.ndarray:
    """One draw of the delays an order-keeping link with uniform +-jitter gives datagrams
    sent at `send_s` (the delay line's rule: deadline = max(previous, sent + delay + U));
    independent uniform delays with ``keep_order=False`` (netem)."""
    t = np.asarray(send_s, dtype=float)
    if jitter_s <= 0 or t.size == 0:
        return np.full(t.size, delay_s)
    rng = np.random.default_rng(seed)
    raw = t + np.maximum(0.0, delay_s + rng.uniform(-jitter_s, jitter_s, t.size))
    return (np.maximum.accumulate(raw) if keep_order else raw) - t


def fifo_model_quantiles(send_s: Sequence[float] | np.ndarray, delay_s: float, jitter_s: float,
                         qs: Sequence[float] = (0.0, 0.5, 1.0), seed: int = 1, keep_order: bool = True) -> list[float]:
    """Quantiles of `fifo_model_delays`."""
    delays = fifo_model_delays(send_s, delay_s, jitter_s, seed, keep_order)
    if delays.size == 0:
        return [math.nan for _ in qs]
    return [float(v) for v in np.quantile(delays, qs)]


class DirectionTrain(BaseModel):
    """One direction's train: counts, loss with its intervals, delay and order (in
    `testbed topo check`'s report as `report` rounds it)."""

    model_config = ConfigDict(extra="forbid")

    src: str
    dst: str
    sent: int
    received: int
    lost: int
    loss: float
    loss_ci95: tuple[float, float]
    loss_ci99: tuple[float, float]
    reordered: int
    keep_order: bool = True  # the link is meant to keep order (the relay); netem's jitter reorders
    duplicates: int
    early: int  # datagrams faster than delay - jitter (less DELAY_TOL_S): must be none
    late: int  # datagrams slower than delay + jitter + LATE_TOL_S
    early_below_ms: float | None = None  # delays below this count as early
    late_above_ms: float | None = None  # ... above this as late
    median_tol_ms: float = DELAY_TOL_S * 1e3  # |median - model median| allowed (0.3 ms + 4 sd of the median)
    pps: float
    delay_ms: dict[str, float]  # min, p50, p99, max (measured, end to end)
    model_ms: dict[str, float]  # min, p50, max of the FIFO model for the same send times

    def report(self) -> DirectionTrain:
        """This train with its delays rounded to 0.1 us, as reported."""
        return self.model_copy(update={
            "early_below_ms": None if self.early_below_ms is None else round(self.early_below_ms, 4),
            "late_above_ms": None if self.late_above_ms is None else round(self.late_above_ms, 4),
            "median_tol_ms": round(self.median_tol_ms, 4),
            "delay_ms": {k: round(v, 4) for k, v in self.delay_ms.items()},
            "model_ms": {k: round(v, 4) for k, v in self.model_ms.items()}})


def analyse(src: str, dst: str, records: np.ndarray, sent: int, delay_s: float, jitter_s: float,
            pps: float, keep_order: bool = True, offset_s: float = 0.0) -> DirectionTrain:
    """The figures of one direction from its receiver's records and its sender's count.
    `offset_s`: the relay path latency the delay line leaves out of the delay (a datagram
    whose path was quicker than that arrives up to `offset_s` before delay - jitter)."""
    seqs = records["seq"].astype(np.int64)
    unique = np.unique(seqs)
    duplicates = int(seqs.size - unique.size)
    received = int(unique.size)
    lost = max(0, sent - received)
    running_max = np.maximum.accumulate(seqs) if seqs.size else seqs
    reordered = int(np.count_nonzero(seqs[1:] < running_max[:-1])) if seqs.size > 1 else 0
    delays = (records["rx"].astype(np.int64) - records["sent"].astype(np.int64)) / 1e9
    if delays.size:
        q = np.quantile(delays, [0.0, 0.5, 0.99, 1.0])
        delay_ms = {k: float(v) * 1e3 for k, v in zip(("min", "p50", "p99", "max"), q, strict=True)}
    else:
        delay_ms = {"min": math.nan, "p50": math.nan, "p99": math.nan, "max": math.nan}
    send_s = np.sort(records["sent"].astype(np.int64)) / 1e9 if records.size else np.array([])
    rel_send = send_s - (send_s[0] if send_s.size else 0.0)
    model = fifo_model_quantiles(rel_send, delay_s, jitter_s, keep_order=keep_order)
    median_tol = DELAY_TOL_S
    if jitter_s > 0 and rel_send.size:
        medians = [float(np.median(fifo_model_delays(rel_send, delay_s, jitter_s, seed, keep_order)))
                   for seed in range(1, MODEL_DRAWS + 1)]
        model[1] = statistics.fmean(medians)
        median_tol += MEDIAN_Z * statistics.stdev(medians) * math.sqrt(1 + 1 / MODEL_DRAWS)
    # the line holds a frame for delay - offset (the offset is the median path latency);
    # the measurement tolerance comes on top of that deliberate shift, not instead of it
    early_below = delay_s - jitter_s - offset_s - DELAY_TOL_S
    late_above = delay_s + jitter_s + LATE_TOL_S
    return DirectionTrain(
        src=src, dst=dst, sent=sent, received=received, lost=lost, loss=lost / sent if sent else math.nan,
        loss_ci95=wilson_interval(lost, sent, Z95), loss_ci99=wilson_interval(lost, sent, Z99),
        reordered=reordered, duplicates=duplicates,
        early=int(np.count_nonzero(delays < early_below)),
        late=int(np.count_nonzero(delays > late_above)), delay_ms=delay_ms,
        model_ms={"min": model[0] * 1e3, "p50": model[1] * 1e3, "max": model[2] * 1e3}, pps=pps,
        keep_order=keep_order, median_tol_ms=median_tol * 1e3, early_below_ms=early_below * 1e3,
        late_above_ms=late_above * 1e3,
    )


def loss_ok(train: DirectionTrain, configured: float) -> bool:
    """One direction alone: a loss-free link loses nothing; a lossy one's count is inside
    its central 1 - DIRECTION_ALPHA binomial range (the link's verdict is `judge_loss`)."""
    return judge_loss([(train.sent, train.lost)], configured, rel_tol=math.inf).ok


def delay_ok(train: DirectionTrain) -> bool:
    """Nothing early (every delay >= delay - jitter - the relay path's offset - 0.3 ms),
    at most 5% late (over delay + jitter + 1 ms: on a shared machine a
    wake-up now and then is late, which the maximum shows), median within
    `median_tol_ms` of the FIFO model's, no reordering."""
    d = train.delay_ms
    if train.received == 0 or any(math.isnan(v) for v in d.values()):
        return False
    in_order = train.reordered == 0 or not train.keep_order
    return bool(train.early == 0 and train.late <= LATE_FRACTION * train.received and in_order
                and abs(d["p50"] - train.model_ms["p50"]) <= train.median_tol_ms + 1e-9)


def rate_ok(configured_bps: float, measured_bps: float | None, tol: float = RATE_TOL) -> bool:
    return measured_bps is not None and bool(abs(measured_bps / configured_bps - 1.0) <= tol)


def expected_tcp_goodput(rate_bps: float, rtt_s: float, loss: float, streams: int,
                         congestion_control: str = "cubic", mss: int = MSS) -> float:
    """Goodput `streams` long-lived TCP flows can expect on a link with random loss,
    capped at the link rate. Reno: Mathis et al. (1997), W = sqrt(3/(2p)) segments.
    CUBIC: the larger of that (its TCP-friendly region) and its own response function,
    W = (C(3+b)/(4(1-b)))^(1/4) (RTT/p)^(3/4) with C=0.4, b=0.7 (RFC 9438). BBR does
    not back off on random loss this low: the link rate."""
    if loss <= 0 or rtt_s <= 0:
        return rate_bps
    if congestion_control == "bbr":
        return rate_bps
    w_reno = math.sqrt(3 / (2 * loss))
    w = w_reno
    if congestion_control == "cubic":
        c, b = 0.4, 0.7
        w = max(w_reno, (c * (3 + b) / (4 * (1 - b))) ** 0.25 * (rtt_s / loss) ** 0.75)
    per_flow = w * mss * 8 / rtt_s
    return min(rate_bps, streams * per_flow)
