"""``profile.json``: what a program did per rank and step, as `testbed launch --profile`
recorded it, and the checks that a profile fits what it is asked to predict.

Times are seconds since the launch started (one clock: every rank of an emulated
topology runs on this machine). Per rank: every communication the program asked of
torch.distributed (bytes, peer, group, when it was issued, waited on, completed) and
every step line it printed (``{"step": k, "step_s": s}``); the compute between
communications is what is left of the rank's time once the waits are taken out
(testbed_core/program/predict.py). The program's files are kept by their sha256 so that
a profile of another version of the program is refused (`check_program`).
"""

from __future__ import annotations

import hashlib
import shlex
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from testbed_core.topology import Topology

PROFILE_FILE = "profile.json"
PROFILE_FORMAT = 1


class ProfileError(ValueError):
    """A profile that cannot be read, or that does not fit what it is asked to predict;
    the message names what does not fit and what to do."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ProgramFile(_Model):
    """A file of the program's command line (the script), by content."""

    path: str = Field(description="as given on the command line (relative to `cwd` unless absolute)")
    sha256: str = Field(description="its content's sha256 when profiled")


class ProgramIdentity(_Model):
    """Which program was profiled: its command line and the files it names."""

    command: list[str] = Field(description="the program and its arguments, as after `--`")
    cwd: str = Field(description="the ranks' working folder")
    files: list[ProgramFile] = Field(default_factory=list,
                                     description="every argument naming an existing file (not the interpreter), hashed")
    modules: list[ProgramFile] = Field(default_factory=list,
                                       description="the program's own Python modules it imported (in its script's "
                                                   "folder or below, not installed ones), hashed at its exit")


class GroupRecord(_Model):
    """A process group a rank used: its global ranks and backend."""

    index: int = Field(description="the rank's own numbering of its groups, in order of first use")
    ranks: list[int] = Field(description="the group's global ranks ([] where torch could not tell)")
    backend: str = Field(description="torch.distributed's name of its backend (gloo, atlas, ...)")
    streams: int | None = Field(None, description="an atlas group's TCP streams per pair, where configured")


class OpRecord(_Model):
    """One communication a rank asked for."""

    id: int = Field(description="the rank's own numbering of its communications, in order of issue")
    kind: Literal["send", "recv", "collective"] = Field(description="a point-to-point send or receive, or a collective")
    op: str = Field(description="the torch.distributed function (isend, batch_irecv, all_reduce, ...)")
    bytes: int = Field(ge=0, description="the tensor(s) it carries from this rank (a collective: its input)")
    peer: int | None = Field(None, description="the other global rank of a send/recv; a rooted collective's root")
    group: int = Field(description="GroupRecord.index")
    tag: int = Field(0, description="the point-to-point tag")
    blocking: bool = Field(description="the call returned only once done (send, recv, a collective without async_op)")
    ddp: bool = Field(False, description="DDP's gradient all-reduce (waited for at the end of the backward pass)")
    t_issue: float = Field(description="when the program called it")
    t_issue_end: float = Field(description="when the call returned (a blocking call: when it was done)")
    waits: list[tuple[float, float]] = Field(default_factory=list, description="the program's waits on it (start, end)")
    t_done: float | None = Field(None, description="when it completed (a collective's future), if known")


class StepRecord(_Model):
    """One ``{"step": k, "step_s": s}`` line the rank printed."""

    step: int = Field(description="the line's step")
    step_s: float = Field(ge=0, description="the line's step_s: the seconds the program timed its step")
    t_line: float = Field(description="when the launch read the line (the step ended just before)")


class RankProfile(_Model):
    """One rank: where it ran, its groups, communications and step lines."""

    rank: int = Field(description="its global rank (RANK)")
    host: str = Field(description="the host it ran on (dc1-h1, ...)")
    dc: str = Field(description="that host's DC")
    groups: list[GroupRecord] = Field(default_factory=list, description="the process groups it used")
    ops: list[OpRecord] = Field(default_factory=list, description="its communications, in order of issue")
    steps: list[StepRecord] = Field(default_factory=list, description="its step lines, in order")
    t_start: float = Field(description="when the recorder started in the rank (its interpreter's start)")
    t_end: float | None = Field(None, description="when the rank's interpreter exited")
    notes: list[str] = Field(default_factory=list, description="what the recorder could not see")
    compute_wall_s: float | None = Field(None, description="wall seconds between the end of a wait and the next "
                                         "communication the rank issued, summed: its compute as the replay keeps it")
    compute_cpu_s: float | None = Field(None, description="the rank's main thread's CPU seconds over the same spans: "
                                        "wall / CPU above 1 says the machine's cores were busy with other work")


