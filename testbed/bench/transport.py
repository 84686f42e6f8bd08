"""Goodput measurements of Atlas against plain TCP, gloo and iperf3.

Every measurement is a pair of worker processes, a server and a client, started by
a *launcher* (a local `subprocess.Popen`, or `HostHandle.popen` inside an emulated
host), so the very same code runs on loopback, in Mininet namespaces and between
real machines:

    python -m testbed.bench.transport server --method atlas --bind 10.0.2.1
    python -m testbed.bench.transport client --method atlas --host 10.0.2.1 --port P \\
        --streams 8 --size 268435456 --repeat 3

Workers speak JSON lines on stdout: the server announces {"event": "ready", "port": P}
and both end with {"event": "result", ...} (or {"event": "error", "message": ...}).
Each tensor/tcp/gloo run sends one warm-up transfer, then `repeat` timed transfers of
random bytes; a transfer counts from the first byte handed to the transport until
the receiver confirmed the last (an ack for tcp and gloo, DONE for atlas). The server
checks an xxh3 digest of every transfer it received, outside the timed window: it
says "ready" once it has checked one and posted the next receive, and the client
waits for that before it starts the next clock (a digest of 256 MiB takes as long as
the transfer and would otherwise compete for the CPU with whichever method overlaps
it best). iperf3 runs for a duration and is reported as the reference ceiling; it
carries no tensor, so its "verified" only means that the test ran and the server
received data.

Both workers also report the CPU time their process spent (all threads, user and
system: `getrusage`) during the timed part, so each measurement comes with the CPU
it cost per GiB at both ends together. On a machine shared with other work, goodput
follows the CPU share each method gets, and CPU per GiB says which one needs less.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import statistics
import struct
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import numpy as np
import xxhash
from pydantic import BaseModel, ConfigDict

from testbed.emulation.linkmeasure.iperf import iperf3_client, iperf3_server
from testbed_core.constants import REPO_ROOT

if TYPE_CHECKING:
    import torch.distributed as dist

    from testbed.emulation.nodes import HostHandle

METHODS = ("atlas", "tcp", "gloo", "iperf3")
MANIFEST_TAG, DATA_TAG, READY_TAG, ACK_TAG = 1, 2, 3, 4
_TCP_HEADER = struct.Struct("!QQQ")  # size, transfers, digest

Launcher = Callable[[list[str], dict[str, str], IO[bytes]], subprocess.Popen]


class BenchError(RuntimeError):
    """A measurement could not be made; the message says which and why."""


class _Metered(BaseModel):
    """CPU seconds a worker spent in its timed part and the bytes moved in it."""

    model_config = ConfigDict(extra="ignore")  # the result line's "event" is not a field

    cpu_s: float = 0.0
    cpu_bytes: int = 0


class ServerResult(_Metered):
    """A server worker's result line: how many transfers it received and whether every
    one matched the client's digest (iperf3: whether each test received data)."""

    verified: bool
    received: int


class ClientResult(_Metered):
    """A client worker's result line: the goodput of each timed transfer (iperf3: of
    each test) and the streams it used."""

    streams: int
    samples_mbps: list[float]
    verified: bool = True  # iperf3 only (data arrived); the tensor methods leave it to the server
    auto_probe_mbps: dict[str, float] | None = None


@dataclass
class Measurement:
    path: str
    method: str
    streams: int
    goodput_mbps: float | None
    verified: bool | None
    requested_streams: int | str = 0
    size_bytes: int = 0
    samples_mbps: list[float] = field(default_factory=list)
    auto_probe_mbps: dict[str, float] | None = None
    error: str | None = None
    round: int = 0  # which pass over the methods (--rounds): ratios pair measurements of one round
    cpu_ms_per_gib: float | None = None  # CPU time of both ends per GiB moved (timed part only)

    def row(self) -> dict[str, Any]:
        return asdict(self)


# --- worker side -----------------------------------------------------------------------

def _emit(event: str, **fields: Any) -> None:
    sys.stdout.write(json.dumps({"event": event, **fields}) + "\n")
    sys.stdout.flush()


def _random_bytes(size: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8)


def _digest(buf: Any) -> int:
    return xxhash.xxh3_64_intdigest(memoryview(buf).cast("B"))


def _signed(x: int) -> int:
    return x - (1 << 64) if x >= 1 << 63 else x


def _goodput(size: int, seconds: list[float]) -> list[float]:
    return [size * 8 / s / 1e6 for s in seconds]


