"""Dagster's runs, event log and schedules in kts's own PostgreSQL server, in a schema of their own.

dagster.yaml names this class as the instance's storage, so every process that loads the instance —
`kts sync`, `kts ui`'s webserver and daemon, the run workers the daemon launches — finds it where
kts's metadata store is: ``KTS_DATABASE_URL``, else the embedded server under ``KTS_HOME`` (started
on demand, as for the store). The tables live in the ``dagster`` schema of that database (Dagster's
names, ``runs``, ``event_logs``…, never meet kts's), and one deployment is one instance whichever
DAGSTER_HOME a process starts from.

Why not Dagster's SQLite files: a no-op ``kts sync`` stores ~150 events and its assets look their
dynamic partitions up ~100 times; SQLite storage builds an engine and connection per statement
(~7 ms each here), which was a third of the pass. Here each process holds one pooled connection
(the pool Dagster's webserver sets up for itself), and the daemon, the webserver and several run
workers write side by side without SQLite's file locks.
"""

from __future__ import annotations

import logging
import re

from dagster import Field
from dagster_postgres import DagsterPostgresStorage
from sqlalchemy.engine import make_url

from kts_resources.dagster_event_log import KtsEventLogStorage

log = logging.getLogger(__name__)

DEFAULT_SCHEMA = "dagster"
_SCHEMA_NAME = re.compile(r"[a-z_][a-z0-9_]{0,62}")
# Connections a process may open beside its pooled one (the daemon's threads, a busy webserver).
MAX_OVERFLOW = 10
POOL_RECYCLE_S = 3600


class KtsDagsterStorage(DagsterPostgresStorage):
    """``storage: custom: {module: kts_resources.dagster_storage, class: KtsDagsterStorage}``.
    Config: ``schema`` (default ``dagster``), the PostgreSQL schema that holds Dagster's tables."""

    def __init__(self, schema: str = DEFAULT_SCHEMA, inst_data=None, server_url: str | None = None):
        self.schema = schema
        url = dagster_database_url(schema, server_url)
        # Each of Dagster's three storages otherwise opens a connection and reflects the schema's
        # tables to see whether to create them (~0.1 s of every process that loads the instance).
        autocreate = not _prepare_schema(url, schema)
        super().__init__(url, should_autocreate_tables=autocreate, inst_data=inst_data)
        # The event log with a run's bookkeeping batched (kts_resources.dagster_event_log), in place
        # of the one just made (which made the tables if they were missing; this one only looks).
        self._event_log_storage = KtsEventLogStorage(url, should_autocreate_tables=autocreate)
        # One pooled connection per process, as Dagster's webserver keeps (storages otherwise open a
        # connection per statement); no statement timeout in a run (a webserver sets its own).
        for storage in (self.run_storage, self.event_log_storage, self.schedule_storage):
            storage.optimize_for_webserver(statement_timeout=0, pool_recycle=POOL_RECYCLE_S, max_overflow=MAX_OVERFLOW)
        _remember_tables_found(self.event_log_storage)

    @classmethod
    def config_type(cls):
        return {"schema": Field(str, is_required=False, default_value=DEFAULT_SCHEMA)}

    @classmethod
    def from_config_value(cls, inst_data, config_value):
        return cls(schema=config_value.get("schema", DEFAULT_SCHEMA), inst_data=inst_data)


def _remember_tables_found(storage) -> None:
    """Answer the event log's ``has_table`` from memory once a table was found.

    Dagster's PostgreSQL event log asks the catalog whether a table exists before every asset event
    (``asset_event_tags``), every check evaluation and every dynamic-partition lookup (which each
    ``add_asset_metadata(partition_key=…)`` makes three of): one round trip each, ~7 % of a 1 GiB
    ``kts sync``'s CPU in its main thread (py-spy). Those are guards for an instance not yet
    migrated; a table that exists does not go away while a process runs (Dagster caches
    ``has_secondary_index`` the same way), and one not found is asked again next time."""
    found: set[str] = set()
    ask = storage.has_table

    def has_table(table_name: str) -> bool:
        if table_name in found:
            return True
        if ask(table_name):
            found.add(table_name)
            return True
        return False

    storage.has_table = has_table


