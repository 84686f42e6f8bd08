"""Atlas's scheduling (runner.atlas_schedule, testbed/run/variants.py and
testbed_core/planning/schedule.py): each pipeline schedule the devices can hold is
planned and predicted, and another than the configured one runs only where it is
predicted faster by more than SCHEDULE_MARGIN. The paper sweep's case: a pipeline
boundary across a long round trip, 8 micro-batches over pp = 4, where 1F1B makes each
group of micro-batches wait for a round trip and GPipe overlaps them."""

from __future__ import annotations

from pathlib import Path

import pytest

from testbed.run.scenario import load_scenario
from testbed.run.variants import SCHEDULE_MARGIN, plan_variant, requested_schedule
from testbed_core.planning.schedule import (
    STATE_BYTES_PER_PARAM,
    activation_memory_bytes,
    device_memory_bytes,
    in_flight,
    schedule_options,
    with_schedule,
)

ROOT = Path(__file__).resolve().parents[3]


def _scenario(delay: str = "100ms", **sets: object):
    return load_scenario(ROOT / "scenarios/atlas-3dc.yaml",
                         {"topology.wan.0.delay": delay, "workload.model.seq_len": 512,
                          "runner.atlas_schedule": "auto", **sets})[0]


def test_a_long_round_trip_runs_gpipe_and_a_short_one_keeps_1f1b() -> None:
    far = _scenario("100ms")
    setup = plan_variant("atlas", far, far.workload, far.workload_dir, None, None)
    alt = setup.schedule_alternatives
    assert set(alt) == {"1f1b", "gpipe"} and alt["gpipe"] < alt["1f1b"] * (1 - SCHEDULE_MARGIN)
    assert setup.schedule == "gpipe" and setup.runs(far.workload).parallelism.schedule == "gpipe"
    assert setup.prediction.iteration_time_s == pytest.approx(alt["gpipe"])
    near = _scenario("5ms")
    kept = plan_variant("atlas", near, near.workload, near.workload_dir, None, None)
    assert kept.schedule is None and kept.runs(near.workload) is near.workload
    assert kept.schedule_alternatives["1f1b"] < kept.schedule_alternatives["gpipe"]


def test_the_baselines_and_configured_atlas_run_the_workloads_schedule() -> None:
    far = _scenario("100ms")
    for name in ("baseline", "multi-tcp", "dp-across-dc", "torch-gloo"):
        assert requested_schedule(name, far) == "configured"
        setup = plan_variant(name, far, far.workload, far.workload_dir, None, None)
        assert setup.schedule is None and setup.schedule_alternatives is None
    fixed = _scenario("100ms", **{"runner.atlas_schedule": "configured"})
    setup = plan_variant("atlas", fixed, fixed.workload, fixed.workload_dir, None, None)
    assert setup.schedule is None and setup.schedule_alternatives is None
    real = load_scenario(ROOT / "scenarios/real-tiny-2dc.yaml", {"runner.atlas_schedule": "auto"})[0]
    assert requested_schedule("atlas", real) == "configured"  # real devices: the configured schedule


def test_within_the_margin_the_configured_schedule_stays() -> None:
    """20 ms RTT at 400 Mbit/s: GPipe predicted within 1% of 1F1B, so 1F1B runs."""
    sc = _scenario("10ms", **{"topology.wan.0.rate": "400Mbit"})
    setup = plan_variant("atlas", sc, sc.workload, sc.workload_dir, None, None)
    alt = setup.schedule_alternatives
    assert abs(alt["gpipe"] / alt["1f1b"] - 1) < SCHEDULE_MARGIN
    assert setup.schedule is None


def test_device_memory_counts_model_state_and_the_micro_batches_in_flight() -> None:
    wl = _scenario().workload
    par = wl.parallelism
    assert (in_flight("gpipe", par.pp, 8), in_flight("1f1b", par.pp, 8), in_flight("1f1b", 4, 2)) == (8, 4, 2)
    state = device_memory_bytes(wl, "1f1b") - 4 * 4 * activation_memory_bytes(wl)  # 4 layers a stage
    gpipe = device_memory_bytes(wl, "gpipe")
    assert gpipe - device_memory_bytes(wl, "1f1b") == 4 * 4 * activation_memory_bytes(wl)
    from testbed_core.compute_model import param_count
    assert state == pytest.approx(param_count(wl.model_spec()) / par.pp * STATE_BYTES_PER_PARAM, abs=1)


