"""No data loss, property-tested (issue 12): across random interleavings of produce (a broker-like
writer), copy, expiry (retention.ms and local.retention.ms moving), DeleteRecords, an expiry
killed half-way (the log start offset recorded and one segment DELETE_SEGMENT_STARTED, nothing
more) and an expiry process SIGKILLed at one of its steps, every offset in [log start offset, high watermark) stays readable from some tier with the
records that were produced, and after a completed expiry nothing outside retention remains."""

from __future__ import annotations

import tempfile
import uuid
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kts_resources.tiering.expiry import plan_partition
from kts_resources.kafka.simulator.broker_log import BrokerLogDir, LogConfig
from kts_resources.kafka.logdir import LogDir
from kts_resources.kafka.records import NewRecord, build_batch
from kts_resources.tiering.partition_admin import delete_records
from kts_resources.tiering.quotas import ManualClock
from kts_resources.reading.reader import TieredLogReader
from kts_resources.remote_log import RemoteLogSegmentState
from kts_resources.remote_storage.factory import remote_storage_from_uri
from kts_resources.tiering.tiers import locate_partitions
from .expiry_driver import CRASH_POINTS
from .partition_steps import copy_each_partition, plan_and_expire

T0 = 1_700_000_000_000
OPERATIONS = ("produce", "copy", "expire", "local_retention", "delete_records", "killed_expiry", "sigkill_expiry")


