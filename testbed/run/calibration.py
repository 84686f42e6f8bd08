"""WAN calibration of `testbed run`: how fast the emulated paths really move tensors
of the workload's wire size, measured before the variants play.

Tensors of the workload's wire size are timed over one channel each way between hosts
on either side of a WAN path (after an untimed tensor that opens the TCP windows), once
per stream count the variants use there, and the shared variants' channels are timed
colliding (all sending at once); a path the DP rings cross (dp-across-dc) times the
workers' own ring all-reduce, all rings at once; inside a DC, the ring between DP
neighbours. Which paths, stream counts and rings: testbed/run/variants.py
(`calibrate_variants`), from the placements of the run's variants; each path's figures
are a `PathCalibration` and the whole a `Calibration`
(testbed_core/contracts/calibration.py, re-exported here).

The probes run in probe agents (`ProbeAgents`): one worker process per host
(``python -m testbed.training.worker --probe-agent``, testbed/training/worker/probe.py)
that runs every probe job handed to it, so the calibration starts a Python process that
imports torch once per host, all hosts at once, not once per probe end.
"""

from __future__ import annotations

import contextlib
import json
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from statistics import median
from typing import Any

from testbed.progress import Progress
from testbed.run.common import (
    REPO_ROOT,
    RUN_PRELOAD,
    RunnerError,
    log_tail,
    stop_processes,
    transport_job,
    worker_env,
)
from testbed.run.network import Network
from testbed.run.ports import PortPlan, PortRange
from testbed.run.scenario import Scenario
from testbed_core.contracts.calibration import (
    PROBE_WARMUP,
    Calibration,
    PathCalibration,
    TogetherCalibration,
)
from testbed_core.contracts.worker_job import ProbeJob, RingProbeJob

__all__ = ["PROBE_WARMUP", "Calibration", "PathCalibration", "ProbeAgents", "Prober", "aggregate_rate", "calibrate",
           "calibrate_link", "calibrate_together", "calibrate_wan_rings", "calibration_pairs", "effective_rate"]

PROBE_GAP_S = 0.1  # between calibration tensors: like a channel between micro-batches
COLLISION_ROUNDS = 12  # timed rounds of the collision probe, at least
PROBE_WARMUP_BYTES_PER_STREAM = 2 << 20  # one big untimed tensor first: a few windows per stream


def effective_rate(nbytes: int, durations: Sequence[float], latency_s: float) -> float:
    """Channel rate from timed transfers: bytes over (median duration - one-way delay).
    The median: a rare retransmission timeout in a handful of samples would otherwise
    set the rate of every transfer of the run."""
    if not durations:
        raise RunnerError("calibration timed no transfer")
    return nbytes * 8 / max(1e-6, median(durations) - latency_s)


def aggregate_rate(nbytes: int, durations: Sequence[float], channels: int, latency_s: float) -> float:
    """Link total while `channels` channels collide, from their transfers' hand-over to
    arrival times: channels x bytes / (mean duration - delay). The mean, not the
    median: colliding channels lose packets, and the rare transfer that waits out a
    retransmission timeout is part of what collisions cost on average."""
    if not durations:
        raise RunnerError("calibration timed no transfer")
    mean = sum(durations) / len(durations)
    return channels * nbytes * 8 / max(1e-6, mean - latency_s)


