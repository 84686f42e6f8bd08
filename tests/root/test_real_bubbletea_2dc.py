"""`testbed run scenarios/real-bubbletea-2dc.yaml` on the emulated 2dc topology (root): the
tiny GPT trained for real across the two DCs (atlas), once alone and once with a BubbleTea
agent next to each worker doing real prefill of a tiny Llama (transformers) in the bubbles.
Every KV cache crosses the emulated LAN whole to the decode server of its DC, which checks
its digest and decodes one step from it: the next token must equal the same model's in one
process. The summary reports utilization and slowdown as for the modelled scenario, and
training with prefill still equals the one-process training reference bit for bit."""

from __future__ import annotations

import io
import json
import time
from pathlib import Path

import pytest

from testbed.progress import Progress
from testbed.run.runner import run_scenario
from testbed.run.scenario import load_scenario

pytestmark = pytest.mark.root
ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.long  # 60 s quiet: make test-long
@pytest.mark.timeout(600)
def test_real_prefill_in_real_training_bubbles_passes_the_kv_decode_check(tmp_path: Path, namespaces) -> None:
    before = namespaces()
    scenario, resolved = load_scenario(ROOT / "scenarios/real-bubbletea-2dc.yaml", {
        "runner.base_port": 44900, "workload.warmup": 1, "workload.iterations": 3,
        "runner.bubbletea_idle_twin": False})  # the decomposition is the modelled runs' business; CI time
    out = tmp_path / "out"
    log = io.StringIO()
    t0 = time.monotonic()
    run_scenario(scenario, resolved, out, Progress(label="t", stream=log, tty=False))
    wall = time.monotonic() - t0
    summary = json.loads((out / "summary.json").read_text())
    assert list(summary["variants"]) == ["atlas", "atlas+bubbletea"]
    plain, bt = summary["variants"]["atlas"], summary["variants"]["atlas+bubbletea"]
    assert "error" not in plain and "error" not in bt, (plain.get("error"), bt.get("error"), log.getvalue())
    assert bt["device_mode"] == "real" and bt["bubbletea_agents"]["engine_mode"] == ["real"]
    # reported like the modelled scenario: utilization with and without prefill, slowdown against atlas
    assert 0 < bt["device_utilization_training"] <= bt["device_utilization"] <= 1
    assert bt["compared_with_iteration_time_s"] == plain["iteration_time_s"]
    assert bt["training_slowdown"] == pytest.approx(bt["iteration_time_s"] / plain["iteration_time_s"] - 1)
    req = bt["prefill_requests"]
    assert req["served"] > 0 and req["unaccounted"] == 0 and req["arrived"] == req["served"] + req["rejected"]
    # every served cache crossed whole, passed its digest and its decode step against the one-process model
    kv = bt["kv_checks"]
    assert kv["shipped"] >= req["served"] and kv["digest_mismatches"] == 0 and kv["decode_failed"] == 0
    assert kv["decode_checked"] == kv["decode_passed"] == kv["shipped"]
    assert kv["wire_scale"] == 1.0 and kv["wire_bytes"] == kv["kv_bytes"] > 0
    decoded = [json.loads(line) for p in (out / "atlas+bubbletea" / "agents").glob("decode-*.jsonl")
               for line in p.read_text().splitlines()]
    assert decoded and all(d["digest_ok"] and d["decode_check"]["ok"] for d in decoded)
    served = {json.loads(line)["id"] for p in (out / "atlas+bubbletea" / "agents").glob("*.requests.jsonl")
              for line in p.read_text().splitlines() if json.loads(line)["status"] == "served"}
    assert served == {d["request_id"] for d in decoded}
    # prefill on the same device did not change what training computed
    assert bt["real"]["identical"] and plain["real"]["identical"]
    assert namespaces() <= before
    print(f"\nreal-bubbletea-2dc: {wall:.0f} s; utilization {bt['device_utilization_training']:.0%} -> "
          f"{bt['device_utilization']:.0%}, slowdown {bt['training_slowdown']:+.1%}, {req['served']} served, "
          f"{kv['decode_passed']} decode checks passed")
