"""The channels of one process group: one atlas `Channel` per pair of ranks, opened
on first use, and the sends and receives posted on them.

Each rank listens on its own address from the start (published in the group's store);
for a pair, the higher rank connects and the lower accepts, so exactly one channel
exists per pair and no order of first uses can deadlock. The connector introduces
itself with a HELLO tensor (its rank and the group's token) since every rank of a
group may share one address. Operations posted before the channel is open wait in a
per-peer queue and are posted on it, in order, the moment it opens, so `isend` and
`irecv` never block.

Congestion control: unless the group sets one (AtlasOptions.congestion /
ATLAS_CONGESTION), a channel whose streams measure an RTT of LAN_RTT_S or more
follows what it sends, where the kernel offers both algorithms:
- small bursts (FSDP's all-gathers and reduce-scatters of a few hundred KiB, one
  after another): SMALL_CONGESTION (cubic), streams kept warm (`Channel.keep_warm`:
  a PING every KEEP_WARM_S, under Linux's smallest retransmission timeout, so a
  stream's window survives the gaps between bursts: tcp_slow_start_after_idle
  halves it every RTO of idleness). A burst within the window leaves at line rate.
  A channel starts this way.
- a send of BIG_SHARE_BYTES per stream or more (DDP's gradient shards, pipeline
  activations): WAN_CONGESTION (BBR), switched before that send starts. BBR keeps its
  bandwidth estimate across idle periods and resumes at that rate; cubic's windows
  would be cut by losses and idleness between such bursts.
- back to cubic once the channel's last BURST_WINDOW sends were all small: BBR learns
  a stream's bandwidth from how fast its bursts are delivered, and a burst much
  smaller than the bandwidth-delay product is delivered in about one RTT whatever the
  rate, so on small bursts its estimate stays low (it never leaves STARTUP) and it
  paces each burst over tens of milliseconds (a stream that ran BBR stays paced,
  at 1.2 x cwnd / RTT, under cubic: still far faster)."""

from __future__ import annotations

import logging
import socket
import threading
import time
import zlib
from collections import deque
from dataclasses import replace

import torch

from ..config import TransportConfig
from ..endpoints import connect, listen
from ..errors import AuthenticationError, ChannelClosed, ConnectError, ShapeMismatch, TransportError
from ..sockets import available_congestion
from .options import LAN_RTT_S, WAN_STREAMS, AtlasOptions
from .rendezvous import PeerAddress, addr_key, group_secret, own_address
from .work import AtlasError

log = logging.getLogger("atlas_transport.torch")

COLL_TAG = 1 << 62  # every collective's traffic: collectives run one at a time, in order
HELLO_TAG = COLL_TAG + 1
MAX_P2P_TAG = COLL_TAG - 1
WAN_CONGESTION = "bbr"
SMALL_CONGESTION = "cubic"
BURST_WINDOW = 16  # sends that decide a WAN channel's congestion control
BIG_SHARE_BYTES = 256 << 10  # a send this large per stream (8 streams: 2 MiB) is a BBR burst
KEEP_WARM_S = 0.1  # under Linux's 200 ms minimum RTO


def rtt_to(host: str, port: int, tries: int = 3, timeout: float = 5.0) -> float:
    """Smallest TCP connect time to host:port over `tries` (one round trip each)."""
    best = float("inf")
    for _ in range(tries):
        t0 = time.perf_counter()
        with socket.create_connection((host, port), timeout=timeout):
            best = min(best, time.perf_counter() - t0)
    return best


def default_streams(rtt_s: float) -> int:
    """1 stream on a LAN (under LAN_RTT_S), WAN_STREAMS beyond."""
    return 1 if rtt_s < LAN_RTT_S else WAN_STREAMS


class PeerOp:
    """One send or receive with one peer, posted on the pair's channel once it is open."""

    def __init__(self, kind: str, peer: int, tensor: torch.Tensor, tag: int, deadline: float, what: str) -> None:
        self.kind, self.peer, self.tensor, self.tag = kind, peer, tensor, tag
        self.deadline, self.what = deadline, what
        self.posted = threading.Event()
        self.handle = None
        self.error: BaseException | None = None

    def start(self, ch) -> None:
        try:
            if self.kind == "send":
                self.handle = ch.isend(self.tensor, self.tag)
            else:
                self.handle = ch.irecv_into(self.tensor, self.tag)
        except Exception as exc:  # noqa: BLE001 - handed to whoever waits on the op
            self.error = exc
        self.posted.set()

    def fail(self, exc: BaseException) -> None:
        self.error = exc
        self.posted.set()

    def done(self) -> bool:
        return self.posted.is_set() and (self.error is not None or self.handle.done())


