"""The simulator writes log dirs a Kafka broker could have written, reproducibly.

Covers ``kts_resources.kafka.simulator.simulate`` and the broker-like writer under it
(``kts_resources.kafka.simulator.broker_log``): byte-identical output for the same seed; segments rolling by
segment.bytes, segment.ms and full indexes; closed segments' indexes equal to a rebuild and the
active segment's preallocated and zero-filled; CRC-valid, decodable batches in every codec;
leader epochs, producer snapshots and the transaction index agreeing with the batches; append
mode continuing offsets; a reopened partition writing exactly what an uninterrupted one writes;
broker-side retention by bytes and by time; the root checkpoints agreeing with the logs.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from kts_resources.kafka.simulator.broker_log import JavaLongHashMapOrder, LogConfig, PartitionLog
from kts_resources.kafka.checkpoints import read_leader_epoch_checkpoint, read_offset_checkpoint, read_partition_metadata
from kts_resources.kafka.codecs import CODEC_NAMES
from kts_resources.kafka.indexes import (
    OFFSET_ENTRY_SIZE,
    TIME_ENTRY_SIZE,
    SegmentIndexer,
    preallocated_size,
    rebuild_indexes,
)
from kts_resources.kafka.logdir import discover_partitions, list_producer_snapshots, list_segments
from kts_resources.kafka.records import (
    CONTROL_ABORT,
    BatchHeader,
    NewRecord,
    build_batch,
    build_control_batch,
    decode_batch,
    parse_control_record,
    scan_batches,
)
from kts_resources.kafka.simulator.simulate import SimulationConfig, simulate
from kts_resources.kafka.snapshots import AbortedTxn, read_producer_snapshot, read_txn_index

KiB = 1024

# Small and quick: ~80 batches over six partitions, a few dozen segments.
SMALL = SimulationConfig(seed=7, total_bytes=300 * KiB, segment_bytes=16 * KiB, index_interval_bytes=1024)
# Many transactions from three producers, so aborted ones overlap others' open transactions.
TXN_HEAVY = replace(
    SMALL, batch_size=2 * KiB, transactional_producers=3, transactional_ratio=0.6, abort_ratio=0.5,
    leader_epoch_change_ratio=0.05,
)


# --- reading what was written -------------------------------------------------------------------


@dataclass
class Segment:
    base_offset: int
    path: Path
    data: bytes
    batches: list[BatchHeader]
    active: bool


def read_segments(partition_dir: Path) -> list[Segment]:
    out = []
    for s in list_segments(partition_dir):
        data = s.log.read_bytes()
        scan = scan_batches(data, verify_crc=True)
        assert scan.invalid is None, f"{s.log}: {scan.invalid}"
        out.append(Segment(s.base_offset, s.log, data, scan.batches, s.active))
    return out


def all_batches(partition_dir: Path) -> list[tuple[Segment, BatchHeader]]:
    return [(seg, b) for seg in read_segments(partition_dir) for b in seg.batches]


def tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def control_type(seg: Segment, batch: BatchHeader) -> int:
    return parse_control_record(decode_batch(seg.data, batch)[0]).type


@pytest.fixture(scope="module")
def small_dir(tmp_path_factory) -> Path:
    log_dir = tmp_path_factory.mktemp("small")
    simulate(log_dir, SMALL)
    return log_dir


@pytest.fixture(scope="module")
def txn_dir(tmp_path_factory) -> Path:
    log_dir = tmp_path_factory.mktemp("txn")
    simulate(log_dir, TXN_HEAVY)
    return log_dir


def partition_dirs(log_dir: Path) -> list[Path]:
    dirs = [p.path for p in discover_partitions(log_dir)]
    assert dirs
    return dirs


# --- determinism --------------------------------------------------------------------------------


def test_the_same_seed_and_options_write_byte_identical_trees(tmp_path):
    first, second, other = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    simulate(first, SMALL)
    simulate(second, SMALL)
    assert tree(first) == tree(second)
    simulate(other, replace(SMALL, seed=8))
    assert tree(other) != tree(first)


def test_default_topics_include_dashes_and_dots_and_get_one_topic_id_each(small_dir):
    names = {p.name for p in small_dir.iterdir() if p.is_dir()}
    assert names == {f"{t}-{p}" for t in ("orders", "page.views", "user-events") for p in (0, 1)}
    ids = {}
    for pdir in discover_partitions(small_dir):
        ids.setdefault(pdir.topic, set()).add(read_partition_metadata(pdir.path / "partition.metadata").topic_id)
    assert all(len(v) == 1 for v in ids.values())
    assert len({next(iter(v)) for v in ids.values()}) == 3


# --- rolling ------------------------------------------------------------------------------------


def test_segments_roll_when_the_next_batch_would_pass_segment_bytes(small_dir):
    rolls = 0
    for pdir in partition_dirs(small_dir):
        segments = read_segments(pdir)
        for seg, nxt in zip(segments, segments[1:]):
            size = len(seg.data)
            first_of_next = nxt.batches[0].size
            assert size > SMALL.segment_bytes - first_of_next, f"{seg.path} rolled early"
            assert size <= SMALL.segment_bytes  # no batch is larger than segment.bytes
            # A batch's position is the segment's size before it: the rule did not fire there.
            assert all(not b.position > SMALL.segment_bytes - b.size for b in seg.batches[1:])
            rolls += 1
    assert rolls >= 10


def test_producer_batches_are_cut_to_what_the_broker_takes_when_segments_are_smaller_than_batch_size(tmp_path):
    # UnifiedLog rejects a batch larger than segment.bytes; the simulated producer fills less.
    config = replace(SMALL, segment_bytes=4 * KiB, total_bytes=100 * KiB, codecs=("none",))
    simulate(tmp_path, config)
    segments = [seg for pdir in partition_dirs(tmp_path) for seg in read_segments(pdir)]
    assert len(segments) >= 20
    assert all(len(seg.data) <= config.segment_bytes for seg in segments)
    assert max(b.record_count for seg in segments for b in seg.batches) > 1


def test_segments_roll_when_the_batch_timestamp_passes_segment_ms(tmp_path):
    config = replace(SMALL, segment_bytes=1024 * KiB, segment_ms=5_000, messages_per_second=20)
    simulate(tmp_path, config)
    rolls = 0
    for pdir in partition_dirs(tmp_path):
        segments = read_segments(pdir)
        for seg, nxt in zip(segments, segments[1:]):
            first = seg.batches[0].max_timestamp
            assert all(b.max_timestamp - first <= config.segment_ms for b in seg.batches)
            assert nxt.batches[0].max_timestamp - first > config.segment_ms
            rolls += 1
    assert rolls >= 5


def test_segments_roll_when_an_index_is_full(tmp_path):
    config = replace(SMALL, segment_bytes=1024 * KiB, segment_index_bytes=48, index_interval_bytes=0)
    simulate(tmp_path, config)
    rolls = 0
    for pdir in partition_dirs(tmp_path):
        for seg in read_segments(pdir):
            if seg.active:
                continue
            indexer = SegmentIndexer(seg.base_offset, 0)
            for b in seg.batches:
                assert not indexer.is_full(48), f"{seg.path}: appended to a full index"
                indexer.append_batch(b.position, b.size, b.last_offset, b.max_timestamp)
            assert indexer.is_full(48)
            rolls += 1
    assert rolls >= 10


# --- indexes ------------------------------------------------------------------------------------


def test_closed_segment_indexes_are_byte_identical_to_a_rebuild(small_dir):
    checked = 0
    for pdir in partition_dirs(small_dir):
        for seg in read_segments(pdir):
            if seg.active:
                continue
            rebuilt = rebuild_indexes(seg.data, seg.base_offset, closed=True, index_interval_bytes=SMALL.index_interval_bytes)
            assert seg.path.with_suffix(".index").read_bytes() == rebuilt.offset_index
            assert seg.path.with_suffix(".timeindex").read_bytes() == rebuilt.time_index
            assert rebuilt.time_entries, "a closed segment's time index ends with its largest timestamp"
            checked += 1
    assert checked >= 10


def test_active_segment_indexes_are_preallocated_with_the_rebuilt_entries_then_zeros(small_dir):
    with_entries = 0
    for pdir in partition_dirs(small_dir):
        seg = read_segments(pdir)[-1]
        assert seg.active
        rebuilt = rebuild_indexes(seg.data, seg.base_offset, closed=False, index_interval_bytes=SMALL.index_interval_bytes)
        # A running broker's active segment has no closing time entry yet (recovery, and so a
        # rebuild, appends one): the same rule, fed batch by batch, without close().
        running = SegmentIndexer(seg.base_offset, SMALL.index_interval_bytes)
        for b in rebuilt.scan.batches:
            running.append_batch(b.position, b.size, b.last_offset, b.max_timestamp)
        assert running.offset_index_bytes() == rebuilt.offset_index
        assert rebuilt.time_index.startswith(running.time_index_bytes())
        for suffix, expected, entry_size in (
            (".index", running.offset_index_bytes(), OFFSET_ENTRY_SIZE),
            (".timeindex", running.time_index_bytes(), TIME_ENTRY_SIZE),
        ):
            data = seg.path.with_suffix(suffix).read_bytes()
            assert len(data) == preallocated_size(SMALL.segment_index_bytes, entry_size)
            assert data[: len(expected)] == expected
            assert data[len(expected):].count(0) == len(data) - len(expected)
        with_entries += bool(rebuilt.offset_entries)
    assert with_entries >= 1


# --- batches ------------------------------------------------------------------------------------


def test_every_batch_is_crc_valid_and_decodes_with_contiguous_offsets(small_dir):
    for pdir in partition_dirs(small_dir):
        expected_offset = 0
        for seg, b in all_batches(pdir):
            assert b.crc_ok
            assert b.base_offset == expected_offset
            records = decode_batch(seg.data, b)
            assert [r.offset for r in records] == list(range(b.base_offset, b.last_offset + 1))
            assert max(r.timestamp for r in records) == b.max_timestamp
            expected_offset = b.next_offset


def test_every_codec_and_record_shape_appears(small_dir):
    codecs_seen: set[str] = set()
    null_keys = tombstones = headers = log_append_time = out_of_order = 0
    for pdir in partition_dirs(small_dir):
        previous_max = None
        for seg, b in all_batches(pdir):
            codecs_seen.add(b.codec_name)
            log_append_time += b.timestamp_type == 1
            if b.is_control:
                continue
            if previous_max is not None and b.max_timestamp < previous_max:
                out_of_order += 1
            previous_max = b.max_timestamp if previous_max is None else max(previous_max, b.max_timestamp)
            for r in decode_batch(seg.data, b):
                null_keys += r.key is None
                tombstones += r.value is None
                headers += bool(r.headers)
    assert codecs_seen == set(CODEC_NAMES)
    assert null_keys and tombstones and headers and log_append_time and out_of_order


def test_leader_epoch_checkpoint_matches_the_batches_partition_leader_epochs(txn_dir):
    changes = 0
    for pdir in partition_dirs(txn_dir):
        lineage: list[tuple[int, int]] = []
        for _, b in all_batches(pdir):
            if not lineage or lineage[-1][0] != b.partition_leader_epoch:
                assert not lineage or b.partition_leader_epoch > lineage[-1][0]
                lineage.append((b.partition_leader_epoch, b.base_offset))
        entries = read_leader_epoch_checkpoint(pdir / "leader-epoch-checkpoint")
        assert [(e.epoch, e.start_offset) for e in entries] == lineage
        changes += len(lineage) - 1
    assert changes >= 3


# --- producer state -----------------------------------------------------------------------------


def test_producer_snapshots_exist_at_every_roll_offset_and_describe_the_producers_before_it(txn_dir):
    open_at_roll = 0
    for pdir in partition_dirs(txn_dir):
        batches = all_batches(pdir)
        segments = read_segments(pdir)
        snapshots = list_producer_snapshots(pdir)
        assert sorted(snapshots) == [s.base_offset for s in segments[1:]]
        for offset, path in snapshots.items():
            entries = read_producer_snapshot(path)
            before = [(seg, b) for seg, b in batches if b.last_offset < offset]
            # Listed in the broker's HashMap order: producers put in as they first appeared.
            order = JavaLongHashMapOrder()
            for _, b in before:
                if b.producer_id >= 0:
                    order.put(b.producer_id)
            assert [e.producer_id for e in entries] == list(order)
            assert {e.producer_id for e in entries} == {b.producer_id for _, b in before if b.producer_id >= 0}
            for e in entries:
                mine = [(seg, b) for seg, b in before if b.producer_id == e.producer_id]
                data = [b for _, b in mine if not b.is_control]
                last = mine[-1][1]
                assert e.producer_epoch == last.producer_epoch
                if last.is_control:
                    assert e.timestamp == last.max_timestamp
                if data and data[-1].producer_epoch == e.producer_epoch:
                    assert e.last_offset == data[-1].last_offset
                    assert e.last_sequence == data[-1].base_sequence + data[-1].last_offset_delta
                    assert e.offset_delta == data[-1].last_offset_delta
                open_txn = not last.is_control and last.is_transactional
                if open_txn:
                    since_marker = [b for _, b in mine if b.is_control]
                    start = max((b.base_offset for b in since_marker), default=-1)
                    assert e.current_txn_first_offset == min(b.base_offset for b in data if b.base_offset > start)
                    open_at_roll += 1
                else:
                    assert e.current_txn_first_offset == -1
    # Some rolls happened inside a transaction, so the snapshot carries it.
    assert open_at_roll >= 1


def expected_aborted_txns(pdir: Path) -> dict[int, list[AbortedTxn]]:
    """Aborted transactions by the base offset of the segment holding their marker, computed from
    the batches: LSO = first offset of the earliest other producer's open transaction, else marker + 1."""
    open_txns: dict[int, int] = {}  # producer id → first offset
    out: dict[int, list[AbortedTxn]] = {}
    for seg, b in all_batches(pdir):
        if b.is_control:
            first = open_txns.pop(b.producer_id, None)
            if first is not None and control_type(seg, b) == CONTROL_ABORT:
                lso = min(open_txns.values(), default=b.last_offset + 1)
                out.setdefault(seg.base_offset, []).append(AbortedTxn(b.producer_id, first, b.base_offset, lso))
        elif b.is_transactional:
            open_txns.setdefault(b.producer_id, b.base_offset)
    return out


