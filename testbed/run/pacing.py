"""``transport.pacing: auto`` (the default): pace every stream where unpaced channels
would overflow a WAN queue, and say why.

Unpaced Linux TCP (this kernel has no sch_fq) sends what its window allows at the
sender's line rate. A WAN link direction then takes, at worst, the windows of every
channel that may send across it at once: the workload's dp pipelines, each channel
with its streams, each stream up to its TCP buffer (min of the sender's tcp wmem max
and the receiver's rmem max; Linux may advertise nearly all of it). That is lost when

- in steady state, it exceeds what the path holds: its bandwidth-delay product plus
  the bottleneck's queue, or
- sent as one burst at the DC's LAN rate (a tensor after a pipeline bubble, every
  stream's window at once), the part the WAN link cannot drain meanwhile,
  ``windows x (1 - wan rate / lan rate)``, exceeds the queue.

Those tail drops and the retransmissions after them are not in the planner's model
(issue 40: scenarios/prefill-service-2dc.yaml ran +28% to +62% over its prediction
with 839-1,506 tail drops per variant; atlas-2dc's multi-tcp +7.5% with 1,315), so
the run avoids the regime instead of modelling it: pacing spreads each window over
the round trip (Linux's internal pacing, SO_MAX_PACING_RATE), the kept paced runs
hold their predictions (docs/scenarios.md, 'TCP pacing'). The choice is made once per
run, before the calibration, so that the calibration measures the streams the
variants then use; every variant of the run is paced alike. ``pacing: true`` or
``false`` in a scenario keeps its word.

Pacing spreads a window over the round trip but does not bound it: where the
multi-stream channels that share a WAN direction (one pipeline's, or several) may put
more in flight than the path holds, a shared variant's streams are also capped to their
share of it (`window_caps`, each receiving end's TCP_WINDOW_CLAMP; the planner's window
model takes the same figure), at least MIN_CAP_WINDOW. The calibration's probes clamp
their streams as the run clamps the channels they stand for (testbed/run/calibration.py
`probe_caps`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from testbed_core.planning.calibrated import LINK_GOODPUT
from testbed_core.planning.network import stream_window
from testbed_core.planning.placement import Placement
from testbed_core.topology import Topology, WanLink, bdp_bytes
from testbed_core.variants import RunVariant
from testbed_core.workload import Parallelism

PACED_BURST = 2.0
"""How many windows per smoothed round trip a capped stream's round leaves at: Linux
paces at 2 x cwnd / srtt while cwnd is below half of ssthresh (tcp_pacing_ss_ratio,
200%) and at 1.2 x in congestion avoidance (tcp_pacing_ca_ratio). A stream held to a
window cap that never lost a packet has no ssthresh, so it stays paced as in slow start,
and its cwnd (grown to twice its flight, tcp_is_cwnd_limited) is at least its window: a
window whose first round leaves onto an idle link queues all of itself but the BDP / 2
the link drains meanwhile (`route_takes`). At 1.2 (congestion avoidance) the caps of
scenarios/atlas-3dc.yaml's multi-tcp left mid->big with 409-451 tail drops a run and
its iterations 2.33-2.56 s; at 2.0, 26 drops and 2.32-2.51 s (results/window-caps/README.md).
Strictly, cwnd grows to twice the window (tcp_is_cwnd_limited) and Linux paces at 2 x
max(cwnd, in flight) / srtt, which makes it 4; caps sized for 4 were tried and taken back:
fewer drops on held-back/3dc-triangle, but atlas-4dc's atlas and multi-tcp ran slower
and further from their predictions (the same README)."""

MIN_CAP_WINDOW = 16 << 10
"""The smallest window cap: a few segments a stream."""

AUTO_STREAMS_MAX = 16
"""The most streams ``transport.streams: auto`` may choose (runner.AUTO_CANDIDATES' largest)."""


@dataclass(frozen=True)
class PacingChoice:
    """Whether the run paces its streams, and the sentence that says why."""

    on: bool
    why: str


def link_streams(topology: Topology, a: str, z: str, configured: int | str, runs: Sequence[RunVariant]) -> int:
    """The most streams one channel of the run's variants may take across the link a-z:
    1 for one-stream variants, ``transport.streams`` for configured ones, and for
    fill-link ones (Atlas) at least enough window-limited streams to fill the link."""
    link = topology.link(a, z)
    window = min(topology.tcp_for(a).wmem_max, topology.tcp_for(z).rmem_max)
    most = 1
    for run in runs:
        policy = run.variant.streams
        if policy == "one":
            continue
        n = AUTO_STREAMS_MAX if configured == "auto" else int(configured)
        if policy == "fill-link" and link.rtt_s > 0:
            n = max(n, math.ceil(link.rate * link.rtt_s / (window * 8)))  # the planner's half window: fewer
        most = max(most, n)
    return most


def choose_pacing(topology: Topology, dp: int, configured_streams: int | str, pacing: bool | str,
                  runs: Sequence[RunVariant], local: bool = False) -> PacingChoice:
    """What ``transport.pacing`` comes to for this run (module docstring)."""
    if pacing is True or pacing is False:
        return PacingChoice(bool(pacing), f"transport.pacing: {str(pacing).lower()} (the scenario's)")
    if local:
        return PacingChoice(False, "transport.pacing auto: off (--local: no emulated WAN queue)")
    worst: tuple[float, str] | None = None
    for link in topology.wan:
        for a, z in (link.between, link.between[::-1]):
            streams = link_streams(topology, a, z, configured_streams, runs)
            window = min(topology.tcp_for(a).wmem_max, topology.tcp_for(z).rmem_max)
            flight = dp * streams * window
            queue, bdp = link.queue_bytes, bdp_bytes(link.rate, link.rtt_s)
            lan = topology.dc(a).lan_rate
            burst = flight * max(0.0, 1 - link.rate / lan) if lan > 0 else flight
            over = max(flight / (bdp + queue), burst / queue)
            if over > 1 and (worst is None or over > worst[0]):
                worst = (over, (
                    f"{dp} channel(s) x {streams} stream(s) x {window / 1e6:.2f} MB windows = {flight / 1e6:.1f} MB "
                    f"may leave {a} for {z} at once: sent at {lan / 1e9:g} Gbit/s, {burst / 1e6:.1f} MB of it "
                    f"against a {queue / 1e6:.2f} MB queue; in steady state against {(bdp + queue) / 1e6:.2f} MB "
                    f"(queue + bandwidth-delay product) on {link.name}"))
    if worst is None:
        return PacingChoice(False, "transport.pacing auto: off (every WAN queue holds the windows of the channels "
                                   "that may cross it at once)")
    return PacingChoice(True, f"transport.pacing auto: on, unpaced channels would overflow a WAN queue: {worst[1]} "
                              "(set transport.pacing: false to run unpaced)")


def route_bottleneck(topology: Topology, src: str, dst: str) -> tuple[WanLink, float]:
    """The route from DC `src` to `dst`: its slowest link (whose queue fills) and its
    round trip, seconds (every link's on the way)."""
    route = topology.route(src, dst)
    links = [topology.link(x, y) for x, y in zip(route, route[1:], strict=False)]
    return min(links, key=lambda link: link.rate), sum(link.rtt_s for link in links)


def route_holds(topology: Topology, src: str, dst: str) -> float:
    """What the route from DC `src` to `dst` holds in steady state (bytes on the wire):
    the slowest link's queue plus the route's bandwidth-delay product. Channels whose
    windows may put more than this in flight together overflow the queue every round
    they are full; below it, only a first round that leaves faster than the link drains
    can (`route_takes`), which the runs did not show: scenarios/atlas-2dc.yaml's
    multi-tcp (2 channels x 8 streams x 0.66 MB windows, 11.0 MB of frames against
    12.5 MB) ran uncapped with 30 tail drops a run and within 2.5% of its prediction,
    capped to the first round's share (560 KB a stream) with 346 drops and 10-15% faster
    than predicted from a calibration whose capped collisions read 547-767 Mbit/s
    (results/window-caps/README.md)."""
    slow, rtt = route_bottleneck(topology, src, dst)
    return slow.queue_bytes + bdp_bytes(slow.rate, rtt)


def route_takes(topology: Topology, src: str, dst: str) -> float:
    """What channels may have in flight together from DC `src` to `dst` (bytes on the
    wire) with no tail drop: the slowest link's queue plus the bandwidth-delay product
    over PACED_BURST. In steady state the route holds its BDP and queue; a round that
    leaves paced onto an idle link at PACED_BURST windows a round trip queues all of
    itself but BDP / PACED_BURST (the link busy, the queue holds only what exceeds the
    BDP: less)."""
    slow, rtt = route_bottleneck(topology, src, dst)
    return slow.queue_bytes + bdp_bytes(slow.rate, rtt) / PACED_BURST


def tensors_at_once(parallelism: Parallelism) -> int:
    """The most activation or gradient tensors one pipeline's channel may have handed to
    one direction at once under its schedule: GPipe sends every micro-batch back to back
    (as does interleaved 1F1B at worst, counted so), 1F1B's first stage at most its
    warm-up's pp - 1 forwards before its first backward (one at a time after)."""
    if parallelism.schedule == "1f1b":
        return max(1, min(parallelism.num_micro_batches, parallelism.pp - 1))
    return parallelism.num_micro_batches * parallelism.chunks


def window_caps(topology: Topology, placement: Placement, streams: int, tensor_bytes: float,
                at_once: int) -> dict[tuple[str, str], int]:
    """The receive window each stream of a shared multi-stream variant's WAN channels
    advertises at most (TCP_WINDOW_CLAMP), per direction (sending DC, receiving DC) its
    channels cross: where what they may have in flight
    together (channels x the lesser of streams x the window the planner gives a stream,
    `network.stream_window`, and the `at_once` tensors a channel may be handed at once,
    `tensors_at_once`), as frames on the wire, exceeds what the route holds in steady
    state (`route_holds`: its queue and its bandwidth-delay product), each stream gets its
    share of what the route takes without a tail drop in a first round (`route_takes`:
    its queue and its bandwidth-delay product over PACED_BURST), in payload (LINK_GOODPUT
    of the frames), at least MIN_CAP_WINDOW. The planner's per-flow rate is then at most the cap over the
    round trip (network.wan_path), where the cap holds a stream below what a probe
    timed (one that serves uncapped variants too runs uncapped,
    testbed/run/calibration.py `probe_caps`).

    Why (issue 40): several tensors handed to colliding channels at once, or a channel
    that keeps its streams busy, let the windows fill past the queue; the tail drops and
    retransmission timeouts that follow cost 150-400 ms a transfer now and then, which
    no calibration probe shows (scenarios/atlas-3dc.yaml's multi-tcp ran 2.40-3.34 s an
    iteration against 2.3-2.4 predicted; docs/results/fidelity.md). Pacing spreads a
    window over the round trip but does not bound it. A cap of exactly the path's share
    in payload bytes (before this, never below a stream's stripe of one tensor) still
    overflowed it: the frames carry 4.6% more than the payload, big-small's stripe
    (128 KiB) was above its share (125 KB), and a window that leaves paced at
    PACED_BURST windows per smoothed round trip queues all of itself but the BDP over
    that in its first round (`route_takes`): 718-877 tail drops and +12-14% in the kept runs. A stream's buffer sized to
    its share of the path is how parallel streams are tuned by hand; Linux's autotuning
    alone grows each to the buffer's maximum. One pipeline's channel alone on a
    direction is capped too where the tensors its schedule may hand it at once overflow
    the path: its streams stay busy and their windows grow past it, as two pipelines'
    do (results/held-back/held-line-pp6.yaml's multi-tcp: tail drops on its one
    8-stream channel a direction and the runs far slower than predicted uncapped;
    docs/results/fidelity.md, "One channel alone on a path"). No cap (empty) with one
    stream, or where the windows, or the tensors, fit: a stream has no more in flight
    than it was given, so a cap there would only slow it (docs/results/fidelity.md,
    multi-tcp on shared links)."""
    if streams < 2:
        return {}
    channels: dict[tuple[str, str], int] = {}
    for d, b in placement.wan_boundaries():
        a, z = placement.dc_of(d, b), placement.dc_of(d, placement.next_stage(b))
        for way in ((a, z), (z, a)):
            channels[way] = channels.get(way, 0) + 1
    caps: dict[tuple[str, str], int] = {}
    for (a, z), n in channels.items():
        window = stream_window(topology, a, z)
        if n * min(streams * window, at_once * tensor_bytes) / LINK_GOODPUT <= route_holds(topology, a, z):
            continue
        cap = max(MIN_CAP_WINDOW, int(route_takes(topology, a, z) * LINK_GOODPUT / (n * streams)))
        if cap < window:
            caps[(a, z)] = cap
    return caps


def probe_burst(topology: Topology, channels: Sequence[tuple[str, str, int, int | None]], tensor_bytes: float,
                at_once: int) -> int:
    """How many tensors at once a calibration probe hands each of its channels before it
    times them (testbed/run/calibration.py `run_channels`): the most, up to `at_once`
    (`tensors_at_once`), that its channels crossing each direction put in flight
    together without exceeding what the route holds (`route_holds`), at least one.
    `channels`: each channel's (sending DC, receiving DC, streams, each stream's window
    clamp or None); a channel inside a DC holds no route. Why: the run's channels,
    handed several tensors at once by the schedule, grow their windows past a stream
    that only ever carries one (results/held-back/held-far-pp4-tcpinfo/), but a burst
    that overflows the queue times loss recovery in the probe that the run's capped
    channels (`window_caps`) never meet, and a probe that serves capped and uncapped
    variants runs uncapped (docs/results/fidelity.md, "The probe's channels handed
    tensors as the schedule hands them")."""
    ways: dict[tuple[str, str], list[tuple[int, int | None]]] = {}
    for a, z, streams, clamp in channels:
        if a != z:
            ways.setdefault((a, z), []).append((streams, clamp))

    def fits(k: int) -> bool:
        for (a, z), chans in ways.items():
            flight = sum(min(k * tensor_bytes, streams * (clamp or stream_window(topology, a, z)))
                         for streams, clamp in chans)
            if flight / LINK_GOODPUT > route_holds(topology, a, z):
                return False
        return True

    k = max(1, at_once)
    while k > 1 and not fits(k):
        k -= 1
    return k
