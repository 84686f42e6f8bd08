"""`testbed launch TOPOLOGY [options] -- COMMAND [ARGS...]`: an unchanged program once
per rank in the emulated hosts, with torchrun's environment (``env://``)."""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import click

if TYPE_CHECKING:
    from testbed.launch.models import LaunchReport, LaunchSpec
    from testbed_core.topology import Topology

Say = Callable[[str], None]  # a progress line on stderr

EPILOG = """\b
Examples:
  sudo .venv/bin/testbed launch topologies/2dc.yaml --env BACKEND=gloo -- .venv/bin/python train.py
  sudo .venv/bin/testbed launch topologies/2dc.yaml --hosts dc1-h1,dc2-h1 --nproc-per-host 2 -- python -u prog.py
  sudo .venv/bin/testbed topo up topologies/2dc.yaml --detach --name dev
  sudo .venv/bin/testbed launch --attach dev -- .venv/bin/python train.py

\b
Each rank gets RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR
(rank 0's emulated address), MASTER_PORT, TESTBED_DC, TESTBED_HOST, GLOO_SOCKET_IFNAME and
TP_SOCKET_IFNAME (its host's interface), OMP_NUM_THREADS=1 and PYTHONUNBUFFERED=1 unless
set; the rest of your environment and your working folder are kept. Output lines show
as [rank K DC/HOST]; every rank's whole stdout/stderr and launch.json (exit codes, wall
times, WAN bytes each way, every JSON line a rank printed) go to --out. The first rank
that fails ends the others (SIGTERM, SIGKILL 2 s later) and the launch exits 1 naming it.
"""


def _progress() -> Say:
    t0 = time.monotonic()

    def say(message: str) -> None:
        click.echo(f"[{time.monotonic() - t0:6.1f}s] {message}", err=True)

    return say


