"""The job files of a variant's workers (pure: no I/O), read by
testbed/training/worker.py.

One process per (pipeline, rank) on its placed host, each with its emulated GPU
(`testbed_core.device.Device`) in the variant's run directory: modelled (durations from
the compute model), or, with ``gpu.mode: real``, real torch work
(testbed/training/real_mode.py). Every pipeline boundary is an atlas_transport
channel (1 stream for ``baseline``, N for the others; 1 inside a DC) carrying
activations forward and gradients back, of the workload's wire size. Under ``atlas``
pipelines start at their planned offsets and each WAN send waits for its token: the
previous transfer in its link's planned order has had its planned time on the wire
(plus ``runner.token_margin``); senders announce their start to the next holder over
UDP on the DC's LAN (``runner.temporal_mode: slot`` waits for the planned slot start
instead). With BubbleTea each worker also gets its planned idle slots and where to
publish its live status (bubbletea_agent/live.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from testbed.run.common import RunnerError, path_links
from testbed.run.variants import VariantSetup


def worker_id(pipeline: int, rank: int) -> str:
    return f"p{pipeline}r{rank}"


def device_name(pipeline: int, rank: int, host: str) -> str:
    return f"{host}-p{pipeline}r{rank}"


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
    from testbed_core.schedules import build_schedule

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


def add_live(jobs: dict[str, dict[str, Any]], topology: Any, run_dir: Path, lead_s: float, local: bool) -> None:
    """BubbleTea's live status for each worker (bubbletea_agent/live.py): where it goes,
    and per boundary the nominal rate of the slowest shaped link a received tensor
    crosses (the WAN links on the way, else the DC's LAN; none in local mode), which
    bounds how soon the bytes still missing can arrive. The slack covers the shaper's
    burst (1 ms at that rate, testbed/emulation/shaping.py) and a little more."""
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
