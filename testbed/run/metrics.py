"""What a run measured, computed from the workers' records (pure: no I/O).

Inputs are the device timelines (`testbed_core.device_records.WorkRecord`, one list per device),
the transfer records the workers wrote (`TransferRecord`, one per boundary tensor,
merged from the sending and the receiving side) and the common start instant of
every iteration (the runner's barrier). Definitions, as printed in the summary:

* iteration i runs from its common start ``T_i`` to the end of the last piece of
  training work of any device that started in ``[T_i, T_{i+1})``; the iteration time
  is the mean over the measured iterations (those after the warm-up);
* a device's utilization is its busy time (any work: training, and prefill once
  BubbleTea runs) over the wall time of the measured iterations;
  ``device_utilization`` is the mean over devices; ``bubble_fraction`` is the mean
  idle share of *training* work (1 - training utilization);
* a transfer is on the wire from the moment the sender hands it to the transport
  (after any temporal-plan wait) until its last byte arrived minus the path's one-way
  delay; a WAN link direction is busy while any of its transfers is on the wire, and
  its goodput is the bytes it carried over its busy time. A link's goodput is that of
  its two directions together (bytes over the sum of their busy times), comparable to
  the link's rate.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from statistics import median
from typing import Any

from pydantic import BaseModel, ConfigDict

from testbed_core.contracts.summary import (
    BubbleTeaTail,
    IterationTail,
    RepeatFigures,
    RepeatRun,
    Repeats,
    SlowdownDecomposition,
    Summary,
    VariantFailure,
    WanDirection,
    WanLink,
)
from testbed_core.device_records import WorkRecord, busy_time
from testbed_core.intervals import covered

TRAINING_KINDS = ("forward", "backward", "optimizer", "allreduce")


class MetricsError(ValueError):
    """Records that cannot give the requested figures (e.g. no measured iteration)."""


@dataclass(frozen=True)
class TransferRecord:
    """One boundary tensor, as both ends saw it (wall-clock seconds, time.time())."""

    iteration: int
    pipeline: int
    boundary: int
    mb: int
    direction: str  # fwd (activations) or bwd (gradients)
    src: str  # worker ids, e.g. p0r0
    dst: str
    nbytes: int
    links: tuple[str, ...] = ()  # WAN link directions crossed, e.g. ("dc1->dc2",); () inside a DC
    latency_s: float = 0.0  # one-way delay of the path
    posted: float | None = None  # the sender's schedule reached the send
    not_before: float | None = None  # temporal plan: planned slot start (None: no plan)
    sent: float | None = None  # handed to the transport
    confirmed: float | None = None  # the receiver's DONE came back
    arrived: float | None = None  # last byte at the receiver
    streams: int = 1

    @property
    def wire_span(self) -> tuple[float, float] | None:
        """(first byte sent, last byte on the wire) or None if either end is missing."""
        if self.sent is None or self.arrived is None:
            return None
        end = max(self.sent, self.arrived - self.latency_s)
        return (self.sent, end)

    def to_json(self) -> dict[str, int | float | str | list[str] | None]:
        data = asdict(self)
        data["links"] = list(self.links)
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> TransferRecord:
        known = {k: data[k] for k in cls.__dataclass_fields__ if k in data}
        known["links"] = tuple(known.get("links") or ())
        return cls(**known)


def merge_transfer_sides(sends: Iterable[Mapping[str, Any]], recvs: Iterable[Mapping[str, Any]]) -> list[TransferRecord]:
    """Join the sender's and the receiver's view of each tensor (keyed by iteration,
    pipeline, boundary, micro-batch and direction) into one record each."""
    def key(d: Mapping[str, Any]) -> tuple:
        return (d["iteration"], d["pipeline"], d["boundary"], d["mb"], d["direction"])

    arrived = {key(r): r for r in recvs}
    out = []
    for s in sends:
        data = dict(s)
        r = arrived.pop(key(s), None)
        if r is not None:
            data["arrived"] = r.get("arrived")
        out.append(TransferRecord.from_json(data))
    for r in arrived.values():  # received, but the sender's record is missing (crash)
        out.append(TransferRecord.from_json(r))
    return sorted(out, key=lambda t: (t.iteration, t.sent or t.arrived or 0.0, t.pipeline, t.boundary, t.mb))


def is_training(rec: WorkRecord) -> bool:
    return rec.owner.startswith("train") or rec.kind in ("forward", "backward")


# ---------------------------------------------------------------- iterations

@dataclass(frozen=True)
class Iteration:
    index: int
    start: float  # the common start instant
    end: float  # last training work of the iteration ended

    @property
    def duration(self) -> float:
        return self.end - self.start


def iterations(
    timelines: Mapping[str, Sequence[WorkRecord]], starts: Sequence[float], ends: Sequence[float] | None = None
) -> list[Iteration]:
    """Iteration spans: from each common start to the last training work that began
    before the next start. `ends` (reported by the workers, e.g. after an all-reduce
    that is not device work) extend an iteration when later."""
    if not starts:
        raise MetricsError("no iteration was started")
    if list(starts) != sorted(starts):
        raise MetricsError("iteration starts must increase")
    out = []
    for i, t0 in enumerate(starts):
        t1 = starts[i + 1] if i + 1 < len(starts) else math.inf
        last = max(
            (r.end for recs in timelines.values() for r in recs if is_training(r) and t0 <= r.start < t1),
            default=None,
        )
        if ends is not None and i < len(ends) and ends[i] is not None:
            last = ends[i] if last is None else max(last, ends[i])
        if last is None:
            raise MetricsError(f"iteration {i} (started at {t0:.3f}) has no training work on any device")
        out.append(Iteration(i, t0, last))
    return out


def measured(its: Sequence[Iteration], warmup: int) -> list[Iteration]:
    kept = [it for it in its if it.index >= warmup]
    if not kept:
        raise MetricsError(f"no measured iterations: {len(its)} ran, the first {warmup} are warm-up")
    return kept


def stage_compute_times(
    timelines: Mapping[str, Sequence[WorkRecord]], windows: Sequence[tuple[float, float]], stages: int
) -> tuple[list[float], list[float]] | None:
    """Median forward and backward seconds of each (virtual) stage over the training
    work that began in `windows` (device labels ``F<mb>@s<stage>``, ``B<mb>@s<stage>``),
    or None when a stage has no record of either kind: what real devices really took,
    for predicting with them instead of the compute model."""
    times: dict[tuple[str, int], list[float]] = {}
    for recs in timelines.values():
        for r in recs:
            if r.kind not in ("forward", "backward") or "@s" not in r.label:
                continue
            if not any(t0 <= r.start < t1 for t0, t1 in windows):
                continue
            try:
                stage = int(r.label.rsplit("@s", 1)[1])
            except ValueError:
                continue
            times.setdefault((r.kind, stage), []).append(r.end - r.start)
    return _per_stage(times, stages, median)


def _per_stage(times: Mapping[tuple[str, int], Sequence[float]], stages: int,
               reduce: Callable[[Sequence[float]], float]) -> tuple[list[float], list[float]] | None:
    """(forward, backward) per stage, each `reduce`d over its samples; None when a
    stage has no sample of either kind."""
    out: dict[str, list[float]] = {"forward": [], "backward": []}
    for kind, values in out.items():
        for k in range(stages):
            got = times.get((kind, k))
            if not got:
                return None
            values.append(reduce(got))
    return out["forward"], out["backward"]


def stage_hold_times(
    timelines: Mapping[str, Sequence[WorkRecord]], transfers: Sequence[TransferRecord],
    spans: Mapping[int, tuple[float, float]], stages: int,
) -> tuple[list[float], list[float]] | None:
    """Mean seconds each (virtual) stage's forward and backward hold its worker's
    pipeline over the training work that began in the iterations of `spans` (iteration
    index -> its start and end): the work itself, the wait from when it could begin (the
    later of its worker's previous piece of work ending and its input tensor arriving)
    to its start, and the time from its end to handing its output tensor to the
    transport (posted). Real devices on the machine's shared cores pay all three on
    every micro-batch, and the slow ones too: the mean, not the median
    (`stage_compute_times`); None when a stage has no record of either kind."""
    arrived = {(t.iteration, t.dst, t.direction, t.mb): t.arrived for t in transfers if t.arrived is not None}
    posted = {(t.iteration, t.src, t.direction, t.mb): t.posted for t in transfers if t.posted is not None}
    times: dict[tuple[str, int], list[float]] = {}
    for recs in timelines.values():
        prev: dict[tuple[str, int], float] = {}  # (worker, iteration) -> its last piece of work's end
        for r in sorted(recs, key=lambda r: r.start):
            if r.kind not in ("forward", "backward") or "@s" not in r.label:
                continue
            iteration = next((i for i, (t0, t1) in spans.items() if t0 <= r.start < t1), None)
            if iteration is None:
                continue
            worker = r.owner.split(":", 1)[-1]
            # an iteration's first piece of work waits on its input only (the time before it
            # is the pipeline's overhead, `pipeline_overhead`)
            before, prev[worker, iteration] = prev.get((worker, iteration)), r.end
            try:
                stage = int(r.label.rsplit("@s", 1)[1])
                mb = int(r.label[1:].split("@", 1)[0])
            except ValueError:
                continue
            key = (iteration, worker, "fwd" if r.kind == "forward" else "bwd", mb)
            ready = max((t for t in (before, arrived.get(key)) if t is not None), default=r.start)
            handed = posted.get(key)
            held = r.end - r.start + max(0.0, r.start - ready) + (max(0.0, handed - r.end) if handed else 0.0)
            times.setdefault((r.kind, stage), []).append(held)
    return _per_stage(times, stages, lambda got: sum(got) / len(got))


def pipeline_overhead(timelines: Mapping[str, Sequence[WorkRecord]], spans: Sequence[tuple[float, float]]) -> float:
    """Median time of each iteration outside its forward/backward pipeline: from the
    common start to the first forward, and from the last backward to the iteration's
    end (real devices: the DP gradient exchange, the optimizer step, the barrier)."""
    extra = []
    for t0, t1 in spans:
        work = [r for recs in timelines.values() for r in recs
                if r.kind in ("forward", "backward") and t0 <= r.start < t1]
        if work:
            extra.append(max(0.0, min(r.start for r in work) - t0) + max(0.0, t1 - max(r.end for r in work)))
    return median(extra) if extra else 0.0


# ---------------------------------------------------------------- devices

def device_utilization(
    timelines: Mapping[str, Sequence[WorkRecord]], windows: Sequence[tuple[float, float]], *, training_only: bool = False
) -> dict[str, float]:
    """Busy share of each device over the windows (summed)."""
    wall = sum(t1 - t0 for t0, t1 in windows)
    if wall <= 0:
        raise MetricsError("the measured iterations have no duration")
    out = {}
    for name, recs in timelines.items():
        chosen = [r for r in recs if is_training(r)] if training_only else list(recs)
        out[name] = sum(busy_time(chosen, t0, t1) for t0, t1 in windows) / wall
    return out


def mean(values: Iterable[float]) -> float:
    vals = list(values)
    return sum(vals) / len(vals) if vals else 0.0


# ---------------------------------------------------------------- WAN links

@dataclass
class LinkStats:
    bytes: int = 0
    transfers: int = 0
    busy_s: float = 0.0
    spans: list[tuple[float, float]] = field(default_factory=list, repr=False)

    @property
    def goodput_mbps(self) -> float | None:
        return self.bytes * 8 / self.busy_s / 1e6 if self.busy_s > 0 else None


def link_name(direction: str) -> str:
    """'dc2->dc1' -> 'dc1-dc2' (the two DCs sorted): a link's name when the
    topology's own name is not known."""
    a, _, b = direction.partition("->")
    return "-".join(sorted((a, b)))


def wan_stats(
    transfers: Iterable[TransferRecord],
    windows: Sequence[tuple[float, float]],
    link_names: Mapping[frozenset[str], str] | None = None,
) -> tuple[dict[str, WanLink], dict[str, WanDirection]]:
    """(per link, per link direction) bytes, transfers, busy seconds and goodput of
    the transfers that started inside the windows. `link_names` maps the pair of
    DCs to the topology's link name (default 'a-b' sorted)."""
    wall = sum(t1 - t0 for t0, t1 in windows)
    per_dir: dict[str, LinkStats] = {}
    for t in transfers:
        span = t.wire_span
        if not t.links or span is None:
            continue
        if not any(t0 <= span[0] < t1 for t0, t1 in windows):
            continue
        for d in t.links:
            st = per_dir.setdefault(d, LinkStats())
            st.bytes += t.nbytes
            st.transfers += 1
            st.spans.append(span)
    for st in per_dir.values():
        st.busy_s = covered(st.spans)

    def row(busy: float, nbytes: int, count: int) -> WanDirection:
        return WanDirection(bytes=nbytes, transfers=count, busy_s=busy,
                            goodput_mbps=nbytes * 8 / busy / 1e6 if busy > 0 else None,
                            mean_throughput_mbps=nbytes * 8 / wall / 1e6 if wall > 0 else None)

    directions = {d: row(st.busy_s, st.bytes, st.transfers) for d, st in sorted(per_dir.items())}
    links: dict[str, WanLink] = {}
    grouped: dict[str, list[str]] = {}
    for d in per_dir:
        a, _, b = d.partition("->")
        name = (link_names or {}).get(frozenset((a, b))) or link_name(d)
        grouped.setdefault(name, []).append(d)
    for name, dirs in sorted(grouped.items()):
        busy = sum(per_dir[d].busy_s for d in dirs)
        nbytes = sum(per_dir[d].bytes for d in dirs)
        count = sum(per_dir[d].transfers for d in dirs)
        links[name] = WanLink(**dict(row(busy, nbytes, count)), directions=sorted(dirs))
    return links, directions


def transfer_wait(transfers: Iterable[TransferRecord], windows: Sequence[tuple[float, float]]) -> dict[str, float]:
    """Mean seconds WAN transfers waited for their planned slot, and mean time from
    hand-over to arrival."""
    waits, flights = [], []
    for t in transfers:
        if not t.links or t.sent is None or not any(t0 <= t.sent < t1 for t0, t1 in windows):
            continue
        if t.posted is not None:
            waits.append(max(0.0, t.sent - t.posted))
        if t.arrived is not None:
            flights.append(t.arrived - t.sent)
    return {"mean_plan_wait_s": mean(waits), "mean_wan_transfer_s": mean(flights)}


def _wan_transfers(transfers: Iterable[TransferRecord], iterations: Iterable[int]) -> list[TransferRecord]:
    wanted = set(iterations)
    return [t for t in transfers if t.iteration in wanted and t.links and t.wire_span is not None]


def _alone(recs: Sequence[TransferRecord]) -> list[bool]:
    """For each transfer: did it have its link directions to itself (no other transfer
    on the wire there at any moment of its own time on the wire)?"""
    by_link: dict[str, list[tuple[float, float]]] = {}
    for t in recs:
        for d in t.links:
            by_link.setdefault(d, []).append(t.wire_span)  # type: ignore[arg-type]
    out = []
    for t in recs:
        s0, e0 = t.wire_span  # type: ignore[misc]
        out.append(all(sum(1 for s, e in by_link[d] if s < e0 and e > s0) <= 1 for d in t.links))  # itself once
    return out


def _wire_s(t: TransferRecord) -> float:
    s, e = t.wire_span  # type: ignore[misc]
    return max(1e-6, e - s)


def channel_rate(transfers: Iterable[TransferRecord], iterations: Iterable[int], min_solo: int = 4,
                 solo_only: bool = True) -> tuple[float, int, str] | None:
    """Median rate (bits/s) of the WAN transfers of `iterations` over their time on the
    wire; with `solo_only`, counting only transfers that had their link directions to
    themselves (no other transfer on the wire there at the same time) when there are
    at least `min_solo` of them. Returns (rate, transfers counted, which) or None."""
    recs = _wan_transfers(transfers, iterations)
    if not recs:
        return None
    solo = [t for t, alone in zip(recs, _alone(recs), strict=True) if alone]
    chosen, which = (solo, "alone on the link") if solo_only and len(solo) >= min_solo else (recs, "all")
    return median([t.nbytes * 8 / _wire_s(t) for t in chosen]), len(chosen), which


def colliding_rate(transfers: Iterable[TransferRecord], iterations: Iterable[int], channels: int,
                   min_count: int = 8) -> tuple[float, int] | None:
    """What a link direction carried in all while the WAN transfers of `iterations`
    collided on it: `channels` x mean bytes over the mean time on the wire of the
    transfers that shared their link with another at some moment (the mean: the rare
    retransmission timeout is part of what collisions cost). The same estimate as the
    calibration's collision probe (testbed/run/calibration.py `aggregate_rate`), from the
    run's own pattern of overlaps. Returns (bits/s, transfers counted), or None with
    fewer than `min_count` of them."""
    recs = _wan_transfers(transfers, iterations)
    hit = [t for t, alone in zip(recs, _alone(recs), strict=True) if not alone]
    if len(hit) < min_count:
        return None
    bits = sum(t.nbytes for t in hit) * 8 / len(hit)
    return channels * bits / (sum(_wire_s(t) for t in hit) / len(hit)), len(hit)


# ---------------------------------------------------------------- a variant

class VariantMetrics(BaseModel):
    """The measured figures of one variant (`variant_metrics`); each field is the
    summary.json `VariantResult` field of the same name."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    iteration_time_s: float
    iteration_times_s: list[float]
    warmup_iteration_times_s: list[float]
    iteration_time_stdev_s: float
    device_utilization: float
    device_utilization_training: float
    bubble_fraction: float
    per_device_utilization: dict[str, float]
    wan_links: dict[str, WanLink]
    wan_directions: dict[str, WanDirection]
    mean_plan_wait_s: float
    mean_wan_transfer_s: float


def variant_metrics(
    timelines: Mapping[str, Sequence[WorkRecord]],
    starts: Sequence[float],
    warmup: int,
    transfers: Sequence[TransferRecord] = (),
    *,
    ends: Sequence[float] | None = None,
    link_names: Mapping[frozenset[str], str] | None = None,
) -> VariantMetrics:
    """The measured figures of one variant, as they go into summary.json."""
    its = iterations(timelines, starts, ends)
    kept = measured(its, warmup)
    windows = [(it.start, it.end) for it in kept]
    util = device_utilization(timelines, windows)
    util_train = device_utilization(timelines, windows, training_only=True)
    links, directions = wan_stats(transfers, windows, link_names)
    times = [it.duration for it in kept]
    return VariantMetrics(
        iteration_time_s=mean(times),
        iteration_times_s=times,
        warmup_iteration_times_s=[it.duration for it in its if it.index < warmup],
        iteration_time_stdev_s=_stdev(times),
        device_utilization=mean(util.values()),
        device_utilization_training=mean(util_train.values()),
        bubble_fraction=1.0 - mean(util_train.values()),
        per_device_utilization=dict(sorted(util.items())),
        wan_links=links,
        wan_directions=directions,
        **transfer_wait(transfers, windows),
    )


def _stdev(values: Sequence[float]) -> float:
    if len(values) < 2:
        return 0.0
    m = mean(values)
    return math.sqrt(sum((v - m) ** 2 for v in values) / (len(values) - 1))


# ------------------------------------------------- BubbleTea: the slowdown's parts

def iteration_tail(times_s: Sequence[float]) -> IterationTail | None:
    """p50, p95, p99 and max of iteration times (None: none)."""
    import numpy as np

    if not times_s:
        return None
    arr = np.asarray(times_s, dtype=float)
    return IterationTail(n=len(times_s), p50=float(np.percentile(arr, 50)), p95=float(np.percentile(arr, 95)),
                         p99=float(np.percentile(arr, 99)), max=float(arr.max()))


def bubbletea_tail(plain_times_s: Sequence[float], with_times_s: Sequence[float]) -> BubbleTeaTail | None:
    """The tail with BubbleTea against the plain twin's, both measured in the same run."""
    w, p = iteration_tail(with_times_s), iteration_tail(plain_times_s)
    if w is None or p is None:
        return None
    limit = 1.05 * p.p50
    return BubbleTeaTail(with_bubbletea=w, without=p, max_ratio=w.max / p.max, p99_ratio=w.p99 / p.p99,
                         p95_ratio=w.p95 / p.p95, p50_ratio=w.p50 / p.p50,
                         slowed_over_5pct=sum(1 for t in with_times_s if t > limit))


def tail_line(t: BubbleTeaTail) -> str:
    """The tail in one log line."""
    return (f"tail: max {t.with_bubbletea.max:.3f} s vs {t.without.max:.3f} s ({t.max_ratio:.2f}x), p99 "
            f"{t.p99_ratio:.2f}x, p95 {t.with_bubbletea.p95:.3f} vs {t.without.p95:.3f} s, p50 "
            f"{t.with_bubbletea.p50:.3f} vs {t.without.p50:.3f} s; {t.slowed_over_5pct} of {t.with_bubbletea.n} "
            "iterations slowed by more than 5%")


def decompose_slowdown(plain_times_s: Sequence[float], with_times_s: Sequence[float],
                       idle_times_s: Sequence[float] | None, waited_on_prefill_s: float,
                       **cpu: Any) -> SlowdownDecomposition:
    """Where a +bubbletea variant's slowdown comes from, against its plain twin: the
    measured iteration times of the plain twin, of the variant with prefill, and of the
    idle twin (agents running, admitting nothing; None: not played), and the total time
    training waited on a prefill over the measured iterations (device timelines).
    ``cpu``: the CPU figures (agents_cpu_cores, ...) passed through to the result.

    total = agent_overhead (idle over plain) + prefill_interference (the rest); the plain
    twin's own spread is the network noise, and the 95% half-width of the total follows
    from both variants' spreads (the difference of two means)."""
    if not plain_times_s or not with_times_s:
        raise MetricsError("a slowdown needs measured iterations of both the plain variant and its +bubbletea twin")
    plain, bt = mean(plain_times_s), mean(with_times_s)
    total = bt / plain - 1
    idle = mean(idle_times_s) if idle_times_s else None
    overhead = None if idle is None else idle / plain - 1
    noise_total = None
    if len(plain_times_s) >= 2 and len(with_times_s) >= 2:
        se = math.sqrt(_stdev(plain_times_s) ** 2 / len(plain_times_s) + _stdev(with_times_s) ** 2 / len(with_times_s))
        noise_total = 1.96 * se / plain
    return SlowdownDecomposition(
        total=total, agent_overhead=overhead,
        prefill_interference=None if overhead is None else total - overhead,
        training_waited_on_prefill=waited_on_prefill_s / len(with_times_s) / plain,
        network_noise=_stdev(plain_times_s) / plain, noise_on_total=noise_total,
        idle_twin_iteration_time_s=idle, idle_twin_iteration_times_s=list(idle_times_s or []),
        tail=bubbletea_tail(plain_times_s, with_times_s), **cpu,
    )


def decomposition_line(d: SlowdownDecomposition) -> str:
    """The decomposition in one log line."""
    def pct(x: float | None) -> str:
        return "-" if x is None else f"{x:+.1%}"

    parts = [f"slowdown {pct(d.total)}"]
    if d.agent_overhead is not None:
        parts.append(f"= agents' overhead {pct(d.agent_overhead)} (idle twin {d.idle_twin_iteration_time_s:.3f} s) "
                     f"+ prefill interference {pct(d.prefill_interference)}")
    parts.append(f"(training waited on prefill {d.training_waited_on_prefill:.1%}); network noise: plain "
                 f"iterations spread {d.network_noise:.1%}"
                 + ("" if d.noise_on_total is None else f", slowdown +-{d.noise_on_total:.1%} (95%)"))
    cores = [f"{k} {v:.2f}" for k, v in (("agents", d.agents_cpu_cores), ("idle agents", d.idle_agents_cpu_cores),
                                         ("emulator", d.emulator_cpu_cores)) if v is not None]
    line = " ".join(parts)
    if cores:
        line += f"; CPU cores used: {', '.join(cores)}"
    if d.cpu_weights:
        line += f" ({d.cpu_weights})"
    if d.tail is not None:
        line += f"; {tail_line(d.tail)}"
    return line


def repeat_stats(runs: Sequence[RepeatRun]) -> Repeats:
    """Every repeat of one variant, and per figure the median and the spread (max - min)."""
    if not runs:
        raise MetricsError("no repeat to summarise")
    figures = {}
    for key in RepeatFigures.model_fields:
        values = [getattr(r, key) for r in runs if getattr(r, key) is not None]
        figures[key] = (median(values), max(values) - min(values)) if values else (None, None)
    worst = {}
    for key in RepeatFigures.model_fields:
        values = [getattr(r, key) for r in runs if getattr(r, key) is not None]
        worst[key] = (min(values) if key.startswith("device_utilization") else max(values)) if values else None
    pooled = [t for r in runs for t in r.iteration_times_s]
    return Repeats(runs=list(runs), median=RepeatFigures(**{k: v[0] for k, v in figures.items()}),
                   spread=RepeatFigures(**{k: v[1] for k, v in figures.items()}),
                   tail=iteration_tail(pooled), worst=RepeatFigures(**worst))


# ---------------------------------------------------------------- the table

def summary_table(summary: Summary) -> str:
    """Fixed-width table of the variants of one run (what `testbed run` prints last)."""
    head = f"{'variant':<22}{'iter s':>9}{'pred s':>9}{'err':>7}{'util':>7}{'bubble':>8}{'WAN MB':>9}{'Mbit/s':>8}"
    lines = [head, "-" * len(head)]
    baseline = summary.result("baseline")
    base = baseline.headline("iteration_time_s") if baseline else None
    notes = []
    for name, v in summary.variants.items():
        if isinstance(v, VariantFailure):
            lines.append(f"{name:<22}FAILED: {v.error}")
            continue
        it, pred = v.headline("iteration_time_s"), v.predicted_iteration_time_s
        err = f"{(it - pred) / pred:+.0%}" if it and pred else "-"
        speed = f"  x{base / it:.2f} vs baseline" if base and it and name != "baseline" else ""
        lines.append(
            f"{name:<22}{_f(it, '.3f'):>9}{_f(pred, '.3f'):>9}{err:>7}{_f(v.headline('device_utilization'), '.0%'):>7}"
            f"{_f(v.bubble_fraction, '.0%'):>8}{(v.wan_bytes() + v.allreduce_wan_bytes()) / 1e6:>9.1f}"
            f"{_f(v.goodput_mbps(), '.0f'):>8}"
            f"{speed}"
        )
        slow = v.headline("training_slowdown")
        if slow is not None:
            notes.append(f"{name}: training slowdown {slow:+.1%}, utilization {v.headline('device_utilization'):.1%}"
                         + (f" (median of {len(v.repeats.runs)} repeats)" if v.repeats is not None else ""))
        if v.slowdown_decomposition is not None:
            first = "repeat 1: " if v.repeats is not None else ""
            notes.append(f"  {first}{decomposition_line(v.slowdown_decomposition)}")
    if any(v.repeats is not None for v in summary.variants.values() if not isinstance(v, VariantFailure)):
        lines.append("(iteration time and utilization: median over the repeats)")
    if any(v.allreduce_wan_bytes() for v in summary.variants.values() if not isinstance(v, VariantFailure)):
        lines.append("(WAN MB: the pipeline's tensors and the DP all-reduce rings' bytes over the measured "
                     "iterations; Mbit/s: the pipeline's)")
    return "\n".join(lines + notes)


def _f(value: Any, spec: str) -> str:
    return "-" if value is None else format(value, spec)
