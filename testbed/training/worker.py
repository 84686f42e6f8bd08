"""One training worker, or one end of a calibration probe, as a process on a host.

    python -m testbed.training.worker JOB.json

The runner (testbed/run/jobs.py) writes a job file per process and starts it on its
host (inside the host's network namespace under emulation). A ``train`` worker is one
(pipeline, rank): it opens its boundary channels (it listens for the channels from
the previous stage and connects to the next), reports ready on the runner's control
socket, then runs each iteration when told to start it, at a common wall-clock
instant (plus its pipeline's planned offset). Its emulated GPU is a shared
`testbed_core.device.Device` in the run directory, so a BubbleTea agent next to it can
use the same device. Transfer records go to the job's ``transfers_path``.

With a ``real`` section (``workload.gpu.mode: real``, testbed/training/real_mode.py)
the device is real: the worker trains its stages as torch modules (`RealWork`), its
boundary channels carry the real activations and gradients (through the same
`TransportComm`, so Atlas's temporal plan and tokens apply), it averages its
gradients with the same-stage workers of the other pipelines over channels of its
own (``real.dp_peers``), steps its optimizer on the device after each iteration,
and at the end saves its parameters and per-iteration losses to ``real.out``.

A ``probe-send``/``probe-recv`` pair measures how long a tensor of the workload's
wire size takes over one channel of N streams, for the runner's calibration.

The shared secret of the channels comes from the environment (ATLAS_SECRET), never
from the job file.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import sys
import threading
import time
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

log = logging.getLogger("testbed.worker")


class WorkerError(RuntimeError):
    """A worker that cannot start or run; the message names the worker and the cause."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ChannelJob(_Model):
    """One boundary channel of a worker. The downstream worker (stage b+1) listens,
    the upstream one (stage b) connects."""

    boundary: int = Field(ge=0)
    role: Literal["listen", "connect"]
    peer: str
    peer_ip: str
    port: int = Field(ge=1, le=65535)
    streams: int = Field(ge=1, le=64)
    links: list[str] = []  # WAN link directions of this worker's *sends* on the channel
    recv_links: list[str] = []  # ... and of what it receives on it
    latency_s: float = Field(0.0, ge=0)


class PlannedSend(_Model):
    """A WAN send of this worker under the temporal plan (see transport_comm.Planned)."""

    direction: Literal["fwd", "bwd"]
    boundary: int
    mb: int
    start_s: float  # planned slot start, seconds after the iteration's common start
    duration_s: float = Field(0.0, ge=0)  # planned time on the wire
    tokens: list[tuple[str, int]] = []  # (link direction, position in its planned order)
    next: list[tuple[str, int, str]] = []  # (link direction, position, worker) of the next transfer


class DeviceJob(_Model):
    name: str
    run_dir: str
    mode: Literal["modelled", "real"] = "modelled"
    time_scale: float = Field(1.0, gt=0)
    torch_device: str | None = None  # real mode: where torch work runs ("cpu", "cuda")


class DpPeerJob(_Model):
    """A channel to the worker of the same stages in another pipeline (DP replica), for
    the gradient average. The lower DP rank listens, the higher one connects."""

    dp_rank: int = Field(ge=0)
    peer: str
    peer_ip: str
    port: int = Field(ge=1, le=65535)
    role: Literal["listen", "connect"]
    streams: int = Field(1, ge=1, le=64)


class RealJob(_Model):
    """Real-device training of this worker's stages (testbed/training/real_mode.py)."""

    workload: dict[str, Any]  # the run's workload, as a mapping (validated again here)
    stages: list[int] = Field(min_length=1)  # the (virtual) stages this worker holds
    dp_rank: int = Field(ge=0)
    seed: int = Field(0, ge=0)
    optimizer: dict[str, Any] = {}  # OptimConfig fields
    torch_device: str = "cpu"
    threads: int = Field(1, ge=1)
    dp_peers: list[DpPeerJob] = []
    out: str  # where the parameters and losses are saved at the end (torch.save)


class TransportJob(_Model):
    chunk_bytes: int | None = None
    congestion: str | None = None
    pacing_rate_mbps: float | None = None  # per stream (SO_MAX_PACING_RATE); None: unpaced
    connect_timeout_s: float = 10.0


