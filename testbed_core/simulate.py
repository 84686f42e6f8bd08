"""Discrete-event simulation of pipeline schedules over a network of shared links.

It runs the op lists of every (pipeline, rank) worker with given compute times; each
boundary transfer travels a path of link resources with a one-way latency and a
per-transfer rate cap (streams x window/RTT). The last byte arrives
``latency + bytes / rate`` after the send, where the rate comes from a fluid model:

* ``shared`` resource: concurrent transfers split it max-min fairly (each also held
  to its own cap), re-computed whenever a transfer starts or ends, as TCP flows
  roughly do;
* ``exclusive`` resource: one transfer at a time, at full rate; in first-come order,
  or in a planned order (a token list, as Atlas's temporal sharing enforces). With a
  ``hold_factor`` above 1 the next transfer gets it only that many times the last
  one's time on the wire after the last one began (a planned transfer's token passes
  at the end of its hold), while the last one's bytes arrive as they left.

A resource with ``busy_bps`` (a shaped WAN link direction) also caps each transfer that
starts while it is busy, another transfer on it or its last one ended less than
``refill_s`` before (the shaper's token bucket not yet full again), at ``busy_bps`` (the
link's sustained goodput): only a transfer onto an idle link gets the bucket's burst, as
the calibration's isolated tensors did.

A crowded ``shared`` resource with ``split_shares`` divides its crowded total unequally
while exactly two transfers are on it: one of them, drawn at random, moves at a share
drawn from ``split_shares`` and the other at the rest, until one leaves. Two TCP channels
that collide do not finish together: which one gets ahead, and by how much, is a draw
(the calibration's collision rounds), and the one ahead starts its pipeline's next step
first. The draws come from ``SimSpec.seed``: one seed, one iteration as it may run
(testbed_core/planning/collisions.py averages several).

A channel (an ``exclusive`` resource) may carry a tensor handed over while the one before
it was still leaving (a backlog: GPipe's forwards, 1F1B's warm-up) at ``backlog_bps``
rather than its capacity, and one handed over before the one before it was acknowledged
(a round trip after it began to leave) with its path's ``backlog_window_bits``
unacknowledged: the streams never run dry, so their windows grow to what the sockets
allow and the tensors follow each other at what the link and those windows allow, where
a tensor that finds the channel idle takes the time one tensor alone was measured to take.

One TCP stream (``Path.fluid_window``) frees its window bit by bit instead: a transfer
sends what the window has room for at once, then each bit as the acknowledgement of the
bit a window before it comes back, a round trip after that one left (the channel keeps
when its bits left: ``_Departures``), so a burst of tensors lands a window a round trip.

With ``rendezvous`` (gloo's TCP pairs), a send's bytes leave only once the receiver
has posted its receive and its notice has reached the sender: the notice is a message
on the receiver's own connection back to the sender (the opposite channel of the same
boundary), queued behind the data the receiver already handed to it (head-of-line
blocking), then one latency on the wire. atlas_transport sends at once and the
receiver buffers.

Resources are one direction of a link (WAN links are full duplex). The result holds
per-device timelines, per-transfer spans and the makespan: the predicted iteration
time, and (with zero delay) the textbook bubble fraction. Pure computation, no I/O.
"""

from __future__ import annotations

import heapq
import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal, NamedTuple

from testbed_core.schedules import Op, Schedule

INF = math.inf


class SimulationError(RuntimeError):
    """The simulated schedule cannot finish (e.g. a planned order that contradicts the
    data dependencies)."""


@dataclass(frozen=True, order=True)
class TransferKey:
    pipeline: int
    boundary: int  # between virtual stages boundary and boundary+1
    mb: int
    direction: Literal["fwd", "bwd"]

    def __str__(self) -> str:
        return f"p{self.pipeline}.b{self.boundary}.{self.direction}{self.mb}"

    def to_json(self) -> dict:
        return {"pipeline": self.pipeline, "boundary": self.boundary, "mb": self.mb, "direction": self.direction}

    @classmethod
    def for_op(cls, pipeline: int, op: Op) -> TransferKey:
        return cls(pipeline, op.boundary(), op.mb, op.direction())  # type: ignore[arg-type]


