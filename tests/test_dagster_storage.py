"""The Dagster instance the repo's dagster.yaml describes keeps its runs, events and schedules in
kts's own PostgreSQL (``kts_resources/dagster_storage.py``): in the ``dagster`` schema of the
database KTS_DATABASE_URL names, shared by every process that loads it, one pooled connection each."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import dagster as dg
import pytest
import sqlalchemy as sa

from kts_resources.metadata import database
from kts_resources.metadata.database import MetadataStoreUnavailable

REPO_ROOT = Path(__file__).resolve().parent.parent


@dg.asset
def chatty(context):
    for i in range(100):
        context.log.info(f"line {i}")  # each one an event in the event log
    return dg.MaterializeResult(metadata={"lines": 100})


def _tables(url: str, schema: str) -> set[str]:
    engine = database.create_engine(url, poolclass=sa.pool.NullPool)
    try:
        return set(sa.inspect(engine).get_table_names(schema=schema))
    finally:
        engine.dispose()


def _sessions(url: str) -> int:
    """Connections ever opened to the database (PostgreSQL counts them as its backends report)."""
    engine = database.create_engine(url, poolclass=sa.pool.NullPool)
    try:
        with engine.connect() as conn:
            return conn.exec_driver_sql("SELECT sessions FROM pg_stat_database WHERE datname = current_database()").scalar()
    finally:
        engine.dispose()


def test_runs_and_events_live_in_the_dagster_schema_of_kts_database_and_every_instance_sees_them(pg_url, monkeypatch):
    monkeypatch.setenv("KTS_DATABASE_URL", pg_url)
    with dg.DagsterInstance.from_config(str(REPO_ROOT)) as instance:
        result = dg.materialize([chatty], instance=instance)
        assert result.success
    assert {"runs", "event_logs", "asset_keys", "jobs"} <= _tables(pg_url, "dagster")
    assert not {"runs", "event_logs"} & _tables(pg_url, "public")  # kts's own tables stay apart
    assert {"remote_log_events", "kts_alembic_version"} <= _tables(pg_url, "public")

    # Another process loading the same dagster.yaml (a webserver, the daemon) sees the run.
    seen = subprocess.run(
        [sys.executable, "-c", "import dagster as dg, sys; i = dg.DagsterInstance.from_config(sys.argv[1]); "
                               "r = i.get_run_by_id(sys.argv[2]); print(r.status.value, len(i.all_logs(r.run_id)))",
         str(REPO_ROOT), result.run_id],
        env={**os.environ, "KTS_DATABASE_URL": pg_url}, capture_output=True, text=True, timeout=120)
    assert seen.returncode == 0, seen.stderr
    status, events = seen.stdout.split()
    assert status == "SUCCESS" and int(events) > 100


def test_a_run_stores_its_events_over_a_few_pooled_connections_not_one_per_event(pg_url, monkeypatch):
    monkeypatch.setenv("KTS_DATABASE_URL", pg_url)
    with dg.DagsterInstance.from_config(str(REPO_ROOT)) as instance:
        dg.materialize([chatty], instance=instance)  # tables created, connections pooled
        before = _sessions(pg_url)
        result = dg.materialize([chatty], instance=instance)
        assert result.success and len(instance.all_logs(result.run_id)) > 100
    time.sleep(0.5)  # a closed backend's count reaches the statistics as it exits
    # Two for _sessions itself; Dagster's SQLite-style storage would have opened one per event.
    assert _sessions(pg_url) - before <= 8


def test_a_table_found_once_is_not_looked_up_in_the_catalog_again_and_a_missing_one_always_is(pg_url, monkeypatch):
    """Dagster's event log asks whether a table exists before each asset event, check evaluation
    and dynamic-partition lookup; kts's storage asks PostgreSQL once per table and process."""
    monkeypatch.setenv("KTS_DATABASE_URL", pg_url)
    with dg.DagsterInstance.from_config(str(REPO_ROOT)) as instance:
        storage = instance.event_log_storage
        statements: list[str] = []
        sa.event.listen(storage._engine, "before_cursor_execute", lambda *args: statements.append(args[2]))
        assert storage.has_table("dynamic_partitions")
        asked = len(statements)
        assert asked >= 1
        assert storage.has_table("dynamic_partitions") and storage.has_table("dynamic_partitions")
        assert len(statements) == asked
        assert not storage.has_table("no_such_table") and not storage.has_table("no_such_table")
        assert len(statements) == asked + 2
        # What the guard is for still works: partitions added and found.
        instance.add_dynamic_partitions("topic_partitions", ["orders-0"])
        assert instance.has_dynamic_partition("topic_partitions", "orders-0")
        assert not instance.has_dynamic_partition("topic_partitions", "orders-9")


