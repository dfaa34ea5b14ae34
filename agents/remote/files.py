"""Files the node's agent tools hand to the remote server, replaced whole: the server never reads
half of one."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path


def write_whole(path: Path, text: str, mode: int = 0o644) -> None:
    """Replace `path` with `text`: a temporary file in the same directory, synced, then renamed
    into place; on failure the old file stays and the temporary one goes. Raises OSError."""
    fd, temp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="ascii") as f:
            f.write(text)
            f.flush()
            os.fchmod(f.fileno(), mode)  # the server may run as another user; it only reads
            os.fsync(f.fileno())
        os.replace(temp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise
