"""`testbed demo`: the mission's three results in one table and one figure.

On built-in defaults, in a few minutes on a 2-core machine:

1. **transport goodput** across the emulated WAN of the quickstart's topology
   (`topologies/2dc.yaml`): atlas on one TCP stream, atlas on N streams, and the
   link itself as iperf3 measures it with as many streams (`testbed.bench.transport`);
2. **iteration time** of the quickstart scenario's pipeline training under the
   baseline (one stream per WAN channel), multi-TCP and Atlas (`testbed.run.runner`);
3. **BubbleTea**: device utilization of the Atlas variant without and with
   prefill agents in its bubbles, and the training slowdown they cost.

The sub-results keep their own folders (`transport/`, `quickstart/`) next to
`demo.json`, `demo.csv`, `demo.txt` and the combined `demo.png`. Everything the
table shows is rebuilt from those folders alone by `load_rows` (no live system).

Layout of this module: configuration, prerequisites, rows (pure: saved JSON in,
table rows out), outputs (text, JSON, CSV, figure), then the orchestration.
"""

from __future__ import annotations

import csv
import json
import math
import os
import platform
import shutil
import sys
import textwrap
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from testbed.progress import Progress, format_duration
from testbed_core.constants import REPO_ROOT

BT_SUFFIX = "+bubbletea"

# The targets (the same as `testbed bench transport` checks, and the
# BubbleTea promise `testbed report` draws): see testbed/bench/report.py
# and testbed/report.py.
TARGET_LINK_FRACTION = 0.9  # atlas N streams >= 90% of iperf3 -P N
TARGET_MULTI_SPEEDUP = 4.0  # atlas N streams >= 4x atlas on one stream
PAPER_UTILIZATION = 0.94  # the paper's best GPU utilization with BubbleTea
SLOWDOWN_LIMIT = 0.01  # BubbleTea may slow training by at most 1%


# ============================================================== configuration

@dataclass(frozen=True)
class DemoConfig:
    """What the demo runs. Every choice is here, visible, with the reason.

    The quickstart scenario runs unchanged (no overrides: ~1m40s for the four
    variants here); `QUICK` trims it for a faster look.
    """

    scenario: Path = REPO_ROOT / "scenarios" / "quickstart.yaml"
    # `--set`-style overrides of the scenario (dotted path -> value); none by default.
    overrides: Mapping[str, Any] = field(default_factory=dict)
    # The variants to run, in order; the plain Atlas variant must run before its
    # +bubbletea twin (the runner measures the slowdown against it).
    variants: tuple[str, ...] = ("baseline", "multi-tcp", "atlas", "atlas+bubbletea")
    # Transport bench across the scenario's WAN: 64 MiB tensors move in ~5 s on one
    # window-limited stream (~100 Mbit/s) and well under 1 s on 8.
    bench_size: int = 64 << 20
    bench_streams: tuple[int, ...] = (1, 8)  # atlas N and iperf3 -P N for each N
    bench_repeat: int = 1  # timed transfers after the untimed warm-up one
    iperf_seconds: float = 3.0
    skip_bench: bool = False
    # Expected seconds per step on this 2-core machine (measured), for the
    # estimate shown before and during the run.
    expected_bench_s: float = 30.0
    expected_setup_s: float = 35.0  # emulation + WAN calibration of the run
    expected_variant_s: float = 17.0

    @property
    def streams(self) -> int:
        return max(self.bench_streams)

    def child_step_s(self) -> dict[str, float]:
        return {"quickstart run": self.expected_variant_s}

    def expected_steps(self) -> dict[str, float]:
        steps = {}
        if not self.skip_bench:
            steps["transport bench"] = self.expected_bench_s
        steps["quickstart run"] = self.expected_setup_s + self.expected_variant_s * len(self.variants)
        return steps


DEFAULT = DemoConfig()
# --quick: 32 MiB bench tensors, no multi-TCP, one measured iteration per variant
# (two warm-up ones still open the TCP windows and calibrate): about half the time,
# noisier figures.
QUICK = DemoConfig(
    overrides={"workload.iterations": 1},
    variants=("baseline", "atlas", "atlas+bubbletea"),
    bench_size=32 << 20,
    iperf_seconds=2.0,
    expected_bench_s=22.0,
    expected_variant_s=14.0,
)


# ============================================================== prerequisites

