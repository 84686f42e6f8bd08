"""The delay line's I/O: two AF_PACKET sockets (PACKET_VNET_HDR, so GSO super-packets
pass whole), one `DelayQueue` per direction, one select() loop.

Fails closed: a frame leaves only from its queue at its deadline; on exit whatever is
queued is discarded. Never blocks: sockets are non-blocking and a frame the kernel
refuses (ENOBUFS when the HTB leaf is full, EAGAIN when the socket send buffer is) is
counted as a drop, so one direction can never stall the other.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import json
import math
import os
import resource
import select
import signal
import socket
import struct
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TextIO

from testbed.emulation.delayline import frames as fr
from testbed.emulation.delayline.batch import BatchReceiver, BatchSender
from testbed.emulation.delayline.control import (
    ControlError,
    QuitCommand,
    SetCommand,
    StatsCommand,
    parse_control,
)
from testbed.emulation.delayline.schedule import DelayQueue

SOL_PACKET = 263
PACKET_ADD_MEMBERSHIP = 1
PACKET_MR_PROMISC = 1
PACKET_STATISTICS = 6
PACKET_VNET_HDR = 15
PACKET_IGNORE_OUTGOING = 23
SO_SNDBUFFORCE = 32
SO_RCVBUFFORCE = 33
ETH_P_ALL = 3
PR_SET_PDEATHSIG = 1
PR_SET_TIMERSLACK = 29

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_VANISHED = 3

RECV_BUDGET = 64  # frames drained per socket per wakeup before serving deadlines
RECV_VLEN = 32  # frames per recvmmsg call
SEND_VLEN = 32  # frames per sendmmsg call
READ_EVERY_S = 0.002  # longest time between reads of a socket the loop is not woken by
MIN_BATCH_DELAY_S = 0.0005  # below this least delay a direction is read as frames arrive
IDLE_CHECK_S = 0.5  # how often to check that the interfaces still exist
SUSPECT_CHECK_S = 0.02  # ... after the kernel reported one of them down
_GONE = (errno.ENXIO, errno.ENODEV)


class RelayError(RuntimeError):
    """Setting up the relay failed; the message says what to do."""


class InterfaceGone(Exception):
    def __init__(self, name: str):
        super().__init__(name)
        self.name = name


@dataclass
class Port:
    """One interface: its socket (used for both receiving and sending) and buffer."""

    name: str
    ifindex: int
    sock: socket.socket
    buf: bytearray
    kernel_drops: int = 0

    def collect_kernel_drops(self) -> None:
        try:
            raw = self.sock.getsockopt(SOL_PACKET, PACKET_STATISTICS, 8)
        except OSError:
            return
        _packets, drops = struct.unpack("II", raw)
        self.kernel_drops += drops  # reading resets the kernel's counters


def _sender(sock: socket.socket) -> BatchSender | None:
    try:
        return BatchSender(sock, SEND_VLEN)
    except (OSError, AttributeError):
        return None  # one send() per frame


def _cpu_s() -> float:
    """CPU seconds this process has used (user + system, kernel work it did for its
    sends included)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def die_with_parent(expected_parent: int | None = None, sig: int = signal.SIGTERM) -> None:
    """Ask the kernel to send ``sig`` when our parent exits; exit at once if it already
    has (we were reparented before the request took effect)."""
    parent = os.getppid()
    libc = _libc()
    libc.prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0)
    libc.prctl(PR_SET_TIMERSLACK, 1, 0, 0, 0)  # wake up on time, not 50 us late
    if os.getppid() != parent or (expected_parent is not None and parent != expected_parent):
        print("delayline: parent process is gone; exiting", file=sys.stderr)
        raise SystemExit(EXIT_OK)


RELAY_RT_PRIORITY = 2
"""Above an agent's real-time hold (SCHED_FIFO 1, bubbletea_agent/agent.py): the emulated
network's packets never wait for an agent's bookkeeping."""


