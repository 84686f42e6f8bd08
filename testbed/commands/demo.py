"""`testbed demo`: the mission's three results in one table and one figure, on
built-in defaults (what `sudo make demo` runs; the logic is in the testbed/demo/ package)."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import click


@click.command()
@click.option("--out", "-o", "out_dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Result folder [default: results/demo-<time>].")
@click.option("--quick", is_flag=True,
              help="Smaller bench tensors, no multi-TCP, one measured iteration: about half the time, noisier.")
@click.option("--skip-bench", is_flag=True, help="Leave the transport bench out (result 1 shows n/a).")
def demo(out_dir: Path | None, quick: bool, skip_bench: bool) -> None:
    """Run the quickstart and show the three results of the mission in one table:

    \b
    1. transport goodput across the emulated WAN: atlas on 1 stream, atlas on
       8 streams, and the link (iperf3 -P 8);
    2. training iteration time: baseline (1 stream) vs multi-TCP vs Atlas;
    3. BubbleTea: device utilization without/with prefill in the bubbles, and
       the training slowdown it costs.

    Writes demo.json, demo.csv, demo.txt and demo.png, plus the bench
    (transport/) and the run (quickstart/) in their own folders. Needs root.
    """
    from testbed import demo as d
    from testbed.progress import format_duration

    cfg = replace(d.QUICK if quick else d.DEFAULT, skip_bench=skip_bench)
    problems = d.probe_prerequisites(cfg)
    if problems:
        raise click.ClickException("the demo cannot run here:\n  - " + "\n  - ".join(problems))
    out = out_dir or d.default_out_dir()
    steps = cfg.expected_steps()
    plan = ", ".join(f"{name} ~{format_duration(s)}" for name, s in steps.items())
    click.echo(f"testbed demo -> {out}", err=True)
    click.echo(f"estimated {format_duration(sum(steps.values()))} on a 2-core machine ({plan})", err=True)
    if cfg.overrides:
        sets = " ".join(f"--set {k}={v}" for k, v in cfg.overrides.items())
        click.echo(f"scenario {cfg.scenario.name} with {sets}; variants {', '.join(cfg.variants)}", err=True)
    progress = d.PlannedProgress(steps, cfg.child_step_s(), label="demo")
    try:
        outcome = d.run_demo(cfg, out, progress, echo=lambda s: click.echo(s, err=True))
    except d.DemoError as exc:
        progress.close("demo: failed")
        raise click.ClickException(str(exc)) from None
    except KeyboardInterrupt:
        progress.close("demo: interrupted")
        sys.exit(130)
    progress.close()
    head = d.subtitle(outcome.meta)
    click.echo(f"\nthe three results ({head}), in {format_duration(outcome.meta.duration_s or 0.0)}:\n")
    click.echo(outcome.table)
    click.echo("", err=True)
    for path in outcome.files:
        click.echo(f"wrote {path}", err=True)
    for sub, what in (("transport", "bench: results.json, goodput.png"),
                      ("quickstart", "run: summary.json, summary.png, <variant>/gantt.png")):
        if (out / sub).is_dir():
            click.echo(f"sub-result: {out / sub} ({what})", err=True)
    if outcome.failed:
        click.echo(f"\nfailed: {', '.join(outcome.failed)} (see the notes in the table and the logs in the "
                   "sub-result folders)", err=True)
        sys.exit(1)
