"""Real pipeline training over atlas_transport between processes: same parameters as
the one-process reference, with 1 stream, N streams, planned (held) sends and sends
that overtake each other.

This file is also the worker program (``python tests/unit/training/test_real_training_tcp.py
--worker``) and its driver (`WorkerCluster`), which tests/root/test_equivalence_2dc.py
reuses on emulated hosts. Each worker is one (pipeline, rank) process: it listens on
its address and, for every run it is sent (JSON on stdin), opens one atlas_transport
channel per pipeline boundary it touches and one per DP peer, trains with `RealWork`
through `executor.run_worker`, saves its parameters and answers on stdout. Workers
live across runs, so torch is imported once per process. The channels' secret comes
from the environment (ATLAS_SECRET), as for the runner's workers.

Boundary tensors go through the runner's `TransportComm` (its tags carry the
iteration; under a plan, sends wait for their slot), or through `ReorderingComm`
below, an adversary that lets sends overtake each other on the same channel.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import random
import secrets
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

HARNESS = Path(__file__).resolve()
HELLO_TAG = (1 << 63) - 1  # above every transfer tag of TransportComm and key_tag
WorkerId = tuple[int, int]  # (pipeline = DP replica, rank)


# --------------------------------------------------------------------------- the Comm


def key_tag(key: Any) -> int:
    """A channel tag per TransferKey: 1 + pipeline | boundary | direction | mb."""
    if not (0 <= key.mb < 1 << 24 and 0 <= key.boundary < 1 << 12 and 0 <= key.pipeline < 1 << 20):
        raise ValueError(f"transfer {key} is out of the tag space (mb < 2^24, boundary < 2^12)")
    direction = 0 if key.direction == "fwd" else 1
    return 1 + ((((key.pipeline << 12) | key.boundary) << 1 | direction) << 24) + key.mb


class ReorderingComm:
    """An adversarial `executor.Comm` over atlas_transport channels (one per boundary):
    `delay(key)` holds each send back on its own timer, so sends overtake each other
    even on the same channel, which no Atlas plan does. Training must not notice."""

    def __init__(self, channels: dict[int, Any], *, delay: Callable[[Any], float],
                 timeout_s: float = 60.0) -> None:
        self.channels = channels
        self.delay = delay
        self.timeout_s = timeout_s
        self._handles: list[Any] = []
        self._timers: list[threading.Timer] = []
        self._errors: list[BaseException] = []
        self._lock = threading.Lock()
        self.asked: list[Any] = []  # keys in the order the schedule sent them
        self.sent: list[Any] = []  # keys in the order they went to the channel

    def _channel(self, key: Any) -> Any:
        try:
            return self.channels[key.boundary]
        except KeyError:
            raise RuntimeError(f"no channel for boundary {key.boundary} ({key})") from None

    def _isend(self, payload: Any, key: Any) -> None:
        try:
            h = self._channel(key).isend(payload, key_tag(key))
            with self._lock:
                self._handles.append(h)
                self.sent.append(key)
        except BaseException as exc:  # surfaced by flush()
            self._errors.append(exc)

    def send(self, key: Any, payload: Any) -> None:
        self._channel(key)
        self.asked.append(key)
        wait = self.delay(key)
        if wait <= 0:  # not held back: send in order now (a 0 s timer could still overtake)
            self._isend(payload, key)
            return
        timer = threading.Timer(wait, self._isend, args=(payload, key))
        timer.daemon = True
        self._timers.append(timer)
        timer.start()

    def recv(self, key: Any) -> Any:
        return self._channel(key).recv(key_tag(key), timeout=self.timeout_s)

    def flush(self) -> None:
        for t in self._timers:
            t.join(self.timeout_s)
        self._timers.clear()
        if self._errors:
            raise self._errors[0]
        with self._lock:
            handles, self._handles = self._handles, []
        for h in handles:
            h.wait(self.timeout_s)


def _delay_fn(spec: dict, pipeline: int) -> Callable[[Any], float]:
    rng = random.Random(spec["seed"] * 1000 + pipeline)
    lock = threading.Lock()

    def delay(key: Any) -> float:
        """Even micro-batches wait max_s, odd ones a random bit: sends overtake each other."""
        if pipeline not in spec["pipelines"]:
            return 0.0
        with lock:
            return spec["max_s"] if key.mb % 2 == 0 else rng.uniform(0.0, spec["max_s"] / 4)

    return delay


# --------------------------------------------------------------------------- the worker


def _say(msg: dict) -> None:
    sys.stdout.write(json.dumps(msg) + "\n")
    sys.stdout.flush()


def _links(me: WorkerId, dp: int, pp: int, stages: int) -> list[tuple[str, int, WorkerId, bool]]:
    """(kind, index, peer, i_connect) of every channel of worker `me`: one per pipeline
    boundary it touches (the upstream end connects) and one per DP peer (lower id connects)."""
    d, r = me
    out = []
    for b in range(stages - 1):
        lo, hi = b % pp, (b + 1) % pp
        if r == lo:
            out.append(("b", b, (d, hi), True))
        elif r == hi:
            out.append(("b", b, (d, lo), False))
    for e in range(dp):
        if e != d:
            out.append(("dp", e, (e, r), d < e))
    return out


def _connect_all(me: WorkerId, run: dict, listener: Any, cfg: Any) -> tuple[dict[int, Any], dict[int, Any]]:
    """(channels by boundary, channels by DP peer rank). The accepting side learns which
    channel it got from a hello tensor [run, kind, pipeline, index] on HELLO_TAG."""
    import torch

    from atlas_transport import connect

    peers = {tuple(map(int, k.split(","))): v for k, v in run["peers"].items()}
    links = _links(me, run["dp"], run["pp"], run["pp"] * run.get("chunks", 1))
    boundary: dict[int, Any] = {}
    dp: dict[int, Any] = {}
    try:
        for kind, index, peer, i_connect in links:
            if i_connect:
                ch = connect(*peers[peer], cfg)
                (boundary if kind == "b" else dp)[index] = ch
                # the acceptor files a DP channel under *our* pipeline, a boundary under its index
                tag_index = index if kind == "b" else me[0]
                ch.send(torch.tensor([run["run"], int(kind == "dp"), me[0], tag_index]), HELLO_TAG, timeout=30)
        for _ in [x for x in links if not x[3]]:
            ch = listener.accept(timeout=30)
            n, is_dp, _pipeline, index = ch.recv(HELLO_TAG, timeout=30).tolist()
            if n != run["run"]:
                raise RuntimeError(f"worker {me}: a channel of run {n} arrived during run {run['run']}")
            (dp if is_dp else boundary)[index] = ch
    except BaseException:
        for ch in [*boundary.values(), *dp.values()]:
            ch.close(timeout=1)
        raise
    return boundary, dp


def _train(me: WorkerId, run: dict, listener: Any) -> dict:
    import torch

    from atlas_transport import TransportConfig
    from testbed.training.executor import run_worker
    from testbed.training.real_work import OptimConfig, PeerGradSync, RealWork
    from testbed.training.transport_comm import ChannelPath, Planned, TransportComm
    from testbed_core.schedules import build_schedule
    from testbed_core.workload import parse_workload
    from testbed_runtime.device import Device

    d, r = me
    wl = parse_workload(run["workload"], "run")
    par = wl.parallelism
    cfg = TransportConfig(streams=run["streams"], idle_timeout_s=30.0)
    boundary, dp_peers = _connect_all(me, dict(run, chunks=par.chunks), listener, cfg)
    connected = time.time()
    try:
        work = RealWork(wl, [c * par.pp + r for c in range(par.chunks)], seed=run["seed"], dp_rank=d,
                        grad_sync=PeerGradSync(d, dp_peers) if dp_peers else None,
                        optim=OptimConfig(**run["optim"]))
        if run.get("reorder"):
            comm: Any = ReorderingComm(boundary, delay=_delay_fn(run["reorder"], d))
        else:  # the runner's Comm; under a plan, sends wait for their slot ("slot" mode: no token bus)
            plan = {}
            if run.get("plan") and d in run["plan"]["pipelines"]:
                gap = run["plan"]["gap_s"]
                plan = {(dr, b, mb): Planned(slot_s=gap * (mb + 1)) for b in boundary
                        for mb in range(par.num_micro_batches) for dr in ("fwd", "bwd")}
            paths = {b: ChannelPath(f"b{b}", streams=run["streams"]) for b in boundary}
            comm = TransportComm(d, f"p{d}r{r}", boundary, paths, filler=torch.zeros(1), plan=plan, mode="slot")
        sched = build_schedule(run["schedule"], par.pp, par.num_micro_batches, par.chunks)
        device = Device(f"p{d}r{r}", run["run_dir"], mode="real")
        offsets = run.get("offsets") or [0.0] * par.dp
        records, held = 0, 0
        for it in range(run["iterations"]):
            start = run["t0"] + offsets[d] if it == 0 else time.time()
            if isinstance(comm, TransportComm):
                comm.begin_iteration(it, start)
            records += len(run_worker(sched, r, d, device, comm, work, start_at=start if it == 0 else None))
            comm.flush()
            if isinstance(comm, TransportComm):
                sent, _ = comm.take_records()
                held += sum(1 for s in sent if s["not_before"] is not None and s["sent"] >= s["not_before"] > s["posted"])
            work.end_iteration()
        train_s = time.time() - max(run["t0"] + offsets[d], connected)  # the iterations, not the setup
        torch.save({"params": work.state_dict(), "losses": work.losses}, run["out"])
        reordered = isinstance(comm, ReorderingComm) and comm.sent != comm.asked
        if isinstance(comm, TransportComm):
            comm.close()
        return {"records": records, "train_s": train_s, "reordered": reordered, "held": held,
                "bytes_received": sum(ch.bytes_received for ch in [*boundary.values(), *dp_peers.values()])}
    finally:
        for ch in [*boundary.values(), *dp_peers.values()]:
            ch.close(timeout=10)


def worker_main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--worker", action="store_true")
    ap.add_argument("--bind", required=True)
    ap.add_argument("--id", required=True, help="pipeline,rank")
    args = ap.parse_args(argv)
    me = tuple(int(x) for x in args.id.split(","))
    import torch

    torch.set_num_threads(1)  # workers share 2 cores with the relay and each other
    from atlas_transport import TransportConfig, listen
    from testbed.training import executor, real_work, transport_comm  # noqa: F401  (imported before "ready")

    listener = listen(args.bind, 0, TransportConfig())
    _say({"port": listener.port})
    try:
        for line in sys.stdin:
            run = json.loads(line)
            if run.get("cmd") == "exit":
                break
            try:
                _say({"done": run["run"], **_train(me, run, listener)})  # type: ignore[arg-type]
            except Exception:
                _say({"error": traceback.format_exc()})
                return 1
    finally:
        listener.close()
    return 0


# --------------------------------------------------------------------------- the driver


@dataclass
class _Proc:
    wid: WorkerId
    proc: subprocess.Popen
    lines: queue.Queue = field(default_factory=queue.Queue)
    port: int = 0
    log: Path | None = None

    def read(self, timeout: float) -> dict:
        try:
            line = self.lines.get(timeout=timeout)
        except queue.Empty:
            raise TimeoutError(f"worker {self.wid} said nothing for {timeout:g} s{self._tail()}") from None
        if line is None:
            raise RuntimeError(f"worker {self.wid} exited (code {self.proc.poll()}){self._tail()}")
        msg = json.loads(line)
        if "error" in msg:
            raise RuntimeError(f"worker {self.wid} failed:\n{msg['error']}{self._tail()}")
        return msg

    def _tail(self) -> str:
        if self.log is None or not self.log.exists():
            return ""
        return "\nits stderr:\n" + "\n".join(self.log.read_text().splitlines()[-20:])


FOLLOW_ON = ("ChannelClosed", "PeerLost", "BrokenPipeError", "ConnectionResetError", "closed channel")


def _follow_on(msg: str) -> bool:
    """Whether a worker's failure (its traceback's last line) is a peer going away."""
    tb = msg.split("\nits stderr:", 1)[0]
    last = [line for line in tb.splitlines() if line.strip() and not line.startswith(" ")]
    return bool(last) and "Traceback" in tb and any(name in last[-1] for name in FOLLOW_ON)


def failure_report(run: int, errors: dict[WorkerId, str]) -> str:
    """One message for the failed workers of a run: those that failed on their own
    first, then those that only saw a peer go away (a closed channel, a broken pipe)."""
    follow_on = {wid: _follow_on(msg) for wid, msg in errors.items()}
    order = sorted(errors, key=lambda wid: (follow_on[wid], wid))
    causes = [wid for wid in order if not follow_on[wid]]
    head = (f"run {run} failed on workers {order}; the likely cause is on {causes}" if causes else
            f"run {run} failed on workers {order}, each after losing a peer")
    return "\n\n".join([head, *(f"--- worker {wid}: {errors[wid]}" for wid in order)])


def _pump(stream: IO[str], q: queue.Queue) -> None:
    for line in stream:
        if line.startswith("{"):
            q.put(line)
    q.put(None)


class WorkerCluster:
    """One worker process per (pipeline, rank); `spawn(wid, argv, **popen_kwargs)`
    starts one (subprocess.Popen locally, `host.popen` on an emulated host) and
    `address(wid)` is the IP it listens on."""

    def __init__(self, dp: int, pp: int, work_dir: Path, *,
                 spawn: Callable[..., subprocess.Popen] | None = None,
                 address: Callable[[WorkerId], str] = lambda wid: "127.0.0.1",
                 start_timeout_s: float = 120.0) -> None:
        self.dp, self.pp = dp, pp
        self.dir = work_dir
        self.spawn = spawn or (lambda wid, argv, **kw: subprocess.Popen(argv, **kw))
        self.address = address
        self.secret = secrets.token_hex(16)
        self.procs: dict[WorkerId, _Proc] = {}
        self.runs = 0
        self.start_timeout_s = start_timeout_s
        self.down: str | None = None  # why a failed run left the workers unusable

    def __enter__(self) -> WorkerCluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> None:
        env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", ATLAS_SECRET=self.secret)
        for d in range(self.dp):
            for r in range(self.pp):
                wid = (d, r)
                log = self.dir / f"worker-p{d}r{r}.stderr"
                argv = [sys.executable, str(HARNESS), "--worker", "--bind", self.address(wid),
                        "--id", f"{d},{r}"]
                proc = self.spawn(wid, argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=open(log, "w"), text=True, env=env, cwd=str(HARNESS.parents[3]))
                p = _Proc(wid, proc, log=log)
                threading.Thread(target=_pump, args=(proc.stdout, p.lines), daemon=True).start()
                self.procs[wid] = p
        for p in self.procs.values():
            p.port = p.read(self.start_timeout_s)["port"]

    def run(self, workload: Any, *, schedule: str, iterations: int = 3, seed: int = 0,
            optim: dict | None = None, streams: int = 1, offsets: list[float] | None = None,
            plan: dict | None = None, reorder: dict | None = None, timeout_s: float = 120.0) -> dict:
        """Train on every worker; returns {"params": per replica merged state dict,
        "losses": per replica, "workers": each worker's answer}.

        Boundary tensors go through the runner's TransportComm; `plan`
        ({"pipelines": [...], "gap_s": g}) holds those pipelines' sends until planned
        slots (mb + 1) x g after the iteration start, as Atlas's temporal sharing does;
        `offsets` staggers the pipelines' starts; `reorder` ({"pipelines", "max_s",
        "seed"}) swaps in ReorderingComm instead."""
        import torch

        if self.down is not None:
            raise RuntimeError(f"the worker cluster is down since an earlier run failed:\n{self.down}")
        self.runs += 1
        k = self.runs
        peers = {f"{d},{r}": [self.address((d, r)), p.port] for (d, r), p in self.procs.items()}
        run_dir = self.dir / f"run{k}"
        run_dir.mkdir()
        base = {"cmd": "run", "run": k, "peers": peers, "workload": workload.model_dump(mode="json"),
                "dp": self.dp, "pp": self.pp, "schedule": schedule, "iterations": iterations, "seed": seed,
                "optim": optim or {}, "streams": streams, "plan": plan,
                "reorder": reorder, "offsets": offsets, "run_dir": str(run_dir), "t0": time.time() + 1.0}
        for (d, r), p in self.procs.items():
            msg = dict(base, out=str(run_dir / f"p{d}r{r}.pt"))
            try:
                p.proc.stdin.write(json.dumps(msg) + "\n")
                p.proc.stdin.flush()
            except OSError as exc:
                self.down = f"worker {(d, r)} does not take runs ({exc}){p._tail()}"
                raise RuntimeError(self.down) from None
        answers = self._answers(k, timeout_s)
        params: list[dict] = [{} for _ in range(self.dp)]
        losses: list[list[float]] = [[] for _ in range(self.dp)]
        for (d, r) in self.procs:
            saved = torch.load(run_dir / f"p{d}r{r}.pt")
            params[d].update(saved["params"])
            if saved["losses"]:
                losses[d] = saved["losses"]
        return {"params": params, "losses": losses, "workers": answers}

    def _answers(self, k: int, timeout_s: float, grace_s: float = 20.0) -> dict[WorkerId, dict]:
        """Every worker's answer to run `k`. One failing worker makes its peers fail too
        (their channels to it close), so on failure it waits up to `grace_s` for the
        others and reports every failure, the likely cause first."""
        deadline = time.monotonic() + timeout_s
        answers: dict[WorkerId, dict] = {}
        errors: dict[WorkerId, str] = {}
        for wid, p in self.procs.items():
            left = deadline - time.monotonic()
            if errors:
                left = min(left, grace_s)
            try:
                answers[wid] = p.read(max(0.1, left))
            except (RuntimeError, TimeoutError) as exc:
                errors[wid] = str(exc)
        if errors:
            self.down = failure_report(k, errors)
            raise RuntimeError(self.down)
        return answers

    def close(self) -> None:
        for p in self.procs.values():
            try:
                p.proc.stdin.write(json.dumps({"cmd": "exit"}) + "\n")
                p.proc.stdin.close()
            except (OSError, ValueError):
                pass
        for p in self.procs.values():
            try:
                p.proc.wait(10)
            except subprocess.TimeoutExpired:
                p.proc.kill()
                p.proc.wait(5)


if __name__ == "__main__":
    sys.exit(worker_main(sys.argv[1:]))


# --------------------------------------------------------------------------- the tests

import pytest  # noqa: E402


@pytest.fixture(scope="module")
def tiny():
    from testbed_core.workload import load_workload

    return load_workload(HARNESS.parents[3] / "scenarios" / "workloads" / "tiny.yaml")  # dp=2, pp=2, m=4


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, tiny):
    import zygote  # tests/zygote.py (the tests' folder is on sys.path under pytest, not in a worker)

    def forked(wid: WorkerId, argv: list[str], *, stdin: Any, stdout: Any, stderr: IO[str], text: bool,
               env: dict[str, str], cwd: str) -> Any:
        """The worker forked from the zygote, which imported torch once (no fresh
        interpreter per worker): stdin and stdout are pipes, as WorkerCluster's Popen has them."""
        assert stdin == stdout == subprocess.PIPE and text and argv[0] == sys.executable
        stderr.close()  # the log file: the worker opens it by name
        return zygote.popen(argv[1:], env, cwd=cwd, pipes=True, err=stderr.name)

    with WorkerCluster(tiny.parallelism.dp, tiny.parallelism.pp, tmp_path_factory.mktemp("tcp"), spawn=forked) as c:
        yield c