def dagster_database_url(schema: str = DEFAULT_SCHEMA, server_url: str | None = None) -> str:
    """kts's database URL (``server_url``, default ``database_url()``) with ``schema`` first on the
    search path (created if missing), and Dagster's commits not waiting for the disk.

    ``synchronous_commit=off`` for Dagster's own sessions only: a run stores ~170 events, each two
    or three autocommitted statements, and every commit waited for a WAL flush — behind the copy's
    own writes of a gigabyte, ~1 s of a 1 GiB ``kts sync`` (bench/README.md). PostgreSQL keeps the
    database consistent either way; an operating-system crash may lose the last fraction of a
    second of Dagster's events, as if they were never written (the run monitor fails a run whose
    worker is gone, and frees its pool slots). kts's metadata store, the record of what is in the
    remote tier, keeps its sessions synchronous, and its commits flush Dagster's earlier ones too.
    Options in ``KTS_DATABASE_URL`` come after, so a deployment can still set it back."""
    from kts_resources.metadata import database

    if not _SCHEMA_NAME.fullmatch(schema):
        raise database.MetadataStoreMisconfigured(
            f"dagster.yaml: storage schema {schema!r} is not a plain PostgreSQL name (lower case letters, digits, _)")
    url = make_url(database.normalize_url(server_url) if server_url else database.database_url())
    options = " ".join(filter(None, ["-csynchronous_commit=off", url.query.get("options"), f"-csearch_path={schema}"]))
    # connect_timeout: a server that is gone fails the load in seconds; the name tells Dagster's
    # connections from the store's in pg_stat_activity.
    url = url.update_query_dict({"options": options, "connect_timeout": str(database.CONNECT_TIMEOUT_S),
                                 "application_name": "kts-dagster"})
    return url.render_as_string(hide_password=False)


# The tables whose absence makes each of Dagster's PostgreSQL storages create its own (with
# should_autocreate_tables): run storage "runs" (and "instance_info"), the event log "event_logs",
# schedule storage "jobs" or "schedules" (dagster_postgres, each storage's __init__).
_CREATION_MARKERS = (("runs",), ("instance_info",), ("event_logs",), ("jobs", "schedules"))


def _prepare_schema(url: str, schema: str) -> bool:
    """Create ``schema`` if missing; True when every table whose absence would make one of
    Dagster's storages create its tables is already there (so none need look)."""
    import sqlalchemy as sa
    from sqlalchemy.exc import IntegrityError, OperationalError, ProgrammingError

    from kts_resources.metadata import database

    bare = make_url(url)
    engine = database.create_engine(bare.set(query={k: v for k, v in bare.query.items() if k != "options"}),
                                    poolclass=sa.pool.NullPool)
    try:
        with engine.begin() as conn:
            conn.exec_driver_sql(f'CREATE SCHEMA IF NOT EXISTS "{schema}"')
            tables = set(conn.execute(sa.text("SELECT table_name FROM information_schema.tables WHERE table_schema = :schema"),
                                      {"schema": schema}).scalars())
        return all(any(name in tables for name in marker) for marker in _CREATION_MARKERS)
    except OperationalError as e:
        # Dagster would retry and then raise a traceback; this is the line a user needs.
        reason = str(getattr(e, "orig", None) or e).strip().splitlines()[0]
        raise database.MetadataStoreUnavailable(
            f"the Dagster instance's database at {database.describe_url(engine.url)} is unreachable: {reason}",
            location=database.describe_url(engine.url), reason=reason) from None
    except (IntegrityError, ProgrammingError) as e:
        # Two processes' first start at once: IF NOT EXISTS is not atomic in PostgreSQL; the
        # other one made it.
        log.debug("schema %s: %s", schema, e)
        return False
    finally:
        engine.dispose()
