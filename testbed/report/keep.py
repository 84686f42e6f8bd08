"""Keeping a sweep's results in the repository (`testbed sweep ... --keep`,
`testbed report DIR --keep`): the small files that back a figure, so that anyone can
inspect them and rebuild the table and plots with `testbed report results/<sweep>`.

Kept, under ``results/<sweep name>/`` of the checkout (or another folder): the sweep's
``sweep.json`` and ``provenance.json``, and per point its ``point.json``,
``summary.json``, ``provenance.json`` and ``scenario.resolved.yaml``; then
``results.csv``, ``summary.txt`` and the plots, rebuilt from those files alone, and
``kept.json`` (where they came from, when, and the size of every file). Left out:
the per-variant folders (timelines, transfer logs, Gantt charts, worker logs, jobs),
which are large and are not what a figure reads. A file above `MAX_FILE_BYTES`, or a
kept folder above `MAX_TOTAL_BYTES`, is refused: the repository keeps small files.
The repository's .gitignore tracks these files in ``results/sweep-*/`` and ignores
anything deeper, so a sweep run straight into ``results/<sweep>/`` keeps the same set.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from testbed.provenance import git_state
from testbed.report.loading import ReportError, load_results
from testbed_core.constants import REPO_ROOT
from testbed_core.contracts.sweep import KeptRecord

MAX_FILE_BYTES = 1 << 20  # one kept file
MAX_TOTAL_BYTES = 8 << 20  # one kept sweep
SWEEP_FILES = ("sweep.json", "provenance.json")
POINT_FILES = ("point.json", "summary.json", "provenance.json", "scenario.resolved.yaml")
KEPT_FILE = "kept.json"


@dataclass
class Kept:
    """What `keep_results` wrote: the folder, every file in it, their sizes."""

    folder: Path
    files: list[Path] = field(default_factory=list)
    total_bytes: int = 0


def default_keep_dir(name: str) -> Path:
    """Where a sweep's kept results live in the checkout: results/<name>/."""
    return REPO_ROOT / "results" / name


def _copy(src: Path, dst: Path) -> None:
    if src.resolve() == dst.resolve():
        return
    dst.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src, dst)


def keep_results(root: str | Path, dest: str | Path | None = None) -> Kept:
    """Copy the small files of the sweep at `root` to `dest` (default: results/<name>/
    of the checkout), rebuild results.csv, summary.txt and the plots there from those
    files alone, and write kept.json. ReportError when `root` is not a sweep folder or
    a file is too large to keep."""
    from testbed.report import build_report

    rs = load_results(root)
    if rs.kind != "sweep" or not (rs.root / "sweep.json").exists():
        raise ReportError(f"{rs.root}: --keep keeps a sweep's results (its sweep.json and point folders); "
                          "this is not a `testbed sweep` folder")
    out = Path(dest) if dest is not None else default_keep_dir(rs.name)
    for name in SWEEP_FILES:
        if (rs.root / name).exists():
            _copy(rs.root / name, out / name)
    for pt in rs.points:
        for name in POINT_FILES:
            if (pt.folder / name).exists():
                _copy(pt.folder / name, out / pt.id / name)
    build_report(out)  # from the kept files alone: what anyone rebuilds from the repository
    kept = Kept(out)
    for path in sorted(p for p in out.rglob("*") if p.is_file() and p.name != KEPT_FILE):
        rel = path.relative_to(out)
        if len(rel.parts) > 2 or (len(rel.parts) == 2 and rel.parts[1] not in POINT_FILES):
            continue  # something else lives here (a sweep run straight into this folder): not kept
        size = path.stat().st_size
        if size > MAX_FILE_BYTES:
            raise ReportError(f"{path}: {size / 1e6:.1f} MB, above the {MAX_FILE_BYTES >> 20} MiB a kept file may "
                              "have; the repository keeps small files only (fewer points, or a smaller plot)")
        kept.files.append(path)
        kept.total_bytes += size
    if kept.total_bytes > MAX_TOTAL_BYTES:
        raise ReportError(f"{out}: the kept files come to {kept.total_bytes / 1e6:.1f} MB, above the "
                          f"{MAX_TOTAL_BYTES >> 20} MiB a kept sweep may have; keep fewer points")
    record = KeptRecord(
        kept_at=datetime.now(UTC).isoformat(timespec="seconds"),
        source=str(rs.root.resolve()),
        sweep=rs.name,
        git=git_state(),
        points={pt.id: pt.status for pt in rs.points},
        rebuild=f"testbed report {_shown(out)}",
        files={str(p.relative_to(out)): p.stat().st_size for p in kept.files},
    )
    (out / KEPT_FILE).write_text(json.dumps(record.to_data(), indent=2) + "\n")
    kept.files.append(out / KEPT_FILE)
    return kept


def _shown(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(REPO_ROOT))
    except ValueError:
        return str(path)
