"""The node agent: what the emulation runs on a server that is another machine, over
SSH, to reach the nodes there (the caller side is testbed/emulation/remote/client.py).

    python -m testbed.emulation.remote.nodeagent serve
        one per server: configuration requests as JSON lines, each naming its node by
        PID on this server (testbed/emulation/nodeconf.py), one reply line each,
        until stdin ends;
    python -m testbed.emulation.remote.nodeagent exec --pid PID --run PREFIX --token T [--cwd D] -- ARGV
        start ARGV in the node of PID (``mnexec -a``), in a session of its own, with
        the run's mark (TESTBED_RUN=PREFIX), the spawn's token and the environment
        the controller gives on the first line of stdin (a JSON object, read byte by
        byte so the rest of stdin stays the program's; never on a command line: the
        channels' secret is in it). Stdin, stdout and stderr are the SSH session's.
        When the environment asks for a readiness pipe (TESTBED_READY_FD,
        testbed_runtime/readiness.py), the program gets one of this agent's and its line
        comes back on stderr after READY_MARK. When the SSH client on the controller
        goes away (its end of stdout closes) the program's session gets SIGTERM, then
        SIGKILL: a program never outlives the handle that started it. Exits with the
        program's code;
    python -m testbed.emulation.remote.nodeagent signal --token T --sig N
        send signal N to the program a spawn started (Popen.terminate/kill on the
        controller come here, so the program sees the signal and can still answer);
    python -m testbed.emulation.remote.nodeagent clean --run PREFIX [--path P]...
        what `testbed clean` and the teardown do on a server: kill every process with
        the run's mark or a node shell of the run (``mininet:PREFIX...``), delete
        interfaces of the run left in the server's root namespace (tunnel ends not yet
        moved), remove the listed paths (only names that start with the prefix).
        Prints one line per thing done.

Only the standard library is imported for exec, signal and clean (they run for
every program started in a remote node); serve imports pydantic and pyroute2.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

ENV_RUN = "TESTBED_RUN"  # as testbed.emulation.records.ENV_RUN
ENV_SPAWN = "TESTBED_SPAWN"
READY_FD_ENV = "TESTBED_READY_FD"  # as testbed_runtime.readiness.READY_FD_ENV
READY_MARK = "\x1etestbed-ready "  # a readiness line relayed on stderr (as testbed/run/inventory.py does)
PREFIX_RE = re.compile(r"^tb[0-9a-f]{3}$")  # as testbed.emulation.naming.PREFIX_RE
TERM_GRACE_S = 1.0


def _environ(pid: int) -> list[bytes]:
    try:
        return Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return []


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _ppid(pid: int) -> int:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return int(stat[stat.rfind(")") + 2:].split()[1])
    except (OSError, ValueError, IndexError):
        return 0


def _pids() -> list[int]:
    return [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit()]


def marked(key: str, value: str) -> list[int]:
    """PIDs whose environment holds key=value (not this process)."""
    mark = f"{key}={value}".encode()
    return [pid for pid in _pids() if pid != os.getpid() and mark in _environ(pid)]


def _kill_all(pids: list[int]) -> list[int]:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + (TERM_GRACE_S if sig == signal.SIGTERM else 3.0)
        while time.monotonic() < deadline:
            pids = [p for p in pids if Path(f"/proc/{p}").exists() and not _zombie(p)]
            if not pids:
                return []
            time.sleep(0.02)
    return pids


def _zombie(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat[stat.rfind(")") + 2:].split()[0] == "Z"


def _env_line() -> dict[str, str]:
    raw = b""
    while not raw.endswith(b"\n"):
        c = os.read(0, 1)
        if not c:
            raise SystemExit("nodeagent exec: no environment on stdin (the controller sends it first)")
        raw += c
    value = json.loads(raw)
    if not isinstance(value, dict):
        raise SystemExit("nodeagent exec: the environment line is not a JSON object")
    return {str(k): str(v) for k, v in value.items()}


def cmd_exec(args: argparse.Namespace) -> int:
    env = dict(os.environ)
    env.update(_env_line())
    env[ENV_RUN] = args.run
    env[ENV_SPAWN] = args.token
    ready_r = ready_w = -1
    if READY_FD_ENV in env:  # the controller waits for a readiness line: a pipe of ours, relayed on stderr
        ready_r, ready_w = os.pipe()
        env[READY_FD_ENV] = str(ready_w)
    try:
        child = subprocess.Popen(["mnexec", "-a", str(args.pid), *args.argv], env=env, cwd=args.cwd or None,
                                 start_new_session=True, pass_fds=(ready_w,) if ready_w >= 0 else ())
    except OSError as exc:
        print(f"nodeagent: cannot start {args.argv[0]!r} in the node of pid {args.pid}: {exc}", file=sys.stderr)
        return 127
    finally:
        if ready_w >= 0:
            os.close(ready_w)

    def forward(signum: int, _frame: object) -> None:
        try:
            os.killpg(child.pid, signum)
        except ProcessLookupError:
            pass

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, forward)
    poller = select.poll()
    poller.register(sys.stdout.fileno(), 0)  # POLLERR/POLLHUP: the SSH session's reader is gone
    if ready_r >= 0:
        poller.register(ready_r, select.POLLIN)
    ready_buf = b""
    while child.poll() is None:
        try:
            events = poller.poll(200)
        except InterruptedError:
            continue
        gone = False
        for fd, _ in events:
            if fd == ready_r:
                data = os.read(ready_r, 4096)
                if data:
                    ready_buf += data
                    continue
                if ready_buf:
                    os.write(2, READY_MARK.encode() + ready_buf.rstrip(b"\n") + b"\n")
                poller.unregister(ready_r)
                os.close(ready_r)
                ready_r = -1
            else:
                gone = True
        if gone:
            forward(signal.SIGTERM, None)
            deadline = time.monotonic() + TERM_GRACE_S
            while child.poll() is None and time.monotonic() < deadline:
                time.sleep(0.02)
            forward(signal.SIGKILL, None)
            break
    code = child.wait()
    if ready_r >= 0:  # the program ended before its pipe was read to the end
        ready_buf += os.read(ready_r, 4096) if select.select([ready_r], [], [], 0)[0] else b""
        if ready_buf.endswith(b"\n"):
            os.write(2, READY_MARK.encode() + ready_buf)
    return 128 - code if code < 0 else code


def cmd_signal(args: argparse.Namespace) -> int:
    """Signal the top of a spawn's processes (its program; not its children, as
    Popen.send_signal on this machine would not)."""
    pids = marked(ENV_SPAWN, args.token)
    tops = [pid for pid in pids if _ppid(pid) not in pids]
    for pid in tops:
        try:
            os.kill(pid, args.sig)
        except ProcessLookupError:
            pass
    print(f"signalled {len(tops)}")
    return 0 if tops else 3


def cmd_clean(args: argparse.Namespace) -> int:
    prefix = args.run
    if not PREFIX_RE.fullmatch(prefix):
        print(f"nodeagent clean: {prefix!r} is not a run prefix", file=sys.stderr)
        return 2
    procs = marked(ENV_RUN, prefix)
    shells = [pid for pid in _pids() if f"mininet:{prefix}" in _cmdline(pid) and pid != os.getpid()]
    left = _kill_all(procs)
    for pid in procs:
        print(f"killed pid {pid}")
    left += _kill_all(shells)
    for pid in shells:
        print(f"killed node shell {pid}")
    failed = bool(left)
    for pid in left:
        print(f"pid {pid} survived SIGKILL", file=sys.stderr)
    net = Path("/sys/class/net")
    for dev in sorted(p.name for p in net.iterdir()) if net.is_dir() else []:
        if dev.startswith(prefix):
            res = subprocess.run(["ip", "link", "del", dev], capture_output=True, text=True, check=False)
            print(f"deleted interface {dev}" if res.returncode == 0 else f"interface {dev}: {res.stderr.strip()}")
    for raw in args.path:
        path = Path(raw)
        if not path.is_absolute() or not path.name.startswith(prefix):
            print(f"nodeagent clean: {raw}: not a path of run {prefix}; left alone", file=sys.stderr)
            failed = True
            continue
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
            print(f"removed folder {path}")
        elif os.path.lexists(path):
            path.unlink()
            print(f"removed file {path}")
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m testbed.emulation.remote.nodeagent")
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("serve")
    ex = sub.add_parser("exec")
    ex.add_argument("--pid", type=int, required=True)
    ex.add_argument("--run", required=True)
    ex.add_argument("--token", required=True)
    ex.add_argument("--cwd", default="")
    ex.add_argument("argv", nargs=argparse.REMAINDER)
    sg = sub.add_parser("signal")
    sg.add_argument("--token", required=True)
    sg.add_argument("--sig", type=int, required=True)
    cl = sub.add_parser("clean")
    cl.add_argument("--run", required=True)
    cl.add_argument("--path", action="append", default=[])
    args = parser.parse_args(argv)
    if args.cmd == "serve":
        from testbed.emulation.nodeconf import serve

        return serve(sys.stdin, sys.stdout)
    if args.cmd == "exec":
        if args.argv and args.argv[0] == "--":
            args.argv = args.argv[1:]
        if not args.argv:
            parser.error("exec: the program to start follows --")
        return cmd_exec(args)
    if args.cmd == "signal":
        return cmd_signal(args)
    return cmd_clean(args)


if __name__ == "__main__":
    sys.exit(main())