def set_scheduling(policy: str) -> str:
    """Keep deadlines under CPU contention: "fifo" (SCHED_FIFO priority `RELAY_RT_PRIORITY`,
    the default: the relay sleeps in select() and wakes on time even on a loaded machine,
    ahead of BubbleTea's real-time holds at priority 1; the kernel's RT throttling still
    leaves 5% to others), "nice" (-10) or "normal".
    Falls back to the next weaker policy when not permitted; returns what applied."""
    if policy == "fifo":
        try:
            os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(RELAY_RT_PRIORITY))
            return "fifo"
        except OSError:
            policy = "nice"
    if policy == "nice":
        try:
            os.setpriority(os.PRIO_PROCESS, 0, -10)
            return "nice"
        except OSError:
            pass
    return "normal"


def open_port(name: str, frame_max: int, rcvbuf: int, sndbuf: int, promisc: bool = True) -> Port:
    """A raw packet socket bound to one interface, with vnet headers, ignoring what
    this host itself transmits on it."""
    try:
        ifindex = socket.if_nametoindex(name)
    except OSError:
        raise RelayError(
            f"no interface {name!r} in this network namespace: start the delay line inside the "
            "WAN link node (e.g. mnexec -a <pid> or ip netns exec) with its two interface names"
        ) from None
    try:
        sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW | socket.SOCK_CLOEXEC, 0)
    except PermissionError:
        raise RelayError("AF_PACKET sockets need root (CAP_NET_RAW)") from None
    try:
        for opt, what in ((PACKET_VNET_HDR, "PACKET_VNET_HDR"), (PACKET_IGNORE_OUTGOING, "PACKET_IGNORE_OUTGOING")):
            try:
                sock.setsockopt(SOL_PACKET, opt, 1)
            except OSError as exc:
                raise OSError(exc.errno, f"this kernel lacks {what} (needs Linux >= 4.20): {exc.strerror}") from None
        for opt, size in ((SO_RCVBUFFORCE, rcvbuf), (SO_SNDBUFFORCE, sndbuf)):
            sock.setsockopt(socket.SOL_SOCKET, opt, size)
        # Protocol 0 at socket() receives nothing; bind() starts the flow on this
        # interface only, so no frame of another interface slips in.
        sock.bind((name, ETH_P_ALL))
        if promisc:  # dropped by the kernel when the socket closes
            mreq = struct.pack("iHH8s", ifindex, PACKET_MR_PROMISC, 0, b"")
            sock.setsockopt(SOL_PACKET, PACKET_ADD_MEMBERSHIP, mreq)
        sock.setblocking(False)
    except OSError as exc:
        sock.close()
        raise RelayError(f"cannot set up the packet socket on {name}: {exc}") from None
    return Port(name=name, ifindex=ifindex, sock=sock, buf=bytearray(frame_max + 1))


@dataclass
class _Way:
    """One direction of the loop: where frames come from and go to, and when its
    socket must next be read (inf: when select() says it is readable; ``backlog``: at
    once, the last read left frames behind) and from when a wake-up for a deadline reads
    it too (``read_after``: saves a wake-up of its own soon after)."""

    src: Port
    dst: Port
    queue: DelayQueue
    rx: BatchReceiver
    read_by: float = 0.0
    read_after: float = 0.0
    last_read: float = 0.0
    backlog: bool = False


