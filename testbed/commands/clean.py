"""`testbed clean`: remove what crashed runs of the toolkit left behind.

Works only from the toolkit's own run records (/run/testbed/<prefix>.json) and the
run's mark: each recorded process is ended only after its start time and its run mark
are verified, a process the record does not name yet only when it carries the mark
(TESTBED_RUN=<prefix> in the environment it started with: the warm-start fork server
and all it forked have it), records of runs still in progress are skipped, and nothing
else is touched. Processes get SIGTERM, SIGKILL after a short grace, and the command
returns only once every one is gone, or names the one that is not and why (then exit
status 1, the record kept). Never Mininet's global cleanup (`mn -c`).
"""

from __future__ import annotations

import os
import sys

import click


@click.command()
@click.option("--dry-run", is_flag=True, help="only say what would be removed")
def clean(dry_run: bool) -> None:
    """Remove leftovers (processes, namespaces, links, records) of crashed runs; returns
    once every process of them is gone."""
    from testbed.emulation.cleanup import clean as do_clean
    from testbed.emulation.records import RECORD_DIR

    if os.geteuid() != 0:
        raise click.ClickException(f"cleaning needs to read {RECORD_DIR} and kill processes: run as root (sudo)")
    report = do_clean(dry_run=dry_run)
    for problem in report.problems:
        click.echo(f"warning: {problem}", err=True)
    if not report.actions:
        click.echo("nothing to clean")
        return
    verb = "would" if dry_run else "did"
    for action in report.actions:
        if action.kind == "skip":
            click.echo(f"skipped        {action.target}  ({action.detail})")
        else:
            click.echo(f"{verb} {action.describe()}")
    for failure in report.failures:
        click.echo(f"failed: {failure}", err=True)
    if report.failures:
        sys.exit(1)
