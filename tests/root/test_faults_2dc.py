"""Faults on purpose end to end (root): scenarios/faults-2dc.yaml shortened (no
calibration, 1 warm-up + 2 measured iterations) with a 1 s WAN outage in the middle of
the first measured iteration: Atlas survives it with every tensor verified, and the
summary, the log and the Gantt chart report it; then a worker killed at an iteration
fails the variant with an error naming the fault, and nothing is left behind."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from testbed.progress import Progress
from testbed.run.runner import run_scenario
from testbed.run.scenario import load_scenario
from testbed_core.contracts.summary import read_summary

pytestmark = [pytest.mark.root, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]
SHORT = {"workload.warmup": 1, "workload.iterations": 2, "runner.calibrate": False, "runner.base_port": 39500}


@pytest.mark.timeout(240)
def test_atlas_survives_a_link_outage_with_every_tensor_verified(tmp_path: Path, namespaces) -> None:
    before = namespaces()
    scenario, resolved = load_scenario(ROOT / "scenarios/faults-2dc.yaml", {
        **SHORT, "faults": [{"kind": "link-down", "link": "dc1-dc2", "iteration": 1, "at": "0.2s", "duration": "1s"}],
    })
    out = tmp_path / "out"
    log = io.StringIO()
    summary = run_scenario(scenario, resolved, out, Progress(label="t", stream=log, tty=False))
    print(log.getvalue())
    assert read_summary(out / "summary.json") == summary
    atlas = summary.result("atlas")
    assert atlas is not None, summary.variants
    par = summary.parallelism
    assert atlas.tensors_verified == 3 * par.dp * par.num_micro_batches * 2  # every iteration, both directions
    (fault,) = summary.faults
    assert fault.outcome == "survived" and fault.error is None and fault.target == "dc1-dc2"
    assert fault.started is not None and fault.ended is not None
    assert 0.95 <= fault.ended - fault.started <= 1.5
    assert 1 in fault.iterations and [a.iteration for a in fault.around][-1] == 2
    assert fault.recovery_s is not None and fault.recovery_s > 0
    assert fault.transfers_caught and fault.transfers_caught > 0
    if summary.delay_backend == "relay":
        assert fault.dropped_frames and fault.dropped_frames > 0
        assert sum(d.down_drops for d in atlas.delay_line["dc1-dc2"].directions().values()) >= fault.dropped_frames
    assert "fault link-down dc1-dc2 for 1s at iteration 1 + 200ms: survived" in log.getvalue()
    assert (out / atlas.gantt_png).stat().st_size > 0
    assert namespaces() <= before


@pytest.mark.timeout(240)
def test_a_killed_worker_fails_the_variant_naming_the_fault(tmp_path: Path, namespaces) -> None:
    before = namespaces()
    scenario, resolved = load_scenario(ROOT / "scenarios/faults-2dc.yaml", {
        **SHORT, "workload.iterations": 1, "faults": [{"kind": "kill-worker", "worker": "p0r1", "iteration": 1}],
    })
    out = tmp_path / "out"
    summary = run_scenario(scenario, resolved, out, Progress(label="t", stream=io.StringIO(), tty=False))
    assert summary.failed() == ["atlas"]
    error = summary.variants["atlas"].error  # type: ignore[union-attr]
    # the first to notice may be the killed worker's peer (its stream lost) or the runner (its exit status)
    assert ("worker p0r1 exited" in error or "PeerLost" in error) and \
        error.endswith("(after the fault injected on purpose: kill-worker p0r1 at iteration 1 + 0s)")
    (fault,) = summary.faults
    assert fault.outcome == "failed" and fault.iterations == [1] and fault.error == error
    assert namespaces() <= before
