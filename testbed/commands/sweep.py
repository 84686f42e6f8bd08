"""`testbed sweep SWEEP.yaml`: run a scenario over a parameter grid, resumably, into a
new folder by default (`--resume DIR` continues one, `--keep` keeps the result)."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path

import click

from testbed_core.configfile import ConfigError


def _load_runner(ref: str | None):
    """`module:function` given with --runner, or None for testbed.run.runner.run_scenario."""
    if ref is None:
        if importlib.util.find_spec("testbed.run.runner") is None:
            raise click.ClickException(
                "the scenario runner (testbed/run/runner.py) is not installed in this checkout; "
                "`testbed sweep` runs points with it"
            )
        return None
    module_name, _, attr = ref.partition(":")
    if not module_name or not attr:
        raise click.ClickException(f"--runner {ref!r}: expected module:function")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise click.ClickException(f"--runner {ref!r}: cannot import {module_name} ({exc})") from None
    runner = getattr(module, attr, None)
    if not callable(runner):
        raise click.ClickException(f"--runner {ref!r}: {module_name} has no function {attr!r}")
    return runner


@click.command()
@click.argument("sweep_file", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--out", "-o", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="New or empty result folder (default: a new results/<sweep name>-<UTC time>/).")
@click.option("--resume", type=click.Path(file_okay=False, path_type=Path), default=None, metavar="DIR",
              help="Continue the sweep in DIR (an earlier run's folder): finished points are skipped, "
                   "failed and unfinished ones rerun.")
@click.option("--jobs", "-j", type=click.IntRange(1, 64), default=1, show_default=True,
              help="Points run at once, each in its own process and emulation.")
@click.option("--lock", type=click.Path(dir_okay=False, path_type=Path), default=None, metavar="FILE",
              help="Hold an exclusive flock on FILE while each point runs, so that other emulations "
                   "taking the same lock (`flock FILE ...`) never run beside a point on a shared machine.")
@click.option("--set", "sets", multiple=True, metavar="PATH=VALUE",
              help="Fixed override for every point, e.g. --set workload.iterations=3 (repeatable).")
@click.option("--dry-run", is_flag=True, help="Validate the sweep and list its points; run nothing.")
@click.option("--keep", is_flag=True,
              help="Keep the results' small files (summaries, provenance, table, plots) in the repository, under "
                   "results/<sweep name>/ (testbed/report/keep.py).")
@click.option("--runner", "runner_ref", default=None, hidden=True,
              help="module:function used instead of testbed.run.runner.run_scenario (tests, custom runners).")
def sweep(sweep_file: Path, out: Path | None, resume: Path | None, jobs: int, lock: Path | None,
          sets: tuple[str, ...], dry_run: bool, keep: bool, runner_ref: str | None) -> None:
    """Run SWEEP_FILE's base scenario at every point of its parameter grid.

    Each run writes to a new folder (results/<sweep name>-<UTC time>/ unless --out
    names one), so it never skips points because of, or writes into, a kept result.
    Each point gets its own folder with its resolved scenario, point.json and
    provenance; failed points are recorded and the sweep goes on. --resume DIR
    continues an interrupted or partly failed sweep: finished points are skipped, the
    rest rerun. At the end, results.csv, plots and a summary table are written (rebuild
    them with `testbed report DIR`); --keep copies the small ones to the kept result
    results/<sweep name>/ (replacing what was kept there).
    """
    from testbed.report import build_report
    from testbed.run.scenario import parse_set_options
    from testbed.sweep import (
        SweepError,
        choose_out_dir,
        is_finished,
        load_sweep,
        run_sweep,
        sweep_size_text,
    )

    try:
        plan = load_sweep(sweep_file, parse_set_options(sets))
        out = choose_out_dir(plan, out, resume)
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"sweep {plan.name}: {sweep_size_text(plan)} -> {out}", err=True)
    if dry_run:
        for point in plan.points:
            done = "done" if is_finished(out / point.id, point) else "to run"
            click.echo(f"{point.id}  seed={point.seed}  {done}")
        return
    runner = _load_runner(runner_ref)
    interrupted = False
    try:
        outcomes = run_sweep(plan, out, jobs=jobs, runner=runner, lock=lock)
    except SweepError as exc:
        raise click.ClickException(str(exc)) from None
    except KeyboardInterrupt:
        interrupted = True
        outcomes = []
    report = build_report(out)
    click.echo(report.table)
    click.echo(f"\ntable: {report.csv}", err=True)
    for plot in report.plots:
        click.echo(f"plot:  {plot}", err=True)
    if keep and not interrupted:
        from testbed.commands.report import _keep

        _keep(out, None)
    if interrupted:
        click.echo(f"interrupted: finished points are kept; add --resume {out} to the same command "
                   "to finish the sweep", err=True)
        sys.exit(130)
    failed = [o for o in outcomes if o.status == "failed"]
    if failed:
        click.echo(f"\n{len(failed)} of {len(outcomes)} points failed (rerun them: the same command with "
                   f"--resume {out}):", err=True)
        for o in failed:
            click.echo(f"  {o.id}: {o.error}  (see {out / o.id / 'traceback.txt'})", err=True)
        sys.exit(1)
