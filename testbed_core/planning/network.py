"""The network model of the prediction: how fast one transfer crosses the WAN.

Each (pipeline, boundary, direction) is one transport channel whose tensors go one
after another over its N TCP connections, so a channel moves at most
``N x per-flow rate``. The per-flow rate is the TCP window over the RTT
(window = min(sender tcp_wmem max, receiver tcp_rmem max x rmem_fraction)); a measured
rate (`NetParams.flow_rate_bps`, e.g. the runner's calibration, or each path's own in
`NetParams.path_flow_rate_bps`) replaces the window formula. On a path with configured
loss (a topology link's ``loss``), either is capped at Mathis et al.'s
``1.22 MSS / (RTT sqrt(loss))`` per flow (`loss_limited_rate`), measured or not: the
calibration's few back-to-back tensors, median kept, see less of the loss than an
iteration's tensors do (issue 40: one-stream variants ran +196% over a calibrated
prediction without the bound on a 0.1%-loss link). Given the size of the tensors a
channel moves, the cap is what each stream delivers of such a tensor through the loss
(testbed_core/planning/lossy.py: short stripes, the channel's slowest stripe and the
repairs of late losses), not a long flow's rate. A
route between two DCs is the lowest-latency path of WAN links; its bottleneck is the
slowest of them. A shaped link's token bucket lets a transfer onto an idle link through
faster than one queued behind another: given the links' shaper rates
(`NetParams.link_line_bps`), a transfer that finds its link busy moves at most at the
link's sustained TCP goodput (`sustained_bps`, `refill_s`; simulate.Resource.busy_bps).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from testbed_core.constants import RMEM_FRACTION
from testbed_core.planning.lossy import lossy_flow_rate, route_loss
from testbed_core.shaper import ETH_FRAME, burst_bytes
from testbed_core.topology import Topology, shortest_path

MSS = 1448


def stream_window(topology: Topology, src: str, dst: str, rmem_fraction: float = RMEM_FRACTION) -> float:
    """The window one TCP stream from DC `src` to `dst` opens to: the lesser of the
    sender's tcp wmem max and `rmem_fraction` of the receiver's tcp rmem max."""
    return min(topology.tcp_for(src).wmem_max, topology.tcp_for(dst).rmem_max * rmem_fraction)


@dataclass(frozen=True)
class NetParams:
    """Knobs of the network model (all visible in the output)."""

    rmem_fraction: float = RMEM_FRACTION  # share of tcp_rmem advertised as window
    flow_rate_bps: float | None = None  # a measured single-flow rate; overrides the window model
    lan_latency_s: float = 0.0
    max_streams: int = 64
    allreduce: bool = True  # add the DP gradient all-reduce to the iteration time
    lan_rate_bps: float | None = None  # a measured rate of one channel inside a DC; overrides the DC's lan_rate
    # the DP rings inside the DCs: how many the calibration timed at once at lan_rate_bps
    # each, and what one of them moved timed alone (None: not measured)
    lan_rings: int | None = None
    lan_ring_alone_bps: float | None = None
    # a pipeline tensor's measured rate over a one-stream channel inside a DC (the LAN
    # tensor probe, where no DP ring was timed); prediction.lan_tensor_rate takes
    # lan_rate_bps first where measured, then this, then the DC's nominal lan_rate
    lan_tensor_bps: float | None = None
    # that probe's tensor while the pipeline's other channels carry theirs both ways (None:
    # not measured): a channel inside a DC whose ranks also use the WAN moves at most at
    # this while those WAN channels are busy (prediction.build_spec, `Path.loaded_by`)
    lan_loaded_bps: float | None = None
    # share of a WAN link's rate that two or more colliding transfers get in total
    # (measured by the runner's collision probe; None: the fluid model, all of it)
    crowded_fraction: float | None = None
    # per DC pair (either order), each WAN path's own measured per-flow rate and, per
    # link (its two DCs), its own crowded fraction: a calibration that timed every path
    # the placements use (testbed/run/calibration.py). A pair not listed falls back to
    # `flow_rate_bps` / `crowded_fraction`.
    path_flow_rate_bps: Mapping[tuple[str, str], float] | None = None
    link_crowded_fraction: Mapping[tuple[str, str], float] | None = None
    # per link, what the DP rings crossing it moved in all, each way, running together
    # (the calibration's ring probe); replaces the channel-rate model of the all-reduce there
    link_ring_rate_bps: Mapping[tuple[str, str], float] | None = None
    # per link, what one of those rings moves alone there, each way (the path's measured
    # channel rate at the rings' stream count): once the smaller stages' rings are done,
    # the largest runs alone, at this rate, not at the aggregate
    link_ring_alone_bps: Mapping[tuple[str, str], float] | None = None
    # net.ipv4.tcp_slow_start_after_idle on the hosts (runner.slow_start_after_idle): a
    # lossy path's flows start every tensor from the initial window (testbed_core/planning/lossy.py)
    slow_start_after_idle: bool = False
    # a lossy path's channels as a run has them (testbed_core/planning/lossy.py `run_times`):
    # opened for the run, (tensors each carries before the measured ones, measured ones,
    # and optionally the bytes a stream of the workers' warm-up tensor before them);
    # None: long-lived connections in their steady state (a what-if)
    lossy_history: tuple[int, ...] | None = None
    # the streams are paced (transport.pacing): a lossy path's rounds leave spread, not at once
    paced: bool = False
    # the variant's sockets ask for no pacing (gloo's pairs): a tensor that fits its
    # channel's windows leaves as one burst at the sender's line rate and waits whole in
    # the bottleneck's queue, so the tensors on a link cross one after another in the
    # order they came, each at the link's rate (prediction.py `build_spec`), not side by
    # side at a paced channel's measured rate
    unpaced_bursts: bool = False
    # the channels only ever carry the workload's tensors (modelled devices: no warm-up
    # tensor): a stream's congestion window stays within STRIPE_WINDOW x the stripe it
    # carries (`stripe_window`), which holds back tensors sent back to back
    stripe_windows: bool = False
    # the channels spread each tensor evenly over their streams (atlas_transport's even
    # spread; a calibration says so, `Calibration.even_spread`): tensors handed to a
    # channel back to back go one after another on every stream. False: the first
    # streams to wake take a tensor's chunks and the next goes side by side on the
    # others (testbed_core/planning/interleave.py), as kept runs before it measured
    even_spread: bool = False
    # with even_spread: the transport's smallest chunk, and how many of them per stream
    # the largest tensor spread so has (None: every size)
    even_spread_stream_bytes: float | None = None
    even_spread_chunks: int = 1
    # per (sending DC, receiving DC), the receive window each stream of a channel there
    # is clamped to (the run's cap on shared multi-stream channels, testbed/run/pacing.py
    # `window_caps`): the window model's window where smaller
    path_window_bytes: Mapping[tuple[str, str], float] | None = None
    # per WAN path, this way (src DC, dst DC): how many times its time on the wire a
    # transfer of a temporal plan holds the path's links (the token passes at the end of
    # its hold, its bytes arrive as they left; simulate.Resource.hold_factor). None or
    # a path not listed: 1
    path_hold_factor: Mapping[tuple[str, str], float] | None = None
    # per WAN link (its two DCs, either order), the rate its shaper is set to (the
    # scenario's topology, not the calibrated one): a transfer that starts while the
    # link's direction is busy gets no burst from its token bucket and moves at most at
    # the link's sustained TCP goodput (`sustained_bps`). None or a link not listed: no cap
    link_line_bps: Mapping[tuple[str, str], float] | None = None
    # per WAN link direction (sending DC, receiving DC), the shares of its crowded total
    # that the channel ahead in a collision of two takes, one per collision-probe round
    # (testbed_core/planning/collisions.py; simulate.Resource.split_shares). None or a
    # direction not listed: colliding transfers split it evenly
    link_split_shares: Mapping[tuple[str, str], tuple[float, ...]] | None = None

    def flow_rate_for(self, a: str, z: str) -> float | None:
        """The measured per-flow rate of the path between DCs `a` and `z`, if any."""
        return _either(self.path_flow_rate_bps, a, z, self.flow_rate_bps)

    def ring_rate_for(self, a: str, z: str) -> float | None:
        """The measured aggregate of the DP rings crossing the link between `a` and `z`, if any."""
        return _either(self.link_ring_rate_bps, a, z, None)

    def ring_alone_for(self, a: str, z: str) -> float | None:
        """The measured rate of one DP ring alone on the link between `a` and `z`, if any."""
        return _either(self.link_ring_alone_bps, a, z, None)

    def crowded_for(self, a: str, z: str) -> float | None:
        """The crowded fraction of the link between DCs `a` and `z`, if any."""
        return _either(self.link_crowded_fraction, a, z, self.crowded_fraction)

    def line_rate_for(self, a: str, z: str) -> float | None:
        """The shaper's rate of the link between DCs `a` and `z`, if given."""
        return _either(self.link_line_bps, a, z, None)


