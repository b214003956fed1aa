"""Where the metadata store lives and how kts talks to it: the URL, the engine, retries, migrations.

``KTS_DATABASE_URL`` names the server: any ``postgresql://`` URL (psycopg2 is the driver) or a
libpq key/value string (``host=db port=5432 dbname=kts user=kts``). Unset, the embedded server under
``KTS_HOME`` is started on demand (``embedded.py``). A URL kts cannot use, or a database whose schema
kts cannot bring to its revision, is ``MetadataStoreMisconfigured``: one line, never the password.

A dropped connection is not an error kts reports straight away: ``with_retries`` runs an
operation again (a fresh transaction, with backoff) when the failure was the connection's, and
only after the last attempt gives ONE clear ``MetadataStoreUnavailable`` naming the server.
"""

from __future__ import annotations

import functools
import logging
import time
from pathlib import Path
from typing import Callable, TypeVar

import sqlalchemy as sa
from sqlalchemy.engine import URL, Connection, Engine, make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, OperationalError

from kts_resources import settings

log = logging.getLogger(__name__)

T = TypeVar("T")

MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"
# Its own version table: Dagster's storage (also Alembic) may share the database.
VERSION_TABLE = "kts_alembic_version"
# pg_advisory_lock key serialising migrations across processes ("kts-migr" as 8 ASCII bytes).
MIGRATION_LOCK_KEY = int.from_bytes(b"kts-migr", "big", signed=True)

DEFAULT_ATTEMPTS = 4
DEFAULT_BACKOFF_S = 0.05
CONNECT_TIMEOUT_S = 5


class MetadataStoreUnavailable(ConnectionError):
    """The metadata store's server cannot be reached (after retrying). ``location`` is where it
    was (``host:port/database``, never the password) and ``reason`` the driver's first line."""

    def __init__(self, message: str, *, location: str | None = None, reason: str | None = None):
        super().__init__(message)
        self.location, self.reason = location, reason

    def went_away(self) -> str:
        """The line for a server that answered earlier in the command (killed, restarted, the
        network cut): what was done is committed or rolled back whole, and the next pass goes on."""
        if self.location is None:
            return str(self)
        return f"metadata store at {self.location} went away: {self.reason}"


class MetadataStoreMisconfigured(ValueError):
    """``KTS_DATABASE_URL``, or the database it names, is not one kts can use; retrying cannot help."""


URL_FORMS = "postgresql://user:password@host:port/database or libpq's 'host=… port=… dbname=… user=…'"


def database_url() -> str:
    """``KTS_DATABASE_URL`` if set, else the embedded server's URL (starting it if needed)."""
    configured = settings.database_url()
    if configured:
        return normalize_url(configured)
    from kts_resources.metadata import embedded

    return embedded.ensure_running().url


def normalize_url(url: str | URL) -> str:
    """Any PostgreSQL URL with the psycopg2 driver (``postgres://`` and ``postgresql://`` too), or
    a libpq key/value string, as a SQLAlchemy URL."""
    parsed = url if isinstance(url, URL) else _parse(str(url).strip())
    if parsed.get_backend_name() not in ("postgresql", "postgres"):
        raise MetadataStoreMisconfigured(
            f"the metadata store needs PostgreSQL, not {parsed.get_backend_name()!r} ({describe_url(parsed)}); "
            f"set KTS_DATABASE_URL to {URL_FORMS}"
        )
    return parsed.set(drivername="postgresql+psycopg2").render_as_string(hide_password=False)


def _parse(text: str) -> URL:
    # The text may hold a password: no message below repeats it.
    if "://" not in text and "=" in text:
        return _parse_libpq(text)
    try:
        parsed = make_url(text)
        parsed.port  # noqa: B018 — a non-numeric port fails here, not at the first connection
    except (ArgumentError, ValueError):
        raise MetadataStoreMisconfigured(f"KTS_DATABASE_URL is not a database URL; expected {URL_FORMS}") from None
    return parsed


