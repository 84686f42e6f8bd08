"""Atlas's stream count (testbed_core/planning/streams.py `fill_link_streams`): of the counts the
calibration timed, the fewest within STREAMS_MARGIN of the fastest, each judged by its
mean transfer time. The paper sweep's 200 ms point took 8 streams for 0.26 MB tensors
(8 streams 107, 107, 107, 271 ms; one stream 107 ms each: equal medians, the formula's
count kept) and atlas ran 1.8x its prediction on the eight streams' tails."""

from __future__ import annotations

from testbed.run.calibration import Calibration, effective_rate
from testbed_core.planning.streams import STREAMS_MARGIN, fill_link_streams, timed_rate

NBYTES = 262_144
CONFIGURED = 8  # transport.streams


def _cal(transfers: dict[int, list[float]], latency_s: float = 0.1) -> Calibration:
    rates = {n: effective_rate(NBYTES, v, latency_s) for n, v in transfers.items()}
    return Calibration(src="dc1-h1", dst="dc2-h1", nbytes=NBYTES, latency_s=latency_s,
                       transfer_s=transfers, rates_bps=rates)


def test_a_count_with_a_tail_loses_to_one_stream_of_the_same_median() -> None:
    cal = _cal({1: [0.107] * 4, 8: [0.107, 0.107, 0.107, 0.271]})
    assert cal.rates_bps[8] == cal.rates_bps[1]  # the medians cannot tell them apart
    assert timed_rate(cal, 8) < 0.5 * timed_rate(cal, 1)
    assert fill_link_streams(8, CONFIGURED, cal, None) == 1


def test_equal_counts_take_the_fewest_streams() -> None:
    cal = _cal({1: [0.107] * 4, 8: [0.1069] * 4, 32: [0.1068] * 4})
    assert fill_link_streams(32, CONFIGURED, cal, None) == 1


def test_a_count_clearly_faster_is_taken() -> None:
    """atlas-2dc at 200 ms RTT: one stream 27 Mbit/s, 8 streams 286, 32 streams 188."""
    cal = _cal({1: [2.552] * 4, 8: [0.335] * 4, 32: [0.458] * 4}, latency_s=0.1)
    assert fill_link_streams(32, CONFIGURED, cal, None) == 8
    # within the margin of the fastest, the fewer streams win; beyond it, the faster
    near = _cal({1: [2.552] * 4, 8: [0.335] * 4, 32: [0.335 * (1 - STREAMS_MARGIN / 2)] * 4})
    assert fill_link_streams(32, CONFIGURED, near, None) == 8
    far = _cal({1: [2.552] * 4, 8: [0.335] * 4, 32: [0.25] * 4})
    assert fill_link_streams(32, CONFIGURED, far, None) == 32


def test_without_kept_transfers_the_calibrated_rates_decide() -> None:
    cal = Calibration(src="a", dst="b", nbytes=NBYTES, latency_s=0.05, rates_bps={1: 5.5e7, 8: 4.7e8, 16: 6.0e8})
    assert timed_rate(cal, 16) == 6.0e8
    assert fill_link_streams(16, CONFIGURED, cal, None) == 16


def test_uncalibrated_keeps_the_formula() -> None:
    assert fill_link_streams(13, CONFIGURED, None, None) == 13
