"""`Channel`: N authenticated TCP streams between two endpoints, carrying tagged
tensors in both directions.

Each stream has a reader and a writer thread doing blocking socket calls (the GIL is
released for every chunk). Writers pull the next chunk from a shared queue when their
socket is ready (work stealing: a slow stream simply takes fewer chunks); readers
write each chunk straight into the destination tensor. A transfer is confirmed by a
DONE frame from the receiver; until then the sender remembers which stream carried
which chunk, and re-sends the chunks of a stream that breaks on the survivors.
Sends complete at DONE, so `completed_at` of a send means "the peer has it".
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections import defaultdict, deque
from dataclasses import dataclass, field

import torch

from . import protocol as P
from .config import TransportConfig
from .errors import ChannelClosed, PeerLost, ProtocolError, ShapeMismatch, TransportError
from .scheduler import Chunk, InTransfer, OutTransfer, Reassembly, SendQueue
from .sockets import (
    StreamDown,
    discard,
    kernel_outq,
    kernel_unsent,
    recv_bytes,
    recv_exact,
    restart_slow_start,
    rtt_s,
    send_parts,
    set_congestion,
    set_io_timeout,
    window_state,
)
from .splice import PageSender
from .tensors import (
    Destination,
    check_device,
    check_into,
    copy_into,
    into_destination,
    new_destination,
    prepare_send,
)

log = logging.getLogger("atlas_transport")

_PING = P.encode_control(P.PING)
# Transfers up to this size may be written by the sending thread itself (one gathered
# sendmsg, never the zero-copy pipe, which belongs to the stream's writer thread).
INLINE_MAX_BYTES = 32 << 10
# Smallest chunk a transfer is cut into to spread it over several streams (the
# lowest-numbered ones first, see _warm_lanes): a 512 KiB transfer rides 4 streams.
SPLIT_MIN_BYTES = 128 << 10
# A transfer of at most SPREAD_CHUNKS smallest chunks per stream: until this share of
# the path's smoothed RTT (at most SPREAD_MAX_S) has passed since it was queued, no
# stream takes more than its even share of its chunks (`_spread`). A 128 KiB write
# returns at once into a large send buffer, so the writer that woke first could take
# a second, third and fourth chunk before the other writers woke, and its stream, whose
# window follows the chunks it usually carries, then needed extra round trips (README,
# "Even spread"). The wait bounds what a writer slow to wake costs. Larger transfers
# (chunks above the smallest) keep plain work stealing.
SPREAD_RTT_FRACTION = 0.25
SPREAD_MAX_S = 0.02
SPREAD_CHUNKS = 2


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


class Handle:
    """A transfer in progress. `wait()` returns the received tensor (recv) or None
    (send, once the peer confirmed it) and raises the transfer's error if it failed.

    `completed_at` (time.monotonic) is when the handle completed: a send at the peer's
    confirmation; a receive when its tensor was delivered, which for a tensor that had
    landed before the receive was posted is the moment of posting. `arrived_at` (a
    receive only) is when the tensor's last byte landed, before or after the posting:
    the time a transfer took on the wire ends there, not at the receiver's request."""

    def __init__(self, kind: str, tag: int, peer: str, seq: int) -> None:
        self.kind = kind
        self.tag = tag
        self.peer = peer
        self.seq = seq  # n-th send/recv on this tag
        self.tid: int | None = None
        self.nbytes: int | None = None
        self.describe_tensor = ""
        self.started_at = time.monotonic()
        self.completed_at: float | None = None
        self.arrived_at: float | None = None  # recv: when the last byte landed (time.monotonic)
        self._event = threading.Event()
        self._out = threading.Event()  # send: every byte handed to the kernel (or the transfer ended)
        self._result: torch.Tensor | None = None
        self._error: TransportError | None = None
        # Bytes landed so far (recv): a callable while the transfer runs, frozen to a
        # number when it ends so the handle no longer references the transfer (and
        # its buffer) once it completed or failed.
        self._progress = None
        self._landed: int | None = None

    def done(self) -> bool:
        return self._event.is_set()

    def wait_out(self, timeout: float | None = None) -> None:
        """Send: wait until every chunk was handed to the kernel (not for the peer's
        DONE, a round trip later); raises the transfer's error if it failed first.
        Chunks of a stream that breaks afterwards are still re-sent until DONE."""
        if not self._out.wait(timeout):
            raise TimeoutError(f"{self.describe()}: not all sent after {timeout:g} s")
        if self._error is not None:
            raise self._error

    def wait(self, timeout: float | None = None) -> torch.Tensor | None:
        if not self._event.wait(timeout):
            raise TimeoutError(f"{self.describe()} not complete after {timeout:g} s")
        if self._error is not None:
            raise self._error
        return self._result

    @property
    def elapsed_s(self) -> float | None:
        return None if self.completed_at is None else self.completed_at - self.started_at

    def describe(self) -> str:
        what = f"transfer {self.tid}" if self.tid is not None else "transfer (none matched yet)"
        size = f", {self.describe_tensor}, {_mib(self.nbytes)}" if self.nbytes is not None else ""
        direction = "to" if self.kind == "send" else "from"
        progress = ""
        landed = self._progress() if self._progress is not None else self._landed
        if landed is not None and self.nbytes:
            progress = f", {_mib(landed)} of {_mib(self.nbytes)} received"
        return f"{self.kind} of {what} (tag {self.tag} #{self.seq}{size}{progress}) {direction} {self.peer}"

    def _finish(self, result: torch.Tensor | None) -> None:
        if self._event.is_set():
            return
        self._result = result
        self._freeze()
        self.completed_at = time.monotonic()
        self._event.set()
        self._out.set()

    def _fail(self, exc: TransportError) -> None:
        if self._event.is_set():
            return
        self._error = type(exc)(f"{self.describe()} failed: {exc}")
        self._freeze()
        self.completed_at = time.monotonic()
        self._event.set()
        self._out.set()

    def _freeze(self) -> None:
        if self._progress is not None:
            self._landed = self._progress()
            self._progress = None


