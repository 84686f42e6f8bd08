"""testbed/provenance.py: the record written beside every sweep point reads back
through its model, and every kept provenance.json fits it."""

from __future__ import annotations

from pathlib import Path

from testbed.provenance import collect_provenance, read_provenance, write_provenance
from testbed_core.constants import REPO_ROOT


def test_written_record_reads_back(tmp_path: Path) -> None:
    record = collect_provenance(seed=7, delay_backend="relay")
    write_provenance(tmp_path / "provenance.json", record)
    back = read_provenance(tmp_path / "provenance.json")
    assert back == record and back.seed == 7 and back.delay_backend == "relay"
    assert back.packages["pydantic"] is not None


def test_kept_provenance_files_fit_the_model() -> None:
    kept = sorted(REPO_ROOT.glob("results/**/provenance.json")) + sorted(REPO_ROOT.glob("docs/**/provenance.json"))
    for path in kept:
        read_provenance(path)  # raises, naming the field, for one that does not fit
