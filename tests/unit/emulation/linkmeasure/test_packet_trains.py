"""The statistics behind `topo check`'s packet trains: loss intervals and train sizes
(checked against simulated trains, so the stated confidence is the real one), the
order-keeping jitter model, a train's figures from its records, and TCP's expected
goodput under loss."""

from __future__ import annotations

import math

import numpy as np
import pytest

from testbed.emulation.linkmeasure import packet_trains as ts


def records(rows: list[tuple[int, int, int]]) -> np.ndarray:
    dt = np.dtype([("seq", "<u4"), ("sent", "<u8"), ("rx", "<u8")])
    return np.array(rows, dtype=dt)


def test_wilson_interval_known_values() -> None:
    lo, hi = ts.wilson_interval(10, 1000)
    assert (lo, hi) == pytest.approx((0.005440, 0.018309), abs=2e-6)  # by hand from the formula
    lo, hi = ts.wilson_interval(0, 2000)
    assert lo == 0.0 and hi == pytest.approx(ts.Z95**2 / (2000 + ts.Z95**2), rel=1e-6)
    assert ts.wilson_interval(0, 0) == (0.0, 1.0)


def test_train_size_makes_the_tolerance_four_sigma_of_the_pooled_estimate() -> None:
    n = ts.train_size(0.001)
    assert 199_000 <= n <= 200_500  # 400 expected losses over both directions
    assert ts.train_size(0.002, directions=1) == pytest.approx(2 * ts.train_size(0.002), abs=2)
    assert ts.train_size(0.0) == ts.LOSSLESS_TRAIN
    assert ts.train_size(1e-6) == ts.MAX_TRAIN  # capped: the verdict then widens the tolerance
    assert ts.train_size(0.5) == ts.LOSSLESS_TRAIN
    assert ts.train_pps(96_000) == 4800  # the train within MAX_TRAIN_S
    assert ts.train_pps(1_000_000) == ts.MAX_PPS
    assert ts.train_pps(2000) == ts.MIN_PPS
    assert ts.train_size(0.001) / ts.train_pps(ts.train_size(0.001)) <= 41  # seconds at 0.1%


def test_binomial_tails_and_central_range_against_known_values() -> None:
    assert ts.binom_tail_outside(10, 0.5, 1, 9) == pytest.approx(2 / 1024)  # P(K=0) + P(K=10)
    lo, hi = ts.binom_central(10, 0.5, alpha=0.05)
    assert (lo, hi) == (2, 8)  # P(K<2) = 11/1024 <= 0.025, P(K<3) = 56/1024 is not
    lo, hi = ts.binom_central(199_800, 0.001)
    assert 140 <= lo < 200 < hi <= 265  # ~ +-3.9 sd around 200
    assert ts.binom_tail_outside(199_800, 0.001, lo, hi) <= ts.DIRECTION_ALPHA


def test_a_correct_link_fails_at_the_stated_rate_on_simulated_trains() -> None:
    """Binomial draws of a correct link: the share that fails matches `false_alarm`
    (a bound: the union of the pooled and per-direction tests). Checked where failures are
    common enough to count (2-sigma tolerance, 1% per direction), then at the real size."""
    rng = np.random.default_rng(7)
    p, n = 0.01, 5000  # 100 expected losses pooled: 20% is 2 sigma
    v = ts.judge_loss([(n, 50), (n, 50)], p, z=2.0, alpha=0.01)
    assert v.sigmas == pytest.approx(2.0, rel=0.01) and 0.05 < v.false_alarm < 0.08
    k = rng.binomial(n, p, size=(20_000, 2))
    pooled = np.abs(k.sum(axis=1) / (2 * n) / p - 1) <= v.rel_tol + 1e-12
    lo, hi = v.directions[0].accept
    each = ((k >= lo) & (k <= hi)).all(axis=1)
    failed = 1 - np.mean(pooled & each)
    assert 0.7 * v.false_alarm <= failed <= v.false_alarm * 1.05
    n = ts.train_size(0.001)
    real = ts.judge_loss([(n, 200), (n, 200)], 0.001)
    assert real.sigmas == pytest.approx(4.0, rel=0.01) and real.false_alarm < 3e-4
    k = rng.binomial(n, 0.001, size=(20_000, 2))
    lo, hi = real.directions[0].accept
    fails = np.count_nonzero(~((np.abs(k.sum(axis=1) / (2 * n) / 0.001 - 1) <= real.rel_tol) &
                               ((k >= lo) & (k <= hi)).all(axis=1)))
    assert fails <= 20  # expected ~5 of 20,000


