"""`testbed whatif` (one topology and grid mode), the grid file, BubbleTea's prefill
capacity, the calibration from a run folder, DCs given as GPU counts, and every error
a user can reach there, checked by its message."""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml
from click.testing import CliRunner

from testbed.commands.whatif import whatif
from testbed_core.contracts.calibration import Calibration
from testbed_core.topology import TopologyError, parse_topology
from testbed_core.whatif.calibration import CalibrationError, load_efficiencies
from testbed_core.whatif.grid import GridError, PointError, load_grid, point_setup, points
from testbed_core.whatif.predict import Gaps
from testbed_core.whatif.prefill import prefill_capacity

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(Path(__file__).resolve().parent))  # summary_builders.py, beside this file
import summary_builders as builders  # noqa: E402  (the summaries the front's tests build through the contract)

TOPO = str(ROOT / "topologies/2dc.yaml")
WORKLOAD = str(ROOT / "scenarios/workloads/gpt-1.3b.yaml")


def test_whatif_prints_every_variant() -> None:
    res = CliRunner().invoke(whatif, ["--topology", TOPO, "--workload", WORKLOAD])
    assert res.exit_code == 0, res.output
    for name in ("baseline", "multi-tcp", "atlas", "dp-across-dc"):
        assert name in res.output
    assert "prefill tok/s" in res.output and "predicted in" in res.output


