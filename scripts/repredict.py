"""Re-make kept runs' a-priori predictions from their own calibration with this
checkout's planner, next to what they measured and what the run itself predicted.

Each run folder needs its `summary.json` and `scenario.resolved.yaml` (a sweep point
keeps both; `--scenario` gives the scenario for a folder without one). Every variant is
planned again (`testbed/report/replan.py` `replan_run`: streams, sharing, placement
and prediction from the calibration in its summary), so a change to the planner can be
judged against runs it did not see:

    .venv/bin/python scripts/repredict.py results/sweep-paper-1f1b/p00* docs/atlas-4dc

`--by-kind` adds the errors grouped by variant and regime (pacing, loss on the path,
one-way delay): how many within 5%, the median and the range, stored and now. Folders
that cannot be re-planned (no summary.json, uncalibrated, no scenario) are listed at the
end with why (exit status 2 where none could be).
`--lan-alone-as-aggregate` is a what-if, not a prediction: for runs whose calibration
did not time a DP ring alone inside the DCs (before that probe), it takes one ring
alone to move what all of them moved at once (the emulation's case, where every ring
shares the machine's cores), so that the staggered-rings model can be judged on them.

`--collisions even` is a what-if: every collision of two channels on a link split
evenly (the lockstep: the planner before 344bf99); `--collisions drawn-choices`: Atlas's
choices of streams, sharing, placement and schedule made with the collisions drawn too,
where the planner makes them with the even split and predicts only the way it chose with
them drawn (testbed/run/variants.py `_drawn_prediction`; docs/results/fidelity.md,
"Collisions drawn from the probe's rounds"). Either way the last line counts the rows
within 5%.

`--turns-from-run` is a what-if too: each run's own measured WAN transfers of its
temporal variant (its transfers.csv, measured iterations) stand in for the turns probe
that runs before the variants (testbed/run/calibration.py `calibrate_turns`; kept runs
calibrated before it have none), so that the planner's use of the plan's holds can be
judged on runs that ran a plan. It is fitted to the run: a check of the model, never a
prediction.

The before/after figures for the planner's channel windows (docs/scenarios.md, 'What a
run writes'): this script on the paper sweep kept at commit 3386d5b (`git worktree add
/tmp/old 3386d5b`, then the folders /tmp/old/results/sweep-paper/p00*): the `stored`
column is the old planner's prediction, `now` this checkout's, each with its error as
summary.json's `prediction_error` gives it (measured / predicted - 1).
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
from collections import defaultdict
from pathlib import Path

import yaml

from testbed.report.loading import ReportError
from testbed.report.replan import replan_run
from testbed.run.scenario import load_scenario
from testbed_core.contracts.calibration import Calibration, TurnsCalibration

TOLERANCE = 0.05


def regime(run: Path, scenario_file: Path | None) -> str:
    """The run's regime as the errors are grouped: pacing, loss on a WAN link, the first link's delay."""
    source = run / "scenario.resolved.yaml"
    source = source if source.exists() else scenario_file
    scenario, _ = load_scenario(source)
    links = scenario.topology.wan
    written = (yaml.safe_load(source.read_text()).get("transport") or {}).get("pacing")
    # a resolved scenario without the field ran before `pacing: auto` existed: unpaced
    pacing = {True: "paced", False: "unpaced", "auto": "pacing auto", None: "unpaced"}.get(written, "?")
    loss = "lossy" if any(link.loss > 0 for link in links) else "no loss"
    return f"{pacing}, {loss}, {links[0].delay * 1e3:g} ms"


def _assume_lan_alone() -> None:
    """The what-if: a calibration without a LAN ring timed alone takes one ring alone at
    the aggregate of all of them at once."""
    plain = Calibration.from_report.__func__  # type: ignore[attr-defined]

    def from_report(cls, r):  # noqa: ANN001, ANN202
        cal = plain(cls, r)
        if cal.lan_alone_rate_bps is None and cal.lan_rate_bps is not None and cal.lan_pairs:
            cal.lan_alone_rate_bps = len(cal.lan_pairs) * cal.lan_rate_bps
        return cal

    Calibration.from_report = classmethod(from_report)  # type: ignore[method-assign]


def _collisions(how: str) -> None:
    """The what-ifs of `--collisions`: "even" keeps every prediction on the even split;
    "drawn-choices" draws the collisions in every prediction Atlas's choices weigh."""
    import testbed.run.variants as variants

    if how == "even":
        variants._drawn_prediction = lambda setup, scenario, workload, base_dir, local: setup  # type: ignore[assignment]
    elif how == "drawn-choices":
        plain = variants._net_per_path

        def drawn_everywhere(setup, scenario, local):  # noqa: ANN001, ANN202
            setup.draw_collisions = True
            return plain(setup, scenario, local)

        variants._net_per_path = drawn_everywhere  # type: ignore[assignment]


