"""A profiled program on another network: `testbed whatif --program DIR`.

The profile (testbed_core/program/profile.py) gives each rank's program as a sequence
of actions: compute for d seconds (what is left of its time once the waits on
communication are taken out: the compute between communications, the Python around
them), issue a communication, wait for some, and the step marks it printed. The replay
runs every rank's sequence at once on a model of the target network: the compute
stays as measured, every communication takes what the network gives it, and a rank
waits where it waited. A step's predicted time is the span between its marks; the
figure is rank 0's median after the warm-up steps (what the program itself prints).

The network model, per directed pair of ranks (one connection of the backend, its
transfers one after another):

* across DCs: the route's one-way latency, and the bytes leave at the link's goodput as
  far as each stream's window allows: a flight within the window at once, a longer one
  a window per round trip after the first; gloo uses one flow
  per pair, atlas its streams (``ATLAS_STREAMS``, else 8 on a WAN path, 1 under 2 ms);
* a connection idle for longer than its retransmission timeout (RTT + 200 ms, Linux's
  minimum) restarts from the initial window (``tcp_slow_start_after_idle``, on unless
  the topology turns it off): its first transfer then takes the rounds of slow start,
  each stream's window doubling per round trip from 10 segments up to the window;
* an emulated link's token bucket (HTB, 1 ms at line rate) lets a flight that starts on
  an idle link pass that much at once (gloo's 0.5 MiB DDP all-reduce at 10 ms: 2 RTT +
  2.8 ms, not the 4.5 ms of two half-tensors at 1 Gbit/s);
* inside a DC: the DC's LAN rate, no latency;
* the per-stream window is the profile's own measure where a path was window-limited
  at the profiled RTT (each timed transfer's service time: the effective window the
  kernel gave, which the nominal ``rmem_max / 2`` only approximates); on a path only
  striped channels crossed (atlas), the window whose replay gives the profiled step,
  where the step depends on it there (`fit_windows`); else the nominal;
* gloo sends once the receive's notice reached the sender (a rendezvous: one one-way
  delay after the receive was posted), and that notice keeps the connection from idling;
  atlas's WAN streams are paced (BBR) until a channel's last 16 sends were all under
  256 KiB per stream (then cubic, kept warm: unpaced), back at the next large send;
  so does each round of its collectives (a ring round of gloo is a round trip plus the
  bytes, found on 2dc's DDP: 2 RTT + 4 ms for 0.5 MiB at 50, 100 and 200 ms); a ring of
  fewer 4-byte elements than ranks (a loss's scalar) is one round;
  atlas sends at once and its send completes when the receiver's confirmation is back;
* collectives by their algorithm (`ALGORITHMS`, a parameter per backend and op; atlas's
  all-reduce as the profile says the installed backend runs it, `algorithms_for`): a
  ring all-reduce is 2(n-1) rounds of 1/n of the tensor to the next rank, starting when
  the last member issued it, a round ending when its slowest transfer does; atlas's
  two-level all-reduce a reduce-scatter in each site, each shard once across the WAN,
  an all-gather in each site; an exchange (one per site: the two-level one too) one
  round in which each member sends from its own issue and is done once every other
  member's tensor reached it; a direct (rooted) one from the root;
* the atlas transport's own cost, measured on the machine before the prediction
  (testbed_core/program/transport.py: ``transport-calibration.json``, where given): each
  atlas transfer across a WAN takes at least its bytes at the measured rate, plus the
  measured overhead per transfer of its pattern (a send, an exchange), which does not
  scale with the RTT;
* what the model still misses at the profiled RTT (a protocol's own exchanges, a restart
  it makes too slow or too fast) is fitted there as round trips added to each WAN
  transfer's arrival (`fit_extra_rtts`, bounded), and scales with the target's RTT.

What it leaves out: transfers of different pairs sharing a WAN link (each pair has the
link to itself), loss and retransmission timeouts, and the CPU the emulation (and the
transport, beyond its calibrated cost) takes from the ranks: the compute between communications is kept as profiled,
as on a cluster whose GPUs compute whatever the network does; on one shared machine a
faster network takes CPU from the ranks and their compute stretches.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from testbed_core.configfile import format_validation_error
from testbed_core.planning.calibrated import LINK_GOODPUT
from testbed_core.planning.lossy import RTO_MIN_S  # Linux's minimum retransmission timeout
from testbed_core.planning.network import stream_window
from testbed_core.program.profile import OpRecord, ProfileError, ProgramProfile, RankProfile
from testbed_core.program.transport import (
    CALIBRATED_BACKENDS,
    Pattern,
    PatternCost,
    TransportCalibration,
)
from testbed_core.shaper import burst_bytes
from testbed_core.topology import MAX_DELAY_S, MAX_RATE_BPS, MIN_RATE_BPS, Topology, TopologyError
from testbed_core.units import format_rate

MSS = 1448
INITIAL_WINDOW = 10 * MSS  # Linux's initial congestion window (RFC 6928)
LAN_STREAMS_RTT_S = 0.002  # atlas: 1 stream under this RTT, else WAN_STREAMS (atlas_transport/torch/options.py)
WAN_STREAMS = 8
RING_MIN_BYTES = 256 << 10  # atlas: all_reduce by ring from this size (atlas_transport/torch/collectives.py)
WINDOW_LIMITED = 0.8  # a path moving less than this share of its link's goodput is window-limited
BLOCKED_S = 1e-3
EXTRA_RTTS_MIN, EXTRA_RTTS_MAX = -0.5, 8.0  # bounds of the fitted round trips per transfer (fit_extra_rtts)
WINDOW_FIT_RANGE = (0.5, 2.0)  # a fitted stream window, as a share of the nominal one (fit_windows)
WINDOW_SENSITIVE = 0.02  # ... fitted only where the step over that range moves by more than this share of it
METRIC_BYTES = 1024
# backends whose receives send a notice to the sender, which sends only then (rendezvous: gloo's
# transfers start one one-way delay after the receive is posted); the others send at once
NOTIFYING = frozenset({"gloo"})
# backends whose sends complete once the receiver confirmed the transfer (atlas: a DONE message
# back, on the same connections, which keeps them from idling), one one-way delay after it
# arrived; the others once the last byte left
CONFIRMING = frozenset({"atlas"})  # a blocking collective this small right before a step line is a metric (step_end)  # a wait longer than this was blocked: its end is when the data arrived


# backends whose WAN streams are paced (BBR: atlas_transport/torch/mesh.py switches a channel's
# streams to it across a WAN unless ATLAS_CONGESTION names another): a transfer leaves at the
# flow's rate from its first byte, no flight within the window at once
PACED = frozenset({"atlas"})
# ... but an atlas WAN channel follows its sends (atlas_transport/torch/mesh.py, PeerMesh._adapt):
# once its last BURST_WINDOW sends were all under BIG_SHARE_BYTES per stream it gives BBR up for
# cubic with warm streams (unpaced: a flight within the window at once); a send that large
# switches it back to BBR before it starts
BURST_WINDOW = 16
BIG_SHARE_BYTES = 256 << 10
HIERARCHICAL_SMALL_BYTES = 64 << 10  # atlas's two-level all-reduce: one exchange below this


def _atlas_all_reduce(nbytes: int, size: int) -> str:
    """atlas's all-reduce before its two-level form: a ring from RING_MIN_BYTES, else one exchange."""
    return "ring" if nbytes >= RING_MIN_BYTES and nbytes >= 4 * size else "exchange"


