"""The job files of a variant's workers (pure: no I/O): one
`testbed_core.contracts.worker_job.TrainJob` per worker, read by
testbed/training/worker/.

One process per (pipeline, rank) on its placed host, each with its emulated GPU
(`testbed_runtime.device.Device`) in the variant's run directory: modelled (durations from
the compute model), or, with ``gpu.mode: real``, real torch work
(testbed/training/real_mode.py). Every pipeline boundary is an atlas_transport
channel (1 stream for ``baseline``, N for the others; 1 inside a DC) carrying
activations forward and gradients back, of the workload's wire size. Under ``atlas``
pipelines start at their planned offsets and each WAN send waits for its token: the
previous transfer in its link's planned order has had its planned time on the wire
(plus ``runner.token_margin``); senders announce their start to the next holder over
UDP on the DC's LAN (``runner.temporal_mode: slot`` waits for the planned slot start
instead). With BubbleTea each worker also gets its planned idle slots and where to
publish its live status (testbed_runtime/live.py). Every port comes from the run's
`PortPlan` (testbed/run/ports.py).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from testbed.run.common import RunnerError, path_links
from testbed.run.ports import PortPlan
from testbed.run.variants import VariantSetup
from testbed_core.contracts.calibration import dc_of_host
from testbed_core.contracts.worker_job import (
    ChannelJob,
    DeviceJob,
    DpPeerJob,
    DpSyncJob,
    GlooJob,
    LiveJob,
    PlannedSend,
    RealJob,
    TemporalJob,
    TokenBusJob,
    TrainJob,
    TransportJob,
)
from testbed_core.planning.host_cpu import compute_only
from testbed_core.planning.wan_paths import grad_wire_bytes

if TYPE_CHECKING:
    from testbed_core.planning.temporal import TemporalPlan
    from testbed_core.schedules import Schedule
    from testbed_core.simulate import TransferKey
    from testbed_core.topology import Topology
    from testbed_core.workload import EffectiveWorkload, Workload

LIVE_POLL_S = 0.002  # how often a worker waiting for a tensor refreshes its live status
SHAPER_BURST_S = 1e-3  # the shaper's burst at its rate (testbed/emulation/shaping.py)
LIVE_SLACK_EXTRA_BYTES = 32 << 10  # ... and a little more


def worker_id(pipeline: int, rank: int) -> str:
    """A worker's name: its job file, log, transfer records and control messages use it."""
    return f"p{pipeline}r{rank}"


def device_name(pipeline: int, rank: int, host: str) -> str:
    """The name of a worker's emulated GPU (its timeline, BubbleTea's slot feed and live status)."""
    return f"{host}-p{pipeline}r{rank}"


def device_parts(device: str) -> tuple[str, int, int]:
    """(host, pipeline, rank) of a name `device_name` made; ValueError for any other."""
    m = re.fullmatch(r"(.+)-p(\d+)r(\d+)", device)
    if m is None:
        raise ValueError(f"{device!r} is not a worker's device name (<host>-p<pipeline>r<rank>)")
    return m.group(1), int(m.group(2)), int(m.group(3))


