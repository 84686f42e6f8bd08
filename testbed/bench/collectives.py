"""`testbed bench collectives`: torch.distributed collectives over atlas against gloo,
size by size, reported as nccl-tests reports them.

The timing runs in every rank (`testbed.bench.collectives_worker`, a plain ``env://``
program); this module holds what the command and the ranks share and what they make
of the results:

- the typed configuration the ranks get (`BenchConfig`) and the typed row each point
  gives (`PointResult`), kept in ``results.json`` (`BenchReport`) and ``results.csv``;
- the bandwidths: algorithm bandwidth ``algbw = S / t`` and bus bandwidth ``busbw =
  algbw x factor`` with nccl-tests' factors (NVIDIA/nccl-tests, doc/PERFORMANCE.md):
  ``2(n-1)/n`` for all_reduce, ``(n-1)/n`` for all_gather, reduce_scatter and
  all_to_all, 1 for send/recv; S is the whole array (the all-gathered output, the
  reduce-scattered input, one rank's all-to-all input). Bus bandwidth is what each rank's
  link carried, so it can be set against the link's rate whatever the number of ranks.
  Reported in Gbit/s (nccl-tests prints GB/s: divide by 8);
- rank 0's JSON lines as results (`results_from_metrics`): the emulated mode is
  `testbed launch`'s machinery, driven by the command (testbed/commands/bench.py); the
  local mode (N ranks on 127.0.0.1, no root) is `collectives_worker.run_local`;
- the table, CSV, JSON and the plot (bus bandwidth against size, one panel per
  collective, one line per backend).
"""

from __future__ import annotations

import csv
import math
from collections.abc import Iterable
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from testbed_core.units import format_size

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv")
BACKENDS = ("gloo", "atlas")


class CollectivesError(RuntimeError):
    """The benchmark could not run; the message says what and what to do."""


# --------------------------------------------------------------------------- bandwidth


def bus_factor(collective: str, world: int) -> float:
    """nccl-tests' correction from algorithm to bus bandwidth for `world` ranks."""
    if world < 1:
        raise ValueError(f"world size {world}: at least 1 rank")
    if collective == "all_reduce":
        return 2 * (world - 1) / world
    if collective in ("all_gather", "reduce_scatter", "all_to_all"):
        return (world - 1) / world
    if collective == "send_recv":
        return 1.0
    raise ValueError(f"unknown collective {collective!r}; known: {', '.join(COLLECTIVES)}")


def algbw_gbit_s(size_bytes: int, seconds: float) -> float:
    """S / t in Gbit/s (10^9 bits per second)."""
    if seconds <= 0:
        raise ValueError(f"a call of {seconds} s: the time must be positive")
    return size_bytes * 8 / seconds / 1e9


def busbw_gbit_s(collective: str, world: int, size_bytes: int, seconds: float) -> float:
    return algbw_gbit_s(size_bytes, seconds) * bus_factor(collective, world)


def size_ladder(smallest: int, largest: int, factor: int) -> list[int]:
    """smallest, smallest x factor, ... up to largest (which is always included)."""
    if smallest < 4:
        raise ValueError(f"the smallest size {smallest} B is under one float32 (4 B)")
    if largest < smallest:
        raise ValueError(f"the largest size {format_size(largest)} is under the smallest {format_size(smallest)}")
    if factor < 2:
        raise ValueError(f"factor {factor}: use 2 or more")
    sizes, s = [], smallest
    while s < largest:
        sizes.append(s)
        s *= factor
    sizes.append(largest)
    return sizes