class ProbeAgents:
    """One probe agent per host (testbed/training/worker/probe.py): a process that runs
    every probe job of the calibration handed to it, so that the calibration starts a
    Python process that imports torch once per host, all hosts at once, instead of once
    per probe end and one after another. `close` ends them."""

    def __init__(self, net: Network, folder: Path, secret: str, timeout_s: float = 180.0, warm: bool = True) -> None:
        self.net, self.folder, self.env, self.timeout_s = net, folder, worker_env(secret), timeout_s
        self.warm = warm  # forked from the run's fork server that imported torch (runner.warm_start)
        self.procs: dict[str, subprocess.Popen] = {}
        self.logs: dict[str, Any] = {}
        self.queues: dict[str, queue.Queue[str]] = {}
        self.owner: dict[str, str] = {}  # probe name -> host
        self.lock = threading.Lock()
        self.folder.mkdir(parents=True, exist_ok=True)

    def _queue(self, key: str) -> queue.Queue[str]:
        with self.lock:
            return self.queues.setdefault(key, queue.Queue())

    def _read(self, host: str, proc: subprocess.Popen) -> None:
        for line in proc.stdout:
            words = line.strip().split(" ", 1)
            if len(words) == 1:
                self._queue(f"@{host}").put(words[0])
            else:
                self._queue(words[0]).put(words[1])
        self._queue(f"@{host}").put("exited")

    def start(self, hosts: Sequence[str]) -> None:
        """Start the agents of `hosts` not started yet, all at once, and wait until each is ready."""
        new = [h for h in dict.fromkeys(hosts) if h not in self.procs]
        for h in new:
            log = open(self.folder / f"agent-{h}.log", "w")  # noqa: SIM115 (closed by close())
            self.logs[h] = log
            host, argv = self.net.host(h), [sys.executable, "-m", "testbed.training.worker", "--probe-agent"]
            kwargs: dict[str, Any] = {"env": self.env, "stdout": subprocess.PIPE, "stderr": log,
                                      "stdin": subprocess.PIPE, "text": True, "cwd": str(REPO_ROOT)}
            self.procs[h] = (host.popen_warm(argv, preload=RUN_PRELOAD, **kwargs) if self.warm
                             else host.popen(argv, **kwargs))
            threading.Thread(target=self._read, args=(h, self.procs[h]), daemon=True).start()
        for h in new:
            word = self._get(f"@{h}", self.timeout_s, f"the probe agent on {h}")
            if word != "ready":
                raise RunnerError(f"the calibration's probe agent on {h} did not start ({word}):\n"
                                  f"{log_tail(self.folder / f'agent-{h}.log')}")

    def _get(self, key: str, timeout_s: float, what: str) -> str:
        try:
            return self._queue(key).get(timeout=timeout_s)
        except queue.Empty:
            host = self.owner.get(key, key.lstrip("@"))
            raise RunnerError(f"calibration: {what} did not answer within {timeout_s:.0f} s:\n"
                              f"{log_tail(self.folder / f'agent-{host}.log')}") from None

    def submit(self, host: str, job: ProbeJob | RingProbeJob) -> str:
        """Hand `job` to the agent on `host` (started if needed); returns its name."""
        self.start([host])
        path = self.folder / f"{job.name}.job.json"
        path.write_text(job.model_dump_json(indent=1))
        self.owner[job.name] = host
        self.procs[host].stdin.write(f"job {path}\n")
        self.procs[host].stdin.flush()
        return job.name

    def expect(self, name: str, word: str, timeout_s: float) -> None:
        """Wait for probe `name` to say `word`; RunnerError when it fails or is silent."""
        got = self._get(name, timeout_s, f"probe {name} (waiting for '{word}')")
        if got != word:
            host = self.owner.get(name, "?")
            raise RunnerError(f"calibration probe {name} on {host}: expected '{word}', got: {got}\n"
                              f"{log_tail(self.folder / f'agent-{host}.log')}")

    def go(self, name: str, start_at: float) -> None:
        proc = self.procs[self.owner[name]]
        proc.stdin.write(f"go {name} {start_at}\n")
        proc.stdin.flush()

    def close(self) -> None:
        for p in self.procs.values():
            with contextlib.suppress(OSError, ValueError):
                p.stdin.write("quit\n")
                p.stdin.flush()
                p.stdin.close()
        deadline = time.monotonic() + 10
        for p in self.procs.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(max(0.1, deadline - time.monotonic()))
        stop_processes(self.procs)
        for log in self.logs.values():
            log.close()
        self.procs, self.logs = {}, {}


