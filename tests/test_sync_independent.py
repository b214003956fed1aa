"""Independent checks of ``kts sync`` and ``kts status --json``, on the filesystem tier and on S3.

The log dir is written by another implementation (tests/independent_log_dir.py: kafka-python's
batch builder plus this repository's reading of KAFKA_FORMATS.md, no kts code), including two
segments written by third-party Kafka implementations. Every expectation is computed from that
writer's own description of what it wrote, and the remote tier is read with plain file reads or a
plain boto3 client — never through kts's storage classes:

- every non-active segment whose next base offset ≤ min(high watermark, recovery point) (and which
  still holds offsets ≥ the log start offset) is in the remote tier under
  ``<topic>-<topic id>/<partition>/<20-digit start>-<segment id>.<suffix>`` (ARCHITECTURE.md), its
  .log, .index, .timeindex and producer snapshot byte-identical to the local files and its
  leader-epoch lineage the partition's epochs up to the segment's end; nothing else is there;
- a second sync after one more roll copies exactly the newly eligible segment and rewrites nothing;
- ``kts status --json`` agrees with the log for every partition.

Each tier runs ``kts sync`` twice (on the session's Spark Connect server), the two tiers side by side, in one
module-scoped fixture; the tests only read what it recorded.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kafka.record.memory_records import MemoryRecords

from .conftest import REPO_ROOT
from .fixtures_postgres import _fresh_database
from .fixtures_s3 import _FAKE_CREDENTIALS
from .independent_log_dir import (
    LogDirDescription,
    PartitionDescription,
    SegmentDescription,
    Workload,
    kafka_uuid_string,
    leader_epoch_checkpoint,
)

pytestmark = pytest.mark.spark  # on the session's Spark Connect server (tests/fixtures_spark.py)

# ARCHITECTURE.md, "Command line": the status object's fields, in order (issue 14 adds lost_ranges
# and damaged_remote_segments, issue 30 replica).
STATUS_FIELDS = (
    "topic", "partition", "log_start_offset", "local_log_start_offset", "high_watermark", "log_end_offset",
    "remote_log_start_offset", "remote_log_end_offset", "local_bytes", "remote_bytes", "local_segments",
    "remote_segments", "copy_lag_bytes", "copy_lag_segments", "lost_ranges", "damaged_remote_segments", "replica",
)
# What travels with a segment (KAFKA_FORMATS.md §7); no .txnindex: the writer aborts nothing.
SEGMENT_SUFFIXES = {"log", "index", "timeindex", "snapshot", "leader-epoch-checkpoint"}
S3_PREFIX = "indep/tier"
_ID = r"[A-Za-z0-9_-]{22}"
# The remote log index: its pointer and its versioned file sets (<generation>-<tag>/<base offset>.<kind>).
_INDEX_OBJECT = re.compile(r"[A-Za-z0-9._-]+/(0|[1-9][0-9]*)/remote-log-index/(current|[0-9]{12}-[0-9a-f]{8}/[0-9]{20}\.remote(Log|Offset|Time)Index)")
_OBJECT = re.compile(rf"(?P<dir>[A-Za-z0-9._-]+)/(?P<partition>0|[1-9][0-9]*)/(?P<start>[0-9]{{20}})-(?P<segment_id>{_ID})\.(?P<suffix>[a-z-]+)")


# --- what the writer's description says must happen --------------------------------------------


def eligible(p: PartitionDescription) -> list[SegmentDescription]:
    """The copy rule (KAFKA_FORMATS.md §7, bounded by min(high watermark, recovery point)):
    closed segments wholly below the bound, from the one holding the log start offset on."""
    bound = min(p.high_watermark, p.recovery_point)
    return [s for s in p.segments
            if not s.active and s.next_base_offset <= bound and s.next_base_offset - 1 >= p.log_start_offset]


def lineage_up_to(p: PartitionDescription, segment: SegmentDescription) -> bytes:
    """The leader-epoch checkpoint that travels with a segment: the entries that start before
    the next segment (Kafka's leaderEpochCache.epochEntriesInRange(-1, nextSegmentBaseOffset))."""
    return leader_epoch_checkpoint([(e, start) for e, start in p.leader_epochs if start < segment.next_base_offset])


# --- running kts -------------------------------------------------------------------------------------


@dataclass
class SyncRun:
    described: LogDirDescription
    stdout: str
    status: dict[tuple[str, int], dict[str, Any]]
    status_fields: list[tuple[str, ...]]
    remote: dict[str, bytes]  # object key below the tier's root/prefix → bytes


@dataclass
class TierRun:
    tier: str
    first: SyncRun
    second: SyncRun  # after page.views-0 rolled once more


class RemoteTier:
    """The remote tier as the test sees it: listed and read without kts."""

    def __init__(self, tier: str, tmp: Path, request: pytest.FixtureRequest):
        self.tier = tier
        if tier == "filesystem":
            self.root = tmp / "remote"
            self.env = {"KTS_REMOTE_URI": self.root.as_uri()}
        else:
            import boto3

            endpoint = request.getfixturevalue("s3_endpoint")
            self.client = boto3.client("s3", endpoint_url=endpoint)
            self.bucket = f"kts-indep-{uuid.uuid4().hex[:12]}"
            self.client.create_bucket(Bucket=self.bucket)
            self.env = {"KTS_REMOTE_URI": f"s3://{self.bucket}/{S3_PREFIX}", "KTS_S3_ENDPOINT_URL": endpoint,
                        **_FAKE_CREDENTIALS}

    def close(self) -> None:
        if self.tier == "s3":
            for key in self.objects():
                self.client.delete_object(Bucket=self.bucket, Key=f"{S3_PREFIX}/{key}")
            self.client.delete_bucket(Bucket=self.bucket)

    def objects(self) -> dict[str, bytes]:
        if self.tier == "filesystem":
            if not self.root.exists():
                return {}
            return {p.relative_to(self.root).as_posix(): p.read_bytes() for p in self.root.rglob("*") if p.is_file()}
        found = {}
        for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=f"{S3_PREFIX}/"):
            for item in page.get("Contents", []):
                body = self.client.get_object(Bucket=self.bucket, Key=item["Key"])["Body"].read()
                found[item["Key"].removeprefix(f"{S3_PREFIX}/")] = body
        return found