class LiveJob(_Model):
    """BubbleTea's live status of this worker's device (bubbletea_agent/live.py): the
    earliest time training can want the device again, kept true as the worker waits."""

    status_path: str
    wake_path: str
    lead_s: float = Field(0.05, gt=0, description="the runner's iteration lead (barrier to next start)")
    # boundary -> nominal rate (bits/s) of the slowest shaped link a tensor received on it
    # crosses (0: none known, e.g. local mode)
    recv_rate_bps: dict[int, float] = {}
    slack_bytes: int = Field(0, ge=0, description="shaper burst: bytes that may pass it at once")
    poll_s: float = Field(0.002, gt=0, description="how often a waiting worker refreshes its bound")


class TrainJob(_Model):
    role: Literal["train"] = "train"
    worker: str
    pipeline: int = Field(ge=0)
    rank: int = Field(ge=0)
    host: str
    bind_ip: str
    schedule: str
    pp: int = Field(ge=1)
    microbatches: int = Field(ge=1)
    chunks: int = Field(1, ge=1)
    forward_s: list[float]
    backward_s: list[float]
    wire_bytes: int = Field(ge=1)
    iterations: int = Field(ge=1, description="all iterations, warm-up included")
    offset_s: float = Field(0.0, ge=0)
    plan: list[PlannedSend] = []
    temporal_mode: Literal["token", "slot"] = "token"
    token_port: int | None = Field(None, ge=1, le=65535)
    token_peers: dict[str, tuple[str, int]] = {}  # worker -> (ip, token port) of senders sharing a link
    token_timeout_s: float = Field(10.0, gt=0)
    channels: list[ChannelJob]
    device: DeviceJob
    control: str
    transfers_path: str
    transport: TransportJob = TransportJob()
    setup_timeout_s: float = Field(60.0, gt=0)
    timeout_s: float = Field(120.0, gt=0)
    slots_path: str | None = None
    idle_slots: list[tuple[float, float]] = []  # planned idle gaps, seconds after the iteration start
    live: LiveJob | None = None  # BubbleTea's live status (None: not published)
    real: RealJob | None = None  # real-device training (None: modelled work)


class ProbeJob(_Model):
    role: Literal["probe-send", "probe-recv"]
    name: str
    bind_ip: str = "0.0.0.0"
    peer_ip: str = ""
    port: int = Field(ge=1, le=65535)
    streams: int = Field(ge=1, le=64)
    nbytes: int = Field(ge=1)
    count: int = Field(ge=1)
    gap_s: float = Field(0.0, ge=0)
    start_at: float | None = None  # wall-clock instant to send the first tensor
    period_s: float | None = Field(None, gt=0, description="send tensor k at start_at + k x period (rounds)")
    wait_go: bool = Field(False, description="once connected, print 'connected' and read 'go <start_at>' on stdin")
    warmup_bytes: int = Field(0, ge=0, description="one untimed tensor of this size first: opens the TCP windows")
    out: str
    transport: TransportJob = TransportJob()
    timeout_s: float = Field(60.0, gt=0)


def parse_job(data: Any, source: str = "<job>") -> TrainJob | ProbeJob:
    """A job file's content, validated; errors name the file and the field."""
    if not isinstance(data, dict):
        raise WorkerError(f"{source}: a job is a JSON object with a 'role'")
    role = data.get("role", "train")
    model = TrainJob if role == "train" else ProbeJob if role in ("probe-send", "probe-recv") else None
    if model is None:
        raise WorkerError(f"{source}: role {role!r} is not one of train, probe-send, probe-recv")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise WorkerError(f"{source}: {where}: {first['msg']}") from None


def load_job(path: str | Path) -> TrainJob | ProbeJob:
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise WorkerError(f"{path}: no such job file") from None
    except json.JSONDecodeError as exc:
        raise WorkerError(f"{path}: not JSON: {exc}") from None
    return parse_job(data, str(path))


# ------------------------------------------------------------------ control socket

