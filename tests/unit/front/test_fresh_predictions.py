"""scripts/fresh_predictions.py without running anything: which shipped scenarios it
runs (a topology and a workload) and why it leaves the others out, how it shortens a
run, and its refusals (an unknown --only name, bad iteration counts)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "scripts" / "fresh_predictions.py"


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("fresh_predictions", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_shipped_run_scenario_is_run_and_the_others_say_why() -> None:
    m = _script()
    runs, left = m.shipped(None)
    names = [f.stem for f in runs]
    assert {"atlas-2dc", "atlas-3dc", "atlas-4dc", "dp-2dc", "quickstart"} <= set(names)
    assert not {"program-2dc", "sweep-paper", "whatif-scale"} & set(names)
    why = {line.split(":")[0]: line for line in left}
    assert "program scenario" in why["scenarios/program-2dc.yaml"]
    assert "a sweep (its points are atlas-3dc.yaml" in why["scenarios/sweep-paper.yaml"]
    assert "builds no network" in why["scenarios/whatif-scale.yaml"]
    assert len(runs) + len(left) == len(list((ROOT / "scenarios").glob("*.yaml")))
    # --only keeps its own order
    assert [f.stem for f in m.shipped(["quickstart", "atlas-2dc"])[0]] == ["quickstart", "atlas-2dc"]


def test_a_run_is_shortened_but_never_lengthened() -> None:
    m = _script()
    sets = m.short_sets(ROOT / "scenarios" / "atlas-2dc.yaml", 2, 2)  # ships 6 measured, 3 warm-up
    assert sets == ["--set", "workload.iterations=2", "--set", "workload.warmup=2"]
    sets = m.short_sets(ROOT / "scenarios" / "quickstart.yaml", 5, 5)  # ships 2 and 2
    assert sets == ["--set", "workload.iterations=2", "--set", "workload.warmup=2"]
    assert m.short_sets(ROOT / "scenarios" / "faults-2dc.yaml", 1, 0) == []  # its outage is timed to them
    assert m.short_sets(ROOT / "scenarios" / "lossy-4dc.yaml", 2, 2) == []  # a lossy link: two are a few draws


@pytest.mark.parametrize(("args", "message"), [
    (["--only", "no-such"], "--only: no scenarios/no-such.yaml (known: "),
    (["--iterations", "0"], "--iterations must be at least 1 and --warmup at least 0 (got 0, 2)"),
])
def test_refusals_name_what_was_wrong(args: list[str], message: str, tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, str(SCRIPT), "--out", str(tmp_path), "--report-only", *args],
                          capture_output=True, text=True, cwd=ROOT)
    assert done.returncode != 0 and message in done.stderr


def test_report_only_without_runs_says_so(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, str(SCRIPT), "--out", str(tmp_path), "--report-only"],
                          capture_output=True, text=True, cwd=ROOT)
    assert done.returncode != 0 and f"no table: no runs under {tmp_path / 'runs'} (run without --report-only" in done.stderr
    (tmp_path / "runs").mkdir()
    done = subprocess.run([sys.executable, str(SCRIPT), "--out", str(tmp_path), "--report-only"],
                          capture_output=True, text=True, cwd=ROOT)
    assert done.returncode != 0 and "no table: no summary.json under" in done.stderr
