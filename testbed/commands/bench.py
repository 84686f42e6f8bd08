"""`testbed bench transport`: goodput of the Atlas transport against one plain TCP
stream, torch.distributed gloo and iperf3, over loopback and across the emulated WAN.

The measuring lives in `testbed.bench.transport` (worker processes that run the same
way inside emulated hosts); this module parses options, runs the suites and writes
the table, JSON, CSV and plot.
"""

from __future__ import annotations

import os
import platform
import sys
import time
from pathlib import Path

import click

from testbed_core.constants import REPO_ROOT
from testbed_core.units import UnitError, parse_size

ALL_METHODS = ("atlas", "tcp", "gloo", "iperf3")


@click.group()
def bench() -> None:
    """Benchmarks of the toolkit's components."""


def _parse_streams(text: str) -> list[int | str]:
    out: list[int | str] = []
    for part in (p.strip() for p in text.split(",") if p.strip()):
        if part == "auto":
            out.append("auto")
            continue
        try:
            n = int(part)
        except ValueError:
            raise click.BadParameter(f"{part!r} is not a stream count (use e.g. 1,2,4,8,16,auto)") from None
        if not 1 <= n <= 256:
            raise click.BadParameter(f"{n} streams is outside 1..256")
        out.append(n)
    if not out:
        raise click.BadParameter("name at least one stream count, e.g. 1,8")
    return out


def _parse_methods(text: str) -> list[str]:
    methods = [m.strip() for m in text.split(",") if m.strip()]
    unknown = [m for m in methods if m not in ALL_METHODS]
    if unknown or not methods:
        raise click.BadParameter(f"unknown method(s) {', '.join(unknown) or '(none)'}; choose from {', '.join(ALL_METHODS)}")
    return methods


def _resolve_topology(path: str) -> Path:
    p = Path(path)
    if p.exists():
        return p
    if not p.is_absolute() and (REPO_ROOT / p).exists():
        return REPO_ROOT / p
    raise click.BadParameter(f"topology file {path} not found (looked in {Path.cwd()} and {REPO_ROOT})",
                             param_hint="--topology")


@bench.command()
@click.option("--topology", default="topologies/2dc.yaml", show_default=True,
              help="topology whose first two DCs (or --between) carry the WAN measurements")
@click.option("--streams", "streams_text", default="1,2,4,8,16,auto", show_default=True,
              help="stream counts for atlas (and iperf3 -P); 'auto' lets atlas probe")
@click.option("--size", "size_text", default="256MiB", show_default=True, help="tensor size per transfer")
@click.option("--repeat", default=3, show_default=True, type=click.IntRange(1, 100),
              help="timed transfers (iperf3 tests) per measurement; the median is reported")
@click.option("--rounds", default=1, show_default=True, type=click.IntRange(1, 50),
              help="passes over all methods, interleaved; targets are judged on the median of the "
                   "per-round ratios and their spread is shown (use 5 or more on a busy machine)")
@click.option("--json", "as_json", is_flag=True, help="print JSON on stdout instead of the table")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None,
              help="where results.json, results.csv, goodput.png and worker logs go "
                   "[default: results/bench-transport-<time>]")
@click.option("--no-wan", is_flag=True, help="measure loopback only (no root, no emulation)")
@click.option("--no-loopback", is_flag=True, help="measure the WAN path only")
@click.option("--methods", "methods_text", default=",".join(ALL_METHODS), show_default=True)
@click.option("--between", default=None, help="the two DCs to measure between, e.g. dc1,dc2")
@click.option("--iperf-seconds", default=3.0, show_default=True, type=click.FloatRange(1, 60),
              help="duration of each iperf3 test")
@click.option("--congestion", default=None, help="TCP congestion control for atlas streams (default: system)")
@click.option("--chunk-size", "chunk_text", default=None, help="atlas chunk size, e.g. 1MiB (default: the library's)")
@click.option("--zero-copy/--no-zero-copy", default=True, show_default=True,
              help="atlas sends payloads with vmsplice + splice (no copy into the kernel), or copies them")
