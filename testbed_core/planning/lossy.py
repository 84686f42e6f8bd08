"""How long one channel's tensor takes through a lossy WAN path: short TCP transfers
through random loss, from TCP's own mechanisms.

Mathis's ``1.22 MSS / (RTT sqrt(p))`` is a long flow's steady-state rate. A channel of N
streams cuts each tensor into chunks the streams take from a shared queue
(atlas_transport's work stealing), so each stream carries a short stripe of it, and
the tensor is there when its slowest stripe is. What decides that stripe's time is not
the average window but where the losses fall (`channel_time`, a round-by-round model
of every stream of the channel over many transfers, cwnd kept from one transfer to the
next as on a long-lived connection):

- a stream sends its congestion window per round trip; a round with a loss cuts the
  window to ``BETA`` x it (Cubic), a round without one grows it by ``ALPHA`` packets per
  round trip (Cubic's Reno-friendly estimate, where its window sits at these loss rates
  and RTTs: together the AIMD average ``sqrt(ALPHA (1 + BETA) / (2 (1 - BETA) p))`` =
  Mathis's 1.22 / sqrt(p)), or doubles it below ssthresh (slow start, e.g. after idle
  with ``slow_start_after_idle``);
- a loss before the stripe's last round is repaired while later rounds go out (SACK):
  it costs only the window cut. A loss in the last round is what the stripe waits for
  (`repair_delay`): with ``DUPTHRESH`` or more packets after it, fast retransmit, one
  RTT; with one or two after it, RACK's reordering window first (a quarter RTT more);
  the stripe's very last packet, only the tail-loss probe repairs it, ``PTO`` =
  max(2 RTT, 10 ms) after it left; a lost probe waits for the retransmission timeout
  (Linux: RTT + 200 ms).

The channel's time of a transfer is the latest of its stripes' (first byte out to last
byte in), plus the tensor's serialization at the bottleneck; `channel_time` returns the
mean over transfers. Random draws come from a seeded generator: the same inputs give
the same figure. Nothing here is fitted to a run.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import Protocol

MSS = 1448
BETA = 0.7  # Cubic's multiplicative decrease (Linux: 717/1024)
ALPHA = 3 * (1 - BETA) / (1 + BETA)  # Cubic's Reno-friendly additive increase, packets per RTT
DUPTHRESH = 3  # packets SACKed after a hole before it is retransmitted at once
PTO_MIN_S = 0.010  # Linux's floor of the tail-loss probe timeout
RTO_MIN_S = 0.200  # Linux's floor of the retransmission timeout (added to the RTT)
INITIAL_WINDOW = 10  # packets (RFC 6928)
CHUNK_BYTES = 4 << 20  # atlas_transport's default chunk (TransportConfig.chunk_bytes)
MIN_SPLIT_CHUNK = 256 << 10  # TransportConfig.chunk_for's floor for a tensor cut over streams
SPLIT_MIN_BYTES = 128 << 10  # Channel._isend's smallest chunk of a tensor spread over streams
MIN_CHUNK = 4096
WORK_PACKETS = 2_000_000  # what one `channel_time` simulates at most
WORK_LOSSES = 20_000
SEED = 20261205  # the model's draws: the same inputs give the same figure


class Draws(Protocol):
    """Where the model takes its random numbers (uniform in [0, 1))."""

    def random(self) -> float: ...


def mathis_window(loss: float) -> float:
    """The AIMD average window in packets at per-packet loss `loss`: sqrt(ALPHA (1 + BETA)
    / (2 (1 - BETA) loss)), Mathis's 1.22 / sqrt(p) with Cubic's constants."""
    return math.sqrt(ALPHA * (1 + BETA) / (2 * (1 - BETA) * loss))


def pto_s(rtt_s: float) -> float:
    """Linux's tail-loss probe timeout: two smoothed RTTs, at least 10 ms."""
    return max(2 * rtt_s, PTO_MIN_S)


def rto_s(rtt_s: float) -> float:
    """Linux's retransmission timeout on a steady path: the RTT plus its 200 ms floor."""
    return rtt_s + RTO_MIN_S


