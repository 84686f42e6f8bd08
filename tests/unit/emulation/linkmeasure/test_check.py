"""Judging link measurements (no emulation needed)."""

from __future__ import annotations

import math
import subprocess
import time

import numpy as np
import pytest

from testbed.commands.topo import render_check
from testbed.emulation.linkmeasure import packet_trains
from testbed.emulation.linkmeasure.check import (
    measure_rtt_both_ways,
    omit_for,
    parse_ping,
    streams_for,
)
from testbed.emulation.linkmeasure.results import Direction, LinkResult, Tolerance
from testbed_core.constants import TOPOLOGIES_DIR
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


class _PingNode:
    """A node whose ping takes `took` seconds and answers with `ms` per echo."""

    def __init__(self, name: str, ms: float, took: float) -> None:
        self.name, self.ms, self.took, self.calls = name, ms, took, []

    def run(self, argv, timeout=None):
        start = time.monotonic()
        time.sleep(self.took)
        self.calls.append((argv[-1], start, time.monotonic()))
        count = int(argv[argv.index("-c") + 1])
        lines = "".join(f"64 bytes from {argv[-1]}: icmp_seq={i} ttl=62 time={self.ms} ms\n" for i in range(count))
        return subprocess.CompletedProcess(argv, 0, stdout=lines, stderr="")


def test_both_directions_are_pinged_at_once_and_kept_apart():
    a, b = _PingNode("a", 50.5, 0.3), _PingNode("b", 50.7, 0.3)
    a_to_b, b_to_a = measure_rtt_both_ways(a, "10.0.0.1", b, "10.0.0.2", count=5)
    assert a_to_b == pytest.approx([0.0505] * 5) and b_to_a == pytest.approx([0.0507] * 5)
    assert [c[0] for c in a.calls] == ["10.0.0.2"] * 2 and [c[0] for c in b.calls] == ["10.0.0.1"] * 2
    (_, a_start, _), (_, b_start, _) = a.calls[0], b.calls[0]
    (_, _, a_end), (_, _, b_end) = a.calls[1], b.calls[1]
    assert a_start < b_end and b_start < a_end, "the two directions were pinged one after the other"


def test_rtt_tolerance_is_0_3_ms_at_any_rtt():
    tol = Tolerance()
    assert tol.rtt_ok(0.050, 0.0503) and tol.rtt_ok(0.200, 0.1997)
    assert not tol.rtt_ok(0.050, 0.0504)
    assert not tol.rtt_ok(0.200, 0.2004)  # no percentage slack on long paths
    assert not tol.rtt_ok(0.050, None)
    assert Tolerance(rtt_abs_s=0.001, rtt_rel=0.03).rtt_ok(0.050, 0.0514)


def test_goodput_tolerance_is_90_percent():
    tol = Tolerance()
    assert tol.goodput_ok(1e9, 0.9e9)
    assert not tol.goodput_ok(1e9, 0.899e9)
    assert not tol.goodput_ok(1e9, None)


def test_streams_cover_the_window_limit():
    capped = TcpSettings(rmem_max=1_000_000, wmem_max=1_000_000)
    # one flow: 0.66 MB / 50 ms = 105.6 Mbit/s, so 1 Gbit/s needs 9.5 flows, plus 10%
    assert streams_for(1e9, 0.05, capped) == 11
    assert streams_for(1e9, 0.05, None) == 8  # gateways: no per-flow cap
    assert streams_for(1e8, 0.05, capped) == 8  # never fewer than 8
    assert streams_for(1e11, 0.2, capped) == 64  # bounded


