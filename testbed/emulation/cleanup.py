"""Cleaning up after a run, from its record (testbed/emulation/records.py): what
`testbed clean` and a run's own teardown do.

`clean` trusts nothing it has not verified: a recorded PID is only killed when its
start time (field 22 of /proc/<pid>/stat) matches the record AND it carries the run's
mark (the prefix in its command line, e.g. `mininet:tb3a7d0h1`, or
TESTBED_RUN=<prefix> in its environment, or the network namespace recorded for
it). A process the record does not name yet (the run was killed between starting it
and writing its PID) is found by the mark alone: TESTBED_RUN=<prefix> in the
environment it started with (every process a run starts has it, the warm-start fork
server and everything it forks included: warmstart.py) or a node shell's
`mininet:<prefix>`; and anything inside a namespace such a process holds. Records
whose owning process is still alive belong to a run in progress and are left alone.
Nothing outside the records and the marks is touched.

Processes are ended as a run's own teardown ends them: SIGTERM, SIGKILL after a short
grace (`TERM_GRACE_S`), and `execute` returns only once every one is gone, looking
again for marked processes that appeared meanwhile; one that does not go is named
with its state (e.g. ``D``, uninterruptible sleep in the kernel), and the record is
kept for the next `clean`.

The planning half (`plan_clean`) only reads a `ProcFS` and returns actions, so it
is unit-tested against a fake /proc tree; `execute` performs them.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from testbed.emulation.naming import PREFIX_RE
from testbed.emulation.records import (
    ENV_RUN,
    RECORD_DIR,
    ProcEntry,
    ProcFS,
    RemoteEntry,
    RunRecord,
    list_records,
    marked,
    record_files,
)

TERM_GRACE_S = 1.0  # between SIGTERM and SIGKILL
KILL_WAIT_S = 10.0  # after SIGKILL: a process that still runs then is reported


@dataclass(frozen=True)
class Action:
    """One step of a cleanup. kind: kill | del-interface | del-netns | restore-sysctl |
    remove-record | skip (nothing done, with the reason)."""

    kind: str
    target: str
    detail: str = ""
    pid: int | None = None
    start: int | None = None
    remote: tuple[str, RemoteEntry] | None = field(default=None, compare=False)  # remote-clean: (prefix, server)

    def describe(self) -> str:
        text = f"{self.kind:15} {self.target}"
        return f"{text}  ({self.detail})" if self.detail else text


def alive(entry: ProcEntry, procfs: ProcFS) -> bool:
    """Whether the very process of `entry` still runs (same PID and start time, and not
    a zombie: a killed owner nobody has reaped yet is gone)."""
    return entry.start != 0 and procfs.start_time(entry.pid) == entry.start and procfs.state(entry.pid) != "Z"


def marked_pids(prefix: str, procfs: ProcFS, skip: Iterable[int] = ()) -> list[tuple[int, int]]:
    """(pid, start) of every live process carrying run `prefix`'s mark, but this one and `skip`."""
    skipped = {os.getpid(), *skip}
    found = []
    for pid in sorted(procfs.pids()):
        if pid in skipped or procfs.state(pid) in (None, "Z") or not marked(pid, prefix, procfs):
            continue
        start = procfs.start_time(pid)
        if start is not None:
            found.append((pid, start))
    return found


def belongs(entry: ProcEntry, prefix: str, procfs: ProcFS) -> bool:
    """Whether the process of `entry` is alive and carries the run's mark."""
    if not alive(entry, procfs):
        return False
    if prefix in (procfs.cmdline(entry.pid) or ""):
        return True
    if procfs.environ_has(entry.pid, ENV_RUN, prefix):
        return True
    return entry.netns is not None and procfs.netns(entry.pid) == entry.netns


def host_netns(procfs: ProcFS) -> set[int]:
    """Namespaces that are never a run's own: the machine's and ours."""
    found = {procfs.netns(1), procfs.netns(os.getpid())}
    return {ns for ns in found if ns is not None}


