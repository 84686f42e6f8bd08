"""Playing one variant's workers: start them on their hosts, run synchronised
iterations, collect the device timelines and transfer records.

Workers connect, report ready on a UNIX control socket (it crosses network namespaces:
it lives on the shared filesystem), and start each iteration at a common wall-clock
instant; the next one starts when all have finished (the optimizer step's barrier),
``runner.iteration_lead`` later. A ``+bubbletea`` variant also starts its decode
servers and agents (testbed/run/bubbletea.py) and waits for them before the first
iteration; the runner then keeps the gate (the next iteration's start).
"""

from __future__ import annotations

import contextlib
import os
import selectors
import socket
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from testbed.process import Process
from testbed.progress import Progress
from testbed.run.bubbletea import (
    AGENT_NICE,
    AGENT_REALTIME_HOLDS,
    CONTROLLER_NICE,
    DECODE_NICE,
    start_agents,
    wait_ready,
)
from testbed.run.common import (
    REPO_ROOT,
    RunnerError,
    log_tail,
    run_preload,
    stop_processes,
    worker_argv,
    worker_env,
)
from testbed.run.cpu import MachineReading, machine_cpu, machine_reading
from testbed.run.network import Network
from testbed.run.scenario import Scenario
from testbed.run.variants import VariantSetup
from testbed_core.contracts.control import (
    Bye,
    ControlError,
    Go,
    Hello,
    IterDone,
    Ready,
    Stop,
    WorkerFailed,
    WorkerMessage,
    parse_worker_message,
)
from testbed_core.contracts.summary import AgentsCpu, MachineCpu
from testbed_core.contracts.worker_job import TrainJob

if TYPE_CHECKING:
    from testbed.run.faults import FaultInjector
    from testbed_core.workload import Workload

M = TypeVar("M", Hello, Ready, IterDone, Bye)


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
        self._agents_lost: set[str] = set()  # BubbleTea agents that died: training goes on
        self.sel = selectors.DefaultSelector()
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.server.bind(path)
        self.server.listen(len(workers) + 4)
        self.server.setblocking(False)
        self.sel.register(self.server, selectors.EVENT_READ)
        self.conns: dict[str, socket.socket] = {}
        self._buf: dict[socket.socket, bytes] = {}
        self._who: dict[socket.socket, str] = {}
        self.inbox: list[WorkerMessage] = []

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
                try:
                    msg = parse_worker_message(line)
                except ControlError as exc:
                    raise RunnerError(str(exc)) from None
                if isinstance(msg, Hello):
                    self.conns[msg.worker] = sock
                    self._who[sock] = msg.worker
                if isinstance(msg, WorkerFailed):
                    raise RunnerError(f"worker {msg.worker} failed: {msg.message}\n"
                                      f"{log_tail(self.logs.get(msg.worker, Path('-')))}")
                self.inbox.append(msg)

    def _check_procs(self) -> None:
        for wid, p in self.procs.items():
            rc = p.poll()
            if rc is not None and rc != 0:
                if wid.startswith("agent-"):
                    # training does not depend on its BubbleTea agent (a dead holder's flock is
                    # gone with it, testbed_runtime/device.py): say so once and train on
                    if wid not in self._agents_lost:
                        self._agents_lost.add(wid)
                        self.progress.log(f"  {wid} exited with status {rc}; training goes on without it "
                                          f"(its log: {self.logs[wid]})")
                    continue
                self._poll(0.2)  # its error message may still be in the socket
                raise RunnerError(f"worker {wid} exited with status {rc}:\n{log_tail(self.logs[wid])}")

    def wait_all(self, kind: type[M], timeout_s: float, what: str, iteration: int | None = None) -> dict[str, M]:
        """One `kind` message from every worker (for `iteration` if given), by worker."""
        deadline = time.monotonic() + timeout_s
        got: dict[str, M] = {}
        while True:
            keep = []
            for msg in self.inbox:
                if isinstance(msg, kind) and (iteration is None or getattr(msg, "iteration", None) == iteration):
                    got[msg.worker] = msg
                else:
                    keep.append(msg)
            self.inbox = keep
            if set(got) >= self.expected:
                return got
            if time.monotonic() > deadline:
                missing = sorted(self.expected - set(got))
                hint = "\n".join(f"  {w} ({self.procs[w].args[-1] if w in self.procs else '?'}):\n{log_tail(self.logs[w], 6)}"
                                 for w in missing[:3] if w in self.logs)
                raise RunnerError(f"{what}: no answer from {', '.join(missing)} within {timeout_s:g} s\n{hint}")
            self._poll(0.05)
            self._check_procs()
            self.progress.tick()

    def broadcast(self, msg: Go | Stop) -> None:
        line = msg.line()
        for wid in self.expected:
            sock = self.conns.get(wid)
            if sock is None:
                raise RunnerError(f"worker {wid} is not connected to the control socket")
            sock.setblocking(True)
            try:
                sock.sendall(line)
            finally:
                sock.setblocking(False)


