"""Turning benchmark measurements into a table, JSON, CSV, a plot and target checks.

Pure functions of a list of `Measurement`s (plus file writes), kept apart from the
measuring so they can be tested on made-up numbers.
"""

from __future__ import annotations

import csv
import json
import statistics
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from testbed.bench.transport import Measurement

CSV_FIELDS = ["path", "method", "streams", "requested_streams", "goodput_mbps", "verified", "size_bytes",
              "samples_mbps", "error", "round", "cpu_ms_per_gib"]


@dataclass(frozen=True)
class Check:
    path: str
    name: str
    ratio: float | None  # the median over rounds of the per-round ratios
    target: float
    detail: str
    ratios: list[float] = field(default_factory=list)  # one per round where both sides were measured

    @property
    def ok(self) -> bool | None:
        return None if self.ratio is None else self.ratio >= self.target

    @property
    def spread(self) -> str:
        """min..max of the per-round ratios ("" with fewer than two rounds)."""
        if len(self.ratios) < 2:
            return ""
        return f"{min(self.ratios):.2f}..{max(self.ratios):.2f} over {len(self.ratios)} rounds"

    def as_dict(self) -> dict[str, Any]:
        return {"path": self.path, "name": self.name, "ratio": self.ratio, "target": self.target,
                "ok": self.ok, "detail": self.detail, "ratios": self.ratios,
                "min": min(self.ratios, default=None), "max": max(self.ratios, default=None)}


def _get(results: list[Measurement], path: str, method: str, streams: int | None = None,
         auto: bool = False) -> Measurement | None:
    for m in results:
        if m.path != path or m.method != method or m.goodput_mbps is None or m.verified is False:
            continue
        if (m.requested_streams == "auto") != auto:
            continue
        if streams is None or m.streams == streams:
            return m
    return None


def _ratio(a: Measurement | None, b: Measurement | None) -> float | None:
    if a is None or b is None or not b.goodput_mbps:
        return None
    return a.goodput_mbps / b.goodput_mbps


def rounds_of(results: list[Measurement]) -> list[int]:
    return sorted({m.round for m in results})


def summarize(results: list[Measurement]) -> list[Measurement]:
    """One row per (path, method, requested streams) over all rounds: goodput is the
    median of the rounds' goodputs, samples_mbps lists each round's, verified only
    if every round was; a round that failed is named in error. With one round, the
    results themselves."""
    if len(rounds_of(results)) < 2:
        return list(results)
    groups: dict[tuple[str, str, str], list[Measurement]] = {}
    for m in results:
        groups.setdefault((m.path, m.method, str(m.requested_streams)), []).append(m)
    out = []
    for rows in groups.values():
        good = [m for m in rows if m.goodput_mbps is not None]
        failed = [m for m in rows if m.error]
        verified = [m.verified for m in rows if m.verified is not None]
        first = good[0] if good else rows[0]
        out.append(replace(
            first,
            goodput_mbps=round(statistics.median(m.goodput_mbps for m in good), 1) if good else None,
            samples_mbps=[m.goodput_mbps for m in good],
            verified=all(verified) if verified else None,
            streams=statistics.mode(m.streams for m in good) if good else first.streams,
            cpu_ms_per_gib=_median_or_none(m.cpu_ms_per_gib for m in good),
            error="; ".join(f"round {m.round}: {m.error}" for m in failed) or None,
            round=-1,
        ))
    return out


def _median_or_none(values) -> float | None:
    xs = [x for x in values if x is not None]
    return round(statistics.median(xs), 1) if xs else None


def _check(results: list[Measurement], path: str, name: str, target: float, a_of, b_of) -> Check:
    """A target judged on the median of per-round ratios (each round pairs measurements
    taken moments apart); the detail gives both sides' medians over the rounds."""
    ratios = []
    for r in rounds_of(results):
        rows = [m for m in results if m.round == r]
        x = _ratio(a_of(rows), b_of(rows))
        if x is not None:
            ratios.append(x)
    summary = summarize(results)
    a, b = a_of(summary), b_of(summary)
    if len(rounds_of(results)) < 2:
        return Check(path, name, _ratio(a, b), target, f"{_fmt(a)} vs {_fmt(b)}", ratios)
    return Check(path, name, statistics.median(ratios) if ratios else None, target,
                 f"median {_fmt(a)} vs {_fmt(b)}", ratios)


