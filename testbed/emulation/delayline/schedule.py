"""The delay line's scheduling core, without I/O: one `DelayQueue` per direction.

Each frame is stamped when it is received and becomes due at
``deadline = max(previous deadline, stamp + delay - offset + jitter sample)``: jitter
never reorders frames (a FIFO link), and a frame is never due before its stamp + delay -
offset - jitter. ``offset`` is the path's own one-way latency outside the queue (the
relay's wake-ups, the veths, the gateways: measured when the emulation starts, see
`testbed.emulation.delayline.calibrate`), so that the end-to-end delay, not the queue's,
equals the configured one. Jitter samples are uniform in [-jitter, +jitter] (netem's default
distribution); ordering makes the mean delay slightly larger than ``delay`` when
jitter is large compared with the gap between frames. Loss is drawn per segment of a
GSO super-packet (see `frames.keep_segments`). Changing parameters affects frames
received afterwards; frames already queued keep their deadlines. A link that is ``down``
(a fault on purpose: the cable cut) drops every frame it receives, and every queued frame
that falls due while it is down (what was on the wire is lost too).
"""

from __future__ import annotations

import math
import random
from collections import deque
from collections.abc import Iterator
from dataclasses import asdict, dataclass

from testbed.emulation.delayline import frames as fr

MAX_DELAY_S = 3600.0


class ParamError(ValueError):
    """A delay/jitter/loss value out of range."""


@dataclass(frozen=True)
class LinkParams:
    """One direction of the delay line: seconds, seconds, probability per segment, and
    the path latency (seconds) the queue leaves out so that the path's total is ``delay``."""

    delay_s: float = 0.0
    jitter_s: float = 0.0
    loss: float = 0.0
    offset_s: float = 0.0
    down: bool = False

    def __post_init__(self) -> None:
        for name, label in (("delay_s", "delay"), ("jitter_s", "jitter"), ("offset_s", "offset")):
            value = getattr(self, name)
            if not (isinstance(value, int | float) and math.isfinite(value) and 0 <= value <= MAX_DELAY_S):
                raise ParamError(f"{label} must be between 0 and {MAX_DELAY_S:g} s, got {value!r}")
        if not (isinstance(self.loss, int | float) and 0.0 <= self.loss <= 1.0):
            raise ParamError(f"loss is a probability between 0 and 1 (1% = 0.01), got {self.loss!r}")
        if not isinstance(self.down, bool):
            raise ParamError(f"down is yes/no (the link is cut while it is on), got {self.down!r}")

    @property
    def queue_delay_s(self) -> float:
        """What the queue itself holds a frame (before jitter): delay less the path's own
        latency, never negative."""
        return max(0.0, self.delay_s - self.offset_s)

    @property
    def min_queue_delay_s(self) -> float:
        """The least a frame received now is held (jitter drawn at its lowest)."""
        return max(0.0, self.delay_s - self.offset_s - self.jitter_s)

    def describe(self) -> str:
        text = f"delay={self.delay_s * 1e3:g}ms jitter={self.jitter_s * 1e3:g}ms loss={self.loss:g}"
        text += f" offset={self.offset_s * 1e3:.4g}ms" if self.offset_s else ""
        return text + (" down" if self.down else "")


@dataclass
class Counters:
    """Per-direction counters; bytes are L2 bytes (vnet header excluded)."""

    rx_frames: int = 0
    rx_bytes: int = 0
    tx_frames: int = 0
    tx_bytes: int = 0
    lost_frames: int = 0  # frames dropped whole by the loss model
    lost_segments: int = 0  # segments dropped by the loss model
    split_frames: int = 0  # super-packets rebuilt around lost segments
    overflow_drops: int = 0  # the relay's own queue exceeded max_queue_bytes
    send_drops: int = 0  # the kernel refused the frame (qdisc full: ENOBUFS/EAGAIN)
    send_errors: int = 0  # other send failures (interface down, malformed frame)
    truncated: int = 0  # frames larger than the receive buffer
    down_drops: int = 0  # frames dropped because the link was down (received, or due, while down)

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


