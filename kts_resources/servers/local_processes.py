"""The facts every server kts starts under ``KTS_HOME`` is managed by (the embedded PostgreSQL,
the Spark Connect server, the CLI server; ``lifecycle.py`` puts them together): whether a recorded
pid is still a live process (and still the same one, or its group), what a process runs, and an
exclusive lock on a file, so concurrent first starts end up sharing one server. Standard library
only: the CLI server's client reads them before every command, and the servers' watchdog
(``home_watch.py``) imports little else."""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path
from typing import Iterator


def alive(pid: int) -> bool:
    """``pid`` is a running process (of any account), not a zombie awaiting its parent's wait."""
    if pid <= 0:
        return False  # kill(0 or -n, 0) would ask about a process group, not a process
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


def start_time(pid: int) -> int | None:
    """When ``pid`` started (clock ticks after boot, /proc/PID/stat's 22nd field), or None when it
    is gone: with the pid, it names one process, never another that reused the number later."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def same_process(pid: int, started: int | None) -> bool:
    """``pid`` is alive and is the process that started at ``started`` (as ``start_time`` said)."""
    return alive(pid) and (started is None or start_time(pid) == started)


def group_alive(pgid: int) -> bool:
    """A process of group ``pgid`` still runs (zombies waiting to be reaped do not count)."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False


def command_line(pid: int) -> list[str]:
    """``pid``'s arguments (empty when it is gone or unreadable)."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [arg.decode(errors="replace") for arg in raw.split(b"\0")[:-1]]


def pids() -> list[int]:
    """Every process's pid this process can see in /proc."""
    return [int(entry.name) for entry in Path("/proc").iterdir() if entry.name.isdigit()]


def owner_uid(pid: int) -> int | None:
    """The real uid ``pid`` runs as (None when it is gone)."""
    try:
        return Path(f"/proc/{pid}").stat().st_uid
    except OSError:
        return None


def try_lock(fd: int) -> bool:
    """Take an exclusive ``flock`` on ``fd`` without waiting; False when another holds it."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``path`` (created if missing) for the block."""
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
