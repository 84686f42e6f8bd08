"""Reading result folders: a sweep's (``sweep.json`` and one folder per point) or one
`testbed run` output folder, and the flat table (``results.csv``) made from them.

Run summaries are read through their model (testbed_core/contracts/summary.py), so
a folder whose summary.json does not match what `testbed run` writes is refused with
the file and the key at fault. ``results.csv`` has one row per point x variant: the
point id, its status and seed, each swept parameter as written in the sweep file, the
variant, then every scalar of the variant's summary entry flattened to a dotted
column name (``wan_links.dc1-dc2.goodput_mbps``, ``ttft_s.p95``), plus
``speedup_vs_baseline`` and ``atlas_speedup`` (this variant's iteration time over
atlas's at the same point: how many times faster atlas ran). A variant played
``runner.repeat`` times (interleaved with the others) has its headline figures
(``iteration_time_s``, ``device_utilization``, ``training_slowdown``, ...) as the median
over its repeats, and the speedups from those medians; ``repeats.spread.*`` is beside
it (each repeat is in summary.json). Points that failed or have not run yet get one row with
their status and error, so the table always shows the whole sweep.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from testbed_core.configfile import ConfigError
from testbed_core.contracts.summary import (
    ProgramSummary,
    ProgramVariantResult,
    RepeatFigures,
    Summary,
    VariantResult,
    is_program_summary,
)
from testbed_core.contracts.sweep import PointRecord, SweepRecord
from testbed_core.variants import sort_key

M = TypeVar("M", bound=BaseModel)

PREFERRED_METRICS = (
    "iteration_time_s", "predicted_iteration_time_s", "device_utilization", "device_utilization_training",
    "bubble_fraction", "training_slowdown", "prefill_requests.served", "prefill_requests.rejected",
    "ttft_s.p50", "ttft_s.p95", "ttft_s.p99", "guard_violations", "seconds_per_step",
)
"""The columns that come first in results.csv, in this order; the rest follow sorted."""


Cell = str | int | float | bool | None
"""One cell of results.csv: a scalar of a summary entry, or a parameter value (lists
and mappings as JSON text, `cell`)."""

Row = dict[str, Cell]
"""One row of results.csv: column name -> cell."""


class ReportError(ConfigError):
    """A folder that holds no results the report can read."""


@dataclass
class PointResult:
    """One point of a sweep (or the one folder of a run), as its files say."""

    id: str
    folder: Path
    parameters: dict[str, Any]
    seed: int | None
    status: str
    error: str | None = None
    duration_s: float | None = None
    summary: Summary | None = None
    bench: list[dict[str, Any]] | None = None
    resolved: dict[str, Any] | None = None
    program: ProgramSummary | None = None  # a program scenario's summary.json (testbed/run/program.py)


@dataclass
class ResultSet:
    """Every point under a result folder, with the swept parameters (path, label)."""

    root: Path
    kind: str  # "sweep" or "run"
    name: str
    parameters: list[tuple[str, str]]  # (path, label)
    points: list[PointResult] = field(default_factory=list)

    def labels(self) -> dict[str, str]:
        return dict(self.parameters)


def read_json(path: Path, fail: Callable[[Exception], Exception]) -> Any:
    """The JSON document at `path`, or None when there is none; `fail` turns a file
    that is there but unreadable into the caller's error (the demo reads results
    the same way)."""
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise fail(exc) from None


def _read_json(path: Path) -> Any:
    return read_json(path, lambda exc: ReportError(
        f"{path}: unreadable JSON ({exc}); remove the file or rerun that point"))


def read_model_file(path: Path, model: type[M], what: str, fail: Callable[[str], Exception]) -> M | None:
    """The file at `path` through `model`, or None when there is none; `fail` turns a
    file that is there but unreadable, or not `what` (the key at fault named), into the
    caller's error (the report and the demo read their files the same way)."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise fail(f"{path}: unreadable ({exc})") from None
    try:
        return model.model_validate_json(text)
    except ValidationError as exc:
        if any(e["type"] == "json_invalid" for e in exc.errors()):
            raise fail(f"{path}: unreadable JSON ({exc.errors()[0]['msg']})") from None
        where = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()[:5])
        raise fail(f"{path}: not {what} ({where})") from None


def read_summary_file(path: Path, fail: Callable[[str], Exception]) -> Summary | None:
    """The run summary at `path` through its model, or None when there is none (see
    `read_model_file`)."""
    return read_model_file(path, Summary, "the summary.json of a `testbed run`", fail)


