"""`testbed bench transport`: the loopback run end to end (tiny sizes), the report
functions on made-up numbers, and every user-facing error."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from testbed.bench import report
from testbed.bench.transport import BenchError, Measurement, measure_pair, wan_suite
from testbed.cli import main


def fake_results() -> list[Measurement]:
    rows = []
    for n, gp in [(1, 100.0), (2, 190.0), (4, 370.0), (8, 800.0), (16, 820.0)]:
        rows.append(Measurement("wan", "atlas", n, gp, True, n, 1 << 20, [gp]))
        rows.append(Measurement("wan", "iperf3", n, gp * 1.05, True, n, 0, [gp]))
    rows.append(Measurement("wan", "atlas", 8, 790.0, True, "auto", 1 << 20, [790.0]))
    rows.append(Measurement("wan", "tcp", 1, 95.0, True, 1, 1 << 20, [95.0]))
    rows.append(Measurement("wan", "gloo", 1, 90.0, False, 1, 1 << 20, [90.0]))
    rows.append(Measurement("loopback", "atlas", 1, 15000.0, True, 1, 1 << 20, [15000.0]))
    rows.append(Measurement("loopback", "iperf3", 1, 20000.0, True, 1, 0, [20000.0]))
    rows.append(Measurement("loopback", "gloo", 1, None, None, 1, 1 << 20, [], error="gloo server failed"))
    return rows


def test_checks_table_csv_json_and_plot(tmp_path: Path) -> None:
    rows = fake_results()
    found = {(c.path, c.name.split(" (")[0]): c for c in report.checks(rows)}
    assert found[("wan", "atlas N=8 / iperf3 -P 8")].ratio == pytest.approx(800 / 840)
    assert found[("wan", "atlas N=8 / iperf3 -P 8")].ok
    assert found[("wan", "atlas N=8 / atlas N=1")].ratio == pytest.approx(8.0)
    auto = next(c for c in report.checks(rows) if c.name.startswith("atlas auto"))
    assert auto.ratio == pytest.approx(790 / 820) and auto.ok and "N=8" in auto.name and "N=16" in auto.name
    assert found[("loopback", "atlas N=1 / iperf3 -P 1")].ratio == pytest.approx(0.75)
    assert found[("loopback", "atlas N=1 / gloo")].ok is None  # gloo failed: not judged
    text = report.table(rows, report.checks(rows))
    assert "gloo server failed" in text and "auto=8" in text and " NO " in text
    report.write_csv(rows, tmp_path / "r.csv")
    assert (tmp_path / "r.csv").read_text().splitlines()[0].startswith("path,method,streams")
    doc = report.as_json(rows, report.checks(rows), {"x": 1})
    assert set(doc["results"][0]) >= {"path", "method", "streams", "goodput_mbps", "verified"}
    report.plot(rows, tmp_path / "g.png", title="2dc")
    assert (tmp_path / "g.png").read_bytes()[:4] == b"\x89PNG"


def test_loopback_benchmark_end_to_end(tmp_path: Path) -> None:
    out = tmp_path / "out"
    r = CliRunner().invoke(main, ["bench", "transport", "--no-wan", "--size", "2MiB", "--repeat", "1",
                                  "--streams", "1,auto", "--iperf-seconds", "1", "--json", "--out", str(out)])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout[r.stdout.index("{"):])
    rows = doc["results"]
    got = {(x["method"], x["requested_streams"]) for x in rows}
    assert got == {("atlas", 1), ("atlas", "auto"), ("tcp", 1), ("gloo", 1), ("iperf3", 1)}
    for x in rows:
        assert x["path"] == "loopback" and x["verified"] is True and x["goodput_mbps"] > 0, x
    auto = next(x for x in rows if x["requested_streams"] == "auto")
    assert auto["auto_probe_mbps"] and auto["streams"] >= 1
    for name in ("results.json", "results.csv", "goodput.png"):
        assert (out / name).stat().st_size > 0
    print("\n" + report.table([Measurement(**x) for x in rows], []))


def test_wan_path_explains_a_missing_emulation(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setitem(sys.modules, "testbed.emulation.network", None)  # import now fails
    r = CliRunner().invoke(main, ["bench", "transport", "--out", str(tmp_path)])
    assert r.exit_code != 0
    assert "the WAN path needs testbed.emulation.network" in r.output and "pass --no-wan" in r.output
    with pytest.raises(BenchError, match="needs testbed.emulation.network"):
        wan_suite("topologies/2dc.yaml", streams=[1], size=1, repeat=1, methods=["atlas"], log_dir=tmp_path)


def test_wan_path_needs_root(monkeypatch, tmp_path: Path) -> None:
    import testbed.emulation.network  # noqa: F401  (importable: the command gets to the root check)

    monkeypatch.setattr("os.geteuid", lambda: 1000)
    r = CliRunner().invoke(main, ["bench", "transport", "--out", str(tmp_path)])
    assert r.exit_code != 0 and "needs root" in r.output and "--no-wan" in r.output


@pytest.mark.parametrize("args, message", [
    (["--streams", "1,x"], "'x' is not a stream count"),
    (["--streams", "0"], "0 streams is outside 1..256"),
    (["--size", "3 bananas"], "unknown size unit"),
    (["--methods", "atlas,nccl"], "unknown method(s) nccl"),
    (["--no-loopback"], "leave nothing to measure"),
    (["--topology", "nowhere.yaml", "--no-loopback", "--no-wan"], "leave nothing to measure"),
])
def test_option_errors(args, message, tmp_path: Path) -> None:
    r = CliRunner().invoke(main, ["bench", "transport", "--no-wan", *args, "--out", str(tmp_path)])
    assert r.exit_code == 2 and message in r.output, r.output


def test_missing_topology_is_named(tmp_path: Path) -> None:
    r = CliRunner().invoke(main, ["bench", "transport", "--topology", "nowhere.yaml", "--out", str(tmp_path)])
    assert r.exit_code == 2 and "topology file nowhere.yaml not found" in r.output


def test_failed_worker_is_recorded_not_raised(tmp_path: Path) -> None:
    import subprocess

    def broken(argv, env, err):
        return subprocess.Popen([sys.executable, "-c", "import sys; sys.stderr.write('boom: no such method\\n')"],
                                stdout=subprocess.PIPE, stderr=err)

    m = measure_pair("loopback", "atlas", 1, 1024, 1, server_launch=broken, client_launch=broken,
                     server_ip="127.0.0.1", client_ip="127.0.0.1", secret="x", log_dir=tmp_path, timeout=10)
    assert m.goodput_mbps is None and m.verified is None
    assert "atlas server did not start" in m.error and "boom: no such method" in m.error