def prerequisite_problems(
    *, euid: int, which: Callable[[str], str | None], libiperf_error: str | None, need_bench: bool,
    scenario: Path,
) -> list[str]:
    """What stops the demo from running here, each with what to do. Pure: the probes
    are passed in (see `probe_prerequisites`)."""
    problems = []
    if euid != 0:
        problems.append("the demo builds emulated datacenters in network namespaces and needs root: "
                        "run `sudo make demo` (or `sudo .venv/bin/testbed demo`)")
    if which("mnexec") is None:
        problems.append("mnexec (Mininet's helper, Debian package `mininet`) is not installed: "
                        "run `sudo make install` or `apt-get install mininet`")
    if which("ifconfig") is None:
        problems.append("ifconfig (Debian package `net-tools`, Mininet calls it) is not installed: "
                        "run `sudo make install` or `apt-get install net-tools`")
    if need_bench and libiperf_error is not None:
        problems.append(f"libiperf (Debian package `libiperf0`) cannot be loaded ({libiperf_error}): "
                        "run `apt-get install libiperf0`, or pass --skip-bench to leave the transport bench out")
    if not scenario.is_file():
        problems.append(f"the demo's scenario {scenario} is missing: is this a complete checkout?")
    return problems


def probe_libiperf() -> str | None:
    """None when the iperf3 wrapper can load libiperf, else why not."""
    try:
        import iperf3

        iperf3.IPerf3(role="c")
    except Exception as exc:  # OSError for a missing library, anything else is as fatal
        return f"{type(exc).__name__}: {exc}"
    return None


def probe_prerequisites(cfg: DemoConfig) -> list[str]:
    return prerequisite_problems(euid=os.geteuid(), which=shutil.which,
                                 libiperf_error=None if cfg.skip_bench else probe_libiperf(),
                                 need_bench=not cfg.skip_bench, scenario=cfg.scenario)


def bubbletea_unavailable() -> str | None:
    """Why the +bubbletea variants cannot run here (None when they can)."""
    import importlib.util

    if importlib.util.find_spec("bubbletea_agent.__main__") is None:
        return "the BubbleTea agent (python -m bubbletea_agent) is not installed"
    return None


# ============================================================== rows (pure)

@dataclass(frozen=True)
class Row:
    """One line of the demo table. `value` is None when the figure is not available
    ("n/a"), and `note` then says why."""

    result: str  # "transport", "training", "bubbletea"
    measure: str
    value: float | None
    unit: str  # "Mbit/s", "s", "x" (ratio), "%" (fraction shown as percent), "" (count)
    target: str = ""  # e.g. ">= 0.9"
    ok: bool | None = None  # against the target; None when there is none or no value
    note: str = ""

    def shown(self) -> str:
        v = self.value
        if v is None or (isinstance(v, float) and math.isnan(v)):
            return "n/a"
        if self.unit == "Mbit/s":
            return f"{v:.1f} Mbit/s"
        if self.unit == "s":
            return f"{v:.3f} s"
        if self.unit == "x":
            return f"{v:.2f}x"
        if self.unit == "%":
            return f"{v:.1%}"
        if self.unit == "+%":
            return f"{v:+.1%}"
        return f"{v:g}"

    def verdict(self) -> str:
        return {True: "ok", False: "MISS", None: ""}[self.ok]

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "shown": self.shown(), "verdict": self.verdict()}


RESULT_TITLES = {
    "transport": "1 transport goodput",
    "training": "2 iteration time",
    "bubbletea": "3 BubbleTea",
}


def _ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or not b:
        return None
    return a / b


def _check(value: float | None, ok: Callable[[float], bool]) -> bool | None:
    return None if value is None else bool(ok(value))


def _bench_pick(rows: Sequence[Mapping[str, Any]], method: str, streams: int) -> Mapping[str, Any] | None:
    for r in rows:
        if (r.get("path") == "wan" and r.get("method") == method and r.get("requested_streams") == streams
                and r.get("goodput_mbps") is not None and r.get("verified") is not False):
            return r
    return None


def _bench_why(rows: Sequence[Mapping[str, Any]], method: str, streams: int, fallback: str) -> str:
    for r in rows:
        if r.get("path") == "wan" and r.get("method") == method and r.get("requested_streams") == streams:
            if r.get("error"):
                return f"failed: {r['error']}"
            if r.get("verified") is False:
                return "the received tensor did not match what was sent"
    return fallback