def _atlas_hierarchical(nbytes: int, size: int) -> str:
    """atlas's two-level all-reduce (atlas_transport/torch/hierarchical.py): one exchange below 64 KiB."""
    return "hierarchical" if nbytes >= HIERARCHICAL_SMALL_BYTES and nbytes >= 4 * size else "exchange"


# backend -> op -> algorithm name, or a function of (bytes, group size) giving it
Algorithm = str | Callable[[int, int], str]
ALGORITHMS: dict[str, dict[str, Algorithm]] = {
    "gloo": {"all_reduce": "ring", "all_reduce_coalesced": "ring", "all_gather": "ring",
             "all_gather_into_tensor": "ring", "reduce_scatter": "ring", "reduce_scatter_tensor": "ring",
             "barrier": "ring", "broadcast": "direct", "reduce": "direct", "gather": "direct", "scatter": "direct",
             "all_to_all": "exchange", "all_to_all_single": "exchange"},
    "atlas": {"all_reduce": _atlas_all_reduce, "all_reduce_coalesced": _atlas_all_reduce,
              "broadcast": "direct", "reduce": "direct", "gather": "direct", "scatter": "direct",
              "barrier": "exchange", "all_gather": "exchange", "all_gather_into_tensor": "exchange",
              "reduce_scatter": "exchange", "reduce_scatter_tensor": "exchange"},
}
DEFAULT_ALGORITHM = "exchange"


def algorithms_for(atlas_all_reduce: str) -> dict[str, dict[str, Algorithm]]:
    """`ALGORITHMS` with atlas's all-reduce as `atlas_all_reduce`: 'ring' (a ring from
    256 KiB) or 'hierarchical' (two levels by site from 64 KiB), whichever the atlas
    backend the program ran with uses."""
    if atlas_all_reduce not in ("ring", "hierarchical"):
        raise ValueError(f"atlas all-reduce {atlas_all_reduce!r}: use ring or hierarchical")
    table = {backend: dict(ops) for backend, ops in ALGORITHMS.items()}
    choice = _atlas_all_reduce if atlas_all_reduce == "ring" else _atlas_hierarchical
    table["atlas"]["all_reduce"] = table["atlas"]["all_reduce_coalesced"] = choice
    return table


class PredictError(ProfileError):
    """A profile that cannot be replayed on the target (the message says what does not fit)."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class PathFigures(_Model):
    """What the replay used for one pair of DCs (either way)."""

    dcs: tuple[str, str]
    one_way_latency_s: float
    link_goodput_bps: float
    window_bytes: float = Field(description="one stream's effective TCP window")
    window_source: str = Field(description="'profile' (measured there on one-stream transfers), 'fitted' (only "
                                           "striped channels crossed there: fitted to the profiled step, "
                                           "fit_windows) or 'nominal' (min(wmem_max, rmem_max / 2))")
    rto_s: float


class StepPrediction(_Model):
    rank: int
    steps: list[float] = Field(description="every step's predicted seconds, in order")
    median_s: float | None = Field(description="median after the warm-up steps")
    measured_median_s: float | None = Field(None, description="the profile's own median after the warm-up (its network)")


class ProgramPrediction(_Model):
    """One target network's prediction."""

    label: str
    topology: str
    rtt_s: dict[str, float] = Field(description="RTT of each WAN link, by 'a-b'")
    bandwidth_bps: dict[str, float]
    seconds_per_step: float | None = Field(description="rank 0's median predicted step time after the warm-up")
    ranks_mean_s_per_step: float | None = Field(
        None, description="the median after the warm-up of each step's mean over the ranks: where ranks meet in one "
                          "exchange per step, how a step splits between one rank's timed part and its wait after "
                          "depends on which rank runs ahead, their mean does not")
    measured_ranks_mean_s_per_step: float | None = Field(None, description="the same figure, measured in the profile")
    ranks: list[StepPrediction]
    paths: list[PathFigures]
    streams: dict[str, int] = Field(description="streams per pair by backend, on WAN paths")
    extra_rtts: float = Field(description="round trips added to each WAN transfer, fitted on the profile's network")
    transport_costs: list[PatternCost] | None = Field(
        None, description="the atlas transport's measured cost per transfer the replay used (transport-calibration"
                          ".json); None: none given, the network alone")


@dataclass
class _Path:
    latency: float
    rtt: float
    link_Bps: float  # bytes/s of goodput
    window: float  # bytes per stream
    rto: float
    lan: bool


@dataclass
class _Channel:
    free: float = -math.inf  # when its last transfer's last byte left
    cwnd: float = INITIAL_WINDOW  # each stream's congestion window (bytes)
    sent: float = -math.inf  # when its sender last sent anything (data, or a receive's notice the other way)


@dataclass
class _Op:
    rank: int
    rec: OpRecord
    issued: float | None = None
    done: float | None = None


@dataclass
class _Transfer:
    send: _Op | None = None
    recv: _Op | None = None


@dataclass
class _Collective:
    members: list[int]
    algorithm: str
    backend: str
    ops: dict[int, _Op] = field(default_factory=dict)


# --------------------------------------------------------------------------- the rank's actions


