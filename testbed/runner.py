"""`testbed run`: geo-distributed pipeline training on the emulated testbed.

One run builds the scenario's topology once (or, with ``runner.local``, uses
127.0.0.1 and no emulated network), calibrates the WAN path, then plays each variant:

1. **Placement and prediction.** The Atlas planner places the stages (its own
   heuristic for ``atlas``, ``runner.baseline_placement`` for ``baseline`` and
   ``multi-tcp``, DP across DCs for ``dp-across-dc``) and simulates one iteration
   with the calibrated channel rates; ``atlas`` gets its temporal plan
   (atlas_transport/temporal.py) unless, with ``runner.atlas_sharing: auto``,
   sharing the link is predicted faster (each way predicted with its own rates: the
   plan's transfers hold the link ``token_margin`` longer; shared channels move what
   the collision probe measured).
2. **Workers.** One process per (pipeline, rank) on its placed host
   (testbed/training/worker.py), each with its emulated GPU (`testbed.device.Device`)
   in the variant's run directory: modelled (durations from the compute model), or,
   with ``gpu.mode: real``, real torch work whose parameters are checked against a
   one-process reference at the end (testbed/training/real_mode.py). Every pipeline boundary is an atlas_transport
   channel (1 stream for ``baseline``, N for the others; 1 inside a DC) carrying
   activations forward and gradients back, of the workload's wire size. Under
   ``atlas`` pipelines start at their planned offsets and each WAN send waits for
   its token: the previous transfer in its link's planned order has had its planned
   time on the wire (plus ``runner.token_margin``); senders announce their start to
   the next holder over UDP on the DC's LAN (``runner.temporal_mode: slot`` waits for
   the planned slot start instead).
3. **Synchronised iterations.** Workers connect, report ready on a UNIX control
   socket (it crosses network namespaces: it lives on the shared filesystem), and
   start each iteration at a common wall-clock instant; the next one starts when all
   have finished (the optimizer step's barrier), ``runner.iteration_lead`` later.
4. **Measurement.** Device timelines and transfer records give iteration times,
   utilization, bubbles and per-WAN-link bytes and goodput
   (testbed/training/metrics.py); a CSV timeline and a Gantt chart per variant.

Calibration and prediction: before the variants, tensors of the workload's wire size
are timed over one channel each way between hosts on either side of the WAN (after an
untimed tensor that opens the TCP windows), once per stream count the variants use,
and the shared variants' channels are timed colliding (all sending at once). The
a-priori prediction uses those rates (per-flow rate = channel rate / streams) instead
of the window model. After a variant ran, its prediction is made again, same
placement and same plan, with the channel rate its own warm-up iterations measured
(the first one left out): the planner's structure (fill/drain, latency, sharing,
temporal plan) is what is tested, with the speed the network really gave. With real
devices the warm-up iterations also give each stage's measured forward/backward time
and the time outside the pipeline (gradient exchange, optimizer step), which the
compute model cannot know. Both predictions are in the summary.

BubbleTea: a variant ``<name>+bubbletea`` (``bubbletea.enabled``, for the variants in
``bubbletea.variants``) makes each worker publish its planned idle slots
(bubbletea_agent/slots.py) to ``<variant>/run/slots/<device>.jsonl`` and its live
guarantee (bubbletea_agent/live.py: until when training surely leaves the device alone)
to ``<variant>/run/live/<device>.status``; the runner keeps the gate
(``run/live/gate.status``: the next iteration's start, or the earliest it can be). It
starts the decode servers (``bubbletea.decode_host``: one per DC for ``same-dc``), then one
agent per worker device on the worker's host (`agent_command`, nice -10), and waits for
the agents to be ready before the first iteration. The variant's summary entry adds the
agents' requests, TTFT, guard violations (training waiting for a prefill, from the device
timelines) and the slowdown against the same variant without agents (`bubbletea_metrics`).
"""

from __future__ import annotations

import contextlib
import copy
import importlib.util
import json
import math
import os
import secrets
import selectors
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol

import yaml

from testbed.configfile import ConfigError
from testbed.progress import Progress
from testbed.scenario import DECODE_SAME_DC, Scenario

BT_SUFFIX = "+bubbletea"
REPO_ROOT = Path(__file__).resolve().parent.parent
PROBE_GAP_S = 0.1  # between calibration tensors: like a channel between micro-batches
PROBE_WARMUP = 2  # calibration tensors sent first and not timed (connection set-up, window growth)
PROBE_WARMUP_BYTES_PER_STREAM = 2 << 20  # one big untimed tensor first: a few windows per stream
AUTO_CANDIDATES = (1, 2, 4, 8, 16)
AUTO_MARGIN = 0.10
# Share of a WAN link's nominal rate that TCP goodput reaches through the shaper
# (headers, HTB, window dynamics): 8 window-limited flows reached ~850 Mbit/s on the
# 2dc topology's 1 Gbit/s link. Atlas's stream count fills this much.
FILL_GOODPUT = 0.85
STREAMS_MARGIN = 0.05  # atlas leaves its fill-the-link stream count only for one measured this much faster
LINK_GOODPUT = 1448 / 1514  # TCP payload per Ethernet frame: what a shaped link carries (topo check: 955/1000)


class RunnerError(RuntimeError):
    """A run that could not be carried out; the message says where and what to do."""


# ============================================================== hosts and networks

class Host(Protocol):
    name: str
    ip: str

    def popen(self, argv: Sequence[str], **kwargs: Any) -> subprocess.Popen: ...


@dataclass
class LocalHost:
    """A topology host played by this machine (local mode): 127.0.0.1, no namespace."""

    name: str
    dc: str
    ip: str = "127.0.0.1"

    def popen(self, argv: Sequence[str], **kwargs: Any) -> subprocess.Popen:
        return subprocess.Popen(list(argv), **kwargs)


class Network(Protocol):
    delay_backend: str
    local: bool

    def host(self, name: str) -> Host: ...


@dataclass
class LocalNetwork:
    topology: Any
    delay_backend: str = "none (local mode: loopback, no emulated WAN)"
    local: bool = True

    def host(self, name: str) -> Host:
        for dc in self.topology.dcs:
            for h in dc.hosts:
                if f"{dc.name}-{h}" == name:
                    return LocalHost(name, dc.name)
        raise RunnerError(f"no host {name!r} in topology {self.topology.name}")


@dataclass
class EmulatedNetwork:
    emu: Any
    local: bool = False

    @property
    def delay_backend(self) -> str:
        return str(self.emu.delay_backend)

    def host(self, name: str) -> Host:
        try:
            return self.emu.node(name)
        except KeyError:
            raise RunnerError(f"no host {name!r} in the emulation of {self.emu.topology.name}") from None


@contextlib.contextmanager
def open_network(scenario: Scenario, progress: Progress) -> Iterator[Network]:
    """The emulated topology (root needed), or loopback in local mode."""
    if scenario.runner.local:
        yield LocalNetwork(scenario.topology)
        return
    if os.geteuid() != 0:
        raise RunnerError("emulating the topology needs root: run as root (sudo), or set runner.local: true "
                          "(testbed run --local) to run the workers on 127.0.0.1 without an emulated WAN")
    from testbed.emulation import Emulation, EmulationError

    try:
        emu = Emulation(scenario.topology, progress=progress.log)
        emu.start()
    except EmulationError as exc:
        raise RunnerError(f"building topology {scenario.topology.name}: {exc}") from None
    try:
        if not scenario.runner.slow_start_after_idle:
            for h in emu.hosts():
                h.run(["sysctl", "-q", "-w", "net.ipv4.tcp_slow_start_after_idle=0"], check=True, timeout=10)
        yield EmulatedNetwork(emu)
    finally:
        emu.stop()


# ============================================================== processes

def worker_env(secret: str) -> dict[str, str]:
    env = dict(os.environ)
    env["ATLAS_SECRET"] = secret
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p)
    env.setdefault("OMP_NUM_THREADS", "1")  # modelled workers do no math; keep torch from spawning threads
    return env


def worker_argv(job_path: Path) -> list[str]:
    return [sys.executable, "-m", "testbed.training.worker", str(job_path)]


def agent_available() -> bool:
    return importlib.util.find_spec("bubbletea_agent.__main__") is not None


def agent_command(job: Mapping[str, Any], agent_job_path: Path) -> list[str]:
    """How a BubbleTea agent is started next to a worker: on the worker's host, with a
    job file naming the shared device (name, run_dir), the slot feed the worker
    writes (slots_path) and the scenario's bubbletea settings."""
    return [sys.executable, "-m", "bubbletea_agent", str(agent_job_path)]


def _tail(path: Path, lines: int = 15) -> str:
    try:
        text = path.read_text(errors="replace").strip().splitlines()
    except FileNotFoundError:
        return "(no log)"
    return "\n".join("    " + line for line in text[-lines:]) or "    (empty log)"