def test_txnindex_entries_match_the_aborted_transactions(txn_dir):
    aborted = overlapping = 0
    for pdir in partition_dirs(txn_dir):
        expected = expected_aborted_txns(pdir)
        found = {s.base_offset: read_txn_index(s.txn_index) for s in list_segments(pdir) if s.txn_index is not None}
        assert found == expected
        for txns in expected.values():
            aborted += len(txns)
            overlapping += sum(t.last_stable_offset <= t.last_offset for t in txns)
    assert aborted >= 3
    # Transactions of several producers interleave: some abort while another is still open.
    assert overlapping >= 1


def test_transactional_batches_of_several_producers_interleave_in_one_partition(txn_dir):
    interleaved = False
    for pdir in partition_dirs(txn_dir):
        open_by: set[int] = set()
        for _, b in all_batches(pdir):
            if b.is_control:
                open_by.discard(b.producer_id)
            elif b.is_transactional:
                open_by.add(b.producer_id)
                interleaved |= len(open_by) > 1
    assert interleaved


# --- append mode and reopening ------------------------------------------------------------------


def test_append_mode_continues_offsets_without_a_gap_and_rolls_further(tmp_path):
    first_run = simulate(tmp_path, SMALL)
    before = {p.name: read_segments(p) for p in partition_dirs(tmp_path)}
    first_tree = tree(tmp_path)
    first_hw = read_offset_checkpoint(tmp_path / "replication-offset-checkpoint")
    second_run = simulate(tmp_path, SMALL)
    # The simulated clock continues after the newest timestamp already written.
    assert second_run.start_time_ms > max(b.max_timestamp for segs in before.values() for s in segs for b in s.batches)
    assert second_run.start_time_ms >= first_run.end_time_ms
    for pdir in partition_dirs(tmp_path):
        old = before[pdir.name]
        new = read_segments(pdir)
        assert len(new) > len(old)
        # Closed segments are untouched; the old active one was appended to, then rolled.
        for seg in old[:-1]:
            for suffix in (".log", ".index", ".timeindex"):
                name = f"{pdir.name}/{seg.path.with_suffix(suffix).name}"
                assert (tmp_path / name).read_bytes() == first_tree[name]
        expected_offset = 0
        for seg, b in all_batches(pdir):
            assert b.base_offset == expected_offset
            expected_offset = b.next_offset
        old_end = old[-1].batches[-1].next_offset
        continued = [b for _, b in all_batches(pdir) if b.base_offset >= old_end]
        assert continued
        # The restarted broker leads with a new epoch.
        assert continued[0].partition_leader_epoch > old[-1].batches[-1].partition_leader_epoch
        for seg in new[:-1]:
            rebuilt = rebuild_indexes(seg.data, seg.base_offset, closed=True, index_interval_bytes=SMALL.index_interval_bytes)
            assert seg.path.with_suffix(".index").read_bytes() == rebuilt.offset_index
            assert seg.path.with_suffix(".timeindex").read_bytes() == rebuilt.time_index
    hw = read_offset_checkpoint(tmp_path / "replication-offset-checkpoint")
    assert all(hw[tp] > first_hw[tp] for tp in first_hw)


