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
@click.option("--methods", "methods_text", default=",".join(ALL_METHODS), show_default=True,
              help="comma-separated methods to measure: atlas (one measurement per --streams count), tcp "
                   "(one plain socket), gloo (torch.distributed send/recv) and iperf3 (-P N, the ceiling)")
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


# --------------------------------------------------------------------------- collectives


def _parse_list(text: str, allowed: tuple[str, ...], what: str, hint: str) -> list[str]:
    items = [x.strip() for x in text.split(",") if x.strip()]
    unknown = [x for x in items if x not in allowed]
    if unknown or not items:
        raise click.BadParameter(f"unknown {what} {', '.join(unknown) or '(none)'}; choose from {', '.join(allowed)}",
                                 param_hint=hint)
    return list(dict.fromkeys(items))


def _size(text: str, hint: str) -> int:
    try:
        size = parse_size(text)
    except UnitError as exc:
        raise click.BadParameter(str(exc), param_hint=hint) from None
    if size < 4:
        raise click.BadParameter(f"{text} is under one float32 (4 bytes); use e.g. 4KiB", param_hint=hint)
    return size


COLLECTIVES_EPILOG = """\b
Examples:
  .venv/bin/testbed bench collectives --local 4 --max-size 16MiB
  sudo .venv/bin/testbed bench collectives --topology topologies/2dc.yaml --max-size 64MiB --iters 3

\b
Bus bandwidth as nccl-tests reports it (NVIDIA/nccl-tests doc/PERFORMANCE.md):
busbw = algbw x 2(n-1)/n for all_reduce, x (n-1)/n for all_gather, reduce_scatter
and all_to_all, x 1 for send_recv (a ring: each rank sends to the next); algbw = S / t,
S the whole array (the gathered output, the scattered input, one rank's all-to-all
input). In Gbit/s; nccl-tests prints GB/s (8x smaller numbers).
"""


@bench.command(epilog=COLLECTIVES_EPILOG)
@click.option("--topology", default=None, metavar="FILE",
              help="run the ranks in the emulated hosts of FILE, as `testbed launch` does (root) "
                   "[default: topologies/2dc.yaml unless --local]")
@click.option("--local", "local", type=int, default=None, metavar="N",
              help="N ranks on 127.0.0.1 instead (torch.multiprocessing; no root, no emulation)")
@click.option("--hosts", default=None, metavar="H1,H2,...", help="with --topology: the hosts, in rank order "
              "(default: every host, DCs in file order)")
@click.option("--nproc-per-host", type=int, default=1, show_default=True, metavar="N",
              help="with --topology: ranks per host")
@click.option("--backends", "backends_text", default="gloo,atlas", show_default=True,
              help="comma-separated torch.distributed backends to time, one after the other: gloo, atlas "
                   "(the atlas_transport backend)")
@click.option("--collectives", "collectives_text", default="all_reduce,all_gather,reduce_scatter,all_to_all,send_recv",
              show_default=True, help="comma-separated collectives to time on each backend, from those listed "
              "by default (send_recv: a ring, each rank sends to the next)")
@click.option("--min-size", "min_text", default="4KiB", show_default=True, help="the smallest S")
@click.option("--max-size", "max_text", default="256MiB", show_default=True, help="the largest S")
@click.option("--factor", default=4, show_default=True, type=int, help="each size is the one before times this")
@click.option("--iters", default=5, show_default=True, type=int, help="timed calls per point")
@click.option("--warmup", default=1, show_default=True, type=int,
              help="untimed calls per point before them (the first one's result is checked)")
@click.option("--budget", "budget_s", default=20.0, show_default=True, type=float, metavar="SECONDS",
              help="fewer timed calls where --iters of them would take longer than this")
@click.option("--max-op-seconds", "max_op_s", default=120.0, show_default=True, type=float,
              help="skip a collective's larger sizes after one call took longer")
@click.option("--timeout", "timeout_s", default=3600.0, show_default=True, type=float, metavar="SECONDS",
              help="end a backend's ranks after this long (and its process group's timeout, capped at 600 s)")
@click.option("--json", "as_json", is_flag=True, help="print results.json on stdout instead of the table")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None,
              help="where results.json, results.csv, busbw.png and the ranks' logs go "
                   "[default: results/bench-collectives-<time>]")
