"""What `testbed topo check` finds on one WAN link, and the verdict it earns.

`LinkResult` holds both directions' figures (`Direction`: ping RTT, iperf3 goodput,
the packet train's loss and delays, the shaper's rate under a UDP blast) beside the
link's configuration; `LinkResult.judge` compares them within a `Tolerance` (RTT) and
the packet-train verdicts (`packet_trains`: loss, delay, rate). Measuring is
`check.check_links`' part; this module does no I/O.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from pydantic import BaseModel, ConfigDict

from testbed.emulation.linkmeasure import packet_trains
from testbed.emulation.linkmeasure.pcapcheck import NodePass, NodePassReport


class _Report(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Figure(_Report):
    """A configured figure beside what was measured (None: not measured)."""

    configured: float
    measured: float | None


class LossReport(_Report):
    """The configured loss, each direction's train loss, and the pooled verdict."""

    configured: float
    measured: list[float | None]
    verdict: packet_trains.LossVerdictReport | None


class DirectionReport(_Report):
    """One direction of a link as reported (see `Direction`)."""

    src: str
    dst: str
    rtt_ms_median: float | None
    rtt_ms_mean: float | None
    rtt_samples: int
    goodput_mbps: float | None
    streams: int
    retransmits: int | None
    error: str | None
    expected_goodput_mbps: float | None
    rate_mbps: float | None
    train: packet_trains.DirectionTrain | None
    node: NodePassReport | None
    relay_cpu_s: float | None
    relay_cpu_s_per_gbit: float | None


class LinkReport(_Report):
    """One WAN link in `testbed topo check`'s report (``--json``: its ``links``)."""

    a: str
    b: str
    rtt_ms: Figure
    goodput_mbps: Figure
    loss: LossReport
    jitter_ms: float
    path_offset_ms: float | None
    rtt_expected_ms: float | None
    ok: bool
    rtt_ok: bool
    goodput_ok: bool
    goodput_judged: bool
    loss_ok: bool
    delay_ok: bool
    rate_ok: bool
    endpoints: str
    relay_during_train: dict[str, dict[str, int]] | None
    pcap: str | None
    histogram: str | None
    capture_drops: int | None
    directions: list[DirectionReport]


@dataclass(frozen=True)
class Tolerance:
    rtt_abs_s: float = 0.0003
    rtt_rel: float = 0.0
    goodput_frac: float = 0.90

    def rtt_ok(self, configured_s: float, measured_s: float | None, slack_s: float = 0.0) -> bool:
        """`slack_s`: the sampling spread of the train's medians under jitter (added)."""
        if measured_s is None or math.isnan(measured_s):
            return False
        return abs(measured_s - configured_s) <= max(self.rtt_abs_s, self.rtt_rel * configured_s) + slack_s + 1e-9

    def goodput_ok(self, configured_bps: float, measured_bps: float | None) -> bool:
        return measured_bps is not None and measured_bps >= self.goodput_frac * configured_bps


@dataclass
class Direction:
    src: str
    dst: str
    rtt_ms_median: float | None = None
    rtt_ms_mean: float | None = None
    rtt_samples: int = 0
    goodput_mbps: float | None = None
    streams: int = 0
    retransmits: int | None = None
    error: str | None = None
    expected_goodput_mbps: float | None = None  # TCP under the link's loss (lossy links)
    rate_mbps: float | None = None  # the shaper's rate under a UDP blast
    train: packet_trains.DirectionTrain | None = None
    node: NodePass | None = None  # the train through the WAN node (--deep)
    relay_cpu_s: float | None = None  # the relay's CPU time during the goodput test (relay backend)
    relay_cpu_s_per_gbit: float | None = None  # ... per Gbit it relayed then (both ways, L2 bytes)


