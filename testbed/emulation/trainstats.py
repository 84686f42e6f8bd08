"""What a packet train (`testbed.emulation.probe`) says about one direction of a link,
and the verdicts `testbed topo check` draws from it. Pure: no I/O beyond reading the
records file.

Loss is a binomial proportion: with k of n datagrams lost, the estimate is k/n and
its Wilson score interval gives the confidence the sample size allows. The train is
sized (`train_size`) so that the 95% interval's half-width is about a fifth of the
configured loss rate; a link is judged consistent with its configuration when the
configured rate lies inside the measurement's 99% interval (so a correct link fails
this test about once in a hundred checks), and a loss-free link must lose nothing.

Delay: the delay line keeps order (a FIFO link), so under jitter a datagram can wait
for the one before it, and the delay distribution depends on how closely the
datagrams follow each other. `fifo_model_quantiles` draws the configured uniform
jitter for the train's own send times, applies the same ordering rule and gives the
distribution the link should show; the measured median is compared with the model's.
netem (under HTB, without its own rate) sorts by send time instead, so jitter there
reorders and delays are independent: with ``keep_order=False`` the model has no
ordering rule and reordering is not held against the link.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from testbed.emulation.probe import RECORD

Z95 = 1.959964
Z99 = 2.575829
TARGET_REL_HALF_WIDTH = 0.2  # 95% interval of the loss estimate: +-20% of the configured rate
LOSSLESS_TRAIN = 2000  # datagrams on a loss-free link: 0 lost bounds the loss below 0.15% (95%)
MAX_TRAIN = 500_000  # 100 s at MAX_PPS
MAX_PPS = 5_000  # per direction: the Python delay line keeps up with small datagrams on a busy 2-core box
MIN_PPS = 2_000
MAX_TRAIN_S = 20.0
DELAY_TOL_S = 0.0003  # median delay and min delay within 0.3 ms of the model
LATE_TOL_S = 0.001  # later than delay + jitter by more than this counts as late
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
    return max(0.0, centre - half), min(1.0, centre + half)


def train_size(loss: float, rel_half_width: float = TARGET_REL_HALF_WIDTH, z: float = Z95) -> int:
    """Datagrams needed so that the loss estimate's interval is +-rel_half_width of
    `loss` (normal approximation), within [LOSSLESS_TRAIN, MAX_TRAIN]."""
    if loss <= 0:
        return LOSSLESS_TRAIN
    n = math.ceil((z / rel_half_width) ** 2 * (1 - loss) / loss)
    return max(LOSSLESS_TRAIN, min(MAX_TRAIN, n))


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


@dataclass
class DirectionTrain:
    """One direction's train: counts, loss with its intervals, delay and order."""

    src: str
    dst: str
    sent: int
    received: int
    lost: int
    loss: float
    loss_ci95: tuple[float, float]
    loss_ci99: tuple[float, float]
    reordered: int
    duplicates: int
    early: int  # datagrams faster than delay - jitter (less DELAY_TOL_S): must be none
    late: int  # datagrams slower than delay + jitter + LATE_TOL_S
    delay_ms: dict[str, float]  # min, p50, p99, max (measured, end to end)
    model_ms: dict[str, float]  # min, p50, max of the FIFO model for the same send times
    pps: float
    keep_order: bool = True  # the link is meant to keep order (the relay); netem's jitter reorders

    def as_json(self) -> dict:
        return {
            "src": self.src, "dst": self.dst, "sent": self.sent, "received": self.received, "lost": self.lost,
            "loss": self.loss, "loss_ci95": list(self.loss_ci95), "loss_ci99": list(self.loss_ci99),
            "reordered": self.reordered, "keep_order": self.keep_order, "duplicates": self.duplicates,
            "early": self.early, "late": self.late,
            "pps": self.pps,
            "delay_ms": {k: round(v, 4) for k, v in self.delay_ms.items()},
            "model_ms": {k: round(v, 4) for k, v in self.model_ms.items()},
        }


def analyse(src: str, dst: str, records: np.ndarray, sent: int, delay_s: float, jitter_s: float,
            pps: float, keep_order: bool = True) -> DirectionTrain:
    """The figures of one direction from its receiver's records and its sender's count."""
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
    model = fifo_model_quantiles(send_s - (send_s[0] if send_s.size else 0.0), delay_s, jitter_s,
                                 keep_order=keep_order)
    return DirectionTrain(
        src=src, dst=dst, sent=sent, received=received, lost=lost, loss=lost / sent if sent else math.nan,
        loss_ci95=wilson_interval(lost, sent, Z95), loss_ci99=wilson_interval(lost, sent, Z99),
        reordered=reordered, duplicates=duplicates,
        early=int(np.count_nonzero(delays < delay_s - jitter_s - DELAY_TOL_S)),
        late=int(np.count_nonzero(delays > delay_s + jitter_s + LATE_TOL_S)), delay_ms=delay_ms,
        model_ms={"min": model[0] * 1e3, "p50": model[1] * 1e3, "max": model[2] * 1e3}, pps=pps,
        keep_order=keep_order,
    )


def loss_ok(train: DirectionTrain, configured: float) -> bool:
    """A loss-free link loses nothing; a lossy one is consistent with its rate (99%)."""
    if train.sent <= 0:
        return False
    if configured <= 0:
        return train.lost == 0
    lo, hi = train.loss_ci99
    return bool(lo <= configured <= hi)


def delay_ok(train: DirectionTrain) -> bool:
    """Nothing early (every delay >= delay - jitter, less 0.3 ms), at most 5% late (over
    delay + jitter + 1 ms: on a shared machine a wake-up now and then is late, which the
    maximum shows), median within 0.3 ms of the FIFO model's, no reordering."""
    d = train.delay_ms
    if train.received == 0 or any(math.isnan(v) for v in d.values()):
        return False
    in_order = train.reordered == 0 or not train.keep_order
    return bool(train.early == 0 and train.late <= LATE_FRACTION * train.received and in_order
                and abs(d["p50"] - train.model_ms["p50"]) <= DELAY_TOL_S * 1e3)


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
