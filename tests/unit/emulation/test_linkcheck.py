"""Judging link measurements (no emulation needed)."""

from __future__ import annotations

import pytest

from testbed.emulation.linkcheck import (
    Direction,
    LinkResult,
    StreamComparison,
    Tolerance,
    omit_for,
    parse_ping,
    streams_for,
)
from testbed_core.topology import TcpSettings

PING = """PING 10.200.2.10 (10.200.2.10) 56(84) bytes of data.
64 bytes from 10.200.2.10: icmp_seq=1 ttl=62 time=50.5 ms
64 bytes from 10.200.2.10: icmp_seq=2 ttl=62 time=50.7 ms
64 bytes from 10.200.2.10: icmp_seq=3 ttl=62 time=0.045 ms

--- 10.200.2.10 ping statistics ---
3 packets transmitted, 3 received, 0% packet loss, time 101ms
rtt min/avg/max/mdev = 0.045/33.748/50.700/23.780 ms
"""


def test_parse_ping():
    assert parse_ping(PING) == pytest.approx([0.0505, 0.0507, 0.000045])
    assert parse_ping("From 10.0.0.1 icmp_seq=1 Destination Host Unreachable") == []


def test_rtt_tolerance_is_max_of_1ms_and_3_percent():
    tol = Tolerance()
    assert tol.rtt_ok(0.050, 0.0514)  # 1.4 ms off, 3% of 50 ms is 1.5 ms
    assert not tol.rtt_ok(0.050, 0.0516)
    assert tol.rtt_ok(0.010, 0.0109)  # 0.9 ms off: within the 1 ms floor
    assert not tol.rtt_ok(0.010, 0.0111)
    assert not tol.rtt_ok(0.050, None)


def test_goodput_tolerance_is_90_percent():
    tol = Tolerance()
    assert tol.goodput_ok(1e9, 0.9e9)
    assert not tol.goodput_ok(1e9, 0.899e9)
    assert not tol.goodput_ok(1e9, None)


def test_streams_cover_the_window_limit():
    capped = TcpSettings(rmem_max=1_000_000, wmem_max=1_000_000)
    # one flow: 0.5 MB / 50 ms = 80 Mbit/s, so 1 Gbit/s needs 12.5 flows, plus 10%
    assert streams_for(1e9, 0.05, capped) == 14
    assert streams_for(1e9, 0.05, None) == 8  # gateways: no per-flow cap
    assert streams_for(1e8, 0.05, capped) == 8  # never fewer than 8
    assert streams_for(1e11, 0.2, capped) == 64  # bounded


def _link(rtts, rates):
    r = LinkResult("dc1", "dc2", "hosts", 50.0, 1000.0)
    for rtt, rate in zip(rtts, rates, strict=True):
        r.directions.append(Direction("dc1-h1", "dc2-h1", rtt_ms_median=rtt, goodput_mbps=rate))
    r.judge(Tolerance())
    return r


def test_link_verdict_uses_both_directions():
    good = _link([50.4, 50.6], [950.0, 930.0])
    assert good.ok and good.rtt_ok and good.goodput_ok
    assert good.measured_rtt_ms == 50.6  # the direction further from 50
    assert good.measured_mbps == 930.0  # the slower direction
    slow_back = _link([50.4, 50.6], [950.0, 850.0])
    assert not slow_back.ok and slow_back.rtt_ok and not slow_back.goodput_ok
    late = _link([50.4, 52.0], [950.0, 950.0])
    assert not late.ok and not late.rtt_ok
    failed = _link([None, 50.2], [None, 950.0])
    assert not failed.ok and failed.measured_mbps is None


def test_json_shape():
    data = _link([50.4, 50.6], [950.0, 930.0]).as_json()
    assert data["a"] == "dc1" and data["b"] == "dc2"
    assert data["rtt_ms"] == {"configured": 50.0, "measured": 50.6}
    assert data["goodput_mbps"] == {"configured": 1000.0, "measured": 930.0}
    assert data["ok"] is True
    assert len(data["directions"]) == 2


def test_stream_comparison_ratio():
    assert StreamComparison(1, 8, 100.0, 800.0).ratio == 8.0
    assert StreamComparison(1, 8, 0.0, 800.0).ratio == float("inf")


def test_slow_start_is_left_out_longer_on_long_paths():
    assert omit_for(0.05) == 1
    assert omit_for(0.1) == 2
    assert omit_for(0.2) == 3
