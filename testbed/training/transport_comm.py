"""A `Comm` (testbed/training/executor.py) whose boundary tensors travel through
atlas_transport channels, one channel per (pipeline, boundary).

* Tags: a channel matches sends to receives by tag; the tag packs the iteration,
  the boundary, the micro-batch and the direction (`tag_for` / `key_of`), so a late
  tensor can never be taken for another one.
* Sends never block the worker's schedule (a GPU does not wait for its NIC): they are
  handed to the channel at once, or, under Atlas's temporal plan, by a dispatcher
  thread that keeps each channel's order and holds a WAN send until it may use its
  link (`Planned`): in ``token`` mode until the previous transfer in the link's
  planned order has had its planned time on the wire (the previous sender announces
  its start over a `TokenBus`, UDP on the DC's LAN), in ``slot`` mode until its
  planned slot start after the iteration's common start. A token holder whose
  transfer still has bytes on this host just before its planned end announces a
  later end (what is left at the plan's rate), so a transfer slowed by loss does not
  have the next one piled onto the link beside it.
* Every tensor leaves a record (`testbed.run.metrics.TransferRecord` fields):
  when the schedule reached the send, the planned slot, when it went to the
  transport, when the receiver confirmed it; the receiving side records the arrival.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import math
import threading
import time
import zlib
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from testbed_core.planning.calibrated import TOKEN_HANDOVER_S
from testbed_core.simulate import TransferKey

if TYPE_CHECKING:
    import torch

ITER_BITS, BOUNDARY_BITS, MB_BITS = 23, 16, 23  # + 1 direction bit = 63 bits (atlas tags are u63)
MAX_ITERATION = (1 << ITER_BITS) - 1
MAX_BOUNDARY = (1 << BOUNDARY_BITS) - 1
MAX_MB = (1 << MB_BITS) - 1
# A token holder looks at its transfer this long before the end it announced: the next
# holder (another host of the DC, over the LAN) must hear of a later end before it starts.
# The planner's hand-over (testbed_core/planning/calibrated.py) is this one figure.
WATCH_LEAD_S = TOKEN_HANDOVER_S


VERIFY_SEED = 0x5EED  # the seeded bytes every worker's patterns are rotations of (TransportComm verify)


class CommError(RuntimeError):
    """A boundary tensor that could not be sent or did not arrive in time."""


def tag_for(key: TransferKey, iteration: int) -> int:
    """The channel tag of boundary tensor `key` in `iteration` (unique per channel)."""
    if not 0 <= iteration <= MAX_ITERATION:
        raise CommError(f"iteration {iteration} out of range 0..{MAX_ITERATION} for a transfer tag")
    if not 0 <= key.boundary <= MAX_BOUNDARY:
        raise CommError(f"boundary {key.boundary} out of range 0..{MAX_BOUNDARY} for a transfer tag")
    if not 0 <= key.mb <= MAX_MB:
        raise CommError(f"micro-batch {key.mb} out of range 0..{MAX_MB} for a transfer tag")
    if key.direction not in ("fwd", "bwd"):
        raise CommError(f"direction {key.direction!r} is neither 'fwd' nor 'bwd'")
    tag = iteration
    tag = (tag << BOUNDARY_BITS) | key.boundary
    tag = (tag << MB_BITS) | key.mb
    return (tag << 1) | (1 if key.direction == "bwd" else 0)


def key_of(tag: int, pipeline: int) -> tuple[int, TransferKey]:
    """Inverse of `tag_for`: (iteration, key) of a tag on a channel of `pipeline`."""
    if not 0 <= tag < (1 << 63):
        raise CommError(f"tag {tag} is not a transfer tag (0..2**63-1)")
    direction = "bwd" if tag & 1 else "fwd"
    tag >>= 1
    mb = tag & MAX_MB
    tag >>= MB_BITS
    boundary = tag & MAX_BOUNDARY
    iteration = tag >> BOUNDARY_BITS
    return iteration, TransferKey(pipeline, boundary, mb, direction)  # type: ignore[arg-type]


@dataclass(frozen=True)
class ChannelPath:
    """Where a boundary channel of this worker goes: the peer worker, the WAN link
    directions crossed by what this worker sends on it and by what it receives
    (empty inside a DC), the path's one-way delay and the channel's stream count.
    Every transfer record of the channel carries these."""

    peer: str
    links: tuple[str, ...] = ()
    latency_s: float = 0.0
    streams: int = 1
    recv_links: tuple[str, ...] = ()


def wall_of(monotonic_t: float | None) -> float | None:
    """A `time.monotonic()` instant (what the transport's handles record) on the
    wall clock every process shares."""
    if monotonic_t is None:
        return None
    return time.time() - (time.monotonic() - monotonic_t)


class CommHandle(Protocol):
    """A send or receive in flight: `wait` returns the received tensor (None for a
    send); `completed_at` (time.monotonic) is set once it completed. An atlas_transport
    receive also has `arrived_at`, when its last byte landed (`_landed`)."""

    completed_at: float | None

    def wait(self, timeout: float | None = None) -> torch.Tensor | None: ...


def _landed(handle: CommHandle) -> float | None:
    """When a received tensor's last byte landed: atlas_transport's `arrived_at`, which
    a receive posted after the tensor landed keeps (its `completed_at` is the posting);
    gloo's futures tell only when `wait` saw them done (`completed_at`)."""
    arrived = getattr(handle, "arrived_at", None)
    return arrived if arrived is not None else handle.completed_at


class CommChannel(Protocol):
    """What TransportComm calls on a channel: an atlas_transport Channel, a GlooChannel
    (gloo_comm.py), or a wrapper of either (worker/live.py)."""

    def isend(self, tensor: torch.Tensor, tag: int) -> CommHandle: ...

    def irecv(self, tag: int) -> CommHandle: ...


@dataclass
class _Pending:
    key: TransferKey
    tensor: Any
    record: dict[str, Any]
    planned: Planned | None
    iteration: int
    iteration_start: float


@dataclass
class _Outstanding:
    handle: CommHandle
    record: dict[str, Any]


@dataclass
class _Watch:
    """A token holder's transfer to look at just before its announced end."""

    at: float  # when to look
    iteration: int
    planned: Planned
    channel: Any
    rate_bps: float  # the plan's rate: bytes / planned time on the wire
    record: dict[str, Any]
    lead: float = WATCH_LEAD_S  # looked at this long before the announced end


@dataclass(frozen=True)
class Planned:
    """A WAN send under the temporal plan.

    slot_s: planned start, seconds after the iteration's common start (slot mode).
    tokens: (link direction, position in that link's planned order) for each link crossed.
    duration_s: planned time on the wire; the next token holder may start this long
        after this send went out.
    next_holders: (link direction, position, worker) of the transfer after this one on
        each link, to be told when this one started.
    """

    slot_s: float | None = None
    tokens: tuple[tuple[str, int], ...] = ()
    duration_s: float = 0.0
    next_holders: tuple[tuple[str, int, str], ...] = ()


_BUS_PURPOSE = b"testbed token bus v1"
_BUS_MAC = hashlib.sha256().digest_size
_log = logging.getLogger(__name__)


class TokenBus:
    """Token announcements between the senders that share WAN links: one UDP socket
    per worker; a message says that transfer `index` of `link` in `iteration` went out
    and until when it is planned to hold the link. A lost datagram only costs the next
    holder its token timeout.

    Each datagram carries an HMAC-SHA256 of its body, keyed with a key derived from the
    run's `secret` (ATLAS_SECRET, as the channels'): one that does not prove it (a
    stranger's, another run's, a cut one) is dropped unread and counted in `refused`,
    so nothing outside the run can hand a sender the link."""

    def __init__(self, bind_ip: str, port: int, peers: Mapping[str, tuple[str, int]],
                 on_message: Callable[[dict[str, Any]], None], *, secret: str | bytes) -> None:
        import socket

        raw = secret.encode() if isinstance(secret, str) else bytes(secret)
        if not raw:
            raise CommError("token bus: the run's secret is empty (ATLAS_SECRET); the bus signs every datagram with it")
        self._key = hmac.new(raw, _BUS_PURPOSE, hashlib.sha256).digest()
        self.refused = 0
        self.peers = dict(peers)
        self.on_message = on_message
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self.sock.bind((bind_ip, port))
        except OSError as exc:
            self.sock.close()
            raise CommError(f"token bus cannot listen on {bind_ip}:{port}: {exc.strerror or exc}") from None
        self.sock.settimeout(0.5)
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name="comm-token-bus", daemon=True)
        self._thread.start()

    def send(self, worker: str, message: dict[str, Any]) -> None:
        try:
            addr = self.peers[worker]
        except KeyError:
            raise CommError(f"token bus: no address for worker {worker} (known: {sorted(self.peers)})") from None
        body = json.dumps(message, separators=(",", ":")).encode()
        self.sock.sendto(hmac.new(self._key, body, hashlib.sha256).digest() + body, tuple(addr))

    def _loop(self) -> None:
        while not self._closed:
            try:
                data, peer = self.sock.recvfrom(4096)
            except TimeoutError:
                continue
            except OSError:
                return
            mac, body = data[:_BUS_MAC], data[_BUS_MAC:]
            if not hmac.compare_digest(mac, hmac.new(self._key, body, hashlib.sha256).digest()):
                self.refused += 1
                if self.refused == 1 or self.refused % 1000 == 0:
                    _log.warning("token bus: dropped %d datagram(s) not signed with the run's secret (last from %s)",
                                 self.refused, peer)
                continue
            try:
                msg = json.loads(body)
            except json.JSONDecodeError:
                continue
            self.on_message(msg)

    def close(self) -> None:
        self._closed = True
        self._thread.join(1.0)
        self.sock.close()


