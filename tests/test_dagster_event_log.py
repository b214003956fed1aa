"""kts's Dagster event log (``kts_resources/dagster_event_log.py``) stores a run's planned events
in batches and each check evaluation in one statement, and leaves exactly what Dagster's own
PostgreSQL event log leaves: the same events, the same check executions (status, partition, the
materialisation each targets), the same asset rows. The UI reads those."""

from __future__ import annotations

import time

import dagster as dg
import pytest
import sqlalchemy as sa
from dagster._core.events import DagsterEvent
from dagster._core.storage.asset_check_execution_record import AssetCheckExecutionRecordStatus

from kts_assets.dagster_internals import materialization_target
from kts_resources.dagster_storage import dagster_database_url
from kts_resources.metadata import database

PARTS = dg.StaticPartitionsDefinition(["p0", "p1", "p2", "p3", "p4"])
WHOLE = dg.AssetCheckKey(dg.AssetKey("ranged"), "whole")
SECOND = dg.AssetCheckKey(dg.AssetKey("ranged"), "second")
FAILING = "p2"  # the partition whose "whole" check fails


@dg.multi_asset(
    specs=[dg.AssetSpec("ranged", partitions_def=PARTS), dg.AssetSpec("beside", partitions_def=PARTS)],
    check_specs=[dg.AssetCheckSpec(WHOLE.name, asset="ranged", partitions_def=PARTS),
                 dg.AssetCheckSpec(SECOND.name, asset="ranged", partitions_def=PARTS)],
    backfill_policy=dg.BackfillPolicy.single_run(),
)
def ranged(context):
    """As kts's steps do: every partition of the range materialised, then one evaluation per
    partition and check, aimed at the partition's latest materialisation."""
    keys = list(context.partition_keys)
    yield dg.Output(None, output_name="ranged")
    yield dg.Output(None, output_name="beside")
    records = context.instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=WHOLE.asset_key, asset_partitions=keys), limit=len(keys)).records
    latest = {r.partition_key: r for r in reversed(records)}
    for check in (WHOLE, SECOND):
        for key in keys:
            yield dg.AssetCheckEvaluation(asset_key=check.asset_key, check_name=check.name,
                                          passed=not (check == WHOLE and key == FAILING), partition=key,
                                          metadata={"partition": key}, target_materialization_data=materialization_target(latest[key]))
        yield dg.Output(None, output_name=context.op_execution_context.assets_def.get_output_name_for_asset_check_key(check))


def _kts_instance(pg_url, monkeypatch):
    monkeypatch.setenv("KTS_DATABASE_URL", pg_url)
    return dg.instance_for_test(overrides={"storage": {"custom": {
        "module": "kts_resources.dagster_storage", "class": "KtsDagsterStorage", "config": {"schema": "kts_events"}}}})


def _dagsters_instance(pg_url):
    engine = database.create_engine(pg_url, poolclass=sa.pool.NullPool)
    with engine.begin() as conn:
        conn.exec_driver_sql("CREATE SCHEMA IF NOT EXISTS dagsters_own")
    engine.dispose()
    return dg.instance_for_test(overrides={"storage": {"postgres": {"postgres_url": dagster_database_url("dagsters_own", pg_url)}}})


def _run_twice(instance) -> list[str]:
    """A ranged run over p0..p3, then one over p1..p4 (the second replaces some evaluations)."""
    run_ids = []
    for start, end in (("p0", "p3"), ("p1", "p4")):
        result = dg.materialize([ranged], instance=instance, tags={
            "dagster/asset_partition_range_start": start, "dagster/asset_partition_range_end": end})
        assert result.success
        run_ids.append(result.run_id)
    return run_ids


def _events(instance, run_id) -> list[tuple]:
    """A run's events, as the UI lists them (their storage ids as positions in the run)."""
    out = []
    for e in instance.all_logs(run_id):
        if e.dagster_event is None:
            continue
        data = e.dagster_event.event_specific_data
        out.append((e.dagster_event.event_type_value, str(e.dagster_event.asset_key), e.dagster_event.partition,
                    getattr(data, "check_name", None), getattr(data, "passed", None)))
    return out