def _train(src, delay_ms, n=2000, lost=0, jitter_ms=0.0, late=0, configured_ms=25.0):
    """A direction's train: n sent, `lost` of them missing, one-way delays around delay_ms."""
    ms = 1_000_000
    k = n - lost
    delays = np.full(k, delay_ms)
    if jitter_ms:
        delays += np.random.default_rng(3).uniform(-jitter_ms, jitter_ms, k)
    delays[:late] += 5.0
    recs = np.zeros(k, dtype=np.dtype([("seq", "<u4"), ("sent", "<u8"), ("rx", "<u8")]))
    recs["seq"] = np.arange(k)
    recs["sent"] = np.arange(k) * ms
    recs["rx"] = recs["sent"] + (delays * ms).astype(np.uint64)
    return packet_trains.analyse(src, "x", recs, n, configured_ms / 1e3, jitter_ms / 1e3, 1000)


def _link(rtts, rates, *, loss=0.0, lost=(0, 0), train_ms=(25.0, 25.0), udp=(990.0, 990.0), n=2000):
    r = LinkResult("dc1", "dc2", "hosts", 50.0, 1000.0, configured_loss=loss)
    for rtt, rate, k, delay, got in zip(rtts, rates, lost, train_ms, udp, strict=True):
        d = Direction("dc1-h1", "dc2-h1", rtt_ms_median=rtt, goodput_mbps=rate, rate_mbps=got)
        d.train = None if delay is None else _train("dc1-h1", delay, n=n, lost=k)
        r.directions.append(d)
    if all(d.train is not None for d in r.directions):
        r.train_rtt_ms = sum(d.train.delay_ms["p50"] for d in r.directions)  # type: ignore[union-attr]
        r.expected_rtt_ms = sum(d.train.model_ms["p50"] for d in r.directions)  # type: ignore[union-attr]
    r.judge(Tolerance())
    return r


def test_link_verdict_uses_both_directions():
    good = _link([50.4, 50.6], [950.0, 930.0])
    assert good.ok and good.rtt_ok and good.goodput_ok and good.loss_ok and good.delay_ok and good.rate_ok
    assert good.measured_rtt_ms == pytest.approx(50.0)  # the train's, not ping's coarse medians
    assert good.measured_mbps == 930.0  # the slower direction
    slow_back = _link([50.4, 50.6], [950.0, 850.0])
    assert not slow_back.ok and slow_back.rtt_ok and not slow_back.goodput_ok
    late = _link([50.4, 52.0], [950.0, 950.0], train_ms=(25.0, 25.4))
    assert not late.ok and not late.rtt_ok and not late.delay_ok
    lossy_by_mistake = _link([50.4, 50.6], [950.0, 930.0], lost=(0, 1))
    assert not lossy_by_mistake.ok and not lossy_by_mistake.loss_ok
    shaper_off = _link([50.4, 50.6], [950.0, 930.0], udp=(990.0, 930.0))
    assert not shaper_off.ok and not shaper_off.rate_ok
    failed = _link([None, 50.2], [None, 950.0], train_ms=(None, 25.0))
    assert not failed.ok and failed.measured_mbps is None and failed.measured_rtt_ms == 50.2


def test_lossy_link_is_judged_on_loss_delay_and_rate_not_tcp_goodput():
    """0.1% loss caps TCP far below the rate: the link is ok when the train's loss is
    consistent with 0.1% and its delay and UDP rate are right."""
    n = packet_trains.train_size(0.001)
    lossy = _link([50.1, 50.1], [130.0, 180.0], loss=0.001, lost=(190, 220), n=n)
    assert lossy.ok and lossy.loss_ok and not lossy.goodput_ok
    assert lossy.loss_verdict is not None and lossy.loss_verdict.sent == 2 * n
    too_lossy = _link([50.1, 50.1], [130.0, 180.0], loss=0.001, lost=(200, 300), n=n)
    assert not too_lossy.ok and not too_lossy.loss_ok
    low = _link([50.1, 50.1], [130.0, 180.0], loss=0.001, lost=(140, 140), n=n)  # 0.07%
    assert not low.ok and not low.loss_ok
    asymmetric = _link([50.1, 50.1], [130.0, 180.0], loss=0.001, lost=(100, 300), n=n)  # pooled right
    assert asymmetric.loss_verdict is not None and asymmetric.loss_verdict.pooled_ok and not asymmetric.loss_ok