def build_jobs(
    *,
    setup: VariantSetup,
    workload: Workload,
    topology: Topology,
    host_ips: Mapping[str, str],
    run_dir: Path,
    control: str,
    ports: PortPlan,
    iterations: int,
    transport: TransportJob,
    local: bool = False,
    setup_timeout_s: float = 60.0,
    timeout_s: float = 120.0,
    temporal_mode: str = "token",
    token_timeout_s: float = 10.0,
    iteration_lead_s: float = 0.05,
    dp_allreduce: bool = True,
    dp_bucket_bytes: int = 25 << 20,
    variant_folder: Path | None = None,
) -> dict[str, TrainJob]:
    """The job of every worker of a variant, by worker name (pure: no I/O). Channel
    ports are the `ports.channels` range over the (pipeline, boundary) channels, so no
    two collide. With dp > 1 the workers all-reduce their gradients after each
    iteration (`dp_allreduce`; always with real devices, whose replicas must agree).
    `run_dir`: where the step files go while the variant plays (in memory when it can,
    testbed/run/runner.py); `variant_folder`: its results folder, where real devices'
    parameters are saved (default: `run_dir`'s parent)."""
    from testbed_core.schedules import build_schedule

    par = workload.parallelism
    # the workers hold their devices for the compute alone: they fill and check their tensors themselves
    eff = compute_only(setup.prediction.effective or workload.effective(), setup.host_cost)
    sched = build_schedule(par.schedule, par.pp, par.num_micro_batches, par.chunks)
    pl = setup.placement
    plan = setup.prediction.plan
    hosts = {worker_id(d, r): pl.hosts[(d, r)][0] for d in range(par.dp) for r in range(par.pp)}
    devices = {worker_id(d, r): device_name(d, r, pl.hosts[(d, r)][0]) for d in range(par.dp) for r in range(par.pp)}
    channels = boundary_channels(setup, workload, topology, sched, hosts, host_ips, ports)
    real: dict[str, RealJob] = {}
    torch_device = None
    if workload.gpu.mode == "real":
        torch_device = real_device(workload)
        real = add_real_jobs(workload, Path(variant_folder or Path(run_dir).parent), torch_device)
    dp = (dp_sync_jobs(setup, workload, eff, topology, hosts, host_ips, ports, dp_bucket_bytes)
          if par.dp > 1 and (dp_allreduce or real) else {})
    gloo = gloo_jobs(workload, channels, hosts, host_ips, ports) if setup.run.variant.comm == "gloo" else {}
    temporal = ({} if plan is None else
                temporal_jobs(plan, sched, hosts, host_ips, ports, temporal_mode, token_timeout_s))
    live = live_jobs(channels, hosts, devices, topology, run_dir, iteration_lead_s, local) if setup.run.bubbletea else {}
    jobs: dict[str, TrainJob] = {}
    for d in range(par.dp):
        for r in range(par.pp):
            wid = worker_id(d, r)
            host, dev = hosts[wid], devices[wid]
            slots: list[tuple[float, float]] = []
            if setup.run.bubbletea:
                slots = [(s, e) for s, e in setup.prediction.sim.idle_slots(d, r, min_s=1e-3)]
            jobs[wid] = TrainJob(
                role="train", worker=wid, pipeline=d, rank=r, host=host,
                bind_ip="0.0.0.0" if not local else "127.0.0.1",
                schedule=par.schedule, pp=par.pp, microbatches=par.num_micro_batches, chunks=par.chunks,
                forward_s=list(eff.stage_forward_s), backward_s=list(eff.stage_backward_s),
                wire_bytes=int(eff.wire_activation_bytes), iterations=iterations,
                offset_s=float(plan.offsets[d]) if plan is not None else 0.0,
                channels=channels[wid], transport=transport, temporal=temporal.get(wid),
                device=DeviceJob(name=dev, run_dir=str(run_dir), mode=workload.gpu.mode,
                                 time_scale=1.0, torch_device=torch_device),
                control=control, transfers_path=str(run_dir / "transfers" / f"{wid}.jsonl"),
                setup_timeout_s=setup_timeout_s, timeout_s=timeout_s,
                slots_path=str(run_dir / "slots" / f"{dev}.jsonl") if setup.run.bubbletea else None,
                idle_slots=slots, live=live.get(wid), real=real.get(wid), dp=dp.get(wid),
                gloo=gloo.get(wid),
            )
    return jobs


