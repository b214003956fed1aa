"""DeleteRecords, topic deletion and the tiering switches (kts_resources/tiering/partition_admin.py), as
Kafka's tiered-storage integration tests check them: record counts read back per tier with fetch."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from kts_resources.reading import remote_index_cache as index_cache
from kts_resources.reading import remote_index_tier as index_tier
from kts_resources.tiering.copier import copy_partition
from kts_resources.kafka.simulator.broker_log import BrokerLogDir, LogConfig
from kts_resources.kafka.logdir import LogDir
from kts_resources.kafka.records import NewRecord, build_batch
from kts_resources.kafka.simulator.simulate import SimulationConfig, simulate
from kts_resources.tiering.partition_admin import (
    DeleteRecordsError,
    delete_on_disable_applies,
    delete_partition_remote_data,
    delete_records,
    delete_topic_remote_data,
)
from kts_resources.tiering.quotas import ManualClock, SystemClock
from kts_resources.reading.reader import OffsetOutOfRangeError, TieredLogReader
from kts_resources.remote_log import RemoteLogSegmentState, RemotePartitionDeleteState
from kts_resources.remote_storage.factory import remote_storage_from_uri
from kts_resources.tiering.tiers import locate_partitions

from .tiered_reads import records_per_tier
from .partition_steps import copy_each_partition, plan_and_expire

FINISHED = RemoteLogSegmentState.COPY_SEGMENT_FINISHED
T = 1_700_000_000_000


def located(root, key, owned=True):
    found, _ = locate_partitions([root], [key], owned_log_dirs=[root] if owned else [])
    return found[key]


@pytest.fixture
def two_epochs(tmp_path, metadata_store):
    """Kafka's DeleteSegmentsByLogStartOffsetBreach shape: 5 segments of 2 one-record batches,
    written under leader epoch 0 then (a leader change) epoch 1, the first four copied and gone locally."""
    root = tmp_path / "logs"
    with BrokerLogDir(root, LogConfig(segment_bytes=1 << 20)) as log_dir:
        log = log_dir.partition("topicA", 0)
        for i in range(10):
            log.append(build_batch([NewRecord(T + i, f"k{i}".encode(), f"v{i}".encode())], base_offset=0),
                       leader_epoch=0 if i < 5 else 1)
            if i % 2 == 1 and i < 9:
                log.roll()
        log.update_high_watermark(10)
        log.flush()
        log_dir.checkpoint()
    storage = remote_storage_from_uri((tmp_path / "remote").as_uri())
    copy_each_partition(LogDir(root), metadata_store, storage)
    tip = next(iter(metadata_store.partitions()))
    finished = sorted(metadata_store.list_remote_log_segments(tip, states={FINISHED}), key=lambda m: m.start_offset)
    assert [(m.start_offset, m.end_offset) for m in finished] == [(0, 1), (2, 3), (4, 5), (6, 7)]
    for md in finished:
        for f in (root / "topicA-0").glob(f"{md.start_offset:020d}.*"):
            f.unlink()
    reader = TieredLogReader(log_dirs=[root], store=metadata_store, rsm=storage, home=tmp_path / "home")
    return root, storage, tip, finished, reader


def test_delete_records_across_a_leader_change_then_expiry_removes_what_is_below(two_epochs, metadata_store):
    root, storage, tip, finished, reader = two_epochs
    assert records_per_tier(reader, "topicA", 0) == (8, 2)
    assert delete_records(located(root, "topicA-0"), tip, metadata_store, 5) == 5
    # Unreadable at once, before any object is deleted.
    with pytest.raises(OffsetOutOfRangeError):
        reader.partition("topicA", 0).fetch(4)
    assert reader.offsets("topicA", 0, "earliest").offset == 5
    assert records_per_tier(reader, "topicA", 5) == (3, 2)
    result = plan_and_expire(located(root, "topicA-0"), tip, metadata_store, storage, clock=ManualClock(T + 100))
    assert result.remote_deleted == [0, 2]  # [4, 5] holds offset 5: it stays
    assert [m.start_offset for m in metadata_store.list_remote_log_segments(tip, states={FINISHED})] == [4, 6]
    assert records_per_tier(reader, "topicA", 5) == (3, 2)
    # Below the current start is a no-op; above the high watermark is refused, as Kafka does.
    assert delete_records(located(root, "topicA-0"), tip, metadata_store, 3) == 5
    with pytest.raises(DeleteRecordsError, match="above the high watermark 10"):
        delete_records(located(root, "topicA-0"), tip, metadata_store, 11)


def test_delete_topic_removes_every_remote_object_and_index_and_stops_copies(two_epochs, metadata_store, tmp_path):
    root, storage, tip, finished, reader = two_epochs
    home = tmp_path / "home"
    directory = index_cache.cache_directory(home, tip)
    index_tier.update_partition_index(metadata_store, storage, directory, tip, lambda md: index_cache.read_segment_entries(storage, md))
    [done] = delete_topic_remote_data("topicA", metadata_store, storage, clock=SystemClock(), home=home)
    assert done.segments_deleted == 4 and done.index_files_deleted == 4  # one file set and its pointer
    assert list(storage.list_objects()) == [] and not directory.exists()
    assert metadata_store.partition_state(tip).delete_state is RemotePartitionDeleteState.DELETE_PARTITION_FINISHED
    assert [e.new_state for e in metadata_store.events(tip) if e.kind == "PARTITION_DELETE_STATE_CHANGED"] == [
        "DELETE_PARTITION_MARKED", "DELETE_PARTITION_STARTED", "DELETE_PARTITION_FINISHED"]
    # Running it again is a no-op, and the copier no longer copies the partition.
    assert delete_topic_remote_data("topicA", metadata_store, storage, clock=SystemClock(), home=home)[0].segments_deleted == 0
    again = copy_partition(located(root, "topicA-0").partition, LogDir(root), metadata_store, storage)
    assert again.copied == [] and "deleted" in again.skipped


@pytest.fixture
def simulated(tmp_path, metadata_store):
    root = tmp_path / "logs"
    simulate(root, SimulationConfig(seed=8, topics=("orders",), partitions=1, total_bytes=120 * 1024, segment_bytes=24 * 1024,
                                    transactional_producers=0))
    storage = remote_storage_from_uri((tmp_path / "remote").as_uri())
    return root, storage


def test_disabling_tiering_with_delete_on_disable_deletes_the_remote_data(simulated, metadata_store):
    root, storage = simulated
    copy_each_partition(LogDir(root), metadata_store, storage)
    tip = next(iter(metadata_store.partitions()))
    assert not delete_on_disable_applies(metadata_store, "orders")
    metadata_store.set_topic_config("orders", "remote.log.delete.on.disable", "true")
    metadata_store.set_topic_config("orders", "remote.storage.enable", "false")
    assert delete_on_disable_applies(metadata_store, "orders")
    done = delete_partition_remote_data(tip, metadata_store, storage, clock=SystemClock(), home=None)
    assert done.segments_deleted > 0 and list(storage.list_objects()) == []


def test_copy_disable_stops_copies_but_keeps_reads(simulated, metadata_store, tmp_path):
    root, storage = simulated
    copy_each_partition(LogDir(root), metadata_store, storage)
    tip = next(iter(metadata_store.partitions()))
    first = sorted(metadata_store.list_remote_log_segments(tip, states={FINISHED}), key=lambda m: m.start_offset)[0]
    metadata_store.set_topic_config("orders", "remote.log.copy.disable", "true")
    simulate(root, SimulationConfig(seed=9, topics=("orders",), partitions=1, total_bytes=60 * 1024, segment_bytes=24 * 1024,
                                    transactional_producers=0))
    result = copy_partition(located(root, "orders-0").partition, LogDir(root), metadata_store, storage)
    assert result.copied == [] and "copy.disable" in result.skipped
    for f in (root / "orders-0").glob(f"{first.start_offset:020d}.*"):
        f.unlink()  # local retention took the copied segment: reads of it go to the remote tier
    reader = TieredLogReader(log_dirs=[root], store=metadata_store, rsm=storage, home=tmp_path / "home")
    remote, local = records_per_tier(reader, "orders", 0)
    assert remote > 0 and local > 0


def test_enabling_tiering_on_an_existing_topic_copies_its_history(simulated, metadata_store):
    root, storage = simulated
    partition = located(root, "orders-0").partition
    metadata_store.ensure_topic("orders", partition.metadata().topic_id, {"remote.storage.enable": "false"})
    assert copy_partition(partition, LogDir(root), metadata_store, storage).copied == []
    metadata_store.set_topic_config("orders", "remote.storage.enable", "true")
    copied = copy_partition(partition, LogDir(root), metadata_store, storage).copied
    assert copied and copied[0].start_offset == partition.segments()[0].base_offset


def kts(env, *args):
    return subprocess.run([sys.executable, "-m", "kts_assets.cli", *args], env=env, capture_output=True, text=True, timeout=120)


def test_the_cli_deletes_records_and_topics_with_one_line_errors(simulated, metadata_store, pg_url, tmp_path):
    root, storage = simulated
    copy_each_partition(LogDir(root), metadata_store, storage)
    env = {**os.environ, "KTS_DATABASE_URL": pg_url, "KTS_LOG_DIRS": str(root), "KTS_HOME": str(tmp_path / "home"),
           "KTS_REMOTE_URI": (tmp_path / "remote").as_uri()}
    ok = kts(env, "delete-records", "orders", "0", "--before", "5", "--json")
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["log_start_offset"] == 5
    # The Dagster UI is told at once: remote_segments' latest observation of orders-0 says so.
    observed = subprocess.run(
        [sys.executable, "-c", "import json, dagster as dg; from kts_assets.instance import dagster_instance; "
         "[r] = dagster_instance().fetch_observations(dg.AssetRecordsFilter(asset_key=dg.AssetKey('remote_segments'), "
         "asset_partitions=['orders-0']), limit=1).records; "
         "print(json.dumps({k: v.value for k, v in r.asset_observation.metadata.items()}))"],
        env=env, capture_output=True, text=True, timeout=300)
    assert observed.returncode == 0, observed.stderr[-3000:]
    metadata = json.loads(observed.stdout.strip().splitlines()[-1])
    assert metadata["log_start_offset"] == 5 and metadata["changed_by"] == "kts delete-records"
    for args, message in [(("delete-records", "orders", "0", "--before", "99999999"), "above the high watermark"),
                          (("delete-records", "nosuch", "0", "--before", "1"), "not known to the metadata store"),
                          (("topic", "delete", "nosuch"), "not known to the metadata store")]:
        bad = kts(env, *args)
        assert bad.returncode == 1 and message in bad.stderr and "Traceback" not in bad.stderr
    deleted = kts(env, "topic", "delete", "orders", "--json")
    assert deleted.returncode == 0, deleted.stderr
    assert json.loads(deleted.stdout)["segments_deleted"] > 0 and list(storage.list_objects()) == []


def test_a_topic_no_kts_has_seen_for_the_grace_period_loses_its_remote_data(tmp_path, metadata_store):
    """A topic gone from every log dir (of every kts sharing the store) for the grace period is
    deleted as `kts topic delete` would; one still seen — here or by another kts's copy — is not."""
    import datetime as dt

    from kts_resources.tiering.partition_admin import delete_topics_gone_from_log_dirs

    root = tmp_path / "logs"
    simulate(root, SimulationConfig(seed=8, topics=("orders", "clicks"), partitions=1, total_bytes=120 * 1024,
                                    segment_bytes=24 * 1024, transactional_producers=0))
    storage = remote_storage_from_uri((tmp_path / "remote").as_uri())
    copy_each_partition(LogDir(root), metadata_store, storage)  # the copy marks both topics seen now
    week_later = ManualClock(int(dt.datetime.now(dt.timezone.utc).timestamp() * 1000) + 8 * 24 * 3600 * 1000)
    metadata_store.set_broker_config("kts.topic.absence.grace.ms", "-1")
    assert delete_topics_gone_from_log_dirs(metadata_store, storage, {"orders"}, clock=week_later, home=None) == []
    metadata_store.set_broker_config("kts.topic.absence.grace.ms", None)  # the 7-day default
    # Seen just now (this call marks "orders"), so a day later nothing is due yet.
    tomorrow = ManualClock(int(dt.datetime.now(dt.timezone.utc).timestamp() * 1000) + 24 * 3600 * 1000)
    assert delete_topics_gone_from_log_dirs(metadata_store, storage, {"orders"}, clock=tomorrow, home=None) == []
    assert delete_topics_gone_from_log_dirs(metadata_store, storage, {"orders"}, clock=week_later, home=None) == ["clicks"]
    clicks = next(t for t in metadata_store.partitions() if t.topic == "clicks")
    orders = next(t for t in metadata_store.partitions() if t.topic == "orders")
    assert metadata_store.partition_state(clicks).delete_state is RemotePartitionDeleteState.DELETE_PARTITION_FINISHED
    assert metadata_store.partition_state(orders).delete_state is None
    assert metadata_store.list_remote_log_segments(orders, states={FINISHED})
    assert delete_topics_gone_from_log_dirs(metadata_store, storage, {"orders"}, clock=week_later, home=None) == []


