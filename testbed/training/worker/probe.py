"""The calibration probes (``probe-send`` / ``probe-recv``, testbed/run/calibration.py):
`count` tensors over one channel of N streams, timed on the wall clock every process
shares.

A probe runs as a process of its own (``python -m testbed.training.worker JOB.json``)
or, as the runner's calibration does it, in a probe agent: one long-lived process per
host (``python -m testbed.training.worker --probe-agent``) that runs every probe job
the runner hands it, each in a thread, so the calibration pays the start of a Python
process that imports torch once per host instead of once per probe end. The agent
speaks lines: it reads ``job <job file>``, ``go <name> <wall time>`` and ``quit`` on
stdin, and answers ``ready`` once, then ``<name> listening``, ``<name> connected``,
``<name> done`` or ``<name> failed <message>`` on stdout.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict

from testbed.training.worker.channels import connect_with_retry, transport_config
from testbed.training.worker.job import WorkerError, load_job
from testbed_core.atomic import write_text_atomic
from testbed_core.contracts.worker_job import ProbeJob, RingProbeJob

if TYPE_CHECKING:
    from atlas_transport.channel import Channel


TENSOR_TAG, WARMUP_TAG, RETURN_TAG = 1, 2, 3  # a probe channel's timed tensors, its warm-up, what comes back


class ProbeResult(BaseModel):
    """What a probe writes to its job's `out`: the receiver the wall-clock arrival of
    each tensor, the sender when it handed each over and when the receiver confirmed it
    (the warm-up tensor not counted)."""

    model_config = ConfigDict(extra="forbid")

    name: str
    role: Literal["probe-send", "probe-recv"]
    streams: int
    nbytes: int
    arrived: list[float | None] | None = None  # probe-recv (None: a receive that did not complete)
    sent: list[float] | None = None  # probe-send
    confirmed: list[float | None] | None = None  # probe-send
    fill_s: list[float] | None = None  # probe-send with verify: each timed pattern fill, seconds
    check_s: list[float] | None = None  # probe-recv with verify: each timed check, seconds
    returned_sent: list[float] | None = None  # probe-recv with duplex: when it handed each tensor back
    returned: list[float | None] | None = None  # probe-send with duplex: when each came back


class RingProbeResult(BaseModel):
    """What a ring probe writes to its job's `out`: the seconds of each all-reduce and
    the bytes this replica sent in one."""

    model_config = ConfigDict(extra="forbid")

    name: str
    times_s: list[float]
    bytes_sent: int


class ProbeIO:
    """How a probe tells the runner where it is and learns its start instant: a probe
    process prints a word on stdout and reads ``go <time>`` on stdin."""

    def say(self, word: str) -> None:
        print(word, flush=True)

    def wait_go(self, name: str) -> float:
        words = sys.stdin.readline().split()
        if len(words) != 2 or words[0] != "go":
            raise WorkerError(f"probe {name}: expected 'go <time>' on stdin, got {' '.join(words)!r}")
        return float(words[1])


class _AgentIO(ProbeIO):
    """One probe of a probe agent: its words prefixed by its name, its start instant
    handed over by the agent's reader."""

    def __init__(self, name: str, out: Callable[[str], None]) -> None:
        self.name, self.out = name, out
        self.go = threading.Event()
        self.start_at = 0.0

    def say(self, word: str) -> None:
        self.out(f"{self.name} {word}")

    def wait_go(self, name: str) -> float:
        if not self.go.wait(600):
            raise WorkerError(f"probe {name}: no 'go' within 600 s")
        return self.start_at


def run_agent(stdin: IO[str] | None = None, stdout: IO[str] | None = None) -> None:
    """The probe agent (module doc): runs the probe jobs named on `stdin` until ``quit``
    or end of input, each in a thread; waits for them before returning."""
    import torch  # noqa: F401  (imported once, before 'ready': the probes' first use pays nothing)

    stdin = stdin or sys.stdin
    stdout = stdout or sys.stdout
    lock = threading.Lock()

    def out(line: str) -> None:
        with lock:
            stdout.write(line + "\n")
            stdout.flush()

    probes: dict[str, _AgentIO] = {}
    threads = []

    def run_one(job: ProbeJob | RingProbeJob, io: _AgentIO) -> None:
        try:
            if isinstance(job, RingProbeJob):
                run_ring_probe(job, io)
            else:
                run_probe(job, io)
            out(f"{job.name} done")
        except Exception as exc:  # noqa: BLE001 (reported to the runner, which fails the calibration)
            out(f"{job.name} failed {type(exc).__name__}: {' '.join(str(exc).split())}")

    out("ready")
    for line in stdin:
        words = line.split()
        if not words:
            continue
        if words[0] == "quit":
            break
        if words[0] == "job" and len(words) == 2:
            try:
                job = load_job(words[1])
                if not isinstance(job, ProbeJob | RingProbeJob):
                    raise WorkerError(f"{words[1]}: a probe agent runs probe jobs, not role {job.role!r}")
            except WorkerError as exc:
                out(f"{Path(words[1]).name} failed WorkerError: {exc}")
                continue
            probes[job.name] = _AgentIO(job.name, out)  # registered before its 'go' can come
            t = threading.Thread(target=run_one, args=(job, probes[job.name]), daemon=True,
                                 name=f"probe-{job.name}")
            t.start()
            threads.append(t)
        elif words[0] == "go" and len(words) == 3 and words[1] in probes:
            probes[words[1]].start_at = float(words[2])
            probes[words[1]].go.set()
        else:
            out(f"agent failed WorkerError: cannot read {line.strip()!r} (job <file> | go <name> <time> | quit)")
    for t in threads:
        t.join()