def boundary_channels(setup: VariantSetup, workload: Workload, topology: Topology, sched: Schedule, hosts: Mapping[str, str],
                      host_ips: Mapping[str, str], ports: PortPlan) -> dict[str, list[ChannelJob]]:
    """Both ends of every (pipeline, boundary) channel, by worker: the upstream worker
    connects, the downstream one listens; WAN channels get the variant's streams."""
    par = workload.parallelism
    pl = setup.placement
    out: dict[str, list[ChannelJob]] = {w: [] for w in hosts}
    k = 0
    for d in range(par.dp):
        for b in range(sched.stages - 1):
            up, down = sched.rank_of(b), sched.rank_of(b + 1)
            if up == down:
                raise RunnerError(f"boundary {b} joins two stages of the same rank {up}: "
                                  "the runner needs pp >= 2 for every boundary to be a channel")
            uw, dw = worker_id(d, up), worker_id(d, down)
            fwd_links, delay = path_links(topology, pl.dc_of(d, up), pl.dc_of(d, down))
            bwd_links, _ = path_links(topology, pl.dc_of(d, down), pl.dc_of(d, up))
            streams = setup.streams if fwd_links else 1
            port = ports.channels.port(k)
            k += 1
            a, z = pl.dc_of(d, up), pl.dc_of(d, down)  # each end clamps the window of what it receives
            out[uw].append(ChannelJob(boundary=b, role="connect", peer=dw, peer_ip=host_ips[hosts[dw]], port=port,
                                      streams=streams, links=list(fwd_links), recv_links=list(bwd_links),
                                      latency_s=delay, window_clamp=setup.window_caps.get((z, a))))
            out[dw].append(ChannelJob(boundary=b, role="listen", peer=uw, peer_ip=host_ips[hosts[uw]], port=port,
                                      streams=streams, links=list(bwd_links), recv_links=list(fwd_links),
                                      latency_s=delay, window_clamp=setup.window_caps.get((a, z))))
    return out


def gloo_jobs(workload: Workload, channels: Mapping[str, list[ChannelJob]], hosts: Mapping[str, str],
              host_ips: Mapping[str, str], ports: PortPlan) -> dict[str, GlooJob]:
    """torch-gloo (pure): every worker's rank in one process group (pipeline x pp + rank;
    the store on rank 0's host, on the run's store port), the rank across each of its
    boundaries, and each stage's DP group."""
    par = workload.parallelism

    def rank_of(wid: str) -> int:
        d, r = wid[1:].split("r")
        return int(d) * par.pp + int(r)

    groups = [[d * par.pp + r for d in range(par.dp)] for r in range(par.pp)]
    store = host_ips[hosts[worker_id(0, 0)]]
    return {
        wid: GlooJob(store_ip=store, port=ports.store.port(0), rank=rank_of(wid), own_ip=host_ips[hosts[wid]],
                     world_size=par.dp * par.pp, peers={c.boundary: rank_of(c.peer) for c in chans},
                     dp_groups=groups, dp_group=rank_of(wid) % par.pp)
        for wid, chans in channels.items()
    }


def real_device(workload: Workload) -> str:
    """The torch device of a real-mode run here; RunnerError when it cannot run here."""
    from testbed.run.real_check import RealModeError, resolve_device

    try:
        return resolve_device(workload)
    except RealModeError as exc:
        raise RunnerError(str(exc)) from None


def add_real_jobs(workload: Workload, variant_folder: Path, torch_device: str) -> dict[str, RealJob]:
    """Real devices (``workload.gpu.mode: real``): each worker trains its stages for
    real (testbed/training/real_mode.py), saving its parameters in `variant_folder`."""
    from testbed.training.real_mode import real_jobs

    return real_jobs(workload=workload, variant_folder=variant_folder, torch_device=torch_device,
                     worker_id=worker_id)


def dp_sync_jobs(setup: VariantSetup, workload: Workload, eff: EffectiveWorkload, topology: Topology, hosts: Mapping[str, str],
                 host_ips: Mapping[str, str], ports: PortPlan, bucket_bytes: int) -> dict[str, DpSyncJob]:
    """The DP gradient all-reduce of every worker (pure): one channel per pair of
    replicas of a rank (the lower DP rank listens; the k-th pair on the k-th port of
    `ports.dp_gradients`; the variant's streams when it crosses a WAN, 1 inside a DC)."""
    par = workload.parallelism
    pl = setup.placement
    peers: dict[str, list[DpPeerJob]] = {worker_id(d, r): [] for d in range(par.dp) for r in range(par.pp)}
    k = 0
    for r in range(par.pp):
        for d in range(par.dp):
            for e in range(d + 1, par.dp):
                lo, hi = worker_id(d, r), worker_id(e, r)
                links, _ = path_links(topology, pl.dc_of(d, r), pl.dc_of(e, r))
                port = ports.dp_gradients.port(k)
                k += 1
                n = setup.streams if links else 1
                peers[lo].append(DpPeerJob(dp_rank=e, peer=hi, peer_ip=host_ips[hosts[hi]], port=port, role="listen",
                                           streams=n))
                peers[hi].append(DpPeerJob(dp_rank=d, peer=lo, peer_ip=host_ips[hosts[lo]], port=port, role="connect",
                                           streams=n))
    return {
        worker_id(d, r): DpSyncJob(dp_rank=d, dp=par.dp, peers=peers[worker_id(d, r)],
                                   grad_bytes=grad_wire_bytes(workload, eff, r), bucket_bytes=bucket_bytes)
        for d in range(par.dp) for r in range(par.pp)
    }