class Control:
    """The worker's end of the runner's control socket: JSON lines both ways."""

    def __init__(self, path: str, worker: str, timeout_s: float) -> None:
        self.worker = worker
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                self.sock.connect(path)
                break
            except (FileNotFoundError, ConnectionRefusedError) as exc:
                if time.monotonic() > deadline:
                    raise WorkerError(f"{worker}: cannot reach the runner's control socket {path}: {exc}") from None
                time.sleep(0.05)
        self._file = self.sock.makefile("r")
        self._lock = threading.Lock()

    def send(self, kind: str, **fields: Any) -> None:
        line = json.dumps({"type": kind, "worker": self.worker, **fields}) + "\n"
        with self._lock:
            self.sock.sendall(line.encode())

    def messages(self) -> Iterator[dict[str, Any]]:
        for line in self._file:
            if line.strip():
                yield json.loads(line)

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


# ------------------------------------------------------------------ channels

def transport_config(job: TrainJob | ProbeJob, streams: int) -> Any:
    from atlas_transport import TransportConfig

    kw: dict[str, Any] = {"streams": streams, "connect_timeout_s": job.transport.connect_timeout_s}
    if job.transport.chunk_bytes:
        kw["chunk_bytes"] = job.transport.chunk_bytes
    if job.transport.congestion:
        kw["congestion"] = job.transport.congestion
    if job.transport.pacing_rate_mbps:
        kw["pacing_rate_mbps"] = job.transport.pacing_rate_mbps
    return TransportConfig(**kw)


def connect_with_retry(ip: str, port: int, cfg: Any, deadline: float, what: str) -> Any:
    """connect(), retried while the listener is not up yet (refused) until `deadline`."""
    from atlas_transport import connect
    from atlas_transport.errors import AuthenticationError, ConnectError

    while True:
        try:
            return connect(ip, port, cfg)
        except AuthenticationError as exc:
            raise WorkerError(f"{what}: {exc} (are both ends started with the same ATLAS_SECRET?)") from None
        except (ConnectError, OSError) as exc:
            if time.monotonic() > deadline:
                raise WorkerError(f"{what}: cannot connect to {ip}:{port}: {exc}") from None
            time.sleep(0.1)


def _ends(job: TrainJob) -> list[tuple[tuple[str, int], ChannelJob | DpPeerJob, str]]:
    """Every channel of a worker: ((kind, index), spec, what it is, for messages);
    kind "b" is a pipeline boundary, "dp" a DP peer (index: its DP rank)."""
    out: list[tuple[tuple[str, int], ChannelJob | DpPeerJob, str]] = [
        (("b", c.boundary), c, f"the channel of boundary {c.boundary}") for c in job.channels]
    if job.real is not None:
        out += [(("dp", p.dp_rank), p, f"the gradient channel of DP replica {p.dp_rank}") for p in job.real.dp_peers]
    return out


def open_all_channels(job: TrainJob) -> tuple[dict[int, Any], dict[int, Any]]:
    """(boundary channels by boundary, DP gradient channels by peer DP rank): listen
    for every channel this worker accepts, connect the others, then accept."""
    from atlas_transport import listen

    deadline = time.monotonic() + job.setup_timeout_s
    ends = _ends(job)
    listeners = {}
    channels: dict[tuple[str, int], Any] = {}
    try:
        for key, c, _ in ends:
            if c.role == "listen":
                listeners[key] = (c, listen(job.bind_ip, c.port, transport_config(job, c.streams)))
        for key, c, what in ends:
            if c.role == "connect":
                channels[key] = connect_with_retry(c.peer_ip, c.port, transport_config(job, c.streams),
                                                   deadline, f"{job.worker}: {what} to {c.peer}")
        whats = {key: what for key, _, what in ends}
        for key, (c, lst) in listeners.items():
            try:
                channels[key] = lst.accept(timeout=max(0.1, deadline - time.monotonic()))
            except TimeoutError:
                raise WorkerError(
                    f"{job.worker}: {c.peer} did not open {whats[key]} "
                    f"(port {c.port}) within {job.setup_timeout_s:g} s"
                ) from None
    except BaseException:
        for ch in channels.values():
            ch.close(timeout=1.0)
        raise
    finally:
        for _, lst in listeners.values():
            lst.close()
    return ({i: ch for (k, i), ch in channels.items() if k == "b"},
            {i: ch for (k, i), ch in channels.items() if k == "dp"})


