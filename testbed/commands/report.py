"""`testbed report DIR`: rebuild the table and plots from result folders alone."""

from __future__ import annotations

from pathlib import Path

import click

from testbed_core.configfile import ConfigError


@click.command()
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