class PeerMesh:
    """Listener, channels and per-peer queues of one process group on one rank."""

    def __init__(self, rank: int, size: int, store, opts: AtlasOptions, timeout_s: float, group: str,
                 global_ranks: list[int]) -> None:
        self.rank, self.size, self.store, self.opts = rank, size, store, opts
        self.timeout_s, self.group = timeout_s, group
        self.global_ranks = global_ranks or list(range(size))
        self.token = zlib.crc32(group.encode()) & 0x7FFFFFFF
        idle = opts.idle_timeout_s or max(1.0, min(30.0, timeout_s / 2))
        self.cfg = TransportConfig(streams=1, secret=group_secret(store, rank), congestion=opts.congestion,
                                   pacing_rate_mbps=opts.pacing_rate_mbps, idle_timeout_s=idle,
                                   connect_timeout_s=max(1.0, min(10.0, timeout_s)))
        self.host = own_address(opts.bind_addr, store)
        try:
            self.listener = listen(self.host, 0, self.cfg)
        except ConnectError as exc:
            raise AtlasError(f"atlas: rank {self.describe(rank)} of group {group!r}: {exc}; set ATLAS_BIND_ADDR "
                             "to an address of this host that the other ranks can reach") from None
        self._ping = socket.socket(socket.AF_INET6 if ":" in self.host else socket.AF_INET)
        self._ping.bind((self.host, 0))
        self._ping.listen(64)
        self._closed = False
        self._peers = {r: _Peer(r) for r in range(size) if r != rank}
        self.streams_used: dict[int, int] = {}
        store.set(addr_key(rank), PeerAddress(self.host, self.listener.port, self._ping.getsockname()[1]).encode())
        for target, name in ((self._accept_loop, "accept"), (self._ping_loop, "ping")):
            threading.Thread(target=target, daemon=True, name=f"atlas-pg{group}-{name}").start()

    # --- naming ------------------------------------------------------------------

    def describe(self, rank: int) -> str:
        g = self.global_ranks[rank]
        return f"{rank}" if g == rank else f"{rank} (global rank {g})"

    # --- posting -----------------------------------------------------------------

    def post(self, op: PeerOp) -> None:
        """Post `op` on its peer's channel now, or queue it until the channel opens."""
        p = self._peer(op.peer)
        with p.lock:
            if p.error is not None:
                op.fail(self._earlier(op, p.error))
            elif p.channel is not None:
                if p.adaptive and op.kind == "send":
                    self._adapt(p, op.tensor.numel() * op.tensor.element_size())
                op.start(p.channel)
            else:
                p.pending.append(op)
                if self.rank > op.peer and not p.opening:
                    p.opening = True
                    threading.Thread(target=self._connect, args=(op.peer,), daemon=True,
                                     name=f"atlas-pg{self.group}-connect-{op.peer}").start()

    def wait(self, op: PeerOp, out_only: bool = False) -> None:
        """Wait for `op` until its deadline; errors name the peer rank and the operation.
        `out_only` (a send): until its bytes were handed to the kernel, not for the
        peer's DONE."""
        peer = f"rank {self.describe(op.peer)}"
        direction = "to" if op.kind == "send" else "from"
        if not op.posted.wait(max(0.0, op.deadline - time.monotonic())):
            side = ("did not accept the connection" if self.rank > op.peer
                    else "never connected (is it running, and did it reach the matching operation?)")
            self.peer_failed(op.peer, AtlasError(
                f"atlas: {op.what} {direction} {peer} (group {self.group!r}): no channel to {peer} after "
                f"{self.timeout_s:g} s (the process group's timeout): {peer} {side}"))
        if op.error is not None:
            if isinstance(op.error, AtlasError):
                raise op.error
            err = AtlasError(f"atlas: {op.what} {direction} {peer} (group {self.group!r}) failed: {op.error}")
            self.peer_failed(op.peer, err)
            raise err
        try:
            left = max(0.0, op.deadline - time.monotonic())
            if out_only and op.kind == "send":
                op.handle.wait_out(left)
            else:
                op.handle.wait(left)
        except TimeoutError:
            other = "recv" if op.kind == "send" else "send"
            err = AtlasError(
                f"atlas: {op.what} {direction} {peer} (group {self.group!r}, tag {op.tag if op.tag < COLL_TAG else 'collective'}) "
                f"did not complete within {self.timeout_s:g} s (the process group's timeout): {peer} is silent "
                f"(stopped or hung) or never posted the matching {other}")
            self.peer_failed(op.peer, err)
            raise err from None
        except ShapeMismatch as exc:
            # The peer is alive and sent what its program holds. Our own sends of this
            # operation still reach it before the channel closes (it names the mismatch
            # from its side, not a closed channel), and this operation raises its own
            # cause even where another wait on the peer failed first (an abandoned
            # receive failing as the peer closes its side after its own mismatch).
            err = AtlasError(f"atlas: {op.what} {direction} {peer} (group {self.group!r}) failed: {exc}")
            self._fail_quietly(op.peer, err, flush_s=max(0.5, op.deadline - time.monotonic()))
            raise err from None
        except TransportError as exc:
            err = AtlasError(f"atlas: {op.what} {direction} {peer} (group {self.group!r}) failed: lost {peer}: {exc}")
            self.peer_failed(op.peer, err)
            raise err from None

    def _earlier(self, op: PeerOp, err: AtlasError) -> AtlasError:
        peer = f"rank {self.describe(op.peer)}"
        direction = "to" if op.kind == "send" else "from"
        return AtlasError(f"atlas: {op.what} {direction} {peer} (group {self.group!r}): {peer} failed earlier: {err}")

    def peer_failed(self, peer: int, err: AtlasError, flush_s: float = 0.5) -> None:
        """Fail every queued and later operation with `peer`, and close its channel so
        the peer's own waits end too, after at most `flush_s` for the sends already on
        it to be confirmed (a lost peer confirms none; a live one reads them); raises
        `err`."""
        p = self._peer(peer)
        with p.lock:
            first = p.error is None
            if first:
                p.error = err
            pending, p.pending = p.pending, []
            ch = p.channel if first else None
        for op in pending:
            op.fail(self._earlier(op, p.error))
        if ch is not None:
            threading.Thread(target=ch.close, kwargs={"timeout": flush_s}, daemon=True).start()
        raise p.error

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.listener.close()
        try:
            self._ping.shutdown(socket.SHUT_RDWR)  # wakes the ping thread's accept()
        except OSError:
            pass
        try:
            self._ping.close()
        except OSError:
            pass
        for p in self._peers.values():
            with p.lock:
                ch, p.channel = p.channel, None
                if p.error is None:
                    p.error = AtlasError(f"atlas: group {self.group!r} was shut down on rank {self.describe(self.rank)}")
                pending, p.pending = p.pending, []
            for op in pending:
                op.fail(p.error)
            if ch is not None:
                ch.close(timeout=2.0)

    # --- opening channels ----------------------------------------------------------

    def _peer(self, peer: int) -> _Peer:
        p = self._peers.get(peer)
        if p is None:
            raise ValueError(f"atlas: rank {peer} is not a peer of rank {self.rank} in group {self.group!r} "
                             f"(size {self.size})")
        return p

    def rtt(self, peer: int, tries: int = 3) -> float:
        """Seconds of one round trip to `peer` (smallest of `tries` TCP connects to its
        ping socket); OSError when it cannot be reached."""
        addr = PeerAddress.decode(self.store.get(addr_key(peer)), peer)
        return rtt_to(addr.host, addr.ping_port, tries=tries, timeout=self.cfg.connect_timeout_s)

    def _streams_for(self, addr: PeerAddress, peer: int) -> int | str:
        if self.opts.streams is not None:
            return self.opts.streams
        rtt = rtt_to(addr.host, addr.ping_port, timeout=self.cfg.connect_timeout_s)
        n = default_streams(rtt)
        log.info("atlas: rank %d -> rank %d: RTT %.2f ms, %d stream(s)", self.rank, peer, rtt * 1e3, n)
        return n

    def _connect(self, peer: int) -> None:
        deadline = time.monotonic() + self.timeout_s
        what = f"the channel from rank {self.describe(self.rank)} to rank {self.describe(peer)} (group {self.group!r})"
        try:
            addr = PeerAddress.decode(self.store.get(addr_key(peer)), peer)
            cfg = replace(self.cfg, streams=self._streams_for(addr, peer))
            while True:
                try:
                    ch = connect(addr.host, addr.port, cfg)
                    break
                except AuthenticationError as exc:
                    raise AtlasError(f"atlas: {what}: {exc} (do all ranks set the same ATLAS_SECRET, or none?)") \
                        from None
                except (ConnectError, OSError) as exc:
                    if time.monotonic() > deadline or self._closed:
                        raise AtlasError(f"atlas: {what}: cannot connect to {addr.host}:{addr.port}: {exc}") \
                            from None
                    time.sleep(0.1)
            ch.isend(torch.tensor([self.rank, self.token], dtype=torch.int64), HELLO_TAG)
            self._attach(peer, ch)
        except AtlasError as exc:
            self._fail_quietly(peer, exc)
        except Exception as exc:  # noqa: BLE001 - store timeouts, probe failures: fail the peer's ops
            self._fail_quietly(peer, AtlasError(f"atlas: {what}: {type(exc).__name__}: {exc}"))

    def _fail_quietly(self, peer: int, err: AtlasError, flush_s: float = 0.5) -> None:
        try:
            self.peer_failed(peer, err, flush_s)
        except AtlasError:
            pass

    def _tune_wan(self, peer: int, ch) -> bool:
        """A channel across a WAN, unless the group chose its congestion control, starts
        on SMALL_CONGESTION with warm streams and follows its sends (see `_adapt`); True
        when it does."""
        if self.opts.congestion is not None:
            return False
        avail = available_congestion()
        if WAN_CONGESTION not in avail or SMALL_CONGESTION not in avail:
            return False
        rtt = ch.rtt_s()
        if rtt is None or rtt < LAN_RTT_S:
            return False
        ok = ch.set_congestion(SMALL_CONGESTION)
        if ok:
            ch.keep_warm(KEEP_WARM_S)
        log.info("atlas: rank %d <-> rank %d: RTT %.1f ms: %s", self.rank, peer, rtt * 1e3,
                 f"streams use {SMALL_CONGESTION}, {WAN_CONGESTION} for large sends" if ok
                 else f"the kernel refused {SMALL_CONGESTION}, default kept")
        return ok

    def _adapt(self, p: _Peer, nbytes: int) -> None:
        """Count a send on `p`'s WAN channel and switch its congestion control when its
        recent sends call for the other one (see the module docstring). p.lock held."""
        ch = p.channel
        p.recent.append(nbytes)
        big = nbytes >= BIG_SHARE_BYTES * max(1, ch.streams)
        if big and p.congestion != WAN_CONGESTION:
            want = WAN_CONGESTION
        elif (not big and p.congestion == WAN_CONGESTION and len(p.recent) == BURST_WINDOW
              and max(p.recent) < BIG_SHARE_BYTES * max(1, ch.streams)):
            want = SMALL_CONGESTION
        else:
            return
        if not ch.set_congestion(want):
            p.adaptive = False  # the kernel refused (some streams may have switched): stop trying
            log.info("atlas: rank %d <-> rank %d: the kernel refused %s; congestion control left as it is",
                     self.rank, p.rank, want)
            return
        p.congestion = want
        ch.keep_warm(None if want == WAN_CONGESTION else KEEP_WARM_S)
        log.debug("atlas: rank %d <-> rank %d: %s sends: streams use %s", self.rank, p.rank,
                  "large" if big else "small", want)

    def _attach(self, peer: int, ch) -> None:
        adaptive = self._tune_wan(peer, ch)
        p = self._peer(peer)
        with p.lock:
            if p.channel is not None or p.error is not None or self._closed:
                dup = True
            else:
                dup = False
                p.channel = ch
                p.adaptive, p.congestion = adaptive, SMALL_CONGESTION if adaptive else None
                self.streams_used[peer] = ch.streams
                pending, p.pending = p.pending, []
                for op in pending:
                    if adaptive and op.kind == "send":
                        self._adapt(p, op.tensor.numel() * op.tensor.element_size())
                    op.start(ch)
        if dup:
            ch.close(timeout=0.5)

    def _accept_loop(self) -> None:
        while not self._closed:
            try:
                ch = self.listener.accept(timeout=0.5)
            except TimeoutError:
                continue
            except (ChannelClosed, OSError):
                return
            threading.Thread(target=self._greet, args=(ch,), daemon=True,
                             name=f"atlas-pg{self.group}-greet").start()

    def _greet(self, ch) -> None:
        try:
            hello = ch.recv(HELLO_TAG, timeout=self.cfg.connect_timeout_s)
            peer, token = (int(v) for v in hello.tolist())
        except (TransportError, TimeoutError, ValueError) as exc:
            log.warning("atlas: group %r rank %d dropped a channel from %s: no valid HELLO (%s)",
                        self.group, self.rank, ch.peer, exc)
            ch.close(timeout=0.5)
            return
        if token != self.token or not self.rank < peer < self.size:
            log.warning("atlas: group %r rank %d dropped a channel from %s claiming rank %d of group token %d",
                        self.group, self.rank, ch.peer, peer, token)
            ch.close(timeout=0.5)
            return
        self._attach(peer, ch)

    def _ping_loop(self) -> None:
        while not self._closed:
            try:
                conn, _ = self._ping.accept()
            except OSError:
                return
            conn.close()


class _Peer:
    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.lock = threading.Lock()
        self.channel = None
        self.pending: list[PeerOp] = []
        self.error: AtlasError | None = None
        self.opening = False
        self.adaptive = False  # a WAN channel that follows its sends (PeerMesh._adapt)
        self.congestion: str | None = None
        self.recent: deque[int] = deque(maxlen=BURST_WINDOW)  # bytes of its last sends
