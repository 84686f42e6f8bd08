"""The worker's end of the runner's control socket (testbed/run/workers.py `Controller`).

JSON lines both ways over a UNIX socket on the shared filesystem (it crosses network
namespaces), each a model of testbed_core/contracts/control.py: the worker says
``hello``, ``ready``, ``iter_done`` per iteration, ``bye`` or ``error``; the runner says
``go`` (an iteration and its common start) and ``stop``."""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from collections.abc import Iterator

from testbed.training.worker.job import WorkerError
from testbed_core.contracts.control import (
    ControlError,
    Go,
    Stop,
    WorkerMessage,
    parse_runner_message,
)

CONTROL_MAP_ENV = "TESTBED_CONTROL_MAP"


class Control:
    """The worker's end of the runner's control socket: JSON lines both ways."""

    def __init__(self, path: str, worker: str, timeout_s: float) -> None:
        self.worker = worker
        # On a real machine (testbed run --inventory) the runner's socket is forwarded over
        # SSH to a path of that machine: CONTROL_MAP_ENV maps the job's path to it.
        path = json.loads(os.environ.get(CONTROL_MAP_ENV) or "{}").get(path, path)
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

    def send(self, msg: WorkerMessage) -> None:
        with self._lock:
            self.sock.sendall(msg.line())

    def messages(self) -> Iterator[Go | Stop]:
        """The runner's messages, in order; WorkerError on a malformed one."""
        for line in self._file:
            if line.strip():
                try:
                    yield parse_runner_message(line)
                except ControlError as exc:
                    raise WorkerError(f"{self.worker}: {exc}") from None

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass
