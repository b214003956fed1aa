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

from kts_resources.reading import remote_index_cache as index_cache
from kts_resources.reading import remote_index_tier as index_tier
from kts_resources.tiering.copier import copy_partition, delete_remote_log_segment
from kts_resources.kafka.logdir import LogDir
from kts_resources.kafka.simulator.simulate import SimulationConfig, simulate
from kts_resources.remote_log import RemoteLogSegmentId, RemoteLogSegmentState, TopicIdPartition
from kts_resources.tiering.quotas import SystemClock
from kts_resources.remote_storage.base import RemoteStorageError, recorded_manifest, stored_objects
from kts_resources.remote_storage.manifest import INDEX_FILE_KINDS
from kts_resources.maintenance.scrub import scrub
from .partition_steps import copy_each_partition

S = RemoteLogSegmentState
LATER = 2 * 24 * 3600  # seconds: everything planted is past the default grace period by then


@pytest.fixture
def copied(tmp_path, metadata_store, remote_storage):
    root = tmp_path / "logs"
    simulate(root, SimulationConfig(seed=12, topics=("orders",), partitions=1, total_bytes=120 * 1024, segment_bytes=24 * 1024))
    [result] = copy_each_partition(LogDir(root), metadata_store, remote_storage)
    assert result.stopped is None and len(result.copied) >= 3
    partition = LogDir(root).partitions()[0]
    return root, TopicIdPartition(partition.metadata().topic_id, partition.topic_partition), result.copied


def _keys(storage) -> set[str]:
    return {o.key for o in storage.list_objects()}


def _leftover_of(storage, md, segment_id=None, suffixes=None) -> dict[str, bytes]:
    """A crashed copy of ``md``'s segment (re-copied later as ``md``): its objects under another
    segment id, without a manifest. key → bytes, planted in the tier."""
    segment_id = segment_id or RemoteLogSegmentId(md.topic_id_partition, uuid.uuid4())
    planted = {}
    for suffix, obj in stored_objects(md.custom_metadata).items():
        if suffixes is None or suffix in suffixes:
            key = storage.keys.segment_key(segment_id, md.start_offset, suffix)
            planted[key] = storage.fetch_object(obj.key)
            storage.put_object(key, planted[key])
    return planted


def _forget(store, md) -> None:
    """The store loses the segment's row (a database restored from an older backup)."""
    with store.engine.begin() as conn:
        for table in ("remote_segment_leader_epochs", "remote_segments"):
            conn.exec_driver_sql(f"DELETE FROM {table} WHERE segment_id = %(sid)s", {"sid": md.segment_id.id})


def test_orphans_go_after_the_grace_period_and_nothing_referenced_is_touched(copied, metadata_store, remote_storage):
    _root, tip, segments = copied
    referenced = _keys(remote_storage)
    orphans = set(_leftover_of(remote_storage, segments[0], suffixes=("log", "index")))  # a copy whose STARTED row was lost

    young = scrub(metadata_store, remote_storage)
    assert young.orphans_deleted == [] and young.young_left == 2 and young.clean
    assert _keys(remote_storage) == referenced | orphans

    dry = scrub(metadata_store, remote_storage, now=time.time() + LATER, dry_run=True)
    assert set(dry.orphans_deleted) == orphans and _keys(remote_storage) == referenced | orphans

    done = scrub(metadata_store, remote_storage, now=time.time() + LATER)
    assert set(done.orphans_deleted) == orphans and done.clean
    assert _keys(remote_storage) == referenced  # exactly the orphans went


def test_objects_of_an_unknown_segment_without_its_log_hold_no_records_and_go(copied, metadata_store, remote_storage):
    _root, tip, segments = copied
    referenced = _keys(remote_storage)
    orphans = set(_leftover_of(remote_storage, segments[1], suffixes=("index", "timeindex")))
    done = scrub(metadata_store, remote_storage, now=time.time() + LATER)
    assert set(done.orphans_deleted) == orphans and done.clean and _keys(remote_storage) == referenced


