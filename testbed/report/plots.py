"""The plots of a report, drawn from its rows (loading.py) and nothing else.

Sweeps: against the swept parameter, iteration time per variant (measured, and
predicted dotted), the speedup of each variant over the baseline, Atlas's speedup over
each other variant (the paper's headline: over dp-across-dc and torch-gloo), device utilization
with and without BubbleTea and the training slowdown it costs, TTFT, and transport
goodput when streams or bandwidth are swept; a second swept parameter becomes one
column of panels per value. A single run: bars per variant. Variant order and colours
come from the variant registry (testbed_core/variants.py), so every figure of the
testbed draws a variant alike.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from testbed.report.loading import ResultSet, Row, category, number, parse_cell, wan_goodput
from testbed_core.contracts.bubbletea import PAPER_UTILIZATION, SLOWDOWN_LIMIT
from testbed_core.contracts.summary import VariantResult
from testbed_core.units import UnitError, parse_duration, parse_rate, parse_size
from testbed_core.variants import base_name, colour, has_bubbletea, sort_key

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.container import BarContainer

MARKERS = ("o", "s", "D", "v", "P")  # by variant rank in the registry; the last for the others


# ---------------------------------------------------------------------------- axes


@dataclass
class Axis:
    """How a swept parameter maps onto a plot axis."""

    path: str
    title: str
    convert: Callable[[Any], float | None]
    categories: list[str] | None = None  # for values that are not numbers
    log: bool = False

    def x(self, value: Any) -> float | None:
        if self.categories is not None:
            text = category(value)
            return float(self.categories.index(text)) if text in self.categories else None
        return self.convert(value)


def _kind(values: list[Any]) -> str:
    """number, duration, rate, size, or other, for the values of one parameter."""
    kinds = set()
    for v in values:
        if isinstance(v, bool) or v is None:
            return "other"
        if isinstance(v, (int, float)):
            kinds.add("number")
            continue
        if not isinstance(v, str):
            return "other"
        unit = re.sub(r"^\s*[-+]?[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?\s*", "", v)
        if unit == v:
            return "other"
        for kind, parser in (("duration", parse_duration), ("rate", parse_rate), ("size", parse_size)):
            try:
                parser(v)
            except (UnitError, ValueError):
                continue
            kinds.add(kind)
            break
        else:
            return "other"
    if kinds <= {"number"}:
        return "number"
    kinds.discard("number")
    return kinds.pop() if len(kinds) == 1 else "other"


def _safe(fn: Callable[[Any], float]) -> Callable[[Any], float | None]:
    def convert(value: Any) -> float | None:
        try:
            out = fn(value)
        except (UnitError, ValueError, TypeError):
            return None
        return out if math.isfinite(out) else None

    return convert


_NAMED = {
    "transport.streams": "TCP streams per transfer",
    "bubbletea.requests.rate": "prefill request rate (requests/s)",
    "bubbletea.requests.deadline": "request deadline (s)",
    "bubbletea.chunk_tokens": "prefill chunk (tokens)",
    "workload.parallelism.dp": "data-parallel pipelines (DP)",
    "workload.parallelism.pp": "pipeline stages (PP)",
    "workload.parallelism.tp": "tensor parallelism (TP)",
    "workload.parallelism.micro_batch": "micro-batch size (sequences)",
    "workload.parallelism.num_micro_batches": "micro-batches per iteration",
    "workload.scale": "tensor scale (wire size / real size)",
    "workload.model.seq_len": "sequence length (tokens)",
    "workload.model.hidden": "hidden size",
    "workload.model.layers": "layers",
}


def axis_for(path: str, values: list[Any]) -> Axis:
    """A readable axis for a swept parameter: WAN delay is shown as RTT in ms, rates in
    Mbit/s, sizes in MiB; values that are not numbers become categories."""
    kind = _kind(values)
    if re.fullmatch(r"topology\.wan\.(\d+|\*)\.delay", path) and kind in ("duration", "number"):
        return Axis(path, "WAN RTT (ms)  [2 x one-way delay]", _safe(lambda v: 2000 * parse_duration(v)))
    if kind == "duration":
        return Axis(path, f"{path} (ms)", _safe(lambda v: 1000 * parse_duration(v)))
    if kind == "rate" or (re.fullmatch(r"topology\.wan\.(\d+|\*)\.rate", path) and kind == "number"):
        big = max((parse_rate(v) for v in values), default=0) >= 10e9
        div, unit = (1e9, "Gbit/s") if big else (1e6, "Mbit/s")
        title = f"WAN bandwidth ({unit})" if path.startswith("topology.wan") else f"{path} ({unit})"
        return Axis(path, title, _safe(lambda v: parse_rate(v) / div))
    if kind == "size":
        return Axis(path, f"{path} (MiB)", _safe(lambda v: parse_size(v) / 2**20))
    if kind == "number":
        nums = [float(v) for v in values]
        log = min(nums) > 0 and max(nums) / min(nums) >= 16 and len(nums) >= 3
        return Axis(path, _NAMED.get(path, path), _safe(float), log=log)
    cats: list[str] = []
    for v in values:
        if category(v) not in cats:
            cats.append(category(v))
    title = "topology" if path == "topology" else "workload" if path == "workload" else _NAMED.get(path, path)
    return Axis(path, title, _safe(float), categories=cats)


# ---------------------------------------------------------------------------- plots


@dataclass
class Series:
    label: str
    variant: str
    metric: Callable[[Row], float | None]
    dashed: bool = False
    marker: str = "o"
    thin: bool = False


@dataclass
class Panel:
    ylabel: str
    series: list[Series]
    percent: bool = False
    hlines: list[tuple[float, str]] = field(default_factory=list)
    ymin0: bool = True
    decimals: int | None = 0  # of percent ticks


def _col(name: str, scale: float = 1.0) -> Callable[[Row], float | None]:
    def get(row: Row) -> float | None:
        value = number(row.get(name))
        return value * scale if value is not None else None

    return get


def _aggregate(rows: list[Row], axis: Axis, series: Series) -> tuple[list[float], list[float], list[float]]:
    """Mean and standard deviation over seeds at each x, for one series."""
    groups: dict[float, list[float]] = {}
    for row in rows:
        if series.variant and row.get("variant") != series.variant or row.get("status") != "ok":
            continue
        x = axis.x(row.get(axis.path))
        y = series.metric(row)
        if x is None or y is None:
            continue
        groups.setdefault(x, []).append(y)
    xs = sorted(groups)
    means = [sum(groups[x]) / len(groups[x]) for x in xs]
    stds = [
        math.sqrt(sum((v - m) ** 2 for v in groups[x]) / (len(groups[x]) - 1)) if len(groups[x]) > 1 else 0.0
        for x, m in zip(xs, means, strict=True)
    ]
    return xs, means, stds


def _facets(rs: ResultSet, rows: list[Row], primary: str) -> list[tuple[str, list[Row]]]:
    """One panel column per combination of the parameters other than the x axis."""
    others = [(p, lab) for p, lab in rs.parameters if p != primary]
    if not others:
        return [("", rows)]
    groups: dict[tuple[str, ...], list[Row]] = {}
    order: list[tuple[str, ...]] = []
    for pt in rs.points:
        key = tuple(f"{lab}={category(pt.parameters.get(p))}" for p, lab in others)
        if key not in groups:
            groups[key] = []
            order.append(key)
    for row in rows:
        key = tuple(f"{lab}={category(parse_cell(row.get(p)))}" for p, lab in others)
        groups.setdefault(key, []).append(row)
        if key not in order:
            order.append(key)
    return [(", ".join(k), groups[k]) for k in order]


def _line_figure(path: Path, title: str, axis: Axis, facets: list[tuple[str, list[Row]]],
                 panels: list[Panel]) -> Path | None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, PercentFormatter

    facets = facets[:6]
    ncols, nrows = len(facets), len(panels)
    fig, axes = plt.subplots(nrows, ncols, figsize=(max(6.4, 5.2 * ncols), 3.9 * nrows + 0.6),
                             squeeze=False, sharex=True)
    palette: dict[str, str] = {}
    drawn = False
    for c, (facet_title, frows) in enumerate(facets):
        for r, panel in enumerate(panels):
            ax = axes[r][c]
            for s in panel.series:
                xs, ys, errs = _aggregate(frows, axis, s)
                if not xs:
                    continue
                drawn = True
                color = colour(s.variant, palette) if s.variant else "0.35"
                # Earlier series drawn wider, with their own marker, so equal values stay visible.
                rank = min(sort_key(s.variant)[0], len(MARKERS) - 1)
                style = {"color": color, "linestyle": "--" if s.dashed else (":" if s.thin else "-"),
                         "marker": None if s.thin else (s.marker if s.marker != "o" else MARKERS[rank]),
                         "linewidth": 1.2 if s.thin else 3.2 - 0.6 * min(rank, 3),
                         "markersize": 9 - 1.2 * min(rank, 3), "label": s.label,
                         "alpha": 0.8 if s.thin else 0.95}
                if any(errs):
                    ax.errorbar(xs, ys, yerr=errs, capsize=3, **style)
                else:
                    ax.plot(xs, ys, **style)
            for y, label in panel.hlines:
                ax.axhline(y, color="0.35", linestyle=(0, (4, 3)), linewidth=1)
                ax.annotate(label, xy=(0.01, y), xycoords=("axes fraction", "data"), xytext=(0, 3),
                            textcoords="offset points", fontsize=8, color="0.3")
            ax.set_ylabel(panel.ylabel)
            if panel.percent:
                ax.yaxis.set_major_formatter(PercentFormatter(1.0, decimals=panel.decimals))
            if panel.ymin0:
                ax.set_ylim(bottom=0)
            else:  # keep zero in view: a slowdown near 0 must not look large
                low, high = ax.get_ylim()
                ax.set_ylim(min(low, 0.0), max(high, 0.0))
            for y, _ in panel.hlines:  # room above a reference line for its label
                if y > 0 and ax.get_ylim()[1] < y * 1.1:
                    ax.set_ylim(top=y * 1.1)
            ax.grid(True, alpha=0.3)
            if facet_title and r == 0:
                ax.set_title(facet_title, fontsize=10)
            if r == nrows - 1:
                ax.set_xlabel(axis.title)
            if axis.categories is not None:
                ax.set_xticks(range(len(axis.categories)))
                ax.set_xticklabels(axis.categories)
            elif axis.log:
                ax.set_xscale("log", base=2)
                ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
            handles, labels = ax.get_legend_handles_labels()
            if handles and c == ncols - 1:  # outside the axes: never hides a line
                ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0)
    if not drawn:
        plt.close(fig)
        return None
    fig.suptitle(title, fontsize=12)
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path


def _present(rows: list[Row], metric: str, variant: str | None = None) -> bool:
    return any(
        number(r.get(metric)) is not None and (variant is None or r.get("variant") == variant)
        for r in rows if r.get("status") == "ok"
    )


def sweep_plots(rs: ResultSet, rows: list[Row], out: Path) -> list[Path]:
    """The plots that answer the sweep's question, against its (first numeric) parameter."""
    if not rs.parameters:
        return []
    axes = {p: axis_for(p, _values_of(rs, p)) for p, _ in rs.parameters}
    streams = next((p for p, _ in rs.parameters if p.endswith("streams")), None)
    primary = next((p for p, _ in rs.parameters if axes[p].categories is None), rs.parameters[0][0])
    axis = axes[primary]
    facets = _facets(rs, rows, primary)
    variants = sorted({r["variant"] for r in rows if r.get("variant") and not r["variant"].startswith("bench:")},
                      key=sort_key)
    plain = [v for v in variants if not has_bubbletea(v)]
    with_bt = [v for v in variants if has_bubbletea(v)]
    title_tail = f" — sweep {rs.name}"
    made: list[Path | None] = []

    if _present(rows, "seconds_per_step"):  # a program scenario (testbed/run/program.py): its rank 0's step time
        made.append(_line_figure(
            out / "step_time.png", "Seconds per training step (median of rank 0's step_s)" + title_tail, axis,
            facets, [Panel("seconds per step", [Series(v, v, _col("seconds_per_step")) for v in variants])]))
    lines = [Series(v, v, _col("iteration_time_s")) for v in (plain or variants)]
    lines += [Series(f"{v} (predicted)", v, _col("predicted_iteration_time_s"), thin=True)
              for v in (plain or variants) if _present(rows, "predicted_iteration_time_s", v)]
    made.append(_line_figure(out / "iteration_time.png", "Training iteration time" + title_tail, axis, facets,
                             [Panel("iteration time (s)", lines)]))

    if "baseline" in variants:
        others = [v for v in plain if v != "baseline"]
        if others:
            made.append(_line_figure(
                out / "speedup.png", "Speedup over baseline (baseline iteration time / variant's)" + title_tail,
                axis, facets,
                [Panel("speedup (x)", [Series(v, v, _col("speedup_vs_baseline")) for v in others],
                       hlines=[(1.0, "baseline")])],
            ))

    if "atlas" in plain and len(plain) > 1:
        over = [v for v in plain if v != "atlas"]
        made.append(_line_figure(
            out / "atlas_speedup.png", "Atlas's speedup over each variant (its iteration time / atlas's)"
            + title_tail, axis, facets,
            [Panel("atlas speedup (x)", [Series(f"over {v}", v, _col("atlas_speedup")) for v in over],
                   hlines=[(1.0, "as fast"), *([(10.0, "10x")] if _beyond(rows, 5.0) else [])])],
        ))

    if with_bt:
        util: list[Series] = []
        slow: list[Series] = []
        ttft: list[Series] = []
        for v in with_bt:
            base = base_name(v)
            util.append(Series(f"{base} with BubbleTea", v, _col("device_utilization")))
            if base in variants and _present(rows, "device_utilization", base):
                util.append(Series(f"{base} without", base, _col("device_utilization"), dashed=True, marker="s"))
            elif _present(rows, "device_utilization_training", v):
                util.append(Series(f"{base} training only", v, _col("device_utilization_training"),
                                   dashed=True, marker="s"))
            slow.append(Series(v, v, _col("training_slowdown")))
            ttft.append(Series(f"{base} p50", v, _col("ttft_s.p50", 1000)))
            ttft.append(Series(f"{base} p95", v, _col("ttft_s.p95", 1000), dashed=True, marker="^"))
        made.append(_line_figure(
            out / "utilization.png", "Device utilization with and without BubbleTea" + title_tail, axis, facets,
            [Panel("mean device utilization", util, percent=True,
                   hlines=[(PAPER_UTILIZATION, "paper: up to 94%")]),
             Panel("training slowdown (vs. without BubbleTea)", slow, percent=True,
                   hlines=[(SLOWDOWN_LIMIT, "1% limit")], ymin0=False, decimals=1)],
        ))
        if any(_present(rows, "ttft_s.p50", v) for v in with_bt):
            served = [Series(base_name(v), v, _served_fraction) for v in with_bt]
            made.append(_line_figure(
                out / "ttft.png", "Prefill in the bubbles: time to first token and requests served" + title_tail,
                axis, facets,
                [Panel("TTFT (ms)", ttft), Panel("requests served", served, percent=True)],
            ))

    rate_path = next((p for p, _ in rs.parameters if re.fullmatch(r"topology\.wan\.(\d+|\*)\.rate", p)), None)
    if streams or rate_path:
        gp_axis = axes[streams] if streams else axis
        gp_facets = _facets(rs, rows, streams) if streams else facets
        series = [Series(v, v, wan_goodput) for v in plain if _any_goodput(rows, v)]
        panels = [Panel("WAN goodput (Mbit/s)", series)]
        link = _link_rate_mbps(rs)
        if rate_path:
            series.append(Series("link rate", "", _col_rate(rate_path), thin=True))
        elif link:
            panels[0].hlines.append((link, f"link rate {link:g} Mbit/s"))
        what = "streams" if streams else "bandwidth"
        made.append(_line_figure(out / "goodput.png", f"WAN transport goodput vs {what}" + title_tail,
                                 gp_axis, gp_facets, panels))
    bench = bench_plot(rs, out)
    if bench:
        made.append(bench)
    return [p for p in made if p is not None]