def test_loss_verdict_at_the_edges_and_wrong_links() -> None:
    n = ts.train_size(0.001)
    expected = n * 0.001
    edge_low = ts.judge_loss([(n, 160), (n, 160)], 0.001)  # -19.9%: inside
    assert edge_low.ok and edge_low.rel_error == pytest.approx(-0.199, abs=0.002)
    edge_high = ts.judge_loss([(n, 239), (n, 240)], 0.001)  # +19.9%
    assert edge_high.ok
    assert not ts.judge_loss([(n, 159), (n, 159)], 0.001).pooled_ok  # -20.4%: out
    # last quiet run's low draw (67 and 106 of 95,941): pooled -10% at 2x the size would pass
    assert ts.judge_loss([(n, 2 * 67 + 50), (n, 2 * 106)], 0.001).ok
    at_007 = ts.judge_loss([(n, round(0.0007 * n))] * 2, 0.001)
    at_014 = ts.judge_loss([(n, round(0.0014 * n))] * 2, 0.001)
    assert not at_007.ok and not at_007.pooled_ok and at_007.rel_error == pytest.approx(-0.3, abs=0.01)
    assert not at_014.ok and not at_014.pooled_ok
    asym = ts.judge_loss([(n, round(0.5 * expected)), (n, round(1.5 * expected))], 0.001)
    assert asym.pooled_ok and not asym.ok and [d.ok for d in asym.directions] == [False, False]
    one_way_low = ts.judge_loss([(n, round(0.65 * expected)), (n, round(1.1 * expected))], 0.001)
    assert one_way_low.pooled_ok and not one_way_low.ok  # 35% low one way: outside its 99.99% range
    clean = ts.judge_loss([(2000, 0), (2000, 0)], 0.0)
    assert clean.ok and clean.false_alarm == 0.0
    assert not ts.judge_loss([(2000, 0), (2000, 1)], 0.0).ok
    assert not ts.judge_loss([(0, 0), (2000, 0)], 0.0).ok  # nothing sent one way
    capped = ts.judge_loss([(ts.MAX_TRAIN, 30), (ts.MAX_TRAIN, 30)], 1e-4)  # 60 expected: 20% is 1.5 sd
    assert capped.rel_tol == pytest.approx(4 * math.sqrt((1 - 1e-4) / 60), rel=1e-3) and capped.ok
    data = edge_low.report()
    assert data.pooled_ok and data.sigmas == pytest.approx(4.0, abs=0.05) and data.directions[0].accept


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
    assert t.report().loss_ci95[1] > 2 / 6


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


def test_loss_verdict_of_one_direction() -> None:
    clean = _train([25.0] * 100)
    assert ts.loss_ok(clean, 0.0)
    assert not ts.loss_ok(_train([25.0] * 100, sent=101), 0.0)  # a loss-free link lost one
    lossy = _train([25.0] * 990, sent=1000)  # 1% measured
    assert ts.loss_ok(lossy, 0.01) and not ts.loss_ok(lossy, 0.001)


def test_early_threshold_follows_the_relay_path_offset() -> None:
    """A correct relay delivers no earlier than delay - jitter - its calibrated offset
    (the path was quicker than the median the offset came from)."""
    ms = 1_000_000
    rows = [(i, i * ms, int(i * ms + d * ms)) for i, d in enumerate([24.5] + [25.0] * 99)]
    got = ts.analyse("a", "b", records(rows), sent=100, delay_s=0.025, jitter_s=0.0, pps=1000)
    assert got.early == 1 and not ts.delay_ok(got)
    got = ts.analyse("a", "b", records(rows), sent=100, delay_s=0.025, jitter_s=0.0, pps=1000, offset_s=0.0006)
    assert got.early == 0 and got.early_below_ms == pytest.approx(24.1) and ts.delay_ok(got)
    # the tolerance adds to a small offset (a 2dc check, 2026-12-03: offset 0.18 ms, one of 2000
    # datagrams at 24.685 ms, 0.135 ms quicker than the line's hold) instead of being used up by it
    rows = [(i, i * ms, int(i * ms + d * ms)) for i, d in enumerate([24.685] + [25.0] * 99)]
    got = ts.analyse("a", "b", records(rows), sent=100, delay_s=0.025, jitter_s=0.0, pps=1000, offset_s=0.00018)
    assert got.early == 0 and got.early_below_ms == pytest.approx(24.52) and ts.delay_ok(got)
    rows = [(i, i * ms, int(i * ms + d * ms)) for i, d in enumerate([24.45] + [25.0] * 99)]
    got = ts.analyse("a", "b", records(rows), sent=100, delay_s=0.025, jitter_s=0.0, pps=1000, offset_s=0.00018)
    assert got.early == 1 and not ts.delay_ok(got)


def test_median_tolerance_covers_a_short_train_under_wide_jitter() -> None:
    """2000 datagrams 10 ms apart under +-20 ms jitter: the median of one draw strays from
    another's by about a millisecond, so 0.3 ms alone would fail correct links. Draws of
    that link all pass; a median 3 ms off still fails."""
    rng = np.random.default_rng(3)
    send = np.arange(2000) * 0.01
    ns = 1_000_000_000
    fails = 0
    for _ in range(40):
        delays = ts.fifo_model_delays(send, 0.05, 0.02, seed=int(rng.integers(1 << 30)))
        rows = [(i, int(t * ns), int((t + d) * ns)) for i, (t, d) in enumerate(zip(send, delays, strict=True))]
        got = ts.analyse("a", "b", records(rows), sent=2000, delay_s=0.05, jitter_s=0.02, pps=100)
        assert got.median_tol_ms > 0.6
        fails += not ts.delay_ok(got)
    assert fails == 0
    rows = [(i, int(t * ns), int((t + d + 0.003) * ns)) for i, (t, d) in enumerate(zip(send, delays, strict=True))]
    shifted = ts.analyse("a", "b", records(rows), sent=2000, delay_s=0.05, jitter_s=0.02, pps=100)
    assert not ts.delay_ok(shifted)


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