def transport_rows(bench: Sequence[Mapping[str, Any]] | None, streams: int, link_mbps: float | None,
                   why_missing: str = "") -> list[Row]:
    """Result 1 from `testbed bench transport` rows (results.json "results"):
    atlas on 1 and N streams, iperf3 -P 1 and -P N, and the two ratios."""
    bench = list(bench or [])
    missing = why_missing or "not measured"
    out = []

    def goodput(method: str, n: int, measure: str, note: str = "") -> float | None:
        r = _bench_pick(bench, method, n)
        value = None if r is None else float(r["goodput_mbps"])
        out.append(Row("transport", measure, value, "Mbit/s",
                       note=note if value is not None else _bench_why(bench, method, n, missing)))
        return value

    link = f"nominal link {link_mbps:g} Mbit/s" if link_mbps else ""
    a1 = goodput("atlas", 1, "atlas, 1 stream")
    if bench and _bench_pick(bench, "iperf3", 1) is not None:
        goodput("iperf3", 1, "iperf3 -P 1 (one plain TCP flow)")
    an = goodput("atlas", streams, f"atlas, {streams} streams")
    ipn = goodput("iperf3", streams, f"iperf3 -P {streams} (the link)", link)
    r = _ratio(an, ipn)
    out.append(Row("transport", f"atlas N={streams} / iperf3 -P {streams}", r, "x",
                   f">= {TARGET_LINK_FRACTION:g}", _check(r, lambda x: x >= TARGET_LINK_FRACTION),
                   "" if r is not None else missing))
    r = _ratio(an, a1)
    out.append(Row("transport", f"atlas N={streams} / atlas N=1", r, "x",
                   f">= {TARGET_MULTI_SPEEDUP:g}", _check(r, lambda x: x >= TARGET_MULTI_SPEEDUP),
                   "" if r is not None else missing))
    return out


def _variant_value(variants: Mapping[str, Any], name: str, key: str) -> tuple[float | None, str]:
    """(value, why it is missing) of one variant's metric in a run summary."""
    v = variants.get(name)
    if v is None:
        return None, f"{name} did not run"
    if v.get("error"):
        return None, f"{name} failed: {_short(str(v['error']))}"
    value = v.get(key)
    if value is None:
        return None, f"{name} reported no {key}"
    return float(value), ""


def _short(text: str, limit: int = 160) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def training_rows(summary: Mapping[str, Any] | None, why_missing: str = "") -> list[Row]:
    """Result 2 from a run summary: iteration time of baseline, multi-tcp and atlas,
    and Atlas's against the baseline's (and multi-tcp's)."""
    variants = (summary or {}).get("variants") or {}
    out = []
    times: dict[str, float | None] = {}
    whys: dict[str, str] = {}
    for name in ("baseline", "multi-tcp", "atlas"):
        if name == "multi-tcp" and name not in variants:
            times[name] = None  # optional (--quick leaves it out): no row
            continue
        if summary is None:
            value, why = None, why_missing or "not run"
        else:
            value, why = _variant_value(variants, name, "iteration_time_s")
        times[name] = value
        whys[name] = why
        streams = (variants.get(name) or {}).get("streams")
        label = f"{name} iteration time" + (f" ({streams} stream{'s' if streams != 1 else ''}/WAN channel)"
                                            if streams else "")
        out.append(Row("training", label, value, "s", note=why))
    a, b, m = times["atlas"], times["baseline"], times["multi-tcp"]
    r = _ratio(a, b)
    out.append(Row("training", "atlas / baseline iteration time", r, "x", "< 1", _check(r, lambda x: x < 1),
                   f"atlas {1 / r:.2f}x faster" if r else (why_missing or _first_why(whys, "baseline", "atlas"))))
    if "multi-tcp" in variants:
        r = _ratio(a, m)
        out.append(Row("training", "atlas / multi-tcp iteration time", r, "x", "<= 1",
                       _check(r, lambda x: x <= 1),
                       f"atlas {1 / r:.2f}x faster" if r else _first_why(whys, "multi-tcp", "atlas")))
    return out


def _first_why(whys: Mapping[str, str], *names: str) -> str:
    return next((whys[n] for n in names if whys.get(n)), "needs both iteration times")