@dataclass(eq=False)
class _RecvReq:
    handle: Handle
    into: torch.Tensor | None
    device: torch.device | None


@dataclass(eq=False)
class _RxState:
    dest: Destination | None  # None: its request was refused, the bytes are discarded
    key: tuple[int, int]
    req: _RecvReq | None = None
    late: bool = False  # request matched after allocation: deliver by copy/move
    ready: bool = False
    landed_at: float | None = None  # when its last byte landed (time.monotonic)
    orphan: bool = False  # its request failed (wrong destination): read off the wire, not stored


@dataclass(eq=False)
class _Stream:
    index: int
    sock: socket.socket
    alive: bool = True
    reason: str = ""
    peer_closed: bool = False
    close_pending: bool = False
    busy: bool = False
    last_send: float = field(default_factory=time.monotonic)
    ctrl: deque = field(default_factory=deque)
    exited: int = 0
    threads: list = field(default_factory=list)
    pages: PageSender = field(default_factory=PageSender)  # the writer's zero-copy pipe


class Channel:
    """Use `connect()` or `Listener.accept()` to get one; close it (or use `with`)."""

    def __init__(self, socks: list[socket.socket], cfg: TransportConfig, channel_id: bytes,
                 peer: str, *, probe: bool = False) -> None:
        self.cfg = cfg
        self.channel_id = channel_id
        self.peer = peer
        self.probe = probe
        self.name = channel_id.hex()[:8]
        self._limits = cfg.limits
        self._ck_code = P.CHECKSUMS[cfg.checksum][0]
        self._lock = threading.Lock()
        self._cv = threading.Condition(self._lock)
        self._sendq = SendQueue()
        self._rx = Reassembly()
        self._next_tid = 0
        self._send_seq: dict[int, int] = defaultdict(int)
        self._recv_seq: dict[int, int] = defaultdict(int)
        self._waiting: dict[tuple[int, int], _RecvReq] = {}
        self._arrived: dict[tuple[int, int], InTransfer] = {}
        self._failure: TransportError | None = None
        self._closing = False
        self._close_started = False
        self.bytes_received = 0
        self._stream_rate: float | None = None  # bytes/s per stream of recent large sends
        self._warm_s: float | None = None  # keep_warm(): PING a stream idle this long
        self.slow_start_restarts = 0  # streams put back into slow start (restart_cut_slow_start)
        self._restart_refused = False  # the kernel refused it once: not tried again
        self._streams = [_Stream(i, s) for i, s in enumerate(socks)]
        for s in self._streams:
            set_io_timeout(s.sock, cfg.idle_timeout_s)
        for s in self._streams:
            for role, fn in (("rx", self._reader), ("tx", self._writer)):
                th = threading.Thread(target=self._run, args=(s, fn), name=f"atlas-{self.name}-s{s.index}-{role}",
                                      daemon=True)
                s.threads.append(th)
                th.start()

    # --- public API ---------------------------------------------------------------

    @property
    def streams(self) -> int:
        return len(self._streams)

    @property
    def alive_streams(self) -> int:
        with self._lock:
            return sum(s.alive for s in self._streams)

    @property
    def chunks_resent(self) -> int:
        """Chunks queued again on surviving streams after a stream broke."""
        return self._sendq.resent

    @property
    def stream_rate_mbps(self) -> float | None:
        """Per-stream goodput of this channel's recent large sends (Mbit/s), from
        first chunk out to DONE; None until one was confirmed. Sizes the chunks of
        later sends (TransportConfig.chunk_target_s)."""
        rate = self._stream_rate
        return None if rate is None else rate * 8 / 1e6

    def held_bytes(self) -> int:
        """Bytes of buffers this channel allocated for incoming transfers and still
        holds: partial transfers, and complete ones no receive has claimed yet (a
        `recv_into` destination is the caller's memory and does not count). What a
        peer's announcements cost this process; 0 once the channel has failed."""
        with self._lock:
            held = {id(t): t for t in self._rx.active.values()}
            held.update((id(t), t) for t in self._arrived.values())
            return sum(t.meta.total_bytes for t in held.values()
                       if t.owner is not None and t.owner.dest is not None and t.owner.dest.owned)

    def drop_stream(self, index: int, reason: str = "dropped on purpose") -> bool:
        """Cut stream `index` now, as a network fault would (for fault injection).

        Its TCP connection is shut down; the peer sees it end; both sides re-send the
        chunks that stream carried and the peer has not confirmed on the remaining
        streams, and the channel goes on with one stream less. Dropping the last live
        stream fails the channel with `PeerLost`, naming `reason`. Returns False when
        the stream was already down (nothing to do), True when this call dropped it."""
        n = len(self._streams)
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < n:
            raise ValueError(f"drop_stream({index!r}): channel {self.name} to {self.peer} has streams 0..{n - 1}")
        s = self._streams[index]
        with self._lock:
            if not s.alive:
                return False
        self._stream_down(s, f"dropped locally: {reason}")
        return True

    def unsent_bytes(self) -> int:
        """Bytes of this channel's sends that have not left this host yet: chunks no
        stream has taken, plus what the streams' kernel send buffers have not
        transmitted (SIOCOUTQNSD). What a sender holding a planned slot on a link
        has left to put on it; approximate (a chunk a stream takes while we look may
        count twice)."""
        with self._lock:
            pending = self._sendq.pending_bytes()
            socks = [s.sock for s in self._streams if s.alive]
        return pending + sum(kernel_unsent(sock) for sock in socks)

    def rtt_s(self) -> float | None:
        """The kernel's smoothed RTT of the first live stream (None: not measured)."""
        with self._lock:
            socks = [s.sock for s in self._streams if s.alive]
        for sock in socks:
            rtt = rtt_s(sock)
            if rtt is not None:
                return rtt
        return None

    def set_congestion(self, name: str) -> bool:
        """Switch every live stream to congestion control `name` (e.g. "bbr"); False
        when the kernel refused it for any stream (those keep theirs)."""
        with self._lock:
            socks = [s.sock for s in self._streams if s.alive]
        return all([set_congestion(sock, name) for sock in socks])

    def keep_warm(self, interval_s: float | None) -> None:
        """Write a PING on every stream that sent nothing for `interval_s` (None: only
        the idle heartbeat). With a loss-based congestion control (cubic, reno) Linux
        shrinks the window of a stream idle for one retransmission timeout, at least
        200 ms (tcp_slow_start_after_idle), so the next burst starts in slow start; a
        PING more often than that keeps the stream's window for bursty traffic."""
        if interval_s is not None and not interval_s > 0:
            raise ValueError(f"keep_warm interval {interval_s!r}: use a positive number of seconds or None")
        with self._cv:
            self._warm_s = interval_s
            self._cv.notify_all()

    @property
    def error(self) -> TransportError | None:
        return self._failure

    def isend(self, tensor: torch.Tensor, tag: int) -> Handle:
        """Start sending; the tensor must not change until the handle completes (the
        peer confirmed it), since a chunk may be re-sent from its memory."""
        return self._isend(tensor, tag)

    def send(self, tensor: torch.Tensor, tag: int, timeout: float | None = None) -> None:
        self.isend(tensor, tag).wait(timeout)

    def irecv(self, tag: int, *, into: torch.Tensor | None = None,
              device: torch.device | str | None = None) -> Handle:
        """Post a receive for the next tensor sent on `tag` (before or after it arrives)."""
        _check_tag(tag)
        dev = torch.device(device) if device is not None else None
        check_device(dev)
        if into is not None and not isinstance(into, torch.Tensor):
            raise TypeError(f"recv_into needs a torch.Tensor, got {type(into).__name__}")
        with self._lock:
            seq = self._recv_seq[tag]
            key = (tag, seq)
            t = self._arrived.get(key)
            if t is None or not t.owner.ready:
                self._check_usable()
            if t is not None:
                del self._arrived[key]
            self._recv_seq[tag] = seq + 1
            h = Handle("recv", tag, self.peer, seq)
            req = _RecvReq(h, into, dev)
            if t is None:
                self._waiting[key] = req
                return h
            state: _RxState = t.owner
            state.req, state.late = req, True
            self._describe_rx(h, t)
            deliver_now = state.ready
        if deliver_now:
            self._deliver(state)
        return h

    def irecv_into(self, tensor: torch.Tensor, tag: int) -> Handle:
        return self.irecv(tag, into=tensor)

    def recv(self, tag: int, *, device: torch.device | str | None = None,
             timeout: float | None = None) -> torch.Tensor:
        return self.irecv(tag, device=device).wait(timeout)

    def recv_into(self, tensor: torch.Tensor, tag: int, timeout: float | None = None) -> torch.Tensor:
        return self.irecv(tag, into=tensor).wait(timeout)

    def close(self, timeout: float | None = None) -> None:
        """Wait (up to `timeout`, default idle_timeout_s) for sends to be confirmed,
        then end every stream with a CLOSE frame. Idempotent."""
        timeout = self.cfg.idle_timeout_s if timeout is None else timeout
        deadline = time.monotonic() + timeout
        with self._lock:
            first = not self._close_started
            self._close_started = True
            pending = [t.owner for t in self._sendq.inflight.values()]
        if first:
            for h in pending:
                h._event.wait(max(0.0, deadline - time.monotonic()))
            with self._lock:
                self._closing = True
                aborted = self._sendq.abort_all()
                for s in self._streams:
                    s.close_pending = True
                self._cv.notify_all()
            for t in aborted:
                t.owner._fail(ChannelClosed(f"channel {self.name} closed before the peer confirmed it"))
        for s in self._streams:
            s.threads[1].join(max(0.1, min(2.0, deadline - time.monotonic())))
        for s in self._streams:  # readers end on the peer's CLOSE/EOF; do not wait long
            s.threads[0].join(max(0.1, min(1.0, deadline - time.monotonic())))
        for s in self._streams:
            _shutdown(s.sock)
        for s in self._streams:
            for th in s.threads:
                th.join(2.0)
        self._fail_all(ChannelClosed(f"channel {self.name} to {self.peer} was closed locally"))

    def __enter__(self) -> Channel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<Channel {self.name} peer={self.peer} streams={self.alive_streams}/{self.streams}>"

    # --- sending ------------------------------------------------------------------

    def _isend(self, tensor: torch.Tensor, tag: int, lanes: int | None = None) -> Handle:
        _check_tag(tag)
        out = prepare_send(tensor)
        with self._lock:
            self._check_usable()
            seq = self._send_seq[tag]
            self._send_seq[tag] = seq + 1
            tid = self._next_tid
            self._next_tid += 1
            n_lanes = lanes or len(self._streams)
            chunk = self.cfg.chunk_for(out.view.nbytes, n_lanes, self._stream_rate)
            if n_lanes > 1:  # every stream gets about two chunks, down to SPLIT_MIN_BYTES
                share = -(-out.view.nbytes // (2 * n_lanes))
                share = -(-share // P.MIN_CHUNK) * P.MIN_CHUNK
                chunk = max(P.MIN_CHUNK, min(chunk, max(SPLIT_MIN_BYTES, share)))
            meta = P.make_meta(tag, seq, out.dtype, out.shape, chunk, self._limits)
            h = Handle("send", tag, self.peer, seq)
            h.tid, h.nbytes, h.describe_tensor = tid, meta.total_bytes, meta.describe()
            soft = lanes is None
            if soft:
                lanes = self._warm_lanes(meta.n_chunks)
            t = OutTransfer(tid, meta, out.view, lanes=lanes, owner=h, keepalive=out.host,
                            soft_lanes=soft and lanes is not None)
            self._spread(t)
            self._sendq.add(t)
            inline = self._take_inline(t)
            if inline is None:
                self._cv.notify_all()
        if inline is not None:
            self._write_inline(*inline)
        return h

    def _spread(self, t: OutTransfer) -> None:
        """Give a transfer of several chunks, at most SPREAD_CHUNKS of the smallest
        (SPLIT_MIN_BYTES) per stream it may ride, its quota: each stream its even share
        of the chunks (one, or two where there are more chunks than streams) until
        SPREAD_RTT_FRACTION of the smoothed RTT (SPREAD_MAX_S at most) has passed; then
        any stream takes what is left (a writer slow to wake, a stream stuck behind a
        full window). Larger transfers, and a channel with no RTT measured yet: no
        quota. Lock held."""
        alive = [s for s in self._streams if s.alive and (t.lanes is None or s.index < t.lanes)]
        if len(alive) < 2 or t.meta.n_chunks < 2 \
                or t.meta.total_bytes > SPREAD_CHUNKS * len(alive) * SPLIT_MIN_BYTES:
            return
        rtt = rtt_s(alive[0].sock)
        if not rtt:
            return
        t.quota = -(-t.meta.n_chunks // len(alive))
        t.spread_until = time.monotonic() + min(SPREAD_MAX_S, SPREAD_RTT_FRACTION * rtt)

    def _warm_lanes(self, n_chunks: int) -> int | None:
        """A transfer of fewer chunks than live streams goes on the lowest-numbered live
        streams (None: any stream). Streams that carry traffic often keep a warm
        congestion window; spreading a few chunks over all streams at random found
        them cold: on the 2dc WAN a 512 KiB collective took 60-70 ms over 8 streams
        against 45 ms over 2. Lifted for a transfer when a stream is lost. Lock held."""
        alive = [s.index for s in self._streams if s.alive]
        if n_chunks >= len(alive) or n_chunks <= 1:  # one chunk: whichever stream is free first
            return None
        return alive[max(0, n_chunks - 1)] + 1

    def _take_inline(self, t: OutTransfer) -> tuple[_Stream, Chunk] | None:
        """A small transfer alone in the queue is written by the sending thread itself
        on an idle stream, saving the hand-off to a writer thread (its wake-up is most
        of a small message's latency). Lock held."""
        if t.meta.total_bytes > INLINE_MAX_BYTES or (t.lanes is not None and not t.soft_lanes) \
                or self._sendq.pending_chunks() != 1:
            return None
        # An idle stream whose send queue is empty: the write cannot block the caller.
        s = next((x for x in self._streams if x.alive and not x.busy and not x.ctrl and not x.close_pending
                  and (t.lanes is None or x.index < t.lanes) and kernel_outq(x.sock) == 0), None)
        if s is None:
            return None
        chunk = self._sendq.next_chunk(s.index, time.monotonic())
        if chunk is None or chunk.transfer is not t:  # cannot happen with one chunk queued; be safe
            self._cv.notify_all()
            return None
        t.started_at = time.monotonic()
        s.busy = True
        return s, chunk

    def _write_inline(self, s: _Stream, chunk: Chunk) -> None:
        """Write the chunk `_take_inline` took; a failure takes the stream down, and the
        chunk is re-sent on the others like any chunk of a lost stream."""
        reason = None
        try:
            self._send_chunk(s, chunk)
            self._chunk_out(chunk)
        except StreamDown as exc:
            reason = str(exc)
        except OSError as exc:
            reason = exc.strerror or str(exc)
        finally:
            with self._lock:
                s.busy = False
                s.last_send = time.monotonic()
                self._cv.notify_all()
        if reason is not None:
            self._stream_down(s, reason)

    def _send_chunk(self, s: _Stream, c: Chunk) -> None:
        t = c.transfer
        payload = t.view[c.offset:c.offset + c.length]
        ck = P.checksum(self._ck_code, payload) if self._ck_code else 0
        head = P.encode_data_header(t.tid, c.offset, c.length, t.meta if c.with_meta else None, self._ck_code, ck)
        if self.cfg.zero_copy:
            s.pages.send(s.sock, head, payload, self.cfg.idle_timeout_s)
        else:
            send_parts(s.sock, [head, payload], self.cfg.idle_timeout_s)

    def _chunk_out(self, c: Chunk) -> None:
        """A chunk was handed to the kernel: once all of its transfer's chunks were,
        the send's handle says so (`wait_out`)."""
        t = c.transfer
        with self._lock:
            t.chunks_out += 1
            out = t.chunks_out >= t.meta.n_chunks
        if out:
            t.owner._out.set()

    def _writer(self, s: _Stream) -> None:
        try:
            self._write(s)
        finally:
            s.pages.close()

    def _write(self, s: _Stream) -> None:
        beat = self.cfg.heartbeat_s
        while True:
            frame = chunk = None
            closing = False
            with self._cv:
                while True:
                    if not s.alive or self._failure is not None:
                        return
                    if s.busy:  # a sender writes a small transfer on this stream itself
                        self._cv.wait()
                        continue
                    if s.ctrl:
                        frame = s.ctrl.popleft()
                        break
                    if s.close_pending:
                        frame = P.encode_control(P.CLOSE, reason="channel closed")
                        closing = True
                        break
                    now = time.monotonic()
                    chunk = self._sendq.next_chunk(s.index, now)
                    if chunk is not None:
                        if chunk.transfer.started_at is None:
                            chunk.transfer.started_at = now
                        break
                    opens_at = self._sendq.opens_at  # chunks held for streams still waking up
                    hb = beat if self._warm_s is None else min(beat, self._warm_s)
                    wait = hb - (now - s.last_send)
                    if wait <= 0:
                        frame = _PING
                        break
                    if opens_at is not None:
                        wait = min(wait, max(opens_at - now, 1e-4))
                    self._cv.wait(wait)
                s.busy = True
            try:
                if chunk is not None:
                    self._send_chunk(s, chunk)
                    self._chunk_out(chunk)
                else:
                    send_parts(s.sock, [frame], self.cfg.idle_timeout_s)
            finally:
                s.busy = False
                s.last_send = time.monotonic()
            if closing:
                try:
                    s.sock.shutdown(socket.SHUT_WR)
                except OSError:
                    pass
                return

    def _queue_ctrl(self, frame: bytes, prefer: _Stream | None = None) -> None:
        """Queue a control frame on a live stream, preferring an idle writer. Lock held."""
        alive = [s for s in self._streams if s.alive and not s.close_pending]
        if not alive:
            return
        if prefer is not None and prefer in alive and not prefer.busy:
            target = prefer
        else:
            target = min(alive, key=lambda s: (s.busy, len(s.ctrl)))
        target.ctrl.append(frame)
        self._cv.notify_all()

    def _on_done(self, tid: int) -> None:
        now = time.monotonic()
        with self._lock:
            t = self._sendq.complete(tid)
            if t is not None:
                self._learn_rate(t, now)
        if t is not None:
            if self.cfg.restart_cut_slow_start and self.cfg.pacing_rate_mbps \
                    and t.meta.total_bytes >= SPLIT_MIN_BYTES:
                # before the send completes: the caller's next send finds the streams repaired
                self._repair_slow_start(list(t.sent_on))
            t.owner._finish(None)

    def _repair_slow_start(self, used: list[int]) -> None:
        """Put each stream in `used` whose slow start was cut short without a loss
        (`WindowState.slow_start_cut_short`) back into slow start, between sends, so
        that the channel's next tensor finds its streams' windows open to what the
        peer allows, not held where cubic's HyStart stopped them on a delay spike."""
        if self._restart_refused:
            return
        with self._lock:
            socks = [(s.index, s.sock) for s in self._streams if s.alive and s.index in used]
        for index, sock in socks:
            state = window_state(sock)
            if state is None or not state.slow_start_cut_short():
                continue
            try:
                done = restart_slow_start(sock)
            except OSError as exc:
                log.warning("channel %s to %s, stream %d: %s", self.name, self.peer, index, exc)
                done = False
            if not done:
                self._restart_refused = True
                log.info("channel %s to %s: stream %d left slow start at ssthresh %d segments, below the "
                         "peer's window of %d; the kernel refused to restart it (BBR unavailable or not "
                         "allowed: net.ipv4.tcp_allowed_congestion_control)", self.name, self.peer, index,
                         state.ssthresh, state.peer_window // state.mss)
                return
            self.slow_start_restarts += 1
            log.debug("channel %s to %s, stream %d: slow start cut short at ssthresh %d segments (peer window "
                      "%d, cwnd %d), restarted", self.name, self.peer, index, state.ssthresh,
                      state.peer_window // state.mss, state.cwnd)

    def _learn_rate(self, t: OutTransfer, now: float) -> None:
        """Fold a confirmed send into the per-stream rate estimate. Lock held. Only
        sends of several chunks count: a small one measures latency, not rate; time
        spent queued behind other sends makes the estimate low, never high."""
        if t.started_at is None or t.meta.total_bytes < 4 * self.cfg.chunk_bytes:
            return
        lanes = max(1, len(t.sent_on))
        rate = t.meta.total_bytes / max(now - t.started_at, 1e-6) / lanes
        self._stream_rate = rate if self._stream_rate is None else (self._stream_rate + rate) / 2

    # --- receiving ----------------------------------------------------------------

    def _reader(self, s: _Stream) -> None:
        idle = self.cfg.idle_timeout_s
        hbuf = bytearray(P.HEADER_SIZE)
        hview = memoryview(hbuf)
        scratch = memoryview(bytearray(1 << 20))
        while True:
            recv_exact(s.sock, hview, idle)
            hdr = P.decode_header(hbuf, self._limits)
            kind = hdr.type
            if kind == P.DATA:
                self._on_data(s, hdr, scratch)
            elif kind == P.DONE:
                self._on_done(hdr.tid)
            elif kind == P.QUERY:
                with self._lock:
                    if self._rx.is_complete(hdr.tid):
                        self._queue_ctrl(P.encode_control(P.DONE, hdr.tid), prefer=s)
            elif kind == P.CLOSE:
                reason = P.decode_reason(recv_bytes(s.sock, hdr.length, idle))
                s.peer_closed = True
                raise StreamDown(f"peer closed the stream ({reason})")
            # PING: nothing to do, its arrival reset the idle clock

    def _on_data(self, s: _Stream, hdr: P.FrameHeader, scratch: memoryview) -> None:
        idle = self.cfg.idle_timeout_s
        meta = None
        if hdr.has_meta:
            prefix = P.decode_meta_prefix(recv_bytes(s.sock, P.META_SIZE, idle), self._limits)
            meta = P.decode_meta_dims(recv_bytes(s.sock, prefix.dims_size, idle), prefix)
        with self._lock:
            if meta is not None:
                t, new = self._rx.announce(hdr.tid, meta)
                if new:
                    self._setup_rx(t)
            t = self._rx.begin_chunk(hdr.tid, hdr.offset, hdr.length)
        if t is None:  # a duplicate of a chunk that already landed
            discard(s.sock, hdr.length, scratch, idle)
            return
        ok = False
        try:
            if t.view is None:  # its receive was refused: read the bytes off the wire, keep nothing
                discard(s.sock, hdr.length, scratch, idle)
            else:
                view = t.view[hdr.offset:hdr.offset + hdr.length]
                recv_exact(s.sock, view, idle)
                if hdr.checksum_algo and P.checksum(hdr.checksum_algo, view) != hdr.checksum:
                    raise ProtocolError(
                        f"checksum mismatch in transfer {hdr.tid} at offset {hdr.offset} ({hdr.length} bytes)"
                    )
            ok = True
        finally:
            with self._lock:
                if ok:
                    self.bytes_received += hdr.length
                finished = self._rx.end_chunk(t, hdr.offset, ok)
                if finished:
                    self._queue_ctrl(P.encode_control(P.DONE, t.tid), prefer=s)
                    state: _RxState = t.owner
                    state.ready, state.landed_at = True, time.monotonic()
                    deliver = state.req is not None
            if finished and deliver:
                self._deliver(state)

    def _setup_rx(self, t: InTransfer) -> None:
        """Pick the destination of a newly announced transfer. Lock held."""
        m = t.meta
        key = (m.tag, m.tag_seq)
        req = self._waiting.pop(key, None)
        dest = None
        orphan = False
        if req is not None:
            self._describe_rx(req.handle, t)
            try:
                if req.into is not None:
                    why = check_into(req.into, m.dtype, m.shape)
                    if why is not None:
                        raise ShapeMismatch(f"cannot receive into the given tensor: {why}")
                    dest = into_destination(req.into)
                else:
                    dest = new_destination(m.dtype, m.shape, req.device)
            except Exception as exc:  # the request fails, the stream and channel do not
                req.handle._fail(exc if isinstance(exc, TransportError) else TransportError(str(exc)))
                req, orphan = None, True  # its bytes are read and discarded, nothing is allocated
        if dest is None and not orphan:
            dest = new_destination(m.dtype, m.shape)
        t.view = dest.view if dest is not None else None
        t.owner = _RxState(dest, key, req, orphan=orphan)
        if req is None and not orphan:
            self._arrived[key] = t

    def _describe_rx(self, h: Handle, t: InTransfer) -> None:
        h.tid, h.nbytes, h.describe_tensor = t.tid, t.meta.total_bytes, t.meta.describe()
        h._progress = lambda: t.bytes_received

    def _deliver(self, state: _RxState) -> None:
        req = state.req
        req.handle.arrived_at = state.landed_at
        try:
            if not state.late:
                result = state.dest.finish()
            elif req.into is not None:
                buf = state.dest.buffer
                why = check_into(req.into, _dtype_str(buf), tuple(buf.shape))
                if why is not None:
                    raise ShapeMismatch(f"cannot receive into the given tensor: {why}")
                result = copy_into(req.into, buf)
            elif req.device is not None and req.device.type != "cpu":
                result = state.dest.buffer.to(req.device)
            else:
                result = state.dest.buffer
        except TransportError as exc:
            req.handle._fail(exc)
            return
        except Exception as exc:  # a torch copy failing must not kill the reader thread
            req.handle._fail(TransportError(f"delivering the tensor failed: {exc}"))
            return
        req.handle._finish(result)

    # --- failures -----------------------------------------------------------------

    def _run(self, s: _Stream, fn) -> None:
        reason = None
        try:
            fn(s)
        except StreamDown as exc:
            reason = str(exc)
        except ProtocolError as exc:
            log.error("channel %s to %s, stream %d: protocol error: %s; closing the stream",
                      self.name, self.peer, s.index, exc)
            reason = f"protocol error: {exc}"
        except Exception as exc:  # never let a thread die silently with the channel half-alive
            log.exception("channel %s to %s, stream %d: internal error", self.name, self.peer, s.index)
            reason = f"internal error: {exc!r}"
        # Outside the except clauses: the exception's traceback, whose frames hold views
        # of tensor memory, is gone before transfers are failed and their memory released.
        try:
            if reason is not None:
                self._stream_down(s, reason)
        finally:
            with self._lock:
                s.exited += 1
                last = s.exited == len(s.threads)
            if last:
                s.sock.close()

    def _stream_down(self, s: _Stream, reason: str) -> None:
        with self._lock:
            if not s.alive:
                return
            s.alive = False
            s.reason = reason
            alive = [x for x in self._streams if x.alive]
            graceful = s.peer_closed or self._closing
            if not graceful:
                log.warning("channel %s to %s: stream %d of %d down: %s; %d left",
                            self.name, self.peer, s.index, len(self._streams), reason, len(alive))
            if alive and not self._closing:
                for tid in self._sendq.stream_lost(s.index):
                    self._queue_ctrl(P.encode_control(P.QUERY, tid))
            self._cv.notify_all()
            failure = None
            if not alive and self._failure is None:
                if self._closing:
                    failure = ChannelClosed(f"channel {self.name} to {self.peer} was closed locally")
                elif all(x.peer_closed for x in self._streams):
                    failure = ChannelClosed(f"peer {self.peer} closed channel {self.name}")
                else:
                    causes = "; ".join(f"stream {x.index}: {x.reason}" for x in self._streams)
                    failure = PeerLost(f"channel {self.name} to {self.peer} lost all {len(self._streams)} "
                                       f"streams ({causes})")
        _shutdown(s.sock)
        if failure is not None:
            self._join_streams(deadline=time.monotonic() + 2.0)
            self._fail_all(failure)

    def _join_streams(self, deadline: float) -> None:
        """Wait (bounded) for the stream threads to end; every socket is shut down by
        now, so they end at once. Their frames hold views of transfer memory: once
        they are gone, failing the transfers releases that memory immediately."""
        me = threading.current_thread()
        for x in self._streams:
            for th in x.threads:
                if th is not me and th.ident is not None:
                    th.join(max(0.0, deadline - time.monotonic()))

    def _fail_all(self, failure: TransportError) -> None:
        """Fail every pending transfer and drop the channel's references to their
        memory (staging copies, partial and announced-but-unfinished receive buffers),
        so it is freed now by reference counting, not later by the garbage collector.
        Complete transfers nobody claimed yet stay receivable."""
        with self._lock:
            victims = self._release_pending()
            if self._failure is None:
                self._failure = failure
            failure = self._failure
            self._cv.notify_all()
        for h in victims:
            h._fail(failure)

    def _release_pending(self) -> list[Handle]:
        """Forget every unfinished transfer; returns the handles to fail. Lock held.
        A function of its own so that no local variable still points at a transfer
        once the handles are failed (whoever wakes up sees the memory gone)."""
        victims = [t.owner for t in self._sendq.abort_all()]
        victims += [r.handle for r in self._waiting.values()]
        self._waiting.clear()
        for key in [k for k, t in self._arrived.items() if not t.owner.ready]:
            del self._arrived[key]  # partial and unclaimed: can never complete now
        for t in self._rx.drop_all():
            if t.owner is not None and t.owner.req is not None:
                victims.append(t.owner.req.handle)
        return victims

    def _check_usable(self) -> None:
        if self._failure is not None:
            raise type(self._failure)(str(self._failure))
        if self._close_started:
            raise ChannelClosed(f"channel {self.name} to {self.peer} is closed")


def _check_tag(tag: int) -> None:
    if isinstance(tag, bool) or not isinstance(tag, int) or not 0 <= tag <= P.MAX_U63:
        raise ValueError(f"tag must be an integer in 0..2**63-1, got {tag!r}")


def _dtype_str(t: torch.Tensor) -> str:
    return str(t.dtype).removeprefix("torch.")


def _shutdown(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
