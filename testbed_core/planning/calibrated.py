"""The network a prediction sees from the run's calibration: the topology with its WAN
links at the calibrated rates, and the per-flow rate, link capacity and crowding the
prediction's `NetParams` take from a channel's measured rate.

The calibration (testbed/run/calibration.py) measures what the transport gets from a
path: protocol overhead, shaper accuracy, the traffic pattern. The planner's network
model (testbed_core/planning/network.py) reads rates off the topology, so the
topology it is given carries the measured figures instead of the nominal ones.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from testbed_core.contracts.calibration import dc_of_host
from testbed_core.topology import MAX_RATE_BPS, Topology

LINK_GOODPUT = 1448 / 1514  # TCP payload per Ethernet frame: what a shaped link carries


def _scaled(topology: Topology, factors: dict[frozenset[str], float], default: float, local: bool,
            floor_bps: float = 0.0) -> Topology:
    """`topology` with each WAN link's rate (and its changes') times its factor in
    `factors` (`default` for the others), at most MAX_RATE_BPS (loopback in local mode
    can time a transfer too quick to measure); no delays in local mode, where a link
    also carries at least `floor_bps`."""
    data = topology.model_dump()
    for link in data["wan"]:
        factor = factors.get(frozenset(link["between"]), default)
        if local:
            link["delay"] = 0.0
            link["jitter"] = 0.0
        link["rate"] = min(max(link["rate"] * factor, floor_bps if local else 0.0), MAX_RATE_BPS)
        for ch in link.get("changes") or []:
            if ch.get("rate") is not None:
                ch["rate"] = min(ch["rate"] * factor, MAX_RATE_BPS)
    data.pop("source", None)
    return type(topology).model_validate(data)


def calibrated_topology(topology: Topology, link_bps: float | None, pair: tuple[str, str] | None,
                        local: bool) -> Topology:
    """The topology as the predictor sees it: WAN link rates scaled so that the link of
    the calibrated path (between the hosts of `pair`) has `link_bps`; no delays in
    local mode."""
    factor = 1.0
    if link_bps is not None and pair is not None:
        ref = topology.bottleneck_rate(dc_of_host(pair[0]), dc_of_host(pair[1]))
        factor = link_bps / ref if ref else 1.0
    return _scaled(topology, {}, factor, local, link_bps or 0.0)


def path_topology(topology: Topology, link_bps: dict[tuple[str, str], float], local: bool) -> Topology:
    """The topology as the predictor sees it with every calibrated path's own figure:
    each link on the route of a path in `link_bps` (DC pairs) carries that path's
    calibrated capacity (scaled by its share of the route's nominal bottleneck); links
    no path of the variant crosses keep their nominal rate; no delays in local mode."""
    factors: dict[frozenset[str], float] = {}
    for (a, z), bps in link_bps.items():
        route = topology.route(a, z)
        bottleneck = topology.bottleneck_rate(a, z) or bps
        for x, y in zip(route, route[1:], strict=False):
            key = frozenset((x, y))
            factors[key] = min(factors.get(key, math.inf), bps / bottleneck)
    return _scaled(topology, factors, 1.0, local)


def calibrated_rates(temporal: bool, streams: int, rate_bps: float | None,
                     nominal_bps: float | None, colliding_bps: float | None = None, lossy: bool = False,
                     ) -> tuple[float | None, float | None, float | None]:
    """(per-flow rate, link capacity, crowded fraction) the prediction of a variant
    uses, from the measured rate of one channel of `streams` streams.

    Temporal sharing puts one transfer at a time on the link: its capacity is that
    rate. Shared links: the link's TCP goodput (at least one channel's rate), each
    channel capped at its own measured rate; while two or more transfers collide on
    it, the measured aggregate of the colliding channels (their loss and
    recovery make it fall short of the goodput, even of one channel alone), given as
    a fraction of the capacity. No collision measurement (single streams, which stay
    far from the loss that many colliding streams cause): no crowding. Nor where two
    channels at their measured rate fit side by side in the link's goodput: each is
    window-limited, their windows together stay under the link's bandwidth-delay
    product, so no queue builds and nothing is lost in a run's steady state; the
    probe's lockstep collision (both channels starting at once, in slow start) then
    measures its own bursts, and a plan chosen on that figure loses to plain sharing.

    On a `lossy` path (a link with configured loss) a temporal plan's link keeps its
    TCP goodput (at least the channel's rate), as a shared one does: the channel's rate
    was measured through the loss, and the planner's loss model (planning/lossy.py, via
    network.wan_path) times the channel's tensors through it at the link's rate, so
    the measured rate as the link's capacity counted the loss twice (issue 40,
    lossy-4dc: atlas's plans at 48-124 Mbit/s on a 400 Mbit/s link)."""
    if rate_bps is None:
        return None, None, None
    if temporal and not (lossy and nominal_bps is not None):
        return rate_bps / streams, rate_bps, None
    if temporal:
        return rate_bps / streams, max(rate_bps, LINK_GOODPUT * nominal_bps), None
    link = rate_bps if nominal_bps is None else max(rate_bps, LINK_GOODPUT * nominal_bps)
    crowded = None if colliding_bps is None else min(1.0, colliding_bps / link)
    if crowded is not None and nominal_bps is not None and 2 * rate_bps <= link:
        crowded = None
    return rate_bps / streams, link, crowded


TOKEN_HANDOVER_S = 0.005
"""How long after its last byte left a planned transfer hands its link on: a sender
looks at its channel this long before its announced end and announces a later one while
bytes are left (testbed/training/transport_comm.py ``WATCH_LEAD_S`` is this figure)."""


def turns_hold_s(transfer_s: Sequence[float], latency_s: float, slot_s: float,
                 handover_s: float = TOKEN_HANDOVER_S) -> float:
    """How long a planned transfer holds its link on average, from the turns probe
    (`TurnsCalibration`): each transfer holds it until the later of its planned end
    (`slot_s` after it started) and its last byte out (its hand-over-to-arrival time less
    the one-way delay) plus the hand-over; the mean, since every overrun delays every later
    holder on the link."""
    if not transfer_s:
        raise ValueError("the turns probe timed no transfer")
    if slot_s <= 0:
        raise ValueError(f"the planned hold must be positive, not {slot_s} s")
    return sum(max(slot_s, t - latency_s + handover_s) for t in transfer_s) / len(transfer_s)


def turns_rate_bps(nbytes: int, transfer_s: Sequence[float], latency_s: float, slot_s: float) -> float:
    """The rate at which a temporal plan's transfers of `nbytes` move through their link,
    holds included (`turns_hold_s`): the channel rate its slots are planned with."""
    return nbytes * 8 / turns_hold_s(transfer_s, latency_s, slot_s)


MIN_WIRE_S = 1e-4
"""The shortest time on the wire a turns probe's transfer is taken to have (its
hand-over-to-arrival time less the one-way delay can come out at zero or below it by
the delay line's timer)."""


def turns_wire_rate_bps(nbytes: int, transfer_s: Sequence[float], latency_s: float) -> float:
    """The rate at which a temporal plan's transfers of `nbytes` reach their receiver:
    over their mean time on the wire in the turns probe (hand-over to arrival less the
    one-way delay), without the hold's hand-over. A planned transfer's bytes arrive as
    they left; only the next holder waits for its hold (`turns_hold_s`)."""
    if not transfer_s:
        raise ValueError("the turns probe timed no transfer")
    return nbytes * 8 / max(MIN_WIRE_S, sum(t - latency_s for t in transfer_s) / len(transfer_s))
