"""The one lifecycle of the servers kts leaves running under a ``KTS_HOME`` (the embedded
PostgreSQL, the Spark Connect server, the CLI server), each in a state directory of its own
(``KTS_HOME/postgres``, ``KTS_HOME/spark-connect``, ``KTS_HOME/cli-server``)::

    server.json  what a later process needs to find the server: its pid, and the kind's own fields
    .lock        flock'd while a process checks, starts or replaces the server, so that
                 concurrent first starts end up sharing one server

A recorded server is trusted only once its process is found to be the one recorded (``runs``:
alive, with the arguments it was started with, so a pid reused after a reboot is never taken for
it); one that is not is stale, and the next starter replaces it. A server is stopped by its pid
only, SIGTERM first and SIGKILL after a grace (``end_process``), so kts never touches a process it
did not start. Standard library only: the CLI server's client and the watchdog (``home_watch.py``)
import it."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, TypeVar

from kts_resources import settings
from kts_resources.private_dirs import make_dirs
from kts_resources.servers.local_processes import command_line, group_alive, locked, same_process

STATE_FILE = "server.json"
START_LOCK = ".lock"
LOOPBACK = "127.0.0.1"

T = TypeVar("T")


def state_dir(name: str, home: Path | None = None) -> Path:
    """``KTS_HOME/name``, a server's state directory (or ``home`` when given, as tests do)."""
    return Path(home) if home is not None else settings.kts_home() / name


def read_state(home: Path, build: Callable[[dict], T]) -> T | None:
    """``build`` of what ``home/server.json`` records, alive or not; None when there is no record
    (or one ``build`` cannot read: a field missing or of the wrong type)."""
    try:
        return build(json.loads((home / STATE_FILE).read_text()))
    except (FileNotFoundError, NotADirectoryError, ValueError, KeyError, TypeError):
        return None


def write_state(home: Path, record: Mapping[str, Any]) -> None:
    """``record`` into ``home/server.json`` (``write_json``)."""
    write_json(home / STATE_FILE, record)


def write_json(path: Path, record: Mapping[str, Any]) -> None:
    """``record`` into ``path``, written whole and renamed: a concurrent reader sees the old
    record or the new one, never half of one."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps(record) + "\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def clear_state(home: Path) -> None:
    """Forget ``home``'s record (a stopped or stale server)."""
    (home / STATE_FILE).unlink(missing_ok=True)


@contextlib.contextmanager
def start_lock(home: Path) -> Iterator[None]:
    """Hold ``home``'s start lock (``home`` made 0700 first, when missing) for the block."""
    make_dirs(home, 0o700)
    with locked(home / START_LOCK):
        yield


def stop_recorded(home: Path, running: Callable[[Path], T | None], end: Callable[[T], None]) -> bool:
    """Stop the server ``home`` records, if ``running`` finds it alive, with ``end``; clear the
    record either way (a stale one names nothing to stop). True when one was running."""
    server = running(home)
    if server is None:
        if home.is_dir():
            clear_state(home)
        return False
    end(server)
    clear_state(home)
    return True


def ensure_started(home: Path, running: Callable[[], T | None], start: Callable[[], T]) -> T:
    """The server ``running()`` finds, else, under ``home``'s start lock, the one another process
    started while this one waited for it, else ``start()`` (which replaces a stale one)."""
    server = running()
    if server is not None:
        return server
    with start_lock(home):
        server = running()
        return server if server is not None else start()


def runs(pid: int, *arguments: str) -> bool:
    """``pid`` is alive and was started with each of ``arguments`` (each one whole argument): the
    process a state file records, not another that reused its number."""
    if not same_process(pid, None):
        return False
    argv = command_line(pid)
    return bool(argv) and all(argument in argv for argument in arguments)


def end_process(pid: int, started: int | None = None, *, grace_s: float, first: int = signal.SIGTERM,
                group: bool = False, poll_s: float = 0.1) -> None:
    """Stop ``pid`` (the process that started at ``started``, when given): ``first`` (SIGTERM),
    then SIGKILL once ``grace_s`` has passed. With ``group``, both go to its process group, and
    the SIGKILL goes in any case, to whatever of the group the first signal left behind."""
    if not same_process(pid, started):
        return
    send = os.killpg if group else os.kill
    _signal(send, pid, first)
    deadline = time.monotonic() + grace_s
    while same_process(pid, started) and time.monotonic() < deadline:
        time.sleep(poll_s)
    if group:
        _signal(send, pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while group_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
    elif same_process(pid, started):
        _signal(send, pid, signal.SIGKILL)


def _signal(send: Callable[[int, int], None], pid: int, signum: int) -> None:
    try:
        send(pid, signum)
    except (ProcessLookupError, PermissionError):
        pass  # gone meanwhile (or, for a group, only other accounts' processes left in it)


def free_port() -> int:
    """A loopback TCP port free now (a server started on it may still lose it to another: retry)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOOPBACK, 0))
        return sock.getsockname()[1]
