"""Measure the relay path's own latency on each WAN link and leave it out of the delay.

A frame crossing an emulated WAN link waits in the relay's queue for the configured
delay, but the path adds latency of its own: the relay wakes up a little late (from
select() when the frame arrives and again at its deadline), and the veths and the
gateways' forwarding add some more. Left alone this sits as a constant bias on every
RTT. When the emulation starts, each link is measured the way a user measures it: the
relay is set to a short probe delay (jitter and loss off), the gateway of one side
pings the other side's WAN address, and what the median RTT exceeds twice the probe
delay by is the path's own round trip (the lower of two rounds, since a burst of some
other process's work can inflate one). Links are measured one after the other, so that
they do not measure each other's CPU use. Half of it, per direction, becomes the relay's
``offset`` (`LinkParams.offset_s`), which it subtracts from the configured delay; then
the configured delay, jitter and loss are restored. The offset stays in the relay when
a time-varying link later changes its delay.

The probe delay is short so that ping reports each reply to 10 microseconds (it prints
fewer digits above 10 ms) but not zero, so that the relay sleeps until a deadline as it
does on a real link (waking from a timer costs more than forwarding at once).
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from testbed.emulation.delayline import set_command

if TYPE_CHECKING:
    from testbed.emulation.nodes import GatewayHandle, WanHandle

PROBE_DELAY_S = 0.002  # one way, while measuring
PINGS = 40
PING_INTERVAL_S = 0.005
ROUNDS = 2  # the lower of the rounds' medians: a burst of another process's work inflates one round
WARMUP_PINGS = 3
MIN_REPLIES = 10
MAX_OFFSET_S = 0.002  # a larger excess is load, not the path: capped, and said so
_TIME = re.compile(r"time[=<]([0-9.]+) ms")


@dataclass(frozen=True)
class PathOffset:
    """One link's measured path latency: the one-way offset the relay now leaves out
    (seconds), from how many ping replies, and why it is not the raw excess (if so)."""

    link: str
    offset_s: float
    replies: int
    excess_rtt_s: float | None
    note: str = ""


def ping_rtts(text: str) -> list[float]:
    """Per-reply RTTs (seconds) from ping's output."""
    return [float(m) / 1e3 for m in _TIME.findall(text)]


def offset_from_rtts(link: str, rtts: Sequence[float], probe_delay_s: float = PROBE_DELAY_S) -> PathOffset:
    """Half the median RTT's excess over twice the probe delay, in [0, MAX_OFFSET_S]."""
    if len(rtts) < MIN_REPLIES:
        return PathOffset(link, 0.0, len(rtts), None,
                          f"only {len(rtts)} of {PINGS} calibration pings came back: no offset applied")
    excess = statistics.median(rtts) - 2 * probe_delay_s
    offset = min(max(excess / 2, 0.0), MAX_OFFSET_S)
    note = ""
    if excess / 2 > MAX_OFFSET_S:
        note = (f"the path added {excess * 1e3:.2f} ms to the RTT (a busy machine?); "
                f"only {MAX_OFFSET_S * 1e3:g} ms per direction is left out")
    return PathOffset(link, offset, len(rtts), excess, note)


def best_round(rounds: Sequence[PathOffset]) -> PathOffset:
    """The round with the lowest excess (one that got too few replies only if all did)."""
    return min(rounds, key=lambda r: (r.excess_rtt_s is None, r.excess_rtt_s or 0.0))


def _ping_argv(dst_ip: str, count: int, interval_s: float) -> list[str]:
    return ["ping", "-n", "-c", str(count), "-i", f"{interval_s:g}", "-W", "1", dst_ip]


def calibrate_relays(wans: Sequence[WanHandle], gateways: dict[str, GatewayHandle],
                     progress: Callable[[str], None] | None = None) -> dict[str, PathOffset]:
    """Measure every relay link's path latency (all links at once) and set each relay's
    offset, restoring the link's configured delay, jitter and loss. Returns the offsets
    by link name."""
    say = progress or (lambda msg: None)
    live = [w for w in wans if w.relay is not None and w.relay.stdin is not None and w.plan is not None]
    if not live:
        return {}
    for w in live:
        _send(w, set_command("both", delay_s=PROBE_DELAY_S, jitter_s=0.0, loss=0.0, offset_s=0.0))
    say(f"calibrating {len(live)} delay lines: {ROUNDS} x {PINGS} pings each at {PROBE_DELAY_S * 2e3:g} ms RTT")
    found: dict[str, PathOffset] = {}
    for w in live:  # one link at a time: pings on all links at once would measure CPU contention
        assert w.plan is not None and w.link is not None
        src, dst_ip = gateways[w.plan.a], w.plan.ip_of(w.plan.b)
        src.run(_ping_argv(dst_ip, WARMUP_PINGS, 0.05), timeout=10)  # ARP, first-packet costs
        rounds = []
        for _ in range(ROUNDS):
            out = src.run(_ping_argv(dst_ip, PINGS, PING_INTERVAL_S), timeout=PINGS * PING_INTERVAL_S + 10)
            rounds.append(offset_from_rtts(w.link.name, ping_rtts(out.stdout)))
        found[w.link.name] = best_round(rounds)
    for w in live:
        assert w.link is not None
        result = found[w.link.name]
        _send(w, set_command("both", delay_s=w.link.delay, jitter_s=w.link.jitter, loss=w.link.loss,
                             offset_s=result.offset_s))
        say(f"{w.link.name}: path latency {result.offset_s * 1e3:.3f} ms each way left out of the delay"
            + (f" ({result.note})" if result.note else ""))
    return found


def _send(w: WanHandle, line: str) -> None:
    assert w.relay is not None and w.relay.stdin is not None
    w.relay.stdin.write(line)
    w.relay.stdin.flush()