def _fail(why: str) -> ReportError:
    return ReportError(f"{why}; remove the file or rerun that point")


def _read_summary(path: Path) -> Summary | None:
    return read_summary_file(path, _fail)


def _read_point_folder(folder: Path, pid: str, parameters: dict[str, Any], seed: int | None) -> PointResult:
    record = read_model_file(folder / "point.json", PointRecord, "the point.json of a `testbed sweep` point", _fail)
    program = _read_program_summary(folder / "summary.json")
    summary = None if program is not None else _read_summary(folder / "summary.json")
    bench = _read_json(folder / "results.json")
    resolved = None
    try:
        resolved = yaml.safe_load((folder / "scenario.resolved.yaml").read_text())
    except (OSError, yaml.YAMLError):
        pass
    status: str
    if record is None:
        status = "ok" if summary is not None or bench is not None or program is not None else "pending"
    else:
        status = record.status
    error = record.error if record is not None else None
    if status == "ok" and summary is None and bench is None and program is None:
        status, error = "incomplete", "status ok but no summary.json"
    if status == "running":
        status = "unfinished"
    return PointResult(
        id=pid,
        folder=folder,
        parameters=record.parameters if record is not None else parameters,
        seed=record.seed if record is not None else seed if seed is not None else (summary.seed if summary else None),
        status=status,
        error=error,
        duration_s=record.duration_s if record is not None else None,
        summary=summary,
        bench=bench.get("results") if isinstance(bench, dict) else None,
        resolved=resolved if isinstance(resolved, dict) else None,
        program=program,
    )


def _read_program_summary(path: Path) -> ProgramSummary | None:
    """A program scenario's summary.json (``"kind": "program"``) through its model, else None."""
    try:
        text = path.read_text()
    except OSError:
        return None
    if not is_program_summary(text):
        return None
    try:
        return ProgramSummary.model_validate_json(text)
    except ValidationError as exc:
        where = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()[:5])
        raise ReportError(f"{path}: not the summary.json of a program run ({where}); remove the file or rerun "
                          "that point") from None


def load_results(root: str | Path) -> ResultSet:
    """The results under `root`: a sweep's folder or one `testbed run` output folder."""
    root = Path(root)
    if not root.is_dir():
        raise ReportError(f"{root}: no such result folder")
    if (root / "summary.json").exists() or (root / "point.json").exists() or (root / "results.json").exists():
        point = _read_point_folder(root, root.name, {}, None)
        name = point.summary.scenario if point.summary else root.name
        return ResultSet(root, "run", str(name), [], [point])
    sweep = read_model_file(root / "sweep.json", SweepRecord, "the sweep.json of a `testbed sweep`", _fail)
    if sweep is not None:
        params = [(p.path, p.label or p.path) for p in sweep.parameters]
        rs = ResultSet(root, "sweep", sweep.name or root.name, params)
        for entry in sweep.points:
            rs.points.append(_read_point_folder(root / entry.id, entry.id, entry.parameters, entry.seed))
        return rs
    folders = sorted(p for p in root.iterdir() if p.is_dir() and ((p / "point.json").exists() or (p / "summary.json").exists()))
    if not folders:
        raise ReportError(
            f"{root}: no results here (expected the summary.json of a `testbed run`, "
            "or the sweep.json and point folders of a `testbed sweep`)"
        )
    rs = ResultSet(root, "sweep", root.name, [])
    for folder in folders:
        rs.points.append(_read_point_folder(folder, folder.name, {}, None))
    seen: dict[str, str] = {}
    for pt in rs.points:
        for path in pt.parameters:
            seen.setdefault(path, path.split(".")[-1])
    rs.parameters = list(seen.items())
    return rs


# ---------------------------------------------------------------------------- rows


def flatten(data: Mapping[str, object], prefix: str = "") -> Row:
    """Scalar leaves of nested mappings (a model's JSON dump), keyed by dotted path;
    lists are left out."""
    out: Row = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flatten(value, name + "."))
        elif isinstance(value, (int, float, str, bool)) or value is None:
            out[name] = value
    return out


def _metric_key(name: str) -> tuple[int, str]:
    return (PREFERRED_METRICS.index(name), "") if name in PREFERRED_METRICS else (len(PREFERRED_METRICS), name)


