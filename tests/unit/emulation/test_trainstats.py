"""The statistics behind `topo check`'s packet trains: loss intervals and train sizes
(checked against simulated trains, so the stated confidence is the real one), the
order-keeping jitter model, a train's figures from its records, and TCP's expected
goodput under loss."""

from __future__ import annotations

import math

import numpy as np
import pytest

from testbed.emulation import trainstats as ts


def records(rows: list[tuple[int, int, int]]) -> np.ndarray:
    dt = np.dtype([("seq", "<u4"), ("sent", "<u8"), ("rx", "<u8")])
    return np.array(rows, dtype=dt)


def test_wilson_interval_known_values() -> None:
    lo, hi = ts.wilson_interval(10, 1000)
    assert (lo, hi) == pytest.approx((0.005440, 0.018309), abs=2e-6)  # by hand from the formula
    lo, hi = ts.wilson_interval(0, 2000)
    assert lo == pytest.approx(0.0, abs=1e-12) and hi == pytest.approx(ts.Z95**2 / (2000 + ts.Z95**2), rel=1e-6)
    assert ts.wilson_interval(0, 0) == (0.0, 1.0)


def test_train_size_gives_a_fifth_of_the_rate_at_95_percent() -> None:
    n = ts.train_size(0.001)
    assert 95_000 <= n <= 97_000
    assert ts.train_size(0.0) == ts.LOSSLESS_TRAIN
    assert ts.train_size(1e-6) == ts.MAX_TRAIN  # capped: the report then shows the wider interval
    assert ts.train_size(0.5) == ts.LOSSLESS_TRAIN
    assert ts.train_pps(96_000) == 4800  # the train within MAX_TRAIN_S
    assert ts.train_pps(1_000_000) == ts.MAX_PPS
    assert ts.train_pps(2000) == ts.MIN_PPS


def test_stated_confidence_holds_on_simulated_trains() -> None:
    """Binomial trains of the chosen size at 0.1% loss: about 95% of estimates fall
    within 20% of the rate, and the 99% interval misses the true rate about 1% of the time."""
    p = 0.001
    n = ts.train_size(p)
    rng = np.random.default_rng(7)
    lost = rng.binomial(n, p, size=4000)
    within = np.mean(np.abs(lost / n - p) <= 0.2 * p)
    misses = np.mean([not (lambda lo_hi: lo_hi[0] <= p <= lo_hi[1])(ts.wilson_interval(int(k), n, ts.Z99))
                      for k in lost])
    assert 0.93 <= within <= 0.97
    assert misses <= 0.02


def test_fifo_model_without_and_with_jitter() -> None:
    assert ts.fifo_model_quantiles([0.0, 0.001], 0.025, 0.0) == [0.025, 0.025, 0.025]
    sparse = np.arange(4000) * 0.01  # 10 ms apart, jitter 2 ms: no datagram waits for another
    lo, mid, hi = ts.fifo_model_quantiles(sparse, 0.025, 0.002)
    assert 0.023 <= lo < 0.0231 and abs(mid - 0.025) < 0.0002 and 0.0249 < hi <= 0.027
    dense = np.arange(4000) * 0.0001  # 0.1 ms apart: each waits for the slowest before it
    _lo, mid_dense, hi_dense = ts.fifo_model_quantiles(dense, 0.025, 0.002)
    assert mid_dense > 0.026 and hi_dense <= 0.027


def test_analyse_counts_loss_order_duplicates_and_delays() -> None:
    ms = 1_000_000
    rows = [(0, 0, 25 * ms), (2, 2 * ms, 27 * ms), (1, 1 * ms, 27 * ms + 10), (2, 2 * ms, 27 * ms + 20),
            (4, 4 * ms, 29 * ms)]
    t = ts.analyse("a", "b", records(rows), sent=6, delay_s=0.025, jitter_s=0.0, pps=1000)
    assert (t.received, t.lost, t.duplicates, t.reordered) == (4, 2, 1, 1)
    assert t.loss == pytest.approx(2 / 6)
    assert t.delay_ms["min"] == pytest.approx(25.0) and t.delay_ms["max"] == pytest.approx(26.00001)
    assert t.model_ms == {"min": 25.0, "p50": 25.0, "max": 25.0}
    assert not ts.delay_ok(t)  # reordered
    assert t.as_json()["loss_ci95"][1] > 2 / 6


