"""`testbed topo show|up|check FILE`: look at, open, and verify an emulated topology;
`testbed topo up --detach`, `down NAME`, `list`: topologies kept up for `testbed launch --attach`."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

import click

from testbed_core.topology import Topology, TopologyError, load_topology
from testbed_core.units import format_rate, format_size

BACKENDS = click.Choice(["auto", "netem", "relay"])


def _stderr_progress() -> Callable[[str], None]:
    t0 = time.monotonic()

    def say(message: str) -> None:
        click.echo(f"[{time.monotonic() - t0:6.1f}s] {message}", err=True)

    return say


def _load(path: str, servers: str | None = None) -> Topology:
    """The topology FILE, with the DCs placed on the servers of ``--servers FILE`` when given."""
    from testbed_core.servers import ServersError, load_servers, place_topology

    try:
        topology = load_topology(path)
        if servers is not None:
            topology = place_topology(topology, load_servers(servers), servers)
        return topology
    except (TopologyError, ServersError) as exc:
        raise click.ClickException(str(exc)) from None


SERVERS_OPTION = click.option(
    "--servers", "servers", type=click.Path(dir_okay=False), default=None, metavar="FILE",
    help="place the DCs on servers reached over SSH (a servers section as its own file: tunnel, ssh, machines); "
         "replaces the topology's own servers section")


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
    if topo.servers is not None:
        srv = topo.servers
        rows = [[s.name, s.address, ", ".join(s.dcs), f"{srv.ssh_for(s).user}@{s.address}:{srv.ssh_for(s).port}",
                 format_rate(s.underlay_rate) if s.underlay_rate else "measured at start"] for s in srv.machines]
        out += ["", f"Servers (WAN links between servers: {srv.tunnel} tunnels)",
                _table(["server", "address", "DCs", "login", "underlay"], rows)]
    return "\n".join(out)


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:.3g}%"


def _flag(ok: bool) -> str:
    return "ok" if ok else "OUT"


def _loss_line(v: dict) -> str:
    """A lossy link's loss verdict: the pooled figure against the tolerance, each way's
    count against its range, and how often a correct link fails the test."""
    cfg = _pct(v["configured"])
    rel = v["rel_error"]
    ways = ", ".join(f"{d['lost']} in {d['accept'][0]}-{d['accept'][1]} {_flag(d['ok'])}" for d in v["directions"])
    level = f"{(1 - v['direction_alpha']) * 100:.4g}%"
    fa = v["false_alarm"]
    odds = f"1 in {round(1 / fa, -2 if fa < 0.01 else 0):,.0f}" if fa > 0 else "never"
    return (f"  loss: pooled {v['lost']:,} of {v['sent']:,} ({_pct(v['pooled'])}, "
            f"{'-' if rel is None else f'{rel * 100:+.1f}%'} of {cfg}, within +-{v['rel_tol'] * 100:.3g}% = "
            f"{v['sigmas']:.1f} sd: {_flag(v['pooled_ok'])}); each way inside its {level} range for {cfg}: {ways}; "
            f"a correct link fails this at most {odds}")


def render_check(report: dict) -> str:
    """The check's verdicts as one table, then each direction's train, rate and goodput."""
    rows = []
    for link in report["links"]:
        rtt, gp = link["rtt_ms"], link["goodput_mbps"]
        rtt_cfg = link.get("rtt_expected_ms") or rtt["configured"]
        rates = " / ".join("-" if d.get("rate_mbps") is None else f"{d['rate_mbps']:.0f}" for d in link["directions"])
        goodput = " / ".join("-" if d.get("goodput_mbps") is None else f"{d['goodput_mbps']:.0f}"
                             for d in link["directions"])
        losses = " / ".join(_pct(d["train"]["loss"]) if d.get("train") else "-" for d in link["directions"])
        rows.append([
            f"{link['a']} <-> {link['b']}",
            f"{rtt_cfg:g}", "-" if rtt["measured"] is None else f"{rtt['measured']:.2f}", _flag(link["rtt_ok"]),
            _pct(link["loss"]["configured"]), losses, _flag(link["loss_ok"]),
            f"{link['jitter_ms']:g}", _flag(link["delay_ok"]),
            f"{gp['configured']:g}", rates, _flag(link["rate_ok"]),
            goodput, _flag(link["goodput_ok"]) if link["goodput_judged"] else
            ("(lossy)" if link["loss"]["configured"] > 0 else "(no TCP)"),
            "ok" if link["ok"] else "FAIL",
        ])
    lines = [
        f"delay backend: {report['delay_backend']}   build: {report['build_s']:.2f} s   "
        f"teardown: {report['teardown_s']:.2f} s",
        _table(["link", "RTT cfg ms", "RTT ms", "RTT?", "loss cfg", "loss a->b / b->a", "loss?", "jitter ms",
                "delay?", "rate Mbit/s", "UDP rate", "rate?", "TCP goodput", "goodput?", "verdict"], rows),
    ]
    for link in report["links"]:
        offset = link.get("path_offset_ms")
        lines.append("")
        lines.append(f"{link['a']} <-> {link['b']} ({link['endpoints']})"
                     + (f"; relay path latency {offset:.3f} ms each way left out of the delay" if offset else ""))
        for d in link["directions"]:
            t = d.get("train")
            if t:
                lo, hi = t["loss_ci95"]
                dm, mm = t["delay_ms"], t["model_ms"]
                lines.append(
                    f"  {d['src']} -> {d['dst']}: {t['lost']} of {t['sent']} lost ({_pct(t['loss'])}, 95% CI "
                    f"{_pct(lo)}-{_pct(hi)}); one-way ms min {dm['min']:.3f} median {dm['p50']:.3f} "
                    f"max {dm['max']:.3f} (model median {mm['p50']:.3f}); early {t['early']}, late {t['late']}, "
                    f"reordered {t['reordered']}")
            n = d.get("node")
            if n:
                nd = n["delay_ms"]
                lines.append(f"    through the WAN node: {n['lost']} of {n['entered']} lost ({_pct(n['loss'])}); "
                             f"ms min {nd['min']:.3f} median {nd['p50']:.3f} max {nd['max']:.3f}; "
                             f"reordered {n['reordered']}")
            if d.get("expected_goodput_mbps") is not None:
                measured = "not measured" if d["goodput_mbps"] is None else f"{d['goodput_mbps']:.0f} Mbit/s"
                lines.append(f"    TCP goodput {measured} with {d['streams']} streams; "
                             f"expected under this loss {d['expected_goodput_mbps']:.0f} Mbit/s")
        verdict = link["loss"].get("verdict")
        if verdict and verdict["configured"] > 0:
            lines.append(_loss_line(verdict))
        relay = link.get("relay_during_train")
        if relay and any(v["relay_drops"] or v["queue_drops"] for v in relay.values()):
            lines.append("  the relay during the train: " + "; ".join(
                f"{k}: {v['relay_drops']} dropped by the relay itself ({v['socket_drops']} by its socket), "
                f"{v['queue_drops']} by the shaper's queue, {v['loss_model']} by the loss model"
                for k, v in relay.items()))
        if link.get("pcap"):
            lines.append(f"  capture: {link['pcap']} (capture drops {link['capture_drops']}); "
                         f"histogram: {link['histogram']}")
    lines += [
        "",
        "tolerance: RTT within 0.3 ms of the configured RTT (train medians; under jitter, of the order-keeping "
        "model's); loss: none on a loss-free link, else both ways pooled within 20% of the configured rate (a train "
        "sized for 4 sd) and each way inside its 99.99% binomial range; delay: none early (below delay - jitter - "
        "max(0.3 ms, the path offset)), <= 5% late by over 1 ms, median within 0.3 ms (plus 4 sd of its sampling "
        "spread) of the model, no reordering (relay; netem's jitter "
        "reorders); UDP rate within 5%; "
        "TCP goodput >= 90% of the rate both ways (loss-free links, unless --no-tcp)",
    ]
    return "\n".join(lines)


@click.group()
def topo() -> None:
    """Show, open or verify an emulated topology; keep one up for `testbed launch --attach`."""


@topo.command()
@click.argument("file", type=click.Path(dir_okay=False))
@SERVERS_OPTION
def show(file: str, servers: str | None) -> None:
    """Print the parsed topology FILE as tables."""
    topology = _load(file, servers)
    try:
        click.echo(render_topology(topology))
    except _user_errors() as exc:
        raise click.ClickException(str(exc)) from None


@topo.command()
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("--backend", type=BACKENDS, default="auto", show_default=True,
              help="delay backend: kernel netem, the userspace relay, or auto")
@SERVERS_OPTION
@click.option("--detach", is_flag=True,
              help="keep the topology up in the background instead of opening Mininet's CLI: "
                   "`testbed launch --attach NAME -- COMMAND` runs programs on it, `testbed topo down NAME` ends it")
@click.option("--name", "name", default=None, metavar="NAME",
              help="with --detach: the name to attach by (default: the topology's name)")
def up(file: str, backend: str, servers: str | None, detach: bool, name: str | None) -> None:
    """Build FILE, open Mininet's CLI on it, tear it down when the CLI exits
    (with --detach: keep it up in the background until `testbed topo down NAME`)."""
    from testbed.emulation.mininet_cli import run_cli
    from testbed.emulation.network import Emulation

    topology = _load(file, servers)
    if name is not None and not detach:
        raise click.UsageError("--name names a topology kept up with --detach; add --detach")
    if detach:
        _up_detached(file, topology, name or topology.name, backend, servers)
        return
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


def _up_detached(file: str, topology: Topology, name: str, backend: str, servers: str | None) -> None:
    from testbed.launch.detach import start_detached
    from testbed.launch.plan import LaunchError

    say = _stderr_progress()
    try:
        state = start_detached(file, name, backend=None if backend == "auto" else backend, servers=servers, say=say)
    except LaunchError as exc:
        raise click.ClickException(str(exc)) from None
    except KeyboardInterrupt:
        click.echo("interrupted: the topology was torn down", err=True)
        sys.exit(130)
    say(f"{state.topology} is up as {state.name!r} (run {state.prefix}, daemon pid {state.daemon_pid}, "
        f"{len(state.hosts)} hosts: {', '.join(h.name for h in state.hosts)})")
    say(f"run programs on it: testbed launch --attach {state.name} -- COMMAND; "
        f"end it: testbed topo down {state.name}")
    click.echo(state.name)


@topo.command()
@click.argument("name")
def down(name: str) -> None:
    """Tear down the topology kept up as NAME (`testbed topo up --detach`) and wait until it is gone."""
    from testbed.launch.detach import stop_detached
    from testbed.launch.plan import LaunchError

    t0 = time.monotonic()
    try:
        state = stop_detached(name)
    except LaunchError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"{state.name} ({state.topology}, run {state.prefix}) torn down in {time.monotonic() - t0:.2f} s",
               err=True)


@topo.command(name="list")
def list_() -> None:
    """List the topologies kept up with `testbed topo up --detach`."""
    from testbed.launch.detach import list_detached

    rows = []
    for state, alive in list_detached():
        age = time.time() - state.built
        rows.append([state.name, state.topology, state.prefix, str(len(state.hosts)), str(state.daemon_pid),
                     f"{age / 60:.0f} min", "up" if alive else "daemon gone: `testbed clean`"])
    if not rows:
        click.echo("no detached topologies (start one with `testbed topo up FILE --detach`)")
        return
    click.echo(_table(["name", "topology", "run", "hosts", "daemon", "up for", "state"], rows))


@topo.command()
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="print the report as JSON on stdout")
@click.option("--backend", type=BACKENDS, default="auto", show_default=True,
              help="delay backend: kernel netem, the userspace relay, or auto")
@click.option("--duration", type=click.IntRange(1, 60), default=4, show_default=True,
              help="seconds of iperf3 per direction (after slow start, which is not counted)")
@click.option("--deep", is_flag=True,
              help="also capture each link's UDP train on its WAN node: writes a pcapng and a delay histogram "
                   "(PNG) per link into --out")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None,
              help="folder for --deep's files (default: topo-check-<topology name>)")
@click.option("--loss-precision", type=click.FloatRange(0.02, 1.0), default=0.2, show_default=True,
              help="a lossy link's loss (both ways pooled) must be within this fraction of the configured loss; "
                   "its UDP train is sized so that this is 4 standard deviations (0.2 at 0.1% loss: 200,000 "
                   "datagrams each way, ~40 s; 0.1: four times as many, capped at 60 s, which widens the tolerance)")
@click.option("--no-tcp", "no_tcp", is_flag=True,
              help="leave out the TCP goodput (iperf3): a quicker check of RTT, loss, delay and rate")
@SERVERS_OPTION
def check(file: str, as_json: bool, backend: str, duration: int, deep: bool, out_dir: str | None,
          loss_precision: float, no_tcp: bool, servers: str | None) -> None:
    """Build FILE, measure every WAN link both ways, compare with the file.

    Per link: RTT, loss, delay distribution and order from a UDP train both ways;
    the shaper's rate from a UDP blast; TCP goodput with iperf3. Exits 1 when a link
    is out of tolerance (the table's last line says what the tolerances are).
    """
    from testbed.emulation.linkmeasure.check import check_links
    from testbed.emulation.network import Emulation

    topology = _load(file, servers)
    say = _stderr_progress()
    deep_dir = None
    if deep:
        deep_dir = Path(out_dir or f"topo-check-{topology.name}")
        try:
            deep_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise click.ClickException(f"--out {deep_dir}: cannot create the folder: {exc.strerror}") from None
    elif out_dir is not None:
        raise click.UsageError("--out names the folder for --deep's files; add --deep")
    try:
        emu = Emulation(topology, delay_backend=None if backend == "auto" else backend, progress=say)
        with emu:
            say(f"built {len(emu.nodes())} nodes in {emu.build_s:.2f} s, delay backend {emu.delay_backend}")
            results = check_links(emu, duration=duration, progress=say, deep_dir=deep_dir,
                                  loss_precision=loss_precision, tcp_goodput=not no_tcp)
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
        "links": [r.report().model_dump(mode="json") for r in results],
    }
    if as_json:
        click.echo(json.dumps(report, indent=2))
    else:
        click.echo(render_check(report))
    if not all(r.ok for r in results):
        bad = ", ".join(f"{r.a}-{r.b}" for r in results if not r.ok)
        click.echo(f"out of tolerance: {bad}", err=True)
        sys.exit(1)
