"""Writing a file so that a reader sees the old content or the new, never half of it.

Every file the toolkit writes and another process reads back while it may still be
written (results, job outputs, state files) goes through here: the text goes to a
temporary file beside the target, is flushed, then renamed over it (rename is atomic
within one file system)."""

from __future__ import annotations

import os
import threading
from pathlib import Path


def write_text_atomic(path: str | os.PathLike[str], text: str, mode: int = 0o666) -> Path:
    """Write `text` to `path` atomically; the path written. `mode`: the new file's
    permission bits before the umask (0o600 for a file only its owner may read)."""
    target = Path(path)
    # the writer's process and thread in the name: two writers never share a temporary file
    tmp = target.with_name(f".{target.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode), "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return target
