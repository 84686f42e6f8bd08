"""`testbed topo show|up|check FILE`: look at, open, and verify an emulated topology."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable

import click

from testbed_core.topology import Topology, TopologyError, load_topology
from testbed_core.units import format_rate, format_size

BACKENDS = click.Choice(["auto", "netem", "relay"])


def _stderr_progress() -> Callable[[str], None]:
    t0 = time.monotonic()

    def say(message: str) -> None:
        click.echo(f"[{time.monotonic() - t0:6.1f}s] {message}", err=True)

    return say


def _load(path: str) -> Topology:
    try:
        return load_topology(path)
    except TopologyError as exc:
        raise click.ClickException(str(exc)) from None


def _user_errors() -> tuple[type[BaseException], ...]:
    from testbed.emulation.naming import NamingError
    from testbed.emulation.network import EmulationError
    from testbed.emulation.records import RecordError

    return (EmulationError, NamingError, RecordError, TopologyError)


def _table(headers: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip()]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    return "\n".join(lines)


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:g} ms"


def render_topology(topo: Topology) -> str:
    """The parsed topology as tables: DCs, WAN links, routes."""
    from testbed.emulation.addressing import plan_addresses

    plan = plan_addresses(topo)
    out = [f"Topology {topo.name}" + (f": {topo.description}" if topo.description else "")]
    if topo.source:
        out.append(f"Source: {topo.source}")
    rows = []
    for dc, dplan in zip(topo.dcs, plan.dcs, strict=True):
        tcp = topo.tcp_for(dc.name)
        rows.append([dc.name, str(len(dc.hosts)), ", ".join(dc.hosts), str(dplan.subnet), dplan.gateway_ip,
                     format_rate(dc.lan_rate),
                     f"{tcp.congestion_control} rmem {format_size(tcp.rmem_max)} wmem {format_size(tcp.wmem_max)}"])
    out += ["", "Datacenters", _table(["DC", "hosts", "names", "subnet", "gateway", "LAN rate", "TCP"], rows)]
    rows = []
    for link, lplan in zip(topo.wan, plan.links, strict=True):
        changes = f"{len(link.changes)} changes" if link.changes else ""
        rows.append([f"{link.between[0]} <-> {link.between[1]}", format_rate(link.rate), _ms(link.delay),
                     _ms(link.rtt_s), _ms(link.jitter), f"{link.loss * 100:g}%", format_size(link.queue_bytes),
                     str(lplan.subnet), changes])
    if rows:
        out += ["", "WAN links", _table(["link", "rate", "delay", "RTT", "jitter", "loss", "queue", "subnet",
                                          "changes"], rows)]
    rows = []
    for (a, b), path in topo.routes().items():
        if a < b or (b, a) not in topo.routes():
            rows.append([f"{a} -> {b}", " > ".join(path), _ms(2 * topo.path_delay(a, b)),
                         "direct" if len(path) == 2 else f"via {', '.join(path[1:-1])}"])
    if rows:
        out += ["", "Routes (lowest latency)", _table(["pair", "path", "RTT", ""], rows)]
    return "\n".join(out)


def render_check(report: dict) -> str:
    rows = []
    for link in report["links"]:
        rtt, gp = link["rtt_ms"], link["goodput_mbps"]
        dirs = " / ".join(
            f"{d['goodput_mbps']:.0f}" if d.get("goodput_mbps") is not None else "-" for d in link["directions"])
        rows.append([f"{link['a']} <-> {link['b']}", f"{rtt['configured']:g}",
                     "-" if rtt["measured"] is None else f"{rtt['measured']:.2f}",
                     "ok" if link["rtt_ok"] else "OUT",
                     f"{gp['configured']:g}", "-" if gp["measured"] is None else f"{gp['measured']:.0f}",
                     dirs, "ok" if link["goodput_ok"] else "OUT", link["endpoints"],
                     "ok" if link["ok"] else "FAIL"])
    lines = [
        f"delay backend: {report['delay_backend']}   build: {report['build_s']:.2f} s   "
        f"teardown: {report['teardown_s']:.2f} s",
        _table(["link", "RTT cfg ms", "RTT ms", "RTT?", "rate Mbit/s", "goodput", "(a->b / b->a)", "rate?",
                "endpoints", "verdict"], rows),
        "tolerance: RTT within max(1 ms, 3%) of the configured RTT (worse direction); "
        "goodput >= 90% of the rate in both directions",
    ]
    return "\n".join(lines)


@click.group()
def topo() -> None:
    """Show, open or verify an emulated topology."""


@topo.command()
@click.argument("file", type=click.Path(dir_okay=False))
def show(file: str) -> None:
    """Print the parsed topology FILE as tables."""
    topology = _load(file)
    try:
        click.echo(render_topology(topology))
    except _user_errors() as exc:
        raise click.ClickException(str(exc)) from None


@topo.command()
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("--backend", type=BACKENDS, default="auto", show_default=True,
              help="delay backend: kernel netem, the userspace relay, or auto")
def up(file: str, backend: str) -> None:
    """Build FILE, open Mininet's CLI on it, tear it down when the CLI exits."""
    from testbed.emulation.mininet_cli import run_cli
    from testbed.emulation.network import Emulation

    topology = _load(file)
    say = _stderr_progress()
    try:
        emu = Emulation(topology, delay_backend=None if backend == "auto" else backend, progress=say)
        with emu:
            say(f"built in {emu.build_s:.2f} s (delay backend {emu.delay_backend}); "
                "`nodes` lists them, `exit` or Ctrl-D tears down")
            run_cli(emu)
        say(f"torn down in {emu.teardown_s:.2f} s")
    except _user_errors() as exc:
        raise click.ClickException(str(exc)) from None


@topo.command()
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="print the report as JSON on stdout")
@click.option("--backend", type=BACKENDS, default="auto", show_default=True,
              help="delay backend: kernel netem, the userspace relay, or auto")
@click.option("--duration", type=click.IntRange(1, 60), default=4, show_default=True,
              help="seconds of iperf3 per direction (after slow start, which is not counted)")
def check(file: str, as_json: bool, backend: str, duration: int) -> None:
    """Build FILE, measure every WAN link both ways, compare with the file.

    Exits 1 when a link is out of tolerance: RTT off by more than max(1 ms, 3%),
    or goodput under 90% of the configured rate.
    """
    from testbed.emulation.linkcheck import check_links
    from testbed.emulation.network import Emulation

    topology = _load(file)
    say = _stderr_progress()
    try:
        emu = Emulation(topology, delay_backend=None if backend == "auto" else backend, progress=say)
        with emu:
            say(f"built {len(emu.nodes())} nodes in {emu.build_s:.2f} s, delay backend {emu.delay_backend}")
            results = check_links(emu, duration=duration, progress=say)
            say("tearing down")
        say(f"torn down in {emu.teardown_s:.2f} s")
    except _user_errors() as exc:
        raise click.ClickException(str(exc)) from None
    except KeyboardInterrupt:
        click.echo("interrupted: the emulation was torn down", err=True)
        sys.exit(130)
    report = {
        "delay_backend": emu.delay_backend,
        "build_s": round(emu.build_s or 0.0, 3),
        "teardown_s": round(emu.teardown_s or 0.0, 3),
        "links": [r.as_json() for r in results],
    }
    if as_json:
        click.echo(json.dumps(report, indent=2))
    else:
        click.echo(render_check(report))
    if not all(r.ok for r in results):
        bad = ", ".join(f"{r.a}-{r.b}" for r in results if not r.ok)
        click.echo(f"out of tolerance: {bad}", err=True)
        sys.exit(1)
