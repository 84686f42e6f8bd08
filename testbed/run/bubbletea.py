"""The BubbleTea side of `testbed run`: decode servers, one agent per worker device,
and the variant's BubbleTea metrics.

A variant ``<name>+bubbletea`` (``bubbletea.enabled``, for the variants in
``bubbletea.variants``) makes each worker publish its planned idle slots
(testbed_runtime/slots.py) to ``<variant>/run/slots/<device>.jsonl`` and its live
guarantee (testbed_runtime/live.py: until when training surely leaves the device alone)
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
import functools
import json
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, ValidationError

from testbed.process import Process, ProcessError, start
from testbed.run.common import REPO_ROOT, RunnerError, path_links, run_preload
from testbed.run.network import Network
from testbed.run.ports import PortPlan
from testbed.run.scenario import Scenario
from testbed_core.contracts.bubbletea import (
    DECODE_SAME_DC,
    AgentDevice,
    AgentJob,
    AgentSummaryRead,
    ControllerAddress,
    KVDestination,
    LivePaths,
    PrefillModelSpec,
)
from testbed_core.contracts.calibration import dc_of_host
from testbed_core.contracts.prefill_service import ControllerJob, ControllerSummaryRead
from testbed_core.contracts.summary import (
    AgentCounters,
    BubbleTeaMetrics,
    GuardOverruns,
    IterationStall,
    KVChecks,
    LeaseOverrun,
    PrefillRequests,
    PrefillService,
    TrainingWait,
    Ttft,
)
from testbed_core.contracts.worker_job import TrainJob

if TYPE_CHECKING:
    from testbed_core.device_records import WorkRecord
    from testbed_core.topology import Topology
    from testbed_core.workload import Workload

DECODE_STREAMS = 1  # KV caches cross at kv_wire_scale of their size: one stream carries them
# CPU priorities: an agent's prefill ends when it wakes from a sleep, so it must wake on
# time however busy the cores are (it uses little CPU); decode servers only move KV caches.
AGENT_NICE = -10
DECODE_NICE = 10
# the controller answers every agent's sync and every client: on a busy machine it must not
# wait behind the emulator's bulk work (a stale status makes it dispatch blind)
CONTROLLER_NICE = -5
# an agent's device holds run at SCHED_FIFO 1: their ends must not wait for a core, even in an
# idle cgroup (runner.bubbletea_cpu_idle: idle concerns the normal class only)
AGENT_REALTIME_HOLDS = True
CONTROLLER_PORT_INDEX = 63  # the controller's port: this one of the decode range (decode servers count from 0)


@dataclass(frozen=True)
class Endpoint:
    """A BubbleTea server the agents reach: a decode server or the controller, on the
    emulated host `host` at address `ip`, port `port`."""

    host: str
    ip: str
    port: int


def agent_command(agent_job_path: Path) -> list[str]:
    """How a BubbleTea agent is started next to a worker (on the worker's host): with
    its job file (an AgentJob: the shared device, the slot feed the worker writes, the
    scenario's bubbletea settings)."""
    return [sys.executable, "-m", "bubbletea_agent", str(agent_job_path)]


def decode_hosts(scenario: Scenario, jobs: Mapping[str, TrainJob]) -> dict[str, str | None]:
    """Where each worker's agent ships its KV caches (worker -> decode host, None: no
    shipping). 'same-dc': one decode server per DC, on the DC's last host, so caches
    cross the DC's LAN only; a host name: that host for every agent."""
    host = scenario.bubbletea.decode_host
    if host is None:
        return {w: None for w in jobs}
    if host != DECODE_SAME_DC:
        return {w: host for w in jobs}
    last = {dc.name: f"{dc.name}-{dc.hosts[-1]}" for dc in scenario.topology.dcs}
    return {w: last[dc_of_host(j.host)] for w, j in jobs.items()}


def kv_path(topology: Topology, src: str, dst: str, local: bool) -> tuple[float, bool]:
    """(nominal rate of the path from host src to host dst in bits/s, crosses a WAN)."""
    a, b = dc_of_host(src), dc_of_host(dst)
    if a == b:
        return topology.dc(a).lan_rate, False
    links, _ = path_links(topology, a, b)
    rate = min(topology.link(*d.split("->")).rate for d in links)
    return rate, not local


def kv_wire_scale(scenario: Scenario, workload: Workload) -> float:
    """Share of each KV cache's true size that crosses the emulated network: the workload's
    `scale` (the ratio every tensor of the run has on the wire), at most
    bubbletea.kv_wire_scale for modelled caches: whole Llama-3-8B caches (64 MiB for 512
    tokens, tens per second) are more than 2 cores move beside the training, so a modelled
    run ships that share and charges the rest at the path's rate. Real devices ship whole
    caches (real mode has scale 1): the decode host checks and decodes every byte."""
    if workload.gpu.mode == "real":
        return float(workload.scale)
    return min(float(workload.scale), scenario.bubbletea.kv_wire_scale)


def decode_check_args(scenario: Scenario, workload: Workload, jobs: Mapping[str, TrainJob]) -> list[str]:
    """Real devices: the decode server holds the agents' prefill model (the scenario's, or
    the tiny preset the agents pick on a real device) on the same kind of torch device
    (the same random weights) and checks one decode step from every cache against the
    same model run in one process (bubbletea_agent/decode_check.py). Modelled: nothing."""
    if workload.gpu.mode != "real":
        return []
    model = scenario.bubbletea.model or PrefillModelSpec(preset="tiny")
    kinds = {j.device.torch_device for j in jobs.values()} - {None}
    return ["--check-model", model.model_dump_json(exclude_none=True),
            "--check-device", kinds.pop() if len(kinds) == 1 else "auto"]


def build_agent_jobs(jobs: Mapping[str, TrainJob], folder: Path, scenario: Scenario, workload: Workload,
                     base_dir: str | None, decode: Mapping[str, Endpoint | None], iterations: int,
                     local: bool = False, duration_s: float = 600.0,
                     controller: Endpoint | None = None) -> dict[str, AgentJob]:
    """The job of the BubbleTea agent next to each worker (testbed_core/contracts/bubbletea.py):
    the worker's device, slot feed and live status, the scenario's bubbletea section,
    this agent's share of the cluster's request rate, what a prefill costs on the
    workload's GPU, the run's iterations (requests stop arriving at the last one), and
    where KV caches go: `decode[worker]` (an `Endpoint` or None), with the rest of a
    scaled-down cache charged at the path's nominal rate, and shipping across a WAN paced
    to this agent's share of bubbletea.kv_wan_rate; with `controller` (the dispatch
    controller's `Endpoint`) the agent syncs with it and takes its work from it. Pure: no I/O."""
    bt = scenario.bubbletea
    wan_shippers = [w for w, d in decode.items()
                    if d is not None and kv_path(scenario.topology, jobs[w].host, d.host, local)[1]]
    out = {}
    for k, (wid, job) in enumerate(sorted(jobs.items())):
        dest = decode.get(wid)
        ship = None
        if dest is not None:
            rate, wan = kv_path(scenario.topology, job.host, dest.host, local)
            paced = bt.kv_wan_rate / len(wan_shippers) if wan and bt.kv_wan_rate is not None else None
            ship = KVDestination(host=dest.ip, port=dest.port, streams=DECODE_STREAMS, rest_rate_bps=rate,
                                 max_rate_bps=paced)
        live, device = job.live, job.device
        out[wid] = AgentJob(
            device=AgentDevice(name=device.name, run_dir=device.run_dir, mode=device.mode,
                               time_scale=device.time_scale, torch_device=device.torch_device),
            slots_path=job.slots_path, worker=wid, host=job.host, bubbletea=bt, seed=scenario.seed,
            out=folder / "agents" / f"{wid}.json",
            agent_index=k, agent_count=len(jobs), iterations=iterations, duration_s=duration_s,
            gpu=workload.gpu, tp=workload.parallelism.tp, base_dir=base_dir,
            wire_scale=kv_wire_scale(scenario, workload), decode=ship, nice=AGENT_NICE, realtime_holds=AGENT_REALTIME_HOLDS,
            live=None if live is None else LivePaths(status=live.status_path, wake=live.wake_path,
                                                     gate=Path(live.status_path).parent / "gate.status"),
            controller=None if controller is None else ControllerAddress(
                host=controller.ip, port=controller.port, name=wid,
                decode_host=None if dest is None else dest.host),
        )
    return out


def start_agents(net: Network, jobs: Mapping[str, TrainJob], folder: Path, scenario: Scenario,
                 workload: Workload, base_dir: str | None, iterations: int, env: dict[str, str],
                 logs: dict[str, Path], duration_s: float = 600.0,
                 dispatch: str | None = None) -> tuple[dict[str, Process], dict[str, Process]]:
    """The decode servers (bubbletea.decode_host, ports from the run's PortPlan), then one
    BubbleTea agent per worker device on the worker's host (`agent_command`), each
    started with a readiness pipe (testbed.process). Returns (agents, decode servers);
    `wait_ready` waits for both. `dispatch` (a dispatch twin's mode; None: the scenario's
    bubbletea.dispatch) 'controller' also starts the cluster's prefill controller
    (`start_controller`, returned among the servers: it stops after the agents)."""
    if dispatch is not None:
        scenario = scenario.model_copy(update={"bubbletea": scenario.bubbletea.model_copy(
            update={"dispatch": dispatch})})
    (folder / "agents").mkdir(parents=True, exist_ok=True)
    servers: dict[str, Process] = {}
    where = decode_hosts(scenario, jobs)
    addresses: dict[str, Endpoint] = {}
    ports = PortPlan(scenario.runner.base_port).decode
    for k, host in enumerate(sorted({h for h in where.values() if h is not None})):
        port = ports.port(k)
        name = f"decode-{host}"
        logs[name] = folder / "logs" / f"{name}.log"
        # every interface of its host (as the workers' channels; in local mode the loopback): the
        # KV streams authenticate with the run's secret (ATLAS_SECRET in `env`)
        argv = ["nice", "-n", str(DECODE_NICE), sys.executable, "-m", "bubbletea_agent", "decode-server",
                "--host", "127.0.0.1" if net.local else "0.0.0.0", "--port", str(port),
                "--streams", str(DECODE_STREAMS), "--log", str(folder / "agents" / f"decode-{host}.jsonl")]
        argv += decode_check_args(scenario, workload, jobs)
        servers[name] = start(argv, popen=popen_of(net, host, scenario), env=env, log_path=logs[name], name=name,
                              cwd=str(REPO_ROOT))
        addresses[host] = Endpoint(host=host, ip=net.host(host).ip, port=port)
    decode = {w: None if h is None else addresses[h] for w, h in where.items()}
    controller = None
    if scenario.bubbletea.dispatch == "controller":
        controller = start_controller(net, jobs, folder, scenario, base_dir, sorted(addresses), env, logs,
                                      duration_s, servers)
    procs = {}
    agent_jobs = build_agent_jobs(jobs, folder, scenario, workload, base_dir, decode, iterations, net.local,
                                  duration_s, controller)
    for wid, agent_job in agent_jobs.items():
        path = folder / "jobs" / f"agent-{wid}.json"
        path.write_text(agent_job.model_dump_json(indent=1))
        name = f"agent-{wid}"
        logs[name] = folder / "logs" / f"{name}.log"
        procs[name] = start(agent_command(path), popen=popen_of(net, jobs[wid].host, scenario), env=env,
                            log_path=logs[name], name=f"BubbleTea {name}", cwd=str(REPO_ROOT))
    return procs, servers


def popen_of(net: Network, host: str, scenario: Scenario) -> Callable[..., Any]:
    """How a BubbleTea process starts on `host`: warm (forked from the run's fork server
    that imported torch, testbed/emulation/warmstart.py) unless ``runner.warm_start`` is off."""
    node = net.host(host)
    if not scenario.runner.warm_start:
        return node.popen
    return functools.partial(node.popen_warm, preload=run_preload(scenario))


def controller_host(scenario: Scenario) -> str:
    """Where the controller runs: bubbletea.controller_host, else the first DC's first host."""
    if scenario.bubbletea.controller_host:
        return scenario.bubbletea.controller_host
    dc = scenario.topology.dcs[0]
    return f"{dc.name}-{dc.hosts[0]}"


def controller_job(jobs: Mapping[str, TrainJob], folder: Path, scenario: Scenario, base_dir: str | None,
                   decode_hosts: Sequence[str], port: int, duration_s: float, bind: str) -> ControllerJob:
    """The controller's job: the scenario's bubbletea section (its request source), the
    agents that will sync (by worker name), the decode hosts a client may name, and the
    address it listens on (`bind`: its host's address in the run, `controller_bind`). Pure."""
    return ControllerJob(bubbletea=scenario.bubbletea, seed=scenario.seed, host=bind, port=port,
                         out=folder / "controller", agents=sorted(jobs), decode_hosts=list(decode_hosts),
                         base_dir=None if base_dir is None else Path(base_dir), duration_s=duration_s)


def start_controller(net: Network, jobs: Mapping[str, TrainJob], folder: Path, scenario: Scenario, base_dir: str | None,
                     decode_hosts: Sequence[str], env: dict[str, str], logs: dict[str, Path], duration_s: float,
                     servers: dict[str, Process]) -> Endpoint:
    """Start the cluster's prefill controller (bubbletea_agent/controller/) on
    `controller_host`, with a readiness pipe; adds it to `servers`; returns where it listens.
    It listens on its host's address in the run only (`controller_bind` says otherwise)
    and answers only requests with the run's tokens (from ATLAS_SECRET in `env`)."""
    host = controller_host(scenario)
    port = PortPlan(scenario.runner.base_port).decode.port(CONTROLLER_PORT_INDEX)
    ip = net.host(host).ip
    job = controller_job(jobs, folder, scenario, base_dir, decode_hosts, port, duration_s,
                         controller_bind(scenario, ip))
    path = folder / "jobs" / "controller.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(job.model_dump_json(indent=1))
    logs["controller"] = folder / "logs" / "controller.log"
    servers["controller"] = start(["nice", "-n", str(CONTROLLER_NICE), sys.executable, "-m", "bubbletea_agent",
                                   "controller", str(path)],
                                  popen=popen_of(net, host, scenario), env=env, log_path=logs["controller"],
                                  name="BubbleTea controller", cwd=str(REPO_ROOT))
    return Endpoint(host=host, ip=net.host(host).ip, port=port)


def controller_bind(scenario: Scenario, host_ip: str) -> str:
    """The address the controller listens on: bubbletea.controller_bind, else its host's
    address in the run (`host_ip`), where the agents reach it, and no other interface."""
    return scenario.bubbletea.controller_bind or host_ip


def uses_controller(scenario: Scenario) -> bool:
    """Whether a variant of the run dispatches through the prefill controller."""
    bt = scenario.bubbletea
    return bt.enabled and (bt.dispatch == "controller" or "controller" in bt.compare_dispatch)


def write_client_token(out: Path, secret: str) -> Path:
    """The controller's client token (bubbletea_agent/controller/auth.py) in the run's
    output folder, readable by the run's user only: a load generator of the user's own
    reads it there (`auth.read_token_file`) to submit prefill requests."""
    from bubbletea_agent.controller.auth import TOKEN_FILE, client_token, write_token_file

    return write_token_file(out / TOKEN_FILE, client_token(secret))


def wait_ready(procs: Mapping[str, Process], timeout_s: float) -> None:
    """Wait until every process (agents: built, about to loop; decode servers:
    listening) announced readiness, so that training does not start while agents still
    load and the first KV caches find their server. One that exits first, or is not
    ready within `timeout_s` in all, is a RunnerError naming it with the tail of its log."""
    deadline = time.monotonic() + timeout_s
    for name, p in procs.items():
        try:
            p.wait_ready(max(0.1, deadline - time.monotonic()))
        except ProcessError as exc:
            raise RunnerError(f"BubbleTea {name} did not start: {exc}") from None


def bubbletea_metrics(folder: Path, timelines: Mapping[str, Sequence[WorkRecord]],
                      windows: Sequence[tuple[float, float]], plain_iteration_s: float | None,
                      iteration_s: float) -> BubbleTeaMetrics:
    """Prefill requests, TTFT and guard violations of a +bubbletea variant (from the
    agents' request records and the device timelines), and the training slowdown
    against the same variant without agents. Each agent's summary file is read once."""
    from bubbletea_agent.metrics import (
        guard_violations,
        read_request_rows,
        request_summary,
        training_slowdown,
    )

    rows = []
    for path in sorted((folder / "agents").glob("*.requests.jsonl")):
        rows += read_request_rows(path)
    agent_rows = rows  # the KV caches' checks are the agents' (they ship them)
    ctl_rows = folder / "controller" / "requests.jsonl"
    if ctl_rows.exists():
        rows = read_request_rows(ctl_rows)  # with a controller its ledger is the one: TTFT from arrival there
    req = request_summary(rows)
    requests = PrefillRequests.model_validate(req["prefill_requests"])
    count, waited, count_all = 0, 0.0, 0
    for recs in timelines.values():
        inside = [r for r in recs if any(t0 <= r.start < t1 for t0, t1 in windows)]
        c, w = guard_violations(inside)
        count, waited = count + c, waited + w
        count_all += guard_violations(recs)[0]
    summaries = agent_summaries(folder)
    agents = AgentCounters(
        engine_mode=sorted({a.engine_mode for a in summaries if a.engine_mode is not None}),
        **{key: sum(getattr(a.counters, key) for a in summaries)
           for key in ("not_arrived", "chunks_run", "late_starts", "device_busy_retries")})
    ttft = Ttft(p50=req["ttft_p50_s"], p95=req["ttft_p95_s"], p99=req["ttft_p99_s"], mean=req["ttft_mean_s"])
    return BubbleTeaMetrics(
        guard_overruns=guard_overruns(folder, timelines, windows),
        stalls=iteration_stalls(folder, timelines, windows),
        prefill_requests=requests,
        ttft_s=ttft,
        prefill_tokens_served=req["prefill_tokens_served"],
        guard_violations=count,
        guard_violations_all_iterations=count_all,
        training_wait_on_prefill_s=waited,
        training_slowdown=training_slowdown(iteration_s, plain_iteration_s),
        compared_with_iteration_time_s=plain_iteration_s,
        bubbletea_agents=agents,
        kv_checks=kv_checks(agent_rows),
        prefill_service=prefill_service(folder, requests, ttft, agents.not_arrived, summaries),
    )


LEASE_GUARD_S = 0.005  # bubbletea_agent/agent.py Agent.lease_guard_s: the guard of every hold's lease


def _request_of(label: str) -> str:
    return label.split(":", 1)[0]


def _iteration_of(t: float, windows: Sequence[tuple[float, float]]) -> int | None:
    for k, (t0, t1) in enumerate(windows):
        if t0 <= t < t1:
            return k
    return None


def _waits(timelines: Mapping[str, Sequence[WorkRecord]], windows: Sequence[tuple[float, float]]) -> list[TrainingWait]:
    """Every wait of training on a prefill inside the measured iterations."""
    from bubbletea_agent.metrics import training_waits

    out = []
    for device, recs in timelines.items():
        for p, t, waited in training_waits(list(recs)):
            k = _iteration_of(t.requested, windows)
            if k is None:
                continue
            out.append(TrainingWait(device=device, request=_request_of(p.label), label=p.label,
                                    training=getattr(t, "label", ""), iteration=k, waited_s=waited,
                                    held_s=p.end - p.start, revoked=bool(getattr(t, "revoked_lease", ""))))
    return sorted(out, key=lambda w: -w.waited_s)


def lease_events(folder: Path) -> list[LeaseOverrun]:
    """The lease events of the variant's devices (testbed_runtime/device.py), longest first."""
    from testbed_core.device_records import LeaseEvent

    out = []
    for path in sorted((folder / "run" / "devices").glob("*.overruns.jsonl")):
        for line in path.read_text().splitlines():
            with contextlib.suppress(json.JSONDecodeError, TypeError):
                e = LeaseEvent.from_json(json.loads(line))
                out.append(LeaseOverrun(device=e.device, request=_request_of(e.label), label=e.label,
                                        event="revoked" if e.event == "revoked" else "overrun",
                                        overrun_s=e.overrun_s, guard_s=e.guard_s, cause=e.cause))
    return sorted(out, key=lambda e: -e.overrun_s)


def guard_overruns(folder: Path, timelines: Mapping[str, Sequence[WorkRecord]],
                   windows: Sequence[tuple[float, float]]) -> GuardOverruns:
    """How far prefills went past their slots: training's longest waits on them (device
    timelines, measured iterations) and every lease revoked or overrun."""
    waits = _waits(timelines, windows)
    events = lease_events(folder)
    return GuardOverruns(
        guard_s=LEASE_GUARD_S, worst_training_wait_s=waits[0].waited_s if waits else 0.0, worst=waits[:10],
        lease_revocations=sum(1 for e in events if e.event == "revoked"), lease_overruns=events[:50],
        worst_lease_overrun_s=max((e.overrun_s for e in events), default=0.0))


class _Send(BaseModel):
    """What `iteration_stalls` reads of a worker's send record (transfers/<worker>.jsonl,
    testbed/training/transport_comm.py); the record's other keys are ignored."""

    model_config = ConfigDict(extra="ignore")

    iteration: int
    links: list[str] | None = None  # WAN link directions crossed (none or empty: inside a DC)
    posted: float | None = None
    confirmed: float | None = None
    token_timeout: bool = False  # waited for Atlas's link token until its timeout

    @property
    def span(self) -> float | None:
        """From posted to confirmed (None: either missing)."""
        return None if self.posted is None or self.confirmed is None else self.confirmed - self.posted


def _wan_transfers(folder: Path) -> dict[int, list[_Send]]:
    """The workers' send records by iteration (transfers/<worker>.jsonl): WAN ones only
    where the record says which links it crossed."""
    from testbed.training.transport_comm import read_transfer_logs

    sends, _ = read_transfer_logs(sorted((folder / "run" / "transfers").glob("*.jsonl")))
    out: dict[int, list[_Send]] = {}
    for r in sends:
        if "iteration" in r:
            rec = _Send.model_validate(r)
            out.setdefault(rec.iteration, []).append(rec)
    return out


def _training_overrun(timelines: Mapping[str, Sequence[WorkRecord]],
                      window: tuple[float, float]) -> tuple[float, str] | None:
    """The longest overrun of a training piece (not a prefill) that started in `window`:
    (seconds, "<device> <label>"), or None when none ran past its modelled time."""
    from bubbletea_agent.metrics import is_prefill

    worst: tuple[float, str] | None = None
    for device, recs in timelines.items():
        for r in recs:
            if r.overrun_s > 0 and window[0] <= r.start < window[1] and not is_prefill(r) \
                    and (worst is None or r.overrun_s > worst[0]):
                worst = (r.overrun_s, f"{device} {r.label}")
    return worst


def iteration_stalls(folder: Path, timelines: Mapping[str, Sequence[WorkRecord]],
                     windows: Sequence[tuple[float, float]], threshold: float = 1.05) -> list[IterationStall]:
    """The measured iterations longer than `threshold` x their median, each with what held
    it up as far as the records show: the prefills training waited for (request, device,
    how long) and the transport's own signs in that iteration (token timeouts, the
    longest send from posted to confirmed against the median one). The network is named
    only when those signs are there; else the verdict says the cause is not recorded."""
    from statistics import median

    if not windows:
        return []
    times = [t1 - t0 for t0, t1 in windows]
    mid = median(times)
    waits = _waits(timelines, windows)
    sends = _wan_transfers(folder)
    first_measured = min(sends) if sends else 0
    # the transfer logs number iterations from the first (warm-ups too): the measured ones are the last len(windows)
    last = max(sends) if sends else -1
    base = last - len(windows) + 1 if sends else first_measured

    all_spans = [x for rs in sends.values() for r in rs if r.links and (x := r.span) is not None]
    typical = median(all_spans) if all_spans else None
    out = []
    for k, t in enumerate(times):
        if t <= threshold * mid:
            continue
        mine = [w for w in waits if w.iteration == k]
        waited = sum(w.waited_s for w in mine)
        recs = sends.get(base + k, [])
        timeouts = sum(1 for r in recs if r.token_timeout)
        spans = [x for r in recs if r.links and (x := r.span) is not None]
        longest = max(spans) if spans else None
        excess = t - mid
        late = _training_overrun(timelines, windows[k])
        parts: list[tuple[float, str]] = []  # (seconds it may explain, what): the largest first
        if mine:
            w = mine[0]
            parts.append((waited, f"prefill {w.request} on {w.device} held the device {w.held_s * 1e3:.0f} ms and "
                          f"training ({w.training}) waited {w.waited_s * 1e3:.0f} ms for it"
                          + (f"; {len(mine) - 1} more waits, {waited * 1e3:.0f} ms in all" if len(mine) > 1 else "")))
        if timeouts:
            parts.append((excess, f"{timeouts} transfer(s) waited for Atlas's link token until its timeout"))
        if longest is not None and typical is not None and longest - typical > 0.5 * excess:
            parts.append((longest - typical, f"a WAN transfer took {longest:.3f} s from posted to confirmed "
                                             f"(median {typical:.3f} s)"))
        if late is not None and late[0] > 0.25 * excess:
            parts.append((late[0], f"training's own {late[1]} ran {late[0] * 1e3:.0f} ms past its modelled time: "
                                   "its worker was held up between taking the device and finishing the work "
                                   "(descheduled or blocked, not waiting for a prefill)"))
        parts.sort(key=lambda p: -p[0])
        said = [text for _, text in parts]
        if not said:
            said.append("no prefill made training wait and the transfer records show nothing unusual: "
                        "cause not recorded (CPU contention on the host?)")
        elif waited < 0.5 * excess and mine:
            said.append(f"the waits on prefill explain {waited / excess:.0%} of the {excess * 1e3:.0f} ms excess")
        out.append(IterationStall(iteration=k, time_s=t, over_median_s=excess, waited_on_prefill_s=waited,
                                  held_by=mine[:5], token_timeouts=timeouts, longest_wan_transfer_s=longest,
                                  median_wan_transfer_s=typical, training_overrun_s=late[0] if late else 0.0,
                                  training_overrun_at=late[1] if late else None, verdict="; ".join(said)))
    return out


def prefill_service(folder: Path, requests: PrefillRequests, ttft: Ttft, agents_not_arrived: int,
                    summaries: Sequence[AgentSummaryRead]) -> PrefillService:
    """The variant's dispatch mode and its request accounting (summary's `prefill_service`):
    the controller's counts where one ran (its ``controller.json``), else the agents'
    (shards or naive, by the window in the agents' `summaries`)."""
    accounted = (requests.unaccounted == 0 and requests.arrived == requests.served + requests.rejected
                 and "unknown" not in requests.rejected_by_reason)
    common = dict(arrived=requests.arrived, served=requests.served, rejected=requests.rejected,
                  rejected_by_reason=requests.rejected_by_reason, ttft_p50_s=ttft.p50, ttft_p99_s=ttft.p99)
    if (folder / "controller").exists():
        ctl = _controller_summary(folder / "controller" / "controller.json")
        if ctl is None:  # the controller never wrote its summary: it did not end cleanly
            return PrefillService(dispatch="controller", accounted=False, not_arrived=0, **common)
        return PrefillService(dispatch="controller", accounted=accounted, not_arrived=ctl.not_arrived or 0,
                              by_device=ctl.by_device, by_origin=ctl.by_origin, refused_bodies=ctl.refused_bodies,
                              **common)
    naive = any(a.config.window == "naive" for a in summaries)
    return PrefillService(dispatch="naive" if naive else "shards", accounted=accounted,
                          not_arrived=agents_not_arrived, **common)


def _controller_summary(path: Path) -> ControllerSummaryRead | None:
    """The controller's summary, None when it is missing or unreadable."""
    with contextlib.suppress(OSError, ValidationError):
        return ControllerSummaryRead.model_validate_json(path.read_text())
    return None


def agent_summaries(folder: Path) -> list[AgentSummaryRead]:
    """The agents' summary files of a variant (``agents/<worker>.json``), each read once;
    a file that is missing or unreadable (an agent that did not end) is left out."""
    out = []
    for path in sorted((folder / "agents").glob("*.json")):
        with contextlib.suppress(OSError, ValidationError):
            out.append(AgentSummaryRead.model_validate_json(path.read_text()))
    return out


def kv_checks(rows: Sequence[Mapping[str, Any]]) -> KVChecks:
    """The decode hosts' checks of the shipped KV caches, from the agents' request rows
    (kv_digest_ok, kv_decode_ok: bubbletea_agent/kv_ship.py)."""
    shipped = [r for r in rows if r.get("kv_digest_ok") is not None]
    served = [r for r in shipped if r.get("status") == "served"]
    decoded = [r for r in shipped if r.get("kv_decode_ok") is not None]
    true_bytes = sum(int(r.get("kv_bytes") or 0) for r in served)
    wire = sum(int(r.get("kv_wire_bytes") or 0) for r in served)
    return KVChecks(
        shipped=len(shipped),
        digest_ok=sum(r["kv_digest_ok"] is True for r in shipped),
        digest_mismatches=sum(r["kv_digest_ok"] is False for r in shipped),
        decode_checked=len(decoded),
        decode_passed=sum(r["kv_decode_ok"] is True for r in decoded),
        decode_failed=sum(r["kv_decode_ok"] is False for r in decoded),
        kv_bytes=true_bytes,
        wire_bytes=wire,
        wire_scale=wire / true_bytes if true_bytes else None,
    )