class TierSetup:
    """One tier's own log dir, KTS_HOME, Dagster instance, database and remote tier."""

    def __init__(self, tier: str, tmp: Path, database_url: str, request: pytest.FixtureRequest, third_party_dir: Path):
        self.tier, self.log_dir, self.third_party_dir = tier, tmp / "logs", third_party_dir
        dagster_home = tmp / "dagster"
        dagster_home.mkdir()
        shutil.copy(REPO_ROOT / "dagster.yaml", dagster_home)  # kts's instance: runs and events in its PostgreSQL
        self.remote = RemoteTier(tier, tmp, request)
        # kts's defaults but the ones named here, KTS_CLI_SERVER's included: the syncs run in the
        # standing CLI server, as a user's do, and it is stopped when the test ends.
        # Spark is the session's (tests/fixtures_spark.py: its Connect server, or the engine chosen).
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("KTS_") or k.startswith("KTS_SPARK_")
                    or k == "KTS_STEP_RETRY_DELAY_S"}  # the suite's short step retries (conftest)
        self.env.update(KTS_DATABASE_URL=database_url, KTS_LOG_DIRS=str(self.log_dir), KTS_HOME=str(tmp / "home"),
                        DAGSTER_HOME=str(dagster_home), **self.remote.env)
        request.addfinalizer(lambda: subprocess.run([sys.executable, "-m", "kts_assets.cli", "services", "stop"],
                                                    env=self.env, capture_output=True, timeout=120, check=False))

    def kts(self, *args: str) -> str:
        result = subprocess.run([sys.executable, "-m", "kts_assets.cli", *args], check=False, env=self.env, capture_output=True, text=True, timeout=600)
        assert result.returncode == 0, f"{self.tier}: kts {' '.join(args)}: exit {result.returncode}\n{result.stderr[-3000:]}"
        return result.stdout

    def sync(self, described: LogDirDescription) -> SyncRun:
        stdout = self.kts("sync")
        rows = json.loads(self.kts("status", "--json"))
        return SyncRun(described, stdout, {(r["topic"], r["partition"]): r for r in rows},
                       [tuple(r) for r in rows], self.remote.objects())

    def run(self) -> TierRun:
        workload = Workload(third_party_dir=self.third_party_dir)
        first = self.sync(workload.write(self.log_dir))
        workload.append_roll()
        second = self.sync(workload.write(self.log_dir))
        return TierRun(self.tier, first, second)


