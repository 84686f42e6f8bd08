"""Reaching the nodes of a server that is another machine: everything goes over that
server's SSH, nothing through this machine's /proc (a remote node's PID is the
server's PID).

* `RemoteAgent`: one node agent per server (``python -m testbed.emulation.remote.nodeagent
  serve``, as root there), answering the configuration requests of
  testbed/emulation/nodeconf.py over the session's stdin/stdout, one JSON line each
  way, each request naming its node by its PID on that server. It lives as long as
  the emulation.
* `RemoteProcess`: a program started in a remote node (``nodeagent exec``), a
  `subprocess.Popen` of the local ssh client whose stdin/stdout/stderr are the
  program's. `send_signal` (so `terminate` and `kill`) signals the program itself on
  the server (``nodeagent signal``), so a program stopped with SIGTERM can still
  write its last output; when the ssh client dies the agent on the server ends the
  program.
The login (testbed/emulation/remote/sshlogin.py) is also stored in the run record, so that
`testbed clean` can undo a run on the server (``nodeagent clean``) after the
controller was killed.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import threading
from collections import deque
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from testbed.emulation.errors import EmulationError
from testbed.emulation.nodeconf import NodeOp, NodeReply, NodeRequest
from testbed.emulation.remote.nodeagent import READY_FD_ENV
from testbed.emulation.remote.readyrelay import relay_stderr, start_relay
from testbed.emulation.remote.sshlogin import RemoteLogin

AGENT_READY_S = 30.0
SIGNAL_TIMEOUT_S = 20.0


class RemoteAgent:
    """The configuration agent of one server reached over SSH."""

    def __init__(self, login: RemoteLogin, prefix: str, control_dir: Path | None) -> None:
        self.login = login
        self.node_name = login.server  # what its errors name until a request names a node
        self._lock = threading.Lock()
        argv = login.ssh_argv(["env", f"TESTBED_RUN={prefix}", *login.agent("serve")], control_dir)
        env = dict(os.environ, TESTBED_RUN=prefix)
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True, bufsize=1, env=env, start_new_session=True)
        self._ready = False  # awaited at the first request: the agents of all nodes start side by side
        self._errors: deque[str] = deque(maxlen=50)  # its stderr, drained so that it never blocks on it
        threading.Thread(target=self._drain, daemon=True, name=f"agent-stderr-{login.server}").start()

    def _drain(self) -> None:
        assert self.proc.stderr is not None
        try:
            for line in self.proc.stderr:
                self._errors.append(line.rstrip())
        except (OSError, ValueError):
            pass
        finally:
            self.proc.stderr.close()

    def _await_ready(self) -> None:
        line = self._readline(AGENT_READY_S)
        if '"ready"' not in line:
            try:
                self.proc.wait(timeout=2)  # its last words reach the drain
            except subprocess.TimeoutExpired:
                pass
            err = "\n".join(self._errors)
            raise EmulationError(
                f"server {self.login.server}: the node agent did not start "
                f"({(err or line).strip()[-500:] or 'no output'}); every server needs Python with this package "
                f"installed (servers.python, now {self.login.python!r}) and mininet")
        self._ready = True

    def _readline(self, timeout: float) -> str:
        import select

        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        return self.proc.stdout.readline() if ready else ""

    def request(self, node: str, pid: int, ops: Sequence[NodeOp], timeout: float = 60.0) -> NodeReply:
        """Apply `ops` in node `node` (Mininet name), PID `pid` on the server."""
        line = NodeRequest(ops=list(ops), pid=pid).model_dump_json()
        with self._lock:
            if not self._ready:
                self._await_ready()
            if self.proc.poll() is not None or self.proc.stdin is None:
                raise EmulationError(f"node {node} on server {self.login.server}: the server's node agent has exited: "
                                     f"{' '.join(self._errors)[-300:] or 'no message'}")
            self.proc.stdin.write(line + "\n")
            self.proc.stdin.flush()
            answer = self._readline(timeout)
        if not answer:
            raise EmulationError(f"node {node} on server {self.login.server}: no answer from the server's node agent "
                                 f"within {timeout:g}s")
        return NodeReply.model_validate_json(answer)

    def close(self) -> None:
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None:
                try:
                    stream.close()
                except OSError:
                    pass
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class RemoteProcess(subprocess.Popen):
    """A program in a remote node, seen through its ssh client (see the module doc)."""

    def __init__(self, login: RemoteLogin, control_dir: Path | None, pid: int, prefix: str,
                 argv: Sequence[str], env_extra: dict[str, str], cwd: str | None, **popen_kwargs: Any) -> None:
        self.login = login
        self.token = secrets.token_hex(8)
        self._control_dir = control_dir
        command = login.agent("exec", "--pid", str(pid), "--run", prefix, "--token", self.token,
                              *(["--cwd", cwd] if cwd else []), "--", *argv)
        keep_stdin = popen_kwargs.pop("stdin", None) == subprocess.PIPE
        passed = tuple(popen_kwargs.pop("pass_fds", ()))  # descriptors do not cross ssh
        ready_fd = int(env_extra[READY_FD_ENV]) if env_extra.get(READY_FD_ENV, "").isdigit() else None
        if ready_fd is not None and ready_fd not in passed:
            ready_fd = None
        relay_to = -1
        if ready_fd is not None:  # the readiness line comes back on ssh's stderr
            relay_to, ready_fd = relay_stderr(popen_kwargs, ready_fd)
        popen_kwargs["start_new_session"] = True  # killpg(pid) reaches the ssh client only
        env = dict(popen_kwargs.pop("env", None) or os.environ)
        env["TESTBED_RUN"] = prefix
        super().__init__(login.ssh_argv(command, control_dir), env=env, stdin=subprocess.PIPE, **popen_kwargs)
        if ready_fd is not None:
            start_relay(self, ready_fd, relay_to, f"ready-relay-{self.token}")
        # the environment: first line of stdin, never a command line
        send_first_line(self, json.dumps(env_extra) + "\n", keep_stdin)

    def send_signal(self, sig: int) -> None:
        if self.poll() is not None:
            return
        try:
            res = subprocess.run(self.login.ssh_argv(self.login.agent("signal", "--token", self.token,
                                                                      "--sig", str(int(sig))), self._control_dir),
                                 capture_output=True, text=True, timeout=SIGNAL_TIMEOUT_S, check=False,
                                 stdin=subprocess.DEVNULL)
            if res.returncode == 0:
                return
        except subprocess.TimeoutExpired:
            pass
        if self.poll() is None:  # the program could not be reached: end the ssh client (the agent ends it)
            super().send_signal(sig)


def send_first_line(proc: subprocess.Popen[Any], line: str, keep_stdin: bool) -> None:
    """Write `line` to the ssh client `proc`'s stdin (what the remote side reads first:
    the program's environment), then close stdin unless the program keeps it. An ssh
    that ended already is no error here: its exit status and stderr say why."""
    assert proc.stdin is not None
    try:
        proc.stdin.write(line if proc.text_mode else line.encode())
        proc.stdin.flush()
        if not keep_stdin:
            proc.stdin.close()
            proc.stdin = None
    except (BrokenPipeError, OSError):
        pass


def remote_argv(argv: Sequence[str], python: str) -> list[str]:
    """`argv` for a remote node: this machine's Python (sys.executable, as the
    emulation's own helpers are started) becomes the server's."""
    argv = [str(a) for a in argv]
    if argv and argv[0] == sys.executable:
        argv[0] = python
    return argv


def env_extra(env: dict[str, str] | None) -> dict[str, str]:
    """What a caller's environment adds to or changes in this process's: the part a
    remote program is given (the rest is the server's own)."""
    if env is None:
        return {}
    return {k: v for k, v in env.items() if os.environ.get(k) != v}


__all__ = ["RemoteAgent", "RemoteLogin", "RemoteProcess", "env_extra", "remote_argv", "send_first_line"]