class _LaunchCommand(click.Command):
    """An option click does not know is most often the program's own, given without `--`."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        try:
            return super().parse_args(ctx, args)
        except click.NoSuchOption as exc:
            exc.message = (exc.message.rstrip(".") + ": the program's own options go after `--`: "
                           "testbed launch TOPOLOGY [options] -- COMMAND [ARGS]...")
            raise


@click.command(cls=_LaunchCommand, epilog=EPILOG)
@click.argument("args", nargs=-1, type=click.UNPROCESSED, metavar="TOPOLOGY -- COMMAND [ARGS]...")
@click.option("--hosts", default=None, metavar="H1,H2,...",
              help="the hosts to start ranks on, in rank order, by name (dc1-h1,dc2-h1; `testbed topo show` "
                   "lists them); default: every host, DCs in file order, hosts in DC order")
@click.option("--nproc-per-host", type=int, default=1, show_default=True, metavar="N",
              help="ranks per host (consecutive RANKs, LOCAL_RANK 0..N-1), like torchrun's --nproc-per-node")
@click.option("--env", "env_items", multiple=True, metavar="KEY=VALUE",
              help="add KEY=VALUE to every rank's environment (repeatable; wins over your environment)")
@click.option("--master-port", type=click.IntRange(1, 65535), default=None, metavar="PORT",
              help="MASTER_PORT of rank 0's rendezvous (default: a free port)")
@click.option("--timeout", "timeout_s", type=click.FloatRange(min=0, min_open=True), default=None, metavar="SECONDS",
              help="end every rank and fail when the launch takes longer (e.g. a program that never connects)")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None, metavar="DIR",
              help="folder for rank-K.stdout, rank-K.stderr and launch.json (default: results/launch-<time>/)")
@click.option("--attach", "attach", default=None, metavar="NAME",
              help="run on the topology kept up by `testbed topo up --detach --name NAME` (no TOPOLOGY then; "
                   "it stays up afterwards)")
@click.option("--backend", type=click.Choice(["auto", "netem", "relay"]), default="auto", show_default=True,
              help="delay backend of the topology built for this launch")
@click.option("--servers", "servers", type=click.Path(dir_okay=False), default=None, metavar="FILE",
              help="place the DCs on servers reached over SSH (as `testbed topo up --servers`); COMMAND and the "
                   "working folder must exist at the same path there")
@click.option("--inventory", "inventory", type=click.Path(dir_okay=False), default=None, metavar="FILE",
              help="real machines instead of the emulation: each host of TOPOLOGY is the inventory's machine, "
                   "reached over SSH (as `testbed run --inventory`); no GLOO_SOCKET_IFNAME is set (give it with "
                   "--env) and no WAN bytes are counted")
@click.option("--quiet", "-q", is_flag=True, help="do not show the ranks' output (it is still saved in --out)")
@click.option("--profile", is_flag=True,
              help="record what the program does per step (each rank's compute between communications, the bytes "
                   "and peers of every send/recv and collective) into --out/profile.json, for "
                   "`testbed whatif --program DIR`")
def launch(args: tuple[str, ...], hosts: str | None, nproc_per_host: int, env_items: tuple[str, ...],
           master_port: int | None, timeout_s: float | None, out_dir: str | None, attach: str | None,
           backend: str, servers: str | None, inventory: str | None, quiet: bool, profile: bool) -> None:
    """Start COMMAND once per rank in the emulated hosts of TOPOLOGY, wait, report, tear down.

    Builds TOPOLOGY (or uses the one kept up with --attach), starts COMMAND in each
    rank's host namespace with the environment torchrun gives, so an unchanged
    ``init_process_group("gloo")`` (env://) program runs across the emulated WAN.
    Exit status: 0 when every rank exits 0, 1 when one fails or --timeout ends it,
    130 on Ctrl-C (every rank is ended and the topology torn down).
    """
    from testbed.launch.models import LaunchSpec
    from testbed.launch.plan import LaunchError, parse_env, parse_hosts, resolve_command

    if inventory is not None and (attach is not None or servers is not None or backend != "auto"):
        raise click.UsageError("--inventory runs on real machines: it goes with TOPOLOGY only, not with --attach, "
                               "--servers or --backend")
    if attach is None:
        if not args:
            raise click.UsageError("give the TOPOLOGY file and the command after `--`, e.g. "
                                   "testbed launch topologies/2dc.yaml -- .venv/bin/python train.py")
        topology_file, command = args[0], list(args[1:])
    else:
        if args and args[0].endswith((".yaml", ".yml")) and Path(args[0]).is_file():
            raise click.UsageError(f"--attach {attach} runs on the topology kept up under that name: "
                                   f"drop {args[0]}")
        topology_file, command = None, list(args)
        if servers is not None or backend != "auto":
            raise click.UsageError("--servers and --backend are for a topology built by this launch, not --attach")
    cwd = os.getcwd()
    try:
        env = parse_env(env_items)
        resolve_command(command, cwd)
        spec = LaunchSpec(command=command, hosts=parse_hosts(hosts), nproc_per_host=max(1, nproc_per_host), env=env,
                          master_port=master_port, timeout_s=timeout_s, cwd=cwd)
        if nproc_per_host < 1:
            from testbed.launch.plan import plan_ranks

            plan_ranks([], None, nproc_per_host)
    except LaunchError as exc:
        raise click.ClickException(str(exc)) from None
    if profile and (inventory is not None or servers is not None):
        raise click.UsageError("--profile times every rank on one clock: it goes with a topology emulated on this "
                               "machine, not with --inventory or --servers")
    out = Path(out_dir) if out_dir else Path("results") / f"launch-{time.strftime('%Y%m%d-%H%M%S')}"
    made = [d for d in [out, *out.parents] if not d.exists()]  # the folders this launch makes, deepest first
    _check_out(out)
    try:
        _launch(out, spec, profile, attach, inventory, servers, backend, topology_file, cwd, quiet)
    except BaseException:
        for folder in made:  # refused before any rank ran: no empty folder left behind
            if folder.is_dir() and not any(folder.iterdir()):
                folder.rmdir()
        raise


def _launch(out: Path, spec: LaunchSpec, profile: bool, attach: str | None, inventory: str | None,
            servers: str | None, backend: str, topology_file: str | None, cwd: str, quiet: bool) -> None:
    say = _progress()
    profiled_env = dict(spec.env)
    line_times: dict[int, list[float]] | None = None
    if profile:
        from testbed.launch.profile import prepare, profile_env

        prepare(out)
        spec.env.update(profile_env(out, spec.env.get("PYTHONPATH", os.environ.get("PYTHONPATH"))))
        line_times = {}
    if attach is not None:
        report = _attached(attach, spec, out, quiet, say, line_times)
    elif inventory is not None:
        assert topology_file is not None
        spec.topology_file = str(Path(topology_file).resolve())
        report = _real(topology_file, inventory, spec, out, quiet, say)
    else:
        assert topology_file is not None
        spec.topology_file = str(Path(topology_file).resolve())
        report = _built(topology_file, servers, backend, spec, out, quiet, say, line_times)
    if line_times is not None:
        _write_profile(report, out, cwd, profiled_env, line_times, say)
    _summary(report, out)
    if not report.ok:
        click.echo(f"launch failed: {report.failure}", err=True)
        sys.exit(1)


def _check_out(out: Path) -> None:
    from testbed.launch.plan import LaunchError
    from testbed.launch.run import check_out_dir

    try:
        check_out_dir(out)
    except LaunchError as exc:
        raise click.ClickException(str(exc)) from None


def _check_plan(topology: Topology, spec: LaunchSpec) -> None:
    """The rank plan on TOPOLOGY's hosts, checked before anything is built or logged in to."""
    from testbed.commands.topo import _user_errors
    from testbed.emulation.addressing import plan_addresses
    from testbed.emulation.naming import display_host
    from testbed.launch.plan import HostSlot, LaunchError, plan_ranks

    try:
        plan = plan_addresses(topology)
        slots = [HostSlot(display_host(dc.name, h), dc.name, ip, "")
                 for dc, dplan in zip(topology.dcs, plan.dcs, strict=True)
                 for h, ip in zip(dc.hosts, dplan.host_ips, strict=True)]
        plan_ranks(slots, spec.hosts, spec.nproc_per_host)
    except LaunchError as exc:
        raise click.ClickException(str(exc)) from None
    except _user_errors() as exc:
        raise click.ClickException(str(exc)) from None


def _write_profile(report: LaunchReport, out: Path, cwd: str, env: dict[str, str],
                   line_times: dict[int, list[float]], say: Say) -> None:
    """``profile.json`` from the ranks' records (a failed launch still gets the part it ran)."""
    from testbed.launch.profile import build_profile, calibrate_transport, write_profile
    from testbed_core.configfile import ConfigError
    from testbed_core.topology import load_topology

    try:
        topology = load_topology(report.topology_file)
    except ConfigError as exc:
        click.echo(f"no profile: cannot read the topology {report.topology_file} again: {exc}", err=True)
        return
    report = report.model_copy(update={"env": env})
    prof = build_profile(report, topology, out, cwd, line_times)
    path = write_profile(prof, out)
    ops = sum(len(r.ops) for r in prof.ranks)
    steps = sum(len(r.steps) for r in prof.ranks)
    share = (f"; {prof.recorded_wan_bytes / prof.wan_bytes:.0%} of the WAN counters' bytes recorded"
             if prof.wan_bytes else "")
    say(f"profile: {ops} communications and {steps} step lines over {len(prof.ranks)} ranks{share}: {path}")
    calibrate_transport(prof, out, say)


def _built(file: str, servers: str | None, backend: str, spec: LaunchSpec, out: Path, quiet: bool,
           say: Say, line_times: dict[int, list[float]] | None = None) -> LaunchReport:
    from testbed.commands.topo import _load, _user_errors
    from testbed.emulation.network import Emulation
    from testbed.launch.plan import LaunchError
    from testbed.launch.run import run_launch

    topology = _load(file, servers)
    _check_plan(topology, spec)
    try:
        with _ranks_ended_on_exit(out, "every rank was ended and the topology torn down", signals=False):
            emu = Emulation(topology, delay_backend=None if backend == "auto" else backend, progress=say)
            with emu:
                say(f"built {topology.name} in {emu.build_s:.2f} s (delay backend {emu.delay_backend}, "
                    f"run {emu.prefix})")
                report = run_launch(emu, spec, out_dir=out, echo=not quiet, progress=say, line_times=line_times)
                say("tearing down")
            say(f"torn down in {emu.teardown_s:.2f} s")
            return report
    except LaunchError as exc:
        raise click.ClickException(str(exc)) from None
    except _user_errors() as exc:
        raise click.ClickException(str(exc)) from None


@contextmanager
def _ranks_ended_on_exit(out: Path, ended: str, signals: bool = True) -> Iterator[None]:
    """Ctrl-C (and, with `signals`, SIGTERM and SIGHUP, made to raise SystemExit while
    inside) unwinds through run_launch, which ends every rank; then the command exits
    130 (or the signal's code) saying what was `ended` and where the logs are."""

    def unwind(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)

    saved = {sig: signal.signal(sig, unwind) for sig in (signal.SIGTERM, signal.SIGHUP)} if signals else {}
    try:
        yield
    except (KeyboardInterrupt, SystemExit) as exc:
        code = 130 if isinstance(exc, KeyboardInterrupt) else exc.code
        click.echo(f"interrupted: {ended}; logs in {out}", err=True)
        sys.exit(code if isinstance(code, int) else 1)
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)


