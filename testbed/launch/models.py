"""The typed files of `testbed launch`: what a launch is asked to do (`LaunchSpec`),
what it did (`LaunchReport`, written as ``launch.json``), and the state file of a
topology kept up by `testbed topo up --detach` (`DetachedState`)."""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from testbed_core.atomic import write_text_atomic

LAUNCH_FILE = "launch.json"


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class LaunchSpec(_Model):
    """What to start on each rank, and how (the options of `testbed launch`)."""

    command: list[str] = Field(description="the program and its arguments, as after `--`")
    hosts: list[str] | None = Field(None, description="display names of the hosts, in rank order (None: all)")
    nproc_per_host: int = Field(1, ge=1, description="ranks per host")
    env: dict[str, str] = Field(default_factory=dict, description="added to the caller's environment (wins)")
    master_port: int | None = Field(None, ge=1, le=65535, description="MASTER_PORT (None: a free port)")
    timeout_s: float | None = Field(None, gt=0, description="end the launch after this many seconds")
    cwd: str = Field(default_factory=os.getcwd, description="the ranks' working folder")
    inherit_env: bool = Field(True, description="start from the caller's environment")
    topology_file: str = Field("", description="the topology file, for the report (when the emulation does not say)")


class LinkBytes(_Model):
    """Bytes a WAN link carried each way during the launch (the tx counters of its
    node's two interfaces, after minus before)."""

    link: str  # the WAN link's name, <dc>-<dc> as the topology lists it
    a: str  # the DC at its first end
    b: str  # the DC at its other end
    a_to_b_bytes: int  # bytes sent from a towards b during the launch (all traffic, headers included)
    b_to_a_bytes: int  # bytes sent from b towards a during the launch


class RankReport(_Model):
    rank: int  # the global rank (RANK), 0 to world_size - 1
    local_rank: int  # the rank among those on its host (LOCAL_RANK)
    host: str  # the host it ran on, by display name (<dc>-<host>)
    dc: str  # the DC of that host
    ip: str  # the host's IPv4 address the other ranks reach it at
    exit_code: int | None = Field(description="the exit status; -N when killed by signal N; None if never started")
    ended_by_launch: bool = Field(False, description="ended by the launch (another rank failed, timeout, interrupt)")
    wall_s: float  # seconds from the rank's start until it ended (0 when it never started)
    stdout: str = Field(description="path of the rank's whole stdout")
    stderr: str = Field(description="path of the rank's whole stderr")
    metrics: list[dict] = Field(default_factory=list,
                                description="every stdout line that parses as a JSON object, in order")


class LaunchReport(_Model):
    """``launch.json``: the command, where it ran, each rank's outcome and the WAN traffic."""

    command: list[str]  # the program and its arguments every rank ran
    topology: str  # the topology's name
    topology_file: str  # the topology file it was built from ("" when unknown)
    attached: str | None = Field(None, description="the detached topology's name, when run with --attach")
    prefix: str = ""  # the emulation's run prefix (its namespaces, interfaces and run record); "" on real machines
    started: float = Field(description="Unix time the first rank started")
    finished: float  # Unix time every rank had ended and its output was read
    wall_s: float  # seconds from the first rank's start until every rank had ended
    ok: bool  # every rank exited with status 0 (no failure)
    failure: str | None = None  # what failed: the first rank that did, the timeout or the interrupt (null: ok)
    world_size: int  # ranks in all (WORLD_SIZE)
    nproc_per_host: int  # ranks per host
    master_addr: str  # MASTER_ADDR: the IPv4 address of rank 0's host
    master_port: int  # MASTER_PORT: the TCP port given to every rank for its rendezvous
    env: dict[str, str] = Field(default_factory=dict, description="the --env options given")
    logs: str = Field("one stdout and one stderr file per rank: rank-<k>.stdout, rank-<k>.stderr",
                      description="how the logs are laid out")
    ranks: list[RankReport]  # each rank's outcome, in rank order
    wan_bytes: list[LinkBytes]  # bytes each WAN link carried each way (empty on real machines: no counters)


def write_report(report: LaunchReport, out_dir: Path) -> Path:
    return write_text_atomic(out_dir / LAUNCH_FILE, report.model_dump_json(indent=1) + "\n")


def read_report(path: Path) -> LaunchReport:
    return LaunchReport.model_validate_json(Path(path).read_text())


# --------------------------------------------------------------------------- detached topologies


class DetachedHost(_Model):
    name: str
    dc: str
    ip: str
    intf: str
    node_pid: int
    netns: int | None


class DetachedWan(_Model):
    link: str
    a: str
    b: str
    node_pid: int
    intfs: tuple[str, str]


class DetachedState(_Model):
    """``<RECORD_DIR>/detached/<prefix>-<name>.json``: a topology kept up by a daemon
    (`testbed topo up --detach`). Its file name carries the run prefix, so the run
    record lists it and `testbed clean` removes it with the run."""

    name: str
    topology: str
    topology_file: str
    prefix: str
    daemon_pid: int
    daemon_start: int = Field(description="start time of the daemon (clock ticks since boot, /proc/PID/stat)")
    socket: str = Field(description="the daemon's Unix socket: launches ask it to start ranks")
    log: str = Field(description="the daemon's own output")
    delay_backend: str
    built: float
    hosts: list[DetachedHost]
    wans: list[DetachedWan]