_REFERENCES: dict[tuple[str, str, int], tuple[Any, Any]] = {}


def _references(tiny, optim: dict, iterations: int) -> tuple[Any, Any]:
    """The micro-batched and global-batch one-process references, trained once per
    (workload, optimizer, iterations): the variants of one workload share them."""
    from testbed.training.real_work import OptimConfig
    from testbed.training.reference import train_reference

    key = (tiny.model_dump_json(), json.dumps(optim, sort_keys=True), iterations)
    if key not in _REFERENCES:
        oc = OptimConfig(**optim)
        _REFERENCES[key] = (train_reference(tiny, iterations=iterations, optim=oc, mode="accumulate", threads=1),
                            train_reference(tiny, iterations=iterations, optim=oc))
    return _REFERENCES[key]


def _check_against_references(tiny, result: dict, optim: dict, iterations: int = 3) -> None:
    from testbed.training.real_work import OptimConfig
    from testbed.training.reference import compare_params, tolerance_for

    acc, ref = _references(tiny, optim, iterations)
    rtol, atol = tolerance_for(OptimConfig(**optim))
    for d, params in enumerate(result["params"]):
        exact = compare_params(params, acc.params)
        assert exact.bitwise_equal, f"replica {d} vs micro-batched reference: {exact.describe()}"
        close = compare_params(params, ref.params, rtol=rtol, atol=atol)
        assert close.ok, f"replica {d} vs global-batch reference: {close.describe()}"
    mean = [sum(ls[i] for ls in result["losses"]) / len(result["losses"]) for i in range(iterations)]
    assert mean == acc.losses
    assert mean == pytest.approx(ref.losses, rel=1e-6)