TIERS = ("filesystem", "s3")


@pytest.fixture(scope="module")
def tier_runs(request, tmp_path_factory, pg_admin_url, pg_template, third_party_dir) -> Iterator[dict[str, TierRun]]:
    """Both tiers, side by side (each sync mostly waits on its processes): the same independent log dir
    written twice, synced, appended to, synced again."""
    # Each tier gets its own database: neither sees the other's rows.
    databases = [_fresh_database(pg_admin_url, pg_template) for _ in TIERS]
    setups = [TierSetup(tier, tmp_path_factory.mktemp(f"indep-{tier}"), next(db), request, third_party_dir)
              for tier, db in zip(TIERS, databases)]
    try:
        with ThreadPoolExecutor(max_workers=len(setups)) as pool:
            yield {run.tier: run for run in pool.map(TierSetup.run, setups)}
    finally:
        for setup in setups:
            setup.remote.close()
        for db in databases:
            next(db, None)  # drops the database


@pytest.fixture(params=TIERS)
def tier_run(request, tier_runs) -> TierRun:
    return tier_runs[request.param]


def runs(run: TierRun) -> list[tuple[str, SyncRun]]:
    return [("first sync", run.first), ("second sync", run.second)]


def remote_segments(objects: dict[str, bytes]) -> dict[tuple[str, str, int], dict[int, dict[str, dict[str, bytes]]]]:
    """(topic, topic id, partition) → start offset → segment id → suffix → bytes, parsed from the
    keys alone; every key must have the documented layout."""
    grouped: dict = {}
    for key, body in objects.items():
        if _INDEX_OBJECT.fullmatch(key):
            continue  # the partition's remote log index files (the remote_log_index asset ships them)
        m = _OBJECT.fullmatch(key)
        assert m, f"object {key!r} does not have the layout <topic>-<topic id>/<partition>/<start>-<segment id>.<suffix>"
        directory = m["dir"]
        assert re.fullmatch(rf".+-{_ID}", directory), key
        topic, topic_id = directory[:-23], directory[-22:]
        by_start = grouped.setdefault((topic, topic_id, int(m["partition"])), {})
        by_start.setdefault(int(m["start"]), {}).setdefault(m["segment_id"], {})[m["suffix"]] = body
    return grouped


# --- the checks ---------------------------------------------------------------------------------------


