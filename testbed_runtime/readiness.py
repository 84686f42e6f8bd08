"""The child's half of "start a process and know it is ready": one JSON line on a pipe.

A parent that starts a process (``testbed.process.start``) creates a pipe, hands the
write end to the child (``pass_fds``) and names its number in the environment variable
``TESTBED_READY_FD``. Once the child can do its job (its sockets listen, its model is
loaded), it calls ``announce_ready(**info)``: one JSON object, newline-terminated, is
written to that file descriptor, which is then closed. The parent learns "ready" and
``info`` (a port, a pid, whatever the child chooses) at once, without polling a file
or a port, and learns "died before it was ready" from the pipe's end of file.

It lives in the runtime layer, below the ``testbed`` package, so that every process of
the testbed, the worker, the BubbleTea agent and anything a ``bubbletea_agent`` module
starts, can announce readiness without importing ``testbed``. It writes to an inherited
file descriptor and to nothing else.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
from typing import Any

READY_FD_ENV = "TESTBED_READY_FD"
"""Environment variable naming the file descriptor a child announces readiness on."""


class ReadinessError(RuntimeError):
    """The readiness pipe named in the environment cannot be used."""


def announce_ready(**info: Any) -> bool:
    """Tell the parent this process is ready: write ``info`` as one JSON line to the
    file descriptor named by ``TESTBED_READY_FD`` and close it.

    Returns True when the line was written; False when no parent asked (the variable
    is not set, e.g. the process was started by hand) or the parent stopped listening
    (it gave up waiting and closed its end). The variable is removed from the
    environment, so a second call, and any child this process starts later, does
    nothing, and never writes to an unrelated file that reused the number.

    Raises ReadinessError when the variable is not a file descriptor number (3 or more)
    or names no open pipe (the parent set the variable without passing the pipe; such
    a descriptor is left open), and TypeError, before touching the pipe or the
    environment, when ``info`` is not JSON-serialisable.
    """
    line = (json.dumps(info, separators=(",", ":")) + "\n").encode()  # TypeError before any effect
    raw = os.environ.pop(READY_FD_ENV, None)
    if raw is None or raw == "":
        return False
    try:
        fd = int(raw)
    except ValueError:
        fd = -1
    if fd < 3:  # never stdin, stdout or stderr: the parent always passes a fresh pipe
        raise ReadinessError(
            f"{READY_FD_ENV}={raw!r} is not the number of a passed pipe (an integer of 3 or more); "
            "it is set by testbed.process.start: unset it to run this process by hand"
        )
    try:
        is_pipe = stat.S_ISFIFO(os.fstat(fd).st_mode)
    except OSError:
        is_pipe = False
    if not is_pipe:  # not open, or a file of this process's own: leave it alone
        raise ReadinessError(
            f"{READY_FD_ENV}={fd} names no open pipe; the parent must pass the pipe's write end "
            "to the child (subprocess pass_fds), as testbed.process.start does"
        )
    try:
        view = memoryview(line)
        while view:
            view = view[os.write(fd, view):]
    except BrokenPipeError:
        return False
    except OSError as exc:
        raise ReadinessError(f"{READY_FD_ENV}={fd}: cannot write the readiness line: {exc.strerror}") from None
    finally:
        with contextlib.suppress(OSError):
            os.close(fd)
    return True
