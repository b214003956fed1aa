"""``remote_log_index`` through Dagster: after a copy (which hands over each segment's entries from
its verification pass; Spark reads the batch headers of any segment without them, and of every
segment on a rebuild), the partition's index files land under KTS_HOME and in the remote tier, the check
finds every finished segment covered exactly once; later runs read only new segments, deleted
segments roll out, and a damaged file fails the check."""

from __future__ import annotations

import dagster as dg
import pytest

from kts_assets.assets import local_and_remote_segments, local_segments, remote_log_index, remote_segments
from kts_assets.checks import REMOTE_INDEX_COVERS
from kts_resources.reading import remote_index as ri
from kts_resources.reading import remote_index_cache as index_cache
from kts_resources.reading import remote_index_tier as index_tier
from kts_resources.tiering.copier import delete_remote_log_segment
from kts_resources.metadata.store import RemoteLogMetadataStore
from kts_resources.tiering.quotas import SystemClock
from kts_resources.remote_log import RemoteLogSegmentState
from kts_resources.remote_storage.factory import remote_storage_from_uri
from kts_resources.remote_storage.manifest import INDEX_FILE_KINDS

from .test_assets import instance, kts_home, log_dir, partition_metadata, pipeline_resources, simulate_log_dir  # noqa: F401

pytestmark = pytest.mark.spark
KEY = "orders-0"
FINISHED = RemoteLogSegmentState.COPY_SEGMENT_FINISHED


def _run(instance, resources, *assets):
    return dg.materialize([local_and_remote_segments, remote_log_index, *assets], partition_key=KEY,
                          instance=instance, resources=resources, raise_on_error=False)


def _check_results(result) -> list:
    return [e for e in result.get_asset_check_evaluations() if e.check_name == "remote_log_index_covers_finished_segments"]


def test_the_index_covers_every_finished_segment_locally_and_in_the_tier(log_dir, pg_url, tmp_path, kts_home, instance):  # noqa: F811
    resources = pipeline_resources(log_dir, pg_url, tmp_path / "remote")
    result = _run(instance, resources)  # the index's check comes with it
    assert result.success
    md = partition_metadata(result, "remote_log_index")[KEY]
    store = RemoteLogMetadataStore.from_url(pg_url)
    tip = next(t for t in store.partitions() if t.topic_partition.dir_name == KEY)
    finished = store.list_remote_log_segments(tip, states={FINISHED})
    # The copy handed over every segment's entries from its own verification pass: none is read again.
    assert md["indexed_segments"] == len(finished) > 2 and md["new_segments"] == 0
    assert md["indexed_bytes"] == sum(m.segment_size_in_bytes for m in finished)
    directory = index_cache.cache_directory(kts_home, tip)
    assert directory.is_relative_to(kts_home) and ri.file_set_offsets(directory)
    storage = remote_storage_from_uri((tmp_path / "remote").as_uri())
    # Shipped as versioned file sets, byte for byte the cache's, named by the pointer written last.
    pointer = index_tier.read_pointer(storage, tip)
    assert md["index_generation"] == pointer.generation == 1 and md["index_files_uploaded"] == 3 * len(pointer.file_sets)
    shipped = {f"{ref.base_offset:020d}.{kind}": storage.fetch_object(storage.keys.remote_index_key(
        tip, f"{ref.base_offset:020d}.{kind}", ref.version)) for ref in pointer.file_sets for kind in INDEX_FILE_KINDS}
    assert shipped == {p.name: p.read_bytes() for p in directory.iterdir() if ri.file_base_offset(p.name) is not None}
    [check] = _check_results(result)
    assert check.passed, check.description
    # ... and they are the entries Spark finds reading every segment afresh: the same files.
    files = {p.name: p.read_bytes() for p in directory.iterdir() if p.is_file()}
    rebuilt = dg.materialize([remote_log_index], partition_key=KEY, instance=instance, resources=resources,
                             run_config={"ops": {"remote_log_index": {"config": {"rebuild": True}}}})
    assert partition_metadata(rebuilt, "remote_log_index")[KEY]["new_segments"] == len(finished)
    assert {p.name: p.read_bytes() for p in directory.iterdir() if p.is_file()} == files

    # A second run after nothing new reads no segment and writes nothing; after a segment is deleted, it rolls out.
    again = _run(instance, resources)
    assert partition_metadata(again, "remote_log_index")[KEY]["new_segments"] == 0
    assert partition_metadata(again, "remote_log_index")[KEY]["index_files_uploaded"] == 0
    delete_remote_log_segment(store, storage, finished[0], SystemClock())
    rolled = dg.materialize([remote_log_index], partition_key=KEY,
                            instance=instance, resources=resources)
    md = partition_metadata(rolled, "remote_log_index")[KEY]
    assert md["indexed_segments"] == len(finished) - 1 and md["new_segments"] == 0
    loaded = [ri.load_file_set(directory, b) for b in ri.file_set_offsets(directory)]
    assert finished[0].segment_id.id not in {e.segment_id for e in ri.iter_entries(loaded)}
    assert _check_results(rolled)[0].passed
    store.close()