class TransportComm:
    """Comm of one worker. `channels[boundary]` is the channel to the neighbouring
    worker across that boundary; `paths[boundary]` says where it goes.

    `plan` maps (direction, boundary, mb) to its `Planned` entry (Atlas's temporal
    sharing); `mode` says how it is enforced: ``token`` (wait for the previous
    transfer on each link, announced on `bus`, or at most `token_timeout_s`) or
    ``slot`` (wait for the planned start). `filler` is sent when the schedule passes
    no tensor (modelled work): a byte tensor of the workload's wire size. With `verify`,
    each modelled send carries instead a pattern of its own (`pattern`: a seeded random
    byte tensor rotated by a hash of (iteration, pipeline, boundary, micro-batch,
    direction)) that the receiver compares byte for byte (`verified` counts them): a
    tensor cut, mixed up or garbled on the way (a link fault, a transport bug) fails the
    run with a message naming it instead of passing unseen.
    """

    def __init__(
        self,
        pipeline: int,
        worker: str,
        channels: Mapping[int, CommChannel],
        paths: Mapping[int, ChannelPath],
        *,
        filler: torch.Tensor,
        plan: Mapping[tuple[str, int, int], Planned] | None = None,
        mode: str = "token",
        bus: TokenBus | None = None,
        token_timeout_s: float = 10.0,
        timeout_s: float = 120.0,
        clock: Callable[[], float] = time.time,
        verify: bool = False,
    ) -> None:
        if mode not in ("token", "slot"):
            raise CommError(f"{worker}: temporal plan mode {mode!r} is neither 'token' nor 'slot'")
        missing = set(channels) ^ set(paths)
        if missing:
            raise CommError(f"{worker}: channels and paths disagree on boundaries {sorted(missing)}")
        self.pipeline = pipeline
        self.worker = worker
        self.channels = dict(channels)
        self.paths = dict(paths)
        self.filler = filler
        self.verified = 0  # received tensors whose pattern matched (verify)
        self._base = None
        if verify:
            import torch

            gen = torch.Generator().manual_seed(VERIFY_SEED)
            self._base = torch.randint(0, 256, (max(1, _nbytes(filler)),), dtype=torch.uint8, generator=gen)
        self.plan = dict(plan or {})
        self.mode = mode
        self.bus = bus
        self.token_timeout_s = token_timeout_s
        self.token_timeouts = 0
        self._ends: dict[tuple[int, str, int], float] = {}  # (iteration, link, index) -> planned link release
        self.timeout_s = timeout_s
        self.clock = clock
        self.iteration = 0
        self.iteration_start = 0.0
        self.sent: list[dict[str, Any]] = []  # finished send records, drained by take_records()
        self.received: list[dict[str, Any]] = []
        self._out: list[_Outstanding] = []
        self._queues: dict[int, deque[_Pending]] = {b: deque() for b in self.channels}
        self._handing = 0  # sends the dispatcher took off a queue and is handing over (not yet in _out)
        self._watches: list[_Watch] = []
        self.slot_extensions = 0  # later ends announced for transfers still sending at their planned end
        self._cv = threading.Condition()
        self._error: BaseException | None = None
        self._closed = False
        self._thread: threading.Thread | None = None
        if self.plan:
            self._thread = threading.Thread(target=self._dispatch, name=f"comm-{worker}-plan", daemon=True)
            self._thread.start()

    # ------------------------------------------------------------ Comm protocol

    def begin_iteration(self, iteration: int, start: float) -> None:
        """Tags and planned slots of the sends that follow refer to this iteration."""
        self.iteration = iteration
        self.iteration_start = start

    def send(self, key: TransferKey, payload: Any) -> None:
        boundary = key.boundary
        ch = self._channel(boundary)
        path = self.paths[boundary]
        if _is_tensor(payload):
            tensor = payload
        elif self._base is not None:
            tensor = self.pattern(key, self.iteration)
        else:
            tensor = self.filler
        now = self.clock()
        planned = self.plan.get((key.direction, boundary, key.mb))
        record = {
            "iteration": self.iteration, "pipeline": self.pipeline, "boundary": boundary, "mb": key.mb,
            "direction": key.direction, "src": self.worker, "dst": path.peer, "nbytes": _nbytes(tensor),
            "links": list(path.links), "latency_s": path.latency_s, "posted": now, "not_before": None,
            "streams": path.streams,
        }
        with self._cv:
            self._raise_if_failed()
            queue = self._queues[boundary]
            pending = _Pending(key, tensor, record, planned, self.iteration, self.iteration_start)
            if queue or (planned is not None and self._release(pending, now) > now):  # keep the channel's order
                queue.append(pending)
                self._cv.notify_all()
                return
            if planned is not None:
                record["not_before"] = now
        self._isend(ch, key, tensor, record, planned)

    def recv(self, key: TransferKey) -> Any:
        ch = self._channel(key.boundary)
        handle = ch.irecv(tag_for(key, self.iteration))
        try:
            tensor = handle.wait(self.timeout_s)
        except TimeoutError:
            raise CommError(
                f"{self.worker}: {key} of iteration {self.iteration} did not arrive from "
                f"{self.paths[key.boundary].peer} within {self.timeout_s:g} s"
            ) from None
        checked = self._check(key, tensor) if self._base is not None else None
        self.received.append({
            "iteration": self.iteration, "pipeline": self.pipeline, "boundary": key.boundary, "mb": key.mb,
            "direction": key.direction, "src": self.paths[key.boundary].peer, "dst": self.worker,
            "nbytes": _nbytes(tensor), "links": list(self.paths[key.boundary].recv_links),
            "latency_s": self.paths[key.boundary].latency_s, "arrived": wall_of(_landed(handle)),
            "streams": self.paths[key.boundary].streams,
            **({} if checked is None else {"verified": checked}),
        })
        return tensor

    def pattern(self, key: TransferKey, iteration: int) -> Any:
        """The modelled tensor of `key` in `iteration` (verify): its own rotation of the
        seeded random bytes, so that every byte depends on which transfer it is."""
        assert self._base is not None
        ident = f"{iteration}:{self.pipeline}:{key.boundary}:{key.mb}:{key.direction}".encode()
        return self._base.roll(zlib.crc32(ident) % self._base.numel())

    def _check(self, key: TransferKey, tensor: Any) -> bool:
        import torch

        want = self.pattern(key, self.iteration)
        got = tensor.reshape(-1).view(torch.uint8) if _is_tensor(tensor) else None
        if got is None or got.numel() != want.numel() or not torch.equal(got, want):
            bad = "not a tensor" if got is None else (
                f"{got.numel()} bytes, expected {want.numel()}" if got.numel() != want.numel()
                else f"{int((got != want).sum())} of {want.numel()} bytes differ")
            raise CommError(f"{self.worker}: {key} of iteration {self.iteration} from {self.paths[key.boundary].peer} "
                            f"failed verification ({bad}): the tensor was damaged or mixed up on the way")
        self.verified += 1
        return True

    def flush(self) -> None:
        """Wait until every send so far was handed over and confirmed by its receiver."""
        deadline = time.monotonic() + self.timeout_s
        with self._cv:
            while (any(self._queues.values()) or self._handing) and self._error is None:
                if not self._cv.wait(max(0.0, deadline - time.monotonic())):
                    break
            self._raise_if_failed()
            if any(self._queues.values()) or self._handing:
                raise CommError(f"{self.worker}: planned sends still waiting after {self.timeout_s:g} s")
            out, self._out = self._out, []
        for o in out:
            try:
                o.handle.wait(max(0.1, deadline - time.monotonic()))
            except TimeoutError:
                raise CommError(
                    f"{self.worker}: send of {o.record['direction']} micro-batch {o.record['mb']} "
                    f"(iteration {o.record['iteration']}) to {o.record['dst']} not confirmed within "
                    f"{self.timeout_s:g} s"
                ) from None
            o.record["confirmed"] = wall_of(o.handle.completed_at)
            self.sent.append(o.record)

    # ------------------------------------------------------------ records, end

    def take_records(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """(sends, receives) recorded since the last call."""
        sent, self.sent = self.sent, []
        received, self.received = self.received, []
        return sent, received

    def close(self) -> None:
        with self._cv:
            self._closed = True
            self._cv.notify_all()
        if self._thread is not None:
            self._thread.join(2.0)

    # ------------------------------------------------------------ internals

    def _channel(self, boundary: int) -> CommChannel:
        try:
            return self.channels[boundary]
        except KeyError:
            raise CommError(
                f"{self.worker}: no channel for boundary {boundary} (have: {sorted(self.channels)})"
            ) from None

    def _isend(self, ch: CommChannel, key: TransferKey, tensor: Any, record: dict[str, Any],
               planned: Planned | None = None) -> None:
        record["sent"] = self.clock()
        handle = ch.isend(tensor, tag_for(key, record["iteration"]))
        with self._cv:
            self._out.append(_Outstanding(handle, record))
        if planned is not None and planned.tokens:
            end = record["sent"] + planned.duration_s
            self._announce(record["iteration"], end, planned)
            if planned.duration_s > 0 and hasattr(ch, "unsent_bytes"):
                rate = record["nbytes"] * 8 / planned.duration_s
                # a transfer planned shorter than the lead is looked at halfway through its time, not as it
                # is handed over: its bytes are all on the host then, and a later end announced at once
                # held the next holder back by the lead itself (5 ms for each 16 KiB tensor of real-tiny-2dc)
                lead = min(WATCH_LEAD_S, planned.duration_s / 2)
                with self._cv:
                    self._watches.append(_Watch(end - lead, record["iteration"], planned, ch, rate, record, lead))
                    self._cv.notify_all()

    def _check_watch(self, w: _Watch, now: float) -> float | None:
        """Just before its announced end: a transfer with bytes still on this host
        announces a later end; returns when to look again (None: it is done)."""
        left = w.channel.unsent_bytes()
        if left <= 0:
            return None
        end = now + w.lead + left * 8 / w.rate_bps
        self.slot_extensions += 1
        w.record["slot_extended_s"] = w.record.get("slot_extended_s", 0.0) + (end - (w.at + w.lead))
        self._announce(w.iteration, end, w.planned)
        return end - w.lead

    def _announce(self, iteration: int, end: float, planned: Planned) -> None:
        """Tell the next holder on each link when it may start (this send's planned release)."""
        with self._cv:
            for link, index in planned.tokens:
                key = (iteration, link, index)
                self._ends[key] = max(end, self._ends.get(key, -math.inf))
            self._cv.notify_all()
        for link, index, worker in planned.next_holders:
            if worker != self.worker and self.bus is not None:
                self.bus.send(worker, {"it": iteration, "link": link, "idx": index - 1, "end": end})

    def on_token(self, msg: dict[str, Any]) -> None:
        """A token announcement from another sender (called by the TokenBus thread);
        a later end for the same transfer (it was still sending) replaces the first."""
        key = (int(msg["it"]), str(msg["link"]), int(msg["idx"]))
        with self._cv:
            self._ends[key] = max(float(msg["end"]), self._ends.get(key, -math.inf))
            self._cv.notify_all()

    def _release(self, p: _Pending, now: float) -> float:
        """When `p` may go (<= now: at once; inf: waiting for a token). Lock held."""
        e = p.planned
        if e is None:
            return now
        if self.mode == "slot":
            return -math.inf if e.slot_s is None else p.iteration_start + e.slot_s
        at = -math.inf
        for link, index in e.tokens:
            if index == 0:
                continue
            end = self._ends.get((p.iteration, link, index - 1))
            if end is None:
                if now - p.record["posted"] >= self.token_timeout_s:
                    continue  # the announcement was lost or the peer died: do not wait forever
                return math.inf
            at = max(at, end)
        return at

    def _raise_if_failed(self) -> None:
        if self._error is not None:
            raise CommError(f"{self.worker}: a planned send failed: {self._error}") from self._error

    def _dispatch(self) -> None:
        """Hand each channel's queued sends over when the plan lets them go, in order."""
        while True:
            due: list[tuple[int, _Pending]] = []
            with self._cv:
                if self._closed:
                    return
                now = self.clock()
                wake = None
                for b, q in self._queues.items():
                    while q:
                        at = self._release(q[0], now)
                        if at > now:
                            if at == math.inf:  # re-check at the token timeout
                                at = q[0].record["posted"] + self.token_timeout_s
                            wake = at if wake is None else min(wake, at)
                            break
                        p = q.popleft()
                        if p.planned is not None:
                            p.record["not_before"] = max(at, p.record["posted"])
                            if self.mode == "token" and any(
                                i > 0 and (p.iteration, link, i - 1) not in self._ends for link, i in p.planned.tokens
                            ):
                                self.token_timeouts += 1
                                p.record["token_timeout"] = True
                        due.append((b, p))
                looks = [w for w in self._watches if w.at <= now]
                self._watches = [w for w in self._watches if w.at > now]
                for w in self._watches:
                    wake = w.at if wake is None else min(wake, w.at)
                if not due and not looks:
                    self._cv.wait(None if wake is None else max(0.0005, wake - now))
                    continue
                self._handing += len(due)  # flush() must wait for these, though the queues look empty
            for w in looks:
                again = self._check_watch(w, self.clock())
                if again is not None:
                    with self._cv:
                        w.at = again
                        self._watches.append(w)
            for b, p in due:
                try:
                    self._isend(self.channels[b], p.key, p.tensor, p.record, p.planned)
                except BaseException as exc:  # surfaced by the worker's next send/flush
                    with self._cv:
                        self._error = exc
                finally:
                    with self._cv:
                        self._handing -= 1
                        self._cv.notify_all()


def _is_tensor(x: Any) -> bool:
    return x is not None and hasattr(x, "element_size") and hasattr(x, "numel")


def _nbytes(t: Any) -> int:
    return int(t.numel() * t.element_size()) if _is_tensor(t) else 0


@dataclass
class TransferLog:
    """Append-only JSON lines of a worker's transfer records (one file per worker)."""

    path: Path
    _lines: list[str] = field(default_factory=list)

    def add(self, side: str, records: list[dict[str, Any]]) -> None:
        for r in records:
            self._lines.append(json.dumps({"side": side, **r}, separators=(",", ":")))

    def write(self) -> None:
        if not self._lines:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a") as fh:
            fh.write("\n".join(self._lines) + "\n")
        self._lines.clear()


def read_transfer_logs(paths: list[Path]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(sends, receives) from the workers' logs; lines cut short by a crash are skipped."""
    sends, recvs = [], []
    for path in paths:
        try:
            lines = path.read_text().splitlines()
        except FileNotFoundError:
            continue
        for line in lines:
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue
            side = rec.pop("side", None)
            (sends if side == "send" else recvs if side == "recv" else []).append(rec)
    return sends, recvs