@dataclass
class VariantRun:
    """What playing a variant recorded: each iteration's common start and last end,
    each device's timeline, and the transfers (both sides merged)."""

    starts: list[float]
    ends: list[float]
    timelines: dict[str, list[Any]]
    transfers: list[Any]
    allreduce_s: list[float | None]  # per iteration: the slowest worker's DP all-reduce (None: none ran)
    tensors_verified: int = 0  # received tensors whose pattern the receiver checked (runner.verify_tensors)
    # CPU over the measured iterations, in cores (CPU seconds / wall seconds), per kind of
    # process: "workers", "agents", "decode" (None: not read, e.g. no measured iteration)
    cpu_cores: dict[str, float] | None = None
    cpu_weights: str | None = None  # how BubbleTea's processes were weighted (testbed/run/cpu.py)
    agents_cpu: AgentsCpu | None = None  # the same, typed (summary: slowdown_decomposition.agents_cpu)
    # this machine's CPU over the measured iterations, the run's and other programs' (None:
    # the run's processes are not all on this machine, or /proc could not be read)
    machine_cpu: MachineCpu | None = None


def run_workers(
    net: Network, setup: VariantSetup, jobs: Mapping[str, TrainJob], folder: Path, ctl_dir: Path,
    secret: str, scenario: Scenario, iterations: int, progress: Progress, workload: Workload, base_dir: str | None,
    faults: FaultInjector | None = None, admit: bool = True,
) -> VariantRun:
    """Start the workers of one variant (their jobs written to ``<variant>/jobs/<worker>.json``),
    play its iterations, collect the records. `faults` (a testbed/run/faults.py
    `FaultInjector`) hears of each iteration's start and end and injects its faults.
    A +bubbletea variant's agents and decode servers run in a cgroup with
    ``runner.bubbletea_cpu_weight`` of a normal CPU weight; with `admit` False its agents
    run but never take the device (the idle twin: testbed_runtime.agent_env.ADMIT_ENV)."""
    from testbed.run.metrics import merge_transfer_sides
    from testbed.training.transport_comm import read_transfer_logs
    from testbed_runtime.device import Device

    jobs_dir, logs_dir = folder / "jobs", folder / "logs"
    jobs_dir.mkdir(parents=True, exist_ok=True)
    logs_dir.mkdir(parents=True, exist_ok=True)
    env = worker_env(secret)
    procs: dict[str, subprocess.Popen] = {}
    logs: dict[str, Path] = {}
    handles = []
    first = next(iter(jobs.values()))
    control, run_dir = first.control, Path(first.device.run_dir)
    ctl = Controller(control, list(jobs), procs, logs, progress)
    pred = setup.prediction.iteration_time_s
    timeout = max(scenario.runner.iteration_timeout, 5 * pred)
    starts: list[float] = []
    ends: list[float] = []
    allreduce: list[float | None] = []
    servers: dict[str, subprocess.Popen] = {}
    agents: dict[str, Process] = {}
    decoders: dict[str, Process] = {}
    gate = None
    group = None
    weights: str | None = None
    agents_cpu: AgentsCpu | None = None
    cpu_from: dict[str, float] = {}
    cpu: dict[str, float] | None = None
    machine_from: MachineReading | None = None
    machine: MachineCpu | None = None
    helpers = net.helper_pids()
    try:
        for wid, job in jobs.items():
            path = jobs_dir / f"{wid}.json"
            path.write_text(job.model_dump_json(indent=1))
            logs[wid] = logs_dir / f"{wid}.log"
            fh = open(logs[wid], "w")  # noqa: SIM115 (closed in finally)
            handles.append(fh)
            host = net.host(job.host)
            kwargs: dict[str, Any] = {"env": env, "stdout": fh, "stderr": subprocess.STDOUT, "cwd": str(REPO_ROOT)}
            procs[wid] = (host.popen_warm(worker_argv(path), preload=run_preload(scenario), **kwargs)
                          if scenario.runner.warm_start else host.popen(worker_argv(path), **kwargs))
        lead = scenario.runner.iteration_lead
        if faults is not None:
            faults.procs = procs
        if setup.run.bubbletea:
            from testbed_runtime.gate import Gate
            from testbed_runtime.live import gate_path

            gate = Gate(gate_path(run_dir), lead)
            # the request source only needs to outlast the run: requests stop at the last iteration
            horizon = iterations * max(pred, 0.1) * 3 + scenario.runner.setup_timeout
            from testbed_runtime.agent_env import ADMIT_ENV

            agent_env = env if admit else {**env, ADMIT_ENV: "none"}
            agents, decoders = start_agents(net, jobs, folder, scenario, workload, base_dir, iterations, agent_env,
                                            logs, horizon, dispatch=setup.run.dispatch)
            procs.update({name: a.popen for name, a in agents.items()})
            servers = {name: d.popen for name, d in decoders.items()}
        ctl.wait_all(Ready, scenario.runner.setup_timeout + 30, f"{setup.name}: starting the workers")
        if setup.run.bubbletea:
            wait_ready({**agents, **decoders}, scenario.runner.setup_timeout)
            # weighed once ready: loading (imports, the request stream) is no time to be starved
            group, weights = weigh_agents(net, setup.name, scenario.runner.bubbletea_cpu_weight,
                                          [p.pid for p in (*agents.values(), *decoders.values())], progress,
                                          idle=scenario.runner.bubbletea_cpu_idle)
            agents_cpu = agents_cpu_record(group, scenario.runner.bubbletea_cpu_weight, weights)
        at = gate.decide(0, max(0.2, lead)) if gate else time.time() + max(0.2, lead)
        for i in range(iterations):
            if i == workload.warmup:
                cpu_from = _cpu_now(procs, servers)
                machine_from = None if helpers is None else machine_reading(helpers)
            starts.append(at)
            if faults is not None:
                faults.iteration_started(i, at)
            ctl.broadcast(Go(iteration=i, at=at))
            done = ctl.wait_all(IterDone, timeout, f"{setup.name}: iteration {i}", iteration=i)
            ends.append(max(m.end for m in done.values()))
            if faults is not None:
                faults.iteration_ended(i, ends[-1])
            rings = [m.allreduce_s for m in done.values() if m.allreduce_s is not None]
            allreduce.append(max(rings) if rings else None)
            kind = "warm-up" if i < workload.warmup else "iteration"
            progress.log(f"  {setup.name}: {kind} {i}: {ends[-1] - at:.3f} s (a-priori prediction {pred:.3f} s)")
            at = gate.decide(i + 1, lead) if gate else time.time() + lead
        if cpu_from and len(starts) > workload.warmup:
            cpu_to = _cpu_now(procs, servers)
            machine_to = None if helpers is None else machine_reading(helpers)
            cpu = _cpu_cores(cpu_from, cpu_to, ends[-1] - starts[workload.warmup])
            if machine_from is not None and machine_to is not None:
                used = sum(after - cpu_from[n] for n, after in cpu_to.items() if n in cpu_from)
                machine = machine_cpu(machine_from, machine_to, used)
        if group is not None:
            group.remove()  # training is over: the agents write their outputs and exit at full weight
        ctl.broadcast(Stop())
        ctl.wait_all(Bye, 30, f"{setup.name}: stopping the workers")
        for wid, p in procs.items():  # agents end when their worker publishes the end of its slots
            try:
                p.wait(60 if wid.startswith("agent-") else 15)
            except subprocess.TimeoutExpired:
                raise RunnerError(f"{wid} did not exit after the run:\n{log_tail(logs[wid])}") from None
    finally:
        if faults is not None:
            faults.close()  # links restored before anything else stops
        if gate is not None:
            gate.close()
        for started in (*agents.values(), *decoders.values()):
            started.close()  # the readiness pipes (wait_ready closes them too)
        if group is not None:
            group.remove()  # before stopping them: a starved process is slow to exit
        stop_processes(servers)
        ctl.close()
        stop_processes(procs)
        for fh in handles:
            fh.close()
    timelines = {}
    for job in jobs.values():
        timelines[job.device.name] = Device(job.device.name, run_dir).timeline()
    sends, recvs = read_transfer_logs([Path(j.transfers_path) for j in jobs.values()])
    verified = sum(1 for r in recvs if r.get("verified"))
    return VariantRun(starts, ends, timelines, merge_transfer_sides(sends, recvs), allreduce, verified, cpu, weights,
                      agents_cpu, machine)