def test_json_shape():
    data = _link([50.4, 50.6], [950.0, 930.0]).report().model_dump(mode="json")
    assert data["a"] == "dc1" and data["b"] == "dc2"
    assert data["rtt_ms"] == {"configured": 50.0, "measured": 50.0}
    assert data["goodput_mbps"] == {"configured": 1000.0, "measured": 930.0}
    assert data["loss"]["configured"] == 0.0 and data["loss"]["measured"] == [0.0, 0.0]
    verdict = data["loss"]["verdict"]
    assert verdict["ok"] and verdict["sent"] == 4000 and verdict["lost"] == 0 and verdict["false_alarm"] == 0.0
    assert data["ok"] is True and data["goodput_judged"] is True
    assert len(data["directions"]) == 2
    train = data["directions"][0]["train"]
    assert train["sent"] == 2000 and train["lost"] == 0 and train["loss_ci95"][1] < 0.002
    assert set(train["delay_ms"]) == {"min", "p50", "p99", "max"}


def test_render_check_shows_verdicts_and_the_loss_interval():
    report = {"delay_backend": "relay", "build_s": 1.0, "teardown_s": 0.1,
              "links": [_link([50.1, 50.1], [130.0, 180.0], loss=0.001, lost=(190, 170),
                               n=packet_trains.train_size(0.001)).report().model_dump(mode="json")]}
    report["links"][0]["directions"][0]["expected_goodput_mbps"] = 126.0
    text = render_check(report)
    assert "(lossy)" in text and text.splitlines()[3].endswith("ok")
    assert "190 of 199800" in text and "95% CI" in text
    assert ("loss: pooled 360 of 399,600 (0.0901%, -9.9% of 0.1%, within +-20% = 4.0 sd: ok); "
            "each way inside its 99.99% range for 0.1%: 190 in 147-257 ok, 170 in 147-257 ok; "
            "a correct link fails this at most 1 in 4,300") in text
    assert "expected under this loss 126 Mbit/s" in text
    wrong = {**report, "links": [_link([50.1, 50.1], [130.0, 180.0], loss=0.001, lost=(100, 300),
                                       n=packet_trains.train_size(0.001)).report().model_dump(mode="json")]}
    text = render_check(wrong)
    assert "100 in 147-257 OUT, 300 in 147-257 OUT" in text and text.splitlines()[3].endswith("FAIL")


def test_slow_start_is_left_out_longer_on_long_paths():
    assert omit_for(0.05) == 1
    assert omit_for(0.1) == 2
    assert omit_for(0.2) == 3


def test_rate_counts_each_segment_headers_as_htb_does():
    """A 44-segment GSO frame is one packet and 61,642 bytes to the interface counter, but
    44 frames of 1,442 bytes on the wire (and to HTB)."""
    from testbed.emulation.linkmeasure.check import wire_bits

    assert wire_bits(61_642, 1) == pytest.approx(8 * 44 * (1400 + 42))
    assert wire_bits(61_642 + 42 + 10 * 1400, 2) == pytest.approx(8 * 54 * (1400 + 42))  # one rebuilt around a loss
    assert wire_bits(0, 0) == 0.0


def test_shaper_rate_is_what_the_shaper_gives_while_fed():
    from testbed.emulation.linkmeasure.check import shaper_rate, wire_bits

    frame = 61_642  # one 44-segment blast frame: 63,448 bytes on the wire
    per_step = 788  # frames per 0.2 s at ~2 Gbit/s of wire bits
    samples, b, n = [], 0, 0
    for i in range(8):
        samples.append((i * 0.2, b, n))
        k = per_step if i not in (2, 5) else per_step // 2  # the feed lagged twice
        b, n = b + k * frame, n + k
    rate = shaper_rate(samples)
    assert rate == pytest.approx(wire_bits(per_step * frame, per_step) / 0.2)
    assert shaper_rate(samples[:1]) is None


