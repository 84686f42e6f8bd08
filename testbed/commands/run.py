"""`testbed run SCENARIO.yaml`: pipeline training across the emulated DCs, every
variant of the scenario side by side (testbed/run/runner.py).

Everything that can be known before the emulation is built is checked first, as
`testbed plan` does (testbed/run/preflight.py): the scenario file and its parts, the
variants, each variant's placement and prediction, the workload's compute model and,
for an emulated run, whether this machine can build it. A refused run creates no
result folder."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import click

from testbed_core.configfile import ConfigError
from testbed_core.variants import BUBBLETEA_SUFFIX, REGISTRY, help_text

if TYPE_CHECKING:
    from testbed.progress import Progress

T = TypeVar("T")


@click.command(epilog="\b\nVariants:\n" + help_text())
@click.argument("scenario_file", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--out", "-o", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Result folder (default results/<scenario>-<timestamp>).")
@click.option("--set", "sets", multiple=True, metavar="PATH=VALUE",
              help="Override a scenario parameter by its dotted path, e.g. --set topology.wan.0.delay=50ms "
                   "(repeatable).")
@click.option("--variants", default=None, metavar="A,B",
              help=f"Run only these variants ({', '.join(REGISTRY)}; {BUBBLETEA_SUFFIX} suffix).")
@click.option("--repeat", type=click.IntRange(min=1), default=None, metavar="N",
              help="Play the variants' measured phases N times (interleaved, one network and calibration); "
                   "summary.json reports each repeat and the median and spread per variant (runner.repeat).")
@click.option("--local", is_flag=True,
              help="Run the workers as local processes on 127.0.0.1, without the emulated network "
                   "(no root needed; no WAN delay or shaping).")
@click.option("--servers", "servers", type=click.Path(dir_okay=False, path_type=Path), default=None, metavar="FILE",
              help="Emulate the topology's DCs on several servers reached over SSH (a servers section as its own "
                   "file: tunnel, ssh, machines); replaces the topology's own servers section.")
@click.option("--inventory", "inventory", type=click.Path(dir_okay=False, path_type=Path), default=None,
              metavar="FILE",
              help="Run on real machines instead of the emulation: FILE maps the topology's hosts to machines "
                   "reached over SSH (key-based); nothing is shaped (runner.inventory).")
def run(scenario_file: Path, out: Path | None, sets: tuple[str, ...], variants: str | None, repeat: int | None,
        local: bool, servers: Path | None = None, inventory: Path | None = None) -> None:
    """Run SCENARIO_FILE: build its topology, calibrate the WAN, then train the
    workload under each variant and compare measured and predicted iteration times.

    Writes summary.json, scenario.resolved.yaml, and per variant a timeline CSV, a
    transfers CSV and a Gantt chart (gantt.png) to the result folder.
    """
    from testbed.progress import Progress
    from testbed.run.metrics import summary_table
    from testbed.run.preflight import preflight
    from testbed.run.runner import default_out_dir, run_scenario
    from testbed.run.scenario import load_scenario, parse_set_options

    try:
        overrides = parse_set_options(sets)
        if local:
            overrides["runner.local"] = True
        if repeat is not None:
            overrides["runner.repeat"] = repeat
        if _names_program(scenario_file):  # a program instead of a workload: testbed/run/program.py
            return _run_program(scenario_file, overrides, out, variants, local, servers, inventory)
        scenario, resolved = load_scenario(scenario_file, overrides)
        if servers is not None:
            from testbed.run.network import with_servers

            scenario, resolved = with_servers(scenario, resolved, servers, local)
        if inventory is not None:
            from testbed.run.network import with_inventory

            scenario, resolved = with_inventory(scenario, resolved, inventory, local or servers is not None)
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None
    only = _variant_names(variants)
    if variants is not None and not only:
        raise click.BadParameter("give at least one variant, e.g. --variants baseline,atlas", param_hint="--variants")
    progress = Progress(label=f"run {scenario.name}")
    problems = preflight(scenario, only, progress)  # nothing is built, no folder made, before this passes
    if problems:
        progress.close(f"run {scenario.name}: refused")
        raise click.ClickException(f"{scenario_file}: this run cannot start (nothing was built):\n"
                                   + "\n".join(f"  - {p}" for p in problems))
    out = out or default_out_dir(scenario)
    click.echo(f"run {scenario.name} -> {out}", err=True)
    summary = _played(progress, scenario.name, lambda: run_scenario(scenario, resolved, out, progress, variants=only))
    click.echo(f"\n{summary.scale_note}; delay backend: {summary.delay_backend}")
    click.echo(summary_table(summary))
    click.echo(f"\nsummary: {out / 'summary.json'}", err=True)
    for name in summary.variants:
        v = summary.result(name)
        if v is not None:
            click.echo(f"timeline: {out / v.gantt_png}  ({name})", err=True)
    failed = summary.failed()
    if failed:
        click.echo(f"\n{len(failed)} variant(s) failed: {', '.join(failed)}", err=True)
        sys.exit(1)



def _variant_names(variants: str | None) -> list[str] | None:
    """--variants A,B as names (None: every variant of the scenario)."""
    return [v.strip() for v in variants.split(",") if v.strip()] if variants else None


def _played(progress: Progress, name: str, play: Callable[[], T]) -> T:
    """What `play` returns, the progress line closed however it ends: a run that fails
    (RunnerError, ConfigError) is the command's error, Ctrl-C exits 130."""
    from testbed.run.common import RunnerError

    try:
        result = play()
    except (RunnerError, ConfigError) as exc:
        progress.close(f"run {name}: failed")
        raise click.ClickException(str(exc)) from None
    except KeyboardInterrupt:
        progress.close(f"run {name}: interrupted")
        sys.exit(130)
    progress.close()
    return result