def _turns_from_run() -> None:
    """The what-if: a run's calibration gets, on each path its temporal variant crossed,
    the turns figures of that variant's own measured transfers (each way, planned holds
    of the alone probe's time on the wire, token_margin longer). Sets the run to read
    before each `replan_run` (`_TURNS_RUN`)."""
    plain = Calibration.from_report.__func__  # type: ignore[attr-defined]

    def from_report(cls, r):  # noqa: ANN001, ANN202
        cal = plain(cls, r)
        run = _TURNS_RUN.get("run")
        if run is None:
            return cal
        summary = json.loads((run / "summary.json").read_text())
        margin = float((summary.get("runner") or {}).get("token_margin", 0.2) or 0.0)
        variants = summary.get("variants") or {}
        for name, v in (variants.items() if isinstance(variants, dict) else ()):
            if v.get("sharing") != "temporal" or not (run / name / "transfers.csv").exists():
                continue
            with open(run / name / "transfers.csv") as f:
                rows = [x for x in csv.DictReader(f) if x["links"] and int(x["iteration"]) >= summary["warmup"]]
            n = int(v["streams"])
            for pc in cal.paths:
                a, z = pc.dcs
                ways = [[float(x["arrived"]) - float(x["sent"]) for x in rows if x["links"] == link]
                        for link in (f"{a}->{z}", f"{z}->{a}")]
                if n in pc.transfer_s and all(ways):
                    slot = (statistics.median(pc.transfer_s[n]) - pc.latency_s) * (1 + margin)
                    pc.turns = [TurnsCalibration(streams=n, channels=1, slot_s=slot, untimed=0,
                                                 transfer_s=ways[0], return_s=ways[1])]
        return cal

    Calibration.from_report = classmethod(from_report)  # type: ignore[method-assign]


_TURNS_RUN: dict[str, Path] = {}


def _line(errors: list[float]) -> str:
    within = sum(abs(e) <= TOLERANCE + 1e-9 for e in errors)
    return (f"{within:3d}/{len(errors):<3d} median {statistics.median(errors):+6.1%}  "
            f"{min(errors):+6.1%} to {max(errors):+6.1%}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", type=Path, help="run or sweep-point folders")
    ap.add_argument("--scenario", type=Path, help="the scenario of folders without scenario.resolved.yaml")
    ap.add_argument("--by-kind", action="store_true", help="also the errors grouped by variant and regime")
    ap.add_argument("--lan-alone-as-aggregate", action="store_true",
                    help="what-if: a LAN ring alone moves what all the calibration's rings moved at once")
    ap.add_argument("--collisions", choices=("drawn", "even", "drawn-choices"), default="drawn",
                    help="what-if: collisions split evenly, or drawn in Atlas's choices too (default: the planner)")
    ap.add_argument("--turns-from-run", action="store_true",
                    help="what-if: each run's own measured transfers of its temporal plan stand in for the turns probe")
    args = ap.parse_args()
    if args.lan_alone_as_aggregate:
        _assume_lan_alone()
    if args.turns_from_run:
        _turns_from_run()
    if args.collisions != "drawn":
        _collisions(args.collisions)
    groups: dict[tuple[str, str], tuple[list[float], list[float]]] = defaultdict(lambda: ([], []))
    rows: list[tuple[float, float]] = []
    refused = []
    print(f"{'run':34} {'variant':13} {'measured':>8} {'stored':>13} {'now':>13}  streams, sharing now")
    for run in args.runs:
        _TURNS_RUN["run"] = run
        try:
            planned = replan_run(run, args.scenario)
        except ReportError as exc:  # listed at the end, with why
            refused.append(str(exc))
            continue
        kind = regime(run, args.scenario) if args.by_kind else ""
        for v in planned:
            measured, stored = v.ran.iteration_time_s, v.ran.predicted_iteration_time_s
            print(f"{run.name[:34]:34} {v.name:13} {measured:8.3f} {stored:7.3f} {measured / stored - 1:+5.0%} "
                  f"{v.now_s:7.3f} {v.error:+5.0%}  {v.setup.streams}, {v.setup.sharing}")
            groups[v.name, kind][0].append(measured / stored - 1)
            groups[v.name, kind][1].append(v.error)
            rows.append((measured / stored - 1, v.error))
    within = [sum(abs(e[k]) <= TOLERANCE + 1e-9 for e in rows) for k in (0, 1)]
    print(f"\n{within[1]} of {len(rows)} rows within {TOLERANCE:.0%} now (stored: {within[0]})")
    if args.by_kind:
        print(f"\n{'variant':13} {'regime':28} {'stored: within, median, range':42} now: within, median, range")
        for (name, kind), (stored, now) in sorted(groups.items()):
            print(f"{name:13} {kind:28} {_line(stored):42} {_line(now)}")
    for why in refused:
        print(f"not re-planned: {why}")
    if refused and not rows:
        raise SystemExit(2)


if __name__ == "__main__":
    main()
