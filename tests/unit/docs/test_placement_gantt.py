"""scripts/placement_gantt.py draws multi-dc.md's predicted Gantt charts from the kept
atlas-4dc run: each stage's row named by its DC, the WAN rows the placement crosses
(Atlas's two crossings avoid the slow mid-edge link the even placement uses), and an
unknown variant refused with the ones there are."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def script():
    spec = importlib.util.spec_from_file_location("placement_gantt", ROOT / "scripts" / "placement_gantt.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["placement_gantt"] = module
    spec.loader.exec_module(module)
    return module


def test_the_chart_s_rows_follow_the_placement(script) -> None:
    planned = {v.name: v for v in script.replan_run(ROOT / "docs" / "atlas-4dc")}
    links = {}
    for name in ("atlas", "baseline"):
        lines, transfers = script.records(planned[name].setup.prediction)
        assert len(lines) == 10 and all(recs for recs in lines.values())
        assert {r.kind for recs in lines.values() for r in recs} == {"forward", "backward"}
        links[name] = {link for t in transfers for link in t.links}
    assert "east-p0r0" in lines and "edge-p0r4" in lines  # the even placement ends in edge
    assert "mid->edge" in links["baseline"] and not any("edge" in link for link in links["atlas"])


def test_an_unknown_variant_or_folder_is_refused(script, tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match=r"no variant nope ran there \(it has baseline, multi-tcp, atlas"):
        script.main(["--variants", "nope", "--out-dir", str(tmp_path)])
    with pytest.raises(SystemExit, match=r"not a kept run's folder with its summary.json"):
        script.main([str(tmp_path)])