class Prober:
    """Runs probe-recv / probe-send pairs on hosts (through their probe agents) and
    reads their results."""

    def __init__(self, net: Network, folder: Path, scenario: Scenario, secret: str, ports: PortRange,
                 agents: ProbeAgents | None = None) -> None:
        self.folder = folder
        self.scenario = scenario
        self.ports = ports
        self.agents = agents or ProbeAgents(net, folder, secret, warm=scenario.runner.warm_start)
        self.net = net
        self.folder.mkdir(parents=True, exist_ok=True)

    def run(self, pairs: Sequence[tuple[str, str]], streams: int, nbytes: int, count: int,
            label: str = "", period_s: float | None = None,
            offsets: Sequence[float] | None = None) -> list[dict[str, Any]]:
        """`count` tensors over one channel per (src, dst) pair, all pairs at once
        (each sender waits PROBE_GAP_S after a confirmation, or sends in rounds of
        `period_s`, pair k starting `offsets[k]` after the common start)."""
        transport = transport_job(self.scenario.transport)
        agents = self.agents
        agents.start([h for pair in pairs for h in pair])
        names = []
        for k, (src, dst) in enumerate(pairs):
            name = f"{label}s{streams}-c{k}"
            port = self.ports.port(k)
            warm = min(PROBE_WARMUP_BYTES_PER_STREAM * streams, 64 << 20)
            agents.submit(dst, ProbeJob(role="probe-recv", name=f"{name}-recv", bind_ip="0.0.0.0", port=port,
                                        streams=streams, nbytes=nbytes, count=count,
                                        out=str(self.folder / f"{name}-recv.json"), transport=transport,
                                        warmup_bytes=warm))
            agents.expect(f"{name}-recv", "listening", 60)
            agents.submit(src, ProbeJob(role="probe-send", name=f"{name}-send", peer_ip=self.net.host(dst).ip,
                                        port=port, streams=streams, nbytes=nbytes, count=count, gap_s=PROBE_GAP_S,
                                        wait_go=True, period_s=period_s, warmup_bytes=warm,
                                        out=str(self.folder / f"{name}-send.json"), transport=transport))
            names.append(name)
        for name in names:  # every sender connected: one common start
            agents.expect(f"{name}-send", "connected", 60)
        t_go = time.time() + 0.2
        for k, name in enumerate(names):
            agents.go(f"{name}-send", t_go + (offsets[k] if offsets else 0.0))
        for name in names:
            for end in ("send", "recv"):
                agents.expect(f"{name}-{end}", "done", 60 + count * 5)
        results = []
        for name in names:
            snd = json.loads((self.folder / f"{name}-send.json").read_text())
            rcv = json.loads((self.folder / f"{name}-recv.json").read_text())
            results.append({"sent": snd["sent"], "arrived": rcv["arrived"]})
        return results


Measured = Calibration | PathCalibration  # what a probe step fills in: the run's calibration or one path's


def calibrate(
    net: Network, scenario: Scenario, folder: Path, secret: str, pairs: Sequence[tuple[str, str]],
    stream_counts: Sequence[int], nbytes: int, latency_s: float, progress: Progress,
    cal: Measured | None = None, agents: ProbeAgents | None = None,
) -> Measured:
    """Time tensors of `nbytes` over one channel per pair, all at once, once per stream
    count (added to `cal` when given). Pass a forward and a reverse pair: pipelines
    send activations and gradients across the WAN at the same time, and the reverse
    traffic (and its ACKs) slows the forward one."""
    count = scenario.runner.calibration_transfers + PROBE_WARMUP
    cal = cal or Calibration(src=pairs[0][0], dst=pairs[0][1], nbytes=nbytes, latency_s=latency_s)
    prober = Prober(net, folder, scenario, secret, PortPlan(scenario.runner.base_port).calibration, agents)
    try:
        for n in sorted(set(stream_counts) - set(cal.rates_bps)):
            durations = []
            for res in prober.run(pairs, n, nbytes, count, f"{_label(cal)}single-"):
                durations += [a - s for s, a in zip(res["sent"], res["arrived"], strict=True)][PROBE_WARMUP:]
            cal.transfer_s = {**cal.transfer_s, n: durations}
            cal.rates_bps = {**cal.rates_bps, n: effective_rate(nbytes, durations, latency_s)}
            progress.log(f"  calibration{_where(cal)}: {n:2d} stream(s), {nbytes / 1e6:.2f} MB tensors: "
                         f"{cal.rates_bps[n] / 1e6:.0f} Mbit/s per channel "
                         f"(transfers {', '.join(f'{d * 1e3:.0f}' for d in durations)} ms)")
    finally:
        if agents is None:
            prober.agents.close()
    return cal