def _scripted_appends(log_dir: Path, steps: range, reopen_at: int | None) -> None:
    """Drive one partition with interleaved transactions, rolls and epoch changes; optionally
    close and reopen it in the middle (while transactions are open)."""
    config = LogConfig(segment_bytes=2 * KiB, index_interval_bytes=256, segment_index_bytes=4 * KiB)
    pdir = log_dir / "orders-0"
    log = PartitionLog.open(pdir, config)
    sequences: dict[int, int] = {}
    open_txn: dict[int, bool] = {}
    for i in steps:
        if reopen_at is not None and i == reopen_at:
            log.close()
            log = PartitionLog.open(pdir, config)
        pid = 1000 + i % 3
        ts = 1_700_000_000_000 + i * 100 - (5_000 if i % 11 == 0 else 0)
        epoch = i // 40
        if i % 7 == 6 and open_txn.get(pid):
            marker = build_control_batch(base_offset=0, commit=i % 2 == 0, producer_id=pid, producer_epoch=0,
                                         coordinator_epoch=3, timestamp=ts)
            log.append(marker, leader_epoch=epoch)
            open_txn[pid] = False
            continue
        records = [NewRecord(ts + j, f"k{j}".encode(), b"v" * (50 + 13 * (i % 5))) for j in range(1 + i % 4)]
        transactional = pid != 1002
        batch = build_batch(records, base_offset=0, producer_id=pid, producer_epoch=0, base_sequence=sequences.get(pid, 0),
                            is_transactional=transactional, codec=i % 5)
        sequences[pid] = sequences.get(pid, 0) + len(records)
        open_txn[pid] = transactional
        log.append(batch, leader_epoch=epoch, log_append_time=ts + 50 if i % 13 == 0 else None)
    log.close()


