"""Issue 34's acceptance scenario, the core use case: a broker keeps hours locally, the tier keeps days.

A broker-owned log dir (not in KTS_OWNED_LOG_DIRS) whose broker rolls a segment every hour and
deletes its segments older than 2 hours by its own retention — files removed, its log start offset
and log-start-offset-checkpoint moved to the first remaining segment, as Kafka's segment deletion
does — for a week of simulated time, while kts runs a pass every simulated hour (168 passes: kts's
own copy, retention planning and expiry, lost-range detection, in-process with the simulated hour as
"now"; tests/broker_retention.py). The topic's retention.ms is 3 days.

After every pass: every offset kts ever copied is readable from the tier alone (each remote
segment's first and last offset, fetched with no log dir) until kts's own retention.ms expires it,
and a segment is gone only when its largest timestamp is older than retention.ms; nothing is
reported lost. Then one more hour and a real `kts sync` in its own process (wall-clock "now") agree.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid

import pytest

from kts_resources.kafka.logdir import LogDir
from kts_resources.remote_storage.factory import remote_storage_from_uri
from kts_resources.tiering.retention import BY_TIME
from kts_resources.tiering.partition_view import partition_tiers
from kts_resources.tiering.tiers import locate_partitions

from .broker_retention import DAY_MS, FINISHED, HOUR_MS, RetainingBroker, kts_pass, records_at, remote_only
from .conftest import REPO_ROOT

pytestmark = pytest.mark.spark  # the closing `kts sync` runs on the session's Spark Connect server

RETENTION_MS = 3 * DAY_MS  # the topic's retention.ms: kts's remote retention
LOCAL_RETENTION_MS = 2 * HOUR_MS  # the broker's own log.retention.ms, not tiering-aware
HOURS = 7 * 24
BATCHES_PER_HOUR = 6


def produce_an_hour(broker: RetainingBroker, hour_start_ms: int) -> None:
    """A batch every 10 minutes of the hour, then the hourly roll."""
    for k in range(BATCHES_PER_HOUR):
        broker.produce(hour_start_ms + k * (HOUR_MS // BATCHES_PER_HOUR))
    broker.roll()


def test_a_week_of_the_brokers_own_retention_loses_nothing_kts_copied(tmp_path, metadata_store, pg_url):
    topic = f"events-{uuid.uuid4().hex[:8]}"
    logs, remote = tmp_path / "logs", tmp_path / "remote"
    storage = remote_storage_from_uri(remote.as_uri())
    broker = RetainingBroker(logs, topic)
    # The simulated week ends an hour before the wall clock, where the closing `kts sync` takes over.
    start = (time.time_ns() // 1_000_000 // HOUR_MS) * HOUR_MS - (HOURS + 1) * HOUR_MS
    copied: dict[int, tuple[int, int]] = {}  # start offset → (end offset, largest timestamp), every segment ever copied
    tip = None

    def assert_the_tier_holds_what_it_must(now_ms: int, *, not_after_ms: int | None = None) -> None:
        """Every segment ever copied is remote and readable unless retention.ms expired it by age
        (``not_after_ms``: a later "now" that may have expired more, for the wall-clock pass)."""
        remote_now = {md.start_offset: md for md in metadata_store.list_remote_log_segments(tip, states={FINISHED})}
        part = remote_only(metadata_store, storage, topic)
        for first, (last, largest) in sorted(copied.items()):
            expired = largest <= now_ms - RETENTION_MS
            if first not in remote_now:
                might = largest <= (not_after_ms if not_after_ms is not None else now_ms) - RETENTION_MS
                assert might, f"segment {first}..{last} (largest timestamp {largest}) left the tier before retention.ms"
                continue
            assert not expired, f"segment {first}..{last} outlived retention.ms at {now_ms}"
            assert remote_now[first].end_offset == last
            for offset in (first, last):
                assert records_at(part, offset).get(offset) == broker.produced[offset], f"offset {offset} at {now_ms}"
        assert metadata_store.lost_ranges(tip, include_acknowledged=True) == []

    try:
        for hour in range(1, HOURS + 1):
            produce_an_hour(broker, start + (hour - 1) * HOUR_MS)
            now = start + hour * HOUR_MS
            # The broker's retention runs before kts looks: the worst order for kts.
            broker.delete_by_retention(now, retention_ms=LOCAL_RETENTION_MS)
            done = kts_pass(metadata_store, storage, logs, now_ms=now, database_url=pg_url)
            assert (done.lost, done.stopped) == ([], []), f"hour {hour}"
            assert {reason for _, _, reason in done.remote_expired} <= {BY_TIME}, f"hour {hour}: {done.remote_expired}"
            copied.update({md.start_offset: (md.end_offset, md.max_timestamp_ms) for md in done.copied})
            if tip is None:
                [tip] = [t for t in metadata_store.partitions() if t.topic == topic]
                metadata_store.set_topic_config(topic, "retention.ms", RETENTION_MS)
            # The broker really did delete: it keeps about two hours, its checkpoint at its first segment.
            [partition] = LogDir(logs).partitions()
            local = partition.segments()
            assert len(local) <= 4, f"hour {hour}: the broker kept {len(local)} segments"
            assert LogDir(logs).log_start_offset(partition.topic_partition) == local[0].base_offset
            assert_the_tier_holds_what_it_must(now)
        # Three days of hourly segments stay, the rest expired by age, and nothing was ever lost.
        finished = metadata_store.list_remote_log_segments(tip, states={FINISHED})
        assert len(copied) == HOURS and 3 * 24 - 2 <= len(finished) <= 3 * 24 + 1
        located, _ = locate_partitions([logs], [f"{topic}-0"])
        tiers = partition_tiers(located[f"{topic}-0"], metadata_store)
        assert tiers.log_start_offset == tiers.remote_log_start_offset == min(md.start_offset for md in finished)

        # One more hour, then `kts sync` itself, on the wall clock.
        produce_an_hour(broker, start + HOURS * HOUR_MS)
        broker.delete_by_retention(time.time_ns() // 1_000_000, retention_ms=LOCAL_RETENTION_MS)
        home, dagster_home = tmp_path / "home", tmp_path / "dagster"
        dagster_home.mkdir()
        (dagster_home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
        env = {**os.environ, "KTS_DATABASE_URL": pg_url, "KTS_LOG_DIRS": str(logs), "KTS_HOME": str(home),
               "KTS_REMOTE_URI": remote.as_uri(), "DAGSTER_HOME": str(dagster_home)}
        env.pop("KTS_OWNED_LOG_DIRS", None)

        def kts(*args: str) -> subprocess.CompletedProcess:
            return subprocess.run([sys.executable, "-m", "kts_assets.cli", *args], env=env, cwd=REPO_ROOT,
                                  capture_output=True, text=True, timeout=900)

        before = time.time_ns() // 1_000_000
        sync = kts("sync")
        after = time.time_ns() // 1_000_000
        assert sync.returncode == 0, sync.stderr[-3000:]
        new = [md for md in metadata_store.list_remote_log_segments(tip, states={FINISHED}) if md.start_offset not in copied]
        assert [md.start_offset for md in new] == [broker.log.segments()[-2].base_offset], "the sync copies the new hour"
        copied.update({md.start_offset: (md.end_offset, md.max_timestamp_ms) for md in new})
        assert_the_tier_holds_what_it_must(before, not_after_ms=after)
        status = kts("status", "--json")
        assert status.returncode == 0, status.stderr
        [row] = [r for r in json.loads(status.stdout) if r["topic"] == topic]
        assert row["lost_ranges"] == [] and row["log_start_offset"] == row["remote_log_start_offset"] >= 0
    finally:
        broker.close()
        storage.close()