def _label(cal: Measured) -> str:
    return f"{cal.dcs[0]}-{cal.dcs[1]}-" if isinstance(cal, PathCalibration) else ""


def _where(cal: Measured) -> str:
    return f" {cal.dcs[0]}<->{cal.dcs[1]}" if isinstance(cal, PathCalibration) else ""


def calibrate_link(
    net: Network, scenario: Scenario, folder: Path, secret: str, pairs: Sequence[tuple[str, str]],
    streams: int, cal: Measured, progress: Progress, agents: ProbeAgents | None = None,
) -> None:
    """The link's total while the variants' channels collide on it: one channel of
    `streams` per pair and per direction, sending in synchronised rounds (as the
    data-parallel pipelines do), at least COLLISION_ROUNDS timed rounds (the mean of
    a heavy-tailed time needs more samples than a median)."""
    count = max(scenario.runner.calibration_transfers, COLLISION_ROUNDS) + PROBE_WARMUP
    prober = Prober(net, folder, scenario, secret, PortPlan(scenario.runner.base_port).calibration, agents)
    single = cal.transfer_s.get(streams) or [1.0]
    period = 2.5 * sum(single) / len(single) + PROBE_GAP_S
    both = list(pairs) + [(b, a) for a, b in pairs]
    try:
        res = prober.run(both, streams, cal.nbytes, count, f"{_label(cal)}x{len(pairs)}-", period_s=period)
    finally:
        if agents is None:
            prober.agents.close()
    rates = []
    durations: list[float] = []
    for group in (res[:len(pairs)], res[len(pairs):]):
        timed = [a - s for r in group for s, a in list(zip(r["sent"], r["arrived"], strict=True))[PROBE_WARMUP:]]
        durations += timed
        rates.append(aggregate_rate(cal.nbytes, timed, len(pairs), cal.latency_s))
    cal.concurrent = len(pairs)
    cal.colliding_bps = {**cal.colliding_bps, streams: sum(rates) / len(rates)}
    cal.colliding_s = {**cal.colliding_s, streams: durations}
    progress.log(f"  calibration{_where(cal)}: {len(pairs)} channels of {streams} streams colliding, each way: "
                 f"{', '.join(f'{r / 1e6:.0f}' for r in rates)} Mbit/s in all (transfers: median "
                 f"{median(durations) * 1e3:.0f} ms, slowest {max(durations) * 1e3:.0f} ms of {len(durations)})")