def test_a_segment_the_store_does_not_know_is_kept_while_nothing_else_holds_its_offsets(copied, metadata_store, remote_storage):
    """A lost manifest and a store without the segment (issue 34, finding 2): its objects are the
    only copy of its offsets, an open lost range meanwhile; the scrub says so and deletes nothing."""
    _root, tip, segments = copied
    victim = segments[1]
    remote_storage.delete_objects([recorded_manifest(victim.custom_metadata).key])
    _forget(metadata_store, victim)
    assert metadata_store.record_lost_range(tip, victim.start_offset, victim.end_offset, "copy pass")
    before = _keys(remote_storage)
    log = stored_objects(victim.custom_metadata)["log"]

    report = scrub(metadata_store, remote_storage, now=time.time() + LATER)
    assert report.orphans_deleted == [] and not report.clean and _keys(remote_storage) == before
    [line] = report.unrecorded
    assert remote_storage.location(log.key) in line and f"{victim.start_offset}..{victim.end_offset}" in line
    assert "not in the store; run kts recover" in line
    assert line in report.problems


def test_a_segment_the_store_does_not_know_in_a_partition_it_does_not_know_is_kept(copied, metadata_store, remote_storage):
    _root, tip, segments = copied
    elsewhere = RemoteLogSegmentId(TopicIdPartition(uuid.uuid4(), tip.topic_partition), uuid.uuid4())
    planted = _leftover_of(remote_storage, segments[0], segment_id=elsewhere)
    report = scrub(metadata_store, remote_storage, now=time.time() + LATER)
    assert report.orphans_deleted == [] and len(report.unrecorded) == 1 and set(planted) <= _keys(remote_storage)


def test_a_leftover_whose_log_fails_its_scan_is_reported_with_its_byte_and_kept(copied, metadata_store, remote_storage):
    from kts_resources.kafka.records import scan_batches

    _root, tip, segments = copied
    planted = _leftover_of(remote_storage, segments[0], suffixes=("log",))
    [(key, data)] = planted.items()
    damaged = bytearray(data)
    second = scan_batches(data).batches[1].position
    damaged[second + 70] ^= 0x01
    remote_storage.put_object(key, bytes(damaged))
    report = scrub(metadata_store, remote_storage, now=time.time() + LATER)
    assert report.orphans_deleted == [] and key in _keys(remote_storage)
    [line] = report.unrecorded
    assert remote_storage.location(key) in line and f"byte {second}" in line and "CRC" in line


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


def _index(store, storage, home: Path, tip):
    """What the remote_log_index step does for the partition (its Spark reads aside)."""
    return index_tier.update_partition_index(store, storage, index_cache.cache_directory(home, tip), tip,
                                             lambda md: index_cache.read_segment_entries(storage, md))


def _index_keys(storage, tip) -> set[str]:
    return {o.key for o in storage.list_objects(storage.keys.remote_index_prefix(tip))}


def _named_keys(storage, tip) -> set[str]:
    """The pointer and every file it names."""
    pointer = index_tier.read_pointer(storage, tip)
    return {storage.keys.remote_index_pointer_key(tip)} | {
        storage.keys.remote_index_key(tip, f"{ref.base_offset:020d}.{kind}", ref.version)
        for ref in pointer.file_sets for kind in INDEX_FILE_KINDS}