def transport(topology: str, streams_text: str, size_text: str, repeat: int, rounds: int, as_json: bool,
              out_dir: str | None,
              no_wan: bool, no_loopback: bool, methods_text: str, between: str | None, iperf_seconds: float,
              congestion: str | None, chunk_text: str | None, zero_copy: bool) -> None:
    """Goodput of atlas (per stream count), plain TCP, gloo and iperf3 -P N.

    Every received tensor is checked against an xxh3 digest of what was sent.
    """
    from testbed.bench import report
    from testbed.bench.transport import BenchError, loopback_suite, wan_suite

    streams = _parse_streams(streams_text)
    methods = _parse_methods(methods_text)
    try:
        size = parse_size(size_text)
    except UnitError as exc:
        raise click.BadParameter(str(exc), param_hint="--size") from None
    if size <= 0:
        raise click.BadParameter("use a positive size, e.g. 64MiB", param_hint="--size")
    chunk = None
    if chunk_text:
        try:
            chunk = parse_size(chunk_text)
        except UnitError as exc:
            raise click.BadParameter(str(exc), param_hint="--chunk-size") from None
        if not 4096 <= chunk <= 256 << 20:
            raise click.BadParameter("use 4KiB..256MiB", param_hint="--chunk-size")
    if no_wan and no_loopback:
        raise click.UsageError("--no-wan and --no-loopback together leave nothing to measure")
    pair = None
    if between:
        pair = tuple(x.strip() for x in between.split(","))
        if len(pair) != 2:
            raise click.BadParameter("name two DCs, e.g. dc1,dc2", param_hint="--between")
    topo_path = None
    if not no_wan:
        topo_path = _resolve_topology(topology)
        try:
            import testbed.emulation.network  # noqa: F401
        except ImportError as exc:
            raise click.ClickException(
                f"the WAN path needs testbed.emulation.network, which cannot be imported here ({exc}); "
                "pass --no-wan to measure loopback only") from None
        if os.geteuid() != 0:
            raise click.ClickException("the WAN path builds network namespaces and needs root: "
                                       "run with sudo, or pass --no-wan to measure loopback only")
    out = Path(out_dir) if out_dir else Path("results") / f"bench-transport-{time.strftime('%Y%m%d-%H%M%S')}"
    out.mkdir(parents=True, exist_ok=True)

    def progress(m) -> None:
        what = f"{m.path} {m.method} N={m.requested_streams}" + (f" round {m.round + 1}/{rounds}" if rounds > 1 else "")
        if m.error:
            click.echo(f"  {what}: FAILED: {m.error}", err=True)
        else:
            click.echo(f"  {what}: {m.goodput_mbps:.1f} Mbit/s (streams {m.streams}, verified {m.verified})", err=True)

    common = dict(streams=streams, size=size, repeat=repeat, methods=methods, log_dir=out / "logs",
                  iperf_seconds=iperf_seconds, congestion=congestion, chunk_bytes=chunk, zero_copy=zero_copy,
                  rounds=rounds,
                  on_result=progress)
    results = []
    try:
        if not no_loopback:
            click.echo(f"loopback: {len(methods)} methods, {size_text} x {repeat}, {rounds} round(s)", err=True)
            results += loopback_suite(**common)
        if topo_path is not None:
            click.echo(f"wan: building {topo_path} (this takes a while)", err=True)
            results += wan_suite(topo_path, pair, **common)
    except BenchError as exc:
        raise click.ClickException(str(exc)) from None

    found = report.checks(results)
    meta = {"size_bytes": size, "repeat": repeat, "rounds": rounds, "chunk_bytes": chunk, "zero_copy": zero_copy,
            "topology": str(topo_path) if topo_path else None,
            "host": platform.node(), "python": sys.version.split()[0], "time": time.strftime("%Y-%m-%dT%H:%M:%S")}
    doc = report.as_json(results, found, meta)
    report.write_json(doc, out / "results.json")
    report.write_csv(results, out / "results.csv")
    report.plot(results, out / "goodput.png", title=topo_path.stem if topo_path else "")
    if as_json:
        import json

        click.echo(json.dumps(doc, indent=2))
    else:
        click.echo(report.table(results, found))
        click.echo(f"\nwrote {out / 'results.json'}, {out / 'results.csv'}, {out / 'goodput.png'}")
    if any(m.error or m.verified is False for m in results):
        sys.exit(1)
