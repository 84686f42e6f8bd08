"""WAN calibration of `testbed run`: how fast the emulated paths really move tensors
of the workload's wire size, measured before the variants play.

Tensors of the workload's wire size are timed over a channel between hosts on either
side of a WAN path, both ways at once as a pipeline's boundary channel carries them,
once per stream count the variants use there, and the shared variants' channels
colliding (all sending at once); every WAN probe's channels opened as the run opens
its own (`run_channels`: cold on modelled devices, warmed with the workers' untimed
tensor on real ones, then the run's untimed warm-up tensors) and clamped as the variants
they stand for clamp theirs (`probe_caps`); the tensor-check probe (`calibrate_verify`)
times CPU work, its channels warmed; a path the DP rings cross (dp-across-dc) times the
workers' own ring all-reduce, all rings at once; inside a DC, the ring between DP
neighbours. Which paths, stream counts and rings (`calibrate_variants`): from the
placements of the run's variants (testbed/run/variants.py `place_variants`, the same
placements the variants then run on) and the streams their policies take
(testbed_core/planning/wan_paths.py, streams.py); each path's figures are a
`PathCalibration` and the whole a `Calibration` (testbed_core/contracts/calibration.py,
re-exported here).

The probes run in probe agents (`ProbeAgents`): one worker process per host
(``python -m testbed.training.worker --probe-agent``, testbed/training/worker/probe.py)
that runs every probe job handed to it, so the calibration starts a Python process that
imports torch once per host, all hosts at once, not once per probe end.
"""

from __future__ import annotations

import contextlib
import json
import math
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from statistics import median
from typing import IO, Any, NamedTuple

from testbed.progress import Progress
from testbed.run.common import (
    REPO_ROOT,
    RUN_PRELOAD,
    RunnerError,
    log_tail,
    nominal_link,
    run_preload,
    stop_processes,
    transport_job,
    worker_env,
)
from testbed.run.network import Network
from testbed.run.pacing import probe_burst, tensors_at_once, window_caps
from testbed.run.ports import PortPlan, PortRange
from testbed.run.scenario import Scenario
from testbed_core.constants import WARMUP_BYTES_PER_STREAM, warmup_bytes
from testbed_core.contracts.calibration import (
    PROBE_WARMUP,
    TURNS_MAX_UNTIMED,
    Calibration,
    PathCalibration,
    TogetherCalibration,
    TurnsCalibration,
    VerifyCalibration,
    dc_of_host,
)
from testbed_core.contracts.worker_job import ProbeJob, RingProbeJob
from testbed_core.planning.calibrated import turns_hold_s
from testbed_core.planning.placement import Placement
from testbed_core.planning.streams import (
    StreamsSetting,
    choose_streams,
    configured_streams,
    mean_rate,
    requested_sharing,
    timed_counts,
    variant_streams,
)
from testbed_core.planning.wan_paths import (
    DcPair,
    PathUse,
    TogetherLoad,
    boundary_pairs,
    dp_lan_pairs,
    grad_wire_bytes,
    lan_boundary_pair,
    path_key,
    together_loads,
    two_way,
    wan_uses,
)
from testbed_core.variants import RunVariant, VariantDef
from testbed_core.workload import EffectiveWorkload

__all__ = ["PROBE_WARMUP", "Calibration", "ChannelState", "PathCalibration", "ProbeAgents", "Prober",
           "aggregate_rate", "calibrate", "calibrate_link", "calibrate_one_way", "calibrate_together",
           "calibrate_turns", "calibrate_variants", "calibrate_verify", "calibrate_wan_rings", "effective_rate",
           "probe_caps", "run_channels", "variant_caps"]

ALONE_MAX_UNTIMED = 8
"""The alone probe's (`calibrate`) untimed tensors a channel at most, where the run's
channels carry more in their warm-up iterations: its channel is used more as a run's
boundary channel is before the run's timed iterations than with TURNS_MAX_UNTIMED, at
the price of a longer probe (a window-limited one-stream channel pays a whole tensor's
round trips for each). Where a stream's window is near its stripe of a tensor, a
channel moves a tensor in one round trip more or fewer, and which one a channel settles
in differs from one channel to the next: neither more untimed tensors nor the two-way
channel make the reading certain there (results/probe-rtt200/, docs/results/sweep-rtt.md).
16 (two warm-up iterations of 8 micro-batches) moved no reading beyond its scatter and
made calibrations longer (docs/results/fidelity.md, at 7531158); where a one-stream
channel's forward and back legs differ, that is the probe's direction, not a channel
still warming (results/held-back/README.md, twelfth session)."""
PROBE_GAP_S = 0.1  # between calibration tensors: like a channel between micro-batches
OPS_HOLD_S = 0.002  # each hold of the device-overhead probe (`calibrate_host_ops`): a short stage's compute
OPS_COUNT = 40  # its timed holds
OPS_WARMUP = 5  # its untimed holds first (the device's files created, the code warm)
COLLISION_ROUNDS = 12  # timed rounds of the collision probe, at least
ONE_WAY_MIN_SHARE = 0.5  # a shared channel timed one way alone too where both ways it moves this share of the link
VERIFY_ROUNDS = 6  # timed tensors of the tensor-check probe each way, at least
LOADED_ROUNDS = 6  # timed rounds of the loaded LAN tensor probe, at least
ONE_WAY_ROUNDS = 4  # timed transfers of the one-way probe, at least (its median: one slow transfer of two halves the rate)
LAN_RING_ROUNDS = 3  # timed rings of the DP ring probe inside the DCs, at least (`calibrate_lan`; each a fraction of a second)
TURNS_ROUNDS = 6  # timed rounds of the turns probe, at least (each channel each way: 4 x this at 2 pipelines)
PROBE_WARMUP_BYTES_PER_STREAM = WARMUP_BYTES_PER_STREAM  # a warmed channel's untimed tensor (testbed_core/constants.py)
PROBE_SLACK_S = 60.0  # a probe's time budget beyond its tensors (connect, start, the warm-up tensor)
PROBE_TRANSFER_SLACK_S = 5.0  # each tensor's budget beyond its bytes at the slowest WAN rate (probe_budget_s)


def probe_budget_s(count: int, nbytes: int, period_s: float | None, offsets: Sequence[float] | None,
                   wan: Sequence[tuple[float, float]], clamped_bytes: int | None = None) -> float:
    """How long a probe of `count` tensors of `nbytes` may take before it counts as hung,
    seconds: per tensor its round (`period_s`) or gap, its bytes at the slowest WAN link's
    rate (`wan`: each link's (rate bits/s, RTT s)), a round trip of the slowest-to-
    answer link per MiB (a window-limited stream: one stream at 200 ms RTT moves about
    3 MB/s; a channel whose streams are clamped, `clamped_bytes` in flight at most, a
    round trip per that many bytes where that is more) and PROBE_TRANSFER_SLACK_S, plus
    the latest start offset and PROBE_SLACK_S.
    A fixed 60 s failed sweep-rtt's 100 ms point: Atlas's one-stream turns probe there
    (two channels' 2.5 s turns a round) needs more than a minute."""
    slowest = min((rate for rate, _ in wan), default=0.0)
    rtt = max((r for _, r in wan), default=0.0)
    trips = max(nbytes / 2**20, math.ceil(nbytes / clamped_bytes) if clamped_bytes else 0)
    per = (PROBE_TRANSFER_SLACK_S + (period_s if period_s is not None else PROBE_GAP_S)
           + (nbytes * 8 / slowest if slowest > 0 else 0.0) + trips * rtt)
    return PROBE_SLACK_S + max(offsets or [0.0]) + count * per


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
    return mean_rate(nbytes, durations, channels, latency_s)