class _CpuMeter:
    """CPU seconds (user + system, every thread of this process) spent inside
    start()/stop() windows, and the bytes moved in them."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.nbytes = 0
        self._t0: float | None = None

    @staticmethod
    def now() -> float:
        r = resource.getrusage(resource.RUSAGE_SELF)
        return r.ru_utime + r.ru_stime

    def start(self) -> None:
        self._t0 = self.now()

    def stop(self, nbytes: int) -> None:
        if self._t0 is not None:
            self.seconds += self.now() - self._t0
            self.nbytes += nbytes
            self._t0 = None

    def fields(self) -> dict[str, float | int]:
        return {"cpu_s": self.seconds, "cpu_bytes": self.nbytes}


def _timed_sends(count: int, size: int, send: Callable[[], None], ready: Callable[[], None]
                 ) -> tuple[list[float], _CpuMeter]:
    """`count` transfers of `size` bytes: `send()` returns once the receiver has it all,
    `ready()` once the receiver checked it and posted the next receive. The first is a
    warm-up, neither timed nor metered; the seconds of the others and the CPU they took."""
    seconds: list[float] = []
    cpu = _CpuMeter()
    for i in range(count):
        if i:
            cpu.start()
        t0 = time.perf_counter()
        send()
        if i:
            seconds.append(time.perf_counter() - t0)
            cpu.stop(size)
        ready()
    return seconds, cpu


def _checked_receives(count: int, size: int, receive: Callable[[], None], matches: Callable[[], bool],
                      ready: Callable[[], None]) -> ServerResult:
    """The receiving side of `_timed_sends`: `receive()` returns once a transfer is in and
    acknowledged, `matches()` checks its digest outside the metered part, `ready()` tells
    the client to go on. The first (warm-up) receive is not metered."""
    ok = []
    cpu = _CpuMeter()
    for i in range(count):
        if i:
            cpu.start()
        receive()
        cpu.stop(size)
        ok.append(matches())
        ready()
    return ServerResult(verified=all(ok), received=len(ok), **cpu.fields())


def _secret() -> str:
    secret = os.environ.get("ATLAS_SECRET")
    if not secret:
        raise BenchError("the worker needs ATLAS_SECRET in its environment")
    return secret


def serve_atlas(a: argparse.Namespace) -> ServerResult:
    import torch

    from atlas_transport.config import TransportConfig
    from atlas_transport.endpoints import listen
    from atlas_transport.tensors import byte_view

    cfg = TransportConfig(secret=_secret(), idle_timeout_s=a.idle_timeout)
    with listen(a.bind, a.port, cfg) as lst:
        _emit("ready", port=lst.port)
        with lst.accept(timeout=a.timeout) as ch:
            size, count, digest = (int(x) for x in ch.recv(MANIFEST_TAG, timeout=a.timeout))
            digest &= (1 << 64) - 1
            buf = torch.zeros(size, dtype=torch.uint8)  # pre-faulted
            pending = ch.irecv_into(buf, DATA_TAG)
            ok = []
            cpu = _CpuMeter()
            for i in range(count):
                pending.wait(a.timeout)
                cpu.stop(size)  # the first (warm-up) transfer is not metered
                ok.append(_digest(byte_view(buf)) == digest)
                if i + 1 < count:
                    pending = ch.irecv_into(buf, DATA_TAG)  # posted before the client may send
                    cpu.start()
                ch.send(torch.ones(1), READY_TAG, timeout=a.timeout)
            return ServerResult(verified=all(ok), received=len(ok), **cpu.fields())


def client_atlas(a: argparse.Namespace) -> ClientResult:
    import torch

    from atlas_transport.auto import cached_streams
    from atlas_transport.config import TransportConfig
    from atlas_transport.endpoints import connect

    streams: int | str = "auto" if a.streams == "auto" else int(a.streams)
    extra = {"chunk_bytes": a.chunk_bytes} if a.chunk_bytes else {}
    cfg = TransportConfig(streams=streams, secret=_secret(), idle_timeout_s=a.idle_timeout,
                          congestion=a.congestion, zero_copy=not a.no_zero_copy, **extra)
    data = torch.from_numpy(_random_bytes(a.size, a.seed))
    digest = _digest(data.numpy())
    with connect(a.host, a.port, cfg) as ch:
        ch.send(torch.tensor([a.size, a.repeat + 1, _signed(digest)], dtype=torch.int64), MANIFEST_TAG)
        seconds, cpu = _timed_sends(a.repeat + 1, a.size,
                                    lambda: ch.send(data, DATA_TAG),  # returns at the receiver's DONE
                                    lambda: ch.recv(READY_TAG, timeout=a.timeout))
        used = ch.streams
    probe = cached_streams(a.host, a.port) if streams == "auto" else None
    return ClientResult(streams=used, samples_mbps=_goodput(a.size, seconds), **cpu.fields(),
                        auto_probe_mbps={str(k): v for k, v in probe.goodput_mbps.items()} if probe else None)


def _recv_exact(conn: socket.socket, view: memoryview) -> None:
    got = 0
    while got < len(view):
        n = conn.recv_into(view[got:], len(view) - got, socket.MSG_WAITALL)
        if n == 0:
            raise BenchError("the tcp client closed the connection early")
        got += n


def serve_tcp(a: argparse.Namespace) -> ServerResult:
    with socket.create_server((a.bind, a.port)) as ls:
        _emit("ready", port=ls.getsockname()[1])
        ls.settimeout(a.timeout)
        conn, _ = ls.accept()
        with conn:
            conn.settimeout(a.timeout)
            head = bytearray(_TCP_HEADER.size)
            _recv_exact(conn, memoryview(head))
            size, count, digest = _TCP_HEADER.unpack(head)
            buf = np.zeros(size, dtype=np.uint8)
            buf[:] = 0  # pre-faulted, as the other methods' buffers

            def receive() -> None:
                _recv_exact(conn, memoryview(buf))
                conn.sendall(b"k")  # ack first: verification is not part of the timing

            return _checked_receives(count, size, receive, lambda: _digest(buf) == digest,
                                     lambda: conn.sendall(b"r"))  # ready for the next one


def client_tcp(a: argparse.Namespace) -> ClientResult:
    data = _random_bytes(a.size, a.seed)
    view = memoryview(data)
    with socket.create_connection((a.host, a.port), timeout=a.timeout) as conn:
        conn.sendall(_TCP_HEADER.pack(a.size, a.repeat + 1, _digest(data)))

        def send() -> None:
            conn.sendall(view)
            if conn.recv(1) != b"k":
                raise BenchError("the tcp server did not acknowledge the transfer")

        def ready() -> None:
            if conn.recv(1) != b"r":
                raise BenchError("the tcp server did not say it was ready for the next transfer")

        seconds, cpu = _timed_sends(a.repeat + 1, a.size, send, ready)
    return ClientResult(streams=1, samples_mbps=_goodput(a.size, seconds), **cpu.fields())


def _gloo_group(store: dist.Store, rank: int, ip: str, timeout: float) -> dist.ProcessGroupGloo:
    from datetime import timedelta

    import torch.distributed as dist

    opts = dist.ProcessGroupGloo._Options()
    opts._devices = [dist.ProcessGroupGloo.create_device(hostname=ip)]
    opts._timeout = timedelta(seconds=timeout)
    return dist.ProcessGroupGloo(store, rank, 2, opts)


def serve_gloo(a: argparse.Namespace) -> ServerResult:
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    store = dist.TCPStore(a.bind, a.port, 2, True, timedelta(seconds=a.timeout), wait_for_workers=False)
    _emit("ready", port=store.port)
    pg = _gloo_group(store, 0, a.bind, a.timeout)
    man = torch.zeros(3, dtype=torch.int64)
    pg.recv([man], 1, MANIFEST_TAG).wait()
    size, count, digest = (int(x) for x in man)
    digest &= (1 << 64) - 1
    buf = torch.zeros(size, dtype=torch.uint8)
    ack = torch.ones(1)

    def receive() -> None:
        pg.recv([buf], 1, DATA_TAG).wait()
        pg.send([ack], 1, ACK_TAG).wait()

    return _checked_receives(count, size, receive, lambda: _digest(buf.numpy()) == digest,
                             lambda: pg.send([ack], 1, READY_TAG).wait())


def client_gloo(a: argparse.Namespace) -> ClientResult:
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    data = torch.from_numpy(_random_bytes(a.size, a.seed))
    digest = _digest(data.numpy())
    store = dist.TCPStore(a.host, a.port, 2, False, timedelta(seconds=a.timeout))
    pg = _gloo_group(store, 1, a.local_ip, a.timeout)
    pg.send([torch.tensor([a.size, a.repeat + 1, _signed(digest)], dtype=torch.int64)], 0, MANIFEST_TAG).wait()
    ack = torch.zeros(1)

    def send() -> None:
        pg.send([data], 0, DATA_TAG).wait()
        pg.recv([ack], 0, ACK_TAG).wait()

    seconds, cpu = _timed_sends(a.repeat + 1, a.size, send, lambda: pg.recv([ack], 0, READY_TAG).wait())
    return ClientResult(streams=1, samples_mbps=_goodput(a.size, seconds), **cpu.fields())


def _free_port(bind: str) -> int:
    with socket.socket() as s:
        s.bind((bind, 0))
        return s.getsockname()[1]


def serve_iperf3(a: argparse.Namespace) -> ServerResult:
    port = a.port or _free_port(a.bind)
    _emit("ready", port=port)
    received = []
    cpu = _CpuMeter()
    for _ in range(a.count):
        cpu.start()  # waiting for the client costs no CPU
        r = iperf3_server(a.bind, port)
        received.append(0 if r is None or r.error else r.received_bytes)
        cpu.stop(received[-1])
    return ServerResult(verified=all(received), received=len(received), **cpu.fields())


def client_iperf3(a: argparse.Namespace) -> ClientResult:
    samples, verified = [], True
    cpu = _CpuMeter()
    for _ in range(a.repeat):
        cpu.start()
        r = iperf3_client(a.host, a.port, int(a.streams), max(1, round(a.seconds)), connect_timeout=a.timeout)
        if r.error:
            raise BenchError(f"iperf3 -P {a.streams} to {a.host}:{a.port} failed: {r.error}")
        cpu.stop(r.received_bytes)
        samples.append(r.received_Mbps)
        verified &= r.received_bytes > 0  # iperf3 carries no tensor: the test ran and data arrived
    return ClientResult(streams=int(a.streams), samples_mbps=samples, verified=verified, **cpu.fields())


_SERVERS: dict[str, Callable[[argparse.Namespace], ServerResult]] = {"atlas": serve_atlas, "tcp": serve_tcp, "gloo": serve_gloo, "iperf3": serve_iperf3}
_CLIENTS: dict[str, Callable[[argparse.Namespace], ClientResult]] = {"atlas": client_atlas, "tcp": client_tcp, "gloo": client_gloo, "iperf3": client_iperf3}


def worker_main(argv: list[str] | None = None) -> int:
    from testbed_runtime.lifetime import watch_owner

    watch_owner()  # ends promptly once the benchmark that started it is gone
    p = argparse.ArgumentParser(prog="python -m testbed.bench.transport", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="role", required=True)
    for role in ("server", "client"):
        s = sub.add_parser(role)
        s.add_argument("--method", choices=METHODS, required=True)
        s.add_argument("--timeout", type=float, default=120.0)
        s.add_argument("--idle-timeout", type=float, default=30.0)
        s.add_argument("--congestion", default=None)
    srv = sub.choices["server"]
    srv.add_argument("--bind", default="127.0.0.1")
    srv.add_argument("--port", type=int, default=0)
    srv.add_argument("--count", type=int, default=1, help="iperf3: tests to serve")
    cli = sub.choices["client"]
    cli.add_argument("--host", required=True)
    cli.add_argument("--port", type=int, required=True)
    cli.add_argument("--local-ip", default="127.0.0.1", help="gloo: own address")
    cli.add_argument("--streams", default="1")
    cli.add_argument("--size", type=int, default=256 << 20)
    cli.add_argument("--repeat", type=int, default=3)
    cli.add_argument("--seconds", type=float, default=3.0, help="iperf3: test duration")
    cli.add_argument("--seed", type=int, default=1)
    cli.add_argument("--chunk-bytes", type=int, default=None, help="atlas: sender chunk size")
    cli.add_argument("--no-zero-copy", action="store_true", help="atlas: copy payloads with sendmsg")
    a = p.parse_args(argv)
    try:
        result = _SERVERS[a.method](a) if a.role == "server" else _CLIENTS[a.method](a)
    except Exception as exc:
        _emit("error", message=f"{a.role} {a.method}: {type(exc).__name__}: {exc}")
        rc = 1
    else:
        _emit("result", **result.model_dump())
        rc = 0
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(rc)  # skip interpreter teardown: iperf3 wrapper objects break it


# --- orchestration ------------------------------------------------------------------

def local_launcher(argv: list[str], env: dict[str, str], stderr: IO[bytes]) -> subprocess.Popen:
    from testbed_runtime.lifetime import OWNER_ENV, owner_mark

    env = {**env, OWNER_ENV: owner_mark()}  # it ends itself when this process is gone (worker_main)
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=stderr, env=env)


def _worker_argv(role: str, method: str, **opts: Any) -> list[str]:
    argv = [sys.executable, "-m", "testbed.bench.transport", role, "--method", method]
    for k, v in opts.items():
        if v is True:
            argv.append(f"--{k.replace('_', '-')}")
        elif v is not None and v is not False:
            argv += [f"--{k.replace('_', '-')}", str(v)]
    return argv


def _worker_env(secret: str) -> dict[str, str]:
    env = dict(os.environ)
    root = str(REPO_ROOT)
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["ATLAS_SECRET"] = secret
    return env


class _Lines:
    """JSON events of a worker's stdout, read on a thread so we can time out."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.events: deque[dict[str, Any]] = deque()
        self.cv = threading.Condition()
        self.closed = False
        threading.Thread(target=self._pump, args=(proc.stdout,), daemon=True).start()

    def _pump(self, stream: IO[bytes]) -> None:
        for raw in stream:
            try:
                ev = json.loads(raw)
            except ValueError:
                continue
            with self.cv:
                self.events.append(ev)
                self.cv.notify_all()
        with self.cv:
            self.closed = True
            self.cv.notify_all()

    def next(self, deadline: float) -> dict[str, Any] | None:
        with self.cv:
            while not self.events:
                if self.closed:
                    return None
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not self.cv.wait(remaining):
                    if not self.events:
                        return None
            return self.events.popleft()


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()
    try:
        proc.wait(5)
    except subprocess.TimeoutExpired:
        pass