@dataclass(frozen=True)
class Path:
    """How one boundary's tensors travel: through `resources` (ids of link directions),
    with a one-way latency, each transfer capped at `cap_bps`. `window_bits`: what the
    channel's TCP windows (streams x window) let it have unacknowledged; a transfer that
    follows another on the same channel before that one's last window was acknowledged
    (a round trip, 2 x latency, after that window began to leave) waits for it to free
    (INF: no such wait, e.g. where the rate itself is the window model's window / RTT)."""

    resources: tuple[str, ...] = ()
    latency_s: float = 0.0
    cap_bps: float = INF
    window_bits: float = INF
    backlog_window_bits: float | None = None  # a backlogged transfer's window (None: `window_bits`)
    # one TCP stream: its window frees bit by bit as acknowledgements come back, so a
    # transfer the window holds back sends what it has room for at once and each further
    # bit as the acknowledgement of the bit a window before it comes back, a round trip
    # after that one left (`_Sim._clock`); False: whole transfers wait for the room they
    # need (a multi-stream channel hands its streams whole chunks, and a small tensor
    # rides a few of them: testbed_core/planning/network.py `warm_lanes`)
    fluid_window: bool = False
    # a channel whose hosts also carry other channels (a boundary inside a DC whose end
    # ranks also send and receive over the WAN): a transfer that starts while a transfer
    # is on any of `loaded_by` moves at most at `loaded_bps` (the hosts' transport loops
    # share their cores with those channels; None: no such cap)
    loaded_by: tuple[str, ...] = ()
    loaded_bps: float | None = None


@dataclass(frozen=True)
class Resource:
    capacity_bps: float
    policy: Literal["shared", "exclusive"] = "shared"
    order: tuple[TransferKey, ...] | None = None  # exclusive only: planned order
    # shared only: the total while two or more transfers are on it (None: capacity_bps).
    # Colliding multi-stream TCP channels lose packets and recover; measured, their
    # total falls well short of what one channel alone gets from the link.
    crowded_bps: float | None = None
    # exclusive only: a transfer holds the resource this many times its time on the
    # wire (>= 1; a temporal plan's token passes after the transfer's planned hold,
    # while its bytes arrive after their time on the wire: the next holder waits, the
    # receiver does not)
    hold_factor: float = 1.0
    # a transfer that starts while the resource is busy (another on it, or the last one
    # ended less than `refill_s` before) moves at most at this rate (None: no such cap)
    busy_bps: float | None = None
    refill_s: float = 0.0
    # exclusive only: the rate of a transfer handed over while the one before it on this
    # resource was still leaving (None: `capacity_bps` for every transfer)
    backlog_bps: float | None = None
    # shared with crowded_bps only: the favoured transfer's share of the crowded total
    # while exactly two are on it, each a draw (each >= 0.5; empty: an even split)
    split_shares: tuple[float, ...] = ()

    def capacity(self, users: int) -> float:
        return self.crowded_bps if users >= 2 and self.crowded_bps is not None else self.capacity_bps

    @property
    def splits_collisions(self) -> bool:
        """Whether two transfers colliding here split its crowded total as drawn
        (`split_shares` on a shared resource with a crowded total)."""
        return bool(self.split_shares) and self.policy == "shared" and self.crowded_bps is not None


@dataclass
class SimSpec:
    schedule: Schedule
    pipelines: int
    forward_s: list[float]  # per virtual stage, per micro-batch
    backward_s: list[float]
    bytes_fwd: list[float]  # per boundary, activations of one micro-batch
    bytes_bwd: list[float]  # per boundary, gradients
    paths: dict[tuple[int, int, str], Path] = field(default_factory=dict)  # (pipeline, boundary, dir)
    resources: dict[str, Resource] = field(default_factory=dict)
    offsets: list[float] | None = None  # start delay of each pipeline
    compute_fn: Callable[[int, int, str, int], float] | None = None  # (pipeline, stage, kind, mb)
    # gloo: a send waits for the receiver's notice (queued behind its data on the way back)
    rendezvous: bool = False
    # each transfer's time on its path as a factor of what its bytes and rate give (None:
    # 1): the planner's spread of lossy channels (testbed_core/planning/lossy.py
    # `spread_makespan`, which keeps only the makespan: the spans carry the scaled bytes)
    transfer_scale: Callable[[TransferKey], float] | None = None
    # the draws of the resources' `split_shares` (who gets ahead in a collision, by how much)
    seed: int = 0

    def path(self, key: TransferKey) -> Path:
        return self.paths.get((key.pipeline, key.boundary, key.direction), Path())

    def nbytes(self, key: TransferKey) -> float:
        return (self.bytes_fwd if key.direction == "fwd" else self.bytes_bwd)[key.boundary]

    def compute_time(self, pipeline: int, op: Op) -> float:
        if self.compute_fn is not None:
            return self.compute_fn(pipeline, op.stage, op.kind, op.mb)
        return (self.forward_s if op.kind == "F" else self.backward_s)[op.stage]


@dataclass(frozen=True)
class ComputeSpan:
    pipeline: int
    rank: int
    stage: int
    kind: str
    mb: int
    start: float
    end: float