def open_channels(job: TrainJob) -> dict[int, Any]:
    """Listen for the upstream channels, connect the downstream ones, accept."""
    boundary, dp = open_all_channels(job)
    for ch in dp.values():
        ch.close(timeout=1.0)
    return boundary


# ------------------------------------------------------------------ training

def run_train(job: TrainJob) -> None:
    import torch

    from testbed.training.executor import ModelledWork, run_worker
    from testbed.training.transport_comm import Planned, Route, TokenBus, TransferLog, TransportComm
    from testbed_core.device import Device
    from testbed_core.schedules import build_schedule

    control = Control(job.control, job.worker, job.setup_timeout_s)
    try:
        control.send("hello", pid=os.getpid(), host=job.host)
        schedule = build_schedule(job.schedule, job.pp, job.microbatches, job.chunks)
        if job.real is not None:
            torch.set_num_threads(job.real.threads)
        device = Device(job.device.name, job.device.run_dir, mode=job.device.mode, time_scale=job.device.time_scale)
        channels, dp_channels = open_all_channels(job)
        owner = f"train:{job.worker}"
        real = None if job.real is None else real_work_of(job, dp_channels)
        work = real if real is not None else ModelledWork(list(job.forward_s), list(job.backward_s))
        live = _live_reporter(job)
        routes = {c.boundary: Route(c.peer, tuple(c.links), c.latency_s, c.streams, tuple(c.recv_links))
                  for c in job.channels}
        plan = {(p.direction, p.boundary, p.mb): Planned(p.start_s, tuple(p.tokens), p.duration_s, tuple(p.next))
                for p in job.plan}
        filler = torch.zeros(job.wire_bytes, dtype=torch.uint8)
        comm = TransportComm(job.pipeline, job.worker, _watched(channels, job, live), routes, filler=filler,
                             plan=plan, mode=job.temporal_mode, token_timeout_s=job.token_timeout_s,
                             timeout_s=job.timeout_s)
        driver = comm if live is None else _live_comm(comm, live)
        if job.token_port is not None and job.temporal_mode == "token":
            comm.bus = TokenBus(job.bind_ip, job.token_port, job.token_peers, comm.on_token)
        tlog = TransferLog(Path(job.transfers_path))
        publisher = _slot_publisher(job)
        if live is not None:
            live.between()
        control.send("ready")
        try:
            for msg in control.messages():
                if msg["type"] == "stop":
                    break
                if msg["type"] != "go":
                    continue
                i, at = int(msg["iteration"]), float(msg["at"])
                comm.begin_iteration(i, at)
                if publisher is not None:
                    _publish(publisher, job, i, at)
                if live is not None:
                    live.scheduled(i, at + job.offset_s)
                records = run_worker(schedule, job.rank, job.pipeline, device, driver, work,
                                     owner=owner, start_at=at + job.offset_s)
                loss = None
                if real is not None:  # DP gradient average (network), then the step on the device
                    if live is not None:
                        live.busy()
                    loss, step = end_real_iteration(real, device, owner, i)
                    records.append(step)
                sent, received = comm.take_records()
                tlog.add("send", sent)
                tlog.add("recv", received)
                tlog.write()
                control.send("iter_done", iteration=i, end=max((r.end for r in records), default=at),
                             busy=sum(r.end - r.start for r in records), token_timeouts=comm.token_timeouts,
                             loss=loss)
                if live is not None:
                    live.between()  # the runner heard we are done: the next start is >= now + lead
            if real is not None:
                save_real(job, real)
        finally:
            if live is not None:
                live.ended()
                live.close()
                print(f"live status of {job.worker}: {json.dumps(live.stats)}", file=sys.stderr, flush=True)
            if publisher is not None:
                publisher.end()
                publisher.close()
            comm.close()
            if comm.bus is not None:
                comm.bus.close()
            for ch in [*channels.values(), *dp_channels.values()]:
                ch.close(timeout=5.0)
        control.send("bye")
    except BaseException as exc:
        try:
            control.send("error", message=f"{type(exc).__name__}: {exc}", trace=traceback.format_exc())
        except OSError:
            pass
        raise
    finally:
        control.close()