def measure_pair(path: str, method: str, streams: int | str, size: int, repeat: int, *,
                 server_launch: Launcher, client_launch: Launcher, server_ip: str, client_ip: str,
                 secret: str, log_dir: Path, iperf_seconds: float = 3.0, timeout: float | None = None,
                 congestion: str | None = None, chunk_bytes: int | None = None,
                 zero_copy: bool = True, round_index: int = 0) -> Measurement:
    """Run one server/client pair and merge what both report. Never raises for a
    failed measurement: the error is recorded in the Measurement."""
    label = f"{path}-{method}-{streams}" + (f"-round{round_index}" if round_index else "")
    if timeout is None:  # generous: a window-limited WAN stream may crawl at ~20 Mbit/s
        timeout = 60.0 + (repeat + 1) * (size * 8 / 20e6 if method != "iperf3" else iperf_seconds + 5)
    env = _worker_env(secret)
    log_dir.mkdir(parents=True, exist_ok=True)
    m = Measurement(path, method, streams if isinstance(streams, int) else 0, None, None,
                    requested_streams=streams, size_bytes=size if method != "iperf3" else 0, round=round_index)
    deadline = time.monotonic() + timeout
    common = {"timeout": timeout, "congestion": congestion}
    with open(log_dir / f"{label}-server.log", "wb") as serr, open(log_dir / f"{label}-client.log", "wb") as cerr:
        server = server_launch(_worker_argv("server", method, bind=server_ip,
                                            count=repeat if method == "iperf3" else None, **common), env, serr)
        client = None
        try:
            s_lines = _Lines(server)
            ready = s_lines.next(min(deadline, time.monotonic() + 60))
            if not ready or ready.get("event") != "ready":
                raise BenchError(_why(ready, f"{method} server did not start", log_dir / f"{label}-server.log"))
            client = client_launch(_worker_argv(
                "client", method, host=server_ip, port=ready["port"], local_ip=client_ip, streams=streams,
                size=size, repeat=repeat, seconds=iperf_seconds,
                chunk_bytes=chunk_bytes if method == "atlas" else None,
                no_zero_copy=method == "atlas" and not zero_copy, **common), env, cerr)
            c_res = _Lines(client).next(deadline)
            if not c_res or c_res.get("event") != "result":
                raise BenchError(_why(c_res, f"{method} client failed", log_dir / f"{label}-client.log"))
            s_res = s_lines.next(min(deadline, time.monotonic() + 30))
            if not s_res or s_res.get("event") != "result":
                raise BenchError(_why(s_res, f"{method} server failed", log_dir / f"{label}-server.log"))
        except BenchError as exc:
            m.error = str(exc)
            return m
        finally:
            for proc in (client, server):
                if proc is not None:
                    _stop(proc)
    client_result, server_result = ClientResult.model_validate(c_res), ServerResult.model_validate(s_res)
    m.samples_mbps = [round(x, 1) for x in client_result.samples_mbps]
    m.goodput_mbps = round(statistics.median(client_result.samples_mbps), 1)
    m.streams = client_result.streams or m.streams
    m.auto_probe_mbps = client_result.auto_probe_mbps
    m.verified = server_result.verified and client_result.verified
    m.cpu_ms_per_gib = _cpu_per_gib(client_result, server_result)
    return m


