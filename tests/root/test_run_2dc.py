"""`testbed run` end to end on the emulated 2dc topology (root): workers in the host
namespaces, real tensors over the emulated WAN through atlas_transport, a short run
(1 warm-up + 1 measured iteration) of baseline and atlas. What is checked is what the
run computed and carried; how fast it went is printed (its floors: tests/floors/)."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from testbed.progress import Progress
from testbed.run.calibration import LAN_RING_ROUNDS
from testbed.run.runner import run_scenario
from testbed.run.scenario import load_scenario
from testbed_core.contracts.summary import read_summary

pytestmark = pytest.mark.root
ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(400)
def test_short_atlas_2dc_run(tmp_path: Path, namespaces) -> None:
    before = namespaces()
    scenario, resolved = load_scenario(ROOT / "scenarios/atlas-2dc.yaml", {
        "workload.warmup": 1, "workload.iterations": 1, "variants": ["baseline", "atlas"],
        "runner.calibration_transfers": 2, "runner.base_port": 39000,
        "workload.scale": 0.25,  # a quarter of the bytes (its calibration too): the same checks, a shorter run
    })
    out = tmp_path / "out"
    log = io.StringIO()
    summary = run_scenario(scenario, resolved, out, Progress(label="t", stream=log, tty=False))
    assert read_summary(out / "summary.json") == summary
    assert summary.variants.keys() == {"baseline", "atlas"} and not summary.failed(), summary.variants
    assert summary.delay_backend in ("relay", "netem")
    assert summary.scale == 0.25 and summary.scenario == "atlas-2dc"
    assert (out / "scenario.resolved.yaml").exists()
    base, atlas = summary.result("baseline"), summary.result("atlas")
    for v in (base, atlas):
        for key in ("iteration_time_s", "predicted_iteration_time_s", "device_utilization", "bubble_fraction"):
            assert getattr(v, key) > 0
        link = v.wan_links["dc1-dc2"]
        assert link.bytes == 1 * 2 * 8 * 2 * summary.wire_activation_bytes  # 1 iteration, dp, m, fwd+bwd
        assert link.goodput_mbps > 0
        assert (out / v.gantt_png).exists() and (out / v.timeline_csv).exists()
        assert v.machine_cpu is not None and v.machine_cpu.cores >= 1  # the run and its delay line are on this machine
        if summary.delay_backend == "relay":  # the relay's counters over the variant
            line = v.delay_line["dc1-dc2"]
            frames = [d.rx_frames for d in line.directions().values()]
            assert len(frames) == 2 and min(frames) > 1000 and line.relay_drops >= 0
    assert base.streams == 1 and atlas.streams >= 8
    cal = summary.calibration  # the WAN path timed before the variants (the demo's reduced run skips it)
    assert cal is not None and cal.channel_rate_mbps["1"] > 0
    assert cal.one_way_delay_s == pytest.approx(scenario.topology.path_delay("dc1", "dc2"))
    # how much faster atlas is: tests/floors/test_run_speedup.py (make floors)
    print(log.getvalue())
    print(f"baseline {base.iteration_time_s:.3f} s/it, {base.wan_links['dc1-dc2'].goodput_mbps:.0f} Mbit/s; "
          f"atlas {atlas.iteration_time_s:.3f} s/it, {atlas.wan_links['dc1-dc2'].goodput_mbps:.0f} Mbit/s")
    assert namespaces() <= before  # nothing of the run is left behind


@pytest.mark.timeout(600)
def test_dp_across_dc_all_reduces_its_gradients_over_the_wan(tmp_path: Path, namespaces) -> None:
    """scenarios/dp-2dc.yaml, short, dp-across-dc and torch-gloo: dp-across-dc keeps each
    pipeline in one DC, so the rings of both stages cross the WAN every iteration (their
    bytes, and no faster than the link allows); the DP ring inside a DC was calibrated
    first, and the all-reduce is predicted. torch-gloo runs over the emulated hosts."""
    from testbed.training.allreduce import ring_plan

    before = namespaces()
    scenario, resolved = load_scenario(ROOT / "scenarios/dp-2dc.yaml", {
        "workload.warmup": 1, "workload.iterations": 1, "variants": ["dp-across-dc", "torch-gloo"],
        "workload.scale": 0.1,  # dp-across-dc's rings are one window-limited stream each
        "runner.calibration_transfers": 1, "runner.base_port": 39000,
    })
    out = tmp_path / "out"
    log = io.StringIO()
    summary = run_scenario(scenario, resolved, out, Progress(label="t", stream=log, tty=False))
    print(log.getvalue())
    assert not summary.failed(), summary.variants
    # the ring inside a DC timed at least LAN_RING_ROUNDS times (1 asked for), its first run left out
    assert summary.calibration.lan_channel_rate_mbps > 0 and len(summary.calibration.lan_transfer_s) == LAN_RING_ROUNDS
    across = summary.result("dp-across-dc")
    assert [set(dcs) for dcs in across.placement.stage_dc] == [{"dc1"}, {"dc2"}]  # a pipeline per DC
    assert not any(link.bytes for link in across.wan_links.values())  # the pipelines stay inside their DC
    wl = scenario.workload
    grads = [int(p * 2 * wl.scale) for p in wl.effective().stage_params]  # bf16
    per_way = sum(ring_plan(0, 2, g, scenario.runner.dp_bucket).bytes_sent for g in grads)
    assert across.allreduce.wan_bytes_per_iteration == 2 * per_way  # both replicas of both stages
    # the link carries at most 1 Gbit/s each way: the rings cannot finish sooner
    assert across.allreduce.mean_s >= 0.9 * per_way * 8 / 1e9
    assert across.allreduce.predicted_added_s > 0
    print(f"dp-across-dc: measured {across.iteration_time_s:.2f} s, predicted "
          f"{across.predicted_iteration_time_s:.2f} s ({across.prediction_error:+.0%})")
    # torch-gloo: the baseline's placement through torch.distributed over the emulated hosts'
    # interfaces: the pipeline's tensors cross the WAN, the all-reduce stays inside the DCs
    gloo = summary.result("torch-gloo")
    link = gloo.wan_links["dc1-dc2"]
    assert link.bytes == 1 * 2 * 8 * 2 * summary.wire_activation_bytes  # iterations, dp, m, fwd+bwd
    assert gloo.allreduce.wan_bytes_per_iteration == 0 and gloo.allreduce.mean_s > 0
    assert namespaces() <= before