def shared_sysctl_origin(key: str, record: RunRecord, procfs: ProcFS | None = None) -> str | None:
    """The value `key` had before any still-active run (other than `record`) changed it."""
    procfs = procfs or ProcFS()
    others, _ = list_records(record.path.parent)
    for other in others:
        if other.prefix == record.prefix or not alive(other.owner, procfs):
            continue
        for change in other.sysctls:
            if change.key == key:
                return change.old
    return None


def plan_clean(record: RunRecord, procfs: ProcFS, others: list[RunRecord] | tuple[RunRecord, ...] = ()) -> list[Action]:
    """The actions that remove what `record` lists and still exists, nothing else.

    `others` are the other records on the machine: a machine-wide sysctl that a
    still-active run also changed is left as it is (the last run restores it), so
    one run's teardown never pulls a setting from under another's feet."""
    if record.owner.pid != os.getpid() and alive(record.owner, procfs):
        return [Action("skip", str(record.path),
                       f"run {record.prefix} is still active (pid {record.owner.pid}); not touched")]
    actions: list[Action] = []
    killed: set[int] = set()
    foreign = host_netns(procfs)
    run_ns: set[int] = set()
    # Spawned processes first (they may hold namespaces open), then node shells.
    for entry in [*record.processes, *record.nodes]:
        if belongs(entry, record.prefix, procfs):
            actions.append(Action("kill", f"pid {entry.pid}", f"{entry.kind} {entry.name}".strip(),
                                  entry.pid, entry.start))
            killed.add(entry.pid)
            ns = procfs.netns(entry.pid)
            if ns is not None and ns not in foreign:
                run_ns.add(ns)
    # Processes with the run's mark that the record does not name (yet). Their namespace
    # is the run's only when it is one the record names or the process is one of the
    # run's node shells: a mark also reaches namespaces the run does not own (a program
    # it started over SSH on a server that is a namespace of this machine, as in a test
    # rig, where that namespace also holds the server's sshd).
    recorded_ns = {e.netns for e in [*record.processes, *record.nodes] if e.netns is not None}
    for pid, start in marked_pids(record.prefix, procfs, skip=killed | {record.owner.pid}):
        actions.append(Action("kill", f"pid {pid}", f"marked {record.prefix}: {(procfs.cmdline(pid) or '?')[:60]}",
                              pid, start))
        killed.add(pid)
        ns = procfs.netns(pid)
        argv = (procfs.cmdline(pid) or "").split()
        # a node shell itself (its namespace is the node's), not a wrapper that started it
        # from its server's namespace (`sudo -E mnexec -cn env PS1= bash ... mininet:<prefix>`)
        shell = bool(argv) and os.path.basename(argv[0]) == "bash" and f"mininet:{record.prefix}" in argv[-1]
        if ns is not None and ns not in foreign and (ns in recorded_ns or shell):
            run_ns.add(ns)
    # Anything else living in a namespace that a verified process of the run holds
    # open is the run's too (e.g. a background job started from a node shell).
    if run_ns:
        for pid in sorted(procfs.pids()):
            if pid in killed or pid == os.getpid():
                continue
            if procfs.netns(pid) in run_ns:
                start = procfs.start_time(pid)
                if start is not None:
                    actions.append(Action("kill", f"pid {pid}",
                                          f"in the run's namespace: {(procfs.cmdline(pid) or '?')[:60]}",
                                          pid, start))
                    killed.add(pid)
    for name in record.interfaces:
        if name.startswith(record.prefix):
            actions.append(Action("del-interface", name))
    for name in record.netns:
        if name.startswith(record.prefix):
            actions.append(Action("del-netns", name))
    for raw in record.paths:
        path = Path(raw)
        if path.is_absolute() and path.name.startswith(record.prefix) and os.path.lexists(path):
            actions.append(Action("remove-path", str(path), "folder" if path.is_dir() else "file"))
    for entry in record.remote:  # over SSH: the run's marked processes, node shells, stray tunnels, paths
        where = f"{entry.login.get('user', 'root')}@{entry.login.get('address', '?')}"
        actions.append(Action("remote-clean", entry.server, f"over SSH {where}", remote=(record.prefix, entry)))
    for change in record.sysctls:
        users = [o.prefix for o in others if o.prefix != record.prefix
                 and any(c.key == change.key for c in o.sysctls) and alive(o.owner, procfs)]
        if users:
            actions.append(Action("keep-sysctl", change.key,
                                  f"still needed by active run {', '.join(sorted(users))}"))
        else:
            actions.append(Action("restore-sysctl", change.key, f"{change.new} -> {change.old}"))
    actions.append(Action("remove-record", str(record.path)))
    return actions