# --------------------------------------------------------------------------- typed files


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class BenchConfig(_Model):
    """What every rank measures (passed to each rank as JSON)."""

    collectives: list[str] = Field(default_factory=lambda: list(COLLECTIVES))
    sizes: list[int] = Field(description="S in bytes (nccl-tests' convention, see the module's docstring)")
    iters: int = Field(5, ge=1, description="timed calls per point (fewer when over budget_s)")
    warmup: int = Field(1, ge=1, description="untimed calls before them; the first one's result is checked")
    budget_s: float = Field(20.0, gt=0, description="timed calls per point are cut to fit in about this long")
    max_op_s: float = Field(120.0, gt=0, description="after a point whose call took longer, larger sizes are skipped")
    timeout_s: float = Field(600.0, gt=0, description="the process group's timeout")

    @field_validator("collectives")
    @classmethod
    def _known(cls, value: list[str]) -> list[str]:
        unknown = [c for c in value if c not in COLLECTIVES]
        if unknown or not value:
            raise ValueError(f"unknown collective(s) {', '.join(unknown) or '(none)'}; choose from {', '.join(COLLECTIVES)}")
        return value

    @field_validator("sizes")
    @classmethod
    def _positive(cls, value: list[int]) -> list[int]:
        if not value or any(s < 4 for s in value):
            raise ValueError("give one or more sizes of 4 bytes (one float32) or more")
        return value


class PointResult(_Model):
    """One collective at one size over one backend (rank 0's report of all ranks)."""

    model_config = ConfigDict(extra="ignore")  # the worker's line carries "event"

    backend: str
    collective: str
    world_size: int
    size: int = Field(description="S as asked for, in bytes (the table's and the plot's size)")
    size_bytes: int = Field(description="S as measured (rounded down to a multiple of 4 x world size)")
    iters: int = 0
    time_s: float | None = Field(None, description="seconds per call: the slowest rank's loop time / iters")
    algbw_gbit_s: float | None = None
    busbw_gbit_s: float | None = None
    verified: bool | None = Field(None, description="the first call's result was right on every rank")
    error: str | None = None
    skipped: str | None = Field(None, description="why this size was not measured")


class BenchReport(_Model):
    """``results.json``."""

    command: str
    mode: str = Field(description="'local N' or the topology file")
    world_size: int
    hosts: list[str] = Field(default_factory=list, description="rank k ran on hosts[k] (emulated mode)")
    time: str = Field(description="when the run started (UTC)")
    host: str
    commit: str | None = Field(None, description="the checkout's commit when the run started; -dirty: with local changes")
    config: BenchConfig
    bus_bandwidth: str = ("busbw = algbw x 2(n-1)/n (all_reduce), x (n-1)/n (all_gather, reduce_scatter, "
                          "all_to_all), x 1 (send_recv); nccl-tests doc/PERFORMANCE.md; Gbit/s")
    results: list[PointResult]
    failures: list[str] = Field(default_factory=list, description="launches or ranks that failed, per backend")


def results_from_metrics(metrics: Iterable[dict]) -> list[PointResult]:
    """The results rank 0 printed (its JSON lines with ``"event": "result"``)."""
    out = []
    for m in metrics:
        if m.get("event") != "result":
            continue
        try:
            out.append(PointResult.model_validate(m))
        except ValidationError as exc:
            raise CollectivesError(f"a rank printed a result line that is not a PointResult: {exc}") from None
    return out


# --------------------------------------------------------------------------- report


CSV_FIELDS = list(PointResult.model_fields)


def _key(r: PointResult) -> tuple[int, int, int]:
    return (COLLECTIVES.index(r.collective) if r.collective in COLLECTIVES else 99, r.size,
            BACKENDS.index(r.backend) if r.backend in BACKENDS else 99)