def rank_actions(rank: RankProfile) -> tuple[float, list[tuple[str, object]]]:
    """(start time, actions) of one rank: ('c', seconds of compute), ('i', op id),
    ('w', [op ids]), ('m', (step, 'start'|'end')). DDP's all-reduces of one backward
    pass are waited for together after the last one is issued (the reducer's finalize)."""
    points: list[tuple[float, int, str, object]] = []
    ddp_batch: list[OpRecord] = []

    def flush_ddp() -> None:
        if not ddp_batch:
            return
        t0 = max(o.t_issue_end for o in ddp_batch)
        done = [o.t_done for o in ddp_batch if o.t_done is not None]
        t1 = max([t0, *done])
        points.append((t0, 2, "w", ([o.id for o in ddp_batch], t1)))
        ddp_batch.clear()

    for op in sorted(rank.ops, key=lambda o: o.t_issue):
        if not op.ddp:
            flush_ddp()
        points.append((op.t_issue, 1, "i", (op.id, op.t_issue_end)))
        if op.ddp:
            ddp_batch.append(op)
            continue
        for t0, t1 in op.waits:
            points.append((t0, 2, "w", ([op.id], t1)))
    flush_ddp()
    for s in rank.steps:
        end = step_end(rank, s.t_line)
        points.append((end - s.step_s, 0, "m", ((s.step, "start"), None)))
        points.append((end, 0, "m", ((s.step, "end"), None)))
    points.sort(key=lambda p: (p[0], p[1]))
    if not points:
        return 0.0, []
    start = points[0][0]
    cursor = start
    actions: list[tuple[str, object]] = []
    for t, _, kind, (what, t_end) in points:
        if t > cursor:
            actions.append(("c", t - cursor))
            cursor = t
        actions.append((kind, what))
        if kind == "w":
            cursor = max(cursor, t_end)  # type: ignore[type-var]
        elif kind == "i":
            cursor = max(cursor, t_end)  # type: ignore[type-var]
    return start, actions


def _finished(op: OpRecord) -> float:
    """When the rank knew `op` done: the end of its last wait, its completion, or the call's return."""
    ends = [op.t_issue_end, *(w[1] for w in op.waits)] + ([op.t_done] if op.t_done is not None else [])
    return max(ends)


def step_end(rank: RankProfile, t_line: float) -> float:
    """When a step's timer stopped, from when its line was read: before the small
    blocking collectives the rank ran just before printing it (a loss or metric
    all-reduce, e.g. ``dist.all_reduce(loss)`` then the line: outside the step's timer),
    else at the line. The launch reads a line some time after it was printed (ms on a
    busy machine), when the next step may have issued its first communication already:
    only what was finished by the line's reading counts as before it."""
    end = t_line
    while True:
        before = [o for o in rank.ops if o.t_issue < end and _finished(o) <= t_line + BLOCKED_S]
        if not before:
            return end
        last = max(before, key=lambda o: o.t_issue)
        if not (last.kind == "collective" and last.blocking and last.bytes <= METRIC_BYTES
                and last.t_issue_end <= end + BLOCKED_S):
            return end
        end = last.t_issue


def compute_per_step(rank: RankProfile) -> list[float]:
    """The rank's compute inside each step (its time not waiting on communication),
    in step order: what the replay keeps as profiled."""
    totals: dict[int, float] = {}
    inside: int | None = None
    for kind, what in rank_actions(rank)[1]:
        if kind == "m":
            step, edge = what  # type: ignore[misc]
            inside = step if edge == "start" else None
            totals.setdefault(step, 0.0)
        elif kind == "c" and inside is not None:
            totals[inside] += what  # type: ignore[operator]
    return [totals[k] for k in sorted(totals)]


# --------------------------------------------------------------------------- the network


def _restart(cwnd: float, idle: float, rto: float) -> float:
    """Linux's tcp_cwnd_restart: after `idle` seconds without sending (more than an RTO),
    the window halves once per further RTO, down to the initial window."""
    restart = min(float(INITIAL_WINDOW), cwnd)
    delta = idle - rto
    while delta > 0 and cwnd > restart:
        cwnd /= 2
        delta -= rto
    return max(cwnd, restart)


def link_burst_bytes(link_Bps: float) -> float:
    """The emulated link's token bucket (testbed/emulation/shaping.py's HTB burst: 1 ms at
    line rate, at least a GSO packet and a frame): an idle link passes this much at once."""
    return burst_bytes(link_Bps * 8 / LINK_GOODPUT)


def _serialization(nbytes: float, streams: int, path: _Path, cwnd: float, paced: bool = False,
                   tokens: float = 0.0) -> tuple[float, float]:
    """(seconds from a transfer's start until its last byte left, each stream's window
    after it): each stream sends its window per round trip, the window doubling from
    `cwnd` (slow start) up to the path's window (or its share of the link). What is left
    once the window is reached leaves at the link's rate as far as the window allows: a
    flight within the window at once (bytes / link rate), a longer one a window per round
    trip after the first ((left - window) / window round trips); `tokens` bytes of the
    link's bucket pass it at once. `paced` (BBR: atlas's WAN channels): no flight at once,
    every byte at the flow's rate, a window per round trip."""
    if nbytes <= 0:
        return 0.0, cwnd
    if path.lan:
        return nbytes / path.link_Bps, cwnd
    per_stream = nbytes / streams
    cap = min(path.window, path.link_Bps * path.rtt / streams)
    sent, t = 0.0, 0.0
    while cwnd < cap and sent + cwnd < per_stream:
        sent += cwnd
        cwnd *= 2
        t += path.rtt
    window = min(max(cwnd, INITIAL_WINDOW), cap)
    left = per_stream - sent
    if paced:
        return t + left * streams / min(path.link_Bps, streams * window / path.rtt), window
    at_once = max(0.0, left * streams - tokens) if t == 0 else left * streams
    return t + max(at_once / path.link_Bps, (left - window) / window * path.rtt), window