SGD = {"kind": "sgd", "lr": 0.5}
VARIANTS = {  # name -> cluster.run keywords: the runner's three variants, and worse
    "baseline-gpipe-1stream": {"schedule": "gpipe", "streams": 1},
    "multi-tcp-1f1b-4streams": {"schedule": "1f1b", "streams": 4},
    "atlas-like-planned-slots": {"schedule": "1f1b", "streams": 4, "offsets": [0.0, 0.03],
                                 "plan": {"pipelines": [1], "gap_s": 0.02}},
    "reordered-within-channels": {"schedule": "1f1b", "streams": 2, "offsets": [0.0, 0.03],
                                  "reorder": {"pipelines": [1], "max_s": 0.04, "seed": 7}},
}


@pytest.mark.slow
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_tcp_pipeline_training_equals_the_reference(cluster, tiny, variant) -> None:
    kw = VARIANTS[variant]
    result = cluster.run(tiny, optim=SGD, **kw)
    _check_against_references(tiny, result, SGD)
    workers = result["workers"]
    # every boundary tensor and DP gradient really crossed a socket
    assert all(w["bytes_received"] > 0 for w in workers.values())
    # and the communication really was reordered where the variant says so
    held = {wid for wid, w in workers.items() if w["held"]}  # sends that waited for their slot
    assert bool(held) == ("plan" in kw) and all(wid[0] == 1 for wid in held)
    reordered = {wid for wid, w in workers.items() if w["reordered"]}
    assert reordered == ({(1, 0), (1, 1)} if "reorder" in kw else set())