def _stop(procs: Mapping[str, subprocess.Popen], grace_s: float = 3.0) -> None:
    """End processes we started (TERM, then KILL after a grace period)."""
    deadline = time.monotonic() + grace_s
    for p in procs.values():
        if p.poll() is None:
            with contextlib.suppress(OSError):
                p.terminate()
    for p in procs.values():
        try:
            p.wait(max(0.05, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            with contextlib.suppress(OSError):
                p.kill()
            p.wait(2.0)


# ============================================================== calibration

@dataclass
class Calibration:
    """Measured speed of the WAN path for tensors of the workload's wire size."""

    src: str
    dst: str
    nbytes: int
    latency_s: float
    transfer_s: dict[int, list[float]] = field(default_factory=dict)  # streams -> hand-over to arrival
    rates_bps: dict[int, float] = field(default_factory=dict)  # streams -> effective channel rate
    concurrent: int = 0
    colliding_bps: dict[int, float] = field(default_factory=dict)  # streams -> aggregate of `concurrent`
    # channels colliding (all sending at once), per direction

    def rate(self, streams: int) -> float:
        return self.rates_bps[streams]

    def to_json(self) -> dict[str, Any]:
        return {
            "method": ("tensors of the workload's wire size timed over one atlas_transport channel from "
                       f"{self.src} to {self.dst} while another sends the other way, the first {PROBE_WARMUP} "
                       "not timed; channel rate = bytes / (median hand-over-to-arrival time - one-way delay); "
                       f"reported apart: the aggregate of {self.concurrent} channels colliding (sending at once) "
                       "each way"),
            "src": self.src, "dst": self.dst, "nbytes": self.nbytes, "one_way_delay_s": self.latency_s,
            "channel_rate_mbps": {str(n): r / 1e6 for n, r in sorted(self.rates_bps.items())},
            "per_flow_rate_mbps": {str(n): r / n / 1e6 for n, r in sorted(self.rates_bps.items())},
            "transfer_s": {str(n): v for n, v in sorted(self.transfer_s.items())},
            "concurrent_channels": self.concurrent,
            "colliding_channels_aggregate_mbps": {str(n): r / 1e6 for n, r in sorted(self.colliding_bps.items())},
        }


def effective_rate(nbytes: int, durations: Sequence[float], latency_s: float) -> float:
    """Channel rate from timed transfers: bytes over (median duration - one-way delay).
    The median: a rare retransmission timeout in a handful of samples would otherwise
    set the rate of every transfer of the run."""
    if not durations:
        raise RunnerError("calibration timed no transfer")
    d = sorted(durations)
    mid = d[len(d) // 2] if len(d) % 2 else (d[len(d) // 2 - 1] + d[len(d) // 2]) / 2
    return nbytes * 8 / max(1e-6, mid - latency_s)


def aggregate_rate(nbytes: int, rounds: Sequence[tuple[float, float]], channels: int, latency_s: float) -> float:
    """Link rate when `channels` send one tensor each at once: per round (first hand-over,
    last arrival), channels x bytes / (median span - delay)."""
    if not rounds:
        raise RunnerError("calibration timed no transfer")
    spans = sorted(last - first for first, last in rounds)
    mid = spans[len(spans) // 2] if len(spans) % 2 else (spans[len(spans) // 2 - 1] + spans[len(spans) // 2]) / 2
    return channels * nbytes * 8 / max(1e-6, mid - latency_s)


class Prober:
    """Runs probe-recv / probe-send pairs on hosts and reads their results."""

    def __init__(self, net: Network, folder: Path, scenario: Scenario, secret: str, port: int) -> None:
        self.net = net
        self.folder = folder
        self.scenario = scenario
        self.env = worker_env(secret)
        self.port = port
        self.folder.mkdir(parents=True, exist_ok=True)

    def run(self, pairs: Sequence[tuple[str, str]], streams: int, nbytes: int, count: int,
            label: str = "", period_s: float | None = None,
            offsets: Sequence[float] | None = None) -> list[dict[str, Any]]:
        """`count` tensors over one channel per (src, dst) pair, all pairs at once
        (each sender waits PROBE_GAP_S after a confirmation, or sends in rounds of
        `period_s`, pair k starting `offsets[k]` after the common start)."""
        t = self.scenario.transport
        transport = {"chunk_bytes": _chunk(t.chunk), "congestion": t.congestion}
        recvs, sends, logs = {}, {}, []
        results = []
        try:
            for k, (src, dst) in enumerate(pairs):
                name = f"{label}s{streams}-c{k}"
                port = self.port + k
                warm = min(PROBE_WARMUP_BYTES_PER_STREAM * streams, 64 << 20)
                rjob = {"role": "probe-recv", "name": name, "bind_ip": "0.0.0.0", "port": port, "streams": streams,
                        "nbytes": nbytes, "count": count, "out": str(self.folder / f"{name}-recv.json"),
                        "transport": transport, "warmup_bytes": warm}
                rpath = self.folder / f"{name}-recv.job.json"
                rpath.write_text(json.dumps(rjob))
                log = open(self.folder / f"{name}-recv.log", "w")  # noqa: SIM115 (closed below)
                logs.append(log)
                recvs[name] = self.net.host(dst).popen(worker_argv(rpath), env=self.env, stdout=subprocess.PIPE,
                                                       stderr=log, text=True, cwd=str(REPO_ROOT))
                line = recvs[name].stdout.readline()
                if "listening" not in line:
                    recvs[name].wait(5)
                    raise RunnerError(f"calibration receiver on {dst} did not start:\n{_tail(Path(log.name))}")
                sjob = {"role": "probe-send", "name": name, "peer_ip": self.net.host(dst).ip, "port": port,
                        "streams": streams, "nbytes": nbytes, "count": count, "gap_s": PROBE_GAP_S,
                        "wait_go": True, "period_s": period_s, "warmup_bytes": warm,
                        "out": str(self.folder / f"{name}-send.json"), "transport": transport}
                spath = self.folder / f"{name}-send.job.json"
                spath.write_text(json.dumps(sjob))
                slog = open(self.folder / f"{name}-send.log", "w")  # noqa: SIM115
                logs.append(slog)
                sends[name] = self.net.host(src).popen(worker_argv(spath), env=self.env, stdout=subprocess.PIPE,
                                                       stderr=slog, stdin=subprocess.PIPE, text=True,
                                                       cwd=str(REPO_ROOT))
            for name, p in sends.items():  # every sender connected: one common start
                if "connected" not in p.stdout.readline():
                    p.wait(5)
                    raise RunnerError(f"calibration probe {name} could not connect:\n"
                                      f"{_tail(self.folder / f'{name}-send.log')}")
            t_go = time.time() + 0.2
            for k, p in enumerate(sends.values()):
                p.stdin.write(f"go {t_go + (offsets[k] if offsets else 0.0)}\n")
                p.stdin.flush()
            procs = {**{f"{n}-recv": p for n, p in recvs.items()}, **{f"{n}-send": p for n, p in sends.items()}}
            deadline = time.monotonic() + 60 + count * 5
            for pname, p in procs.items():
                try:
                    rc = p.wait(max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    raise RunnerError(f"calibration probe {pname} did not finish in time:\n"
                                      f"{_tail(self.folder / f'{pname}.log')}") from None
                if rc != 0:
                    raise RunnerError(f"calibration probe {pname} failed (exit {rc}):\n"
                                      f"{_tail(self.folder / f'{pname}.log')}")
            for name in sends:
                s = json.loads((self.folder / f"{name}-send.json").read_text())
                r = json.loads((self.folder / f"{name}-recv.json").read_text())
                results.append({"sent": s["sent"], "arrived": r["arrived"]})
        finally:
            _stop({**recvs, **sends})
            for log in logs:
                log.close()
        return results


def calibrate(
    net: Network, scenario: Scenario, folder: Path, secret: str, pairs: Sequence[tuple[str, str]],
    stream_counts: Sequence[int], nbytes: int, latency_s: float, progress: Progress,
    cal: Calibration | None = None,
) -> Calibration:
    """Time tensors of `nbytes` over one channel per pair, all at once, once per stream
    count (added to `cal` when given). Pass a forward and a reverse pair: pipelines
    send activations and gradients across the WAN at the same time, and the reverse
    traffic (and its ACKs) slows the forward one."""
    count = scenario.runner.calibration_transfers + PROBE_WARMUP
    cal = cal or Calibration(pairs[0][0], pairs[0][1], nbytes, latency_s)
    prober = Prober(net, folder, scenario, secret, scenario.runner.base_port + 2000)
    for n in sorted(set(stream_counts) - set(cal.rates_bps)):
        durations = []
        for res in prober.run(pairs, n, nbytes, count, "single-"):
            durations += [a - s for s, a in zip(res["sent"], res["arrived"], strict=True)][PROBE_WARMUP:]
        cal.transfer_s[n] = durations
        cal.rates_bps[n] = effective_rate(nbytes, durations, latency_s)
        progress.log(f"  calibration: {n:2d} stream(s), {nbytes / 1e6:.2f} MB tensors: "
                     f"{cal.rates_bps[n] / 1e6:.0f} Mbit/s per channel "
                     f"(transfers {', '.join(f'{d * 1e3:.0f}' for d in durations)} ms)")
    return cal


def calibrate_link(
    net: Network, scenario: Scenario, folder: Path, secret: str, pairs: Sequence[tuple[str, str]],
    streams: int, cal: Calibration, progress: Progress,
) -> None:
    """The link's capacity as the variants load it: one channel of `streams` per pair
    and per direction, sending in synchronised rounds (as the data-parallel pipelines
    do); per direction and round, channels x bytes over the time until the last
    tensor arrived (so unfair sharing counts against the link)."""
    count = scenario.runner.calibration_transfers + PROBE_WARMUP
    prober = Prober(net, folder, scenario, secret, scenario.runner.base_port + 2000)
    single = cal.transfer_s.get(streams) or [1.0]
    period = 2.5 * sum(single) / len(single) + PROBE_GAP_S
    both = list(pairs) + [(b, a) for a, b in pairs]
    res = prober.run(both, streams, cal.nbytes, count, f"x{len(pairs)}-", period_s=period)
    rates = []
    for group in (res[:len(pairs)], res[len(pairs):]):
        rounds = [(min(r["sent"][k] for r in group), max(r["arrived"][k] for r in group))
                  for k in range(PROBE_WARMUP, count)]
        rates.append(aggregate_rate(cal.nbytes, rounds, len(pairs), cal.latency_s))
    cal.concurrent = len(pairs)
    cal.colliding_bps[streams] = sum(rates) / len(rates)
    progress.log(f"  calibration: {len(pairs)} channels of {streams} streams at once, each way: "
                 f"{', '.join(f'{r / 1e6:.0f}' for r in rates)} Mbit/s in all")


def _chunk(value: str | int) -> int:
    from testbed.units import parse_size

    return parse_size(value) if isinstance(value, str) else int(value)


# ============================================================== variants and predictions

@dataclass
class VariantSetup:
    name: str  # as reported, e.g. "atlas+bubbletea"
    base: str  # baseline, multi-tcp, atlas, dp-across-dc
    bubbletea: bool
    streams: int
    variant: Any  # atlas_transport.planner.Variant
    placement: Any
    prediction: Any
    rate_bps: float | None = None  # calibrated channel rate the a-priori prediction used
    colliding_bps: float | None = None  # calibrated aggregate of the pipelines' channels colliding
    final_prediction: float | None = None  # with the rate of the warm-up iterations
    sharing: str = "shared"  # how the variant uses WAN links: "temporal" (a plan) or "shared"
    sharing_alternatives: dict[str, float] | None = None  # atlas "auto": a-priori prediction of each way


def variant_names(scenario: Scenario, only: Sequence[str] | None = None) -> list[str]:
    """The variants to run, in order: the scenario's (or `only`), each also with
    BubbleTea when it is enabled (and without it too when `compare` is set)."""
    names = list(scenario.variants)
    if only:
        allowed = set(names) | {f"{n}{BT_SUFFIX}" for n in names}
        unknown = [v for v in only if v not in allowed and v.removesuffix(BT_SUFFIX) not in
                   ("baseline", "multi-tcp", "atlas", "dp-across-dc")]
        if unknown:
            raise RunnerError(f"--variants: unknown variant(s) {', '.join(unknown)} "
                              f"(allowed: baseline, multi-tcp, atlas, dp-across-dc, each optionally +bubbletea)")
        return list(dict.fromkeys(only))
    out = []
    bt = scenario.bubbletea
    for n in names:
        if bt.enabled and (bt.variants is None or n in bt.variants):
            if bt.compare:
                out.append(n)
            out.append(n + BT_SUFFIX)
        else:
            out.append(n)
    return out


def choose_streams(base: str, scenario: Scenario, flow_bps: float | None, link_bps: float | None,
                   auto: int | None) -> int:
    """TCP streams per WAN channel: 1 for baseline; transport.streams (or the
    calibrated best for 'auto') for multi-tcp and dp-across-dc; for atlas at least
    enough streams to fill the link (the planner's rule), counted against the
    goodput a shaped link gives TCP (FILL_GOODPUT of its nominal rate)."""
    if base == "baseline":
        return 1
    s = scenario.transport.streams
    n = (auto or 8) if s == "auto" else int(s)
    if base == "atlas" and flow_bps and link_bps:
        n = max(n, min(64, math.ceil(FILL_GOODPUT * link_bps / flow_bps - 1e-9)))
    return n


def calibrated_topology(topology: Any, link_bps: float | None, pair: tuple[str, str] | None, local: bool) -> Any:
    """The topology as the predictor sees it: WAN link rates scaled so that the link of
    the calibrated path has `link_bps` (what the transport gets from it: protocol
    overhead, shaper accuracy, the traffic pattern); no delays in local mode."""
    data = topology.model_dump()
    if link_bps is not None and pair is not None:
        ref = _nominal_link(topology, pair)
        factor = link_bps / ref if ref else 1.0
        for link in data["wan"]:
            link["rate"] = link["rate"] * factor
            for ch in link.get("changes") or []:
                if ch.get("rate") is not None:
                    ch["rate"] *= factor
    if local:
        for link in data["wan"]:
            link["delay"] = 0.0
            link["jitter"] = 0.0
            link["rate"] = max(link["rate"], link_bps or 0.0)
    data.pop("source", None)
    return type(topology).model_validate(data)


def calibrated_rates(temporal: bool, streams: int, rate_bps: float | None, sharing: int,
                     nominal_bps: float | None, colliding_bps: float | None = None) -> tuple[float | None, float | None]:
    """(per-flow rate, link capacity) the prediction of a variant uses, from the
    measured rate of one channel of `streams` streams.

    Temporal sharing puts one transfer at a time on the link: its capacity is that
    rate. Shared links: the measured aggregate of `sharing` channels colliding
    (sending at once), when calibrated; at least the one-channel rate (a fluid max-min
    model cannot give two channels less than one gets alone). Without that
    measurement (single streams, which stay far from the loss that many colliding
    streams cause): the link's TCP goodput, each channel still capped at its own
    measured rate."""
    if rate_bps is None:
        return None, None
    if temporal:
        return rate_bps / streams, rate_bps
    if colliding_bps is not None:
        return rate_bps / streams, max(rate_bps, colliding_bps)
    if nominal_bps is None:
        return rate_bps / streams, rate_bps
    return rate_bps / streams, max(rate_bps, LINK_GOODPUT * nominal_bps)


def _net_for(setup: VariantSetup, scenario: Scenario, workload: Any, rate_bps: float | None,
             pair: tuple[str, str] | None, local: bool) -> tuple[Any, Any]:
    from atlas_transport.planner import NetParams

    nominal = _nominal_link(scenario.topology, pair) if pair else None
    flow, link = calibrated_rates(setup.variant.sharing == "temporal", setup.streams, rate_bps,
                                  workload.parallelism.dp, nominal, setup.colliding_bps)
    return NetParams(flow_rate_bps=flow, allreduce=False), calibrated_topology(scenario.topology, link, pair, local)


def predict_variant(setup: VariantSetup, scenario: Scenario, workload: Any, base_dir: str | None,
                    rate_bps: float | None, pair: tuple[str, str] | None, local: bool,
                    effective: Any = None) -> Any:
    """The planner's prediction (and, for atlas, temporal plan) of a placed variant
    whose WAN channels move `rate_bps` each (`effective`: measured compute times)."""
    from atlas_transport.planner import predict

    net, topo = _net_for(setup, scenario, workload, rate_bps, pair, local)
    return predict(topo, workload, setup.variant, net=net, base_dir=base_dir, placement=setup.placement,
                   effective=effective)


def repredict(setup: VariantSetup, scenario: Scenario, workload: Any, base_dir: str | None,
              rate_bps: float | None, pair: tuple[str, str] | None, local: bool,
              compute: tuple[list[float], list[float]] | None = None) -> float:
    """Iteration time the planner predicts for the same placement and the same
    temporal plan (token order, offsets) when the channels move `rate_bps` (None:
    the calibrated rate) and, when given, each stage computes for the measured
    (forward, backward) seconds instead of the compute model's."""
    from dataclasses import replace

    from atlas_transport.planner import build_spec
    from testbed.training.simulate import simulate

    eff = workload.effective(base_dir)
    if compute is not None:
        eff = replace(eff, stage_forward_s=list(compute[0]), stage_backward_s=list(compute[1]))
    if rate_bps is None:
        rate_bps = setup.rate_bps
    plan = setup.prediction.plan
    if plan is not None and setup.rate_bps and rate_bps is not None:
        # with tokens a transfer holds its link for its planned time even when it is
        # done sooner: the link cannot move more than the plan's rate
        rate_bps = min(rate_bps, setup.rate_bps)
    net, topo = _net_for(setup, scenario, workload, rate_bps, pair, local)
    if plan is None:
        return predict_variant(setup, scenario, workload, base_dir, rate_bps, pair, local, eff).iteration_time_s
    spec, _ = build_spec(topo, workload, setup.placement, setup.variant, eff, net)
    return simulate(plan.apply(spec)).makespan


def plan_variant(
    name: str, scenario: Scenario, workload: Any, base_dir: str | None, cal: Calibration | None,
    auto_streams: int | None, local: bool = False,
) -> VariantSetup:
    from atlas_transport.planner import Variant, default_variants, free_gpus, place

    base = name.removesuffix(BT_SUFFIX)
    if base == "dp-across-dc":
        raise RunnerError(
            "dp-across-dc puts each pipeline in one DC, so only the DP gradient all-reduce crosses the WAN, "
            "and the runner does not emulate the all-reduce yet: the result would be compute alone. "
            "`testbed plan --variants dp-across-dc` predicts it; drop it from variants here"
        )
    table = default_variants(8, scenario.runner.baseline_placement)
    proto = table[base]
    topo = scenario.topology
    pair = (cal.src, cal.dst) if cal else None
    flow1 = cal.rates_bps.get(1) if cal else None
    streams = choose_streams(base, scenario, flow1, _nominal_link(topo, pair) if pair else None, auto_streams)
    if base == "atlas":
        streams = atlas_streams(streams, scenario, cal, auto_streams)
    par = workload.parallelism
    hosts = {dc.name: list(dc.hosts) for dc in topo.dcs}
    try:
        placement = place(free_gpus(topo), par.pp, par.dp, par.tp, strategy=proto.placement, hosts=hosts)
    except ValueError as exc:
        raise RunnerError(f"variant {name}: {exc}") from None
    if any(not h for h in placement.hosts.values()):
        raise RunnerError(f"variant {name}: placement {proto.placement} left a stage without a host")
    rate = cal.rates_bps.get(streams) if cal else None
    sharing = scenario.runner.atlas_sharing if base == "atlas" else proto.sharing
    setup = VariantSetup(name, base, name.endswith(BT_SUFFIX), streams,
                         Variant(base, streams, "shared", proto.placement, fill_link=False), placement, None)
    setup.colliding_bps = cal.colliding_bps.get(streams) if cal else None
    options: dict[str, tuple[Any, Any, float | None]] = {}
    for way in ("temporal", "shared"):
        if sharing not in (way, "auto"):
            continue
        setup.variant = Variant(base, streams, way, proto.placement, fill_link=False)
        way_rate = rate
        if rate is not None and way == "temporal":
            # a transfer holds its link token_margin longer than its measured time on
            # the wire, so that one running late does not collide with the next
            way_rate = rate / (1 + scenario.runner.token_margin)
        pred = predict_variant(setup, scenario, workload, base_dir, way_rate, pair, local)
        options[way] = (setup.variant, pred, way_rate)
    if len(options) == 2:
        from atlas_transport.planner import choose_sharing

        times = {way: opt[1].iteration_time_s for way, opt in options.items()}
        setup.sharing_alternatives = times
        way = choose_sharing(times["temporal"], times["shared"])
    else:
        (way,) = options
    setup.variant, setup.prediction, setup.rate_bps = options[way]
    if setup.prediction.plan is None and way == "temporal":
        way = "shared"  # no WAN link to plan (every crossing inside one DC)
    setup.sharing = way
    return setup


# ============================================================== jobs

def worker_id(pipeline: int, rank: int) -> str:
    return f"p{pipeline}r{rank}"


def device_name(pipeline: int, rank: int, host: str) -> str:
    return f"{host}-p{pipeline}r{rank}"


def path_links(topology: Any, a: str, b: str) -> tuple[tuple[str, ...], float]:
    """WAN link directions from DC a to DC b (lowest latency route) and its delay."""
    from testbed.topology import shortest_path

    if a == b:
        return (), 0.0
    path = shortest_path(a, b, topology.wan)
    return tuple(f"{x}->{y}" for x, y in zip(path, path[1:], strict=False)), topology.path_delay(a, b)


def build_jobs(
    *,
    setup: VariantSetup,
    workload: Any,
    topology: Any,
    host_ips: Mapping[str, str],
    run_dir: Path,
    control: str,
    base_port: int,
    iterations: int,
    transport: Mapping[str, Any],
    local: bool = False,
    setup_timeout_s: float = 60.0,
    timeout_s: float = 120.0,
    temporal_mode: str = "token",
    token_timeout_s: float = 10.0,
    iteration_lead_s: float = 0.05,
) -> dict[str, dict[str, Any]]:
    """The job file of every worker of a variant (pure: no I/O). Channel ports are
    `base_port + k` over the (pipeline, boundary) channels, so no two collide."""
    from testbed.training.schedules import build_schedule

    par = workload.parallelism
    eff = setup.prediction.effective or workload.effective()
    sched = build_schedule(par.schedule, par.pp, par.num_micro_batches, par.chunks)
    pl = setup.placement
    plan = setup.prediction.plan
    jobs: dict[str, dict[str, Any]] = {}
    for d in range(par.dp):
        for r in range(par.pp):
            host = pl.hosts[(d, r)][0]
            wid = worker_id(d, r)
            slots: list[tuple[float, float]] = []
            if setup.bubbletea:
                slots = [(s, e) for s, e in setup.prediction.sim.idle_slots(d, r, min_s=1e-3)]
            jobs[wid] = {
                "role": "train", "worker": wid, "pipeline": d, "rank": r, "host": host,
                "bind_ip": "0.0.0.0" if not local else "127.0.0.1",
                "schedule": par.schedule, "pp": par.pp, "microbatches": par.num_micro_batches, "chunks": par.chunks,
                "forward_s": list(eff.stage_forward_s), "backward_s": list(eff.stage_backward_s),
                "wire_bytes": int(eff.wire_activation_bytes), "iterations": iterations,
                "offset_s": float(plan.offsets[d]) if plan is not None else 0.0,
                "plan": [], "channels": [],
                "device": {"name": device_name(d, r, host), "run_dir": str(run_dir), "mode": "modelled",
                           "time_scale": 1.0},
                "control": control,
                "transfers_path": str(run_dir / "transfers" / f"{wid}.jsonl"),
                "transport": dict(transport),
                "setup_timeout_s": setup_timeout_s, "timeout_s": timeout_s,
                "slots_path": str(run_dir / "slots" / f"{device_name(d, r, host)}.jsonl") if setup.bubbletea else None,
                "idle_slots": slots,
            }
    k = 0
    for d in range(par.dp):
        for b in range(sched.stages - 1):
            up, down = sched.rank_of(b), sched.rank_of(b + 1)
            if up == down:
                raise RunnerError(f"boundary {b} joins two stages of the same rank {up}: "
                                  "the runner needs pp >= 2 for every boundary to be a channel")
            uj, dj = jobs[worker_id(d, up)], jobs[worker_id(d, down)]
            dc_up, dc_down = pl.dc_of(d, up), pl.dc_of(d, down)
            fwd_links, delay = path_links(topology, dc_up, dc_down)
            bwd_links, _ = path_links(topology, dc_down, dc_up)
            streams = setup.streams if fwd_links else 1
            port = base_port + k
            k += 1
            uj["channels"].append({"boundary": b, "role": "connect", "peer": dj["worker"],
                                   "peer_ip": host_ips[dj["host"]], "port": port, "streams": streams,
                                   "links": list(fwd_links), "recv_links": list(bwd_links), "latency_s": delay})
            dj["channels"].append({"boundary": b, "role": "listen", "peer": uj["worker"],
                                   "peer_ip": host_ips[uj["host"]], "port": port, "streams": streams,
                                   "links": list(bwd_links), "recv_links": list(fwd_links), "latency_s": delay})
    if workload.gpu.mode == "real":
        add_real_jobs(jobs, setup, workload, topology, host_ips, run_dir, base_port)
    if plan is not None:
        add_plan(jobs, plan, sched, base_port + 1000, host_ips, temporal_mode, token_timeout_s)
    if setup.bubbletea:
        add_live(jobs, topology, run_dir, iteration_lead_s, local)
    return jobs


def add_real_jobs(jobs: dict[str, dict[str, Any]], setup: VariantSetup, workload: Any, topology: Any,
                  host_ips: Mapping[str, str], run_dir: Path, base_port: int) -> None:
    """Real devices (``workload.gpu.mode: real``): each worker trains its stages for
    real and averages gradients with its DP peers (testbed/training/real_mode.py)."""
    from testbed.training.real_mode import RealModeError, add_real, resolve_device

    try:
        device = resolve_device(workload)
    except RealModeError as exc:
        raise RunnerError(str(exc)) from None
    add_real(jobs, workload=workload, placement=setup.placement, streams=setup.streams, topology=topology,
             host_ips=host_ips, run_dir=run_dir, base_port=base_port, torch_device=device, worker_id=worker_id)


def real_entry(folder: Path, workload: Any, progress: Progress, name: str) -> dict[str, Any]:
    """What a real-device variant adds to its summary entry: ``device_mode`` and the
    comparison with the one-process reference (``real``); nothing for modelled GPUs."""
    if workload.gpu.mode != "real":
        return {}
    from testbed.training.real_mode import summary_entry

    return summary_entry(folder, workload, progress.log, name)


def add_live(jobs: dict[str, dict[str, Any]], topology: Any, run_dir: Path, lead_s: float, local: bool) -> None:
    """BubbleTea's live status for each worker (bubbletea_agent/live.py): where it goes,
    and per boundary the nominal rate of the slowest shaped link a received tensor
    crosses (the WAN links on the way, else the DC's LAN; none in local mode), which
    bounds how soon the bytes still missing can arrive. The slack covers the shaper's
    burst (1 ms at that rate, testbed/shaping.py) and a little more."""
    from bubbletea_agent.live import status_path, wake_path

    lan = {dc.name: dc.lan_rate for dc in topology.dcs}
    for job in jobs.values():
        rates = {}
        for c in job["channels"]:
            links = [topology.link(*d.split("->")).rate for d in c["recv_links"]]
            rates[c["boundary"]] = 0.0 if local else min(links) if links else lan[job["host"].split("-", 1)[0]]
        slowest = max(rates.values(), default=0.0)
        name = job["device"]["name"]
        job["live"] = {"status_path": str(status_path(run_dir, name)), "wake_path": str(wake_path(run_dir, name)),
                       "lead_s": lead_s, "recv_rate_bps": rates,
                       "slack_bytes": int(slowest * 1e-3 / 8) + (32 << 10)}


def add_plan(jobs: dict[str, dict[str, Any]], plan: Any, sched: Any, token_base_port: int,
             host_ips: Mapping[str, str], mode: str, token_timeout_s: float) -> None:
    """Hand the temporal plan to the senders: for each WAN send its slot, its place in
    each link's token order, how long it holds the link (its planned time on the wire)
    and who holds the next token; and to each sender the token-bus addresses of the
    others."""

    def sender(key: Any) -> str:
        rank = sched.rank_of(key.boundary) if key.direction == "fwd" else sched.rank_of(key.boundary + 1)
        return worker_id(key.pipeline, rank)

    tokens: dict[Any, list[tuple[str, int]]] = {}
    nexts: dict[Any, list[tuple[str, int, str]]] = {}
    for res, keys in plan.order.items():
        link = res.removeprefix("wan:")
        for i, key in enumerate(keys):
            tokens.setdefault(key, []).append((link, i))
            if i + 1 < len(keys):
                nexts.setdefault(key, []).append((link, i + 1, sender(keys[i + 1])))
    for key, (start, end) in plan.slots.items():
        jobs[sender(key)]["plan"].append({
            "direction": key.direction, "boundary": key.boundary, "mb": key.mb, "start_s": float(start),
            "duration_s": float(end - start), "tokens": tokens.get(key, []), "next": nexts.get(key, []),
        })
    senders = sorted(w for w, j in jobs.items() if j["plan"])
    ports = {w: token_base_port + i for i, w in enumerate(sorted(jobs))}
    peers = {w: (host_ips[jobs[w]["host"]], ports[w]) for w in senders}
    for w in senders:
        job = jobs[w]
        job["plan"].sort(key=lambda p: p["start_s"])
        job["temporal_mode"] = mode
        job["token_timeout_s"] = token_timeout_s
        if mode == "token":
            job["token_port"] = ports[w]
            job["token_peers"] = {k: list(v) for k, v in peers.items()}


# ============================================================== control socket

class Controller:
    """The runner's end of the control socket: waits for the workers, starts each
    iteration at a common instant, watches for crashed processes."""

    def __init__(self, path: str, workers: Sequence[str], procs: Mapping[str, subprocess.Popen],
                 logs: Mapping[str, Path], progress: Progress) -> None:
        self.path = path
        self.expected = set(workers)
        self.procs = procs
        self.logs = logs
        self.progress = progress
        self.sel = selectors.DefaultSelector()
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.server.bind(path)
        self.server.listen(len(workers) + 4)
        self.server.setblocking(False)
        self.sel.register(self.server, selectors.EVENT_READ)
        self.conns: dict[str, socket.socket] = {}
        self._buf: dict[socket.socket, bytes] = {}
        self._who: dict[socket.socket, str] = {}
        self.inbox: list[dict[str, Any]] = []

    def close(self) -> None:
        for s in list(self._buf):
            with contextlib.suppress(OSError):
                s.close()
        self.server.close()
        self.sel.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)

    def _poll(self, timeout: float) -> None:
        for key, _ in self.sel.select(timeout):
            sock = key.fileobj
            if sock is self.server:
                conn, _ = self.server.accept()
                conn.setblocking(False)
                self._buf[conn] = b""
                self.sel.register(conn, selectors.EVENT_READ)
                continue
            try:
                data = sock.recv(65536)
            except OSError:
                data = b""
            if not data:
                self.sel.unregister(sock)
                self._buf.pop(sock, None)
                sock.close()
                continue
            buf = self._buf[sock] + data
            *lines, rest = buf.split(b"\n")
            self._buf[sock] = rest
            for line in lines:
                if not line.strip():
                    continue
                msg = json.loads(line)
                if msg.get("type") == "hello":
                    self.conns[msg["worker"]] = sock
                    self._who[sock] = msg["worker"]
                if msg.get("type") == "error":
                    raise RunnerError(f"worker {msg.get('worker')} failed: {msg.get('message')}\n"
                                      f"{_tail(self.logs.get(msg.get('worker'), Path('-')))}")
                self.inbox.append(msg)

    def _check_procs(self) -> None:
        for wid, p in self.procs.items():
            rc = p.poll()
            if rc is not None and rc != 0:
                self._poll(0.2)  # its error message may still be in the socket
                raise RunnerError(f"worker {wid} exited with status {rc}:\n{_tail(self.logs[wid])}")

    def wait_all(self, kind: str, timeout_s: float, what: str, iteration: int | None = None) -> dict[str, dict]:
        """One `kind` message from every worker (for `iteration` if given)."""
        deadline = time.monotonic() + timeout_s
        got: dict[str, dict] = {}
        while True:
            keep = []
            for msg in self.inbox:
                if msg.get("type") == kind and (iteration is None or msg.get("iteration") == iteration):
                    got[msg["worker"]] = msg
                else:
                    keep.append(msg)
            self.inbox = keep
            if set(got) >= self.expected:
                return got
            if time.monotonic() > deadline:
                missing = sorted(self.expected - set(got))
                hint = "\n".join(f"  {w} ({self.procs[w].args[-1] if w in self.procs else '?'}):\n{_tail(self.logs[w], 6)}"
                                 for w in missing[:3] if w in self.logs)
                raise RunnerError(f"{what}: no answer from {', '.join(missing)} within {timeout_s:g} s\n{hint}")
            self._poll(0.05)
            self._check_procs()
            self.progress.tick()

    def broadcast(self, kind: str, **fields: Any) -> None:
        line = (json.dumps({"type": kind, **fields}) + "\n").encode()
        for wid in self.expected:
            sock = self.conns.get(wid)
            if sock is None:
                raise RunnerError(f"worker {wid} is not connected to the control socket")
            sock.setblocking(True)
            try:
                sock.sendall(line)
            finally:
                sock.setblocking(False)


# ============================================================== one variant

@dataclass
class VariantRun:
    starts: list[float]
    ends: list[float]
    timelines: dict[str, list[Any]]
    transfers: list[Any]


def run_workers(
    net: Network, setup: VariantSetup, jobs: Mapping[str, dict[str, Any]], folder: Path, ctl_dir: Path,
    secret: str, scenario: Scenario, iterations: int, progress: Progress, workload: Any, base_dir: str | None,
) -> VariantRun:
    """Start the workers of one variant, play its iterations, collect the records."""
    from testbed.device import Device
    from testbed.training.metrics import merge_transfer_sides
    from testbed.training.transport_comm import read_transfer_logs

    jobs_dir, logs_dir = folder / "jobs", folder / "logs"
    jobs_dir.mkdir(parents=True, exist_ok=True)
    logs_dir.mkdir(parents=True, exist_ok=True)
    env = worker_env(secret)
    procs: dict[str, subprocess.Popen] = {}
    logs: dict[str, Path] = {}
    handles = []
    control = next(iter(jobs.values()))["control"]
    ctl = Controller(control, list(jobs), procs, logs, progress)
    pred = setup.prediction.iteration_time_s
    timeout = max(scenario.runner.iteration_timeout, 5 * pred)
    starts: list[float] = []
    ends: list[float] = []
    servers: dict[str, subprocess.Popen] = {}
    gate = None
    try:
        for wid, job in jobs.items():
            path = jobs_dir / f"{wid}.json"
            path.write_text(json.dumps(job, indent=1))
            logs[wid] = logs_dir / f"{wid}.log"
            fh = open(logs[wid], "w")  # noqa: SIM115 (closed in finally)
            handles.append(fh)
            procs[wid] = net.host(job["host"]).popen(worker_argv(path), env=env, stdout=fh,
                                                     stderr=subprocess.STDOUT, cwd=str(REPO_ROOT))
        lead = scenario.runner.iteration_lead
        if setup.bubbletea:
            from bubbletea_agent.live import Gate, gate_path

            gate = Gate(gate_path(Path(next(iter(jobs.values()))["device"]["run_dir"])), lead)
            # the request source only needs to outlast the run: requests stop at the last iteration
            horizon = iterations * max(pred, 0.1) * 3 + scenario.runner.setup_timeout
            agents, servers = start_agents(net, jobs, folder, scenario, workload, base_dir, iterations, env, logs,
                                           handles, horizon)
            procs.update(agents)
        ctl.wait_all("ready", scenario.runner.setup_timeout + 30, f"{setup.name}: starting the workers")
        if setup.bubbletea:
            wait_agents(procs, logs, folder, scenario.runner.setup_timeout)
            wait_decode_servers(servers, logs, scenario.runner.setup_timeout)
        at = gate.decide(0, max(0.2, lead)) if gate else time.time() + max(0.2, lead)
        for i in range(iterations):
            starts.append(at)
            ctl.broadcast("go", iteration=i, at=at)
            done = ctl.wait_all("iter_done", timeout, f"{setup.name}: iteration {i}", iteration=i)
            ends.append(max(m["end"] for m in done.values()))
            kind = "warm-up" if i < workload.warmup else "iteration"
            progress.log(f"  {setup.name}: {kind} {i}: {ends[-1] - at:.3f} s (a-priori prediction {pred:.3f} s)")
            at = gate.decide(i + 1, lead) if gate else time.time() + lead
        ctl.broadcast("stop")
        ctl.wait_all("bye", 30, f"{setup.name}: stopping the workers")
        for wid, p in procs.items():  # agents end when their worker publishes the end of its slots
            try:
                p.wait(60 if wid.startswith("agent-") else 15)
            except subprocess.TimeoutExpired:
                raise RunnerError(f"{wid} did not exit after the run:\n{_tail(logs[wid])}") from None
    finally:
        if gate is not None:
            gate.close()
        _stop(servers)
        ctl.close()
        _stop(procs)
        for fh in handles:
            fh.close()
    run_dir = Path(next(iter(jobs.values()))["device"]["run_dir"])
    timelines = {}
    for job in jobs.values():
        dev = Device(job["device"]["name"], run_dir)
        timelines[job["device"]["name"]] = dev.timeline()
    sends, recvs = read_transfer_logs([Path(j["transfers_path"]) for j in jobs.values()])
    return VariantRun(starts, ends, timelines, merge_transfer_sides(sends, recvs))


DECODE_PORT_OFFSET = 3000  # decode server ports: runner.base_port + this (+ k for the k-th server)
DECODE_STREAMS = 1  # KV caches cross at kv_wire_scale of their size: one stream carries them
# CPU priorities: an agent's prefill ends when it wakes from a sleep, so it must wake on
# time however busy the cores are (it uses little CPU); decode servers only move KV caches.
AGENT_NICE = -10
DECODE_NICE = 10


def decode_hosts(scenario: Scenario, jobs: Mapping[str, dict[str, Any]]) -> dict[str, str | None]:
    """Where each worker's agent ships its KV caches (worker -> decode host, None: no
    shipping). 'same-dc': one decode server per DC, on the DC's last host, so caches
    cross the DC's LAN only; a host name: that host for every agent."""
    host = scenario.bubbletea.decode_host
    if host is None:
        return {w: None for w in jobs}
    if host != DECODE_SAME_DC:
        return {w: host for w in jobs}
    last = {dc.name: f"{dc.name}-{dc.hosts[-1]}" for dc in scenario.topology.dcs}
    return {w: last[j["host"].split("-", 1)[0]] for w, j in jobs.items()}


def kv_path(topology: Any, src: str, dst: str, local: bool) -> tuple[float, bool]:
    """(nominal rate of the path from host src to host dst in bits/s, crosses a WAN)."""
    a, b = src.split("-", 1)[0], dst.split("-", 1)[0]
    if a == b:
        return topology.dc(a).lan_rate, False
    links, _ = path_links(topology, a, b)
    rate = min(topology.link(*d.split("->")).rate for d in links)
    return rate, not local


def build_agent_jobs(jobs: Mapping[str, dict[str, Any]], folder: Path, scenario: Scenario, workload: Any,
                     base_dir: str | None, decode: Mapping[str, dict[str, Any] | None], iterations: int,
                     local: bool = False, duration_s: float = 600.0) -> dict[str, dict]:
    """The job file of the BubbleTea agent next to each worker (bubbletea_agent/job.py):
    the worker's device, slot feed and live status, the scenario's bubbletea section,
    this agent's share of the cluster's request rate, what a prefill costs on the
    workload's GPU, the run's iterations (requests stop arriving at the last one), and
    where KV caches go: `decode[worker]` ({host, port, ip} or None), with the rest of a
    scaled-down cache charged at the path's nominal rate, and shipping across a WAN paced
    to this agent's share of bubbletea.kv_wan_rate. Pure: no I/O."""
    bt = scenario.bubbletea
    wan_shippers = [w for w, d in decode.items()
                    if d is not None and kv_path(scenario.topology, jobs[w]["host"], d["host"], local)[1]]
    out = {}
    for k, (wid, job) in enumerate(sorted(jobs.items())):
        dest = decode.get(wid)
        ship = None
        if dest is not None:
            rate, wan = kv_path(scenario.topology, job["host"], dest["host"], local)
            ship = {"host": dest["ip"], "port": dest["port"], "streams": DECODE_STREAMS, "rest_rate_bps": rate}
            if wan and bt.kv_wan_rate is not None:
                ship["max_rate_bps"] = bt.kv_wan_rate / len(wan_shippers)
        out[wid] = {
            "device": job["device"], "slots_path": job["slots_path"], "worker": wid, "host": job["host"],
            "bubbletea": bt.model_dump(), "seed": scenario.seed,
            "out": str(folder / "agents" / f"{wid}.json"), "ready": str(folder / "agents" / f"{wid}.ready"),
            "agent_index": k, "agent_count": len(jobs), "iterations": iterations, "duration_s": duration_s,
            "gpu": workload.gpu.model_dump(), "tp": workload.parallelism.tp, "base_dir": base_dir,
            "wire_scale": bt.kv_wire_scale, "decode": ship, "nice": AGENT_NICE, "realtime_holds": True,
            "live": None if not job.get("live") else {
                "status": job["live"]["status_path"], "wake": job["live"]["wake_path"],
                "gate": str(Path(job["live"]["status_path"]).parent / "gate.status")},
        }
    return out


def start_agents(net: Network, jobs: Mapping[str, dict[str, Any]], folder: Path, scenario: Scenario,
                 workload: Any, base_dir: str | None, iterations: int, env: dict[str, str],
                 logs: dict[str, Path], handles: list,
                 duration_s: float = 600.0) -> tuple[dict[str, subprocess.Popen], dict[str, subprocess.Popen]]:
    """The decode servers (bubbletea.decode_host), then one BubbleTea agent per worker
    device on the worker's host (`agent_command`). Returns (agents, decode servers)."""
    if not agent_available():
        raise RunnerError("bubbletea variants need the BubbleTea agent's command line (python -m bubbletea_agent), "
                          "which is not installed yet; set bubbletea.enabled: false or drop the +bubbletea variants")
    (folder / "agents").mkdir(parents=True, exist_ok=True)
    servers: dict[str, subprocess.Popen] = {}
    where = decode_hosts(scenario, jobs)
    addresses: dict[str, dict[str, Any]] = {}
    for k, host in enumerate(sorted({h for h in where.values() if h is not None})):
        port = scenario.runner.base_port + DECODE_PORT_OFFSET + k
        name = f"decode-{host}"
        logs[name] = folder / "logs" / f"{name}.log"
        fh = open(logs[name], "w")  # noqa: SIM115 (closed by the caller)
        handles.append(fh)
        argv = ["nice", "-n", str(DECODE_NICE), sys.executable, "-m", "bubbletea_agent", "decode-server", "--port", str(port),
                "--streams", str(DECODE_STREAMS), "--log", str(folder / "agents" / f"decode-{host}.jsonl")]
        servers[name] = net.host(host).popen(argv, env=env, stdout=fh, stderr=subprocess.STDOUT, cwd=str(REPO_ROOT))
        addresses[host] = {"host": host, "ip": net.host(host).ip, "port": port}
    decode = {w: None if h is None else addresses[h] for w, h in where.items()}
    procs = {}
    agent_jobs = build_agent_jobs(jobs, folder, scenario, workload, base_dir, decode, iterations, net.local,
                                  duration_s)
    for wid, agent_job in agent_jobs.items():
        path = folder / "jobs" / f"agent-{wid}.json"
        path.write_text(json.dumps(agent_job, indent=1))
        name = f"agent-{wid}"
        logs[name] = folder / "logs" / f"{name}.log"
        fh = open(logs[name], "w")  # noqa: SIM115
        handles.append(fh)
        procs[name] = net.host(jobs[wid]["host"]).popen(agent_command(jobs[wid], path), env=env, stdout=fh,
                                                        stderr=subprocess.STDOUT, cwd=str(REPO_ROOT))
    return procs, servers


def _wait_ready(procs: Mapping[str, subprocess.Popen], logs: Mapping[str, Path], timeout_s: float,
                ready: Callable[[str], bool], what: str, state: str = "ready") -> None:
    """Wait until `ready(name)` holds for every process; one that exits first, or a
    deadline passed, is an error naming it with the tail of its log."""
    deadline = time.monotonic() + timeout_s
    pending = dict(procs)
    while pending:
        for name, p in list(pending.items()):
            if ready(name):
                del pending[name]
            elif p.poll() is not None:
                raise RunnerError(f"BubbleTea {name} exited (status {p.returncode}) before training started:\n"
                                  f"{_tail(logs[name])}")
        if pending and time.monotonic() > deadline:
            raise RunnerError(f"BubbleTea {what} {', '.join(sorted(pending))} not {state} within {timeout_s:g} s:\n"
                              f"{_tail(logs[sorted(pending)[0]])}")
        if pending:
            time.sleep(0.05)


def wait_agents(procs: Mapping[str, subprocess.Popen], logs: Mapping[str, Path], folder: Path,
                timeout_s: float) -> None:
    """Wait until every agent is built (its ready file exists), so that training does
    not start while agents still load."""
    agents = {n: p for n, p in procs.items() if n.startswith("agent-")}
    _wait_ready(agents, logs, timeout_s,
                lambda name: (folder / "agents" / f"{name.removeprefix('agent-')}.ready").exists(), "agents")


def wait_decode_servers(servers: Mapping[str, subprocess.Popen], logs: Mapping[str, Path], timeout_s: float) -> None:
    """Wait until every decode server listens (its log says so), so that the first KV
    caches find it."""
    def listening(name: str) -> bool:
        try:
            return "listening on" in logs[name].read_text(errors="replace")
        except FileNotFoundError:
            return False

    _wait_ready(servers, logs, timeout_s, listening, "decode servers", "listening")


def bubbletea_metrics(folder: Path, timelines: Mapping[str, Sequence[Any]], windows: Sequence[tuple[float, float]],
                      plain_iteration_s: float | None, iteration_s: float) -> dict[str, Any]:
    """Prefill requests, TTFT and guard violations of a +bubbletea variant (from the
    agents' request records and the device timelines), and the training slowdown
    against the same variant without agents."""
    from bubbletea_agent.metrics import (
        guard_violations,
        read_request_rows,
        request_summary,
        training_slowdown,
    )

    rows = []
    for path in sorted((folder / "agents").glob("*.requests.jsonl")):
        rows += read_request_rows(path)
    req = request_summary(rows)
    count, waited, count_all = 0, 0.0, 0
    for recs in timelines.values():
        inside = [r for r in recs if any(t0 <= r.start < t1 for t0, t1 in windows)]
        c, w = guard_violations(inside)
        count, waited = count + c, waited + w
        count_all += guard_violations(recs)[0]
    agents: dict[str, Any] = {"engine_mode": sorted({a.get("engine_mode") for a in _agent_summaries(folder)} - {None}),
                              "not_arrived": 0, "chunks_run": 0, "late_starts": 0, "device_busy_retries": 0}
    for a in _agent_summaries(folder):
        counters = a.get("counters") or {}
        for key in ("not_arrived", "chunks_run", "late_starts", "device_busy_retries"):
            agents[key] += int(counters.get(key) or 0)
    return {
        "prefill_requests": req["prefill_requests"],
        "ttft_s": {"p50": req["ttft_p50_s"], "p95": req["ttft_p95_s"], "p99": req["ttft_p99_s"],
                   "mean": req["ttft_mean_s"]},
        "prefill_tokens_served": req["prefill_tokens_served"],
        "guard_violations": count,
        "guard_violations_all_iterations": count_all,
        "training_wait_on_prefill_s": waited,
        "training_slowdown": training_slowdown(iteration_s, plain_iteration_s),
        "compared_with_iteration_time_s": plain_iteration_s,
        "bubbletea_agents": agents,
    }


def _agent_summaries(folder: Path) -> list[dict[str, Any]]:
    out = []
    for path in sorted((folder / "agents").glob("*.json")):
        with contextlib.suppress(OSError, json.JSONDecodeError):
            out.append(json.loads(path.read_text()))
    return out


# ============================================================== outputs

def write_variant_outputs(folder: Path, name: str, run: VariantRun, metrics: Mapping[str, Any],
                          setup: VariantSetup, warmup: int) -> dict[str, str]:
    from testbed.device import write_timeline_csv
    from testbed.training.gantt import gantt_png

    records = sorted((r for recs in run.timelines.values() for r in recs), key=lambda r: (r.device, r.start))
    write_timeline_csv(records, folder / "timeline.csv")
    _write_transfers_csv(run.transfers, folder / "transfers.csv")
    (folder / "prediction.json").write_text(json.dumps(setup.prediction.to_json(), indent=1, default=str))
    (folder / "iterations.json").write_text(json.dumps({"starts": run.starts, "ends": run.ends, "warmup": warmup}))
    title = (f"{name}: {metrics['iteration_time_s']:.3f} s per iteration "
             f"(predicted {setup.final_prediction or setup.prediction.iteration_time_s:.3f} s), utilization "
             f"{metrics['device_utilization']:.0%}, {setup.streams} stream(s) per WAN channel")
    gantt_png(run.timelines, run.transfers, run.starts, run.ends, warmup, folder / "gantt.png", title=title)
    return {"timeline_csv": f"{folder.name}/timeline.csv", "transfers_csv": f"{folder.name}/transfers.csv",
            "gantt_png": f"{folder.name}/gantt.png"}


def _write_transfers_csv(transfers: Sequence[Any], path: Path) -> None:
    import csv

    cols = ["iteration", "pipeline", "boundary", "mb", "direction", "src", "dst", "nbytes", "links", "streams",
            "latency_s", "posted", "not_before", "sent", "arrived", "confirmed"]
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(cols)
        for t in transfers:
            row = t.to_json()
            row["links"] = " ".join(row["links"])
            w.writerow([row.get(c) for c in cols])


# ============================================================== the run

def default_out_dir(scenario: Scenario) -> Path:
    return Path("results") / f"{scenario.name}-{datetime.now().strftime('%Y%m%d-%H%M%S')}"


def run_scenario(
    scenario: Scenario,
    resolved: dict[str, Any],
    out_dir: str | Path,
    progress: Progress | None = None,
    *,
    variants: Sequence[str] | None = None,
) -> dict[str, Any]:
    """Run every variant of `scenario`; writes `out_dir` and returns the summary."""
    from testbed.workload import WorkloadError, parse_workload

    t_begin = time.time()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    own_progress = progress is None
    progress = progress or Progress(label=f"run {scenario.name}")
    (out / "scenario.resolved.yaml").write_text(yaml.safe_dump(_plain(resolved), sort_keys=False))
    wl_source = scenario.workload.get("_source", f"{scenario.source or 'scenario'}: workload")
    try:
        workload = parse_workload(scenario.workload, wl_source)
    except WorkloadError as exc:
        raise RunnerError(str(exc)) from None
    base_dir = str(Path(wl_source).parent) if "_source" in scenario.workload else None
    par = workload.parallelism
    if par.pp < 2:
        raise RunnerError(f"{wl_source}: parallelism.pp is {par.pp}; pipeline training across DCs needs pp >= 2")
    if par.tp != 1:
        progress.log(f"note: tp={par.tp}: each worker plays a whole tensor-parallel group on one host")
    names = variant_names(scenario, variants)
    if any(n.endswith(BT_SUFFIX) for n in names) and not agent_available():
        raise RunnerError("bubbletea.enabled: the BubbleTea agent has no command line yet (python -m bubbletea_agent);"
                          " set bubbletea.enabled: false, or drop the +bubbletea variants")
    iterations = workload.warmup + workload.iterations
    eff = workload.effective(base_dir)
    progress.set_total(1 + len(names))
    secret = secrets.token_hex(16)
    ctl_dir = Path(tempfile.mkdtemp(prefix="tbrun-"))
    summary: dict[str, Any] = {
        "scenario": scenario.name, "topology": scenario.topology.name, "workload": workload.name,
        "delay_backend": None, "scale": workload.scale,
        "scale_note": eff.scale_note(max((link.rate for link in scenario.topology.wan), default=None)),
        "seed": scenario.seed, "schedule": par.schedule,
        "parallelism": {"dp": par.dp, "pp": par.pp, "tp": par.tp, "micro_batch": par.micro_batch,
                        "num_micro_batches": par.num_micro_batches},
        "iterations": workload.iterations, "warmup": workload.warmup,
        "wire_activation_bytes": eff.wire_activation_bytes,
        "stage_forward_s": eff.stage_forward_s, "stage_backward_s": eff.stage_backward_s,
        "definitions": {
            "iteration_time_s": "mean over measured iterations (after warm-up) of: common start -> last training "
                                "work of any device ends; iterations are separated by a barrier",
            "predicted_iteration_time_s": "planner simulation of one iteration (atlas_transport/planner.py: same "
                                          "placement, same temporal plan) fed with the WAN channel rate measured "
                                          "in the variant's warm-up iterations, the first one left out when there "
                                          "are two or more (median over transfers; for shared variants those alone "
                                          "on their link); prediction.a_priori_iteration_time_s is the planner's before "
                                          "the run, with the calibration probe's rate. DP all-reduce not emulated, "
                                          "not included",
            "device_utilization": "mean over devices of busy time / wall time of the measured iterations",
            "bubble_fraction": "mean over devices of idle (no training work) / wall time of the measured iterations",
            "wan_links": "bytes of the measured iterations; goodput = bytes / time the link had a transfer on the "
                         "wire (both directions)",
        },
        "runner": scenario.runner.model_dump(),
        "variants": {},
    }
    try:
        with contextlib.ExitStack() as stack:
            stack.callback(shutil.rmtree, ctl_dir, True)
            with progress.step("setup"):
                net = stack.enter_context(open_network(scenario, progress))
                summary["delay_backend"] = net.delay_backend
                setups, cal = prepare(scenario, workload, base_dir, names, net, out, secret, eff, progress)
                summary["calibration"] = cal.to_json() if cal else None
            for name in names:
                entry: dict[str, Any]
                with progress.step(name):
                    try:
                        setup = setups[name]
                        if isinstance(setup, Exception):
                            raise setup
                        plain = summary["variants"].get(name.removesuffix(BT_SUFFIX), {}).get("iteration_time_s")
                        entry = play_variant(net, setup, scenario, workload, out, ctl_dir, secret, iterations,
                                             progress, base_dir, (cal.src, cal.dst) if cal else None, plain)
                    except (RunnerError, ConfigError, ValueError) as exc:
                        progress.log(f"  {name} FAILED: {exc}")
                        entry = {"error": str(exc)}
                summary["variants"][name] = entry
                _write_summary(out, summary, t_begin)
    finally:
        summary["duration_s"] = time.time() - t_begin
        _write_summary(out, summary, t_begin)
        if own_progress:
            progress.close()
    return summary


def prepare(scenario: Scenario, workload: Any, base_dir: str | None, names: Sequence[str], net: Network, out: Path,
            secret: str, eff: Any, progress: Progress) -> tuple[dict[str, Any], Calibration | None]:
    """Calibration, then placement and prediction of every variant."""
    from atlas_transport.planner import free_gpus, place

    par = workload.parallelism
    topo = scenario.topology
    cal = None
    auto = None
    if scenario.runner.calibrate:
        hosts = {dc.name: list(dc.hosts) for dc in topo.dcs}
        pl = place(free_gpus(topo), par.pp, par.dp, par.tp, strategy="atlas", hosts=hosts)
        pairs = calibration_pairs(pl)
        if not pairs:  # every stage in one DC: probe between the first two DCs
            pairs = [(f"{topo.dcs[0].name}-{topo.dcs[0].hosts[0]}", f"{topo.dcs[-1].name}-{topo.dcs[-1].hosts[0]}")]
        dc_a, dc_b = pairs[0][0].split("-", 1)[0], pairs[0][1].split("-", 1)[0]
        latency = 0.0 if net.local or dc_a == dc_b else topo.path_delay(dc_a, dc_b)
        counts = {1}
        s = scenario.transport.streams
        if s == "auto":
            counts |= set(AUTO_CANDIDATES)
        else:
            counts.add(int(s))
        progress.log(f"calibrating {pairs[0][0]} -> {pairs[0][1]} ({', '.join(map(str, sorted(counts)))} streams)")
        folder = out / "calibration"
        a, b = pairs[0]
        two_way = [pairs[0], pairs[1][::-1] if len(pairs) > 1 else (b, a)]
        cal = calibrate(net, scenario, folder, secret, two_way, sorted(counts), eff.wire_activation_bytes, latency,
                        progress)
        if s == "auto":
            from atlas_transport.auto import choose

            auto = choose({n: cal.rates_bps[n] for n in AUTO_CANDIDATES}, AUTO_MARGIN)
        wanted = {choose_streams(n.removesuffix(BT_SUFFIX), scenario, cal.rate(1), _nominal_link(topo, pairs[0]), auto)
                  for n in names}
        calibrate(net, scenario, folder, secret, two_way, sorted(wanted), eff.wire_activation_bytes, latency,
                  progress, cal)
        sharing = min(par.dp, len(pairs))
        if sharing > 1:
            # the colliding rate of every stream count that may share the link
            # (multi-tcp; atlas when its sharing is not fixed to temporal)
            for n in sorted(shared_stream_counts(scenario, names, cal, auto, _nominal_link(topo, pairs[0]))):
                calibrate_link(net, scenario, folder, secret, pairs[:sharing], n, cal, progress)
    setups: dict[str, Any] = {}
    for name in names:
        try:
            setups[name] = plan_variant(name, scenario, workload, base_dir, cal, auto, net.local)
            if cal is not None and setups[name].streams not in cal.rates_bps:
                raise RunnerError(f"variant {name}: {setups[name].streams} streams were not calibrated")
        except (RunnerError, ValueError) as exc:
            setups[name] = RunnerError(f"variant {name}: {exc}")
    return setups, cal


def shared_stream_counts(scenario: Scenario, names: Sequence[str], cal: Calibration, auto: int | None,
                         nominal_bps: float | None) -> set[int]:
    """Stream counts of the variants that may send on a shared link at once (baseline's
    single streams stay under the link and need no collision measurement)."""
    counts = set()
    for name in names:
        base = name.removesuffix(BT_SUFFIX)
        if base == "baseline" or (base == "atlas" and scenario.runner.atlas_sharing == "temporal"):
            continue
        n = choose_streams(base, scenario, cal.rate(1), nominal_bps, auto)
        if base == "atlas":
            n = atlas_streams(n, scenario, cal, auto)
        counts.add(n)
    return counts


def atlas_streams(fill: int, scenario: Scenario, cal: Calibration | None, auto: int | None) -> int:
    """Atlas's streams per channel: enough to fill the link by formula, unless the
    calibration measured another count faster (more than STREAMS_MARGIN): on long
    RTTs many flows collapse together, on short ones a single flow nearly fills the
    link and more overflow its queue. Candidates: that count, transport.streams and
    the single stream every calibration times."""
    if cal is None:
        return fill
    plain = choose_streams("multi-tcp", scenario, None, None, auto)
    measured = {n: cal.rates_bps[n] for n in (fill, plain, 1) if n in cal.rates_bps}
    if not measured:
        return fill
    best = max(measured, key=lambda n: measured[n])
    keep = fill if fill in measured else max(measured)
    return keep if measured[keep] >= (1 - STREAMS_MARGIN) * measured[best] else best


def _nominal_link(topo: Any, pair: tuple[str, str]) -> float | None:
    a, b = pair[0].split("-", 1)[0], pair[1].split("-", 1)[0]
    if a == b:
        return None
    from testbed.topology import shortest_path

    path = shortest_path(a, b, topo.wan)
    return min(topo.link(x, y).rate for x, y in zip(path, path[1:], strict=False))


def calibration_pairs(placement: Any) -> list[tuple[str, str]]:
    """(upstream host, downstream host) of each pipeline's first WAN crossing, in pipeline order."""
    pairs = []
    for d in range(placement.dp):
        for s in range(placement.pp - 1):
            if placement.dc_of(d, s) != placement.dc_of(d, s + 1):
                pairs.append((placement.hosts[(d, s)][0], placement.hosts[(d, s + 1)][0]))
                break
    return pairs


def play_variant(net: Network, setup: VariantSetup, scenario: Scenario, workload: Any, out: Path, ctl_dir: Path,
                 secret: str, iterations: int, progress: Progress, base_dir: str | None,
                 pair: tuple[str, str] | None, plain_iteration_s: float | None = None) -> dict[str, Any]:
    """Run one variant and return its summary entry. Its prediction is made again
    with the channel rate its warm-up iterations measured (same placement, same
    temporal plan); the a-priori one (calibration probe) is kept beside it."""
    from testbed.training.metrics import channel_rate, variant_metrics

    folder = out / setup.name
    if folder.exists():
        shutil.rmtree(folder)
    run_dir = folder / "run"
    run_dir.mkdir(parents=True)
    host_ips = {h: net.host(h).ip for h in {hs[0] for hs in setup.placement.hosts.values()}}
    t = scenario.transport
    jobs = build_jobs(
        setup=setup, workload=workload, topology=scenario.topology, host_ips=host_ips, run_dir=run_dir,
        control=str(ctl_dir / f"{_safe(setup.name)}.sock"), base_port=scenario.runner.base_port,
        iterations=iterations, transport={"chunk_bytes": _chunk(t.chunk), "congestion": t.congestion},
        local=net.local, setup_timeout_s=scenario.runner.setup_timeout,
        timeout_s=max(scenario.runner.iteration_timeout, 5 * setup.prediction.iteration_time_s),
        temporal_mode=scenario.runner.temporal_mode,
        token_timeout_s=max(1.0, 2 * setup.prediction.iteration_time_s),
        iteration_lead_s=scenario.runner.iteration_lead,
    )
    pred = setup.prediction
    progress.log(f"{setup.name}: {len(jobs)} workers, {setup.streams} stream(s) per WAN channel, placement "
                 f"{setup.placement.strategy}, {setup.sharing} links{_alternatives(setup)}, predicted "
                 f"{pred.iteration_time_s:.3f} s per iteration")
    run = run_workers(net, setup, jobs, folder, ctl_dir, secret, scenario, iterations, progress, workload, base_dir)
    link_names = {frozenset(link.between): link.name for link in scenario.topology.wan}
    m = variant_metrics(run.timelines, run.starts, workload.warmup, run.transfers, ends=run.ends,
                        link_names=link_names)
    measured_it = m["iteration_time_s"]
    predicted, how = pred.iteration_time_s, "calibration probe" if setup.rate_bps else "window model"
    warm = None
    temporal = setup.sharing == "temporal"
    if workload.warmup:  # a temporal plan holds the link alone: all its transfers; shared: the lone ones
        first = 1 if workload.warmup >= 2 else 0  # the very first iteration also opens the TCP windows
        warm = channel_rate(run.transfers, range(first, workload.warmup), solo_only=not temporal)
        if warm is not None and warm[2] == "all" and not temporal and setup.streams > 1:
            warm = None  # too few transfers had the link alone: their rate would count the sharing twice
    compute, overhead = None, 0.0
    if workload.gpu.mode == "real" and workload.warmup:
        # real devices: the compute model does not know this machine; the warm-up
        # iterations measured what each stage really takes
        from testbed.training.metrics import iterations as iteration_spans
        from testbed.training.metrics import pipeline_overhead, stage_compute_times

        first = 1 if workload.warmup >= 2 else 0  # the very first one also pays for lazy init (CUDA, caches)
        spans = [(it.start, it.end) for it in iteration_spans(run.timelines, run.starts, run.ends)
                 if first <= it.index < workload.warmup]
        compute = stage_compute_times(run.timelines, spans, len(pred.effective.stage_forward_s))
        overhead = pipeline_overhead(run.timelines, spans)
    if (warm is not None and pair is not None) or compute is not None:
        rate = warm[0] if warm is not None and pair is not None else None
        predicted = repredict(setup, scenario, workload, base_dir, rate, pair, net.local, compute)
        if compute is not None:
            predicted += overhead  # the planner's model is the pipeline alone
        how = " and ".join(w for w, used in (("warm-up rates", rate is not None),
                                               ("warm-up compute times", compute is not None)) if used)
    setup.final_prediction = predicted
    files = write_variant_outputs(folder, setup.name, run, m, setup, workload.warmup)
    extra: dict[str, Any] = {}
    if setup.bubbletea:
        kept = [(s, e) for i, (s, e) in enumerate(zip(run.starts, run.ends, strict=True)) if i >= workload.warmup]
        extra = bubbletea_metrics(folder, run.timelines, kept, plain_iteration_s, measured_it)
        req, slow = extra["prefill_requests"], extra["training_slowdown"]
        p50 = extra["ttft_s"]["p50"]
        progress.log(f"  {setup.name}: utilization {m['device_utilization_training']:.0%} training -> "
                     f"{m['device_utilization']:.0%} with prefill; {req['served']} of {req['arrived']} requests "
                     f"served, TTFT p50 {'-' if p50 is None else f'{p50:.2f} s'}; training slowdown "
                     f"{'-' if slow is None else f'{slow:+.1%}'}, waited {extra['training_wait_on_prefill_s'] * 1e3:.0f}"
                     f" ms on prefill ({extra['guard_violations']} guard violations)")
    return {
        "iteration_time_s": measured_it,
        "predicted_iteration_time_s": predicted,
        "prediction_error": (measured_it - predicted) / predicted,
        "prediction": {
            "rates_from": how,
            "warmup_channel_rate_mbps": None if warm is None else warm[0] / 1e6,
            "warmup_transfers_counted": None if warm is None else f"{warm[1]} ({warm[2]})",
            "calibrated_channel_rate_mbps": None if setup.rate_bps is None else setup.rate_bps / 1e6,
            "a_priori_iteration_time_s": pred.iteration_time_s,
            "a_priori_error": (measured_it - pred.iteration_time_s) / pred.iteration_time_s,
            "measured_stage_forward_s": None if compute is None else compute[0],
            "measured_stage_backward_s": None if compute is None else compute[1],
            "measured_overhead_s": None if compute is None else overhead,
        },
        "device_utilization": m["device_utilization"],
        "device_utilization_training": m["device_utilization_training"],
        "bubble_fraction": m["bubble_fraction"],
        "predicted_bubble_fraction": pred.bubble_fraction,
        "wan_links": m["wan_links"],
        "wan_directions": m["wan_directions"],
        "predicted_wan_bytes_per_iteration": pred.wan_bytes,
        "iteration_times_s": m["iteration_times_s"],
        "warmup_iteration_times_s": m["warmup_iteration_times_s"],
        "iteration_time_stdev_s": m["iteration_time_stdev_s"],
        "per_device_utilization": m["per_device_utilization"],
        "mean_plan_wait_s": m["mean_plan_wait_s"],
        "mean_wan_transfer_s": m["mean_wan_transfer_s"],
        "streams": setup.streams,
        "sharing": setup.sharing,
        "sharing_requested": scenario.runner.atlas_sharing if setup.base == "atlas" else "shared",
        # atlas "auto": the a-priori prediction of each way; the faster (temporal unless
        # sharing wins by more than the planner's SHARING_MARGIN) ran
        "sharing_alternatives_s": setup.sharing_alternatives,
        "placement": setup.placement.to_json(scenario.topology),
        "temporal_plan": None if pred.plan is None else {
            "offsets_s": pred.plan.offsets, "stagger_s": pred.plan.stagger_s,
            "transfers_planned": sum(len(v) for v in pred.plan.order.values()),
        },
        "compute_only_s": pred.compute_only_s,
        **real_entry(folder, workload, progress, setup.name),  # real devices: equivalence check (real_mode.py)
        **extra,
        **files,
    }


def _alternatives(setup: VariantSetup) -> str:
    alt = setup.sharing_alternatives
    if not alt:
        return ""
    return f" (predicted temporal {alt['temporal']:.3f} s, shared {alt['shared']:.3f} s)"


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in name)


def _plain(data: Any) -> Any:
    """The resolved scenario as plain YAML data (no private '_source' keys dropped:
    they say where the topology and workload came from)."""
    return json.loads(json.dumps(copy.deepcopy(data), default=str))


def _write_summary(out: Path, summary: dict[str, Any], t_begin: float) -> None:
    summary["duration_s"] = time.time() - t_begin
    tmp = out / "summary.json.tmp"
    tmp.write_text(json.dumps(summary, indent=2, default=str))
    os.replace(tmp, out / "summary.json")