def _parse_libpq(text: str) -> URL:
    """libpq's ``key=value`` connection string: host, port, dbname, user and password go to the
    URL's parts, every other keyword (sslmode, …) to its query, as psycopg2 takes them."""
    from psycopg2.extensions import parse_dsn

    try:
        params = parse_dsn(text)
    except Exception:  # psycopg2.ProgrammingError: libpq's own parser refused it
        raise MetadataStoreMisconfigured(f"KTS_DATABASE_URL is not a libpq connection string; expected {URL_FORMS}") from None
    port = params.pop("port", None)
    if port is not None and not (port.isdigit() and 0 < int(port) < 65536):
        raise MetadataStoreMisconfigured(f"KTS_DATABASE_URL: port {port!r} is not a TCP port")
    return URL.create(
        "postgresql+psycopg2",
        username=params.pop("user", None),
        password=params.pop("password", None),
        host=params.pop("host", None),
        port=int(port) if port is not None else None,
        database=params.pop("dbname", None),
        query=params,
    )


def describe_url(url: str | URL) -> str:
    """``host:port/database`` for messages: never the password."""
    parsed = make_url(str(url)) if not isinstance(url, URL) else url
    host = parsed.host or (parsed.query.get("host") if parsed.query else None) or "localhost"
    if isinstance(host, tuple):
        host = ",".join(host)
    return f"{host}:{parsed.port or 5432}/{parsed.database or ''}"


def create_engine(url: str | URL | None = None, **kwargs) -> Engine:
    """An engine on ``url`` (default ``database_url()``): psycopg2, pool_pre_ping so a pooled
    connection the server dropped is replaced before use, and a bounded connect timeout so an
    unreachable server fails in seconds rather than hanging."""
    target = normalize_url(url if url is not None else database_url())
    connect_args = {
        "connect_timeout": CONNECT_TIMEOUT_S,
        "application_name": "kts",
        # Notice a dead server on an idle pooled connection instead of waiting on TCP forever.
        "keepalives": 1,
        "keepalives_idle": 30,
        "keepalives_interval": 10,
        "keepalives_count": 3,
    }
    connect_args.update(kwargs.pop("connect_args", {}))
    return sa.create_engine(target, pool_pre_ping=True, connect_args=connect_args, **kwargs)


def is_connection_error(exc: BaseException) -> bool:
    """True when ``exc`` is the connection's failure (server gone, network, restart), after
    which running the whole transaction again is the right answer."""
    if isinstance(exc, DBAPIError) and exc.connection_invalidated:
        return True
    if isinstance(exc, OperationalError):
        # psycopg2 reports refused/closed connections without a SQLSTATE; server-side errors
        # that merely inherit OperationalError (deadlock, lock timeout, query cancel) carry one.
        code = getattr(exc.orig, "pgcode", None)
        return code is None or code.startswith("08") or code in ("57P01", "57P02", "57P03")
    return False


def with_retries(
    engine: Engine,
    operation: Callable[[int], T],
    *,
    attempts: int = DEFAULT_ATTEMPTS,
    backoff_s: float = DEFAULT_BACKOFF_S,
) -> T:
    """``operation(attempt)`` (attempt counts from 1), run again after a connection error.

    Only for operations that are safe to repeat: reads, and writes that recognise their own
    earlier commit (a commit may succeed on the server and still lose its reply). After the last
    attempt: ``MetadataStoreUnavailable`` saying which server and why.
    """
    delay = backoff_s
    for attempt in range(1, attempts + 1):
        try:
            return operation(attempt)
        except DBAPIError as exc:
            if not is_connection_error(exc):
                raise
            if attempt == attempts:
                raise unavailable(engine, exc) from exc
            log.warning("metadata store connection lost (attempt %d of %d): %s", attempt, attempts, _first_line(exc))
            time.sleep(delay)
            delay *= 2
    raise AssertionError("unreachable")


def in_transaction(engine: Engine, work: Callable[[Connection, int], T], **retry) -> T:
    """``work(conn, attempt)`` in one transaction (committed on return, rolled back on error),
    retried whole on a connection error: nothing is ever half-written."""

    def once(attempt: int) -> T:
        with engine.begin() as conn:
            return work(conn, attempt)

    return with_retries(engine, once, **retry)