class ProgramProfile(_Model):
    """``profile.json``: a program's communication and compute per rank and step."""

    format: Literal[1] = Field(PROFILE_FORMAT, description="this file's format version")
    program: ProgramIdentity = Field(description="which program was profiled")
    topology: dict[str, Any] = Field(description="the topology it ran on, as loaded (the fields of a topology file)")
    topology_file: str = Field(description="the topology file it was loaded from")
    env: dict[str, str] = Field(default_factory=dict, description="the launch's --env options")
    world_size: int = Field(description="the number of ranks")
    nproc_per_host: int = Field(1, description="ranks per host")
    started: float = Field(description="Unix time the launch started (the times here are seconds after it)")
    wall_s: float = Field(description="the launch's wall time")
    ranks: list[RankProfile] = Field(description="every rank, by rank")
    wan_bytes: int | None = Field(None, description="what the WAN links' counters carried during the launch, both ways")
    recorded_wan_bytes: int = Field(0, description="bytes the recorded sends and collectives put between DCs "
                                    "(a collective counted by its input)")
    atlas_all_reduce: Literal["ring", "hierarchical"] = Field(
        "ring", description="the all-reduce of the atlas backend the program ran with: a ring (collectives.py) or "
                            "two levels by site (hierarchical.py)")
    transport_fingerprint: str | None = Field(
        None, description="sha256 over atlas_transport's sources the program ran with (a transport calibration of "
                          "another version is refused); None in profiles made before it was recorded")

    @field_validator("topology")
    @classmethod
    def _topology(cls, value: dict[str, Any]) -> dict[str, Any]:
        Topology.model_validate(value)
        return value

    @property
    def network(self) -> Topology:
        """The topology it ran on, as the model."""
        return Topology.model_validate(self.topology)

    def hosts(self) -> list[str]:
        return [r.host for r in sorted(self.ranks, key=lambda r: r.rank)]


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _is_interpreter(arg: str) -> bool:
    return Path(arg).name.startswith(("python", "pypy"))


def program_identity(command: list[str], cwd: str) -> ProgramIdentity:
    """The command and the sha256 of every argument that names an existing regular file
    (the interpreter excepted: a venv rebuilt is not another program)."""
    files = []
    for i, arg in enumerate(command):
        if i == 0 and _is_interpreter(arg):
            continue
        path = Path(arg) if Path(arg).is_absolute() else Path(cwd) / arg
        if path.is_file():
            files.append(ProgramFile(path=arg, sha256=file_sha256(path)))
    return ProgramIdentity(command=list(command), cwd=cwd, files=files)


def check_program(profile: ProgramProfile, source: str, command: list[str] | None = None) -> None:
    """ProfileError when a file of the profiled program no longer has the content it had
    (another version of the program), or when `command` (the program one means to run)
    differs from the profiled command in its files or arguments."""
    ident = profile.program
    for f, what in [(f, "file") for f in ident.files] + [(f, "module (imported by it)") for f in ident.modules]:
        path = Path(f.path) if Path(f.path).is_absolute() else Path(ident.cwd) / f.path
        if not path.is_file():
            raise ProfileError(f"{source}: the profiled program's {what} {f.path} is gone (looked in {ident.cwd}): "
                               "this profile cannot be checked against the program; profile it again with "
                               "`testbed launch --profile`")
        now = file_sha256(path)
        if now != f.sha256:
            raise ProfileError(f"{source}: {f.path}, the program's {what}, has changed since it was profiled (sha256 "
                               f"{f.sha256[:12]} in the profile, {now[:12]} now): the profile describes another "
                               "version of the program; profile this one again: testbed launch TOPOLOGY --profile -- "
                               f"{shlex.join(ident.command)}")
    if command is None:
        return
    old, new = ident.command, list(command)
    start = 1 if old and new and _is_interpreter(old[0]) and _is_interpreter(new[0]) else 0
    if old[start:] != new[start:]:
        diff = _first_difference(old[start:], new[start:])
        raise ProfileError(f"{source}: the profile was recorded for `{shlex.join(old)}`, not `{shlex.join(new)}` "
                           f"({diff}): other arguments make another program (sizes, steps, schedule); profile this "
                           f"command: testbed launch TOPOLOGY --profile -- {shlex.join(new)}")


def _first_difference(old: list[str], new: list[str]) -> str:
    for i, (a, b) in enumerate(zip(old, new, strict=False)):
        if a != b:
            return f"argument {i + 1}: {a!r} in the profile, {b!r} now"
    if len(old) > len(new):
        return f"the profile has more arguments: {shlex.join(old[len(new):])}"
    return f"extra arguments now: {shlex.join(new[len(old):])}"


def read_profile(directory: Path) -> ProgramProfile:
    """The profile in `directory` (a `testbed launch --profile` output folder, or the file itself)."""
    directory = Path(directory)
    path = directory / PROFILE_FILE if directory.is_dir() else directory
    if not path.is_file():
        hint = (" (it has a launch.json: that launch was not profiled; run it again with --profile)"
                if (directory / "launch.json").is_file() else "")
        raise ProfileError(f"--program {directory}: no {PROFILE_FILE} there{hint}; make one with "
                           "`sudo testbed launch TOPOLOGY --profile --out DIR -- COMMAND`")
    try:
        return ProgramProfile.model_validate_json(path.read_text())
    except ValueError as exc:
        raise ProfileError(f"{path}: not a profile this version reads ({str(exc).splitlines()[0]}); "
                           "profile the program again") from None
