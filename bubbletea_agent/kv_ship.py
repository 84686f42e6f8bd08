"""KV-cache shipping from a prefill agent to a decode host over `atlas_transport`.

Wire format (version 2), per request, on one channel (`send(tensor, tag)` / `recv(tag)`):

    tag HEADER  int64[20]  MAGIC_KV, version, seq, materialised shape (5), logical shape (5),
                           dtype code, mode code (0 real, 1 modelled), filler bytes, digest
                           (xxh64 of every payload and filler byte, as int64), first token
                           (real engine; -1 none), wire bytes (payload + filler), 0
    tag ID      uint8[n]   request id, UTF-8
    tag PAYLOAD uint8[...] keys and values stacked [2, layers, batch, kv_heads, tokens, head_dim],
                           sent as raw bytes (any dtype crosses any transport)
    tag FILLER  uint8[...] only for scaled-down (modelled) caches with `pad_to_logical`: bytes
                           that make the wire carry the true cache size times `wire_scale` (the
                           workload's wire/real size ratio), in pieces of at most FILLER_PIECE
    <- tag ACK  int64[8]   MAGIC_ACK, seq, arrival time (ns, decode host's clock), bytes received,
                           status (ACK_OK, ACK_DIGEST_MISMATCH, ACK_TOO_LARGE), decode check
                           (-1 not run, 0 failed, 1 passed), next token decoded, reference's

The decode host checks every cache: its digest against the header's (a mismatch is refused:
the request is not served, the sender reports it), its size against what it accepts
(`max_cache_bytes`: refused after draining the bytes, so the channel stays in step), and,
holding the same model (`DecodeServer(checker=...)`, a real engine's cache), one decode step
from it against the same model run in one process (decode_check.py).

A HEADER whose first element is MAGIC_PING is a hello, answered at once with an ACK carrying
seq -1, the host's clock, the largest cache it accepts (0: any) and its version: the sender
sends one when it connects, refuses too large caches before they cross, and, when the two
hosts do not share a clock, estimates the one-way delay from it. In the testbed all hosts
are namespaces of one machine and share its `time.time()` clock (the device timeline's),
so the decode host's arrival stamp is used directly (`shared_clock`).

TTFT ends when the whole cache has arrived at the decode host. The messages of one cache
are posted together (`isend`) so a long-RTT path costs one round trip, not one per tensor.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import torch
import xxhash

from bubbletea_agent.engine import KVCache, checked_wire_scale

log = logging.getLogger(__name__)

MAGIC_KV = 0x4B56_4254  # "KVBT"
MAGIC_PING = 0x5049_4E47
MAGIC_ACK = 0x41434B21
VERSION = 2
HEADER_LEN, ACK_LEN = 20, 8
ACK_OK, ACK_DIGEST_MISMATCH, ACK_TOO_LARGE = 0, 1, 2
ACK_TIMEOUT_S = 60.0  # a decode host that answers nothing this long after a cache is taken as gone
TAG_HEADER, TAG_ID, TAG_PAYLOAD, TAG_FILLER, TAG_ACK = 0x4B01, 0x4B02, 0x4B03, 0x4B04, 0x4B05
FILLER_PIECE = 16 << 20

_DTYPE_CODES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2, torch.float64: 3}
_CODE_DTYPES = {v: k for k, v in _DTYPE_CODES.items()}
_MODES = {"real": 0, "modelled": 1}


class ShipError(RuntimeError):
    """KV shipping failed or the peer spoke something else; says which request/peer."""


class ChannelLike(Protocol):
    def send(self, tensor: torch.Tensor, tag: int) -> Any: ...
    def recv(self, tag: int) -> torch.Tensor: ...


# --------------------------------------------------------------------------- packing


def pack(seq: int, request_id: str, kv: KVCache, pad_to_logical: bool = False,
         wire_scale: float = 1.0) -> list[tuple[int, torch.Tensor]]:
    """The (tag, tensor) messages that carry one KV cache."""
    if kv.keys.shape != kv.values.shape or kv.keys.dtype != kv.values.dtype:
        raise ShipError(f"request {request_id}: keys {tuple(kv.keys.shape)} and values "
                        f"{tuple(kv.values.shape)} differ in shape or dtype")
    if kv.keys.dtype not in _DTYPE_CODES:
        raise ShipError(f"request {request_id}: KV dtype {kv.keys.dtype} cannot be shipped")
    stacked = torch.stack([kv.keys, kv.values]).detach().to("cpu").contiguous()
    payload = stacked.view(-1).view(torch.uint8)
    filler = max(0, int(round(kv.logical_bytes * wire_scale)) - kv.materialised_bytes if pad_to_logical else 0)
    digest = xxhash.xxh64(payload.numpy())
    pieces = []
    left = filler
    if left:
        piece = torch.zeros(min(left, FILLER_PIECE), dtype=torch.uint8)
        while left:
            n = min(left, FILLER_PIECE)
            pieces.append(piece[:n])
            digest.update(piece[:n].numpy())
            left -= n
    header = torch.tensor(
        [MAGIC_KV, VERSION, seq, *kv.keys.shape, *kv.logical_shape,
         _DTYPE_CODES[kv.keys.dtype], _MODES.get(kv.mode, 0), filler, _signed(digest.intdigest()),
         -1 if kv.first_token is None else kv.first_token, payload.numel() + filler, 0], dtype=torch.int64)
    msgs = [(TAG_HEADER, header),
            (TAG_ID, torch.tensor(list(request_id.encode()), dtype=torch.uint8)),
            (TAG_PAYLOAD, payload)]
    msgs += [(TAG_FILLER, p) for p in pieces]
    return msgs


def _signed(u64: int) -> int:
    """An unsigned 64-bit digest as the int64 a header carries."""
    return u64 - (1 << 64) if u64 >= 1 << 63 else u64


def wire_bytes_of(kv: KVCache, pad_to_logical: bool = False, wire_scale: float = 1.0) -> int:
    """Bytes `pack` puts on the wire for this cache (payload plus filler)."""
    filler = int(round(kv.logical_bytes * wire_scale)) - kv.materialised_bytes if pad_to_logical else 0
    return kv.materialised_bytes + max(0, filler)


@dataclass
class Received:
    seq: int
    request_id: str
    keys: torch.Tensor
    values: torch.Tensor
    logical_shape: tuple[int, ...]
    mode: str
    wire_bytes: int
    arrival_ns: int
    digest_ok: bool = True
    first_token: int | None = None
    refused: str | None = None  # why the decode host refused it (digest mismatch, too large); None: accepted
    ack: Callable[[int, int, int], None] | None = None  # answer it: (decode check, next token, reference's)


def receive_one(ch: ChannelLike, clock_ns: Callable[[], int] = time.time_ns,
                peer: str = "peer", max_cache_bytes: int = 0, defer_ack: bool = False) -> Received | None:
    """Decode side: read one KV cache (answering hellos on the way; None when a hello was
    answered instead), check its digest and size (`max_cache_bytes`, 0: any) and
    acknowledge it. A refused cache (`Received.refused`) is drained and acknowledged with
    its status, and its tensors are empty. With `defer_ack` an accepted cache is not
    acknowledged yet: call `Received.ack(decode, next, next_ref)` after checking it."""
    header = ch.recv(TAG_HEADER)
    h = header.tolist()
    if h and h[0] == MAGIC_PING:
        ch.send(torch.tensor([MAGIC_ACK, -1, clock_ns(), max_cache_bytes, VERSION, 0, 0, 0],
                             dtype=torch.int64), TAG_ACK)
        return None
    if len(h) < 2 or h[0] != MAGIC_KV:
        raise ShipError(f"KV stream from {peer}: bad header {h[:4]} (not a BubbleTea KV sender?)")
    if h[1] != VERSION or len(h) != HEADER_LEN:
        raise ShipError(f"KV stream from {peer}: version {h[1]}, this decode server speaks {VERSION} "
                        "(agents and decode server must come from the same checkout)")
    seq, shape, logical = h[2], tuple(h[3:8]), tuple(h[8:13])
    dtype = _CODE_DTYPES.get(h[13])
    if dtype is None:
        raise ShipError(f"KV stream from {peer}: unknown dtype code {h[13]}")
    mode = "modelled" if h[14] == 1 else "real"
    filler, digest_sent, first_token, total = h[15], h[16], h[17], h[18]
    request_id = bytes(ch.recv(TAG_ID).tolist()).decode()
    too_large = max_cache_bytes > 0 and total > max_cache_bytes
    payload = ch.recv(TAG_PAYLOAD)
    nbytes = payload.numel()
    want = 2 * torch.Size(shape).numel() * torch.empty((), dtype=dtype).element_size()
    if nbytes != want:
        raise ShipError(f"KV stream from {peer}, request {request_id}: payload {nbytes} bytes, "
                        f"header promised {want}")
    digest = xxhash.xxh64(payload.contiguous().numpy())
    while filler > 0:
        piece = ch.recv(TAG_FILLER)
        filler -= piece.numel()
        nbytes += piece.numel()
        digest.update(piece.contiguous().numpy())
    arrival = clock_ns()
    digest_ok = _signed(digest.intdigest()) == digest_sent
    refused = None
    if too_large:
        refused = (f"KV cache of request {request_id} is {total} bytes; this decode host accepts at most "
                   f"{max_cache_bytes} (decode-server --max-cache-bytes)")
    elif not digest_ok:
        refused = (f"KV cache of request {request_id} arrived corrupted: xxh64 {digest.intdigest() & ((1 << 64) - 1):#x} "
                   f"over {nbytes} bytes, the sender's {digest_sent & ((1 << 64) - 1):#x}")
    status = ACK_TOO_LARGE if too_large else ACK_OK if digest_ok else ACK_DIGEST_MISMATCH

    def ack(decode: int = -1, nxt: int = -1, nxt_ref: int = -1) -> None:
        ch.send(torch.tensor([MAGIC_ACK, seq, arrival, nbytes, status, decode, nxt, nxt_ref],
                             dtype=torch.int64), TAG_ACK)

    if refused is not None:
        ack()
        empty = torch.empty(0, dtype=dtype)
        return Received(seq, request_id, empty, empty, logical, mode, nbytes, arrival, digest_ok,
                        None if first_token < 0 else first_token, refused)
    kv = payload.contiguous().view(dtype).view(2, *shape)
    if not defer_ack:
        ack()
    return Received(seq, request_id, kv[0], kv[1], logical, mode, nbytes, arrival, digest_ok,
                    None if first_token < 0 else first_token, None, ack if defer_ack else None)


# --------------------------------------------------------------------------- sender


@dataclass
class ShipResult:
    request_id: str
    seq: int
    sent_at: float  # sender clock, seconds (time.time())
    arrival: float  # arrival at the decode host, on the sender's clock
    wire_bytes: int
    error: str | None = None
    modelled_s: float = 0.0  # of arrival - sent_at: the modelled rest of the cache (see KVShipper)
    digest_ok: bool | None = None  # the decode host's digest check (None: never reached it)
    decode_ok: bool | None = None  # its decode check (None: not run: modelled cache or no model there)
    next_token: int | None = None  # decoded from the shipped cache
    next_token_ref: int | None = None  # the one-process reference's


class KVShipper:
    """Sender side over one channel; one request at a time, in order.

    On connecting it says hello (one round trip): the decode host answers with its clock
    and the largest cache it accepts; a larger cache is refused here, before it crosses.
    A cache scaled down on the wire (`wire_scale` < 1) stands for the whole one: with
    `rest_rate_bps` the bytes that did not cross (true size minus wire bytes) are charged
    at that rate on a modelled link after the measured arrival, queued behind the rest
    of earlier caches, so TTFT is what the whole cache would take on a link of that rate.
    `max_rate_bps` paces shipping: a cache's wire bytes occupy at least bytes/rate
    seconds before the next one starts (for paths shared with training, e.g. a WAN).
    A channel that fails (the decode host died, the network cut) is a ShipError naming
    `peer`; the shipper is then `broken`."""

    def __init__(self, channel: ChannelLike, *, shared_clock: bool = True,
                 pad_to_logical: bool = False, wire_scale: float = 1.0,
                 rest_rate_bps: float | None = None, max_rate_bps: float | None = None,
                 clock: Callable[[], float] = time.time, sleep: Callable[[float], None] = time.sleep,
                 peer: str = "the decode host", ack_timeout_s: float = ACK_TIMEOUT_S) -> None:
        for name, rate in (("rest_rate_bps", rest_rate_bps), ("max_rate_bps", max_rate_bps)):
            if rate is not None and not rate > 0:
                raise ShipError(f"KV shipper: {name} must be > 0 bits/s, got {rate}")
        self.ch = channel
        self.shared_clock = shared_clock
        self.pad = pad_to_logical
        self.wire_scale = checked_wire_scale(wire_scale, ShipError)
        self.rest_rate_bps = rest_rate_bps
        self.max_rate_bps = max_rate_bps
        self.clock = clock
        self.sleep = sleep
        self.peer = peer
        self.ack_timeout_s = ack_timeout_s
        self.seq = 0
        self.broken: str | None = None
        self._link_free = 0.0  # the modelled link is busy with earlier caches' rest until then
        rtt, self.max_cache_bytes = self.hello()
        self.one_way_s = 0.0 if shared_clock else rtt / 2

    def hello(self) -> tuple[float, int]:
        """(round-trip time, largest cache the decode host accepts, 0: any)."""
        t0 = self.clock()
        try:
            self.ch.send(torch.tensor([MAGIC_PING, VERSION] + [0] * (HEADER_LEN - 2), dtype=torch.int64),
                         TAG_HEADER)
            ack = self._ack(-1, "hello")
        except ShipError:
            raise
        except Exception as exc:  # noqa: BLE001 - transport errors, named below
            raise ShipError(f"{self.peer} did not answer the KV hello ({type(exc).__name__}: {exc}): "
                            "is a BubbleTea decode server listening there?") from None
        if ack[4] != VERSION:
            raise ShipError(f"{self.peer} speaks KV version {ack[4]}, this agent {VERSION} "
                            "(agents and decode server must come from the same checkout)")
        return self.clock() - t0, int(ack[3])

    def _ack(self, seq: int, what: str) -> list[int]:
        try:
            ack = self.ch.recv(TAG_ACK, timeout=self.ack_timeout_s).tolist()  # type: ignore[call-arg]
        except TimeoutError:
            raise ShipError(f"{self.peer} did not acknowledge {what} within {self.ack_timeout_s:.0f} s "
                            "(decode server hung or overloaded?)") from None
        if len(ack) != ACK_LEN or ack[0] != MAGIC_ACK or ack[1] != seq:
            raise ShipError(f"{self.peer} answered {ack} to KV message {seq} (expected an ack for it)")
        return ack

    def ship(self, request_id: str, kv: KVCache) -> ShipResult:
        if self.broken is not None:
            raise ShipError(self.broken)
        size = wire_bytes_of(kv, self.pad, self.wire_scale)
        if self.max_cache_bytes and size > self.max_cache_bytes:
            raise ShipError(f"KV cache of request {request_id} is {size} bytes; {self.peer} accepts at most "
                            f"{self.max_cache_bytes} (its decode-server --max-cache-bytes): not sent")
        seq = self.seq
        self.seq += 1
        sent_at = self.clock()
        msgs = pack(seq, request_id, kv, self.pad, self.wire_scale)
        try:
            isend = getattr(self.ch, "isend", None)
            if isend is None:
                for tag, tensor in msgs:
                    self.ch.send(tensor, tag)
            else:
                for handle in [isend(tensor, tag) for tag, tensor in msgs]:
                    handle.wait()
            ack = self._ack(seq, f"the KV cache of request {request_id}")
        except Exception as exc:  # noqa: BLE001 - the channel is gone: say which host and what to check
            if isinstance(exc, ShipError) and "did not acknowledge" not in str(exc):
                raise
            self.broken = (f"lost {self.peer} while shipping the KV cache of request {request_id} "
                           f"({type(exc).__name__}: {exc}): did its decode server die? see its log")
            raise ShipError(self.broken) from None
        if self.shared_clock:
            arrival = ack[2] / 1e9
        else:
            arrival = self.clock() - self.one_way_s
        wire, status, decode = ack[3], ack[4], ack[5]
        if status == ACK_DIGEST_MISMATCH:
            return ShipResult(request_id, seq, sent_at, arrival, wire, digest_ok=False,
                              error=f"{self.peer} refused the KV cache of request {request_id}: its xxh64 "
                                    f"digest over {wire} bytes differs from the one sent (corrupted on the way)")
        if status == ACK_TOO_LARGE:
            return ShipResult(request_id, seq, sent_at, arrival, wire, digest_ok=None,
                              error=f"{self.peer} refused the KV cache of request {request_id}: {wire} bytes "
                                    "is more than it accepts (decode-server --max-cache-bytes)")
        modelled = 0.0
        if self.rest_rate_bps is not None:
            rest_s = max(0, kv.logical_bytes - wire) * 8 / self.rest_rate_bps
            done = max(arrival, self._link_free) + rest_s
            self._link_free = done
            modelled, arrival = done - arrival, done
        if self.max_rate_bps is not None:
            left = sent_at + wire * 8 / self.max_rate_bps - self.clock()
            if left > 0:
                self.sleep(left)
        return ShipResult(request_id, seq, sent_at, arrival, wire, modelled_s=modelled, digest_ok=True,
                          decode_ok=None if decode < 0 else bool(decode),
                          next_token=None if decode < 0 else ack[6], next_token_ref=None if decode < 0 else ack[7])

    def close(self) -> None:
        close = getattr(self.ch, "close", None)
        if close is not None:
            try:
                close(timeout=1.0) if self.broken else close()
            except Exception as exc:  # noqa: BLE001 - closing a lost channel may fail; nothing is pending
                log.debug("closing the KV channel to %s: %s", self.peer, exc)


class AsyncShipper:
    """Ships in a background thread so the device loop never waits on the WAN.
    `submit()` queues, `poll()` returns finished results (errors included, never lost)."""

    def __init__(self, connect: Callable[[], KVShipper], max_queue: int = 64) -> None:
        self._connect = connect
        self._todo: queue.Queue[tuple[str, KVCache] | None] = queue.Queue(max_queue)
        self._done: queue.Queue[ShipResult] = queue.Queue()
        self._thread = threading.Thread(target=self._loop, name="kv-shipper", daemon=True)
        self._thread.start()

    def submit(self, request_id: str, kv: KVCache) -> None:
        """Queue a cache; ShipError at once if `max_queue` caches already wait (the link
        to the decode host cannot keep up): the request is rejected, never stalls the agent."""
        try:
            self._todo.put_nowait((request_id, kv))
        except queue.Full:
            raise ShipError(f"{self._todo.maxsize} KV caches already wait for the decode host link; "
                            f"{request_id} dropped") from None

    def pending(self) -> int:
        return self._todo.qsize()

    def poll(self) -> list[ShipResult]:
        out = []
        while True:
            try:
                out.append(self._done.get_nowait())
            except queue.Empty:
                return out

    def _loop(self) -> None:
        shipper: KVShipper | None = None
        error: str | None = None
        while True:
            item = self._todo.get()
            if item is None:
                break
            rid, kv = item
            if shipper is None and error is None:
                try:
                    shipper = self._connect()
                except Exception as exc:  # noqa: BLE001 - reported per request, never lost
                    error = f"cannot reach decode host: {exc}"
                    log.error("%s", error)
            if shipper is None:
                self._done.put(ShipResult(rid, -1, time.time(), float("nan"), 0, error))
                continue
            try:
                self._done.put(shipper.ship(rid, kv))
            except Exception as exc:  # noqa: BLE001
                log.error("shipping KV of %s failed: %s", rid, exc)
                self._done.put(ShipResult(rid, -1, time.time(), float("nan"), 0, str(exc)))
        if shipper is not None:
            shipper.close()

    def close(self, timeout: float = 30.0) -> None:
        """Finish what is queued, then stop."""
        self._todo.put(None)  # blocks only while the queue is full; the worker is draining it
        self._thread.join(timeout)


# --------------------------------------------------------------------------- in-memory channel


class _Done:
    def wait(self, timeout: float | None = None) -> None:
        return None


class MemoryChannel:
    """One end of an in-process channel pair with the transport's send/recv(tag) shape:
    for in-process agent runs (no network) and tests of the wire format."""

    def __init__(self, inbox: dict[int, queue.Queue], outbox: dict[int, queue.Queue],
                 lock: threading.Lock) -> None:
        self._in, self._out, self._lock = inbox, outbox, lock

    @staticmethod
    def pair() -> tuple[MemoryChannel, MemoryChannel]:
        a: dict[int, queue.Queue] = {}
        b: dict[int, queue.Queue] = {}
        lock = threading.Lock()
        return MemoryChannel(a, b, lock), MemoryChannel(b, a, lock)

    def _q(self, box: dict[int, queue.Queue], tag: int) -> queue.Queue:
        with self._lock:
            return box.setdefault(tag, queue.Queue())

    def send(self, tensor: torch.Tensor, tag: int) -> None:
        self._q(self._out, tag).put(tensor.clone())

    def isend(self, tensor: torch.Tensor, tag: int) -> _Done:
        self.send(tensor, tag)
        return _Done()

    def recv(self, tag: int, timeout: float | None = 30.0) -> torch.Tensor:
        try:
            return self._q(self._in, tag).get(timeout=timeout)
        except queue.Empty:
            raise TimeoutError(f"no message with tag {tag:#x} within {timeout} s") from None


# --------------------------------------------------------------------------- over atlas_transport


def transport_config(streams: int | str = 4, secret: bytes | str | None = None, **kw: Any) -> Any:
    """An atlas_transport TransportConfig (secret None: the ATLAS_SECRET environment variable)."""
    from atlas_transport.config import TransportConfig

    return TransportConfig(streams=streams, secret=secret, **kw)


def connect_shipper(host: str, port: int, *, streams: int | str = 4, secret: bytes | str | None = None,
                    shared_clock: bool = True, pad_to_logical: bool = False, wire_scale: float = 1.0,
                    rest_rate_bps: float | None = None, max_rate_bps: float | None = None,
                    **kw: Any) -> KVShipper:
    """A shipper over a new atlas_transport channel to a decode server."""
    from atlas_transport.endpoints import connect

    ch = connect(host, port, transport_config(streams, secret, **kw))
    return KVShipper(ch, shared_clock=shared_clock, pad_to_logical=pad_to_logical, wire_scale=wire_scale,
                     rest_rate_bps=rest_rate_bps, max_rate_bps=max_rate_bps,
                     peer=f"decode host {host}:{port}")


class DecodeServer:
    """The decode host's side: accepts agents' channels, receives KV caches, checks each
    (digest; size against `max_cache_bytes`, 0: any; with a `checker`, a
    decode_check.DecodeChecker holding the agents' model, one decode step from each real
    cache against the one-process reference), acknowledges each with its arrival time and
    the checks' outcome, and logs one JSON line per cache (`log_path`)."""

    def __init__(self, listener: Any, log_path: str | None = None, keep_tensors: bool = False,
                 checker: Any = None, max_cache_bytes: int = 0) -> None:
        self.listener = listener
        self.port: int = listener.port
        self.keep_tensors = keep_tensors
        self.checker = checker
        self.max_cache_bytes = max_cache_bytes
        self.checks: dict[str, Any] = {}  # request id -> its DecodeCheck
        self.refused: list[Received] = []
        self._check_lock = threading.Lock()
        self.received: list[Received] = []
        self.errors: list[str] = []
        self._cv = threading.Condition()
        self._stop = threading.Event()
        self._log = open(log_path, "a", buffering=1) if log_path else None  # noqa: SIM115
        self._threads: list[threading.Thread] = []
        self._channels: list[Any] = []
        self._accept = threading.Thread(target=self._accept_loop, name="kv-decode-accept", daemon=True)
        self._accept.start()

    @classmethod
    def start(cls, host: str, port: int, *, streams: int | str = 4, secret: bytes | str | None = None,
              log_path: str | None = None, keep_tensors: bool = True, checker: Any = None,
              max_cache_bytes: int = 0, **kw: Any) -> DecodeServer:
        from atlas_transport.endpoints import listen

        return cls(listen(host, port, transport_config(streams, secret, **kw)), log_path, keep_tensors,
                   checker, max_cache_bytes)

    def _check(self, rx: Received) -> Any:
        """The decode check of a real cache (None: no checker, or a modelled cache)."""
        if self.checker is None or rx.mode != "real" or rx.first_token is None:
            return None
        from bubbletea_agent.decode_check import DecodeCheck

        try:
            with self._check_lock:
                return self.checker.check(rx.request_id, rx.keys, rx.values, rx.first_token)
        except Exception as exc:  # noqa: BLE001 - a cache this model cannot use fails its check, says why
            log.warning("decode check of %s failed to run: %s", rx.request_id, exc)
            return DecodeCheck(False, rx.first_token, -1, -1, -1, float("nan"), 0.0, f"{type(exc).__name__}: {exc}")

    def _accept_loop(self) -> None:
        while not self._stop.is_set():
            try:
                ch = self.listener.accept(timeout=0.5)
            except TimeoutError:
                continue
            except Exception:  # noqa: BLE001 - listener closed
                return
            t = threading.Thread(target=self._serve, args=(ch,), name=f"kv-decode-{ch!r}", daemon=True)
            self._channels.append(ch)
            t.start()
            self._threads.append(t)

    def _serve(self, ch: Any) -> None:
        peer = getattr(ch, "peer", "peer")
        try:
            while not self._stop.is_set():
                rx = receive_one(ch, peer=peer, max_cache_bytes=self.max_cache_bytes, defer_ack=True)
                if rx is None:
                    continue
                check = None
                if rx.refused is not None:
                    log.warning("decode server: refused a KV cache from %s: %s", peer, rx.refused)
                else:
                    check = self._check(rx)
                    assert rx.ack is not None
                    if check is None:
                        rx.ack(-1, -1, -1)
                    else:
                        rx.ack(int(check.ok), check.next_token, check.next_token_ref)
                        if not check.ok:
                            log.warning("decode server: decode check failed: %s", check.detail)
                if self._log is not None:
                    self._log.write(json.dumps({
                        "request_id": rx.request_id, "seq": rx.seq, "peer": peer, "mode": rx.mode,
                        "arrival": rx.arrival_ns / 1e9, "wire_bytes": rx.wire_bytes,
                        "logical_shape": list(rx.logical_shape), "digest_ok": rx.digest_ok,
                        "refused": rx.refused,
                        "decode_check": None if check is None else check.to_json()}) + "\n")
                if not self.keep_tensors:
                    rx.keys = rx.values = torch.empty(0)
                rx.ack = None
                with self._cv:
                    if rx.refused is not None:
                        self.refused.append(rx)
                    else:
                        self.received.append(rx)
                        if check is not None:
                            self.checks[rx.request_id] = check
                    self._cv.notify_all()
        except Exception as exc:  # noqa: BLE001 - peer closed or spoke nonsense
            if not self._stop.is_set() and "closed" not in str(exc).lower():
                log.warning("decode server: channel from %s ended: %s", peer, exc)
                self.errors.append(f"{peer}: {exc}")
        finally:
            close = getattr(ch, "close", None)
            if close is not None:
                try:
                    close(timeout=1.0)
                except Exception:  # noqa: BLE001
                    pass

    def wait_for(self, n: int, timeout: float = 10.0) -> list[Received]:
        with self._cv:
            if not self._cv.wait_for(lambda: len(self.received) >= n, timeout):
                raise ShipError(f"decode server got {len(self.received)} KV caches, expected {n} "
                                f"within {timeout} s (errors: {self.errors or 'none'})")
            return list(self.received)

    def stop(self) -> None:
        """Stop accepting, end every agent's channel (their shippers then fail with a
        message naming this host), and close the log."""
        self._stop.set()
        self.listener.close()
        self._accept.join(2.0)
        for ch in self._channels:
            close = getattr(ch, "close", None)
            if close is not None:
                try:
                    close(timeout=0.5)
                except Exception:  # noqa: BLE001 - already gone
                    pass
        for t in self._threads:
            t.join(2.0)
        if self._log is not None:
            self._log.close()
