"""scripts/repredict.py on kept runs: the planner's prediction against the collisions'
what-ifs (`--collisions even`: the lockstep; `drawn-choices`: Atlas's choices drawn too)
and the closing count of rows within 5%."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
RUN = ROOT / "results" / "prediction-errors" / "at-344bf99" / "runs" / "atlas-2dc"


def _rows(*args: str) -> tuple[dict[str, float], str]:
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "repredict.py"), *args, str(RUN)],
                         capture_output=True, text=True, check=True, cwd=ROOT, timeout=120).stdout
    now = {m[1]: float(m[2]) for m in re.finditer(r"^atlas-2dc\s+(\S+)\s+\S+\s+\S+\s+\S+\s+(\S+)", out, re.M)}
    return now, out.strip().splitlines()[-1]


def test_the_lockstep_what_if_slows_only_the_drawn_shared_way() -> None:
    """The kept atlas-2dc run at 344bf99: its multi-TCP channels collide on the uncapped
    2dc link, so the planner's prediction (drawn, its stored 2.004 s) is faster than the
    lockstep's; baseline and Atlas's plan do not draw; the last line counts the rows."""
    drawn, last = _rows()
    even, _ = _rows("--collisions", "even")
    assert set(drawn) == {"baseline", "multi-tcp", "atlas"}
    assert abs(drawn["multi-tcp"] - 2.004) < 0.002
    assert even["multi-tcp"] > 1.1 * drawn["multi-tcp"]
    assert even["baseline"] == drawn["baseline"] and even["atlas"] == drawn["atlas"]
    assert re.fullmatch(r"\d of 3 rows within 5% now \(stored: \d\)", last)
    # every prediction drawn: multi-TCP, which chooses nothing, differs only by the one-way
    # weighing made on a drawn iteration rather than the even split's (within 1%)
    choices, _ = _rows("--collisions", "drawn-choices")
    assert choices["baseline"] == drawn["baseline"]
    assert abs(choices["multi-tcp"] / drawn["multi-tcp"] - 1) < 0.01


def test_a_folder_it_cannot_re_plan_is_listed_with_why(tmp_path: Path) -> None:
    """A folder without summary.json beside a kept run: the run is re-planned, the folder
    listed at the end with why (status 0); the folder alone: status 2."""
    script = [sys.executable, str(ROOT / "scripts" / "repredict.py")]
    both = subprocess.run([*script, str(tmp_path), str(RUN)], capture_output=True, text=True, cwd=ROOT,
                          timeout=120)
    assert both.returncode == 0, both.stderr
    assert re.search(r"^atlas-2dc\s+baseline", both.stdout, re.M)
    assert f"not re-planned: {tmp_path}: no summary.json" in both.stdout
    alone = subprocess.run([*script, str(tmp_path)], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert alone.returncode == 2 and "no summary.json" in alone.stdout and "Traceback" not in alone.stderr
