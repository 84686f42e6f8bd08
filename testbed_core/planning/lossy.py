"""How long one channel's tensor takes through a lossy WAN path: short TCP transfers
through random loss, from TCP's own mechanisms.

Mathis's ``1.22 MSS / (RTT sqrt(p))`` is a long flow's steady-state rate. A channel of N
streams cuts each tensor into chunks the streams take from a shared queue
(atlas_transport's work stealing), so each stream carries a short stripe of it, and
the tensor is there when its slowest stripe is. What decides that stripe's time is not
the average window but where the losses fall (`channel_time`, a round-by-round model
of every stream of the channel over many transfers, cwnd kept from one transfer to the
next as on a long-lived connection):

- a stream sends its congestion window per round trip (at most the receiver's window;
  paced, spread at 2 or 1.2 x cwnd a round trip as Linux's internal pacing does); a
  round with a loss cuts the window to ``BETA`` x it (Cubic), a round without one grows
  it along Cubic's curve back towards the window it lost (time spent sending counted,
  idle time not), at least by ``ALPHA`` packets per round trip (its Reno-friendly
  estimate, where its window sits at these loss rates and RTTs: together the AIMD
  average ``sqrt(ALPHA (1 + BETA) / (2 (1 - BETA) p))`` = Mathis's 1.22 / sqrt(p)), or
  doubles it below ssthresh (slow start: a fresh connection, up to twice what the
  receiver lets it have in flight, or after idle with ``slow_start_after_idle``; a round
  that does not fill the window still grows it to twice its flight, Linux's
  tcp_is_cwnd_limited);
- a loss before the stripe's last round is repaired while later rounds go out (SACK):
  it costs only the window cut. A loss in the last round is what the stripe waits for
  (`repair_delay`): with ``DUPTHRESH`` or more packets after it, fast retransmit, one
  RTT; with one or two after it, RACK's reordering window first (a quarter RTT more);
  the stripe's very last packet, only the tail-loss probe repairs it, ``PTO`` =
  max(2 RTT, 10 ms) after it left; a lost probe waits for the retransmission timeout
  (Linux: RTT + 200 ms).

The channel's time of a transfer is the latest of its stripes' (first byte out to last
byte in), plus the tensor's serialization at the bottleneck; `channel_time` returns the
mean over transfers on a long-lived connection in its steady state (a what-if),
`run_times` a run's: connections opened for it, the warm-up iterations' tensors, then
the measured ones (at 0.1% loss a channel meets a few losses an iteration, so a short
run's windows stay above the steady state). Those times are random, and a pipeline
waits for its slow transfers: the planner simulates the iteration with each lossy
channel's tensors taking the model's times in turn and keeps the mean
(`spread_makespan`; a run's channels at the same iteration of their run, since their
windows come down from slow start together); `run_interval` says how far one run's mean may fall from it by
chance. Tensors the schedule hands a channel back to back (1F1B's warm-up forwards, where
compute is short: `channel_groups`, from the planner's own simulation) queue on the same
streams as one flight (`_Channel.transfer_many`): they share its round trips, and its
slow start opens the windows wider than one tensor's, which lasts through the run's
first losses. Random draws come from a seeded generator: the same inputs give the same
figure. Nothing here is fitted to a run.
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import TYPE_CHECKING, Protocol

from testbed_core.constants import WARMUP_MAX_BYTES

if TYPE_CHECKING:  # network.py and prediction.py import this module
    from testbed_core.planning.network import WanPath
    from testbed_core.planning.prediction import Prediction
    from testbed_core.simulate import SimResult, SimSpec, TransferKey
    from testbed_core.topology import Topology

MSS = 1448
BETA = 0.7  # Cubic's multiplicative decrease (Linux: 717/1024)
ALPHA = 3 * (1 - BETA) / (1 + BETA)  # Cubic's Reno-friendly additive increase, packets per RTT
CUBIC_C = 0.4  # Cubic's scaling constant (packets / s^3)
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
    w_max: float = 0.0  # Cubic: the window at the last loss (fast convergence applied)
    epoch_s: float = 0.0  # Cubic: time spent sending since the last loss (idle time left out, as Linux does)
    w_est: float = 0.0  # Cubic: its Reno-friendly estimate


class _Channel:
    """The streams of one channel and their state between transfers: on a long-lived
    connection in its steady state (the window at the loss's AIMD average), or
    (`fresh`) on a connection just opened (the initial window, slow start until the
    first loss)."""

    def __init__(self, streams: int, loss: float, window_pkts: float, draws: Draws, idle_restart: bool,
                 gaps: Callable[[], int] | None = None, fresh: bool = False, paced: bool = False) -> None:
        self.loss, self.cap, self.draws, self.idle_restart = loss, max(1.0, window_pkts), draws, idle_restart
        self.paced = paced
        self._gap = gaps or self._draw_gap
        if fresh:
            self.streams = [_Stream(INITIAL_WINDOW, math.inf, self._gap()) for _ in range(streams)]
        else:
            start = min(self.cap, mathis_window(loss)) if loss > 0 else self.cap
            self.streams = [_Stream(start, start, self._gap(), start, 0.0, start) for _ in range(streams)]

    def _grow(self, s: _Stream, acked: int, rtt_s: float) -> None:
        """A round without loss in which `s` sent all its window allowed. Slow start
        (below ssthresh) adds what was acknowledged, up to twice what was in flight
        (Linux's tcp_is_cwnd_limited there: the window grows past the receiver's); in
        congestion avoidance Cubic grows only a window-limited flow, towards
        ``w_max + C (t - K)^3`` (t: its sending time since the last loss, K =
        cbrt(w_max (1 - BETA) / C)), at most half the window a round trip, or to its
        Reno-friendly estimate (ALPHA a round trip) where that is larger."""
        if s.cwnd < s.ssthresh:
            s.cwnd = min(s.cwnd + acked, s.ssthresh, 2 * self.cap)
            s.w_est = s.cwnd
            return
        if s.cwnd > self.cap + 1e-9:  # held by the receiver's window, not its own: no growth
            return
        s.epoch_s += rtt_s
        k = (max(0.0, s.w_max) * (1 - BETA) / CUBIC_C) ** (1 / 3)
        target = s.w_max + CUBIC_C * (s.epoch_s + rtt_s - k) ** 3
        s.w_est += ALPHA
        cubic = s.cwnd + min(max(0.0, target - s.cwnd), s.cwnd / 2)
        s.cwnd = max(cubic, s.w_est)

    @staticmethod
    def _cut(s: _Stream) -> None:
        """A round with a loss: the window to BETA of it, Cubic's w_max with fast
        convergence (a loss below the last w_max lowers it to (1 + BETA) / 2 of the window)."""
        s.w_max = s.cwnd * (1 + BETA) / 2 if s.cwnd < s.w_max else s.cwnd
        s.cwnd = max(2.0, s.cwnd * BETA)
        s.ssthresh = s.w_est = s.cwnd
        s.epoch_s = 0.0

    def _draw_gap(self) -> int:
        """Packets up to and including the next lost one (geometric in the loss rate)."""
        if self.loss <= 0:
            return 1 << 62
        u = self.draws.random()
        return 1 + int(math.log(1 - u) / math.log(1 - self.loss)) if self.loss < 1 else 1

    def transfer(self, chunks: list[int], rtt_s: float) -> float:
        """Send one tensor cut into `chunks` (packets each); the time from its first
        packet out to its last packet in, without serialization (`transfer_many` of one)."""
        return self.transfer_many([chunks], rtt_s)[0]

    def transfer_many(self, tensors: Sequence[Sequence[int]], rtt_s: float) -> list[float]:
        """Send `tensors` (each cut into chunks of packets) handed to the channel at once,
        their chunks queued in order on the same streams (work stealing); each one's time
        from the first packet out to its own last packet in, without serialization.
        Tensors behind the first share its round trips (they leave in the same rounds,
        each after the one before it, not each in rounds of its own) and are in the
        streams' flight, and slow start grows the window while it is under twice the
        flight (Linux's tcp_is_cwnd_limited), so back-to-back tensors (1F1B's warm-up
        forwards) open it wider than one alone."""
        queue = [(t, n) for t, chunks in enumerate(tensors) for n in chunks]
        lanes = self.streams[:max(1, min(len(self.streams), max(len(c) for c in tensors)))]
        if self.idle_restart:
            for s in lanes:  # slow start after idle: back to the initial window
                s.ssthresh = max(s.ssthresh, 0.75 * s.cwnd)
                s.cwnd = min(s.cwnd, INITIAL_WINDOW)
        head = [queue.pop(0) if queue else (0, 0) for _ in lanes]
        cur = [t for t, _ in head]
        left = [n for _, n in head]
        done = [0.0] * len(tensors)
        active = list(range(len(lanes)))
        rnd = 0
        while active:
            for i in list(active):
                s = lanes[i]
                budget = max(1, int(min(s.cwnd, self.cap)))
                sent, losses, completed = 0, [], []
                while sent < budget:
                    if left[i] == 0:
                        if not queue:
                            break
                        cur[i], left[i] = queue.pop(0)  # work stealing: the next chunk
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
                    if left[i] == 0:
                        completed.append((cur[i], sent))
                last = left[i] == 0 and not queue
                # paced (Linux's internal pacing): the round's packets leave spread at
                # 2 (slow start) or 1.2 (congestion avoidance) x cwnd a round trip
                rate = (2.0 if s.cwnd < s.ssthresh else 1.2) * s.cwnd / rtt_s if self.paced and rtt_s > 0 else math.inf
                if losses:
                    if s.cwnd < s.ssthresh:  # slow start: the round's ACKs grew it before the loss was seen
                        s.cwnd = min(s.cwnd + sent - len(losses), 2 * self.cap)
                    self._cut(s)
                elif sent >= budget:  # window-limited: the window grows
                    self._grow(s, sent, rtt_s)
                elif s.cwnd < s.ssthresh:  # slow start grows while cwnd < 2 x the flight (tcp_is_cwnd_limited)
                    s.cwnd = max(s.cwnd, min(s.cwnd + sent, 2 * sent, s.ssthresh, 2 * self.cap))
                    s.w_est = s.cwnd
                lo = 0
                for t, at_end in completed:  # a chunk's last packet, and its packets lost this round
                    end = rnd * rtt_s + (at_end - 1) / rate + rtt_s / 2
                    for at in losses:
                        if lo < at <= at_end:
                            probe_lost = sent - at == 0 and self.draws.random() < self.loss
                            end = max(end, rnd * rtt_s + (at - 1) / rate + rtt_s / 2
                                      + repair_delay(sent - at, rtt_s, probe_lost))
                    done[t] = max(done[t], end)
                    lo = at_end
                if last:
                    active.remove(i)
            rnd += 1
        return done


def channel_time(nbytes: float, streams: int, rtt_s: float, loss: float, window_bytes: float,
                 bottleneck_bps: float, *, idle_restart: bool = False, mss: int = MSS,
                 draws: Draws | None = None, transfers: int | None = None, warmup: int | None = None,
                 gaps: Callable[[], int] | None = None, paced: bool = False) -> float:
    """Mean time (s) for one channel of `streams` streams to move a tensor of `nbytes`
    over a path of `rtt_s` with per-packet loss `loss`: first byte handed over to last
    byte in, including the one-way latency and the tensor's serialization at
    `bottleneck_bps`. Each stream's window is at most `window_bytes`; `idle_restart`:
    every transfer starts from the initial window (net.ipv4.tcp_slow_start_after_idle
    on), else where the last one left it. The mean is over `transfers` transfers (None:
    enough for every stream to see about 200 losses, 100 to 2,000) after `warmup` ones
    (None: as many as bring the windows to their steady state, about 20 losses each).
    `gaps` replaces the random loss positions (each call: packets a stream sends up to
    and including its next lost one), to check the model by hand. `paced`: Linux's
    internal pacing (``transport.pacing``) spreads each round's packets at 2 (slow
    start) or 1.2 x cwnd a round trip instead of sending them at once."""
    times = transfer_times(nbytes, streams, rtt_s, loss, window_bytes, bottleneck_bps, idle_restart=idle_restart,
                           mss=mss, draws=draws, transfers=transfers, warmup=warmup, gaps=gaps, paced=paced)
    return sum(times) / len(times)


def transfer_times(nbytes: float, streams: int, rtt_s: float, loss: float, window_bytes: float,
                   bottleneck_bps: float, *, idle_restart: bool = False, mss: int = MSS,
                   draws: Draws | None = None, transfers: int | None = None, warmup: int | None = None,
                   gaps: Callable[[], int] | None = None, paced: bool = False) -> list[float]:
    """The times of `channel_time`'s transfers, one after another on the same
    connections (each as `channel_time` counts it): their spread, not only their mean,
    is what a pipeline waits for (`channel_time` has the arguments)."""
    nbytes = max(1, int(nbytes))
    chunk = chunk_bytes(nbytes, streams) if streams > 1 else nbytes
    chunks = [math.ceil(min(chunk, nbytes - off) / mss) for off in range(0, nbytes, chunk)]
    per_stream = sum(chunks) / max(1, min(streams, len(chunks)))
    # at most WORK_PACKETS packets and WORK_LOSSES losses simulated (a few tenths of a second)
    budget = max(3, int(min(WORK_PACKETS / sum(chunks), WORK_LOSSES / max(loss, 1e-12) / sum(chunks))))
    if transfers is None:
        transfers = min(budget, int(min(2000, max(100, 200 / loss / per_stream)))) if loss > 0 else 1
    ch = _Channel(streams, loss, window_bytes / mss, draws or random.Random(SEED), idle_restart, gaps, paced=paced)
    if warmup is None:
        warmup = min(transfers, budget // 4, int(20 / loss / per_stream)) if loss > 0 else 0
    for _ in range(warmup):
        ch.transfer(chunks, rtt_s)
    wire = nbytes * 8 / bottleneck_bps
    return [ch.transfer(chunks, rtt_s) + wire for _ in range(transfers)]


WARM_MAX_BYTES = WARMUP_MAX_BYTES  # the workers' warm-up tensor's cap (testbed_core/constants.py)
RUN_REPLICAS = (20, 400)  # fresh connections `run_times` plays: at least, at most
RUN_WORK_PACKETS = 4_000_000  # what `run_times` simulates at most (a second or two)


@lru_cache(maxsize=1024)
def run_times(nbytes: float, streams: int, rtt_s: float, loss: float, window_bytes: float, bottleneck_bps: float,
              before: int, measured: int, idle_restart: bool = False,
              paced: bool = False, warm_per_stream: int = 0,
              groups: tuple[int, ...] = ()) -> tuple[tuple[float, ...], ...]:
    """A run's transfers on a channel opened for it: from a fresh connection (the
    initial window, slow start until the first loss), the worker's untimed warm-up
    tensor of `warm_per_stream` bytes a stream (at most WARM_MAX_BYTES; 0: none), then
    `before` tensors not counted (the run's warm-up iterations), then the times of
    `measured` tensors (its measured iterations), as `channel_time` counts them; one
    sequence per replica of the run, seeded. A short run's windows have not come down to the loss's steady state: few
    losses a tensor, and after each Cubic climbs back towards the window it lost."""
    nbytes = max(1, int(nbytes))
    chunk = chunk_bytes(nbytes, streams) if streams > 1 else nbytes
    chunks = [math.ceil(min(chunk, nbytes - off) / MSS) for off in range(0, nbytes, chunk)]
    warm = min(warm_per_stream * streams, WARM_MAX_BYTES)
    warm_chunks = [math.ceil(min(chunk_bytes(warm, streams), warm - off) / MSS)
                   for off in range(0, warm, chunk_bytes(warm, streams))] if warm > 0 else []
    per_run = sum(chunks) * max(1, before + measured) + sum(warm_chunks)
    replicas = max(RUN_REPLICAS[0], min(RUN_REPLICAS[1], RUN_WORK_PACKETS // per_run, 4000 // max(1, measured)))
    draws = random.Random(SEED)
    wire = nbytes * 8 / bottleneck_bps
    out = []
    sizes = _group_sizes(groups, before + measured)
    for _ in range(replicas):
        ch = _Channel(streams, loss, window_bytes / MSS, draws, idle_restart, fresh=True, paced=paced)
        if warm_chunks:
            ch.transfer(warm_chunks, rtt_s)
        times: list[float] = []
        for k in sizes:
            # a group's tensors serialize one after the other at the bottleneck
            ends = [end + (j + 1) * wire for j, end in enumerate(ch.transfer_many([chunks] * k, rtt_s))]
            # the planner's channel takes them in turn: each its time past the one before it
            times += [ends[0]] + [max(0.0, b - a) + rtt_s / 2 for a, b in zip(ends, ends[1:], strict=False)]
        out.append(tuple(times[before:]))
    return tuple(out)


def _group_sizes(groups: tuple[int, ...], count: int) -> list[int]:
    """`count` tensors cut into the back-to-back groups of `groups` (sizes, one
    iteration's tensors on the channel, repeated, the last cut short; empty: one at a time)."""
    sizes, pattern = [], itertools.cycle(groups or (1,))
    while (done := sum(sizes)) < count:
        sizes.append(min(next(pattern), count - done))
    return sizes


def _warm(history: tuple[int, ...]) -> int:
    """A history's warm-up bytes a stream (its third element; 0 when it has none)."""
    return history[2] if len(history) > 2 else 0


def _mean_time(nbytes: float, streams: int, rtt_s: float, loss: float, window_bytes: float, bottleneck_bps: float,
               idle_restart: bool, history: tuple[int, ...] | None, paced: bool) -> float:
    if history is None or history[1] <= 0:
        return channel_time(nbytes, streams, rtt_s, loss, window_bytes, bottleneck_bps, idle_restart=idle_restart,
                            paced=paced)
    runs = run_times(nbytes, streams, rtt_s, loss, window_bytes, bottleneck_bps, history[0], history[1], idle_restart,
                     paced, _warm(history))
    return sum(map(sum, runs)) / sum(map(len, runs))


@lru_cache(maxsize=4096)
def lossy_flow_rate(nbytes: float, streams: int, rtt_s: float, loss: float, window_bytes: float,
                    bottleneck_bps: float, idle_restart: bool = False,
                    history: tuple[int, ...] | None = None, paced: bool = False) -> float:
    """The per-stream rate (bits/s) that makes the planner's ``latency + bytes / (streams
    x rate)`` equal `channel_time`: what each stream of the channel delivers of a
    tensor of `nbytes` through loss, its slowest stripe and its repairs included. With
    `history` (tensors before the measured ones, measured ones, on a channel opened for
    the run: `run_times`), the mean over the measured ones of a fresh connection; else
    a long-lived connection's steady state."""
    t = _mean_time(nbytes, streams, rtt_s, loss, window_bytes, bottleneck_bps, idle_restart, history, paced)
    return nbytes * 8 / (streams * max(t - rtt_s / 2, 1e-9))


# ------------------------------------------------------------------ the spread of a channel's transfers

SPREAD_RUNS = 256
"""Simulations of the iteration `spread_makespan` averages. A one-stream channel's
iterations through 0.1% loss scatter by about 25% (lossy-4dc), so 32 random draws left
the expected iteration 3-4% off by the draws alone (sd over seeds: baseline 5.0%,
multi-tcp 2.9%, torch-gloo 4.0%), the same way in every prediction of a run, the seed
being fixed; 256, each iteration's replicas taken in a shuffled order (`_orders`), come
within 0.6-0.7% of the replicas' own mean, for about 0.6 s a prediction."""


@lru_cache(maxsize=1024)
def service_factors(nbytes: float, streams: int, rtt_s: float, loss: float, window_bytes: float,
                    bottleneck_bps: float, idle_restart: bool = False, history: tuple[int, ...] | None = None,
                    block: int = 1, paced: bool = False, groups: tuple[int, ...] = ()) -> tuple[tuple[float, ...], int, int]:
    """The spread of a lossy channel's tensors around the mean the planner's rate gives
    them: each transfer's service time (its time less the one-way latency, rtt_s / 2)
    over their mean, in the order they ran on the channel's connections (windows carried
    from one to the next), with the `block` they come in: a long-lived connection's
    steady state (`transfer_times`), any one after another (block 1); with `history`,
    the measured transfers of the run's replicas (`run_times`) one after another, in
    blocks of `block` (an iteration's tensors on the channel). The third element is the
    length of one replica's run (`run_times`' measured transfers; 0 for the steady
    state, where every block is alike)."""
    per_run = 0
    if history is None or history[1] <= 0:
        times = transfer_times(nbytes, streams, rtt_s, loss, window_bytes, bottleneck_bps, idle_restart=idle_restart,
                               paced=paced)
        block = 1
    else:
        runs = run_times(nbytes, streams, rtt_s, loss, window_bytes, bottleneck_bps, history[0], history[1],
                         idle_restart, paced, _warm(history), groups)
        times = [t for run in runs for t in run]
        block = max(1, block) if history[1] % max(1, block) == 0 else 1
        per_run = history[1]
    service = [max(1e-9, t - rtt_s / 2) for t in times]
    mean = sum(service) / len(service)
    if groups and history is not None and history[1] > 0:
        # around the rate's mean (`lossy_flow_rate`: tensors one at a time), so that what
        # back-to-back tensors gain moves the mean iteration too
        mean = _mean_time(nbytes, streams, rtt_s, loss, window_bytes, bottleneck_bps, idle_restart, history,
                          paced) - rtt_s / 2
    return tuple(x / mean for x in service), block, per_run


Factors = tuple[tuple[float, ...], int, int]
"""A lossy route's `service_factors`: the factors, their block and one replica's run
length (0: a steady state's, every block alike)."""


def _iteration(k: int, runs: int, count: int) -> int:
    """The iteration of a run of `count` the `k`-th of `runs` simulations takes: cycled
    (every one equally often where `runs` is a multiple of `count`), or, in a run longer
    than the simulations, `runs` evenly spread over it, not its first `runs` only
    (whose windows have not come down yet)."""
    return k % count if runs >= count else ((2 * k + 1) * count) // (2 * runs)


def _replicated(factors: Factors) -> bool:
    """Whether `factors` are runs of a run's replicas (`run_times`), in whole blocks."""
    f, block, per_run = factors
    return bool(per_run) and per_run % block == 0 and len(f) % per_run == 0


def _starts(chans: Mapping[tuple[int, int, str], Factors], rng: random.Random, k: int,
            runs: int, orders: Mapping[tuple[int, int, str], list[list[int]]]) -> dict:
    """Where each channel takes the `k`-th of `runs` simulations' block of its factors.
    Channels whose factors are runs of a run's replicas (a third element: a replica's
    length) take the same iteration of the run (`_iteration`), each from its own
    replica: a run's channels were opened together, so their windows come down
    from slow start together (the first iterations fast on every channel, the later
    ones slow), while their losses are independent. The replica is the next of the
    channel's shuffled order for that iteration (`orders`, `_orders`: every replica
    once before any twice, so that the simulations' mean comes near the replicas'
    own, not a random draw of them). Others (run length 0): a random block each."""
    out = {}
    for key, (f, block, per_run) in chans.items():
        if _replicated((f, block, per_run)):
            count = per_run // block
            it = _iteration(k, runs, count)
            order = orders[key][it]
            seen = k // count if runs >= count else 0  # simulations of iteration `it` before this one
            out[key] = per_run * order[seen % len(order)] + block * it
        else:
            out[key] = block * rng.randrange(max(1, len(f) // block))
    return out


def _orders(chans: Mapping[tuple[int, int, str], Factors], rng: random.Random) -> dict:
    """Each replicated channel's replicas in a seeded random order, one order per
    iteration of the run (`_starts`)."""
    out = {}
    for key, (f, block, per_run) in chans.items():
        if _replicated((f, block, per_run)):
            replicas = len(f) // per_run
            out[key] = [rng.sample(range(replicas), replicas) for _ in range(per_run // block)]
    return out


def spread_makespan(spec: SimSpec, factors: Mapping[tuple[str, ...], Factors],
                    run: Callable[[SimSpec], SimResult], runs: int = SPREAD_RUNS, seed: int = SEED) -> float:
    """The mean iteration (makespan) over `runs` simulations of `spec` in which every
    channel whose WAN route (its path's link resources, `factors`' keys) is lossy takes
    each tensor in the time the rate gives it times the next of its route's
    `service_factors`, from a seeded random block of them (channels lose packets
    independently; where the factors are a run's replicas, every channel takes the same
    iteration of its replica, as `run_interval` does, the iterations in turn, every
    replica of an iteration once before any twice: `_starts`).
    Random times on a pipeline's dependent transfers make it wait for the slowest more
    often than the mean time says: the mean iteration is longer than the iteration of
    mean transfers."""
    chans = {key: factors[path.resources[1:]] for key, path in spec.paths.items() if path.resources[1:] in factors}
    if not chans:
        return run(spec).makespan
    rng = random.Random(seed)
    orders = _orders(chans, rng)
    total = 0.0
    for k in range(runs):
        total += run(_scaled(spec, chans, _starts(chans, rng, k, runs, orders))).makespan
    return total / runs


def _scaled(spec: SimSpec, chans: Mapping[tuple[int, int, str], Factors], start: Mapping) -> SimSpec:
    """`spec` with each lossy channel's tensors taking its factors from `start` on (a
    micro-batch's tensor the next factor), the others as the rate gives them."""
    def scale(key: TransferKey) -> float:
        ch = (key.pipeline, key.boundary, key.direction)
        if ch not in chans:
            return 1.0
        f = chans[ch][0]
        return f[(start[ch] + key.mb) % len(f)]

    return replace(spec, transfer_scale=scale)


def run_interval(spec: SimSpec, factors: Mapping[tuple[str, ...], Factors],
                 run: Callable[[SimSpec], SimResult], iterations: int, runs: int = 200,
                 seed: int = SEED) -> tuple[float, float]:
    """The 5th and 95th percentiles of a run's mean iteration over `iterations`
    iterations, each channel's tensors taking one replica's blocks of `factors` one
    iteration after another (as `spread_makespan` takes one): how far one short run on a
    lossy path may fall from the expected iteration by chance alone. Each distinct
    iteration is simulated once and reused."""
    chans = {key: factors[path.resources[1:]] for key, path in spec.paths.items() if path.resources[1:] in factors}
    if not chans:
        t = run(spec).makespan
        return t, t
    rng = random.Random(seed)
    memo: dict[tuple[tuple[tuple[int, int, str], int], ...], float] = {}

    def one(start: dict) -> float:
        key = tuple(sorted(start.items()))
        if key not in memo:
            memo[key] = run(_scaled(spec, chans, start)).makespan
        return memo[key]

    means = []
    for _ in range(runs):
        first = {key: v[1] * iterations * rng.randrange(max(1, len(v[0]) // (v[1] * iterations)))
                 for key, v in chans.items()}  # a replica's run from its start
        means.append(sum(one({k: (v + i * chans[k][1]) % max(1, len(chans[k][0])) for k, v in first.items()})
                         for i in range(iterations)) / iterations)
    means.sort()
    return means[int(0.05 * (runs - 1))], means[int(0.95 * (runs - 1))]


def route_loss(topology: Topology, dcs: Sequence[str]) -> float:
    """The per-packet loss of a route through DCs `dcs`: 1 - the product of its links' delivery."""
    return 1 - math.prod(1 - topology.link(x, y).loss for x, y in zip(dcs, dcs[1:], strict=False))


def lossy_between(topology: Topology, a: str, z: str) -> bool:
    """Whether the route between DCs `a` and `z` loses packets (a link on it with
    configured loss): what a probe measures there came through the loss, which the loss
    model brings back on its own."""
    return route_loss(topology, topology.route(a, z)) > 0


def lossy_routes(topology: Topology, paths: Iterable[WanPath], nbytes: float, idle_restart: bool = False,
                 history: tuple[int, ...] | None = None, per_iteration: int = 1,
                 paced: bool = False, plan: tuple[SimSpec, SimResult] | None = None,
                 ) -> dict[tuple[str, ...], Factors]:
    """The `service_factors` of every lossy route among `paths` (by its link resources),
    for tensors of `nbytes` at the route's streams and windows; `history` and
    `per_iteration` (tensors a channel carries an iteration) as `service_factors` takes
    them; `plan`: the iteration simulated at the rates' mean, whose back-to-back groups
    (`channel_groups`, read only where a route is lossy) the routes' channels carry."""
    lossy = [(wp, loss) for wp in paths
             if (loss := route_loss(topology, wp.dcs)) > 0 and wp.rtt_s > 0 and nbytes > 0]
    groups = channel_groups(*plan) if plan is not None and lossy else {}
    out = {}
    for wp, loss in lossy:
        window = wp.window_bytes if math.isfinite(wp.window_bytes) else wp.flow_rate_bps * wp.rtt_s / 8
        out[wp.resources] = service_factors(float(nbytes), wp.streams, wp.rtt_s, loss, window,
                                            wp.bottleneck_bps, idle_restart, history, per_iteration, paced,
                                            groups.get(wp.resources, ()))
    return out


def channel_groups(spec: SimSpec, sim: SimResult) -> dict[tuple[str, ...], tuple[int, ...]]:
    """Each WAN route's tensors of one iteration in the groups its channel is handed them
    back to back (sizes in hand-over order): a tensor handed over while the one before
    it is still on the channel (in `sim`, the iteration at the rate's mean) rides the
    same streams' flight (`run_times`' `groups`; 1F1B's warm-up forwards, where compute
    is short). Routes over a planned (exclusive) link are left out: a temporal plan's
    dispatcher hands the transport one tensor at a time; gloo's pairs (rendezvous) send
    a tensor once its receive is posted. The first channel on a route speaks for it."""
    spans: dict[tuple[int, int, str], list] = {}
    for t in sim.transfers:
        spans.setdefault((t.key.pipeline, t.key.boundary, t.key.direction), []).append(t)
    out: dict[tuple[str, ...], tuple[int, ...]] = {}
    for key in sorted(spec.paths):
        route = spec.paths[key].resources[1:]
        if route in out or not route or key not in spans \
                or any(spec.resources[r].policy != "shared" for r in route if r in spec.resources):
            continue
        sizes: list[int] = []
        prev = None
        for t in sorted(spans[key], key=lambda t: (t.ready, t.key.mb)):
            # gloo's pairs (rendezvous) send a tensor only once its receive is posted
            handed = t.start if spec.rendezvous else t.ready
            if prev is not None and handed < prev.end:
                sizes[-1] += 1
            else:
                sizes.append(1)
            prev = t
        out[route] = tuple(sizes)
    return out


def chance_interval(prediction: Prediction, topology: Topology, iterations: int,
                    history: tuple[int, ...] | None = None, paced: bool = False, idle_restart: bool = False,
                    runs: int = 100) -> tuple[float, float] | None:
    """Where one run's mean iteration over `iterations` may fall by chance around
    `prediction` on its lossy routes (`run_interval` on its simulation; the all-reduce's
    time added as predicted), or None without a lossy route."""
    from testbed_core.simulate import simulate

    assert prediction.effective is not None
    factors = lossy_routes(topology, prediction.paths.values(), prediction.effective.wire_activation_bytes,
                           idle_restart, history, prediction.spec.schedule.microbatches, paced,
                           (prediction.spec, prediction.sim))
    if not factors:
        return None
    lo, hi = run_interval(prediction.spec, factors, simulate, max(1, iterations), runs)
    extra = prediction.iteration_time_s - prediction.pipeline_time_s
    return lo + extra, hi + extra