def _creates_tables(instance) -> list[bool]:
    return [s.should_autocreate_tables for s in (instance.run_storage, instance.event_log_storage, instance.schedule_storage)]


def test_loading_an_instance_whose_tables_exist_checks_them_in_one_query_and_a_missing_table_is_made_again(pg_url, monkeypatch):
    monkeypatch.setenv("KTS_DATABASE_URL", pg_url)
    with dg.DagsterInstance.from_config(str(REPO_ROOT)) as instance:  # a new database: Dagster makes its tables
        assert _creates_tables(instance) == [True, True, True]
    assert {"runs", "instance_info", "event_logs", "jobs"} <= _tables(pg_url, "dagster")

    before = _sessions(pg_url)
    with dg.DagsterInstance.from_config(str(REPO_ROOT)) as instance:
        assert _creates_tables(instance) == [False, False, False]
        loaded = _sessions(pg_url)
        assert instance.get_runs() == []  # nothing else changed
    # One for the schema and its tables (and one for _sessions itself): not one more per storage.
    assert loaded - before == 2

    engine = database.create_engine(pg_url, poolclass=sa.pool.NullPool)
    with engine.begin() as conn:
        conn.exec_driver_sql("DROP TABLE dagster.instance_info")
    engine.dispose()
    with dg.DagsterInstance.from_config(str(REPO_ROOT)) as instance:
        assert _creates_tables(instance) == [True, True, True]
    assert "instance_info" in _tables(pg_url, "dagster")


def test_an_unreachable_database_is_one_line_naming_it_without_the_password(pg_url, monkeypatch):
    url = sa.engine.make_url(pg_url).set(host="127.0.0.1", port=1, password="s3cret-pw")
    monkeypatch.setenv("KTS_DATABASE_URL", url.render_as_string(hide_password=False))
    with pytest.raises(MetadataStoreUnavailable) as failure:
        dg.DagsterInstance.from_config(str(REPO_ROOT))
    message = str(failure.value)
    assert message.startswith("the Dagster instance's database at 127.0.0.1:1/") and "unreachable" in message
    assert "s3cret-pw" not in message and "\n" not in message


def test_the_schema_is_a_plain_name(pg_url, monkeypatch, tmp_path):
    monkeypatch.setenv("KTS_DATABASE_URL", pg_url)
    (tmp_path / "dagster.yaml").write_text(
        "storage:\n  custom:\n    module: kts_resources.dagster_storage\n    class: KtsDagsterStorage\n"
        "    config:\n      schema: 'x; DROP TABLE runs'\n")
    with pytest.raises(database.MetadataStoreMisconfigured, match="not a plain PostgreSQL name"):
        dg.DagsterInstance.from_config(str(tmp_path))


def _commit_setting(conn) -> tuple[str, str]:
    """(synchronous_commit, where the session got it: 'client' when its connection asked for it)."""
    return tuple(conn.exec_driver_sql("SELECT setting, source FROM pg_settings WHERE name = 'synchronous_commit'").one())


def test_dagster_sessions_commit_without_waiting_for_the_disk_and_the_metadata_store_keeps_the_servers_setting(pg_url, monkeypatch):
    """Dagster's bookkeeping (events, runs, schedules) may lose its last fraction of a second to an
    operating-system crash; the record of what is in the remote tier may not."""
    from kts_resources.metadata.store import RemoteLogMetadataStore

    monkeypatch.setenv("KTS_DATABASE_URL", pg_url)
    with dg.DagsterInstance.from_config(str(REPO_ROOT)) as instance:
        assert dg.materialize([chatty], instance=instance).success
        for storage in (instance.event_log_storage, instance.run_storage, instance.schedule_storage):
            with storage.index_connection() if hasattr(storage, "index_connection") else storage.connect() as conn:
                assert _commit_setting(conn) == ("off", "client")
    store = RemoteLogMetadataStore.from_url(pg_url)
    try:
        with store.engine.connect() as conn:
            assert _commit_setting(conn)[1] != "client"  # the server's own (the test server's is off, for speed)
    finally:
        store.close()


def test_a_deployment_can_keep_dagsters_commits_synchronous_through_the_database_urls_options(pg_url, monkeypatch):
    url = sa.engine.make_url(pg_url).update_query_dict({"options": "-csynchronous_commit=on"})
    monkeypatch.setenv("KTS_DATABASE_URL", url.render_as_string(hide_password=False))
    with dg.DagsterInstance.from_config(str(REPO_ROOT)) as instance:
        with instance.event_log_storage.index_connection() as conn:
            assert _commit_setting(conn) == ("on", "client")