def bubbletea_rows(summary: Mapping[str, Any] | None, plain: str = "atlas", why_missing: str = "") -> list[Row]:
    """Result 3 from a run summary: utilization of `plain` without and with
    BubbleTea, and the training slowdown it cost."""
    variants = (summary or {}).get("variants") or {}
    bt = plain + BT_SUFFIX
    if summary is None:
        why = why_missing or "not run"
        u0, w0, u1, w1 = None, why, None, why
    else:
        u0, w0 = _variant_value(variants, plain, "device_utilization")
        u1, w1 = _variant_value(variants, bt, "device_utilization")
        if bt not in variants and why_missing:
            w1 = why_missing
    if u1 is not None and u0 is not None:
        gain = f"{(u1 - u0) * 100:+.1f} points"
    else:
        gain = ""
    entry = variants.get(bt) or {}
    train_only = entry.get("device_utilization_training") if u1 is not None else None
    out = [
        Row("bubbletea", f"utilization without BubbleTea ({plain})", u0, "%", note=w0),
        Row("bubbletea", f"utilization with BubbleTea ({bt})", u1, "%", f"-> {PAPER_UTILIZATION:.0%} (paper)",
            None, w1 or gain),
    ]
    if train_only is not None:
        out.append(Row("bubbletea", "  of which training work", float(train_only), "%",
                       note="the rest is prefill" if u1 and u1 > train_only else ""))
    slowdown = entry.get("training_slowdown") if u1 is not None else None
    if slowdown is None and u1 is not None:  # older summaries: from the two iteration times
        t0, _ = _variant_value(variants, plain, "iteration_time_s")
        t1, _ = _variant_value(variants, bt, "iteration_time_s")
        slowdown = None if not t0 or t1 is None else t1 / t0 - 1
    why = (w1 or w0) if slowdown is None else ""
    if slowdown is not None:
        t0 = (variants.get(plain) or {}).get("iteration_time_s")
        t1 = entry.get("iteration_time_s")
        if t0 and t1:
            why = f"{t1:.3f} s vs {t0:.3f} s per iteration"
        drops = entry.get("wan_tail_drops") or {}
        if entry.get("training_slowdown_note"):
            why += (f"; WAN lost {drops.get('with_bubbletea')} packets here, {drops.get('without')} without "
                    "BubbleTea (TCP windows shrank): rerun to compare")
    out.append(Row("bubbletea", "training slowdown with BubbleTea", None if slowdown is None else float(slowdown),
                   "+%", f"<= {SLOWDOWN_LIMIT:.0%}", _check(slowdown, lambda x: x <= SLOWDOWN_LIMIT), why))
    req = entry.get("prefill_requests") if u1 is not None else None
    if isinstance(req, Mapping) and req.get("served") is not None:
        ttft = (entry.get("ttft_s") or {}).get("p50")
        note = f"of {req.get('arrived', '?')} arrived" + (f"; TTFT p50 {ttft * 1000:.0f} ms" if ttft else "")
        out.append(Row("bubbletea", "prefill requests served in the bubbles", float(req["served"]), "",
                       note=note))
    return out


def build_rows(bench: Sequence[Mapping[str, Any]] | None, summary: Mapping[str, Any] | None, *,
               streams: int = 8, link_mbps: float | None = None, bench_note: str = "", run_note: str = "",
               bubbletea_note: str = "") -> list[Row]:
    """The whole demo table from the saved sub-results; a `*_note` says why a part
    is missing (skipped, failed, not installed) and is shown in its rows."""
    return (transport_rows(bench, streams, link_mbps, bench_note)
            + training_rows(summary, run_note)
            + bubbletea_rows(summary, why_missing=bubbletea_note or run_note))


def _read_json(path: Path) -> Any:
    from testbed.report import read_json

    return read_json(path, lambda exc: DemoError(f"{path}: cannot be read as JSON ({exc})"))


class DemoError(RuntimeError):
    """The demo cannot go on; the message says why and what to do."""


def load_rows(out: Path) -> tuple[list[Row], dict[str, Any]]:
    """The demo table rebuilt from a demo folder: `transport/results.json`,
    `quickstart/summary.json` and the notes kept in `demo.json`."""
    out = Path(out)
    doc = _read_json(out / "demo.json") or {}
    meta = doc.get("meta") or {}
    notes = meta.get("notes") or {}
    bench_doc = _read_json(out / "transport" / "results.json")
    summary = _read_json(out / "quickstart" / "summary.json")
    if bench_doc is None and summary is None and not doc:
        raise DemoError(f"{out}: no demo results here (expected transport/results.json or quickstart/summary.json)")
    rows = build_rows(
        None if bench_doc is None else bench_doc.get("results"), summary,
        streams=int(meta.get("streams", 8)), link_mbps=meta.get("link_mbps"),
        bench_note=notes.get("transport", "" if bench_doc else "no transport/results.json"),
        run_note=notes.get("training", "" if summary else "no quickstart/summary.json"),
        bubbletea_note=notes.get("bubbletea", ""),
    )
    return rows, meta


# ============================================================== outputs

def format_table(rows: Sequence[Row]) -> str:
    """The one table: result, measure, value, target and check, note."""
    headers = ["result", "measure", "value", "target", "check", "note"]
    cells = []
    last = None
    for r in rows:
        title = RESULT_TITLES.get(r.result, r.result) if r.result != last else ""
        last = r.result
        cells.append([title, r.measure, r.shown(), r.target, r.verdict(), r.note])
    widths = [max(len(h), *(len(c[i]) for c in cells)) if cells else len(h) for i, h in enumerate(headers)]
    widths[-1] = len(headers[-1])  # the note runs on freely

    def line(c: list[str]) -> str:
        parts = [c[0].ljust(widths[0]), c[1].ljust(widths[1]), c[2].rjust(widths[2]), c[3].ljust(widths[3]),
                 c[4].ljust(widths[4]), c[5]]
        return "  ".join(parts).rstrip()

    out = [line(headers), "-" * (sum(widths[:5]) + 2 * 5 + 30)]
    prev = None
    for r, c in zip(rows, cells, strict=True):
        if prev is not None and r.result != prev:
            out.append("")
        prev = r.result
        out.append(line(c))
    return "\n".join(out)


