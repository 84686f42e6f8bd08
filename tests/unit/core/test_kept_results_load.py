"""Every result kept in the repository (results/**) still loads through the models the
toolkit writes and reads them with, and the sweep's own files come back from their
model as the very text on disk: the models describe the files as they are."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from testbed_core.contracts.demo import DemoDoc
from testbed_core.contracts.summary import ProgramSummary, Summary, is_program_summary
from testbed_core.contracts.sweep import KeptRecord, PointRecord, SweepRecord

ROOT = Path(__file__).resolve().parents[3]
RESULTS = ROOT / "results"
RECORDS = {"point.json": PointRecord, "sweep.json": SweepRecord, "kept.json": KeptRecord}


def _kept(name: str) -> list[Path]:
    return sorted(RESULTS.rglob(name))


@pytest.mark.parametrize("name", sorted(RECORDS))
def test_sweep_files_round_trip_through_their_model(name: str) -> None:
    paths = _kept(name)
    assert paths, f"no {name} under {RESULTS}"
    for path in paths:
        text = path.read_text()
        record = RECORDS[name].model_validate_json(text)
        assert json.dumps(record.to_data(), indent=2) + "\n" == text, path


def test_every_kept_summary_loads() -> None:
    paths = _kept("summary.json") + sorted((ROOT / "docs").rglob("summary.json"))
    assert paths
    for path in paths:
        text = path.read_text()
        model = ProgramSummary if is_program_summary(text) else Summary
        model.model_validate_json(text)


def test_the_kept_demo_json_round_trips() -> None:
    text = (ROOT / "docs" / "demo.json").read_text()
    assert json.dumps(DemoDoc.model_validate_json(text).model_dump(), indent=2, default=str) + "\n" == text
