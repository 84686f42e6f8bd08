"""Temporal bandwidth sharing: one pipeline's transfer at a time on each WAN link.

When D data-parallel pipelines cross the same WAN link, sending all at once splits
the link D ways and every pipeline waits for its slowed transfer. Atlas instead gives
each link direction to one transfer at a time, in a planned order, and starts the
pipelines at staggered offsets, so that while one pipeline transmits, the others
compute.

The plan is derived from the workload, not hand-tuned: given the simulation spec
(compute time of every stage, bytes and path of every boundary transfer), we try
pipeline staggers ``offset[d] = d * delta`` for deltas built from the workload's own
time constants (one transfer's time alone on the link, the stage compute times, and
a grid up to the larger of D transfers and one forward+backward), simulate each with
the WAN link directions exclusive (first come, first served), and keep the fastest.
The order in which that simulation used each link becomes the token list, and each
transfer's simulated window its slot.

A runner enforces the plan with ``offsets`` (delay pipeline d's start) and either
the token lists (a transfer waits until the previous token on its link is done) or
the slots (a transfer does not start before ``iteration_start + slot[0]``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from testbed_core.simulate import SimResult, SimSpec, TransferKey, simulate


class TemporalPlanError(ValueError):
    """A plan that cannot be built or a slot that does not exist."""


@dataclass
class TemporalPlan:
    offsets: list[float]  # seconds after the iteration start, per pipeline
    order: dict[str, list[TransferKey]]  # link direction (resource id) -> transfers in order
    slots: dict[TransferKey, tuple[float, float]]  # planned (start, end) on the wire
    resources_of: dict[TransferKey, tuple[str, ...]]
    stagger_s: float
    predicted_iteration_s: float
    tried: list[tuple[float, float]] = field(default_factory=list)  # (stagger, iteration time)

    def first_transfer_s(self, pipelines: int) -> list[float | None]:
        """When each pipeline first gets a planned link: the stagger the token order
        produces, which adds to `offsets`."""
        firsts: list[float | None] = [None] * pipelines
        for key, (start, _) in self.slots.items():
            cur = firsts[key.pipeline]
            firsts[key.pipeline] = start if cur is None else min(cur, start)
        return firsts

    def tokens(self, resource: str) -> list[TransferKey]:
        try:
            return self.order[resource]
        except KeyError:
            raise TemporalPlanError(
                f"no plan for link direction {resource!r} (planned: {', '.join(sorted(self.order)) or 'none'})"
            ) from None

    def slot(
        self, link: str, pipeline: int, microbatch: int, direction: str, boundary: int | None = None
    ) -> tuple[float, float]:
        """Planned wire window of a transfer on `link` (a resource id such as
        'wan:dc1->dc2'), relative to the iteration start."""
        keys = [
            k for k in self.tokens(link)
            if k.pipeline == pipeline and k.mb == microbatch and k.direction == direction
            and (boundary is None or k.boundary == boundary)
        ]
        if not keys:
            raise TemporalPlanError(
                f"no {direction} transfer of pipeline {pipeline}, micro-batch {microbatch} on {link}"
            )
        if len(keys) > 1:
            raise TemporalPlanError(
                f"pipeline {pipeline} crosses {link} at boundaries {sorted(k.boundary for k in keys)}: pass boundary="
            )
        return self.slots[keys[0]]

    def position(self, key: TransferKey) -> dict[str, int]:
        """Index of `key` in the token list of each link direction it uses."""
        return {res: self.order[res].index(key) for res in self.resources_of.get(key, ()) if res in self.order}

    def apply(self, spec: SimSpec) -> SimSpec:
        """`spec` with the offsets and the token order enforced on the planned links."""
        resources = dict(spec.resources)
        for name, keys in self.order.items():
            resources[name] = dataclasses.replace(resources[name], policy="exclusive", order=tuple(keys))
        return dataclasses.replace(spec, resources=resources, offsets=list(self.offsets))

    def to_json(self) -> dict[str, Any]:
        return {
            "offsets_s": self.offsets,
            "first_transfer_s": self.first_transfer_s(len(self.offsets)),
            "stagger_s": self.stagger_s,
            "predicted_iteration_s": self.predicted_iteration_s,
            "tried": [{"stagger_s": s, "iteration_s": t} for s, t in self.tried],
            "order": {
                res: [{**k.to_json(), "start_s": self.slots[k][0], "end_s": self.slots[k][1]} for k in keys]
                for res, keys in self.order.items()
            },
        }


def _transfer_alone_s(spec: SimSpec, links: set[str]) -> float:
    """Longest hold of a planned link by one boundary transfer alone on it (its time
    on the wire, times the link's `hold_factor`)."""
    longest = 0.0
    for (_, boundary, direction), path in spec.paths.items():
        used = [r for r in path.resources if r in links]
        if not used:
            continue
        rate = min([path.cap_bps] + [spec.resources[r].capacity_bps for r in path.resources])
        nbytes = (spec.bytes_fwd if direction == "fwd" else spec.bytes_bwd)[boundary]
        hold = max(spec.resources[r].hold_factor for r in used)
        if rate > 0 and rate != math.inf:
            longest = max(longest, nbytes * 8 / rate * hold)
    return longest


def stagger_candidates(spec: SimSpec, links: set[str], grid: int = 16) -> list[float]:
    d = spec.pipelines
    if d <= 1:
        return [0.0]
    tx = _transfer_alone_s(spec, links)
    tf, tb = max(spec.forward_s), max(spec.backward_s)
    span = max(tx * d, tf + tb)
    values = {0.0, tx, 2 * tx, tf, tb, tf + tb, (tf + tb) / d, tx * d}
    values.update(span * k / grid for k in range(1, grid + 1))
    return sorted(v for v in values if v >= 0 and math.isfinite(v))


def _exclusive(spec: SimSpec, links: set[str], offsets: list[float]) -> SimSpec:
    resources = dict(spec.resources)
    for name in links:
        resources[name] = dataclasses.replace(resources[name], policy="exclusive", order=None)
    return dataclasses.replace(spec, resources=resources, offsets=offsets)


def derive_plan(spec: SimSpec, links: Iterable[str], candidates: list[float] | None = None) -> TemporalPlan:
    """The temporal plan for `links` (resource ids of WAN link directions)."""
    links = set(links)
    unknown = links - set(spec.resources)
    if unknown:
        raise TemporalPlanError(f"links {sorted(unknown)} are not resources of the simulation")
    tried: list[tuple[float, float]] = []
    best: tuple[float, float, SimResult] | None = None
    for delta in candidates if candidates is not None else stagger_candidates(spec, links):
        offsets = [d * delta for d in range(spec.pipelines)]
        result = simulate(_exclusive(spec, links, offsets))
        tried.append((delta, result.makespan))
        if best is None or result.makespan < best[1] * (1 - 1e-9):
            best = (delta, result.makespan, result)
    if best is None:
        raise TemporalPlanError("no stagger candidates to try")
    delta, _, result = best
    order = {name: result.order_on(name) for name in sorted(links)}
    order = {name: keys for name, keys in order.items() if keys}
    # a slot is the transfer's hold of its links (its token passes at its end), which
    # outlasts its time on the wire where a link's `hold_factor` says so
    slots = {t.key: (t.start, t.held_until) for t in result.transfers if set(t.resources) & links}
    resources_of = {t.key: t.resources for t in result.transfers}
    plan = TemporalPlan(
        offsets=[d * delta for d in range(spec.pipelines)], order=order, slots=slots, resources_of=resources_of,
        stagger_s=delta, predicted_iteration_s=result.makespan, tried=tried,
    )
    # Enforcing the tokens must reproduce the plan (and cannot deadlock).
    check = simulate(plan.apply(spec))
    plan.predicted_iteration_s = check.makespan
    return plan