def live_jobs(channels: Mapping[str, list[ChannelJob]], hosts: Mapping[str, str], devices: Mapping[str, str],
              topology: Topology, run_dir: Path, lead_s: float, local: bool) -> dict[str, LiveJob]:
    """BubbleTea's live status for each worker (testbed_runtime/live.py): where it goes,
    and per boundary the nominal rate of the slowest shaped link a received tensor
    crosses (the WAN links on the way, else the DC's LAN; none in local mode), which
    bounds how soon the bytes still missing can arrive. The slack covers the shaper's
    burst and a little more."""
    from testbed_runtime.live import status_path, wake_path

    lan = {dc.name: dc.lan_rate for dc in topology.dcs}
    out = {}
    for wid, chans in channels.items():
        rates = {}
        for c in chans:
            links = [topology.link(*d.split("->")).rate for d in c.recv_links]
            rates[c.boundary] = 0.0 if local else min(links) if links else lan[dc_of_host(hosts[wid])]
        slowest = max(rates.values(), default=0.0)
        name = devices[wid]
        out[wid] = LiveJob(status_path=str(status_path(run_dir, name)), wake_path=str(wake_path(run_dir, name)),
                           lead_s=lead_s, recv_rate_bps=rates, poll_s=LIVE_POLL_S,
                           slack_bytes=int(slowest * SHAPER_BURST_S / 8) + LIVE_SLACK_EXTRA_BYTES)
    return out


def temporal_jobs(plan: TemporalPlan, sched: Schedule, hosts: Mapping[str, str], host_ips: Mapping[str, str], ports: PortPlan,
                  mode: str, token_timeout_s: float) -> dict[str, TemporalJob]:
    """Hand the temporal plan to the senders: for each WAN send its slot, its place in
    each link's token order, how long it holds the link (its planned time on the wire)
    and who holds the next token; and, in token mode, to each sender the token-bus
    addresses of the others (token ports: the `ports.tokens` range, by worker name)."""

    def sender(key: TransferKey) -> str:
        rank = sched.rank_of(key.boundary) if key.direction == "fwd" else sched.rank_of(key.boundary + 1)
        return worker_id(key.pipeline, rank)

    tokens: dict[TransferKey, list[tuple[str, int]]] = {}
    nexts: dict[TransferKey, list[tuple[str, int, str]]] = {}
    for res, keys in plan.order.items():
        link = res.removeprefix("wan:")
        for i, key in enumerate(keys):
            tokens.setdefault(key, []).append((link, i))
            if i + 1 < len(keys):
                nexts.setdefault(key, []).append((link, i + 1, sender(keys[i + 1])))
    sends: dict[str, list[PlannedSend]] = {}
    for key, (start, end) in plan.slots.items():
        sends.setdefault(sender(key), []).append(PlannedSend(
            direction=key.direction, boundary=key.boundary, mb=key.mb, start_s=float(start),
            duration_s=float(end - start), tokens=tokens.get(key, []), next=nexts.get(key, []),
        ))
    token_ports = {w: ports.tokens.port(i) for i, w in enumerate(sorted(hosts))}
    peers = {w: (host_ips[hosts[w]], token_ports[w]) for w in sorted(sends)}
    return {
        w: TemporalJob(
            mode=mode, token_timeout_s=token_timeout_s,
            sends=sorted(ws, key=lambda p: p.start_s),
            token_bus=TokenBusJob(port=token_ports[w], peers=peers) if mode == "token" else None,
        )
        for w, ws in sends.items()
    }
