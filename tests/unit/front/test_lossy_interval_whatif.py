"""scripts/lossy_interval_whatif.py refuses what it cannot re-plan, saying what it needs."""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "scripts" / "lossy_interval_whatif.py"


def _run(monkeypatch: pytest.MonkeyPatch, *args: str) -> str:
    monkeypatch.setattr(sys, "argv", [str(SCRIPT), *args])
    with pytest.raises(SystemExit) as exc:
        runpy.run_path(str(SCRIPT), run_name="__main__")
    return str(exc.value)


def test_a_folder_that_is_not_a_run_is_refused(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    message = _run(monkeypatch, str(tmp_path), "--warmup", "1", "--iterations", "8")
    assert message == f"{tmp_path}: needs summary.json and scenario.resolved.yaml (a `testbed run` folder)"


def test_iteration_counts_out_of_range_are_refused(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    message = _run(monkeypatch, str(tmp_path), "--warmup", "1", "--iterations", "0")
    assert message == "--warmup must be 0 or more and --iterations 1 or more, got 1 and 0"