class ProbeTimes(NamedTuple):
    """One channel's probe: when each tensor was handed over (the sender's clock) and
    when it arrived (the receiver's; the hosts share the machine's clock); a probe with
    the tensor checks (verify) also each fill (sender) and check (receiver), seconds."""

    sent: list[float]
    arrived: list[float]
    fill_s: list[float] | None = None
    check_s: list[float] | None = None
    back_sent: list[float] | None = None  # a duplex probe's: when the receiver handed each tensor back
    back_arrived: list[float] | None = None  # ... and when it came back to the sender

    def timed(self, untimed: int) -> list[float]:
        """Each tensor's transfer time, the `untimed` first tensors left out."""
        return [a - s for s, a in zip(self.sent, self.arrived, strict=True)][untimed:]

    def timed_back(self, untimed: int) -> list[float]:
        """A duplex probe's: each tensor's time back, the `untimed` first left out."""
        return [a - s for s, a in zip(self.back_sent or [], self.back_arrived or [], strict=True)][untimed:]


class ChannelState(NamedTuple):
    """How the run's channels are when its measured iterations use them (`run_channels`):
    `warm`, opened with the workers' untimed warm-up tensor (warmup_bytes), `untimed`,
    the tensors each carried before (its warm-up iterations', at most TURNS_MAX_UNTIMED),
    and `at_once`, how many of them the schedule may have handed a channel at once
    (testbed/run/pacing.py `tensors_at_once`)."""

    warm: bool
    untimed: int
    at_once: int = 1


def run_channels(scenario: Scenario, most: int = TURNS_MAX_UNTIMED) -> ChannelState:
    """How a probe opens its channels to time them as the run's: warmed where the
    workers warm each WAN channel (real devices, testbed/training/worker/warm.py), cold
    on modelled devices (no warm-up tensor); then as many untimed tensors as a run's
    channel carries in its warm-up iterations, at most TURNS_MAX_UNTIMED (the turns
    probe's rule: the first tensor of a cold channel took 1.4-4.4 x its steady time, the
    third on were at it; `most`: another cap), handed over as many at once as the
    schedule may hand a channel (`tensors_at_once`). Why (issue 40): the probe's
    channels are to be in the state of the run's; a big warm-up tensor that the run's
    modelled workers never send opens windows they do not have, and a stream only ever
    handed one tensor at a time settles in slow start at a window of twice that tensor,
    which Linux paces at twice the window a round trip: its tensor then takes a quarter
    of the round trip on the wire, slower than the link on a long path, where the run's
    streams, handed several at once by its warm-up, grew past it
    (results/held-back/held-far-pp4-tcpinfo/)."""
    w = scenario.workload
    return ChannelState(w.gpu.mode == "real", min(most, w.warmup * w.parallelism.num_micro_batches),
                        tensors_at_once(w.parallelism))


def variant_caps(scenario: Scenario, run: RunVariant, placement: Placement, streams: int, nbytes: int,
                 local: bool, auto_capped: bool) -> dict[DcPair, int] | None:
    """The receive window the run clamps each stream of `run`'s channels of `streams`
    streams on `placement` to, per direction (sending DC, receiving DC), as
    testbed/run/variants.py `_plan_one` gives its shared way (testbed/run/pacing.py
    `window_caps`; none in local mode); None where it runs uncapped: a temporal plan by
    request, or, unless `auto_capped`, a variant that weighs both ways (sharing
    ``auto``: its plan's channels are not capped)."""
    sharing = requested_sharing(run.variant, scenario.runner.atlas_sharing)
    if sharing == "temporal" or (sharing == "auto" and not auto_capped):
        return None
    if local:
        return {}
    return window_caps(scenario.topology, placement, streams, nbytes, tensors_at_once(scenario.workload.parallelism))


def probe_caps(caps: Sequence[Mapping[DcPair, int] | None]) -> dict[DcPair, int]:
    """The window caps of a probe whose figure serves every variant of `caps` (each
    `variant_caps`; None: one that runs uncapped): per direction, the cap all of them run
    with; none where one runs uncapped or with another cap (the probe then times the
    streams as the uncapped run them, and the planner holds a capped stream to its cap a
    round trip, testbed_core/planning/network.py `wan_path`)."""
    if not caps or any(c is None for c in caps):
        return {}
    first, *rest = caps
    assert first is not None
    return {way: cap for way, cap in first.items() if all(c is not None and c.get(way) == cap for c in rest)}


