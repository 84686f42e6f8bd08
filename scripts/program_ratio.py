"""The pipelining example's point, measured: seconds per step with BACKEND=atlas against
gloo, across the WAN of topologies/2dc.yaml (50 ms RTT, 1 Gbit/s, 1 MB per-flow windows)
and inside one DC (topologies/1dc-lan.yaml, no WAN, ATLAS_STREAMS left to the backend). The target: atlas at most 1/4 of
gloo's seconds per step across the WAN, and within 10% of gloo on the LAN.

    sudo .venv/bin/python scripts/program_ratio.py [--steps 6] [--out results/bench-program-ratio]

Runs scenarios/program-2dc.yaml twice through testbed/run/program.py (once on each
topology), prints the table and writes ``ratio.json`` (and each run's summary.json)
under --out. Timing figures: run it on a quiet machine; tests/floors/test_program_ratio_floor.py
asserts the same targets under `make floors`.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from testbed.run.program import program_table, run_program_scenario  # noqa: E402
from testbed.run.scenario import ProgramScenario, apply_override, resolve_scenario, validate_any  # noqa: E402
from testbed_core.contracts.summary import ProgramSummary  # noqa: E402

SCENARIO = REPO / "scenarios" / "program-2dc.yaml"
LAN = REPO / "topologies" / "1dc-lan.yaml"


def measure(where: str, steps: int, work: Path) -> ProgramSummary:
    """One run of the pipelining scenario: `where` is "wan" (its own 2dc) or "lan" (1dc-lan)."""
    data = resolve_scenario(SCENARIO)
    if where == "lan":
        from testbed.run.scenario import ScenarioError
        from testbed_core.configfile import read_yaml_mapping

        data["topology"] = read_yaml_mapping(LAN, "topology", ScenarioError)
        apply_override(data, "program.hosts", ["dc1-h1", "dc1-h2"])
        # the backend's own choice on a path under 2 ms RTT (1 stream), not the WAN's 8
        data["program"]["env"].pop("ATLAS_STREAMS", None)
    command = list(data["program"]["command"])
    i = command.index("--steps")
    command[i + 1] = str(steps)
    apply_override(data, "program.command", command)
    scenario = validate_any(data)
    assert isinstance(scenario, ProgramScenario)
    return run_program_scenario(scenario, data, work / where)


def ratios(wan: ProgramSummary, lan: ProgramSummary) -> dict[str, float | None]:
    def s(summary: ProgramSummary, v: str) -> float | None:
        entry = summary.result(v)
        return entry.seconds_per_step if entry is not None and entry.ok else None

    out: dict[str, float | None] = {}
    for name, summary in (("wan", wan), ("lan", lan)):
        gloo, atlas = s(summary, "gloo"), s(summary, "atlas")
        out[f"{name}_gloo_s"] = gloo
        out[f"{name}_atlas_s"] = atlas
        out[f"{name}_atlas_over_gloo"] = atlas / gloo if gloo and atlas else None
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--out", type=Path, default=REPO / "results" / "bench-program-ratio")
    args = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="program-ratio-"))
    try:
        wan = measure("wan", args.steps, work)
        lan = measure("lan", args.steps, work)
        figures = ratios(wan, lan)
        args.out.mkdir(parents=True, exist_ok=True)
        for name in ("wan", "lan"):
            shutil.copy(work / name / "summary.json", args.out / f"{name}-summary.json")
        (args.out / "ratio.json").write_text(json.dumps(figures, indent=2) + "\n")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print("across the WAN (topologies/2dc.yaml):\n" + program_table(wan))
    print("\ninside one DC (topologies/1dc-lan.yaml):\n" + program_table(lan))
    print(f"\natlas / gloo seconds per step: WAN {figures['wan_atlas_over_gloo']}, LAN {figures['lan_atlas_over_gloo']}"
          f"  (targets: WAN <= 0.25, LAN <= 1.10)\nwritten: {args.out / 'ratio.json'}")


if __name__ == "__main__":
    main()