def _fmt(m: Measurement | None) -> str:
    return "missing" if m is None else f"{m.goodput_mbps:.0f} Mbit/s"


def _best_fixed(rows: list[Measurement], path: str) -> Measurement | None:
    fixed = [m for m in rows if m.path == path and m.method == "atlas" and m.requested_streams != "auto"
             and m.goodput_mbps is not None and m.verified]
    return max(fixed, key=lambda m: m.goodput_mbps, default=None)


def checks(results: list[Measurement]) -> list[Check]:
    """The issues' targets: on the WAN, atlas N=8 >= 90% of iperf3 -P 8 and >= 4x
    atlas N=1, auto >= 90% of the best fixed N; on loopback, atlas N=1 >= 90% of one
    iperf3 stream and not slower than gloo. With several rounds each is judged on the
    median of its per-round ratios, and the spread is kept."""
    out = []
    paths = sorted({m.path for m in results})

    def get(path: str, method: str, streams: int | None = None, auto: bool = False):
        return lambda rows: _get(rows, path, method, streams, auto)

    if "wan" in paths:
        out.append(_check(results, "wan", "atlas N=8 / iperf3 -P 8", 0.9, get("wan", "atlas", 8), get("wan", "iperf3", 8)))
        out.append(_check(results, "wan", "atlas N=8 / atlas N=1", 4.0, get("wan", "atlas", 8), get("wan", "atlas", 1)))
    summary = summarize(results)
    for path in paths:
        auto = _get(summary, path, "atlas", auto=True)
        if auto is not None:
            best = _best_fixed(summary, path)
            name = f"atlas auto (N={auto.streams}) / best fixed (N={best.streams if best else '?'})"
            out.append(_check(results, path, name, 0.9, get(path, "atlas", auto=True),
                              lambda rows, path=path: _best_fixed(rows, path)))
    if "loopback" in paths:
        out.append(_check(results, "loopback", "atlas N=1 / iperf3 -P 1", 0.9, get("loopback", "atlas", 1),
                          get("loopback", "iperf3", 1)))
        out.append(_check(results, "loopback", "atlas N=1 / gloo", 1.0, get("loopback", "atlas", 1),
                          get("loopback", "gloo", 1)))
    return out


def table(results: list[Measurement], found: list[Check]) -> str:
    """One row per measurement; with several rounds, one row per method with the
    median over rounds and each round's goodput. CPU ms/GiB: both ends' CPU time per
    GiB moved (on a shared machine, goodput follows the CPU share a method gets; this
    column says what each needs)."""
    n_rounds = len(rounds_of(results))
    what = f"per round ({n_rounds} rounds)" if n_rounds > 1 else "samples"
    lines = [f"{'path':<9} {'method':<7} {'streams':>7} {'goodput Mbit/s':>15} {'CPU ms/GiB':>10} {'verified':>9}  "
             f"{what} / error"]
    for m in summarize(results):
        streams = f"auto={m.streams}" if m.requested_streams == "auto" else str(m.streams)
        gp = f"{m.goodput_mbps:.1f}" if m.goodput_mbps is not None else "-"
        cpu = f"{m.cpu_ms_per_gib:.0f}" if m.cpu_ms_per_gib is not None else "-"
        ver = {True: "yes", False: "NO", None: "-"}[m.verified]
        extra = m.error or ", ".join(f"{x:.0f}" for x in m.samples_mbps)
        lines.append(f"{m.path:<9} {m.method:<7} {streams:>7} {gp:>15} {cpu:>10} {ver:>9}  {extra}")
    if found:
        lines.append("")
        lines.append("targets:")
        for c in found:
            verdict = {True: "ok  ", False: "MISS", None: "n/a "}[c.ok]
            ratio = f"{c.ratio:.2f}" if c.ratio is not None else "-"
            spread = f"; {c.spread}" if c.spread else ""
            lines.append(f"  {verdict} {c.path:<9} {c.name:<45} {ratio:>6} (target >= {c.target:g}; {c.detail}{spread})")
    return "\n".join(lines)