def test_slow_counter_reads_are_left_out_of_the_rate():
    """A read that waited for the CPU has an uncertain time: stamped at its middle, a
    40 ms read next to 1 ms ones reads a 2 Gbit/s shaper 10% fast in the next interval,
    and with three of them the upper quartile takes it. Left out, the rate is the
    shaper's again."""
    from testbed.emulation.linkmeasure.check import shaper_rate, timed_reads, wire_bits

    frame, per_step = 61_642, 788
    true_rate = wire_bits(per_step * frame, per_step) / 0.2
    reads, b, n = [], 0, 0
    for i in range(8):
        took = 0.04 if i in (2, 4, 6) else 0.001
        # the counters were read at the call's start, the stamp is its middle
        reads.append((i * 0.2 + took / 2, b, n, took))
        b, n = b + per_step * frame, n + per_step
    stamped = [(t, b, n) for t, b, n, _ in reads]
    assert shaper_rate(stamped) > true_rate * 1.05  # the late stamp makes the next interval look short
    assert shaper_rate(timed_reads(reads)) == pytest.approx(true_rate)
    assert len(timed_reads(reads[:3])) == 3  # too few quick reads: all of them


def test_check_options_are_explained(tmp_path):
    """`--out` without `--deep`, and an --out folder that cannot be made, are refused
    before anything is built (no root needed to reach them)."""
    from click.testing import CliRunner

    from testbed.cli import main

    topo = str(TOPOLOGIES_DIR / "2dc.yaml")
    result = CliRunner().invoke(main, ["topo", "check", topo, "--out", str(tmp_path / "x")])
    assert result.exit_code == 2 and "--out names the folder for --deep's files; add --deep" in result.output
    blocker = tmp_path / "file"
    blocker.write_text("")
    result = CliRunner().invoke(main, ["topo", "check", topo, "--deep", "--out", str(blocker / "sub")])
    assert result.exit_code == 1 and f"--out {blocker / 'sub'}: cannot create the folder" in result.output
    result = CliRunner().invoke(main, ["topo", "check", topo, "--loss-precision", "0"])
    assert result.exit_code == 2 and "--loss-precision" in result.output


def test_without_tcp_the_link_is_judged_on_the_packet_figures():
    r = LinkResult("dc1", "dc2", "hosts", 50.0, 1000.0, tcp_measured=False)
    for _ in range(2):
        d = Direction("dc1-h1", "dc2-h1", rate_mbps=995.0)
        d.train = _train("dc1-h1", 25.0)
        r.directions.append(d)
    r.train_rtt_ms, r.expected_rtt_ms = 50.0, 50.0
    r.judge(Tolerance())
    assert r.ok and not r.goodput_ok and not r.goodput_judged
    text = render_check({"delay_backend": "relay", "build_s": 1.0, "teardown_s": 0.1,
                         "links": [r.report().model_dump(mode="json")]})
    assert "(no TCP)" in text


def test_relay_drops_during_the_train_are_attributed_and_shown():
    from testbed.emulation.delayline.stats import RelaySnapshot
    from testbed.emulation.linkmeasure.check import relay_drops

    before = RelaySnapshot.model_validate(
        {"a": "w-eth0", "b": "w-eth1", "a2b": {"rx_frames": 1}, "b2a": {}, "kernel_drops": {"a": 0, "b": 0}})
    after = RelaySnapshot.model_validate({"a": "w-eth0", "b": "w-eth1", "a2b": {"rx_frames": 9, "lost_segments": 2,
                                                                               "send_drops": 1},
                                          "b2a": {}, "kernel_drops": {"a": 5, "b": 0}})
    got = relay_drops(before, after)
    assert got["w-eth0->w-eth1"] == {"loss_model": 2, "queue_drops": 1, "relay_drops": 5, "socket_drops": 5}
    assert got["w-eth1->w-eth0"]["relay_drops"] == 0
    link = _link([50.1, 50.1], [950.0, 950.0]).report().model_dump(mode="json")
    link["relay_during_train"] = got
    text = render_check({"delay_backend": "relay", "build_s": 1.0, "teardown_s": 0.1, "links": [link]})
    assert "w-eth0->w-eth1: 5 dropped by the relay itself (5 by its socket), 1 by the shaper's queue" in text