class Relay:
    """Relays frames a->b and b->a through two DelayQueues until stopped."""

    def __init__(
        self,
        a: Port,
        b: Port,
        a2b: DelayQueue,
        b2a: DelayQueue,
        *,
        out: TextIO,
        control_fd: int | None = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.a, self.b = a, b
        self.a2b, self.b2a = a2b, b2a
        self.out = out
        self.control_fd = control_fd
        self.clock = clock
        self._stop = False
        self._exit_code = EXIT_OK
        self._control_buf = b""
        self._suspect = False
        self.wakeups = 0
        # set up now: the kernel stamps frames from here on, also those read late
        self._rx = (BatchReceiver(a.sock, len(a.buf), RECV_VLEN, clock=clock),
                    BatchReceiver(b.sock, len(b.buf), RECV_VLEN, clock=clock))
        self._tx = (_sender(a.sock), _sender(b.sock))

    # -- output ---------------------------------------------------------------------
    def say(self, line: str) -> None:
        try:
            self.out.write(line + "\n")
            self.out.flush()
        except (BrokenPipeError, ValueError, OSError):
            pass  # nobody listens any more; keep relaying until told to stop

    def stats(self) -> dict[str, object]:
        for port in (self.a, self.b):
            port.collect_kernel_drops()
        return {
            "a": self.a.name,
            "b": self.b.name,
            "a2b": {**self.a2b.counters.as_dict(), "queued": len(self.a2b), "params": self.a2b.params.describe()},
            "b2a": {**self.b2a.counters.as_dict(), "queued": len(self.b2a), "params": self.b2a.params.describe()},
            "kernel_drops": {"a": self.a.kernel_drops, "b": self.b.kernel_drops},
            "cpu_s": round(_cpu_s(), 6),
            "wakeups": self.wakeups,
        }

    # -- control --------------------------------------------------------------------
    def _on_control(self) -> None:
        assert self.control_fd is not None
        try:
            chunk = os.read(self.control_fd, 65536)
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        if not chunk:  # EOF: keep running with the current parameters
            self.control_fd = None
            return
        self._control_buf += chunk
        *lines, self._control_buf = self._control_buf.split(b"\n")
        for raw in lines:
            self.handle_control(raw.decode("utf-8", "replace"))

    def handle_control(self, line: str) -> None:
        try:
            cmd = parse_control(line)
            if cmd is None:
                return
            if isinstance(cmd, StatsCommand):
                self.say("STATS " + json.dumps(self.stats(), sort_keys=True))
            elif isinstance(cmd, QuitCommand):
                self.say("OK quit")
                self._stop = True
            elif isinstance(cmd, SetCommand):
                targets = {"a2b": [self.a2b], "b2a": [self.b2a], "both": [self.a2b, self.b2a]}[cmd.direction]
                new = [cmd.apply(q.params) for q in targets]  # validate all before changing any
                for q, params in zip(targets, new, strict=True):
                    q.set_params(params)
                self.say(f"OK a2b {self.a2b.params.describe()} b2a {self.b2a.params.describe()}")
        except ControlError as exc:
            self.say(f"ERROR {exc}")

    # -- data path ------------------------------------------------------------------
    def _check_alive(self, port: Port) -> None:
        try:
            index = socket.if_nametoindex(port.name)
        except OSError:
            raise InterfaceGone(port.name) from None
        if index != port.ifindex:  # deleted and re-created: not our link any more
            raise InterfaceGone(port.name)

    def _drain(self, port: Port, rx: BatchReceiver, queue: DelayQueue) -> bool:
        """Take every frame waiting on ``port`` (up to RECV_BUDGET), each held from its
        kernel receive stamp; False when the budget left some behind."""
        push = queue.push
        view, slot = rx.view, rx.slot
        smallest = fr.VNET_LEN + fr.ETH_LEN
        taken = 0
        while taken < RECV_BUDGET:
            try:
                got = rx.recv()
            except OSError as exc:
                if exc.errno == errno.ENETDOWN or exc.errno in _GONE:
                    self._suspect = True
                    self._check_alive(port)
                    return True
                raise
            for off, n, stamp in got:
                if n >= slot:  # MSG_TRUNC reports the real length
                    queue.counters.truncated += 1
                elif n >= smallest:
                    push(bytes(view[off : off + n]), stamp)
            taken += len(got)
            if len(got) < rx.vlen:
                return True
        return False

    def _flush(self, queue: DelayQueue, port: Port, now: float, tx: BatchSender | None = None) -> None:
        """Send every frame due by ``now``, several per system call when ``tx`` is given."""
        due = queue.take_due(now)
        if not due:
            return
        counters = queue.counters
        i, total = 0, len(due)
        while i < total:
            if tx is not None and total - i > 1:
                n, err = tx.send(due, i)
                queue.sent_all(due[i : i + n])
                i += n
                if not err:
                    continue
                i += 1  # the frame the kernel refused
            else:
                frame = due[i]
                i += 1
                try:
                    port.sock.send(frame)
                except OSError as exc:
                    err = exc.errno or 0
                else:
                    queue.sent(frame)
                    continue
            if err in (errno.ENOBUFS, errno.EAGAIN, errno.EINTR):
                counters.send_drops += 1
            elif err in _GONE:
                raise InterfaceGone(port.name)
            else:
                if err == errno.ENETDOWN:
                    self._suspect = True
                counters.send_errors += 1

    def stop(self) -> None:
        self._stop = True

    def run(self, wakeup_fd: int | None = None) -> int:
        """Relay until stopped (signal via ``wakeup_fd``, quit command) or until an
        interface vanishes (returns EXIT_VANISHED).

        Every frame carries its kernel receive stamp and is held from it, so reading it
        late does not delay it: a frame arriving after a socket was last read cannot
        fall due before that read + the direction's least delay. While a direction has
        frames queued the loop therefore sleeps until the next deadline and reads its
        socket only as often as that bound (and READ_EVERY_S, so the socket never
        fills) requires, on the deadlines' wake-ups where one is close, many frames per
        ``recvmmsg``; frames due together leave in one ``sendmmsg``. It sleeps on a
        socket's arrivals only when its queue is empty or its least delay is under
        MIN_BATCH_DELAY_S. Under load the loop thus wakes up about once per deadline,
        not once per arrival and once per deadline, with about one read per
        READ_EVERY_S / 2 instead of one per frame."""
        a, b = self.a, self.b
        sa, sb = a.sock, b.sock
        a2b, b2a = self.a2b, self.b2a
        clock = self.clock
        ways = [_Way(a, b, a2b, self._rx[0]), _Way(b, a, b2a, self._rx[1])]
        tx_a, tx_b = self._tx
        drain, flush, sel = self._drain, self._flush, select.select
        next_check = clock() + IDLE_CHECK_S
        ready: list[object] = []
        try:
            while not self._stop:
                now = clock()
                for w in ways:
                    if w.backlog or now >= w.read_after or w.src.sock in ready:
                        w.backlog = not drain(w.src, w.rx, w.queue)
                        w.last_read = now
                        w.read_by = w.read_after = math.inf
                now = clock()
                flush(a2b, b, now, tx_b)
                flush(b2a, a, now, tx_a)
                if now >= next_check:
                    self._check_alive(a)
                    self._check_alive(b)
                    next_check = now + (SUSPECT_CHECK_S if self._suspect else IDLE_CHECK_S)
                wake = next_check
                rlist: list[object] = []
                for w in ways:
                    due = w.queue.next_deadline()
                    if due is not None and due < wake:
                        wake = due
                    if w.backlog:  # the budget left frames behind: read again at once
                        wake = now
                        continue
                    bound = w.queue.params.min_queue_delay_s
                    if due is None or bound < MIN_BATCH_DELAY_S:
                        rlist.append(w.src.sock)  # woken by the next arrival
                    else:
                        w.read_by = w.last_read + min(bound, READ_EVERY_S)
                        w.read_after = w.read_by - READ_EVERY_S / 2  # read on a wake-up this close anyway
                        wake = min(wake, w.read_by)
                if wakeup_fd is not None:
                    rlist.append(wakeup_fd)
                if self.control_fd is not None:
                    rlist.append(self.control_fd)
                self.wakeups += 1
                ready, _, _ = sel(rlist, [], [], max(0.0, wake - clock()))
                for r in ready:
                    if r is sa or r is sb:
                        continue  # read at the top of the loop
                    if r == wakeup_fd:
                        try:
                            os.read(wakeup_fd, 512)  # type: ignore[arg-type]
                        except BlockingIOError:
                            pass
                        self._stop = True
                    elif r == self.control_fd:
                        self._on_control()
        except InterfaceGone as gone:
            print(f"delayline: interface {gone.name} vanished; exiting", file=sys.stderr)
            self._exit_code = EXIT_VANISHED
        finally:
            discarded = self.a2b.clear() + self.b2a.clear()  # fail closed: never early
            if discarded:
                print(f"delayline: discarded {discarded} queued frames on exit", file=sys.stderr)
        return self._exit_code
