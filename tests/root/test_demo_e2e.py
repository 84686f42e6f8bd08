"""`testbed demo` end to end, reduced to about a minute: the real transport bench
across the emulated WAN and the real quickstart run (fewer variants and
iterations, no calibration), then the table and files. It checks that every figure
the demo reads is there (the runner's and the bench's key names), not how fast
anything was."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from testbed import demo as d

pytestmark = [pytest.mark.root, pytest.mark.slow, pytest.mark.timeout(300)]

REDUCED = d.DemoConfig(
    overrides={"workload.iterations": 1, "workload.warmup": 1, "runner.calibrate": False,  # the demo reads
               # no calibrated figure (per-path calibration: tests/root/test_run_2dc.py)
               "runner.bubbletea_idle_twin": False},  # the decomposition: tests/root/test_bubbletea_run.py
    variants=("baseline", "atlas", "atlas+bubbletea"),
    bench_size=8 << 20,
    iperf_seconds=1.0,
)


def test_reduced_demo_end_to_end(tmp_path: Path) -> None:
    problems = d.probe_prerequisites(REDUCED)
    if problems:
        pytest.skip("; ".join(problems))
    said: list[str] = []
    outcome = d.run_demo(REDUCED, tmp_path, d.PlannedProgress(REDUCED.expected_steps(), enabled=False),
                         echo=said.append)
    assert outcome.failed == [], outcome.table
    rows = {r.measure: r for r in outcome.rows}

    a1, a8 = rows["atlas, 1 stream"].value, rows["atlas, 8 streams"].value
    assert a1 and a8  # measured and verified; how much faster 8 are: tests/floors/test_wan_striping.py
    print(f"\natlas across the WAN: 1 stream {a1:.0f} Mbit/s, 8 streams {a8:.0f} Mbit/s")
    assert rows["iperf3 -P 8 (the link)"].value
    assert rows["atlas N=8 / iperf3 -P 8"].value is not None

    speed = rows["atlas / baseline iteration time"]
    assert speed.value is not None and 0 < speed.value, outcome.table

    bt = rows["utilization with BubbleTea (atlas+bubbletea)"]
    if d.bubbletea_unavailable() is None:
        assert bt.value is not None and 0 < bt.value <= 1, outcome.table
        assert rows["utilization without BubbleTea (atlas)"].value is not None
        assert rows["training slowdown with BubbleTea"].value is not None
    else:
        assert bt.value is None and "not run" in bt.note

    for name in ("demo.json", "demo.csv", "demo.txt", "demo.png", "transport/results.json",
                 "transport/goodput.png", "quickstart/summary.json"):
        assert (tmp_path / name).is_file(), name
    meta = json.loads((tmp_path / "demo.json").read_text())["meta"]
    assert meta["variants"][:2] == ["baseline", "atlas"]
    again, _ = d.load_rows(tmp_path)
    assert [r.record() for r in again] == [r.record() for r in outcome.rows]
