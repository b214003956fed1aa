"""copy_job as the daemon runs it (``dg.execute_job`` on a reconstructable job, the job's own
executor, kts's own Definitions and environment): every step runs in one process and the whole run
— inventory, copy and checks, the CRC check included — creates exactly one Spark session."""

from __future__ import annotations

import dagster as dg
import pytest

from kts_assets.partitions import topic_partitions
from kts_resources import resources as kts_resources_module
from kts_resources import settings

from .test_assets import KEYS, RANGE_END, RANGE_START, simulate_log_dir

pytestmark = pytest.mark.spark  # on the session's Spark Connect server (tests/fixtures_spark.py)


def kts_copy_job() -> dg.JobDefinition:
    """copy_job from kts's one Definitions, rebuilt by ``reconstructable`` as a run worker would."""
    from kts_assets.definitions import defs

    return defs.resolve_job_def("copy_job")


@pytest.fixture
def session_starts(monkeypatch) -> list[int]:
    """One entry per Spark session the pyspark resource sets up (with the pid that set it up)."""
    import os

    starts: list[int] = []
    original = kts_resources_module.KtsPySparkResource.build_session

    def counting(self):
        starts.append(os.getpid())
        return original(self)

    monkeypatch.setattr(kts_resources_module.KtsPySparkResource, "build_session", counting)
    return starts


def test_a_copy_job_run_executes_every_step_in_one_process_with_one_spark_session(tmp_path, pg_url, monkeypatch, session_starts):
    import os

    log_dir = simulate_log_dir(tmp_path / "logs")
    monkeypatch.setenv(settings.HOME, str(tmp_path / "kts_home"))
    monkeypatch.setenv(settings.LOG_DIRS, str(log_dir))
    monkeypatch.setenv(settings.DATABASE_URL, pg_url)
    monkeypatch.setenv(settings.REMOTE_URI, (tmp_path / "remote").as_uri())
    job = kts_copy_job()
    assert job.executor_def is dg.in_process_executor

    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions(topic_partitions.name, KEYS)
        # Not entered as a context manager: entering initialises the resources once more, to load
        # outputs, which a daemon's run worker never does.
        result = dg.execute_job(dg.reconstructable(kts_copy_job), instance=instance,
                                tags={RANGE_START: KEYS[0], RANGE_END: KEYS[-1]})
        assert result.success
        steps = {e.step_key for e in result.all_events if e.event_type_value == "STEP_START"}
        pids = {e.pid for e in result.all_events if e.event_type_value == "STEP_START"}
        crc = [e for e in result.get_asset_check_evaluations()
               if e.check_name == "local_segments_crc_clean" and e.partition is not None]
    assert {"local_and_remote_segments", "retention_state", "remote_log_index"} <= steps
    # The copy step's checks ran in this run, in that step …
    assert {e.partition for e in crc} == set(KEYS) and all(e.passed for e in crc)
    assert pids == {os.getpid()}  # … every step in this one process, none in a child
    assert session_starts == [os.getpid()]  # … and one Spark session served every Spark step



def test_materialize_on_remote_segments_copies_the_partition_in_one_step_without_the_scrub(
        tmp_path, pg_url, monkeypatch, session_starts):
    """What Materialize on remote_segments' page runs: Dagster's implicit asset job over the asset and
    every check of it the job holds (the default of an asset selection), for one partition. (That the
    job runs in one process is its executor's, tests/test_run_hygiene.py.)"""
    from kts_assets.assets import remote_segments
    from kts_assets.checks import COPY_COMPLETED, NO_UNCOPIED_SEGMENT_LOST, OFFSET_INVARIANTS, REMOTE_SEGMENTS_IN_BUCKET
    from kts_assets.definitions import defs

    log_dir = simulate_log_dir(tmp_path / "logs")
    monkeypatch.setenv(settings.HOME, str(tmp_path / "kts_home"))
    monkeypatch.setenv(settings.LOG_DIRS, str(log_dir))
    monkeypatch.setenv(settings.DATABASE_URL, pg_url)
    monkeypatch.setenv(settings.REMOTE_URI, (tmp_path / "remote").as_uri())
    job = defs.resolve_implicit_global_asset_job_def().get_subset(asset_selection={remote_segments.key})

    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions(topic_partitions.name, KEYS)
        result = job.execute_in_process(instance=instance, partition_key=KEYS[0])
        assert result.success
        steps = [e.step_key for e in result.all_events if e.event_type_value == "STEP_START"]
        evaluated = {(e.asset_key, e.check_name) for e in result.get_asset_check_evaluations()}
        [copied] = result.asset_materializations_for_node("local_and_remote_segments")
    assert steps == ["local_and_remote_segments"]
    assert copied.asset_key == remote_segments.key and copied.partition == KEYS[0]
    assert copied.metadata["copied_segments"].value > 0
    # The partition's own checks, not the tier-wide scrub (remote_tier's, run by scrub_job).
    assert evaluated == {(k.asset_key, k.name) for k in (OFFSET_INVARIANTS, REMOTE_SEGMENTS_IN_BUCKET,
                                                         NO_UNCOPIED_SEGMENT_LOST, COPY_COMPLETED)}
    assert session_starts == []  # a copy alone starts no Spark session
