"""The slowdown's decomposition (agents' overhead, prefill interference, network
noise) and the repeats' median and spread (testbed/run/metrics.py), and how the
summary, its table and the demo's rows read them."""

from __future__ import annotations

import math

import pytest

from testbed.run.metrics import (
    MetricsError,
    decompose_slowdown,
    decomposition_line,
    repeat_stats,
)
from testbed_core.contracts.summary import RepeatRun, SlowdownDecomposition


def test_parts_add_up_to_the_total() -> None:
    plain = [1.00, 1.02, 0.98, 1.00]
    idle = [1.01, 1.01, 1.01, 1.01]
    bt = [1.03, 1.03, 1.03, 1.03]
    d = decompose_slowdown(plain, bt, idle, waited_on_prefill_s=0.02, agents_cpu_cores=0.25)
    assert d.total == pytest.approx(0.03)
    assert d.agent_overhead == pytest.approx(0.01)
    assert d.prefill_interference == pytest.approx(0.02)
    assert d.agent_overhead + d.prefill_interference == pytest.approx(d.total)
    assert d.training_waited_on_prefill == pytest.approx(0.02 / 4 / 1.0)
    assert d.network_noise == pytest.approx(math.sqrt((0.02**2 * 2) / 3))  # sample stdev over the mean
    assert d.noise_on_total == pytest.approx(1.96 * d.network_noise / 2)  # bt has no spread
    assert d.idle_twin_iteration_time_s == pytest.approx(1.01) and d.agents_cpu_cores == 0.25


def test_without_idle_twin_the_overhead_is_unknown_not_zero() -> None:
    d = decompose_slowdown([1.0, 1.0], [1.1, 1.1], None, 0.0)
    assert d.total == pytest.approx(0.1)
    assert d.agent_overhead is None and d.prefill_interference is None
    assert d.idle_twin_iteration_times_s == []
    line = decomposition_line(d)
    assert "slowdown +10.0%" in line and "overhead" not in line


def test_one_iteration_has_no_noise_interval() -> None:
    d = decompose_slowdown([1.0], [1.0], [1.0], 0.0)
    assert d.noise_on_total is None and d.network_noise == 0.0


def test_no_iterations_is_an_error_that_says_what_is_missing() -> None:
    with pytest.raises(MetricsError, match="measured iterations of both the plain variant and its \\+bubbletea"):
        decompose_slowdown([], [1.0], None, 0.0)


def test_the_log_line_names_every_part() -> None:
    d = decompose_slowdown([1.0, 1.02], [1.05, 1.05], [1.02, 1.02], 0.01, agents_cpu_cores=0.3,
                           emulator_cpu_cores=1.1, cpu_weights="agents in cgroup v1 x at 0.1 of a normal cpu.shares")
    line = decomposition_line(d)
    for part in ("agents' overhead +1.0%", "prefill interference +3.0%", "training waited on prefill 0.5%",
                 "network noise", "(95%)", "agents 0.30", "emulator 1.10", "cgroup v1"):
        assert part in line, (part, line)


def _run(k: int, it: float, util: float, slow: float | None) -> RepeatRun:
    return RepeatRun(repeat=k, iteration_time_s=it, device_utilization=util, device_utilization_training=0.2,
                     training_slowdown=slow, folder=f"atlas/repeat-{k}")


def test_repeats_report_median_and_spread() -> None:
    r = repeat_stats([_run(1, 1.2, 0.93, 0.02), _run(2, 1.1, 0.95, -0.01), _run(3, 1.3, 0.90, 0.005)])
    assert r.median.iteration_time_s == pytest.approx(1.2) and r.spread.iteration_time_s == pytest.approx(0.2)
    assert r.median.device_utilization == pytest.approx(0.93)
    assert r.median.training_slowdown == pytest.approx(0.005)
    assert r.spread.training_slowdown == pytest.approx(0.03)
    assert r.median.agent_overhead is None  # no repeat measured it
    assert [x.repeat for x in r.runs] == [1, 2, 3]


def test_repeats_of_nothing_are_an_error() -> None:
    with pytest.raises(MetricsError, match="no repeat"):
        repeat_stats([])


def test_decomposition_refuses_unknown_keys() -> None:
    d = decompose_slowdown([1.0], [1.0], None, 0.0)
    data = d.model_dump()
    data["surprise"] = 1
    with pytest.raises(ValueError, match="surprise"):
        SlowdownDecomposition.model_validate(data)
