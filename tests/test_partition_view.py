"""One partition view (kts_resources.tiering.partition_view): reads, `kts status` and retention
plans see a partition's offsets alike, whatever its checkpoints say."""

from __future__ import annotations

from kts_resources.kafka.checkpoints import REPLICATION_OFFSET_CHECKPOINT, read_offset_checkpoint, write_offset_checkpoint
from kts_resources.kafka.simulator.simulate import SimulationConfig, simulate
from kts_resources.reading.reader import PartitionReader
from kts_resources.tiering.partition_view import partition_tiers, partition_view, tiers_of
from kts_resources.tiering.tiers import active_log_end_offset, locate_partitions


def _one_partition(tmp_path):
    root = tmp_path / "logs"
    simulate(root, SimulationConfig(seed=5, topics=("orders",), partitions=1, total_bytes=160 * 1024, segment_bytes=48 * 1024))
    located, _ = locate_partitions([root], ["orders-0"])
    return root, located["orders-0"]


def test_a_high_watermark_checkpointed_past_the_log_end_is_the_log_end_for_reads_status_and_tiers(tmp_path):
    """A replication-offset-checkpoint can run ahead of a log the broker truncated since: a read
    never serves past the log end offset, and status and the tier numbers say the same."""
    root, loc = _one_partition(tmp_path)
    tp = loc.partition.topic_partition
    log_end = active_log_end_offset(loc.partition.segments())
    checkpoint = root / REPLICATION_OFFSET_CHECKPOINT
    write_offset_checkpoint(checkpoint, {**read_offset_checkpoint(checkpoint), tp: log_end + 100})

    reader = PartitionReader(tp.topic, tp.partition, located=loc, store=None, rsm=None, index_dir=None)
    assert reader.high_watermark == log_end
    assert tiers_of(partition_view(loc, None)).high_watermark == log_end
    assert partition_tiers(loc).high_watermark == log_end


def test_a_high_watermark_inside_the_log_is_taken_as_checkpointed_without_reading_the_active_segment(tmp_path, monkeypatch):
    root, loc = _one_partition(tmp_path)
    tp = loc.partition.topic_partition
    segments = loc.partition.segments()
    assert len(segments) > 1
    checkpoint = root / REPLICATION_OFFSET_CHECKPOINT
    write_offset_checkpoint(checkpoint, {**read_offset_checkpoint(checkpoint), tp: segments[-1].base_offset})

    from kts_resources.tiering import partition_view as module

    def no_read(*args, **kwargs):
        raise AssertionError("the active segment was read")

    monkeypatch.setattr(module, "active_log_end_offset", no_read)
    view = partition_view(loc, None)
    assert view.high_watermark == segments[-1].base_offset
    assert partition_tiers(loc).log_end_offset == segments[-1].base_offset  # the bound that costs no read


def test_the_view_reads_each_input_once_however_many_answers_use_it(tmp_path, monkeypatch):
    """One view per operation: the log start offset, the readable spans and the tier numbers all
    come from one listing of the partition's segments."""
    _root, loc = _one_partition(tmp_path)
    listings = []
    real = type(loc.partition).segments

    def counted(partition):
        listings.append(partition.path)
        return real(partition)

    monkeypatch.setattr(type(loc.partition), "segments", counted)
    view = partition_view(loc, None)
    assert (view.log_start_offset, view.high_watermark) == (tiers_of(view).log_start_offset, tiers_of(view).high_watermark)
    assert view.readable_spans == []
    assert listings == [loc.partition.path]
