"""Starting, streaming, watching and ending the ranks of one launch.

`run_launch` works on a place that can start programs in the emulated hosts' network
namespaces (a `Site`): a running `Emulation` (wrapped by `EmulationSite`) or a
topology kept up by a daemon (`testbed.launch.detach.Attached`). It installs no signal
handler and prints nothing unless `echo`: `testbed run` calls it once per variant.

Each rank's stdout and stderr are read by a thread per pipe, line by line: written
whole to ``rank-<k>.stdout`` / ``rank-<k>.stderr`` in the launch's folder and, with
`echo`, shown with a ``[rank k dc/host]`` prefix (stderr on stderr). Every stdout line
that parses as a JSON object is kept as one of the rank's metrics.

The watch polls every rank; on the first one that exits non-zero or dies by a
signal (or at the timeout), every other rank's process group gets SIGTERM, then
SIGKILL `KILL_AFTER_S` later.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Protocol

from testbed.launch.models import LaunchReport, LaunchSpec, LinkBytes, RankReport, write_report
from testbed.launch.plan import (
    HostSlot,
    LaunchError,
    RankPlan,
    plan_ranks,
    rank_env,
    rank_label,
    resolve_command,
)

if TYPE_CHECKING:
    from testbed.emulation.network import Emulation

POLL_S = 0.05
KILL_AFTER_S = 2.0
READER_JOIN_S = 2.0
TAIL_LINES = 8


class RankProcess(Protocol):
    """A started rank: its PID, its output pipes (bytes), and its exit status."""

    pid: int
    stdout: IO[bytes] | None
    stderr: IO[bytes] | None

    def poll(self) -> int | None: ...

    def signal(self, sig: int) -> None:
        """Send `sig` to the rank's whole process group (its program and children)."""


class Site(Protocol):
    """Where ranks run: the hosts, a way to start a program in one, the WAN counters."""

    topology_name: str
    topology_file: str
    prefix: str
    attached: str | None

    def slots(self) -> list[HostSlot]: ...

    def spawn(self, slot: HostSlot, argv: list[str], env: dict[str, str], cwd: str) -> RankProcess: ...

    def wan_counters(self) -> list[tuple[str, str, str, int, int]]:
        """(link, a, b, bytes sent towards b, bytes sent towards a) per WAN link."""


# --------------------------------------------------------------------------- a running Emulation


class _PopenRank:
    def __init__(self, proc: subprocess.Popen, group: bool) -> None:
        self.proc = proc
        self.pid = proc.pid
        self.stdout = proc.stdout
        self.stderr = proc.stderr
        self._group = group  # mnexec -d made it a session (and group) leader on this machine

    def poll(self) -> int | None:
        return self.proc.poll()

    def signal(self, sig: int) -> None:
        if self.proc.poll() is not None:
            return
        try:
            if self._group:
                os.killpg(self.pid, sig)
            else:  # a program on another server: its agent there signals it
                self.proc.send_signal(sig)
        except (ProcessLookupError, PermissionError):
            pass


class EmulationSite:
    """A running `Emulation` as a `Site`: ranks through `HostHandle.popen` (recorded in
    the run record, ended at teardown at the latest)."""

    def __init__(self, emu: Emulation) -> None:
        from testbed.emulation.naming import RunNames

        self.emu = emu
        self.topology_name = emu.topology.name
        self.topology_file = emu.topology.source
        self.prefix = emu.prefix
        self.attached = None
        self._hosts = {h.name: h for h in emu.hosts()}
        self._slots = [HostSlot(h.name, h.dc, h.ip, RunNames.intf(h.mn_name, 0)) for h in emu.hosts()]
        if not self._slots:
            raise LaunchError("the emulation is not running: build it first (`with Emulation(...) as emu:`)")

    def slots(self) -> list[HostSlot]:
        return list(self._slots)

    def spawn(self, slot: HostSlot, argv: list[str], env: dict[str, str], cwd: str) -> RankProcess:
        host = self._hosts[slot.name]
        proc = host.popen(argv, env=env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE)
        return _PopenRank(proc, group=not host.remote)

    def wan_counters(self) -> list[tuple[str, str, str, int, int]]:
        from testbed.emulation.nodes import WanHandle

        out = []
        for w in self.emu.nodes():
            if not isinstance(w, WanHandle) or w.plan is None or w.link is None:
                continue
            c = w.tx_counters(w.intfs)
            out.append((w.link.name, w.plan.a, w.plan.b, int(c[w.intfs[1]][0]), int(c[w.intfs[0]][0])))
        return out


