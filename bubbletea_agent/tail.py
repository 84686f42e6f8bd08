"""Following append-only JSON-lines files that another process is still writing: the
worker's slot feed (slots.py) and the device timeline (testbed_runtime/device.py).

`JsonlTail` is the one reader of such files: each `poll` returns the lines completed
since the previous one, keeps a half-written last line until its newline arrives (a
writer's line may land in two reads), and treats a missing file as nothing written yet
(the writer may start after the reader). What a line means is the caller's business
(slots.SlotFeed, runtime.TimelineTail).
"""

from __future__ import annotations

import os
from pathlib import Path


class JsonlTail:
    """The complete lines appended to `path` since the previous poll, numbered from 1."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        self._offset = 0
        self._partial = b""
        self._lines = 0

    def poll(self) -> list[tuple[int, bytes]]:
        """(line number, line without its newline) for each line completed since the last poll."""
        try:
            with self.path.open("rb") as f:
                f.seek(self._offset)
                data = f.read()
        except FileNotFoundError:
            return []
        if not data:
            return []
        self._offset += len(data)
        *lines, self._partial = (self._partial + data).split(b"\n")
        first = self._lines + 1
        self._lines += len(lines)
        return list(enumerate(lines, first))