def unavailable(engine: Engine, exc: BaseException) -> MetadataStoreUnavailable:
    location, reason = describe_url(engine.url), _first_line(exc)
    return MetadataStoreUnavailable(f"metadata store at {location} is unreachable: {reason}", location=location, reason=reason)


def _first_line(exc: BaseException) -> str:
    orig = getattr(exc, "orig", None) or exc
    text = str(orig).strip()
    return text.splitlines()[0] if text else type(orig).__name__


# -- migrations -----------------------------------------------------------------------------------


def alembic_config(connection: Connection | None = None):
    """Alembic's Config for kts's migrations (no alembic.ini: the scripts live in the package).
    ``alembic.command.revision(alembic_config(conn), autogenerate=True, message=...)`` writes a
    new migration against a database at head."""
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    if connection is not None:
        config.attributes["connection"] = connection
    return config


def migrate(engine: Engine, revision: str = "head") -> None:
    """Upgrade the store's schema to ``revision``. Idempotent; concurrent callers queue on an
    advisory lock, so the second finds the schema already at head instead of racing the first."""
    from alembic import command

    if revision == "head" and with_retries(engine, lambda _attempt: _at_head(engine)):
        return  # every open after the first: one query, not Alembic's ~0.3 s of loading the scripts

    def once(_attempt: int) -> None:
        with engine.connect() as conn:
            conn.execute(sa.text("SELECT pg_advisory_lock(:key)"), {"key": MIGRATION_LOCK_KEY})
            conn.commit()
            try:
                config = alembic_config(conn)
                _check_known_revision(engine, conn, config)
                try:
                    command.upgrade(config, revision)
                except DBAPIError as exc:
                    if is_connection_error(exc):
                        raise
                    # The server refused the schema change: a table kts did not make is in the
                    # way, or the account may not create tables. Retrying cannot help.
                    raise MetadataStoreMisconfigured(
                        f"metadata store at {describe_url(engine.url)}: cannot bring its schema to revision "
                        f"{head_revision()}: {_first_line(exc)}"
                    ) from exc
                conn.commit()
            finally:
                # Session-level: released even when the upgrade failed (or by the server when the
                # connection itself died).
                if not conn.invalidated:
                    conn.rollback()
                    conn.execute(sa.text("SELECT pg_advisory_unlock(:key)"), {"key": MIGRATION_LOCK_KEY})
                    conn.commit()

    with_retries(engine, once)


def _check_known_revision(engine: Engine, conn: Connection, config) -> None:
    """One clear line when the database is at a revision these migrations do not know (a newer
    kts migrated it, or another tool wrote kts's version table)."""
    from alembic.runtime.migration import MigrationContext
    from alembic.script import ScriptDirectory

    script = ScriptDirectory.from_config(config)
    for current in MigrationContext.configure(conn, opts={"version_table": VERSION_TABLE}).get_current_heads():
        try:
            known = script.get_revision(current) is not None
        except Exception:  # alembic's ResolutionError / CommandError: not one of ours
            known = False
        if not known:
            conn.rollback()
            raise MetadataStoreMisconfigured(
                f"metadata store at {describe_url(engine.url)} is at schema revision {current[:64]!r}, which this "
                f"kts does not know (its newest is {head_revision()!r}): was it migrated by a newer kts?"
            )


def current_revision(engine: Engine) -> str | None:
    """The schema revision the database is at (None before the first migration)."""
    from alembic.runtime.migration import MigrationContext

    with engine.connect() as conn:
        return MigrationContext.configure(conn, opts={"version_table": VERSION_TABLE}).get_current_revision()


def _at_head(engine: Engine) -> bool:
    """The database's schema is at this kts's newest revision already (its version table holds
    exactly that one): nothing to migrate, nothing to lock."""
    with engine.connect() as conn:
        try:
            current = conn.execute(sa.text(f"SELECT version_num FROM {VERSION_TABLE}")).scalars().all()
        except sa.exc.ProgrammingError:  # no version table yet: a fresh database
            return False
    return current == [head_revision()]


@functools.cache  # the scripts are this process's code: they do not change under it
def head_revision() -> str:
    from alembic.script import ScriptDirectory

    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    assert head is not None
    return head
