"""`testbed run` end to end on the emulated 2dc topology (root): workers in the host
namespaces, real tensors over the emulated WAN through atlas_transport, a short run
(1 warm-up + 2 measured iterations) of baseline and atlas."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from testbed.progress import Progress
from testbed.run.runner import run_scenario
from testbed.run.scenario import load_scenario
from testbed_core.contracts.summary import read_summary

pytestmark = pytest.mark.root
ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(400)
def test_short_atlas_2dc_run(tmp_path: Path, namespaces) -> None:
    before = namespaces()
    scenario, resolved = load_scenario(ROOT / "scenarios/atlas-2dc.yaml", {
        "workload.warmup": 1, "workload.iterations": 2, "variants": ["baseline", "atlas"],
        "runner.calibration_transfers": 3, "runner.base_port": 39000,
    })
    out = tmp_path / "out"
    log = io.StringIO()
    summary = run_scenario(scenario, resolved, out, Progress(label="t", stream=log, tty=False))
    assert read_summary(out / "summary.json") == summary
    assert summary.variants.keys() == {"baseline", "atlas"} and not summary.failed(), summary.variants
    assert summary.delay_backend in ("relay", "netem")
    assert summary.scale == 1.0 and summary.scenario == "atlas-2dc"
    assert (out / "scenario.resolved.yaml").exists()
    base, atlas = summary.result("baseline"), summary.result("atlas")
    for v in (base, atlas):
        for key in ("iteration_time_s", "predicted_iteration_time_s", "device_utilization", "bubble_fraction"):
            assert getattr(v, key) > 0
        link = v.wan_links["dc1-dc2"]
        assert link.bytes == 2 * 2 * 8 * 2 * summary.wire_activation_bytes  # 2 iterations, dp, m, fwd+bwd
        assert link.goodput_mbps > 50
        assert (out / v.gantt_png).exists() and (out / v.timeline_csv).exists()
        if summary.delay_backend == "relay":  # the relay's counters over the variant
            line = v.delay_line["dc1-dc2"]
            frames = [d.rx_frames for d in line.directions().values()]
            assert len(frames) == 2 and min(frames) > 1000 and line.relay_drops >= 0
    assert base.streams == 1 and atlas.streams >= 8
    assert atlas.iteration_time_s < base.iteration_time_s
    assert atlas.wan_links["dc1-dc2"].goodput_mbps > 2 * base.wan_links["dc1-dc2"].goodput_mbps
    print(log.getvalue())
    assert namespaces() <= before  # nothing of the run is left behind
