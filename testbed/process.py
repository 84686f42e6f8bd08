"""Start a process and know when it is ready: the parent's half of the readiness pipe
(the child's half is ``testbed_runtime.readiness.announce_ready``).

``start(argv, ...)`` creates a pipe, starts the child with the pipe's write end passed
to it (``pass_fds``) and its number in ``TESTBED_READY_FD``, and returns a
``Process``. ``Process.wait_ready(timeout)`` returns the JSON object the child
announced, or raises ``ProcessError`` naming the process, saying whether it exited
(with its exit code or signal) or was still not ready when the time ran out, and
quoting the tail of its log. No polling of files or ports: the child's line arrives on
the pipe, and a child that dies closes its end, which the parent sees at once.

``popen`` is anything called like ``subprocess.Popen(argv, **kwargs)``:
``subprocess.Popen`` itself, a Mininet node's ``popen`` (mininet's ``Node.popen``
hands its keyword arguments to ``subprocess.Popen`` and runs the command through
``mnexec``, which keeps inherited file descriptors unless given ``-c``), or the
testbed's ``NodeHandle.popen`` and ``LocalHost.popen``. ``stdout`` and ``stderr`` are
always passed explicitly (the log file, or None to inherit), so a wrapper's default
of PIPE (Mininet's) never leaves a child blocked on a pipe nobody reads.

Both pipe ends are close-on-exec in the parent, so processes started at the same
time from other threads never inherit them; only the child named here gets the
write end, and the parent closes its own copy at once, so the child's exit is an end
of file on the read end.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from testbed_runtime.readiness import READY_FD_ENV

Popen = Callable[..., subprocess.Popen]

TAIL_LINES = 20
"""Lines of the child's log quoted in an error."""
_TAIL_BYTES = 8192


class ProcessError(RuntimeError):
    """A process that could not be started or did not become ready. The message says
    which, what happened and quotes its log; the attributes carry the same facts."""

    def __init__(self, message: str, *, name: str, returncode: int | None = None, timed_out: bool = False,
                 log_tail: str = "") -> None:
        super().__init__(message)
        self.name = name
        self.returncode = returncode
        self.timed_out = timed_out
        self.log_tail = log_tail


@dataclass(eq=False)
class Process:
    """A started child and the read end of its readiness pipe."""

    name: str
    popen: subprocess.Popen
    log_path: Path | None
    _ready_fd: int | None = field(repr=False)
    info: dict[str, Any] | None = None
    _failure: ProcessError | None = field(default=None, repr=False)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def poll(self) -> int | None:
        return self.popen.poll()

    def wait_ready(self, timeout: float) -> dict[str, Any]:
        """The object the child passed to ``announce_ready``, once it has; waits up to
        `timeout` seconds. A second call returns the same object (or raises the same
        error). On failure the process is left as it is: stop it with ``stop()``."""
        if self.info is not None:
            return self.info
        if self._failure is not None:
            raise self._failure
        try:
            self.info = self._wait(timeout)
            return self.info
        except ProcessError as exc:
            self._failure = exc
            raise
        finally:
            self.close()

    def _wait(self, timeout: float) -> dict[str, Any]:
        fd = self._ready_fd
        assert fd is not None
        deadline = time.monotonic() + timeout
        buf = bytearray()
        eof = False
        while b"\n" not in buf:
            left = deadline - time.monotonic()
            if not eof:
                readable, _, _ = select.select([fd], [], [], min(max(left, 0.0), 0.2))
                if readable:
                    chunk = os.read(fd, 65536)
                    buf += chunk
                    eof = not chunk
                    continue
            else:
                time.sleep(min(max(left, 0.0), 0.05))
            code = self.popen.poll()
            if code is not None:
                buf += _drain(fd)  # a line written just before the exit still counts
                if buf.strip():
                    break
                raise self._error(f"exited {_how(code)} before it was ready", returncode=code)
            if time.monotonic() >= deadline:
                if eof:
                    what = (f"closed its readiness pipe without announcing ready, and is still running "
                            f"after {timeout:g} s (does it close inherited file descriptors?)")
                else:
                    what = (f"was not ready within {timeout:g} s and is still running "
                            "(raise the timeout if it is only slow)")
                raise self._error(what, timed_out=True)
        line = bytes(buf).split(b"\n", 1)[0]
        try:
            info = json.loads(line)
        except ValueError:
            info = None
        if not isinstance(info, dict):
            raise self._error(f"announced readiness with a line that is not a JSON object: {line[:200]!r}",
                              returncode=self.popen.poll())
        return info

    def _error(self, what: str, *, returncode: int | None = None, timed_out: bool = False) -> ProcessError:
        tail = self.log_tail()
        if self.log_path is None:
            quoted = "its output was not captured (start it with log_path= to see it here)"
        elif tail:
            quoted = f"last lines of {self.log_path}:\n" + "\n".join(f"  | {x}" for x in tail.splitlines())
        else:
            quoted = f"its log {self.log_path} is empty"
        return ProcessError(f"{self.name} (pid {self.pid}) {what}; {quoted}", name=self.name,
                            returncode=returncode, timed_out=timed_out, log_tail=tail)

    def log_tail(self, lines: int = TAIL_LINES) -> str:
        """The last `lines` lines of the child's log ('' when there is none)."""
        if self.log_path is None:
            return ""
        try:
            with open(self.log_path, "rb") as fh:
                fh.seek(0, os.SEEK_END)
                fh.seek(max(0, fh.tell() - _TAIL_BYTES))
                data = fh.read()
        except OSError:
            return ""
        return "\n".join(data.decode(errors="replace").splitlines()[-lines:])

    def stop(self, grace_s: float = 5.0) -> int:
        """SIGTERM, then SIGKILL after `grace_s` seconds; the exit code (negative: the signal)."""
        if self.popen.poll() is None:
            self.popen.terminate()
            try:
                self.popen.wait(grace_s)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()
        self.close()
        return self.popen.returncode

    def close(self) -> None:
        """Release the read end of the readiness pipe (wait_ready and stop do it)."""
        if self._ready_fd is not None:
            os.close(self._ready_fd)
            self._ready_fd = None