class Replay:
    """Every rank's actions at once on a network model."""

    def __init__(self, profile: ProgramProfile, paths: Mapping[tuple[str, str], _Path],
                 dc_of: Mapping[int, str], streams_of: Callable[[str, _Path], int],
                 algorithms: Mapping[str, Mapping[str, Algorithm]], slow_start_after_idle: bool,
                 extra_rtts: float = 0.0, transport: TransportCalibration | None = None) -> None:
        self.profile, self.paths, self.dc_of = profile, paths, dc_of
        self.extra_rtts = extra_rtts
        self.transport = transport
        self.streams_of, self.algorithms = streams_of, algorithms
        self.cold_restart = slow_start_after_idle
        self.link_free: dict[tuple[str, str], float] = {}  # when each direction's link last sent
        self.recent_sends: dict[tuple, list[float]] = defaultdict(list)  # a paced channel's last sends
        self.unpaced: set[tuple] = set()  # paced channels that gave pacing up (small sends)
        congestion = profile.env.get("ATLAS_CONGESTION", "").strip().lower()
        self.paced = PACED if congestion in ("", "bbr") else frozenset()
        self.channels: dict[tuple, _Channel] = defaultdict(_Channel)
        self.ops: dict[tuple[int, int], _Op] = {}
        self.queues: dict[tuple, list[_Transfer]] = defaultdict(list)
        self.next_send: dict[tuple, int] = defaultdict(int)
        self.next_recv: dict[tuple, int] = defaultdict(int)
        self.resolved: dict[tuple, int] = defaultdict(int)
        self.collectives: dict[tuple, _Collective] = {}
        self.coll_seq: dict[tuple[int, tuple], int] = defaultdict(int)
        self.group_key: dict[tuple[int, int], tuple] = {}
        self.backend: dict[tuple[int, int], str] = {}
        for r in profile.ranks:
            seen: dict[tuple, int] = defaultdict(int)
            for g in sorted(r.groups, key=lambda g: g.index):
                base = (tuple(g.ranks), g.backend)
                self.group_key[(r.rank, g.index)] = (*base, seen[base])
                self.backend[(r.rank, g.index)] = g.backend
                seen[base] += 1
            for op in r.ops:
                self.ops[(r.rank, op.id)] = _Op(r.rank, op)

    # --- transfers

    def path(self, a: int, b: int) -> _Path:
        return self.paths[(self.dc_of[a], self.dc_of[b])]

    def _transfer(self, gkey: tuple, backend: str, src: int, dst: int, nbytes: float, start: float,
                  pattern: Pattern = "send") -> tuple[float, float]:
        """(last byte out, arrival) of `nbytes` from `src` to `dst` on the group's connection;
        a calibrated backend's transfer across a WAN takes at least its bytes at the
        transport's measured rate, plus the measured overhead per transfer of its
        `pattern` (testbed_core/program/transport.py), on the channel's time."""
        path = self.path(src, dst)
        ch = self.channels[(gkey, src, dst)]
        begin = max(start, ch.free)
        cwnd = ch.cwnd
        last = max(ch.free, ch.sent)
        if self.cold_restart and begin - last > path.rto:
            cwnd = _restart(cwnd, begin - last, path.rto)
        streams = self.streams_of(backend, path)
        link = (self.dc_of[src], self.dc_of[dst])
        idle_since = self.link_free.get(link, -math.inf)
        tokens = 0.0 if path.lan else min(link_burst_bytes(path.link_Bps), max(0.0, begin - idle_since) * path.link_Bps)
        took, ch.cwnd = _serialization(nbytes, streams, path, cwnd, self._paced(gkey, backend, src, dst, nbytes,
                                                                              streams, path), tokens)
        cost = self._cost(backend, path, pattern)
        if cost is not None:
            took = max(took, nbytes / cost.rate_Bps) + cost.overhead_s
        ch.free = ch.sent = begin + took
        self.link_free[link] = max(idle_since, ch.free)
        # the fitted round trips are what a transfer's data costs beyond the model (pacing, ramp-up,
        # the protocol's own exchanges); a message within each stream's first flight pays none of them
        extra = self.extra_rtts if nbytes / streams > INITIAL_WINDOW else min(0.0, self.extra_rtts)
        return ch.free, ch.free + max(0.0, path.latency + extra * path.rtt)

    def _cost(self, backend: str, path: _Path, pattern: Pattern) -> PatternCost | None:
        if self.transport is None or path.lan or backend not in CALIBRATED_BACKENDS:
            return None
        return self.transport.cost(pattern)

    def _paced(self, gkey: tuple, backend: str, src: int, dst: int, nbytes: float, streams: int, path: _Path) -> bool:
        """Whether this send leaves paced (BBR): a paced backend's WAN channel, unless its
        recent sends were all small (see BIG_SHARE_BYTES)."""
        if backend not in self.paced or path.lan:
            return False
        key = (gkey, src, dst)
        recent = self.recent_sends[key]
        recent.append(nbytes)
        del recent[:-BURST_WINDOW]
        big = nbytes >= BIG_SHARE_BYTES * streams
        if big:
            self.unpaced.discard(key)
        elif len(recent) == BURST_WINDOW and max(recent) < BIG_SHARE_BYTES * streams:
            self.unpaced.add(key)
        return key not in self.unpaced

    def _p2p(self, op: _Op) -> None:
        rec = op.rec
        gkey = self.group_key[(op.rank, rec.group)]
        if rec.peer is None:
            raise PredictError(f"rank {op.rank}: {rec.op} #{rec.id} has no peer rank recorded: cannot replay it")
        src, dst = (op.rank, rec.peer) if rec.kind == "send" else (rec.peer, op.rank)
        key = (gkey, src, dst, rec.tag)
        counter = self.next_send if rec.kind == "send" else self.next_recv
        i = counter[key]
        counter[key] += 1
        queue = self.queues[key]
        while len(queue) <= i:
            queue.append(_Transfer())
        if rec.kind == "send":
            queue[i].send = op
        else:
            queue[i].recv = op
            if self.backend[(op.rank, rec.group)] in NOTIFYING:
                # a posted receive sends a notice to the sender on the same connection (gloo's
                # "ready to receive"): data the other way, which keeps that direction from idling
                back = self.channels[(gkey, dst, src)]
                back.sent = max(back.sent, op.issued or -math.inf)
        backend = self.backend[(op.rank, rec.group)]
        while self.resolved[key] < len(queue):
            tr = queue[self.resolved[key]]
            if tr.send is None or tr.recv is None or tr.send.issued is None or tr.recv.issued is None:
                break
            start = tr.send.issued
            if backend in NOTIFYING:
                start = max(start, tr.recv.issued + self.path(src, dst).latency)
            out, arrival = self._transfer(gkey, backend, src, dst, tr.send.rec.bytes, start)
            tr.send.done = arrival + self.path(src, dst).latency if backend in CONFIRMING else out
            if backend in CONFIRMING:  # the confirmation is data the other way: that direction does not idle
                back = self.channels[(gkey, dst, src)]
                back.sent = max(back.sent, arrival)
            tr.recv.done = max(arrival, tr.recv.issued)
            self.resolved[key] += 1

    def _collective(self, op: _Op) -> None:
        rec = op.rec
        gkey = self.group_key[(op.rank, rec.group)]
        seq_key = (op.rank, gkey)
        seq = self.coll_seq[seq_key]
        self.coll_seq[seq_key] += 1
        key = (gkey, seq)
        coll = self.collectives.get(key)
        if coll is None:
            backend = self.backend[(op.rank, rec.group)]
            members = list(gkey[0]) or sorted(self.dc_of)
            choice = self.algorithms.get(backend, {}).get(rec.op, DEFAULT_ALGORITHM)
            algorithm = choice(rec.bytes, len(members)) if callable(choice) else choice
            coll = self.collectives[key] = _Collective(members, algorithm, backend)
        coll.ops[op.rank] = op
        if len(coll.ops) < len(coll.members) or any(o.issued is None for o in coll.ops.values()):
            return
        if coll.algorithm == "exchange" or (coll.algorithm == "hierarchical" and self._one_per_site(coll)):
            self._exchange(gkey, coll)
            return
        start = max(o.issued for o in coll.ops.values())  # type: ignore[type-var]
        end = self._run_collective(gkey, coll, rec, start)
        for o in coll.ops.values():
            o.done = end

    def _one_per_site(self, coll: _Collective) -> bool:
        return len({self.dc_of[m] for m in coll.members}) == len(coll.members)

    def _exchange(self, gkey: tuple, coll: _Collective) -> None:
        """One round: every member sends its whole tensor to every other as soon as it
        issued the collective (its sends not waited for: atlas's detached copies), and is
        done once every other member's tensor reached it."""
        nbytes = max(o.rec.bytes for o in coll.ops.values())
        arrivals: dict[int, float] = {m: coll.ops[m].issued for m in coll.members}  # type: ignore[misc]
        for a in coll.members:
            for b in coll.members:
                if a != b:
                    arrived = self._transfer(gkey, coll.backend, a, b, nbytes, coll.ops[a].issued,  # type: ignore[arg-type]
                                             "exchange")[1]
                    arrivals[b] = max(arrivals[b], arrived)
        for m, o in coll.ops.items():
            o.done = arrivals[m]

    def _run_collective(self, gkey: tuple, coll: _Collective, rec: OpRecord, start: float) -> float:
        members, n = coll.members, len(coll.members)
        if n <= 1:
            return start
        nbytes = max(o.rec.bytes for o in coll.ops.values())
        t = start
        send = self._round_transfer
        if coll.algorithm == "ring":
            chunk = nbytes / n
            rounds = 2 * (n - 1) if rec.op.startswith("all_reduce") else n - 1
            if nbytes < 4 * n:  # fewer elements than ranks: gloo skips the empty chunks
                rounds = 1
            for _ in range(rounds):
                t = max(send(gkey, coll.backend, members[i], members[(i + 1) % n], chunk, t) for i in range(n))
            return t
        if coll.algorithm == "direct":
            root = rec.peer if rec.peer in members else members[0]
            if rec.op in ("reduce", "gather"):
                return max(send(gkey, coll.backend, m, root, nbytes, t) for m in members if m != root)
            return max(send(gkey, coll.backend, root, m, nbytes, t) for m in members if m != root)
        if coll.algorithm == "hierarchical" and rec.op.startswith("all_reduce"):
            return self._hierarchical(gkey, coll, nbytes, t)
        # exchange: every member sends its whole tensor to every other, at once
        return max(self._transfer(gkey, coll.backend, a, b, nbytes, t, "exchange")[1]
                   for a in members for b in members if a != b)

    def _round_transfer(self, gkey: tuple, backend: str, src: int, dst: int, nbytes: float, start: float) -> float:
        """Arrival of one round's transfer of a collective that starts at `start`: a
        rendezvous backend (gloo) sends once the receiver's notice, posted at the round's
        start, reached the sender."""
        if backend in NOTIFYING:
            start += self.path(dst, src).latency
            back = self.channels[(gkey, dst, src)]
            back.sent = max(back.sent, start)
        return self._transfer(gkey, backend, src, dst, nbytes, start)[1]

    def _hierarchical(self, gkey: tuple, coll: _Collective, nbytes: float, t: float) -> float:
        """atlas's two-level all-reduce (atlas_transport/torch/hierarchical.py): ranks by
        site (DC); with sites of L ranks, a reduce-scatter inside each site (1/L of the
        tensor to each local peer), each shard to the ranks holding it in the other
        sites (across the WAN, once per remote site), an all-gather inside each site.
        Unequal sites: one site over all ranks. Each phase ends when its slowest transfer does."""
        sites: dict[str, list[int]] = defaultdict(list)
        for m in coll.members:
            sites[self.dc_of[m]].append(m)
        groups = list(sites.values())
        if len({len(g) for g in groups}) != 1:
            groups = [list(coll.members)]
        local_n = len(groups[0])
        shard = nbytes / local_n
        be = coll.backend

        def phase(pairs: list[tuple[int, int]], size: float, start: float) -> float:
            return max([start, *(self._transfer(gkey, be, a, b, size, start)[1] for a, b in pairs)])

        local_pairs = [(a, b) for g in groups for a in g for b in g if a != b]
        t = phase(local_pairs, shard, t)
        cross = [(g1[j], g2[j]) for j in range(local_n) for g1 in groups for g2 in groups if g1 is not g2]
        t = phase(cross, shard, t)
        return phase(local_pairs, shard, t)

    # --- the run

    def run(self) -> dict[int, dict[tuple[int, str], float]]:
        """Every rank's step marks, as predicted times."""
        state = {}
        for r in self.profile.ranks:
            start, actions = rank_actions(r)
            state[r.rank] = [start, actions, 0]
        marks: dict[int, dict[tuple[int, str], float]] = {r: {} for r in state}
        progress = True
        while progress:
            progress = False
            for rank, st in state.items():
                clock, actions, i = st
                while i < len(actions):
                    kind, what = actions[i]
                    if kind == "c":
                        clock += what  # type: ignore[operator]
                    elif kind == "m":
                        marks[rank][what] = clock  # type: ignore[index]
                    elif kind == "i":
                        op = self.ops[(rank, what)]  # type: ignore[index]
                        op.issued = clock
                        if op.rec.kind == "collective":
                            self._collective(op)
                        else:
                            self._p2p(op)
                    else:  # wait
                        ops = [self.ops[(rank, j)] for j in what]  # type: ignore[union-attr]
                        if any(o.done is None for o in ops):
                            break
                        clock = max([clock, *(o.done for o in ops)])  # type: ignore[list-item]
                    i += 1
                if i != st[2]:
                    progress = True
                st[0], st[2] = clock, i
        stuck = [(rank, st) for rank, st in state.items() if st[2] < len(st[1])]
        if stuck:
            rank, st = stuck[0]
            waiting = st[1][st[2]][1]
            ops = [self.ops[(rank, j)].rec for j in waiting]  # type: ignore[union-attr]
            names = ", ".join(f"{o.op} #{o.id} (peer {o.peer})" for o in ops)
            raise PredictError(f"the replay stops at rank {rank}, waiting for {names} that no other rank's record "
                               "matches: the profile is incomplete (a rank ended early or was killed); profile a "
                               "launch that ran to its end")
        return marks


