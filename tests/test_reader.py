"""Reading the tiered log back (kts_resources/reading/reader.py): a simulated partition is copied, its
remote log index built, and its early segments removed locally as a broker's local retention would;
then a fetch from every offset returns exactly the records that were produced — from the remote tier
below the local log start offset, across segment borders and into the local log — on both tiers,
for every codec, under both isolation levels."""

from __future__ import annotations

from pathlib import Path

import pytest

from kts_resources.reading import remote_index_cache as index_cache
from kts_resources.reading import remote_index_tier as index_tier
from kts_resources.kafka.logdir import LogDir
from kts_resources.kafka.records import CONTROL_ABORT, parse_control_record, read_records, scan_batches
from kts_resources.kafka.simulator.simulate import SimulationConfig, simulate
from kts_resources.kafka.snapshots import read_txn_index
from kts_resources.reading.reader import (
    READ_COMMITTED,
    READ_UNCOMMITTED,
    OffsetOutOfRangeError,
    RemoteDataCorruptError,
    TieredLogReader,
)
from kts_resources.remote_log import RemoteLogSegmentState
from kts_resources.remote_storage.factory import remote_storage_from_uri

from .fixtures_s3 import make_s3_storage
from .partition_steps import copy_each_partition

FINISHED = RemoteLogSegmentState.COPY_SEGMENT_FINISHED
TOPIC = "orders"


def produced_records(partition_dir: Path, isolation: str) -> dict[int, tuple]:
    """offset → (timestamp, key, value, headers) of every record a consumer sees, decoded straight
    from the segment files before any of them is tiered (aborted transactions dropped for
    read_committed, as Kafka's consumer drops them)."""
    aborted = []
    for txn_index in sorted(partition_dir.glob("*.txnindex")):
        aborted += read_txn_index(txn_index)
    out: dict[int, tuple] = {}
    aborting: set[int] = set()
    pending = sorted(aborted, key=lambda t: t.first_offset)
    for log in sorted(partition_dir.glob("*.log")):
        for header, records in read_records(log.read_bytes()):
            while pending and pending[0].first_offset <= header.last_offset:
                aborting.add(pending.pop(0).producer_id)
            if header.is_control:
                if parse_control_record(records[0]).type == CONTROL_ABORT:
                    aborting.discard(header.producer_id)
                continue
            if isolation == READ_COMMITTED and header.is_transactional and header.producer_id in aborting:
                continue
            for r in records:
                out[r.offset] = (r.timestamp, r.key, r.value, tuple(r.headers))
    return out


@pytest.fixture(params=["filesystem", "s3"])
def storage(request, tmp_path):
    if request.param == "filesystem":
        return remote_storage_from_uri((tmp_path / "remote").as_uri())
    return make_s3_storage(request.getfixturevalue("s3_endpoint"), request.getfixturevalue("s3_bucket"))


