"""Producer state snapshots (<offset>.snapshot) and transaction indexes (.txnindex): byte-exact
encoding derived field by field from Kafka's layout, round trips, and corruption (bad CRC, wrong
version, truncation, count mismatches, partial entries) reported with the file and byte position."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
from crc32c import crc32c
from hypothesis import given, settings
from hypothesis import strategies as st

from kts_resources.kafka.errors import CheckpointError, IndexFormatError
from kts_resources.kafka.snapshots import (
    PRODUCER_ENTRY_SIZE,
    SNAPSHOT_HEADER_SIZE,
    TXN_INDEX_ENTRY_SIZE,
    AbortedTxn,
    ProducerSnapshotEntry,
    decode_aborted_txns,
    decode_producer_snapshot,
    encode_aborted_txns,
    encode_producer_snapshot,
    read_producer_snapshot,
    read_txn_index,
    write_producer_snapshot,
    write_txn_index,
)


int16s = st.integers(-(2**15), 2**15 - 1)
int32s = st.integers(-(2**31), 2**31 - 1)
int64s = st.integers(-(2**63), 2**63 - 1)
producer_entries = st.builds(ProducerSnapshotEntry, int64s, int16s, int32s, int64s, int32s, int64s, int32s, int64s)
aborted_txns = st.builds(AbortedTxn, int64s, int64s, int64s, int64s)

IDEMPOTENT = ProducerSnapshotEntry(
    producer_id=1000, producer_epoch=3, last_sequence=41, last_offset=1234, offset_delta=4,
    timestamp=1_700_000_000_000, coordinator_epoch=-1, current_txn_first_offset=-1,
)
TRANSACTIONAL = ProducerSnapshotEntry(
    producer_id=2000, producer_epoch=0, last_sequence=9, last_offset=1300, offset_delta=9,
    timestamp=1_700_000_000_500, coordinator_epoch=5, current_txn_first_offset=1290,
)

# Derived by hand from the layout: version int16 | crc uint32 | count int32 | 46-byte entries.
EXPECTED_SNAPSHOT = bytes.fromhex(
    "0001"  # version 1
    "27d881d1"  # CRC-32C of everything from the count on
    "00000002"  # two entries
    # producerId, epoch, lastSequence, lastOffset, offsetDelta, timestamp, coordinatorEpoch, currentTxnFirstOffset
    "00000000000003e8" "0003" "00000029" "00000000000004d2" "00000004" "0000018bcfe56800" "ffffffff" "ffffffffffffffff"
    "00000000000007d0" "0000" "00000009" "0000000000000514" "00000009" "0000018bcfe569f4" "00000005" "000000000000050a"
)


# --- producer snapshots -------------------------------------------------------------------------


def test_crc32c_is_the_castagnoli_polynomial():
    # The standard check value for CRC-32C; CRC-32 (zlib) would give 0xcbf43926.
    assert crc32c(b"123456789") == 0xE3069283


def test_producer_snapshot_encodes_byte_for_byte_as_kafkas_layout():
    encoded = encode_producer_snapshot([IDEMPOTENT, TRANSACTIONAL])
    assert len(encoded) == SNAPSHOT_HEADER_SIZE + 2 * PRODUCER_ENTRY_SIZE == 102
    assert encoded == EXPECTED_SNAPSHOT
    # The CRC covers bytes [6, end): the count and the entries, not the version.
    assert struct.unpack_from(">I", encoded, 2)[0] == crc32c(encoded[6:])


def test_producer_snapshot_decodes_kafkas_bytes():
    assert decode_producer_snapshot(EXPECTED_SNAPSHOT) == [IDEMPOTENT, TRANSACTIONAL]


def test_an_empty_producer_snapshot_is_a_header_with_count_zero():
    # CRC-32C of four zero bytes is 0x48674bc7.
    assert encode_producer_snapshot([]) == bytes.fromhex("0001" "48674bc7" "00000000")
    assert decode_producer_snapshot(encode_producer_snapshot([])) == []


def test_only_a_producer_with_a_first_offset_has_an_ongoing_transaction():
    assert TRANSACTIONAL.has_ongoing_txn and not IDEMPOTENT.has_ongoing_txn


@settings(max_examples=100)
@given(st.lists(producer_entries, max_size=10))
def test_producer_snapshots_round_trip(entries: list[ProducerSnapshotEntry]):
    assert decode_producer_snapshot(encode_producer_snapshot(entries)) == entries


def test_producer_snapshot_round_trips_through_an_atomically_written_file(tmp_path: Path):
    path = tmp_path / "00000000000000001300.snapshot"
    write_producer_snapshot(path, [IDEMPOTENT, TRANSACTIONAL])
    assert path.read_bytes() == EXPECTED_SNAPSHOT
    assert read_producer_snapshot(path) == [IDEMPOTENT, TRANSACTIONAL]
    assert [p.name for p in tmp_path.iterdir()] == [path.name]


def test_producer_snapshot_with_a_flipped_bit_fails_its_crc_naming_the_file(tmp_path: Path):
    corrupt = bytearray(EXPECTED_SNAPSHOT)
    corrupt[40] ^= 0x01
    path = tmp_path / "00000000000000001300.snapshot"
    path.write_bytes(corrupt)
    with pytest.raises(CheckpointError) as caught:
        read_producer_snapshot(path)
    assert caught.value.position == 2  # the stored CRC
    assert "CRC" in str(caught.value) and str(path) in str(caught.value)


def test_producer_snapshot_of_an_unknown_version_is_rejected_at_byte_0():
    with pytest.raises(CheckpointError, match="version 2") as caught:
        decode_producer_snapshot(b"\x00\x02" + EXPECTED_SNAPSHOT[2:])
    assert caught.value.position == 0


def test_producer_snapshot_truncated_inside_an_entry_names_that_entrys_position():
    truncated = EXPECTED_SNAPSHOT[: SNAPSHOT_HEADER_SIZE + PRODUCER_ENTRY_SIZE + 20]
    with pytest.raises(CheckpointError, match="truncated") as caught:
        decode_producer_snapshot(truncated, path="p/00000000000000001300.snapshot")
    assert caught.value.position == SNAPSHOT_HEADER_SIZE + PRODUCER_ENTRY_SIZE
    assert caught.value.path == "p/00000000000000001300.snapshot"


@pytest.mark.parametrize("length, position", [(0, 0), (1, 0), (4, 2), (7, 6)])
def test_producer_snapshot_truncated_in_its_header_is_rejected(length: int, position: int):
    with pytest.raises(CheckpointError, match="truncated") as caught:
        decode_producer_snapshot(EXPECTED_SNAPSHOT[:length])
    assert caught.value.position == position


def test_producer_snapshot_whose_count_exceeds_its_entries_is_rejected():
    data = bytearray(EXPECTED_SNAPSHOT)
    struct.pack_into(">i", data, 6, 3)
    with pytest.raises(CheckpointError, match="count says 3") as caught:
        decode_producer_snapshot(bytes(data))
    assert caught.value.position == len(EXPECTED_SNAPSHOT)  # where the missing third entry would start


def test_producer_snapshot_with_bytes_beyond_its_count_is_rejected():
    data = bytearray(EXPECTED_SNAPSHOT)
    struct.pack_into(">i", data, 6, 1)
    with pytest.raises(CheckpointError, match="count says 1") as caught:
        decode_producer_snapshot(bytes(data))
    assert caught.value.position == SNAPSHOT_HEADER_SIZE + PRODUCER_ENTRY_SIZE


def test_producer_snapshot_with_a_negative_count_is_rejected_at_the_count():
    data = bytearray(EXPECTED_SNAPSHOT)
    struct.pack_into(">i", data, 6, -1)
    with pytest.raises(CheckpointError, match="negative") as caught:
        decode_producer_snapshot(bytes(data))
    assert caught.value.position == 6


def test_producer_snapshot_entries_outside_the_field_widths_are_refused():
    with pytest.raises(ValueError, match="does not fit"):
        encode_producer_snapshot([ProducerSnapshotEntry(1, 2**15, 0, 0, 0, 0, 0)])


# --- transaction index --------------------------------------------------------------------------


def test_aborted_txn_encodes_as_34_bytes_version_then_four_int64s():
    txn = AbortedTxn(producer_id=7, first_offset=100, last_offset=120, last_stable_offset=95)
    assert encode_aborted_txns([txn]) == bytes.fromhex(
        "0000" "0000000000000007" "0000000000000064" "0000000000000078" "000000000000005f"
    )
    assert TXN_INDEX_ENTRY_SIZE == 34


@settings(max_examples=100)
@given(st.lists(aborted_txns, max_size=10))
def test_transaction_indexes_round_trip(txns: list[AbortedTxn]):
    assert decode_aborted_txns(encode_aborted_txns(txns)) == txns


def test_an_empty_transaction_index_has_no_aborted_txns():
    assert decode_aborted_txns(b"") == []


def test_transaction_index_round_trips_through_a_file(tmp_path: Path):
    path = tmp_path / "00000000000000000100.txnindex"
    txns = [AbortedTxn(7, 100, 120, 95), AbortedTxn(8, 130, 131, 121)]
    write_txn_index(path, txns)
    assert read_txn_index(path) == txns


def test_transaction_index_with_a_partial_entry_names_the_partial_entrys_position(tmp_path: Path):
    path = tmp_path / "00000000000000000100.txnindex"
    path.write_bytes(encode_aborted_txns([AbortedTxn(7, 100, 120, 95)] * 2) + b"\x00" * 10)
    with pytest.raises(IndexFormatError) as caught:
        read_txn_index(path)
    assert caught.value.position == 2 * TXN_INDEX_ENTRY_SIZE
    assert "not a multiple of 34" in str(caught.value) and str(path) in str(caught.value)


def test_transaction_index_entry_with_an_unknown_version_is_rejected_at_that_entry():
    data = bytearray(encode_aborted_txns([AbortedTxn(7, 100, 120, 95)] * 3))
    struct.pack_into(">h", data, TXN_INDEX_ENTRY_SIZE, 1)
    with pytest.raises(IndexFormatError, match="entry 1 has unknown version 1") as caught:
        decode_aborted_txns(bytes(data))
    assert caught.value.position == TXN_INDEX_ENTRY_SIZE
