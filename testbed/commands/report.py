"""`testbed report DIR`: rebuild the table and plots from result folders alone;
`testbed report predictions DIR...`: the a-priori prediction errors of runs."""

from __future__ import annotations

from pathlib import Path

import click

from testbed_core.configfile import ConfigError


@click.command()
@click.argument("paths", nargs=-1, required=True, type=click.Path(exists=True, path_type=Path))
@click.option("--out", "-o", type=click.Path(file_okay=False, path_type=Path), default=Path("."), show_default=True,
              help="Where to write prediction-errors.csv and prediction-errors.json.")
@click.option("--tolerance", type=click.FloatRange(0, 1), default=0.05, show_default=True,
              help="The error (either way, a fraction) within which a prediction counts as holding.")
def predictions(paths: tuple[Path, ...], out: Path, tolerance: float) -> None:
    """Print the a-priori prediction errors of runs: per variant, the iteration time the
    planner predicted before it ran against the one it measured (measured / predicted - 1),
    rows beyond the tolerance marked, with the WAN queues' tail drops beside them.

    PATHS are `testbed run` output folders, sweep folders, or any folder holding them
    (searched to any depth for summary.json and kept *.summary.json files), or such files.
    """
    from testbed.report.predictions import prediction_table

    try:
        table = prediction_table(paths, tolerance)
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(table.text())
    for line in table.skipped:
        click.echo(f"skipped: {line}", err=True)
    csv_path, json_path = table.write(out)
    click.echo(f"table: {csv_path}, {json_path}", err=True)


class _ReportCommand(click.Command):
    """`testbed report RESULT_DIR`, or `testbed report predictions PATHS...` when the
    first word is `predictions` (a result folder of that name: `testbed report ./predictions`)."""

    def make_context(self, info_name: str | None, args: list[str], parent: click.Context | None = None,
                     **extra: object) -> click.Context:
        if args and args[0] == "predictions":
            return predictions.make_context(f"{info_name} predictions", args[1:], parent=parent, **extra)  # type: ignore[arg-type]
        return super().make_context(info_name, args, parent=parent, **extra)  # type: ignore[arg-type]


@click.command(cls=_ReportCommand, epilog=(
    "testbed report predictions PATHS... prints the a-priori prediction errors (predicted against measured "
    "iteration time per variant) of every run under PATHS and writes prediction-errors.csv/.json "
    "(testbed report predictions --help)."))
@click.argument("result_dir", type=click.Path(file_okay=False, path_type=Path))
@click.option("--out", "-o", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Where to write results.csv and the plots (default: RESULT_DIR).")
@click.option("--keep", is_flag=True,
              help="A sweep: also keep its small files (summaries, provenance, table, plots) in the repository, "
                   "under results/<sweep name>/ (testbed/report/keep.py).")
@click.option("--keep-to", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="With --keep: keep them in this folder instead.")
def report(result_dir: Path, out: Path | None, keep: bool, keep_to: Path | None) -> None:
    """Rebuild results.csv, the plots and summary.txt from RESULT_DIR.

    RESULT_DIR is a `testbed sweep` folder (one row per point x variant, plots against
    the swept parameters) or one `testbed run` output folder (bars per variant).
    With --keep, a sweep's small files go to results/<sweep name>/ as well, where
    git tracks them.
    """
    from testbed.report import build_report

    try:
        rep = build_report(result_dir, out)
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(rep.table)
    counts = ", ".join(f"{n} {status}" for status, n in sorted(rep.counts.items()))
    click.echo(f"\n{rep.results.kind} {rep.results.name}: {len(rep.results.points)} point(s) ({counts})", err=True)
    click.echo(f"table: {rep.csv}", err=True)
    for plot in rep.plots:
        click.echo(f"plot:  {plot}", err=True)
    if keep or keep_to is not None:
        _keep(result_dir, keep_to)


def _keep(result_dir: Path, keep_to: Path | None) -> None:
    """Keep a sweep's small files (testbed/report/keep.py) and say where."""
    from testbed.report.keep import keep_results

    try:
        kept = keep_results(result_dir, keep_to)
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"kept:  {len(kept.files)} files, {kept.total_bytes / 1e3:.0f} kB in {kept.folder} "
               f"(git add {kept.folder} to commit them)", err=True)
