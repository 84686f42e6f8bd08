"""Where a result came from: the facts needed to trust it and to repeat it.

Saved next to every run of a sweep (and usable by `testbed run`): the kernel (delay
lines and TCP behave differently across kernels), the Python and package versions,
the git commit of the toolkit (and whether the tree had local changes), the seed,
and the delay backend the runner picked (netem or the userspace relay). Collecting
it is cheap (no torch import, no network) and never fails: unknown facts are null.
"""

from __future__ import annotations

import functools
import json
import os
import platform
import socket
import subprocess
import sys
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

from testbed_core.constants import REPO_ROOT

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


@functools.lru_cache(maxsize=4)
def git_state(root: Path = REPO_ROOT) -> dict[str, Any]:
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
        return {"commit": None, "dirty": None}
    status = git("status", "--porcelain", "--untracked-files=no")
    return {"commit": commit, "dirty": bool(status) if status is not None else None}


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


def collect_provenance(
    *, seed: int | None = None, delay_backend: str | None = None, extra: dict[str, Any] | None = None
) -> dict[str, Any]:
    """A JSON-ready record of the machine, software and settings of one run."""
    uname = platform.uname()
    record: dict[str, Any] = {
        "recorded_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "seed": seed,
        "delay_backend": delay_backend,
        "kernel": {"release": uname.release, "version": uname.version, "machine": uname.machine},
        "host": {"name": socket.gethostname(), "cpus": os.cpu_count(), "accelerators": accelerators()},
        "python": {"version": platform.python_version(), "implementation": platform.python_implementation(),
                   "executable": sys.executable},
        "packages": package_versions(),
        "git": git_state(),
        "command": sys.argv[:],
    }
    if extra:
        record.update(extra)
    return record


def write_provenance(path: Path, record: dict[str, Any]) -> None:
    """Write a record from `collect_provenance` as indented JSON."""
    path.write_text(json.dumps(record, indent=2, sort_keys=False, default=str) + "\n")
