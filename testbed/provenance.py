"""Where a result came from: the facts needed to trust it and to repeat it.

Saved next to every run of a sweep (and usable by `testbed run`): the kernel (delay
lines and TCP behave differently across kernels), the Python and package versions,
the git commit of the toolkit (and whether the tree had local changes), the seed,
and the delay backend the runner picked (netem or the userspace relay). Collecting
it is cheap (no torch import, no network) and never fails: unknown facts are null.
"""

from __future__ import annotations

import functools
import os
import platform
import socket
import subprocess
import sys
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from testbed_core.constants import REPO_ROOT
from testbed_core.contracts.sweep import GitState

PACKAGES = (
    "geo-llm-testbed", "torch", "pyroute2", "mininet", "transformers", "pydantic", "numpy",
    "matplotlib", "click", "scapy", "iperf3", "PyYAML",
)


def package_versions(names: tuple[str, ...] = PACKAGES) -> dict[str, str | None]:
    """Installed version of each distribution (None when it is not installed)."""
    out: dict[str, str | None] = {}
    for name in names:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class KernelInfo(_Model):
    """`uname` of the machine: delay lines and TCP behave differently across kernels."""

    release: str  # the kernel release (uname -r), e.g. 6.8.0-45-generic
    version: str  # the kernel's build string (uname -v)
    machine: str  # the hardware architecture (uname -m), e.g. x86_64


class HostInfo(_Model):
    name: str = Field(description="the host name")
    cpus: int | None = Field(description="logical CPUs (null when unknown)")
    accelerators: list[str] = Field(description="the NVIDIA GPUs the driver reports, by model name")


class PythonInfo(_Model):
    version: str  # the Python version, e.g. 3.12.3
    implementation: str  # the Python implementation, e.g. CPython
    executable: str = Field(description="the interpreter that ran the toolkit")


class Provenance(_Model):
    """provenance.json: the machine, software and settings of one run."""

    recorded_at: str = Field(description="when it was collected: ISO 8601, UTC, to the second")
    seed: int | None = Field(description="the point's seed (null for the sweep's own record)")
    delay_backend: str | None = Field(description="netem or relay, as the runner picked it (null until known)")
    kernel: KernelInfo  # the kernel the run's delay lines and TCP ran on
    host: HostInfo  # the machine: its name, CPUs and GPUs
    python: PythonInfo  # the interpreter that ran the toolkit
    packages: dict[str, str | None] = Field(description="distribution -> installed version (null: not installed)")
    git: GitState = Field(description="the toolkit checkout's commit and whether it had local changes")
    command: list[str] = Field(description="the command line (sys.argv) that ran")


@functools.lru_cache(maxsize=4)
def git_state(root: Path = REPO_ROOT) -> GitState:
    """Commit and dirtiness of the toolkit's checkout (null outside a git tree)."""

    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(
                ["git", "-C", str(root), *args], capture_output=True, text=True, timeout=10, check=False
            )
        except (OSError, subprocess.TimeoutExpired):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    if commit is None:
        return GitState(commit=None, dirty=None)
    status = git("status", "--porcelain", "--untracked-files=no")
    return GitState(commit=commit, dirty=bool(status) if status is not None else None)


def accelerators() -> list[str]:
    """NVIDIA GPUs the driver reports, read from /proc (no CUDA initialisation)."""
    names = []
    for info in sorted(Path("/proc/driver/nvidia/gpus").glob("*/information")):
        try:
            for line in info.read_text().splitlines():
                if line.startswith("Model:"):
                    names.append(line.split(":", 1)[1].strip())
        except OSError:
            continue
    return names


def collect_provenance(*, seed: int | None = None, delay_backend: str | None = None) -> Provenance:
    """The record of the machine, software and settings of one run."""
    uname = platform.uname()
    return Provenance(
        recorded_at=datetime.now(UTC).isoformat(timespec="seconds"),
        seed=seed,
        delay_backend=delay_backend,
        kernel=KernelInfo(release=uname.release, version=uname.version, machine=uname.machine),
        host=HostInfo(name=socket.gethostname(), cpus=os.cpu_count(), accelerators=accelerators()),
        python=PythonInfo(version=platform.python_version(), implementation=platform.python_implementation(),
                          executable=sys.executable),
        packages=package_versions(),
        git=git_state(),
        command=sys.argv[:],
    )


def write_provenance(path: Path, record: Provenance) -> None:
    """Write a record from `collect_provenance` as indented JSON."""
    path.write_text(record.model_dump_json(indent=2) + "\n")


def read_provenance(path: Path) -> Provenance:
    """A provenance.json written by `write_provenance`."""
    return Provenance.model_validate_json(path.read_text())