def real_work_of(job: TrainJob, dp_channels: dict[int, Any]) -> Any:
    """The `RealWork` of a real-mode worker: its stages as torch modules on its torch
    device, DP gradients averaged over `dp_channels` (peer DP rank -> channel)."""
    from testbed.training.real_work import OptimConfig, PeerGradSync, RealWork, RealWorkError
    from testbed_core.workload import WorkloadError, parse_workload

    real = job.real
    assert real is not None
    try:
        workload = parse_workload(real.workload, f"{job.worker}: real.workload")
        opt = dict(real.optimizer)
        if "betas" in opt:
            opt["betas"] = tuple(opt["betas"])
        sync = PeerGradSync(real.dp_rank, dp_channels, timeout_s=job.timeout_s) if dp_channels else None
        return RealWork(workload, real.stages, seed=real.seed, dp_rank=real.dp_rank, grad_sync=sync,
                        optim=OptimConfig(**opt), device=real.torch_device)
    except (WorkloadError, RealWorkError, TypeError) as exc:
        raise WorkerError(f"{job.worker}: real-mode training cannot start: {exc}") from None


def end_real_iteration(work: Any, device: Any, owner: str, iteration: int) -> tuple[float | None, Any]:
    """Average the gradients over DP, then step the optimizer on the device (so its
    timeline shows it). Returns (this replica's mean loss or None, the step's record)."""
    if work.iteration != iteration:
        raise WorkerError(f"{owner}: the runner started iteration {iteration}, but the model has trained "
                          f"{work.iteration}: iterations must come in order from 0")
    steps: list[Any] = []
    loss = work.end_iteration(step=lambda fn: steps.append(device.run("optimizer", owner, fn=fn,
                                                                        label=f"step{iteration}")))
    return loss, steps[0]


