"""`kts serve` where a consumer's position meets the log's ends (issue 29, acceptance "Offset out of
range"): below the log start offset the client's auto.offset.reset=earliest recovers, and a consumer
at the end sees the records appended after it got there, from the tier once they are copied (and
their local segments gone) and straight from the local log for those still local."""

from __future__ import annotations

import dataclasses
import shutil
import time
from pathlib import Path

from kafka import KafkaConsumer, TopicPartition

from kts_resources.kafka.logdir import LogDir
from kts_resources.kafka.simulator.simulate import simulate
from kts_resources.remote_storage.factory import remote_storage_from_uri

from .partition_steps import copy_each_partition
from .test_serve import CONFIG, TOPIC, delete_copied_segments, original_records, served, tiered  # noqa: F401 - fixtures
from .test_sync_outcome import kts


def poll_records(consumer: KafkaConsumer, tp: TopicPartition, until: int, timeout_s: float = 60) -> list[tuple]:
    got = []
    deadline = time.monotonic() + timeout_s
    while consumer.position(tp) < until and time.monotonic() < deadline:
        for records in consumer.poll(timeout_ms=500).values():
            got += [(r.offset, r.timestamp, r.key, r.value, list(r.headers)) for r in records]
    return got


def test_a_consumer_below_the_log_start_offset_resets_to_earliest_and_reads_on_from_there(served):
    server, originals = served
    records = original_records(originals / f"{TOPIC}-0", read_committed=False)
    start = records[len(records) // 4][0]  # a record in the tier only
    moved = kts(server.env, "delete-records", TOPIC, "0", "--before", str(start))
    assert moved.returncode == 0, moved.stderr
    consumer = KafkaConsumer(bootstrap_servers=server.bootstrap, enable_auto_commit=False, auto_offset_reset="earliest")
    try:
        tp = TopicPartition(TOPIC, 0)
        assert consumer.beginning_offsets([tp])[tp] == start
        consumer.assign([tp])
        consumer.seek(tp, 3)  # below the log start: OFFSET_OUT_OF_RANGE, then the reset
        got = poll_records(consumer, tp, start + 200)
        assert got and got == [r for r in records if start <= r[0] <= got[-1][0]]
    finally:
        consumer.close()


def test_a_consumer_at_the_end_sees_new_records_from_the_tier_once_copied_and_from_the_local_log_while_local(served, metadata_store):
    server, _ = served
    env = server.env
    log_dir = Path(env["KTS_LOG_DIRS"])
    consumer = KafkaConsumer(bootstrap_servers=server.bootstrap, enable_auto_commit=False)
    try:
        tp = TopicPartition(TOPIC, 0)
        consumer.assign([tp])
        consumer.seek_to_end(tp)
        end = consumer.position(tp)
        assert poll_records(consumer, tp, end + 1, timeout_s=1) == []  # at the end: nothing yet

        # New records while the consumer waits at the end; kts copies the closed segments and
        # local retention deletes them: the first new records are then in the tier only.
        simulate(log_dir, dataclasses.replace(CONFIG, total_bytes=300 * 1024))
        appended = log_dir.parent / "appended"
        shutil.copytree(log_dir / f"{TOPIC}-0", appended)
        results = copy_each_partition(LogDir(log_dir), metadata_store, remote_storage_from_uri(env["KTS_REMOTE_URI"]))
        [copied] = [r for r in results if r.topic_partition.partition == 0]
        copied_to = max(md.end_offset for md in copied.copied)
        assert copied_to > end
        delete_copied_segments(log_dir, copied.topic_partition, copied_to)
        assert LogDir(log_dir).partition_dir(copied.topic_partition).segments()[0].base_offset > end  # new, and tier only

        # The broker writes on: these records are in the local log only.
        simulate(log_dir, dataclasses.replace(CONFIG, total_bytes=60 * 1024))
        appended_later = log_dir.parent / "appended-later"
        shutil.copytree(log_dir / f"{TOPIC}-0", appended_later)

        new_end = consumer.end_offsets([tp])[tp]
        assert new_end > copied_to + 1
        got = poll_records(consumer, tp, new_end)
        written = {r[0]: r for snapshot in (appended, appended_later) for r in original_records(snapshot, read_committed=False)}
        want = [written[offset] for offset in sorted(written) if end <= offset < new_end]
        assert got == want and got[0][0] <= copied_to < got[-1][0]
    finally:
        consumer.close()