class _Say:
    """The `progress.log` that testbed/run/inventory.py speaks to, as this command's lines."""

    def __init__(self, say: Say) -> None:
        self.log = say


def _real(file: str, inventory: str, spec: LaunchSpec, out: Path, quiet: bool, say: Say) -> LaunchReport:
    """The ranks on the real machines of `inventory` (testbed/run/inventory.py): each
    host of TOPOLOGY is the machine the inventory gives it, reached over SSH; nothing is
    shaped and no WAN counters are read; the machines see COMMAND and the working
    folder at the same paths (or under the inventory's repo)."""
    from types import SimpleNamespace

    from testbed.commands.topo import _load
    from testbed.launch.plan import LaunchError
    from testbed.launch.run import HostsSite, run_launch
    from testbed.run.common import RunnerError
    from testbed.run.inventory import open_inventory

    topology = _load(file)
    _check_plan(topology, spec)
    scenario = SimpleNamespace(runner=SimpleNamespace(inventory=inventory), topology=topology, faults=None,
                               source=file)
    try:
        with _ranks_ended_on_exit(out, "every rank was ended on the machines"), \
                open_inventory(scenario, _Say(say)) as net:
            hosts = [net.host(h) for h in net.assignment]
            order = {name: i for i, name in enumerate(
                f"{dc.name}-{h}" for dc in topology.dcs for h in dc.hosts)}
            hosts.sort(key=lambda h: order.get(h.name, len(order)))
            prefix = net.record.prefix if net.record is not None else ""
            site = HostsSite(hosts, topology.name, str(Path(file).resolve()), prefix)
            return run_launch(site, spec, out_dir=out, echo=not quiet, progress=say)
    except (LaunchError, RunnerError) as exc:
        raise click.ClickException(str(exc)) from None