def table(results: list[PointResult]) -> str:
    """One row per collective and size: each backend's time per call and bus bandwidth,
    and atlas's bus bandwidth over gloo's where both were measured."""
    backends = [b for b in BACKENDS if any(r.backend == b for r in results)]
    backends += sorted({r.backend for r in results} - set(backends))
    by = {(r.collective, r.size, r.backend): r for r in results}
    head = f"{'collective':<15}{'size':>9}"
    for b in backends:
        head += f" {b + ' ms':>11} {b + ' busbw':>12}"
    both = {"gloo", "atlas"} <= set(backends)
    if both:
        head += f" {'atlas/gloo':>10}"
    lines = [head + "   (busbw in Gbit/s, nccl-tests' convention)"]
    seen = sorted({(r.collective, r.size) for r in results},
                  key=lambda k: (COLLECTIVES.index(k[0]) if k[0] in COLLECTIVES else 99, k[1]))
    notes = []
    for coll, size in seen:
        line = f"{coll:<15}{format_size(size):>9}"
        for b in backends:
            r = by.get((coll, size, b))
            if r is None or r.time_s is None:
                line += f" {'-':>11} {'-':>12}"
                why = None if r is None else (r.error or r.skipped)
                if why:
                    notes.append(f"{b} {coll} {format_size(size)}: {why}")
            else:
                line += f" {r.time_s * 1e3:>11.3f} {r.busbw_gbit_s:>12.4f}"
        if both:
            a, g = by.get((coll, size, "atlas")), by.get((coll, size, "gloo"))
            ratio = (a.busbw_gbit_s / g.busbw_gbit_s if a and g and a.busbw_gbit_s and g.busbw_gbit_s else None)
            line += f" {ratio:>9.2f}x" if ratio is not None else f" {'-':>10}"
        lines.append(line)
    if notes:
        lines.append("")
        lines += [f"  {n}" for n in _dedupe_skips(notes)]
    return "\n".join(lines)


def _dedupe_skips(notes: list[str]) -> list[str]:
    """One line per reason: the sizes skipped for one reason are named together."""
    out: list[str] = []
    groups: dict[str, list[str]] = {}
    for n in notes:
        head, _, why = n.partition(": ")
        groups.setdefault(why, []).append(head)
    for why, heads in groups.items():
        out.append(f"{heads[0]}: {why}" if len(heads) == 1 else f"{heads[0]} .. {heads[-1].split()[-1]}: {why}")
    return out


def write_json(report: BenchReport, path: Path) -> None:
    path.write_text(report.model_dump_json(indent=1) + "\n")


def read_json(path: Path) -> BenchReport:
    return BenchReport.model_validate_json(Path(path).read_text())


def write_csv(results: list[PointResult], path: Path) -> None:
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=CSV_FIELDS)
        w.writeheader()
        for r in sorted(results, key=_key):
            w.writerow(r.model_dump())


STYLE = {"atlas": ("tab:blue", "o", "-"), "gloo": ("tab:green", "v", "--")}


def plot(results: list[PointResult], path: Path, title: str = "") -> None:
    """Bus bandwidth against size, one panel per collective, one line per backend
    (log-log); a point whose check failed is a red cross."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colls = [c for c in COLLECTIVES if any(r.collective == c for r in results)]
    cols = min(3, max(1, len(colls)))
    rows_n = math.ceil(max(1, len(colls)) / cols)
    fig, axes = plt.subplots(rows_n, cols, figsize=(5.2 * cols, 3.9 * rows_n), squeeze=False)
    for i, ax in enumerate(axes.flat):
        if i >= len(colls):
            ax.set_visible(False)
            continue
        coll = colls[i]
        for backend in sorted({r.backend for r in results}, key=lambda b: BACKENDS.index(b) if b in BACKENDS else 9):
            pts = sorted((r.size, r.busbw_gbit_s) for r in results
                         if r.collective == coll and r.backend == backend and r.busbw_gbit_s)
            if not pts:
                continue
            color, marker, ls = STYLE.get(backend, ("tab:gray", "s", ":"))
            ax.plot([s for s, _ in pts], [b for _, b in pts], marker=marker, linestyle=ls, color=color, label=backend)
            bad = [(r.size, r.busbw_gbit_s) for r in results if r.collective == coll and r.backend == backend
                   and r.verified is False and r.busbw_gbit_s]
            if bad:
                ax.plot(*zip(*bad, strict=True), marker="x", color="red", markersize=11, linestyle="none",
                        label=f"{backend}: wrong result")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        sizes = sorted({r.size for r in results if r.collective == coll})
        ticks = sizes if len(sizes) <= 6 else sizes[::2]
        ax.set_xticks(ticks)
        ax.set_xticklabels([format_size(s) for s in ticks], fontsize=8)
        ax.set_xlabel("size S")
        ax.set_ylabel("bus bandwidth (Gbit/s)")
        ax.set_title(coll)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8, loc="best")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


