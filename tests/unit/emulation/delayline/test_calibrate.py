"""The relay path's latency from calibration pings: half the median RTT's excess over
twice the probe delay, never negative, capped (and said so) on a busy machine."""

from __future__ import annotations

import pytest

from testbed.emulation.delayline.calibrate import (
    MAX_OFFSET_S,
    MIN_REPLIES,
    PROBE_DELAY_S,
    best_round,
    offset_from_rtts,
    ping_rtts,
)

PING = """PING 10.201.0.2 (10.201.0.2) 56(84) bytes of data.
64 bytes from 10.201.0.2: icmp_seq=1 ttl=64 time=4.31 ms
64 bytes from 10.201.0.2: icmp_seq=2 ttl=64 time=4.29 ms
"""


def test_ping_rtts() -> None:
    assert ping_rtts(PING) == pytest.approx([0.00431, 0.00429])


def test_offset_is_half_the_median_excess() -> None:
    rtts = [2 * PROBE_DELAY_S + 0.0003] * 20 + [2 * PROBE_DELAY_S + 0.01] * 3  # a few slow outliers
    got = offset_from_rtts("dc1-dc2", rtts)
    assert got.offset_s == pytest.approx(0.00015) and got.replies == 23 and not got.note


def test_offset_is_never_negative_and_capped() -> None:
    assert offset_from_rtts("l", [2 * PROBE_DELAY_S - 0.0001] * 20).offset_s == 0.0
    busy = offset_from_rtts("l", [2 * PROBE_DELAY_S + 0.01] * 20)
    assert busy.offset_s == MAX_OFFSET_S and "busy machine" in busy.note


def test_too_few_replies_apply_no_offset() -> None:
    got = offset_from_rtts("l", [0.0043] * (MIN_REPLIES - 1))
    assert got.offset_s == 0.0 and "no offset applied" in got.note


def test_the_quieter_round_counts() -> None:
    quiet = offset_from_rtts("l", [2 * PROBE_DELAY_S + 0.0003] * 20)
    busy = offset_from_rtts("l", [2 * PROBE_DELAY_S + 0.0009] * 20)
    failed = offset_from_rtts("l", [])
    assert best_round([busy, quiet, failed]) is quiet
    assert best_round([failed, busy]) is busy