@pytest.mark.slow
def test_tcp_adam_and_interleaved_training_equal_the_reference(cluster, tiny) -> None:
    optim = {"kind": "adam", "lr": 3e-3}
    par = tiny.parallelism.model_copy(update={"schedule": "interleaved-1f1b", "chunks": 2})
    wl = tiny.model_copy(update={"parallelism": par})
    result = cluster.run(wl, schedule="interleaved-1f1b", streams=2, optim=optim,
                         plan={"pipelines": [0, 1], "gap_s": 0.005})
    _check_against_references(wl, result, optim)
    assert result["losses"][0][-1] < result["losses"][0][0]  # it learns


def test_key_tags_are_distinct_and_in_range() -> None:
    from testbed_core.simulate import TransferKey

    keys = [TransferKey(p, b, mb, dr) for p in range(3) for b in range(4) for mb in range(64) for dr in ("fwd", "bwd")]
    tags = {key_tag(k) for k in keys}
    assert len(tags) == len(keys) and 0 < min(tags) and max(tags) < HELLO_TAG
    with pytest.raises(ValueError, match="out of the tag space"):
        key_tag(TransferKey(0, 0, 1 << 24, "fwd"))


def test_links_of_a_worker() -> None:
    # pp=2, dp=2: rank 0 connects boundary 0 downstream; DP: lower pipeline connects
    assert _links((0, 0), 2, 2, 2) == [("b", 0, (0, 1), True), ("dp", 1, (1, 0), True)]
    assert _links((1, 1), 2, 2, 2) == [("b", 0, (1, 0), False), ("dp", 0, (0, 1), False)]
    # interleaved, 2 ranks x 2 chunks: boundaries 0 and 2 go r0 -> r1, boundary 1 r1 -> r0
    assert _links((0, 0), 1, 2, 4) == [("b", 0, (0, 1), True), ("b", 1, (0, 1), False), ("b", 2, (0, 1), True)]