class DelayQueue:
    """Frames of one direction waiting for their deadline.

    ``vnet``: frames start with a virtio_net_hdr (the relay's case); loss is then
    per GSO segment, otherwise per frame.
    """

    def __init__(
        self,
        params: LinkParams,
        rng: random.Random,
        *,
        vnet: bool = True,
        max_queue_bytes: int = 1 << 30,
    ):
        self.params = params
        self.rng = rng
        self.vnet = vnet
        self.max_queue_bytes = max_queue_bytes
        self.counters = Counters()
        self._q: deque[tuple[float, bytes]] = deque()
        self._last_deadline = -math.inf
        self._queued_bytes = 0

    def __len__(self) -> int:
        return len(self._q)

    @property
    def queued_bytes(self) -> int:
        return self._queued_bytes

    def set_params(self, params: LinkParams) -> None:
        self.params = params

    def next_deadline(self) -> float | None:
        return self._q[0][0] if self._q else None

    def _deadline(self, now: float) -> float:
        p = self.params
        delay = p.queue_delay_s
        if p.jitter_s:
            delay += self.rng.uniform(-p.jitter_s, p.jitter_s)
        deadline = now + delay if delay > 0.0 else now
        if deadline < self._last_deadline:
            deadline = self._last_deadline
        self._last_deadline = deadline
        return deadline

    def _survivors(self, frame: bytes) -> list[bytes]:
        loss = self.params.loss
        lay = fr.gso_layout(frame) if self.vnet else None
        if lay is None:
            if self.rng.random() < loss:
                self.counters.lost_frames += 1
                self.counters.lost_segments += 1
                return []
            return [frame]
        rand = self.rng.random
        lost = [rand() < loss for _ in range(lay.segments)]
        n_lost = sum(lost)
        if not n_lost:
            return [frame]
        kept = fr.keep_segments(frame, lay, lost)
        if kept:
            self.counters.split_frames += 1
            self.counters.lost_segments += n_lost
        else:
            self.counters.lost_frames += 1
            self.counters.lost_segments += lay.segments
        return kept

    def push(self, frame: bytes, now: float) -> None:
        """Take a frame received at ``now`` (monotonic seconds)."""
        c = self.counters
        size = len(frame)
        c.rx_frames += 1
        c.rx_bytes += size - fr.VNET_LEN if self.vnet else size
        if self.params.down:
            c.down_drops += 1
            return
        if self._queued_bytes + size > self.max_queue_bytes:
            c.overflow_drops += 1
            return
        if self.params.loss > 0.0:
            out = self._survivors(frame)
            if not out:
                return
            deadline = self._deadline(now)
            for f in out:
                self._q.append((deadline, f))
                self._queued_bytes += len(f)
            return
        self._q.append((self._deadline(now), frame))  # the common, loss-free path
        self._queued_bytes += size

    def pop_due(self, now: float) -> Iterator[bytes]:
        """Frames whose deadline is <= now, oldest first (never one before its time)."""
        q = self._q
        while q and q[0][0] <= now:
            _, frame = q.popleft()
            self._queued_bytes -= len(frame)
            if self.params.down:  # on the wire when the link went down: lost
                self.counters.down_drops += 1
                continue
            yield frame

    def take_due(self, now: float) -> list[bytes]:
        """`pop_due` as a list (the relay's batched path)."""
        q = self._q
        if not q or q[0][0] > now:
            return []
        return list(self.pop_due(now))

    def sent_all(self, frames: list[bytes]) -> None:
        """`sent` for each of ``frames``."""
        n = len(frames)
        self.counters.tx_frames += n
        self.counters.tx_bytes += sum(map(len, frames)) - (n * fr.VNET_LEN if self.vnet else 0)

    def sent(self, frame: bytes) -> None:
        self.counters.tx_frames += 1
        self.counters.tx_bytes += len(frame) - fr.VNET_LEN if self.vnet else len(frame)

    def clear(self) -> int:
        """Drop everything queued (fail closed on exit); returns how many frames."""
        n = len(self._q)
        self._q.clear()
        self._queued_bytes = 0
        return n