def test_a_schedule_the_devices_cannot_hold_is_not_weighed_and_says_why() -> None:
    """GPT-3 XL at 8k tokens with 32 micro-batches over 2 stages: GPipe would hold all
    32 micro-batches' activations, far more than an A100's 80 GB."""
    sc = load_scenario(ROOT / "scenarios/quickstart.yaml", {
        "workload.model.seq_len": 8192, "workload.parallelism.num_micro_batches": 32,
        "bubbletea.enabled": False, "runner.atlas_schedule": "auto"})[0]
    options, refused = schedule_options(sc.workload)
    assert options == ["1f1b"]
    assert "needs" in refused["gpipe"] and "per A100 (80 GB): 32 micro-batches' activations at once" \
        in refused["gpipe"]
    setup = plan_variant("atlas", sc, sc.workload, sc.workload_dir, None, None)
    assert set(setup.schedule_alternatives) == {"1f1b"} and setup.schedules_refused == refused


def test_interleaved_stages_and_unknown_devices_keep_the_configured_schedule(tmp_path: Path) -> None:
    wl = _scenario().workload
    inter = wl.model_copy(update={"parallelism": wl.parallelism.model_copy(
        update={"schedule": "interleaved-1f1b", "chunks": 2})})
    options, refused = schedule_options(inter)
    assert options == ["interleaved-1f1b"] and set(refused) == {"1f1b", "gpipe"}
    assert "splits stages into 2 chunks" in refused["gpipe"]
    custom = wl.model_copy(update={"gpu": wl.gpu.model_copy(update={"type": "custom", "peak_tflops": 100.0,
                                                                      "memory_bandwidth_gbs": 1000.0})})
    options, refused = schedule_options(custom)
    assert options == ["1f1b"] and "memory of a custom device is not known" in refused["gpipe"]
    assert with_schedule(wl, "gpipe").parallelism.schedule == "gpipe" and wl.parallelism.schedule == "1f1b"


def test_atlas_schedule_is_validated() -> None:
    from testbed_core.configfile import ConfigError

    with pytest.raises(ConfigError, match="atlas_schedule"):
        _scenario(**{"runner.atlas_schedule": "fastest"})
    plain = load_scenario(ROOT / "scenarios/atlas-3dc.yaml")[0]
    assert plain.runner.atlas_schedule == "configured"  # opt-in
    assert requested_schedule("atlas", plain) == "configured"


def test_the_chosen_schedule_reaches_the_workers_jobs(tmp_path: Path) -> None:
    """What atlas runs is what it predicted: its workers' jobs carry GPipe, and their
    BubbleTea slots are the GPipe plan's idle time, while the scenario's own workload
    (the baselines') keeps 1F1B."""
    from testbed.run.jobs import build_jobs
    from testbed.run.ports import PortPlan
    from testbed_core.contracts.worker_job import TransportJob

    far = _scenario("100ms")
    setup = plan_variant("atlas+bubbletea", far, far.workload, far.workload_dir, None, None)
    assert setup.schedule == "gpipe" and far.workload.parallelism.schedule == "1f1b"
    ips = {f"{dc.name}-{h}": f"10.0.{i}.{j}" for i, dc in enumerate(far.topology.dcs)
           for j, h in enumerate(dc.hosts)}
    jobs = build_jobs(setup=setup, workload=setup.runs(far.workload), topology=far.topology, host_ips=ips,
                      run_dir=tmp_path / "run", control="/tmp/ctl.sock", ports=PortPlan(30000), iterations=3,
                      transport=TransportJob(chunk_bytes=4 << 20, congestion=None, pacing_rate_mbps=None,
                                             connect_timeout_s=10.0))
    assert {j.schedule for j in jobs.values()} == {"gpipe"}
    job = jobs["p0r0"]
    assert job.idle_slots == [(s, e) for s, e in setup.prediction.sim.idle_slots(0, 0, min_s=1e-3)]