CSV_FIELDS = ["result", "measure", "value", "unit", "shown", "target", "verdict", "note"]


def write_csv(rows: Sequence[Row], path: Path) -> None:
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=CSV_FIELDS, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({**r.as_dict(), "value": "" if r.value is None else f"{r.value:.6g}"})


def write_json(rows: Sequence[Row], meta: Mapping[str, Any], path: Path) -> None:
    doc = {"rows": [r.as_dict() for r in rows], "meta": dict(meta)}
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(doc, indent=2, default=str) + "\n")
    os.replace(tmp, path)


def _find(rows: Sequence[Row], result: str, prefix: str) -> Row | None:
    return next((r for r in rows if r.result == result and r.measure.startswith(prefix)), None)


def _na(ax: Any, title: str, why: str) -> None:
    ax.set_title(title, fontsize=11)
    ax.text(0.5, 0.5, "n/a\n" + textwrap.fill(why or "not measured", 40), ha="center", va="center",
            fontsize=10, color="0.35", transform=ax.transAxes)
    ax.set_xticks([])
    ax.set_yticks([])


def _bars(ax: Any, labels: list[str], values: list[float | None], colors: list[str], fmt: str) -> None:
    xs = list(range(len(labels)))
    heights = [float("nan") if v is None else v for v in values]
    bars = ax.bar(xs, heights, 0.62, color=colors, edgecolor="0.2", linewidth=0.6)
    top = max((h for h in heights if not math.isnan(h)), default=1.0)
    for bar, h in zip(bars, heights, strict=True):
        x = bar.get_x() + bar.get_width() / 2
        if math.isnan(h):
            ax.text(x, top * 0.03, "n/a", ha="center", va="bottom", fontsize=9, color="0.4")
        else:
            ax.annotate(fmt.format(h), (x, h), xytext=(0, 3), textcoords="offset points", ha="center",
                        va="bottom", fontsize=10, fontweight="bold")
    ax.set_xticks(xs)
    ax.set_xticklabels(labels, fontsize=9)
    ax.grid(True, axis="y", alpha=0.3)
    ax.set_axisbelow(True)


def plot(rows: Sequence[Row], path: Path, *, streams: int = 8, link_mbps: float | None = None,
         subtitle: str = "") -> Path:
    """Three panels, one per result: goodput bars (with the nominal link rate),
    iteration time bars (with Atlas's speedup), utilization without/with BubbleTea
    (with the slowdown)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import PercentFormatter

    fig, axes = plt.subplots(1, 3, figsize=(17, 5.6))

    # 1: transport
    ax = axes[0]
    title = f"1. Transport goodput across the WAN ({streams} streams)"
    picks = [("atlas, 1 stream", "atlas\n1 stream", "#9ecae1"),
             ("iperf3 -P 1", "iperf3\n-P 1", "#d9d9d9"),
             (f"atlas, {streams} streams", f"atlas\n{streams} streams", "#1f77b4"),
             (f"iperf3 -P {streams}", f"iperf3 -P {streams}\n(the link)", "#7f7f7f")]
    found = [(lab, _find(rows, "transport", key), c) for key, lab, c in picks]
    found = [(lab, r, c) for lab, r, c in found if r is not None]
    if not any(r.value is not None for _, r, _ in found):
        _na(ax, title, next((r.note for _, r, _ in found if r.note), ""))
    else:
        _bars(ax, [lab for lab, _, _ in found], [r.value for _, r, _ in found], [c for _, _, c in found],
              "{:.0f}")
        if link_mbps:
            ax.axhline(link_mbps, color="0.3", linestyle=(0, (5, 3)), linewidth=1.2)
            ax.annotate(f"link rate {link_mbps:g} Mbit/s", xy=(0.99, link_mbps), xycoords=("axes fraction", "data"),
                        xytext=(0, 3), textcoords="offset points", ha="right", fontsize=9, color="0.25")
        top = max([r.value or 0 for _, r, _ in found] + [link_mbps or 0])
        ax.set_ylim(0, top * 1.3)
        ax.set_ylabel("goodput (Mbit/s)")
        ratios = [r for r in rows if r.result == "transport" and r.unit == "x" and r.value is not None]
        if ratios:
            ax.text(0.02, 0.97, "\n".join(f"{r.measure}: {r.shown()}" for r in ratios), transform=ax.transAxes,
                    va="top", fontsize=9, bbox={"boxstyle": "round", "facecolor": "white", "alpha": 0.85})
        ax.set_title(title, fontsize=11)

    # 2: training
    ax = axes[1]
    title = "2. Training iteration time (lower is better)"
    colors = {"baseline": "#d62728", "multi-tcp": "#ff7f0e", "atlas": "#1f77b4"}
    it = [(n, _find(rows, "training", f"{n} iteration time")) for n in colors]
    it = [(n, r) for n, r in it if r is not None and (r.value is not None or n != "multi-tcp")]
    if not any(r.value is not None for _, r in it):
        _na(ax, title, next((r.note for _, r in it if r.note), ""))
    else:
        _bars(ax, [n for n, _ in it], [r.value for _, r in it], [colors[n] for n, _ in it], "{:.2f} s")
        top = max(r.value or 0 for _, r in it)
        ax.set_ylim(0, top * 1.2)
        ax.set_ylabel("seconds per iteration")
        sp = _find(rows, "training", "atlas / baseline")
        if sp is not None and sp.value:
            ax.text(0.98, 0.97, f"Atlas {1 / sp.value:.2f}x faster than baseline", transform=ax.transAxes,
                    ha="right", va="top", fontsize=10,
                    bbox={"boxstyle": "round", "facecolor": "white", "alpha": 0.85})
        ax.set_title(title, fontsize=11)

    # 3: BubbleTea
    ax = axes[2]
    title = "3. Device utilization with BubbleTea"
    u0 = _find(rows, "bubbletea", "utilization without")
    u1 = _find(rows, "bubbletea", "utilization with ")
    sd = _find(rows, "bubbletea", "training slowdown")
    if u0 is None or u1 is None or (u0.value is None and u1.value is None):
        _na(ax, title, (u1.note if u1 else "") or (u0.note if u0 else ""))
    else:
        tr = _find(rows, "bubbletea", "  of which training")
        _bars(ax, ["atlas\nwithout BubbleTea", "atlas\nwith BubbleTea"], [u0.value, u1.value],
              ["#1f77b4", "#2ca02c"], "{:.0%}")
        if tr is not None and tr.value is not None:  # the training share of the BubbleTea bar
            ax.bar([1], [tr.value], 0.62, color="#1f77b4", edgecolor="0.2", linewidth=0.6)
            ax.legend(handles=[plt.Rectangle((0, 0), 1, 1, color="#1f77b4", label="training work"),
                               plt.Rectangle((0, 0), 1, 1, color="#2ca02c", label="prefill (BubbleTea)")],
                      loc="upper right", bbox_to_anchor=(1.0, 0.86), fontsize=9)
        ax.axhline(PAPER_UTILIZATION, color="0.3", linestyle=(0, (5, 3)), linewidth=1.2)
        ax.annotate(f"paper: up to {PAPER_UTILIZATION:.0%}", xy=(0.99, PAPER_UTILIZATION),
                    xycoords=("axes fraction", "data"), xytext=(0, 3), textcoords="offset points", fontsize=9,
                    ha="right", color="0.25")
        ax.set_ylim(0, 1.05)
        ax.yaxis.set_major_formatter(PercentFormatter(1.0, decimals=0))
        ax.set_ylabel("mean device utilization (busy / wall time)")
        if sd is not None:
            txt = (f"training slowdown {sd.shown()} (limit {SLOWDOWN_LIMIT:+.0%})" if sd.value is not None
                   else f"training slowdown n/a: {textwrap.shorten(sd.note, 50)}")
            ax.text(0.02, 0.86, txt, transform=ax.transAxes, va="top", fontsize=10,
                    bbox={"boxstyle": "round", "facecolor": "white", "alpha": 0.85})
        if u1.value is None:
            ax.text(0.75, 0.5, textwrap.fill(u1.note, 28), transform=ax.transAxes, ha="center", fontsize=8,
                    color="0.35")
        ax.set_title(title, fontsize=11)

    fig.suptitle("Geo-distributed training testbed: the three results" + (f" ({subtitle})" if subtitle else ""),
                 fontsize=13)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# ============================================================== orchestration

class PlannedProgress(Progress):
    """A Progress whose estimate starts from known step durations (the demo's steps
    differ too much for a mean). A running step with a child reporter (the run:
    set-up, then one step per variant) is refined by what the child has done: its
    first step is the set-up, the others are alike and take `child_step_s` each
    until one has been timed."""

    def __init__(self, expected: Mapping[str, float], child_step_s: Mapping[str, float] | None = None,
                 **kwargs: Any) -> None:
        super().__init__(total=len(expected), **kwargs)
        self.expected = dict(expected)
        self.child_step_s = dict(child_step_s or {})
        self.finished: set[str] = set()

    def done(self, name: str, **kwargs: Any) -> None:
        self.finished.add(name)
        super().done(name, **kwargs)

    def _running_left(self, name: str, began: float, now: float) -> float:
        est = self.expected.get(name, 0.0)
        kid = self._children.get(name)
        if kid is None or kid.total == 0 or kid.done_count == 0:
            return max(0.0, est - (now - began))
        alike = kid.durations[1:]
        per = sum(alike) / len(alike) if alike else self.child_step_s.get(name, est / kid.total)
        pending = max(0, kid.total - kid.done_count)
        into = now - min(kid.running.values()) if kid.running else 0.0
        return max(0.0, pending * per - into)

    def child(self, name: str, label: str = "") -> Progress:
        """As Progress.child, but the child's own lines show this plan's estimate."""
        with self._lock:
            kid = _PlannedChild(self, name, label or name)
            self._children[name] = kid
            return kid

    def eta_s(self) -> float | None:
        with self._lock:
            now = self.clock()
            left = 0.0
            for name, est in self.expected.items():
                if name in self.finished:
                    continue
                began = self.running.get(name)
                left += est if began is None else self._running_left(name, began, now)
            return left


class _PlannedChild(Progress):
    """The reporter inside a planned step; its estimate is the plan's for that step."""

    def __init__(self, parent: PlannedProgress, name: str, label: str) -> None:
        super().__init__(0, label, stream=parent.stream, tty=parent.tty, clock=parent.clock,
                         min_interval=parent.min_interval, enabled=parent.enabled)
        self._parent = parent
        self._plan = (parent, name)

    def eta_s(self) -> float | None:
        parent, name = self._plan
        with parent._lock:
            began = parent.running.get(name)
            return None if began is None else parent._running_left(name, began, self.clock())


