"""Topic deletion without the CLI (issue 31, item 6): with only the Dagster daemon running, a topic
removed from the log dirs loses its remote data once the grace period has passed — the topic
deletion sensor requests a run, the run deletes — and no `kts sync` is ever run."""

from __future__ import annotations

import time

import dagster as dg
import pytest

from kts_assets.definitions import defs
from kts_assets.sensors.topic_deletion import topic_deletion_job, topic_deletion_sensor
from kts_resources.kafka.logdir import LogDir
from kts_resources.kafka.simulator.simulate import SimulationConfig, simulate
from kts_resources.remote_log import RemoteLogSegmentState, RemotePartitionDeleteState
from kts_resources.remote_storage.factory import remote_storage_from_uri
from kts_resources.resources import KafkaLogDirsResource, MetadataStoreResource, RemoteTierResource
from kts_resources.tiering.partition_admin import TOPIC_ABSENCE_GRACE_KEY

from .partition_steps import copy_each_partition

FINISHED = RemoteLogSegmentState.COPY_SEGMENT_FINISHED
GRACE_S = 5


@pytest.fixture
def copied(tmp_path, metadata_store):
    """orders and clicks, one partition each, copied (which marks both topics seen now)."""
    root = tmp_path / "logs"
    simulate(root, SimulationConfig(seed=8, topics=("orders", "clicks"), partitions=1, total_bytes=120 * 1024,
                                    segment_bytes=24 * 1024, transactional_producers=0))
    storage = remote_storage_from_uri((tmp_path / "remote").as_uri())
    assert all(r.copied for r in copy_each_partition(LogDir(root), metadata_store, storage))
    return root, storage


def tick(instance, resources):
    with dg.build_sensor_context(instance=instance, resources=resources, definitions=defs) as context:
        return topic_deletion_sensor.evaluate_tick(context)


def test_a_topic_gone_from_the_log_dirs_loses_its_remote_data_after_the_grace_period_with_only_the_daemon(
        copied, metadata_store, pg_url, tmp_path, monkeypatch):
    monkeypatch.setenv("KTS_HOME", str(tmp_path / "home"))
    root, storage = copied
    metadata_store.set_broker_config(TOPIC_ABSENCE_GRACE_KEY, str(GRACE_S * 1000))
    metadata_store.mark_topics_seen(["orders", "clicks"])  # as the daemon's last copy run did
    seen_at = time.monotonic()
    resources = {"kafka_log_dirs": KafkaLogDirsResource(log_dirs=str(root)),
                 "metadata_store": MetadataStoreResource(database_url=pg_url),
                 "remote_tier": RemoteTierResource(remote_uri=storage.location(""))}
    clicks = next(t for t in metadata_store.partitions() if t.topic == "clicks")
    orders = next(t for t in metadata_store.partitions() if t.topic == "orders")
    clicks_keys = {o.key for o in storage.list_objects(storage.keys.partition_prefix(clicks))}
    assert clicks_keys
    for path in (root / "clicks-0").iterdir():  # the broker deleted the topic
        path.unlink()
    (root / "clicks-0").rmdir()
    with dg.instance_for_test() as instance:
        early = tick(instance, resources)
        assert not early.run_requests and "no topic has been gone" in early.skip_message  # within the grace period
        time.sleep(max(0.0, GRACE_S + 0.5 - (time.monotonic() - seen_at)))
        [request] = tick(instance, resources).run_requests
        # The run the daemon would launch for the request.
        run = topic_deletion_job.execute_in_process(instance=instance, resources=resources, tags=request.tags)
        assert run.success
        assert metadata_store.partition_state(clicks).delete_state is RemotePartitionDeleteState.DELETE_PARTITION_FINISHED
        assert not metadata_store.list_remote_log_segments(clicks, states={FINISHED})
        assert not {o.key for o in storage.list_objects()} & clicks_keys
        assert metadata_store.list_remote_log_segments(orders, states={FINISHED})  # present: kept
        # The UI shows the deleted partition empty at once, said by the run that deleted it.
        [record] = instance.fetch_observations(dg.AssetRecordsFilter(asset_key=dg.AssetKey("remote_segments"),
                                                                     asset_partitions=["clicks-0"]), limit=1).records
        metadata = {label: value.value for label, value in record.asset_observation.metadata.items()}
        assert (metadata["remote_segments"], metadata["remote_bytes"], metadata["remote_log_start_offset"]) == (0, 0, -1)
        assert metadata["changed_by"] == f"topic_deletion_job run {run.run_id}"
        [record] = instance.fetch_observations(dg.AssetRecordsFilter(asset_key=dg.AssetKey("local_segments"),
                                                                     asset_partitions=["clicks-0"]), limit=1).records
        assert record.asset_observation.metadata["missing"].value is True
        # Deleted once: the next tick finds nothing due.
        after = tick(instance, resources)
        assert not after.run_requests and "nothing to delete" in after.skip_message
