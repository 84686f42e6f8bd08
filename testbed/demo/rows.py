"""The demo table: its rows, made from the saved sub-results alone (pure: no I/O).

Result 1 from the transport bench's rows (``transport/results.json``), results 2 and 3
from the quickstart run's summary (``quickstart/summary.json``, read through its model,
testbed_core/contracts/summary.py). A figure that is not there is a row with no value
and a note saying why (skipped, failed, not installed), so the table always has the
same lines.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from testbed_core.contracts.bubbletea import PAPER_UTILIZATION, SLOWDOWN_LIMIT
from testbed_core.contracts.demo import DemoRowRecord
from testbed_core.contracts.summary import Summary, VariantFailure, VariantResult
from testbed_core.variants import BUBBLETEA_SUFFIX

# The targets (the same as `testbed bench transport` checks, and the
# BubbleTea promise `testbed report` draws): see testbed/bench/report.py
# and testbed/report/plots.py.
TARGET_LINK_FRACTION = 0.9  # atlas N streams >= 90% of iperf3 -P N
TARGET_MULTI_SPEEDUP = 4.0  # atlas N streams >= 4x atlas on one stream
WORST_ITERATION_LIMIT = 1.15  # its slowest iteration may be at most 1.15x the slowest without (issue 30)

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

    def record(self) -> DemoRowRecord:
        """The row as demo.json keeps it: its fields, as shown, and the verdict."""
        return DemoRowRecord(**asdict(self), shown=self.shown(), verdict=self.verdict())


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


def _variant_value(summary: Summary, name: str, key: str) -> tuple[float | None, str]:
    """(value, why it is missing) of one variant's metric in a run summary (the median
    over the repeats of a repeated run)."""
    v = summary.variants.get(name)
    if v is None:
        return None, f"{name} did not run"
    if isinstance(v, VariantFailure):
        return None, f"{name} failed: {short(v.error)}"
    value = v.headline(key)
    if value is None:
        return None, f"{name} reported no {key}"
    return float(value), ""


def short(text: str, limit: int = 160) -> str:
    """`text` on one line, cut to `limit` characters."""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


MULTI_TCP_TOLERANCE = 1.03  # atlas / multi-tcp: within 3% (issue 40)


def training_rows(summary: Summary | None, why_missing: str = "") -> list[Row]:
    """Result 2 from a run summary: iteration time of baseline, multi-tcp and atlas,
    and Atlas's against the baseline's (and multi-tcp's)."""
    variants = summary.variants if summary is not None else {}
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
            value, why = _variant_value(summary, name, "iteration_time_s")
        times[name] = value
        whys[name] = why
        ran = summary.result(name) if summary is not None else None
        streams = ran.streams if ran is not None else None
        label = f"{name} iteration time" + (f" ({streams} stream{'s' if streams != 1 else ''}/WAN channel)"
                                            if streams else "")
        out.append(Row("training", label, value, "s", note=why))
    a, b, m = times["atlas"], times["baseline"], times["multi-tcp"]
    r = _ratio(a, b)
    out.append(Row("training", "atlas / baseline iteration time", r, "x", "< 1", _check(r, lambda x: x < 1),
                   f"atlas {1 / r:.2f}x faster" if r else (why_missing or _first_why(whys, "baseline", "atlas"))))
    if "multi-tcp" in variants:
        r = _ratio(a, m)
        # Issue 40's criterion: atlas within 3% of multi-TCP or ahead. Where Atlas's own
        # prediction says sharing the link is as fast as any plan, it runs multi-TCP's
        # configuration, and two runs of one configuration differ by noise alone.
        out.append(Row("training", "atlas / multi-tcp iteration time", r, "x", f"<= {MULTI_TCP_TOLERANCE:g}",
                       _check(r, lambda x: x <= MULTI_TCP_TOLERANCE),
                       f"atlas {1 / r:.2f}x faster" if r else _first_why(whys, "multi-tcp", "atlas")))
    return out


def _first_why(whys: Mapping[str, str], *names: str) -> str:
    return next((whys[n] for n in names if whys.get(n)), "needs both iteration times")


def bubbletea_rows(summary: Summary | None, plain: str = "atlas", why_missing: str = "") -> list[Row]:
    """Result 3 from a run summary: utilization of `plain` without and with
    BubbleTea, and the training slowdown it cost."""
    bt = plain + BUBBLETEA_SUFFIX
    if summary is None:
        why = why_missing or "not run"
        u0, w0, u1, w1 = None, why, None, why
    else:
        u0, w0 = _variant_value(summary, plain, "device_utilization")
        u1, w1 = _variant_value(summary, bt, "device_utilization")
        if bt not in summary.variants and why_missing:
            w1 = why_missing
    if u1 is not None and u0 is not None:
        gain = f"{(u1 - u0) * 100:+.1f} points"
    else:
        gain = ""
    entry = summary.result(bt) if summary is not None and u1 is not None else None
    twin = summary.result(plain) if summary is not None else None
    train_only = entry.headline("device_utilization_training") if entry is not None else None
    out = [
        Row("bubbletea", f"utilization without BubbleTea ({plain})", u0, "%", note=w0),
        Row("bubbletea", f"utilization with BubbleTea ({bt})", u1, "%", f"-> {PAPER_UTILIZATION:.0%} (paper)",
            None, w1 or gain),
    ]
    if train_only is not None:
        out.append(Row("bubbletea", "  of which training work", float(train_only), "%",
                       note="the rest is prefill" if u1 and u1 > train_only else ""))
    slowdown = entry.headline("training_slowdown") if entry is not None else None
    t0 = twin.headline("iteration_time_s") if twin is not None else None
    if slowdown is None and entry is not None and t0:  # not measured against the twin by the run
        slowdown = entry.headline("iteration_time_s") / t0 - 1
    why = (w1 or w0) if slowdown is None else ""
    if slowdown is not None and entry is not None:
        t1 = entry.headline("iteration_time_s")
        if t0 and t1:
            why = f"{t1:.3f} s vs {t0:.3f} s per iteration"
        if entry.repeats is not None:
            why += f" (median of {len(entry.repeats.runs)} repeats)"
        d = entry.slowdown_decomposition
        if d is not None and d.agent_overhead is not None:
            why += (f"; agents' overhead {d.agent_overhead:+.1%}, prefill {d.prefill_interference:+.1%}, "
                    f"noise +-{d.network_noise:.1%}")
        drops = entry.wan_tail_drops
        if entry.training_slowdown_note and drops is not None:
            why += (f"; WAN lost {drops.with_bubbletea} packets here, {drops.without} without "
                    "BubbleTea (TCP windows shrank): rerun to compare")
    out.append(Row("bubbletea", "training slowdown with BubbleTea", None if slowdown is None else float(slowdown),
                   "+%", f"<= {SLOWDOWN_LIMIT:.0%}", _check(slowdown, lambda x: x <= SLOWDOWN_LIMIT), why))
    worst = worst_iteration_row(entry, twin)
    if worst is not None:
        out.append(worst)
    req = entry.prefill_requests if entry is not None else None
    if req is not None:
        ttft = entry.ttft_s.p50 if entry.ttft_s is not None else None
        note = f"of {req.arrived} arrived" + (f"; TTFT p50 {ttft * 1000:.0f} ms" if ttft else "")
        out.append(Row("bubbletea", "prefill requests served in the bubbles", float(req.served), "",
                       note=note))
    return out


def worst_iteration_row(entry: VariantResult | None, twin: VariantResult | None) -> Row | None:
    """BubbleTea's slowest measured iteration over the slowest without it (over every
    repeat when the variants were repeated), with the p95s, the iterations slowed by
    more than 5% and the longest wait of training on a prefill; None when not measured."""
    if entry is None or twin is None:
        return None
    if entry.repeats is not None and entry.repeats.tail is not None and twin.repeats is not None \
            and twin.repeats.tail is not None:
        w, p, slowed, where = entry.repeats.tail, twin.repeats.tail, None, f" over {len(entry.repeats.runs)} repeats"
    else:
        d = entry.slowdown_decomposition
        if d is None or d.tail is None:
            return None
        w, p, slowed, where = d.tail.with_bubbletea, d.tail.without, d.tail.slowed_over_5pct, ""
    ratio = w.max / p.max
    note = f"{w.max:.3f} s vs {p.max:.3f} s{where}; p95 {w.p95:.3f} vs {p.p95:.3f} s"
    if slowed is not None:
        note += f"; {slowed} of {w.n} iterations slowed by more than 5%"
    g = entry.guard_overruns
    if g is not None:
        note += f"; longest wait on a prefill {g.worst_training_wait_s * 1e3:.0f} ms"
        if g.worst:
            note += f" ({g.worst[0].request} on {g.worst[0].device})"
    return Row("bubbletea", "worst iteration with BubbleTea", ratio, "x", f"<= {WORST_ITERATION_LIMIT:.2f}x",
               _check(ratio, lambda x: x <= WORST_ITERATION_LIMIT), note)


def build_rows(bench: Sequence[Mapping[str, Any]] | None, summary: Summary | None, *,
               streams: int = 8, link_mbps: float | None = None, bench_note: str = "", run_note: str = "",
               bubbletea_note: str = "") -> list[Row]:
    """The whole demo table from the saved sub-results; a `*_note` says why a part
    is missing (skipped, failed, not installed) and is shown in its rows."""
    return (transport_rows(bench, streams, link_mbps, bench_note)
            + training_rows(summary, run_note)
            + bubbletea_rows(summary, why_missing=bubbletea_note or run_note))


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


def find(rows: Sequence[Row], result: str, prefix: str) -> Row | None:
    """The first row of `result` whose measure starts with `prefix`."""
    return next((r for r in rows if r.result == result and r.measure.startswith(prefix)), None)


