"""Bookkeeping of striped transfers, without sockets or threads.

`SendQueue` hands chunks to whichever stream asks first (work stealing), remembers
which stream carried which chunk until the receiver confirms the whole transfer, and
puts the chunks of a lost stream back at the head of the queue. A transfer spread over
several streams may carry a quota: until its `spread_until`, no stream takes more than
`quota` of its chunks, so the writer that wakes first cannot take the chunks of the
streams still waking up (see `Channel._spread`). `Reassembly` tracks,
per incoming transfer, which chunks have landed (a bitmap, so re-sent duplicates are
dropped) and how many streams are writing into it right now, so a transfer is handed
to the user only when nobody writes into its memory any more.

Callers hold their own lock around every method; these classes are not thread-safe.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from .errors import ProtocolError
from .protocol import TensorMeta, check_chunk


@dataclass(eq=False)
class OutTransfer:
    tid: int
    meta: TensorMeta
    view: memoryview  # the flat bytes of the (contiguous, host) tensor
    lanes: int | None = None  # only streams with index < lanes may carry it (probing)
    soft_lanes: bool = False  # lanes is a preference: lifted when a stream is lost
    owner: Any = None  # the channel's handle, opaque here
    keepalive: Any = None  # the tensor behind `view`, held until DONE
    started_at: float | None = None  # when a stream took its first chunk (set by the channel)
    next_offset: int = 0
    chunks_out: int = 0  # chunks handed to the kernel (re-sent ones count again)
    handed_out: bool = False
    meta_sent_on: set[int] = field(default_factory=set)
    sent_on: dict[int, list[int]] = field(default_factory=dict)  # stream -> chunk offsets
    # at most this many of its chunks per stream until spread_until (time.monotonic());
    # None: no quota. Lifted for good when a stream is lost.
    quota: int | None = None
    spread_until: float = 0.0


@dataclass(frozen=True)
class Chunk:
    transfer: OutTransfer
    offset: int
    length: int
    with_meta: bool


class SendQueue:
    def __init__(self) -> None:
        self._fresh: deque[OutTransfer] = deque()  # transfers with chunks never sent
        self._resend: deque[tuple[OutTransfer, int]] = deque()
        self.inflight: dict[int, OutTransfer] = {}  # tid -> not yet confirmed by DONE
        self.resent = 0  # chunks queued again after a stream loss
        # after a next_chunk() that found only chunks held back by a quota: when the
        # earliest of those quotas lifts (the asking stream may look again then); else None
        self.opens_at: float | None = None

    def add(self, t: OutTransfer) -> None:
        self.inflight[t.tid] = t
        self._fresh.append(t)

    def next_chunk(self, stream: int, now: float = 0.0) -> Chunk | None:
        """The next chunk this stream should send, or None. Re-sends go first; a fresh
        transfer's chunk only while the stream carries fewer than its quota of them or
        once the quota lifted (`now` >= its spread_until; `opens_at` says when)."""
        self.opens_at = None
        for i, (t, off) in enumerate(self._resend):
            if _may(t, stream):
                del self._resend[i]
                return self._take(t, off, stream)
        for t in self._fresh:
            if _may(t, stream):
                if t.quota is not None and now < t.spread_until and len(t.sent_on.get(stream, ())) >= t.quota:
                    self.opens_at = t.spread_until if self.opens_at is None else min(self.opens_at, t.spread_until)
                    continue
                off = t.next_offset
                t.next_offset = off + t.meta.chunk_bytes
                if t.next_offset >= t.meta.total_bytes:
                    t.handed_out = True
                    self._fresh.remove(t)
                return self._take(t, off, stream)
        return None

    def _take(self, t: OutTransfer, off: int, stream: int) -> Chunk:
        with_meta = stream not in t.meta_sent_on
        t.meta_sent_on.add(stream)
        t.sent_on.setdefault(stream, []).append(off)
        length = t.meta.chunk_length(off) if t.meta.total_bytes else 0
        return Chunk(t, off, length, with_meta)

    def pending_chunks(self) -> int:
        """Chunks no stream has taken yet (fresh and queued again)."""
        fresh = sum(-(-max(0, t.meta.total_bytes - t.next_offset) // t.meta.chunk_bytes) or
                    (0 if t.handed_out else 1) for t in self._fresh)
        return fresh + len(self._resend)

    def pending_bytes(self) -> int:
        """Bytes of chunks no stream has taken yet (fresh and queued again)."""
        fresh = sum(max(0, t.meta.total_bytes - t.next_offset) for t in self._fresh)
        return fresh + sum(t.meta.chunk_length(off) for t, off in self._resend)

    def stream_lost(self, stream: int) -> list[int]:
        """Queue again every unconfirmed chunk the lost stream carried; returns the ids
        of all unconfirmed transfers, whose DONE may have been lost with the stream."""
        for t in self.inflight.values():
            t.quota = None
            if t.soft_lanes:
                t.lanes = None
            t.meta_sent_on.discard(stream)
            for off in t.sent_on.pop(stream, ()):
                self._resend.append((t, off))
                self.resent += 1
        return list(self.inflight)

    def complete(self, tid: int) -> OutTransfer | None:
        t = self.inflight.pop(tid, None)
        if t is None:
            return None  # a repeated DONE (answer to a QUERY): nothing to do
        self._drop(t)
        return t

    def abort_all(self) -> list[OutTransfer]:
        out = list(self.inflight.values())
        self.inflight.clear()
        self._fresh.clear()
        self._resend.clear()
        return out

    def _drop(self, t: OutTransfer) -> None:
        if t in self._fresh:
            self._fresh.remove(t)
        self._resend = deque(x for x in self._resend if x[0] is not t)


def _may(t: OutTransfer, stream: int) -> bool:
    return t.lanes is None or stream < t.lanes


@dataclass(eq=False)
class InTransfer:
    tid: int
    meta: TensorMeta
    view: memoryview | None = None  # where chunks are written; set by the channel
    owner: Any = None  # channel-side state (destination tensor, request)
    bitmap: bytearray = field(default_factory=bytearray)
    received: int = 0  # chunks landed
    writers: int = 0  # streams writing into view right now
    finished: bool = False

    @property
    def bytes_received(self) -> int:
        return min(self.meta.total_bytes, self.received * self.meta.chunk_bytes)


class Reassembly:
    """Incoming transfers of one channel (one direction)."""

    def __init__(self) -> None:
        self.active: dict[int, InTransfer] = {}
        self._done_below = 0  # every tid below this is complete
        self._done_above: set[int] = set()

    def is_complete(self, tid: int) -> bool:
        return tid < self._done_below or tid in self._done_above

    def drop_all(self) -> list[InTransfer]:
        """Forget every unfinished transfer (the channel failed); returns them."""
        out = list(self.active.values())
        self.active.clear()
        return out

    def announce(self, tid: int, meta: TensorMeta) -> tuple[InTransfer | None, bool]:
        """Register a description; returns (transfer or None if already complete, is_new)."""
        if self.is_complete(tid):
            return None, False
        t = self.active.get(tid)
        if t is not None:
            if t.meta != meta:
                raise ProtocolError(f"transfer {tid} re-announced as {meta.describe()}, was {t.meta.describe()}")
            return t, False
        t = InTransfer(tid, meta, bitmap=bytearray(meta.n_chunks))
        self.active[tid] = t
        return t, True

    def begin_chunk(self, tid: int, offset: int, length: int) -> InTransfer | None:
        """A chunk header arrived: the transfer to write into, or None to discard the payload."""
        t = self.active.get(tid)
        if t is None:
            if self.is_complete(tid):
                return None
            raise ProtocolError(f"DATA for transfer {tid} arrived before its description")
        index = check_chunk(t.meta, offset, length)
        if t.bitmap[index]:
            return None
        t.writers += 1
        return t

    def end_chunk(self, t: InTransfer, offset: int, ok: bool) -> bool:
        """The payload was read (ok) or the stream broke (not ok). True exactly once:
        when the transfer is whole and nobody writes into it any more."""
        t.writers -= 1
        if ok:
            index = offset // t.meta.chunk_bytes if t.meta.total_bytes else 0
            if not t.bitmap[index]:
                t.bitmap[index] = 1
                t.received += 1
        return self._maybe_finish(t)

    def _maybe_finish(self, t: InTransfer) -> bool:
        if t.finished or t.writers or t.received < len(t.bitmap):
            return False
        t.finished = True
        del self.active[t.tid]
        self._done_above.add(t.tid)
        while self._done_below in self._done_above:
            self._done_above.remove(self._done_below)
            self._done_below += 1
        return True
