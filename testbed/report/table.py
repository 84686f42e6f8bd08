"""The report's text table for the terminal (and summary.txt): per variant for one
run, per point for a sweep."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from testbed.report.loading import PointResult, ResultSet, Row, category, number, wan_goodput
from testbed_core.variants import BUBBLETEA_SUFFIX, base_name, has_bubbletea, sort_key


def format_table(headers: list[str], rows: Iterable[list[str]]) -> str:
    """Columns padded to their widest cell; the first left-aligned, the rest right."""
    rows = [list(map(str, r)) for r in rows]
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(headers)]
    def line(cells: list[str]) -> str:
        return "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths, strict=True))).rstrip()
    out = [line(headers), line(["-" * w for w in widths])]
    out += [line(r) for r in rows]
    return "\n".join(out)


def _fmt(value: float | None, spec: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return format(value, spec)


def summary_table(rs: ResultSet, rows: list[Row]) -> str:
    """A compact text table for the terminal."""
    by_point: dict[str, dict[str, Row]] = {}
    for r in rows:
        by_point.setdefault(r["point"], {})[r.get("variant") or ""] = r
    variants = sorted({r["variant"] for r in rows if r.get("variant") and not r["variant"].startswith("bench:")},
                      key=sort_key)
    if any(number(r.get("seconds_per_step")) is not None for r in rows):  # a program scenario
        return _program_table(rs, rows, by_point, variants)
    if rs.kind == "run" and not variants:
        bench = [r for r in rows if str(r.get("variant", "")).startswith("bench:")]
        headers = ["path", "method", "streams", "goodput Mbit/s", "verified"]
        return format_table(headers, [
            [str(r.get("bench.path", "-")), str(r.get("bench.method", "-")), str(r.get("bench.streams", "-")),
             _fmt(number(r.get("bench.goodput_mbps")), ".0f"), str(r.get("bench.verified", "-"))]
            for r in bench
        ])
    if rs.kind == "run":
        headers = ["variant", "iter s", "pred s", "util", "bubbles", "WAN Mbit/s", "slowdown", "served/rej", "TTFT p95"]
        body = []
        for v in variants:
            r = by_point[rs.points[0].id].get(v, {})
            served, rejected = number(r.get("prefill_requests.served")), number(r.get("prefill_requests.rejected"))
            body.append([
                v, _fmt(number(r.get("iteration_time_s")), ".3f"),
                _fmt(number(r.get("predicted_iteration_time_s")), ".3f"),
                _fmt(number(r.get("device_utilization")), ".1%"), _fmt(number(r.get("bubble_fraction")), ".1%"),
                _fmt(wan_goodput(r), ".0f"), _fmt(number(r.get("training_slowdown")), "+.1%"),
                f"{served:.0f}/{rejected:.0f}" if served is not None and rejected is not None else "-",
                _fmt(_scaled(r.get("ttft_s.p95"), 1000), ".0f") + (" ms" if number(r.get("ttft_s.p95")) is not None else ""),
            ])
        return format_table(headers, body)
    labels = [lab for _, lab in rs.parameters]
    plain = [v for v in variants if not has_bubbletea(v)]
    with_bt = [v for v in variants if has_bubbletea(v)]
    headers = ["point", *labels, "status"] + [f"{v} s" for v in plain]
    speed = [v for v in plain if v != "baseline"] if "baseline" in plain else []
    headers += [f"{v} speedup" for v in speed]
    over = [v for v in plain if v != "atlas"] if "atlas" in plain else []
    headers += [f"atlas/{v}" for v in over]
    # BubbleTea: the headline variant only (atlas+bubbletea when present); all of them are in the CSV.
    bt = [v for v in with_bt if v == f"atlas{BUBBLETEA_SUFFIX}"] or with_bt[-1:]
    bt_base = [base_name(v) for v in bt]
    headers += [f"util {b}" for b in bt_base] + [f"util {b}+BT" for b in bt_base]
    headers += [f"slowdown {b}+BT" for b in bt_base]
    body = []
    for pt in rs.points:
        vr = by_point.get(pt.id, {})
        cells = _point_cells(rs, pt)
        cells += _column(vr, plain, "iteration_time_s", ".3f")
        cells += _column(vr, speed, "speedup_vs_baseline", ".2f", "x")
        cells += _column(vr, over, "atlas_speedup", ".2f", "x")
        cells += [_fmt(number(vr.get(b, {}).get("device_utilization"))
                       or number(vr.get(v, {}).get("device_utilization_training")), ".1%")
                  for b, v in zip(bt_base, bt, strict=True)]
        cells += _column(vr, bt, "device_utilization", ".1%")
        cells += _column(vr, bt, "training_slowdown", "+.1%")
        body.append(cells)
    return format_table(headers, body)


def _point_cells(rs: ResultSet, pt: PointResult) -> list[str]:
    """A point's first cells: its number, its parameters' values, its status."""
    return [pt.id.split("-", 1)[0], *[category(pt.parameters.get(p)) for p, _ in rs.parameters], pt.status]


def _column(vr: dict[str, Row], variants: list[str], key: str, spec: str, suffix: str = "") -> list[str]:
    """One cell per variant: its row's `key` formatted with `spec` (then `suffix`), '-' when missing."""
    return [_fmt(number(vr.get(v, {}).get(key)), spec) + suffix for v in variants]


def _scaled(value: Any, factor: float) -> float | None:
    value = number(value)
    return value * factor if value is not None else None




def _program_table(rs: ResultSet, rows: list[Row], by_point: dict[str, dict[str, Row]],
                   variants: list[str]) -> str:
    """A program scenario's table: seconds per step per variant (and how many times
    faster atlas ran, when there is an atlas variant)."""
    labels = [lab for _, lab in rs.parameters]
    over = [v for v in variants if v != "atlas"] if "atlas" in variants else []
    headers = ["point", *labels, "status"] + [f"{v} s/step" for v in variants] + [f"{v}/atlas" for v in over]
    body = []
    for pt in rs.points:
        vr = by_point.get(pt.id, {})
        body.append(_point_cells(rs, pt) + _column(vr, variants, "seconds_per_step", ".3f")
                    + _column(vr, over, "atlas_speedup", ".2f", "x"))
    return format_table(headers, body)