def calibrate_together(
    net: Network, scenario: Scenario, folder: Path, secret: str,
    loads: Sequence[tuple[PathCalibration, Sequence[tuple[str, str]]]], streams: int, progress: Progress,
    agents: ProbeAgents | None = None,
) -> None:
    """Every path of a placement loaded at once, as the placement's pipelines load them
    (every WAN link is a delay line on the machine's cores, so a path gives less while
    the others are busy than it gave timed alone). `loads`: per path, the (upstream,
    downstream) hosts of the pipelines crossing it. Two probes, in synchronised rounds
    of at least COLLISION_ROUNDS: one channel of `streams` each way on every path (each
    path's channel rate, the median as `calibrate` takes it), then, where two or more
    pipelines cross a path, all of their channels each way on every path (that path's
    colliding aggregate, the mean as `calibrate_link` takes it). The figures go to each
    path's ``together`` list."""
    count = max(scenario.runner.calibration_transfers, COLLISION_ROUNDS) + PROBE_WARMUP
    prober = Prober(net, folder, scenario, secret, PortPlan(scenario.runner.base_port).calibration, agents)
    means = [sum(v) / len(v) for pc, _ in loads if (v := pc.transfer_s.get(streams))] or [1.0]
    period = 2.5 * max(means) + PROBE_GAP_S  # the slowest path's transfers fit a round
    dcs = [pc.dcs for pc, _ in loads]
    label = "+".join(f"{a}-{z}" for a, z in dcs)
    figures = {pc.dcs: TogetherCalibration(streams=streams, paths=dcs, channels=len(pairs)) for pc, pairs in loads}

    def timed(res: dict[str, Any]) -> list[float]:
        return [a - s for s, a in list(zip(res["sent"], res["arrived"], strict=True))[PROBE_WARMUP:]]

    def play(per_path: Sequence[Sequence[tuple[str, str]]], tag: str) -> list[list[list[float]]]:
        """Per path, per direction: the timed transfers of its channels."""
        both = [list(pairs) + [(b, a) for a, b in pairs] for pairs in per_path]
        res = prober.run([p for pairs in both for p in pairs], streams, loads[0][0].nbytes, count,
                         f"{label}-{tag}-", period_s=period)
        out, k = [], 0
        for pairs in both:
            group = res[k:k + len(pairs)]
            k += len(pairs)
            half = len(pairs) // 2
            out.append([[d for r in group[:half] for d in timed(r)], [d for r in group[half:] for d in timed(r)]])
        return out

    try:
        for (pc, _), ways in zip(loads, play([[pairs[0]] for _, pairs in loads], "one"), strict=True):
            fig = figures[pc.dcs]
            fig.transfer_s = ways[0] + ways[1]
            fig.rate_bps = sum(effective_rate(pc.nbytes, w, pc.latency_s) for w in ways) / 2
        if any(len(pairs) > 1 for _, pairs in loads):
            for (pc, pairs), ways in zip(loads, play([pairs for _, pairs in loads], "all"), strict=True):
                if len(pairs) > 1:
                    fig = figures[pc.dcs]
                    fig.colliding_s = ways[0] + ways[1]
                    fig.colliding_bps = sum(aggregate_rate(pc.nbytes, w, len(pairs), pc.latency_s) for w in ways) / 2
    finally:
        if agents is None:
            prober.agents.close()
    for pc, _ in loads:
        fig = figures[pc.dcs]
        pc.together = [t for t in pc.together if not (t.streams == streams and t.loads(dcs))] + [fig]
        alone = pc.rates_bps.get(streams)
        progress.log(f"  calibration{_where(pc)} with {len(dcs) - 1} other path(s) loaded at once, {streams} "
                     f"streams: {(fig.rate_bps or 0) / 1e6:.0f} Mbit/s per channel"
                     + (f" (alone {alone / 1e6:.0f})" if alone else "")
                     + ("" if fig.colliding_bps is None else
                        f", {fig.channels} channels colliding each way: {fig.colliding_bps / 1e6:.0f} Mbit/s in all"
                        + (f" (alone {pc.colliding_bps[streams] / 1e6:.0f})" if streams in pc.colliding_bps else "")))


def calibrate_wan_rings(net: Network, scenario: Scenario, folder: Path, secret: str,
                        pairs: Sequence[tuple[str, str]], streams: int, grad_bytes: int, path: PathCalibration,
                        progress: Progress, agents: ProbeAgents | None = None) -> None:
    """The DP rings that cross a WAN path (dp-across-dc: the replicas of every stage in
    other DCs), timed as they run: the workers' own ring all-reduce of `grad_bytes` (the
    largest stage's gradients) between each pair of replicas, all pairs at once, channels
    of `streams`; aggregate = rings x bytes each replica sends / (median time - the
    ring's 2 one-way delays), the first run (windows opening) not counted."""
    count = scenario.runner.calibration_transfers + 1
    times, sent = time_rings(net, scenario, folder, secret, pairs, streams, grad_bytes, count,
                             f"{_label(path)}wan-", agents)
    timed = times[1:]
    path.ring_channels, path.ring_streams, path.ring_nbytes, path.ring_s = len(pairs), streams, grad_bytes, timed
    path.ring_bps = len(pairs) * sent * 8 / max(1e-6, median(timed) - 2 * path.latency_s)
    progress.log(f"  calibration{_where(path)}: {len(pairs)} DP ring(s) of {streams} streams at once, "
                 f"{grad_bytes / 1e6:.1f} MB gradients: {path.ring_bps / 1e6:.0f} Mbit/s in all each way "
                 f"(rings {', '.join(f'{t * 1e3:.0f}' for t in timed)} ms)")


