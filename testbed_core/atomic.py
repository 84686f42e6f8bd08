"""Writing a file so that a reader sees the old content or the new, never half of it.

Every file the toolkit writes and another process reads back while it may still be
written (results, job outputs, state files) goes through here: the text goes to a
temporary file beside the target, is flushed, then renamed over it (rename is atomic
within one file system)."""

from __future__ import annotations

import os
from pathlib import Path


def write_text_atomic(path: str | os.PathLike[str], text: str) -> Path:
    """Write `text` to `path` atomically; the path written."""
    target = Path(path)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return target