def _either(table: Mapping[tuple[str, str], float] | None, a: str, z: str, default: float | None) -> float | None:
    if table:
        for key in ((a, z), (z, a)):
            if key in table:
                return table[key]
    return default


@dataclass(frozen=True)
class WanPath:
    src: str
    dst: str
    dcs: tuple[str, ...]
    resources: tuple[str, ...]
    latency_s: float
    bottleneck_bps: float
    flow_rate_bps: float
    streams: int
    # one stream's TCP window (bytes); with a measured flow rate (a transfer's rate
    # alone) the simulation also holds each channel to streams x window unacknowledged,
    # which the measured rate of one transfer does not show (simulate.Path.window_bits)
    window_bytes: float = math.inf
    measured: bool = False
    # one stream's window where its tensors come back to back (never capped to stripes of
    # one tensor: `stripe_window`); inf: as `window_bytes`
    backlog_window_bytes: float = math.inf
    # the streams that carry tensors handed over back to back: atlas_transport puts a
    # tensor of fewer chunks than streams on the lowest-numbered streams (its warm lanes),
    # so a backlog of such tensors queues on those (None: every stream)
    backlog_lanes: int | None = None

    @property
    def window_bits(self) -> float:
        """What the channel may have unacknowledged (`_unacked_bits` of one stream's window)."""
        return self._unacked_bits(self.window_bytes)

    @property
    def backlog_window_bits(self) -> float:
        """What the channel may have unacknowledged while its tensors come back to back:
        the whole windows of the streams that carry them (`_unacked_bits`)."""
        lanes = self.streams if self.backlog_lanes is None else self.backlog_lanes
        return self._unacked_bits(self.backlog_window_bytes) * lanes / max(1, self.streams)

    def _unacked_bits(self, stream_window_bytes: float) -> float:
        """The channel's streams' windows of `stream_window_bytes` each, in bits, where its
        rate was measured; inf where its rate is the window model's (window / RTT already
        holds it to that)."""
        return self.streams * stream_window_bytes * 8 if self.measured else math.inf

    @property
    def rtt_s(self) -> float:
        return 2 * self.latency_s

    @property
    def rate_bps(self) -> float:
        """One transfer's rate when it has the path to itself."""
        return min(self.bottleneck_bps, self.streams * self.flow_rate_bps)

    def to_json(self) -> dict[str, Any]:
        return {"src": self.src, "dst": self.dst, "path": list(self.dcs), "links": list(self.resources),
                "one_way_latency_s": self.latency_s, "bottleneck_bps": self.bottleneck_bps,
                "per_flow_rate_bps": self.flow_rate_bps, "streams": self.streams,
                "transfer_rate_bps": self.rate_bps}