def test_relay_cpu_per_gbit_from_two_stats_snapshots():
    from testbed.emulation.delayline.stats import RelaySnapshot
    from testbed.emulation.linkmeasure.check import relay_cpu

    before = RelaySnapshot.model_validate({"cpu_s": 10.0, "a2b": {"tx_bytes": 1_000}, "b2a": {"tx_bytes": 0}})
    after = RelaySnapshot.model_validate({"cpu_s": 10.6, "a2b": {"tx_bytes": 1_000 + 1_000_000_000},
                                          "b2a": {"tx_bytes": 250_000_000}})
    cpu, per_gbit = relay_cpu(before, after)
    assert cpu == pytest.approx(0.6)
    assert per_gbit == pytest.approx(0.6 / 10.0)  # 1.25 GB both ways = 10 Gbit
    assert relay_cpu(None, after) is None
    assert relay_cpu(RelaySnapshot(), after) is None  # a relay without the figure
    assert relay_cpu(before, before.model_copy()) == (0.0, None)  # nothing relayed: no rate


def test_rtt_tolerance_widens_by_the_medians_sampling_spread_under_jitter():
    """2000 datagrams 1 ms apart under +-20 ms jitter: each median strays by some tenths
    of a millisecond between draws, so the RTT check adds that spread to its 0.3 ms;
    without jitter it does not."""
    r = LinkResult("dc1", "dc2", "hosts", 50.0, 1000.0, configured_jitter_ms=20.0)
    for _ in range(2):
        d = Direction("dc1-h1", "dc2-h1", rtt_ms_median=50.0, goodput_mbps=950.0, rate_mbps=990.0)
        d.train = _train("dc1-h1", 25.0, jitter_ms=20.0)
        r.directions.append(d)
    spread = [d.train.median_tol_ms - 0.3 for d in r.directions]  # type: ignore[union-attr]
    assert all(s > 0.2 for s in spread)
    r.expected_rtt_ms = sum(d.train.model_ms["p50"] for d in r.directions)  # type: ignore[union-attr]
    r.train_rtt_ms = r.expected_rtt_ms + 0.4
    r.judge(Tolerance())
    assert r.rtt_ok  # 0.4 ms off: inside 0.3 ms + the spread
    r.train_rtt_ms = r.expected_rtt_ms + 0.3 + 1.1 * math.hypot(*spread)
    r.judge(Tolerance())
    assert not r.rtt_ok
    plain = _link([50.4, 50.6], [950.0, 930.0], train_ms=(25.0, 25.4))
    assert not plain.rtt_ok  # no jitter: 0.4 ms off is out


def test_a_probe_report_is_its_last_json_line_and_a_silent_probe_fails_with_its_stderr():
    import subprocess
    import sys

    from testbed.emulation.linkmeasure.check import _report
    from testbed.emulation.linkmeasure.probe import TrainReport

    line = TrainReport(sent=3, received=2, foreign=0, records="/tmp/r.bin").model_dump_json()
    ok = subprocess.Popen([sys.executable, "-c", f"print('READY'); print({line!r})"], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True)
    assert _report(ok, 30, TrainReport, "the probe train") == TrainReport(sent=3, received=2, foreign=0,
                                                                         records="/tmp/r.bin")
    bad = subprocess.Popen([sys.executable, "-c", "import sys; sys.exit('no socket')"], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
    with pytest.raises(RuntimeError, match=r"the probe train failed \(exit 1\): no socket"):
        _report(bad, 30, TrainReport, "the probe train")
