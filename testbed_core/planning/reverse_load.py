"""How much a WAN path's transfers overlap the other way's during a predicted iteration.

The calibration's rate probe times a channel while another sends the other way (as
pipelines whose activations and gradients cross together load a path). A channel that
fills its link moves less so than alone: the other way's data queues its
acknowledgements. Where a pipeline's transfers take turns across a path instead (one
way, then the other: one pipeline of many stages, 1F1B), it moves what a channel alone
one way moves. The calibration also times that (`PathCalibration.one_way_bps`);
`reverse_loads` reads the share of each path's wire time that the other way is busy
too off a simulated iteration, and `weighed_one_way` puts the channel's rate between
its two figures by it.
"""

from __future__ import annotations

from testbed_core.intervals import overlap, union
from testbed_core.planning.path_load import way_busy
from testbed_core.planning.placement import Placement
from testbed_core.schedules import Schedule
from testbed_core.simulate import SimResult


def reverse_loads(sim: SimResult, schedule: Schedule, placement: Placement) -> dict[frozenset[str], float]:
    """Per WAN path the pipelines cross (its two DCs), the share of the time a transfer
    is on its wire one way while one is on the wire the other way too: 0, the two ways
    took turns throughout; 1, both ways were busy together throughout (as the rate probe
    loads the path)."""
    busy = way_busy(sim, schedule, placement)
    out: dict[frozenset[str], float] = {}
    for path in dict.fromkeys(frozenset(way) for way in busy):
        a, z = sorted(path)
        there, back = union(busy.get((a, z), [])), union(busy.get((z, a), []))
        wire = sum(e - s for s, e in there) + sum(e - s for s, e in back)
        out[path] = 2 * overlap(there, back) / wire if wire > 0 else 0.0
    return out


def weighed_one_way(both_bps: float, one_way_bps: float | None, load: float) -> float:
    """A channel's rate on a path whose other way is busy `load` of its wire time
    (`reverse_loads`): its time per byte is the two figures' in those shares (the rate
    probe's `both_bps` while the other way is busy, `one_way_bps` while not). No one-way
    figure: the rate probe's. A one-way figure below the other (a probe that came out
    low) stands for nothing: the other way's traffic cannot speed a channel up."""
    if one_way_bps is None or one_way_bps <= both_bps:
        return both_bps
    share = min(max(load, 0.0), 1.0)
    return 1.0 / (share / both_bps + (1.0 - share) / one_way_bps)
