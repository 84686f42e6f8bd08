"""Prediction error against the run's own CPU, over kept runs.

Every variant row that recorded the machine's CPU (summary ``machine_cpu``, since
bcbf1b5) and ran with other programs under `--outside` cores, from `testbed report
predictions`' own table (testbed/report/predictions.py `prediction_table`), grouped by
the cores the run itself kept busy: per band, how many rows, their median error, how many
within the tolerance. Where a run's own work nears the machine's cores, the emulation is
near CPU-bound and its times follow the CPU as well as the network.

    .venv/bin/python scripts/cpu_error_bands.py results
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from testbed.report.predictions import PredictionRow, prediction_table  # noqa: E402

BANDS = ((0.0, 0.5), (0.5, 0.8), (0.8, 1.1), (1.1, 1.3), (1.3, 1.5), (1.5, 64.0))


def bands(rows: list[PredictionRow], outside: float) -> list[tuple[tuple[float, float], list[PredictionRow]]]:
    """The rows with the run's CPU recorded and other programs under `outside` cores, per band."""
    kept = [r for r in rows if r.run_cores is not None and (r.outside_cores or 0.0) < outside]
    return [((lo, hi), [r for r in kept if lo <= r.run_cores < hi]) for lo, hi in BANDS]  # type: ignore[operator]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("paths", nargs="+", type=Path, help="run, sweep or results folders")
    ap.add_argument("--outside", type=float, default=0.2, help="leave out rows where other programs took this many cores")
    args = ap.parse_args(argv)
    table = prediction_table(args.paths)
    for (lo, hi), rows in bands(table.rows, args.outside):
        if not rows:
            continue
        errors = [r.error for r in rows]
        print(f"run CPU {lo:.1f}-{hi:.1f} cores: {len(rows):3d} rows, median error {statistics.median(errors):+.1%}, "
              f"{sum(r.within for r in rows)} within {table.tolerance:.0%}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