def sustained_bps(line_bps: float) -> float:
    """What a shaped link carries of TCP payload once its token bucket is empty (a
    transfer queued behind another): its line rate x MSS / frame."""
    return line_bps * MSS / ETH_FRAME


def refill_s(line_bps: float) -> float:
    """How long a shaped link must stay idle for its token bucket (1 ms at line rate,
    at least a GSO packet and a frame) to fill again: the bucket over the line rate."""
    if line_bps <= 0 or not math.isfinite(line_bps):
        return 0.0
    return burst_bytes(line_bps) * 8 / line_bps


MATHIS_C = 1.22
"""Mathis et al.'s constant, sqrt(3/2) (Reno, and Cubic in its Reno-friendly region,
where its window sits at these loss rates and RTTs)."""


def loss_limited_rate(rtt_s: float, loss: float, mss: int = MSS) -> float:
    """One TCP flow's rate through random loss `loss` per packet over `rtt_s`, bits/s:
    Mathis et al. 1997, ``MSS / RTT x C / sqrt(p)``; infinite without loss (or RTT).
    N streams of a channel each get this (the caller caps N x it at the link's rate)."""
    if loss <= 0 or rtt_s <= 0:
        return math.inf
    return MATHIS_C * mss * 8 / (rtt_s * math.sqrt(loss))


def wan_resource(a: str, b: str) -> str:
    return f"wan:{a}->{b}"