# --------------------------------------------------------------------------- calibration from the profile


def measured_windows(profile: ProgramProfile, topology: Topology, fit: bool = True,
                     transport: TransportCalibration | None = None) -> dict[frozenset[str], float]:
    """Per pair of DCs, one TCP flow's effective window as the profile shows it: each
    timed transfer on a one-stream connection (its arrival less the one-way delay, from
    when the connection could start it) gives the flow's rate; a rate under
    `WINDOW_LIMITED` of the link's goodput is window-limited, and gives the window
    (service = (bytes - window) / window round trips; the median over transfers).
    Striped channels (atlas) are left out: their rate shows the transport's own costs as
    much as the windows (the fit of round trips takes those). Pairs with no such transfer
    get the window `fit_windows` fits to the profiled step where it can (`fit` True), else
    are left out (the nominal window then)."""
    dc_of = {r.rank: r.dc for r in profile.ranks}
    sends: dict[tuple[int, int, int], list[OpRecord]] = defaultdict(list)
    recvs: dict[tuple[int, int, int], list[OpRecord]] = defaultdict(list)
    backend: dict[tuple[int, int], str] = {}
    for r in profile.ranks:
        for g in r.groups:
            backend[(r.rank, g.index)] = g.backend
        for op in sorted(r.ops, key=lambda o: o.t_issue):
            if op.kind == "send" and op.peer is not None:
                sends[(r.rank, op.peer, op.tag)].append(op)
            elif op.kind == "recv" and op.peer is not None:
                recvs[(op.peer, r.rank, op.tag)].append(op)
    env_streams = _env_streams(profile.env)
    rates: dict[frozenset[str], list[float]] = defaultdict(list)
    for key, ss in sends.items():
        src, dst, _ = key
        a, b = dc_of.get(src), dc_of.get(dst)
        if a is None or b is None or a == b:
            continue
        route = topology.route(a, b)
        latency = sum(topology.link(x, y).delay for x, y in zip(route, route[1:], strict=False))
        rtt = 2 * latency
        link = (topology.bottleneck_rate(a, b) or math.inf) * LINK_GOODPUT / 8
        be = backend.get((src, ss[0].group), "gloo")
        streams = 1 if be != "atlas" else (env_streams or (WAN_STREAMS if rtt >= LAN_STREAMS_RTT_S else 1))
        if streams > 1:
            continue  # a striped channel's rate shows the transport's own costs as much as the windows
        previous = -math.inf
        for s, rv in zip(ss, recvs.get(key, []), strict=False):
            blocked = [w for w in rv.waits if w[1] - w[0] > BLOCKED_S]
            arrival = blocked[-1][1] if blocked and s.bytes == rv.bytes else None
            if arrival is None:
                previous = -math.inf
                continue
            # its last byte left `service` after the connection could start it: once sent (and, for a
            # rendezvous backend, once the receive's notice arrived), and once the one before it had left
            began = max(s.t_issue, previous - latency, rv.t_issue + latency if be in NOTIFYING else -math.inf)
            service = arrival - latency - began
            idle = began - (previous - latency)
            previous = arrival
            if service <= 0 or s.bytes < 4 * MSS or idle > rtt + RTO_MIN_S:
                continue  # too small to time, or after an idle connection (slow start)
            rate = s.bytes / service
            if rate < WINDOW_LIMITED * link:  # window-limited: service = (bytes - window) / window round trips
                rates[frozenset((a, b))].append(s.bytes * rtt / (service + rtt) / streams)
    measured = {pair: statistics.median(v) for pair, v in rates.items() if v}
    return {**measured, **fit_windows(profile, measured, transport=transport)} if fit else measured