def test_delete_records_on_a_partition_that_exists_nowhere_is_refused(simulated, metadata_store, tmp_path):
    """Issue 34 finding 6: orders-9 is in no log dir and the store holds no remote data of it, so
    there is no log to move the start of; nothing is written, in the store or the tier."""
    from kts_resources.kafka.partition import TopicPartition
    from kts_resources.tiering.partition_admin import UnknownPartitionError
    from kts_resources.remote_log import TopicIdPartition

    root, storage = simulated
    copy_each_partition(LogDir(root), metadata_store, storage)
    orders_0 = next(iter(metadata_store.partitions()))
    tip = TopicIdPartition(orders_0.topic_id, TopicPartition("orders", 9))
    before = sorted(o.key for o in storage.list_objects())
    with pytest.raises(UnknownPartitionError, match="orders-9"):
        delete_records(None, tip, metadata_store, 123456789, storage=storage)
    assert metadata_store.partition_state(tip).log_start_offset <= 0
    assert sorted(o.key for o in storage.list_objects()) == before


def test_delete_records_on_a_partition_known_only_to_the_tier_is_accepted(simulated, metadata_store):
    """A partition gone from the log dirs but with remote data is a log kts still serves."""
    root, storage = simulated
    copy_each_partition(LogDir(root), metadata_store, storage)
    tip = next(iter(metadata_store.partitions()))
    end = metadata_store.finished_summary(tip).end_offset
    assert delete_records(None, tip, metadata_store, end, storage=storage) == end
    with pytest.raises(DeleteRecordsError, match="high watermark"):
        delete_records(None, tip, metadata_store, end + 2, storage=storage)