def save_real(job: TrainJob, work: Any) -> None:
    """This worker's parameters (CPU copies, the whole model's names) and per-iteration
    losses (last stage only), with what the runner's reference needs to match them."""
    import torch

    real = job.real
    assert real is not None
    out = Path(real.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    torch.save({
        "worker": job.worker, "pipeline": job.pipeline, "rank": job.rank, "dp_rank": real.dp_rank,
        "stages": list(work.stages), "iterations": work.iteration, "losses": list(work.losses),
        "params": work.state_dict(), "seed": real.seed, "optimizer": dict(real.optimizer),
        "torch_device": str(work.device), "threads": real.threads, "torch_version": torch.__version__,
    }, tmp)
    os.replace(tmp, out)


def _slot_publisher(job: TrainJob) -> Any:
    """BubbleTea's slot feed of this worker's device (bubbletea_agent/slots.py), when asked for."""
    if not job.slots_path:
        return None
    from bubbletea_agent.slots import SlotPublisher

    return SlotPublisher(job.slots_path, worker=job.worker, stage=job.rank)


def _live_reporter(job: TrainJob) -> Any:
    """BubbleTea's live status writer of this worker's device, when asked for."""
    if job.live is None:
        return None
    from bubbletea_agent.live import LiveReporter, Nudger, StatusWriter

    return LiveReporter(StatusWriter(job.live.status_path), Nudger(job.live.wake_path), lead_s=job.live.lead_s,
                        poll_s=job.live.poll_s)


def _watched(channels: dict[int, Any], job: TrainJob, live: Any) -> dict[int, Any]:
    """The channels as the Comm sees them: with live status, receives report while they wait."""
    if live is None:
        return channels
    from bubbletea_agent.live import ArrivalFloor, ProgressBound, WatchedChannel
    from bubbletea_agent.tcp_progress import TcpProgressError, TcpReceived

    assert job.live is not None
    out = {}
    for c in job.channels:
        rate = job.live.recv_rate_bps.get(c.boundary, 0.0)
        progress = None
        if rate > 0:
            try:
                counter = TcpReceived.for_channel(c.peer_ip, c.port, c.role, c.streams)
                progress = ProgressBound(counter.total, rate, job.live.slack_bytes)
            except (TcpProgressError, OSError) as exc:
                print(f"{job.worker}: boundary {c.boundary}: no byte counts ({exc}); live bound learned instead",
                      file=sys.stderr, flush=True)
        floor = ArrivalFloor(job.wire_bytes * 8 / rate if rate > 0 else 0.0)
        out[c.boundary] = WatchedChannel(channels[c.boundary], live, floor, job.wire_bytes, progress)
    return out


def _live_comm(comm: Any, live: Any) -> Any:
    from bubbletea_agent.live import LiveComm

    return LiveComm(comm, live)


def _publish(publisher: Any, job: TrainJob, iteration: int, start: float) -> None:
    from bubbletea_agent.slots import Slot

    publisher.publish([Slot(iteration, k, start + s, e - s, job.rank) for k, (s, e) in enumerate(job.idle_slots)])


# ------------------------------------------------------------------ probes

def run_probe(job: ProbeJob) -> None:
    """Time `count` tensors over one channel. The receiver writes the arrival times,
    the sender the hand-over and confirmation times (wall clock), to `out`."""
    import torch

    from atlas_transport import listen
    from testbed.training.transport_comm import wall_of

    cfg = transport_config(job, job.streams)
    result: dict[str, Any] = {"name": job.name, "role": job.role, "streams": job.streams, "nbytes": job.nbytes}
    deadline = time.monotonic() + job.timeout_s
    if job.role == "probe-recv":
        with listen(job.bind_ip, job.port, cfg) as lst:
            print("listening", flush=True)
            ch = lst.accept(timeout=job.timeout_s)
            try:
                if job.warmup_bytes:
                    ch.irecv(2).wait(max(0.1, deadline - time.monotonic()))
                arrived = []
                for _ in range(job.count):
                    h = ch.irecv(1)
                    h.wait(max(0.1, deadline - time.monotonic()))
                    arrived.append(wall_of(h.completed_at))
                result["arrived"] = arrived
            finally:
                ch.close(timeout=5.0)
    else:
        ch = connect_with_retry(job.peer_ip, job.port, cfg, deadline, f"probe {job.name}")
        try:
            if job.warmup_bytes:
                ch.isend(torch.zeros(job.warmup_bytes, dtype=torch.uint8), 2).wait(max(0.1, deadline - time.monotonic()))
            payload = torch.zeros(job.nbytes, dtype=torch.uint8)
            start_at = job.start_at
            if job.wait_go:  # all probes connected: the runner gives them one start instant
                print("connected", flush=True)
                words = sys.stdin.readline().split()
                if len(words) != 2 or words[0] != "go":
                    raise WorkerError(f"probe {job.name}: expected 'go <time>' on stdin, got {' '.join(words)!r}")
                start_at = float(words[1])
            if start_at is not None:
                while (left := start_at - time.time()) > 0:
                    time.sleep(left)
            sent, confirmed = [], []
            first = start_at if start_at is not None else time.time()
            for k in range(job.count):
                if job.period_s is not None:  # synchronised rounds with the other probes
                    while (left := first + k * job.period_s - time.time()) > 0:
                        time.sleep(left)
                elif k and job.gap_s:
                    time.sleep(job.gap_s)
                sent.append(time.time())
                h = ch.isend(payload, 1)
                h.wait(max(0.1, deadline - time.monotonic()))
                confirmed.append(wall_of(h.completed_at))
            result.update(sent=sent, confirmed=confirmed)
        finally:
            ch.close(timeout=5.0)
    tmp = Path(job.out).with_suffix(".tmp")
    tmp.write_text(json.dumps(result))
    os.replace(tmp, job.out)


# ------------------------------------------------------------------ entry point

def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1 or argv[0] in ("-h", "--help"):
        print("usage: python -m testbed.training.worker JOB.json  (job files are written by `testbed run`)",
              file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        job = load_job(argv[0])
        if isinstance(job, TrainJob):
            run_train(job)
        else:
            run_probe(job)
    except WorkerError as exc:
        print(f"worker error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
