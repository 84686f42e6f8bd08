"""Two channels that collide on a link do not finish together: who gets ahead is a draw.

The calibration's collision probe (testbed/run/calibration.py `calibrate_link`) starts
one tensor on each of two channels at once, both ways, in rounds. Its aggregate (the
link's crowded total) is what the simulation gives two colliding transfers in all; an
even split of it ends both together, so two identical pipelines that meet on a link stay
in lockstep for the whole iteration and every one of their tensors collides. In the
probe's own rounds they do not end together: one channel ends first, by a margin that
varies from round to round, and in the runs the pipeline whose tensor got through first
starts its next step first, so the two drift apart and collide less (atlas-2dc's
multi-TCP at 50 ms RTT, which the lockstep over-predicted in every kept table:
docs/results/fidelity.md, "Collisions drawn from the probe's rounds").

So each round of the probe gives a share: what the channel that ended first moved of the
crowded total while both moved (`round_shares`; its tensor over its time on the wire,
over the aggregate, at least half). The simulation draws, for each collision of two
transfers on such a link, which one is favoured and its share from those rounds
(testbed_core/simulate.py `Resource.split_shares`), and the prediction is the draw
nearest the mean of `COLLISION_DRAWS` such iterations (`drawn`).

Where the run clamps the shared channels' windows (testbed/run/pacing.py `window_caps`:
atlas-3dc, atlas-4dc), each stream is held to its cap and the channel that gets ahead
cannot take more of the link; the runs' pipelines stay in lockstep there, and the split
stays even (testbed/run/variants.py). A lossy route's tensors already take random times
(testbed_core/planning/lossy.py) and get no split either.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import replace

from testbed_core.simulate import SimResult, SimSpec

COLLISION_DRAWS = 8
"""Iterations simulated per prediction where a link splits its collisions unequally:
the prediction is the one nearest their mean makespan (a whole simulated iteration, so
that its spans, bubbles and transfers are those of one iteration as it may run)."""


def round_shares(durations: Sequence[float], channels: int, nbytes: int, latency_s: float,
                 aggregate_bps: float) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """The favoured channel's share of the crowded total in each round of a collision
    probe, each way: (first way, the way back). `durations`: the probe's transfer times
    as `calibrate_link` keeps them (the first way's channels one after another, each
    its rounds in order, then the way back's); `channels`: the channels that collided
    each way (a split is modelled for two only: none otherwise); `aggregate_bps`: the
    crowded total the prediction gives the link. A round's share is the first channel
    to end's tensor over its time on the wire, over the total: at least 0.5 (a round
    where both ran below the total's pace ended even), at most 1."""
    if channels != 2 or aggregate_bps <= 0 or not durations or len(durations) % (2 * channels):
        return (), ()
    rounds = len(durations) // (2 * channels)
    ways = []
    for start in (0, channels * rounds):
        shares = []
        for i in range(rounds):
            first = min(durations[start + c * rounds + i] for c in range(channels))
            wire = first - latency_s
            share = 1.0 if wire <= 0 else nbytes * 8 / wire / aggregate_bps
            shares.append(min(1.0, max(0.5, share)))
        ways.append(tuple(shares))
    return ways[0], ways[1]


def splits(spec: SimSpec) -> bool:
    """Whether any shared link of `spec` splits its collisions unequally."""
    return any(r.splits_collisions for r in spec.resources.values())


def drawn(simulate: Callable[[SimSpec], SimResult], spec: SimSpec, draws: int = COLLISION_DRAWS) -> SimResult:
    """`spec` simulated: once where no link splits its collisions (`splits`), else
    `draws` times (seeds 0 to draws - 1) and the iteration nearest their mean makespan
    (the first such seed on a tie), with every draw's makespan (`SimResult.draws_s`):
    the same result for the same spec, every time."""
    if not splits(spec) or draws <= 1:
        return simulate(spec)
    results = [simulate(replace(spec, seed=seed)) for seed in range(draws)]
    mean = statistics.fmean(r.makespan for r in results)
    nearest = min(results, key=lambda r: abs(r.makespan - mean))
    return replace(nearest, draws_s=tuple(r.makespan for r in results))
