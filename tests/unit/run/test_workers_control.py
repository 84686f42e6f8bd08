"""The control socket (testbed/run/workers.py `Controller`, the worker's end
testbed/training/worker/control.py) speaking the typed messages of
testbed_core/contracts/control.py over a real UNIX socket."""

from __future__ import annotations

import socket
import threading
from pathlib import Path

import pytest

from testbed.progress import Progress
from testbed.run.common import RunnerError
from testbed.run.workers import Controller
from testbed.training.worker.control import Control
from testbed.training.worker.job import WorkerError
from testbed_core.contracts.control import (
    ControlError,
    Go,
    Hello,
    IterDone,
    Ready,
    Stop,
    WorkerFailed,
    parse_runner_message,
    parse_worker_message,
)


def controller(tmp_path: Path, workers: list[str]) -> Controller:
    return Controller(str(tmp_path / "ctl.sock"), workers, {}, {w: tmp_path / f"{w}.log" for w in workers},
                      Progress(enabled=False))


def test_messages_round_trip_and_unknown_or_incomplete_ones_are_refused() -> None:
    done = IterDone(worker="p0r1", iteration=3, end=12.5, busy=0.4, token_timeouts=0, loss=None, allreduce_s=0.2)
    assert parse_worker_message(done.line()) == done
    assert parse_runner_message(Go(iteration=1, at=5.0).line()) == Go(iteration=1, at=5.0)
    with pytest.raises(ControlError, match=r"malformed control message from the worker: .*iter_done.*end: Field "
                                           r"required.*same checkout"):
        parse_worker_message(b'{"type": "iter_done", "worker": "w", "iteration": 1, "busy": 0, '
                             b'"token_timeouts": 0, "loss": null, "allreduce_s": null}')
    with pytest.raises(ControlError, match="from the runner"):
        parse_runner_message('{"type": "hello", "worker": "w", "pid": 1, "host": "h"}')
    with pytest.raises(ControlError, match="from the worker"):
        parse_worker_message("not json")


def test_the_runner_waits_for_every_worker_and_starts_them_together(tmp_path: Path) -> None:
    ctl = controller(tmp_path, ["p0r0", "p0r1"])
    got: dict[str, list] = {}

    def worker(name: str) -> None:
        c = Control(ctl.path, name, 5.0)
        c.send(Hello(worker=name, pid=1, host="dc1-h1"))
        c.send(Ready(worker=name))
        got[name] = []
        for msg in c.messages():
            got[name].append(msg)
            if isinstance(msg, Stop):
                break
            c.send(IterDone(worker=name, iteration=msg.iteration, end=msg.at + 1, busy=0.5, token_timeouts=0,
                            loss=None, allreduce_s=None))
        c.close()

    threads = [threading.Thread(target=worker, args=(w,)) for w in ("p0r0", "p0r1")]
    for t in threads:
        t.start()
    try:
        ready = ctl.wait_all(Ready, 10, "starting")
        assert set(ready) == {"p0r0", "p0r1"}
        ctl.broadcast(Go(iteration=0, at=100.0))
        done = ctl.wait_all(IterDone, 10, "iteration 0", iteration=0)
        assert {w: m.end for w, m in done.items()} == {"p0r0": 101.0, "p0r1": 101.0}
        ctl.broadcast(Stop())
    finally:
        for t in threads:
            t.join(10)
        ctl.close()
    assert got["p0r0"] == [Go(iteration=0, at=100.0), Stop()]


def test_a_worker_error_or_a_malformed_line_stops_the_run_with_its_message(tmp_path: Path) -> None:
    ctl = controller(tmp_path, ["w"])
    (tmp_path / "w.log").write_text("Traceback ...\nValueError: bad stage\n")
    c = Control(ctl.path, "w", 5.0)
    try:
        c.send(WorkerFailed(worker="w", message="ValueError: bad stage", trace="..."))
        with pytest.raises(RunnerError, match=r"worker w failed: ValueError: bad stage(.|\n)*bad stage"):
            ctl.wait_all(Ready, 5, "starting")
    finally:
        c.close()
        ctl.close()
    ctl = controller(tmp_path, ["w"])
    raw = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    raw.connect(ctl.path)
    try:
        raw.sendall(b'{"type": "ready"}\n')
        with pytest.raises(RunnerError, match=r"malformed control message from the worker: .*worker: Field required"):
            ctl.wait_all(Ready, 5, "starting")
    finally:
        raw.close()
        ctl.close()


def test_the_worker_refuses_a_malformed_runner_message(tmp_path: Path) -> None:
    path = str(tmp_path / "r.sock")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(1)
    c = Control(path, "w", 5.0)
    conn, _ = server.accept()
    try:
        conn.sendall(b'{"type": "go", "iteration": -1, "at": 1}\n')
        with pytest.raises(WorkerError, match=r"w: malformed control message from the runner: .*iteration"):
            next(c.messages())
    finally:
        conn.close()
        c.close()
        server.close()