def test_a_damaged_index_file_fails_the_check_naming_file_and_position(log_dir, pg_url, tmp_path, kts_home, instance):  # noqa: F811
    resources = pipeline_resources(log_dir, pg_url, tmp_path / "remote")
    assert _run(instance, resources).success
    store = RemoteLogMetadataStore.from_url(pg_url)
    tip = next(t for t in store.partitions() if t.topic_partition.dir_name == KEY)
    store.close()
    directory = index_cache.cache_directory(kts_home, tip)
    log_index = directory / f"{ri.file_set_offsets(directory)[0]:020d}.remoteLogIndex"
    data = bytearray(log_index.read_bytes())
    data[20] ^= 0xFF
    log_index.write_bytes(bytes(data))
    result = dg.materialize([local_and_remote_segments, remote_log_index],
                            instance=instance, resources=resources, raise_on_error=False, tags={"dagster/partition": KEY},
                            selection=dg.AssetSelection.checks(REMOTE_INDEX_COVERS))
    [check] = _check_results(result)
    assert not check.passed
    assert str(log_index) in check.description and "byte 0: remoteLogIndex entry CRC" in check.description


def test_a_reader_beside_another_broker_fetches_what_this_kts_indexed_with_one_ranged_get(
        log_dir, pg_url, tmp_path, kts_home, instance):  # noqa: F811
    """The asset run is broker A's kts; a reader with another KTS_HOME and no log dir (broker B's
    kts, remote-only) takes the tier's current file sets and serves a fetch from the middle of a
    remote segment with one ranged GET."""
    from kts_resources.reading.reader import TieredLogReader

    resources = pipeline_resources(log_dir, pg_url, tmp_path / "remote")
    assert _run(instance, resources).success
    store = RemoteLogMetadataStore.from_url(pg_url)
    tip = next(t for t in store.partitions() if t.topic_partition.dir_name == KEY)
    finished = sorted(store.list_remote_log_segments(tip, states={FINISHED}), key=lambda m: m.start_offset)
    md = finished[len(finished) // 2]
    middle = (md.start_offset + md.end_offset) // 2
    (tmp_path / "b-logs").mkdir()
    storage = remote_storage_from_uri((tmp_path / "remote").as_uri())
    with TieredLogReader(log_dirs=[tmp_path / "b-logs"], store=store, rsm=storage, home=tmp_path / "b-home") as reader:
        result = reader.fetch("orders", 0, middle, 4096)
    with TieredLogReader(log_dirs=[log_dir], store=None, rsm=None) as local:
        expected = local.fetch("orders", 0, middle, 4096)
    assert result.remote_requests == 1
    assert [(r.offset, r.value) for r in result.records] == [(r.offset, r.value) for r in expected.records]
    store.close()
