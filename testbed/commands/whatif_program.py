"""`testbed whatif --program DIR`: a program profiled by `testbed launch --profile`,
predicted on another topology, RTT or bandwidth (testbed_core/program/predict.py)."""

from __future__ import annotations

import json
import shlex
import time
from pathlib import Path

import click


def _values(text: str | None, parse, what: str) -> list[float | None]:
    if text is None:
        return [None]
    out: list[float | None] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        try:
            value = parse(part)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint=what) from None
        if not value > 0:
            raise click.BadParameter(f"{part}: must be more than 0", param_hint=what)
        out.append(value)
    if not out:
        raise click.BadParameter("give at least one value", param_hint=what)
    return out


def _transport(profile, program_dir: Path, choice: str, quiet: bool):
    """The atlas transport's calibration the prediction uses (None: the network alone)."""
    from testbed_core.program.profile import ProfileError
    from testbed_core.program.transport import CALIBRATION_FILE, needs_calibration, read_calibration

    if choice == "none" or not needs_calibration(profile):
        return None
    if choice == "measure":
        from testbed.launch.transport_calibration import CalibrationError, measure, write

        if not quiet:
            click.echo("measuring the atlas transport's own cost on this machine (two ranks on 127.0.0.1) ...",
                       err=True)
        try:
            cal = measure()
        except CalibrationError as exc:
            raise click.ClickException(str(exc)) from None
        write(cal, program_dir if Path(program_dir).is_dir() else Path(program_dir).parent)
        return cal
    cal = read_calibration(program_dir, profile)
    if cal is None:
        raise ProfileError(f"--program {program_dir}: the program used atlas across DCs, but there is no "
                           f"{CALIBRATION_FILE} there (the transport's own cost per transfer on this machine, which "
                           "`testbed launch --profile` measures after the ranks end; profiles made before it have "
                           "none): measure it now with --transport-cost measure, or predict the network alone with "
                           "--transport-cost none")
    return cal


def program_whatif(program_dir: Path, topology_path: Path | None, rtt_text: str | None, bandwidth_text: str | None,
                   hosts_text: str | None, command_text: str | None, streams: str | None, as_json: bool,
                   transport_cost: str = "profile") -> None:
    """Print (or give as JSON) the profiled program's predicted seconds per step per target;
    `transport_cost`: 'profile' (the folder's transport-calibration.json, required where
    the program used atlas across DCs), 'measure' (measured now, written there) or 'none'."""
    from testbed_core.configfile import ConfigError
    from testbed_core.program.predict import measured_windows, predict, retarget
    from testbed_core.program.profile import ProfileError, check_program, read_profile
    from testbed_core.topology import load_topology
    from testbed_core.units import format_rate, parse_duration, parse_rate

    rtts = _values(rtt_text, parse_duration, "--rtt")
    rates = _values(bandwidth_text, parse_rate, "--bandwidth")
    n_streams = None
    if streams is not None:
        if not streams.isdigit() or int(streams) < 1:
            raise click.BadParameter(f"{streams!r}: with --program give a number of streams (atlas's per pair)",
                                     param_hint="--streams")
        n_streams = int(streams)
    try:
        profile = read_profile(program_dir)
        check_program(profile, str(program_dir), shlex.split(command_text) if command_text else None)
        base = load_topology(topology_path) if topology_path is not None else profile.network
        source = str(topology_path) if topology_path is not None else f"the profile's topology ({base.name})"
        hosts = [h.strip() for h in hosts_text.split(",") if h.strip()] if hosts_text else None
        transport = _transport(profile, program_dir, transport_cost, as_json)
        windows = measured_windows(profile, profile.network, transport=transport)
        t0 = time.perf_counter()
        rows = []
        for rtt in rtts:
            for rate in rates:
                label = ", ".join(x for x in (f"RTT {rtt * 1e3:g} ms" if rtt else "",
                                              f"{format_rate(rate)}/s" if rate else "") if x) or base.name
                rows.append(predict(profile, retarget(base, rtt, rate), label=label, streams=n_streams,
                                    hosts=hosts, source=source, windows=windows, transport=transport))
        took = time.perf_counter() - t0
    except (ProfileError, ConfigError) as exc:
        raise click.ClickException(str(exc)) from None
    measured = rows[0].ranks[0].measured_median_s if rows and rows[0].ranks else None
    if as_json:
        click.echo(json.dumps({"program": profile.program.model_dump(), "profiled_on": profile.network.name,
                               "measured_s_per_step": measured, "predict_s": took,
                               "predictions": [r.model_dump() for r in rows]}, indent=1))
        return
    backends = sorted({g.backend for r in profile.ranks for g in r.groups})
    click.echo(f"What-if: {shlex.join(profile.program.command)} ({profile.world_size} ranks, "
               f"{', '.join(backends) or 'no communication'}), profiled on {profile.network.name}: "
               f"{measured if measured is None else f'{measured:.3f}'} s per step measured there (rank 0's median "
               "after the first step)")
    loads = [r.compute_wall_s / r.compute_cpu_s for r in profile.ranks if r.compute_wall_s and r.compute_cpu_s]
    if loads:
        click.echo(f"  the ranks' compute took {min(loads):.1f}-{max(loads):.1f}x its CPU time in wall time there (1.0: "
                   "cores to spare); it is replayed as profiled, so a machine busier or idler then than at the "
                   "target moves the prediction by as much")
    if transport is not None:
        costs = ", ".join(f"{c.pattern} {c.overhead_s * 1e3:.2f} ms + bytes at {c.rate_Bps / 1e6:,.0f} MB/s"
                          for c in transport.costs)
        click.echo(f"  atlas transport's own cost per WAN transfer (measured {transport.measured_utc} UTC on "
                   f"127.0.0.1, load {transport.load_average:g}): {costs}")
    click.echo(f"  fitted on the profile's own network: {rows[0].extra_rtts:+.2f} round trips per WAN transfer "
               "beyond the model")
    for p in rows[0].paths:
        where = {"profile": "measured in the profile",
                 "fitted": "fitted to the profiled step: only striped channels crossed there"}.get(
                     p.window_source, "nominal: from the hosts' TCP buffers")
        click.echo(f"  path {p.dcs[0]}-{p.dcs[1]}: one TCP flow's window {p.window_bytes / 1e3:,.0f} kB ({where})")
    click.echo(f"  {'target':<28}{'s/step':>9}{'ranks mean':>12}  {'per rank (median s/step)'}")
    for r in rows:
        per_rank = ", ".join(f"{x.rank}: {x.median_s:.3f}" for x in r.ranks if x.median_s is not None)
        value = "-" if r.seconds_per_step is None else f"{r.seconds_per_step:.3f}"
        mean = "-" if r.ranks_mean_s_per_step is None else f"{r.ranks_mean_s_per_step:.3f}"
        click.echo(f"  {r.label:<28}{value:>9}{mean:>12}  {per_rank}")
    click.echo("  s/step: rank 0's median after the first step; ranks mean: the median of each step's mean over "
               "the ranks (where ranks meet in one exchange a step, one rank's own timer depends on which runs ahead)")
    click.echo(f"  predicted in {took:.2f} s (testbed_core/program/predict.py: the ranks' compute as profiled, "
               "each communication on the target network)")