def fit_windows(profile: ProgramProfile, measured: Mapping[frozenset[str], float], warmup: int = 1,
                transport: TransportCalibration | None = None) -> dict[frozenset[str], float]:
    """The stream window of the WAN paths that only striped channels crossed in the
    profile (atlas: no one-stream transfer there to measure it), where the program's
    step on the profile's own network depends on it: the window, as a share of each
    path's nominal one (`WINDOW_FIT_RANGE`), that makes the replay there (no round trips
    added) give the measured step. Why: the nominal window (`stream_window`) is
    what this machine's kernel advertised (testbed_core/constants.py); kernels advertise
    the share of the buffer they measure, and a window assumed too small at the profiled RTT would otherwise be
    taken up by the fitted round trips (`fit_extra_rtts`), negative then, which scale
    with the RTT where the window no longer binds (results/program-predict/README.md).
    Empty when every WAN path has its measure or was crossed by a one-stream connection
    (a group of gloo, or of atlas on one stream: its transfers moved within the nominal
    window, else `measured_windows` timed it), when the step does
    not depend on the window there (small transfers: the round trips are fitted
    instead), or when no window in the range gives the measured step."""
    topo = profile.network
    dc_of = {r.rank: r.dc for r in profile.ranks}
    dcs = set(dc_of.values())
    one_stream: set[frozenset[str]] = set()
    env_streams = _env_streams(profile.env)
    for r in profile.ranks:
        for g in r.groups:
            if g.backend != "atlas" or (env_streams or g.streams or WAN_STREAMS) == 1:
                members = {dc_of[m] for m in (g.ranks or dc_of) if m in dc_of}
                one_stream.update(frozenset((a, b)) for a in members for b in members if a != b)
    missing = {frozenset((a, b)) for a in dcs for b in dcs if a != b} - set(measured) - one_stream
    target = ranks_mean_median(measured_steps(profile), warmup)
    if not missing or target is None:
        return {}
    nominal = {pair: stream_window(topo, a, b) for pair in missing for a, b in [sorted(pair)]}
    slow = any(topo.tcp_for(dc).slow_start_after_idle for dc in dcs)
    rule = _streams_rule(profile, None)
    algos = algorithms_for(profile.atlas_all_reduce)

    def step(share: float) -> float:
        windows = {**measured, **{pair: share * n for pair, n in nominal.items()}}
        paths, _ = _paths(topo, dcs, windows)
        marks = Replay(profile, paths, dc_of, rule, algos, slow, 0.0, transport).run()
        return ranks_mean_median(_replayed_steps(profile, marks), warmup) or 0.0

    lo, hi = WINDOW_FIT_RANGE
    slow_step, fast_step = step(lo), step(hi)
    if slow_step - fast_step < WINDOW_SENSITIVE * target or not fast_step <= target <= slow_step:
        return {}
    for _ in range(30):
        mid = (lo + hi) / 2
        if step(mid) > target:
            lo = mid
        else:
            hi = mid
    share = (lo + hi) / 2
    return {pair: share * n for pair, n in nominal.items()}


def _env_streams(env: Mapping[str, str]) -> int | None:
    text = env.get("ATLAS_STREAMS", "").strip()
    return int(text) if text.isdigit() and int(text) > 0 else None


# --------------------------------------------------------------------------- the prediction