def test_index_file_sets_nothing_names_go_after_the_grace_period_and_named_ones_never(copied, metadata_store, remote_storage,
                                                                                     tmp_path):
    _root, tip, segments = copied
    home = tmp_path / "home"
    _index(metadata_store, remote_storage, home, tip)
    first = _index_keys(remote_storage, tip)
    # Retention takes the oldest segment: the next build rewrites the file set that held it, under a new version.
    delete_remote_log_segment(metadata_store, remote_storage, segments[0], SystemClock())
    assert _index(metadata_store, remote_storage, home, tip).published is not None
    superseded = first - _named_keys(remote_storage, tip)
    # ... and a build beside another broker crashed before naming what it uploaded.
    crashed = {remote_storage.keys.remote_index_key(tip, f"{segments[1].start_offset:020d}.{kind}", "000000000007-0badcafe")
               for kind in INDEX_FILE_KINDS}
    for key in crashed:
        remote_storage.put_object(key, b"never named")
    named = _named_keys(remote_storage, tip)
    assert superseded and _index_keys(remote_storage, tip) == named | superseded | crashed

    young = scrub(metadata_store, remote_storage)
    assert young.index_files_deleted == [] and young.index_files_young == len(superseded | crashed) and young.clean
    dry = scrub(metadata_store, remote_storage, now=time.time() + LATER, dry_run=True)
    assert set(dry.index_files_deleted) == superseded | crashed and _index_keys(remote_storage, tip) == named | superseded | crashed
    done = scrub(metadata_store, remote_storage, now=time.time() + LATER)
    assert set(done.index_files_deleted) == superseded | crashed and done.clean
    assert _index_keys(remote_storage, tip) == named  # the pointer and what it names, however old
    assert scrub(metadata_store, remote_storage, deep=True, now=time.time() + LATER).clean


def test_the_flat_layout_of_earlier_versions_stays_until_a_pointer_names_the_index(copied, metadata_store, remote_storage, tmp_path):
    _root, tip, _segments = copied
    home = tmp_path / "home"
    directory = index_cache.cache_directory(home, tip)
    built = index_cache.build_partition_index(directory, metadata_store.list_remote_log_segments(tip, states={S.COPY_SEGMENT_FINISHED}),
                                              lambda md: index_cache.read_segment_entries(remote_storage, md))
    flat = {remote_storage.keys.remote_index_key(tip, name) for name in built.written}
    for name in built.written:  # as earlier kts versions shipped them
        remote_storage.put_object(remote_storage.keys.remote_index_key(tip, name), directory / name)
    kept = scrub(metadata_store, remote_storage, now=time.time() + LATER)
    assert kept.index_files_deleted == [] and _index_keys(remote_storage, tip) == flat  # still the partition's index

    _index(metadata_store, remote_storage, home, tip)
    done = scrub(metadata_store, remote_storage, now=time.time() + LATER)
    assert set(done.index_files_deleted) == flat and _index_keys(remote_storage, tip) == _named_keys(remote_storage, tip)


