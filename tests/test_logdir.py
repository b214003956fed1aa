"""Reading a broker log dir the way Kafka lays it out: 20-digit offset file names, partition
directory names (split on the last dash; -delete/-future/-stray and foreign directories skipped with
a reason), segment listing in offset order with the last one active, files that are never live data
(.deleted/.cleaned/.swap/.tmp) reported but not used, producer snapshots, and the log dir's
checkpoints (missing ones read as empty with a note)."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kts_resources.kafka.checkpoints import (
    EpochEntry,
    MissingCheckpointError,
    PartitionMetadata,
    write_leader_epoch_checkpoint,
    write_offset_checkpoint,
    write_partition_metadata,
)
from kts_resources.kafka.errors import CheckpointError
from kts_resources.kafka.logdir import (
    LogDir,
    PartitionDir,
    discover,
    discover_partitions,
    list_producer_snapshots,
    list_segments,
    offset_file_name,
    parse_offset_file_name,
    parse_partition_dir_name,
    scan_partition_dir,
)
from kts_resources.kafka.partition import TopicPartition, parse_topic_partition

UNIQUE_ID = "5b2a0c3d9e8f47a1b6c5d4e3f2a1b0c9"  # Kafka appends a dashless UUID before the suffix


def touch(directory: Path, *names: str) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for name in names:
        (directory / name).write_bytes(b"")


def segment_files(base_offset: int, *suffixes: str) -> list[str]:
    return [offset_file_name(base_offset, suffix) for suffix in suffixes]


# --- file names ---------------------------------------------------------------------------------


def test_offset_file_names_are_20_digit_zero_padded():
    assert offset_file_name(42, ".log") == "00000000000000000042.log"
    assert offset_file_name(2**63 - 1, ".snapshot") == "09223372036854775807.snapshot"
    assert parse_offset_file_name("00000000000000000042.log") == (42, ".log")
    assert parse_offset_file_name("00000000000000000042.log.deleted") == (42, ".log.deleted")


@given(st.integers(0, 2**63 - 1), st.sampled_from([".log", ".index", ".timeindex", ".txnindex", ".snapshot"]))
def test_offset_file_names_round_trip(offset: int, suffix: str):
    assert parse_offset_file_name(offset_file_name(offset, suffix)) == (offset, suffix)


@pytest.mark.parametrize("name", ["42.log", "0000000000000000004x.log", "000000000000000000042.log", "00000000000000000042"])
def test_names_without_a_20_digit_offset_do_not_parse(name: str):
    with pytest.raises(ValueError):
        parse_offset_file_name(name)


def test_offsets_outside_int64_have_no_file_name():
    with pytest.raises(ValueError):
        offset_file_name(-1, ".log")


# --- partition directory names ------------------------------------------------------------------


def test_topic_names_with_dashes_and_dots_split_on_the_last_dash():
    assert parse_partition_dir_name("orders-eu.v2-west-12") == TopicPartition("orders-eu.v2-west", 12)
    assert parse_partition_dir_name("__consumer_offsets-49") == TopicPartition("__consumer_offsets", 49)
    assert TopicPartition("orders-eu.v2-west", 12).dir_name == "orders-eu.v2-west-12"


@pytest.mark.parametrize("suffix", ["-delete", "-future", "-stray"])
def test_delete_future_and_stray_directories_are_not_partitions(suffix: str):
    assert parse_partition_dir_name(f"orders-3.{UNIQUE_ID}{suffix}") is None
    assert parse_partition_dir_name(f"orders{suffix}") is None


@pytest.mark.parametrize(
    "name",
    [
        "orders",  # no dash
        "orders-",  # no partition
        "-0",  # no topic
        "orders-x",  # partition not a number
        "orders-01",  # not canonical: would collide with orders-1
        "orders-2147483648",  # beyond int32
        "bad topic-0",  # illegal character
        "..-0",  # "." and ".." are not topics
        "t" * 250 + "-0",  # longer than 249 characters
        "__cluster_metadata-0",  # the KRaft metadata log
        "remote-log-index-cache",  # tiered storage's index cache
        "lost+found",
    ],
)
def test_names_that_are_not_a_legal_topic_and_partition_are_not_partitions(name: str):
    assert parse_partition_dir_name(name) is None


legal_topics = st.from_regex(r"[a-zA-Z0-9._-]{1,60}", fullmatch=True).filter(lambda t: t not in (".", ".."))


@given(legal_topics, st.integers(0, 2**31 - 1))
def test_every_legal_topic_partition_parses_back_from_its_dir_name(topic: str, partition: int):
    tp = TopicPartition(topic, partition)
    if topic != "__cluster_metadata":
        assert parse_partition_dir_name(tp.dir_name) == tp
    assert parse_topic_partition(tp.dir_name) == tp


def test_topic_partitions_sort_by_topic_then_partition_number():
    tps = [TopicPartition("b", 0), TopicPartition("a", 10), TopicPartition("a", 2)]
    assert sorted(tps) == [TopicPartition("a", 2), TopicPartition("a", 10), TopicPartition("b", 0)]


# --- discovery ----------------------------------------------------------------------------------


@pytest.fixture
def log_dir(tmp_path: Path) -> Path:
    root = tmp_path / "kafka-logs"
    for name in ["orders-10", "orders-2", "clicks.v2-0", "my-dashed-topic-1"]:
        touch(root / name)
    for name in [f"orders-3.{UNIQUE_ID}-delete", f"orders-4.{UNIQUE_ID}-future", f"orders-5.{UNIQUE_ID}-stray",
                 "__cluster_metadata-0", "remote-log-index-cache", "lost+found"]:
        touch(root / name)
    touch(root, "meta.properties", "replication-offset-checkpoint", ".lock", "cleaner-offset-checkpoint")
    return root


def test_discovery_finds_live_partitions_sorted_by_topic_and_partition(log_dir: Path):
    found = discover_partitions(log_dir)
    assert [p.topic_partition for p in found] == [
        TopicPartition("clicks.v2", 0),
        TopicPartition("my-dashed-topic", 1),
        TopicPartition("orders", 2),
        TopicPartition("orders", 10),
    ]
    assert all(p.path == log_dir / p.topic_partition.dir_name for p in found)


def test_discovery_reports_every_skipped_directory_with_its_reason(log_dir: Path):
    skipped = dict(discover(log_dir).skipped)
    assert set(skipped) == {
        f"orders-3.{UNIQUE_ID}-delete", f"orders-4.{UNIQUE_ID}-future", f"orders-5.{UNIQUE_ID}-stray",
        "__cluster_metadata-0", "remote-log-index-cache", "lost+found",
    }
    deleted = skipped[f"orders-3.{UNIQUE_ID}-delete"]
    assert "orders-3" in deleted and "deletion" in deleted
    assert "future" in skipped[f"orders-4.{UNIQUE_ID}-future"]
    assert "stray" in skipped[f"orders-5.{UNIQUE_ID}-stray"]
    assert "KRaft" in skipped["__cluster_metadata-0"]
    assert "not a partition directory" in skipped["lost+found"]


def test_plain_files_in_the_log_dir_are_neither_partitions_nor_skips(log_dir: Path):
    names = {s.name for s in discover(log_dir).skipped} | {p.path.name for p in discover(log_dir).partitions}
    assert "meta.properties" not in names and "replication-offset-checkpoint" not in names


# --- segments -----------------------------------------------------------------------------------


@pytest.fixture
def partition_dir(tmp_path: Path) -> Path:
    d = tmp_path / "orders-0"
    touch(d, *segment_files(0, ".log", ".index", ".timeindex"))
    touch(d, *segment_files(250, ".log", ".index", ".timeindex"))  # listed out of order on purpose
    touch(d, *segment_files(100, ".log", ".index", ".timeindex", ".txnindex"))
    touch(d, *segment_files(100, ".snapshot"), *segment_files(250, ".snapshot"))
    touch(d, "leader-epoch-checkpoint", "partition.metadata")
    return d


def test_segments_are_listed_in_base_offset_order_and_the_last_is_active(partition_dir: Path):
    segments = list_segments(partition_dir)
    assert [s.base_offset for s in segments] == [0, 100, 250]
    assert [s.active for s in segments] == [False, False, True]
    assert [s.next_base_offset for s in segments] == [100, 250, None]


def test_segment_files_name_the_log_and_its_indexes(partition_dir: Path):
    first, second, _ = list_segments(partition_dir)
    assert second.log == partition_dir / "00000000000000000100.log"
    assert second.offset_index == partition_dir / "00000000000000000100.index"
    assert second.time_index == partition_dir / "00000000000000000100.timeindex"
    assert second.txn_index == partition_dir / "00000000000000000100.txnindex"
    assert first.txn_index is None  # absent, so None


def test_a_single_segment_is_the_active_one(tmp_path: Path):
    touch(tmp_path / "t-0", *segment_files(0, ".log"))
    (only,) = list_segments(tmp_path / "t-0")
    assert only.active and only.next_base_offset is None


def test_an_empty_partition_dir_has_no_segments(tmp_path: Path):
    touch(tmp_path / "t-0")
    assert list_segments(tmp_path / "t-0") == []


@pytest.mark.parametrize("suffix", [".deleted", ".cleaned", ".swap"])
def test_deleted_cleaned_and_swap_files_are_never_live_segments(partition_dir: Path, suffix: str):
    # A higher base offset that would otherwise become the active segment.
    touch(partition_dir, *(name + suffix for name in segment_files(900, ".log", ".index", ".timeindex")))
    touch(partition_dir, offset_file_name(0, ".log") + suffix)
    scan = scan_partition_dir(partition_dir)
    assert [s.base_offset for s in scan.segments] == [0, 100, 250]
    assert scan.segments[-1].active and scan.segments[-1].base_offset == 250
    skipped = dict(scan.skipped)
    assert offset_file_name(900, ".log") + suffix in skipped
    assert suffix in skipped[offset_file_name(0, ".log") + suffix]


def test_tmp_files_from_unfinished_writes_are_skipped(partition_dir: Path):
    touch(partition_dir, "leader-epoch-checkpoint.tmp", "partition.metadata.tmp")
    skipped = dict(scan_partition_dir(partition_dir).skipped)
    assert "unfinished write" in skipped["leader-epoch-checkpoint.tmp"]
    assert "partition.metadata.tmp" in skipped


def test_a_log_file_without_a_20_digit_name_is_skipped_with_a_reason(partition_dir: Path):
    touch(partition_dir, "42.log")
    scan = scan_partition_dir(partition_dir)
    assert 42 not in [s.base_offset for s in scan.segments]
    assert "20-digit" in dict(scan.skipped)["42.log"]


def test_an_index_without_its_log_is_reported_as_orphaned(partition_dir: Path):
    touch(partition_dir, *segment_files(500, ".index", ".timeindex"))
    scan = scan_partition_dir(partition_dir)
    assert [s.base_offset for s in scan.segments] == [0, 100, 250]
    assert "orphaned" in dict(scan.skipped)["00000000000000000500.index"]


def test_unknown_files_are_reported_and_known_partition_files_are_not(partition_dir: Path):
    touch(partition_dir, "notes.txt")
    skipped = dict(scan_partition_dir(partition_dir).skipped)
    assert set(skipped) == {"notes.txt"}


def test_producer_snapshots_are_listed_by_offset(partition_dir: Path):
    touch(partition_dir, offset_file_name(50, ".snapshot") + ".deleted")
    assert list_producer_snapshots(partition_dir) == {
        100: partition_dir / "00000000000000000100.snapshot",
        250: partition_dir / "00000000000000000250.snapshot",
    }


# --- PartitionDir and LogDir --------------------------------------------------------------------


def test_partition_dir_reads_its_lineage_metadata_segments_and_snapshots(partition_dir: Path):
    write_leader_epoch_checkpoint(partition_dir / "leader-epoch-checkpoint", [EpochEntry(0, 0), EpochEntry(2, 180)])
    topic_id = uuid.uuid4()
    write_partition_metadata(partition_dir / "partition.metadata", PartitionMetadata(0, topic_id))
    p = PartitionDir.at(partition_dir)
    assert p.topic_partition == TopicPartition("orders", 0)
    assert p.leader_epochs() == [EpochEntry(0, 0), EpochEntry(2, 180)]
    assert p.metadata() == PartitionMetadata(0, topic_id)
    assert [s.base_offset for s in p.segments()] == [0, 100, 250]
    assert list(p.snapshots()) == [100, 250]
    assert p.producer_snapshot_path(250) == partition_dir / "00000000000000000250.snapshot"


def test_a_partition_without_lineage_or_metadata_reads_as_empty(tmp_path: Path):
    p = PartitionDir.at(tmp_path / "orders-0")
    assert p.leader_epochs() == []
    assert p.metadata() is None
    with pytest.raises(MissingCheckpointError):
        p.leader_epochs(missing_ok=False)


def test_partition_dir_refuses_a_directory_marked_for_deletion(tmp_path: Path):
    with pytest.raises(ValueError, match="deletion"):
        PartitionDir.at(tmp_path / f"orders-0.{UNIQUE_ID}-delete")


def test_log_dir_reads_high_watermark_recovery_point_and_log_start_offset(log_dir: Path):
    tp = TopicPartition("orders", 2)
    write_offset_checkpoint(log_dir / "replication-offset-checkpoint", {tp: 500})
    write_offset_checkpoint(log_dir / "recovery-point-offset-checkpoint", {tp: 450})
    write_offset_checkpoint(log_dir / "log-start-offset-checkpoint", {tp: 100})
    logs = LogDir(log_dir)
    assert logs.high_watermark(tp) == 500
    assert logs.recovery_point(tp) == 450
    assert logs.log_start_offset(tp) == 100
    assert logs.high_watermark(TopicPartition("orders", 10)) is None
    assert [p.topic_partition for p in logs.partitions()][-1] == TopicPartition("orders", 10)
    assert logs.partition_dir(tp).path == log_dir / "orders-2"


def test_a_missing_checkpoint_reads_as_empty_with_a_note(tmp_path: Path):
    logs = LogDir(tmp_path)
    checkpoint = logs.log_start_offsets()
    assert checkpoint.offsets == {} and checkpoint.missing
    assert "missing" in checkpoint.note and "log-start-offset-checkpoint" in checkpoint.note
    assert logs.recovery_point(TopicPartition("orders", 0)) is None


def test_a_malformed_log_dir_checkpoint_still_raises(tmp_path: Path):
    (tmp_path / "replication-offset-checkpoint").write_bytes(b"0\n2\norders 0 5\n")
    with pytest.raises(CheckpointError, match="line 2"):
        LogDir(tmp_path).high_watermarks()


def test_a_checkpoint_is_parsed_again_only_after_the_broker_replaced_it(tmp_path, monkeypatch):
    """A pass asks for thousands of partitions' offsets: each must not parse the whole checkpoint."""
    import kts_resources.kafka.logdir as logdir

    parses = []
    parse = logdir.read_offset_checkpoint
    monkeypatch.setattr(logdir, "read_offset_checkpoint", lambda path: parses.append(path) or parse(path))
    orders = [TopicPartition("orders", p) for p in range(3)]
    write_offset_checkpoint(tmp_path / "replication-offset-checkpoint", {tp: 10 * tp.partition for tp in orders})
    log_dir = LogDir(tmp_path)
    assert [log_dir.high_watermark(tp) for tp in orders] == [0, 10, 20]
    assert len(parses) == 1
    write_offset_checkpoint(tmp_path / "replication-offset-checkpoint", {tp: 99 for tp in orders})  # renamed over it
    assert [log_dir.high_watermark(tp) for tp in orders] == [99, 99, 99]
    assert len(parses) == 2
    with pytest.raises(TypeError):
        log_dir.high_watermarks().offsets[orders[0]] = 1  # shared between callers: read-only