def collectives(topology: str | None, local: int | None, hosts: str | None, nproc_per_host: int,
                backends_text: str, collectives_text: str, min_text: str, max_text: str, factor: int, iters: int,
                warmup: int, budget_s: float, max_op_s: float, timeout_s: float, as_json: bool,
                out_dir: str | None) -> None:
    """Time all_reduce, all_gather, reduce_scatter, all_to_all and send/recv over each
    backend from --min-size to --max-size: time per call, algorithm and bus bandwidth
    (nccl-tests' convention), a table, results.json/.csv and a plot.

    Every call's first result is checked on every rank; the time of a call is the
    slowest rank's.
    """
    from testbed.bench.collectives import (
        BACKENDS,
        COLLECTIVES,
        BenchConfig,
        BenchReport,
        CollectivesError,
        plot,
        size_ladder,
        table,
        write_csv,
        write_json,
    )
    from testbed.bench.collectives_worker import run_local
    from testbed.provenance import git_state

    backends = _parse_list(backends_text, BACKENDS, "backend(s)", "--backends")
    colls = _parse_list(collectives_text, COLLECTIVES, "collective(s)", "--collectives")
    try:
        sizes = size_ladder(_size(min_text, "--min-size"), _size(max_text, "--max-size"), factor)
    except ValueError as exc:
        raise click.UsageError(f"--min-size/--max-size/--factor: {exc}") from None
    for name, value, low in (("--iters", iters, 1), ("--warmup", warmup, 1)):
        if value < low:
            raise click.BadParameter(f"{value}: use {low} or more", param_hint=name)
    for name, value in (("--budget", budget_s), ("--max-op-seconds", max_op_s), ("--timeout", timeout_s)):
        if value <= 0:
            raise click.BadParameter(f"{value:g}: use a positive number of seconds", param_hint=name)
    if local is not None:
        if topology is not None or hosts is not None or nproc_per_host != 1:
            raise click.UsageError("--local N runs on loopback: it goes without --topology, --hosts and "
                                   "--nproc-per-host")
        if local < 2:
            raise click.BadParameter(f"{local}: collectives need 2 or more ranks", param_hint="--local")
        if local > (os.cpu_count() or 1) * 8:
            raise click.BadParameter(f"{local} ranks on {os.cpu_count()} CPUs: use at most {(os.cpu_count() or 1) * 8}",
                                     param_hint="--local")
    topo_path = None
    if local is None:
        if nproc_per_host < 1:
            raise click.BadParameter(f"{nproc_per_host}: give 1 or more ranks per host", param_hint="--nproc-per-host")
        topo_path = _resolve_topology(topology or "topologies/2dc.yaml")
        try:
            import testbed.emulation.network  # noqa: F401
        except ImportError as exc:
            raise click.ClickException(
                f"running on a topology needs testbed.emulation.network, which cannot be imported here ({exc}); "
                "use --local N to measure on loopback") from None
        if os.geteuid() != 0:
            raise click.ClickException("running on a topology builds network namespaces and needs root: run with "
                                       "sudo, or use --local N to measure on loopback")
    cfg = BenchConfig(collectives=colls, sizes=sizes, iters=iters, warmup=warmup, budget_s=budget_s,
                      max_op_s=max_op_s, timeout_s=min(timeout_s, 600.0))
    out = Path(out_dir) if out_dir else Path("results") / f"bench-collectives-{time.strftime('%Y%m%d-%H%M%S')}"
    out.mkdir(parents=True, exist_ok=True)

    hosts_used: list[str] = []
    git = git_state()  # the tree the ranks run (read before they start)
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    try:
        if local is not None:
            click.echo(f"local: {local} ranks on 127.0.0.1, {', '.join(backends)}, {len(sizes)} sizes", err=True)
            results, failures = run_local(local, backends, cfg)  # rank 0 says each point as it goes
            world = local
        else:
            assert topo_path is not None
            results, failures, hosts_used = _collectives_on_topology(topo_path, hosts, nproc_per_host, backends, cfg,
                                                                     out, timeout_s)
            world = len(hosts_used)
    except CollectivesError as exc:
        raise click.ClickException(str(exc)) from None
    report = BenchReport(command=" ".join(["testbed", *sys.argv[1:]]) if sys.argv[1:3] == ["bench", "collectives"]
                         else "testbed bench collectives",
                         mode=f"local {local}" if local is not None else str(topo_path), world_size=world,
                         hosts=hosts_used, time=started,
                         host=platform.node(),
                         commit=(git.commit[:12] + ("-dirty" if git.dirty else "")) if git.commit else None,
                         config=cfg, results=results, failures=failures)
    write_json(report, out / "results.json")
    write_csv(results, out / "results.csv")
    title = (f"{topo_path.stem if topo_path else 'loopback'}: {world} ranks"
             + (f" ({', '.join(hosts_used)})" if hosts_used else ""))
    if results:
        plot(results, out / "busbw.png", title=title)
    if as_json:
        click.echo(report.model_dump_json(indent=1))
    else:
        click.echo(table(results))
        click.echo(f"\nwrote {out / 'results.json'}, {out / 'results.csv'}" + (f", {out / 'busbw.png'}" if results else ""))
    for f in failures:
        click.echo(f"FAILED: {f}", err=True)
    if failures or any(r.error for r in results):
        sys.exit(1)


