"""Python programs started by forking a process that imported torch once (a zygote),
for the tests that start many small torch programs (the examples' ranks, the backend's
rank programs, the real-training workers): importing torch costs about 3 CPU seconds a process on these machines,
most of what such a short program uses.

A forked child is what ``python SCRIPT ARGS`` would be, as far as the program can tell:
its own environment (``os.environ`` replaced, torch's thread count set from
OMP_NUM_THREADS, which OpenMP read when the zygote loaded it), ``sys.argv``, the
script's folder first on ``sys.path``, ``__name__ == "__main__"``, stdin from /dev/null,
stdout and stderr to files (or, with ``pipes=True``, stdin and stdout pipes to the test,
through two FIFOs: a worker that takes commands, as tests/unit/training's real-training
workers do); at the end Python's own shutdown order (waiting for its
non-daemon threads, then its atexit functions) and the exit status a plain interpreter
gives (1 and the traceback for an exception, SystemExit's code or message). What it
cannot be: the modules the zygote imported are imported already (torch and its
distributed packages; never the code under test, so atlas_transport registers its
backend in the child as it would alone).

``popen(argv, env)`` returns a `Forked` with the subset of ``subprocess.Popen`` these
tests use (pid, poll, wait, communicate, kill, send_signal, returncode; stdin and
stdout with pipes). The zygote is
started on first use, one per test process (one per pytest-xdist worker), and ends with
it. ``TESTBED_TEST_ZYGOTE=0`` starts every program as a plain subprocess instead."""

from __future__ import annotations

import atexit
import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import IO

PRELOAD = ("torch", "torch.distributed", "torch.distributed.fsdp", "torch.distributed.pipelining",
           "torch.distributed.tensor", "torch.distributed.tensor.parallel")
ENABLED = os.environ.get("TESTBED_TEST_ZYGOTE", "1") != "0"


# ---- the zygote process (this file run as a script) ---------------------------------


def _child(req: dict) -> None:
    """In the forked child: become `python argv...` and never return."""
    code = 1
    try:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGCHLD})
        # stdout first: with pipes it is a FIFO the test side opened for reading before it
        # asked for this child, and the test side's open of stdin (the other FIFO) returns
        # only once this child has it, so stdout is in place by then (no early end of file)
        out = os.open(req["out"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(out, 1)
        os.dup2(os.open(req["err"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644) if req["err"] else out, 2)
        os.dup2(os.open(req.get("stdin") or os.devnull, os.O_RDONLY), 0)
        if req.get("stdin"):  # not the zygote's own stdin object (its request pipe, maybe read ahead)
            sys.stdin = open(0, encoding="utf-8", closefd=False)  # noqa: SIM115
        os.chdir(req["cwd"])
        os.environ.clear()
        os.environ.update(req["env"])
        import runpy

        import torch

        atexit._clear()  # the zygote's own, not the program's
        threads = os.environ.get("OMP_NUM_THREADS", "")
        if threads.isdigit() and int(threads) > 0:
            torch.set_num_threads(int(threads))
        script = req["argv"][0]
        sys.argv = list(req["argv"])
        sys.path[0] = os.path.dirname(os.path.abspath(script))
        try:
            runpy.run_path(script, run_name="__main__")
            code = 0
        except SystemExit as exc:
            if exc.code is None:
                code = 0
            elif isinstance(exc.code, int):
                code = exc.code
            else:
                print(exc.code, file=sys.stderr)
                code = 1
        except BaseException:  # noqa: BLE001  (as the interpreter: any exception ends the program)
            import traceback

            traceback.print_exc()
            code = 1
        threading._shutdown()  # type: ignore[attr-defined]  (Python's own exit: non-daemon threads first)
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001
                pass
        os._exit(code & 0xFF)


def _serve() -> None:
    import importlib

    for name in PRELOAD:
        importlib.import_module(name)
    status: dict[int, str] = {}  # pid -> where its exit status goes

    def reap(*_: object) -> None:  # SIGCHLD: each ended child's status, as Popen gives it
        while True:
            try:
                pid, st = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            path = status.pop(pid, None)
            if path:
                Path(path + ".tmp").write_text(str(os.waitstatus_to_exitcode(st)))
                os.replace(path + ".tmp", path)

    signal.signal(signal.SIGCHLD, reap)
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        req = json.loads(line)
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD})  # its status is known before it can end
        pid = os.fork()
        if pid == 0:
            _child(req)
        status[pid] = req["status"]
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGCHLD})
        print(json.dumps({"pid": pid}), flush=True)


# ---- the test side ---------------------------------------------------------------


