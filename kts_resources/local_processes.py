"""The two facts every server kts starts under ``KTS_HOME`` is managed by (the embedded
PostgreSQL, the Spark Connect server, the CLI server): whether a recorded pid is still a live
process, and an exclusive lock on a file, so concurrent first starts end up sharing one server.
Standard library only: the CLI server's client reads them before every command."""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path
from typing import Iterator


def alive(pid: int) -> bool:
    """``pid`` is a running process (of any account), not a zombie awaiting its parent's wait."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # alive, owned by another account
    # A killed server stays a zombie until its parent (often init) reaps it.
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state != "Z"


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``path`` (created if missing) for the block."""
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