def wan_path(
    topology: Topology, src: str, dst: str, streams: int | str, net: NetParams, *, fill_link: bool = False,
    transfer_bytes: float | None = None,
) -> WanPath:
    """Route, latency and rates between two DCs; with `fill_link`, at least enough
    streams for one transfer to fill the bottleneck link. On a lossy route, with
    `transfer_bytes` (the size of the tensors its channels move) each flow is held to
    what it delivers of such a tensor through the loss (`lossy_flow_rate`: its stripe,
    the channel's slowest stripe and the repairs included), else to Mathis's
    steady-state rate (a long flow)."""
    dcs = tuple(shortest_path(src, dst, topology.wan))
    links = [topology.link(x, y) for x, y in zip(dcs, dcs[1:], strict=False)]
    latency = sum(link.delay for link in links)
    rtt = 2 * latency
    bottleneck = min(link.rate for link in links)
    measured = net.flow_rate_for(src, dst)
    window = stream_window(topology, src, dst, net.rmem_fraction)
    capped = (net.path_window_bytes or {}).get((src, dst))
    window = min(window, capped) if capped is not None else window
    flow = unlossy = measured if measured is not None else window * 8 / rtt if rtt > 0 else math.inf
    if capped is not None and measured is not None and rtt > 0:
        # the run's cap on the streams' windows (testbed/run/pacing.py `window_caps`); a probe
        # that also serves uncapped variants timed them uncapped (calibration.probe_caps): a
        # capped stream moves at most a window a round trip
        flow = unlossy = min(flow, window * 8 / rtt)
    # the loss bound holds for a measured rate too: the calibration times a few tensors on
    # a connection its warm-up just opened and keeps the median, which a tensor that met
    # no loss (or one without a timeout) sets; a run's tensors, each after a pipeline
    # bubble, meet the path's loss over the whole iteration
    loss = route_loss(topology, dcs)
    flow = min(flow, loss_limited_rate(rtt, loss))
    fill = 1 if flow >= bottleneck else min(net.max_streams, math.ceil(bottleneck / flow - 1e-9))
    n = fill if streams == "auto" else int(streams)
    if fill_link:
        n = max(n, fill)
    if loss > 0 and rtt > 0 and transfer_bytes:  # the short-transfer model replaces Mathis's long flow
        flow = min(unlossy, lossy_flow_rate(float(transfer_bytes), n, rtt, loss, window, bottleneck,
                                            net.slow_start_after_idle, net.lossy_history, net.paced))
    whole = window
    if net.stripe_windows and transfer_bytes and loss <= 0:
        window = min(window, stripe_window(float(transfer_bytes), n))
    lanes = None
    if transfer_bytes and net.even_spread and net.even_spread_stream_bytes:
        lanes = warm_lanes(float(transfer_bytes), n, net.even_spread_stream_bytes)
    return WanPath(src, dst, dcs, tuple(wan_resource(x, y) for x, y in zip(dcs, dcs[1:], strict=False)),
                   latency, bottleneck, flow, n, window, measured is not None, whole, lanes)


def warm_lanes(transfer_bytes: float, streams: int, stream_bytes: float) -> int:
    """How many of a channel's `streams` carry its tensors of `transfer_bytes` when they
    come back to back: atlas_transport cuts a tensor into chunks of at least
    `stream_bytes` (its SPLIT_MIN_BYTES, recorded by the calibration) and puts one of
    fewer chunks than streams, but more than one, on the lowest-numbered streams
    (`Channel._warm_lanes`), so a backlog of them queues on those streams' windows; a
    one-chunk tensor takes whichever stream is free, and a larger one every stream. A
    256 KiB tensor on 8 streams rides 2 (docs/results/sweep-paper.md)."""
    chunks = math.ceil(transfer_bytes / stream_bytes)
    return streams if chunks <= 1 or chunks >= streams else chunks


STRIPE_WINDOW = 2.0
"""Linux grows an application-limited flow's congestion window only while the flow
fills it (in slow start, while the window is under twice the packets in flight:
tcp_is_cwnd_limited), so a stream that only ever carries stripes of one tensor keeps a
window of at most about twice its stripe."""


def stripe_window(transfer_bytes: float, streams: int) -> float:
    """The congestion window (bytes) a stream keeps that only carries its stripe of
    `transfer_bytes` tensors over `streams` streams: STRIPE_WINDOW stripes."""
    return STRIPE_WINDOW * transfer_bytes / max(1, streams)