class MachineHost(Protocol):
    """A host that is not emulated, as HostsSite starts ranks in it."""

    name: str
    dc: str
    ip: str

    def popen(self, argv: list[str], **kwargs: Any) -> subprocess.Popen[bytes]: ...


class HostsSite:
    """Hosts that are not emulated (the real machines of an inventory, reached over SSH):
    anything with ``name``, ``dc``, ``ip`` and ``popen``. No interface is known for
    gloo (``--env GLOO_SOCKET_IFNAME=...`` sets it) and no WAN counters are read."""

    def __init__(self, hosts: Sequence[MachineHost], topology_name: str, topology_file: str = "", prefix: str = "") -> None:
        self.topology_name = topology_name
        self.topology_file = topology_file
        self.prefix = prefix
        self.attached = None
        self._hosts = {h.name: h for h in hosts}
        self._slots = [HostSlot(h.name, h.dc, h.ip, "") for h in hosts]

    def slots(self) -> list[HostSlot]:
        return list(self._slots)

    def spawn(self, slot: HostSlot, argv: list[str], env: dict[str, str], cwd: str) -> RankProcess:
        proc = self._hosts[slot.name].popen(argv, env=env, cwd=cwd, stdin=subprocess.DEVNULL,
                                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        return _PopenRank(proc, group=False)  # signalled through the machine's launcher (send_signal)

    def wan_counters(self) -> list[tuple[str, str, str, int, int]]:
        return []


def as_site(emu: Emulation | Site) -> Site:
    """`emu` itself when it is a Site, else a running Emulation wrapped as one."""
    if hasattr(emu, "spawn") and hasattr(emu, "slots"):
        return emu  # type: ignore[no-any-return]
    return EmulationSite(emu)


# --------------------------------------------------------------------------- output


@dataclass
class _Rank:
    plan: RankPlan
    out_path: Path
    err_path: Path
    proc: RankProcess | None = None
    started: float = 0.0
    ended: float | None = None
    code: int | None = None
    ended_by_launch: bool = False
    metrics: list[dict] = field(default_factory=list)
    metric_times: list[float] = field(default_factory=list)  # Unix time each metric line was read
    tail_out: deque[str] = field(default_factory=lambda: deque(maxlen=TAIL_LINES))
    tail_err: deque[str] = field(default_factory=lambda: deque(maxlen=TAIL_LINES))
    readers: list[threading.Thread] = field(default_factory=list)


class _Echo:
    """Prefixed lines on the terminal, one whole line at a time."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.lock = threading.Lock()

    def line(self, prefix: str, text: str, err: bool) -> None:
        if not self.enabled:
            return
        stream = sys.stderr if err else sys.stdout
        with self.lock:
            try:
                stream.write(f"[{prefix}] {text}\n")
                stream.flush()
            except (OSError, ValueError):
                pass


def _reader(rank: _Rank, pipe: IO[bytes], path: Path, err: bool, echo: _Echo) -> None:
    label = rank_label(rank.plan)
    tail = rank.tail_err if err else rank.tail_out
    with open(path, "ab", buffering=0) as log:
        try:
            for raw in iter(pipe.readline, b""):
                log.write(raw)
                text = raw.decode(errors="replace").rstrip("\r\n")
                tail.append(text)
                if not err:
                    stripped = text.strip()
                    if stripped.startswith("{"):
                        try:
                            value = json.loads(stripped)
                        except ValueError:
                            value = None
                        if isinstance(value, dict):
                            rank.metric_times.append(time.time())
                            rank.metrics.append(value)
                echo.line(label, text, err)
        except (OSError, ValueError):
            pass
        finally:
            try:
                pipe.close()
            except OSError:
                pass


# --------------------------------------------------------------------------- the launch


def free_port() -> int:
    """A TCP port free on this machine now (the ranks' namespaces are fresh: free there too)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _describe_exit(code: int) -> str:
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"was killed by {name}"
    if 128 < code < 128 + 65:  # a shell's (or a server's agent's) way of saying a signal ended it
        try:
            return f"exited with {code} (killed by {signal.Signals(code - 128).name})"
        except ValueError:
            pass
    return f"exited with {code}"


def _who(rank: _Rank) -> str:
    return f"rank {rank.plan.rank} ({rank.plan.host.dc}/{rank.plan.host.name})"


def _tail_text(rank: _Rank) -> tuple[Path, str]:
    lines, path = list(rank.tail_err), rank.err_path
    if not lines:
        lines, path = list(rank.tail_out), rank.out_path
    return path, ("\n  ".join(lines) if lines else "(no output)")


def check_out_dir(out_dir: Path) -> None:
    """Make `out_dir` and write a file in it, so that a folder the ranks' logs cannot go
    to is refused before anything starts (LaunchError)."""
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        probe = out_dir / ".write-test"
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        raise LaunchError(f"--out {out_dir}: cannot write there ({exc.strerror or exc}); give another folder") from None


def run_launch(emu: Emulation | Site, spec: LaunchSpec, *, out_dir: Path, echo: bool = True,
               progress: Callable[[str], None] | None = None,
               line_times: dict[int, list[float]] | None = None) -> LaunchReport:
    """Start `spec.command` once per rank in the hosts of `emu` (a running `Emulation`,
    or an attached detached topology), stream and save their output, wait, and write
    ``out_dir/launch.json``.

    Errors: `LaunchError` for input that cannot run (unknown host, command not found,
    too many ranks, an output folder that cannot be written, a host the rank could not
    be started in), raised before any rank runs (ranks already started are ended
    first). A rank that fails once started is not raised: the report comes back with
    ``ok=False`` and `failure` naming the rank, how it ended and its log (the same for
    a `timeout_s`). KeyboardInterrupt and SystemExit end every rank, write the report
    (``failure`` says "interrupted") and propagate. No signal handler is installed;
    nothing is printed unless `echo`. `line_times`, when given, gets per rank the Unix
    time the launch read each of its metric lines (what `--profile` aligns steps by).
    """
    say = progress or (lambda _msg: None)
    site = as_site(emu)
    resolve_command(spec.command, spec.cwd)
    plans = plan_ranks(site.slots(), spec.hosts, spec.nproc_per_host)
    out_dir = Path(out_dir)
    check_out_dir(out_dir)
    world = len(plans)
    master = plans[0].host
    port = spec.master_port or free_port()
    base = dict(os.environ) if spec.inherit_env else {}
    run_id = f"{site.prefix or 'testbed'}-{int(time.time())}"
    ranks = [_Rank(p, out_dir / f"rank-{p.rank}.stdout", out_dir / f"rank-{p.rank}.stderr") for p in plans]
    for r in ranks:
        r.out_path.write_bytes(b"")
        r.err_path.write_bytes(b"")
    out = _Echo(echo)
    before = {c[0]: c for c in _counters(site)}
    started = time.time()
    t0 = time.monotonic()
    failure: str | None = None
    interrupted: BaseException | None = None
    say(f"starting {world} ranks on {len({p.host.name for p in plans})} hosts; MASTER_ADDR={master.ip} "
        f"MASTER_PORT={port}; logs in {out_dir}")
    try:
        for r in ranks:
            env = rank_env(base, r.plan, world, master.ip, port, spec.env, run_id)
            try:
                r.proc = site.spawn(r.plan.host, list(spec.command), env, spec.cwd)
            except Exception as exc:
                raise LaunchError(f"could not start {_who(r)}: {exc}") from None
            r.started = time.monotonic()
            for pipe, path, err in ((r.proc.stdout, r.out_path, False), (r.proc.stderr, r.err_path, True)):
                if pipe is None:
                    continue
                t = threading.Thread(target=_reader, args=(r, pipe, path, err, out), daemon=True,
                                     name=f"launch-rank{r.plan.rank}-{'err' if err else 'out'}")
                t.start()
                r.readers.append(t)
        failure = _watch(ranks, t0, spec.timeout_s)
    except BaseException as exc:
        interrupted = exc
        if isinstance(exc, LaunchError):
            failure = str(exc)
        else:
            failure = f"interrupted ({_interruption(exc)}): every rank was ended"
    finally:
        _end(ranks)
        for r in ranks:
            for t in r.readers:
                t.join(timeout=READER_JOIN_S)
    finished = time.time()
    after = {c[0]: c for c in _counters(site)}
    wan = [LinkBytes(link=name, a=a, b=b, a_to_b_bytes=max(0, ab - before[name][3]),
                     b_to_a_bytes=max(0, ba - before[name][4]))
           for name, a, b, ab, ba in after.values() if name in before]
    if failure is not None and interrupted is None:
        failure = _explain(failure, ranks, out_dir)
    report = LaunchReport(
        command=list(spec.command), topology=site.topology_name, topology_file=site.topology_file or spec.topology_file,
        attached=site.attached, prefix=site.prefix, started=started, finished=finished,
        wall_s=round(time.monotonic() - t0, 3), ok=failure is None, failure=failure, world_size=world,
        nproc_per_host=spec.nproc_per_host, master_addr=master.ip, master_port=port, env=dict(spec.env),
        ranks=[RankReport(rank=r.plan.rank, local_rank=r.plan.local_rank, host=r.plan.host.name, dc=r.plan.host.dc,
                          ip=r.plan.host.ip, exit_code=r.code, ended_by_launch=r.ended_by_launch,
                          wall_s=round(((r.ended or time.monotonic()) - r.started) if r.started else 0.0, 3),
                          stdout=str(r.out_path), stderr=str(r.err_path), metrics=r.metrics) for r in ranks],
        wan_bytes=wan)
    write_report(report, out_dir)
    if line_times is not None:
        line_times.update({r.plan.rank: list(r.metric_times) for r in ranks})
    if interrupted is not None:
        raise interrupted
    return report


def _interruption(exc: BaseException) -> str:
    """Ctrl-C, or the signal a SystemExit of 128 + N stands for (the CLI's handlers)."""
    if isinstance(exc, KeyboardInterrupt):
        return "Ctrl-C"
    code = getattr(exc, "code", None)
    if isinstance(code, int) and 128 < code < 128 + 65:
        try:
            return signal.Signals(code - 128).name
        except ValueError:
            pass
    return type(exc).__name__


def _counters(site: Site) -> list[tuple[str, str, str, int, int]]:
    try:
        return site.wan_counters()
    except Exception:  # the counters are a report, not a reason to fail the launch
        return []


def _watch(ranks: Sequence[_Rank], t0: float, timeout_s: float | None) -> str | None:
    """Wait for every rank; the first failure (a non-zero exit or a signal), or the
    timeout, as a short reason (None when all exited 0)."""
    deadline = None if timeout_s is None else t0 + timeout_s
    while True:
        now = time.monotonic()
        for r in ranks:
            if r.code is None and r.proc is not None:
                code = r.proc.poll()
                if code is not None:
                    r.code, r.ended = code, now
                    if code != 0:
                        return f"rank:{r.plan.rank}"
        if all(r.code is not None for r in ranks):
            return None
        if deadline is not None and now >= deadline:
            return f"timeout:{timeout_s:g}"
        time.sleep(POLL_S)


def _end(ranks: Sequence[_Rank]) -> None:
    """SIGTERM to every rank still running (its process group), SIGKILL after
    `KILL_AFTER_S`; each one's exit status recorded."""
    live = [r for r in ranks if r.proc is not None and r.code is None]
    for r in live:
        code = r.proc.poll()  # type: ignore[union-attr]
        if code is not None:
            r.code, r.ended = code, time.monotonic()
    live = [r for r in live if r.code is None]
    if not live:
        return
    for r in live:
        r.ended_by_launch = True
        r.proc.signal(signal.SIGTERM)  # type: ignore[union-attr]
    for sig, wait in ((signal.SIGKILL, KILL_AFTER_S), (None, 1.0)):
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            for r in live:
                if r.code is None:
                    code = r.proc.poll()  # type: ignore[union-attr]
                    if code is not None:
                        r.code, r.ended = code, time.monotonic()
            if all(r.code is not None for r in live):
                return
            time.sleep(POLL_S)
        if sig is not None:
            for r in live:
                if r.code is None:
                    r.proc.signal(sig)  # type: ignore[union-attr]


def _explain(reason: str, ranks: Sequence[_Rank], out_dir: Path) -> str:
    """The failure as a user reads it: which rank, how it ended, its log and last lines;
    or for a timeout, which ranks were still running."""
    kind, _, value = reason.partition(":")
    ended = [r for r in ranks if r.ended_by_launch]
    others = (f"; ended the other ranks still running: {', '.join(str(r.plan.rank) for r in ended)}"
              if ended else "")
    if kind == "rank":
        r = next(r for r in ranks if r.plan.rank == int(value))
        path, tail = _tail_text(r)
        return f"{_who(r)} {_describe_exit(r.code or 0)} — its log: {path}{others}; last lines:\n  {tail}"
    if kind == "timeout":
        running = ", ".join(_who(r) for r in ended) or "none"
        done = [r for r in ranks if not r.ended_by_launch and r.code is not None]
        finished = f"; finished before: {', '.join(str(r.plan.rank) for r in done)}" if done else ""
        return (f"timed out after {value} s (--timeout) with ranks still running: {running}{finished}. "
                "A program that never connects waits for its peers: check that every rank rendezvouses at "
                f"MASTER_ADDR:MASTER_PORT (env://) and the ranks' logs in {out_dir}")
    return reason
