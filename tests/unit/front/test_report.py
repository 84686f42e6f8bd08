"""Reports: the CSV (one row per point x variant, flattened metrics), plots chosen for
the swept parameter, single-run bar charts, and rebuilding from folders alone."""

from __future__ import annotations

import csv
import io
import json
import shutil
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from sweep_fakes import fake_runner, flaky_runner, write_base, write_sweep  # noqa: E402

from testbed.cli import main  # noqa: E402
from testbed.progress import Progress  # noqa: E402
from testbed.report import ReportError, axis_for, build_report, flatten  # noqa: E402
from testbed.sweep import load_sweep, run_sweep  # noqa: E402

PNG = b"\x89PNG\r\n\x1a\n"


def sweep_results(folder: Path, body: dict, runner=fake_runner, bubbletea: bool = False) -> Path:
    write_base(folder, bubbletea=bubbletea)
    plan = load_sweep(write_sweep(folder, body))
    out = folder / "out"
    run_sweep(plan, out, runner=runner, progress=Progress(len(plan.points), stream=io.StringIO(), tty=False))
    return out


def read_csv(path: Path) -> list[dict[str, str]]:
    with path.open() as fh:
        return list(csv.DictReader(fh))


def is_png(path: Path) -> bool:
    return path.exists() and path.read_bytes()[:8] == PNG and path.stat().st_size > 10_000


def test_rtt_sweep_csv_and_plots(tmp_path: Path) -> None:
    out = sweep_results(tmp_path, {"parameters": {"topology.wan.0.delay": ["5ms", "50ms", "100ms"]}, "repeat": 2},
                        bubbletea=True)
    report = build_report(out)
    assert report.columns[:8] == ["point", "status", "seed", "topology.wan.0.delay", "variant", "delay_backend",
                                  "scale", "iteration_time_s"]
    assert report.columns[-3:] == ["speedup_vs_baseline", "atlas_speedup", "error"]
    for col in ("wan_links.dc1-dc2.goodput_mbps", "ttft_s.p95", "prefill_requests.rejected_by_reason.deadline",
                "device_utilization_training", "training_slowdown", "guard_violations"):
        assert col in report.columns, col
    rows = read_csv(report.csv)
    assert len(rows) == 6 * 6  # 3 delays x 2 seeds x 6 variants
    first = {r["variant"]: r for r in rows if r["point"] == "p001-delay=5ms-seed=1"}
    assert list(first) == ["baseline", "baseline+bubbletea", "multi-tcp", "multi-tcp+bubbletea",
                           "atlas", "atlas+bubbletea"]
    base, atlas = float(first["baseline"]["iteration_time_s"]), float(first["atlas"]["iteration_time_s"])
    assert float(first["atlas"]["speedup_vs_baseline"]) == pytest.approx(base / atlas)
    assert float(first["baseline"]["atlas_speedup"]) == pytest.approx(base / atlas)  # atlas over each variant
    assert float(first["atlas"]["atlas_speedup"]) == pytest.approx(1.0)
    assert first["atlas"]["topology.wan.0.delay"] == "5ms" and first["atlas"]["status"] == "ok"
    assert first["atlas"]["ttft_s.p95"] == ""  # only BubbleTea variants have TTFT
    assert {p.name for p in report.plots} == {"iteration_time.png", "speedup.png", "atlas_speedup.png",
                                              "utilization.png", "ttft.png"}
    assert all(is_png(p) for p in report.plots)
    assert "atlas speedup" in report.table and "util atlas+BT" in report.table
    assert "atlas/multi-tcp" in report.table and "atlas/baseline" in report.table
    # The speedup grows with RTT in the fake (as Atlas's should): the table says so too.
    speedups = [float(r["speedup_vs_baseline"]) for r in rows if r["variant"] == "atlas" and r["seed"] == "1"]
    assert speedups == sorted(speedups)


def test_streams_and_bandwidth_sweeps_plot_goodput(tmp_path: Path) -> None:
    out = sweep_results(tmp_path / "s", {"parameters": {"transport.streams": [1, 2, 4, 8]}})
    assert {p.name for p in build_report(out).plots} == {"iteration_time.png", "speedup.png", "atlas_speedup.png",
                                                         "goodput.png"}
    out = sweep_results(tmp_path / "b", {"parameters": {"topology.wan.0.rate": ["100Mbit", "1Gbit"]}})
    report = build_report(out)
    assert "goodput.png" in {p.name for p in report.plots}
    assert all(is_png(p) for p in report.plots)


def test_two_parameters_make_facets(tmp_path: Path) -> None:
    out = sweep_results(tmp_path, {"parameters": {"transport.streams": [1, 8],
                                                  "topology.wan.0.rate": ["500Mbit", "1Gbit"]}})
    report = build_report(out)
    assert is_png(out / "goodput.png")
    rows = read_csv(report.csv)
    assert {r["topology.wan.0.rate"] for r in rows} == {"500Mbit", "1Gbit"}