def _train(delays_ms: list[float], sent: int | None = None) -> ts.DirectionTrain:
    ms = 1_000_000
    rows = [(i, i * ms, int(i * ms + d * ms)) for i, d in enumerate(delays_ms)]
    return ts.analyse("a", "b", records(rows), sent=sent or len(rows), delay_s=0.025, jitter_s=0.0, pps=1000)


def test_delay_verdict_early_late_and_median() -> None:
    assert ts.delay_ok(_train([25.0] * 200))
    assert not ts.delay_ok(_train([25.0] * 199 + [24.6]))  # one early datagram is a fault
    assert ts.delay_ok(_train([25.0] * 192 + [27.0] * 8))  # late wake-ups, 4%: allowed
    assert not ts.delay_ok(_train([25.0] * 188 + [27.0] * 12))  # 6% late: not
    assert not ts.delay_ok(_train([25.5] * 200))  # median 0.5 ms off
    assert not ts.delay_ok(_train([]))


def test_loss_verdict() -> None:
    clean = _train([25.0] * 100)
    assert ts.loss_ok(clean, 0.0)
    assert not ts.loss_ok(_train([25.0] * 100, sent=101), 0.0)  # a loss-free link lost one
    lossy = _train([25.0] * 990, sent=1000)  # 1% measured
    assert ts.loss_ok(lossy, 0.01) and not ts.loss_ok(lossy, 0.001)


def test_rate_verdict() -> None:
    assert ts.rate_ok(1e9, 0.96e9) and ts.rate_ok(1e9, 1.04e9)
    assert not ts.rate_ok(1e9, 0.94e9) and not ts.rate_ok(1e9, None)


def test_expected_tcp_goodput_under_loss() -> None:
    reno = ts.expected_tcp_goodput(1e12, 0.05, 0.001, 1, "reno")
    assert reno == pytest.approx(math.sqrt(1.5 / 0.001) * 1448 * 8 / 0.05)  # Mathis: ~9 Mbit/s
    cubic = ts.expected_tcp_goodput(1e12, 0.05, 0.001, 1, "cubic")
    assert cubic >= reno
    assert ts.expected_tcp_goodput(1e12, 0.2, 0.001, 1, "cubic") > ts.expected_tcp_goodput(1e12, 0.2, 0.001, 1, "reno")
    assert ts.expected_tcp_goodput(400e6, 0.05, 0.001, 8, "cubic") == pytest.approx(8 * cubic)
    assert ts.expected_tcp_goodput(400e6, 0.05, 0.001, 1000, "cubic") == 400e6  # capped at the rate
    assert ts.expected_tcp_goodput(400e6, 0.05, 0.001, 1, "bbr") == 400e6
    assert ts.expected_tcp_goodput(400e6, 0.05, 0.0, 1, "reno") == 400e6


def test_netem_model_is_independent_and_may_reorder() -> None:
    """netem's jitter (tfifo) reorders and leaves delays independent: the model's median
    stays at the delay however dense the train, and reordering is not a fault there."""
    dense = np.arange(4000) * 0.0001
    _lo, mid, _hi = ts.fifo_model_quantiles(dense, 0.025, 0.002, keep_order=False)
    assert abs(mid - 0.025) < 0.0002
    ms = 1_000_000
    rows = [(i, i * ms, i * ms + 25 * ms) for i in range(200)]
    rows[50], rows[51] = rows[51], rows[50]  # 51 arrives first
    for keep in (True, False):
        t = ts.analyse("a", "b", records(rows), sent=200, delay_s=0.025, jitter_s=0.0, pps=1000, keep_order=keep)
        assert t.reordered == 1 and ts.delay_ok(t) is (not keep)