def test_the_independent_log_dir_has_the_cases_the_checks_need(tmp_path, third_party_dir):
    """What the writer puts on disk reads back with kafka-python and has what the acceptance item
    asks for, so a green run means something: all five codecs, a COMMIT marker, several segments
    per partition with contiguous offsets, a closed segment above the high watermark, a recovery
    point below the high watermark, a leader change, a log start offset inside the first segment,
    topics with '.' and '-', and the two third-party segments as closed first segments."""
    described = Workload(third_party_dir=third_party_dir).write(tmp_path / "logs")
    partitions = described.partitions
    assert {t for t, _ in partitions} == {"page.views", "click-stream", "orders", "vendor.segments"}
    assert any(not s.active and s.next_base_offset > p.high_watermark for p in partitions.values() for s in p.segments)
    assert any(p.recovery_point < p.high_watermark for p in partitions.values())
    assert any(len(p.leader_epochs) > 1 for p in partitions.values())
    assert any(p.log_start_offset > p.segments[0].base_offset for p in partitions.values())
    for name, key in (("kafka-gleam", ("vendor.segments", 0)), ("codecrafters-kafka-go", ("vendor.segments", 1))):
        first = partitions[key].segments[0]
        assert not first.active and first.log.read_bytes() == (third_party_dir / f"{name}-00000000000000000000.log").read_bytes()
    codecs, control = set(), 0
    for p in partitions.values():
        assert len(p.segments) >= 2 and p.segments[-1].active and not any(s.active for s in p.segments[:-1])
        assert (p.path / "partition.metadata").read_text() == f"version: 0\ntopic_id: {kafka_uuid_string(p.topic_id)}"
        expected_next = None
        for s in p.segments:
            assert s.log.name == f"{s.base_offset:020d}.log"
            records = MemoryRecords(s.log.read_bytes())
            while (batch := records.next_batch()) is not None:
                assert batch.validate_crc()
                assert expected_next is None or batch.base_offset == expected_next, f"{p.topic}-{p.partition}: offset gap"
                expected_next = batch.last_offset + 1
                codecs.add(batch.compression_type)
                control += batch.is_control_batch
                list(batch)  # every record decodes
            assert expected_next == (s.next_base_offset if not s.active else p.log_end_offset)
    assert codecs == {0, 1, 2, 3, 4} and control > 0


def test_eligible_segments_are_in_the_remote_tier_byte_identical_and_nothing_else(tier_run):
    for label, run in runs(tier_run):
        remote = remote_segments(run.remote)
        partitions = run.described.partitions
        expected_keys = {(p.topic, kafka_uuid_string(p.topic_id), p.partition) for p in partitions.values() if eligible(p)}
        assert set(remote) == expected_keys, f"{tier_run.tier}, {label}: partitions in the remote tier"
        for p in partitions.values():
            segments = eligible(p)
            by_start = remote.get((p.topic, kafka_uuid_string(p.topic_id), p.partition), {})
            where = f"{tier_run.tier}, {label}, {p.topic}-{p.partition}"
            # Exactly the eligible segments: none above min(HW, recovery point), no active segment.
            assert sorted(by_start) == [s.base_offset for s in segments], where
            for s in segments:
                copies = by_start[s.base_offset]
                assert len(copies) == 1, f"{where}: {len(copies)} copies of segment {s.base_offset}"
                ((segment_id, objects),) = copies.items()
                assert set(objects) == SEGMENT_SUFFIXES | {"manifest"}, f"{where}, segment {s.base_offset}"
                # The manifest (issue 13) describes this segment and its objects as they are in the tier.
                manifest = json.loads(objects.pop("manifest"))
                assert (manifest["topic"], manifest["topic_id"], manifest["partition"], manifest["segment_id"],
                        manifest["start_offset"]) == (p.topic, kafka_uuid_string(p.topic_id), p.partition, segment_id,
                                                      s.base_offset), f"{where}: manifest of segment {s.base_offset}"
                assert {k: v["size"] for k, v in manifest["objects"].items()} == {k: len(v) for k, v in objects.items()}, where
                assert objects["log"] == s.log.read_bytes(), f"{where}: {s.log.name} differs"
                assert objects["index"] == s.index.read_bytes(), f"{where}: {s.index.name} differs"
                assert objects["timeindex"] == s.timeindex.read_bytes(), f"{where}: {s.timeindex.name} differs"
                assert objects["snapshot"] == s.snapshot.read_bytes(), f"{where}: {s.snapshot.name} differs"
                assert objects["leader-epoch-checkpoint"] == lineage_up_to(p, s), f"{where}: epochs of segment {s.base_offset}"


def test_the_sync_reports_what_it_copied(tier_run):
    first_total = sum(len(eligible(p)) for p in tier_run.first.described.partitions.values())
    partitions = len(tier_run.first.described.partitions)
    assert tier_run.first.stdout.startswith(f"synced {partitions} partitions ({partitions} new): copied {first_total} segments ")
    assert tier_run.second.stdout.startswith(f"synced {partitions} partitions (0 new): copied 1 segment ")