def as_json(results: list[Measurement], found: list[Check], meta: dict[str, Any]) -> dict[str, Any]:
    """Every measurement ("results", each with its round), the checks, and with
    several rounds the per-method medians ("summary")."""
    doc = {"results": [m.row() for m in results], "checks": [c.as_dict() for c in found], "meta": meta}
    if len(rounds_of(results)) > 1:
        doc["summary"] = [m.row() for m in summarize(results)]
    return doc


def write_csv(results: list[Measurement], path: Path) -> None:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=CSV_FIELDS, extrasaction="ignore")
        w.writeheader()
        for m in results:
            row = m.row()
            row["samples_mbps"] = " ".join(f"{x:g}" for x in m.samples_mbps)
            w.writerow(row)


def write_json(doc: dict[str, Any], path: Path) -> None:
    path.write_text(json.dumps(doc, indent=2) + "\n")


STYLE = {"atlas": ("tab:blue", "o", "-"), "iperf3": ("tab:gray", "s", "--"),
         "tcp": ("tab:orange", "^", ":"), "gloo": ("tab:green", "v", ":")}


def plot(results: list[Measurement], path: Path, title: str = "") -> None:
    """Goodput vs streams per method, one panel per path. Single-stream methods (tcp,
    gloo) are drawn as a horizontal line at their goodput; atlas "auto" as a star at
    the stream count it chose; a failed verification as a red cross."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    results = summarize(results)
    paths = [p for p in ("loopback", "wan") if any(m.path == p for m in results)]
    fig, axes = plt.subplots(1, max(1, len(paths)), figsize=(6.5 * max(1, len(paths)), 4.6), squeeze=False)
    for ax, p in zip(axes[0], paths, strict=False):
        rows = [m for m in results if m.path == p and m.goodput_mbps is not None]
        ns = sorted({m.streams for m in rows if m.method in ("atlas", "iperf3")} | {1})
        for method in ("iperf3", "atlas"):
            pts = sorted((m.streams, m.goodput_mbps) for m in rows if m.method == method and m.requested_streams != "auto")
            if pts:
                color, marker, ls = STYLE[method]
                label = "iperf3 -P N (ceiling)" if method == "iperf3" else "atlas, N streams"
                ax.plot([x for x, _ in pts], [y for _, y in pts], marker=marker, linestyle=ls, color=color, label=label)
        for method in ("tcp", "gloo"):
            m = next((m for m in rows if m.method == method), None)
            if m is not None:
                color, marker, ls = STYLE[method]
                ax.axhline(m.goodput_mbps, color=color, linestyle=ls, linewidth=1.2)
                ax.plot([1], [m.goodput_mbps], marker=marker, color=color, linestyle="none",
                        label=f"{'plain TCP' if method == 'tcp' else 'torch gloo'} (1 stream)")
        auto = next((m for m in rows if m.method == "atlas" and m.requested_streams == "auto"), None)
        if auto is not None:
            ax.plot([auto.streams], [auto.goodput_mbps], marker="*", markersize=16, color="tab:red",
                    linestyle="none", label=f"atlas auto (chose N={auto.streams})")
        bad = [m for m in rows if m.verified is False]
        if bad:
            ax.plot([m.streams for m in bad], [m.goodput_mbps for m in bad], marker="x", markersize=12,
                    color="red", linestyle="none", label="verification FAILED")
        ax.set_xscale("log", base=2)
        ax.set_xticks(ns)
        ax.set_xticklabels([str(n) for n in ns])
        ax.set_xlabel("TCP streams (N)")
        ax.set_ylabel("goodput (Mbit/s)")
        ax.set_ylim(bottom=0)
        ax.set_title(f"{p}" + (f" - {title}" if title and p == "wan" else ""))
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
