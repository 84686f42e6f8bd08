"""scripts/same_config_spread.py on kept runs: variants of one run that ran one
configuration, their measured spread, and the closing count."""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
KEPT = ROOT / "results" / "prediction-errors"


def _run(*folders: Path, csv_out: Path | None = None) -> list[str]:
    extra = ["--csv", str(csv_out)] if csv_out else []
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "same_config_spread.py"), *map(str, folders), *extra],
                         capture_output=True, text=True, check=True, cwd=ROOT, timeout=120)
    return out.stdout.strip().splitlines()


def test_multi_tcp_and_atlas_on_one_way_form_a_group_with_their_spread(tmp_path: Path):
    """dp-2dc at c5ae581: Atlas took multi-TCP's 8 shared streams (both predicted 1.502 s)
    and measured 1.325 s against 1.418 (7.1% apart); at 344bf99 1.396 and 1.420 (1.7%).
    The baseline (one stream) and dp-across-dc ran other ways: no group."""
    wide, close = KEPT / "at-c5ae581" / "runs" / "dp-2dc", KEPT / "at-344bf99" / "runs" / "dp-2dc"
    lines = _run(wide, close, csv_out=tmp_path / "g.csv")
    assert lines[-1] == "1 of 2 groups measured more than 5% apart"
    rows = list(csv.DictReader((tmp_path / "g.csv").open()))
    assert [(r["variants"], r["streams"], r["sharing"]) for r in rows] == [("multi-tcp atlas", "8", "shared")] * 2
    assert [round(float(r["spread"]), 3) for r in rows] == [0.071, 0.017]


def test_a_temporal_plan_is_no_one_way_with_a_shared_variant():
    """atlas-2dc at 344bf99: Atlas ran its temporal plan, multi-TCP shared links, the
    baseline one stream: three ways, no group."""
    assert _run(KEPT / "at-344bf99" / "runs" / "atlas-2dc")[-1] == "0 of 0 groups measured more than 5% apart"
