"""A readiness line relayed over SSH: a program started on another machine (a node on a
server reached by SSH, testbed/emulation/remote/client.py; a real machine of an
inventory, testbed/run/inventory.py) cannot write to the caller's readiness pipe, so
its launcher there writes the line to stderr after READY_MARK. `relay_stderr` makes
the ssh client's stderr a pipe and `start_relay` passes it on to where the caller
wanted stderr, except that line, which goes to the readiness pipe
(testbed_runtime/readiness.py reads it as if the program had written it there)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import threading
from typing import Any

from testbed.emulation.remote.nodeagent import READY_MARK


def relay_stderr(popen_kwargs: dict[str, Any], ready_fd: int) -> tuple[int, int]:
    """Make the ssh client's stderr a pipe (in `popen_kwargs`); return (a descriptor
    of our own of where stderr was meant to go, a copy of `ready_fd`): the caller
    closes its files once the process is started."""
    err = popen_kwargs.get("stderr")
    target = popen_kwargs.get("stdout") if err == subprocess.STDOUT else err
    if target == subprocess.DEVNULL:
        relay_to = os.open(os.devnull, os.O_WRONLY)
    elif target is None or target == subprocess.PIPE:
        relay_to = os.dup(2)
    else:
        relay_to = os.dup(target if isinstance(target, int) else target.fileno())
    popen_kwargs["stderr"] = subprocess.PIPE
    return relay_to, os.dup(ready_fd)


def start_relay(proc: subprocess.Popen, ready_fd: int, relay_to: int, name: str) -> None:
    """Take the started ssh client's stderr pipe away from `proc` and relay it."""
    stderr, proc.stderr = proc.stderr, None
    threading.Thread(target=_relay, args=(stderr, ready_fd, relay_to), daemon=True, name=name).start()


def _relay(source: Any, ready_fd: int, out: int) -> None:
    mark = READY_MARK.encode()
    try:
        for line in iter(source.readline, b""):
            if line.startswith(mark) and ready_fd >= 0:
                with contextlib.suppress(OSError):
                    os.write(ready_fd, line[len(mark):])
                os.close(ready_fd)
                ready_fd = -1
                continue
            with contextlib.suppress(OSError):
                os.write(out, line)
    finally:
        if ready_fd >= 0:
            os.close(ready_fd)  # ended before it was ready: the caller reads end of file
        os.close(out)
        source.close()