@dataclass(frozen=True)
class TransferSpan:
    key: TransferKey
    ready: float  # when the sender handed it over
    start: float  # first byte on the wire
    end: float  # last byte on the wire
    arrival: float  # last byte at the receiver
    nbytes: float
    resources: tuple[str, ...]
    released: float | None = None  # its exclusive resources handed on (None: at `end`; `Resource.hold_factor`)

    @property
    def held_until(self) -> float:
        """When the next transfer may take its exclusive resources."""
        return self.end if self.released is None else self.released


@dataclass
class SimResult:
    makespan: float
    compute: list[ComputeSpan]
    transfers: list[TransferSpan]
    pipelines: int
    ranks: int
    # where this is one of several draws of the links' collisions (testbed_core/planning/
    # collisions.py `drawn`): every draw's makespan, this one's among them
    draws_s: tuple[float, ...] = ()

    def spans(self, pipeline: int, rank: int) -> list[ComputeSpan]:
        return [c for c in self.compute if c.pipeline == pipeline and c.rank == rank]

    def busy(self, pipeline: int, rank: int) -> float:
        return sum(c.end - c.start for c in self.spans(pipeline, rank))

    def bubble_fraction(self) -> float:
        """Mean over devices of idle time / iteration time."""
        if self.makespan <= 0:
            return 0.0
        fr = [1 - self.busy(d, r) / self.makespan for d in range(self.pipelines) for r in range(self.ranks)]
        return sum(fr) / len(fr)

    def idle_slots(self, pipeline: int, rank: int, min_s: float = 0.0) -> list[tuple[float, float]]:
        gaps, cursor = [], 0.0
        for c in sorted(self.spans(pipeline, rank), key=lambda c: c.start):
            if c.start - cursor > min_s:
                gaps.append((cursor, c.start))
            cursor = max(cursor, c.end)
        if self.makespan - cursor > min_s:
            gaps.append((cursor, self.makespan))
        return gaps

    def order_on(self, resource: str) -> list[TransferKey]:
        """Transfers that used `resource`, in the order they started."""
        spans = sorted((t for t in self.transfers if resource in t.resources), key=lambda t: (t.start, t.key))
        return [t.key for t in spans]

    def transfer(self, key: TransferKey) -> TransferSpan:
        for t in self.transfers:
            if t.key == key:
                return t
        raise KeyError(str(key))


class _Clock(NamedTuple):
    """Where an ACK-clocked transfer stands against its stream's window (`_Sim._clock`)."""

    before: float  # bits of its channel that left before it
    room: float  # its bits the window had room for at once
    window: float  # the stream's window, bits
    rtt: float
    last: float  # when its window's last bit may leave: the bit a window before acknowledged


@dataclass
class _Flow:
    key: TransferKey
    path: Path
    bits: float
    left: float
    ready: float
    start: float
    rate: float = 0.0
    notice: bool = False  # rendezvous: the receiver's notice for `key`, not its bytes
    hold: float = 0.0  # no bytes move before this: the channel's window is still full
    cap: float = INF  # it started on a busy link: at most that link's sustained rate (Resource.busy_bps)
    backlogged: bool = False  # handed over while the transfer before it on its channel was leaving
    unacked: bool = False  # handed over before the first window of the one before it was acknowledged
    clock: _Clock | None = None  # an ACK-clocked stream held by its window (`_Sim._clock`)
    # its phases: `pause_left` (its room sent, it waits for `resume`), then `clocked_left`
    # (its bits a window before were acknowledged at the pace they left: none beyond the
    # window's last before `clock`'s last, then its own pace); None: passed
    pause_left: float | None = None
    resume: float = 0.0
    clocked_left: float | None = None
    free_cap: float = INF  # its cap outside the clocked phase (its link's, `Resource.busy_bps`)
    paused_at: float | None = None  # when its room had left
    clocked_at: float | None = None  # when its window's bits had left

    @property
    def floor(self) -> float:
        """The bits left at which its next phase begins (0: its end)."""
        if self.pause_left is not None:
            return self.pause_left
        return self.clocked_left if self.clocked_left is not None else 0.0

    @property
    def window_bits(self) -> float:
        w = self.path.backlog_window_bits
        return w if self.unacked and w is not None else self.path.window_bits

    @property
    def ident(self) -> tuple[TransferKey, bool]:
        return self.key, self.notice


def max_min_rates(flows: list[tuple[float, tuple[str, ...]]], capacity: dict[str, float]) -> list[float]:
    """Max-min fair rates of flows (cap, resources) over resource capacities
    (progressive filling)."""
    rates = [0.0] * len(flows)
    left = {r: capacity[r] for f in flows for r in f[1]}
    todo = set(range(len(flows)))
    while todo:
        level = INF
        for r, cap in left.items():
            n = sum(1 for i in todo if r in flows[i][1])
            if n:
                level = min(level, cap / n)
        level = min([level] + [flows[i][0] for i in todo])
        if level == INF:
            for i in todo:
                rates[i] = INF
            return rates
        tol = level * 1e-12
        frozen = {i for i in todo if flows[i][0] <= level + tol}
        for r, cap in left.items():
            users = [i for i in todo if r in flows[i][1]]
            if users and cap / len(users) <= level + tol:
                frozen.update(users)
        for i in frozen:
            rates[i] = level
            for r in flows[i][1]:
                left[r] = max(0.0, left[r] - level)
        todo -= frozen
    return rates


class _Departures:
    """When each bit of one channel left, in the order they left (its transfers go one
    after another): pieces (first left, last left, bits before, bits after), each bit of a
    piece taken to leave at an even pace between its two times. A TCP stream's bit is
    acknowledged a round trip after it left, and the stream sends bit x only once bit
    x - window is acknowledged."""

    def __init__(self) -> None:
        self.pieces: list[tuple[float, float, float, float]] = []

    @property
    def bits(self) -> float:
        """How many bits have left (and been recorded) so far."""
        return self.pieces[-1][3] if self.pieces else 0.0

    def add(self, first: float, last: float, bits: float) -> None:
        if bits > 0:
            x = self.bits
            self.pieces.append((first, max(first, last), x, x + bits))

    def clocked(self, lo: float, hi: float, window: float, rtt: float,
                not_before: float) -> list[tuple[float, float, float]]:
        """When bits `lo` to `hi` (beyond those recorded) leave where each follows the
        acknowledgement of the bit `window` before it, a round trip after that one left
        (none before `not_before`): (first left, last left, bits) per piece, in order."""
        out = []
        for t0, t1, x0, x1 in self.pieces:
            a, b = max(x0, lo - window), min(x1, hi - window)
            if b <= a:
                continue
            ta = t0 + (t1 - t0) * (a - x0) / (x1 - x0)
            tb = t0 + (t1 - t0) * (b - x0) / (x1 - x0)
            out.append((max(ta + rtt, not_before), max(tb + rtt, not_before), b - a))
        return out

    def left_at(self, x: float) -> float:
        """When bit `x` left (the piece it ends where two meet; -INF: before the first
        recorded bit, none to wait for)."""
        if x <= 0 or not self.pieces:
            return -INF
        for t0, t1, x0, x1 in reversed(self.pieces):
            if x > x0:
                return t0 + (t1 - t0) * min(1.0, (x - x0) / (x1 - x0))
        return -INF

    def left_by(self, t: float) -> float:
        """How many bits had left by time `t`."""
        for t0, t1, x0, x1 in reversed(self.pieces):
            if t >= t0:
                return x1 if t >= t1 else x0 + (x1 - x0) * (t - t0) / (t1 - t0)
        return 0.0