class Scenario:
    """One partition of a fresh topic, in an owned log dir, with everything produced remembered."""

    def __init__(self, store, root: Path):
        self.store = store
        self.root = root
        self.topic = f"prop-{uuid.uuid4().hex[:10]}"
        self.key = f"{self.topic}-0"
        self.storage = remote_storage_from_uri((root / "remote").as_uri())
        self.logs = root / "logs"
        self.produced: dict[int, bytes] = {}
        self.clock = ManualClock(T0)
        self.tip = None

    def produce(self, batches: int, roll_every: int) -> None:
        with BrokerLogDir(self.logs, LogConfig(segment_bytes=1 << 20)) as log_dir:
            log = log_dir.partition(self.topic, 0)
            for i in range(batches):
                self.clock.advance(1_000)
                offset = log.log_end_offset
                value = f"{self.topic}:{offset}".encode()
                log.append(build_batch([NewRecord(self.clock.now_ms(), None, value)], base_offset=0), leader_epoch=0)
                self.produced[offset] = value
                if (i + 1) % roll_every == 0:
                    log.roll()
            log.update_high_watermark(log.log_end_offset)
            log.flush()
            log_dir.checkpoint()

    def located(self):
        found, _ = locate_partitions([self.logs], [self.key], owned_log_dirs=[self.logs])
        return found.get(self.key)

    def copy(self) -> None:
        copy_each_partition(LogDir(self.logs), self.store, self.storage)
        if self.tip is None:
            self.tip = next((t for t in self.store.partitions() if t.topic == self.topic), None)

    def expire(self, *, retention_ms: int | None = None, local_retention_ms: int | None = None) -> None:
        if self.tip is None:
            return
        self.set_retention(retention_ms, local_retention_ms)
        plan_and_expire(self.located(), self.tip, self.store, self.storage, clock=self.clock)
        # Converged: a plan made right after has nothing left to do.
        assert not plan_partition(self.located(), self.tip, self.store, now_ms=self.clock.now_ms()).has_work

    def set_retention(self, retention_ms: int | None, local_retention_ms: int | None) -> None:
        """Kafka refuses local.retention.ms above retention.ms: keep the pair valid."""
        config = self.store.topic_configs(self.topic)
        if retention_ms is not None:
            if config.local_retention_ms > retention_ms:
                self.store.delete_topic_config(self.topic, "local.retention.ms")
            self.store.set_topic_config(self.topic, "retention.ms", retention_ms)
        if local_retention_ms is not None:
            limit = self.store.topic_configs(self.topic).retention_ms
            self.store.set_topic_config(self.topic, "local.retention.ms", local_retention_ms if limit < 0 else min(limit, local_retention_ms))

    def killed_expiry(self, retention_ms: int) -> None:
        """An expiry killed after its first two steps: the log start offset recorded, one segment
        DELETE_SEGMENT_STARTED, its objects still there."""
        if self.tip is None:
            return
        self.set_retention(retention_ms, None)
        plan = plan_partition(self.located(), self.tip, self.store, now_ms=self.clock.now_ms())
        if not plan.remote.expired:
            return
        self.store.update_log_start_offset(self.tip, plan.new_log_start_offset)
        first = self.store.segment(plan.remote.expired[0].segment_id)
        self.store.update_remote_log_segment_metadata(first.segment_id, RemoteLogSegmentState.DELETE_SEGMENT_STARTED,
                                                      self.clock.now_ms())

    def sigkill_expiry(self, retention_ms: int, crash_at: str, pg_url: str) -> None:
        """An expiry in its own process, killed with SIGKILL at ``crash_at`` (tests/expiry_driver.py)."""
        import os
        import subprocess
        import sys

        if self.tip is None:
            return
        self.set_retention(retention_ms, None)
        env = {**os.environ, "KTS_DATABASE_URL": pg_url, "KTS_REMOTE_URI": self.storage.location()}
        done = subprocess.run([sys.executable, "-m", "tests.expiry_driver", str(self.logs), self.topic,
                               str(self.clock.now_ms()), crash_at], cwd=Path(__file__).resolve().parent.parent,
                              env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode in (0, -9), done.stderr  # 0: nothing to expire, so the crash point never came

    def delete_records(self, fraction: float) -> None:
        if self.tip is None or not self.produced:
            return
        reader = TieredLogReader(log_dirs=[self.logs], store=self.store, rsm=self.storage, home=self.root / "home")
        part = reader.partition(self.topic, 0)
        target = part.log_start_offset + int((part.high_watermark - part.log_start_offset) * fraction)
        delete_records(self.located(), self.tip, self.store, target)

    def check_every_offset_is_readable(self) -> None:
        if not self.produced:
            return
        reader = TieredLogReader(log_dirs=[self.logs], store=self.store, rsm=self.storage, home=self.root / "home")
        part = reader.partition(self.topic, 0)
        got: dict[int, bytes] = {}
        position = part.log_start_offset
        while position < part.high_watermark:
            result = part.fetch(position, 4096)
            assert result.next_offset > position, f"no progress at offset {position}"
            got.update((r.offset, r.value) for r in result.records)
            position = result.next_offset
        want = {o: v for o, v in self.produced.items() if part.log_start_offset <= o < part.high_watermark}
        assert got == want, f"offsets missing: {sorted(set(want) - set(got))[:10]}"


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(steps=st.lists(st.tuples(st.sampled_from(OPERATIONS), st.integers(1, 6), st.floats(0.0, 1.0)), min_size=3, max_size=10))
def test_every_offset_from_the_log_start_stays_readable(metadata_store, pg_url, steps):
    with tempfile.TemporaryDirectory(prefix="kts-prop-") as tmp:
        s = Scenario(metadata_store, Path(tmp))
        s.produce(6, 2)
        for operation, n, fraction in steps:
            if operation == "produce":
                s.produce(n * 2, max(1, n))
            elif operation == "copy":
                s.copy()
            elif operation == "expire":
                # retention.ms reaching back over a random share of what was produced
                s.expire(retention_ms=int(1_000 * (len(s.produced) * (1 - fraction) + 1)))
            elif operation == "local_retention":
                s.expire(local_retention_ms=int(1_000 * (len(s.produced) * (1 - fraction) + 1)))
            elif operation == "delete_records":
                s.delete_records(fraction)
            elif operation == "sigkill_expiry":
                s.sigkill_expiry(int(1_000 * (len(s.produced) * (1 - fraction) + 1)), CRASH_POINTS[n % len(CRASH_POINTS)], pg_url)
            else:
                s.killed_expiry(int(1_000 * (len(s.produced) * (1 - fraction) + 1)))
            s.check_every_offset_is_readable()
        # A full pass after everything (a rerun after the kill) converges and loses nothing.
        s.copy()
        s.expire()
        s.check_every_offset_is_readable()