def weigh_agents(net: Network, variant: str, weight: float | None, pids: Sequence[int],
                 progress: Progress, idle: bool = False) -> tuple[Any, str | None]:
    """Put BubbleTea's processes (`pids`) in a cgroup with `weight` of a normal CPU weight
    (testbed/run/cpu.py), idle with `idle` (``cpu.idle`` 1: they run only on a core
    nothing else wants), recorded in the run record so that `testbed clean` removes
    it. Returns (the group or None, what was done, for the summary)."""
    from testbed.run.cpu import CpuGroupError, create_group

    if weight is None:
        return None, "no CPU weights (runner.bubbletea_cpu_weight: null)"
    emu = getattr(net, "emu", None)
    record = getattr(emu, "record", None)
    prefix = getattr(emu, "prefix", None) or "tbrun"
    name = f"{prefix}-bubbletea-{''.join(c if c.isalnum() else '-' for c in variant)}-{os.getpid()}"
    group, how = create_group(name, weight, record.add_path if record is not None else None, idle=idle)
    if group is None:
        progress.log(f"  {variant}: {how}")
        return None, how
    try:
        for pid in pids:
            group.add(pid)
    except CpuGroupError as exc:
        progress.log(f"  {variant}: {exc}: agents run without a CPU weight")
        group.remove()
        return None, f"no CPU weights ({exc})"
    return group, how