@dataclass
class DemoOutcome:
    out: Path
    rows: list[Row]
    table: str
    meta: dict[str, Any]
    failed: list[str]  # parts that failed (empty when all ran)
    files: list[Path]


def default_out_dir() -> Path:
    return Path("results") / f"demo-{datetime.now().strftime('%Y%m%d-%H%M%S')}"


def run_bench(cfg: DemoConfig, topology: Path, out: Path, progress: Progress) -> list[Any]:
    """The short transport bench across the WAN of `topology`; writes results.json,
    results.csv and goodput.png in `out` as `testbed bench transport` does."""
    from testbed.bench import report as bench_report
    from testbed.bench.transport import wan_suite

    out.mkdir(parents=True, exist_ok=True)

    def on_result(m: Any) -> None:
        what = f"atlas N={m.requested_streams}" if m.method == "atlas" else f"{m.method} -P {m.requested_streams}"
        if m.error:
            progress.log(f"  transport: {what}: FAILED: {m.error}")
        else:
            progress.log(f"  transport: {what}: {m.goodput_mbps:.1f} Mbit/s")

    results = wan_suite(topology, None, streams=list(cfg.bench_streams), size=cfg.bench_size,
                        repeat=cfg.bench_repeat, methods=["atlas", "iperf3"], log_dir=out / "logs",
                        iperf_seconds=cfg.iperf_seconds, congestion=None, chunk_bytes=None, on_result=on_result)
    found = bench_report.checks(results)
    meta = {"size_bytes": cfg.bench_size, "repeat": cfg.bench_repeat, "chunk_bytes": None,
            "topology": str(topology), "host": platform.node(), "python": sys.version.split()[0],
            "time": time.strftime("%Y-%m-%dT%H:%M:%S"), "by": "testbed demo"}
    bench_report.write_json(bench_report.as_json(results, found, meta), out / "results.json")
    bench_report.write_csv(results, out / "results.csv")
    bench_report.plot(results, out / "goodput.png", title=topology.stem)
    return results