def repair_delay(after: int, rtt_s: float, probe_lost: bool = False) -> float:
    """How much later than planned a packet lost in its stripe's last round arrives, with
    `after` packets of the stripe sent after it: fast retransmit (DUPTHRESH or more
    after it) one RTT; one or two after it, RACK's quarter-RTT reordering window first;
    none (the last packet), the tail-loss probe's timeout, or (`probe_lost`) the
    retransmission timeout."""
    if after >= DUPTHRESH:
        return rtt_s
    if after >= 1:
        return 1.25 * rtt_s
    return rto_s(rtt_s) if probe_lost else pto_s(rtt_s)


def stripe_loss_probability(nbytes: float, loss: float, mss: int = MSS) -> float:
    """The chance that a stripe of `nbytes` meets at least one loss: 1 - (1 - p)^n, n =
    its packets (bytes / MSS, rounded up)."""
    n = max(1, math.ceil(nbytes / mss))
    return 1 - (1 - loss) ** n


def chunk_bytes(nbytes: int, streams: int, base: int = CHUNK_BYTES) -> int:
    """The chunk atlas_transport cuts a tensor of `nbytes` into over `streams` streams
    before it has measured a rate: TransportConfig.chunk_for (about two chunks per
    stream, at least MIN_SPLIT_CHUNK, at most `base`), then Channel._isend's split of a
    multi-stream send (at most two per stream's share, down to SPLIT_MIN_BYTES)."""
    share = -(-nbytes // max(1, 2 * streams))
    share = -(-share // MIN_CHUNK) * MIN_CHUNK
    chunk = max(MIN_CHUNK, min(base, max(MIN_SPLIT_CHUNK, share)))
    if streams > 1:
        chunk = max(MIN_CHUNK, min(chunk, max(SPLIT_MIN_BYTES, share)))
    return chunk


@dataclass
class _Stream:
    cwnd: float
    ssthresh: float
    gap: int  # packets still to send before the next lost one (the lost one counted)


class _Channel:
    """The streams of one channel and their state between transfers."""

    def __init__(self, streams: int, loss: float, window_pkts: float, draws: Draws, idle_restart: bool,
                 gaps: Callable[[], int] | None = None) -> None:
        self.loss, self.cap, self.draws, self.idle_restart = loss, max(1.0, window_pkts), draws, idle_restart
        self._gap = gaps or self._draw_gap
        start = min(self.cap, mathis_window(loss)) if loss > 0 else self.cap
        self.streams = [_Stream(start, start, self._gap()) for _ in range(streams)]

    def _draw_gap(self) -> int:
        """Packets up to and including the next lost one (geometric in the loss rate)."""
        if self.loss <= 0:
            return 1 << 62
        u = self.draws.random()
        return 1 + int(math.log(1 - u) / math.log(1 - self.loss)) if self.loss < 1 else 1

    def transfer(self, chunks: list[int], rtt_s: float) -> float:
        """Send one tensor cut into `chunks` (packets each); the time from its first
        packet out to its last packet in, without serialization."""
        queue = list(chunks)
        lanes = self.streams[:max(1, min(len(self.streams), len(queue)))]
        if self.idle_restart:
            for s in lanes:  # slow start after idle: back to the initial window
                s.ssthresh = max(s.ssthresh, 0.75 * s.cwnd)
                s.cwnd = min(s.cwnd, INITIAL_WINDOW)
        left = [queue.pop(0) if queue else 0 for _ in lanes]
        done = [0.0] * len(lanes)
        active = list(range(len(lanes)))
        rnd = 0
        while active:
            for i in list(active):
                s = lanes[i]
                budget = max(1, int(s.cwnd))
                sent, losses = 0, []
                while sent < budget:
                    if left[i] == 0:
                        if not queue:
                            break
                        left[i] = queue.pop(0)  # work stealing: the next chunk of the tensor
                    k = min(budget - sent, left[i])
                    while s.gap <= k:  # a lost packet in this burst
                        losses.append(sent + s.gap)
                        k_rest = k - s.gap
                        sent += s.gap
                        left[i] -= s.gap
                        k = k_rest
                        s.gap = self._gap()
                    s.gap -= k
                    sent += k
                    left[i] -= k
                last = left[i] == 0 and not queue
                if losses:
                    s.cwnd = max(2.0, s.cwnd * BETA)
                    s.ssthresh = s.cwnd
                elif sent >= budget:  # window-limited: the window grows
                    s.cwnd = min(self.cap, min(s.cwnd + sent, s.ssthresh) if s.cwnd < s.ssthresh else s.cwnd + ALPHA)
                if last:
                    end = rnd * rtt_s + rtt_s / 2
                    for at in losses:
                        probe_lost = sent - at == 0 and self.draws.random() < self.loss
                        end = max(end, rnd * rtt_s + rtt_s / 2 + repair_delay(sent - at, rtt_s, probe_lost))
                    done[i] = end
                    active.remove(i)
            rnd += 1
        return max(done)


def channel_time(nbytes: float, streams: int, rtt_s: float, loss: float, window_bytes: float,
                 bottleneck_bps: float, *, idle_restart: bool = False, mss: int = MSS,
                 draws: Draws | None = None, transfers: int | None = None, warmup: int | None = None,
                 gaps: Callable[[], int] | None = None) -> float:
    """Mean time (s) for one channel of `streams` streams to move a tensor of `nbytes`
    over a path of `rtt_s` with per-packet loss `loss`: first byte handed over to last
    byte in, including the one-way latency and the tensor's serialization at
    `bottleneck_bps`. Each stream's window is at most `window_bytes`; `idle_restart`:
    every transfer starts from the initial window (net.ipv4.tcp_slow_start_after_idle
    on), else where the last one left it. The mean is over `transfers` transfers (None:
    enough for every stream to see about 200 losses, 100 to 2,000) after `warmup` ones
    (None: as many as bring the windows to their steady state, about 20 losses each).
    `gaps` replaces the random loss positions (each call: packets a stream sends up to
    and including its next lost one), to check the model by hand."""
    nbytes = max(1, int(nbytes))
    chunk = chunk_bytes(nbytes, streams) if streams > 1 else nbytes
    chunks = [math.ceil(min(chunk, nbytes - off) / mss) for off in range(0, nbytes, chunk)]
    per_stream = sum(chunks) / max(1, min(streams, len(chunks)))
    # at most WORK_PACKETS packets and WORK_LOSSES losses simulated (a few tenths of a second)
    budget = max(3, int(min(WORK_PACKETS / sum(chunks), WORK_LOSSES / max(loss, 1e-12) / sum(chunks))))
    if transfers is None:
        transfers = min(budget, int(min(2000, max(100, 200 / loss / per_stream)))) if loss > 0 else 1
    ch = _Channel(streams, loss, window_bytes / mss, draws or random.Random(SEED), idle_restart, gaps)
    if warmup is None:
        warmup = min(transfers, budget // 4, int(20 / loss / per_stream)) if loss > 0 else 0
    warm = warmup
    for _ in range(warm):
        ch.transfer(chunks, rtt_s)
    mean = sum(ch.transfer(chunks, rtt_s) for _ in range(transfers)) / transfers
    return mean + nbytes * 8 / bottleneck_bps


@lru_cache(maxsize=4096)
def lossy_flow_rate(nbytes: float, streams: int, rtt_s: float, loss: float, window_bytes: float,
                    bottleneck_bps: float, idle_restart: bool = False) -> float:
    """The per-stream rate (bits/s) that makes the planner's ``latency + bytes / (streams
    x rate)`` equal `channel_time`: what each stream of the channel delivers of a
    tensor of `nbytes` through loss, its slowest stripe and its repairs included."""
    t = channel_time(nbytes, streams, rtt_s, loss, window_bytes, bottleneck_bps, idle_restart=idle_restart)
    return nbytes * 8 / (streams * max(t - rtt_s / 2, 1e-9))
