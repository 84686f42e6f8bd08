"""Bad input refused before anything is built (testbed/run/preflight.py): a variant
whose placement does not fit says which pp or dp would, and a run whose processes
would not fit in the machine's memory says what would (the largest workload.scale,
or fewer workers), each naming the file and the field."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from testbed.cli import main
from testbed.run.preflight import (
    MEMORY_SHARE,
    PROCESS_BYTES,
    available_memory_bytes,
    memory_estimate,
    memory_problem,
    placement_problem,
    point_memory_problem,
    preflight,
)
from testbed.run.scenario import load_scenario
from testbed.run.variants import run_variants
from testbed_core.constants import TOPOLOGIES_DIR, WORKLOADS_DIR
from testbed_core.planning.schedule import activation_memory_bytes

GiB = 1 << 30


@pytest.fixture
def scenario_file(tmp_path: Path) -> Path:
    doc = {"name": "refused", "topology": str(TOPOLOGIES_DIR / "2dc.yaml"),
           "workload": str(WORKLOADS_DIR / "gpt-1.3b.yaml"), "variants": ["baseline", "atlas"],
           "runner": {"local": True, "dp_allreduce": False}}
    path = tmp_path / "scenario.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def _load(path: Path, **sets: object):
    scenario, _ = load_scenario(path, dict(sets))
    return scenario, run_variants(scenario)


def test_placement_that_does_not_fit_names_the_field_and_what_fits(scenario_file: Path) -> None:
    scenario, runs = _load(scenario_file, **{"workload.parallelism.pp": 8})
    msg = placement_problem(runs[0], scenario)
    assert msg is not None
    assert msg.startswith("variant baseline: ")
    assert "gpt-1.3b.yaml: workload.parallelism (pp=8, dp=2, tp=1) cannot be placed by placement even" in msg
    assert "GPUs per DC: dc1: 2, dc2: 2" in msg
    assert "infeasible: the even placement puts more GPUs in a DC than it has" in msg
    assert "what would fit: workload.parallelism.pp: 2 (with dp=2) or workload.parallelism.dp: 1 (with pp=8)" \
        not in msg  # pp=8 with dp=1 needs 8 GPUs: it does not fit either
    assert "what would fit: workload.parallelism.pp: 2 (with dp=2)" in msg
    assert "--gpus" not in msg  # a `testbed plan` option, not one of `testbed run`
    assert placement_problem(runs[0], _load(scenario_file)[0]) is None


def test_variant_that_cannot_be_placed_says_which_dp_fits(scenario_file: Path) -> None:
    scenario, _ = _load(scenario_file, **{"workload.parallelism.dp": 3, "runner.dp_allreduce": True})
    (run,) = run_variants(scenario, ["dp-across-dc"])
    msg = placement_problem(run, scenario)
    assert msg is not None
    assert "variant dp-across-dc: " in msg and "cannot be placed by placement dp-across" in msg
    assert "only 2 of 3 pipelines fit" in msg
    assert "what would fit: workload.parallelism.dp: 2 (with pp=2)" in msg


def test_no_smaller_shape_fits(scenario_file: Path, tmp_path: Path) -> None:
    doc = yaml.safe_load(scenario_file.read_text())
    doc["topology"] = {"name": "one-each", "dcs": [{"name": "dc1", "hosts": 1}, {"name": "dc2", "hosts": 1}],
                       "wan": [{"between": ["dc1", "dc2"], "rate": "1Gbit", "delay": "5ms"}]}
    scenario_file.write_text(yaml.safe_dump(doc))
    scenario, runs = _load(scenario_file, **{"workload.parallelism.pp": 4})
    msg = placement_problem(runs[0], scenario)
    assert msg is not None and "no smaller pp or dp fits either" in msg
    assert "the topology's dcs[].hosts" in msg


def test_memory_estimate_parts(scenario_file: Path) -> None:
    scenario, runs = _load(scenario_file)
    est = memory_estimate(scenario, runs)
    assert est.workers == 4
    wire = round(2048 * 2048 * 2 * 0.1)  # micro_batch x seq_len x hidden x bf16 x the workload's scale 0.1
    assert est.scaled == pytest.approx(4 * (1 + 2 * 8 + 2) * wire, abs=4 * 19)  # sent, waiting, in flight
    assert est.parts["processes"] >= 5 * PROCESS_BYTES
    assert "all-reduce buffers" not in est.parts  # dp_allreduce is off
    half, _ = _load(scenario_file, **{"workload.scale": 0.05})
    assert memory_estimate(half, runs).scaled == pytest.approx(est.scaled / 2, abs=4 * 19)
    with_ar, _ = _load(scenario_file, **{"runner.dp_allreduce": True})
    assert memory_estimate(with_ar, runs).parts["all-reduce buffers"] == 4 * 2 * (25 << 20)


def test_memory_refusal_says_which_scale_fits(scenario_file: Path) -> None:
    scenario, runs = _load(scenario_file)
    est = memory_estimate(scenario, runs)
    fixed = est.total - est.scaled
    avail = int((fixed + est.scaled // 4) / MEMORY_SHARE)  # a quarter of the tensors fits
    msg = memory_problem(scenario, runs, avail)
    assert msg is not None
    assert msg.startswith(f"{WORKLOADS_DIR / 'gpt-1.3b.yaml'}: the run would need about ")
    assert "4 workers, pp x dp = 2 x 2" in msg and f"{MEMORY_SHARE:.0%} of the" in msg
    assert "workload.scale: at 0.1 each worker holds about" in msg
    assert "workload.parallelism.num_micro_batches, now 8" in msg
    fit = float(re.search(r"what would fit: workload.scale <= ([0-9.]+) ", msg).group(1))
    assert 0.02 <= fit <= 0.025  # a quarter of 0.1, rounded down to two significant digits
    fits, _ = _load(scenario_file, **{"workload.scale": fit})
    assert memory_problem(fits, runs, avail) is None  # what it says fits does fit
    assert memory_problem(scenario, runs, int(est.total / MEMORY_SHARE) + 1) is None


def test_memory_refusal_when_the_processes_alone_do_not_fit(scenario_file: Path) -> None:
    scenario, runs = _load(scenario_file)
    msg = memory_problem(scenario, runs, PROCESS_BYTES * 3)
    assert msg is not None and "workload.parallelism: even the smallest run (pp=2, dp=1) would not fit" in msg
    tiny_wl, _ = _load(scenario_file, **{"workload.scale": 0.0001})
    est = memory_estimate(tiny_wl, runs)
    msg = memory_problem(tiny_wl, runs, int((est.total - est.scaled) * 0.95 / MEMORY_SHARE))
    assert msg is not None and "the processes alone exceed it; what would fit: at most about 3 workers" in msg


def test_real_mode_counts_the_model_and_its_activations(tmp_path: Path) -> None:
    doc = {"name": "real", "topology": str(TOPOLOGIES_DIR / "2dc.yaml"),
           "workload": str(WORKLOADS_DIR / "tiny.yaml"), "variants": ["atlas"], "runner": {"local": True}}
    path = tmp_path / "real.yaml"
    path.write_text(yaml.safe_dump(doc))
    scenario, runs = _load(path, **{"workload.gpu.mode": "real"})
    est = memory_estimate(scenario, runs)
    assert est.parts["model state"] > 0 and est.parts["reference"] > PROCESS_BYTES
    # Korthikanti et al.: s b h (34 + 5 a s / h) bytes in 16-bit; fp32 doubles it
    assert activation_memory_bytes(scenario.workload) == int(32 * 2 * 64 * (34 + 5 * 4 * 32 / 64) * 4 / 2)
    assert est.parts["activations"] == 4 * 2 * 2 * activation_memory_bytes(scenario.workload)
    msg = memory_problem(scenario, runs, int((est.total - est.parts["processes"]) / MEMORY_SHARE))
    assert msg is not None and "workload.model: what would fit: a smaller model or micro_batch" in msg


def test_bubbletea_agents_are_counted(scenario_file: Path) -> None:
    scenario, runs = _load(scenario_file)
    with_bt, bt_runs = _load(scenario_file, **{"bubbletea.enabled": True})
    assert memory_estimate(with_bt, bt_runs).parts["bubbletea"] > 4 * PROCESS_BYTES
    assert "bubbletea" not in memory_estimate(scenario, runs).parts


def test_available_memory_is_read_from_meminfo(tmp_path: Path) -> None:
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       24683688 kB\nMemAvailable:   21000000 kB\n")
    assert available_memory_bytes(meminfo) == 21000000 * 1024
    meminfo.write_text("MemTotal: 1 kB\n")
    assert available_memory_bytes(meminfo) is None
    assert available_memory_bytes(tmp_path / "missing") is None


def test_preflight_and_run_refuse_a_run_that_exceeds_memory(scenario_file: Path, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    scenario, _ = _load(scenario_file)
    est = memory_estimate(scenario, run_variants(scenario))
    small = int((est.total - est.scaled / 2) / MEMORY_SHARE)  # half the tensors fit
    problems = preflight(scenario, machine=False, available_bytes=small)
    assert len(problems) == 1 and re.search(r"what would fit: workload.scale <= 0.0(5|49) ", problems[0])
    assert preflight(scenario, machine=False, available_bytes=64 * GiB) == []
    assert point_memory_problem(scenario, small) == problems[0]

    import testbed.run.preflight as pre

    monkeypatch.setattr(pre, "available_memory_bytes", lambda meminfo="/proc/meminfo": small)
    monkeypatch.chdir(tmp_path)
    res = CliRunner().invoke(main, ["run", str(scenario_file)])
    assert res.exit_code == 1 and "this run cannot start (nothing was built)" in res.output
    assert "what would fit: workload.scale <=" in res.output
    assert not (tmp_path / "results").exists()


def test_a_sweep_point_that_exceeds_memory_is_refused_when_loaded(scenario_file: Path, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    import testbed.run.preflight as pre
    from testbed.sweep import SweepError, load_sweep

    scenario, runs = _load(scenario_file)
    est = memory_estimate(scenario, runs)
    small = int((est.total - est.scaled / 2) / MEMORY_SHARE)  # scale 0.05 fits, 0.1 does not
    monkeypatch.setattr(pre, "available_memory_bytes", lambda meminfo="/proc/meminfo": small)
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(f"name: scales\nbase: {scenario_file}\nparameters:\n  workload.scale: [0.01, 0.1]\n")
    with pytest.raises(SweepError) as info:
        load_sweep(sweep)
    msg = str(info.value)
    assert "point p002-scale=0.1 (workload.scale=0.1) cannot run (nothing was built)" in msg
    assert "what would fit: workload.scale <=" in msg