class ProbeAgents:
    """One probe agent per host (testbed/training/worker/probe.py): a process that runs
    every probe job of the calibration handed to it, so that the calibration starts a
    Python process that imports torch once per host, all hosts at once, instead of once
    per probe end and one after another. `close` ends them."""

    def __init__(self, net: Network, folder: Path, secret: str, timeout_s: float = 180.0, warm: bool = True,
                 preload: tuple[str, ...] = RUN_PRELOAD) -> None:
        self.net, self.folder, self.env, self.timeout_s = net, folder, worker_env(secret), timeout_s
        self.warm = warm  # forked from the run's fork server that imported torch (runner.warm_start)
        self.preload = preload  # what that server imports (run_preload: the run's first warm start decides)
        self.procs: dict[str, subprocess.Popen] = {}
        self.logs: dict[str, IO[str]] = {}
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
            self.procs[h] = (host.popen_warm(argv, preload=self.preload, **kwargs) if self.warm
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
        self.agents = agents or ProbeAgents(net, folder, secret, warm=scenario.runner.warm_start,
                                            preload=run_preload(scenario))
        self.net = net
        self.burst = 1  # the last run's untimed tensors handed at once (`run`'s `opened`), for the log
        self.folder.mkdir(parents=True, exist_ok=True)

    def run(self, pairs: Sequence[tuple[str, str]], streams: int | Sequence[int], nbytes: int, count: int,
            label: str = "", period_s: float | None = None,
            offsets: Sequence[float] | None = None, warm: bool = True, verify: bool = False,
            caps: Mapping[DcPair, int] | None = None, duplex: bool = False,
            opened: ChannelState | None = None) -> list[ProbeTimes]:
        """`count` tensors over one channel per (src, dst) pair, all pairs at once
        (each sender waits PROBE_GAP_S after a confirmation, or sends in rounds of
        `period_s`, pair k starting `offsets[k]` after the common start); `streams`: every
        channel's stream count, or one per pair; `warm`: each
        channel first sends one untimed tensor that opens its windows (warmup_bytes);
        `verify`: each tensor filled and checked as ``runner.verify_tensors`` does, timed;
        `caps`: per direction (sending DC, receiving DC), each stream's window clamp
        (`probe_caps`), each end clamping what it receives as the run's channels do;
        `duplex`: each receiver hands a tensor back over the same channel as each arrives;
        `opened`: how the run's channels are opened, its `untimed` first tensors handed
        `at_once` at a time, or as many as the routes hold (testbed/run/pacing.py
        `probe_burst`; `warm` is then its `warm`)."""
        transport = transport_job(self.scenario.transport)
        if opened is not None:
            warm = opened.warm
        untimed, at_once = (opened.untimed, opened.at_once) if opened is not None else (0, 1)
        per_pair = [streams] * len(pairs) if isinstance(streams, int) else list(streams)
        if len(per_pair) != len(pairs):
            raise ValueError(f"{len(per_pair)} stream counts for {len(pairs)} pairs")
        budget = probe_budget_s(count * (2 if duplex else 1), nbytes, period_s, offsets,
                                [(link.rate, link.rtt_s) for link in self.scenario.topology.wan],
                                min(per_pair) * min(caps.values()) if caps else None)
        if at_once > 1 and untimed > 1:  # as many as the routes hold, each way a channel carries tensors
            ways = [(dc_of_host(a), dc_of_host(z), n, (caps or {}).get((dc_of_host(a), dc_of_host(z))))
                    for (src, dst), n in zip(pairs, per_pair, strict=True)
                    for a, z in ([(src, dst), (dst, src)] if duplex else [(src, dst)])]
            at_once = probe_burst(self.scenario.topology, ways, nbytes, at_once)
        self.burst = at_once
        agents = self.agents
        agents.start([h for pair in pairs for h in pair])
        names = []
        for k, ((src, dst), streams) in enumerate(zip(pairs, per_pair, strict=True)):
            name = f"{label}s{streams}-c{k}"
            port = self.ports.port(k)
            warm_bytes = warmup_bytes(streams) if warm else 0
            ahead, back = (dc_of_host(src), dc_of_host(dst)), (dc_of_host(dst), dc_of_host(src))
            agents.submit(dst, ProbeJob(role="probe-recv", name=f"{name}-recv", bind_ip="0.0.0.0", port=port,
                                        streams=streams, nbytes=nbytes, count=count,
                                        out=str(self.folder / f"{name}-recv.json"), transport=transport,
                                        warmup_bytes=warm_bytes, verify=verify, timeout_s=budget,
                                        window_clamp=(caps or {}).get(ahead), duplex=duplex))
            agents.expect(f"{name}-recv", "listening", 60)
            agents.submit(src, ProbeJob(role="probe-send", name=f"{name}-send", peer_ip=self.net.host(dst).ip,
                                        port=port, streams=streams, nbytes=nbytes, count=count, gap_s=PROBE_GAP_S,
                                        untimed=min(untimed, count), untimed_at_once=at_once, wait_go=True,
                                        period_s=period_s, warmup_bytes=warm_bytes, verify=verify,
                                        out=str(self.folder / f"{name}-send.json"), transport=transport,
                                        timeout_s=budget, window_clamp=(caps or {}).get(back), duplex=duplex))
            names.append(name)
        for name in names:  # every sender connected: one common start
            agents.expect(f"{name}-send", "connected", 60)
        t_go = time.time() + 0.2
        for k, name in enumerate(names):
            agents.go(f"{name}-send", t_go + (offsets[k] if offsets else 0.0))
        for name in names:
            for end in ("send", "recv"):
                agents.expect(f"{name}-{end}", "done", budget + 30)  # the probe's own timeout first
        results = []
        for name in names:
            snd = json.loads((self.folder / f"{name}-send.json").read_text())
            rcv = json.loads((self.folder / f"{name}-recv.json").read_text())
            results.append(ProbeTimes(snd["sent"], rcv["arrived"], snd.get("fill_s"), rcv.get("check_s"),
                                      rcv.get("returned_sent"), snd.get("returned")))
        return results


Measured = Calibration | PathCalibration  # what a probe step fills in: the run's calibration or one path's


def calibrate(
    net: Network, scenario: Scenario, folder: Path, secret: str, pairs: Sequence[tuple[str, str]],
    stream_counts: Sequence[int], nbytes: int, latency_s: float, progress: Progress,
    cal: Measured | None = None, agents: ProbeAgents | None = None, caps: Mapping[DcPair, int] | None = None,
) -> Measured:
    """Time tensors of `nbytes` over one channel per pair, all at once, once per stream
    count (added to `cal` when given), each channel carrying them both ways (duplex: the
    receiver hands one back as each arrives), as a pipeline's boundary channel carries
    activations one way and gradients the other, the reverse traffic (and its ACKs) on
    the same connections; the channels opened as the run's (`run_channels`, up to
    ALONE_MAX_UNTIMED untimed tensors first) and clamped by `caps` (`Prober.run`). The
    figures: both ways' transfers, forward ones first."""
    state = run_channels(scenario, ALONE_MAX_UNTIMED)
    count = scenario.runner.calibration_transfers + state.untimed
    cal = cal or Calibration(src=pairs[0][0], dst=pairs[0][1], nbytes=nbytes, latency_s=latency_s)
    prober = Prober(net, folder, scenario, secret, PortPlan(scenario.runner.base_port).calibration, agents)
    try:
        for n in sorted(set(stream_counts) - set(cal.rates_bps)):
            durations = []
            for res in prober.run(pairs, n, nbytes, count, f"{_label(cal)}single-", opened=state, caps=caps,
                                  duplex=True):
                durations += res.timed(state.untimed) + res.timed_back(state.untimed)
            cal.transfer_s = {**cal.transfer_s, n: durations}
            cal.rates_bps = {**cal.rates_bps, n: effective_rate(nbytes, durations, latency_s)}
            progress.log(f"  calibration{_where(cal)}: {n:2d} stream(s), {nbytes / 1e6:.2f} MB tensors: "
                         f"{cal.rates_bps[n] / 1e6:.0f} Mbit/s per channel "
                         f"({_opened(state, caps, getattr(cal, 'dcs', ()), prober.burst)}"
                         f"; transfers {', '.join(_ms(d) for d in durations)} ms)")
    finally:
        if agents is None:
            prober.agents.close()
    return cal


def calibrate_one_way(net: Network, scenario: Scenario, folder: Path, secret: str, pair: tuple[str, str],
                      stream_counts: Sequence[int], path: PathCalibration, progress: Progress,
                      agents: ProbeAgents | None = None, caps: Mapping[DcPair, int] | None = None) -> None:
    """Time tensors of the path's size over one channel of `pair` alone, nothing sent
    the other way, once per stream count not timed so yet: the rate probe (`calibrate`)
    carries tensors both ways on one channel, as pipelines whose activations and gradients cross
    together load the path; a channel that fills the link moves less so (the other
    way's data delays its acknowledgements), and a pipeline whose transfers take turns
    across the path (one way, then the other) moves more. The planner weighs the two
    by how much its transfers overlap the other way's (testbed_core/planning/reverse_load.py).
    Channels opened as the run's (`run_channels`), clamped by `caps`."""
    state = run_channels(scenario)
    count = max(scenario.runner.calibration_transfers, ONE_WAY_ROUNDS) + state.untimed
    prober = Prober(net, folder, scenario, secret, PortPlan(scenario.runner.base_port).calibration, agents)
    try:
        for n in sorted(set(stream_counts) - set(path.one_way_bps)):
            (res,) = prober.run([pair], n, path.nbytes, count, f"{_label(path)}oneway-", opened=state, caps=caps)
            durations = res.timed(state.untimed)
            path.one_way_s = {**path.one_way_s, n: durations}
            path.one_way_bps = {**path.one_way_bps, n: effective_rate(path.nbytes, durations, path.latency_s)}
            progress.log(f"  calibration{_where(path)}: {n:2d} stream(s) one way alone: "
                         f"{path.one_way_bps[n] / 1e6:.0f} Mbit/s per channel ({_opened(state, caps, path.dcs, prober.burst)}; "
                         f"transfers {', '.join(f'{d * 1e3:.0f}' for d in durations)} ms)")
    finally:
        if agents is None:
            prober.agents.close()


def _label(cal: Measured) -> str:
    return f"{cal.dcs[0]}-{cal.dcs[1]}-" if isinstance(cal, PathCalibration) else ""


def _where(cal: Measured) -> str:
    return f" {cal.dcs[0]}<->{cal.dcs[1]}" if isinstance(cal, PathCalibration) else ""


def _ms(seconds: float) -> str:
    """A transfer's milliseconds for a log line: whole ones, tenths below 10 ms."""
    return f"{seconds * 1e3:.0f}" if seconds >= 0.01 else f"{seconds * 1e3:.1f}"


def _opened(state: ChannelState, caps: Mapping[DcPair, int] | None = None, dcs: Sequence[str] = (),
            burst: int = 1) -> str:
    """How a probe's channels were opened and clamped (the caps between `dcs` only, where
    given; `burst`: the untimed tensors it handed at once, `Prober.burst`), for the log."""
    return (f"{'warmed' if state.warm else 'cold'} channels, {state.untimed} untimed tensor(s) first"
            + (f", {burst} at a time" if burst > 1 and state.untimed > 1 else "")
            + "".join(f", {a}->{z} windows capped at {c / 1e3:.0f} KB a stream"
                      for (a, z), c in sorted((caps or {}).items()) if not dcs or {a, z} <= set(dcs)))


def calibrate_link(
    net: Network, scenario: Scenario, folder: Path, secret: str, pairs: Sequence[tuple[str, str]],
    streams: int, cal: Measured, progress: Progress, agents: ProbeAgents | None = None,
    caps: Mapping[DcPair, int] | None = None,
) -> None:
    """The link's total while the variants' channels collide on it: one channel of
    `streams` per pair and per direction, sending in synchronised rounds (as the
    data-parallel pipelines do), at least COLLISION_ROUNDS timed rounds (the mean of
    a heavy-tailed time needs more samples than a median); the channels opened as the
    run's (`run_channels`) and clamped as the shared variants' are (`caps`)."""
    state = run_channels(scenario)
    count = max(scenario.runner.calibration_transfers, COLLISION_ROUNDS) + state.untimed
    prober = Prober(net, folder, scenario, secret, PortPlan(scenario.runner.base_port).calibration, agents)
    single = cal.transfer_s.get(streams) or [1.0]
    period = 2.5 * sum(single) / len(single) + PROBE_GAP_S
    both = list(pairs) + [(b, a) for a, b in pairs]
    try:
        res = prober.run(both, streams, cal.nbytes, count, f"{_label(cal)}x{len(pairs)}-", period_s=period,
                         opened=state, caps=caps)
    finally:
        if agents is None:
            prober.agents.close()
    rates = []
    durations: list[float] = []
    for group in (res[:len(pairs)], res[len(pairs):]):
        timed = [d for r in group for d in r.timed(state.untimed)]
        durations += timed
        rates.append(aggregate_rate(cal.nbytes, timed, len(pairs), cal.latency_s))
    cal.concurrent = len(pairs)
    cal.colliding_bps = {**cal.colliding_bps, streams: sum(rates) / len(rates)}
    cal.colliding_s = {**cal.colliding_s, streams: durations}
    progress.log(f"  calibration{_where(cal)}: {len(pairs)} channels of {streams} streams colliding, each way: "
                 f"{', '.join(f'{r / 1e6:.0f}' for r in rates)} Mbit/s in all ({_opened(state, caps, getattr(cal, 'dcs', ()), prober.burst)}; "
                 "transfers: "
                 f"median {median(durations) * 1e3:.0f} ms, slowest {max(durations) * 1e3:.0f} ms of {len(durations)})")


def calibrate_together(
    net: Network, scenario: Scenario, folder: Path, secret: str,
    loads: Sequence[tuple[PathCalibration, Sequence[tuple[str, str]]]], streams: int, progress: Progress,
    agents: ProbeAgents | None = None, caps: Mapping[DcPair, int] | None = None,
    colliding_caps: Mapping[DcPair, int] | None = None,
) -> None:
    """Every path of a placement loaded at once, as the placement's pipelines load them
    (every WAN link is a delay line on the machine's cores, so a path gives less while
    the others are busy than it gave timed alone). `loads`: per path, the (upstream,
    downstream) hosts of the pipelines crossing it. Two probes, in synchronised rounds
    of at least COLLISION_ROUNDS: one channel of `streams` each way on every path (each
    path's channel rate, the median as `calibrate` takes it, but one channel each way
    rather than one carrying both), then, where two or more
    pipelines cross a path, all of their channels each way on every path (that path's
    colliding aggregate, the mean as `calibrate_link` takes it). The figures go to each
    path's ``together`` list. The channels opened as the run's (`run_channels`), clamped
    by `caps` (one channel each way) and `colliding_caps` (every pipeline's)."""
    state = run_channels(scenario)
    count = max(scenario.runner.calibration_transfers, COLLISION_ROUNDS) + state.untimed
    prober = Prober(net, folder, scenario, secret, PortPlan(scenario.runner.base_port).calibration, agents)
    means = [sum(v) / len(v) for pc, _ in loads if (v := pc.transfer_s.get(streams))] or [1.0]
    period = 2.5 * max(means) + PROBE_GAP_S  # the slowest path's transfers fit a round
    dcs = [pc.dcs for pc, _ in loads]
    label = "+".join(f"{a}-{z}" for a, z in dcs)
    figures = {pc.dcs: TogetherCalibration(streams=streams, paths=dcs, channels=len(pairs)) for pc, pairs in loads}

    def play(per_path: Sequence[Sequence[tuple[str, str]]], tag: str,
             clamp: Mapping[DcPair, int] | None) -> list[list[list[float]]]:
        """Per path, per direction: the timed transfers of its channels."""
        both = [list(pairs) + [(b, a) for a, b in pairs] for pairs in per_path]
        res = prober.run([p for pairs in both for p in pairs], streams, loads[0][0].nbytes, count,
                         f"{label}-{tag}-", period_s=period, opened=state, caps=clamp)
        out, k = [], 0
        for pairs in both:
            group = res[k:k + len(pairs)]
            k += len(pairs)
            half = len(pairs) // 2
            out.append([[d for r in group[:half] for d in r.timed(state.untimed)],
                        [d for r in group[half:] for d in r.timed(state.untimed)]])
        return out

    try:
        for (pc, _), ways in zip(loads, play([[pairs[0]] for _, pairs in loads], "one", caps), strict=True):
            fig = figures[pc.dcs]
            fig.transfer_s = ways[0] + ways[1]
            fig.rate_bps = sum(effective_rate(pc.nbytes, w, pc.latency_s) for w in ways) / 2
        if any(len(pairs) > 1 for _, pairs in loads):
            for (pc, pairs), ways in zip(loads, play([pairs for _, pairs in loads], "all", colliding_caps),
                                         strict=True):
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
        opened = _opened(state, {**(caps or {}), **(colliding_caps or {})}, pc.dcs, prober.burst)
        progress.log(f"  calibration{_where(pc)} with {len(dcs) - 1} other path(s) loaded at once, {streams} "
                     f"streams ({opened}): "
                     f"{(fig.rate_bps or 0) / 1e6:.0f} Mbit/s per channel"
                     + (f" (alone {alone / 1e6:.0f})" if alone else "")
                     + ("" if fig.colliding_bps is None else
                        f", {fig.channels} channels colliding each way: {fig.colliding_bps / 1e6:.0f} Mbit/s in all"
                        + (f" (alone {pc.colliding_bps[streams] / 1e6:.0f})" if streams in pc.colliding_bps else "")))


def calibrate_turns(net: Network, scenario: Scenario, folder: Path, secret: str, pairs: Sequence[tuple[str, str]],
                    streams: int, pc: PathCalibration, progress: Progress, agents: ProbeAgents | None = None) -> None:
    """The path timed as a temporal plan uses it (`TurnsCalibration`): one channel of
    `streams` per pipeline crossing it (`pairs`), each way, taking turns on each link
    direction with the plan's hold per transfer (the alone probe's median time on the
    wire, token_margin longer; each turn two holds long, so that a late transfer meets no
    other), both directions at once. As the run's channels are: cold on modelled devices
    (no warm-up tensor), warmed with the calibration's tensor on real ones (their workers
    warm each WAN channel so, testbed/training/worker/warm.py); then as many untimed
    tensors as a run channel carries in its warm-up iterations (at most
    TURNS_MAX_UNTIMED), then at least TURNS_ROUNDS timed rounds. A planned
    transfer holds its link until the later of its planned end and its last byte out
    (testbed/training/transport_comm.py), and transfers taking turns on a path move
    otherwise than the alone probe's, both ways at once: the planner takes the plan's
    holds from these transfers (testbed_core/planning/calibrated.py `turns_hold_s`)."""
    single = pc.transfer_s.get(streams)
    if not single or not pairs:
        return
    warm, untimed, _ = run_channels(scenario)  # a plan's turns hand a channel one tensor at a time
    slot = max(1e-3, median(single) - pc.latency_s) * (1 + scenario.runner.token_margin)
    turn = 2 * slot
    count = untimed + max(scenario.runner.calibration_transfers, TURNS_ROUNDS)
    both = list(pairs) + [(b, a) for a, b in pairs]
    offsets = [k * turn for k in range(len(pairs))] * 2
    prober = Prober(net, folder, scenario, secret, PortPlan(scenario.runner.base_port).calibration, agents)
    try:
        res = prober.run(both, streams, pc.nbytes, count, f"{_label(pc)}turns-", period_s=len(pairs) * turn,
                         offsets=offsets, warm=warm)
    finally:
        if agents is None:
            prober.agents.close()
    ways = [[d for r in group for d in r.timed(untimed)] for group in (res[:len(pairs)], res[len(pairs):])]
    fig = TurnsCalibration(streams=streams, channels=len(pairs), slot_s=slot, untimed=untimed, transfer_s=ways[0],
                           return_s=ways[1])
    pc.turns = [t for t in pc.turns if t.streams != streams] + [fig]
    holds = ", ".join(f"{turns_hold_s(way, pc.latency_s, slot) * 1e3:.0f}" for way in ways)
    progress.log(f"  calibration{_where(pc)}: {len(pairs)} {'warmed' if warm else 'cold'} channel(s) of {streams} "
                 "streams taking turns each "
                 f"way, {untimed} untimed tensors first: a planned transfer holds its link {holds} ms on average "
                 f"each way (planned {slot * 1e3:.0f} ms; transfers median "
                 f"{', '.join(f'{median(way) * 1e3:.0f}' for way in ways)} ms, slowest "
                 f"{max(max(way) for way in ways) * 1e3:.0f} ms)")


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
    agents = agents or ProbeAgents(net, folder, secret, warm=scenario.runner.warm_start,
                                   preload=run_preload(scenario))
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
    bytes each replica sends / median time of at least LAN_RING_ROUNDS rings (the first
    run, which opens the connections' windows, not counted; the rings share the
    machine's cores, and a median of two let one slow moment set the rate for the whole
    run: docs/results/fidelity.md, "The probe's channels handed tensors as the schedule
    hands them"). With several pairs, then the first pair alone, the same way (the
    planner shares the aggregate among the rings that overlap, each at most that)."""
    count = max(scenario.runner.calibration_transfers, LAN_RING_ROUNDS) + 1
    times, sent = time_rings(net, scenario, folder, secret, pairs, 1, grad_bytes, count, "lan-", agents)
    timed = times[1:]
    cal.lan_pairs, cal.lan_nbytes, cal.lan_transfer_s = [tuple(p) for p in pairs], grad_bytes, timed
    cal.lan_rate_bps = sent * 8 / max(1e-6, median(timed))
    progress.log(f"  calibration: DP all-reduce inside the DCs, {len(pairs)} ring(s) at once, "
                 f"{grad_bytes / 1e6:.1f} MB gradients: {cal.lan_rate_bps / 1e6:.0f} Mbit/s per replica "
                 f"(rings {', '.join(f'{t * 1e3:.0f}' for t in timed)} ms)")
    if len(pairs) < 2:
        return
    # the stages' rings start one after another (each at its stage's last backward), so
    # a ring often runs alone or beside few others: time the first one alone too
    times, sent = time_rings(net, scenario, folder, secret, pairs[:1], 1, grad_bytes, count, "lan-alone-", agents)
    alone = times[1:]
    cal.lan_alone_transfer_s = alone
    cal.lan_alone_rate_bps = sent * 8 / max(1e-6, median(alone))
    progress.log(f"  calibration: one of those rings alone: {cal.lan_alone_rate_bps / 1e6:.0f} Mbit/s per replica "
                 f"(rings {', '.join(f'{t * 1e3:.0f}' for t in alone)} ms)")


def calibrate_lan_tensor(net: Network, scenario: Scenario, folder: Path, secret: str, pair: tuple[str, str],
                         nbytes: int, cal: Calibration, progress: Progress,
                         agents: ProbeAgents | None = None) -> None:
    """The rate of a pipeline tensor inside a DC where no DP ring is timed there
    (`calibrate_lan`): the single-channel probe (`calibrate`: both ways, opened as the run
    opens its channels, bytes / median hand-over-to-arrival time) of one stream between
    the two hosts of a boundary inside a DC, as the run's channels there, with tensors of
    `nbytes` (the wire size) and no delay (the planner's `lan_latency_s`). Its tensors
    are PROBE_GAP_S apart, as the WAN probes': on a paced channel the one sent after that
    idle moves slower than the one handed back at once, and a pipeline of millisecond
    stages moves its tensors inside a DC slower than a warm channel alone while its other
    channels and devices share the cores; the median of both ways is nearer the run's
    (measured: results/held-back/README.md, sixteenth session)."""
    dc = dc_of_host(pair[0])
    pc = calibrate(net, scenario, folder, secret, [pair], [1], nbytes, 0.0, progress,
                   PathCalibration(dcs=(dc, dc), src=pair[0], dst=pair[1], nbytes=nbytes, latency_s=0.0), agents)
    cal.lan_tensor_pair, cal.lan_tensor_transfer_s, cal.lan_tensor_rate_bps = pair, pc.transfer_s[1], pc.rates_bps[1]


def calibrate_host_ops(run_dir: Path, cal: Calibration, progress: Progress) -> None:
    """What a worker's compute op costs past its modelled time: an emulated device
    (testbed_runtime/device.py, as the workers open theirs, in `run_dir`: where their
    step files live while a variant plays) held OPS_COUNT times for OPS_HOLD_S, one after
    another, each hold's wall time past its modelled time (the device's lock, its
    records, the sleep's overshoot). The planner adds the median to every compute op
    (testbed_core/planning/host_cpu.py): a pipeline of millisecond stages pays it at
    every op."""
    from testbed_runtime.device import Device

    dev = Device("calibration-ops", run_dir, mode="modelled", time_scale=1.0)
    past = []
    for k in range(OPS_WARMUP + OPS_COUNT):
        t0 = time.perf_counter()
        dev.run("forward", "calibration", duration_s=OPS_HOLD_S, label=f"op{k}")
        past.append(max(0.0, time.perf_counter() - t0 - OPS_HOLD_S))
    cal.op_overhead_samples_s = past[OPS_WARMUP:]
    cal.op_overhead_s = median(cal.op_overhead_samples_s)
    progress.log(f"  calibration: an emulated device's hold past its modelled time, {OPS_COUNT} holds of "
                 f"{OPS_HOLD_S * 1e3:g} ms: median {cal.op_overhead_s * 1e3:.2f} ms "
                 f"(max {max(cal.op_overhead_samples_s) * 1e3:.2f} ms)")


def calibrate_lan_loaded(net: Network, scenario: Scenario, folder: Path, secret: str,
                         boundaries: Sequence[tuple[str, str, int]], nbytes: int, cal: Calibration,
                         progress: Progress, agents: ProbeAgents | None = None) -> None:
    """A pipeline's channels inside a DC and over the WAN at once: the hosts' transport
    loops share the machine's two cores, so a tensor inside a DC moves slower while the
    pipeline's other channels move theirs (the LAN tensor probe, `calibrate_lan_tensor`,
    times one alone). `boundaries`: (upstream host, downstream host, streams) of each
    of a placement's boundaries (`boundary_pairs`), with the stream count of the variant
    whose placement it is (one inside a DC, as the run's channels there). In synchronised rounds of at least
    LOADED_ROUNDS, one channel each way per boundary (a pipeline's activations and
    gradients cross at once), a tensor of `nbytes` (the wire size) on every channel at
    the start of each round. Figures (`lan_loaded_*`): the tensors inside a DC, bytes /
    median time, and the WAN's transfers beside them. Channels opened as the run's
    (`run_channels`); unclamped."""
    wan = [b for b in boundaries if dc_of_host(b[0]) != dc_of_host(b[1])]
    inside = [b for b in boundaries if dc_of_host(b[0]) == dc_of_host(b[1])]
    if not wan or not inside:
        return
    state = run_channels(scenario)
    count = max(scenario.runner.calibration_transfers, LOADED_ROUNDS) + state.untimed
    prober = Prober(net, folder, scenario, secret, PortPlan(scenario.runner.base_port).calibration, agents)
    timed_wan = [sum(v) / len(v) for pc in cal.paths for a, z, n in wan
                 if set(pc.dcs) == {dc_of_host(a), dc_of_host(z)} and (v := pc.transfer_s.get(n))]
    period = 2.5 * max(timed_wan or [1.0]) + PROBE_GAP_S  # the slowest WAN transfer fits a round

    chans = wan + inside
    both = [*chans, *((z, a, n) for a, z, n in chans)]  # each boundary's forward channels, then its reverse ones
    try:
        res = prober.run([(a, z) for a, z, _ in both], [n for *_, n in both], nbytes, count, "lan-loaded-",
                         period_s=period, opened=state)
    finally:
        if agents is None:
            prober.agents.close()
    per = [r.timed(state.untimed) for r in res]
    ways = [per[i] + per[i + len(chans)] for i in range(len(chans))]  # per boundary, both ways
    cal.lan_loaded_with = [tuple(b) for b in wan]
    cal.lan_loaded_transfer_s = [d for way in ways[len(wan):] for d in way]
    cal.lan_loaded_rate_bps = effective_rate(nbytes, cal.lan_loaded_transfer_s, 0.0)
    cal.lan_loaded_wan_s = [d for way in ways[:len(wan)] for d in way]
    progress.log("  calibration: a pipeline's channels inside the DCs and over the WAN at once ("
                 + ", ".join(f"{a}->{z}{f' {n} streams' if n > 1 else ''}" for a, z, n in wan + inside)
                 + f", each way, {nbytes / 1e6:.1f} MB tensors in rounds): inside a DC "
                 f"{cal.lan_loaded_rate_bps / 1e6:.0f} Mbit/s (median {median(cal.lan_loaded_transfer_s) * 1e3:.1f} ms), "
                 f"the WAN's transfers beside them median {median(cal.lan_loaded_wan_s) * 1e3:.0f} ms")


def calibrate_verify(net: Network, scenario: Scenario, folder: Path, secret: str, pairs: Sequence[tuple[str, str]],
                     streams: int, nbytes: int, progress: Progress,
                     agents: ProbeAgents | None = None) -> VerifyCalibration:
    """The tensor checks' CPU time (``runner.verify_tensors``): tensors of the
    workload's wire size over one channel per pair of `pairs` (a forward and a reverse
    one, `two_way`), as the rate probe sends them, each filled with the training's
    pattern by its sender and checked byte for byte by its receiver
    (testbed/training/worker/probe.py), every fill and check timed, the first
    PROBE_WARMUP of each channel not counted (the run's warm-up iterations pay those)."""
    count = max(scenario.runner.calibration_transfers, VERIFY_ROUNDS) + PROBE_WARMUP
    prober = Prober(net, folder, scenario, secret, PortPlan(scenario.runner.base_port).calibration, agents)
    fill: list[float] = []
    check: list[float] = []
    try:
        for res in prober.run(pairs, streams, nbytes, count, "verify-", verify=True):
            fill += (res.fill_s or [])[PROBE_WARMUP:]
            check += (res.check_s or [])[PROBE_WARMUP:]
    finally:
        if agents is None:
            prober.agents.close()
    if not fill or not check:
        raise RunnerError(f"calibration: the tensor-check probe between {pairs[0][0]} and {pairs[0][1]} timed "
                          f"{len(fill)} fill(s) and {len(check)} check(s); see {folder}/agent-*.log")
    verify = VerifyCalibration(nbytes=nbytes, fill_s=fill, check_s=check)
    progress.log(f"  calibration: tensor checks (verify_tensors), {nbytes / 1e6:.2f} MB tensors: fill "
                 f"{verify.fill_mean_s * 1e3:.1f} ms, check {verify.check_mean_s * 1e3:.1f} ms on average "
                 f"(checks {', '.join(f'{c * 1e3:.0f}' for c in check)} ms)")
    return verify


# ------------------------------------------------------------------ the run's calibration

def path_uses(scenario: Scenario, placements: Mapping[str, Placement | ValueError]) -> dict[DcPair, PathUse]:
    """Every WAN path the variants' `placements` cross (those that place every stage on
    a host; Atlas's first), with the pipelines' and, where the DP all-reduce is timed
    on modelled devices, the DP rings' host pairs on it."""
    rings = scenario.workload.parallelism.dp > 1 and scenario.runner.dp_allreduce \
        and scenario.workload.gpu.mode != "real"
    return wan_uses(_hosted(placements), rings)


def lan_tensor_pair_of(hosted: Mapping[str, Placement],
                       runs: Mapping[str, RunVariant]) -> tuple[str, tuple[str, str]] | None:
    """The variant and the boundary inside a DC the LAN tensor probe times: on Atlas's
    placement first, else the first placement with one, of the variants whose tensors go
    over atlas_transport (gloo's are not bound by its loop: planning/prediction.py
    `lan_tensor_rate`)."""
    order = sorted(hosted, key=lambda name: name != "atlas")
    for name in order:
        run = runs.get(name)
        if run is not None and run.variant.comm != "atlas":
            continue
        pair = lan_boundary_pair(hosted[name])
        if pair is not None:
            return name, pair
    return None


def _hosted(placements: Mapping[str, Placement | ValueError]) -> dict[str, Placement]:
    """The placements that give every stage a host (the calibration has nothing to time
    of the others), in order."""
    return {name: pl for name, pl in placements.items() if isinstance(pl, Placement) and all(pl.hosts.values())}


def _may_take(definition: VariantDef, setting: StreamsSetting, flow_bps: float | None, nominal_bps: float | None,
               auto: int | None) -> set[int]:
    """The stream counts a variant may run with, before the calibration has timed them:
    its policy's count (`choose_streams`), and for fill-link also the configured count
    and one (`fill_link_streams` keeps the fewest of those timed near the fastest)."""
    n = choose_streams(definition, setting, flow_bps, nominal_bps, auto)
    return {n, configured_streams(setting, auto), 1} if definition.streams == "fill-link" else {n}


def together_of(scenario: Scenario, runs: Sequence[RunVariant], placements: Mapping[str, Placement | ValueError],
                cal: Calibration, auto: int | None, nominal: float | None) -> list[TogetherLoad]:
    """How each multi-stream variant of `runs` loads its paths at once (single streams
    stay window-limited, far from what loads the machine): at its stream count and, for
    Atlas's ``auto`` sharing, at the configured count it also weighs."""
    hosted = _hosted(placements)
    out = []
    for run in runs:
        definition = run.variant
        if definition.streams == "one" or definition.name not in hosted:
            continue
        sharing = requested_sharing(definition, scenario.runner.atlas_sharing)
        counts = [variant_streams(definition, scenario.transport.streams, cal, auto, nominal)]
        if sharing == "auto" and definition.streams == "fill-link":
            counts.append(configured_streams(scenario.transport.streams, auto))
        out += [TogetherLoad(definition.name, n, sharing == "temporal", hosted[definition.name]) for n in counts]
    return out


def calibrate_variants(scenario: Scenario, runs: Sequence[RunVariant], placements: Mapping[str, Placement | ValueError],
                       net: Network, out: Path, secret: str, eff: EffectiveWorkload, progress: Progress,
                       auto_candidates: Sequence[int], auto_margin: float) -> tuple[Calibration | None, int | None]:
    """The run's calibration (None when ``runner.calibrate`` is off) and, for
    ``transport.streams: auto``, the stream count it found best.

    Every WAN path the variants' `placements` (testbed/run/variants.py
    `place_variants`) cross is timed on its own, through one probe agent per host:
    tensors of the workload's wire size with a single stream and the configured count
    (or the auto candidates), then the count each variant crossing it will use, then,
    where two or more of a shared variant's pipelines cross it at once, their colliding
    aggregate; a path the DP rings cross (dp-across-dc) times those rings themselves, all
    at once. Inside the DCs, the DP ring of Atlas's placement. The first path is Atlas's
    first crossing (or, with no crossing, the path between the first and the last DC).
    Probes are clamped as the variants whose figure they give run (`probe_caps`): one
    stream and the auto candidates are timed first, unclamped (the count is chosen from
    them), so a capped variant at an auto count reads the unclamped figure, which the
    planner holds to its cap a round trip (testbed_core/planning/network.py `wan_path`)."""
    if not scenario.runner.calibrate:
        return None, None
    t0 = time.monotonic()
    par = scenario.workload.parallelism
    topo = scenario.topology
    uses = path_uses(scenario, placements)
    if not any(u.pairs for u in uses.values()):  # no pipeline crosses a WAN: probe the first and last DC
        a, z = topo.dcs[0], topo.dcs[-1]
        key = path_key(uses, a.name, z.name)
        use = uses.pop(key, PathUse(key))
        use.pairs = [(f"{a.name}-{a.hosts[0]}", f"{z.name}-{z.hosts[0]}")] if key == (a.name, z.name) \
            else [(f"{z.name}-{z.hosts[0]}", f"{a.name}-{a.hosts[0]}")]
        uses = {key: use, **uses}
    atlas_pl = _hosted(placements).get("atlas")
    lan = dp_lan_pairs(atlas_pl) if atlas_pl is not None and par.dp > 1 and scenario.runner.dp_allreduce \
        and scenario.workload.gpu.mode != "real" else []
    s = scenario.transport.streams
    counts = {1} | (set(auto_candidates) if s == "auto" else set())  # before the variants' counts are known
    folder = out / "calibration"
    nbytes = eff.wire_activation_bytes
    by_name = {r.variant.name: r for r in runs}
    hosted = _hosted(placements)

    def caps_of(names: Sequence[str], n: int, auto_capped: bool) -> dict[DcPair, int]:
        """The window caps of a probe of `n` streams whose figure serves the variants `names`."""
        return probe_caps([variant_caps(scenario, by_name[v], hosted[v], n, nbytes, net.local, auto_capped)
                           for v in names if v in by_name and v in hosted])
    agents = ProbeAgents(net, folder, secret, warm=scenario.runner.warm_start, preload=run_preload(scenario))
    progress.log(f"calibrating {len(uses)} WAN path(s): "
                 + ", ".join(f"{a}<->{z} ({', '.join(u.variants) or 'probe'})" for (a, z), u in uses.items()))
    try:
        hosts = [h for u in uses.values() for pair in [*u.pairs, *u.ring_pairs] for h in pair]
        agents.start([*hosts, *(h for pair in lan for h in pair)])  # every agent at once
        paths: list[PathCalibration] = []
        for (a, z), use in uses.items():
            first = use.pairs[0] if use.pairs else use.ring_pairs[0]
            latency = 0.0 if net.local else topo.path_delay(a, z)
            pc = PathCalibration(dcs=(a, z), src=first[0], dst=first[1], nbytes=nbytes, latency_s=latency,
                                 nominal_bps=nominal_link(topo, first), variants=use.variants)
            paths.append(pc)
            if use.pairs:  # one stream (never capped) and the auto candidates (the count is chosen from them)
                calibrate(net, scenario, folder, secret, use.pairs[:1], sorted(counts), nbytes, latency,
                          progress, pc, agents)
        cal = Calibration(src=paths[0].src, dst=paths[0].dst, nbytes=nbytes, latency_s=paths[0].latency_s,
                          paths=paths)
        cal.mirror_primary()
        auto = None
        if s == "auto":
            from atlas_transport.auto import choose

            auto = choose({n: cal.rates_bps[n] for n in auto_candidates}, auto_margin)
        nominal = nominal_link(topo, (cal.src, cal.dst))
        for pc, use in zip(paths, uses.values(), strict=True):
            # the configured count and the count each variant's policy asks for (fill-link: by
            # formula on the primary path, or the configured count, or one: plan_variant keeps,
            # of the counts measured, the fastest on the primary), each clamped as the variants
            # that may take it run it
            takes = {v: _may_take(by_name[v].variant, s, cal.rate(1), nominal, auto)
                     for v in use.channels if v in by_name}
            wanted = set().union(*takes.values()) | ({int(s)} if s != "auto" else set())
            for n in sorted(wanted - set(pc.rates_bps) if use.pairs else ()):
                calibrate(net, scenario, folder, secret, use.pairs[:1], [n], nbytes, pc.latency_s,
                          progress, pc, agents, caps_of([v for v, ns in takes.items() if n in ns], n, False))
            cal.mirror_primary()
        for pc, use in zip(paths, uses.values(), strict=True):
            collide: dict[int, int] = {}
            sharers: dict[int, list[str]] = {}  # the variants whose shared way reads each count's figures
            for name in use.channels:
                if name not in by_name:
                    continue
                definition = by_name[name].variant
                if definition.streams == "one" or \
                        requested_sharing(definition, scenario.runner.atlas_sharing) == "temporal":
                    continue
                n = variant_streams(definition, s, cal, auto, nominal)
                collide[n] = max(collide.get(n, 0), use.channels[name])
                sharers.setdefault(n, []).append(name)
            for n, k in sorted(collide.items()):
                if k > 1:
                    calibrate_link(net, scenario, folder, secret, use.pairs[:k], n, pc, progress, agents,
                                   caps_of(sharers[n], n, True))
            # a channel far below the link's rate is window-limited: the other way's data
            # queues none of its acknowledgements, both ways move the same (measured: 1 and
            # 4 streams of 1 MB windows at 50 ms on 1 Gbit/s); one near it fills the link
            near = [n for n in collide if pc.nominal_bps is None
                    or pc.rates_bps.get(n, 0.0) >= ONE_WAY_MIN_SHARE * pc.nominal_bps]
            for n in sorted(near if use.pairs else ()):
                calibrate_one_way(net, scenario, folder, secret, use.pairs[0], [n], pc, progress, agents,
                                  caps_of(sharers[n], n, True))
            for name, k in use.channels.items():  # a plan's channels taking turns (Atlas's temporal sharing)
                if name not in by_name or \
                        requested_sharing(by_name[name].variant, scenario.runner.atlas_sharing) == "shared":
                    continue
                definition = by_name[name].variant
                counts_here = set(timed_counts(definition, s, cal, auto, nominal)) | \
                    {variant_streams(definition, s, cal, auto, nominal)}
                for n in sorted(counts_here):
                    if pc.turns_for(n) is None:
                        calibrate_turns(net, scenario, folder, secret, use.pairs[:k], n, pc, progress, agents)
            ring_runs = [by_name[v] for v in use.ring_variants if v in by_name]
            if use.ring_pairs and ring_runs:
                n = variant_streams(ring_runs[0].variant, s, cal, auto, nominal)
                grad = max(grad_wire_bytes(scenario.workload, eff, r) for r in range(par.pp))
                calibrate_wan_rings(net, scenario, folder, secret, use.ring_pairs, n, grad, pc, progress, agents)
            cal.mirror_primary()
        first_use = next(iter(uses.values()))
        if scenario.runner.verify_tensors and scenario.workload.gpu.mode != "real" and first_use.pairs:
            # real devices send their own tensors: only modelled sends carry the patterns
            cal.verify = calibrate_verify(net, scenario, folder, secret, two_way(first_use.pairs),
                                          configured_streams(s, auto), nbytes, progress, agents)
        loads = together_of(scenario, runs, placements, cal, auto, nominal)
        for n, groups in together_loads(loads, uses, paths).items():
            at_n = [load for load in loads if load.streams == n]
            one = caps_of([load.variant for load in at_n], n, False)
            colliding = caps_of([load.variant for load in at_n if not load.temporal], n, True)
            for group in groups:
                calibrate_together(net, scenario, folder, secret, group, n, progress, agents, one, colliding)
        cal.mirror_primary()
        if lan:
            grad = max(grad_wire_bytes(scenario.workload, eff, r) for r in range(par.pp))
            calibrate_lan(net, scenario, folder, secret, lan, grad, cal, progress, agents)
        else:  # no DP ring inside a DC: a pipeline boundary there, if any, timed with its own tensors
            inside = lan_tensor_pair_of(hosted, by_name)
            if inside is not None:
                name, pair = inside
                calibrate_lan_tensor(net, scenario, folder, secret, pair, nbytes, cal, progress, agents)
                n = variant_streams(by_name[name].variant, s, cal, auto, nominal) if name in by_name \
                    else configured_streams(s, auto)
                boundaries = [(a, z, n if dc_of_host(a) != dc_of_host(z) else 1)
                              for a, z in boundary_pairs(hosted[name])]
                calibrate_lan_loaded(net, scenario, folder, secret, boundaries, nbytes, cal, progress, agents)
        memory = getattr(net, "memory_dir", None)
        calibrate_host_ops((memory("calibration-ops") if memory else None) or folder / "ops", cal, progress)
    finally:
        agents.close()
    cal.wall_s = time.monotonic() - t0
    progress.log(f"  calibration took {cal.wall_s:.1f} s")
    return cal, auto
