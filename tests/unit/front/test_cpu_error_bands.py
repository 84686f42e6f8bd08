"""scripts/cpu_error_bands.py: rows grouped by the run's own CPU, rows without it or with
other programs busy left out; and on the kept results (the table's own rows)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

from testbed.report.predictions import PredictionRow

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "scripts" / "cpu_error_bands.py"


def _row(error: float, run: float | None, outside: float | None = 0.0) -> PredictionRow:
    return PredictionRow(source="s", scenario="x", topology="t", variant="v", predicted_s=1.0, measured_s=1 + error,
                         error=error, within=abs(error) <= 0.05, calibrated=True, rates_from="probe", tail_drops=0,
                         streams=1, sharing="shared", outside_cores=outside, run_cores=run)


def test_rows_fall_in_their_band() -> None:
    spec = importlib.util.spec_from_file_location("cpu_error_bands", SCRIPT)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    rows = [_row(0.01, 0.2), _row(0.2, 1.4), _row(0.1, 1.45), _row(0.5, None), _row(0.9, 1.4, outside=0.6)]
    got = {band: [r.error for r in rs] for band, rs in mod.bands(rows, 0.2)}
    assert got[(0.0, 0.5)] == [0.01] and got[(1.3, 1.5)] == [0.2, 0.1]  # no CPU recorded, or others busy: out
    assert sum(len(v) for v in got.values()) == 3


def test_on_the_kept_held_back_runs() -> None:
    out = subprocess.run([sys.executable, str(SCRIPT), str(ROOT / "results" / "held-back" / "2dc-fast-at-12497bc")],
                         capture_output=True, text=True, check=True, timeout=120).stdout
    # its five rows: four at 1.5 cores and more (1.52-1.59), torch-gloo left out (others took 0.63)
    assert "run CPU 1.5-64.0 cores:   4 rows" in out and "0 within 5%" in out
