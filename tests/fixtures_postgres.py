"""PostgreSQL for the tests: a real server, and a fresh database per test.

The server is ``KTS_DATABASE_URL`` when set (its user needs CREATEDB), else an embedded server
started once per session under a temporary KTS_HOME (fsync off: test data need not survive a
power cut) and stopped at the end. Each test gets its own database, copied from a template
migrated once per session (CREATE DATABASE … TEMPLATE is far faster than migrating each time).

Fixtures:
- ``pg_url``: SQLAlchemy URL of a fresh, migrated database for this test;
- ``metadata_store``: a ``RemoteLogMetadataStore`` on ``pg_url``;
- ``pg_unmigrated_url``: a fresh database with no kts tables (migration tests);
- ``pg_admin_url``: the server's maintenance database (for pg_terminate_backend and the like);
- ``pg_template``: name of the session's migrated template database;
- ``embedded_postgres``: the session's embedded server (started even when KTS_DATABASE_URL is set).

A subprocess reaches the same database with ``KTS_DATABASE_URL=<pg_url>`` in its environment.
"""

from __future__ import annotations

import contextlib

import os
import uuid
from typing import Iterator

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import make_url

from kts_resources.metadata import database, embedded
from kts_resources.metadata.store import RemoteLogMetadataStore

# Durability off for speed; correctness (locks, transactions, constraints) is unchanged.
FAST_SETTINGS = {"fsync": "off", "synchronous_commit": "off", "full_page_writes": "off"}

__all__ = ["embedded_postgres", "pg_admin_url", "pg_template", "pg_url", "pg_unmigrated_url", "metadata_store"]


@pytest.fixture(scope="session")
def embedded_postgres(tmp_path_factory: pytest.TempPathFactory) -> Iterator[embedded.EmbeddedServer]:
    home = tmp_path_factory.mktemp("kts_home") / "postgres"
    server = embedded.ensure_running(home, settings=FAST_SETTINGS)
    try:
        yield server
    finally:
        embedded.discard(home)  # under root the cluster lives outside the temporary KTS_HOME


@pytest.fixture(scope="session")
def pg_admin_url(request: pytest.FixtureRequest) -> str:
    configured = os.environ.get("KTS_DATABASE_URL", "").strip()
    if configured:
        return database.normalize_url(configured)
    return request.getfixturevalue("embedded_postgres").url_for("postgres")


def _with_database(url: str, name: str) -> str:
    return make_url(url).set(database=name).render_as_string(hide_password=False)


def _admin_engine(url: str) -> sa.Engine:
    return database.create_engine(url, isolation_level="AUTOCOMMIT", poolclass=sa.pool.NullPool)


@pytest.fixture(scope="session")
def pg_template(pg_admin_url: str) -> Iterator[str]:
    name = f"kts_template_{uuid.uuid4().hex[:12]}"
    admin = _admin_engine(pg_admin_url)
    with admin.connect() as conn:
        conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
    engine = database.create_engine(_with_database(pg_admin_url, name), poolclass=sa.pool.NullPool)
    database.migrate(engine)
    with engine.begin() as conn:
        # Simulated records carry a fixed 2023 clock (reproducible runs), which Kafka's default
        # 7-day retention would expire on every copy pass. Test databases keep data unless a test
        # sets retention on its topic (the topic's config wins over this broker-level default).
        conn.exec_driver_sql("INSERT INTO broker_configs (name, value) VALUES ('log.retention.ms', '-1')")
    engine.dispose()  # CREATE DATABASE … TEMPLATE needs the template free of connections
    try:
        yield name
    finally:
        with admin.connect() as conn:
            conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.dispose()


def _fresh_database(admin_url: str, template: str) -> Iterator[str]:
    """A new database from ``template``, dropped afterwards (also :func:`fresh_database`, for a
    test that needs a second one: a store rebuilt from the tier beside the first)."""
    name = f"kts_test_{uuid.uuid4().hex[:12]}"
    admin = _admin_engine(admin_url)
    with admin.connect() as conn:
        conn.exec_driver_sql(f'CREATE DATABASE "{name}" TEMPLATE "{template}"')
    try:
        yield _with_database(admin_url, name)
    finally:
        with admin.connect() as conn:
            conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.dispose()


fresh_database = contextlib.contextmanager(_fresh_database)


@pytest.fixture
def pg_url(pg_admin_url: str, pg_template: str) -> Iterator[str]:
    yield from _fresh_database(pg_admin_url, pg_template)


@pytest.fixture
def pg_unmigrated_url(pg_admin_url: str) -> Iterator[str]:
    yield from _fresh_database(pg_admin_url, "template0")


@pytest.fixture
def metadata_store(pg_url: str) -> Iterator[RemoteLogMetadataStore]:
    store = RemoteLogMetadataStore(database.create_engine(pg_url))
    try:
        yield store
    finally:
        store.close()
