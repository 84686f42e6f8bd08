"""`testbed report`: one CSV, a text table and a few plots from result folders alone.

Works on the output of a sweep (``sweep.json`` and one folder per point) and on the
output folder of a single `testbed run` (its ``summary.json``). Nothing is recomputed
from a live system, so a report can be rebuilt anywhere, any time, from the files.

The package: loading.py reads the folders (run summaries through their model,
testbed_core/contracts/summary.py) and makes the rows of results.csv; plots.py draws
the figures from those rows; table.py prints them. `build_report` does all three.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from testbed.report.loading import (
    PREFERRED_METRICS,
    PointResult,
    ReportError,
    ResultSet,
    flatten,
    load_results,
    read_json,
    read_summary_file,
    result_rows,
    write_csv,
)
from testbed.report.plots import (
    PAPER_UTILIZATION,
    SLOWDOWN_LIMIT,
    Axis,
    axis_for,
    run_plot,
    run_plots,
    sweep_plots,
)
from testbed.report.table import format_table, summary_table

__all__ = [
    "PAPER_UTILIZATION", "PREFERRED_METRICS", "SLOWDOWN_LIMIT", "Axis", "PointResult", "Report", "ReportError",
    "ResultSet", "axis_for", "build_report", "flatten", "format_table", "load_results", "read_json",
    "read_summary_file", "result_rows", "run_plot", "run_plots", "summary_table", "sweep_plots", "write_csv",
]


@dataclass
class Report:
    """What `build_report` made: the results it read, the files it wrote, the table."""

    results: ResultSet
    csv: Path
    plots: list[Path]
    table: str
    columns: list[str]
    counts: dict[str, int]  # points per status


def build_report(root: str | Path, out: str | Path | None = None) -> Report:
    """Rebuilds results.csv, the plots and summary.txt under `out` (default: `root`)."""
    rs = load_results(root)
    out_dir = Path(out) if out is not None else rs.root
    out_dir.mkdir(parents=True, exist_ok=True)
    columns, rows = result_rows(rs)
    csv_path = out_dir / "results.csv"
    write_csv(csv_path, columns, rows)
    plots = run_plots(rs, out_dir) if rs.kind == "run" else sweep_plots(rs, rows, out_dir)
    table = summary_table(rs, rows)
    counts: dict[str, int] = {}
    for pt in rs.points:
        counts[pt.status] = counts.get(pt.status, 0) + 1
    (out_dir / "summary.txt").write_text(table + "\n")
    return Report(rs, csv_path, plots, table, columns, counts)