def map_ranks(profile: ProgramProfile, topology: Topology, source: str, hosts: list[str] | None = None
              ) -> dict[int, str]:
    """Each rank's DC on `topology`: the host it ran on in the profile (or `hosts[rank]`),
    which `topology` must have. PredictError naming the rank and host otherwise."""
    from testbed_core.topology import TopologyError

    names: dict[str, str] = {}
    for dc in topology.dcs:
        for i, _ in enumerate(dc.hosts, start=1):
            names[f"{dc.name}-h{i}"] = dc.name
    ranks = sorted(profile.ranks, key=lambda r: r.rank)
    if hosts is not None and len(hosts) != len(ranks):
        raise PredictError(f"--hosts names {len(hosts)} hosts for a profile of {len(ranks)} ranks: give one host "
                           "per rank, in rank order")
    have = ", ".join(f"{dc.name} ({len(dc.hosts)} host{'s' if len(dc.hosts) != 1 else ''})" for dc in topology.dcs)
    total = sum(len(dc.hosts) for dc in topology.dcs)
    hosts_needed = len({r.host for r in ranks}) if hosts is None else len(set(hosts))
    if total < hosts_needed:
        raise PredictError(f"{source} has {total} host{'s' if total != 1 else ''} ({have}); the profile's "
                           f"{len(ranks)} ranks ran on {hosts_needed} hosts: too few hosts; give a topology with "
                           "at least as many, or map the ranks with --hosts")
    out = {}
    for r in ranks:
        host = hosts[r.rank] if hosts is not None else r.host
        if host not in names:
            if hosts is not None:
                raise PredictError(f"--hosts puts rank {r.rank} on {host}, but {source} has no host {host} (it has "
                                   f"{have}; hosts are named <dc>-h<k>, e.g. {next(iter(names))})")
            raise PredictError(f"rank {r.rank} ran on {host} in the profile, but {source} has no host {host} "
                               f"(it has {have}); give a topology with that host, or map the ranks with "
                               f"--hosts H0,H1,... in rank order")
        out[r.rank] = names[host]
    try:
        for a in set(out.values()):
            for b in set(out.values()):
                if a != b:
                    topology.route(a, b)
    except (TopologyError, KeyError, ValueError) as exc:
        raise PredictError(f"{source}: no WAN route between the ranks' DCs: {exc}") from None
    return out


def retarget(topology: Topology, rtt_s: float | None = None, bandwidth_bps: float | None = None) -> Topology:
    """`topology` with every WAN link at `rtt_s` (one-way delay rtt/2) and/or `bandwidth_bps`.
    Each link is checked as a topology file's would be (delay and rate within the ranges a
    link takes), but not against what the emulation's delay line can hold in flight: the
    result is predicted, never emulated (a 10 Tbit/s link at 200 ms is a fair question)."""
    if rtt_s is None and bandwidth_bps is None:
        return topology
    if rtt_s is not None and not 0 < rtt_s <= 2 * MAX_DELAY_S:
        raise TopologyError(f"RTT {rtt_s * 1e3:g} ms is out of range for a WAN link: allowed above 0 up to "
                            f"{2 * MAX_DELAY_S:g} s ({MAX_DELAY_S:g} s one way; satellite paths are about 0.6 s)")
    if bandwidth_bps is not None and not MIN_RATE_BPS <= bandwidth_bps <= MAX_RATE_BPS:
        raise TopologyError(f"bandwidth {format_rate(bandwidth_bps)}/s is out of range for a WAN link: allowed "
                            f"{format_rate(MIN_RATE_BPS)}/s to {format_rate(MAX_RATE_BPS)}/s")
    links = []
    for i, link in enumerate(topology.wan):
        data = link.model_dump()
        if rtt_s is not None:
            data["delay"] = rtt_s / 2
            data["jitter"] = min(data.get("jitter") or 0.0, rtt_s / 2)
        if bandwidth_bps is not None:
            data["rate"] = bandwidth_bps
        data["changes"] = []
        data["trace"] = None
        try:
            links.append(type(link).model_validate(data))
        except ValidationError as exc:
            raise TopologyError(format_validation_error(f"{topology.name} retargeted", exc, "topology",
                                                        prefix=f"wan.{i}")) from None
    return topology.model_copy(update={"wan": links})


def _paths(topology: Topology, dcs: set[str], windows: Mapping[frozenset[str], float],
           fitted: frozenset[frozenset[str]] = frozenset()
           ) -> tuple[dict[tuple[str, str], _Path], list[PathFigures]]:
    out: dict[tuple[str, str], _Path] = {}
    figures: list[PathFigures] = []
    for a in dcs:
        for b in dcs:
            if a == b:
                lan = next(dc for dc in topology.dcs if dc.name == a).lan_rate
                out[(a, b)] = _Path(0.0, 0.0, lan * LINK_GOODPUT / 8, math.inf, math.inf, True)
                continue
            route = topology.route(a, b)
            links = [topology.link(x, y) for x, y in zip(route, route[1:], strict=False)]
            latency = sum(link.delay for link in links)
            rtt = 2 * latency
            link_Bps = min(link.rate for link in links) * LINK_GOODPUT / 8
            nominal = min(topology.tcp_for(a).wmem_max, topology.tcp_for(b).rmem_max / 2)
            window = windows.get(frozenset((a, b)))
            rto = rtt + RTO_MIN_S
            out[(a, b)] = _Path(latency, rtt, link_Bps, window or nominal, rto, False)
            if a < b:
                figures.append(PathFigures(dcs=(a, b), one_way_latency_s=latency, link_goodput_bps=link_Bps * 8,
                                           window_bytes=window or nominal,
                                           window_source=("fitted" if frozenset((a, b)) in fitted else "profile")
                                           if window else "nominal", rto_s=rto))
    return out, figures


def _median_after(values: list[float], warmup: int) -> float | None:
    kept = values[warmup:] or values
    return statistics.median(kept) if kept else None


def _streams_rule(profile: ProgramProfile, streams: int | None) -> Callable[[str, _Path], int]:
    env_streams = streams or _env_streams(profile.env)
    group_streams = {g.backend: g.streams for r in profile.ranks for g in r.groups if g.streams}

    def streams_of(backend: str, path: _Path) -> int:
        if backend != "atlas":
            return 1
        n = env_streams or group_streams.get("atlas")
        return n or (1 if path.lan or path.rtt < LAN_STREAMS_RTT_S else WAN_STREAMS)

    return streams_of


def _rank0_median(profile: ProgramProfile, marks: Mapping[int, Mapping[tuple[int, str], float]],
                  warmup: int) -> float | None:
    r = min(profile.ranks, key=lambda r: r.rank)
    m = marks[r.rank]
    steps = [m[(s.step, "end")] - m[(s.step, "start")] for s in r.steps
             if (s.step, "end") in m and (s.step, "start") in m]
    return _median_after(steps, warmup)


