"""WAN calibration of `testbed run`: how fast the emulated path really moves tensors
of the workload's wire size, measured before the variants play.

Tensors of the workload's wire size are timed over one channel each way between hosts
on either side of the WAN (after an untimed tensor that opens the TCP windows), once
per stream count the variants use, and the shared variants' channels are timed
colliding (all sending at once). The probes are worker processes
(testbed/training/worker.py, roles probe-recv / probe-send) on the hosts; the rates
feed the variants' a-priori predictions (testbed/run/variants.py). The result is a
`Calibration` (testbed_core/contracts/calibration.py, re-exported here).
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from statistics import median
from typing import Any

from testbed.progress import Progress
from testbed.run.common import (
    REPO_ROOT,
    RunnerError,
    log_tail,
    stop_processes,
    transport_job,
    worker_argv,
    worker_env,
)
from testbed.run.network import Network
from testbed.run.ports import PortPlan, PortRange
from testbed.run.scenario import Scenario
from testbed_core.contracts.calibration import PROBE_WARMUP, Calibration
from testbed_core.contracts.worker_job import ProbeJob, RingProbeJob

__all__ = ["PROBE_WARMUP", "Calibration", "Prober", "aggregate_rate", "calibrate", "calibrate_link",
           "calibration_pairs", "effective_rate"]

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


class Prober:
    """Runs probe-recv / probe-send pairs on hosts and reads their results."""

    def __init__(self, net: Network, folder: Path, scenario: Scenario, secret: str, ports: PortRange) -> None:
        self.net = net
        self.folder = folder
        self.scenario = scenario
        self.env = worker_env(secret)
        self.ports = ports
        self.folder.mkdir(parents=True, exist_ok=True)

    def run(self, pairs: Sequence[tuple[str, str]], streams: int, nbytes: int, count: int,
            label: str = "", period_s: float | None = None,
            offsets: Sequence[float] | None = None) -> list[dict[str, Any]]:
        """`count` tensors over one channel per (src, dst) pair, all pairs at once
        (each sender waits PROBE_GAP_S after a confirmation, or sends in rounds of
        `period_s`, pair k starting `offsets[k]` after the common start)."""
        t = self.scenario.transport
        transport = transport_job(t)
        recvs, sends, logs = {}, {}, []
        results = []
        try:
            for k, (src, dst) in enumerate(pairs):
                name = f"{label}s{streams}-c{k}"
                port = self.ports.port(k)
                warm = min(PROBE_WARMUP_BYTES_PER_STREAM * streams, 64 << 20)
                rjob = ProbeJob(role="probe-recv", name=name, bind_ip="0.0.0.0", port=port, streams=streams,
                                nbytes=nbytes, count=count, out=str(self.folder / f"{name}-recv.json"),
                                transport=transport, warmup_bytes=warm)
                rpath = self.folder / f"{name}-recv.job.json"
                rpath.write_text(rjob.model_dump_json(indent=1))
                log = open(self.folder / f"{name}-recv.log", "w")  # noqa: SIM115 (closed below)
                logs.append(log)
                recvs[name] = self.net.host(dst).popen(worker_argv(rpath), env=self.env, stdout=subprocess.PIPE,
                                                       stderr=log, text=True, cwd=str(REPO_ROOT))
                line = recvs[name].stdout.readline()
                if "listening" not in line:
                    recvs[name].wait(5)
                    raise RunnerError(f"calibration receiver on {dst} did not start:\n{log_tail(Path(log.name))}")
                sjob = ProbeJob(role="probe-send", name=name, peer_ip=self.net.host(dst).ip, port=port,
                                streams=streams, nbytes=nbytes, count=count, gap_s=PROBE_GAP_S,
                                wait_go=True, period_s=period_s, warmup_bytes=warm,
                                out=str(self.folder / f"{name}-send.json"), transport=transport)
                spath = self.folder / f"{name}-send.job.json"
                spath.write_text(sjob.model_dump_json(indent=1))
                slog = open(self.folder / f"{name}-send.log", "w")  # noqa: SIM115
                logs.append(slog)
                sends[name] = self.net.host(src).popen(worker_argv(spath), env=self.env, stdout=subprocess.PIPE,
                                                       stderr=slog, stdin=subprocess.PIPE, text=True,
                                                       cwd=str(REPO_ROOT))
            for name, p in sends.items():  # every sender connected: one common start
                if "connected" not in p.stdout.readline():
                    p.wait(5)
                    raise RunnerError(f"calibration probe {name} could not connect:\n"
                                      f"{log_tail(self.folder / f'{name}-send.log')}")
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
                                      f"{log_tail(self.folder / f'{pname}.log')}") from None
                if rc != 0:
                    raise RunnerError(f"calibration probe {pname} failed (exit {rc}):\n"
                                      f"{log_tail(self.folder / f'{pname}.log')}")
            for name in sends:
                s = json.loads((self.folder / f"{name}-send.json").read_text())
                r = json.loads((self.folder / f"{name}-recv.json").read_text())
                results.append({"sent": s["sent"], "arrived": r["arrived"]})
        finally:
            stop_processes({**recvs, **sends})
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
    cal = cal or Calibration(src=pairs[0][0], dst=pairs[0][1], nbytes=nbytes, latency_s=latency_s)
    prober = Prober(net, folder, scenario, secret, PortPlan(scenario.runner.base_port).calibration)
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
    """The link's total while the variants' channels collide on it: one channel of
    `streams` per pair and per direction, sending in synchronised rounds (as the
    data-parallel pipelines do), at least COLLISION_ROUNDS timed rounds (the mean of
    a heavy-tailed time needs more samples than a median)."""
    count = max(scenario.runner.calibration_transfers, COLLISION_ROUNDS) + PROBE_WARMUP
    prober = Prober(net, folder, scenario, secret, PortPlan(scenario.runner.base_port).calibration)
    single = cal.transfer_s.get(streams) or [1.0]
    period = 2.5 * sum(single) / len(single) + PROBE_GAP_S
    both = list(pairs) + [(b, a) for a, b in pairs]
    res = prober.run(both, streams, cal.nbytes, count, f"x{len(pairs)}-", period_s=period)
    rates = []
    durations: list[float] = []
    for group in (res[:len(pairs)], res[len(pairs):]):
        timed = [a - s for r in group for s, a in list(zip(r["sent"], r["arrived"], strict=True))[PROBE_WARMUP:]]
        durations += timed
        rates.append(aggregate_rate(cal.nbytes, timed, len(pairs), cal.latency_s))
    cal.concurrent = len(pairs)
    cal.colliding_bps[streams] = sum(rates) / len(rates)
    cal.colliding_s[streams] = durations
    progress.log(f"  calibration: {len(pairs)} channels of {streams} streams colliding, each way: "
                 f"{', '.join(f'{r / 1e6:.0f}' for r in rates)} Mbit/s in all (transfers: median "
                 f"{median(durations) * 1e3:.0f} ms, slowest {max(durations) * 1e3:.0f} ms of {len(durations)})")


def time_rings(net: Network, scenario: Scenario, folder: Path, secret: str, pairs: Sequence[tuple[str, str]],
               streams: int, grad_bytes: int, count: int, label: str) -> tuple[list[float], int]:
    """Run the training workers' DP ring all-reduce (testbed/training/allreduce.py) of
    `grad_bytes` between each pair of hosts, all pairs at once from one common start,
    `count` times. Returns (the slowest pair's seconds per run, bytes each replica sent)."""
    ports = PortPlan(scenario.runner.base_port).calibration
    transport = transport_job(scenario.transport)
    env = worker_env(secret)
    folder.mkdir(parents=True, exist_ok=True)
    procs: dict[str, subprocess.Popen] = {}
    logs = []
    try:
        for k, (a, b) in enumerate(pairs):
            for rank, (me, peer, end) in enumerate(((a, b, "listen"), (b, a, "connect"))):
                name = f"{label}ring{k}-r{rank}"
                job = RingProbeJob(role="probe-ring", name=name, channel=end, bind_ip="0.0.0.0",
                                   peer_ip=net.host(peer).ip, port=ports.port(k), streams=streams, dp_rank=rank,
                                   grad_bytes=grad_bytes, bucket_bytes=scenario.runner.dp_bucket, count=count,
                                   out=str(folder / f"{name}.json"), transport=transport,
                                   timeout_s=scenario.runner.iteration_timeout)
                path = folder / f"{name}.job.json"
                path.write_text(job.model_dump_json(indent=1))
                log = open(folder / f"{name}.log", "w")  # noqa: SIM115 (closed below)
                logs.append(log)
                procs[name] = net.host(me).popen(worker_argv(path), env=env, stdout=subprocess.PIPE, stderr=log,
                                                 stdin=subprocess.PIPE, text=True, cwd=str(REPO_ROOT))
                if end == "listen" and "listening" not in procs[name].stdout.readline():
                    procs[name].wait(5)
                    raise RunnerError(f"calibration ring {name} on {me} did not start:\n"
                                      f"{log_tail(folder / f'{name}.log')}")
        for name, p in procs.items():
            if "connected" not in p.stdout.readline():
                p.wait(5)
                raise RunnerError(f"calibration ring {name} could not connect:\n{log_tail(folder / f'{name}.log')}")
        t_go = time.time() + 0.2
        for p in procs.values():
            p.stdin.write(f"go {t_go}\n")
            p.stdin.flush()
        for name, p in procs.items():
            try:
                rc = p.wait(scenario.runner.iteration_timeout + 30)
            except subprocess.TimeoutExpired:
                raise RunnerError(f"calibration ring {name} did not finish in time:\n"
                                  f"{log_tail(folder / f'{name}.log')}") from None
            if rc != 0:
                raise RunnerError(f"calibration ring {name} failed (exit {rc}):\n{log_tail(folder / f'{name}.log')}")
        results = [json.loads((folder / f"{name}.json").read_text()) for name in procs]
    finally:
        stop_processes(procs)
        for log in logs:
            log.close()
    slowest = [max(r["times_s"][i] for r in results) for i in range(count)]
    return slowest, int(results[0]["bytes_sent"])


def calibrate_lan(net: Network, scenario: Scenario, folder: Path, secret: str, pairs: Sequence[tuple[str, str]],
                  grad_bytes: int, cal: Calibration, progress: Progress) -> None:
    """The rate of the DP all-reduce inside a DC: the workers' own ring of `grad_bytes`
    (the largest stage's gradients) between the hosts of DP neighbours, all pairs at
    once (as the rings of every stage run together), single-stream channels; rate =
    bytes each replica sends / median time (the first run, which opens the connections'
    windows, not counted)."""
    count = scenario.runner.calibration_transfers + 1
    times, sent = time_rings(net, scenario, folder, secret, pairs, 1, grad_bytes, count, "lan-")
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