def _cpu_per_gib(*sides: _Metered) -> float | None:
    """CPU milliseconds per GiB, both ends together (None if a side did not meter)."""
    total = 0.0
    for side in sides:
        if not side.cpu_bytes:
            return None
        total += side.cpu_s / (side.cpu_bytes / 2**30)
    return round(total * 1000, 1)


def _why(event: dict[str, Any] | None, what: str, log: Path) -> str:
    if event and event.get("event") == "error":
        return event["message"]
    tail = ""
    try:
        lines = log.read_text(errors="replace").strip().splitlines()
        tail = f": {lines[-1]}" if lines else ""
    except OSError:
        pass
    return f"{what} (no result; see {log}){tail}"


def run_suite(path: str, *, streams: list[int | str], size: int, repeat: int, methods: list[str],
              server_launch: Launcher, client_launch: Launcher, server_ip: str, client_ip: str,
              log_dir: Path, iperf_seconds: float = 3.0, congestion: str | None = None,
              chunk_bytes: int | None = None, zero_copy: bool = True, rounds: int = 1,
              on_result: Callable[[Measurement], None] | None = None) -> list[Measurement]:
    """All measurements of one path: atlas per N, tcp, gloo, iperf3 per numeric N,
    `rounds` times over, interleaved (round 0 of every method, then round 1, ...), so
    that load from other processes that comes and goes hits every method alike and
    the ratios of one round compare measurements taken moments apart."""
    secret = os.urandom(16).hex()
    plan: list[tuple[str, int | str]] = []
    for method in methods:
        if method == "atlas":
            plan += [("atlas", n) for n in streams]
        elif method == "iperf3":
            plan += [("iperf3", n) for n in streams if n != "auto"]
        else:
            plan.append((method, 1))
    results = []
    for r in range(rounds):
        for method, n in plan:
            m = measure_pair(path, method, n, size, repeat, server_launch=server_launch, client_launch=client_launch,
                             server_ip=server_ip, client_ip=client_ip, secret=secret, log_dir=log_dir,
                             iperf_seconds=iperf_seconds, congestion=congestion, chunk_bytes=chunk_bytes,
                             zero_copy=zero_copy, round_index=r)
            results.append(m)
            if on_result:
                on_result(m)
    return results