def run_demo(cfg: DemoConfig, out: Path, progress: PlannedProgress | None = None,
             echo: Callable[[str], None] = print) -> DemoOutcome:
    """Bench, quickstart run, then the table and files. A part that fails is
    recorded (its rows say n/a and why) and the demo goes on to the next."""
    from testbed.run.runner import RunnerError, run_scenario
    from testbed.run.scenario import load_scenario
    from testbed_core.configfile import ConfigError

    t0 = time.monotonic()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    try:
        scenario, resolved = load_scenario(cfg.scenario, dict(cfg.overrides))
    except ConfigError as exc:
        raise DemoError(f"the demo's scenario cannot be used: {exc}") from None
    topology = Path(resolved["topology"].get("_source", REPO_ROOT / "topologies" / "2dc.yaml"))
    link = scenario.topology.wan[0] if scenario.topology.wan else None
    link_mbps = link.rate / 1e6 if link else None
    streams = cfg.streams
    notes: dict[str, str] = {}
    failed: list[str] = []

    variants = list(cfg.variants)
    bt_missing = bubbletea_unavailable()
    if bt_missing:
        variants = [v for v in variants if not v.endswith(BT_SUFFIX)]
        notes["bubbletea"] = f"not run: {bt_missing}"
        echo(f"note: BubbleTea rows will be n/a: {bt_missing}")
    allowed = set(scenario.variants)
    dropped = [v for v in variants if v.removesuffix(BT_SUFFIX) not in allowed]
    if dropped:
        variants = [v for v in variants if v not in dropped]
        echo(f"note: {scenario.source or cfg.scenario} has no variant(s) {', '.join(dropped)}; left out")
        if any(v.endswith(BT_SUFFIX) for v in dropped) and "bubbletea" not in notes:
            notes["bubbletea"] = f"not run: the scenario has no {dropped[-1].removesuffix(BT_SUFFIX)} variant"

    progress = progress or PlannedProgress(cfg.expected_steps(), cfg.child_step_s(), label="demo")
    meta: dict[str, Any] = {
        "scenario": str(cfg.scenario), "overrides": dict(cfg.overrides), "variants": variants,
        "topology": str(topology), "link_mbps": link_mbps, "rtt_ms": link.rtt_s * 1000 if link else None,
        "streams": streams, "bench": {"size_bytes": cfg.bench_size, "streams": list(cfg.bench_streams),
                                      "repeat": cfg.bench_repeat, "iperf_seconds": cfg.iperf_seconds,
                                      "skipped": cfg.skip_bench},
        "host": platform.node(), "started": datetime.now().isoformat(timespec="seconds"), "notes": notes,
    }

    bench_rows: list[dict[str, Any]] | None = None
    if cfg.skip_bench:
        notes["transport"] = "skipped (--skip-bench)"
    else:
        from testbed.bench.transport import BenchError

        with progress.step("transport bench"):
            try:
                results = run_bench(cfg, topology, out / "transport", progress)
                bench_rows = [m.row() for m in results]
                bad = [m for m in results if m.error or m.verified is False]
                if bad:
                    failed.append("transport")
            except BenchError as exc:
                notes["transport"] = f"bench failed: {exc}"
                failed.append("transport")
                progress.log(f"  transport bench FAILED: {exc}")

    summary: dict[str, Any] | None = None
    with progress.step("quickstart run"):
        kid = progress.child("quickstart run", label=f"run {scenario.name}")
        try:
            summary = run_scenario(scenario, resolved, out / "quickstart", kid, variants=variants)
        except (RunnerError, ConfigError) as exc:
            notes["training"] = f"run failed: {_short(str(exc), 300)}"
            failed.append("training")
            progress.log(f"  quickstart run FAILED: {exc}")
        else:
            errs = [n for n, v in summary.get("variants", {}).items() if v.get("error")]
            if errs:
                failed.append("training")
            meta["delay_backend"] = summary.get("delay_backend")
        finally:
            kid.close()

    if summary is not None:
        try:  # the run's own table and plots (testbed report), next to its results
            from testbed.report import build_report

            build_report(out / "quickstart")
        except Exception as exc:  # a side product: never worth failing the demo
            progress.log(f"  note: testbed report of the run failed: {exc}")

    rows = build_rows(bench_rows, summary, streams=streams, link_mbps=link_mbps,
                      bench_note=notes.get("transport", ""), run_note=notes.get("training", ""),
                      bubbletea_note=notes.get("bubbletea", ""))
    meta["duration_s"] = round(time.monotonic() - t0, 1)
    meta["failed"] = failed
    files = write_outputs(rows, meta, out)
    table = format_table(rows)
    return DemoOutcome(out, rows, table, meta, failed, files)


def subtitle(meta: Mapping[str, Any]) -> str:
    parts = []
    topo = Path(str(meta.get("topology") or "")).stem
    if topo:
        parts.append(topo)
    if meta.get("link_mbps"):
        parts.append(f"{meta['link_mbps']:g} Mbit/s WAN")
    if meta.get("rtt_ms"):
        parts.append(f"{meta['rtt_ms']:g} ms RTT")
    if meta.get("delay_backend"):
        parts.append(f"delay: {meta['delay_backend']}")
    return ", ".join(parts)


def write_outputs(rows: Sequence[Row], meta: Mapping[str, Any], out: Path) -> list[Path]:
    """demo.json, demo.csv, demo.txt (the table) and demo.png in `out`."""
    out = Path(out)
    write_json(rows, meta, out / "demo.json")
    write_csv(rows, out / "demo.csv")
    head = f"testbed demo ({subtitle(meta)})" if subtitle(meta) else "testbed demo"
    if meta.get("duration_s") is not None:
        head += f", {format_duration(float(meta['duration_s']))}"
    (out / "demo.txt").write_text(head + "\n\n" + format_table(rows) + "\n")
    plot(rows, out / "demo.png", streams=int(meta.get("streams", 8)), link_mbps=meta.get("link_mbps"),
         subtitle=subtitle(meta))
    return [out / "demo.json", out / "demo.csv", out / "demo.txt", out / "demo.png"]

