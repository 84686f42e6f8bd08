"""How busy a placement's other WAN paths keep each path during a predicted iteration.

Every WAN link of the emulator is a delay line on the machine's cores, so a path
moves less while the others carry traffic than it does alone. The calibration times
each path both ways: alone, and with every path of the placement loaded at once (its
``together`` figures). A run sits between the two: a path's transfers overlap the
other paths' only part of the time (a pipeline's boundaries take turns; the
temporal plan spaces them). `path_loads` reads that share off a simulated iteration
and `weighed_rate` puts the path's rate where it falls between its two figures.
"""

from __future__ import annotations

from collections.abc import Mapping

from testbed_core.intervals import Interval, overlap, union
from testbed_core.planning.placement import Placement
from testbed_core.schedules import Schedule
from testbed_core.simulate import SimResult


def way_busy(sim: SimResult, schedule: Schedule, placement: Placement) -> dict[tuple[str, str], list[Interval]]:
    """Per WAN path and direction (sending DC, receiving DC), when each pipeline
    transfer of the simulated iteration was on its wire (first to last byte sent), as
    the simulation gives them (not merged)."""
    spans: dict[tuple[str, str], list[Interval]] = {}
    for t in sim.transfers:
        k = t.key
        a = placement.dc_of(k.pipeline, schedule.rank_of(k.boundary))
        z = placement.dc_of(k.pipeline, schedule.rank_of(k.boundary + 1))
        if a != z:
            spans.setdefault((a, z) if k.direction == "fwd" else (z, a), []).append((t.start, t.end))
    return spans


def path_busy(sim: SimResult, schedule: Schedule, placement: Placement) -> dict[frozenset[str], list[Interval]]:
    """Per WAN path (its two DCs, either direction), when a pipeline transfer of the
    simulated iteration was on its wire (first to last byte sent), merged."""
    spans: dict[frozenset[str], list[Interval]] = {}
    for way, iv in way_busy(sim, schedule, placement).items():
        spans.setdefault(frozenset(way), []).extend(iv)
    return {path: union(iv) for path, iv in spans.items()}


def path_loads(sim: SimResult, schedule: Schedule, placement: Placement) -> dict[frozenset[str], float]:
    """Per WAN path the pipelines cross, how loaded the other paths keep it: over the
    time its own transfers are on the wire, the mean number of other paths with a
    transfer on theirs, over the number of other paths. 0: it ran alone throughout (as
    the calibration timed it alone); 1: every other path was busy throughout (as the
    calibration's together probe loads them). A placement crossing one path has none."""
    busy = path_busy(sim, schedule, placement)
    if len(busy) < 2:
        return {}
    loads: dict[frozenset[str], float] = {}
    for path, own in busy.items():
        length = sum(end - start for start, end in own)
        if length <= 0:
            loads[path] = 0.0
            continue
        shared = sum(overlap(own, other) for p, other in busy.items() if p != path)
        loads[path] = shared / length / (len(busy) - 1)
    return loads


def weighed_rate(alone: float | None, together: float | None, load: float) -> float | None:
    """A path's rate at `load` (`path_loads`): its alone figure at 0, its together
    figure at 1, in proportion between (either missing: the other). Loading the other
    paths cannot speed a path up, so a together figure above the alone one means the
    alone probe came out low (e.g. windows still opening): the together one then
    stands for both."""
    if alone is None or together is None:
        return together if together is not None else alone
    alone = max(alone, together)
    return alone + min(max(load, 0.0), 1.0) * (together - alone)


def load_of(loads: Mapping[frozenset[str], float] | None, a: str, z: str) -> float:
    """The load of the path between `a` and `z` (1, every other path busy, where not
    simulated yet: the calibration's together figures as they were timed)."""
    if loads is None:
        return 1.0
    return loads.get(frozenset((a, z)), 1.0)