def test_a_reopened_partition_writes_exactly_what_an_uninterrupted_one_writes(tmp_path):
    _scripted_appends(tmp_path / "straight", range(120), reopen_at=None)
    _scripted_appends(tmp_path / "reopened", range(120), reopen_at=75)
    straight, reopened = tree(tmp_path / "straight"), tree(tmp_path / "reopened")
    assert straight == reopened
    assert any(name.endswith(".txnindex") for name in straight)
    assert sum(name.endswith(".snapshot") for name in straight) >= 5


def test_append_rejects_what_a_leader_would_reject(tmp_path):
    log = PartitionLog.open(tmp_path / "t-0")
    record = [NewRecord(1, b"k", b"v")]
    log.append(build_batch(record, base_offset=0, producer_id=5, producer_epoch=1, base_sequence=0), leader_epoch=2)
    with pytest.raises(ValueError, match="out-of-order sequence"):
        log.append(build_batch(record, base_offset=0, producer_id=5, producer_epoch=1, base_sequence=7), leader_epoch=2)
    with pytest.raises(ValueError, match="fenced"):
        log.append(build_batch(record, base_offset=0, producer_id=5, producer_epoch=0, base_sequence=1), leader_epoch=2)
    with pytest.raises(ValueError, match="older than the latest epoch"):
        log.append(build_batch(record, base_offset=0), leader_epoch=1)
    assert log.log_end_offset == 1
    log.close()