def test_the_second_sync_copies_only_the_newly_rolled_segment(tier_run):
    first, second = tier_run.first.remote, tier_run.second.remote
    # Nothing copied before was rewritten, re-keyed or removed; of the remote log index, only the
    # pointer of the partition that grew names new file sets.
    pointers = {k for k in first if k.endswith("/remote-log-index/current")}
    assert {k: second.get(k) for k in first if k not in pointers} == {k: v for k, v in first.items() if k not in pointers}
    assert sorted(k for k in pointers if second.get(k) != first[k]) == [k for k in pointers if k.startswith("page.views-")]
    new = remote_segments({k: v for k, v in second.items() if k not in first})
    before = {key: {s.base_offset for s in eligible(p)} for key, p in tier_run.first.described.partitions.items()}
    rolled = [(p, s) for key, p in tier_run.second.described.partitions.items() for s in eligible(p) if s.base_offset not in before[key]]
    assert [(p.topic, p.partition) for p, _ in rolled] == [("page.views", 0)] and len(rolled) == 1
    (p, s), = rolled
    assert {k: sorted(v) for k, v in new.items()} == {(p.topic, kafka_uuid_string(p.topic_id), p.partition): [s.base_offset]}


def test_status_offsets_bytes_and_segments_agree_with_the_log(tier_run):
    for label, run in runs(tier_run):
        assert set(run.status) == set(run.described.partitions), f"{tier_run.tier}, {label}: partitions in kts status"
        assert all(fields == STATUS_FIELDS for fields in run.status_fields)
        for key, p in run.described.partitions.items():
            copied = eligible(p)
            expected = {
                "topic": p.topic,
                "partition": p.partition,
                "local_log_start_offset": p.segments[0].base_offset,
                "high_watermark": p.high_watermark,
                "log_end_offset": p.log_end_offset,
                "remote_log_start_offset": copied[0].base_offset if copied else -1,
                "remote_log_end_offset": copied[-1].next_base_offset - 1 if copied else -1,
                "local_bytes": sum(s.size for s in p.segments),
                "remote_bytes": sum(s.size for s in copied),
                "local_segments": len(p.segments),
                "remote_segments": len(copied),
                "lost_ranges": [],  # nothing left the disk uncopied
                "damaged_remote_segments": 0,
            }
            actual = {name: run.status[key][name] for name in expected}
            assert actual == expected, f"{tier_run.tier}, {label}, {p.topic}-{p.partition}"


def test_status_log_start_offset_is_the_checkpointed_one(tier_run):
    """The partition's log start offset is what log-start-offset-checkpoint says (KAFKA_FORMATS.md §1;
    DeleteRecords can put it inside the first segment): no offset below it is readable, from either tier."""
    for label, run in runs(tier_run):
        actual = {key: row["log_start_offset"] for key, row in run.status.items()}
        expected = {key: p.log_start_offset for key, p in run.described.partitions.items()}
        assert actual == expected, f"{tier_run.tier}, {label}"


def test_status_copy_lag_is_every_closed_segment_not_yet_remote(tier_run):
    """Copy lag as Kafka's RemoteCopyLagBytes / RemoteCopyLagSegments (KAFKA_FORMATS.md §7):
    the bytes and count of local-only segments (base offset above the highest offset in remote
    storage), minus the active segment."""
    for label, run in runs(tier_run):
        for key, p in run.described.partitions.items():
            copied = eligible(p)
            highest_remote = copied[-1].next_base_offset - 1 if copied else -1
            lag = [s for s in p.segments if not s.active and s.base_offset >= highest_remote]
            actual = (run.status[key]["copy_lag_segments"], run.status[key]["copy_lag_bytes"])
            assert actual == (len(lag), sum(s.size for s in lag)), f"{tier_run.tier}, {label}, {p.topic}-{p.partition}"