def test_whatif_json_has_the_figures_of_each_variant() -> None:
    res = CliRunner().invoke(whatif, ["--topology", TOPO, "--workload", WORKLOAD, "--variants", "baseline,atlas",
                                      "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    rows = {v["variant"]: v for v in doc["variants"]}
    assert set(rows) == {"baseline", "atlas"}
    for r in rows.values():
        assert r["iteration_s"] > r["compute_only_s"] > 0
        assert 0 < r["utilization"] < r["utilization_with_bubbletea"] <= 1
        assert r["wan_bytes"] > 0 and r["prefill_tokens_per_s"] > 0
    assert rows["atlas"]["iteration_s"] < rows["baseline"]["iteration_s"]


@pytest.mark.parametrize("args, message", [
    ([], "give --topology and --workload, or --grid"),
    (["--grid", "g.yaml", "--topology", TOPO], "--grid takes its topologies, DC sizes and workload"),
    (["--grid", "g.yaml", "--gpus", "dc1=4"], "drop --topology/--workload/--gpus"),
    (["--calibration", "/nonexistent-run"], "no summary.json"),
    (["--topology", TOPO, "--workload", WORKLOAD, "--variants", "atlas,nope"], "unknown variant(s) nope"),
    (["--topology", TOPO, "--workload", WORKLOAD, "--streams", "0"], "streams must be between 1 and 64"),
    (["--topology", TOPO, "--workload", WORKLOAD, "--gpus", "dc9=4"], "unknown DC 'dc9'"),
    (["--topology", "nope.yaml", "--workload", WORKLOAD], "no such topology file"),
])
def test_whatif_usage_errors_say_what_to_do(args: list[str], message: str) -> None:
    res = CliRunner().invoke(whatif, args)
    assert res.exit_code != 0
    assert message in res.output


def test_a_bad_thread_count_in_the_environment_is_refused_by_name(monkeypatch) -> None:
    monkeypatch.setenv("TESTBED_WHATIF_THREADS", "all")
    res = CliRunner().invoke(whatif, ["--topology", TOPO, "--workload", WORKLOAD])
    assert res.exit_code == 1
    assert ("Error: $TESTBED_WHATIF_THREADS='all' is not a count: set a whole number >= 1 (1 runs one stride at a "
            "time) or unset it") in res.output


def test_a_variant_that_cannot_be_placed_says_why_once() -> None:
    res = CliRunner().invoke(whatif, ["--topology", TOPO, "--workload", WORKLOAD, "--gpus", "dc1=8,dc2=1"])
    assert res.exit_code == 0, res.output
    assert ("baseline     infeasible: the even placement puts more GPUs in a DC than it has (dc2 needs 2, has 1)"
            in res.output)
    assert "infeasible: infeasible" not in res.output


def test_whatif_all_variants_infeasible_says_why() -> None:
    res = CliRunner().invoke(whatif, ["--topology", TOPO, "--workload", WORKLOAD, "--gpus", "dc1=1,dc2=1"])
    assert res.exit_code != 0
    assert "no variant can be placed" in res.output and "infeasible" in res.output


# ------------------------------------------------------------------ grid mode

def _grid_file(tmp_path: Path, **over) -> Path:
    data = {
        "name": "tiny", "workload": str(ROOT / "scenarios/workloads/gpt-1.3b.yaml"), "pp": 4, "tp": 1,
        "variants": ["baseline", "atlas", "dp-across-dc"],
        "grid": {"gpus": [8, 16], "dcs": [2], "rtt": ["20ms"], "bandwidth": ["1Gbit"]},
    }
    data.update(over)
    path = tmp_path / "grid.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_grid_writes_csv_points_and_plot(tmp_path: Path) -> None:
    out = tmp_path / "out"
    res = CliRunner().invoke(whatif, ["--grid", str(_grid_file(tmp_path)), "--out", str(out)])
    assert res.exit_code == 0, res.output
    rows = list(csv.DictReader((out / "results.csv").open()))
    assert len(rows) == 2 * 1 * 1 * 1 * 3  # points x variants
    atlas = [r for r in rows if r["variant"] == "atlas"]
    assert all(r["feasible"] == "True" and float(r["speedup_vs_baseline"]) > 0 for r in atlas)
    assert {int(r["dp"]) for r in rows} == {2, 4}
    assert (out / "whatif.png").stat().st_size > 10_000
    assert len(json.loads((out / "points.json").read_text())["points"]) == 2


def test_grid_point_topology_splits_stages_largest_first() -> None:
    grid, wl = load_grid(ROOT / "scenarios/whatif-scale.yaml")
    assert min(grid.grid.gpus) == 64 and max(grid.grid.gpus) == 16384
    assert min(grid.grid.dcs) == 2 and max(grid.grid.dcs) == 8
    pt = next(p for p in points(grid) if p.gpus == 1024 and p.dcs == 3) if 3 in grid.grid.dcs else None
    pt = pt or next(p for p in points(grid) if p.gpus == 1024 and p.dcs == 4)
    topo, point_wl = point_setup(grid, wl, pt)
    dp = 1024 // (grid.pp * grid.tp)
    assert point_wl.parallelism.dp == dp
    sizes = [dc.gpus for dc in topo.dcs]
    assert sum(sizes) == 1024 and sizes == sorted(sizes, reverse=True)
    assert all(link.rate == pt.bandwidth_bps and link.delay == pt.rtt_s / 2 for link in topo.wan)


@pytest.mark.parametrize("over, message", [
    ({"pp": 2, "grid": {"gpus": [8], "dcs": [3], "rtt": ["1ms"], "bandwidth": ["1Gbit"]}},
     "more than pp=2 stages"),
    ({"variants": ["atlas", "nope"]}, "unknown variant(s) nope"),
    ({"grid": {"gpus": [8], "dcs": [2], "rtt": ["1ms"], "bandwidth": ["1Gbyte"]}}, "unknown rate unit"),
    ({"workload": "missing.yaml"}, "no such workload file"),
    ({"tp": 3}, "does not divide the model's 16 heads"),
    ({"colour": "red"}, "colour"),
])
def test_grid_file_errors_name_the_field(tmp_path: Path, over: dict, message: str) -> None:
    with pytest.raises(GridError, match="grid.yaml") as info:
        load_grid(_grid_file(tmp_path, **over))
    assert message in str(info.value)


def test_grid_point_that_cannot_be_built_is_reported_per_variant(tmp_path: Path) -> None:
    path = _grid_file(tmp_path, grid={"gpus": [6], "dcs": [2], "rtt": ["1ms"], "bandwidth": ["1Gbit"]})
    out = tmp_path / "o"
    res = CliRunner().invoke(whatif, ["--grid", str(path), "--out", str(out)])
    assert res.exit_code == 0, res.output
    rows = list(csv.DictReader((out / "results.csv").open()))
    assert rows and all("not a multiple of pp x tp = 4" in r["error"] for r in rows)


# ------------------------------------------------------------------ prefill capacity

def test_prefill_fills_whole_chunks_then_the_largest_that_fits() -> None:
    def cost(tokens: int) -> float:  # 1 ms per 32 tokens
        return tokens / 32 * 1e-3

    # a 40 ms gap: with a 10% guard a 512-token chunk needs 17.6 ms -> 2 chunks (35.2 ms),
    # then 4.8 ms left: 128 tokens need 4.4 ms, 160 need 5.5 ms -> 128
    gaps = Gaps(np.array([0.040, 0.001]), np.array([3.0, 1.0]))
    cap = prefill_capacity(gaps, iteration_s=0.1, devices=4, training_busy_s=0.05, cost=cost,
                           chunk_tokens=512, min_tokens=32, guard=0.1)
    assert cap.tokens_per_iteration == 3 * (2 * 512 + 128)
    assert cap.tokens_per_s == pytest.approx(3 * 1152 / 0.1)
    assert cap.busy_s_per_iteration == pytest.approx(3 * (2 * 0.016 + 0.004))
    assert cap.utilization_with_prefill == pytest.approx((4 * 0.05 + 3 * 0.036) / 0.4)


def test_prefill_refuses_impossible_chunks() -> None:
    with pytest.raises(ValueError, match="min_tokens"):
        prefill_capacity(Gaps(np.array([1.0]), np.array([1.0])), 1, 1, 0, lambda n: 1e-3, chunk_tokens=16,
                         min_tokens=32)


# ------------------------------------------------------------------ calibration

def _run_folder(tmp_path: Path, *, calibrated: bool = True) -> Path:
    """A run folder as `testbed run` leaves it, built through the contracts."""
    folder = tmp_path / "run"
    folder.mkdir()
    cal = Calibration(src="dc1-h1", dst="dc2-h1", nbytes=8_388_608, latency_s=0.025,
                      rates_bps={1: 108e6, 8: 700e6}, concurrent=2, colliding_bps={8: 420e6})
    summary = builders.summary({"atlas": builders.variant("atlas", 2.1)},
                               calibration=cal.report() if calibrated else None,
                               runner={"local": False, "temporal_mode": "token", "token_margin": 0.2})
    (folder / "summary.json").write_text(summary.to_json())
    scenario = yaml.safe_load((ROOT / "scenarios/atlas-2dc.yaml").read_text())
    scenario["topology"] = yaml.safe_load((ROOT / "topologies/2dc.yaml").read_text())
    scenario["workload"] = yaml.safe_load((ROOT / "scenarios/workloads/gpt-1.3b.yaml").read_text())
    (folder / "scenario.resolved.yaml").write_text(yaml.safe_dump(scenario))
    return folder


def test_a_run_with_the_turns_probe_carries_its_measured_holds(tmp_path: Path) -> None:
    """A run whose calibration timed the primary path as a plan uses it carries the
    plan's measured hold over the alone wire time (the slower way), not the token
    margin alone."""
    from testbed_core.contracts.calibration import PathCalibration, TurnsCalibration

    folder = _run_folder(tmp_path)
    # alone: 8 streams in 25 ms one way + 40 ms on the wire; planned 48 ms holds; the
    # turns probe's transfers 25 + 40 ms one way (on time) and 25 + 70 ms back (75 ms held)
    pc = PathCalibration(dcs=("dc1", "dc2"), src="dc1-h1", dst="dc2-h1", nbytes=8_388_608, latency_s=0.025,
                         rates_bps={1: 108e6, 8: 700e6}, transfer_s={8: [0.065]}, concurrent=2,
                         colliding_bps={8: 420e6},
                         turns=[TurnsCalibration(streams=8, channels=2, slot_s=0.048, untimed=8,
                                                 transfer_s=[0.065], return_s=[0.095])])
    cal = Calibration(src="dc1-h1", dst="dc2-h1", nbytes=8_388_608, latency_s=0.025, paths=[pc])
    cal.mirror_primary()
    data = json.loads((folder / "summary.json").read_text())
    data["calibration"] = json.loads(cal.report().model_dump_json())
    (folder / "summary.json").write_text(json.dumps(data))
    eff = load_efficiencies(folder)
    assert eff.temporal_hold == pytest.approx(0.075 / 0.040)
    # that way's bytes were 70 ms on the wire (95 less the 25 ms delay): they arrive then
    assert eff.temporal_wire == pytest.approx(0.070 / 0.040)
    (tmp_path / "plain").mkdir()
    assert load_efficiencies(_run_folder(tmp_path / "plain")).temporal_wire is None  # no turns probe


KEPT = ROOT / "results/prediction-errors/head-1205/runs"


@pytest.mark.parametrize("run", ["atlas-2dc", "bubbletea-soak"])
def test_a_runs_calibration_reproduces_its_temporal_plans_prediction(run: str) -> None:
    """A kept run whose calibration timed its path as a plan uses it (the turns probe),
    Atlas on a temporal plan: `testbed whatif --calibration` of the run predicts the run's
    own setting as the run's planner does now (testbed/report/replan.py, from the same
    calibration): a planned transfer's bytes arrive after their time on the wire, its
    link held for the hold. Holding the bytes to the hold's end (before) came out 1.6%
    slower on both."""
    from testbed.report.replan import replan_run
    from testbed_core.planning.network import NetParams
    from testbed_core.whatif.calibration import run_setting
    from testbed_core.whatif.evaluate import evaluate

    folder = KEPT / run
    planned = {r.name: r.setup.prediction for r in replan_run(folder)}["atlas"]
    assert planned is not None and planned.sharing == "temporal"
    cal = load_efficiencies(folder)
    assert cal.temporal_wire is not None and 1.0 < cal.temporal_wire < cal.temporal_hold
    topo, workload = run_setting(folder)
    (atlas,) = evaluate(topo, workload, ["atlas"], calibration=cal, net=NetParams(allreduce=False))
    assert atlas.sharing == "temporal"
    assert atlas.iteration_s == pytest.approx(planned.iteration_time_s, rel=0.002)
    (held,) = evaluate(topo, workload, ["atlas"], calibration=cal.model_copy(update={"temporal_wire": None}),
                       net=NetParams(allreduce=False))
    assert held.iteration_s > planned.iteration_time_s * 1.01


def test_calibration_ratios_from_a_run_folder(tmp_path: Path) -> None:
    eff = load_efficiencies(_run_folder(tmp_path))
    # 2dc: rmem 1 MB x 0.66 advertised over 50 ms RTT: 105.6 Mbit/s modelled, 108 measured
    assert eff.flow_efficiency == pytest.approx(108e6 / (0.66e6 * 8 / 0.05))
    assert eff.link_efficiency == pytest.approx(0.7)
    assert eff.crowded_fraction == pytest.approx(0.6)
    assert eff.temporal_hold == pytest.approx(1.2)  # the run's token margin
    topo = parse_topology(yaml.safe_load((ROOT / "topologies/2dc.yaml").read_text()))
    from testbed_core.planning.network import NetParams

    calibrated, net = eff.apply(topo, NetParams())
    assert calibrated.wan[0].rate == pytest.approx(0.7e9)
    assert net.crowded_fraction == pytest.approx(0.6)
    res = CliRunner().invoke(whatif, ["--topology", TOPO, "--workload", WORKLOAD, "--calibration",
                                      str(tmp_path / "run")])
    assert res.exit_code == 0, res.output
    assert "calibrated by" in res.output and "link goodput x0.70" in res.output


def test_calibration_errors_say_what_is_missing(tmp_path: Path) -> None:
    with pytest.raises(CalibrationError, match="no summary.json"):
        load_efficiencies(tmp_path)
    folder = _run_folder(tmp_path, calibrated=False)
    with pytest.raises(CalibrationError, match="has no WAN calibration"):
        load_efficiencies(folder)
    res = CliRunner().invoke(whatif, ["--topology", TOPO, "--workload", WORKLOAD, "--calibration", str(folder)])
    assert res.exit_code != 0 and "--calibration:" in res.output


# ------------------------------------------------------------------ DCs as GPU counts

def test_dc_sizes_as_gpu_counts_and_the_emulation_refuses_them() -> None:
    topo = parse_topology({"name": "big", "dcs": [{"name": "a", "gpus": 2048}, {"name": "b", "hosts": 2}],
                           "wan": [{"between": ["a", "b"], "rate": "10Gbit", "delay": "10ms"}]})
    assert [dc.gpu_count(4) for dc in topo.dcs] == [2048, 8]
    with pytest.raises(TopologyError, match=r"a \(2048 GPUs\) are given as GPU counts.*Give each DC `hosts:`"):
        topo.require_emulable()


@pytest.mark.parametrize("dc, message", [
    ({"name": "a", "gpus": 8, "hosts": 2}, "give either hosts"),
    ({"name": "a"}, "give hosts (a count or names, to emulate it) or gpus"),
    ({"name": "a", "gpus": 0}, "greater than or equal to 1"),
])
def test_dc_needs_hosts_or_gpus(dc: dict, message: str) -> None:
    with pytest.raises(TopologyError) as info:
        parse_topology({"name": "t", "dcs": [dc]})
    assert message in str(info.value)


def test_calibration_alone_predicts_the_runs_own_setting(tmp_path: Path) -> None:
    folder = _run_folder(tmp_path)
    res = CliRunner().invoke(whatif, ["--calibration", str(folder), "--variants", "atlas", "--no-allreduce"])
    assert res.exit_code == 0, res.output
    assert "on 2dc" in res.output and "hold links x1.20" in res.output


def test_grid_point_whose_workload_breaks_a_rule_says_which(tmp_path: Path) -> None:
    wl = yaml.safe_load((ROOT / "scenarios/workloads/gpt-1.3b.yaml").read_text())
    wl["parallelism"].update(schedule="interleaved-1f1b", chunks=2, pp=2, num_micro_batches=4)
    (tmp_path / "il.yaml").write_text(yaml.safe_dump(wl))
    grid, base = load_grid(_grid_file(tmp_path, workload="il.yaml", pp=3,
                                      grid={"gpus": [6], "dcs": [2], "rtt": ["1ms"], "bandwidth": ["1Gbit"]}))
    with pytest.raises(PointError, match=r"num_micro_batches \(4\) to be a multiple of pp \(3\)"):
        point_setup(grid, base, points(grid)[0])


def test_plan_uses_the_fast_predictor_and_exact_on_request() -> None:
    from testbed.commands.plan import plan

    docs = {}
    for extra in ([], ["--exact"]):
        res = CliRunner().invoke(plan, ["--topology", TOPO, "--workload", WORKLOAD, "--json", *extra])
        assert res.exit_code == 0, res.output
        docs[bool(extra)] = json.loads(res.output)
    assert (docs[False]["predictor"], docs[True]["predictor"]) == ("fast", "exact")
    for name, fast in docs[False]["variants"].items():
        exact = docs[True]["variants"][name]
        assert fast["predicted_iteration_time_s"] == pytest.approx(exact["predicted_iteration_time_s"], rel=1e-9)
        assert fast["sharing"] == exact["sharing"]
        assert bool(fast["temporal_plan"]) == bool(exact["temporal_plan"])
