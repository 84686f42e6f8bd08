"""The prefill controller in a real run (root): a short run of atlas, atlas+bubbletea with
the controller and its shards and naive twins on the emulated 2dc topology (quickstart's
workload, 1 warm-up + 1 measured iteration). Checks that every variant accounts for every
request, that the controller dispatched to the devices, and that the naive twin is marked
as such; timing is not asserted (the machine is shared)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from testbed.progress import Progress
from testbed.run.runner import run_scenario
from testbed.run.scenario import RunnerSettings, load_scenario

pytestmark = pytest.mark.root
ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.long  # 80 s on a quiet 2-core machine: make test-long
@pytest.mark.timeout(400)
def test_controller_shards_and_naive_in_one_run(tmp_path: Path, namespaces) -> None:
    before = namespaces()
    overrides = {
        "variants": ["atlas"], "workload.warmup": 1, "workload.iterations": 1, "runner.calibrate": False,
        "runner.base_port": 39700, "bubbletea.requests.rate": 40, "bubbletea.dispatch": "controller",
        "bubbletea.compare_dispatch": ["shards", "naive"],
    }
    if "bubbletea_idle_twin" in RunnerSettings.model_fields:
        overrides["runner.bubbletea_idle_twin"] = False
    scenario, resolved = load_scenario(ROOT / "scenarios/quickstart.yaml", overrides)
    out = tmp_path / "out"
    log = io.StringIO()
    run_scenario(scenario, resolved, out, Progress(label="t", stream=log, tty=False))
    print(log.getvalue())
    summary = json.loads((out / "summary.json").read_text())
    assert list(summary["variants"]) == ["atlas", "atlas+bubbletea", "atlas+bubbletea-shards",
                                         "atlas+bubbletea-naive"]
    for name, mode in (("atlas+bubbletea", "controller"), ("atlas+bubbletea-shards", "shards"),
                       ("atlas+bubbletea-naive", "naive")):
        v = summary["variants"][name]
        assert "error" not in v, (name, v.get("error"))
        svc = v["prefill_service"]
        assert svc["dispatch"] == mode and svc["accounted"], (name, svc)
        assert svc["arrived"] == svc["served"] + svc["rejected"] > 0
        assert v["training_slowdown"] is not None
    ctl = summary["variants"]["atlas+bubbletea"]["prefill_service"]
    assert ctl["served"] > 0 and sum(ctl["by_device"].values()) > 0
    assert set(ctl["by_device"]) == {"p0r0", "p0r1", "p1r0", "p1r1"}
    rows = [json.loads(line) for line in (out / "atlas+bubbletea" / "controller" / "requests.jsonl")
            .read_text().splitlines()]
    assert len(rows) == ctl["arrived"] and all(r["status"] in ("served", "rejected") for r in rows)
    assert all(r["reason"] for r in rows if r["status"] == "rejected")
    assert namespaces() == before
