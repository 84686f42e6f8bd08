"""The pipelining example (examples/pipeline.py) as a program scenario (root): launched
once per rank in the emulated hosts of a small 2-DC topology (2 ms each way, so it is
quick), with gloo and with atlas, on one build; each variant's losses and final
parameter digests equal the one-process reference's within 1e-5, and the summary
reports its seconds per step and the WAN bytes it made. No timing is asserted."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from testbed.run.program import run_program_scenario
from testbed.run.scenario import ProgramScenario, resolve_scenario, validate_any
from testbed_core.constants import REPO_ROOT
from testbed_core.contracts.summary import ProgramVariantResult

pytestmark = [pytest.mark.root, pytest.mark.slow]

ARGS = ["--schedule", "1f1b", "--steps", "3", "--rows", "512", "--hidden", "16", "--layers-per-stage", "2",
        "--seed", "7"]
TOL = 1e-5
HAS_ATLAS = importlib.util.find_spec("atlas_transport.torch") is not None


def scenario(tmp_path: Path) -> tuple[ProgramScenario, dict]:
    text = (REPO_ROOT / "scenarios" / "program-2dc.yaml").read_text()
    path = tmp_path / "program.yaml"
    path.write_text(text.replace("../topologies/2dc.yaml", str(REPO_ROOT / "topologies" / "2dc.yaml")))
    data = resolve_scenario(path)
    data["topology"]["wan"][0]["delay"] = "2ms"
    data["program"]["command"] = [sys.executable, "examples/pipeline.py", *ARGS]
    data["program"]["cwd"] = str(REPO_ROOT)
    data["program"]["timeout"] = 240
    if not HAS_ATLAS:
        data["variants"].pop("atlas")
    sc = validate_any(data)
    assert isinstance(sc, ProgramScenario)
    return sc, data


def reference() -> tuple[dict[int, float], dict[str, dict]]:
    done = subprocess.run([sys.executable, str(REPO_ROOT / "examples" / "pipeline.py"), "--reference",
                           "--stages", "2", *ARGS], capture_output=True, text=True, timeout=240, check=True)
    lines = [json.loads(x) for x in done.stdout.splitlines() if x.startswith("{")]
    return {d["step"]: d["loss"] for d in lines if "loss" in d}, next(d["params"] for d in lines if d.get("final"))


def test_pipeline_example_under_launch_equals_reference(tmp_path: Path) -> None:
    sc, data = scenario(tmp_path)
    summary = run_program_scenario(sc, data, tmp_path / "out")
    want_loss, want_params = reference()
    for name in sc.variants:
        entry = summary.variants[name]
        assert isinstance(entry, ProgramVariantResult), f"{name}: {entry}"
        assert entry.ok and entry.exit_status == 0, f"{name}: {entry.failure}"
        assert entry.source == "step_s" and entry.steps == 3 and entry.seconds_per_step > 0
        assert entry.wan_bytes and entry.wan_bytes > 3 * 2 * 4 * 512 * 16 * 4, f"{name}: WAN bytes {entry.wan_bytes}"
        assert entry.losses is not None and len(entry.losses) == 3
        for step, loss in enumerate(entry.losses):
            assert abs(loss - want_loss[step]) <= TOL, f"{name} step {step}: {loss} vs {want_loss[step]}"
        launch = json.loads((Path(entry.launch_dir) / "launch.json").read_text())
        got: dict[str, dict] = {}
        for rank in launch["ranks"]:
            final = next(m for m in rank["metrics"] if m.get("final"))
            got.update(final["params"])
        assert set(got) == set(want_params)
        for pname, digest in want_params.items():
            assert abs(got[pname]["sum"] - digest["sum"]) <= TOL * max(1.0, digest["abs_sum"]), (name, pname)
            assert abs(got[pname]["abs_sum"] - digest["abs_sum"]) <= TOL * max(1.0, digest["abs_sum"]), (name, pname)
        print(f"\n{name}: {entry.seconds_per_step:.3f} s per step, WAN {entry.wan_bytes} bytes")
    assert (tmp_path / "out" / "summary.json").exists()