class Forked:
    """A program forked by the zygote: the part of subprocess.Popen the tests use."""

    def __init__(self, pid: int, folder: Path, merged: bool, text: bool, zygote: subprocess.Popen) -> None:
        self.pid, self._folder, self._merged, self._text, self._zygote = pid, folder, merged, text, zygote
        self.returncode: int | None = None
        self.stdin: IO | None = None  # with pipes: the program's stdin and stdout, as Popen's PIPEs
        self.stdout: IO | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            status = self._folder / "status"  # written by the zygote once it reaped the child
            if status.exists():
                self.returncode = int(status.read_text())
            elif self._zygote.poll() is not None and not _alive(self.pid) and not status.exists():
                self.returncode = -signal.SIGKILL  # the zygote died: no status will come
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(str(self.pid), timeout or 0)
            time.sleep(0.02)
        return self.returncode  # type: ignore[return-value]

    def _read(self, name: str) -> str | bytes:
        data = (self._folder / name).read_bytes()
        return data.decode(errors="replace") if self._text else data

    def communicate(self, timeout: float | None = None) -> tuple[str | bytes, str | bytes | None]:
        if self.stdout is not None:  # its output went through the pipe, not to the file read here
            raise RuntimeError("a program started with pipes: read its .stdout and wait() instead")
        self.wait(timeout)
        return self._read("out"), None if self._merged else self._read("err")

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def _open_pipes(child: Forked, fifo_in: Path, out_fd: int, text: bool, timeout: float = 60.0) -> tuple[IO, IO]:
    """Our ends of a piped child's stdin and stdout. Its stdin opens once the child has
    opened its end, which it does after its stdout (`_child`): from then on a read of its
    stdout waits for what it writes, as a Popen pipe's does, and ends when it exits."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            in_fd = os.open(fifo_in, os.O_WRONLY | os.O_NONBLOCK)
            break
        except OSError as exc:  # ENXIO: the child has not opened its end yet
            if exc.errno != errno.ENXIO:
                raise
            if child.poll() is not None or time.monotonic() > deadline:
                os.close(out_fd)
                raise RuntimeError(f"the forked program {child.pid} did not open its stdin "
                                   f"(exit status {child.poll()})") from None
            time.sleep(0.005)
    os.set_blocking(in_fd, True)
    os.set_blocking(out_fd, True)
    mode = {"encoding": "utf-8"} if text else {"buffering": 0}
    return open(in_fd, "w" if text else "wb", **mode), open(out_fd, "r" if text else "rb", **mode)  # noqa: SIM115


def _alive(pid: int) -> bool:
    """Whether `pid` exists, a zombie included (the zygote reaps its children, and while
    it lives an ended child stays until it has)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


class Zygote:
    def __init__(self) -> None:
        self._proc: subprocess.Popen | None = None
        self._lock = threading.Lock()
        self._root = Path(tempfile.mkdtemp(prefix="zygote-"))
        self._n = 0

    def _start(self) -> subprocess.Popen:
        if self._proc is None or self._proc.poll() is not None:
            root = str(Path(__file__).resolve().parents[1])
            path = [root, *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
            env = dict(os.environ, PYTHONPATH=os.pathsep.join(path), OMP_NUM_THREADS="1")
            self._proc = subprocess.Popen([sys.executable, __file__], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                          text=True, env=env, cwd=root)
            ready = self._proc.stdout.readline()  # type: ignore[union-attr]
            if not ready:
                raise RuntimeError("the test zygote (tests/zygote.py) did not start")
            atexit.register(self.close)
        return self._proc

    def popen(self, argv: list[str], env: dict[str, str], cwd: str | None = None, merge: bool = False,
              text: bool = True, pipes: bool = False, err: str | None = None) -> Forked:
        with self._lock:
            proc = self._start()
            self._n += 1
            folder = self._root / str(self._n)
            folder.mkdir()
            req = {"argv": [str(a) for a in argv], "env": dict(env), "cwd": cwd or os.getcwd(),
                   "out": str(folder / "out"), "err": None if merge else err or str(folder / "err"),
                   "status": str(folder / "status")}
            out_fd = None
            if pipes:  # two FIFOs; ours of stdout opened now, so that the child's open does not wait
                os.mkfifo(folder / "in")
                os.mkfifo(folder / "out")
                req["stdin"] = str(folder / "in")
                out_fd = os.open(folder / "out", os.O_RDONLY | os.O_NONBLOCK)
            proc.stdin.write(json.dumps(req) + "\n")  # type: ignore[union-attr]
            proc.stdin.flush()  # type: ignore[union-attr]
            pid = json.loads(proc.stdout.readline())["pid"]  # type: ignore[union-attr]
        child = Forked(pid, folder, merge, text, proc)
        if out_fd is not None:
            child.stdin, child.stdout = _open_pipes(child, folder / "in", out_fd, text)
        return child

    def close(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.stdin.close()  # type: ignore[union-attr]
            self._proc.wait(10)
        shutil.rmtree(self._root, ignore_errors=True)


_ZYGOTE: Zygote | None = None


def popen(argv: list[str], env: dict[str, str], cwd: str | None = None, merge: bool = False,
          text: bool = True, pipes: bool = False, err: str | None = None) -> Forked | subprocess.Popen:
    """`python argv...` with `env`: forked from the zygote, or a plain subprocess where
    TESTBED_TEST_ZYGOTE=0 (then stdout/stderr are pipes, stderr merged when `merge`).
    With `pipes` its stdin and stdout are pipes (`.stdin`, `.stdout`, as Popen's) and its
    stderr goes to the file `err` (None: a file of the zygote's own, or a pipe)."""
    global _ZYGOTE
    if not ENABLED:
        if pipes:
            with open(err or os.devnull, "w") as stderr:
                return subprocess.Popen([sys.executable, *argv], env=env, cwd=cwd, stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, stderr=stderr, text=text)
        return subprocess.Popen([sys.executable, *argv], env=env, cwd=cwd, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT if merge else subprocess.PIPE, text=text)
    if _ZYGOTE is None:
        _ZYGOTE = Zygote()
    return _ZYGOTE.popen(argv, env, cwd, merge, text, pipes, err)


if __name__ == "__main__":
    _serve()