def _root_links() -> set[str]:
    return {p.name for p in Path("/sys/class/net").iterdir()} if Path("/sys/class/net").is_dir() else set()


def _sysctl_path(key: str) -> Path:
    return Path("/proc/sys") / key.replace(".", "/")


def kill_and_wait(targets: list[tuple[int, int]], procfs: ProcFS, sig: int = signal.SIGKILL,
                  timeout: float = 3.0) -> list[int]:
    """Send `sig` to each (pid, start) still matching, wait until they are gone.
    Returns the PIDs still alive after `timeout`."""
    pending = []
    for pid, start in targets:
        if procfs.start_time(pid) != start:
            continue
        try:
            os.kill(pid, sig)
            pending.append((pid, start))
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + timeout
    while pending and time.monotonic() < deadline:
        still = []
        for pid, start in pending:
            if _running(pid, start, procfs):
                still.append((pid, start))
                continue
            try:  # reap our own children, after they ended, so they do not linger as zombies
                os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                pass
        pending = still
        if pending:
            time.sleep(0.02)
    return [pid for pid, _ in pending]


def end_processes(targets: list[tuple[int, int]], procfs: ProcFS, grace_s: float = TERM_GRACE_S,
                  kill_wait_s: float = KILL_WAIT_S, at_once: Iterable[int] = ()) -> list[tuple[int, str]]:
    """End each (pid, start) still matching: SIGTERM, SIGKILL after `grace_s` to those
    left (at once to the PIDs in `at_once`: node shells, which ignore SIGTERM), then wait
    up to `kill_wait_s` until they are gone. Returns (pid, why) for each one still
    running then (``why`` says its state)."""
    hard = set(at_once)
    left = [t for t in targets if _running(*t, procfs)]
    soft = [t for t in left if t[0] not in hard]
    if soft:
        kill_and_wait(soft, procfs, signal.SIGTERM, grace_s)
    left = [t for t in left if _running(*t, procfs)]
    if not left:
        return []
    survivors = kill_and_wait(left, procfs, signal.SIGKILL, kill_wait_s)
    out = []
    for pid in survivors:
        state = procfs.state(pid) or "?"
        why = {"D": "in uninterruptible sleep (D) in the kernel, e.g. waiting on a device or a network filesystem",
               "T": "stopped (T)", "t": "stopped by a debugger (t)"}.get(state, f"state {state}")
        out.append((pid, f"pid {pid} ({(procfs.cmdline(pid) or '?')[:60]}) still runs {kill_wait_s:g} s after "
                         f"SIGKILL: {why}"))
    return out


