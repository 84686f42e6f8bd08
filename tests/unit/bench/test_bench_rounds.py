"""`testbed bench transport --rounds N`: targets judged on the median of per-round
ratios (each round pairs measurements taken moments apart), with the spread shown;
the table, JSON and plot summarise the rounds. Made-up numbers, no processes."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from testbed.bench import report
from testbed.bench.transport import Measurement
from testbed.cli import main


def rounds() -> list[Measurement]:
    # Round 1 is slow for everybody (a busy machine): the ratios stay near their usual values.
    goodput = {"atlas": [9000.0, 4000.0, 9500.0], "iperf3": [10000.0, 4100.0, 10000.0],
               "gloo": [8000.0, 4500.0, 8500.0], "tcp": [8500.0, 4000.0, 9000.0]}
    rows = []
    for r in range(3):
        for method, values in goodput.items():
            rows.append(Measurement("loopback", method, 1, values[r], True, 1, 1 << 20, [values[r]], round=r,
                                    cpu_ms_per_gib=500.0 + 10 * r))
    return rows


def test_checks_use_per_round_ratios_and_report_the_spread() -> None:
    found = {c.name: c for c in report.checks(rounds())}
    iperf = found["atlas N=1 / iperf3 -P 1"]
    assert iperf.ratios == pytest.approx([0.9, 4000 / 4100, 0.95])
    assert iperf.ratio == pytest.approx(0.95) and iperf.ok
    assert iperf.spread == "0.90..0.98 over 3 rounds"
    gloo = found["atlas N=1 / gloo"]
    assert gloo.ratios == pytest.approx([9000 / 8000, 4000 / 4500, 9500 / 8500])
    assert gloo.ratio == pytest.approx(9500 / 8500) and gloo.ok
    assert "median 9000 Mbit/s vs 8000 Mbit/s" in gloo.detail
    d = gloo.as_dict()
    assert d["min"] == pytest.approx(4000 / 4500) and d["max"] == pytest.approx(9000 / 8000)


def test_one_round_keeps_the_plain_ratio() -> None:
    rows = [m for m in rounds() if m.round == 0]
    c = next(c for c in report.checks(rows) if c.name == "atlas N=1 / iperf3 -P 1")
    assert c.ratio == pytest.approx(0.9) and c.spread == "" and c.detail == "9000 Mbit/s vs 10000 Mbit/s"


def test_summary_table_json_and_plot(tmp_path: Path) -> None:
    rows = rounds()
    rows.append(Measurement("loopback", "atlas", 2, None, None, 2, 1 << 20, round=0, error="atlas client failed"))
    rows.append(Measurement("loopback", "atlas", 2, 15000.0, True, 2, 1 << 20, [15000.0], round=1))
    summary = {(m.method, m.streams): m for m in report.summarize(rows)}
    assert summary[("atlas", 1)].goodput_mbps == 9000.0 and summary[("atlas", 1)].samples_mbps == [9000, 4000, 9500]
    assert summary[("atlas", 2)].goodput_mbps == 15000.0 and summary[("atlas", 2)].cpu_ms_per_gib is None
    assert summary[("atlas", 1)].cpu_ms_per_gib == 510.0  # median over rounds
    assert summary[("atlas", 2)].error == "round 0: atlas client failed"
    text = report.table(rows, report.checks(rows))
    assert "per round (3 rounds)" in text and "CPU ms/GiB" in text
    assert "loopback  atlas         1          9000.0        510       yes  9000, 4000, 9500" in text
    assert "0.95 (target >= 0.9; median 9000 Mbit/s vs 10000 Mbit/s; 0.90..0.98 over 3 rounds)" in text
    doc = report.as_json(rows, report.checks(rows), {})
    assert len(doc["results"]) == 14 and {r["round"] for r in doc["results"]} == {0, 1, 2}
    assert len(doc["summary"]) == 5
    report.write_csv(rows, tmp_path / "r.csv")
    assert (tmp_path / "r.csv").read_text().splitlines()[0].endswith(",error,round,cpu_ms_per_gib")
    report.plot(rows, tmp_path / "g.png")
    assert (tmp_path / "g.png").read_bytes()[:4] == b"\x89PNG"


def test_rounds_option_is_bounded(tmp_path: Path) -> None:
    r = CliRunner().invoke(main, ["bench", "transport", "--no-wan", "--rounds", "0", "--out", str(tmp_path)])
    assert r.exit_code == 2 and "Invalid value for '--rounds': 0 is not in the range 1<=x<=50" in r.output
