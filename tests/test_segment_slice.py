"""A segment cut where a new leader's copy starts (kts_resources/tiering/segment_slice.py): the batches from
the first one reaching the offset, byte for byte, with the indexes a broker would write for a segment
with that base offset and the aborted transactions whose markers it holds."""

from __future__ import annotations

import pytest

from kts_resources.kafka.indexes import rebuild_indexes, verify_segment_indexes
from kts_resources.kafka.logdir import LogDir
from kts_resources.kafka.records import scan_batches
from kts_resources.kafka.simulator.simulate import SimulationConfig, simulate
from kts_resources.kafka.snapshots import read_txn_index
from kts_resources.tiering.segment_slice import SliceError, slice_segment


@pytest.fixture
def segment_with_aborts(tmp_path):
    simulate(tmp_path / "logs", SimulationConfig(seed=11, topics=("orders",), partitions=1, segment_bytes=64 * 1024,
                                                 total_bytes=400 * 1024, transactional_ratio=0.5, abort_ratio=0.6))
    [partition] = LogDir(tmp_path / "logs").partitions()
    closed = [s for s in partition.segments() if not s.active]
    return next(s for s in closed if s.txn_index is not None and read_txn_index(s.txn_index))


def test_a_cut_inside_a_batch_starts_at_that_batch_and_keeps_its_bytes(segment_with_aborts, tmp_path):
    segment = segment_with_aborts
    data = segment.log.read_bytes()
    batches = scan_batches(data).batches
    inside = next(b for b in batches[len(batches) // 2:] if b.last_offset > b.base_offset)

    cut = slice_segment(segment, inside.base_offset + 1, temp_dir=tmp_path)

    try:
        assert cut.base_offset == inside.base_offset and cut.files.log.name == f"{inside.base_offset:020d}.log"
        assert cut.files.log.read_bytes() == data[inside.position:]
        assert cut.size == len(data) - inside.position and cut.last_offset == batches[-1].last_offset
        rebuilt = rebuild_indexes(data[inside.position:], inside.base_offset)
        assert cut.files.offset_index.read_bytes() == rebuilt.offset_index
        assert cut.files.time_index.read_bytes() == rebuilt.time_index
        assert verify_segment_indexes(cut.files.log, closed=True) == []
        kept = [t for t in read_txn_index(segment.txn_index) if t.last_offset >= inside.base_offset]
        assert (read_txn_index(cut.files.txn_index) if cut.files.txn_index else []) == kept
        assert cut.max_timestamp == max(b.max_timestamp for b in batches if b.position >= inside.position)
    finally:
        cut.remove()
    assert not cut.directory.exists()
    assert segment.log.read_bytes() == data  # the broker's file is only read


def test_an_offset_past_the_segment_is_one_error_line(segment_with_aborts, tmp_path):
    past = scan_batches(segment_with_aborts.log.read_bytes()).batches[-1].last_offset + 1
    with pytest.raises(SliceError, match=rf"no batch holds offset {past} or later"):
        slice_segment(segment_with_aborts, past, temp_dir=tmp_path)
    assert list(tmp_path.glob("kts-segment-slice-*")) == []