def _collectives_on_topology(topo_path: Path, hosts: str | None, nproc_per_host: int, backends: list[str],
                             cfg, out: Path, timeout_s: float):
    """Build the emulation once; `testbed launch` the worker on its ranks once per
    backend (the logs under out/launch-<backend>); rank 0's result lines, the failures,
    and where each rank ran."""
    from testbed.bench.collectives import CollectivesError, results_from_metrics
    from testbed.commands.launch import _check_plan
    from testbed.commands.topo import _load, _user_errors
    from testbed.emulation.network import Emulation
    from testbed.launch.models import LaunchSpec
    from testbed.launch.plan import LaunchError, parse_hosts
    from testbed.launch.run import run_launch

    say = _say_elapsed()
    topology = _load(str(topo_path))
    pythonpath = str(REPO_ROOT) + (os.pathsep + os.environ["PYTHONPATH"] if os.environ.get("PYTHONPATH") else "")
    command = [sys.executable, "-m", "testbed.bench.collectives_worker", "--config", cfg.model_dump_json()]
    results, failures, where = [], [], []

    def spec(backend: str) -> LaunchSpec:
        return LaunchSpec(command=command, hosts=parse_hosts(hosts), nproc_per_host=max(1, nproc_per_host),
                          env={"BACKEND": backend, "PYTHONPATH": pythonpath}, timeout_s=timeout_s,
                          cwd=str(REPO_ROOT), topology_file=str(topo_path))

    _check_plan(topology, spec(backends[0]))  # an unknown host or too many ranks, before anything is built
    try:
        with Emulation(topology, progress=say) as emu:
            say(f"built {topology.name} in {emu.build_s:.2f} s (delay backend {emu.delay_backend})")
            for backend in backends:
                logs = out / f"launch-{backend}"
                say(f"{backend}: the worker on every rank (progress: {logs / 'rank-0.stderr'})")
                report = run_launch(emu, spec(backend), out_dir=logs, echo=False, progress=say)
                rows = results_from_metrics(report.ranks[0].metrics) if report.ranks else []
                for r in rows:
                    say(f"{r.backend} {r.collective} {r.size} B: " + (
                        f"{r.time_s * 1e3:.3f} ms, busbw {r.busbw_gbit_s:.4f} Gbit/s" if r.time_s is not None
                        else (r.error or r.skipped or "")))
                results += rows
                where = [f"{r.dc}/{r.host}" for r in report.ranks]
                if not report.ok:
                    failures.append(f"{backend}: {report.failure}")
    except LaunchError as exc:
        raise CollectivesError(str(exc)) from None
    except _user_errors() as exc:
        raise CollectivesError(f"cannot build {topo_path}: {exc}") from None
    return results, failures, where


def _say_elapsed():
    t0 = time.monotonic()

    def say(message: str) -> None:
        click.echo(f"[{time.monotonic() - t0:6.1f}s] {message}", err=True)

    return say