def _open_channel(job: ProbeJob | RingProbeJob, listening: bool, deadline: float, what: str,
                  io: ProbeIO) -> Channel:
    """The probe's one channel: accepted on the job's address (after saying 'listening'),
    or connected to its peer, retried until `deadline`; each stream's receive window
    clamped as the job says (`ProbeJob.window_clamp`: the run's cap on the channels the
    probe stands for; a ring probe's channel, as the DP channels, has none)."""
    from atlas_transport import listen

    cfg = transport_config(job.transport, job.streams, job.window_clamp if isinstance(job, ProbeJob) else None)
    if listening:
        with listen(job.bind_ip, job.port, cfg) as lst:
            io.say("listening")
            return lst.accept(timeout=job.timeout_s)
    return connect_with_retry(job.peer_ip, job.port, cfg, deadline, what)


def _checker(job: ProbeJob) -> Callable[..., Any] | None:
    """With `job.verify`: the training's tensor checks (testbed/training/transport_comm.py
    `TransportComm` with verify, its own pattern and byte-for-byte check, no channel of
    its own): the sender's fill of tensor k returns the tensor to send, the receiver's
    check takes (k, the tensor that came) and fails on a damaged one."""
    if not job.verify:
        return None
    import torch

    from testbed.training.transport_comm import ChannelPath, TransportComm
    from testbed_core.simulate import TransferKey

    # boundary 0 stands for the probe's channel (named in a failed check's message); no
    # send or receive goes through this comm
    comm = TransportComm(0, job.name, {0: None}, {0: ChannelPath(peer=job.peer_ip or "the probe's sender")},  # type: ignore[dict-item]
                         filler=torch.zeros(job.nbytes, dtype=torch.uint8), verify=True)

    def key(k: int) -> TransferKey:
        return TransferKey(0, 0, k, "fwd")

    if job.role == "probe-send":
        return lambda k: comm.pattern(key(k), 0)
    return lambda k, tensor: comm._check(key(k), tensor)  # noqa: SLF001 (the training's own check, timed)


def _timed(times: list[float], fn: Callable[..., Any], *args: Any) -> Any:
    t0 = time.perf_counter()
    out = fn(*args)
    times.append(time.perf_counter() - t0)
    return out


