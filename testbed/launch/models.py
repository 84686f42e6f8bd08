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

    link: str
    a: str
    b: str
    a_to_b_bytes: int
    b_to_a_bytes: int


class RankReport(_Model):
    rank: int
    local_rank: int
    host: str
    dc: str
    ip: str
    exit_code: int | None = Field(description="the exit status; -N when killed by signal N; None if never started")
    ended_by_launch: bool = Field(False, description="ended by the launch (another rank failed, timeout, interrupt)")
    wall_s: float
    stdout: str = Field(description="path of the rank's whole stdout")
    stderr: str = Field(description="path of the rank's whole stderr")
    metrics: list[dict] = Field(default_factory=list,
                                description="every stdout line that parses as a JSON object, in order")


class LaunchReport(_Model):
    """``launch.json``: the command, where it ran, each rank's outcome and the WAN traffic."""

    command: list[str]
    topology: str
    topology_file: str
    attached: str | None = Field(None, description="the detached topology's name, when run with --attach")
    prefix: str = ""
    started: float = Field(description="Unix time the first rank started")
    finished: float
    wall_s: float
    ok: bool
    failure: str | None = None
    world_size: int
    nproc_per_host: int
    master_addr: str
    master_port: int
    env: dict[str, str] = Field(default_factory=dict, description="the --env options given")
    logs: str = Field("one stdout and one stderr file per rank: rank-<k>.stdout, rank-<k>.stderr",
                      description="how the logs are laid out")
    ranks: list[RankReport]
    wan_bytes: list[LinkBytes]


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