def _beyond(rows: list[Row], value: float) -> bool:
    """Whether any atlas speedup in `rows` reaches `value` (then the 10x line is drawn)."""
    return any((number(r.get("atlas_speedup")) or 0.0) >= value for r in rows)


def _col_rate(path: str) -> Callable[[Row], float | None]:
    """The swept link rate itself, in Mbit/s: the ceiling goodput is measured against."""

    def get(row: Row) -> float | None:
        try:
            return parse_rate(parse_cell(row.get(path))) / 1e6
        except (UnitError, TypeError, ValueError):
            return None

    return get


def _values_of(rs: ResultSet, path: str) -> list[Any]:
    return [pt.parameters.get(path) for pt in rs.points if path in pt.parameters]


def _served_fraction(row: Row) -> float | None:
    served = number(row.get("prefill_requests.served"))
    rejected = number(row.get("prefill_requests.rejected"))
    if served is None or rejected is None or served + rejected == 0:
        return None
    return served / (served + rejected)


def _any_goodput(rows: list[Row], variant: str) -> bool:
    return any(r.get("variant") == variant and wan_goodput(r) is not None for r in rows)


def _link_rate_mbps(rs: ResultSet) -> float | None:
    for pt in rs.points:
        wan = ((pt.resolved or {}).get("topology") or {}).get("wan") or []
        if wan:
            try:
                return parse_rate(wan[0]["rate"]) / 1e6
            except (KeyError, TypeError, UnitError):
                return None
    return None


