"""Dagster's PostgreSQL event log, storing a run's bookkeeping in fewer round trips.

A pass over a partition range writes, per partition, one materialisation planned per asset and one
evaluation per check (8 checks a partition). At a broker's size these were the largest cost of a
``kts sync`` after the copy itself (bench/scale_bench.py at 400 partitions, py-spy: ~1.7 s for the
planned events, ~3.4 s for the evaluations, against 6 s for the copy alone):

* **Planned events.** Dagster hands a run's planned events to ``store_event_batch`` as one batch
  of two kinds (materialisations, then checks), which ``PostgresEventLogStorage`` stores one at a
  time because the batch is mixed: an insert, a NOTIFY and an asset-table upsert each. Here each
  kind is stored as its own batch, and a batch of planned materialisations is one insert, with the
  asset table upserted once per asset from its latest event — what storing them one at a time
  leaves there (``last_run_id``, the latest timestamp).
* **Check evaluations.** Dagster stores each alone (they are not batch-writable): the event row,
  a NOTIFY, then the check's execution row updated in a second connection, the event serialised
  twice. Here it is one statement: the event row inserted and the execution row updated from it,
  with the event serialised once. The NOTIFY is left out, as Dagster's own batch writes leave it
  out: nothing listens to it (Dagster's PostgreSQL event watcher polls).

Dagster's private storage API (its tables, ``_event_to_row``, ``_store_asset_event``) is used here
and in ``kts_assets.dagster_internals`` only; both are pinned with the dagster release in
pyproject.toml, and tests/test_dagster_event_log.py compares what this class stores with what
Dagster's own storage stores for the same run.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import sqlalchemy as sa
from dagster import DagsterEventType, DagsterInvariantViolationError, EventLogEntry
from dagster._core.storage.asset_check_execution_record import AssetCheckExecutionRecordStatus
from dagster._core.storage.event_log.schema import AssetCheckExecutionsTable, SqlEventLogStorageTable
from dagster_postgres import PostgresEventLogStorage

_EXECUTIONS = AssetCheckExecutionsTable


class KtsEventLogStorage(PostgresEventLogStorage):
    """``PostgresEventLogStorage`` with batched planned events and one-statement check evaluations
    (``kts_resources.dagster_storage.KtsDagsterStorage`` uses it)."""

    def store_event_batch(self, events: Sequence[EventLogEntry]) -> None:
        for kind, group in _runs_of_one_kind(events):
            if kind == DagsterEventType.ASSET_MATERIALIZATION_PLANNED and len(group) > 1:
                self._store_planned_materializations(group)
            else:
                super().store_event_batch(group)

    def store_event(self, event: EventLogEntry) -> None:
        if event.dagster_event_type == DagsterEventType.ASSET_CHECK_EVALUATION and event.run_id:
            self._store_check_evaluation(event)
        else:
            super().store_event(event)

    def _store_planned_materializations(self, events: Sequence[EventLogEntry]) -> None:
        with self._connect() as conn:
            ids = [int(i) for i in conn.execute(
                self.prepare_insert_event_batch(events).returning(SqlEventLogStorageTable.c.id)).scalars()]
        latest: dict[object, tuple[EventLogEntry, int]] = {}
        for event, event_id in zip(events, ids, strict=True):
            latest[event.get_dagster_event().asset_key] = (event, event_id)
        with self.index_transaction() as conn:
            self._store_asset_event_tags(conn, events, ids)
            for event, event_id in latest.values():
                self._store_asset_event(conn, event, event_id)

    def _store_check_evaluation(self, event: EventLogEntry) -> None:
        """The event row and its check's execution row (made by the run's planned event), in one
        statement; an execution row is inserted when there was none (a step launched without
        planned events), as Dagster does."""
        evaluation = event.get_dagster_event().event_specific_data
        row = self._event_to_row(event)
        status = (AssetCheckExecutionRecordStatus.SUCCEEDED if evaluation.passed
                  else AssetCheckExecutionRecordStatus.FAILED).value
        target = evaluation.target_materialization_data
        execution = {
            "execution_status": status,
            "evaluation_event": row["event"],
            "evaluation_event_timestamp": row["timestamp"],
            "materialization_event_storage_id": target.storage_id if target else None,
            "partition": evaluation.partition,
        }
        key = {"asset_key": evaluation.asset_key.to_string(), "check_name": evaluation.check_name, "run_id": event.run_id}
        inserted = SqlEventLogStorageTable.insert().values(**row).returning(SqlEventLogStorageTable.c.id).cte("inserted")
        event_id = sa.select(inserted.c.id).scalar_subquery()
        partition = (_EXECUTIONS.c.partition.is_(None) if evaluation.partition is None
                     else _EXECUTIONS.c.partition == evaluation.partition)
        updated = (_EXECUTIONS.update()
                   .where(*(_EXECUTIONS.c[name] == value for name, value in key.items()), partition)
                   .values(**execution, evaluation_event_storage_id=event_id)
                   .returning(_EXECUTIONS.c.id).cte("updated"))
        statement = sa.select(event_id, sa.select(sa.func.count()).select_from(updated).scalar_subquery())
        with self._connect() as conn:
            stored_id, rows_updated = conn.execute(statement).one()
            if rows_updated == 0:
                conn.execute(_EXECUTIONS.insert().values(**key, **execution, evaluation_event_storage_id=stored_id))
        if rows_updated > 1:
            raise DagsterInvariantViolationError(
                f"Updated {rows_updated} rows for asset check evaluation {evaluation.asset_check_key} "
                "as a result of duplicate AssetCheckPlanned events.")


def _runs_of_one_kind(events: Sequence[EventLogEntry]) -> Iterator[tuple[DagsterEventType, list[EventLogEntry]]]:
    """``events`` cut where their type changes, in order."""
    group: list[EventLogEntry] = []
    for event in events:
        if group and event.dagster_event_type != group[0].dagster_event_type:
            yield group[0].dagster_event_type, group
            group = []
        group.append(event)
    if group:
        yield group[0].dagster_event_type, group
