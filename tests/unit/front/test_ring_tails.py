"""scripts/ring_tails.py on a hand-made run folder: each stage's last backward (the later
replica's), the measured tail after the last of them, and the ring model's tail fed with
those starts and the run's own calibration; runs without calibrated rings are said."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "scripts" / "ring_tails.py"


def _run_folder(tmp: Path) -> Path:
    run = tmp / "run"
    (run / "baseline").mkdir(parents=True)
    (run / "torch-gloo").mkdir()
    cal = {"lan_pairs": [["a-h1", "a-h2"], ["b-h1", "b-h2"]], "lan_nbytes": 10_000_000,
           "lan_transfer_s": [0.1, 0.1], "lan_channel_rate_mbps": 800.0,  # 80 Mbit each way in 0.1 s
           "lan_alone_transfer_s": [0.05], "lan_alone_channel_rate_mbps": 1600.0}
    (run / "summary.json").write_text(json.dumps({"calibration": cal, "variants": {"baseline": {}, "torch-gloo": {}}}))
    # one warm-up and one measured iteration, starting at 100 and 200
    (run / "baseline" / "iterations.json").write_text(json.dumps(
        {"starts": [100.0, 200.0], "ends": [101.0, 201.0], "warmup": 1}))
    rows = ["device,kind,owner,label,requested,start,end"]
    for it in (100.0, 200.0):
        # stage 0 ends at 0.80 (replica 1 later than replica 0), stage 1 at 0.90
        for device, end in (("a-h1-p0r0", 0.75), ("a-h2-p1r0", 0.80), ("b-h1-p0r1", 0.90), ("b-h2-p1r1", 0.85)):
            rows.append(f"{device},backward,train,B,{it},{it + end - 0.1},{it + end}")
            rows.append(f"{device},forward,train,F,{it},{it + 0.1},{it + 0.2}")
    (run / "baseline" / "timeline.csv").write_text("\n".join(rows) + "\n")
    return run


def test_the_measured_tail_against_the_ring_model_fed_with_the_measured_starts(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, str(SCRIPT), str(_run_folder(tmp_path))], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "2 rings of 10.0 MB" in out.stdout and "torch-gloo" not in out.stdout  # gloo's rings: left out
    (line,) = [x for x in out.stdout.splitlines() if x.strip().startswith("baseline")]
    # measured: the iteration ends 1.0 s after its start, the last backward at 0.90: 0.10 s
    # model: ring 0 from 0.80 alone (all at once 2 x 800 Mbit/s, one alone 1.6 Gbit/s): its 80
    # Mbit by 0.85; ring 1 from 0.90 alone, the same 0.05 s: the last ends 0.05 s after 0.90
    assert "measured 0.100 s, ring model 0.050 s (1 iterations: 0.100/0.050)" in line


def test_a_run_without_calibrated_rings_says_so(tmp_path: Path) -> None:
    run = tmp_path / "plain"
    run.mkdir()
    (run / "summary.json").write_text(json.dumps({"calibration": None, "variants": {}}))
    out = subprocess.run([sys.executable, str(SCRIPT), str(run)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "no rings inside the DCs were calibrated" in out.stdout


@pytest.mark.parametrize("stage", ["0", "1"])
def test_stage_ends_take_the_later_replica(stage: str) -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location("ring_tails", SCRIPT)
    assert spec is not None and spec.loader is not None
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    rows = [{"device": f"h1-p0r{stage}", "kind": "backward", "start": "10.1", "end": "10.5"},
            {"device": f"h2-p1r{stage}", "kind": "backward", "start": "10.2", "end": "10.7"},
            {"device": f"h2-p1r{stage}", "kind": "forward", "start": "10.7", "end": "10.9"}]
    assert m.stage_ends(rows, 10.0, 11.0) == pytest.approx([0.7])
