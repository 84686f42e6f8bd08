"""scripts/bubbletea_gantt.py draws the docs' BubbleTea Gantt chart from the kept run's
own timeline (no run): the record reads back, the least idle iterations are picked, and a
record with too few iterations is refused with a message."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


def _script():
    spec = importlib.util.spec_from_file_location("bubbletea_gantt", ROOT / "scripts" / "bubbletea_gantt.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["bubbletea_gantt"] = module
    spec.loader.exec_module(module)
    return module


def test_the_chart_is_drawn_from_the_kept_record(tmp_path: Path, capsys) -> None:
    gantt = _script()
    text, its = gantt.read_record(gantt.KEPT)
    lines = gantt.timelines(text)
    assert len(lines) == 4 and any(r.kind == "prefill" for recs in lines.values() for r in recs)
    out = tmp_path / "g.png"
    assert gantt.main(["--out", str(out)]) == 0
    assert out.stat().st_size > 10_000
    assert "devices busy 94.9%" in capsys.readouterr().out


def test_too_few_iterations_are_refused(tmp_path: Path) -> None:
    gantt = _script()
    text, its = gantt.read_record(gantt.KEPT)
    (tmp_path / "timeline.csv").write_text(text)
    (tmp_path / "iterations.json").write_text(json.dumps({"starts": its["starts"][:4], "ends": its["ends"][:4]}))
    with pytest.raises(SystemExit, match="fewer than 2 measured iterations after 3 warm-ups"):
        gantt.main(["--record", str(tmp_path), "--out", str(tmp_path / "g.png")])