def loopback_suite(**kw: Any) -> list[Measurement]:
    return run_suite("loopback", server_launch=local_launcher, client_launch=local_launcher,
                     server_ip="127.0.0.1", client_ip="127.0.0.1", **kw)


def wan_suite(topology: str | Path, between: tuple[str, str] | None = None, **kw: Any) -> list[Measurement]:
    """The same measurements between host 0 of two DCs of an emulated topology."""
    try:
        from testbed.emulation.network import Emulation
    except ImportError as exc:
        raise BenchError(
            f"the WAN path needs testbed.emulation.network, which cannot be imported here ({exc}); "
            "pass --no-wan to measure loopback only"
        ) from None
    if os.geteuid() != 0:
        raise BenchError("the WAN path builds network namespaces and needs root: run with sudo, or pass --no-wan")
    from testbed.emulation.network import EmulationError
    from testbed_core.topology import TopologyError

    try:
        emu = Emulation.from_file(topology)
        emu.start()
    except (EmulationError, TopologyError, OSError) as exc:
        raise BenchError(f"cannot build the emulation of {topology}: {exc}") from None
    try:
        names = [d.name for d in emu.topology.dcs]
        if between is None:
            if len(names) < 2:
                raise BenchError(f"{topology}: the WAN path needs two DCs, the topology has {len(names)}")
            between = (names[0], names[1])
        try:
            client_host, server_host = emu.host(between[0], 0), emu.host(between[1], 0)
        except (KeyError, IndexError) as exc:
            raise BenchError(f"--between {','.join(between)}: {exc.args[0]}") from None

        def on(host: HostHandle) -> Launcher:
            return lambda argv, env, err: host.popen(argv, stdout=subprocess.PIPE, stderr=err, env=env)

        return run_suite("wan", server_launch=on(server_host), client_launch=on(client_host),
                         server_ip=server_host.ip, client_ip=client_host.ip, **kw)
    finally:
        emu.stop()


if __name__ == "__main__":
    sys.exit(worker_main())
