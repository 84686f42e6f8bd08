"""`testbed run scenarios/real-tiny-2dc.yaml`, shortened, on the emulated 2dc topology (root): the
product itself trains the tiny GPT for real across the two DCs, under baseline and
atlas, over the emulated 50 ms / 1 Gbit/s WAN, and its summary says
that every variant's parameters equal the same model trained in one process: bit for
bit against the micro-batched reference, and within `reference.tolerance_for` of the
global-batch one (the checks of tests/root/test_equivalence_2dc.py, which also covers
an adversarial send order the runner has no variant for)."""

from __future__ import annotations

import io
import json
import time
from pathlib import Path

import pytest

from testbed.progress import Progress
from testbed.run.runner import run_scenario
from testbed.run.scenario import load_scenario

pytestmark = [pytest.mark.root, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(400)
def test_real_tiny_run_across_two_dcs_equals_one_process_for_every_variant(tmp_path: Path, namespaces) -> None:
    before = namespaces()
    # shortened: 1 warm-up + 1 measured iteration, no calibration probe (the a-priori model
    # plans; what is checked is the training, not the prediction), baseline and atlas (multi-tcp
    # is baseline's code with 4 streams, as atlas has: tests/unit/run/test_real_mode.py runs all three)
    scenario, resolved = load_scenario(ROOT / "scenarios/real-tiny-2dc.yaml", {
        "runner.base_port": 43500, "workload.warmup": 1, "workload.iterations": 1, "runner.calibrate": False,
        "variants": ["baseline", "atlas"]})
    out = tmp_path / "out"
    log = io.StringIO()
    t0 = time.monotonic()
    run_scenario(scenario, resolved, out, Progress(label="t", stream=log, tty=False))
    wall = time.monotonic() - t0
    summary = json.loads((out / "summary.json").read_text())  # what the run wrote, as a user reads it
    assert summary["variants"].keys() == {"baseline", "atlas"}
    assert summary["delay_backend"] in ("relay", "netem")
    lines = []
    for name, v in summary["variants"].items():
        assert "error" not in v, (name, v, log.getvalue())
        real = v["real"]
        assert v["device_mode"] == "real", name
        glob = real["reference"]["global_batch"]
        assert real["identical"], f"{name}: {real['replicas']}"
        assert real["max_abs_param_diff"] == 0.0
        assert real["within_tolerance"] and glob["max_abs_param_diff"] <= glob["atol"], f"{name}: {real['replicas']}"
        assert real["losses"] == real["reference"]["micro_batched"]["losses"]
        assert real["iterations_trained"] == 2
        # the real tensors crossed the emulated WAN (50 ms RTT): 1 measured iteration x 2 pipelines x 4
        # micro-batches, activations and gradients, each of micro_batch x seq_len x hidden x 4 bytes
        link = v["wan_links"]["dc1-dc2"]
        assert link["transfers"] == 16 and link["bytes"] == 16 * 2 * 32 * 64 * 4
        assert v["iteration_time_s"] > 0.05  # at least one round trip per iteration
        lines.append(f"{name:>10}: {v['iteration_time_s'] * 1e3:5.0f} ms/iteration, max |diff| "
                     f"{real['max_abs_param_diff']:g} vs micro-batched (identical), {glob['max_abs_param_diff']:.2g} "
                     f"vs global batch (atol {glob['atol']:g}); loss {real['losses'][0]:.4f} -> {real['losses'][-1]:.4f}")
    assert summary["variants"]["atlas"]["temporal_plan"]["transfers_planned"] > 0
    assert summary["variants"]["baseline"]["streams"] == 1
    assert "parameters bit-identical to the one-process reference" in log.getvalue()
    print(f"\nreal-tiny-2dc ({summary['delay_backend']} delay line): {wall:.1f} s in all")
    print("\n".join(lines))
    assert namespaces() <= before  # nothing of the run is left behind
