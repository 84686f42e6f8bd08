"""testbed_core.atomic: a reader sees the old file or the new one, never a part."""

from __future__ import annotations

from pathlib import Path

import pytest

from testbed_core.atomic import write_text_atomic


def test_replaces_the_whole_file_and_leaves_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "a.json"
    target.write_text("old")
    assert write_text_atomic(target, "new content") == target
    assert target.read_text() == "new content"
    assert [p.name for p in tmp_path.iterdir()] == ["a.json"]


def test_a_failed_write_keeps_the_old_file_and_removes_its_temporary(tmp_path: Path) -> None:
    target = tmp_path / "a.json"
    target.write_text("old")

    with pytest.raises(TypeError):
        write_text_atomic(target, 42)  # type: ignore[arg-type]  # not text: the write fails
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["a.json"]


def test_a_private_file_is_written_with_its_mode(tmp_path: Path) -> None:
    import stat

    target = write_text_atomic(tmp_path / "record.json", "{}", mode=0o600)
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