def ranks_mean_median(per_rank: Mapping[int, Mapping[int, float]], warmup: int) -> float | None:
    """The median after `warmup` steps of each step's mean over the ranks (steps every rank timed).
    Two ranks meeting in one exchange per step time it as c + L + d and c + L - d, d the lead of
    one over the other, which nothing in the exchange sets (it drifts with the ranks' compute):
    one rank's median is anywhere from c to c + 2L, the ranks' mean is c + L."""
    common = sorted(set.intersection(*(set(v) for v in per_rank.values()))) if per_rank else []
    means = [statistics.fmean(per_rank[r][k] for r in per_rank) for k in common]
    return _median_after(means, warmup)


def _replayed_steps(profile: ProgramProfile, marks: Mapping[int, Mapping[tuple[int, str], float]]
                    ) -> dict[int, dict[int, float]]:
    return {r.rank: {s.step: marks[r.rank][(s.step, "end")] - marks[r.rank][(s.step, "start")] for s in r.steps
                     if (s.step, "end") in marks[r.rank] and (s.step, "start") in marks[r.rank]}
            for r in profile.ranks if r.steps}


def measured_steps(profile: ProgramProfile) -> dict[int, dict[int, float]]:
    """Each rank's step_s lines by step, as profiled."""
    return {r.rank: {s.step: s.step_s for s in r.steps} for r in profile.ranks if r.steps}


def fit_extra_rtts(profile: ProgramProfile, windows: Mapping[frozenset[str], float], streams: int | None,
                   algorithms: Mapping[str, Mapping[str, Algorithm]] | None, warmup: int,
                   transport: TransportCalibration | None = None) -> float:
    """The round trips each WAN transfer takes beyond the model (a protocol's own
    exchanges, a restart the model makes too slow or too fast), fitted so that the
    replay on the profile's own network gives rank 0's measured median step: a number
    in [EXTRA_RTTS_MIN, EXTRA_RTTS_MAX] that then scales with the target's RTT."""
    topo = profile.network
    dc_of = {r.rank: r.dc for r in profile.ranks}
    paths, _ = _paths(topo, set(dc_of.values()), windows)
    if all(p.lan for p in paths.values()):
        return 0.0
    measured = ranks_mean_median(measured_steps(profile), warmup)
    if measured is None:
        return 0.0
    slow = any(topo.tcp_for(dc).slow_start_after_idle for dc in set(dc_of.values()))
    rule = _streams_rule(profile, streams)
    algos = algorithms or algorithms_for(profile.atlas_all_reduce)

    def error(x: float) -> float:
        marks = Replay(profile, paths, dc_of, rule, algos, slow, x, transport).run()
        got = ranks_mean_median(_replayed_steps(profile, marks), warmup)
        return (got or 0.0) - measured

    lo, hi = EXTRA_RTTS_MIN, EXTRA_RTTS_MAX
    if error(lo) >= 0:
        return lo
    if error(hi) <= 0:
        return hi
    for _ in range(30):
        mid = (lo + hi) / 2
        if error(mid) < 0:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def predict(profile: ProgramProfile, topology: Topology, *, label: str = "", warmup: int = 1,
            streams: int | None = None, hosts: list[str] | None = None, source: str = "the topology",
            algorithms: Mapping[str, Mapping[str, Algorithm]] | None = None,
            windows: Mapping[frozenset[str], float] | None = None,
            extra_rtts: float | None = None, transport: TransportCalibration | None = None) -> ProgramPrediction:
    """The profiled program replayed on `topology` (see the module docstring);
    `extra_rtts` None: fitted on the profile's own network (`fit_extra_rtts`);
    `transport`: the atlas transport's measured cost per transfer (a floor and an
    overhead on each of its WAN transfers, in the fits too), None: the network alone."""
    if not any(r.steps for r in profile.ranks):
        raise PredictError("the profile has no step lines: the program printed no {\"step\": k, \"step_s\": s} "
                           "JSON lines, so there is no step to predict")
    dc_of = map_ranks(profile, topology, source, hosts)
    fitted: frozenset[frozenset[str]] = frozenset()
    if windows is None:
        measured = measured_windows(profile, profile.network, fit=False)
        fits = fit_windows(profile, measured, transport=transport)
        windows, fitted = {**measured, **fits}, frozenset(fits)
    paths, figures = _paths(topology, set(dc_of.values()), windows, fitted)
    streams_of = _streams_rule(profile, streams)
    slow_start = any(topology.tcp_for(dc).slow_start_after_idle for dc in set(dc_of.values()))
    algos = algorithms or algorithms_for(profile.atlas_all_reduce)
    if extra_rtts is None:
        extra_rtts = fit_extra_rtts(profile, windows, streams, algos, warmup, transport)

    def replay_on(topo: Topology, paths_: Mapping[tuple[str, str], _Path], dcs: Mapping[int, str], slow: bool,
                  extra: float) -> dict[int, dict[tuple[int, str], float]]:
        return Replay(profile, paths_, dcs, streams_of, algos, slow, extra, transport).run()

    marks = replay_on(topology, paths, dc_of, slow_start, extra_rtts)
    ranks = []
    for r in sorted(profile.ranks, key=lambda r: r.rank):
        m = marks[r.rank]
        steps = [m[(s.step, "end")] - m[(s.step, "start")] for s in r.steps
                 if (s.step, "end") in m and (s.step, "start") in m]
        ranks.append(StepPrediction(rank=r.rank, steps=steps, median_s=_median_after(steps, warmup),
                                    measured_median_s=_median_after([s.step_s for s in r.steps], warmup)))
    wan = {f"{link.between[0]}-{link.between[1]}": link for link in topology.wan}
    wan_paths = [p for p in paths.values() if not p.lan]
    return ProgramPrediction(
        label=label or topology.name, topology=topology.name,
        rtt_s={k: 2 * v.delay for k, v in wan.items()}, bandwidth_bps={k: v.rate for k, v in wan.items()},
        seconds_per_step=ranks[0].median_s if ranks else None, ranks=ranks, paths=figures,
        ranks_mean_s_per_step=ranks_mean_median(_replayed_steps(profile, marks), warmup),
        measured_ranks_mean_s_per_step=ranks_mean_median(measured_steps(profile), warmup),
        streams={"gloo": 1, "atlas": streams_of("atlas", wan_paths[0]) if wan_paths else streams_of("atlas", _LAN)},
        extra_rtts=extra_rtts, transport_costs=list(transport.costs) if transport is not None else None)


_LAN = _Path(0.0, 0.0, math.inf, math.inf, math.inf, True)