def test_the_cli_refuses_delete_records_on_a_partition_that_does_not_exist(simulated, metadata_store, pg_url, tmp_path):
    root, storage = simulated
    copy_each_partition(LogDir(root), metadata_store, storage)
    env = {**os.environ, "KTS_DATABASE_URL": pg_url, "KTS_LOG_DIRS": str(root), "KTS_HOME": str(tmp_path / "home"),
           "KTS_REMOTE_URI": (tmp_path / "remote").as_uri()}
    before = sorted(o.key for o in storage.list_objects())
    bad = kts(env, "delete-records", "orders", "9", "--before", "123456789")
    assert bad.returncode == 2, bad.stderr
    assert bad.stderr.strip().splitlines() == [bad.stderr.strip()] and "orders-9" in bad.stderr
    assert sorted(o.key for o in storage.list_objects()) == before


def test_delete_records_without_a_high_watermark_is_bounded_by_the_log_end(simulated, metadata_store):
    """No replication-offset-checkpoint: the log end offset is the bound, not "anything goes"."""
    root, storage = simulated
    copy_each_partition(LogDir(root), metadata_store, storage)
    (root / "replication-offset-checkpoint").unlink()
    tip = next(iter(metadata_store.partitions()))
    with pytest.raises(DeleteRecordsError, match="above the high watermark"):
        delete_records(located(root, "orders-0"), tip, metadata_store, 123456789, storage=storage)
