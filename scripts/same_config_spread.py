"""How far apart two variants of one run measure when they ran the same configuration.

Multi-TCP and Atlas often run the same way (Atlas's choice can be multi-TCP's own: the
same streams, sharing, schedule and hosts), one after the other in one run on the same
emulated network, and the planner then predicts them alike. The difference between their
measured iteration times is the run's own spread for that configuration: no a-priori
prediction can be within 5% of both where they differ by more than about 10%, and a
prediction error smaller than this spread says nothing about the model. This script
lists each such group in kept runs:

    .venv/bin/python scripts/same_config_spread.py results/prediction-errors/at-*/runs/* --csv OUT.csv

A group: the plain variants (no ``+bubbletea`` twins) of one run with the same streams,
sharing, schedule, stages' DCs and hosts, no temporal plan, and the same a-priori
prediction (within 0.1%: the planner sees them as one configuration;
testbed/report/predictions.py `same_way_groups`, which `testbed report predictions`
also shows). Spread: the slower's measured iteration time over the faster's, minus 1.
The last line counts the groups whose spread is above 5%.
"""

from __future__ import annotations

import argparse
import csv
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from testbed.report.loading import ReportError, read_summary_file  # noqa: E402
from testbed.report.predictions import same_way_groups, same_way_spread, same_way_times  # noqa: E402
from testbed_core.contracts.summary import VariantResult  # noqa: E402


@dataclass(frozen=True)
class Group:
    run: str
    variants: tuple[str, ...]
    streams: int
    sharing: str
    predicted_s: float
    measured_s: tuple[float, ...]
    spread: float  # testbed/report/predictions.py `same_way_spread`


def groups_of(folder: Path) -> list[Group]:
    """The same-way groups of the run in `folder` (testbed/report/predictions.py
    `same_way_groups`; none without a summary), each variant's headline iteration time
    (the median of its repeats where repeated)."""
    summary = read_summary_file(folder / "summary.json", ReportError)
    if summary is None:
        return []
    out = []
    for names in same_way_groups(summary):
        vs = [summary.variants[n] for n in names]
        assert all(isinstance(v, VariantResult) for v in vs)
        first = vs[0]
        out.append(Group(str(folder), names, first.streams, first.sharing,  # type: ignore[union-attr]
                         min(v.predicted_iteration_time_s for v in vs),  # type: ignore[union-attr]
                         tuple(same_way_times(summary, names)), same_way_spread(summary, names)))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", type=Path, help="`testbed run` output folders (or sweep points)")
    ap.add_argument("--csv", type=Path, help="also write the groups to this CSV file")
    args = ap.parse_args(argv)
    groups: list[Group] = []
    for folder in args.runs:
        try:
            groups += groups_of(folder)
        except ReportError as exc:
            print(f"skipped {folder}: {exc}", file=sys.stderr)
    print(f"{'run':<60} {'variants':<22} {'way':<12} {'predicted':>9} {'measured':>17} {'spread':>7}")
    for g in groups:
        measured = " / ".join(f"{m:.3f}" for m in g.measured_s)
        print(f"{g.run[-60:]:<60} {','.join(g.variants):<22} {f'{g.streams}, {g.sharing}':<12} "
              f"{g.predicted_s:>9.3f} {measured:>17} {g.spread:>+7.1%}")
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["run", "variants", "streams", "sharing", "predicted_s", "measured_s", "spread"])
            for g in groups:
                w.writerow([g.run, " ".join(g.variants), g.streams, g.sharing, f"{g.predicted_s:.6f}",
                            " ".join(f"{m:.6f}" for m in g.measured_s), f"{g.spread:.6f}"])
    wide = sum(g.spread > 0.05 for g in groups)
    print(f"{wide} of {len(groups)} groups measured more than 5% apart")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