# --- retention ----------------------------------------------------------------------------------


def test_retention_bytes_deletes_the_oldest_segments_and_advances_the_log_start_offset(tmp_path):
    config = replace(SMALL, retention_bytes=40 * KiB)
    summary = simulate(tmp_path, config)
    assert summary.segments_deleted >= 5
    lso = read_offset_checkpoint(tmp_path / "log-start-offset-checkpoint")
    for p in discover_partitions(tmp_path):
        pdir, tp = p.path, p.topic_partition
        segments = read_segments(pdir)
        size = sum(len(s.data) for s in segments)
        assert size >= config.retention_bytes or lso[tp] == 0
        # Kafka stopped at the first segment whose deletion would take the log under the limit.
        if not segments[0].active and lso[tp] > 0:
            assert size - len(segments[0].data) < config.retention_bytes
        assert lso[tp] == segments[0].base_offset
        assert not [p for p in pdir.iterdir() if p.name.endswith(".deleted")]
        assert all(offset >= lso[tp] for offset in list_producer_snapshots(pdir))
        epochs = read_leader_epoch_checkpoint(pdir / "leader-epoch-checkpoint")
        assert epochs[0].start_offset == lso[tp]
    assert any(v > 0 for v in lso.values())


def test_retention_ms_deletes_segments_older_than_the_limit_and_stops_at_the_first_kept(tmp_path):
    config = replace(SMALL, messages_per_second=20, retention_ms=30_000, out_of_order_ratio=0.0)
    summary = simulate(tmp_path, config)
    now = summary.end_time_ms
    assert summary.segments_deleted >= 3
    lso = read_offset_checkpoint(tmp_path / "log-start-offset-checkpoint")
    for p in discover_partitions(tmp_path):
        segments = read_segments(p.path)
        first = segments[0]
        if not first.active:
            assert now - max(b.max_timestamp for b in first.batches) <= config.retention_ms
        assert lso[p.topic_partition] == first.base_offset