@pytest.fixture
def tiered(tmp_path, metadata_store, storage):
    """A partition whose older half exists only in the remote tier, with its remote log index."""
    root = tmp_path / "logs"
    simulate(root, SimulationConfig(seed=5, topics=(TOPIC,), partitions=1, total_bytes=400 * 1024,
                                    segment_bytes=32 * 1024, transactional_ratio=0.4, abort_ratio=0.5))
    pdir = root / f"{TOPIC}-0"
    expected = {iso: produced_records(pdir, iso) for iso in (READ_UNCOMMITTED, READ_COMMITTED)}
    copy_each_partition(LogDir(root), metadata_store, storage)
    tip = next(iter(metadata_store.partitions()))
    finished = metadata_store.list_remote_log_segments(tip, states={FINISHED})
    assert len(finished) >= 6
    home = tmp_path / "home"
    index_dir = index_cache.cache_directory(home, tip)
    index_tier.update_partition_index(metadata_store, storage, index_dir, tip, lambda md: index_cache.read_segment_entries(storage, md),
                                      rotate_bytes=2048)
    # Local retention: the oldest two thirds of the copied segments leave the local log.
    gone = sorted(finished, key=lambda md: md.start_offset)[: len(finished) * 2 // 3]
    for md in gone:
        for f in pdir.glob(f"{md.start_offset:020d}.*"):
            f.unlink()
    reader = TieredLogReader(log_dirs=[root], store=metadata_store, rsm=storage, home=home)
    return reader, expected, gone


def _read_all_from(reader, offset: int, isolation: str, max_bytes: int = 8 * 1024, *, part=None,
                   span: int | None = None) -> tuple[list, int, int]:
    """Fetch from ``offset`` until the fetchable end (or ``span`` offsets on): (records, how many
    batches came from the remote tier, where reading stopped)."""
    part = part or reader.partition(TOPIC, 0)
    limit = part.fetch_limit(isolation)
    if span is not None:
        limit = min(limit, offset + span)
    records, remote_batches = [], 0
    position = offset
    while position < limit:
        result = part.fetch(position, max_bytes, isolation)
        assert result.next_offset > position, f"no progress from {position}"
        remote_batches += sum(b.remote for b in result.batches)
        records += result.records
        position = result.next_offset
    return records, remote_batches, position


@pytest.mark.parametrize("isolation", [READ_UNCOMMITTED, READ_COMMITTED])
def test_fetching_from_any_offset_returns_exactly_what_was_produced(tiered, isolation):
    reader, expected, gone = tiered
    want = expected[isolation]
    part = reader.partition(TOPIC, 0)
    assert part.local_log_start_offset == gone[-1].end_offset + 1
    # Every offset below the local log start offset (remote only), then a stride through the local
    # log; from each, fetches continue across remote segment borders and into the local log.
    # Over S3 (an HTTP request per fetch) every 11th remote offset keeps the test quick.
    remote_part = range(part.log_start_offset, part.local_log_start_offset, 1 if reader.rsm.location().startswith("file:") else 11)
    starts = [*remote_part, *range(part.local_log_start_offset, part.high_watermark, 37)]
    for start in starts:
        records, _remote, end = _read_all_from(reader, start, isolation, part=part, span=120)
        got = {r.offset: (r.timestamp, r.key, r.value, r.headers) for r in records}
        assert got == {o: v for o, v in want.items() if start <= o < end}, f"fetch from {start}"


def test_offload_and_consume_counts_remote_batches_and_requests(tiered):
    """Kafka's OffloadAndConsumeFromLeaderTest, counted: consuming from offset k reads the remote
    part with one ranged request per remote segment (its index entries coalesced), then the local log."""
    reader, expected, gone = tiered
    part = reader.partition(TOPIC, 0)
    k = gone[0].end_offset - 2
    records, remote_batches, end = _read_all_from(reader, k, READ_UNCOMMITTED, max_bytes=1 << 30, part=part)
    assert [r.offset for r in records] == [o for o in sorted(expected[READ_UNCOMMITTED]) if k <= o < end]
    assert end == part.high_watermark
    remote_offsets = {r.offset for r in records if r.offset < part.local_log_start_offset}
    assert remote_offsets == {o for o in expected[READ_UNCOMMITTED] if k <= o < part.local_log_start_offset}
    assert remote_batches == sum(
        1 for md in gone for b in scan_batches(reader.rsm.fetch_object(reader.rsm.segment_object_keys(md)["log"])).batches
        if b.last_offset >= k)
    assert part.remote_requests == len(gone)


def test_every_codec_is_in_the_remote_part(tiered):
    """The simulated partition mixes codecs per batch; its remote-only part has each of them, so the
    fetch tests above read every codec back from the remote tier."""
    reader, _expected, gone = tiered
    codecs = {b.codec_name for md in gone for b in scan_batches(reader.rsm.fetch_object(reader.rsm.segment_object_keys(md)["log"])).batches}
    assert codecs >= {"none", "gzip", "snappy", "lz4", "zstd"}


def test_an_exceeded_fetch_quota_returns_no_remote_data_and_says_throttled(tiered):
    from kts_resources.metadata.quota_config import QuotaConfig
    from kts_resources.tiering.quotas import ManualClock, fetch_quota_manager

    reader, _expected, gone = tiered
    clock = ManualClock(1_000_000)
    reader.fetch_quota = fetch_quota_manager(QuotaConfig(fetch_max_bytes_per_second=1024), reader.store.engine, clock=clock)
    part = reader.partition(TOPIC, 0)
    first = part.fetch(gone[0].start_offset, 64 * 1024)
    assert first.batches and not first.throttled  # under quota: served, and its bytes recorded
    second = part.fetch(first.next_offset, 64 * 1024)
    assert second.throttled and second.batches == [] and second.next_offset == first.next_offset
    local = part.fetch(part.local_log_start_offset, 4096)
    assert local.batches and not local.throttled  # local reads go on
    clock.advance(120_000)
    assert part.fetch(first.next_offset, 4096).batches


def test_a_cached_index_makes_one_remote_request_per_fetch(tiered):
    reader, _expected, gone = tiered
    part = reader.partition(TOPIC, 0)
    before = part.remote_requests
    result = part.fetch(gone[1].start_offset + 1, 4096)
    assert result.batches and all(b.remote for b in result.batches)
    assert part.remote_requests - before == 1


def test_offsets_out_of_range_are_an_error_not_an_empty_answer(tiered):
    reader, _expected, _gone = tiered
    part = reader.partition(TOPIC, 0)
    with pytest.raises(OffsetOutOfRangeError, match="out of range"):
        part.fetch(part.log_end_offset + 1)


def test_a_remote_chunk_that_fails_its_crc_is_an_error_naming_object_and_position(tiered, storage):
    reader, _expected, gone = tiered
    md = gone[0]
    key = storage.segment_object_keys(md)["log"]
    data = bytearray(storage.fetch_object(key))
    data[200] ^= 0xFF
    storage.put_object(key, bytes(data))
    with pytest.raises(RemoteDataCorruptError, match=r"byte \d+: the batch at offset \d+ fails its CRC"):
        reader.partition(TOPIC, 0).fetch(md.start_offset, 1 << 20)