def test_reordering_comm_names_a_missing_boundary() -> None:
    from testbed_core.simulate import TransferKey

    comm = ReorderingComm({0: object()}, delay=lambda k: 0.0)
    with pytest.raises(RuntimeError, match="no channel for boundary 3"):
        comm.recv(TransferKey(0, 3, 0, "fwd"))


def test_failure_report_names_the_failing_worker_before_its_peers() -> None:
    def tb(last: str) -> str:
        return f"worker failed:\nTraceback (most recent call last):\n  File \"x.py\", line 1, in f\n{last}\n\nits stderr:\n"

    errors = {
        (0, 0): tb("atlas_transport.errors.ChannelClosed: recv of transfer failed: peer 1.2.3.4:5 closed channel ab"),
        (0, 1): tb("BrokenPipeError: [Errno 32] Broken pipe"),
        (1, 0): tb("AttributeError: 'float' object has no attribute 'tokens'"),
    }
    report = failure_report(3, errors)
    assert report.startswith("run 3 failed on workers [(1, 0), (0, 0), (0, 1)]; the likely cause is on [(1, 0)]")
    assert report.index("'float' object") < report.index("closed channel") < report.index("Broken pipe")
    only_peers = failure_report(4, {(0, 0): errors[(0, 0)]})
    assert only_peers.startswith("run 4 failed on workers [(0, 0)], each after losing a peer")