# --- checkpoints --------------------------------------------------------------------------------


def test_root_checkpoints_parse_cover_every_partition_and_agree_with_the_logs(small_dir):
    hw = read_offset_checkpoint(small_dir / "replication-offset-checkpoint")
    recovery = read_offset_checkpoint(small_dir / "recovery-point-offset-checkpoint")
    lso = read_offset_checkpoint(small_dir / "log-start-offset-checkpoint")
    pdirs = discover_partitions(small_dir)
    assert set(hw) == set(recovery) == set(lso) == {p.topic_partition for p in pdirs}
    for pdir in pdirs:
        tp = pdir.topic_partition
        segments = read_segments(pdir.path)
        log_end = segments[-1].batches[-1].next_offset
        active_base = segments[-1].base_offset
        assert lso[tp] == segments[0].base_offset <= hw[tp] <= log_end
        assert recovery[tp] == active_base <= hw[tp]
        # The newest batch is above the high watermark, and no marker is at or above it.
        assert hw[tp] <= segments[-1].batches[-1].base_offset
        assert not [b for s in segments for b in s.batches if b.is_control and b.base_offset >= hw[tp]]


def test_progress_reports_grow_to_the_total(tmp_path):
    reports: list[tuple[int, int]] = []
    summary = simulate(tmp_path, replace(SMALL, total_bytes=200 * KiB), progress=lambda done, total: reports.append((done, total)))
    assert len(reports) >= 3
    assert [d for d, _ in reports] == sorted(d for d, _ in reports)
    assert reports[-1] == (summary.bytes_written, 200 * KiB)
    assert summary.bytes_written >= 200 * KiB