def time_rings(net: Network, scenario: Scenario, folder: Path, secret: str, pairs: Sequence[tuple[str, str]],
               streams: int, grad_bytes: int, count: int, label: str,
               agents: ProbeAgents | None = None) -> tuple[list[float], int]:
    """Run the training workers' DP ring all-reduce (testbed/training/allreduce.py) of
    `grad_bytes` between each pair of hosts, all pairs at once from one common start,
    `count` times. Returns (the slowest pair's seconds per run, bytes each replica sent)."""
    ports = PortPlan(scenario.runner.base_port).calibration
    transport = transport_job(scenario.transport)
    folder.mkdir(parents=True, exist_ok=True)
    own = agents is None
    agents = agents or ProbeAgents(net, folder, secret, warm=scenario.runner.warm_start)
    try:
        agents.start([h for pair in pairs for h in pair])
        names = []
        for k, (a, b) in enumerate(pairs):
            for rank, (me, peer, end) in enumerate(((a, b, "listen"), (b, a, "connect"))):
                name = f"{label}ring{k}-r{rank}"
                agents.submit(me, RingProbeJob(role="probe-ring", name=name, channel=end, bind_ip="0.0.0.0",
                                               peer_ip=net.host(peer).ip, port=ports.port(k), streams=streams,
                                               dp_rank=rank, grad_bytes=grad_bytes,
                                               bucket_bytes=scenario.runner.dp_bucket, count=count,
                                               out=str(folder / f"{name}.json"), transport=transport,
                                               timeout_s=scenario.runner.iteration_timeout))
                if end == "listen":
                    agents.expect(name, "listening", 60)
                names.append(name)
        for name in names:
            agents.expect(name, "connected", 60)
        t_go = time.time() + 0.2
        for name in names:
            agents.go(name, t_go)
        for name in names:
            agents.expect(name, "done", scenario.runner.iteration_timeout + 30)
        results = [json.loads((folder / f"{name}.json").read_text()) for name in names]
    finally:
        if own:
            agents.close()
    slowest = [max(r["times_s"][i] for r in results) for i in range(count)]
    return slowest, int(results[0]["bytes_sent"])


def calibrate_lan(net: Network, scenario: Scenario, folder: Path, secret: str, pairs: Sequence[tuple[str, str]],
                  grad_bytes: int, cal: Calibration, progress: Progress, agents: ProbeAgents | None = None) -> None:
    """The rate of the DP all-reduce inside a DC: the workers' own ring of `grad_bytes`
    (the largest stage's gradients) between the hosts of DP neighbours, all pairs at
    once (as the rings of every stage run together), single-stream channels; rate =
    bytes each replica sends / median time (the first run, which opens the connections'
    windows, not counted)."""
    count = scenario.runner.calibration_transfers + 1
    times, sent = time_rings(net, scenario, folder, secret, pairs, 1, grad_bytes, count, "lan-", agents)
    timed = times[1:]
    cal.lan_pairs, cal.lan_nbytes, cal.lan_transfer_s = [tuple(p) for p in pairs], grad_bytes, timed
    cal.lan_rate_bps = sent * 8 / max(1e-6, median(timed))
    progress.log(f"  calibration: DP all-reduce inside the DCs, {len(pairs)} ring(s) at once, "
                 f"{grad_bytes / 1e6:.1f} MB gradients: {cal.lan_rate_bps / 1e6:.0f} Mbit/s per replica "
                 f"(rings {', '.join(f'{t * 1e3:.0f}' for t in timed)} ms)")


def dp_lan_pairs(placement: Any) -> list[tuple[str, str]]:
    """(host of DP replica 0, host of replica 1) of each rank whose first two replicas
    are in one DC on different hosts: the all-reduce channels the LAN probe times."""
    out = []
    for r in range(placement.pp):
        a, b = placement.hosts[(0, r)][0], placement.hosts[(1, r)][0]
        if a != b and placement.dc_of(0, r) == placement.dc_of(1, r):
            out.append((a, b))
    return out


def calibration_pairs(placement: Any) -> list[tuple[str, str]]:
    """(upstream host, downstream host) of each pipeline's first WAN crossing, in pipeline order."""
    pairs = []
    for d in range(placement.dp):
        for s in range(placement.pp - 1):
            if placement.dc_of(d, s) != placement.dc_of(d, s + 1):
                pairs.append((placement.hosts[(d, s)][0], placement.hosts[(d, s + 1)][0]))
                break
    return pairs