def test_a_damaged_index_pointer_is_reported_and_none_of_its_partitions_index_files_go(copied, metadata_store, remote_storage,
                                                                                    tmp_path):
    _root, tip, segments = copied
    home = tmp_path / "home"
    _index(metadata_store, remote_storage, home, tip)
    delete_remote_log_segment(metadata_store, remote_storage, segments[0], SystemClock())
    _index(metadata_store, remote_storage, home, tip)  # a superseded set the scrub could remove
    pointer_key = remote_storage.keys.remote_index_pointer_key(tip)
    data = bytearray(remote_storage.fetch_object(pointer_key))
    data[len(data) // 2] ^= 0x01
    remote_storage.put_object(pointer_key, bytes(data))
    before = _index_keys(remote_storage, tip)

    report = scrub(metadata_store, remote_storage, now=time.time() + LATER)
    assert not report.clean and report.index_files_deleted == [] and _index_keys(remote_storage, tip) == before
    [line] = report.index_pointers
    assert remote_storage.location(pointer_key) in line and "damaged remote log index pointer" in line
    # The next build writes the pointer again; then the scrub is clean.
    assert _index(metadata_store, remote_storage, home, tip).published is not None
    assert scrub(metadata_store, remote_storage, now=time.time() + LATER).clean


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


def test_the_weekly_scrub_job_reports_the_tier_and_its_check_which_fails_on_damage(copied, tmp_path, pg_url, remote_storage):
    import dagster as dg

    from kts_assets.assets import remote_segments
    from kts_assets.definitions import default_resources, defs
    from kts_assets.scrub_job import REMOTE_TIER_SCRUBBED, remote_tier_asset, scrub_job
    from kts_resources.resources import KafkaLogDirsResource, MetadataStoreResource, RemoteTierResource

    if hasattr(remote_storage, "bucket"):
        pytest.skip("the job's path is the same for both tiers")
    assert {s.name for s in defs.get_repository_def().schedule_defs} >= {"scrub_schedule"}
    root, _tip, segments = copied
    resources = {"metadata_store": MetadataStoreResource(database_url=pg_url),
                 "remote_tier": RemoteTierResource(remote_uri=remote_storage.location("")),
                 "kafka_log_dirs": KafkaLogDirsResource(log_dirs=str(root))}
    job = dg.Definitions(assets=[remote_tier_asset], jobs=[scrub_job],
                         resources={**default_resources(), **resources}).resolve_job_def("scrub_job")
    with dg.instance_for_test() as instance:
        healthy = job.execute_in_process(instance=instance)
        assert healthy.success
        [evaluation] = healthy.get_asset_check_evaluations()
        assert evaluation.passed and evaluation.check_name == "remote_tier_scrubbed"
        assert evaluation.asset_key == REMOTE_TIER_SCRUBBED.asset_key  # the tier's own check, not a partition's
        assert evaluation.metadata["damaged_segments"].value == 0 and evaluation.metadata["objects_listed"].value > 0
        [tier] = healthy.asset_materializations_for_node("remote_tier")
        assert tier.metadata["segments_checked"].value == len(copied[2])
        remote_storage.delete_objects([stored_objects(segments[0].custom_metadata)["log"].key])
        damaged = job.execute_in_process(instance=instance)
        [evaluation] = damaged.get_asset_check_evaluations()
        assert not evaluation.passed and evaluation.severity == dg.AssetCheckSeverity.ERROR
        assert "missing" in evaluation.description and evaluation.metadata["damaged_segments"].value == 1
        # The check's latest result is what the UI shows on remote_tier: failed, evaluated by this run.
        record = instance.event_log_storage.get_latest_asset_check_execution_by_key([REMOTE_TIER_SCRUBBED])[REMOTE_TIER_SCRUBBED]
        assert record.event.dagster_event.event_specific_data.passed is False and record.run_id == damaged.run_id
        # The partition whose damage it recorded is reported again, as `kts status` counts it.
        [observed] = instance.fetch_observations(dg.AssetRecordsFilter(asset_key=remote_segments.key,
                                                                       asset_partitions=["orders-0"]), limit=1).records
        assert observed.run_id == damaged.run_id
        assert observed.asset_observation.metadata["damaged_remote_segments"].value == 1


def test_a_scrub_sigkilled_half_way_is_converged_by_a_rerun(tmp_path, pg_url, metadata_store):
    import os
    import subprocess
    import sys

    from kts_resources.remote_storage.factory import remote_storage_from_uri

    uri = (tmp_path / "tier").as_uri()  # the tier as the driver names it: by KTS_REMOTE_URI
    storage = remote_storage_from_uri(uri)
    root = tmp_path / "logs"
    simulate(root, SimulationConfig(seed=13, topics=("orders",), partitions=1, total_bytes=96 * 1024, segment_bytes=24 * 1024))
    [result] = copy_each_partition(LogDir(root), metadata_store, storage)
    tip = result.copied[0].topic_id_partition
    referenced = _keys(storage)
    for _ in range(3):
        _leftover_of(storage, result.copied[0], suffixes=("log",))
    env = {**os.environ, "KTS_DATABASE_URL": pg_url, "KTS_REMOTE_URI": uri}
    killed = subprocess.run([sys.executable, "-m", "tests.tier_tools_driver", "scrub", "1"], env=env, capture_output=True,
                            text=True, timeout=120, cwd=Path(__file__).resolve().parent.parent)
    assert killed.returncode == -9, killed.stderr
    assert referenced < _keys(storage) and len(_keys(storage) - referenced) == 2  # one orphan went; nothing referenced
    again = scrub(metadata_store, storage, grace_s=0)
    assert len(again.orphans_deleted) == 2 and _keys(storage) == referenced and again.clean


# --- manifests ------------------------------------------------------------------------------------


def _edit_manifest(storage, md, **changes) -> str:
    """The segment's manifest rewritten with other values, still well-formed (its own CRC right)."""
    from dataclasses import replace

    from kts_resources.remote_storage.manifest import decode_manifest, encode_manifest

    key = recorded_manifest(md.custom_metadata).key
    manifest = decode_manifest(storage.fetch_object(key), where=key)
    storage.put_object(key, encode_manifest(replace(manifest, metadata=replace(manifest.metadata, **changes))))
    return key


def test_a_deep_scrub_finds_an_edited_manifest_says_what_differs_and_writes_it_again(copied, metadata_store, remote_storage):
    from kts_resources.remote_storage.manifest import decode_manifest

    _root, tip, segments = copied
    edited = _edit_manifest(remote_storage, segments[1], end_offset=segments[1].end_offset + 7)
    garbled = recorded_manifest(segments[2].custom_metadata).key
    remote_storage.put_object(garbled, b'{"format": "kts-remote-segment-manifest", "version": 1')

    report = scrub(metadata_store, remote_storage, deep=True)
    assert not report.clean and report.damaged == []
    assert len(report.manifests) == 2
    line = next(line for line in report.manifests if remote_storage.location(edited) in line)
    assert f"end_offset {segments[1].end_offset + 7}" in line and f"store {segments[1].end_offset}" in line
    assert "written again from the store" in line
    line = next(line for line in report.manifests if remote_storage.location(garbled) in line)
    assert "damaged manifest" in line and "written again from the store" in line
    for md in segments[1:3]:
        key = recorded_manifest(md.custom_metadata).key
        manifest = decode_manifest(remote_storage.fetch_object(key), where=key)
        assert (manifest.metadata.segment_id, manifest.metadata.end_offset) == (md.segment_id, md.end_offset)
        assert recorded_manifest(metadata_store.segment(md.segment_id).custom_metadata).key == key
    assert scrub(metadata_store, remote_storage, deep=True).clean


def test_an_edited_manifest_beside_a_damaged_segment_is_not_written_again(copied, metadata_store, remote_storage):
    _root, tip, segments = copied
    victim = segments[1]
    key = _edit_manifest(remote_storage, victim, segment_leader_epochs={7: victim.start_offset})
    edited = remote_storage.fetch_object(key)
    log = stored_objects(victim.custom_metadata)["log"]
    data = bytearray(remote_storage.fetch_object(log.key))
    data[len(data) // 2] ^= 0x04
    remote_storage.put_object(log.key, bytes(data))
    report = scrub(metadata_store, remote_storage, deep=True)
    assert len(report.damaged) == 1 and "CRC-32C" in report.damaged[0]
    assert remote_storage.fetch_object(key) == edited  # the store's row is not vouched for by its object: no rewrite


def test_a_dry_run_reports_an_edited_manifest_and_leaves_it(copied, metadata_store, remote_storage):
    _root, tip, segments = copied
    key = _edit_manifest(remote_storage, segments[0], segment_size_in_bytes=segments[0].segment_size_in_bytes,
                         max_timestamp_ms=segments[0].max_timestamp_ms + 1)
    edited = remote_storage.fetch_object(key)
    report = scrub(metadata_store, remote_storage, deep=True, dry_run=True)
    [line] = report.manifests
    assert "max_timestamp_ms" in line and remote_storage.fetch_object(key) == edited


def test_the_cli_deep_scrub_exits_1_naming_an_edited_manifest(copied, tmp_path, pg_url, remote_storage):
    import os
    import subprocess
    import sys

    if hasattr(remote_storage, "bucket"):
        pytest.skip("the CLI path is the same for both tiers")
    _root, _tip, segments = copied
    key = _edit_manifest(remote_storage, segments[0], start_offset=segments[0].start_offset, end_offset=segments[0].end_offset - 1)
    env = {**os.environ, "KTS_DATABASE_URL": pg_url, "KTS_HOME": str(tmp_path / "home"),
           "KTS_REMOTE_URI": remote_storage.location("")}
    run = subprocess.run([sys.executable, "-m", "kts_assets.cli", "scrub", "--deep"], env=env, capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 1, run.stderr
    assert "Traceback" not in run.stderr
    [line] = [line for line in run.stderr.splitlines() if remote_storage.location(key) in line]
    assert "end_offset" in line