def run_probe(job: ProbeJob, io: ProbeIO | None = None) -> None:
    """Time `count` tensors over one channel, one at a time (the `job.untimed` first
    `job.untimed_at_once` at a time). The receiver writes the arrival times,
    the sender the hand-over and confirmation times (wall clock), to `out`; with
    `job.verify` each tensor carries the training's pattern, filled (sender) and
    checked (receiver) as the training does, each fill and check timed; with
    `job.duplex` the receiver hands a tensor of the same size back as each arrives
    (each end its warm-up tensor too, as testbed/training/worker/warm.py warms a run's
    channel both ways) and writes when, the sender when each came back; the first timed
    tensor then goes out once every untimed one has come back: handed several at once,
    their returns still queued on the way back would hold the first timed return behind
    them, and the probe would time that wait (the schedule's own queueing is the
    simulation's) instead of the channel."""
    import torch

    from testbed.training.transport_comm import wall_of

    io = io or ProbeIO()
    result = ProbeResult(name=job.name, role=job.role, streams=job.streams, nbytes=job.nbytes)
    verify = _checker(job)
    checks: list[float] = []
    deadline = time.monotonic() + job.timeout_s
    receiver = job.role == "probe-recv"
    ch = _open_channel(job, receiver, deadline, f"probe {job.name}", io)
    try:
        if receiver:
            back = torch.zeros(job.nbytes, dtype=torch.uint8) if job.duplex else None
            if job.warmup_bytes:
                warm = ch.isend(torch.zeros(job.warmup_bytes, dtype=torch.uint8), WARMUP_TAG) if job.duplex else None
                ch.irecv(WARMUP_TAG).wait(max(0.1, deadline - time.monotonic()))
                if warm is not None:
                    warm.wait(max(0.1, deadline - time.monotonic()))
            arrived, returned_sent, returns = [], [], []
            for k in range(job.count):
                h = ch.irecv(TENSOR_TAG)
                got = h.wait(max(0.1, deadline - time.monotonic()))
                arrived.append(wall_of(h.arrived_at))  # its last byte, even if it landed before the posting
                if back is not None:  # handed back at once; the next receive is posted meanwhile
                    returned_sent.append(time.time())
                    returns.append(ch.isend(back, RETURN_TAG))
                if verify is not None:
                    _timed(checks, verify, k, got)
            for r in returns:
                r.wait(max(0.1, deadline - time.monotonic()))
            result.arrived = arrived
            result.check_s = checks if verify is not None else None
            result.returned_sent = returned_sent if job.duplex else None
        else:
            comebacks = []
            if job.warmup_bytes:
                warm_back = ch.irecv(WARMUP_TAG) if job.duplex else None
                ch.isend(torch.zeros(job.warmup_bytes, dtype=torch.uint8), WARMUP_TAG).wait(
                    max(0.1, deadline - time.monotonic()))
                if warm_back is not None:
                    warm_back.wait(max(0.1, deadline - time.monotonic()))
            if job.duplex:  # every tensor coming back, posted before the first goes out
                comebacks = [ch.irecv(RETURN_TAG) for _ in range(job.count)]
            payload = torch.zeros(job.nbytes, dtype=torch.uint8)
            start_at = job.start_at
            if job.wait_go:  # all probes connected: the runner gives them one start instant
                io.say("connected")
                start_at = io.wait_go(job.name)
            if start_at is not None:
                while (left := start_at - time.time()) > 0:
                    time.sleep(left)
            sent, confirmed = [], []
            first = start_at if start_at is not None else time.time()
            k = 0
            while k < job.count:
                if job.period_s is not None:  # synchronised rounds with the other probes
                    while (left := first + k * job.period_s - time.time()) > 0:
                        time.sleep(left)
                elif k and job.gap_s:
                    time.sleep(job.gap_s)
                if comebacks and k == job.untimed:  # the untimed tensors back first (see the docstring)
                    for r in comebacks[:k]:
                        r.wait(max(0.1, deadline - time.monotonic()))
                group = min(job.untimed_at_once, job.untimed - k) if k < job.untimed else 1
                handles = []
                for j in range(k, k + group):
                    tensor = payload if verify is None else _timed(checks, verify, j)
                    sent.append(time.time())
                    handles.append(ch.isend(tensor, TENSOR_TAG))
                for h in handles:
                    h.wait(max(0.1, deadline - time.monotonic()))
                    confirmed.append(wall_of(h.completed_at))
                k += group
            returned: list[float | None] = []
            for r in comebacks:
                r.wait(max(0.1, deadline - time.monotonic()))
                returned.append(wall_of(r.arrived_at))
            result.sent, result.confirmed = sent, confirmed
            result.returned = returned if job.duplex else None
            result.fill_s = checks if verify is not None else None
    finally:
        ch.close(timeout=5.0)
    write_text_atomic(job.out, result.model_dump_json(exclude_none=True))


def run_ring_probe(job: RingProbeJob, io: ProbeIO | None = None) -> None:
    """Open the one channel to the other replica, wait for the runner's common start
    ('connected', then 'go <time>' on stdin, as the other probes), then run the
    training workers' DP ring all-reduce `count` times; write each run's seconds and
    the bytes each replica sent to `out`."""
    import torch

    from testbed.training.allreduce import ring_allreduce, ring_plan

    io = io or ProbeIO()
    deadline = time.monotonic() + job.timeout_s
    ch = _open_channel(job, job.channel == "listen", deadline, f"ring probe {job.name}", io)
    try:
        plan = ring_plan(job.dp_rank, 2, job.grad_bytes, job.bucket_bytes)
        bucket = max(plan.messages)
        filler, landing = torch.zeros(bucket, dtype=torch.uint8), torch.empty(bucket, dtype=torch.uint8)
        io.say("connected")
        start_at = io.wait_go(f"ring probe {job.name}")
        while (left := start_at - time.time()) > 0:
            time.sleep(left)
        peer = {1 - job.dp_rank: ch}
        times = [ring_allreduce(plan, peer, filler, landing, max(0.1, deadline - time.monotonic()))
                 for _ in range(job.count)]
    finally:
        ch.close(timeout=5.0)
    write_text_atomic(job.out, RingProbeResult(name=job.name, times_s=times, bytes_sent=plan.bytes_sent).model_dump_json())