def _attached(name: str, spec: LaunchSpec, out: Path, quiet: bool, say: Say,
              line_times: dict[int, list[float]] | None = None) -> LaunchReport:
    from testbed.launch.detach import Attached
    from testbed.launch.plan import LaunchError
    from testbed.launch.run import run_launch

    try:
        with _ranks_ended_on_exit(out, f"every rank was ended ({name} stays up)"), Attached.connect(name) as site:
            say(f"attached to {name} ({site.topology_name}, run {site.prefix})")
            return run_launch(site, spec, out_dir=out, echo=not quiet, progress=say, line_times=line_times)
    except LaunchError as exc:
        raise click.ClickException(str(exc)) from None


def _summary(report: LaunchReport, out: Path) -> None:
    lines = [f"{'rank':>4}  {'host':<12} {'exit':>6} {'wall s':>8}  metrics"]
    for r in report.ranks:
        code = "-" if r.exit_code is None else str(r.exit_code)
        lines.append(f"{r.rank:>4}  {r.dc + '/' + r.host:<12} {code:>6} {r.wall_s:>8.2f}  {len(r.metrics)}")
    for w in report.wan_bytes:
        lines.append(f"WAN {w.link}: {w.a}->{w.b} {w.a_to_b_bytes:,} B, {w.b}->{w.a} {w.b_to_a_bytes:,} B")
    lines.append(f"{'ok' if report.ok else 'FAILED'} in {report.wall_s:.2f} s; launch.json and logs in {out}")
    click.echo("\n".join(lines), err=True)
