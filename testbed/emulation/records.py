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
run's mark, and `clean` undoes it over SSH (``nodeagent clean``; `cleanup.remote_clean`).
There the mark alone identifies the run's processes (no start times are recorded for
another machine's PIDs), so two controllers must not share a server under one prefix.
A record is kept while one of its servers cannot be cleaned.

What `testbed clean` does with a record (plans and carries out the cleanup) is
testbed/emulation/cleanup.py.
"""

from __future__ import annotations

import json
import os
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

    def ppid(self, pid: int) -> int | None:
        """The parent's PID, or None when the PID is gone."""
        fields = self._stat_fields(pid)
        try:
            return int(fields[1]) if fields is not None else None
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
        for p in record_files(self.path):
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


def record_files(path: Path) -> list[Path]:
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


def marked(pid: int, prefix: str, procfs: ProcFS) -> bool:
    """Whether `pid` carries run `prefix`'s mark: TESTBED_RUN=<prefix> in the environment
    it started with, or a node shell's ``mininet:<prefix>`` in its command line."""
    if procfs.environ_has(pid, ENV_RUN, prefix):
        return True
    return f"mininet:{prefix}" in (procfs.cmdline(pid) or "")