def _check_state(instance, run_ids) -> dict:
    storage = instance.event_log_storage
    materializations = {}
    for key in PARTS.get_partition_keys():
        found = instance.fetch_materializations(dg.AssetRecordsFilter(asset_key=WHOLE.asset_key, asset_partitions=[key]),
                                                limit=5).records
        materializations[key] = [run_ids.index(r.run_id) for r in found]
    infos = sorted(((i.check_key.name, i.partition_key, i.latest_execution_status.value, i.is_current,
                     run_ids.index(i.latest_planned_run_id)) for i in storage.get_asset_check_partition_info([WHOLE, SECOND])))
    history = []
    for check in (WHOLE, SECOND):
        for key in PARTS.get_partition_keys():
            for record in storage.get_asset_check_execution_history(check, limit=10, partition_filter=None):
                if record.partition != key:
                    continue
                evaluation = record.event.dagster_event.event_specific_data if record.event and record.event.dagster_event else None
                history.append((check.name, key, run_ids.index(record.run_id), record.status.value,
                                getattr(evaluation, "passed", None),
                                dict(evaluation.metadata) if evaluation is not None and hasattr(evaluation, "metadata") else None))
    asset = instance.get_asset_records([WHOLE.asset_key])[0].asset_entry
    return {"materializations": materializations, "infos": infos, "history": sorted(history, key=repr),
            "last_run": run_ids.index(asset.last_run_id)}


def _statements(run):
    """``run()``'s result and the SQL statements it sent."""
    sent = []

    def count(*_args):
        sent.append(1)

    sa.event.listen(sa.engine.Engine, "before_cursor_execute", count)
    try:
        return run(), len(sent)
    finally:
        sa.event.remove(sa.engine.Engine, "before_cursor_execute", count)


def test_kts_event_log_leaves_what_dagsters_own_leaves_for_ranged_runs_with_partitioned_checks(pg_url, monkeypatch):
    with _dagsters_instance(pg_url) as theirs:
        their_runs, their_statements = _statements(lambda: _run_twice(theirs))
        expected = [_events(theirs, r) for r in their_runs], _check_state(theirs, their_runs)
    with _kts_instance(pg_url, monkeypatch) as ours:
        our_runs, our_statements = _statements(lambda: _run_twice(ours))
        got = [_events(ours, r) for r in our_runs], _check_state(ours, our_runs)
    assert got == expected
    # Each run plans 2 assets × 4 partitions and evaluates 2 checks × 4 partitions: at least a
    # statement fewer per planned materialisation, two fewer per evaluation.
    planned, evaluations = 2 * 4, 2 * 4
    assert their_statements - our_statements >= 2 * (planned + 2 * evaluations), (our_statements, their_statements)
    state = got[1]
    # What the UI shows from it: p2's "whole" failed, the rest passed, each about its latest materialisation.
    assert ("whole", FAILING, AssetCheckExecutionRecordStatus.FAILED.value, True, 1) in state["infos"]
    assert ("second", "p0", AssetCheckExecutionRecordStatus.SUCCEEDED.value, True, 0) in state["infos"]
    assert len(state["infos"]) == 10 and all(current for _, _, _, current, _ in state["infos"])
    assert state["last_run"] == 1


def _evaluation_event(run_id: str, partition: str | None, passed: bool) -> dg.EventLogEntry:
    evaluation = dg.AssetCheckEvaluation(asset_key=WHOLE.asset_key, check_name=WHOLE.name, passed=passed,
                                         partition=partition, metadata={"n": 1})
    event = DagsterEvent(event_type_value=dg.DagsterEventType.ASSET_CHECK_EVALUATION.value, job_name="a_job",
                         event_specific_data=evaluation)
    return dg.EventLogEntry(error_info=None, level=20, user_message="", run_id=run_id, timestamp=time.time(),
                            dagster_event=event)


@pytest.mark.parametrize("partition", ["p1", None])
def test_an_evaluation_without_a_planned_execution_row_gets_one_as_in_dagsters_own_log(pg_url, monkeypatch, partition):
    """A step launched without planned events (Dagster's step launchers) evaluates a check for which
    no execution row exists: both logs insert one."""
    rows = {}
    for name, make in (("theirs", lambda: _dagsters_instance(pg_url)), ("ours", lambda: _kts_instance(pg_url, monkeypatch))):
        with make() as instance:
            storage = instance.event_log_storage
            storage.store_event(_evaluation_event(f"run-{name}-{partition}", partition, passed=False))
            record = storage.get_asset_check_execution_history(WHOLE, limit=5)[0]
            rows[name] = (record.partition, record.status.value, record.event.dagster_event.event_specific_data.passed)
            stored = [e for e in instance.all_logs(f"run-{name}-{partition}")]
            assert len(stored) == 1 and stored[0].dagster_event.event_specific_data.partition == partition
    assert rows["ours"] == rows["theirs"]
    assert rows["ours"] == (partition, AssetCheckExecutionRecordStatus.FAILED.value, False)