def result_rows(rs: ResultSet) -> tuple[list[str], list[Row]]:
    """CSV columns and rows: one row per point x variant (one per point without results)."""
    rows: list[Row] = []
    metrics: set[str] = set()
    param_paths = [p for p, _ in rs.parameters]
    for pt in rs.points:
        head: Row = {"point": pt.id, "status": pt.status, "seed": pt.seed}
        for path in param_paths:
            head[path] = cell(pt.parameters.get(path))
        made = 0
        summary = pt.summary
        variants = summary.variants if summary else {}
        delay_backend = summary.delay_backend if summary else None
        baseline = summary.result("baseline") if summary else None
        base_it = number(baseline.headline("iteration_time_s")) if baseline else None
        atlas = summary.result("atlas") if summary else None
        atlas_it = number(atlas.headline("iteration_time_s")) if atlas else None
        for vname in sorted(variants, key=sort_key):
            entry = variants[vname]
            flat = flatten(entry.model_dump(mode="json"))
            metrics.update(flat)
            row = dict(head, variant=vname, delay_backend=delay_backend, scale=summary.scale if summary else None)
            row.update(flat)
            if isinstance(entry, VariantResult) and entry.repeats is not None:  # the median over the repeats
                row.update({k: entry.headline(k) for k in RepeatFigures.model_fields if k in row})
            it = number(entry.headline("iteration_time_s")) if isinstance(entry, VariantResult) else None
            row["speedup_vs_baseline"] = base_it / it if base_it and it else None
            row["atlas_speedup"] = it / atlas_it if atlas_it and it else None
            rows.append(row)
            made += 1
        for result in pt.bench or []:
            flat = {f"bench.{k}": v for k, v in flatten(result).items()}
            metrics.update(flat)
            row = dict(head, variant=f"bench:{result.get('method', '?')}", delay_backend=delay_backend)
            row.update(flat)
            rows.append(row)
            made += 1
        if pt.program is not None:
            made += _program_rows(pt.program, head, rows, metrics)
        if not made:
            rows.append(dict(head, variant=""))
        if pt.error:
            for row in rows[len(rows) - made - (0 if made else 1):]:
                row["error"] = pt.error
    columns = ["point", "status", "seed", *param_paths, "variant", "delay_backend", "scale"]
    columns += sorted(metrics, key=_metric_key)
    columns += ["speedup_vs_baseline", "atlas_speedup", "error"]
    return columns, rows


def _program_rows(summary: ProgramSummary, head: Row, rows: list[Row],
                  metrics: set[str]) -> int:
    """A program scenario's rows: per variant its seconds per step (and the rest of its
    entry's scalars), and ``atlas_speedup``: its seconds per step over variant atlas's."""
    atlas = summary.result("atlas")
    atlas_s = number(atlas.seconds_per_step) if atlas else None
    for vname, entry in summary.variants.items():
        flat = flatten(entry.model_dump(mode="json"))
        metrics.update(flat)
        row = dict(head, variant=vname, delay_backend=summary.delay_backend, scale=None)
        row.update(flat)
        mine = number(entry.seconds_per_step) if isinstance(entry, ProgramVariantResult) else None
        row["atlas_speedup"] = mine / atlas_s if atlas_s and mine else None
        rows.append(row)
    return len(summary.variants)


def cell(value: object) -> Cell:
    """A parameter value as one CSV cell (lists and mappings as JSON, anything else that
    is not a scalar as its text)."""
    if isinstance(value, (dict, list)):
        return json.dumps(value, sort_keys=True)
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return str(value)


def number(value: Any) -> float | None:
    """A finite number from a table cell or a summary field, else None."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, (int, float)):
        return float(value) if math.isfinite(value) else None
    return None


def write_csv(path: Path, columns: list[str], rows: list[Row]) -> None:
    """results.csv: empty cells for missing values, booleans as true/false."""
    with path.open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(columns)
        for row in rows:
            writer.writerow([_csv_value(row.get(c)) for c in columns])


def _csv_value(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(round(value, 9))
    return str(value)




def category(value: Any) -> str:
    """A parameter value as a label: a swapped-in file by its stem, else as written."""
    if isinstance(value, str) and value.endswith((".yaml", ".yml")):
        return Path(value).stem
    return str(value)


def parse_cell(value: Any) -> Any:
    """The value behind a CSV cell (`cell`): JSON lists and mappings decoded."""
    if isinstance(value, str) and value[:1] in "[{":
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


def wan_goodput(row: Row) -> float | None:
    """A row's WAN goodput: the sum over its links (None without WAN traffic)."""
    values = [number(v) for k, v in row.items() if k.startswith("wan_links.") and k.endswith(".goodput_mbps")]
    values = [v for v in values if v is not None]
    return sum(values) if values else None