def start(
    argv: Sequence[str | os.PathLike[str]],
    *,
    popen: Popen = subprocess.Popen,
    env: dict[str, str] | None = None,
    log_path: str | os.PathLike[str] | None = None,
    name: str | None = None,
    **popen_kwargs: Any,
) -> Process:
    """Start `argv` through `popen` with a readiness pipe; wait with ``wait_ready``.

    `env` defaults to this process's environment; ``TESTBED_READY_FD`` is added to it.
    With `log_path` the child's stdout and stderr both go to that file (truncated),
    which errors then quote; without it they are inherited. `name` (default: the
    program, or the module of ``python -m``) is how errors name the process. Other
    keyword arguments (``cwd``, ...) go to `popen` unchanged.
    """
    args = [os.fspath(a) for a in argv]
    if not args:
        raise ValueError("start() needs a command: argv is empty")
    name = name or _default_name(args)
    if log_path is not None and ({"stdout", "stderr"} & popen_kwargs.keys()):
        raise ValueError(f"{name}: pass log_path or stdout/stderr, not both")
    extra_fds = tuple(popen_kwargs.pop("pass_fds", ()))
    r, w = os.pipe()  # both close-on-exec: only the child below gets w, through pass_fds
    try:
        if w < 3:  # never hand over a standard stream's number (this process had closed one)
            high = os.dup(w)  # os.dup returns the lowest free number: 3 or more here
            os.close(w)
            w = high
        child_env = dict(os.environ if env is None else env)
        child_env[READY_FD_ENV] = str(w)
        log = None
        if log_path is not None:
            log = open(log_path, "wb")  # closed below: the child keeps its own copy
            popen_kwargs.update(stdout=log, stderr=subprocess.STDOUT)
        else:
            popen_kwargs.setdefault("stdout", None)
            popen_kwargs.setdefault("stderr", None)
        try:
            proc = popen(args, env=child_env, pass_fds=(*extra_fds, w), **popen_kwargs)
        except OSError as exc:
            raise ProcessError(f"could not start {name} ({args[0]}): {exc}", name=name) from exc
        finally:
            if log is not None:
                log.close()
    except BaseException:
        os.close(r)
        raise
    finally:
        os.close(w)  # the child holds the only write end now: its exit is our end of file
    return Process(name, proc, Path(log_path) if log_path is not None else None, r)


def _default_name(argv: list[str]) -> str:
    if len(argv) > 2 and argv[1] == "-m":
        return argv[2]
    return os.path.basename(argv[0]) or argv[0]


def _how(code: int) -> str:
    if code < 0:
        try:
            return f"on signal {signal.Signals(-code).name}"
        except ValueError:
            return f"on signal {-code}"
    return f"with code {code}"


def _drain(fd: int) -> bytes:
    """What is left in the pipe after the child exited (stops at end of file, or when
    nothing more is there: a grandchild may still hold the write end)."""
    out = bytearray()
    while select.select([fd], [], [], 0)[0]:
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        out += chunk
    return bytes(out)
