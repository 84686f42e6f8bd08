"""scripts/sim_vs_run.py: a run's transfers and compute against its plan made again, on
hand-made spans (medians, warm-ups left out, the compute lag) and on a kept run folder
(the measured side read from its files)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from testbed_core.simulate import ComputeSpan, SimResult, TransferKey, TransferSpan

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "scripts" / "sim_vs_run.py"
KEPT = ROOT / "results" / "held-back" / "3dc-line-at-906c71d"


def _module():
    spec = importlib.util.spec_from_file_location("sim_vs_run", SCRIPT)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("sim_vs_run", mod)  # its dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


def _sim() -> SimResult:
    key = TransferKey(0, 0, 0, "fwd")
    spans = [TransferSpan(key, ready=0.010, start=0.012, end=0.020, arrival=0.030, nbytes=1.0, resources=()),
             TransferSpan(TransferKey(1, 0, 0, "fwd"), ready=0.010, start=0.010, end=0.018, arrival=0.022,
                          nbytes=1.0, resources=())]
    compute = [ComputeSpan(0, 0, 0, "F", 0, 0.0, 0.010), ComputeSpan(0, 1, 1, "F", 0, 0.030, 0.040),
               ComputeSpan(1, 0, 0, "F", 0, 0.0, 0.010)]
    return SimResult(makespan=0.04, compute=compute, transfers=spans, pipelines=2, ranks=2)


def test_transfer_medians_of_the_model_and_of_the_measured_iterations() -> None:
    mod = _module()
    rows = [{"iteration": "0", "boundary": "0", "direction": "fwd", "posted": "0.0", "sent": "0.0", "arrived": "9.0"},
            {"iteration": "1", "boundary": "0", "direction": "fwd", "posted": "1.0", "sent": "1.001", "arrived": "1.016"},
            {"iteration": "1", "boundary": "0", "direction": "fwd", "posted": "2.0", "sent": "2.0", "arrived": "2.012"}]
    (row,) = mod.transfer_rows(_sim(), rows, warmup=1)
    assert (row.boundary, row.direction, row.count) == (0, "fwd", 2)
    assert row.sim_ms == pytest.approx(16.0) and row.sim_wire_ms == pytest.approx(15.0)  # medians of 20/12, 18/12 ms
    assert row.run_ms == pytest.approx(14.0) and row.run_wire_ms == pytest.approx(13.5)  # the warm-up's 9 s left out
    (none,) = mod.transfer_rows(_sim(), [], warmup=0)
    assert none.run_ms is None and none.count == 0


def test_compute_lag_of_one_pipeline_in_one_iteration() -> None:
    mod = _module()
    timeline = [{"kind": "forward", "device": "x-h1-p0r0", "label": "F0@s0", "start": "100.001", "end": "100.012"},
                {"kind": "forward", "device": "x-h2-p0r1", "label": "F0@s1", "start": "100.045", "end": "100.055"},
                {"kind": "forward", "device": "x-h3-p1r0", "label": "F0@s0", "start": "100.0", "end": "100.01"},
                {"kind": "forward", "device": "x-h1-p0r0", "label": "F0@s0", "start": "101.0", "end": "101.01"}]
    rows = mod.compute_rows(_sim(), timeline, 100.0, 100.5, pipeline=0)
    assert [r.label for r in rows] == ["F0@s0", "F0@s1"]  # the next iteration's F0@s0 left out
    assert rows[1].lag_ms == pytest.approx(15.0) and rows[0].run_end_ms == pytest.approx(12.0)


def test_on_a_kept_run() -> None:
    out = subprocess.run([sys.executable, str(SCRIPT), str(KEPT), "--variant", "torch-gloo", "--iteration", "2"],
                         capture_output=True, text=True, check=True, timeout=120).stdout
    assert out.startswith("torch-gloo: predicted ") and "measured 1.839 s" in out
    wan = [line.split() for line in out.splitlines() if line.split()[:2] == ["2", "fwd"]]
    assert wan and wan[0][4:] == ["47.1", "47.0", "48"]  # the run's side, from its transfers.csv
    assert "iteration 2, pipeline 0:" in out and " lag " in out
    bad = subprocess.run([sys.executable, str(SCRIPT), str(KEPT), "--variant", "nope"], capture_output=True,
                         text=True, timeout=120)
    assert bad.returncode == 2 and "no variant 'nope' that ran there" in bad.stderr