@dataclass
class LinkResult:
    a: str
    b: str
    endpoints: str  # "hosts" or "gateways"
    configured_rtt_ms: float
    configured_mbps: float
    directions: list[Direction] = field(default_factory=list)
    configured_loss: float = 0.0
    configured_jitter_ms: float = 0.0
    tcp_measured: bool = True  # False: `topo check --no-tcp`
    path_offset_ms: float | None = None  # the relay path's latency left out of the delay
    expected_rtt_ms: float | None = None  # the FIFO model's median RTT (= configured without jitter)
    train_rtt_ms: float | None = None  # sum of the two median one-way delays of the train
    relay: dict[str, dict[str, int]] | None = None  # the relay's own drops during the train (`relay_drops`)
    loss_verdict: packet_trains.LossVerdict | None = None  # both directions' trains pooled (`packet_trains.judge_loss`)
    loss_rel_tol: float = packet_trains.LOSS_REL_TOL  # the pooled loss within this fraction of the configured rate
    pcap: str | None = None  # --deep: the capture on the WAN node and its histogram
    histogram: str | None = None
    capture_drops: int | None = None
    rtt_ok: bool = False
    goodput_ok: bool = False
    loss_ok: bool = False
    delay_ok: bool = False
    rate_ok: bool = False

    @property
    def lossy(self) -> bool:
        return self.configured_loss > 0

    @property
    def goodput_judged(self) -> bool:
        """TCP goodput counts on loss-free links, when it was measured."""
        return self.tcp_measured and not self.lossy

    @property
    def ok(self) -> bool:
        """RTT, loss, delay and rate as configured; TCP goodput judged on loss-free links only."""
        return (self.rtt_ok and self.loss_ok and self.delay_ok and self.rate_ok
                and (self.goodput_ok or not self.goodput_judged))

    @property
    def measured_rtt_ms(self) -> float | None:
        """The train's RTT (precise to microseconds); ping's worse direction without it."""
        if self.train_rtt_ms is not None:
            return self.train_rtt_ms
        values = [d.rtt_ms_median for d in self.directions if d.rtt_ms_median is not None]
        if not values:
            return None
        return max(values, key=lambda v: abs(v - self.configured_rtt_ms))

    @property
    def measured_mbps(self) -> float | None:
        """The slower direction."""
        values = [d.goodput_mbps for d in self.directions]
        if not values or any(v is None for v in values):
            return None
        return min(v for v in values if v is not None)

    def judge(self, tol: Tolerance) -> None:
        rates = [d.goodput_mbps for d in self.directions]
        expected = self.expected_rtt_ms if self.expected_rtt_ms is not None else self.configured_rtt_ms
        measured = self.measured_rtt_ms
        slack_ms = 0.0
        if self.train_rtt_ms is not None:  # under jitter each median has its own sampling spread
            slack_ms = math.sqrt(sum((d.train.median_tol_ms - packet_trains.DELAY_TOL_S * 1e3) ** 2
                                     for d in self.directions if d.train is not None))
        self.rtt_ok = tol.rtt_ok(expected / 1e3, None if measured is None else measured / 1e3, slack_ms / 1e3)
        self.goodput_ok = bool(rates) and all(
            tol.goodput_ok(self.configured_mbps * 1e6, None if r is None else r * 1e6) for r in rates)
        trains = [d.train for d in self.directions]
        self.loss_verdict = None
        if trains and all(t is not None for t in trains):
            self.loss_verdict = packet_trains.judge_loss([(t.sent, t.lost) for t in trains if t is not None],
                                                      self.configured_loss, rel_tol=self.loss_rel_tol)
        self.loss_ok = self.loss_verdict is not None and self.loss_verdict.ok
        self.delay_ok = bool(trains) and all(
            t is not None and packet_trains.delay_ok(t) for t in trains)
        self.rate_ok = bool(self.directions) and all(
            packet_trains.rate_ok(self.configured_mbps * 1e6, None if d.rate_mbps is None else d.rate_mbps * 1e6)
            for d in self.directions)

    def report(self) -> LinkReport:
        """This link in `testbed topo check`'s report (figures rounded as shown)."""
        return LinkReport(
            a=self.a, b=self.b,
            rtt_ms=Figure(configured=round(self.configured_rtt_ms, 3), measured=_round(self.measured_rtt_ms, 3)),
            goodput_mbps=Figure(configured=round(self.configured_mbps, 3), measured=_round(self.measured_mbps, 1)),
            loss=LossReport(configured=self.configured_loss,
                            measured=[None if d.train is None else d.train.loss for d in self.directions],
                            verdict=None if self.loss_verdict is None else self.loss_verdict.report()),
            jitter_ms=self.configured_jitter_ms,
            path_offset_ms=_round(self.path_offset_ms, 4),
            rtt_expected_ms=_round(self.expected_rtt_ms, 3),
            ok=self.ok, rtt_ok=self.rtt_ok, goodput_ok=self.goodput_ok, goodput_judged=self.goodput_judged,
            loss_ok=self.loss_ok, delay_ok=self.delay_ok, rate_ok=self.rate_ok,
            endpoints=self.endpoints, relay_during_train=self.relay,
            pcap=self.pcap, histogram=self.histogram, capture_drops=self.capture_drops,
            directions=[_direction_report(d) for d in self.directions])


def _direction_report(d: Direction) -> DirectionReport:
    return DirectionReport(
        src=d.src, dst=d.dst, rtt_ms_median=_round(d.rtt_ms_median, 3), rtt_ms_mean=_round(d.rtt_ms_mean, 3),
        rtt_samples=d.rtt_samples, goodput_mbps=_round(d.goodput_mbps, 3), streams=d.streams,
        retransmits=d.retransmits, error=d.error, expected_goodput_mbps=_round(d.expected_goodput_mbps, 3),
        rate_mbps=_round(d.rate_mbps, 3), train=None if d.train is None else d.train.report(),
        node=None if d.node is None else d.node.report(), relay_cpu_s=_round(d.relay_cpu_s, 3),
        relay_cpu_s_per_gbit=_round(d.relay_cpu_s_per_gbit, 3))


def _round(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)
