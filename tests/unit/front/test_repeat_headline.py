"""Repeated runs (runner.repeat, testbed run --repeat N): the summary's per-variant
repeats and their median, read by the run's table and the demo's rows; the
slowdown's decomposition in the demo's BubbleTea row."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import summary_builders as b  # noqa: E402

from testbed import demo as d  # noqa: E402
from testbed.run.metrics import decompose_slowdown, repeat_stats, summary_table  # noqa: E402
from testbed_core.contracts.summary import RepeatRun, Summary  # noqa: E402


def _runs(name: str, values: list[tuple[float, float, float | None]]) -> list[RepeatRun]:
    return [RepeatRun(repeat=k + 1, iteration_time_s=it, device_utilization=u, device_utilization_training=0.2,
                      training_slowdown=s, folder=name if k == 0 else f"{name}/repeat-{k + 1}")
            for k, (it, u, s) in enumerate(values)]


def _repeated() -> Summary:
    atlas = b.variant("atlas", 1.30, device_utilization=0.20, streams=8)
    atlas.repeats = repeat_stats(_runs("atlas", [(1.30, 0.20, None), (1.20, 0.21, None), (1.22, 0.19, None)]))
    bt = b.with_bubbletea(atlas, "atlas+bubbletea", iteration_time_s=1.40, device_utilization=0.90,
                          training_slowdown=0.077)
    bt.repeats = repeat_stats(_runs("atlas+bubbletea",
                                    [(1.40, 0.90, 0.077), (1.21, 0.94, 0.008), (1.22, 0.95, 0.0)]))
    bt.slowdown_decomposition = decompose_slowdown([1.2, 1.2], [1.21, 1.21], [1.206, 1.206], 0.0)
    return b.summary({"atlas": atlas, "atlas+bubbletea": bt})


def test_headline_is_the_median_of_the_repeats() -> None:
    s = _repeated()
    bt = s.result("atlas+bubbletea")
    assert bt.iteration_time_s == 1.40  # the first repeat's own figures stay
    assert bt.headline("iteration_time_s") == pytest.approx(1.22)
    assert bt.headline("device_utilization") == pytest.approx(0.94)
    assert bt.headline("training_slowdown") == pytest.approx(0.008)
    assert bt.headline("bubble_fraction") == bt.bubble_fraction  # not repeated: its own


def test_summary_with_repeats_reads_back() -> None:
    s = _repeated()
    back = Summary.model_validate_json(s.to_json())
    assert back.result("atlas+bubbletea").repeats.median.training_slowdown == pytest.approx(0.008)
    assert back.result("atlas+bubbletea").slowdown_decomposition.agent_overhead == pytest.approx(0.005)
    plain = Summary.model_validate_json(b.summary({"atlas": b.variant("atlas")}).to_json())
    assert "repeats" not in plain.to_json() and "slowdown_decomposition" not in plain.to_json()


def test_demo_row_reads_the_median_and_the_parts() -> None:
    rows = {r.measure: r for r in d.bubbletea_rows(_repeated())}
    slow = rows["training slowdown with BubbleTea"]
    assert slow.value == pytest.approx(0.008) and slow.ok is True
    assert "median of 3 repeats" in slow.note
    assert "agents' overhead +0.5%" in slow.note and "prefill +0.3%" in slow.note
    assert rows["utilization with BubbleTea (atlas+bubbletea)"].value == pytest.approx(0.94)


def test_run_table_says_it_shows_medians() -> None:
    table = summary_table(_repeated())
    assert "median over the repeats" in table
    assert "atlas+bubbletea: training slowdown +0.8%, utilization 94.0% (median of 3 repeats)" in table
    assert "  repeat 1: slowdown +0.8% = agents' overhead +0.5%" in table  # the decomposition is the first repeat's
    line = next(x for x in table.splitlines() if x.startswith("atlas+bubbletea "))
    assert "1.220" in line and "94%" in line


def test_a_repeated_run_reports_its_medians_and_speedups_from_them(tmp_path: Path) -> None:
    """results.csv (and the sweep's table and plots, which read it) take each repeated
    variant's median: interleaved repeats are what makes two close variants comparable."""
    from testbed.report.loading import load_results, result_rows

    s = _repeated()
    base = b.variant("baseline", 2.60)
    base.repeats = repeat_stats(_runs("baseline", [(2.60, 0.1, None), (2.44, 0.1, None), (2.40, 0.1, None)]))
    s.variants["baseline"] = base
    (tmp_path / "summary.json").write_text(s.to_json())
    _, rows = result_rows(load_results(tmp_path))
    by = {r["variant"]: r for r in rows}
    assert by["atlas"]["iteration_time_s"] == pytest.approx(1.22)  # the median, not the first repeat's 1.30
    assert by["atlas+bubbletea"]["training_slowdown"] == pytest.approx(0.008)
    assert by["baseline"]["atlas_speedup"] == pytest.approx(2.44 / 1.22)
    assert by["atlas"]["speedup_vs_baseline"] == pytest.approx(2.44 / 1.22)
    assert by["atlas"]["repeats.spread.iteration_time_s"] == pytest.approx(0.10)  # 1.30 - 1.20, beside it
