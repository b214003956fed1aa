"""Scrub on both tiers: orphans (a segment id the store does not know) are deleted once past the grace
period and young ones left alone; an interrupted delete is finished; a missing object is reported,
recorded and re-copied by the next copy pass; a flipped byte is found only by a deep scrub, naming
the object; a listing that fails half-way deletes nothing; a stale multipart upload is aborted; no
referenced object is ever touched."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest

from kts_resources.copier import copy_log_dir, copy_partition
from kts_resources.kafka.logdir import LogDir
from kts_resources.kafka.simulate import SimulationConfig, simulate
from kts_resources.remote_log import RemoteLogSegmentId, RemoteLogSegmentState, TopicIdPartition
from kts_resources.remote_storage.base import RemoteStorageError, stored_objects
from kts_resources.scrub import scrub

S = RemoteLogSegmentState
LATER = 2 * 24 * 3600  # seconds: everything planted is past the default grace period by then


@pytest.fixture
def copied(tmp_path, metadata_store, remote_storage):
    root = tmp_path / "logs"
    simulate(root, SimulationConfig(seed=12, topics=("orders",), partitions=1, total_bytes=120 * 1024, segment_bytes=24 * 1024))
    [result] = copy_log_dir(LogDir(root), metadata_store, remote_storage)
    assert result.stopped is None and len(result.copied) >= 3
    partition = LogDir(root).partitions()[0]
    return root, TopicIdPartition(partition.metadata().topic_id, partition.topic_partition), result.copied


def _keys(storage) -> set[str]:
    return {o.key for o in storage.list_objects()}


def test_orphans_go_after_the_grace_period_and_nothing_referenced_is_touched(copied, metadata_store, remote_storage):
    _root, tip, _segments = copied
    referenced = _keys(remote_storage)
    orphan_id = RemoteLogSegmentId(tip, uuid.uuid4())  # a copy whose STARTED row was lost
    orphans = {remote_storage.keys.segment_key(orphan_id, 0, suffix) for suffix in ("log", "index")}
    for key in orphans:
        remote_storage.put_object(key, b"left behind")

    young = scrub(metadata_store, remote_storage)
    assert young.orphans_deleted == [] and young.young_left == 2 and young.clean
    assert _keys(remote_storage) == referenced | orphans

    dry = scrub(metadata_store, remote_storage, now=time.time() + LATER, dry_run=True)
    assert set(dry.orphans_deleted) == orphans and _keys(remote_storage) == referenced | orphans

    done = scrub(metadata_store, remote_storage, now=time.time() + LATER)
    assert set(done.orphans_deleted) == orphans and done.clean
    assert _keys(remote_storage) == referenced  # exactly the orphans went


def test_an_interrupted_delete_is_finished(copied, metadata_store, remote_storage):
    _root, tip, segments = copied
    victim = segments[0]
    metadata_store.update_remote_log_segment_metadata(victim.segment_id, S.DELETE_SEGMENT_STARTED, 1)
    report = scrub(metadata_store, remote_storage)
    assert report.deletes_finished == 1
    assert metadata_store.segment(victim.segment_id).state is S.DELETE_SEGMENT_FINISHED
    assert not set(remote_storage.segment_object_keys(victim).values()) & _keys(remote_storage)


def test_a_missing_object_is_reported_recorded_and_recopied_by_the_next_copy_pass(copied, metadata_store, remote_storage):
    root, tip, segments = copied
    victim = segments[1]
    remote_storage.delete_objects([stored_objects(victim.custom_metadata)["timeindex"].key])
    report = scrub(metadata_store, remote_storage)
    assert not report.clean and len(report.damaged) == 1 and "missing" in report.damaged[0]
    assert [md.segment_id for md, _ in metadata_store.damaged_segments(tip)] == [victim.segment_id]
    result = copy_partition(LogDir(root).partitions()[0], LogDir(root), metadata_store, remote_storage)
    assert len(result.recopied) == 1
    assert scrub(metadata_store, remote_storage).clean


def test_only_a_deep_scrub_finds_a_flipped_byte_and_names_the_object(copied, metadata_store, remote_storage):
    _root, _tip, segments = copied
    log = stored_objects(segments[2].custom_metadata)["log"]
    data = bytearray(remote_storage.fetch_object(log.key))
    data[len(data) // 3] ^= 0x04
    remote_storage.put_object(log.key, bytes(data))
    assert scrub(metadata_store, remote_storage).clean  # same size: the listing cannot tell
    deep = scrub(metadata_store, remote_storage, deep=True)
    assert len(deep.damaged) == 1 and remote_storage.location(log.key) in deep.damaged[0] and "CRC-32C" in deep.damaged[0]


class _ListingThatBreaks:
    """The tier, except that its listing fails after two objects."""

    def __init__(self, inner):
        self.inner, self.deleted = inner, []

    def list_objects(self, prefix: str = ""):
        for i, obj in enumerate(self.inner.list_objects(prefix)):
            if i == 2:
                raise RemoteStorageError("listing broke off half-way")
            yield obj

    def delete_objects(self, keys):
        self.deleted += list(keys)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def test_a_listing_that_fails_half_way_deletes_nothing(copied, metadata_store, remote_storage):
    _root, tip, _segments = copied
    remote_storage.put_object(remote_storage.keys.segment_key(RemoteLogSegmentId(tip, uuid.uuid4()), 0, "log"), b"x")
    broken = _ListingThatBreaks(remote_storage)
    with pytest.raises(RemoteStorageError, match="half-way"):
        scrub(metadata_store, broken, now=time.time() + LATER)
    assert broken.deleted == []


def test_a_stale_multipart_upload_is_aborted(copied, metadata_store, remote_storage):
    if not hasattr(remote_storage, "bucket"):
        pytest.skip("multipart uploads are S3's")
    client = remote_storage.client
    key = remote_storage.keys.root + "stale-upload"
    client.create_multipart_upload(Bucket=remote_storage.bucket, Key=key)
    report = scrub(metadata_store, remote_storage, grace_s=0)
    assert report.uploads_aborted == 1
    assert client.list_multipart_uploads(Bucket=remote_storage.bucket).get("Uploads", []) == []


def test_the_cli_reports_and_exits_1_on_damage(copied, tmp_path, pg_url, remote_storage):
    import os
    import subprocess
    import sys

    if hasattr(remote_storage, "bucket"):
        pytest.skip("the CLI path is the same for both tiers")
    _root, _tip, segments = copied
    remote_storage.delete_objects([stored_objects(segments[0].custom_metadata)["log"].key])
    env = {**os.environ, "KTS_DATABASE_URL": pg_url, "KTS_HOME": str(tmp_path / "home"),
           "KTS_REMOTE_URI": remote_storage.location("")}
    run = subprocess.run([sys.executable, "-m", "kts_assets.cli", "scrub"], env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 1, run.stderr
    assert run.stdout.startswith("scrubbed ") and "1 damaged segment" in run.stdout
    assert "missing" in run.stderr and "re-copied by the next copy pass" in run.stderr


def test_the_weekly_scrub_job_records_the_scrub_as_a_check_that_fails_on_damage(copied, tmp_path, pg_url, remote_storage):
    import dagster as dg

    from kts_assets.assets import local_and_remote_segments, remote_segments
    from kts_assets.definitions import default_resources, defs
    from kts_assets.scrub_job import remote_tier_scrubbed, scrub_job
    from kts_resources.resources import MetadataStoreResource, RemoteTierResource

    if hasattr(remote_storage, "bucket"):
        pytest.skip("the job's path is the same for both tiers")
    assert {s.name for s in defs.get_repository_def().schedule_defs} >= {"scrub_schedule"}
    resources = {"metadata_store": MetadataStoreResource(database_url=pg_url),
                 "remote_tier": RemoteTierResource(remote_uri=remote_storage.location(""))}
    job = dg.Definitions(assets=[local_and_remote_segments], asset_checks=[remote_tier_scrubbed], jobs=[scrub_job],
                         resources={**default_resources(), **resources}).resolve_job_def("scrub_job")
    with dg.instance_for_test() as instance:
        healthy = job.execute_in_process(instance=instance)
        assert healthy.success
        [evaluation] = healthy.get_asset_check_evaluations()
        assert evaluation.passed and evaluation.check_name == "remote_tier_scrubbed"
        assert evaluation.metadata["damaged_segments"].value == 0 and evaluation.metadata["objects_listed"].value > 0
        _root, _tip, segments = copied
        remote_storage.delete_objects([stored_objects(segments[0].custom_metadata)["log"].key])
        damaged = job.execute_in_process(instance=instance)
        [evaluation] = damaged.get_asset_check_evaluations()
        assert not evaluation.passed and evaluation.severity == dg.AssetCheckSeverity.ERROR
        assert "missing" in evaluation.description and evaluation.metadata["damaged_segments"].value == 1
        # The check's latest result is what the UI shows on remote_segments: failed.
        record = instance.event_log_storage.get_latest_asset_check_execution_by_key(
            [dg.AssetCheckKey(remote_segments.key, "remote_tier_scrubbed")])[dg.AssetCheckKey(remote_segments.key, "remote_tier_scrubbed")]
        assert record.event.dagster_event.event_specific_data.passed is False


def test_a_scrub_sigkilled_half_way_is_converged_by_a_rerun(tmp_path, pg_url, metadata_store):
    import os
    import subprocess
    import sys

    from kts_resources.remote_storage.factory import remote_storage_from_uri

    uri = (tmp_path / "tier").as_uri()  # the tier as the driver names it: by KTS_REMOTE_URI
    storage = remote_storage_from_uri(uri)
    root = tmp_path / "logs"
    simulate(root, SimulationConfig(seed=13, topics=("orders",), partitions=1, total_bytes=96 * 1024, segment_bytes=24 * 1024))
    [result] = copy_log_dir(LogDir(root), metadata_store, storage)
    tip = result.copied[0].topic_id_partition
    referenced = _keys(storage)
    for _ in range(3):
        storage.put_object(storage.keys.segment_key(RemoteLogSegmentId(tip, uuid.uuid4()), 0, "log"), b"x")
    env = {**os.environ, "KTS_DATABASE_URL": pg_url, "KTS_REMOTE_URI": uri}
    killed = subprocess.run([sys.executable, "-m", "tests.tier_tools_driver", "scrub", "1"], env=env, capture_output=True,
                            text=True, timeout=120, cwd=Path(__file__).resolve().parent.parent)
    assert killed.returncode == -9, killed.stderr
    assert referenced < _keys(storage) and len(_keys(storage) - referenced) == 2  # one orphan went; nothing referenced
    again = scrub(metadata_store, storage, grace_s=0)
    assert len(again.orphans_deleted) == 2 and _keys(storage) == referenced and again.clean