def agents_cpu_record(group: Any, weight: float | None, how: str | None) -> AgentsCpu:
    """The summary's typed record of how BubbleTea's processes were kept off the workers'
    cores: the group `weigh_agents` made (or None) and the fixed priorities they start at."""
    return AgentsCpu(cgroup=None if group is None else group.path.name, weight=None if group is None else weight,
                     idle=bool(getattr(group, "idle", False)), agent_nice=AGENT_NICE,
                     controller_nice=CONTROLLER_NICE, decode_nice=DECODE_NICE, realtime_holds=AGENT_REALTIME_HOLDS,
                     how=how or "no CPU weights")


def _cpu_now(procs: Mapping[str, subprocess.Popen], servers: Mapping[str, subprocess.Popen]) -> dict[str, float]:
    from testbed.run.cpu import cpu_seconds

    out = {}
    for name, p in (*procs.items(), *servers.items()):
        used = cpu_seconds(p.pid)
        if used is not None:
            out[name] = used
    return out


def _cpu_cores(before: Mapping[str, float], after: Mapping[str, float], wall_s: float) -> dict[str, float] | None:
    """CPU seconds used between two readings, per kind of process, over `wall_s`: cores."""
    if wall_s <= 0:
        return None
    cores: dict[str, float] = {}
    for name, used in after.items():
        if name in before:
            kind = "agents" if name.startswith("agent-") else "decode" if name.startswith("decode-") else "workers"
            cores[kind] = cores.get(kind, 0.0) + (used - before[name]) / wall_s
    return cores
