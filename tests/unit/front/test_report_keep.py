"""Keeping a sweep's results in the repository (testbed/report/keep.py): the small
files only (sweep.json, provenance, each point's record, summary and resolved
scenario, the table and plots rebuilt from them), kept.json saying where they came
from, a report that rebuilds from the kept folder alone, and large files refused."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from click.testing import CliRunner

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from test_report import read_csv, sweep_results  # noqa: E402

from testbed.cli import main  # noqa: E402
from testbed.report import ReportError, build_report  # noqa: E402
from testbed.report.keep import MAX_FILE_BYTES, default_keep_dir, keep_results  # noqa: E402
from testbed_core.constants import REPO_ROOT  # noqa: E402


def test_keep_copies_the_small_files_and_rebuilds_from_them(tmp_path: Path) -> None:
    out = sweep_results(tmp_path, {"parameters": {"topology.wan.0.delay": ["5ms", "50ms"]}})
    (out / "p001-delay=5ms" / "atlas").mkdir(exist_ok=True)
    (out / "p001-delay=5ms" / "atlas" / "timeline.csv").write_text("big\n" * 1000)
    original = read_csv(build_report(out).csv)
    kept = keep_results(out, tmp_path / "kept")
    names = {str(p.relative_to(kept.folder)) for p in kept.files}
    assert {"sweep.json", "results.csv", "summary.txt", "iteration_time.png", "kept.json"} <= names
    assert "p001-delay=5ms/point.json" in names and "p002-delay=50ms/point.json" in names
    assert not (kept.folder / "p001-delay=5ms" / "atlas").exists()  # per-variant folders stay behind
    assert read_csv(kept.folder / "results.csv") == original  # the table from the kept files alone
    record = json.loads((kept.folder / "kept.json").read_text())
    assert record["source"] == str(out.resolve()) and record["points"] == {"p001-delay=5ms": "ok",
                                                                           "p002-delay=50ms": "ok"}
    assert record["files"]["sweep.json"] == (kept.folder / "sweep.json").stat().st_size
    assert kept.total_bytes == sum(record["files"].values())
    rebuilt = CliRunner().invoke(main, ["report", str(kept.folder)])
    assert rebuilt.exit_code == 0, rebuilt.output


def test_report_keep_option_and_default_folder(tmp_path: Path) -> None:
    out = sweep_results(tmp_path, {"parameters": {"topology.wan.0.delay": ["5ms"]}})
    res = CliRunner().invoke(main, ["report", str(out), "--keep-to", str(tmp_path / "k")])
    assert res.exit_code == 0, res.output
    assert "kept:" in res.stderr and (tmp_path / "k" / "kept.json").exists()
    assert default_keep_dir("sweep-rtt") == REPO_ROOT / "results" / "sweep-rtt"


def test_keep_refuses_what_is_not_a_sweep_or_too_large(tmp_path: Path) -> None:
    out = sweep_results(tmp_path, {"parameters": {"topology.wan.0.delay": ["5ms"]}})
    single = out / "p001-delay=5ms"
    res = CliRunner().invoke(main, ["report", str(single), "--keep-to", str(tmp_path / "k1")])
    assert res.exit_code == 1 and "not a `testbed sweep` folder" in res.output
    (out / "sweep.json").write_text((out / "sweep.json").read_text() + " " * MAX_FILE_BYTES)
    try:
        keep_results(out, tmp_path / "k2")
    except ReportError as exc:
        assert "sweep.json" in str(exc) and "small files only" in str(exc)
    else:
        raise AssertionError("a file above the limit was kept")
