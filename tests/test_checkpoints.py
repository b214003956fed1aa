"""Kafka's text checkpoint files and partition.metadata: the exact bytes kts writes, what it accepts
when reading (no more than Kafka's reader does), errors that name the file and the line, the
distinct "missing" error, atomic replacement, and the leader-epoch lineage helpers."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kts_resources.kafka import checkpoints
from kts_resources.kafka.checkpoints import (
    EpochEntry,
    MissingCheckpointError,
    PartitionMetadata,
    decode_partition_metadata,
    encode_partition_metadata,
    epoch_for_offset,
    epochs_up_to,
    format_leader_epoch_checkpoint,
    format_offset_checkpoint,
    parse_leader_epoch_checkpoint,
    parse_offset_checkpoint,
    read_leader_epoch_checkpoint,
    read_offset_checkpoint,
    read_partition_metadata,
    topic_id_from_base64,
    topic_id_to_base64,
    write_atomically,
    write_leader_epoch_checkpoint,
    write_offset_checkpoint,
    write_partition_metadata,
)
from kts_resources.kafka.errors import CheckpointError
from kts_resources.kafka.partition import TopicPartition

topics = st.from_regex(r"[a-zA-Z0-9._-]{1,40}", fullmatch=True).filter(lambda t: t not in (".", ".."))
partitions = st.integers(0, 2**31 - 1)
int64s = st.integers(-(2**63), 2**63 - 1)
topic_partitions = st.builds(TopicPartition, topics, partitions)


# --- the CheckpointFile format --------------------------------------------------------------------


def test_offset_checkpoint_is_written_as_version_count_then_one_sorted_entry_per_line(tmp_path: Path):
    path = tmp_path / "replication-offset-checkpoint"
    write_offset_checkpoint(path, {TopicPartition("orders", 1): 42, TopicPartition("clicks.v2", 0): 7})
    assert path.read_bytes() == b"0\n2\nclicks.v2 0 7\norders 1 42\n"


@settings(max_examples=50)
@given(st.dictionaries(topic_partitions, int64s, max_size=20))
def test_offset_checkpoints_round_trip(offsets: dict[TopicPartition, int]):
    assert parse_offset_checkpoint(format_offset_checkpoint(offsets)) == offsets


def test_offset_checkpoint_reads_kafkas_bytes(tmp_path: Path):
    path = tmp_path / "recovery-point-offset-checkpoint"
    path.write_bytes(b"0\n3\n__consumer_offsets 22 0\nmy-topic.v1 0 1500\nmy-topic.v1 11 9\n")
    assert read_offset_checkpoint(path) == {
        TopicPartition("__consumer_offsets", 22): 0,
        TopicPartition("my-topic.v1", 0): 1500,
        TopicPartition("my-topic.v1", 11): 9,
    }


def test_an_empty_checkpoint_file_has_no_entries_as_in_kafka():
    # Kafka creates checkpoint files empty before their first write.
    assert parse_offset_checkpoint(b"") == {}
    assert parse_offset_checkpoint(b"0\n") == {}


def test_checkpoint_lines_may_end_in_crlf():
    assert parse_leader_epoch_checkpoint(b"0\r\n1\r\n3 100\r\n") == [EpochEntry(3, 100)]


def test_checkpoint_without_a_final_newline_is_still_whole():
    assert parse_leader_epoch_checkpoint(b"0\n1\n3 100") == [EpochEntry(3, 100)]


def test_checkpoint_with_wrong_entry_count_names_the_file_and_line(tmp_path: Path):
    path = tmp_path / "replication-offset-checkpoint"
    path.write_bytes(b"0\n3\norders 0 5\norders 1 6\n")
    with pytest.raises(CheckpointError) as caught:
        read_offset_checkpoint(path)
    error = caught.value
    assert error.path == str(path)
    assert error.position == 2  # the count line starts at byte 2
    assert "line 2" in str(error) and str(path) in str(error)
    assert "3" in error.message and "2 entry lines" in error.message


def test_checkpoint_with_more_entries_than_its_count_is_rejected_at_the_count_line():
    with pytest.raises(CheckpointError) as caught:
        parse_leader_epoch_checkpoint(b"0\n1\n0 0\n1 10\n")
    assert caught.value.position == 2 and "line 2" in str(caught.value)


def test_malformed_entry_names_its_line_number_and_byte_position(tmp_path: Path):
    path = tmp_path / "log-start-offset-checkpoint"
    data = b"0\n2\norders 0 5\norders one 6\n"
    path.write_bytes(data)
    with pytest.raises(CheckpointError) as caught:
        read_offset_checkpoint(path)
    assert caught.value.position == data.index(b"orders one")
    assert "line 4" in str(caught.value)
    assert "partition 'one'" in str(caught.value)


@pytest.mark.parametrize(
    "entry",
    [
        b"orders 0",  # too few fields
        b"orders 0 5 6",  # too many fields
        b" orders 0 5",  # Kafka's split keeps a leading empty field
        b"orders 0 1_000",  # Python would read this; Long.parseLong would not
        b"orders 0 9223372036854775808",  # beyond int64
        b"orders 2147483648 0",  # partition beyond int32
        b"",  # a blank entry line
    ],
)
def test_offset_entries_must_be_topic_partition_offset_in_java_integer_syntax(entry: bytes):
    with pytest.raises(CheckpointError, match="line 3"):
        parse_offset_checkpoint(b"0\n1\n" + entry + b"\n")


def test_checkpoint_with_an_unknown_version_is_rejected_at_line_1():
    with pytest.raises(CheckpointError) as caught:
        parse_offset_checkpoint(b"1\n0\n")
    assert caught.value.position == 0 and "line 1" in str(caught.value) and "version 1" in str(caught.value)


@pytest.mark.parametrize("data", [b"zero\n0\n", b"0\nmany\n", b"0\n-1\n"])
def test_checkpoint_header_lines_must_be_integers(data: bytes):
    with pytest.raises(CheckpointError, match="line [12]"):
        parse_offset_checkpoint(data)


def test_checkpoint_that_is_not_utf8_names_the_line():
    with pytest.raises(CheckpointError, match="line 3: not UTF-8"):
        parse_offset_checkpoint(b"0\n1\n\xff 0 0\n")


def test_a_missing_checkpoint_is_a_distinct_file_not_found_error(tmp_path: Path):
    path = tmp_path / "leader-epoch-checkpoint"
    with pytest.raises(MissingCheckpointError) as caught:
        read_leader_epoch_checkpoint(path)
    assert isinstance(caught.value, FileNotFoundError)
    assert isinstance(caught.value, CheckpointError)
    assert "missing" in str(caught.value) and str(path) in str(caught.value)


def test_writers_reject_values_the_format_cannot_carry():
    with pytest.raises(ValueError):
        format_offset_checkpoint({TopicPartition("has space", 0): 1})
    with pytest.raises(ValueError):
        format_offset_checkpoint({TopicPartition("orders", 0): 2**63})
    with pytest.raises(ValueError):
        format_leader_epoch_checkpoint([EpochEntry(2**31, 0)])


# --- atomic writes ------------------------------------------------------------------------------


def test_checkpoint_writes_replace_the_file_and_leave_no_tmp(tmp_path: Path):
    path = tmp_path / "leader-epoch-checkpoint"
    (tmp_path / "leader-epoch-checkpoint.tmp").write_bytes(b"left over from a crash")
    write_leader_epoch_checkpoint(path, [EpochEntry(0, 0)])
    write_leader_epoch_checkpoint(path, [EpochEntry(0, 0), EpochEntry(1, 50)])
    assert path.read_bytes() == b"0\n2\n0 0\n1 50\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["leader-epoch-checkpoint"]


def test_atomic_write_fsyncs_the_file_and_then_the_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    synced: list[str] = []
    real_fsync = os.fsync

    def recording_fsync(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}") if os.path.exists("/proc/self/fd") else str(fd))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    write_atomically(tmp_path / "f", b"x")
    assert len(synced) == 2
    if os.path.exists("/proc/self/fd"):
        assert synced == [str(tmp_path / "f.tmp"), str(tmp_path)]


def test_a_failed_write_keeps_the_old_checkpoint_and_removes_the_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    path = tmp_path / "replication-offset-checkpoint"
    write_offset_checkpoint(path, {TopicPartition("orders", 0): 1})
    before = path.read_bytes()

    def failing_replace(src, dst):
        raise OSError("disk gone")

    monkeypatch.setattr(checkpoints.os, "replace", failing_replace)
    with pytest.raises(OSError, match="disk gone"):
        write_offset_checkpoint(path, {TopicPartition("orders", 0): 2})
    assert path.read_bytes() == before
    assert not (tmp_path / "replication-offset-checkpoint.tmp").exists()


# --- leader-epoch-checkpoint --------------------------------------------------------------------


@settings(max_examples=50)
@given(st.lists(st.builds(EpochEntry, st.integers(-(2**31), 2**31 - 1), int64s), max_size=20))
def test_leader_epoch_checkpoints_round_trip_in_order(entries: list[EpochEntry]):
    assert parse_leader_epoch_checkpoint(format_leader_epoch_checkpoint(entries)) == entries


def test_leader_epoch_checkpoint_round_trips_through_a_file(tmp_path: Path):
    path = tmp_path / "leader-epoch-checkpoint"
    entries = [EpochEntry(0, 0), EpochEntry(2, 120), EpochEntry(5, 300)]
    write_leader_epoch_checkpoint(path, entries)
    assert read_leader_epoch_checkpoint(path) == entries


def test_leader_epoch_entry_must_have_two_fields():
    with pytest.raises(CheckpointError, match="line 4"):
        parse_leader_epoch_checkpoint(b"0\n2\n0 0\n1 10 extra\n")


def test_a_segments_lineage_holds_the_epochs_that_start_at_or_before_its_end_offset():
    lineage = [EpochEntry(0, 0), EpochEntry(1, 100), EpochEntry(3, 200), EpochEntry(4, 350)]
    assert epochs_up_to(lineage, 199) == lineage[:2]
    assert epochs_up_to(lineage, 200) == lineage[:3]  # an epoch starting at the last offset belongs
    assert epochs_up_to(lineage, 10_000) == lineage


def test_the_epoch_of_an_offset_is_the_last_one_starting_at_or_before_it():
    lineage = [EpochEntry(0, 0), EpochEntry(1, 100), EpochEntry(3, 200)]
    assert epoch_for_offset(lineage, 0) == 0
    assert epoch_for_offset(lineage, 199) == 1
    assert epoch_for_offset(lineage, 200) == 3
    assert epoch_for_offset([EpochEntry(2, 50)], 10) is None


# --- partition.metadata -------------------------------------------------------------------------


def test_topic_ids_are_base64url_without_padding_like_kafkas_uuid_to_string():
    # Kafka's Uuid.METADATA_TOPIC_ID (0, 1) prints as "AAAAAAAAAAAAAAAAAAAAAQ".
    assert topic_id_to_base64(uuid.UUID(int=1)) == "AAAAAAAAAAAAAAAAAAAAAQ"
    assert topic_id_from_base64("AAAAAAAAAAAAAAAAAAAAAQ") == uuid.UUID(int=1)
    # URL-safe alphabet: '-' and '_' rather than '+' and '/'.
    all_ones = uuid.UUID(int=2**128 - 1)
    assert topic_id_to_base64(all_ones) == "_____________________w"


@given(st.uuids())
def test_topic_ids_round_trip_through_base64(topic_id: uuid.UUID):
    text = topic_id_to_base64(topic_id)
    assert len(text) == 22
    assert topic_id_from_base64(text) == topic_id


@pytest.mark.parametrize("text", ["", "AAAA", "AAAAAAAAAAAAAAAAAAAAA+", "AAAAAAAAAAAAAAAAAAAAAQA", "AAAAAAAAAAAAAAAAAAAA/Q"])
def test_topic_ids_that_are_not_16_bytes_of_base64url_are_rejected(text: str):
    with pytest.raises(ValueError):
        topic_id_from_base64(text)


def test_partition_metadata_is_written_exactly_as_kafka_writes_it(tmp_path: Path):
    path = tmp_path / "partition.metadata"
    write_partition_metadata(path, PartitionMetadata(0, uuid.UUID(int=1)))
    assert path.read_bytes() == b"version: 0\ntopic_id: AAAAAAAAAAAAAAAAAAAAAQ"
    assert read_partition_metadata(path) == PartitionMetadata(0, uuid.UUID(int=1))


@given(st.uuids().filter(lambda u: u.int != 0))
def test_partition_metadata_round_trips(topic_id: uuid.UUID):
    metadata = PartitionMetadata(0, topic_id)
    assert decode_partition_metadata(encode_partition_metadata(metadata)) == metadata


def test_partition_metadata_accepts_a_trailing_newline_and_later_versions():
    # Kafka accepts any version >= 0 so that a downgraded broker can still read the file.
    assert decode_partition_metadata(b"version: 1\ntopic_id: AAAAAAAAAAAAAAAAAAAAAQ\n").version == 1


def test_partition_metadata_with_the_zero_uuid_is_rejected_at_line_2():
    data = b"version: 0\ntopic_id: AAAAAAAAAAAAAAAAAAAAAA"
    with pytest.raises(CheckpointError, match="line 2") as caught:
        decode_partition_metadata(data, path="p/partition.metadata")
    assert caught.value.position == data.index(b"topic_id")
    assert "p/partition.metadata" in str(caught.value)


@pytest.mark.parametrize(
    "data, line",
    [
        (b"version 0\ntopic_id: AAAAAAAAAAAAAAAAAAAAAQ", 1),
        (b"version: zero\ntopic_id: AAAAAAAAAAAAAAAAAAAAAQ", 1),
        (b"version: -1\ntopic_id: AAAAAAAAAAAAAAAAAAAAAQ", 1),
        (b"version: 0\n", 2),
        (b"version: 0\ntopic: AAAAAAAAAAAAAAAAAAAAAQ", 2),
        (b"version: 0\ntopic_id: not-a-topic-id", 2),
    ],
)
def test_malformed_partition_metadata_names_the_line(data: bytes, line: int):
    with pytest.raises(CheckpointError, match=f"line {line}"):
        decode_partition_metadata(data)


def test_missing_partition_metadata_is_a_missing_checkpoint(tmp_path: Path):
    with pytest.raises(MissingCheckpointError, match="missing partition.metadata"):
        read_partition_metadata(tmp_path / "partition.metadata")
