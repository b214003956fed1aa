"""The watchdog beside each server kts leaves running under a ``KTS_HOME`` (the embedded PostgreSQL,
the Spark Connect server): when the server's state directory (``KTS_HOME/postgres``,
``KTS_HOME/spark-connect``) is gone, the server stops, and what it kept outside ``KTS_HOME`` (a
cluster under ``/var/lib/kts/postgres``) is removed with it. A PostgreSQL or a JVM cannot watch
``KTS_HOME`` itself; the CLI server, a kts process, checks the same (``home_gone``) in its own loop.

One watchdog per state directory: it holds an ``flock`` on ``.watch.lock`` there for as long as it
runs, so a starter sees at once whether one is needed (``ensure_watched``). It checks every
``KTS_IDLE_CHECK_S`` seconds; it follows whichever server the directory currently names (a server
restarted keeps its watchdog) and exits when none runs. A state directory renamed is told apart
from one deleted (the watchdog holds it open): the server stops either way (nothing can find it
any more), but only a deleted one takes its cluster along.

Each kind of server (``KINDS``) provides ``watched(home) -> Watched | None`` (its live server)
and ``end_watched(Watched, deleted)`` (stop it; remove its leftovers when ``deleted``).
Standard library only, beside the two server modules it drives.
"""

from __future__ import annotations

import importlib
import os
import stat
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from kts_resources.servers.local_processes import same_process, try_lock

WATCH_LOCK = ".watch.lock"
# Which module drives each kind of server (imported by the watchdog only: no import cycle).
KINDS = {"postgres": "kts_resources.metadata.embedded", "spark-connect": "kts_resources.spark.connect_server"}
SPAWN_TIMEOUT_S = 60


@dataclass(frozen=True, slots=True)
class Watched:
    """One live server: its pid, when that process started (so a reused pid is never signalled),
    and the directory outside its state directory that holds its data (None when there is none)."""

    pid: int
    started: int | None
    outside: Path | None = None


def home_gone(home: Path, held: int | None = None) -> bool:
    """True when ``home`` is no longer a directory there (deleted or renamed); with ``held`` (an
    open descriptor of it), also when another directory has taken its name."""
    try:
        now = os.stat(home)
    except (FileNotFoundError, NotADirectoryError):
        return True
    except OSError:
        return False  # unreadable on the way is not gone
    if not stat.S_ISDIR(now.st_mode):
        return True
    if held is None:
        return False
    then = os.fstat(held)
    return (now.st_dev, now.st_ino) != (then.st_dev, then.st_ino)


def ensure_watched(kind: str, home: Path, server: Watched | None) -> None:
    """Start the watchdog of ``home``'s live ``server`` unless one already runs (holds ``.watch.lock``).

    The directory and the lock are opened and taken here, and handed to the watchdog: it watches
    this very directory (a rename before it has started is still seen) and holds the lock from the
    start (a second starter sees it at once)."""
    if server is None:
        return
    home = Path(os.path.abspath(home))
    try:
        held = os.open(home, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return  # gone already: there is nothing left to find the server by
    try:
        lock = os.open(home / WATCH_LOCK, os.O_RDWR | os.O_CREAT, 0o600)
    except OSError:
        os.close(held)
        return
    try:
        if not try_lock(lock):
            return  # watched already
        package_root = str(Path(__file__).resolve().parent.parent)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (package_root, os.environ.get("PYTHONPATH")) if p)}
        argv = [sys.executable, "-m", "kts_resources.servers.home_watch", kind, str(home), str(held), str(lock),
                str(server.pid), str(server.started or ""), str(server.outside or "")]
        # Through `sh -c '… &'`: the shell returns at once and the watchdog is init's child, not a
        # zombie of a long-lived starter; a session of its own keeps a Ctrl-C in the starter's terminal from it.
        subprocess.run(["/bin/sh", "-c", '"$@" &', "sh", *argv], pass_fds=(held, lock), stdin=subprocess.DEVNULL,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True, cwd="/", env=env,
                       timeout=SPAWN_TIMEOUT_S, check=False)
    finally:
        os.close(lock)  # the watchdog's copy keeps the lock
        os.close(held)


def _without_package_init(package: str) -> None:
    """Make ``package``'s modules importable without running its ``__init__``: that of
    ``kts_resources.metadata`` imports the metadata store (SQLAlchemy, seconds of CPU), and a
    watchdog needs only ``embedded.py`` from it."""
    import importlib.util
    import types

    if package in sys.modules:
        return
    spec = importlib.util.find_spec(package)
    if spec is None or spec.submodule_search_locations is None:
        return
    module = types.ModuleType(package)
    module.__path__ = list(spec.submodule_search_locations)
    module.__spec__ = spec
    sys.modules[package] = module


def watch(kind: str, home: Path, held: int, lock: int, server: Watched, interval_s: float) -> int:
    """The watchdog's loop (see the module docstring): ``held`` is ``home`` opened, ``lock`` its
    ``.watch.lock`` with the lock taken; 0 when it ends."""
    _without_package_init("kts_resources.metadata")
    driver = importlib.import_module(KINDS[kind])
    _say(f"watching {kind} (pid {server.pid})")
    while True:
        if home_gone(home, held):
            deleted = os.fstat(held).st_nlink == 0
            _say(f"{home} is {'deleted' if deleted else 'gone'}; stopping {kind} (pid {server.pid})")
            driver.end_watched(server, deleted)
            _say("stopped")
            return 0
        current = driver.watched(home)
        if current is None and same_process(server.pid, server.started):
            # The directory no longer names it, yet it runs: the directory is being deleted (a
            # `rm -rf` has taken the files that name it but not yet the directory). Keep following it.
            current = server
        if current is None:
            # Stopped: step aside, unless a server started meanwhile (its starter saw this lock
            # held and started no watchdog of its own). Looking again after the release closes that race.
            os.close(lock)
            current = driver.watched(home)
            try:
                # Never created again here: a file made in a directory being deleted fails the `rm -rf`.
                lock = os.open(f"/proc/self/fd/{held}/{WATCH_LOCK}", os.O_RDWR | os.O_CLOEXEC)
            except OSError:
                return 0
            if current is None or not try_lock(lock):
                _say(f"{kind} (pid {server.pid}) ended: leaving")
                return 0
        server = current
        time.sleep(interval_s)


def _say(line: str) -> None:
    print(f"{time.strftime('%Y-%m-%d %H:%M:%S')} kts watchdog {os.getpid()}: {line}", flush=True)


def main(argv: list[str]) -> int:
    if len(argv) != 7 or argv[0] not in KINDS:
        print(f"usage: python -m kts_resources.servers.home_watch {{{','.join(KINDS)}}} STATE_DIR DIR_FD LOCK_FD PID STARTED OUTSIDE "
              "(started by ensure_watched)", file=sys.stderr)
        return 2
    from kts_resources.settings import idle_check_s

    kind, home, held, lock, pid, started, outside = argv
    home = Path(home)
    # Its output (rare: what it stopped) goes beside the server's own files.
    try:
        log = os.open(f"/proc/self/fd/{held}/watch.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
    except OSError:
        pass  # deleted already: nowhere to write
    server = Watched(int(pid), int(started) if started else None, Path(outside) if outside else None)
    return watch(kind, home, int(held), int(lock), server, idle_check_s())


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