class _Sim:
    def __init__(self, spec: SimSpec) -> None:
        self.spec = spec
        self.s = spec.schedule
        self.events: list[tuple[float, int, str, object]] = []
        self.seq = 0
        p = self.s.ranks
        self.workers = [(d, r) for d in range(spec.pipelines) for r in range(p)]
        self.pos = {w: 0 for w in self.workers}
        self.busy_until: dict[tuple[int, int], bool] = {w: False for w in self.workers}
        self.started = {w: False for w in self.workers}
        self.waiting: dict[TransferKey, tuple[int, int]] = {}
        self.arrived: set[TransferKey] = set()
        self.recv_posted: dict[TransferKey, float] = {}  # rendezvous: when each receive was posted
        self.noticed: dict[TransferKey, float] = {}  # rendezvous: when its notice reached the sender
        self.held: dict[TransferKey, float] = {}  # rendezvous: sends waiting for their notice
        self.compute: list[ComputeSpan] = []
        self.transfers: list[TransferSpan] = []
        self.active: dict[tuple[TransferKey, bool], _Flow] = {}
        self.pending: list[tuple[int, _Flow]] = []  # (ready seq, flow) waiting for exclusive resources
        self.holder: dict[str, tuple[TransferKey, bool]] = {}
        self.token = {name: 0 for name in spec.resources}
        self.net_time = 0.0
        self.net_version = 0
        # per channel: (when its last window is acknowledged, bits of it) of finished transfers
        self.unacked: dict[tuple[int, int, str], list[tuple[float, float]]] = {}
        # per ACK-clocked channel: when its bits left (`_Departures`)
        self.departed: dict[tuple[int, int, str], _Departures] = {}
        self.last_end: dict[str, float] = {}  # per resource: when its last transfer's last byte left
        self.last_start: dict[str, float] = {}  # per backlog resource: when its last transfer's first byte left
        self.rng = random.Random(spec.seed)
        # per split resource: the two transfers on it, the favoured one and its share
        self.splits: dict[str, tuple[frozenset[tuple[TransferKey, bool]], tuple[TransferKey, bool], float]] = {}
        self.split_links = [name for name, r in spec.resources.items() if r.splits_collisions]
        for name in {r for path in spec.paths.values() for r in path.resources}:
            if name not in spec.resources:
                raise SimulationError(f"path uses resource {name!r}, which is not defined")

    def push(self, t: float, kind: str, payload: object) -> None:
        self.seq += 1
        heapq.heappush(self.events, (t, self.seq, kind, payload))

    # -------------------------------------------------------------- workers

    def advance(self, w: tuple[int, int], t: float) -> None:
        d, r = w
        ops = self.s.ops[r]
        while self.pos[w] < len(ops) and not self.busy_until[w]:
            op = ops[self.pos[w]]
            if op.is_compute:
                dur = self.spec.compute_time(d, op)
                self.compute.append(ComputeSpan(d, r, op.stage, op.kind, op.mb, t, t + dur))
                self.busy_until[w] = True
                self.pos[w] += 1
                self.push(t + dur, "done", w)
                return
            key = TransferKey.for_op(d, op)
            if op.kind.startswith("SEND"):
                self.send(key, t)
            elif key not in self.arrived:
                if self.spec.rendezvous and key not in self.recv_posted:
                    self.recv_posted[key] = t
                    self.notify(key, t)
                self.waiting[key] = w
                return
            self.pos[w] += 1

    # -------------------------------------------------------------- network

    def send(self, key: TransferKey, t: float) -> None:
        if self.spec.rendezvous and key not in self.noticed:
            self.held[key] = t  # released by its notice
            return
        self.start_send(key, t, t)

    def notify(self, key: TransferKey, t: float) -> None:
        """Rendezvous: the receiver of `key` posted its receive at `t`; its notice waits
        on the opposite channel behind what is queued there, then crosses the path."""
        back = TransferKey(key.pipeline, key.boundary, key.mb, "bwd" if key.direction == "fwd" else "fwd")
        path = self.spec.path(back)
        queue = tuple(r for r in path.resources if self._exclusive(r))
        if not queue:
            self.push(t + path.latency_s, "notice", key)
            return
        self.pending.append((self.seq, _Flow(key, Path(queue, path.latency_s), 0.0, 0.0, t, t, notice=True)))
        self.seq += 1
        self.try_start(t)

    def start_send(self, key: TransferKey, ready: float, t: float) -> None:
        """The bytes of `key` (handed over at `ready`) leave at `t`."""
        path = self.spec.path(key)
        bits = self.spec.nbytes(key) * 8
        if self.spec.transfer_scale is not None:
            bits *= self.spec.transfer_scale(key)
        if bits <= 0 or (not path.resources and path.cap_bps == INF):
            self.transfers.append(TransferSpan(key, ready, t, t, t + path.latency_s, bits / 8, path.resources))
            self.push(t + path.latency_s, "arrive", key)
            return
        self.pending.append((self.seq, _Flow(key, path, bits, bits, ready, t)))
        self.seq += 1
        self.try_start(t)

    def _exclusive(self, name: str) -> bool:
        return self.spec.resources[name].policy == "exclusive"

    def try_start(self, t: float) -> None:
        started = False
        wanted: set[str] = set()  # FIFO resources an earlier pending transfer waits for
        keep = []
        for seq, flow in self.pending:
            ok = True
            for name in flow.path.resources:
                if not self._exclusive(name):
                    continue
                res = self.spec.resources[name]
                if name in self.holder:
                    ok = False
                elif res.order is not None and not flow.notice:
                    i = self.token[name]
                    if i >= len(res.order) or res.order[i] != flow.key:
                        ok = False
                elif name in wanted:
                    ok = False
            if ok:
                if not started:
                    self.progress(t)
                started = True
                queued = [n for n in flow.path.resources
                          if self._exclusive(n) and self.spec.resources[n].backlog_bps is not None]
                flow.backlogged = not flow.notice and any(flow.ready < self.last_end.get(n, -INF) for n in queued)
                flow.unacked = not flow.notice and any(
                    flow.ready < self.last_start.get(n, -INF) + 2 * flow.path.latency_s for n in queued)
                flow.start, window_cap = self._window_free(flow, t)
                flow.hold = flow.start
                flow.cap = min(self._busy_cap(flow), window_cap)
                for n in queued:
                    self.last_start[n] = flow.start
                for name in flow.path.resources:
                    if self._exclusive(name):
                        self.holder[name] = flow.ident
                        if not flow.notice:
                            self.token[name] += 1
                self.active[flow.ident] = flow
            else:
                keep.append((seq, flow))
                wanted.update(n for n in flow.path.resources if self._exclusive(n) and self.spec.resources[n].order is None)
        self.pending = keep
        if started:
            self.reschedule(t)

    def _clocked(self, path: Path) -> bool:
        """Whether transfers on `path` follow their stream's acknowledgements bit by bit
        (`Path.fluid_window` with a finite window and a latency, over shared links: a
        planned link hands whole transfers its token, which keep whole-window waits)."""
        return path.fluid_window and path.window_bits != INF and path.latency_s > 0 \
            and not any(self._exclusive(n) for n in path.resources[1:])

    def _window_free(self, flow: _Flow, t: float) -> tuple[float, float]:
        """When `flow`'s first bytes may leave, and the rate its window holds it to: `t`,
        or later where earlier transfers on its channel still hold more of the window than
        leaves room for it (its first window: all of it, up to the channel's window), at
        no cap. An ACK-clocked stream (`_clocked`) is `_clock`'s."""
        window = flow.window_bits
        if flow.notice or window == INF:
            return t, INF
        key = (flow.key.pipeline, flow.key.boundary, flow.key.direction)
        if self._clocked(flow.path):
            return self._clock(flow, self.departed.setdefault(key, _Departures()), window, t)
        acks = sorted(a for a in self.unacked.get(key, []) if a[0] > t)
        self.unacked[key] = acks
        room = window - min(flow.bits, window)
        held = sum(bits for _, bits in acks)
        at = t
        for ack, bits in acks:
            if held <= room + 1e-9:
                break
            held -= bits
            at = ack
        return at, INF

    def _clock(self, flow: _Flow, sent: _Departures, window: float, t: float) -> tuple[float, float]:
        """One TCP stream sends bit x only once bit x - `window` is acknowledged, a round
        trip after it left (`sent`: when the channel's earlier bits left). The bits its
        window has room for at `t` leave at once; it then pauses until the first of the
        rest may leave (`_Flow.pause_left`, `resume`), and its bits up to a window of its
        own leave no faster than the acknowledgements of the bits a window before them
        come back: none of them ends before the last of those returns (`_Flow.clocked_left`:
        its rate is capped so, where that binds). Its bits beyond a window of its own follow
        its own acknowledgements (`_next_phase`). Returns (first bits leave, cap)."""
        rtt = 2 * flow.path.latency_s
        x = sent.bits
        room = min(flow.bits, max(0.0, sent.left_by(t - rtt) + window - x))
        if room >= flow.bits - 1e-6:
            return t, INF
        resume = max(t, sent.left_at(x + room + 1 - window) + rtt)  # its next bit's
        last = sent.left_at(min(x + flow.bits, x + window) - window) + rtt
        flow.clock = _Clock(x, room, window, rtt, last)
        flow.resume = resume
        if room > 1e-6:
            flow.pause_left = flow.bits - room
            return t, INF
        flow.free_cap = self._busy_cap(flow)
        return resume, self._clocked_cap(flow, resume)

    def _clocked_cap(self, flow: _Flow, at: float) -> float:
        """`flow`'s cap from `at`, when its clocked bits begin to leave: they end no sooner
        than the last of the acknowledgements they wait for (`_Flow.clock`; no cap where
        that wait is over already); it marks where that phase ends (`_Flow.clocked_left`),
        where its bits beyond a window of its own begin (`_next_phase`)."""
        assert flow.clock is not None
        room, window, last = flow.clock.room, flow.clock.window, flow.clock.last
        clocked = min(flow.bits, window) - room
        flow.clocked_left = flow.bits - min(flow.bits, window)
        if clocked <= 1e-6 or last <= at + 1e-12:
            return flow.free_cap
        return min(flow.free_cap, clocked / (last - at))

    def _next_phase(self, f: _Flow, t: float) -> None:
        """`f` has reached its `floor` at `t`: its room has left (it pauses until its
        `resume`, then its clocked bits leave), or its bits up to a window of its own
        have: the rest follow its own acknowledgements, a window a round trip at most,
        or its channel's rate where that was measured above it (one tensor alone's: the
        stream's window is the model's figure, the measured rate the stream's own)."""
        f.left = f.floor
        if f.pause_left is not None:
            f.paused_at, f.pause_left = t, None
            f.hold = max(t, f.resume)
            f.free_cap = f.cap
            f.cap = self._clocked_cap(f, f.hold)
        elif f.clocked_left is not None:
            assert f.clock is not None
            f.clocked_at, f.clocked_left = t, None
            own = self.spec.resources[f.path.resources[0]].capacity_bps if f.path.resources else INF
            f.cap = min(f.free_cap, max(f.clock.window / f.clock.rtt, own))

    def _record_departures(self, f: _Flow, sent: _Departures, t: float) -> None:
        """When `f`'s bits left (it ended at `t`), for the channel's next transfers' windows:
        evenly over its time on the wire; held by its window (`_Flow.clock`), the room it
        had (until its pause), then its bits up to a window of its own as the
        acknowledgements of the bits a window before them came back (none before it
        resumed, none after its clocked phase ended: the simulation moves them at one even
        rate, the next transfers' windows take their uneven pace), then the rest evenly
        until `t`."""
        if f.clock is None:
            sent.add(f.hold, t, f.bits)
            return
        x, room, window, rtt, _ = f.clock
        if room > 0:
            sent.add(f.start, f.paused_at if f.paused_at is not None else f.hold, room)
        done = f.clocked_at if f.clocked_at is not None else t
        for first, last, bits in sent.clocked(x + room, x + min(f.bits, window), window, rtt, f.hold):
            sent.add(min(first, done), min(last, done), bits)
        rest = f.bits - (sent.bits - x)
        if rest > 1e-6:
            sent.add(sent.pieces[-1][1] if sent.pieces else f.hold, t, rest)

    def _busy_cap(self, flow: _Flow) -> float:
        """The sustained rate of the busiest link `flow` starts on (`Resource.busy_bps`):
        one that another transfer is on, or whose last transfer ended less than its
        `refill_s` before `flow` starts; and its path's loaded rate where a transfer is on
        one of the resources that load its hosts (`Path.loaded_by`); INF where none
        applies."""
        if flow.notice:
            return INF
        cap = INF
        loaded = flow.path.loaded_bps
        if loaded is not None and any(not f.notice and not set(f.path.resources).isdisjoint(flow.path.loaded_by)
                                      for f in self.active.values() if f is not flow):
            cap = loaded
        for name in flow.path.resources:
            res = self.spec.resources[name]
            if res.busy_bps is None:
                continue
            busy = self.last_end.get(name, -INF) > flow.start - res.refill_s or any(
                f is not flow and not f.notice and name in f.path.resources for f in self.active.values())
            if busy:
                cap = min(cap, res.busy_bps)
        return cap

    def progress(self, t: float) -> None:
        dt = t - self.net_time
        if dt > 0:
            for f in self.active.values():  # a flow waiting for its window has rate 0 until then
                f.left = max(f.floor, f.left - f.rate * dt) if f.rate != INF else f.floor
        self.net_time = t

    def reschedule(self, t: float) -> None:
        waiting = [f for f in self.active.values() if f.hold > t]
        for f in waiting:
            f.rate = 0.0
        flows = [f for f in self.active.values() if f.hold <= t]
        users: dict[str, int] = {}
        for f in flows:
            for name in f.path.resources:
                users[name] = users.get(name, 0) + 1
        caps = {name: res.capacity(users.get(name, 0)) for name, res in self.spec.resources.items()}
        for f in flows:  # an exclusive resource has one transfer on it: its rate is that one's
            if f.backlogged:
                for name in f.path.resources:
                    backlog = self.spec.resources[name].backlog_bps
                    if backlog is not None and self._exclusive(name):
                        caps[name] = backlog
        shares = self._split_caps(flows, caps)
        rates = max_min_rates([(min(f.path.cap_bps, f.cap, shares.get(f.ident, INF)), f.path.resources)
                               for f in flows], caps)
        nxt = INF
        for f, rate in zip(flows, rates, strict=True):
            f.rate = rate
            if rate == INF:
                nxt = t
            elif rate > 0:
                nxt = min(nxt, t + (f.left - f.floor) / rate)
        for f in waiting:
            nxt = min(nxt, f.hold)
        self.net_version += 1
        if nxt < INF:
            self.push(nxt, "net", self.net_version)

    def _split_caps(self, flows: list[_Flow], caps: dict[str, float]) -> dict[tuple[TransferKey, bool], float]:
        """Each transfer's cap from the crowded resources it collides on with exactly one
        other (`Resource.split_shares`): the favoured one, drawn when the two meet, at
        its drawn share of the crowded total, the other at the rest."""
        out: dict[tuple[TransferKey, bool], float] = {}
        for name in self.split_links:
            res = self.spec.resources[name]
            on = [f for f in flows if not f.notice and name in f.path.resources]
            if len(on) != 2:
                self.splits.pop(name, None)
                continue
            pair = frozenset(f.ident for f in on)
            if name not in self.splits or self.splits[name][0] != pair:
                favoured = self.rng.choice(sorted(pair, key=lambda i: (str(i[0]), i[1])))
                self.splits[name] = (pair, favoured, self.rng.choice(res.split_shares))
            _, favoured, share = self.splits[name]
            for f in on:
                part = share if f.ident == favoured else 1.0 - share
                out[f.ident] = min(out.get(f.ident, INF), part * caps[name])
        return out

    def on_net(self, t: float, version: int) -> None:
        if version != self.net_version:
            return
        self.progress(t)
        for f in self.active.values():  # a phase of an ACK-clocked stream has ended (`_next_phase`)
            while f.floor > 0 and f.hold <= t and f.left <= f.floor + 1e-9 * f.bits + 1e-6:
                self._next_phase(f, t)
        done = [f for f in self.active.values() if f.hold <= t and f.left <= 1e-9 * f.bits + 1e-6]
        for f in done:
            del self.active[f.ident]
            key = (f.key.pipeline, f.key.boundary, f.key.direction)
            if key in self.departed and not f.notice:
                self._record_departures(f, self.departed[key], t)
            elif not f.notice and f.window_bits != INF:
                # its last window's bytes left over the last bits / rate seconds and are
                # acknowledged a round trip after each left: the window frees from then on
                last = min(f.bits, f.window_bits)
                sent = max(f.hold, t - last / f.rate) if 0 < f.rate < INF else t
                self.unacked.setdefault((f.key.pipeline, f.key.boundary, f.key.direction), []).append(
                    (sent + 2 * f.path.latency_s, last))
            released = t
            for name in f.path.resources:
                if not f.notice:
                    self.last_end[name] = t
                if self.holder.get(name) == f.ident:
                    factor = 1.0 if f.notice else self.spec.resources[name].hold_factor
                    if factor > 1.0:  # handed on after the transfer's hold, not its last byte
                        until = t + (factor - 1.0) * (t - f.hold)
                        released = max(released, until)
                        self.push(until, "release", (name, f.ident))
                    else:
                        del self.holder[name]
            if f.notice:
                self.push(t + f.path.latency_s, "notice", f.key)
                continue
            self.transfers.append(TransferSpan(f.key, f.ready, f.start, t, t + f.path.latency_s, f.bits / 8,
                                               f.path.resources, None if released == t else released))
            self.push(t + f.path.latency_s, "arrive", f.key)
        self.reschedule(t)
        if done:
            self.try_start(t)

    # ------------------------------------------------------------------ run

    def run(self) -> SimResult:
        offsets = self.spec.offsets or [0.0] * self.spec.pipelines
        if len(offsets) != self.spec.pipelines:
            raise SimulationError(f"{len(offsets)} offsets for {self.spec.pipelines} pipelines")
        for d, off in enumerate(offsets):
            self.push(off, "start", d)
        while self.events:
            t, _, kind, payload = heapq.heappop(self.events)
            if kind == "start":
                for r in range(self.s.ranks):
                    self.advance((payload, r), t)  # type: ignore[arg-type]
            elif kind == "done":
                self.busy_until[payload] = False  # type: ignore[index]
                self.advance(payload, t)  # type: ignore[arg-type]
            elif kind == "arrive":
                self.arrived.add(payload)  # type: ignore[arg-type]
                w = self.waiting.pop(payload, None)  # type: ignore[call-overload]
                if w is not None:
                    self.advance(w, t)
            elif kind == "net":
                self.on_net(t, payload)  # type: ignore[arg-type]
            elif kind == "release":
                name, ident = payload  # type: ignore[misc]
                if self.holder.get(name) == ident:
                    del self.holder[name]
                    self.try_start(t)
            elif kind == "notice":
                self.noticed[payload] = t  # type: ignore[index]
                ready = self.held.pop(payload, None)  # type: ignore[call-overload]
                if ready is not None:
                    self.start_send(payload, ready, t)  # type: ignore[arg-type]
        stuck = [w for w in self.workers if self.pos[w] < len(self.s.ops[w[1]])]
        if stuck:
            detail = ", ".join(f"pipeline {d} rank {r} at {self.s.ops[r][self.pos[(d, r)]]}" for d, r in stuck[:6])
            pend = ", ".join(str(f.key) for _, f in self.pending[:6])
            raise SimulationError(f"simulation cannot finish; waiting: {detail}; transfers not started: {pend or 'none'}")
        makespan = max((c.end for c in self.compute), default=0.0)
        return SimResult(makespan, self.compute, self.transfers, self.spec.pipelines, self.s.ranks)


def simulate(spec: SimSpec) -> SimResult:
    """Run one iteration of `spec` and return the timelines."""
    return _Sim(spec).run()