def _running(pid: int, start: int, procfs: ProcFS) -> bool:
    if procfs.start_time(pid) != start:
        return False
    try:
        stat = (procfs.root / str(pid) / "stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2:].split()[0] != "Z"  # a zombie is as good as gone


def execute(actions: list[Action], procfs: ProcFS | None = None, grace_s: float = TERM_GRACE_S,
            kill_wait_s: float = KILL_WAIT_S) -> list[str]:
    """Carry out `actions`; returns a message for each one that failed. Processes are
    ended first (`end_processes`) and are all gone when this returns, or named."""
    procfs = procfs or ProcFS()
    failures: list[str] = []
    kills = [(a.pid, a.start) for a in actions if a.kind == "kill" and a.pid and a.start]
    shells = {a.pid for a in actions if a.kind == "kill" and a.detail.startswith("node ") and a.pid}
    survivors = end_processes(kills, procfs, grace_s, kill_wait_s, shells)
    # A process of the run that appeared meanwhile (forked by one being ended) is found
    # by its mark: the run's prefix is its record's name.
    prefix = next((Path(a.target).stem for a in actions if a.kind == "remove-record"), "")
    if PREFIX_RE.fullmatch(prefix):
        done = {pid for pid, _ in kills}
        for _ in range(3):
            late = [t for t in marked_pids(prefix, procfs) if t[0] not in done]
            if not late:
                break
            done.update(pid for pid, _ in late)
            survivors += end_processes(late, procfs, grace_s, kill_wait_s)
    failures += [why for _, why in survivors]
    links = None
    remote_failed = False
    remote = [a for a in actions if a.kind == "remote-clean" and a.remote is not None]
    from concurrent.futures import ThreadPoolExecutor

    pool = ThreadPoolExecutor(max_workers=max(1, min(8, len(remote))))  # servers at once: see clean()
    remote_done = {a.target: pool.submit(remote_clean, *a.remote) for a in remote}  # type: ignore[misc]
    pool.shutdown(wait=False)
    for action in actions:
        try:
            if action.kind == "del-interface":
                links = _root_links() if links is None else links
                if action.target in links:
                    from pyroute2 import IPRoute

                    with IPRoute() as ipr:
                        idx = ipr.link_lookup(ifname=action.target)
                        if idx:
                            ipr.link("del", index=idx[0])
            elif action.kind == "del-netns":
                from pyroute2 import netns

                if action.target in netns.listnetns():
                    netns.remove(action.target)
            elif action.kind == "remove-path":
                path = Path(action.target)
                if path.is_relative_to("/sys/fs/cgroup"):
                    path.rmdir()  # a cgroup (testbed/run/cpu.py): rmdir, its files cannot be deleted
                elif path.is_dir() and not path.is_symlink():
                    shutil.rmtree(path)
                elif os.path.lexists(path):
                    path.unlink()
            elif action.kind == "remote-clean":
                assert action.remote is not None
                failure = remote_done[action.target].result()
                if failure:
                    failures.append(failure)
                    remote_failed = True
            elif action.kind == "restore-sysctl":
                path = _sysctl_path(action.target)
                new, old = action.detail.split(" -> ", 1)
                if path.exists() and path.read_text().split() == new.split():
                    path.write_text(old)
            elif action.kind == "remove-record":
                if remote_failed:
                    failures.append(f"{action.target}: kept, a server could not be cleaned over SSH")
                elif not survivors:
                    for p in record_files(Path(action.target)):
                        p.unlink(missing_ok=True)
                else:
                    failures.append(f"{action.target}: kept, some processes survived")
        except Exception as exc:  # report and go on: clean must do as much as it can
            failures.append(f"{action.kind} {action.target}: {exc}")
    return failures


def remote_clean(prefix: str, entry: RemoteEntry, timeout: float = 60.0) -> str | None:
    """Undo run `prefix` on a recorded server over SSH (``nodeagent clean``); a message
    when that failed (the server unreachable, the agent missing), None when done."""
    import subprocess

    from testbed.emulation.remote.sshlogin import RemoteLogin

    identity = entry.login.get("identity")
    if identity and not os.path.exists(identity) and _rig_gone(identity):
        return _clean_here(prefix, entry, timeout)
    if identity and not os.path.exists(identity):  # ssh would still try, and wait out its connect timeout
        return (f"server {entry.server} ({entry.login.get('address')}): not cleaned over SSH: its login's identity "
                f"file {identity} no longer exists (a test rig's, gone with it?); run `testbed clean` where that "
                "server is reachable with a key, or remove the record if the server is gone")
    try:
        argv = RemoteLogin.model_validate(entry.login).clean_argv(prefix, entry.paths)
        res = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    except (ValueError, OSError, subprocess.TimeoutExpired) as exc:
        return f"server {entry.server}: clean over SSH failed: {exc}"
    if res.returncode != 0:
        return (f"server {entry.server} ({entry.login.get('address')}): clean over SSH failed (exit "
                f"{res.returncode}): {(res.stderr or res.stdout).strip()[-300:] or 'no output'}; run `testbed clean` "
                "where that server is reachable")
    return None


RIG_FOLDER_RE = re.compile(r"(tb[0-9a-f]{3})-rig-[0-9a-f]+")


def rig_prefix(identity: str) -> str | None:
    """The prefix of the test rig (testbed/emulation/cluster/rig.py) whose key folder
    holds `identity`, or None when the login is not a rig's."""
    folder = Path(identity).parent
    match = RIG_FOLDER_RE.fullmatch(folder.name)
    return match.group(1) if match and folder.parent == Path(tempfile.gettempdir()).resolve() else None


def _rig_gone(identity: str, directory: Path | None = None) -> bool:
    """A rig's servers are namespaces of this machine with an sshd each: once the rig's
    key folder and its record are gone, so are the servers, and what a run started
    there carried the run's mark on this machine, where `plan_clean` ends it."""
    prefix = rig_prefix(identity)
    return prefix is not None and not (Path(directory or RECORD_DIR) / f"{prefix}.json").exists()


def _clean_here(prefix: str, entry: RemoteEntry, timeout: float) -> str | None:
    """The node agent's clean run on this machine for a server of a rig that is gone:
    the server shared this machine's processes and files, and its namespace (with the
    run's interfaces there) goes once the run's last process in it has ended."""
    import subprocess
    import sys

    argv = [sys.executable, "-m", "testbed.emulation.remote.nodeagent", "clean", "--run", prefix]
    for path in entry.paths:
        argv += ["--path", path]
    try:
        res = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"server {entry.server} (a test rig's, gone): clean on this machine failed: {exc}"
    if res.returncode != 0:
        return (f"server {entry.server} (a test rig's, gone): clean on this machine failed (exit {res.returncode}): "
                f"{(res.stderr or res.stdout).strip()[-300:] or 'no output'}")
    return None


def uses_rig(record: RunRecord, rig: str) -> bool:
    """Whether `record` reached servers of rig `rig` over SSH."""
    return any(rig_prefix(str(e.login.get("identity") or "")) == rig for e in record.remote)


@dataclass
class CleanReport:
    actions: list[Action]
    failures: list[str]
    problems: list[str]  # files in the record directory that are not records
    dry_run: bool


def clean(directory: Path | None = None, dry_run: bool = False,
          procfs: ProcFS | None = None) -> CleanReport:
    """Remove what crashed runs left, as listed in their records, and nothing else."""
    procfs = procfs or ProcFS()
    records, problems = list_records(directory)
    plans = [plan_clean(record, procfs, records) for record in records]
    actions = [a for planned in plans for a in planned]
    # Records at once: a server reached over SSH that does not answer costs its connect
    # timeout, and that should be paid once, not once per record.
    from concurrent.futures import ThreadPoolExecutor

    # A dead test rig first: the dead runs that reached its servers over SSH are then
    # cleaned on this machine, where those servers' processes and files were
    # (`_clean_here`), not over an SSH that no longer answers.
    todo = [(planned, record.topology == "server-rig") for planned, record in zip(plans, records, strict=True)
            if not dry_run and not any(a.kind == "skip" for a in planned)]
    first = [planned for planned, rig in todo if rig]
    last = [planned for planned, rig in todo if not rig]
    failures: list[str] = []
    for batch in (first, last):
        with ThreadPoolExecutor(max_workers=max(1, min(8, len(batch)))) as pool:
            failures += [f for result in pool.map(lambda planned: execute(planned, procfs), batch) for f in result]
    return CleanReport(actions, failures, problems, dry_run)
