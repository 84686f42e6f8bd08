"""scripts/last_hops.py on a hand-made run folder: the last micro-batch's backward chain
hop by hop (backward, wait until sent, wire, hand-over), with its modelled times and the
DP rings that had started; warm-up iterations left out."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "scripts" / "last_hops.py"

TRANSFER_HEAD = "iteration,pipeline,boundary,mb,direction,src,dst,nbytes,links,streams,latency_s,posted,not_before,sent,arrived,confirmed"


def _run_folder(tmp: Path) -> Path:
    run = tmp / "run"
    (run / "atlas").mkdir(parents=True)
    (run / "summary.json").write_text(json.dumps({"variants": {"atlas": {}}}))
    (run / "atlas" / "iterations.json").write_text(json.dumps({"starts": [100.0, 200.0], "ends": [101.0, 201.0],
                                                               "warmup": 1}))
    rows = ["device,kind,owner,label,requested,start,end,mode,modelled_s"]
    transfers = [TRANSFER_HEAD]
    for i, it in enumerate((100.0, 200.0)):
        # pipeline 1 ends its stages first: stage 1 at 0.52, stage 0 at 0.61
        rows.append(f"x-h2-p1r1,backward,train,B1@s1,{it + 0.5},{it + 0.5},{it + 0.52},modelled,0.005")
        rows.append(f"x-h1-p1r0,backward,train,B1@s0,{it + 0.6},{it + 0.6},{it + 0.61},modelled,0.005")
        # pipeline 0: B1@s1 0.53-0.54, sent 0.542, arrived 0.545, B1@s0 asked for at 0.546, run 0.546-0.556
        rows.append(f"x-h3-p0r1,forward,train,F1@s1,{it + 0.1},{it + 0.1},{it + 0.2},modelled,0.1")
        rows.append(f"x-h3-p0r1,backward,train,B1@s1,{it + 0.53},{it + 0.53},{it + 0.54},modelled,0.005")
        rows.append(f"x-h4-p0r0,backward,train,B1@s0,{it + 0.546},{it + 0.546},{it + 0.556},modelled,0.005")
        transfers.append(f"{i},0,0,1,bwd,p0r1,p0r0,1024,,1,0.0,{it + 0.54},,{it + 0.542},{it + 0.545},{it + 0.5455}")
        transfers.append(f"{i},1,0,1,bwd,p1r1,p1r0,1024,,1,0.0,{it + 0.52},,{it + 0.52},{it + 0.59},{it + 0.595}")
    (run / "atlas" / "timeline.csv").write_text("\n".join(rows) + "\n")
    (run / "atlas" / "transfers.csv").write_text("\n".join(transfers) + "\n")
    return run


def test_the_last_micro_batch_hop_by_hop(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, str(SCRIPT), str(_run_folder(tmp_path))], capture_output=True,
                         text=True, check=True).stdout
    assert "iteration 0" not in out  # the warm-up
    p0 = out.split("iteration 1 pipeline 0:")[1].split("iteration 1 pipeline 1:")[0]
    assert "last backward ends at 556.0 ms" in p0
    lines = [" ".join(line.split()) for line in p0.strip().splitlines()[1:]]
    assert lines == [
        "B1@s1 at 530.0 ms took 10.0 ms (modelled 5.0), rings running: 0",
        "until sent (plan, channel) at 540.0 ms took 2.0 ms, rings running: 1",  # stage 1 done in both
        "grad s1->s0 (LAN) at 542.0 ms took 3.0 ms, rings running: 1",
        "hand-over to B1@s0 at 545.0 ms took 1.0 ms, rings running: 1",
        "B1@s0 at 546.0 ms took 10.0 ms (modelled 5.0), rings running: 1",
    ]
    p1 = out.split("iteration 1 pipeline 1:")[1]
    assert "grad s1->s0 (LAN) at 520.0 ms took 70.0 ms, rings running: 0" in " ".join(p1.split())


def test_every_variant_unless_some_are_asked_for(tmp_path: Path) -> None:
    run = _run_folder(tmp_path)
    (run / "baseline").mkdir()
    for name in ("iterations.json", "timeline.csv", "transfers.csv"):
        (run / "baseline" / name).write_text((run / "atlas" / name).read_text())
    (run / "summary.json").write_text(json.dumps({"variants": {"baseline": {}, "atlas": {}}}))
    every = subprocess.run([sys.executable, str(SCRIPT), str(run)], capture_output=True, text=True, check=True).stdout
    assert "== baseline" in every and "== atlas" in every
    one = subprocess.run([sys.executable, str(SCRIPT), str(run), "--variant", "atlas"], capture_output=True,
                         text=True, check=True).stdout
    assert "== baseline" not in one and one.startswith("== atlas\n")