def test_failed_and_pending_points_are_rows(tmp_path: Path) -> None:
    out = sweep_results(tmp_path, {"parameters": {"topology.wan.0.delay": ["5ms", "100ms"]}}, runner=flaky_runner)
    sweep = json.loads((out / "sweep.json").read_text())
    sweep["points"].append({"id": "p003-delay=150ms", "parameters": {"topology.wan.0.delay": "150ms"}, "seed": 1})
    (out / "sweep.json").write_text(json.dumps(sweep))
    report = build_report(out)
    rows = read_csv(report.csv)
    failed = [r for r in rows if r["point"] == "p002-delay=100ms"]
    assert len(failed) == 1 and failed[0]["status"] == "failed" and failed[0]["variant"] == ""
    assert failed[0]["error"] == "RuntimeError: relay lost its queue at RTT 200 ms"
    pending = [r for r in rows if r["point"] == "p003-delay=150ms"]
    assert pending[0]["status"] == "pending"
    assert report.counts == {"ok": 1, "failed": 1, "pending": 1}


def test_report_rebuilds_from_folders_alone(tmp_path: Path) -> None:
    out = sweep_results(tmp_path, {"parameters": {"topology.wan.0.delay": ["5ms", "50ms"]}})
    original = build_report(out).csv.read_text()
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    for name in ("results.csv", "iteration_time.png", "speedup.png", "summary.txt"):
        (copy / name).unlink()
    result = CliRunner().invoke(main, ["report", str(copy)])
    assert result.exit_code == 0, result.output
    assert (copy / "results.csv").read_text() == original
    assert is_png(copy / "iteration_time.png")
    assert "p001     5ms      ok" in result.stdout
    assert "sweep t: 2 point(s) (2 ok)" in result.stderr
    # Without sweep.json the point folders alone still make a report.
    (copy / "sweep.json").unlink()
    rows = read_csv(build_report(copy).csv)
    assert {r["point"] for r in rows} == {"p001-delay=5ms", "p002-delay=50ms"}
    assert {r["topology.wan.0.delay"] for r in rows} == {"5ms", "50ms"}


def test_single_run_folder_gives_bars_per_variant(tmp_path: Path) -> None:
    out = sweep_results(tmp_path, {"parameters": {"topology.wan.0.delay": ["25ms"]}}, bubbletea=True)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    for name in ("summary.json", "scenario.resolved.yaml"):
        shutil.copy(out / "p001-delay=25ms" / name, run_dir / name)
    report = build_report(run_dir)
    assert report.results.kind == "run"
    assert [p.name for p in report.plots] == ["summary.png"] and is_png(report.plots[0])
    rows = read_csv(report.csv)
    assert [r["variant"] for r in rows][:2] == ["baseline", "baseline+bubbletea"] and len(rows) == 6
    lines = report.table.splitlines()
    assert lines[0].split()[:3] == ["variant", "iter", "s"]
    assert any(line.startswith("atlas+bubbletea") and "+0.4%" in line and "ms" in line for line in lines)


def test_bench_results_are_aggregated(tmp_path: Path) -> None:
    run_dir = tmp_path / "bench"
    run_dir.mkdir()
    results = [{"path": "dc1-h1->dc2-h1", "method": m, "streams": n, "goodput_mbps": g, "verified": True}
               for m, n, g in (("single", 1, 95.0), ("atlas", 2, 190.0), ("atlas", 8, 840.0))]
    (run_dir / "results.json").write_text(json.dumps({"results": results}))
    report = build_report(run_dir)
    rows = read_csv(report.csv)
    assert [r["variant"] for r in rows] == ["bench:single", "bench:atlas", "bench:atlas"]
    assert rows[2]["bench.goodput_mbps"] == "840.0" and rows[2]["bench.streams"] == "8"
    assert [p.name for p in report.plots] == ["bench_goodput.png"] and is_png(report.plots[0])


def test_no_results_is_an_error_that_says_what_was_expected(tmp_path: Path) -> None:
    with pytest.raises(ReportError, match=r"no results here \(expected the summary.json of a `testbed run`"):
        build_report(tmp_path)
    result = CliRunner().invoke(main, ["report", str(tmp_path / "nope")])
    assert result.exit_code == 1 and "nope: no such result folder" in result.stderr
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "summary.json").write_text("{not json")
    with pytest.raises(ReportError, match=r"summary.json: unreadable JSON"):
        build_report(bad)


def test_axes_speak_the_reader_units() -> None:
    rtt = axis_for("topology.wan.0.delay", ["5ms", "100ms"])
    assert rtt.title.startswith("WAN RTT (ms)") and rtt.x("25ms") == pytest.approx(50)
    bw = axis_for("topology.wan.0.rate", ["100Mbit", "1Gbit"])
    assert bw.title == "WAN bandwidth (Mbit/s)" and bw.x("1Gbit") == pytest.approx(1000)
    streams = axis_for("transport.streams", [1, 2, 4, 8, 16])
    assert streams.title == "TCP streams per transfer" and streams.log and streams.x(4) == 4
    topo = axis_for("topology", ["../topologies/2dc.yaml", "../topologies/3dc-triangle.yaml"])
    assert topo.categories == ["2dc", "3dc-triangle"] and topo.x("../topologies/3dc-triangle.yaml") == 1
    assert axis_for("transport.streams", [4, "auto"]).categories == ["4", "auto"]
    assert axis_for("transport.chunk", ["1MiB", "4MiB"]).x("4MiB") == pytest.approx(4)


def test_flatten_keeps_scalars_only() -> None:
    assert flatten({"a": 1, "b": {"c": 2.5, "d": {"e": "x"}}, "l": [1, 2], "n": None}) == {
        "a": 1, "b.c": 2.5, "b.d.e": "x", "n": None}
