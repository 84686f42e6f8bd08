"""Run records: what one emulation run created, so that it can always be removed.

Before a run creates anything it claims `/run/testbed/<prefix>.json` (directory mode
0700) and then appends every object as it creates it: node shell PIDs, spawned
processes (relays, iperf3 servers, user commands), changed sysctls with their
old values, and the temporary folders and sockets it made (named with the prefix,
recorded before they are created). A record can also list interfaces and named namespaces in the root
namespace; no run creates any today, but `clean` removes those a record lists. A normal teardown removes everything and deletes the record; a
run killed with SIGKILL leaves the record behind for `testbed clean`.

Servers reached over SSH (the multi-server emulation's other machines, the
real-machine mode's machines) are listed with their login and the temporary paths made
there (`RemoteEntry`), before anything is made on them; what runs there carries the
run's mark, and `clean` undoes it over SSH (``nodeagent clean``; `remote_clean`).
There the mark alone identifies the run's processes (no start times are recorded for
another machine's PIDs), so two controllers must not share a server under one prefix.
A record is kept while one of its servers cannot be cleaned.

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

import json
import os
import shutil
import signal
import threading
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from testbed.emulation.naming import PREFIX_RE
from testbed_core.atomic import write_text_atomic

RECORD_DIR = Path("/run/testbed")
ENV_RUN = "TESTBED_RUN"  # set in the environment of every process a run spawns
RECORD_VERSION = 1
TERM_GRACE_S = 1.0  # between SIGTERM and SIGKILL
KILL_WAIT_S = 10.0  # after SIGKILL: a process that still runs then is reported


class RecordError(RuntimeError):
    """A run record that cannot be claimed, read or written."""


# --------------------------------------------------------------------------- /proc


class ProcFS:
    """Read-only view of a /proc tree (a fake one in unit tests)."""

    def __init__(self, root: str | Path = "/proc") -> None:
        self.root = Path(root)

    def _stat_fields(self, pid: int) -> list[str] | None:
        """The fields of /proc/<pid>/stat after comm (state first), or None when the PID is gone."""
        try:
            text = (self.root / str(pid) / "stat").read_text()
        except (FileNotFoundError, ProcessLookupError, PermissionError, NotADirectoryError):
            return None
        # comm (field 2) may contain spaces and parentheses: split after the last ')'.
        return text[text.rfind(")") + 2:].split()

    def start_time(self, pid: int) -> int | None:
        """Start time in clock ticks since boot, or None when the PID is gone."""
        fields = self._stat_fields(pid)
        try:
            return int(fields[19]) if fields is not None else None
        except (IndexError, ValueError):
            return None

    def cmdline(self, pid: int) -> str | None:
        try:
            raw = (self.root / str(pid) / "cmdline").read_bytes()
        except (FileNotFoundError, ProcessLookupError, PermissionError, NotADirectoryError):
            return None
        return raw.replace(b"\0", b" ").decode(errors="replace").strip()

    def environ_has(self, pid: int, key: str, value: str) -> bool:
        try:
            raw = (self.root / str(pid) / "environ").read_bytes()
        except (FileNotFoundError, ProcessLookupError, PermissionError, NotADirectoryError):
            return False
        return f"{key}={value}".encode() in raw.split(b"\0")

    def netns(self, pid: int) -> int | None:
        """Inode of the network namespace of `pid`."""
        try:
            link = os.readlink(self.root / str(pid) / "ns" / "net")
        except (FileNotFoundError, ProcessLookupError, PermissionError, NotADirectoryError):
            return None
        # "net:[4026531840]"
        try:
            return int(link[link.index("[") + 1:link.index("]")])
        except ValueError:
            return None

    def state(self, pid: int) -> str | None:
        """The state letter of `pid` (R, S, D, Z, ...), or None when it is gone."""
        fields = self._stat_fields(pid)
        return fields[0] if fields else None

    def pids(self) -> list[int]:
        try:
            return [int(p.name) for p in self.root.iterdir() if p.name.isdigit()]
        except FileNotFoundError:
            return []


# --------------------------------------------------------------------------- record


@dataclass
class ProcEntry:
    pid: int
    start: int
    kind: str  # "owner" | "node" | "relay" | "process"
    name: str = ""
    netns: int | None = None

    @classmethod
    def from_dict(cls, data: dict) -> ProcEntry:
        return cls(int(data["pid"]), int(data["start"]), str(data["kind"]), str(data.get("name", "")),
                   data.get("netns"))


@dataclass
class SysctlChange:
    key: str  # dotted, root namespace
    old: str
    new: str


@dataclass
class RemoteEntry:
    """A server reached over SSH that the run uses (testbed/emulation/cluster/): its login
    (remote.sshlogin.RemoteLogin's fields) and the temporary paths made there. What runs
    there carries the run's mark (TESTBED_RUN=<prefix>, or a node shell's
    ``mininet:<prefix>...``), so clean finds it on the server by that mark, over SSH,
    with ``python -m testbed.emulation.remote.nodeagent clean``."""

    server: str
    login: dict
    paths: list[str] = field(default_factory=list)

    @classmethod
    def from_dict(cls, data: dict) -> RemoteEntry:
        return cls(str(data["server"]), dict(data["login"]), [str(p) for p in data.get("paths", [])])


@dataclass
class RunRecord:
    """The on-disk inventory of one run. Every mutator persists at once."""

    prefix: str
    path: Path
    owner: ProcEntry
    topology: str = ""
    created: float = 0.0
    nodes: list[ProcEntry] = field(default_factory=list)
    processes: list[ProcEntry] = field(default_factory=list)
    interfaces: list[str] = field(default_factory=list)
    netns: list[str] = field(default_factory=list)
    sysctls: list[SysctlChange] = field(default_factory=list)
    paths: list[str] = field(default_factory=list)  # temporary folders and sockets (absolute)
    remote: list[RemoteEntry] = field(default_factory=list)  # servers reached over SSH

    def __post_init__(self) -> None:
        self._lock = threading.Lock()

    # -- creation / loading

    @classmethod
    def create(cls, prefix: str, topology: str = "", directory: Path | None = None,
               procfs: ProcFS | None = None) -> RunRecord:
        """Claim `<directory>/<prefix>.json` atomically (fails if the prefix is taken)."""
        directory = Path(directory or RECORD_DIR)
        procfs = procfs or ProcFS()
        try:
            directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            os.chmod(directory, 0o700)
        except PermissionError:
            raise RecordError(f"cannot create {directory}: run as root (sudo)") from None
        pid = os.getpid()
        owner = ProcEntry(pid, procfs.start_time(pid) or 0, "owner", procfs.cmdline(pid) or "")
        path = directory / f"{prefix}.json"
        record = cls(prefix, path, owner, topology, time.time())
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            raise RecordError(f"run prefix {prefix} is already taken ({path} exists)") from None
        with os.fdopen(fd, "w") as fh:
            fh.write(record.to_json())
        return record

    @classmethod
    def load(cls, path: Path) -> RunRecord:
        try:
            data = json.loads(Path(path).read_text())
            record = cls(
                prefix=data["prefix"],
                path=Path(path),
                owner=ProcEntry.from_dict(data["owner"]),
                topology=data.get("topology", ""),
                created=float(data.get("created", 0.0)),
                nodes=[ProcEntry.from_dict(e) for e in data.get("nodes", [])],
                processes=[ProcEntry.from_dict(e) for e in data.get("processes", [])],
                interfaces=list(data.get("interfaces", [])),
                netns=list(data.get("netns", [])),
                sysctls=[SysctlChange(**s) for s in data.get("sysctls", [])],
                paths=[str(p) for p in data.get("paths", [])],
                remote=[RemoteEntry.from_dict(e) for e in data.get("remote", [])],
            )
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise RecordError(f"{path}: unreadable run record ({exc})") from None
        if not PREFIX_RE.fullmatch(record.prefix) or Path(path).name != f"{record.prefix}.json":
            raise RecordError(f"{path}: not a testbed run record (prefix {record.prefix!r})")
        return record

    def to_json(self) -> str:
        data = {
            "version": RECORD_VERSION,
            "prefix": self.prefix,
            "owner": asdict(self.owner),
            "topology": self.topology,
            "created": self.created,
            "nodes": [asdict(e) for e in self.nodes],
            "processes": [asdict(e) for e in self.processes],
            "interfaces": self.interfaces,
            "netns": self.netns,
            "sysctls": [asdict(s) for s in self.sysctls],
            "paths": self.paths,
            "remote": [asdict(e) for e in self.remote],
        }
        return json.dumps(data, indent=1)

    def save(self) -> None:
        write_text_atomic(self.path, self.to_json(), mode=0o600)

    def delete(self) -> None:
        for p in _record_files(self.path):
            p.unlink(missing_ok=True)

    # -- mutators (thread safe, persisted)

    def _own(self, name: str, what: str) -> None:
        if not name.startswith(self.prefix):
            raise RecordError(f"{what} {name!r} does not carry the run prefix {self.prefix}")

    def add_node(self, name: str, pid: int, procfs: ProcFS | None = None) -> ProcEntry:
        self._own(name, "node")
        procfs = procfs or ProcFS()
        entry = ProcEntry(pid, procfs.start_time(pid) or 0, "node", name, procfs.netns(pid))
        with self._lock:
            self.nodes.append(entry)
            self.save()
        return entry

    def add_process(self, kind: str, name: str, pid: int, netns: int | None,
                    procfs: ProcFS | None = None) -> ProcEntry:
        procfs = procfs or ProcFS()
        entry = ProcEntry(pid, procfs.start_time(pid) or 0, kind, name, netns)
        with self._lock:
            self.processes.append(entry)
            self.save()
        return entry

    def drop_processes(self, pids: Iterable[int]) -> None:
        gone = set(pids)
        if not gone:
            return
        with self._lock:
            self.processes = [e for e in self.processes if e.pid not in gone]
            self.save()

    def add_path(self, path: str | Path) -> None:
        """Record a temporary folder or socket before it is created: an absolute path
        whose name starts with the run prefix (what `clean` verifies before removing)."""
        path = Path(path)
        if not path.is_absolute():
            raise RecordError(f"temporary path {str(path)!r} must be absolute")
        self._own(path.name, "temporary path")
        with self._lock:
            self.paths.append(str(path))
            self.save()

    def add_remote(self, server: str, login: dict) -> RemoteEntry:
        """Record a server reached over SSH before anything is made on it."""
        with self._lock:
            for entry in self.remote:
                if entry.server == server:
                    return entry
            entry = RemoteEntry(server, dict(login))
            self.remote.append(entry)
            self.save()
        return entry

    def add_remote_path(self, server: str, path: str) -> None:
        """Record a temporary path on a recorded server before it is made there."""
        self._own(Path(path).name, "temporary path")
        with self._lock:
            for entry in self.remote:
                if entry.server == server:
                    entry.paths.append(str(path))
                    self.save()
                    return
        raise RecordError(f"server {server!r} is not in run record {self.prefix} (add_remote first)")

    def add_sysctl(self, key: str, old: str, new: str) -> None:
        with self._lock:
            self.sysctls.append(SysctlChange(key, old, new))
            self.save()


def _record_files(path: Path) -> list[Path]:
    """A record and what a writer killed in the middle of `RunRecord.save` left beside it
    (testbed_core.atomic's temporary name)."""
    return [path, *path.parent.glob(f".{path.name}.*.tmp")]


def list_records(directory: Path | None = None) -> tuple[list[RunRecord], list[str]]:
    """The records in `directory` and a message for each file that is not one."""
    directory = Path(directory or RECORD_DIR)
    records, problems = [], []
    if not directory.is_dir():
        return records, problems
    for path in sorted(directory.glob("*.json")):
        try:
            records.append(RunRecord.load(path))
        except RecordError as exc:
            problems.append(str(exc))
    return records, problems


def prefix_in_use(prefix: str, directory: Path | None = None, procfs: ProcFS | None = None) -> bool:
    """A prefix is in use when it has a record or a live process carries its mark (a
    node shell's ``mininet:<prefix>``, TESTBED_RUN=<prefix> in its environment)."""
    directory = Path(directory or RECORD_DIR)
    if (directory / f"{prefix}.json").exists():
        return True
    procfs = procfs or ProcFS()
    return any(marked(pid, prefix, procfs) for pid in procfs.pids())


# --------------------------------------------------------------------------- cleanup


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


def marked(pid: int, prefix: str, procfs: ProcFS) -> bool:
    """Whether `pid` carries run `prefix`'s mark: TESTBED_RUN=<prefix> in the environment
    it started with, or a node shell's ``mininet:<prefix>`` in its command line."""
    if procfs.environ_has(pid, ENV_RUN, prefix):
        return True
    return f"mininet:{prefix}" in (procfs.cmdline(pid) or "")


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
        for pid, _ in pending:
            try:  # reap our own children so they do not linger as zombies
                os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                pass
        pending = [(pid, start) for pid, start in pending if _running(pid, start, procfs)]
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
                    for p in _record_files(Path(action.target)):
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
    todo = [planned for planned in plans if not dry_run and not any(a.kind == "skip" for a in planned)]
    # Records at once: a server reached over SSH that does not answer costs its connect
    # timeout, and that should be paid once, not once per record.
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=max(1, min(8, len(todo)))) as pool:
        results = list(pool.map(lambda planned: execute(planned, procfs), todo))
    failures = [f for result in results for f in result]
    return CleanReport(actions, failures, problems, dry_run)