def _names_program(path: Path) -> bool:
    """Whether the scenario file names a program (read again by load_any: errors say where)."""
    from testbed.run.scenario import is_program
    from testbed_core.configfile import read_yaml_mapping

    try:
        return is_program(read_yaml_mapping(path, "scenario", ConfigError))
    except ConfigError:
        return False  # load_scenario says what is wrong with it


def _run_program(scenario_file: Path, overrides: dict[str, object], out: Path | None, variants: str | None, local: bool,
                  servers: Path | None, inventory: Path | None) -> None:
    """`testbed run` of a program scenario: each variant one launch of the program on one
    build of the topology (testbed/run/program.py)."""
    from datetime import datetime

    from testbed.progress import Progress
    from testbed.run.common import RunnerError
    from testbed.run.program import program_table, run_program_scenario, select_variants
    from testbed.run.scenario import ProgramScenario, load_any

    given = [name for name, flag in (("--local", local or "runner.local" in overrides), ("--servers", servers),
                                     ("--inventory", inventory), ("--repeat", "runner.repeat" in overrides)) if flag]
    if given:
        raise click.ClickException(f"{scenario_file}: names a program; {', '.join(given)}: only for a workload "
                                   "scenario only (a program runs in the emulated hosts under testbed launch)")
    try:
        scenario, resolved = load_any(scenario_file, overrides)
        assert isinstance(scenario, ProgramScenario)
        only = _variant_names(variants)
        select_variants(scenario, only)
    except (ConfigError, RunnerError) as exc:
        raise click.ClickException(str(exc)) from None
    out = out or Path("results") / f"{scenario.name}-{datetime.now().strftime('%Y%m%d-%H%M%S')}"
    click.echo(f"run {scenario.name} (program) -> {out}", err=True)
    progress = Progress(label=f"run {scenario.name}")
    summary = _played(progress, scenario.name,
                      lambda: run_program_scenario(scenario, resolved, out, progress, variants=only))
    click.echo(f"\ndelay backend: {summary.delay_backend}")
    click.echo(program_table(summary))
    click.echo(f"\nsummary: {out / 'summary.json'}", err=True)
    failed = summary.failed()
    if failed:
        click.echo(f"\n{len(failed)} variant(s) failed: {', '.join(failed)} (logs in {out}/<variant>/)", err=True)
        sys.exit(1)
