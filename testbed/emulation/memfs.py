"""Where a run keeps the files its processes coordinate through at every step.

The emulated GPU's lock, leases and timeline, the workers' live status, the slot feeds and
the transfer logs are written and renamed many times a second by training and by the
BubbleTea agents beside it. On a disk file system every such rename and create is a
journal transaction; with the agents' churn added, training's own bookkeeping (a rename
between two pieces of work) now and then waited a quarter of a second, far longer than
any bubble (docs/bubbletea.md, "What still stalled training"). A memory file system
(tmpfs) has no journal, so these files live there while the run plays and are copied into
the results folder after it.
"""

from __future__ import annotations

import os
from pathlib import Path

MEMORY_FS_TYPES = frozenset({"tmpfs", "ramfs"})
CANDIDATES = ("/dev/shm", "/run/shm")


def mount_types(mounts: str) -> dict[str, str]:
    """Mount point -> file system type, from the text of /proc/mounts (last mount wins)."""
    out: dict[str, str] = {}
    for line in mounts.splitlines():
        parts = line.split()
        if len(parts) >= 3:
            out[parts[1].replace("\\040", " ")] = parts[2]
    return out


def memory_root(mounts: str | None = None, candidates: tuple[str, ...] = CANDIDATES) -> Path | None:
    """The first of `candidates` that is a writable memory file system mount, or None.
    `mounts`: /proc/mounts' text (read when not given)."""
    if mounts is None:
        try:
            mounts = Path("/proc/mounts").read_text()
        except OSError:
            return None
    types = mount_types(mounts)
    for c in candidates:
        if types.get(c) in MEMORY_FS_TYPES and os.path.isdir(c) and os.access(c, os.W_OK | os.X_OK):
            return Path(c)
    return None