@pytest.mark.parametrize(
    "options, message",
    [
        ({"topics": ("bad topic",)}, "topics"),
        ({"codecs": ("brotli",)}, "brotli"),
        ({"abort_ratio": 1.5}, "abort_ratio"),
        ({"segment_index_bytes": 8}, "segment.index.bytes"),
        ({"segment_bytes": 1000}, "segment_bytes 1000 cannot hold one batch"),
        ({"partitions": 0}, "partitions"),
    ],
)
def test_bad_options_are_rejected_with_a_readable_message(options, message):
    with pytest.raises(ValueError, match=message):
        SimulationConfig(**options)


def test_topics_and_codecs_accept_comma_separated_text():
    config = SimulationConfig(topics="a.b,c-d", codecs="gzip,zstd")
    assert config.topics == ("a.b", "c-d") and config.codecs == ("gzip", "zstd")


@pytest.mark.parametrize("profile", ["old", "future", "shuffled"])
def test_timestamp_profiles_shape_create_time_for_retention_scenarios(tmp_path, profile):
    """--timestamps: month-old backfills, clock-skewed producers a day ahead, late data hours
    behind; segment.ms rolls on the record timestamps (KIP-33), so future stamps roll early."""
    from kts_resources.kafka.records import read_records
    from kts_resources.kafka.simulator.simulate import TIMESTAMP_PROFILES

    config = SimulationConfig(seed=4, topics=("t",), partitions=1, total_bytes=96 * 1024, codecs=("none",),
                              messages_per_second=100.0, timestamps=profile, segment_ms=3_600_000)
    summary = simulate(tmp_path, config)
    stamps = [(h.base_offset, h.max_timestamp) for log in sorted((tmp_path / "t-0").glob("*.log"))
              for h, _ in read_records(log.read_bytes()) if not h.is_control and h.timestamp_type == 0]  # CreateTime
    _p, low, high = TIMESTAMP_PROFILES[profile]
    clock_start, clock_end = summary.start_time_ms, summary.end_time_ms
    if profile == "old":
        assert all(ts < clock_end + low + 60_000 for _o, ts in stamps)
    elif profile == "future":
        assert any(ts > clock_end + 60_000 for _o, ts in stamps)
        assert len(list((tmp_path / "t-0").glob("*.log"))) > 1  # a day-ahead stamp rolls the segment
    else:
        assert any(ts < clock_start - 1_000 or ts < prev - 1_000 for (_o, prev), (_p2, ts) in zip(stamps, stamps[1:]))


def test_an_unknown_timestamp_profile_is_refused():
    with pytest.raises(ValueError, match="timestamps: 'weird' is not one of steady, old, future, shuffled"):
        SimulationConfig(timestamps="weird")