def bench_plot(rs: ResultSet, out: Path) -> Path | None:
    """Goodput against streams from `testbed bench` results found in the folders."""
    points: dict[str, dict[float, list[float]]] = {}
    for pt in rs.points:
        for r in pt.bench or []:
            streams, gp = number(r.get("streams")), number(r.get("goodput_mbps"))
            if streams is None or gp is None:
                continue
            points.setdefault(str(r.get("method", "?")), {}).setdefault(streams, []).append(gp)
    if not points:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for method, by_streams in sorted(points.items()):
        xs = sorted(by_streams)
        ax.plot(xs, [sum(by_streams[x]) / len(by_streams[x]) for x in xs], marker="o", linewidth=2, label=method)
    link = _link_rate_mbps(rs)
    if link:
        ax.axhline(link, color="0.35", linestyle=(0, (4, 3)), linewidth=1, label=f"link rate ({link:g} Mbit/s)")
    all_streams = [x for by_streams in points.values() for x in by_streams if x > 0]
    if all_streams and max(all_streams) / min(all_streams) >= 8:
        from matplotlib.ticker import FuncFormatter

        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.set_xlabel("TCP streams")
    ax.set_ylabel("goodput (Mbit/s)")
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(f"Transport benchmark: goodput vs streams — {rs.name}", fontsize=11)
    fig.tight_layout()
    path = out / "bench_goodput.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def run_plot(rs: ResultSet, out: Path) -> Path | None:
    """A single run: bars per variant for iteration time, utilization and WAN goodput."""
    summary = rs.points[0].summary
    if summary is None or not summary.variants:
        return None
    names = sorted(summary.variants, key=sort_key)
    ran = {n: summary.result(n) for n in names}
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    palette: dict[str, str] = {}
    colors = [colour(n, palette) for n in names]
    hatches = ["//" if has_bubbletea(n) else "" for n in names]
    fig, axes = plt.subplots(1, 3, figsize=(min(18.0, 6 + 1.6 * len(names)), 5.2))
    xs = list(range(len(names)))

    def get(name: str, key: str) -> float:
        value = number(getattr(ran[name], key, None))
        return value if value is not None else float("nan")

    ax = axes[0]
    width = 0.38
    measured = [get(n, "iteration_time_s") for n in names]
    predicted = [get(n, "predicted_iteration_time_s") for n in names]
    bars = ax.bar([x - width / 2 for x in xs], measured, width, color=colors, hatch=None, label="measured")
    for bar, h in zip(bars, hatches, strict=True):
        bar.set_hatch(h)
    ax.bar([x + width / 2 for x in xs], predicted, width, color="none", edgecolor=colors, linewidth=1.5,
           linestyle="--", label="predicted")
    _bar_labels(ax, bars, "{:.2f}")
    ax.set_ylabel("iteration time (s)")
    ax.set_title("Iteration time", fontsize=10)
    ax.legend(fontsize=8)

    ax = axes[1]
    util = [get(n, "device_utilization") for n in names]
    train = [get(n, "device_utilization_training") for n in names]
    bars = ax.bar(xs, util, 0.6, color=colors)
    for bar, h in zip(bars, hatches, strict=True):
        bar.set_hatch(h)
    if any(not math.isnan(t) for t in train):
        ax.scatter(xs, train, marker="_", s=600, color="black", zorder=3, label="training only")
        ax.legend(fontsize=8, loc="lower right")
    _bar_labels(ax, bars, "{:.0%}")
    ax.axhline(PAPER_UTILIZATION, color="0.35", linestyle=(0, (4, 3)), linewidth=1)
    ax.annotate("paper: up to 94%", xy=(0.01, PAPER_UTILIZATION), xycoords=("axes fraction", "data"),
                xytext=(0, 3), textcoords="offset points", fontsize=8, color="0.3")
    ax.set_ylim(0, 1.08)
    ax.set_ylabel("mean device utilization")
    ax.yaxis.set_major_formatter(plt.matplotlib.ticker.PercentFormatter(1.0, decimals=0))
    ax.set_title("Device utilization (hatched: with BubbleTea)", fontsize=10)

    ax = axes[2]
    links = sorted({k for v in ran.values() if v is not None for k in v.wan_links})
    if links:
        w = 0.8 / len(links)
        for j, link in enumerate(links):
            vals = [_link_goodput(ran[n], link) for n in names]
            bars = ax.bar([x - 0.4 + w * (j + 0.5) for x in xs], [v if v is not None else float("nan") for v in vals],
                          w, color=colors, alpha=1.0 - 0.25 * j, label=link if len(links) > 1 else None)
            _bar_labels(ax, bars, "{:.0f}")
        rate = _link_rate_mbps(rs)
        if rate:
            ax.axhline(rate, color="0.35", linestyle=(0, (4, 3)), linewidth=1)
            ax.annotate(f"link rate {rate:g} Mbit/s", xy=(0.01, rate), xycoords=("axes fraction", "data"),
                        xytext=(0, 3), textcoords="offset points", fontsize=8, color="0.3")
        if len(links) > 1:
            ax.legend(fontsize=8)
    ax.set_ylabel("WAN goodput (Mbit/s)")
    ax.set_title("WAN goodput per link", fontsize=10)
    for ax in axes:
        ax.set_xticks(xs)
        ax.set_xticklabels(names, rotation=20, ha="right", fontsize=9)
        ax.grid(True, axis="y", alpha=0.3)
        ax.set_axisbelow(True)
    backend = summary.delay_backend
    scale = summary.scale
    fig.suptitle(f"{rs.name}: per-variant results (delay backend {backend}"
                 f"{f', scale {scale:g}' if isinstance(scale, (int, float)) else ''})", fontsize=12)
    fig.tight_layout()
    path = out / "summary.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _link_goodput(entry: VariantResult | None, link: str) -> float | None:
    found = entry.wan_links.get(link) if entry is not None else None
    return number(found.goodput_mbps) if found is not None else None


def _bar_labels(ax: Axes, bars: BarContainer, fmt: str) -> None:
    for bar in bars:
        h = bar.get_height()
        if h is None or math.isnan(h):
            continue
        ax.annotate(fmt.format(h), (bar.get_x() + bar.get_width() / 2, h), xytext=(0, 2),
                    textcoords="offset points", ha="center", va="bottom", fontsize=8)




def run_plots(rs: ResultSet, out: Path) -> list[Path]:
    """The plots of a single run folder: bars per variant, and the bench's goodput."""
    plot = run_plot(rs, out)
    plots = [plot] if plot else []
    bench = bench_plot(rs, out)
    return plots + ([bench] if bench else [])
